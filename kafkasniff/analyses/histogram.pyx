# cython: language_level=3
"""Latency percentiles in memory that does not grow with the number of latencies: --stats, the end-to-end
latency of records, the live view.

Compiled: --stats adds a latency for every response (a worker's share of 70,000 on bench60), and in Python each
addition cost as much as counting the rest of the message."""

from __future__ import annotations

import math
from collections import Counter

from libc.math cimport log

PERCENTILES = (50, 95, 99)


_RATIO = 1.01
_FLOOR_MS = 0.001
cdef double _LOG_RATIO = math.log(_RATIO), _FLOOR = _FLOOR_MS
cdef double _LONGEST_MS = 1e15  # 31,700 years


cdef class LatencyHistogram:
    """Latencies in buckets 1% wide on a log scale, from 1 µs up; below 1 µs, one bucket.

    A percentile is the geometric middle of the bucket that holds it, clamped to
    the smallest and largest latency seen: within 0.5% of the exact value
    (nearest-rank definition), or within 1 µs below 1 µs. The maximum is exact.
    Buckets are kept only when used: 2,085 span 1 µs to 1,000 s.
    """

    cdef public object buckets  # Counter: bucket -> latencies
    cdef public long long count
    cdef public double min, max, total

    RATIO = _RATIO
    FLOOR_MS = _FLOOR_MS

    def __init__(self) -> None:
        self.buckets: Counter[int] = Counter()
        self.count = 0
        self.min = math.inf
        self.max = -math.inf
        self.total = 0.0  # the sum of the latencies (Prometheus histograms give it)

    cpdef add(self, double ms, long long times=1):
        """One latency, or `times` equal ones (records of a batch)."""
        if not ms >= 0.0:
            ms = 0.0  # capture clocks can step back; a negative latency means "no time" (and so does NaN)
        elif ms > _LONGEST_MS:
            ms = _LONGEST_MS  # its bucket must fit the integer it is computed into
        self.count += times
        self.total += ms * times
        if ms < self.min:
            self.min = ms
        if ms > self.max:
            self.max = ms
        bucket = <long long>(log(ms / _FLOOR) / _LOG_RATIO) if ms >= _FLOOR else -1  # as int(math.log(...))
        # The Counter read and written as the dict it is: assigning a Counter's item through its type is a Python
        # call (Counter defines __delitem__, which takes dict's slot for both), 2,000 instructions an addition.
        cdef dict buckets = <dict>self.buckets
        buckets[bucket] = buckets.get(bucket, 0) + times

    def merge(self, other: LatencyHistogram) -> None:
        """Add another histogram's latencies (a parallel decode's worker's): the same buckets, minimum, maximum and
        percentiles as if they had been added here."""
        self.buckets.update(other.buckets)
        self.count += other.count
        self.total += other.total
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    def _middle(self, bucket: int) -> float:
        if bucket < 0:
            return self.FLOOR_MS / 2
        return self.FLOOR_MS * self.RATIO ** (bucket + 0.5)

    def upper_bound(self, bucket: int) -> float:
        """The largest latency (ms) the bucket holds."""
        return self.FLOOR_MS if bucket < 0 else self.FLOOR_MS * self.RATIO ** (bucket + 1)

    def since(self, before: Counter) -> LatencyHistogram:
        """The latencies added since the buckets were `before` (a copy of `buckets`): a window's histogram,
        its percentiles clamped to this one's minimum and maximum."""
        window = LatencyHistogram()
        window.buckets = self.buckets - before
        window.count = sum(window.buckets.values())
        window.min, window.max = self.min, self.max
        return window

    def percentile(self, p: float) -> float | None:
        if not self.count:
            return None
        rank = max(1, math.ceil(p / 100 * self.count))
        seen = 0
        for bucket in sorted(self.buckets):
            seen += self.buckets[bucket]
            if seen >= rank:
                return min(max(self._middle(bucket), self.min), self.max)
        return self.max

    def to_json(self) -> dict:
        out = {"count": self.count}
        for p in PERCENTILES:
            value = self.percentile(p)
            out[f"p{p}"] = round(value, 3) if value is not None else None
        out["max"] = round(self.max, 3) if self.count else None
        return out
