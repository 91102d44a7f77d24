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

from __future__ import annotations

import re
import struct
from bisect import bisect_left, bisect_right, insort
from functools import cache
from operator import itemgetter
from typing import NamedTuple, Protocol

DEFAULT_MAX_FRAME = 100 * 1024 * 1024
MIN_FRAME = 4  # a response header alone is 4 bytes
MAX_WAITING = 1024  # candidates a framer out of sync keeps waiting for their bytes


class Plausibility(Protocol):
    """What the owner of a framer knows about the frames of its direction."""

    header_bytes: int    # bytes of a payload that `header` needs to decide
    correlation_at: int  # where the correlation id is in a payload: clients number requests upwards

    def header(self, buf, pos: int, end: int) -> bool | None:
        """May a frame whose payload starts at buf[pos] be real, judging by its first bytes?
        buf[pos:end] is what has arrived; None when that is too little to tell."""

    def frame(self, buf, pos: int, end: int) -> bool:
        """Is buf[pos:end], a whole payload, a frame of this direction (it decodes)?"""


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


# Built by tuple.__new__ (C) on the per-frame paths: a named tuple's own __new__ is a Python call.
_new_tuple = tuple.__new__
_SIZE = struct.Struct(">i").unpack_from
_POSITION = itemgetter(1)
_LAST = 1 << 63  # sorts after any stream offset


def _size_at(buf: bytearray, pos: int) -> int:
    return int.from_bytes(buf[pos:pos + 4], "big", signed=True)


