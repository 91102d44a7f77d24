"""Golden files: the one-line, `--json`, `-V`, `--hex` and `--stats --json` output of every capture in captures/, byte for byte.

The files in tests/golden/ are what `kafkasniff decode` printed for each capture when they were made. They
change only on purpose: regenerate them with

    KAFKASNIFF_REGEN_GOLDEN=1 python -m pytest tests/test_golden.py

and say in the commit why the output changed.
"""

from __future__ import annotations

import difflib
import gzip
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from capture_manifest import capture_names, load_capture
from kafkasniff.cli import main

GOLDEN = Path(__file__).parent / "golden"
REGENERATE = os.environ.get("KAFKASNIFF_REGEN_GOLDEN") == "1"
# (view name, decode options, golden file suffix); JSON lines are long and base64-heavy: kept gzipped.
VIEWS = [("line", [], ".txt"), ("json", ["--json"], ".jsonl.gz"), ("tree", ["-V"], ".tree.txt.gz"),
         ("hex", ["--hex"], ".hex.txt.gz"), ("stats", ["--stats", "--json"], ".stats.jsonl.gz")]


def decoded(name: str, options: list[str]) -> str:
    result = CliRunner().invoke(main, ["decode", "-j", "1", *options, str(load_capture(name).pcap)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def read_golden(path: Path) -> str:
    raw = path.read_bytes()
    return (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode()


def write_golden(path: Path, text: str) -> None:
    data = text.encode()
    # mtime=0: the same output makes the same file, so regenerating changes only what changed.
    path.write_bytes(gzip.compress(data, mtime=0) if path.suffix == ".gz" else data)


@pytest.mark.parametrize("view, options, suffix", VIEWS, ids=[v[0] for v in VIEWS])
@pytest.mark.parametrize("name", capture_names())
def test_output_matches_the_golden_file(name, view, options, suffix):
    path = GOLDEN / f"{name}{suffix}"
    got = decoded(name, options)
    if REGENERATE:
        write_golden(path, got)
        return
    expected = read_golden(path)
    if got != expected:
        diff = difflib.unified_diff(expected.splitlines(), got.splitlines(), "golden", "now", lineterm="", n=1)
        pytest.fail(f"{view} output of {name} differs from {path.name}:\n" + "\n".join(list(diff)[:40]))
