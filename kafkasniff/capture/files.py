"""Read capture files (pcap, pcapng, either gzip-compressed) as a stream of TcpSegments.

The format is told by the magic number, never by the file name. The path `-` is standard input;
it, and any other pipe, is read as a stream: each read returns what has arrived. A file that cannot
be read at all raises CaptureError; damage further in (a cut-off last record, a corrupt block) ends
the iteration after every complete record has been delivered and leaves a message in
`CaptureReader.warnings`.

pcap records and pcapng packet blocks are scanned in C (`_headers.c`), a chunk at a time; the
rare pcapng blocks (section headers, interface descriptions) are read here. No pcap library is
used: dpkt's Reader yields neither the original length (needed to see snaplen cuts) nor, for
pcapng, the interface of a packet, and applies the first interface's link type to every packet;
and importing dpkt takes 60-70 ms, which would delay every decode.
"""

from __future__ import annotations

import gzip
import io
import math
import os
import stat
import sys
import zlib
from array import array
from collections.abc import Iterator
from itertools import chain
from struct import Struct

from kafkasniff.capture import _headers
from kafkasniff.capture.packets import LINK_LAYERS_READ, LINK_TYPE_REASON, FrameParser, TcpSegment

GZIP_MAGIC = b"\x1f\x8b"
# Larger than any link layer's frame (loopback reaches 65,549 bytes; pcapng allows 256 KiB
# snaplens); a record claiming more is corruption, not data.
MAX_RECORD_BYTES = 16 << 20
# Connections by their endpoints, in buckets: what a reader shares out (segment_batches) and counts bytes by
# (bucket_bytes)
CONNECTION_BUCKETS = _headers.CONNECTION_BUCKETS
STDIN = "-"  # the path that stands for standard input
_LINKTYPE_MASK = 0x03FFFFFF  # the bits above carry FCS information
_READ_BUFFER = 64 << 10  # for the header and gzip's reads: the records are read past it (_Unread)
_SCAN_CHUNK = 1 << 20  # bytes read per pass of the C record loop

# magic (read big-endian) -> byte order, timestamp fraction units per second, record header size:
# microsecond, nanosecond and Kuznetzov's modified pcap, each written big- or little-endian
_PCAP_VARIANTS = {
    0xA1B2C3D4: (">", 1e6, 16),
    0xA1B23C4D: (">", 1e9, 16),
    0xA1B2CD34: (">", 1e6, 24),
    0xD4C3B2A1: ("<", 1e6, 16),
    0x4D3CB2A1: ("<", 1e9, 16),
    0x34CDB2A1: ("<", 1e6, 24),
}
_PCAPNG_MAGIC = b"\x0a\x0d\x0d\x0a"  # the section header block's type
_PCAPNG_BYTE_ORDER = {b"\x1a\x2b\x3c\x4d": ">", b"\x4d\x3c\x2b\x1a": "<"}
_PCAPNG_INTERFACE_DESCRIPTION = 1
_IDB_OPTIONS = 16  # after the block header, link type, reserved bits and snaplen
_OPT_END, _OPT_IF_TSRESOL, _OPT_IF_TSOFFSET = 0, 9, 14


class CaptureError(Exception):
    """The capture cannot be read at all; the message says what is wrong and what to do."""


class NotACapture(CaptureError):
    """The file is something else (its first bytes are no capture's), not a damaged capture."""


