"""Decode one capture on several cores: its connections are shared out among worker processes.

The parent reads the capture and reassembles TCP, because stream numbers and the ends of
idle connections are facts about the whole capture. Each worker runs the sessions of its
connections (framing, decoding, pairing) and renders their events. The parent writes the
rendered events in exactly the order one process would have, resolving topic ids on the
way, since resolving them needs every earlier message of the capture.

Order: the parent numbers every TCP event. Workers tag what they render with (that
number, rank within the event's output). Every batch goes to all workers at once and
carries the last number handed out so far, the batch's watermark; a worker's reply
carries it back once the batch is done. An item is written once no other worker can
still produce a smaller one. So the parent holds at most about one batch of output per
worker, and a slow worker holds up the others instead of letting them run ahead.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import threading
import traceback
from bisect import bisect_right
from operator import itemgetter
from typing import TYPE_CHECKING, Iterable

from kafkasniff.capture.packets import TcpSegment
from kafkasniff.render.output import Output
from kafkasniff.stream.analyzer import Analyzer
from kafkasniff.stream import tcp
from kafkasniff.stream.tcp import StreamData, TcpReassembler

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

# multiprocessing is imported when workers start: small captures decode in one process, and start-up delays all.

BATCH_EVENTS = 1024  # TCP events per batch: big enough to make pickling and pipes cheap per event
BATCH_BYTES = 4 << 20  # ... and stream bytes per batch, so batches of big segments stay small in memory
END = 1 << 62  # the watermark of a worker's last reply: it has nothing more
FAILED = -2  # a worker's reply after an exception: the traceback follows
_NUMBER, _ORDER = itemgetter(0), itemgetter(0, 1)  # of a rendered item: (number, rank, line, mentions)
# The parent feeds every worker: when cores are short, it must not wait for them.
WORKER_NICENESS = 10


# TCP events travel to the workers as tuples of plain values, (event number, kind, content...):
# pickled in C, with no named tuples to reduce and rebuild (a Python call each), and handed to the
# Analyzer method of their kind. A direction's own end tells the Analyzer nothing and is not sent.
_DATA, _OPENED, _GAP, _ENDED, _LATE = range(5)


def _plain(number: int, ev) -> tuple | None:
    kind = type(ev)
    if kind is StreamData:
        conn, direction, _, data, ts = ev
        return number, _DATA, conn.stream, direction, data, ts
    conn = ev.conn
    if kind is tcp.ConnectionOpened:
        return number, _OPENED, conn.stream, *conn.a, *conn.b, ev.client_guess is not None
    if kind is tcp.Gap:
        return number, _GAP, conn.stream, ev.direction, ev.size, ev.ts
    if kind is tcp.LateData:
        return number, _LATE, conn.stream, ev.direction, ev.offset, ev.size, ev.ts
    if ev.direction == tcp.BOTH:
        return number, _ENDED, conn.stream, ev.ts
    return None


def _handle_plain(analyzer: Analyzer, item: tuple) -> list:
    kind = item[1]
    if kind == _DATA:
        _, _, stream, direction, data, ts = item
        return analyzer.stream_data(stream, direction, data, ts)
    if kind == _OPENED:
        _, _, stream, a_ip, a_port, b_ip, b_port, from_start = item
        analyzer.opened(stream, tcp.Endpoint(a_ip, a_port), tcp.Endpoint(b_ip, b_port), from_start)
        return []
    if kind == _GAP:
        _, _, stream, direction, size, ts = item
        return analyzer.gap(stream, direction, size, ts)
    if kind == _LATE:
        _, _, stream, direction, offset, size, ts = item
        return analyzer.late(stream, direction, offset, size, ts)
    _, _, stream, ts = item
    return analyzer.ended(stream, ts)


class WorkerFailed(RuntimeError):
    pass


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class _Worker:
    def __init__(self, ctx, make_analyzer, output: Output, inherited: list[Connection]):
        inbox_r, self.inbox = ctx.Pipe(duplex=False)
        self.results, results_w = ctx.Pipe(duplex=False)
        # A worker must not hold the parent's ends, its own or earlier workers': EOF would never come.
        parent_ends = [*inherited, self.inbox, self.results]
        self.process = ctx.Process(target=_work, args=(inbox_r, results_w, make_analyzer, output, parent_ends),
                                   daemon=True)
        self.process.start()
        inbox_r.close()
        results_w.close()


def _work(inbox: Connection, results: Connection, make_analyzer, output: Output, parent_ends: list[Connection]):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    os.nice(WORKER_NICENESS)
    for conn in parent_ends:  # copied by fork
        conn.close()
    analyzer: Analyzer = make_analyzer()
    render = output.render
    try:
        watermark = None
        while watermark != END:
            watermark, events = pickle.loads(inbox.recv_bytes())
            items = []
            for item in events:
                number = item[0]
                rank = 0
                for ev in _handle_plain(analyzer, item):
                    rendered = render(ev)
                    if rendered is not None:
                        items.append((number, rank, *rendered))
                        rank += 1
            results.send_bytes(pickle.dumps((watermark, items), pickle.HIGHEST_PROTOCOL))
    except BaseException:
        with contextlib.suppress(OSError):
            results.send_bytes(pickle.dumps((FAILED, traceback.format_exc())))


class _Merger:
    """Receives the workers' rendered events and delivers them in capture order (a thread of the parent)."""

    def __init__(self, output: Output, workers: list[_Worker]):
        self.output = output
        self.results = [w.results for w in workers]
        self.queues: list[list] = [[] for _ in workers]  # (number, rank, line, mentions), in order
        self.watermarks = [-1] * len(workers)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="kafkasniff-merge", daemon=True)

    def _run(self) -> None:
        from multiprocessing.connection import wait

        try:
            live = {conn: i for i, conn in enumerate(self.results)}
            while live:
                for conn in wait(list(live)):
                    i = live[conn]
                    try:
                        watermark, items = pickle.loads(conn.recv_bytes())
                    except EOFError:
                        raise WorkerFailed(f"decode worker {i} ended without a word") from None
                    if watermark == FAILED:
                        raise WorkerFailed(f"decode worker {i} failed:\n{items}")
                    self.queues[i].extend(items)
                    self.watermarks[i] = watermark
                    if watermark == END:
                        del live[conn]
                self._deliver_ready()
        except BaseException as e:
            self.error = e
            for conn in self.results:  # workers blocked on writing to us now fail, and stop reading theirs
                conn.close()

    def _deliver_ready(self) -> None:
        """Deliver, in order, the items numbered up to the lowest watermark: no worker can still precede them
        (a worker's next items come from batches after its watermark)."""
        limit = min(self.watermarks)
        ready = []
        for q in self.queues:
            cut = bisect_right(q, limit, key=_NUMBER)
            if cut:
                ready += q[:cut]
                del q[:cut]
        if ready:
            ready.sort(key=_ORDER)
            self.output.deliver([(line, mentions) for _, _, line, mentions in ready])


