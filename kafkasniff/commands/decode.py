"""`kafkasniff decode CAPTURE...`: read captures, reassemble TCP, decode and pair Kafka messages."""

from __future__ import annotations

import os
import sys
from itertools import chain
from typing import TYPE_CHECKING, Iterable, Iterator

import click

from kafkasniff.capture.files import CaptureError, CaptureReader, open_capture
from kafkasniff.capture.packets import TcpSegment
from kafkasniff.engine.heap import collect_rarely
from kafkasniff.engine.parallel import decode_parallel, usable_cores
from kafkasniff.render.output import Output, OutputOptions, stdout_gone
from kafkasniff.stream.analyzer import Analyzer
from kafkasniff.stream.keylog import KeyLog, KeyLogError, keylog_paths

if TYPE_CHECKING:
    from rich.progress import Progress

# Modules that only some views or inputs need (rich, records and their codecs, a pipe's reading thread)
# are imported when used: start-up runs before any work is shared out, so every import there delays the
# whole decode.

# Smaller captures decode in a moment: a bar would only flicker.
PROGRESS_MIN_BYTES = 8 << 20
PARALLEL_MIN_BYTES = 8 << 20
# ... and packets: the workers save a few microseconds of the main process's time per packet, and every byte of
# the streams crosses a pipe to them. A capture of big messages (records-heavy: 64 MB in 3,500 packets) decodes
# faster in one process, whose one-line view reads only the batches' headers (0.12 s against 0.22 s).
PARALLEL_MIN_PACKETS = 50_000
MAX_AUTO_JOBS = 4  # beyond that, reading and reassembling in the parent is the limit
# A capture through a pipe: how long the decoding waits for a segment before it looks for a stop
# signal and lets capture time pass; and how many segments read ahead may wait for it.
STREAM_POLL_S = 0.2
STREAM_READ_AHEAD = 4096


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
                     help="Broker port hint, for where the bytes fit either way (a captured handshake and "
                          "the bytes decide first; Kafka and TLS are found on any port)."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def tls_keylog_option(f):
    return click.option("--tls-keylog", "tls_keylogs", multiple=True, metavar="FILE",
                        help="TLS key log (NSS format, as SSLKEYLOGFILE writes) to decrypt TLS connections; "
                             "repeatable. Default: the file SSLKEYLOGFILE names.")(f)


def open_keylog(tls_keylogs: tuple[str, ...], follow: bool = False) -> KeyLog:
    """The key logs of --tls-keylog (or SSLKEYLOGFILE); a file that cannot be read is a CLI error."""
    from kafkasniff.commands.terminal import fail

    try:
        keylog = KeyLog(keylog_paths(tls_keylogs), follow=follow)
    except KeyLogError as e:
        fail(f"{e}; give a readable --tls-keylog FILE (or unset SSLKEYLOGFILE)")
    if keylog.bad_lines:
        click.echo(f"kafkasniff: warning: {keylog.bad_lines:,} lines of the TLS key logs are not key log lines "
                   "(LABEL <client random> <secret>, in hex); skipped", err=True)
    return keylog


def open_input(path: str, keylog: KeyLog) -> CaptureReader:
    """A capture given on the command line (one that cannot be read is a CLI error), the TLS secrets a pcapng file
    carries added to `keylog`."""
    from kafkasniff.capture.secrets import tls_key_log_text
    from kafkasniff.commands.terminal import fail

    try:
        reader = open_capture(path)
    except CaptureError as e:
        fail(str(e))
    if not reader.streaming:
        keylog.add_text(tls_key_log_text(path))
    return reader


def warn_of(reader: CaptureReader) -> None:
    """What reading the capture warned of, on standard error."""
    for warning in reader.warnings:
        click.echo(f"kafkasniff: warning: {warning}", err=True)


