"""Live capture from a network interface (Linux AF_PACKET, through a TPACKET_V3 ring).

Frames come out as TcpSegments, a list per block of the ring, parsed in C by the same header
parser as capture files (`_headers.scan_ring_block`), so `sniff` hands them to the same
Analyzer as `decode` and nothing is done per packet in Python before reassembly.

scapy opens the socket (`conf.L2listen`: bound to the interface, promiscuous, whatever slipped
in before its filter drained) and its libpcap bindings compile the filter. The kernel copies
each frame into a ring of blocks shared with this process (memory-mapped): a block is handed
over when full or after RING_BLOCK_TIMEOUT_MS, and its frames are read in place, one call per
block. Reading one frame per `recvmsg` in Python cost 3.7 us a frame (at 60,000 frames/s), half
of what the one-line view cost in all; a block's frames cost 0.3 us each, headers parsed
(bench/README.md). The filter is
compiled here, not by scapy: the kernel cuts each frame to the length the filter returns, and
scapy compiles with 65,535, which cuts the 65,549-byte frames of loopback (MTU 65,536). The
ring's frame headers give each frame's time, original length and VLAN tag, so a frame longer
than the snaplen is known to be cut.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import select
import socket
import time
from collections import Counter
from collections.abc import Iterator
from struct import Struct
from typing import BinaryIO, NamedTuple

from kafkasniff.capture import _headers
from kafkasniff.capture.packets import TcpSegment

SNAPLEN = 262144  # tcpdump's default; larger than loopback's 65,549-byte frames
DEFAULT_BUFFER_BYTES = 32 << 20
IDLE_WAKEUP_S = 0.5  # how often an idle capture checks its deadline
DRAIN_LIMIT_S = 2.0  # after a stop request, how long to keep reading frames already captured
# A block is handed over once full, or when the kernel's timer finds it was already filling at its last turn
# (every RING_BLOCK_TIMEOUT_MS): a message shows at most twice this after its last packet. It also bounds how long
# the ring can wait for a busy reader while blocks are not full: 64 blocks of 10 ms hold 0.64 s of traffic whatever
# its rate, of 50 ms up to 3.2 s, or as much as fits (32 MiB: 1 s of bench60's packets at 100,000/s).
RING_BLOCK_TIMEOUT_MS = 50
RING_MIN_BLOCKS = 4  # so that the kernel has blocks to fill while one is read, whatever --buffer-size says

SOL_PACKET = 263
PACKET_RX_RING = 5
PACKET_STATISTICS = 6
PACKET_VERSION = 10
TPACKET_V3 = 2
SO_ATTACH_FILTER = 26
PCAP_NETMASK_UNKNOWN = 0xFFFFFFFF
_PASS_NOTHING = "less 0"  # every frame is longer than 0 bytes
ARPHRD_LOOPBACK = 772
# DLT_RAW (12) is written to files as LINKTYPE_RAW (101), as libpcap does.
_FILE_LINKTYPES = {12: 101}
_PCAP_NANOSECOND_MAGIC = 0xA1B23C4D

# Room a frame takes in a block besides its bytes: the block's header (48 bytes), the frame's header and
# address (68), alignment (16); a block holds at least one frame of SNAPLEN bytes.
_RING_FRAME_OVERHEAD = 256
_RING_FRAME_SIZE = 2048  # a nominal frame size the kernel wants to be told; frames of TPACKET_V3 are packed
_TPACKET_REQ3 = Struct("7I")  # block size and count, frame size and count, block timeout, private size, features
_TPACKET_STATS_V3 = Struct("III")  # packets, drops, times the ring was full
_PCAP_FILE_HEADER = Struct("=IHHiIII")

PERMISSION_HINT = ("run as root or give python CAP_NET_RAW: "
                   "sudo setcap cap_net_raw+ep $(readlink -f $(which python3))")


class LiveCaptureError(Exception):
    """Capture cannot start; the message says what is wrong and what to do."""


class Interface(NamedTuple):
    name: str
    up: bool
    loopback: bool
    addresses: tuple[str, ...]


class KernelStats(NamedTuple):
    packets: int  # frames that passed the filter, dropped ones included
    drops: int  # frames the kernel dropped because the ring was full


def interfaces() -> list[Interface]:
    """Every interface of this host, in index order."""
    from scapy.config import conf
    import scapy.arch  # noqa: F401 - registers the platform's interface provider

    found = sorted(conf.ifaces.values(), key=lambda i: i.index)
    return [Interface(i.name, i.is_valid(), i.type == ARPHRD_LOOPBACK,
                      tuple(i.ips.get(4, []) + i.ips.get(6, []))) for i in found]


def port_filter(ports: tuple[int, ...]) -> str:
    """The BPF expression that selects Kafka traffic on `ports` (all of TCP when empty)."""
    return " or ".join(f"tcp port {p}" for p in ports) if ports else "tcp"


class LiveCapture:
    """An open capture on one interface with a kernel BPF filter, read through a ring of about `buffer_bytes`.

    Iterate `segment_batches()` once; `stop()` (safe to call from a signal handler) ends it.
    `kernel_stats()` reads the kernel's counters; `frames` counts the frames read, `skipped` those that
    held no TCP segment, by reason (as FrameParser counts them).
    """

    def __init__(self, interface: str, bpf_filter: str, buffer_bytes: int = DEFAULT_BUFFER_BYTES,
                 snaplen: int = SNAPLEN):
        names = [i.name for i in interfaces()]
        if interface not in names:
            raise LiveCaptureError(
                f"no interface {interface!r}; available: {', '.join(names)} (see --list-interfaces)")
        from scapy.config import conf
        from scapy.data import ARPHRD_TO_DLT
        from scapy.interfaces import resolve_iface

        self.interface = interface
        self.bpf_filter = bpf_filter
        self.snaplen = snaplen
        hardware_type = resolve_iface(interface).type
        self.linktype = ARPHRD_TO_DLT.get(hardware_type, -1)
        if self.linktype < 0:
            raise LiveCaptureError(f"{interface}: link type (ARPHRD {hardware_type}) not supported")
        self.file_linktype = _FILE_LINKTYPES.get(self.linktype, self.linktype)
        # Loopback shows every packet twice, leaving and arriving; keep the arrival only
        # (as libpcap does), in the kernel so the copies cost no room in the ring.
        kernel_filter = f"({bpf_filter}) and inbound" if hardware_type == ARPHRD_LOOPBACK else bpf_filter
        program = _FilterProgram(kernel_filter, self.linktype, snaplen, shown_as=bpf_filter)
        scapy_log = logging.getLogger("scapy.runtime")
        level = scapy_log.level
        # scapy warns that it cannot pick a dissector for the link; frames are never dissected
        scapy_log.setLevel(logging.ERROR)
        self._scapy_socket = None
        try:
            # scapy compiles its filters for 65,535-byte frames, and the kernel cuts each
            # frame to the length the filter returns. So scapy binds the socket with a
            # filter that passes nothing, and the real one replaces it once the ring is set up:
            # from then on every frame that passes goes into the ring.
            self._scapy_socket = conf.L2listen(iface=interface, filter=_PASS_NOTHING)
            self._socket: socket.socket = self._scapy_socket.ins
            self._ring = _Ring(self._socket, buffer_bytes, snaplen)
            program.attach(self._socket)
        except OSError as error:
            if self._scapy_socket is not None:
                self._scapy_socket.close()
            if isinstance(error, PermissionError):
                raise LiveCaptureError(f"no permission to capture on {interface}: {PERMISSION_HINT}") from None
            raise LiveCaptureError(f"cannot capture on {interface}: {error.strerror or error}") from None
        finally:
            scapy_log.setLevel(level)
            program.free()
        self.buffer_bytes = self._ring.size
        self.frames = 0
        self.skipped: Counter[str] = Counter()
        self._pcap: BinaryIO | None = None
        self._wake_read, self._wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._give_up_at: float | None = None  # set by stop()
        self._packets = self._drops = 0
        self._stats_final = False  # the counters were settled when reading stopped

    def write_pcap(self, file: BinaryIO) -> None:
        """Write the frames read from now on to `file`, a pcap (nanosecond timestamps) whose header is written now."""
        file.write(_PCAP_FILE_HEADER.pack(_PCAP_NANOSECOND_MAGIC, 2, 4, 0, 0, self.snaplen, self.file_linktype))
        self._pcap = file

    def segment_batches(self, deadline: float | None = None) -> Iterator[list[TcpSegment] | None]:
        """Yield the TcpSegments of each block of the ring, in capture order, until `stop()` is called or the
        `deadline` (a time.monotonic() value) passes; then those of the frames the kernel holds already.
        While no traffic arrives, yield None now and then, so the caller can let time pass."""
        scan = _headers.scan_ring_block
        blocks = self._ring.blocks
        linktype, skipped = self.linktype, self.skipped
        records = bytearray() if self._pcap is not None else None
        monotonic = time.monotonic
        waiting = select.poll()  # a block handed over, or stop()
        waiting.register(self._socket, select.POLLIN)
        waiting.register(self._wake_read, select.POLLIN)
        draining = select.poll()
        draining.register(self._socket, select.POLLIN)
        at = 0
        while True:
            found = scan(blocks[at], linktype, skipped, records)
            if found is not None:
                at = (at + 1) % len(blocks)
                segments, frames = found
                self.frames += frames
                if records:
                    self._pcap.write(records)
                    records.clear()
                yield segments
                if self._give_up_at is not None:
                    if monotonic() >= self._give_up_at:
                        return
                elif deadline is not None and monotonic() >= deadline:
                    self.stop()
            elif self._give_up_at is not None:
                # Stopping, and no block is ready. Frames the kernel counted may sit in the block it fills,
                # handed over within 2 x RING_BLOCK_TIMEOUT_MS: read on until every frame counted was read.
                self._read_counters()
                if self._packets - self._drops <= self.frames or monotonic() >= self._give_up_at:
                    self._stats_final = True
                    return
                draining.poll(RING_BLOCK_TIMEOUT_MS)
            else:
                timeout = IDLE_WAKEUP_S
                if deadline is not None:
                    timeout = min(timeout, deadline - monotonic())
                    if timeout <= 0:
                        self.stop()
                        continue
                if not waiting.poll(timeout * 1000):
                    yield None

    def stop(self) -> None:
        """End `segment_batches()` once the frames the kernel holds are read (at most DRAIN_LIMIT_S
        more); a second call ends it at once. Safe to call from a signal handler."""
        now = time.monotonic()
        self._give_up_at = now + DRAIN_LIMIT_S if self._give_up_at is None else now
        if self._wake_write is not None:
            try:
                os.write(self._wake_write, b"x")
            except OSError:  # pipe full: a wake-up is pending already
                pass

    def kernel_stats(self) -> KernelStats:
        """Totals since the capture started. Once `segment_batches()` has ended after a stop, the totals are those
        it settled on: every packet they count was read."""
        if not self._stats_final:
            self._read_counters()
        return KernelStats(self._packets, self._drops)

    def _read_counters(self) -> None:
        """Add the kernel's counters (which it resets on each read) to the totals."""
        if self._scapy_socket.closed:
            return
        packets, drops, _ring_full = _TPACKET_STATS_V3.unpack(
            self._socket.getsockopt(SOL_PACKET, PACKET_STATISTICS, _TPACKET_STATS_V3.size))
        self._packets += packets
        self._drops += drops

    def close(self) -> None:
        self._ring.close()
        self._scapy_socket.close()
        for fd in (self._wake_read, self._wake_write):
            if fd is not None:
                os.close(fd)
        self._wake_read = self._wake_write = None

    def __enter__(self) -> LiveCapture:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class _Ring:
    """The TPACKET_V3 receive ring of a packet socket, mapped into this process; `blocks` are its blocks, in the
    order the kernel fills them."""

    def __init__(self, sock: socket.socket, size: int, snaplen: int):
        block_size = mmap.PAGESIZE
        while block_size < snaplen + _RING_FRAME_OVERHEAD:
            block_size <<= 1  # the kernel gives blocks whole pages, in powers of two
        count = max(RING_MIN_BLOCKS, size // block_size)
        sock.setsockopt(SOL_PACKET, PACKET_VERSION, TPACKET_V3)
        sock.setsockopt(SOL_PACKET, PACKET_RX_RING, _TPACKET_REQ3.pack(
            block_size, count, _RING_FRAME_SIZE, block_size // _RING_FRAME_SIZE * count, RING_BLOCK_TIMEOUT_MS, 0, 0))
        self.size = block_size * count
        self._map = mmap.mmap(sock.fileno(), self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        with memoryview(self._map) as whole:
            self.blocks = [whole[i * block_size:(i + 1) * block_size] for i in range(count)]

    def close(self) -> None:
        for block in self.blocks:
            block.release()
        self._map.close()


class _FilterProgram:
    """A BPF program compiled by libpcap for `linktype` frames of up to `snaplen` bytes."""

    def __init__(self, expression: str, linktype: int, snaplen: int, shown_as: str):
        from scapy.libs.structures import bpf_program
        from scapy.libs.winpcapy import pcap_close, pcap_compile, pcap_geterr, pcap_open_dead

        self._program = bpf_program()
        handle = pcap_open_dead(linktype, snaplen)
        try:
            if pcap_compile(handle, ctypes.byref(self._program), expression.encode(), 1, PCAP_NETMASK_UNKNOWN) < 0:
                problem = pcap_geterr(handle).decode(errors="replace")
                raise LiveCaptureError(f"invalid capture filter {shown_as!r}: {problem}")
        finally:
            pcap_close(handle)

    def attach(self, sock: socket.socket) -> None:
        from scapy.libs.structures import sock_fprog

        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER,
                        sock_fprog(self._program.bf_len, self._program.bf_insns))

    def free(self) -> None:
        from scapy.libs.winpcapy import pcap_freecode

        pcap_freecode(ctypes.byref(self._program))
