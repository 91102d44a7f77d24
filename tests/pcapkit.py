"""Rewriting captures in tests: read Ethernet/IPv4 frames with dpkt, cut, reorder, re-encapsulate
or retime them, build TCP connections around bytes of our own, and write pcap or pcapng.

A capture is handled as a list of `Packet(ts, frame)`, frames being Ethernet with IPv4 and TCP
(what tcpdump writes on Linux loopback). Lengths and checksums are recomputed on rewrite.
"""

from __future__ import annotations

import struct
from socket import inet_aton
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

import dpkt

ETHERNET, LINUX_SLL, LINUX_SLL2 = 1, 113, 276
ETHERTYPE_IPV4, ETHERTYPE_IPV6 = 0x0800, 0x86DD
LOOPBACK_MSS = 65483  # the TCP payload of a 65,549-byte loopback frame (Ethernet, IPv4, TCP with timestamps)


class Packet(NamedTuple):
    ts: float
    frame: bytes


def read_packets(path: Path) -> list[Packet]:
    with open(path, "rb") as f:
        reader = dpkt.pcap.Reader(f)
        assert reader.datalink() == ETHERNET, f"{path}: expected an Ethernet capture"
        return [Packet(ts, bytes(frame)) for ts, frame in reader]


def write_pcap(path: Path, packets: Iterable[Packet], linktype: int = ETHERNET) -> Path:
    with open(path, "wb") as out:
        writer = dpkt.pcap.Writer(out, snaplen=262144, linktype=linktype)
        for ts, frame in packets:
            writer.writepkt(frame, ts)
    return path


def write_pcapng(path: Path, packets: Iterable[Packet], interface_of: Callable[[Packet], int],
                 interfaces: list[tuple[int, Callable[[bytes], bytes]]]) -> Path:
    """pcapng with one interface per (link type, frame converter); nanosecond timestamps on
    every interface after the first, so each packet's time goes through two resolutions."""
    nanoseconds = [dpkt.pcapng.PcapngOptionLE(code=dpkt.pcapng.PCAPNG_OPT_IF_TSRESOL, data=b"\x09"),
                   dpkt.pcapng.PcapngOptionLE()]
    blocks = [dpkt.pcapng.InterfaceDescriptionBlockLE(linktype=linktype, snaplen=262144,
                                                      **({"opts": nanoseconds} if i else {}))
              for i, (linktype, _convert) in enumerate(interfaces)]
    with open(path, "wb") as out:
        writer = dpkt.pcapng.Writer(out, idb=blocks)
        for packet in packets:
            iface = interface_of(packet)
            ticks = round(packet.ts * 1e6) * (1000 if iface else 1)
            writer.writepkt(dpkt.pcapng.EnhancedPacketBlockLE(
                iface_id=iface, ts_high=ticks >> 32, ts_low=ticks & 0xFFFFFFFF,
                pkt_data=interfaces[iface][1](packet.frame)))
    return path


# ---------------------------------------------------------------- looking into frames


def ip_of(frame: bytes) -> dpkt.ip.IP:
    return dpkt.ethernet.Ethernet(frame).data


def tcp_of(frame: bytes) -> dpkt.tcp.TCP:
    return ip_of(frame).data


def payload_len(packet: Packet) -> int:
    return len(tcp_of(packet.frame).data)


def endpoints(packet: Packet) -> tuple[tuple[str, int], tuple[str, int]]:
    """(sender, receiver) as (dotted IP, port)."""
    ip = ip_of(packet.frame)
    tcp = ip.data
    return (dpkt.utils.inet_to_str(ip.src), tcp.sport), (dpkt.utils.inet_to_str(ip.dst), tcp.dport)


def client_port(packet: Packet, broker_port: int) -> int:
    tcp = tcp_of(packet.frame)
    return tcp.sport if tcp.dport == broker_port else tcp.dport


def from_client(packet: Packet, broker_port: int) -> bool:
    return tcp_of(packet.frame).dport == broker_port


# ---------------------------------------------------------------- rewriting


def rewrite(frame: bytes, **tcp_fields) -> bytes:
    """The frame with some TCP fields replaced (sport, dport, seq, ack, data, ...)."""
    eth = dpkt.ethernet.Ethernet(frame)
    ip = eth.data
    for name, value in tcp_fields.items():
        setattr(ip.data, name, value)
    ip.len = 0  # recomputed by dpkt, as are the checksums
    ip.sum = 0
    ip.data.sum = 0
    return bytes(eth)


def relinked(frame: bytes, header: Callable[[int], bytes]) -> bytes:
    """The Ethernet frame's network packet behind another link header, made from its ethertype."""
    ethertype = struct.unpack_from("!H", frame, 12)[0]
    return header(ethertype) + frame[14:]


def sll_header(ethertype: int) -> bytes:
    """Linux cooked v1: packet type 0 (to us), ARPHRD_LOOPBACK, 6-byte address."""
    return struct.pack("!HHH8sH", 0, 772, 6, b"\0" * 8, ethertype)


def sll2_header(ethertype: int) -> bytes:
    """Linux cooked v2: protocol, reserved, interface index 1, ARPHRD_LOOPBACK, packet type, address."""
    return struct.pack("!HHIHBB8s", ethertype, 0, 1, 772, 0, 6, b"\0" * 8)


def vlan_header(*tags: tuple[int, int]) -> Callable[[int], bytes]:
    """Ethernet with (TPID, VLAN id) tags in order, outermost first."""
    def header(ethertype: int) -> bytes:
        tag_bytes = b"".join(struct.pack("!HH", tpid, vid) for tpid, vid in tags)
        return b"\x02" * 6 + b"\x04" * 6 + tag_bytes + struct.pack("!H", ethertype)
    return header


