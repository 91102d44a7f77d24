"""The per-event loops of parallel decoding, compiled: the parent reassembles TCP and turns each event into a
tuple of plain values for its connection's worker; the worker hands each tuple to the Analyzer method of its kind.

Every packet of a capture passes through the parent's loop, which one core runs for all the workers: in Python it
cost about 4,500 instructions per event (parallel.py says why the events travel as plain tuples)."""

from kafkasniff.stream import tcp

from kafkasniff.stream.analyzer cimport Analyzer
from kafkasniff.stream.session cimport MessageEvent
from kafkasniff.stream.tcp import ConnectionOpened, Endpoint, Gap, LateData, StreamData

# An event's kind, the second value of its tuple (the first is its number in capture order). TICK is not a TCP
# event: a live capture was idle, and capture time went on (every worker gets it).
DATA, OPENED, GAP, ENDED, LATE, TICK = range(6)
cdef int _DATA = DATA, _OPENED = OPENED, _GAP = GAP, _ENDED = ENDED, _LATE = LATE, _TICK = TICK
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


cdef long long _distribute(list events, long long number, list batches, long long *data_bytes):
    """Append each event's plain tuple, numbered from `number`, to the batch of its connection's worker (stream
    number modulo the workers), adding the stream bytes to data_bytes; the number after the last."""
    cdef Py_ssize_t count = len(batches)
    cdef tuple item
    for ev in events:
        item = plain(number, ev)
        if item is not None:
            (<list>batches[<long long>item[2] % count]).append(item)
            if <int>item[1] == _DATA:
                data_bytes[0] += len(<bytes>item[4])
        number += 1
    return number


def share_out(segment_lists, reassembler, list batches, send, stopped, long long batch_events,
              long long batch_bytes) -> bint:
    """Reassemble the segments (given a list at a time); append each event's plain tuple to the batch of its connection's worker
    (stream number modulo the workers), and `send(watermark)` them all every `batch_events` events or
    `batch_bytes` stream bytes, the watermark being the last event number handed out. False when `stopped()`
    says to give up; else the batches hold the rest, the capture's end included."""
    cdef long long number = 0, pending = 0, pending_bytes = 0
    cdef list events
    for segments in segment_lists:
        for segment in <list>segments:
            events = reassembler.feed(segment)
            if not events:
                continue
            number = _distribute(events, number, batches, &pending_bytes)
            pending += len(events)
            if pending >= batch_events or pending_bytes >= batch_bytes:
                if stopped():
                    return False
                send(number - 1)
                pending = pending_bytes = 0
    _distribute(reassembler.flush(), number, batches, &pending_bytes)
    return True


def share_out_live(blocks, reassembler, list batches, send, stopped, now) -> bool:
    """share_out for a live capture: `blocks` gives the segments of each block of its ring, or None while the
    capture is idle (then the reassembler is told the time, `now()`, and every worker gets a TICK). Whatever a
    block or tick brought is sent at once, so each message goes out within a block's time of its last packet."""
    cdef long long number = 0, sent = 0, data_bytes = 0
    for segments in blocks:
        if segments is None:
            at = now()
            number = _distribute(reassembler.tick(at), number, batches, &data_bytes)
            for batch in batches:
                (<list>batch).append((number, _TICK, at))
            number += 1
        else:
            number = _distribute(reassembler.feed_all(segments), number, batches, &data_bytes)
        if number != sent:
            if stopped():
                return False
            send(number - 1)
            sent = number
    _distribute(reassembler.flush(), number, batches, &data_bytes)
    return True


cdef class Replies:
    """What a worker rendered and has not sent yet, for `handle_all`, which sends it with `reply(watermark, items,
    messages, big)`: items are (event number, rank within the event's output, rendered...), in order; `big`, when
    not None, is a part of an event's output sent after them, out of band (Output.render's parts)."""

    cdef list out
    cdef long long number, size, messages
    cdef int rank
    cdef object reply

    def __init__(self, reply):
        self.out = []
        self.reply = reply

    cpdef add(self, tuple rendered):
        """What the renderer made of the current event (or a part of it)."""
        self.out.append((self.number, self.rank, *rendered))
        self.rank += 1
        self.size += rendered_size(rendered[0])

    def add_big(self, data, mentions) -> None:
        """A big part of the current event's output (`data`: a buffer valid during the call): sent at once, after
        what is waiting, with the event before it as watermark (more of this one may follow)."""
        self.out.append((self.number, self.rank, None, mentions))
        self.rank += 1
        self.send(self.number - 1, data)

    cdef send(self, long long watermark, big=None):
        self.reply(watermark, self.out, self.messages, big)
        self.out = []
        self.size = self.messages = 0


def handle_all(Analyzer analyzer, list items, render, reply, long long reply_bytes) -> tuple:
    """A worker's batch: each item to its Analyzer method, each resulting event rendered (`render(event,
    replies)`), as (number, rank within the item's events, rendered...) for what the renderer keeps. Whenever what
    was rendered reaches `reply_bytes` (lines, and the payloads of events handed on whole), `reply(number, rendered,
    messages, None)` sends it with the number of the item just done as watermark and how many of its events were
    messages; the rest is returned, with its count of messages."""
    cdef Replies replies = Replies(reply)
    cdef tuple item, rendered
    cdef int kind
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
        elif kind == _TICK:
            events = analyzer.poll_tls(item[2])
        else:
            events = analyzer.ended(item[2], item[3])
        replies.number = item[0]
        replies.rank = 0
        for ev in events:
            if type(ev) is MessageEvent:
                replies.messages += 1
            rendered = render(ev, replies)
            if rendered is not None:
                replies.add(rendered)
        if replies.size >= reply_bytes:
            replies.send(item[0])
    return replies.out, replies.messages


# What a --stats item (a tuple: render.stats.counted) is taken to weigh, so that the items a worker holds are
# bounded as lines are (a message's item with what the analyses read of it, serialized: 100-600 bytes).
COUNTED_ITEM_BYTES = 256


cpdef Py_ssize_t rendered_size(line):
    """Bytes of what Output.render gave: a line, an event handed on whole (its payload), what --stats counts of an
    event, or nothing (Output.LEARN_ONLY: only mentions)."""
    if type(line) is bytes:
        return len(<bytes>line)
    if type(line) is MessageEvent:
        return len((<MessageEvent>line).payload)
    if type(line) is tuple:
        return COUNTED_ITEM_BYTES
    return 0
