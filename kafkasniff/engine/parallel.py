"""Decode one capture on several cores: its connections are shared out among worker processes.

The parent reads the capture and reassembles TCP, because stream numbers and the ends of
idle connections are facts about the whole capture. Each worker runs the sessions of its
connections (framing, decoding, pairing) and renders their events. The parent writes the
rendered events in exactly the order one process would have, resolving topic ids on the
way, since resolving them needs every earlier message of the capture.

Order: the parent numbers every TCP event. Workers tag what they render with that number, in the
order they render it (share.Replies: lines back to back, with an index of numbers). Every batch
goes to all workers at once and carries the last number handed out so far, the batch's watermark;
a worker's reply carries it back once the batch is done, and one is sent whenever REPLY_BYTES have
been rendered, with the number of the last event done. An item is written once no other worker can
still produce an earlier one: every other worker's watermark is at least the number before its own
(an event is one worker's; share.Merge). The parent stops reading a worker that holds QUEUE_BYTES
it cannot write yet, until the others catch up. So what waits in the workers, the pipes and the
parent is bounded, whatever a batch's bytes make (700,000 requests of 14 bytes in one connection:
220 MB of JSON), and a slow worker holds up the others instead of letting them run ahead.

-V, and --json of a message with records: its text comes in parts as it is made (Output.render); a
part of TREE_PART_BYTES or more is sent out of band, as it is, right after the reply whose last
special item stands for it (its bytes None): serializing, copying and loading 300 MB of text cost
more than making it; through a wide pipe it costs a few copies by the kernel. And nothing holds a
whole message's text: a few KB of compressed records can make 600 MB of JSON.
"""

from __future__ import annotations

import contextlib
import fcntl
import marshal
import os
import pickle
import signal
import struct
import threading
import time
import traceback
from typing import TYPE_CHECKING

from kafkasniff.render.output import Output
from kafkasniff.engine.share import END, Merge, Replies, handle_all, share_out, share_out_live
from kafkasniff.stream.analyzer import Analyzer
from kafkasniff.stream.tcp import TcpReassembler

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

# multiprocessing is imported when workers start: small captures decode in one process, and start-up delays all.

BATCH_EVENTS = 1024  # TCP events per batch: big enough to make each write to the pipes cheap per event
BATCH_BYTES = 4 << 20  # ... and stream bytes per batch, so batches of big segments stay small in memory
REPLY_BYTES = 1 << 20  # rendered bytes a worker gathers before it replies, whether its batch is done or not
QUEUE_BYTES = 4 << 20  # rendered bytes of a worker waiting in the parent for the others, past which it is not read
PIPE_BYTES = 1 << 20  # the pipes' size (fs.pipe-max-size is 1 MiB by default)
FAILED = -2  # a worker's reply after an exception: the traceback follows
# The parent feeds every worker: when cores are short, it must not wait for them.
WORKER_NICENESS = 10


# TCP events travel to the workers as native values in one bytearray per batch, after its watermark (share.pyx,
# compiled: every event passes through it), and are handed to the Analyzer method of their kind.
_WATERMARK = struct.Struct("=q")


class WorkerFailed(RuntimeError):
    pass


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class _Worker:
    def __init__(self, ctx, make_analyzer, output: Output, inherited: list[Connection]):
        inbox_r, self.inbox = ctx.Pipe(duplex=False)
        self.results, results_w = ctx.Pipe(duplex=False)
        for conn in (inbox_r, self.results):
            _widen(conn)
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
    messages = 0  # decoded so far, for the parent to count (sniff's summary)

    def reply(watermark: int, index, text, specials: list, decoded: int, big) -> None:
        nonlocal messages
        messages += decoded
        results.send_bytes(_dumps((watermark, index, text, specials, messages, 0 if big is None else len(big))))
        if big is not None:  # the last special's bytes, as they are: nothing to serialize, copy and load
            _write_all(results.fileno(), big)

    replies = Replies(reply)
    try:
        watermark = None
        while watermark != END:
            batch = inbox.recv_bytes()
            watermark, = _WATERMARK.unpack_from(batch)
            handle_all(analyzer, batch, _WATERMARK.size, render, replies, REPLY_BYTES)
            if watermark == END:  # what the output renders once all is rendered (--stats: the worker's totals)
                replies.number = END
                for rendered in output.render_end():
                    replies.add(rendered)
            replies.send(watermark)
    except BaseException:
        with contextlib.suppress(OSError):
            results.send_bytes(_dumps((FAILED, traceback.format_exc())))


def _dumps(value) -> bytes:
    """What a worker replies: marshalled when it is plain values (nearly always: lines, what --stats leaves to the
    parent), which makes it in half the time pickle does (--stats: 0.36 s against 0.17 s on the 60 MB benchmark);
    pickled otherwise (a message the parent renders, a worker's --stats totals). Events come as share.pyx writes
    them."""
    try:
        return marshal.dumps(value)
    except ValueError:  # "unmarshallable object"
        return pickle.dumps(value, pickle.HIGHEST_PROTOCOL)


def _loads(data: bytes):
    """What _dumps made: a pickle starts with its PROTO opcode, 0x80, which no marshalled tuple does."""
    return pickle.loads(data) if data[0] == _PICKLE_PROTO else marshal.loads(data)


_PICKLE_PROTO = pickle.PROTO[0]


