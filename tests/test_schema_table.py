"""The committed schema table is exactly what the generator produces from ../shared/kafka-schemas."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kafkasniff.protocol.schema import VERSIONS_KEPT, apis, message_variant, version_range

REPO = Path(__file__).resolve().parent.parent
SCHEMAS = REPO.parent / "shared" / "kafka-schemas"


@pytest.mark.skipif(not SCHEMAS.is_dir(), reason="../shared/kafka-schemas not present beside the repository")
def test_committed_table_matches_generator():
    result = subprocess.run([sys.executable, "tools/gen_schema_table.py", str(SCHEMAS), "--check"],
                            cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_table_keeps_facts_not_prose():
    text = (REPO / "kafkasniff" / "protocol" / "schema_table.json").read_text()
    assert '"about"' not in text and "//" not in text
    table = json.loads(text)
    assert [a["key"] for a in table["apis"]] == list(range(95))
    # Versions Kafka 4.0 removed come from the 3.9 snapshot.
    produce = table["apis"][0]
    assert sorted(tuple(v["versions"]) for v in produce["request"]) == [(0, 2), (3, 13)]
    client_id = [f for f in table["headers"]["RequestHeader"][0]["fields"] if f["name"] == "ClientId"][0]
    assert client_id["flexible"] is None  # never compact, even in header v2
    assert {"ConsumerProtocolSubscription", "ConsumerProtocolAssignment"} <= set(table["data"])


def test_version_lookups_keep_every_real_version_and_a_bounded_number_of_made_up_ones():
    # Frames with made-up (key, version) pairs must not grow the look-up caches without end, and the
    # bound must cover every version Kafka defines, so real traffic never evicts.
    real = sum(high - low + 1 for key in apis() for kind in ("request", "response")
               for low, high in [version_range(key, kind)])
    assert real < VERSIONS_KEPT
    message_variant.cache_clear()
    for key in range(200, 330):
        for version in range(40):
            assert message_variant(key, "request", version) is None
    assert message_variant.cache_info().currsize == VERSIONS_KEPT
    assert message_variant(18, "request", 3) is not None