class CaptureReader:
    """An open capture file. Iterate `segments()` (or `frames()`) once, then close.

    Attributes:
        path, name (in messages: the path, or "standard input"), format ("pcap" or "pcapng"),
        compressed (gzip), streaming (a pipe, not a file: bytes come as they are written),
        total_size (bytes on disk; 0 for a pipe), warnings (problems met while reading, one line
        each), frames_read, skipped (Counter of frames without a usable TCP segment, by reason).
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self.name = "standard input" if self.path == STDIN else self.path
        self._raw = _open_raw(self.path)
        try:
            status = os.fstat(self._raw.fileno())
            self.total_size = status.st_size
            self.streaming = not stat.S_ISREG(status.st_mode)
            self.compressed = self._raw.peek(2)[:2] == GZIP_MAGIC
            # gzip reads its input in large blocks: from a pipe, it takes what has arrived instead.
            source = _Arrived(self._raw) if self.streaming else self._raw
            self._stream = gzip.GzipFile(fileobj=source) if self.compressed else self._raw
            self._magic = self._read_magic()
            self.format = "pcapng" if self._magic == _PCAPNG_MAGIC else "pcap"
            if self.format == "pcap":
                self._pcap_layout = self._read_pcap_header()
        except BaseException:
            self.close()
            raise
        self.warnings: list[str] = []
        self.frames_read = 0
        self.time_reached = -math.inf  # (segment_batches_reached)
        self._parser = FrameParser()
        self.skipped = self._parser.skipped

    @property
    def position(self) -> int:
        """Bytes of the file on disk read so far (compressed bytes for gzip): progress is
        position / total_size."""
        if self._raw.closed or self.streaming:
            return self.total_size
        return self._raw.raw.tell()

    def estimated_packets(self, sample_bytes: int = 4 << 20) -> int:
        """How many packets the file holds, counted in its first `sample_bytes` (on disk) and extrapolated:
        whether a decode is worth sharing out depends on packets more than bytes. 0 for a pipe."""
        if self.streaming:
            return 0
        with open_capture(self.path) as sample:
            count = 0
            for frames, _ in sample._records(parse=False):
                count += len(frames)
                if sample.position >= sample_bytes:
                    break
            read = sample.position
        return count if read >= self.total_size else count * self.total_size // max(read, 1)

    def _read_magic(self) -> bytes:
        what = "gzip-compressed data" if self.compressed else "input" if self.path == STDIN else "file"
        try:
            magic = self._stream.read(4)
        except (OSError, EOFError, zlib.error) as error:
            raise CaptureError(
                f"{self.name}: damaged gzip data ({error}); recompress or use the uncompressed capture"
            ) from None
        remedy = ("pipe a capture into it, e.g. tcpdump -U -w - | kafkasniff decode -" if self.path == STDIN
                  else "give a file written by tcpdump, tshark, dumpcap or Wireshark")
        if len(magic) < 4:
            raise CaptureError(f"{self.name}: {what} too short to be a capture ({len(magic)} bytes); {remedy}")
        if magic != _PCAPNG_MAGIC and int.from_bytes(magic, "big") not in _PCAP_VARIANTS:
            raise NotACapture(
                f"{self.name}: {what} is not a pcap or pcapng capture (starts with {magic.hex()}); {remedy}"
            )
        return magic

    def frames(self) -> Iterator[tuple[float, int, bytes, int]]:
        """Yield (timestamp, link type, frame bytes, original length) for each record."""
        return chain.from_iterable(items for items, _ in self._records(parse=False))

    def segments(self) -> Iterator[TcpSegment]:
        """Yield the TCP segment of each record that holds one; others are counted in `skipped`."""
        return chain.from_iterable(self.segment_batches())

    def segment_batches(self, shard: int = 0, owners: bytes | None = None) -> Iterator[list[TcpSegment | None]]:
        """`segments()` a list at a time (those of each chunk read): a loop over millions of packets
        pays for resuming a generator once per chunk instead of once per packet. With `owners` (the share of
        each of CONNECTION_BUCKETS, as array('H') bytes), only the segments of the connections whose bucket is
        `shard`'s (the same bucket for both directions, in any process); the others' are None, so that each
        segment keeps its index among the file's."""
        return (items for items, _ in self._records(True, shard, owners))

    def segment_batches_reached(self, shard: int = 0,
                                owners: bytes | None = None) -> Iterator[tuple[list[TcpSegment | None], array | None]]:
        """`segment_batches(shard, owners)`, each list with the capture time the file had reached at each of its items
        (the latest time of any TCP packet up to it): None when that is every segment's own time, else an
        array('d') of a time per item. A file's packets whose time went back (its clock stepped back) come after
        those before them when files are merged by time: the times reached order them, as mergecap orders them.
        `time_reached` is the latest so far (-inf before any)."""
        clock = array("d", [-math.inf])
        for items, reached in self._records(True, shard, owners, clock=clock):
            self.time_reached = clock[0]
            yield items, None if reached is None else array("d", reached)

    def bucket_bytes(self, counts: array | None = None) -> array:
        """The captured bytes of the TCP frames of each of CONNECTION_BUCKETS (connections by their endpoints, as
        `segment_batches` shares them out), read to the end of the file, added to `counts` when given (array('Q'),
        one per bucket: several files' sums, counted in several threads too, as each chunk's counts are added
        holding the GIL); no segments are made."""
        if counts is None:
            counts = array("Q", bytes(8 * CONNECTION_BUCKETS))
        for _ in self._records(True, counts=counts):
            pass
        return counts

    def _records(self, parse: bool, shard: int = 0, owners: bytes | None = None, counts: array | None = None,
                 clock: array | None = None) -> Iterator[tuple[list, bytes | None]]:
        """(items, reached) a chunk at a time: see _headers.c's scans."""
        batches = (self._pcapng_batches(parse, shard, owners, counts, clock) if self.format == "pcapng"
                   else self._pcap_batches(parse, shard, owners, counts, clock))
        try:
            for items, records, reached in batches:
                self.frames_read += records
                yield items, reached
        except EOFError:  # gzip member cut short
            self._warn(f"compressed data ends early after {self.frames_read} records (file truncated?)")
        except (OSError, zlib.error) as error:
            self._warn(f"unreadable data after {self.frames_read} records: {error}")
        if parse:
            self._warn_of_unread_link_layers()

    def _warn_of_unread_link_layers(self) -> None:
        """Frames of a link layer the parser does not read hold no segment for it: without a word, a capture of
        only such frames would decode to nothing, and one with such an interface among others to less."""
        for reason, count in sorted(self.skipped.items()):
            if reason.startswith(LINK_TYPE_REASON):
                self._warn(f"{count:,} packets skipped: their {reason} is not a link layer kafkasniff reads "
                           f"({LINK_LAYERS_READ}); capture on an interface of one of those")

    def _read_pcap_header(self):
        header = self._stream.read(20)
        if len(header) < 20:
            raise CaptureError(f"{self.name}: pcap file header cut short ({4 + len(header)} of 24 bytes); the file is "
                               "truncated: copy or write it again whole")
        byte_order, units, record_header_len = _PCAP_VARIANTS[int.from_bytes(self._magic, "big")]
        # after the magic: version (2 + 2), time zone, timestamp accuracy, snaplen, link type (4 each)
        linktype = int.from_bytes(header[16:20], "big" if byte_order == ">" else "little")
        return linktype & _LINKTYPE_MASK, byte_order, units, record_header_len

    def _pcap_batches(self, parse: bool, shard: int, owners: bytes | None, counts: array | None,
                      clock: array | None):
        """(items, records read, reached) for the whole records of each chunk read: the record loop and the
        header parsing run in C. readinto1 hands over every byte decompressed before damage in a gzip file."""
        linktype, byte_order, units, record_header_len = self._pcap_layout
        skipped = self._parser.skipped
        unread = _Unread(self._stream)
        offset = 24  # of the first unread byte in the (uncompressed) file
        while unread.read_more():
            with unread.view() as buf:
                items, records, pos, bad_caplen, reached = _headers.scan_pcap(
                    buf, byte_order == ">", record_header_len, units, linktype, MAX_RECORD_BYTES, skipped, parse,
                    shard, owners, counts, clock)
            yield items, records, reached
            if bad_caplen is not None:
                self._warn(f"record at byte {offset + pos} claims {bad_caplen} bytes: file corrupt from here")
                return
            unread.take(pos)
            offset += pos
        if unread.size >= record_header_len:
            with unread.view() as buf:
                caplen = int.from_bytes(buf[8:12], "big" if byte_order == ">" else "little")
            self._warn(
                f"capture ends inside the record at byte {offset} "
                f"({unread.size - record_header_len} of {caplen} bytes; file truncated?)"
            )
        elif unread.size:
            self._warn(f"capture ends inside a record header at byte {offset} (file truncated?)")

    def _pcapng_batches(self, parse: bool, shard: int, owners: bytes | None, counts: array | None,
                        clock: array | None):
        """(items, records read, reached) for the packet blocks of each chunk read: the block loop runs in C
        (scan_pcapng); the blocks it leaves (section headers, interface descriptions, others, and
        invalid lengths) are read here, one at a time."""
        skipped = self._parser.skipped
        interfaces: list[tuple[int, float, float] | None] = []  # (link type, units/s, offset s) per interface
        self._pcapng_order = "<"  # until the section header says
        unread = _Unread(self._stream, self._magic)
        offset = 0  # of the first unread byte in the (uncompressed) file
        at_end = False
        while not at_end:
            at_end = not unread.read_more()
            while True:
                with unread.view() as buf:
                    items, records, pos, at_block, reached = _headers.scan_pcapng(
                        buf, self._pcapng_order == ">", interfaces, MAX_RECORD_BYTES, skipped, parse, shard, owners,
                        counts, clock)
                if records:
                    yield items, records, reached
                unread.take(pos)
                offset += pos
                if not at_block:
                    break
                with unread.view() as buf:
                    taken = self._pcapng_other_block(buf, offset, at_end, interfaces)
                if taken is None:  # the block is not whole yet
                    break
                if taken < 0:  # the file is corrupt from here
                    return
                unread.take(taken)
                offset += taken
        if unread.size >= 8:
            self._warn(f"capture ends inside the block at byte {offset} (file truncated?)")
        elif unread.size:
            self._warn(f"capture ends inside a block header at byte {offset} (file truncated?)")

    def _pcapng_other_block(self, buf: memoryview, offset: int, at_end: bool, interfaces: list) -> int | None:
        """Read the block at the start of buf that is not a packet block: its length (whole and valid),
        None when more bytes are needed, -1 (with a warning) when the file is corrupt from here. A section
        header starts a new list of interfaces; an interface description adds one."""
        if buf[:4] == _PCAPNG_MAGIC:
            if len(buf) < 12:
                return None
            byte_order = _PCAPNG_BYTE_ORDER.get(bytes(buf[8:12]))
            if byte_order is None:
                self._warn(f"section header at byte {offset} has no valid byte-order mark")
                return -1
            header_len = 12
        else:
            byte_order = self._pcapng_order
            header_len = 8
        block_type, block_len = Struct(byte_order + "II").unpack_from(buf)
        if block_len < header_len + 4 or block_len % 4 or block_len > MAX_RECORD_BYTES:
            self._warn(f"block at byte {offset} has invalid length {block_len}: file corrupt from here")
            return -1
        if len(buf) < block_len:
            return None
        if header_len == 12:
            self._pcapng_order = byte_order
            interfaces.clear()
        elif block_type == _PCAPNG_INTERFACE_DESCRIPTION:
            interfaces.append(self._interface(byte_order, bytes(buf[:block_len]), offset))
        return block_len

    def _interface(self, byte_order: str, block: bytes, offset: int) -> tuple[int, float, int] | None:
        """(link type, timestamp units per second, timestamp offset in seconds) of an interface description
        block; None, with a warning, when it cannot be read (its packets are then skipped)."""
        end = len(block) - 4  # the block ends with a copy of its length
        if end < _IDB_OPTIONS:
            self._warn(f"unreadable interface description at byte {offset} (only {end} bytes); "
                       f"its packets are skipped")
            return None
        linktype = Struct(byte_order + "H").unpack_from(block, 8)[0]
        units, ts_offset = 1e6, 0
        option = Struct(byte_order + "HH")
        at = _IDB_OPTIONS
        while at + 4 <= end:
            code, length = option.unpack_from(block, at)
            if code == _OPT_END:
                break
            value = block[at + 4:at + 4 + length]
            if len(value) < length:
                self._warn(f"unreadable interface description at byte {offset} (option {code} at byte "
                           f"{offset + at} runs past the block); its packets are skipped")
                return None
            if code == _OPT_IF_TSRESOL and value:
                exponent = value[0] & 0x7F
                units = float(2**exponent if value[0] & 0x80 else 10**exponent)
            elif code == _OPT_IF_TSOFFSET and length == 8:
                ts_offset = int.from_bytes(value, "little" if byte_order == "<" else "big", signed=True)
            at += 4 + (length + 3) // 4 * 4  # values are padded to 32 bits
        return linktype, units, ts_offset

    def _warn(self, message: str) -> None:
        self.warnings.append(f"{self.name}: {message}")

    def close(self) -> None:
        stream = getattr(self, "_stream", self._raw)
        if stream is not self._raw:
            stream.close()
        self._raw.close()

    def __enter__(self) -> CaptureReader:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def open_capture(path: str | os.PathLike) -> CaptureReader:
    """Open a capture file for reading; raises CaptureError if it cannot be read at all."""
    return CaptureReader(path)


