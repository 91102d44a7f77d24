"""The analyses together, for whoever has MessageEvents: the commands, the live view, --stats, Spark.

    insight = Insight()
    for ev in events:              # MessageEvents in capture order (others are ignored)
        insight.observe(ev)
    insight.to_json()              # {"groups": [...], "lag": {...}, "end_to_end": [...]}
    insight.group_rows()           # one flat record per member of each generation
    insight.partition_rows()       # one flat record per (consumer, topic, partition): fetch position and lag
    insight.commit_rows()          # one per (group, topic, partition): committed offset against the log end
    insight.latency_rows()         # one per (topic, consumer): produce-to-fetch latency of records

Rows are dicts of plain values (str, int, float, None, lists of int), the same for every capture, so they
go straight into a table.
"""

from __future__ import annotations

from kafkasniff.analyses.groups import GroupTracker, causes, started, took_ms
from kafkasniff.analyses.lag import LagTracker
from kafkasniff.analyses.wire import Seen, seen
from kafkasniff.protocol.topics import TopicNames
from kafkasniff.stream.session import MessageEvent


class Insight:
    def __init__(self, samples: bool = True):
        """`samples`: keep every fetch's lag (the lag over time); without, only the last and the largest."""
        self.topic_names = TopicNames()
        self.groups = GroupTracker(self.topic_names)
        self.lag = LagTracker(self.groups, self.topic_names, samples)

    def observe(self, ev) -> None:
        if type(ev) is MessageEvent:
            found = seen(ev)
            if found is not None:
                self.take(found)

    def take(self, s: Seen) -> None:
        """One message as the analyses read it (wire.seen), in capture order."""
        if s.pairs:
            self.topic_names.by_id.update(s.pairs)  # learns the (id, name) pairs, to name ids later
        self.groups.observe(s)
        self.lag.observe(s)

    def to_json(self) -> dict:
        return {"groups": self.groups.to_json(), "lag": self.lag.to_json(), "end_to_end": self.lag.latency.to_json()}

    def group_rows(self) -> list[dict]:
        rows = []
        for group_id, group in sorted(self.groups.groups.items()):
            for gen in group.generations:
                for member_id, assignment in gen.members.items():
                    info = group.member(member_id)
                    rows.append({
                        "group_id": group_id, "generation": gen.generation, "protocol": gen.protocol,
                        "assignor": gen.assignor, "started": started(gen), "formed": gen.formed,
                        "completed": gen.completed, "rebalance_ms": took_ms(gen),
                        "cause": "; ".join(t.text for t in causes(gen)), "member_id": member_id,
                        "client_id": info.client_id, "host": info.host, "leader": member_id == gen.leader,
                        "assignment": [[topic, partition] for topic, partitions in (assignment or {}).items()
                                       for partition in partitions]})
        return rows

    def partition_rows(self) -> list[dict]:
        rows = []
        for position in self.lag.consumer_rows():
            last, worst = position.last, position.max_lag
            rows.append({"group": position.group, "client_id": position.client_id, "topic": position.topic,
                         "partition": position.partition, "fetches": position.fetches, "fetched_at": last[0],
                         "fetch_offset": last[1], "high_watermark": last[2], "last_stable_offset": last[3],
                         "lag": last[4], "max_lag": worst[4], "max_lag_at": worst[0],
                         "delivered_to": self.lag.delivered_to(position)})
        return rows

    def commit_rows(self) -> list[dict]:
        return [self.lag.commit_json(commit) for _, commit in sorted(self.lag.commits.items())]

    def latency_rows(self) -> list[dict]:
        rows = []
        for topic in self.lag.latency.to_json():
            for consumer in topic["consumers"]:
                rows.append({"topic": topic["topic"], "consumer": consumer["consumer"],
                             "records": consumer["records"], **consumer["latency_ms"]})
        return rows
