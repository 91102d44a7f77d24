"""Cut one direction of a TCP stream into Kafka frames (4-byte big-endian size + payload).

Sans-I/O: feed bytes (and gaps) in stream order, get `Frame`s and `Skipped`
notices back. While in sync, every frame follows the previous one. After a gap
in the stream, or when a capture starts mid-connection, the framer is out of
sync: it looks for a position where a frame starts, and reports how many bytes
it skipped to get there.

Resynchronising never locks onto a frame on its size and header alone: bytes
inside a frame can look like both. A candidate position is accepted only once
its whole frame has arrived, decodes (`Plausibility.frame`), and what follows
agrees: the bytes seen so far end exactly there, or the next frame's size and
header are plausible too. A candidate still waiting for its bytes does not stop
the scan: a later candidate that is proven first wins. When the direction ends,
candidates still incomplete are rejected (their sizes run past what the
direction carries) and the scan goes on from the byte after each of them, so a
wrong size never swallows the frames behind it.
"""

from bisect import bisect_left, bisect_right, insort
from operator import itemgetter
from typing import NamedTuple

from kafkasniff.protocol.records import starts_with_checked_batch

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.string cimport memchr, memcpy

from kafkasniff.stream.namedtuples cimport named_tuple

DEFAULT_MAX_FRAME = 100 * 1024 * 1024
MIN_FRAME = 4  # a response header alone is 4 bytes
MAX_WAITING = 1024  # candidates a framer out of sync keeps waiting for their bytes
# A frame of this many bytes or more is copied into its payload as its segments come, instead of gathering in the
# buffer and being copied out whole: one copy of its bytes instead of several (a growing buffer is copied each time
# it grows). It starts once an eighth of the frame has come, so that a size prefix alone (damaged or made-up bytes
# naming 100 MB) never reserves more than eight times the bytes that did come.
FILL_FROM = 1 << 16
FILL_AFTER_PART = 8


cdef class Plausibility:
    """What the owner of a framer knows about the frames of its direction (session.RequestFrames, ResponseFrames).
    Compiled, and called without a Python call: out of sync, every candidate position of a stream is asked
    about (a capture starting inside a 2 MB Fetch response: tens of thousands)."""

    def __init__(self, int header_bytes, int correlation_at):
        self.header_bytes = header_bytes  # bytes of a payload that `header` needs to decide
        self.correlation_at = correlation_at  # where the correlation id is in a payload: clients number upwards

    cpdef object header(self, buf, Py_ssize_t pos, Py_ssize_t end):
        """May a frame whose payload starts at buf[pos] be real, judging by its first bytes?
        buf[pos:end] is what has arrived; None when that is too little to tell."""
        raise NotImplementedError

    cpdef bint frame(self, buf, Py_ssize_t pos, Py_ssize_t end) except -1:
        """Is buf[pos:end], a whole payload, a frame of this direction (it decodes)?"""
        raise NotImplementedError

    cpdef new_search(self):
        """A search for a frame boundary begins. What the owner knows does not change until the framer returns
        (it acts on frames after), so what header() works out from it may be kept until the next search."""


class Frame(NamedTuple):
    payload: bytes        # the frame without its size prefix
    stream_offset: int    # where the size prefix starts in the direction's byte stream
    ts: float             # time of the segment that completed the frame
    first_ts: float       # time of the segment that carried its first byte


class Skipped(NamedTuple):
    stream_offset: int
    size: int
    reason: str
    ts: float             # time of the latest bytes seen when the skip was decided
    captured: bool = True  # False: the bytes were never captured (a gap)


_POSITION = itemgetter(1)
_LAST = 1 << 63  # sorts after any stream offset


