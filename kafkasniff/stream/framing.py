"""Cut one direction of a TCP stream into Kafka frames (4-byte big-endian size + payload).

Sans-I/O: feed bytes (and gaps) in stream order, get `Frame`s and `Skipped`
notices back. While in sync, every frame follows the previous one. After a gap
in the stream, or when a capture starts mid-connection, the framer is out of
sync: it scans forward for the first position where `plausible(buf, pos, size)`
accepts a frame, and reports how many bytes it skipped to get there.
"""

from __future__ import annotations

import re
import struct
from functools import cache
from typing import Callable, NamedTuple

DEFAULT_MAX_FRAME = 100 * 1024 * 1024
MIN_FRAME = 4  # a response header alone is 4 bytes
# How long an out-of-sync scan waits on a candidate frame before trying the next offset.
SCAN_WINDOW = 1 << 20

# plausible(buf, start, end, complete): may the frame whose payload starts at buf[start] be real?
# buf[start:end] is what has arrived of it; complete says whether that is the whole payload.
# True or False, or None when it cannot tell before more bytes arrive.
Plausible = Callable[[bytearray, int, int, bool], "bool | None"]


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


# Built by tuple.__new__ (C) on the per-frame paths: a named tuple's own __new__ is a Python call.
_new_tuple = tuple.__new__
_SIZE = struct.Struct(">i").unpack_from


def _size_at(buf: bytearray, pos: int) -> int:
    return int.from_bytes(buf[pos:pos + 4], "big", signed=True)


class Framer:
    """Frames for one direction of one connection."""

    # Four framers a connection (two probing before the client is known): slots make them cheap to set up.
    __slots__ = ("plausible", "candidates", "max_frame", "synced", "min_frame", "buf", "buf_offset", "first_ts",
                 "last_ts", "skip_start", "skip_reason", "out")

    def __init__(self, plausible: Plausible, max_frame: int = DEFAULT_MAX_FRAME, synced: bool = True,
                 requests: bool = False):
        self.plausible = plausible
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

    def feed(self, data: bytes, ts: float) -> list:
        self.last_ts = ts
        if not self.buf:
            self.first_ts = ts
            if self.synced:
                data = self._cut_whole(data, ts)
        if data:
            self.buf += data
            self._cut(ts)
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
        self.out.append(Skipped(self.buf_offset, size, reason, ts))
        self.buf_offset += size
        self._unsync("resynchronised after a gap")
        return self._take()

    def close(self) -> list:
        """The direction ended: report bytes that never completed a frame."""
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
        self.synced = False
        self.skip_start = self.buf_offset
        self.skip_reason = reason

    def _lose(self, n: int, reason: str) -> None:
        """Drop the first n buffered bytes (and any unsynced run before them) as skipped."""
        start = self.skip_start if self.skip_start is not None else self.buf_offset
        end = self.buf_offset + n
        if end > start:
            self.out.append(Skipped(start, end - start, reason, self.last_ts))
        del self.buf[:n]
        self.buf_offset = end
        self.skip_start = None if self.synced else end

    def _cut(self, ts: float) -> None:
        buf = self.buf
        pos = 0
        n = len(buf)
        while True:
            if not self.synced:
                found, scanned = self._resync(pos)
                if not found:
                    pos = scanned
                    break
                start = self.skip_start
                if start is not None and self.buf_offset + scanned > start:
                    self.out.append(Skipped(start, self.buf_offset + scanned - start, self.skip_reason, ts))
                self.skip_start = None
                self.synced = True
                pos = scanned
            if n - pos < 4:
                break
            size = _size_at(buf, pos)
            if size < self.min_frame or size > self.max_frame:
                self.synced = False
                self.skip_start = self.buf_offset + pos
                self.skip_reason = f"implausible frame size {size}; resynchronised"
                continue
            if n - pos - 4 < size:
                break
            self.out.append(Frame(bytes(buf[pos + 4:pos + 4 + size]), self.buf_offset + pos, ts,
                                  self.first_ts if pos == 0 else ts))
            pos += 4 + size
        if pos:
            del buf[:pos]
            self.buf_offset += pos
            self.first_ts = ts

    def _resync(self, pos: int) -> tuple[bool, int]:
        """(True, p) for the first plausible frame at p >= pos, or (False, p) to wait for more bytes at p."""
        buf = self.buf
        n = len(buf)
        max_frame = self.max_frame
        plausible = self.plausible
        for match in self.candidates.finditer(buf, pos):
            at = match.start()
            size = int.from_bytes(buf[at:at + 4], "big", signed=True)
            if MIN_FRAME <= size <= max_frame:
                verdict = plausible(buf, at + 4, min(n, at + 4 + size), n >= at + 4 + size)
                if verdict:
                    return True, at
                if verdict is None and n - at < SCAN_WINDOW:
                    return False, at  # undecided until more of the candidate frame arrives
        return False, max(pos, n - CANDIDATE_BYTES + 1)


# Candidate positions are found by a regular expression (C speed) before the Python checks run:
# a size prefix below the frame limit, and for requests the high bytes of the API key and version.
CANDIDATE_BYTES = 8


@cache
def size_prefix_pattern(max_frame: int, request: bool) -> re.Pattern:
    if max_frame >= 1 << 24:
        size = rb"[\x00-" + re.escape(bytes([min(max_frame >> 24, 0x7F)])) + rb"]..."
    else:
        size = rb"\x00[\x00-" + re.escape(bytes([max_frame >> 16])) + rb"].."
    header = rb"\x00.\x00." if request else rb"...."
    return re.compile(b"(?=" + size + header + b")", re.DOTALL)
