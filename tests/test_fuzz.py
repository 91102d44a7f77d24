"""The fuzz campaign of tools/fuzz.py, run for 25 seconds: every kind of case runs, and none goes wrong (issue 18)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parent.parent / "tools" / "fuzz.py"


def test_a_short_fuzz_campaign_finds_no_exception_hang_or_crash(tmp_path):
    done = subprocess.run([sys.executable, str(TOOL), "--minutes", "0.42", "--out", str(tmp_path), "--seed", "18"],
                          capture_output=True, text=True, timeout=300)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert done.returncode == 0, (summary, sorted(p.name for p in tmp_path.iterdir()))
    assert json.loads(done.stdout) == summary
    assert (summary["exceptions"], summary["hangs"], summary["crashes"], summary["sanitizer reports"]) == (0, 0, 0, 0)
    assert min(summary[f"{kind} cases"] for kind in ("frame", "batch", "explain", "capture")) > 0, summary
    assert summary["peak_process_mb"] < 200


def test_a_case_that_goes_wrong_is_saved_so_that_it_can_be_made_again(tmp_path):
    """The reproducer of case 7 of seed 18 holds what case_input makes again from (seed, number) alone."""
    sys.path.insert(0, str(TOOL.parent))
    try:
        import fuzz
    finally:
        sys.path.remove(str(TOOL.parent))
    fuzz.save(tmp_path, 18, 7, "exception", "a detail")
    kind, about, data = fuzz.case_input(18, 7)
    (saved,) = tmp_path.iterdir()
    assert saved.name == f"exception-{kind}-7"
    assert (saved / ("input.txt" if kind == "explain" else "input.bin")).read_bytes() == data
    assert json.loads((saved / "case.json").read_text()) == {"seed": 18, "case": 7, "kind": kind, **about,
                                                             "what": "exception", "detail": "a detail"}