cdef class Framer:
    """Frames for one direction of one connection."""

    def __init__(self, Plausibility plausibility, long long max_frame=DEFAULT_MAX_FRAME, bint synced=True,
                 bint requests=False):
        self.plausibility = plausibility
        self.requests = requests
        self.max_frame = max_frame
        self.synced = synced
        self.min_frame = MIN_FRAME
        self.buf = bytearray()
        self.buf_offset = 0
        self.first_ts = self.last_ts = 0.0
        self.skip_start = -1 if synced else 0
        self.skip_reason = "" if synced else "capture started mid-connection; resynchronised"
        self.out = []
        self.scan_from = 0
        self.waiting = []
        self.waiting_from = 0
        self.arrivals = []
        self.filling = None
        self.lost_until = self.lost_from = -1

    cpdef list feed(self, bytes data, double ts):
        self.last_ts = ts
        if self.lost_until >= 0:
            data = self._drop_lost(data, ts)
        if self.filling is not None:
            data = self._fill(data, ts)
        if not self.buf:
            self.first_ts = ts
            if self.synced:
                data = self._cut_whole(data, ts)
        if data:
            self.buf += data
            if not self.synced:
                self.arrivals.append((self.buf_offset + len(self.buf), ts))
            self._cut(ts, False)
            if self.synced:
                self._start_filling()
        return self._take()

    cdef void _start_filling(self):
        """In sync, the buffer holds the start of a frame: once it is a big one (FILL_FROM) and an eighth of it has
        come, its payload is made at its full size and what came is copied in; the buffer is emptied."""
        cdef Py_ssize_t n = len(self.buf)
        cdef long long size
        if n < 4 or self.arrivals:  # (bytes that came out of sync are dated piece by piece: left to the buffer)
            return
        size = int32_at(self.buf)
        if size < FILL_FROM or size > self.max_frame or (n - 4) * FILL_AFTER_PART < size or n - 4 >= size:
            return
        self.filling = PyBytes_FromStringAndSize(NULL, size)
        memcpy(PyBytes_AS_STRING(self.filling), <const char*>self.buf + 4, n - 4)
        self.filled = n - 4
        self.filling_offset = self.buf_offset
        self.filling_first_ts = self.first_ts
        self.buf_offset += n
        del self.buf[:]

    cdef bytes _fill(self, bytes data, double ts):
        """Copy data into the frame being filled; once whole, it is a Frame. Returns what is left of data."""
        cdef Py_ssize_t size = len(self.filling), n = len(data)
        cdef Py_ssize_t take = min(size - self.filled, n)
        memcpy(PyBytes_AS_STRING(self.filling) + self.filled, <const char*>data, take)
        self.filled += take
        self.buf_offset += take
        if self.filled < size:
            return b""
        self.out.append(named_tuple(Frame, (self.filling, self.filling_offset, ts, self.filling_first_ts)))
        self.filling = None
        return data[take:] if take < n else b""

    cdef void _stop_filling(self):
        """The frame being filled goes back to the buffer (a gap or the end, which the buffer's rules report)."""
        if self.filling is None:
            return
        self.buf = bytearray(len(self.filling).to_bytes(4, "big"))  # (the buffer is empty while a frame fills)
        self.buf += self.filling[:self.filled]
        self.buf_offset = self.filling_offset
        self.first_ts = self.filling_first_ts
        self.filling = None

    cdef bytes _drop_lost(self, bytes data, double ts):
        """The bytes of data that belong to the frame lost in a gap are dropped; returns the rest."""
        cdef Py_ssize_t take = min(self.lost_until - self.buf_offset, len(data))
        self.buf_offset += take
        if self.buf_offset < self.lost_until:
            return b""
        self._report_lost(ts)
        return data[take:] if take else data

    cdef void _report_lost(self, double ts):
        """The bytes dropped since the gap, as one notice; the frame lost in it is done with."""
        if self.buf_offset > self.lost_from:
            self.out.append(Skipped(self.lost_from, self.buf_offset - self.lost_from, "partial frame lost in a gap",
                                    ts))
        self.lost_until = self.lost_from = -1

    cdef bytes _cut_whole(self, bytes data, double ts):
        """Frames that lie whole in data, cut without buffering (most segments hold whole frames);
        returns the rest, for the buffer."""
        cdef Py_ssize_t n = len(data), pos = 0
        cdef long long size
        cdef const unsigned char* p = data
        cdef list out = self.out
        cdef long long base = self.buf_offset
        while n - pos >= 4:
            size = int32_at(p + pos)
            if size < self.min_frame or size > self.max_frame or n - pos - 4 < size:
                break
            out.append(named_tuple(Frame, (PyBytes_FromStringAndSize(<const char*>p + pos + 4, size),
                                             base + pos, ts, ts)))
            pos += 4 + size
        self.buf_offset += pos
        return data[pos:] if pos else data

    cpdef list gap(self, long long size, double ts, str reason="bytes missing from the capture"):
        """Bytes of the stream that were never captured: whatever frame was open is lost. When its size prefix had
        come and the gap ends inside it, the next frame starts where it ends: the framer stays in sync, and drops
        its bytes until then; otherwise it resynchronises."""
        cdef long long frame_end = -1
        self.last_ts = ts
        self._stop_filling()
        if self.lost_until >= 0:
            frame_end = self.lost_until
            self._report_lost(ts)
        elif self.synced and len(self.buf) >= 4:
            frame_end = self.buf_offset + 4 + int32_at(self.buf)
        self._lose(len(self.buf), "partial frame lost in a gap" if self.synced else self.skip_reason)
        self.out.append(Skipped(self.buf_offset, size, reason, ts, False))
        self.buf_offset += size
        if frame_end > self.buf_offset:
            self.lost_until, self.lost_from = frame_end, self.buf_offset
        elif frame_end < self.buf_offset:
            self._unsync("resynchronised after a gap")
        return self._take()

    cpdef list close(self):
        """The direction ended: frames proven by the end, then bytes that never completed a frame."""
        if self.lost_until >= 0:
            self._report_lost(self.last_ts)
        self._stop_filling()
        if not self.synced:
            self._cut(self.last_ts, True)
        if self.synced and len(self.buf) >= 4:
            reason = f"stream ended inside a frame ({len(self.buf) - 4} of {int32_at(self.buf)} bytes)"
        else:
            reason = self.skip_reason or "stream ended before a frame boundary"
        self._lose(len(self.buf), reason)
        return self._take()

    cdef list _take(self):
        out = self.out
        self.out = []
        return out

    cdef void _unsync(self, str reason):
        """Out of sync from the start of the buffer on."""
        self.synced = False
        self.skip_start = self.scan_from = self.buf_offset
        self.skip_reason = reason
        self.waiting.clear()
        self.arrivals = [(self.buf_offset + len(self.buf), self.last_ts)] if self.buf else []

    cdef void _lose(self, Py_ssize_t n, str reason):
        """Drop the first n buffered bytes (and any unsynced run before them) as skipped."""
        cdef long long start = self.skip_start if self.skip_start >= 0 else self.buf_offset
        cdef long long end = self.buf_offset + n
        if end > start:
            self.out.append(Skipped(start, end - start, reason, self.last_ts))
        del self.buf[:n]
        self.buf_offset = end
        self.skip_start = -1 if self.synced else end
        self.scan_from = max(self.scan_from, end)
        self.waiting.clear()
        self.arrivals.clear()

    cdef void _cut(self, double ts, bint final):
        """Cut the buffered frames; out of sync, first find where they start."""
        cdef Py_ssize_t n, pos, end
        cdef long long size, base, implausible
        cdef bint is_implausible
        cdef const unsigned char* p
        cdef double frame_ts, first_ts
        while True:
            if not self.synced and not self._resync(final):
                return
            buf = self.buf
            n = len(buf)
            p = buf
            pos = 0
            arrivals = self.arrivals  # frames found by resynchronising are dated by the bytes they came in
            is_implausible = False
            while n - pos >= 4:
                size = int32_at(p + pos)
                if size < self.min_frame or size > self.max_frame:
                    implausible = size
                    is_implausible = True
                    break
                end = pos + 4 + size
                if n < end:
                    break
                base = self.buf_offset
                frame_ts = self._arrival_ts(base + end) if arrivals else ts
                first_ts = self._arrival_ts(base + pos + 1) if arrivals else self.first_ts if pos == 0 else ts
                self.out.append(Frame(PyBytes_FromStringAndSize(<const char*>p + pos + 4, size), base + pos,
                                      frame_ts, first_ts))
                pos = end
            if pos:
                del buf[:pos]
                self.buf_offset += pos
                self.first_ts = ts
            if arrivals:
                del arrivals[:bisect_left(arrivals, (self.buf_offset + 1,))]
            if not is_implausible:
                return
            self._unsync(f"implausible frame size {implausible}; resynchronised")

    cdef double _arrival_ts(self, long long stream_end):
        """Time of the piece that carried the byte just before stream offset stream_end."""
        arrivals = self.arrivals
        i = bisect_left(arrivals, (stream_end,))
        return arrivals[i][1] if i < len(arrivals) else self.last_ts

    cdef bint _resync(self, bint final) except -1:
        """Find the first proven frame; True once the buffer starts with it (the bytes before are
        reported skipped), False while none is proven (the buffer keeps what may still be needed).
        final: the direction has ended, so nothing more will arrive."""
        cdef long long base = self.buf_offset, keep_from, drop
        cdef Py_ssize_t n = len(self.buf)
        found = None
        self.plausibility.new_search()
        # Candidates that were waiting and can be decided now, in stream order, then new ones.
        waiting = self.waiting
        decidable = len(waiting) if final else bisect_right(waiting, (base + n, _LAST))
        ready = sorted(at for _, at in waiting[:decidable])
        del waiting[:decidable]
        for at in ready:
            verdict, decided_at = self._judge(at - base, final)
            if verdict:
                found = at
                break
            if verdict is None:
                self._wait(decided_at, at)
        if ready and waiting:
            self.waiting_from = min(waiting, key=_POSITION)[1]
        if found is None:
            found = self._scan(final)
        if found is None:
            # Keep the bytes of waiting candidates and of those still to be scanned.
            keep_from = min(self.scan_from, self.waiting_from) if waiting else self.scan_from
            drop = min(keep_from - base, n)
            if drop > 0:
                del self.buf[:drop]
                self.buf_offset += drop
            return False
        start = self.skip_start
        if start >= 0 and found > start:
            self.out.append(Skipped(start, found - start, self.skip_reason, self._arrival_ts(found + 1)))
        del self.buf[:found - base]
        self.buf_offset = found
        self.skip_start = -1
        self.synced = True
        waiting.clear()
        return True

    cdef object _scan(self, bint final):
        """The first new candidate proven a frame (its stream offset); those that must wait are kept."""
        cdef long long base = self.buf_offset
        cdef Py_ssize_t n = len(self.buf), at = max(self.scan_from - base, 0)
        while True:
            at = next_candidate(self.buf, at, n, self.max_frame, self.requests)
            if at < 0:
                break
            verdict, decided_at = self._judge(at, final)
            if verdict:
                return base + at
            if verdict is None:
                self._wait(decided_at, base + at)
            at += 1
        self.scan_from = max(self.scan_from, base + (n if final else n - CANDIDATE_BYTES + 1))
        return None

    cdef void _wait(self, long long decided_at, long long at):
        """Keep a candidate to decide when the stream reaches decided_at. Only the MAX_WAITING decided
        soonest are kept: real frames are mostly small, and bytes inside a frame claim sizes of megabytes."""
        waiting = self.waiting
        if len(waiting) >= MAX_WAITING:
            if decided_at >= waiting[-1][0]:
                return
            waiting.pop()
        insort(waiting, (decided_at, at))
        if at < self.waiting_from or len(waiting) == 1:
            self.waiting_from = at

    cdef tuple _judge(self, Py_ssize_t at, bint final):
        """(verdict, stream offset by which it can be decided) on a frame at buf[at]; verdict None: wait."""
        buf = self.buf
        cdef Py_ssize_t n = len(buf)
        cdef const unsigned char* p = self.buf
        cdef long long size, next_size
        cdef Py_ssize_t start, end, at_id
        cdef Plausibility plausibility = self.plausibility
        if at < 0 or n - at < 4:
            return False, 0
        size = int32_at(p + at)
        if size < MIN_FRAME or size > self.max_frame:
            return False, 0
        start, end = at + 4, at + 4 + size
        header = plausibility.header(buf, start, min(n, end))
        if header is False:
            return False, 0
        if n < end:  # decided when the bytes end there, or the next frame's header is in
            return (False, 0) if final else (None, self.buf_offset + end)
        if n > end:  # the next frame's size and header must be plausible too
            next_header = None
            if n - end >= 4:
                next_size = int32_at(p + end)
                if next_size < self.min_frame or next_size > self.max_frame:
                    return False, 0
                next_header = plausibility.header(buf, end + 4, n)
                if next_header is False:
                    return False, 0
                at_id = plausibility.correlation_at
                if next_header and end + 8 + at_id <= n and \
                        int32_at(p + end + 4 + at_id) <= int32_at(p + start + at_id):
                    return False, 0  # each request, and so each response, has a higher id than the last
            if next_header is None and not final:
                return None, self.buf_offset + end + 4 + plausibility.header_bytes
        if size > 16 and p[start + 16] <= 2 and starts_with_checked_batch(buf, start, end):
            return False, 0  # a Produce's or Fetch's records after their length: a message's start was lost
        return plausibility.frame(buf, start, end), 0


