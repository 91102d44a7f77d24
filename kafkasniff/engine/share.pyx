"""The per-event loops of parallel decoding, compiled: the parent reassembles TCP and writes each event, as native
values, into the batch (a bytearray) of its connection's worker; the worker hands each to the Analyzer method of its
kind. No object per event crosses the pipe: no tuple to make, marshal and load on either side.

Every packet of a capture passes through the parent's loop, which one core runs for all the workers: in Python it
cost about 4,500 instructions per event."""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.string cimport memcpy

from kafkasniff.stream import tcp

from kafkasniff.stream.analyzer cimport Analyzer
from kafkasniff.stream.session cimport MessageEvent
from kafkasniff.render.output import OUTPUT_BLOCK
from kafkasniff.stream.tcp import ConnectionOpened, Endpoint, Gap, LateData, StreamData, StreamEnd

# An event's kind, its second value (the first is its number in capture order). TICK is not a TCP event: a live
# capture was idle, and capture time went on (every worker gets it).
DATA, OPENED, GAP, ENDED, LATE, TICK = range(6)
cdef int _DATA = DATA, _OPENED = OPENED, _GAP = GAP, _ENDED = ENDED, _LATE = LATE, _TICK = TICK
cdef int _BOTH = tcp.BOTH
# Why a connection ended (tcp.END_*), sent as its index: a session says it of the requests without a response.
END_REASONS = (tcp.END_FIN, tcp.END_RST, tcp.END_CAPTURE, tcp.END_PORT_REUSED, tcp.END_IDLE, tcp.END_CROWDED)
END = 1 << 62  # the number of what a worker renders once all is rendered, and the watermark of its last reply
cdef long long _END = END
cdef enum:
    ITEM_BYTES = 16  # an item of a reply's index: two int64 (Replies)
cdef Py_ssize_t _OUTPUT_BLOCK = OUTPUT_BLOCK


cdef inline void _put_i64(bytearray buffer, long long value):
    _append(buffer, <const char *>&value, 8)


cdef inline void _put_f64(bytearray buffer, double value):
    _append(buffer, <const char *>&value, 8)


cdef inline void _put_u8(bytearray buffer, unsigned char value):
    _append(buffer, <const char *>&value, 1)


cdef inline Py_ssize_t _put_bytes(bytearray buffer, bytes data):
    """The bytes after their length (what _Reader.bytes_ reads); their length."""
    cdef Py_ssize_t size = len(data)
    _put_i64(buffer, size)
    _append(buffer, PyBytes_AS_STRING(data), size)
    return size


cdef inline void _put_head(bytearray batch, unsigned char kind, long long stream, unsigned char flag):
    """What every TCP event starts with after its number: its kind, its connection and a byte (the direction,
    whether the connection's start was seen, or why it ended: an index in END_REASONS)."""
    _put_u8(batch, kind)
    _put_i64(batch, stream)
    _put_u8(batch, flag)


cdef void _encode(list batches, long long number, event, long long *data_bytes) except *:
    """The event, numbered, at the end of the batch of its connection's worker (stream number modulo the workers):
    (number, kind, stream, direction or flag, content...) as native values, a DATA event's bytes as they are, its
    size added to data_bytes. A direction's own end tells the Analyzer nothing: it is left out."""
    kind = type(event)
    cdef tuple ev = <tuple>event  # every event is a named tuple: read by index
    if kind is StreamEnd and ev[1] != _BOTH:
        return
    cdef tuple conn = <tuple>ev[0]
    cdef long long stream = conn[0]
    cdef bytearray batch = <bytearray>batches[stream % len(batches)]
    _put_i64(batch, number)
    if kind is StreamData:  # (conn, direction, offset, data, ts)
        _put_head(batch, _DATA, stream, ev[1])
        _put_f64(batch, ev[4])
        data_bytes[0] += _put_bytes(batch, ev[3])
    elif kind is ConnectionOpened:  # (conn, client_guess, ts)
        a, b = <tuple>conn[1], <tuple>conn[2]
        _put_head(batch, _OPENED, stream, ev[1] is not None)
        _put_bytes(batch, (<str>a[0]).encode())
        _put_i64(batch, a[1])
        _put_bytes(batch, (<str>b[0]).encode())
        _put_i64(batch, b[1])
    elif kind is Gap or kind is LateData:  # (conn, direction, offset, size, ts)
        _put_head(batch, _GAP if kind is Gap else _LATE, stream, ev[1])
        if kind is LateData:
            _put_i64(batch, ev[2])
        _put_i64(batch, ev[3])
        _put_f64(batch, ev[4])
    else:  # StreamEnd of both directions (conn, direction, reason, ts)
        _put_head(batch, _ENDED, stream, END_REASONS.index(ev[2]))
        _put_f64(batch, ev[3])


cdef long long _distribute(list events, long long number, list batches, long long *data_bytes) except -1:
    """Append each event, numbered from `number`, to the batch of its connection's worker, adding the stream bytes
    to data_bytes; the number after the last."""
    for ev in events:
        _encode(batches, number, ev, data_bytes)
        number += 1
    return number


