"""Both snappy framings occur in the project's real captures, and both decode to what was produced."""

from pathlib import Path

from capture_manifest import load_capture
from kafkasniff.capture.files import open_capture
from kafkasniff.protocol.messages import with_fields
from kafkasniff.protocol.records import DECOMPRESSED_RECORDS
from kafkasniff.stream.analyzer import Analyzer
from kafkasniff.stream.session import MessageEvent

CAPTURES = Path(__file__).resolve().parent.parent / "captures"
XERIAL_MAGIC = b"\x82SNAPPY\x00"


def snappy_batches(name: str):
    """(compressed bytes, decoded record values) of every snappy batch in Produce requests."""
    with open_capture(CAPTURES / f"{name}.pcap") as reader:
        for ev in Analyzer().run(reader.segments()):
            if type(ev) is not MessageEvent or ev.message.api_name != "Produce" or ev.message.kind != "request":
                continue
            for _, f in with_fields(ev.message, ev.payload).body.walk():
                if f.type == "RecordBatch" and f.value["codec"] == "snappy":
                    records = f["records"]
                    assert records.type == DECOMPRESSED_RECORDS and f.value["crc_valid"]
                    yield (ev.payload[records.offset:records.offset + records.length],
                           [r.value["value"] for r in records.children])


def produced_values(name: str) -> set:
    return {m.value for m in load_capture(name).produced() if m.codec == "snappy"}


def test_java_style_xerial_framing_from_kafka_python():
    batches = list(snappy_batches("kafka_python_codecs"))
    assert batches and all(raw.startswith(XERIAL_MAGIC) for raw, _ in batches)
    decoded = [v for _, values in batches for v in values]
    # Clients send a batch uncompressed when compression would not shrink it: not every
    # message of the snappy topic is in a snappy batch, but every one decoded was produced.
    assert decoded and set(decoded) <= produced_values("kafka_python_codecs")


def test_raw_snappy_blocks_from_librdkafka():
    batches = list(snappy_batches("confluent_codecs"))
    assert batches and not any(raw.startswith(XERIAL_MAGIC) for raw, _ in batches)
    decoded = [v for _, values in batches for v in values]
    assert decoded and set(decoded) <= produced_values("confluent_codecs")
