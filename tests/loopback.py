"""Conversations on loopback, recorded by tcpdump: real frames replayed by a stub client and a stub
broker, and TLS.

For conversations no real client or broker will hold on demand (a broker answering an acks=0 Produce,
a first frame with trailing bytes, a capture that begins after a request): the frames of a connection of
one of the project's captures, changed where the case needs it, go over a real TCP connection on
loopback, and tcpdump writes what the kernel carried.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pcapkit
from broker import LOOPBACK, Tcpdump, free_port, split_frames
from capture_manifest import CAPTURES_DIR

Step = tuple[bool, bytes]  # (sent by the client?, bytes)
SETTLE_S = 0.2  # lets the last FIN and ACK reach tcpdump before it stops


def connection_frames(name: str, stream: int) -> list[Step]:
    """The frames of one connection of a capture (its TCP stream number), in the order they completed."""
    connections: dict[frozenset, list[pcapkit.Packet]] = {}
    for packet in pcapkit.read_packets(CAPTURES_DIR / f"{name}.pcap"):
        connections.setdefault(frozenset(pcapkit.endpoints(packet)), []).append(packet)
    packets = list(connections.values())[stream]
    client = pcapkit.endpoints(packets[0])[0]  # the sender of the SYN
    pending = {True: b"", False: b""}
    steps = []
    for packet in packets:
        from_client = pcapkit.endpoints(packet)[0] == client
        pending[from_client] += pcapkit.tcp_of(packet.frame).data
        frames = split_frames(pending[from_client])
        pending[from_client] = pending[from_client][sum(map(len, frames)):]
        steps += [(from_client, frame) for frame in frames]
    return steps


def with_size(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


def converse(port: int, steps: list[Step], before: dict[int, Callable[[], None]] | None = None) -> None:
    """A stub broker listening on `port` and a stub client exchange `steps` in turn, each read whole by
    the other side before the next is sent; `before[i]` runs before step i. The client closes first."""
    with socket.create_server((LOOPBACK, port)) as listener:
        client = socket.create_connection((LOOPBACK, port))
        broker, _ = listener.accept()
        with client, broker:
            for i, (from_client, data) in enumerate(steps):
                if before and i in before:
                    before[i]()
                sender, receiver = (client, broker) if from_client else (broker, client)
                sender.sendall(data)
                receive(receiver, len(data))
            client.shutdown(socket.SHUT_RDWR)
            broker.recv(1)  # the client's FIN
    time.sleep(SETTLE_S)


def record(path: Path, steps: list[Step], start_at: int = 0) -> tuple[Path, int]:
    """A capture of `steps` replayed on a free port, tcpdump starting before step `start_at` (0: before
    the handshake). Returns (capture, broker port)."""
    port = free_port()
    dump = Tcpdump(path, port)
    started = []

    def start() -> None:
        dump.__enter__()
        started.append(True)

    try:
        if start_at == 0:
            start()
        converse(port, steps, {start_at: start} if start_at else None)
    finally:
        if started:
            dump.__exit__(None, None, None)
    return path, port


def tls_exchange(port: int, certificate: tuple[Path, Path], data: bytes) -> None:
    """A TLS handshake on loopback (Python's ssl module at both ends), `data` sent each way, then both
    sides close."""
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(*certificate)
    client_context = ssl.create_default_context()
    client_context.check_hostname = False
    client_context.verify_mode = ssl.CERT_NONE
    with socket.create_server((LOOPBACK, port)) as listener:
        def serve() -> None:
            connection, _ = listener.accept()
            with server_context.wrap_socket(connection, server_side=True) as tls:
                tls.sendall(receive(tls, len(data)))

        server = threading.Thread(target=serve)
        server.start()
        with client_context.wrap_socket(socket.create_connection((LOOPBACK, port)),
                                        server_hostname="localhost") as tls:
            tls.sendall(data)
            assert receive(tls, len(data)) == data
        server.join()
    time.sleep(SETTLE_S)


def receive(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        data += sock.recv(size - len(data))
    return data


def tls_converse(port: int, certificate: tuple[Path, Path], steps: list[Step], keylog: Path) -> None:
    """`converse` over TLS: Python's ssl module at both ends (the server in a thread), the client logging its
    secrets to `keylog`, TLS 1.3."""
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(*certificate)
    client_context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_context.check_hostname = False
    client_context.verify_mode = ssl.CERT_NONE
    client_context.keylog_filename = str(keylog)

    def play(tls: ssl.SSLSocket, is_client: bool) -> None:
        for from_client, data in steps:
            if from_client == is_client:
                tls.sendall(data)
            else:
                receive(tls, len(data))

    with socket.create_server((LOOPBACK, port)) as listener:
        def serve() -> None:
            connection, _ = listener.accept()
            with server_context.wrap_socket(connection, server_side=True) as tls:
                play(tls, False)
                tls.recv(1)  # the client's close

        server = threading.Thread(target=serve)
        server.start()
        with client_context.wrap_socket(socket.create_connection((LOOPBACK, port)),
                                        server_hostname="kafka.internal") as tls:
            play(tls, True)
        server.join()
    time.sleep(SETTLE_S)