def decode_parallel(segments_after_start, output: Output, make_analyzer, jobs: int) -> None:
    """Decode on `jobs` workers. `segments_after_start()` gives the segments; it is called once
    the workers are running, so whatever starts threads (a progress bar) starts after the fork."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    workers: list[_Worker] = []
    for _ in range(jobs):
        inherited = [c for w in workers for c in (w.inbox, w.results)]
        workers.append(_Worker(ctx, make_analyzer, output, inherited))
    merger = _Merger(output, workers)
    merger.thread.start()
    try:
        _share_out(segments_after_start(), workers, merger)
        merger.thread.join()
    finally:
        for w in workers:
            w.inbox.close()
            w.process.join(timeout=1)
            if w.process.is_alive():
                w.process.terminate()
    if merger.error is not None:
        raise merger.error


def _share_out(segments: Iterable[TcpSegment], workers: list[_Worker], merger: _Merger) -> None:
    """Reassemble TCP here; send each event to the worker of its connection, in batches."""
    reassembler = TcpReassembler()
    batches: list[list] = [[] for _ in workers]
    count = len(workers)
    number = 0

    def send(watermark: int) -> None:
        for w, batch in zip(workers, batches):
            w.inbox.send_bytes(pickle.dumps((watermark, batch), pickle.HIGHEST_PROTOCOL))
            batch.clear()

    try:
        pending = pending_bytes = 0
        for segment in segments:
            events = reassembler.feed(segment)
            if not events:
                continue
            for ev in events:
                item = _plain(number, ev)
                if item is not None:
                    batches[item[2] % count].append(item)
                    if item[1] == _DATA:
                        pending_bytes += len(item[4])
                number += 1
            pending += len(events)
            if pending >= BATCH_EVENTS or pending_bytes >= BATCH_BYTES:
                if merger.error is not None:
                    return  # the merger has stopped, and has the reason
                send(number - 1)
                pending = pending_bytes = 0
        for ev in reassembler.flush():
            item = _plain(number, ev)
            if item is not None:
                batches[item[2] % count].append(item)
            number += 1
        send(END)
    except (BrokenPipeError, ConnectionResetError):
        merger.thread.join(timeout=5)  # a worker went away: the merger hears why
        if merger.error is None:
            raise