# Candidate positions are found by a C loop before the checks that call the session run: a size prefix from
# MIN_FRAME to about the frame limit, and for requests the high bytes of the API key and version.
CANDIDATE_BYTES = 8


cdef Py_ssize_t next_candidate(const unsigned char* p, Py_ssize_t at, Py_ssize_t n, long long max_frame,
                               bint requests):
    """The first position from `at` where CANDIDATE_BYTES bytes may start a frame, or -1: a size from MIN_FRAME to
    max_frame rounded up to its top byte (or, under 16 MiB, its top two); then a request's API key and version
    below 256, or a response's correlation id, which is not negative. Out of sync, every byte of a stream may be
    looked at (a capture starting in a 2 MB Fetch response): eight at a time where none can start a size."""
    cdef unsigned char top = <unsigned char>min(max_frame >> 24, 0x7F)
    cdef unsigned char second = <unsigned char>((max_frame >> 16) & 0xFF)
    cdef bint wide = max_frame >= (1 << 24)
    cdef Py_ssize_t last = n - CANDIDATE_BYTES, stop
    cdef const unsigned char* zero
    cdef unsigned long long word
    while at <= last:
        if wide:  # a size's top byte is at most top: skip words with no such byte
            memcpy(&word, p + at, 8)
            if not _has_byte_below(word, top + 1):
                at += 8
                continue
        else:  # a size's top byte is 0
            zero = <const unsigned char*>memchr(p + at, 0, last + 1 - at)
            if zero == NULL:
                return -1
            at = zero - p
        stop = min(at + 8, last + 1)
        while at < stop:
            if (p[at] <= top if wide else p[at] == 0 and p[at + 1] <= second) and \
                    not (p[at] == 0 and p[at + 1] == 0 and p[at + 2] == 0 and p[at + 3] < MIN_FRAME) and \
                    (p[at + 4] == 0 and p[at + 6] == 0 if requests else p[at + 4] <= 0x7F):
                return at
            at += 1
    return -1


cdef inline bint _has_byte_below(unsigned long long word, unsigned int limit):
    """Whether a byte of the word is below limit (at most 128): the carry of subtracting limit from every byte
    reaches its top bit only there."""
    return ((word - 0x0101010101010101ULL * limit) & ~word & 0x8080808080808080ULL) != 0
