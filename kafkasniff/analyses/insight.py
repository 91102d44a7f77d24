"""The analyses together, for whoever has MessageEvents: the commands, the live view, --stats, Spark.

    insight = Insight()
    for ev in events:              # MessageEvents in capture order (others are ignored)
        insight.observe(ev)
    insight.to_json()              # {"groups": [...], "lag": {...}, "end_to_end": [...]}
    insight.group_rows()           # the Spark `groups` table: a row per member of each generation
    insight.partition_rows()       # the Spark `partitions` table: a row per topic and partition

Rows are dicts of plain values (str, int, float, bool, None, lists and dicts of them), made from the same
values `groups --json` and `lag --json` print, so the tables hold what the commands say.
"""

from __future__ import annotations

from kafkasniff.analyses.groups import GroupTracker
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
        """Per group, a row per member of each generation (the generation's facts repeated), then a row with
        `generation` null for what happened after the last generation (when anything did, or no generation was
        seen): its start, causes and errors."""
        rows = []
        for group in self.groups.to_json():
            common = {"group_id": group["group_id"], "group_state": group["state"]}
            for gen in group["generations"]:
                facts = {**common, **{key: gen[key] for key in GENERATION_COLUMNS}, "rebalance_ms": gen["took_ms"]}
                rows += [{**facts, **member} for member in gen["members"]] or [{**facts, **NO_MEMBER}]
            after = group["after_last_generation"]
            if after is not None or not group["generations"]:
                after = after or {"started": None, "causes": [], "errors": {}}
                rows.append({**common, **dict.fromkeys(GENERATION_COLUMNS), "events": [], "rebalance_ms": None,
                             **after, **NO_MEMBER})
        return rows

    def partition_rows(self) -> list[dict]:
        """A row per topic and partition: its traffic and log end (lag --json's `partitions`), the consumers
        fetching it (`consumers`, without the samples) and the groups' committed offsets (`committed`)."""
        lag = self.lag.to_json()
        consumers, committed = {}, {}
        for position in lag["consumers"]:
            consumers.setdefault((position["topic"], position["partition"]), []).append(
                {key: value for key, value in position.items() if key not in ("topic", "partition", "samples")})
        for commit in lag["committed"]:
            committed.setdefault((commit["topic"], commit["partition"]), []).append(
                {key: value for key, value in commit.items() if key not in ("topic", "partition")})
        return [{**row, "consumers": consumers.get((row["topic"], row["partition"]), []),
                 "committed": committed.get((row["topic"], row["partition"]), [])}
                for row in self.lag.partitions_json()]


# What a member row of the groups table repeats of its generation (groups --json's keys), and a member's keys.
GENERATION_COLUMNS = ("generation", "protocol", "protocol_type", "assignor", "started", "first_join", "formed",
                      "completed", "causes", "errors", "events")
NO_MEMBER = dict.fromkeys(("member_id", "client_id", "host", "instance_id", "leader", "subscription", "assignment",
                           "assigned_at"))