def ipv6_address(ipv4: bytes) -> bytes:
    """fd00::a.b.c.d: a unique-local IPv6 address per IPv4 address."""
    return b"\xfd" + b"\0" * 11 + ipv4


def as_ipv6(frame: bytes) -> bytes:
    """The IPv4 packet of an Ethernet frame as IPv6, TCP segment unchanged but its checksum."""
    eth = dpkt.ethernet.Ethernet(frame)
    ip4 = eth.data
    ip6 = dpkt.ip6.IP6(v=6, nxt=dpkt.ip.IP_PROTO_TCP, hlim=ip4.ttl,
                       src=ipv6_address(ip4.src), dst=ipv6_address(ip4.dst), data=ip4.data)
    ip6.data.sum = 0
    ip6.plen = len(ip6.data)
    return frame[:12] + struct.pack("!H", ETHERTYPE_IPV6) + bytes(ip6)


def inserted_after(packets: list[Packet], index: int, data: bytes, broker_port: int) -> list[Packet]:
    """A client data segment carrying `data` inserted after packets[index] on the same
    connection: later client sequence numbers and server acknowledgements move up by len(data)."""
    anchor = packets[index]
    port = client_port(anchor, broker_port)
    last_client = next(p for p in reversed(packets[: index + 1])
                       if from_client(p, broker_port) and client_port(p, broker_port) == port)
    tcp = tcp_of(last_client.frame)
    seq = (tcp.seq + len(tcp.data) + (1 if tcp.flags & dpkt.tcp.TH_SYN else 0)) % 2**32
    out = packets[: index + 1]
    out.append(Packet(anchor.ts, rewrite(last_client.frame, seq=seq, data=data,
                                         flags=dpkt.tcp.TH_ACK | dpkt.tcp.TH_PUSH)))
    for packet in packets[index + 1:]:
        if client_port(packet, broker_port) == port:
            tcp = tcp_of(packet.frame)
            if from_client(packet, broker_port):
                packet = Packet(packet.ts, rewrite(packet.frame, seq=(tcp.seq + len(data)) % 2**32))
            elif tcp.flags & dpkt.tcp.TH_ACK:
                packet = Packet(packet.ts, rewrite(packet.frame, ack=(tcp.ack + len(data)) % 2**32))
        out.append(packet)
    return out


# ---------------------------------------------------------------- connections of our own


class TcpConversation:
    """Ethernet/IPv4 frames of one TCP connection built from the bytes each side sends."""

    def __init__(self, client: tuple[str, int], server: tuple[str, int], start: float = 1_700_000_000.0,
                 client_isn: int = 1000, server_isn: int = 50000, mss: int = 1460):
        self.client, self.server = client, server
        self.ts = start
        self.mss = mss
        self.seq = {client: client_isn, server: server_isn}
        self.packets: list[Packet] = []
        self._segment(client, dpkt.tcp.TH_SYN, advance=1)
        self._segment(server, dpkt.tcp.TH_SYN | dpkt.tcp.TH_ACK, advance=1)
        self._segment(client, dpkt.tcp.TH_ACK)

    def _peer(self, side):
        return self.server if side == self.client else self.client

    def _segment(self, side, flags, data: bytes = b"", advance: int = 0) -> None:
        self.ts += 0.0001
        peer = self._peer(side)
        tcp = dpkt.tcp.TCP(sport=side[1], dport=peer[1], seq=self.seq[side],
                           ack=self.seq[peer] if flags & dpkt.tcp.TH_ACK else 0,
                           flags=flags, win=65535, data=data)
        ip = dpkt.ip.IP(src=inet_aton(side[0]), dst=inet_aton(peer[0]), p=dpkt.ip.IP_PROTO_TCP, ttl=64, data=tcp)
        eth = dpkt.ethernet.Ethernet(src=b"\x02" * 6, dst=b"\x04" * 6, type=ETHERTYPE_IPV4, data=ip)
        self.packets.append(Packet(round(self.ts, 6), bytes(eth)))
        self.seq[side] = (self.seq[side] + len(data) + advance) % 2**32

    def send(self, from_client: bool, data: bytes) -> TcpConversation:
        side = self.client if from_client else self.server
        for i in range(0, len(data), self.mss):
            self._segment(side, dpkt.tcp.TH_ACK | dpkt.tcp.TH_PUSH, data[i:i + self.mss])
        return self

    def ack(self, from_client: bool) -> TcpConversation:
        """A bare ACK (as a TCP keepalive's answer)."""
        self._segment(self.client if from_client else self.server, dpkt.tcp.TH_ACK)
        return self

    def close(self) -> list[Packet]:
        self._segment(self.client, dpkt.tcp.TH_FIN | dpkt.tcp.TH_ACK, advance=1)
        self._segment(self.server, dpkt.tcp.TH_FIN | dpkt.tcp.TH_ACK, advance=1)
        self._segment(self.client, dpkt.tcp.TH_ACK)
        return self.packets


def merged(*captures: list[Packet]) -> list[Packet]:
    """Packets of several captures in one timeline (stable: ties keep capture order)."""
    return sorted((p for capture in captures for p in capture), key=lambda p: p.ts)


def shifted(packets: list[Packet], seconds: float) -> list[Packet]:
    return [Packet(ts + seconds, frame) for ts, frame in packets]