def share_out(segment_lists, reassembler, list batches, send, stopped, long long batch_events,
              long long batch_bytes) -> bint:
    """Reassemble the segments (given a list at a time); append each event to the batch (a bytearray) of its
    connection's worker (stream number modulo the workers), and `send(watermark)` them all every `batch_events`
    events or `batch_bytes` stream bytes, the watermark being the last event number handed out. False when `stopped()`
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
                _put_i64(<bytearray>batch, number)
                _put_u8(<bytearray>batch, _TICK)
                _put_f64(<bytearray>batch, at)
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


cdef inline void _append(bytearray buffer, const char *data, Py_ssize_t size):
    cdef Py_ssize_t at = PyByteArray_GET_SIZE(buffer)
    PyByteArray_Resize(buffer, at + size)
    memcpy(PyByteArray_AS_STRING(buffer) + at, data, size)


cdef inline void _append_item(bytearray index, long long number, long long where):
    """An item of a reply's index: its event number, and where it is (see Replies)."""
    cdef long long pair[2]
    pair[0], pair[1] = number, where
    _append(index, <const char *>pair, ITEM_BYTES)


cdef class Replies:
    """What a worker rendered and has not sent yet, for `handle_all`, which sends it with `reply(watermark, index,
    text, specials, messages, big)`, in the order rendered. `index` holds two native int64 per item: the event's
    number, and where the item is: a line with nothing for the parent to resolve (most) ends there in `text`, where
    such lines lie back to back; any other item is `specials[-1 - where]`, as Output.render gave it. A line costs a
    copy into `text` instead of a tuple to serialize, load, sort and unpack (the parent's merge, Merge, is compiled
    too). `big`, when not None, is a part of an event's output sent after them, out of band (Output.render's
    parts)."""

    cdef bytearray index, text
    cdef list specials
    cdef public long long number  # of the event being rendered
    cdef long long size, messages
    cdef object reply

    def __init__(self, reply):
        self.reply = reply
        self._clear()

    cdef void _clear(self):
        self.index, self.text, self.specials = bytearray(), bytearray(), []
        self.size = self.messages = 0

    cpdef add(self, tuple rendered):
        """What the renderer made of the current event (or a part of it): (line, mentions)."""
        line, mentions = rendered
        if mentions is None and type(line) is bytes:
            _append(self.text, PyBytes_AS_STRING(<bytes>line), len(<bytes>line))
            _append_item(self.index, self.number, PyByteArray_GET_SIZE(self.text))
            self.size += len(<bytes>line)
            return
        self.specials.append(rendered)
        _append_item(self.index, self.number, -len(self.specials))
        self.size += rendered_size(line)

    def add_big(self, data, mentions) -> None:
        """A big part of the current event's output (`data`: a buffer valid during the call): sent at once, after
        what is waiting, with the event before it as watermark (more of this one may follow)."""
        self.specials.append((None, mentions))
        _append_item(self.index, self.number, -len(self.specials))
        self.send(self.number - 1, data)

    cpdef send(self, long long watermark, big=None):
        self.reply(watermark, self.index, self.text, self.specials, self.messages, big)
        self._clear()


cdef class _Reader:
    """A batch's values, read in order; a value past its end is a ValueError (the batch is not trusted)."""
    cdef const unsigned char *data
    cdef Py_ssize_t at, size
    cdef object keep  # the buffer's owner

    def __cinit__(self, bytes batch, Py_ssize_t at):
        self.keep, self.data, self.size, self.at = batch, <const unsigned char *>PyBytes_AS_STRING(batch), \
            len(batch), at

    cdef inline const unsigned char *take(self, Py_ssize_t size) except NULL:
        if size < 0 or size > self.size - self.at:
            raise ValueError(f"parallel: a batch ends inside a value (byte {self.at} of {self.size})")
        self.at += size
        return self.data + self.at - size

    cdef inline long long i64(self) except? -1:
        cdef long long value
        memcpy(&value, self.take(8), 8)
        return value

    cdef inline double f64(self) except? -1:
        cdef double value
        memcpy(&value, self.take(8), 8)
        return value

    cdef inline int u8(self) except -1:
        return self.take(1)[0]

    cdef inline bytes bytes_(self):
        cdef Py_ssize_t size = self.i64()
        return PyBytes_FromStringAndSize(<const char *>self.take(size), size)


