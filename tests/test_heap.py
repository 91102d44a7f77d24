"""The allocator keeps freed big buffers for the next ones once a decode has set it up (engine/heap.pyx)."""

import subprocess
import sys

import pytest

# In a fresh interpreter, what a connection's stream buffer goes through for big frames: 64 KiB segments
# appended until a 4 MiB frame is whole, the frame taken out, 50 times; and the minor page faults that took.
CHURN = """
import resource, sys
from kafkasniff.engine import heap
tuned = heap.reuse_freed_memory() if sys.argv[1] == "tuned" else None
segment = bytes(64 << 10)
buffer = bytearray()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    while len(buffer) < 4 << 20:
        buffer += segment
    frame = bytes(buffer)
    del buffer[:], frame
print(tuned, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def churn(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", CHURN, mode], capture_output=True, text=True, check=True).stdout
    tuned, faults = out.split()
    return tuned, int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_freed_big_buffers_are_reused_instead_of_mapped_again():
    tuned, faults_tuned = churn("tuned")
    _, faults_default = churn("default")
    assert tuned == "True"
    pages = (4 << 20) // 4096
    # by default the growing buffer and the frames are mapped again and again, faulted in page by page each time
    # (glibc 2.36: 14,190 faults)
    assert faults_default >= 8 * pages
    # kept in the heap: the buffer and a frame are faulted in once (2,055), then reused
    assert faults_tuned <= 3 * pages
