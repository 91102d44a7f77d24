"""`kafkasniff decode CAPTURE...`: read captures, reassemble TCP, decode and pair Kafka messages."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Iterable, Iterator

import click

from kafkasniff.capture.files import CaptureError, CaptureReader, open_capture
from kafkasniff.capture.packets import TcpSegment
from kafkasniff.commands.parallel import decode_parallel, usable_cores
from kafkasniff.protocol.schema import apis as all_apis
from kafkasniff.render.output import Output, OutputOptions, stdout_gone
from kafkasniff.stream.analyzer import Analyzer

if TYPE_CHECKING:
    from rich.progress import Progress

# Modules that only some views need (rich, records and their codecs) are imported when used:
# start-up runs before any work is shared out, so every import there delays the whole decode.

# Smaller captures decode in a moment: a bar would only flicker.
PROGRESS_MIN_BYTES = 8 << 20
PROGRESS_EVERY = 512  # segments between progress updates
PARALLEL_MIN_BYTES = 8 << 20
MAX_AUTO_JOBS = 4  # beyond that, reading and reassembling in the parent is the limit


def output_options(f):
    """The view and filter options that decode and sniff share."""
    options = [
        click.option("-V", "--verbose", "tree", is_flag=True, help="Full field tree of every message."),
        click.option("--hex", "hex_", is_flag=True, help="Each field's offset and bytes (implies -V)."),
        click.option("--json", "as_json", is_flag=True, help="JSON Lines (schema in the README)."),
        click.option("--api", "apis", multiple=True, help="Only this API (name or key); repeatable."),
        click.option("--topic", "topics", multiple=True, help="Only messages about this topic; repeatable."),
        click.option("--client-id", "client_ids", multiple=True, help="Only this client id; repeatable."),
        click.option("--stream", "streams", type=int, multiple=True, help="Only this TCP stream number."),
        click.option("--errors-only", is_flag=True, help="Only messages with a non-zero error code or malformed."),
        click.option("--stats", is_flag=True,
                     help="Summary per API, topic and client id at the end (alone: only the summary)."),
        click.option("--show-secrets", is_flag=True, help="Show SASL passwords and SCRAM proofs."),
        click.option("--full", is_flag=True, help="Show long keys, values and byte runs whole."),
        click.option("--port", "ports", type=int, multiple=True,
                     help="Kafka broker port hint (Kafka is also found on any port by content)."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _check_apis(apis) -> None:
    known = {a["name"].lower() for a in all_apis().values()} | {str(key) for key in all_apis()}
    unknown = [a for a in apis if a.lower() not in known]
    if unknown:
        raise click.BadParameter(f"unknown API {unknown[0]!r}; `kafkasniff apis` lists the names and keys",
                                 param_hint="--api")


def make_options(tree, hex_, as_json, apis, topics, client_ids, streams, errors_only, stats, show_secrets,
                 full) -> OutputOptions:
    _check_apis(apis)
    return OutputOptions(
        view="json" if as_json else "tree" if tree or hex_ else "line", hex=hex_, show_secrets=show_secrets,
        full_values=full, apis=frozenset(a.lower() for a in apis), topics=frozenset(topics),
        client_ids=frozenset(client_ids), streams=frozenset(streams), errors_only=errors_only, stats=stats)


def wants_progress(stderr, total_size: int) -> bool:
    return total_size >= PROGRESS_MIN_BYTES and stderr.isatty()


def _with_progress(reader: CaptureReader, segments: Iterable[TcpSegment], progress: Progress) -> Iterator[TcpSegment]:
    task = progress.add_task(os.path.basename(reader.path), total=reader.total_size)
    for n, segment in enumerate(segments, 1):
        if n % PROGRESS_EVERY == 0:
            progress.update(task, completed=reader.position)
        yield segment
    progress.update(task, completed=reader.total_size)


def decode_file(reader: CaptureReader, output: Output, ports, jobs: int = 1) -> None:
    def make_analyzer() -> Analyzer:
        return Analyzer(ports)

    show_progress = wants_progress(sys.stderr, reader.total_size)
    if jobs > 1 and output.renders_apart:
        decode_parallel(lambda: _segments(reader, show_progress), output, make_analyzer, jobs)
        return
    analyzer = make_analyzer()
    for ev in analyzer.run(_segments(reader, show_progress)):
        output.emit(ev)


def _segments(reader: CaptureReader, show_progress: bool) -> Iterator[TcpSegment]:
    if not show_progress:
        yield from reader.segments()
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    # On one terminal, stdout goes through the bar (redirect) so lines print above it.
    progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                        console=Console(file=sys.stderr), transient=True, redirect_stdout=sys.stdout.isatty(),
                        redirect_stderr=False)
    with progress:
        yield from _with_progress(reader, reader.segments(), progress)


def default_jobs(reader: CaptureReader, options: OutputOptions) -> int:
    """Small captures decode in a moment in one process: only big ones are worth the workers' start."""
    cores = usable_cores()
    if reader.total_size < PARALLEL_MIN_BYTES or cores == 1:
        return 1
    if options.view != "line":
        return min(cores, MAX_AUTO_JOBS)  # the workers write JSON: they do the most, one per core
    # One line per message leaves the workers little to do next to the main process's reading and
    # reassembly, which keep most of a core busy: one worker more than cores keeps every core busy
    # (on 2 cores, measured: 3 workers 1.6 s, 2 workers 1.75-1.8 s; see bench/README.md).
    return min(cores + 1, MAX_AUTO_JOBS)


@click.command("decode")
@click.argument("captures", nargs=-1, required=True)
@click.option("-j", "--jobs", type=click.IntRange(min=1),
              help="Worker processes (default for captures of 8 MiB or more: one per core, "
                   "one more for the one-line view, at most 4).")
@output_options
def decode_command(captures, ports, jobs, **view) -> None:
    """Decode every Kafka request and response in pcap/pcapng captures (gzip too)."""
    from kafkasniff.commands.terminal import fail

    output = Output(make_options(**view))
    try:
        for path in captures:
            try:
                reader = open_capture(path)
            except CaptureError as e:
                fail(str(e))
            with reader:
                decode_file(reader, output, ports, jobs or default_jobs(reader, output.options))
            for warning in reader.warnings:
                click.echo(f"kafkasniff: warning: {warning}", err=True)
        output.finish()
    except BrokenPipeError:
        stdout_gone()