def handle_all(Analyzer analyzer, bytes batch, Py_ssize_t at, render, Replies replies, long long reply_bytes) -> None:
    """A worker's batch, its events from byte `at` (_encode's): each to its Analyzer method, each resulting event
    rendered (`render(event, replies)`) into `replies`. Whenever what was rendered reaches `reply_bytes` (lines, and
    the payloads of events handed on whole), it is sent with the number of the event just done as watermark; the
    rest stays in `replies`."""
    cdef _Reader items = _Reader(batch, at)
    cdef tuple rendered
    cdef int kind, flag
    cdef long long number, stream
    while items.at < items.size:
        number = items.i64()
        kind = items.u8()
        if kind == _TICK:
            events = analyzer.poll_tls(items.f64())
        else:
            stream = items.i64()
            flag = items.u8()  # the direction, whether the connection's start was seen, or why it ended
            if kind == _DATA:
                ts = items.f64()
                events = analyzer.stream_data(stream, flag, items.bytes_(), ts)
            elif kind == _OPENED:
                a = Endpoint(items.bytes_().decode(), items.i64())
                b = Endpoint(items.bytes_().decode(), items.i64())
                analyzer.opened(stream, a, b, flag != 0)
                continue
            elif kind == _GAP:
                size = items.i64()
                events = analyzer.gap(stream, flag, size, items.f64())
            elif kind == _LATE:
                offset = items.i64()
                size = items.i64()
                events = analyzer.late(stream, flag, offset, size, items.f64())
            elif kind == _ENDED:
                events = analyzer.ended(stream, items.f64(), END_REASONS[flag])
            else:
                raise ValueError(f"parallel: an event of unknown kind {kind}")
        replies.number = number
        for ev in events:
            if type(ev) is MessageEvent:
                replies.messages += 1
            rendered = render(ev, replies)
            if rendered is not None:
                replies.add(rendered)
        if replies.size >= reply_bytes:
            replies.send(number)


cdef class _Reply:
    """A reply waiting in the parent (Replies): `at` its next item, `text_at` where that item's line starts when
    it is one."""
    cdef bytes index, text
    cdef list specials
    cdef Py_ssize_t at, count, text_at

    def __cinit__(self, bytes index, bytes text, list specials):
        self.index, self.text, self.specials = index, text, specials
        self.count = len(index) // ITEM_BYTES

    cdef inline long long number(self):
        cdef long long value
        memcpy(&value, PyBytes_AS_STRING(self.index) + self.at * ITEM_BYTES, 8)
        return value

    cdef inline long long where(self):
        cdef long long value
        memcpy(&value, PyBytes_AS_STRING(self.index) + self.at * ITEM_BYTES + 8, 8)
        return value


cdef class Merge:
    """The workers' replies, as the parent holds them until it can write them in capture order (parallel.py): an
    item can be written once no other worker can still produce an earlier one."""

    cdef list replies  # per worker, the replies not all written (a list of _Reply)
    cdef readonly list queued  # per worker, the bytes waiting (rendered_size)

    def __init__(self, int workers):
        self.replies = [[] for _ in range(workers)]
        self.queued = [0] * workers

    def add(self, int worker, index, text, list specials) -> None:
        """A worker's reply (Replies.send), its big part, if any, already in its last special. Index and text are
        bytes when marshalled, bytearrays when pickled (_dumps: a message the parent renders)."""
        if type(index) is not bytes:
            index, text = bytes(index), bytes(text)
        cdef Py_ssize_t size = len(text)
        for line, _ in specials:
            size += rendered_size(line)
        if len(index):
            (<list>self.replies[worker]).append(_Reply(index, text, specials))
            self.queued[worker] += size

    def deliver(self, list watermarks, output) -> bool:
        """Write, in order, every item numbered at most one more than every other worker's watermark (their next
        items are numbered past their watermarks, and never the same: an event is one worker's), to `output`:
        lines with nothing to resolve straight (Output.write_lines), anything else through Output.deliver. Whether
        anything was written."""
        cdef Py_ssize_t workers = len(self.replies), i, best
        cdef long long number, best_number, where, others
        cdef list limits = []
        for i in range(workers):
            others = _END
            for j in range(workers):
                if j != i and <long long>watermarks[j] < others:
                    others = watermarks[j]
            limits.append(others + 1 if others < _END else _END)
        cdef bytearray lines = bytearray()
        cdef long long line_count = 0, delivered = 0
        cdef list specials = []
        cdef _Reply reply
        cdef list queue
        cdef Py_ssize_t size
        while True:
            best, best_number = -1, _END + 1
            for i in range(workers):
                queue = self.replies[i]
                if not queue:
                    continue
                number = (<_Reply>queue[0]).number()
                if number <= <long long>limits[i] and number < best_number:
                    best, best_number = i, number
            if best < 0:
                break
            queue = self.replies[best]
            reply = queue[0]
            where = reply.where()
            if where >= 0:
                if specials:
                    output.deliver(specials)
                    specials = []
                size = where - reply.text_at
                _append(lines, PyBytes_AS_STRING(reply.text) + reply.text_at, size)
                reply.text_at = where
                line_count += 1
                if PyByteArray_GET_SIZE(lines) >= _OUTPUT_BLOCK:
                    output.write_lines(lines, line_count)
                    lines, line_count = bytearray(), 0
            else:
                if line_count:
                    output.write_lines(lines, line_count)
                    lines, line_count = bytearray(), 0
                item = reply.specials[-1 - where]
                specials.append(item)
                size = rendered_size((<tuple>item)[0])
            self.queued[best] -= size
            delivered += 1
            reply.at += 1
            if reply.at == reply.count:
                del queue[0]
        if line_count:
            output.write_lines(lines, line_count)
        if specials:
            output.deliver(specials)
        return delivered > 0


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
