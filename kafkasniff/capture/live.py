"""Live capture from a network interface (Linux AF_PACKET through scapy).

Frames come out as the same (timestamp, link type, frame bytes, original length) tuples
that capture files give, so `sniff` feeds them through the same FrameParser and Analyzer
as `decode`.

scapy opens the socket (`conf.L2listen`): it attaches a filter before binding, drains
whatever slipped in before the filter, and enables kernel timestamps and VLAN auxiliary
data; its libpcap bindings compile the filter. Frames are read here with one `recvmsg`
per frame rather than through scapy's `recv`/AsyncSniffer: those dissect every frame into
scapy layers (a few thousand frames/s) and read at most 65,535 bytes, which cuts the
65,549-byte frames of loopback (MTU 65,536). The filter is compiled here for the same
reason: the kernel cuts each frame to the length the filter returns, and scapy compiles
with 65,535. The auxiliary data gives each frame's original length, so a frame longer
than the snaplen is known to be cut.
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
import socket
import time
from collections.abc import Iterator
from struct import Struct
from typing import NamedTuple

SNAPLEN = 262144  # tcpdump's default; larger than loopback's 65,549-byte frames
DEFAULT_BUFFER_BYTES = 32 << 20
IDLE_WAKEUP_S = 0.5  # how often an idle capture checks its deadline
DRAIN_LIMIT_S = 2.0  # after a stop request, how long to keep reading frames already captured

SOL_PACKET = 263
PACKET_STATISTICS = 6
PACKET_AUXDATA = 8
SO_TIMESTAMPNS = 35
SO_RCVBUFFORCE = 33  # not exported by Python's socket module
SO_ATTACH_FILTER = 26
PCAP_NETMASK_UNKNOWN = 0xFFFFFFFF
_PASS_NOTHING = "less 0"  # every frame is longer than 0 bytes
ARPHRD_LOOPBACK = 772
TP_STATUS_VLAN_VALID = 0x10
TP_STATUS_VLAN_TPID_VALID = 0x40
ETH_P_8021Q = 0x8100
DLT_EN10MB = 1
# DLT_RAW (12) is written to files as LINKTYPE_RAW (101), as libpcap does.
_FILE_LINKTYPES = {12: 101}

_TIMESPEC = Struct("qq")
_AUXDATA = Struct("IIIHHHH")  # struct tpacket_auxdata
_TPACKET_STATS = Struct("II")
_ANCILLARY_BYTES = socket.CMSG_SPACE(_TIMESPEC.size) + socket.CMSG_SPACE(_AUXDATA.size)

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
    drops: int  # frames the kernel dropped because the socket buffer was full


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
    """An open capture on one interface with a kernel BPF filter.

    Iterate `frames()` once; `stop()` (safe to call from a signal handler) ends it.
    `kernel_stats()` reads the kernel's counters.
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
        # (as libpcap does), in the kernel so the copies cost no buffer space.
        kernel_filter = f"({bpf_filter}) and inbound" if hardware_type == ARPHRD_LOOPBACK else bpf_filter
        program = _FilterProgram(kernel_filter, self.linktype, snaplen, shown_as=bpf_filter)
        scapy_log = logging.getLogger("scapy.runtime")
        level = scapy_log.level
        # scapy warns that it cannot pick a dissector for the link; frames are never dissected
        scapy_log.setLevel(logging.ERROR)
        try:
            # scapy compiles its filters for 65,535-byte frames, and the kernel cuts each
            # frame to the length the filter returns. So scapy binds the socket with a
            # filter that passes nothing, and the real one replaces it.
            self._scapy_socket = conf.L2listen(iface=interface, filter=_PASS_NOTHING)
            self._socket: socket.socket = self._scapy_socket.ins
            program.attach(self._socket)
        except PermissionError:
            raise LiveCaptureError(f"no permission to capture on {interface}: {PERMISSION_HINT}") from None
        except OSError as error:
            raise LiveCaptureError(f"cannot capture on {interface}: {error.strerror or error}") from None
        finally:
            scapy_log.setLevel(level)
            program.free()
        self.buffer_bytes = self._set_buffer(buffer_bytes)
        self._socket.setblocking(False)
        self._wake_read, self._wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._give_up_at: float | None = None  # set by stop()
        self._packets = self._drops = 0
        self._stats_final = False  # the counters were settled when reading stopped

    def _set_buffer(self, size: int) -> int:
        """Raise the socket buffer past rmem_max when allowed (root); return what the kernel gave."""
        try:
            self._socket.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, size)
        except PermissionError:
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)
        return self._socket.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)

    def frames(self, deadline: float | None = None) -> Iterator[tuple[float, int, bytes, int] | None]:
        """Yield (timestamp, link type, frame, original length) until `stop()` is called or
        the `deadline` (a time.monotonic() value) passes; then what the kernel holds already.
        While no traffic arrives, yield None now and then, so the caller can let time pass."""
        recvmsg = self._socket.recvmsg
        snaplen, linktype = self.snaplen, self.linktype
        timestamp_level, auxdata_level = (socket.SOL_SOCKET, SO_TIMESTAMPNS), (SOL_PACKET, PACKET_AUXDATA)
        unpack_timespec, unpack_auxdata = _TIMESPEC.unpack, _AUXDATA.unpack
        monotonic = time.monotonic
        waiting = [self._socket, self._wake_read]
        while True:
            try:
                frame, ancillary, _flags, _address = recvmsg(snaplen, _ANCILLARY_BYTES)
            except BlockingIOError:
                if self._give_up_at is not None:
                    # Stopping, and the socket is empty. Packets that came in since the counters were last read
                    # are counted but maybe not read yet: read the counters, and while they grew, read on.
                    if self._read_counters() and monotonic() < self._give_up_at:
                        continue
                    self._stats_final = True
                    return
                timeout = IDLE_WAKEUP_S
                if deadline is not None:
                    timeout = min(timeout, deadline - monotonic())
                    if timeout <= 0:
                        return
                if not select.select(waiting, [], [], timeout)[0]:
                    yield None
                continue
            ts, wire_len = None, len(frame)
            for level, kind, data in ancillary:
                if (level, kind) == timestamp_level:
                    seconds, nanoseconds = unpack_timespec(data)
                    ts = seconds + nanoseconds * 1e-9
                elif (level, kind) == auxdata_level:
                    status, wire_len, _snaplen, _mac, _net, vlan_tci, vlan_tpid = unpack_auxdata(data)
                    if (vlan_tci or status & TP_STATUS_VLAN_VALID) and linktype == DLT_EN10MB:
                        # the NIC took the 802.1Q tag off; put it back where it was on the wire
                        tpid = vlan_tpid if status & TP_STATUS_VLAN_TPID_VALID else ETH_P_8021Q
                        frame = frame[:12] + tpid.to_bytes(2, "big") + vlan_tci.to_bytes(2, "big") + frame[12:]
                        wire_len += 4
            yield (ts if ts is not None else time.time()), linktype, frame, wire_len
            if self._give_up_at is not None:
                if monotonic() >= self._give_up_at:
                    return
            elif deadline is not None and monotonic() >= deadline:
                self.stop()

    def stop(self) -> None:
        """End `frames()` once the frames the kernel holds are read (at most DRAIN_LIMIT_S
        more); a second call ends it at once. Safe to call from a signal handler."""
        now = time.monotonic()
        self._give_up_at = now + DRAIN_LIMIT_S if self._give_up_at is None else now
        if self._wake_write is not None:
            try:
                os.write(self._wake_write, b"x")
            except OSError:  # pipe full: a wake-up is pending already
                pass

    def kernel_stats(self) -> KernelStats:
        """Totals since the capture started. Once `frames()` has ended after a stop, the totals are those it
        settled on: every packet they count was read."""
        if not self._stats_final:
            self._read_counters()
        return KernelStats(self._packets, self._drops)

    def _read_counters(self) -> int:
        """Add the kernel's counters (which it resets on each read) to the totals; the packets newly counted."""
        if self._scapy_socket.closed:
            return 0
        packets, drops = _TPACKET_STATS.unpack(
            self._socket.getsockopt(SOL_PACKET, PACKET_STATISTICS, _TPACKET_STATS.size))
        self._packets += packets
        self._drops += drops
        return packets

    def close(self) -> None:
        self._scapy_socket.close()
        for fd in (self._wake_read, self._wake_write):
            if fd is not None:
                os.close(fd)
        self._wake_read = self._wake_write = None

    def __enter__(self) -> LiveCapture:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


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