class _Unread:
    """The bytes read from a capture and not yet taken, in one buffer that every read fills in place
    (readinto): a new bytes object per read, appended to a bytearray, copied every byte twice. It grows
    only while a record is longer than what is free (MAX_RECORD_BYTES at most)."""

    def __init__(self, stream, start: bytes = b""):
        self._buf = bytearray(2 * _SCAN_CHUNK)
        self._buf[:len(start)] = start
        self.size = len(start)  # bytes unread, at the start of the buffer
        # A file's readinto1 would copy through its buffer, and block on a pipe after taking what that holds: the
        # first read takes what the buffer read ahead (peek: no read while it holds some), the others read the file.
        self._buffered = stream if isinstance(stream, io.BufferedReader) else None
        self._ahead: int | None = None  # bytes it holds, once peeked
        self._readinto = stream.raw.readinto if self._buffered else stream.readinto1  # gzip: its own buffers

    def read_more(self) -> bool:
        """Read what comes (up to _SCAN_CHUNK bytes); False at the end."""
        if len(self._buf) - self.size < _SCAN_CHUNK:
            grown = bytearray(self.size + 2 * _SCAN_CHUNK)
            grown[:self.size] = memoryview(self._buf)[:self.size]
            self._buf = grown
        if self._buffered is not None:
            if self._ahead is None:
                self._ahead = len(self._buffered.peek(0))
            held = self._buffered.read1(min(self._ahead, _SCAN_CHUNK))
            self._ahead -= len(held)
            if not self._ahead:
                self._buffered = None
            self._buf[self.size:self.size + len(held)] = held
            self.size += len(held)
            return bool(held)
        with memoryview(self._buf) as free:
            got = self._readinto(free[self.size:self.size + _SCAN_CHUNK]) or 0
        self.size += got
        return got > 0

    def view(self) -> memoryview:
        """The unread bytes (release the view before `read_more` or `take`: a `with` block)."""
        return memoryview(self._buf)[:self.size]

    def take(self, n: int) -> None:
        """Drop the first n unread bytes (the rest moves to the start: less than a record)."""
        with memoryview(self._buf) as buf:
            buf[:self.size - n] = buf[n:self.size]
        self.size -= n


class _Arrived:
    """A reader whose read(n) returns the bytes that have arrived (at most n; b"" at the end)."""

    def __init__(self, raw: io.BufferedReader):
        self.read = raw.read1


def _open_raw(path: str) -> io.BufferedReader:
    if path == STDIN:
        if os.isatty(sys.stdin.fileno()):
            raise CaptureError("standard input is a terminal; pipe a capture into it, e.g. "
                               "tcpdump -w - | kafkasniff decode -")
        return open(sys.stdin.fileno(), "rb", buffering=_READ_BUFFER, closefd=False)
    try:
        return open(path, "rb", buffering=_READ_BUFFER)
    except FileNotFoundError:
        raise CaptureError(f"{path}: no such file; check the path") from None
    except IsADirectoryError:
        raise CaptureError(f"{path}: is a directory; give a capture file inside it") from None
    except PermissionError:
        raise CaptureError(
            f"{path}: permission denied; make the file readable for this user (or run as its owner)"
        ) from None
    except OSError as error:
        raise CaptureError(f"{path}: cannot open ({error.strerror})") from None