def make_options(tree, hex_, as_json, apis, topics, client_ids, streams, errors_only, stats, show_secrets,
                 full) -> OutputOptions:
    """The options of a view and its filters; views given together (other than --stats) are a CLI error."""
    from kafkasniff.commands.terminal import api_key_named, fail

    if as_json and (tree or hex_):
        # --hex's rows and -V's tree are not in the JSON lines: given with --json, they would be dropped unsaid
        fail(f"{'--hex' if hex_ else '-V'} and --json are two views, shown one at a time: pick one of them")
    for api in apis:
        api_key_named("--api", api)
    return OutputOptions(
        view="json" if as_json else "tree" if tree or hex_ else "line", hex=hex_, show_secrets=show_secrets,
        full_values=full, apis=frozenset(a.lower() for a in apis), topics=frozenset(topics),
        client_ids=frozenset(client_ids), streams=frozenset(streams), errors_only=errors_only, stats=stats)


def wants_progress(stderr, total_size: int) -> bool:
    return total_size >= PROGRESS_MIN_BYTES and stderr.isatty()


def _with_progress(reader: CaptureReader, batches: Iterable[list[TcpSegment]],
                   progress: Progress) -> Iterator[list[TcpSegment]]:
    task = progress.add_task(os.path.basename(reader.path), total=reader.total_size)
    for batch in batches:  # the segments of a chunk read
        yield batch
        progress.update(task, completed=reader.position)
    progress.update(task, completed=reader.total_size)


def decode_file(reader: CaptureReader, output: Output, ports, jobs: int = 1, keylog: KeyLog | None = None) -> None:
    """keylog: secrets for the TLS connections (workers get them: they fork after make_analyzer is made)."""
    def make_analyzer() -> Analyzer:
        return Analyzer(ports, keylog=keylog)

    collect_rarely()
    if keylog:  # workers fork from here: they inherit the TLS layer (and cryptography) instead of each importing it
        import kafkasniff.stream.tls  # noqa: F401
    if reader.streaming:
        decode_stream(reader, output, make_analyzer())
        return
    show_progress = wants_progress(sys.stderr, reader.total_size)
    if jobs > 1 and output.renders_apart:
        decode_parallel(lambda: _segment_batches(reader, show_progress), output, make_analyzer, jobs)
        return
    analyzer = make_analyzer()
    for ev in analyzer.run(chain.from_iterable(_segment_batches(reader, show_progress))):
        output.emit(ev)


def decode_stream(reader: CaptureReader, output: Output, analyzer: Analyzer) -> None:
    """A capture coming through a pipe (`tcpdump -w - | kafkasniff decode -`), decoded as it arrives:
    standard output is flushed whenever the decoding has caught up with the pipe, so each message shows
    once its last byte is in. As in sniff, Ctrl-C or SIGTERM stop the reading; the messages in flight
    are finished, then the summary is printed.

    A thread reads the segments, so that a stop signal, which only sets a flag, is seen even while a
    read waits on the pipe. While the pipe is idle, capture time goes on from the last segment's time,
    so a hole is given up after the same wait as when sniffing."""
    import queue
    import signal
    import threading
    import time

    segments: queue.Queue = queue.Queue(STREAM_READ_AHEAD)
    failure: list[BaseException] = []
    stop = threading.Event()

    def read() -> None:
        try:
            for segment in reader.segments():
                if stop.is_set():
                    return
                segments.put(segment)
        except BaseException as error:  # for the decoding thread to raise, unless it stopped reading
            failure.append(error)
        segments.put(None)

    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    threading.Thread(target=read, name="kafkasniff-read", daemon=True).start()
    last_ts = arrived = None
    unflushed = False  # events written since the last flush
    try:
        while not stop.is_set():
            try:
                segment = segments.get(timeout=STREAM_POLL_S)
            except queue.Empty:
                if last_ts is not None:
                    unflushed |= _show(output, analyzer.tick(last_ts + time.monotonic() - arrived))
                if unflushed:
                    output.flush()
                    unflushed = False
                continue
            if segment is None:
                if failure:
                    raise failure[0]
                break
            last_ts, arrived = segment.ts, time.monotonic()
            # (flushed once the pipe has nothing more for now, whether or not its last segment completed a message:
            # a burst usually ends with an ACK or a FIN)
            unflushed |= _show(output, analyzer.feed(segment))
            if unflushed and segments.empty():
                output.flush()
                unflushed = False
        _show(output, analyzer.finish())
    finally:
        stop.set()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _show(output: Output, events: list) -> bool:
    for ev in events:
        output.emit(ev)
    return bool(events)


