"""Record loopback_exchange.pcap: a real TCP exchange between two Python sockets on 127.0.0.1.

The client sends requests and waits for each reply, like a Kafka client; one request is
large enough that Linux's loopback sends 65,549-byte frames. The bytes are drawn from
SHAKE-256 so tests can rebuild both streams from loopback_exchange.json alone.
Run as root from the repository root: python tests/data/record_loopback_exchange.py
"""

import hashlib
import json
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REQUEST_SIZES = [300, 300, 1200, 300, 70000]
RESPONSE_SIZES = [120, 2000, 120, 120, 500]
CLIENT_SEED, SERVER_SEED = b"kafkasniff client", b"kafkasniff server"


def stream_bytes(seed: bytes, size: int) -> bytes:
    return hashlib.shake_256(seed).digest(size)


def recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = sock.recv(size)
        if not chunk:
            raise ConnectionError("peer closed early")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def serve(listener: socket.socket, responses: list[bytes]) -> None:
    conn, _ = listener.accept()
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for request_size, response in zip(REQUEST_SIZES, responses):
            recv_exact(conn, request_size)
            conn.sendall(response)
        assert conn.recv(1) == b""


def split(data: bytes, sizes: list[int]) -> list[bytes]:
    parts, pos = [], 0
    for size in sizes:
        parts.append(data[pos : pos + size])
        pos += size
    return parts


def main() -> None:
    requests = split(stream_bytes(CLIENT_SEED, sum(REQUEST_SIZES)), REQUEST_SIZES)
    responses = split(stream_bytes(SERVER_SEED, sum(RESPONSE_SIZES)), RESPONSE_SIZES)
    listener = socket.socket()
    # A large receive buffer opens the window wide enough for full 64 KiB loopback segments.
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    pcap = HERE / "loopback_exchange.pcap"
    tcpdump = subprocess.Popen(
        ["tcpdump", "-i", "lo", "--immediate-mode", "-U", "-B", "4096", "-w", str(pcap), f"tcp port {port}"],
        stderr=subprocess.PIPE, text=True,
    )
    assert "listening on" in tcpdump.stderr.readline()
    server = threading.Thread(target=serve, args=(listener, responses))
    server.start()
    with socket.create_connection(("127.0.0.1", port)) as client:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for request, response in zip(requests, responses):
            client.sendall(request)
            assert recv_exact(client, len(response)) == response
        client.shutdown(socket.SHUT_WR)
        server.join()
        assert client.recv(1) == b""
    time.sleep(1)
    tcpdump.send_signal(signal.SIGINT)
    tcpdump.wait()
    listener.close()
    manifest = {
        "server_port": port,
        "client_seed": CLIENT_SEED.decode(), "request_sizes": REQUEST_SIZES,
        "server_seed": SERVER_SEED.decode(), "response_sizes": RESPONSE_SIZES,
    }
    (HERE / "loopback_exchange.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
