"""The per-event loops of parallel decoding, compiled: the parent reassembles TCP and turns each event into a
tuple of plain values for its connection's worker; the worker hands each tuple to the Analyzer method of its kind.

Every packet of a capture passes through the parent's loop, which one core runs for all the workers: in Python it
cost about 4,500 instructions per event (parallel.py says why the events travel as plain tuples)."""

from kafkasniff.stream import tcp

from kafkasniff.stream.session cimport MessageEvent
from kafkasniff.stream.tcp import ConnectionOpened, Endpoint, Gap, LateData, StreamData

# An event's kind, the second value of its tuple (the first is its number in capture order).
DATA, OPENED, GAP, ENDED, LATE = range(5)
cdef int _DATA = DATA, _OPENED = OPENED, _GAP = GAP, _ENDED = ENDED, _LATE = LATE
cdef int _BOTH = tcp.BOTH


cpdef tuple plain(long long number, event):
    """The event as (number, kind, stream, content...), or None for a direction's own end (it tells the Analyzer
    nothing)."""
    kind = type(event)
    cdef tuple ev = <tuple>event  # every event is a named tuple: read by index
    conn = <tuple>ev[0]
    stream = conn[0]
    if kind is StreamData:  # (conn, direction, offset, data, ts)
        return (number, _DATA, stream, ev[1], ev[3], ev[4])
    if kind is ConnectionOpened:  # (conn, client_guess, ts)
        a, b = <tuple>conn[1], <tuple>conn[2]
        return (number, _OPENED, stream, a[0], a[1], b[0], b[1], ev[1] is not None)
    if kind is Gap:  # (conn, direction, offset, size, ts)
        return (number, _GAP, stream, ev[1], ev[3], ev[4])
    if kind is LateData:  # (conn, direction, offset, size, ts)
        return (number, _LATE, stream, ev[1], ev[2], ev[3], ev[4])
    if ev[1] == _BOTH:  # StreamEnd (conn, direction, reason, ts)
        return (number, _ENDED, stream, ev[3])
    return None


def share_out(segment_lists, reassembler, list batches, send, stopped, long long batch_events,
              long long batch_bytes) -> bint:
    """Reassemble the segments (given a list at a time); append each event's plain tuple to the batch of its connection's worker
    (stream number modulo the workers), and `send(watermark)` them all every `batch_events` events or
    `batch_bytes` stream bytes, the watermark being the last event number handed out. False when `stopped()`
    says to give up; else the batches hold the rest, the capture's end included."""
    cdef long long number = 0, pending = 0, pending_bytes = 0
    cdef Py_ssize_t count = len(batches)
    cdef list events
    cdef tuple item
    for segments in segment_lists:
        for segment in <list>segments:
            events = reassembler.feed(segment)
            if not events:
                continue
            for ev in events:
                item = plain(number, ev)
                if item is not None:
                    (<list>batches[<long long>item[2] % count]).append(item)
                    if <int>item[1] == _DATA:
                        pending_bytes += len(<bytes>item[4])
                number += 1
            pending += len(events)
            if pending >= batch_events or pending_bytes >= batch_bytes:
                if stopped():
                    return False
                send(number - 1)
                pending = pending_bytes = 0
    for ev in reassembler.flush():
        item = plain(number, ev)
        if item is not None:
            (<list>batches[<long long>item[2] % count]).append(item)
        number += 1
    return True


def handle_all(analyzer, list items, render, reply, long long reply_bytes) -> list:
    """A worker's batch: each item to its Analyzer method, each resulting event rendered, as
    (number, rank within the item's events, rendered...) for what the renderer keeps. Whenever what was rendered
    reaches `reply_bytes` (lines, and the payloads of events handed on whole), `reply(number, rendered)` sends it
    with the number of the item just done as watermark; the rest is returned."""
    cdef list out = []
    cdef tuple item, rendered
    cdef int kind, rank
    cdef long long size = 0
    for item in items:
        kind = item[1]
        if kind == _DATA:
            events = analyzer.stream_data(item[2], item[3], item[4], item[5])
        elif kind == _OPENED:
            analyzer.opened(item[2], Endpoint(item[3], item[4]), Endpoint(item[5], item[6]), item[7])
            continue
        elif kind == _GAP:
            events = analyzer.gap(item[2], item[3], item[4], item[5])
        elif kind == _LATE:
            events = analyzer.late(item[2], item[3], item[4], item[5], item[6])
        else:
            events = analyzer.ended(item[2], item[3])
        rank = 0
        for ev in events:
            rendered = render(ev)
            if rendered is not None:
                out.append((item[0], rank, *rendered))
                rank += 1
                size += rendered_size(rendered[0])
        if size >= reply_bytes:
            reply(item[0], out)
            out = []
            size = 0
    return out


cpdef Py_ssize_t rendered_size(line):
    """Bytes of what Output.render gave: a line, or an event handed on whole (its payload)."""
    return len(<bytes>line) if type(line) is bytes else len((<MessageEvent>line).payload)
