"""`kafkasniff groups CAPTURE...` and `kafkasniff lag CAPTURE...`: consumer groups, consumer lag and
produce-to-fetch latency, from the wire (kafkasniff.analyses)."""

from __future__ import annotations

import sys

import click

from kafkasniff.analyses.insight import Insight
from kafkasniff.commands.decode import tls_keylog_option


def analysed(captures, ports, tls_keylogs, samples: bool) -> Insight:
    """Every capture through one Insight, in the order given (a later capture continues an earlier one); TLS
    connections decrypted as `decode` decrypts them (--tls-keylog, SSLKEYLOGFILE, a pcapng's secrets). Those left
    encrypted are said in a warning: their messages are missing from what the analyses found."""
    from kafkasniff.commands.decode import open_input, open_keylog, warn_of
    from kafkasniff.stream.analyzer import Analyzer
    from kafkasniff.stream.session import NOT_DECODED, NoticeEvent

    insight = Insight(samples)
    keylog = open_keylog(tls_keylogs)
    for path in captures:
        encrypted = set()  # the streams whose TLS could not be decrypted
        with open_input(path, keylog) as reader:
            for ev in Analyzer(ports, keylog=keylog).run(reader.segments()):
                if type(ev) is NoticeEvent and ev.kind == "tls" and NOT_DECODED in ev.text:
                    encrypted.add(ev.conn.stream)
                insight.observe(ev)
        warn_of(reader)
        if encrypted:
            click.echo(f"kafkasniff: warning: {path}: {len(encrypted):,} TLS connections not decrypted, their messages "
                       "not analysed; give their key log (--tls-keylog FILE, or SSLKEYLOGFILE)", err=True)
    return insight


def _print_json(value) -> None:
    import orjson

    click.echo(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode())


def _print_tables(tables, nothing: str) -> None:
    from kafkasniff.commands.terminal import make_console
    from kafkasniff.render.tables import print_tables

    tables = [table for table in tables if table is not None]
    if not tables:
        make_console().print(nothing)
    print_tables(tables, sys.stdout)


captures_argument = click.argument("captures", nargs=-1, required=True)
json_option = click.option("--json", "as_json", is_flag=True, help="JSON instead of tables (schema in the README).")
port_option = click.option("--port", "ports", type=int, multiple=True,
                           help="Broker port hint, as for decode (Kafka is found on any port).")


@click.command("groups")
@captures_argument
@json_option
@port_option
@tls_keylog_option
def groups_command(captures, as_json, ports, tls_keylogs) -> None:
    """Consumer groups in captures: each group's generations, with their members, the decoded assignment
    of each, how long the rebalance took, what started it and the errors seen.

    Classic groups (JoinGroup/SyncGroup), KIP-848 (ConsumerGroupHeartbeat) and share groups."""
    insight = analysed(captures, tuple(ports), tls_keylogs, samples=False)
    if as_json:
        _print_json(insight.groups.to_json())
        return
    from kafkasniff.render.insight import group_tables

    _print_tables(group_tables(insight.groups), "no consumer-group traffic in the capture")


@click.command("lag")
@captures_argument
@json_option
@port_option
@tls_keylog_option
def lag_command(captures, as_json, ports, tls_keylogs) -> None:
    """Consumer lag in captures: per consumer (group, else client id), topic and partition, the fetch
    offset against the high watermark (and last stable offset) of each Fetch response; committed offsets
    against the log end; and how long records took from Produce to Fetch, per topic.

    --json gives every fetch's lag too (the lag over time), and each partition's traffic."""
    insight = analysed(captures, tuple(ports), tls_keylogs, samples=as_json)
    if as_json:
        _print_json({"lag": insight.lag.to_json(), "end_to_end": insight.lag.latency.to_json(),
                     "partitions": insight.lag.partitions_json()})
        return
    from kafkasniff.render.insight import lag_tables, latency_table

    _print_tables([*lag_tables(insight.lag), latency_table(insight.lag)], "no consumer fetched in the capture")