class Framer:
    """Frames for one direction of one connection."""

    # Four framers a connection (two probing before the client is known): slots make them cheap to set up.
    __slots__ = ("plausibility", "candidates", "max_frame", "synced", "min_frame", "buf", "buf_offset",
                 "first_ts", "last_ts", "skip_start", "skip_reason", "out", "scan_from", "waiting", "waiting_from",
                 "arrivals")

    def __init__(self, plausibility: Plausibility, max_frame: int = DEFAULT_MAX_FRAME, synced: bool = True,
                 requests: bool = False):
        self.plausibility = plausibility
        self.candidates = size_prefix_pattern(max_frame, requests)
        self.max_frame = max_frame
        self.synced = synced
        # Raw SASL tokens may be empty (a broker answers a PLAIN token with a bare zero size):
        # the session lowers this to 0 while they flow.
        self.min_frame = MIN_FRAME
        self.buf = bytearray()
        self.buf_offset = 0                  # stream offset of buf[0]
        self.first_ts: float | None = None
        self.last_ts = 0.0
        # Where the current unsynced run began, and why we are out of sync.
        self.skip_start: int | None = None if synced else 0
        self.skip_reason = "" if synced else "capture started mid-connection; resynchronised"
        self.out: list = []
        # Out of sync only: the stream offset up to which candidates have been looked at; candidates
        # that wait for more bytes, as (stream offset where they can be decided, stream offset); and
        # (stream offset after the bytes, time) of each piece fed, to date the frames found in them.
        self.scan_from = 0
        self.waiting: list[tuple[int, int]] = []  # sorted
        self.waiting_from = 0  # the stream offset of the first waiting candidate, when there is one
        self.arrivals: list[tuple[int, float]] = []

    def feed(self, data: bytes, ts: float) -> list:
        self.last_ts = ts
        if not self.buf:
            self.first_ts = ts
            if self.synced:
                data = self._cut_whole(data, ts)
        if data:
            self.buf += data
            if not self.synced:
                self.arrivals.append((self.buf_offset + len(self.buf), ts))
            self._cut(ts, False)
        return self._take()

    def _cut_whole(self, data: bytes, ts: float) -> bytes:
        """Frames that lie whole in data, cut without buffering (most segments hold whole frames);
        returns the rest, for the buffer."""
        n = len(data)
        pos = 0
        out, base, min_frame, max_frame = self.out, self.buf_offset, self.min_frame, self.max_frame
        while n - pos >= 4:
            size = _SIZE(data, pos)[0]
            if size < min_frame or size > max_frame or n - pos - 4 < size:
                break
            out.append(_new_tuple(Frame, (data[pos + 4:pos + 4 + size], base + pos, ts, ts)))
            pos += 4 + size
        self.buf_offset += pos
        return data[pos:] if pos else data

    def gap(self, size: int, ts: float, reason: str = "bytes missing from the capture") -> list:
        """Bytes of the stream that were never captured: whatever frame was open is lost."""
        self.last_ts = ts
        self._lose(len(self.buf), "partial frame lost in a gap" if self.synced else self.skip_reason)
        self.out.append(Skipped(self.buf_offset, size, reason, ts, False))
        self.buf_offset += size
        self._unsync("resynchronised after a gap")
        return self._take()

    def close(self) -> list:
        """The direction ended: frames proven by the end, then bytes that never completed a frame."""
        if not self.synced:
            self._cut(self.last_ts, True)
        if self.synced and len(self.buf) >= 4:
            reason = f"stream ended inside a frame ({len(self.buf) - 4} of {_size_at(self.buf, 0)} bytes)"
        else:
            reason = self.skip_reason or "stream ended before a frame boundary"
        self._lose(len(self.buf), reason)
        return self._take()

    def _take(self) -> list:
        out, self.out = self.out, []
        return out

    def _unsync(self, reason: str) -> None:
        """Out of sync from the start of the buffer on."""
        self.synced = False
        self.skip_start = self.scan_from = self.buf_offset
        self.skip_reason = reason
        self.waiting.clear()
        self.arrivals = [(self.buf_offset + len(self.buf), self.last_ts)] if self.buf else []

    def _lose(self, n: int, reason: str) -> None:
        """Drop the first n buffered bytes (and any unsynced run before them) as skipped."""
        start = self.skip_start if self.skip_start is not None else self.buf_offset
        end = self.buf_offset + n
        if end > start:
            self.out.append(Skipped(start, end - start, reason, self.last_ts))
        del self.buf[:n]
        self.buf_offset = end
        self.skip_start = None if self.synced else end
        self.scan_from = max(self.scan_from, end)
        self.waiting.clear()
        self.arrivals.clear()

    def _cut(self, ts: float, final: bool) -> None:
        """Cut the buffered frames; out of sync, first find where they start."""
        while True:
            if not self.synced and not self._resync(final):
                return
            buf = self.buf
            n = len(buf)
            pos = 0
            arrivals = self.arrivals  # frames found by resynchronising are dated by the bytes they came in
            implausible = None
            while n - pos >= 4:
                size = _size_at(buf, pos)
                if size < self.min_frame or size > self.max_frame:
                    implausible = size
                    break
                end = pos + 4 + size
                if n < end:
                    break
                base = self.buf_offset
                frame_ts = self._arrival_ts(base + end) if arrivals else ts
                first_ts = self._arrival_ts(base + pos + 1) if arrivals else self.first_ts if pos == 0 else ts
                self.out.append(Frame(bytes(buf[pos + 4:end]), base + pos, frame_ts, first_ts))
                pos = end
            if pos:
                del buf[:pos]
                self.buf_offset += pos
                self.first_ts = ts
            if arrivals:
                del arrivals[:bisect_left(arrivals, (self.buf_offset + 1,))]
            if implausible is None:
                return
            self._unsync(f"implausible frame size {implausible}; resynchronised")

    def _arrival_ts(self, stream_end: int) -> float:
        """Time of the piece that carried the byte just before stream offset stream_end."""
        arrivals = self.arrivals
        i = bisect_left(arrivals, (stream_end,))
        return arrivals[i][1] if i < len(arrivals) else self.last_ts

    def _resync(self, final: bool) -> bool:
        """Find the first proven frame; True once the buffer starts with it (the bytes before are
        reported skipped), False while none is proven (the buffer keeps what may still be needed).
        final: the direction has ended, so nothing more will arrive."""
        base = self.buf_offset
        n = len(self.buf)
        found = None
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
        if start is not None and found > start:
            self.out.append(Skipped(start, found - start, self.skip_reason, self._arrival_ts(found + 1)))
        del self.buf[:found - base]
        self.buf_offset = found
        self.skip_start = None
        self.synced = True
        waiting.clear()
        return True

    def _scan(self, final: bool) -> int | None:
        """The first new candidate proven a frame (its stream offset); those that must wait are kept."""
        base = self.buf_offset
        n = len(self.buf)
        for match in self.candidates.finditer(self.buf, max(self.scan_from - base, 0)):
            at = match.start()
            verdict, decided_at = self._judge(at, final)
            if verdict:
                return base + at
            if verdict is None:
                self._wait(decided_at, base + at)
        self.scan_from = max(self.scan_from, base + (n if final else n - CANDIDATE_BYTES + 1))
        return None

    def _wait(self, decided_at: int, at: int) -> None:
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

    def _judge(self, at: int, final: bool) -> tuple[bool | None, int]:
        """(verdict, stream offset by which it can be decided) on a frame at buf[at]; verdict None: wait."""
        buf = self.buf
        n = len(buf)
        size = _SIZE(buf, at)[0]
        if size < MIN_FRAME or size > self.max_frame:
            return False, 0
        plausibility = self.plausibility
        start, end = at + 4, at + 4 + size
        header = plausibility.header(buf, start, min(n, end))
        if header is False:
            return False, 0
        if n < end:  # decided when the bytes end there, or the next frame's header is in
            return (False, 0) if final else (None, self.buf_offset + end)
        if n > end:  # the next frame's size and header must be plausible too
            next_header = None
            if n - end >= 4:
                next_size = _SIZE(buf, end)[0]
                if next_size < self.min_frame or next_size > self.max_frame:
                    return False, 0
                next_header = plausibility.header(buf, end + 4, n)
                if next_header is False:
                    return False, 0
                at_id = plausibility.correlation_at
                if next_header and _SIZE(buf, end + 4 + at_id)[0] <= _SIZE(buf, start + at_id)[0]:
                    return False, 0  # each request, and so each response, has a higher id than the last
            if next_header is None and not final:
                return None, self.buf_offset + end + 4 + plausibility.header_bytes
        return plausibility.frame(buf, start, end), 0


# Candidate positions are found by a regular expression (C speed) before the Python checks run:
# a size prefix below the frame limit, and for requests the high bytes of the API key and version.
CANDIDATE_BYTES = 8


@cache
def size_prefix_pattern(max_frame: int, request: bool) -> re.Pattern:
    """A size from MIN_FRAME to about max_frame; then a request's API key and version below 256, or a
    response's correlation id, which is not negative."""
    if max_frame >= 1 << 24:
        size = rb"[\x00-" + re.escape(bytes([min(max_frame >> 24, 0x7F)])) + rb"]..."
    else:
        size = rb"\x00[\x00-" + re.escape(bytes([max_frame >> 16])) + rb"].."
    too_small = rb"(?!\x00\x00\x00[\x00-" + re.escape(bytes([MIN_FRAME - 1])) + rb"])"
    header = rb"\x00.\x00." if request else rb"[\x00-\x7f]..."
    return re.compile(b"(?=" + too_small + size + header + b")", re.DOTALL)
