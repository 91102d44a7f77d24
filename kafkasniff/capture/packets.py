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