class FileLabels:
    """Standard output when several captures are decoded, saying which capture each event comes from:
    one-line view lines start with `PATH: `, JSON lines get a "file" key, and the tree view shows a
    heading before each capture's first event. `start` is called before each capture, after what came
    before it has been written; `start(None)` (the --stats summary after the last) labels nothing."""

    def __init__(self, view: str):
        self.view = view
        self._label = ""        # what starts each line of the capture being decoded
        self._heading = ""      # what the tree view prints before the capture's first event
        self._at_line_start = True

    def start(self, path: str | None) -> None:
        self._at_line_start = True
        if path is None:
            self._label = self._heading = ""
        elif self.view == "tree":
            self._heading = f"==> {path} <==\n"
        elif self.view == "json":
            import json

            self._label = f'{{"file":{json.dumps(path)},'
        else:
            self._label = f"{path}: "

    def write(self, text: str) -> int:
        if self._heading and text:
            sys.stdout.write(self._heading)
            self._heading = ""
        label = self._label
        if not label or not text:
            return sys.stdout.write(text)
        # Lines may come in pieces (JSON is written between records): only a line's start is labelled;
        # a JSON line's label takes the place of its opening brace.
        skip = 1 if self.view == "json" else 0
        pieces = text.split("\n")
        for i, piece in enumerate(pieces):
            if piece and (i or self._at_line_start):
                pieces[i] = label + piece[skip:]
        self._at_line_start = not pieces[-1]
        sys.stdout.write("\n".join(pieces))
        return len(text)

    def flush(self) -> None:
        sys.stdout.flush()

    def isatty(self) -> bool:
        return sys.stdout.isatty()


def _segment_batches(reader: CaptureReader, show_progress: bool) -> Iterator[list[TcpSegment]]:
    if not show_progress:
        yield from reader.segment_batches()
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    # On one terminal, stdout goes through the bar (redirect) so lines print above it.
    progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                        console=Console(file=sys.stderr), transient=True, redirect_stdout=sys.stdout.isatty(),
                        redirect_stderr=False)
    with progress:
        yield from _with_progress(reader, reader.segment_batches(), progress)


def default_jobs(reader: CaptureReader, options: OutputOptions) -> int:
    """Small captures decode in a moment in one process: only big ones are worth the workers' start."""
    cores = usable_cores()
    if reader.total_size < PARALLEL_MIN_BYTES or cores == 1 or reader.estimated_packets() < PARALLEL_MIN_PACKETS:
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
@tls_keylog_option
@output_options
def decode_command(captures, ports, jobs, tls_keylogs, **view) -> None:
    """Decode every Kafka request and response in pcap/pcapng captures (gzip too).

    CAPTURES are files, or - for standard input (tcpdump -w - | kafkasniff decode -), which is decoded
    as it arrives until it ends or Ctrl-C. TLS connections are decrypted with --tls-keylog files and the
    secrets pcapng files carry (editcap --inject-secrets)."""
    options = make_options(**view)
    labels = FileLabels(options.view) if len(captures) > 1 else None
    output = Output(options, labels)
    keylog = open_keylog(tls_keylogs)
    try:
        for path in captures:
            reader = open_input(path, keylog)
            if labels is not None:
                output.flush()
                labels.start(path)
            with reader:
                decode_file(reader, output, ports, jobs or default_jobs(reader, output.options), keylog)
            warn_of(reader)
        if labels is not None:
            output.flush()
            labels.start(None)
        output.finish()
    except BrokenPipeError:
        stdout_gone()