def _widen(conn: Connection) -> None:
    """A pipe of PIPE_BYTES, where Linux allows (64 KiB by default): a batch or a part of a tree goes through in
    one write instead of waking the reader every 64 KiB."""
    with contextlib.suppress(AttributeError, OSError):
        fcntl.fcntl(conn.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)


def _write_all(fd: int, data) -> None:
    with memoryview(data) as view:
        written = 0
        while written < len(view):
            written += os.write(fd, view[written:])


def _read_exactly(fd: int, size: int) -> bytes:
    data = os.read(fd, size)  # whole, mostly: the pipe holds a part of a tree
    if len(data) == size:
        return data
    pieces = [data]
    while size := size - len(data):
        data = os.read(fd, size)
        if not data:
            raise EOFError
        pieces.append(data)
    return b"".join(pieces)


class _Merger:
    """Receives the workers' rendered events and delivers them in capture order (a thread of the parent);
    `flush_each`: flushes the output after each delivery (live capture: lines show as they are decoded)."""

    def __init__(self, output: Output, workers: list[_Worker], flush_each: bool):
        self.output = output
        self.flush_each = flush_each
        self.results = [w.results for w in workers]
        self.merge = Merge(len(workers))  # what they sent, not written yet
        self.watermarks = [-1] * len(workers)
        self.messages = [0] * len(workers)  # decoded by each worker so far
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="kafkasniff-merge", daemon=True)

    def _run(self) -> None:
        from multiprocessing.connection import wait

        try:
            live = {conn: i for i, conn in enumerate(self.results)}
            queued = self.merge.queued
            while live:
                # Not a worker holding QUEUE_BYTES: it waits for the others. The one with the lowest watermark is
                # always read: all it sent can be written (see Merge.deliver).
                for conn in wait([conn for conn, i in live.items() if queued[i] < QUEUE_BYTES]):
                    i = live[conn]
                    try:
                        reply = _loads(conn.recv_bytes())
                        if reply[0] == FAILED:
                            raise WorkerFailed(f"decode worker {i} failed:\n{reply[1]}")
                        watermark, index, text, specials, messages, big = reply
                        if big:  # the last special's bytes follow the message
                            specials[-1] = (_read_exactly(conn.fileno(), big), specials[-1][1])
                    except EOFError:
                        raise WorkerFailed(f"decode worker {i} ended without a word") from None
                    self.merge.add(i, index, text, specials)
                    self.watermarks[i] = watermark
                    self.messages[i] = messages
                    if watermark == END:
                        del live[conn]
                if self.merge.deliver(self.watermarks, self.output) and self.flush_each:
                    self.output.flush()
        except BaseException as e:
            self.error = e
            for conn in self.results:  # workers blocked on writing to us now fail, and stop reading theirs
                conn.close()


def decode_parallel(segments_after_start, output: Output, make_analyzer, jobs: int) -> None:
    """Decode on `jobs` workers. `segments_after_start()` gives the segments, a list at a time; it is called once
    the workers are running, so whatever starts threads (a progress bar) starts after the fork."""
    def share(batches, send, stopped) -> bool:
        return share_out(segments_after_start(), TcpReassembler(), batches, send, stopped, BATCH_EVENTS, BATCH_BYTES)

    _decode_on_workers(share, output, make_analyzer, jobs, flush_each=False)


def sniff_parallel(blocks_after_start, output: Output, make_analyzer, jobs: int) -> int:
    """Decode a live capture on `jobs` workers, its lines written as soon as they are decoded: decode_parallel
    for `blocks_after_start()`, which gives the segments of each block of the capture's ring, or None while it
    is idle. Returns how many messages were decoded."""
    def share(batches, send, stopped) -> bool:
        return share_out_live(blocks_after_start(), TcpReassembler(), batches, send, stopped, time.time)

    return sum(_decode_on_workers(share, output, make_analyzer, jobs, flush_each=True).messages)


def _decode_on_workers(share, output: Output, make_analyzer, jobs: int, flush_each: bool) -> _Merger:
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    workers: list[_Worker] = []
    for _ in range(jobs):
        inherited = [c for w in workers for c in (w.inbox, w.results)]
        workers.append(_Worker(ctx, make_analyzer, output, inherited))
    merger = _Merger(output, workers, flush_each)
    merger.thread.start()
    try:
        _share_out(share, workers, merger)
        merger.thread.join()
    finally:
        for w in workers:
            w.inbox.close()
            w.process.join(timeout=1)
            if w.process.is_alive():
                w.process.terminate()
    if merger.error is not None:
        raise merger.error
    return merger


def _share_out(share, workers: list[_Worker], merger: _Merger) -> None:
    """Reassemble TCP here (`share`, with share.pyx); send each event to the worker of its connection, in
    batches."""
    batches = [bytearray(_WATERMARK.size) for _ in workers]  # each event after the batch's watermark

    def send(watermark: int) -> None:
        for w, batch in zip(workers, batches):
            _WATERMARK.pack_into(batch, 0, watermark)
            w.inbox.send_bytes(batch)
            del batch[_WATERMARK.size:]

    try:
        # the merger stops on a worker's failure, and has the reason
        if share(batches, send, lambda: merger.error is not None):
            send(END)
    except (BrokenPipeError, ConnectionResetError):
        merger.thread.join(timeout=5)  # a worker went away: the merger hears why
        if merger.error is None:
            raise
