"""Live capture from a network interface (Linux AF_PACKET through scapy).

Frames come out as the same (timestamp, link type, frame bytes, original length) tuples
that capture files give, so `sniff` feeds them through the same FrameParser and Analyzer
as `decode`.

scapy opens the socket (`conf.L2listen`): it compiles the BPF filter with libpcap and
attaches it before binding, drains whatever slipped in before the filter, and enables
kernel timestamps and VLAN auxiliary data. Frames are then read here with one
`recvmsg` per frame rather than through scapy's `recv`/AsyncSniffer: those dissect every
frame into scapy layers (a few thousand frames/s) and read at most 65,535 bytes, which
cuts the 65,549-byte frames of loopback (MTU 65,536). The auxiliary data also gives each
frame's original length, so a frame longer than the snaplen is known to be cut.
"""

from __future__ import annotations

import os
import select
import socket
import time
from collections.abc import Iterator
from struct import Struct
from typing import NamedTuple

SNAPLEN = 262144  # tcpdump's default; larger than loopback's 65,549-byte frames
DEFAULT_BUFFER_BYTES = 32 << 20
IDLE_WAKEUP_S = 0.5  # how often an idle capture returns control (deadline, stop request)

SOL_PACKET = 263
PACKET_STATISTICS = 6
PACKET_AUXDATA = 8
SO_TIMESTAMPNS = 35
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

    Iterate `frames()` once; `stop()` (safe to call from a signal handler) ends the
    iteration at the next frame boundary. `kernel_stats()` reads the kernel's counters.
    """

    def __init__(self, interface: str, bpf_filter: str, buffer_bytes: int = DEFAULT_BUFFER_BYTES,
                 snaplen: int = SNAPLEN):
        names = [i.name for i in interfaces()]
        if interface not in names:
            raise LiveCaptureError(
                f"no interface {interface!r}; available: {', '.join(names)} (see --list-interfaces)")
        from scapy.config import conf
        from scapy.error import Scapy_Exception
        from scapy.interfaces import resolve_iface

        self.interface = interface
        self.bpf_filter = bpf_filter
        self.snaplen = snaplen
        loopback = resolve_iface(interface).type == ARPHRD_LOOPBACK
        # Loopback shows every packet twice, leaving and arriving; keep the arrival only
        # (as libpcap does), in the kernel so the copies cost no buffer space.
        kernel_filter = f"({bpf_filter}) and inbound" if loopback else bpf_filter
        try:
            self._scapy_socket = conf.L2listen(iface=interface, filter=kernel_filter)
        except PermissionError:
            raise LiveCaptureError(f"no permission to capture on {interface}: {PERMISSION_HINT}") from None
        except Scapy_Exception as error:
            raise LiveCaptureError(f"invalid capture filter {bpf_filter!r}: {_filter_problem(error)}") from None
        except OSError as error:
            raise LiveCaptureError(f"cannot capture on {interface}: {error.strerror or error}") from None
        self._socket: socket.socket = self._scapy_socket.ins
        hardware_type = self._socket.getsockname()[3]
        from scapy.data import ARPHRD_TO_DLT

        self.linktype = ARPHRD_TO_DLT.get(hardware_type)
        if self.linktype is None or self.linktype < 0:
            self._scapy_socket.close()
            raise LiveCaptureError(f"{interface}: link type (ARPHRD {hardware_type}) not supported")
        self.file_linktype = _FILE_LINKTYPES.get(self.linktype, self.linktype)
        self.buffer_bytes = self._set_buffer(buffer_bytes)
        self._socket.setblocking(False)
        self._wake_read, self._wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._stopping = False
        self._packets = self._drops = 0

    def _set_buffer(self, size: int) -> int:
        """Raise the socket buffer past rmem_max when allowed (root); return what the kernel gave."""
        try:
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUFFORCE, size)
        except PermissionError:
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)
        return self._socket.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)

    def frames(self, deadline: float | None = None) -> Iterator[tuple[float, int, bytes, int]]:
        """Yield (timestamp, link type, frame, original length) until `stop()` or the
        `deadline` (time.monotonic() value) passes."""
        recvmsg = self._socket.recvmsg
        snaplen, linktype = self.snaplen, self.linktype
        timestamp_level, auxdata_level = (socket.SOL_SOCKET, SO_TIMESTAMPNS), (SOL_PACKET, PACKET_AUXDATA)
        unpack_timespec, unpack_auxdata = _TIMESPEC.unpack, _AUXDATA.unpack
        waiting = [self._socket, self._wake_read]
        while not self._stopping:
            try:
                frame, ancillary, _flags, _address = recvmsg(snaplen, _ANCILLARY_BYTES)
            except BlockingIOError:
                timeout = IDLE_WAKEUP_S
                if deadline is not None:
                    timeout = deadline - time.monotonic()
                    if timeout <= 0:
                        return
                    timeout = min(timeout, IDLE_WAKEUP_S)
                select.select(waiting, [], [], timeout)
                continue
            ts, wire_len = None, len(frame)
            for level, kind, data in ancillary:
                if (level, kind) == timestamp_level:
                    seconds, nanoseconds = unpack_timespec(data)
                    ts = seconds + nanoseconds * 1e-9
                elif (level, kind) == auxdata_level:
                    status, wire_len, _, _, vlan_tci, vlan_tpid = unpack_auxdata(data)[:6]
                    if (vlan_tci or status & TP_STATUS_VLAN_VALID) and linktype == DLT_EN10MB:
                        # the NIC took the 802.1Q tag off; put it back where it was on the wire
                        tpid = vlan_tpid if status & TP_STATUS_VLAN_TPID_VALID else ETH_P_8021Q
                        frame = frame[:12] + tpid.to_bytes(2, "big") + vlan_tci.to_bytes(2, "big") + frame[12:]
                        wire_len += 4
            yield (ts if ts is not None else time.time()), linktype, frame, wire_len
            if deadline is not None and time.monotonic() >= deadline:
                return

    def stop(self) -> None:
        """End `frames()` soon; wakes a capture waiting for traffic."""
        self._stopping = True
        if self._wake_write is not None:
            try:
                os.write(self._wake_write, b"x")
            except OSError:  # pipe full: a wake-up is pending already
                pass

    def kernel_stats(self) -> KernelStats:
        """Totals since the capture started (the kernel resets its counters on each read)."""
        if not self._scapy_socket.closed:
            packets, drops = _TPACKET_STATS.unpack(
                self._socket.getsockopt(SOL_PACKET, PACKET_STATISTICS, _TPACKET_STATS.size))
            self._packets += packets
            self._drops += drops
        return KernelStats(self._packets, self._drops)

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


def _filter_problem(error: Exception) -> str:
    """libpcap's reason from scapy's 'Cannot set filter: Failed to compile ... (reason)'."""
    text = str(error)
    return text[text.rfind("(") + 1:].rstrip(")") if text.endswith(")") and "(" in text else text
