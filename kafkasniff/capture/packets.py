"""Turn one raw link-layer frame into a TcpSegment.

Independent of where frames come from: capture files and live capture both hand over
(frame bytes, link type, timestamp, original length). Link types: Ethernet, Linux cooked v1
and v2, BSD null/loopback and raw IPv4/IPv6, each with any 802.1Q/QinQ tags; IPv4 and IPv6
with extension headers.

The headers are parsed in C (`_headers.c`): every frame of a capture passes through here.
dpkt builds an object per layer and copies the payload at each one (92k frames/s on a loopback
capture of small segments, 17k frames/s on one of 64 KiB segments); direct parsing in Python
reached ~700k frames/s, and took a fifth of the one-line view's time.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from kafkasniff.capture import _headers

FIN, SYN, RST, ACK = 0x01, 0x02, 0x04, 0x10  # TCP header flags


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
    payload: bytes
    missing: int = 0

    @property
    def truncated(self) -> bool:
        return self.missing > 0


_headers.use_segment_type(TcpSegment)

# A frame whose link layer is not read is skipped for this reason followed by the link type's number (_headers.c);
# these are the layers read.
LINK_TYPE_REASON = "link type "
LINK_LAYERS_READ = "Ethernet, Linux cooked v1 and v2, BSD null/loopback, raw IPv4 and IPv6"


class FrameParser:
    """Parses frames into TcpSegments and counts the ones it skips, by reason.

    Skip reasons: "link type N" (unsupported link type), "not IP", "not TCP",
    "IP fragment" (fragmented packets are not reassembled), "malformed" (headers cut or
    inconsistent).
    """

    def __init__(self) -> None:
        self.skipped: Counter[str] = Counter()

    def parse(
        self, frame: bytes, linktype: int, ts: float, wire_len: int | None = None
    ) -> TcpSegment | None:
        """Return the TCP segment in `frame`, or None (and count why) if there is none.

        `wire_len` is the frame's original length on the wire when the capture knows it;
        a larger value than len(frame) means the frame was cut by the snaplen.
        """
        found = _headers.parse_frame(frame, linktype, ts, wire_len)
        if type(found) is str:
            self.skipped[found] += 1
            return None
        return found


# -- whole packets pasted as hex (explain): which headers are there, and the TCP payload after them ------

_ETHERTYPE_IPV4, _ETHERTYPE_IPV6, _ETHERTYPE_VLAN = 0x0800, 0x86DD, 0x8100
_ETHERNET_MINIMUM = 60  # shorter frames are padded to this (without the FCS)
_TCP = 6
_IPV6_OPTION_HEADERS = (0, 43, 60)  # hop-by-hop, routing, destination options: (next, length / 8 - 1, ...)


def dumped_packet_payload(data: bytes) -> tuple[bytes, str] | None:
    """The TCP payload of a whole packet dumped with its headers (tcpdump -x/-X: from the IP header;
    tcpdump -XX, tshark -x: from the link header: Ethernet, 802.1Q, Linux cooked v1/v2), and the headers
    found, e.g. "Ethernet, IPv4, TCP"; None unless the bytes start with such headers whose lengths agree
    with the bytes given (a Kafka frame does not)."""
    for link, ip_at in _link_layers(data):
        found = _ip_tcp_payload(data, ip_at, padded=link == "Ethernet")
        if found is not None:
            payload, ip = found
            return payload, ", ".join(filter(None, (link, ip, "TCP")))
    return None


def _link_layers(data: bytes):
    """(link layer name, where the IP header would start) for each link layer the bytes may start with."""
    yield "", 0
    ethertype_at, link = 12, "Ethernet"
    while len(data) >= ethertype_at + 2:
        ethertype = int.from_bytes(data[ethertype_at:ethertype_at + 2], "big")
        if ethertype != _ETHERTYPE_VLAN:
            break
        ethertype_at, link = ethertype_at + 4, "Ethernet 802.1Q"
    if len(data) >= ethertype_at + 2 and \
            int.from_bytes(data[ethertype_at:ethertype_at + 2], "big") in (_ETHERTYPE_IPV4, _ETHERTYPE_IPV6):
        yield link, ethertype_at + 2
    if len(data) >= 16 and int.from_bytes(data[14:16], "big") in (_ETHERTYPE_IPV4, _ETHERTYPE_IPV6):
        yield "Linux cooked", 16
    if len(data) >= 20 and int.from_bytes(data[0:2], "big") in (_ETHERTYPE_IPV4, _ETHERTYPE_IPV6):
        yield "Linux cooked v2", 20


def _ip_tcp_payload(data: bytes, at: int, padded: bool) -> tuple[bytes, str] | None:
    """(TCP payload, IP version name) of an IP packet at data[at] holding a TCP segment, if its length
    fields agree with the bytes given (an Ethernet frame may be padded to its minimum size)."""
    if len(data) < at + 20:
        return None
    version = data[at] >> 4
    if version == 4:
        header = (data[at] & 0x0F) * 4
        total = int.from_bytes(data[at + 2:at + 4], "big")
        protocol, name = data[at + 9], "IPv4"
    elif version == 6 and len(data) >= at + 40:
        header = 40
        total = 40 + int.from_bytes(data[at + 4:at + 6], "big")
        protocol, name = data[at + 6], "IPv6"
        while protocol in _IPV6_OPTION_HEADERS and len(data) >= at + header + 8:
            protocol = data[at + header]
            header += (data[at + header + 1] + 1) * 8
    else:
        return None
    end = at + total
    if protocol != _TCP or header < 20 or total < header + 20 or \
            not (end == len(data) or padded and end < len(data) == _ETHERNET_MINIMUM):
        return None
    tcp_at = at + header
    tcp_header = (data[tcp_at + 12] >> 4) * 4
    if tcp_header < 20 or tcp_at + tcp_header > end:
        return None
    return data[tcp_at + tcp_header:end], name
