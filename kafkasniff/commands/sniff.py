"""`kafkasniff sniff -i IFACE`: capture live and decode through the same pipeline as `decode`."""

from __future__ import annotations

import signal
import sys
import time

from typing import TYPE_CHECKING

import click

from kafkasniff.commands.decode import make_options, open_keylog, output_options, tls_keylog_option
from kafkasniff.engine.heap import collect_rarely
from kafkasniff.engine.parallel import sniff_parallel
from kafkasniff.render.output import Output, stdout_gone
from kafkasniff.stream.analyzer import Analyzer
from kafkasniff.stream.session import MessageEvent

if TYPE_CHECKING:
    from kafkasniff.capture.live import LiveCapture

DEFAULT_PORT = 9092
TOP_REFRESH_S = 1.0


@click.command("sniff")
@click.option("-i", "--interface", help="Interface to capture on (see --list-interfaces).")
@click.option("--list-interfaces", is_flag=True, help="List the interfaces and exit.")
@click.option("--any-port", is_flag=True, help="Capture all TCP (Kafka is found by content).")
@click.option("--filter", "bpf_filter", metavar="EXPR", help="Raw BPF capture filter, e.g. 'tcp and host 10.0.0.5'.")
@click.option("-w", "--write", "pcap_path", type=click.Path(dir_okay=False),
              help="Also write every captured packet to this pcap file.")
@click.option("-c", "--count", type=click.IntRange(min=1), help="Stop after this many Kafka messages shown.")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Stop after this many seconds.")
# The ring is at least capture.live.RING_MIN_BLOCKS (4) blocks of 512 KiB (a 256 KiB frame each): 2 MiB.
@click.option("-B", "--buffer-size", "buffer_mib", type=click.IntRange(min=2), default=32, show_default=True,
              help="Kernel capture buffer in MiB, at least 2; raise it if drops are reported.")
@click.option("--top", is_flag=True, help="A live dashboard instead of messages: rates, latency and errors per "
              "API, client id and topic, rebalances, consumer lag; refreshed every second.")
@click.option("--metrics-port", type=click.IntRange(1, 65535), metavar="PORT",
              help="Serve Prometheus metrics on http://0.0.0.0:PORT/metrics while capturing.")
@click.option("-q", "--quiet", is_flag=True,
              help="Write no messages: with --metrics-port, -w or -c, serve, save or count only.")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=1, show_default=True,
              help="Worker processes decoding the one-line view, --json, -V into a file or pipe, or --stats (not "
                   "with -c, --top or --metrics-port) while this process captures and reassembles TCP: more small "
                   "packets per second when other processes keep the cores busy, fewer big ones.")
@tls_keylog_option
@output_options
def sniff_command(interface, list_interfaces, any_port, bpf_filter, pcap_path, count, duration, buffer_mib,
                  top, metrics_port, quiet, jobs, ports, tls_keylogs, **view) -> None:
    """Decode Kafka requests and responses live from a network interface.

    Captures `tcp port 9092` unless told otherwise with --port (repeatable),
    --any-port or --filter. Stops on Ctrl-C, SIGTERM, -c or --duration, then
    prints what it saw to standard error. Needs root or CAP_NET_RAW.
    """
    from kafkasniff.capture.live import LiveCapture, LiveCaptureError, port_filter
    from kafkasniff.commands.terminal import fail

    if list_interfaces:
        _print_interfaces()
        return
    if not interface:
        fail("give the interface to capture on with -i (see --list-interfaces)")
    if interface == "any":  # Linux's pseudo-interface of every interface: its ring would mix their link layers
        fail("-i any is not supported: capture on one interface (see --list-interfaces), or on all of them with "
             "tcpdump -i any -U -w - port 9092 | kafkasniff decode -")
    if any_port and bpf_filter:
        fail("--any-port and --filter exclude each other: put the ports in the --filter expression")
    if not (ports or any_port or bpf_filter):
        ports = (DEFAULT_PORT,)
    if quiet and view["stats"]:
        fail("--stats counts the messages it shows: leave out -q (with the one-line view it prints its tables only)")
    if top and (view["tree"] or view["hex_"] or view["as_json"]):
        fail("--top shows a dashboard, not messages: leave out -V, --hex and --json")
    options = make_options(**view)  # its errors before the capture starts
    expression = bpf_filter or port_filter(() if any_port else ports)
    try:
        capture = LiveCapture(interface, expression, buffer_mib << 20)
    except LiveCaptureError as error:
        fail(str(error))
    try:
        pcap_file = open(pcap_path, "wb") if pcap_path else None
    except OSError as error:
        capture.close()
        fail(f"cannot write {pcap_path}: {error.strerror}; choose a writable path for -w")
    live = None
    if top or metrics_port:
        from kafkasniff.render.live import LiveStats, serve_metrics

        live = LiveStats()
    if metrics_port:
        try:
            serve_metrics(live, metrics_port)
        except OSError as error:
            capture.close()
            fail(f"cannot serve metrics on port {metrics_port}: {error.strerror}; choose another --metrics-port")
    with capture:
        # Clients append to their key logs as they connect: the files are read again while keys are missing.
        session = LiveSession(capture, options, ports, pcap_file, count, live,
                              open_keylog(tls_keylogs, follow=True), jobs, quiet)
        deadline = time.monotonic() + duration if duration else None
        if top:
            session.run_with_dashboard(deadline)
        else:
            session.run(deadline)
    click.echo(session.summary(), err=True)


