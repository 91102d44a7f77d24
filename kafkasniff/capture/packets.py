"""Turn one raw link-layer frame into a TcpSegment.

Independent of where frames come from: capture files and live capture both hand over
(frame bytes, link type, timestamp, original length).

The headers are parsed with struct/indexing rather than dpkt's classes: dpkt builds an
object per layer and copies the payload at each one, which measured 92k frames/s on a
loopback capture of small segments and 17k frames/s on one of 64 KiB segments, against
~700k frames/s for direct parsing.
"""

from __future__ import annotations

from collections import Counter
from socket import AF_INET6, inet_ntoa, inet_ntop
from struct import Struct
from struct import error as StructError
from typing import NamedTuple

from dpkt.tcp import TH_ACK, TH_FIN, TH_RST, TH_SYN

FIN, SYN, RST, ACK = TH_FIN, TH_SYN, TH_RST, TH_ACK

# Link types as capture files number them (dpkt's DLT_RAW and DLT_LOOP follow the OS
# it runs on instead).
LINKTYPE_NULL = 0
LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101
LINKTYPE_LOOP = 108
LINKTYPE_LINUX_SLL = 113
LINKTYPE_IPV4 = 228
LINKTYPE_IPV6 = 229
LINKTYPE_LINUX_SLL2 = 276
# The OS values of DLT_RAW (12 on most BSDs, 14 on OpenBSD) end up in some files.
RAW_IP_LINKTYPES = frozenset({LINKTYPE_RAW, 12, 14, LINKTYPE_IPV4, LINKTYPE_IPV6})
ETHERTYPE_IPV4 = 0x0800
ETHERTYPE_IPV6 = 0x86DD
VLAN_ETHERTYPES = frozenset({0x8100, 0x88A8, 0x9100})

IPPROTO_TCP = 6
IPV6_HOP_BY_HOP, IPV6_ROUTING, IPV6_FRAGMENT, IPV6_DEST_OPTS, IPV6_AUTH = 0, 43, 44, 60, 51
_IPV6_SKIPPABLE = frozenset({IPV6_HOP_BY_HOP, IPV6_ROUTING, IPV6_DEST_OPTS})

_TCP_HEADER = Struct("!HHIIBB").unpack_from
# version/IHL, total length, flags/fragment offset, protocol, source and destination address
_IPV4_HEADER = Struct("!BxHxxHxBxx8s").unpack_from
MAX_REMEMBERED_ADDRESS_PAIRS = 4096  # texts of (source, destination) pairs kept: hosts talk to few peers


class TcpSegment(NamedTuple):
    """One TCP segment as seen on the wire.

    `missing` counts TCP payload bytes the frame should have carried but that were not
    captured (snaplen cut); the payload holds only the bytes present.
    """

    ts: float
    src: str
    sport: int
    dst: str
    dport: int
    seq: int
    ack: int
    flags: int
    payload: bytes | memoryview
    missing: int = 0

    @property
    def truncated(self) -> bool:
        return self.missing > 0


