"""The compiled modules (C, and the C that Cython writes) under AddressSanitizer and UndefinedBehaviorSanitizer.

The package is copied to a temporary folder, its compiled modules are built there with
-fsanitize=address,undefined (any report is fatal), and the tests that drive the compiled code hardest run
against that build in a process of their own: every real frame whole, cut and mutated, random bytes at every
API version, hostile and damaged records, captures of every link type, live capture ring blocks whole and
damaged, TCP cut, reordered and rewritten, captures started at every packet, the golden output of every view, byte
tables of secrets, and TLS record streams (sealed here, cut, damaged) and captures decrypted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SANITIZED_TESTS = ["tests/test_walker.py", "tests/test_partition_facts.py", "tests/test_records.py",
                   "tests/test_robustness.py", "tests/test_capture_files.py", "tests/test_golden.py",
                   "tests/test_compression.py", "tests/test_decode_hard_cases.py", "tests/test_tcp_reassembly.py",
                   "tests/test_mid_start.py", "tests/test_recorded_cases.py", "tests/test_ring_blocks.py",
                   "tests/test_tls_records.py",
                   "tests/test_tls.py::test_every_message_names_the_suite_its_connection_used",
                   "tests/test_tls.py::test_a_corrupted_key_is_reported_and_the_other_connections_decode",
                   "tests/test_tls.py::test_a_capture_starting_mid_connection_decrypts_once_a_record_is_found",
                   "tests/test_hostile_memory.py::test_hostile_records_stay_in_bounded_memory[zstd zeros-tree]",
                   # the byte tables of --hex (render/bytemap.pyx) of secrets; the golden files hold every capture's.
                   # (Not the hostile-input tests: their memory limits do not hold with ASan's shadow memory.)
                   "tests/test_decode_output.py::test_hex_view_masks_the_bytes_of_secrets",
                   "tests/test_decode_output.py::test_hex_view_masks_secret_bytes_inside_sasl_authenticate"]
FLAGS = "-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g -O1"
SANITIZED_RUN_SECONDS = 1800


def _runtime(name: str) -> str | None:
    found = subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
    return found if os.path.isabs(found) and os.path.exists(found) else None


@pytest.mark.skipif(shutil.which("gcc") is None or _runtime("libasan.so") is None, reason="needs gcc with libasan")
# Its own budget, not the suite's 600 s per test: a clean clone builds every module from its Cython source first
# (on a 2-core machine whose cores ran other work, that and the tests took over 600 s), then gives the sanitized
# tests up to SANITIZED_RUN_SECONDS.
@pytest.mark.timeout(1200 + SANITIZED_RUN_SECONDS)
def test_compiled_modules_under_address_and_undefined_behaviour_sanitizers(tmp_path):
    copy = tmp_path / "repository"
    for part in ("kafkasniff", "tests", "captures", "setup.py", "pyproject.toml"):
        source = REPO / part
        if source.is_dir():
            shutil.copytree(source, copy / part, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
        else:
            shutil.copy(source, copy / part)
    if (REPO.parent / "shared").is_dir():  # the schemas and seed documents some tests read, beside the repository
        (tmp_path / "shared").symlink_to(REPO.parent / "shared")
    env = {**os.environ, "CFLAGS": FLAGS, "LDFLAGS": FLAGS}
    built = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=copy, env=env,
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    env = {**os.environ, "PYTHONPATH": str(copy), "LD_PRELOAD": _runtime("libasan.so"),
           # Python itself leaks at exit by design; what matters here are reads and writes out of bounds
           "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1", "UBSAN_OPTIONS": "print_stacktrace=1"}
    # --capture=sys: pytest's default capture of file descriptors ends the process silently under ASan
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--capture=sys",
                          *SANITIZED_TESTS],
                         cwd=copy, env=env, capture_output=True, text=True, timeout=SANITIZED_RUN_SECONDS)
    assert ran.returncode == 0, (ran.stdout[-4000:] + ran.stderr[-4000:])
    assert " passed" in ran.stdout and str(copy) in subprocess.run(
        [sys.executable, "-c", "import kafkasniff.protocol._walk as w; print(w.__file__)"], cwd=copy, env=env,
        capture_output=True, text=True).stdout  # the sanitized build was the one tested