class LiveSession:
    """Segments from a LiveCapture through Analyzer -> Output, a block of the capture's ring at a time; on
    `jobs` worker processes (engine/parallel.py) when the view is rendered apart and nothing needs every event
    here (-c counts shown messages, --top and --metrics-port watch every event)."""

    def __init__(self, capture: LiveCapture, options, ports, pcap_file, count: int | None, live=None, keylog=None,
                 jobs: int = 1, quiet: bool = False):
        self.capture = capture
        self.live = live            # LiveStats for --top and --metrics-port: sees every event
        self.refresh = None         # --top: called about every TOP_REFRESH_S with the frames so far
        self.next_refresh = 0.0
        self.output = Output(options)
        self.make_analyzer = lambda: Analyzer(ports, keylog=keylog)  # workers make theirs after the fork
        self.analyzer = self.make_analyzer()
        self.quiet = quiet          # -q: no messages written (nothing to render, so no workers either)
        self.jobs = jobs if jobs > 1 and self.output.renders_apart and count is None and live is None and not quiet \
            else 1
        self.pcap_file = pcap_file
        if pcap_file:
            capture.write_pcap(pcap_file)
        self.count = count
        self.counted = 0  # messages that passed the display filters, for -c
        self.messages = 0

    @property
    def frames(self) -> int:
        return self.capture.frames

    def run(self, deadline: float | None) -> None:
        """Capture until a stop signal, the deadline or the message count; then flush everything."""
        stop_signals = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, lambda *_: self.capture.stop()) for sig in stop_signals}
        capture = self.capture
        collect_rarely()
        filters = capture.bpf_filter + (f"; writing {self.pcap_file.name}" if self.pcap_file else "")
        click.echo(f"capturing on {capture.interface} (filter {filters})", err=True)
        try:
            if self.jobs > 1:
                self._capture_on_workers(deadline)
            else:
                self._capture(deadline)
                self._show(self.analyzer.finish())
            self.output.finish()
            sys.stdout.flush()
        except BrokenPipeError:  # the reader went away (| head): stop quietly
            stdout_gone()
        finally:
            self.kernel_stats = capture.kernel_stats()
            if self.pcap_file:
                self.pcap_file.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def run_with_dashboard(self, deadline: float | None) -> None:
        """run() with a rich Live dashboard (--top) in place of the messages."""
        from rich.live import Live

        from kafkasniff.commands.terminal import make_console
        from kafkasniff.render.live import Dashboard

        dashboard = Dashboard(self.live)
        with Live(dashboard.render(0), console=make_console(), auto_refresh=False) as screen:
            self.refresh = lambda: screen.update(dashboard.render(self.frames), refresh=True)
            self.run(deadline)
            self.refresh()

    def _refresh_if_due(self) -> None:
        now = time.monotonic()
        if now >= self.next_refresh:
            self.next_refresh = now + TOP_REFRESH_S
            self.refresh()

    def _capture(self, deadline: float | None) -> None:
        feed_all = self.analyzer.feed_all
        refresh = self.refresh
        for segments in self.capture.segment_batches(deadline):
            if refresh is not None:
                self._refresh_if_due()
            if segments is None:  # idle: holes that waited too long are given up, frames behind them show
                events = self.analyzer.tick(time.time())
                if events:
                    self._show(events)
                    self.output.flush()
                continue
            events = feed_all(segments)
            if events:
                self._show(events)
                # users pipe into jq or tee: each message must go out as soon as its block is decoded
                self.output.flush()
                if self.count is not None and self.counted >= self.count:
                    return

    def _capture_on_workers(self, deadline: float | None) -> None:
        self.messages = sniff_parallel(lambda: self.capture.segment_batches(deadline), self.output,
                                       self.make_analyzer, self.jobs)

    def _show(self, events: list) -> None:
        count = self.count
        live = self.live
        shows_messages = self.refresh is None and not self.quiet  # --top: the dashboard in place of the messages
        for ev in events:
            if count is not None and self.counted >= count:
                return
            if live is not None:
                live.observe(ev)
            if type(ev) is MessageEvent:
                self.messages += 1
                if count is not None and self.output.wanted(ev):
                    self.counted += 1
            if shows_messages:
                self.output.emit(ev)

    def summary(self) -> str:
        stats = self.kernel_stats
        text = (f"{self.frames} packets captured, {self.messages} Kafka messages decoded; "
                f"kernel: {stats.packets} packets received by filter, {stats.drops} dropped")
        if stats.drops:
            text += " (raise the buffer with -B MiB, or narrow the capture with --port/--filter)"
        unread = stats.packets - stats.drops - self.frames
        if unread > 0:  # the kernel had not handed over their block when reading stopped
            text += f"; {unread} received but not read before the capture ended"
        return text


def _print_interfaces() -> None:
    from kafkasniff.capture.live import interfaces

    for iface in interfaces():
        flags = ("up" if iface.up else "down") + (", loopback" if iface.loopback else "")
        click.echo(f"{iface.name}\t{flags}\t{' '.join(iface.addresses)}".rstrip())