class FrameParser:
    """Parses frames into TcpSegments and counts the ones it skips, by reason.

    Skip reasons: "link type N" (unsupported link type), "not IP", "not TCP",
    "IP fragment" (fragmented packets are not reassembled), "malformed" (headers cut or
    inconsistent).
    """

    def __init__(self) -> None:
        self.skipped: Counter[str] = Counter()
        self._ipv4_pairs: dict[bytes, tuple[str, str]] = {}

    def parse(
        self, frame: bytes, linktype: int, ts: float, wire_len: int | None = None
    ) -> TcpSegment | None:
        """Return the TCP segment in `frame`, or None (and count why) if there is none.

        `wire_len` is the frame's original length on the wire when the capture knows it;
        a larger value than len(frame) means the frame was cut by the snaplen.
        """
        try:
            if linktype == LINKTYPE_ETHERNET:
                ethertype = frame[12] << 8 | frame[13]
                off = 14
            elif linktype == LINKTYPE_LINUX_SLL:
                ethertype = frame[14] << 8 | frame[15]
                off = 16
            elif linktype == LINKTYPE_LINUX_SLL2:
                ethertype = frame[0] << 8 | frame[1]
                off = 20
            elif linktype in RAW_IP_LINKTYPES:
                ethertype = ETHERTYPE_IPV6 if frame[0] >> 4 == 6 else ETHERTYPE_IPV4
                off = 0
            elif linktype == LINKTYPE_NULL or linktype == LINKTYPE_LOOP:
                ethertype = _loopback_ethertype(frame)
                off = 4
            else:
                self.skipped[f"link type {linktype}"] += 1
                return None
            while ethertype in VLAN_ETHERTYPES:
                ethertype = frame[off + 2] << 8 | frame[off + 3]
                off += 4

            cut = len(frame) - (wire_len if wire_len is not None else len(frame))
            if ethertype == ETHERTYPE_IPV4:
                return self._ipv4(frame, off, ts, cut)
            if ethertype == ETHERTYPE_IPV6:
                return self._ipv6(frame, off, ts, cut)
            self.skipped["not IP"] += 1
            return None
        except (IndexError, StructError, OSError, ValueError):  # a header runs past the bytes
            self.skipped["malformed"] += 1
            return None

    def _ipv4(self, frame, off, ts, cut):
        version_ihl, total_len, fragment, protocol, addresses = _IPV4_HEADER(frame, off)
        header_len = (version_ihl & 0x0F) * 4
        if version_ihl >> 4 != 4 or header_len < 20:
            self.skipped["malformed"] += 1
            return None
        if protocol != IPPROTO_TCP:
            self.skipped["not TCP"] += 1
            return None
        if fragment & 0x3FFF:  # more-fragments flag or offset
            self.skipped["IP fragment"] += 1
            return None
        # TSO-captured packets carry total length 0: the frame length is all there is.
        end = off + total_len if total_len else len(frame) - min(cut, 0)
        pair = self._ipv4_pairs.get(addresses)
        if pair is None:
            pair = self._ipv4_pairs[addresses] = (inet_ntoa(addresses[:4]), inet_ntoa(addresses[4:]))
            if len(self._ipv4_pairs) > MAX_REMEMBERED_ADDRESS_PAIRS:
                self._ipv4_pairs.clear()
        return self._tcp(frame, off + header_len, end, ts, cut, *pair)

    def _ipv6(self, frame, off, ts, cut):
        if frame[off] >> 4 != 6:
            self.skipped["malformed"] += 1
            return None
        payload_len = frame[off + 4] << 8 | frame[off + 5]
        end = off + 40 + payload_len if payload_len else len(frame) - min(cut, 0)
        next_header = frame[off + 6]
        src = inet_ntop(AF_INET6, frame[off + 8 : off + 24])
        dst = inet_ntop(AF_INET6, frame[off + 24 : off + 40])
        pos = off + 40
        while next_header != IPPROTO_TCP:
            if next_header in _IPV6_SKIPPABLE:
                header_len = (frame[pos + 1] + 1) * 8
            elif next_header == IPV6_FRAGMENT:
                if (frame[pos + 2] << 8 | frame[pos + 3]) & 0xFFF9:  # offset or more-fragments
                    self.skipped["IP fragment"] += 1
                    return None
                header_len = 8
            elif next_header == IPV6_AUTH:
                header_len = (frame[pos + 1] + 2) * 4
            else:
                self.skipped["not TCP"] += 1
                return None
            next_header = frame[pos]
            pos += header_len
        return self._tcp(frame, pos, end, ts, cut, src, dst)

    def _tcp(self, frame, off, ip_end, ts, cut, src, dst):
        sport, dport, seq, ack, data_offset, flags = _TCP_HEADER(frame, off)
        start = off + (data_offset >> 4) * 4
        if start - off < 20 or start > ip_end:
            self.skipped["malformed"] += 1
            return None
        present_end = min(ip_end, len(frame))
        if start > present_end:  # options cut by the snaplen
            self.skipped["malformed"] += 1
            return None
        # Trust the IP length for what is missing only as far as the capture admits a cut,
        # so a lying length field in an uncut frame does not invent a gap.
        missing = min(ip_end - present_end, -cut) if cut < 0 else 0
        return TcpSegment(
            ts, src, sport, dst, dport, seq, ack, flags,
            memoryview(frame)[start:present_end], missing,
        )


def _loopback_ethertype(frame) -> int:
    """Map the 4-byte address family of BSD loopback/null headers to an ethertype.

    The family is in the capturing host's byte order (DLT_NULL) or network order
    (DLT_LOOP); a family fits one byte, so whichever end holds it tells the order.
    """
    family = frame[0] if frame[0] else frame[3]
    if family == 2:
        return ETHERTYPE_IPV4
    if family in (10, 24, 28, 30):  # AF_INET6 on Linux, NetBSD/OpenBSD, FreeBSD, macOS
        return ETHERTYPE_IPV6
    return 0
