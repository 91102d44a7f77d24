"""Rich tables of the analyses (kafkasniff.analyses): consumer-group generations, consumer lag, committed
offsets and produce-to-fetch latency, for `groups`, `lag`, `--stats` and the live view."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from kafkasniff.analyses.groups import Group, GroupTracker, causes, clock, named, took_ms
from kafkasniff.analyses.histogram import PERCENTILES
from kafkasniff.analyses.lag import LagTracker


def _table(title: str, columns: tuple[str, ...], numeric: set[str]) -> Table:
    table = Table(title=title, title_justify="left", header_style="bold", show_edge=False)
    for col in columns:
        table.add_column(col, justify="right" if col in numeric else "left")
    return table


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:,.1f}"


def assignment_text(assignment: dict | None) -> str:
    if not assignment:
        return "(none)" if assignment is not None else "?"
    return " ".join(f"{topic}[{','.join(map(str, partitions))}]" for topic, partitions in assignment.items())


def group_table(group: Group, by_id: dict[str, str]) -> Table:
    """One row per member of each generation; the generation's facts on its first member's row, then a row per
    event settled within it (by_id: topic names of the ids assignments carry)."""
    latest = group.latest
    kind = f"{latest.protocol} protocol" if latest is not None else "no generation seen"
    table = _table(f"group {group.group_id} ({kind}): {group.state()}",
                   ("gen", "formed", "rebalance ms", "cause", "errors", "member", "host", "assignment"),
                   {"gen", "rebalance ms"})
    for gen in group.generations:
        errors = gen.rebalance.errors + gen.errors
        first = True
        for member_id, assignment in gen.members.items():
            info = group.member(member_id)
            leader = "*" if member_id == gen.leader else ""
            facts = (str(gen.generation), clock(gen.formed), _ms(took_ms(gen)),
                     "\n".join(t.text for t in causes(gen)),
                     ", ".join(f"{name}×{n}" for name, n in sorted(errors.items()))) if first else ("",) * 5
            table.add_row(*facts[:3], Text(facts[3]), facts[4], Text(leader + info.label()),
                          gen.hosts.get(member_id, info.host) or "",
                          Text(assignment_text(named(assignment, by_id))))
            first = False
        for event in gen.events:
            table.add_row("", clock(event.ts), "", Text(event.text), "", "", "", "")
        table.add_section()
    if group.pending.triggers or group.pending.errors:
        table.add_row("", "after", "", Text("\n".join(t.text for t in sorted(group.pending.triggers,
                                                                             key=lambda t: t.ts))),
                      ", ".join(f"{name}×{n}" for name, n in sorted(group.pending.errors.items())), "", "", "")
    return table


def group_tables(groups: GroupTracker) -> list[Table]:
    return [group_table(group, groups.topic_names.by_id) for _, group in sorted(groups.groups.items())]


def lag_tables(lag: LagTracker) -> list[Table]:
    tables = []
    rows = lag.consumer_rows()
    if rows:
        fetching = _table("consumer lag from Fetch (lag = high watermark, or last stable offset when "
                          "read_committed, minus fetch offset)",
                          ("consumer", "topic", "partition", "fetches", "fetch offset", "high watermark",
                           "last stable", "lag", "max lag", "max lag at", "delivered to"),
                          {"partition", "fetches", "fetch offset", "high watermark", "last stable", "lag",
                           "max lag", "delivered to"})
        for p in rows:
            _, offset, high_watermark, last_stable, now = p.last
            delivered = lag.delivered_to(p)
            fetching.add_row(Text(p.consumer), Text(p.topic or "?"), str(p.partition), f"{p.fetches:,}",
                             f"{offset:,}", f"{high_watermark:,}", f"{last_stable:,}", f"{now:,}",
                             f"{p.max_lag[4]:,}", clock(p.max_lag[0]), "" if delivered is None else f"{delivered:,}")
        tables.append(fetching)
    if lag.commits:
        committed = _table("committed offsets (lag = log end seen in Fetch, Produce and ListOffsets minus committed)",
                           ("group", "topic", "partition", "committed", "commits", "log end", "lag", "at"),
                           {"partition", "committed", "commits", "log end", "lag"})
        for _, commit in sorted(lag.commits.items()):
            row = lag.commit_json(commit)
            committed.add_row(Text(row["group"]), Text(row["topic"] or "?"), str(row["partition"]),
                              f"{row['committed_offset']:,}", f"{row['commits']:,}",
                              "" if row["log_end_offset"] is None else f"{row['log_end_offset']:,}",
                              "" if row["lag"] is None else f"{row['lag']:,}", clock(row["committed_at"]))
        tables.append(committed)
    return tables


def latency_table(lag: LagTracker) -> Table | None:
    topics = lag.latency.to_json()
    if not topics:
        return None
    table = _table("end-to-end latency, Produce request to Fetch response (ms)",
                   ("topic", "consumer", "records", *(f"p{p}" for p in PERCENTILES), "max"),
                   {"records", *(f"p{p}" for p in PERCENTILES), "max"})
    for topic in topics:
        rows = [("(all)", topic["records"], topic["latency_ms"])] if len(topic["consumers"]) > 1 else []
        rows += [(c["consumer"], c["records"], c["latency_ms"]) for c in topic["consumers"]]
        for consumer, records, ms in rows:
            table.add_row(Text(topic["topic"]), Text(consumer), f"{records:,}",
                          *(_ms(ms[f"p{p}"]) for p in PERCENTILES), _ms(ms["max"]))
    return table
