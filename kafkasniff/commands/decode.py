"""`kafkasniff decode CAPTURE...`: read captures, reassemble TCP, decode and pair Kafka messages."""

from __future__ import annotations

import click

from kafkasniff.capture.files import CaptureError, open_capture
from kafkasniff.protocol.records import decode_records
from kafkasniff.render.output import Output, OutputOptions
from kafkasniff.stream.analyzer import Analyzer


def output_options(f):
    """The view and filter options that decode and sniff share."""
    options = [
        click.option("-V", "--verbose", "tree", is_flag=True, help="Full field tree of every message."),
        click.option("--hex", "hex_", is_flag=True, help="With -V: each field's offset and bytes."),
        click.option("--json", "as_json", is_flag=True, help="JSON Lines (schema in the README)."),
        click.option("--api", "apis", multiple=True, help="Only this API (name or key); repeatable."),
        click.option("--topic", "topics", multiple=True, help="Only messages about this topic; repeatable."),
        click.option("--client-id", "client_ids", multiple=True, help="Only this client id; repeatable."),
        click.option("--stream", "streams", type=int, multiple=True, help="Only this TCP stream number."),
        click.option("--errors-only", is_flag=True, help="Only messages with a non-zero error code or malformed."),
        click.option("--stats", is_flag=True, help="Summary tables per API, topic and client id."),
        click.option("--show-secrets", is_flag=True, help="Show SASL passwords and SCRAM proofs."),
        click.option("--full", is_flag=True, help="Show long keys and values whole."),
        click.option("--port", "ports", type=int, multiple=True,
                     help="Kafka broker port hint (Kafka is also found on any port by content)."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def make_options(tree, hex_, as_json, apis, topics, client_ids, streams, errors_only, stats, show_secrets,
                 full) -> OutputOptions:
    return OutputOptions(
        view="json" if as_json else "tree" if tree or hex_ else "line", hex=hex_, show_secrets=show_secrets,
        full_values=full, apis=frozenset(a.lower() for a in apis), topics=frozenset(topics),
        client_ids=frozenset(client_ids), streams=frozenset(streams), errors_only=errors_only, stats=stats)


@click.command("decode")
@click.argument("captures", nargs=-1, required=True)
@output_options
def decode_command(captures, ports, **view) -> None:
    """Decode every Kafka request and response in pcap/pcapng captures (gzip too)."""
    from kafkasniff.cli import fail

    options = make_options(**view)
    output = Output(options)
    for path in captures:
        try:
            reader = open_capture(path)
        except CaptureError as e:
            fail(str(e))
        analyzer = Analyzer(decode_records if options.needs_records else None, ports)
        try:
            for ev in analyzer.run(reader.segments()):
                output.emit(ev)
        finally:
            reader.close()
    output.finish()
