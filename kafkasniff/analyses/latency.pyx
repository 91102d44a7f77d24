# cython: language_level=3
"""Produce-to-fetch latency: how long a record took from its producer to each consumer, per topic.

A Produce response gives the offset of the first record of each partition's batch in its request; a batch's
header says how many offsets its records take. So every produced record is known by (topic, partition,
offset) together with the time its Produce request was captured. A Fetch response to a consumer carries
record batches whose headers give their offsets: each record fetched for the first time by that consumer
(a group, or a client id outside groups) is matched to its produced offset, and the time from the Produce
request to the Fetch response is its latency. Records are counted from batch headers, never decoded.

Only records whose Produce request and response are both in the capture count (acks=0 produces have no
offsets). What a consumer re-fetches (after a rebalance, a seek) does not count again. A consumer may fetch
records before their Produce response is captured (the broker makes them readable before it answers, on
another connection): such fetches wait, a bounded number per partition, for the Produce response.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque

from kafkasniff.analyses.histogram import LatencyHistogram

# Produced batches remembered per partition: beyond this many, the oldest half are forgotten (a live capture
# runs for days; a consumer that far behind gets no latency for those records).
MAX_PRODUCED_BATCHES = 100_000
# Fetched batches waiting for their Produce response, per partition; the oldest are forgotten first.
MAX_EARLY_FETCHES = 1_000


class ProducedLog:
    """One partition's produced offset ranges, in offset order, with the capture time of their Produce."""

    __slots__ = ("bases", "ranges")

    def __init__(self) -> None:
        self.bases: list[int] = []
        self.ranges: list[tuple[int, int, float]] = []  # (first offset, last offset, produce time)

    def add(self, first: int, last: int, ts: float) -> None:
        if self.ranges and first <= self.ranges[-1][0]:
            at = bisect_right(self.bases, first)
            self.bases.insert(at, first)
            self.ranges.insert(at, (first, last, ts))
        else:
            self.bases.append(first)
            self.ranges.append((first, last, ts))
        if len(self.ranges) > MAX_PRODUCED_BATCHES:
            del self.bases[:MAX_PRODUCED_BATCHES // 2]
            del self.ranges[:MAX_PRODUCED_BATCHES // 2]

    def overlapping(self, first: int, last: int):
        """(records, produce time) of every produced range that offsets first..last meet."""
        at = max(bisect_right(self.bases, first) - 1, 0)
        ranges = self.ranges
        while at < len(ranges):
            start, end, ts = ranges[at]
            if start > last:
                return
            if end >= first:
                yield min(end, last) - max(start, first) + 1, ts
            at += 1


class EndToEnd:
    def __init__(self) -> None:
        self.produced: dict[tuple[str, int], ProducedLog] = {}
        self.delivered: dict[tuple[str, str, int], int] = {}  # (consumer, topic, partition) -> next offset
        self.by_topic: dict[str, LatencyHistogram] = {}
        self.by_consumer: dict[tuple[str, str], LatencyHistogram] = {}  # (topic, consumer)
        # (topic, partition) -> (consumer, first offset, last offset, fetch time) not yet known produced
        self.early: dict[tuple[str, int], deque] = {}

    def produce(self, topic: str, partition: int, base_offset: int, batches: list, ts: float) -> None:
        """A Produce request's batches for a partition (walker.BATCH_FACTS), whose first offset the response
        gave: the records take consecutive offsets from there."""
        log = self.produced.get((topic, partition))
        if log is None:
            log = self.produced[topic, partition] = ProducedLog()
        early = self.early.get((topic, partition))
        for batch in batches:
            last = base_offset + batch[1]
            log.add(base_offset, last, ts)
            for consumer, first_fetched, last_fetched, fetched_at in early or ():
                records = min(last, last_fetched) - max(base_offset, first_fetched) + 1
                if records > 0:
                    self._matched(topic, consumer, (fetched_at - ts) * 1000, records)
            base_offset = last + 1

    def fetch(self, consumer: str, topic: str, partition: int, batches: list, ts: float) -> None:
        """A Fetch response's batches for a partition, delivered to `consumer` at `ts`."""
        log = self.produced.get((topic, partition))
        key = (consumer, topic, partition)
        delivered = self.delivered.get(key)
        for base_offset, last_offset_delta, _records, is_control, _max_ts in batches:
            last = base_offset + last_offset_delta
            first = base_offset if delivered is None else max(base_offset, delivered)
            if is_control or last < first:
                continue
            delivered = last + 1
            matched = 0
            for records, produced_at in log.overlapping(first, last) if log is not None else ():
                self._matched(topic, consumer, (ts - produced_at) * 1000, records)
                matched += records
            if matched <= last - first:
                early = self.early.get((topic, partition))
                if early is None:
                    early = self.early[topic, partition] = deque(maxlen=MAX_EARLY_FETCHES)
                early.append((consumer, first, last, ts))
        if delivered is not None:
            self.delivered[key] = delivered

    def _matched(self, topic: str, consumer: str, ms: float, records: int) -> None:
        self._histogram(self.by_topic, topic).add(ms, records)
        self._histogram(self.by_consumer, (topic, consumer)).add(ms, records)

    @staticmethod
    def _histogram(table: dict, key) -> LatencyHistogram:
        found = table.get(key)
        if found is None:
            found = table[key] = LatencyHistogram()
        return found

    def to_json(self) -> list[dict]:
        """Per topic: records matched and their latency (ms); and the same per consumer."""
        return [{"topic": topic, "records": hist.count, "latency_ms": hist.to_json(),
                 "consumers": [{"consumer": consumer, "records": h.count, "latency_ms": h.to_json()}
                               for (t, consumer), h in sorted(self.by_consumer.items()) if t == topic]}
                for topic, hist in sorted(self.by_topic.items())]
