"""`kafkasniff spark INPUT... --out DIR` and `kafkasniff report DIR`: the Spark pipeline.

PySpark is imported only when a command runs, so the rest of the tool works without it.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager

import click

from kafkasniff.commands.decode import tls_keylog_option
from kafkasniff.pipeline.sparkenv import DEFAULT_MASTER

_WARNINGS_SHOWN = 5


def _spark_options(f):
    f = click.option("--conf", "confs", multiple=True, metavar="KEY=VALUE",
                     help="A Spark setting, e.g. spark.executor.memory=4g; repeatable.")(f)
    return click.option("--master", default=DEFAULT_MASTER, show_default=True,
                        help="Spark master URL (local[N], spark://host:7077, yarn, k8s://...).")(f)


def _conf_pairs(confs) -> dict[str, str]:
    from kafkasniff.commands.terminal import fail

    pairs = {}
    for item in confs:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"--conf {item}: give KEY=VALUE")
        pairs[key] = value
    return pairs


@contextmanager
def _spark(master: str, confs):
    """A SparkContext for the command, or exit 2 saying what is missing."""
    from kafkasniff.commands.terminal import fail
    from kafkasniff.pipeline.sparkenv import SparkUnavailable, missing_requirement, spark_context

    problem = missing_requirement()
    if problem:
        fail(problem)
    try:
        with spark_context(master, _conf_pairs(confs)) as context:
            yield context
    except SparkUnavailable as error:
        fail(str(error))


@click.command("spark")
@click.argument("inputs", nargs=-1, required=True, metavar="INPUT...")
@click.option("--out", "out", required=True,
              help="Folder (or hdfs://, s3a://, gs:// URI) for the Parquet tables (made if need be); the tables' "
                   "folders in it are replaced.")
@click.option("--port", "ports", type=int, multiple=True,
              help="Kafka broker port hint (Kafka is also found on any port by content).")
@click.option("--partitions", type=click.IntRange(1),
              help="Partitions the connections are spread over (default: Spark's parallelism, "
                   "spark.default.parallelism).")
@tls_keylog_option
@_spark_options
def spark_command(inputs, out, ports, partitions, master, confs, tls_keylogs) -> None:
    """Decode many captures on Spark into Parquet tables: messages, records, connections, and the consumer
    groups and partitions of the whole run.

    INPUT is a capture file, a folder (searched recursively) or a glob; or a Hadoop URI
    (hdfs://, s3a://, file:///...). A connection split across rotated files (tcpdump -C/-G)
    is reassembled as if it were one capture. TLS connections are decrypted with --tls-keylog files
    (or SSLKEYLOGFILE) and the secrets local pcapng inputs carry; the keys go to the executors with the tasks.
    """
    from kafkasniff.commands.terminal import fail, make_console
    from kafkasniff.pipeline.inputs import InputError, expand_local, expand_uris, is_uri

    try:
        files, warnings = expand_local([i for i in inputs if not is_uri(i)])
    except InputError as error:
        fail(str(error))
    if not is_uri(out):
        out = os.path.abspath(out)
        _check_out(out)
    keylog_text = _keylog_text(tls_keylogs, files)
    with _spark(master, confs) as context:
        try:
            files += expand_uris(context, [i for i in inputs if is_uri(i)])
        except InputError as error:
            fail(str(error))
        if not files:
            fail("no capture files among the inputs")
        from kafkasniff.pipeline.build import build_tables  # (pyarrow: there when Spark could start)

        summary = build_tables(context, files, out, ports, partitions, keylog_text)
    warnings += summary.warnings
    for line in warnings[:_WARNINGS_SHOWN]:
        click.echo(f"kafkasniff: warning: {line}", err=True)
    if len(warnings) > _WARNINGS_SHOWN:
        click.echo(f"kafkasniff: ... and {len(warnings) - _WARNINGS_SHOWN} more warnings", err=True)
    from rich.table import Table as RichTable

    table = RichTable(title=f"Tables written to {out}", header_style="bold")
    for column in ("files", "MB", "packets", "connections", "messages", "records", "seconds", "MB/s"):
        table.add_column(column, justify="right")
    mb = summary.bytes / 1e6
    table.add_row(str(summary.files), f"{mb:.1f}", str(summary.segments), str(summary.connections),
                  str(summary.messages), str(summary.records), f"{summary.seconds:.1f}",
                  f"{mb / summary.seconds:.2f}" if summary.seconds else "-")
    make_console().print(table)


def _check_out(out: str) -> None:
    """A local --out is a folder the tasks can write in, made if need be: said before Spark starts (the tasks' own
    error came from deep in a job, a hundred lines of it)."""
    from kafkasniff.commands.terminal import fail

    if os.path.exists(out) and not os.path.isdir(out):
        fail(f"--out {out}: a file, not a folder; give a folder for the tables (made if it does not exist)")
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as error:
        fail(f"--out {out}: cannot make the folder ({error.strerror}); give a folder you can write in")
    if not os.access(out, os.W_OK | os.X_OK):
        fail(f"--out {out}: cannot write in it; give a folder you can write in")


def _keylog_text(tls_keylogs: tuple[str, ...], files) -> bytes:
    """The key log lines of --tls-keylog (or SSLKEYLOGFILE) and of the local inputs' pcapng secrets."""
    from kafkasniff.capture.secrets import tls_key_log_text
    from kafkasniff.commands.terminal import fail
    from kafkasniff.stream.keylog import keylog_paths

    texts = []
    for path in keylog_paths(tls_keylogs):
        try:
            with open(path, "rb") as f:
                texts.append(f.read())
        except OSError as e:
            fail(f"cannot read the TLS key log {path}: {e.strerror or e}; give a readable --tls-keylog FILE "
                 "(or unset SSLKEYLOGFILE)")
    texts += [tls_key_log_text(f.name) for f in files if f.local]
    return b"\n".join(texts)


@click.command("report")
@click.argument("directory")
@click.option("--json", "as_json", is_flag=True, help="One JSON object with every section.")
@click.option("--top", type=click.IntRange(1), default=20, show_default=True,
              help="Rows in the topics, clients, groups and partitions sections.")
@_spark_options
def report_command(directory, as_json, top, master, confs) -> None:
    """Latency percentiles, error rates, top topics, clients, throttling, consumer groups and partitions
    from `spark` tables."""
    from kafkasniff.commands.terminal import fail, make_console
    from kafkasniff.pipeline.inputs import is_uri
    from kafkasniff.pipeline.report import report
    from kafkasniff.pipeline.sparkenv import sql_session
    from kafkasniff.pipeline.tables import TABLES

    if not is_uri(directory):
        if not os.path.isdir(directory):
            fail(f"{directory}: no such folder; give the --out folder of `kafkasniff spark`")
        missing = [t.name for t in TABLES if not os.path.isdir(os.path.join(directory, t.name))]
        if missing:
            fail(f"{directory}: no {', '.join(missing)} table; give the --out folder of `kafkasniff spark`")
    with _spark(master, confs):
        sections = report(sql_session(), directory, top)
    if as_json:
        click.echo(json.dumps(sections, indent=1))
        return
    console = make_console()
    for name, rows in sections.items():
        console.print(_rich_table(name, rows))


_TITLES = {
    "summary": "Summary",
    "latency": "Response latency per API (ms)",
    "errors": "Error codes in responses (rate: share of that API's responses)",
    "topics": "Top topics by record bytes (key + value)",
    "clients": "Clients",
    "throttle": "Throttle time in responses (ms)",
    "groups": "Consumer groups (generations, longest rebalance in ms, group errors, what started the last)",
    "partitions": "Partitions by bytes produced (lag: the consumer furthest behind at its last fetch, and "
                  "the committed offset furthest behind the log end)",
}


def _rich_table(name: str, rows: list[dict]):
    from rich.table import Table as RichTable
    from rich.text import Text

    if not rows:  # one line: a table without columns wraps its title to a few characters a line
        return Text(f"{_TITLES[name]}: none", style="italic")
    table = RichTable(title=_TITLES[name], header_style="bold", title_justify="left")
    for column in rows[0]:
        value = next((row[column] for row in rows if row[column] is not None), None)  # (the first may be null)
        table.add_column(column, justify="right" if isinstance(value, (int, float)) else "left")
    for row in rows:
        table.add_row(*(_cell(v) for v in row.values()))
    return table


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)
