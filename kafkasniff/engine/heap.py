"""The garbage collector's settings for a long decoding loop."""

from __future__ import annotations

import gc
from contextlib import contextmanager

# What a decoding loop allocates (segments, messages, events, lines) is freed by reference counting as soon
# as it has been shown; the collector's default, a pass every 700 allocations, then spends about 5 % of a
# decode (measured with callgrind) walking the objects that live on: schema tables, layouts, sessions.
YOUNG_ALLOCATIONS_PER_PASS = 50_000
PASSES_PER_OLDER_PASS = (20, 100)


def collect_rarely() -> None:
    """Keep what start-up made out of every collection, and collect cycles seldom."""
    gc.freeze()
    gc.set_threshold(YOUNG_ALLOCATIONS_PER_PASS, *PASSES_PER_OLDER_PASS)


@contextmanager
def collecting_rarely():
    """collect_rarely's thresholds for the time of a loop in a process that lives on after it (a Spark worker:
    the task's leftovers are not frozen, which would keep any garbage cycle among them for good)."""
    before = gc.get_threshold()
    gc.set_threshold(YOUNG_ALLOCATIONS_PER_PASS, *PASSES_PER_OLDER_PASS)
    try:
        yield
    finally:
        gc.set_threshold(*before)
