"""TLS record layer and key schedule, sans-I/O: the bytes of each direction of a TCP connection in, the
plaintext they carry out, given the secrets of a key log (see keylog.py).

TLS 1.2 (AES-GCM, ChaCha20-Poly1305, AES-CBC with HMAC, encrypt-then-MAC too) and TLS 1.3 (AES-GCM,
ChaCha20-Poly1305, key updates). The primitives are the `cryptography` package's; what no library offers
as a parser (records, the hellos, the TLS 1.2 PRF, HKDF-Expand-Label's label) is here, but for the per-record
work: record keys and the loop that opens each direction's records are compiled (stream/tlsdirection.pyx),
and call back here for what is not per record (handshake messages, finding keys, failing).

A connection whose handshake was not captured is decrypted when a TLS 1.3 traffic secret of the key log
authenticates one of its records at some sequence number (TLS 1.2 keys need the hellos' randoms). A
connection that cannot be decrypted says why once (`failure`), with what its hellos told (`description`).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand

from kafkasniff.stream.keylog import KeyLog
from kafkasniff.stream.tlsdirection import HASHES, MAC_LEN, TAG, Direction, RecordKeys, hmac_digest
from kafkasniff.stream.tlsrecord import ALERT, CHANGE_CIPHER_SPEC, HANDSHAKE, HEADER

TLS12, TLS13 = 0x0303, 0x0304
CLIENT_HELLO, SERVER_HELLO, FINISHED, KEY_UPDATE = 1, 2, 20, 24
EXT_SERVER_NAME, EXT_ENCRYPT_THEN_MAC, EXT_SUPPORTED_VERSIONS = 0, 22, 43
# A server's random that says "HelloRetryRequest" (RFC 8446 4.1.3): a second ClientHello follows.
RETRY_RANDOM = bytes.fromhex("cf21ad74e59a6111be1d8c021e65b891c2a211167abb8c5e079e09e2c8a8339c")
# Alerts that end a handshake, by number (RFC 8446 section 6), for the notice saying why.
ALERTS = {0: "close_notify", 10: "unexpected_message", 40: "handshake_failure", 42: "bad_certificate",
          46: "certificate_unknown", 48: "unknown_ca", 70: "protocol_version", 71: "insufficient_security",
          80: "internal_error", 112: "unrecognized_name", 120: "no_application_protocol"}
MAX_HANDSHAKE_MESSAGE = 1 << 16  # hellos, Finished and KeyUpdate are small; larger messages are skipped unread
# Bytes a connection may hold while it waits for its keys to appear in a followed key log.
MAX_HELD = 16 << 20
# Sequence numbers tried when the record sequence is not known (capture starting mid-way, or after missing
# bytes), and decryptions one connection may spend on finding its keys and place.
MAX_SEQUENCE_GUESS = 4096
MAX_GUESSES = 1 << 16
_SEQUENCE_ROUNDS = ((0, 16), (16, 256), (256, MAX_SEQUENCE_GUESS))
_LEN = struct.Struct(">H")


class Suite(NamedTuple):
    name: str
    tls13: bool
    cipher: str  # "gcm", "chacha" or "cbc"
    key_len: int
    hash: str  # of the PRF (TLS 1.2) or HKDF (TLS 1.3)
    mac: str | None  # HMAC's hash (CBC suites)


def _suites() -> dict[int, Suite]:
    table = {
        0x1301: ("TLS_AES_128_GCM_SHA256", True, "gcm", 16, "sha256", None),
        0x1302: ("TLS_AES_256_GCM_SHA384", True, "gcm", 32, "sha384", None),
        0x1303: ("TLS_CHACHA20_POLY1305_SHA256", True, "chacha", 32, "sha256", None),
    }
    for exchange, ids in (("ECDHE_ECDSA", (0xC02B, 0xC02C, 0xCCA9, 0xC009, 0xC00A, 0xC023, 0xC024)),
                          ("ECDHE_RSA", (0xC02F, 0xC030, 0xCCA8, 0xC013, 0xC014, 0xC027, 0xC028)),
                          ("DHE_RSA", (0x009E, 0x009F, 0xCCAA, 0x0033, 0x0039, 0x0067, 0x006B)),
                          ("RSA", (0x009C, 0x009D, None, 0x002F, 0x0035, 0x003C, 0x003D))):
        kinds = (("AES_128_GCM_SHA256", "gcm", 16, "sha256", None),
                 ("AES_256_GCM_SHA384", "gcm", 32, "sha384", None),
                 ("CHACHA20_POLY1305_SHA256", "chacha", 32, "sha256", None),
                 ("AES_128_CBC_SHA", "cbc", 16, "sha256", "sha1"),
                 ("AES_256_CBC_SHA", "cbc", 32, "sha256", "sha1"),
                 ("AES_128_CBC_SHA256", "cbc", 16, "sha256", "sha256"),
                 ("AES_256_CBC_SHA384" if exchange.startswith("ECDHE") else "AES_256_CBC_SHA256", "cbc", 32,
                  "sha384" if exchange.startswith("ECDHE") else "sha256",
                  "sha384" if exchange.startswith("ECDHE") else "sha256"))
        for suite_id, (name, cipher, key_len, prf, mac) in zip(ids, kinds):
            if suite_id is not None:
                table[suite_id] = (f"TLS_{exchange}_WITH_{name}", False, cipher, key_len, prf, mac)
    return {suite_id: Suite(*row) for suite_id, row in table.items()}


SUITES = _suites()
_IV_LEN = {"gcm": 4, "chacha": 12, "cbc": 0}  # TLS 1.2's implicit IV; TLS 1.3's is always 12


def version_text(version: int) -> str:
    return {TLS12: "1.2", TLS13: "1.3", 0x0302: "1.1", 0x0301: "1.0"}.get(version, f"0x{version:04x}")


# ---------------------------------------------------------------------------------------------- key schedule

def prf12(hash_name: str, secret: bytes, label: bytes, seed: bytes, size: int) -> bytes:
    """TLS 1.2's PRF (RFC 5246 section 5): P_hash over label + seed."""
    seed = label + seed
    out, a = b"", seed
    while len(out) < size:
        a = hmac_digest(hash_name, secret, a)
        out += hmac_digest(hash_name, secret, a + seed)
    return out[:size]


def hkdf_expand_label(hash_name: str, secret: bytes, label: bytes, size: int) -> bytes:
    """TLS 1.3's HKDF-Expand-Label with an empty context (RFC 8446 section 7.1)."""
    full = b"tls13 " + label
    info = _LEN.pack(size) + bytes((len(full),)) + full + b"\x00"
    return HKDFExpand(HASHES[hash_name](), size, info).derive(secret)


def tls13_keys(suite: Suite, secret: bytes) -> RecordKeys:
    """One direction's record keys from its TLS 1.3 traffic secret (RFC 8446 section 7.3)."""
    return RecordKeys(suite, hkdf_expand_label(suite.hash, secret, b"key", suite.key_len),
                      hkdf_expand_label(suite.hash, secret, b"iv", 12))


def tls12_keys(suite: Suite, master: bytes, client_random: bytes, server_random: bytes,
               encrypt_then_mac: bool) -> tuple[RecordKeys, RecordKeys]:
    """The client's and the server's record keys, from the key block (RFC 5246 section 6.3)."""
    mac_len = MAC_LEN[suite.mac] if suite.mac else 0
    iv_len = _IV_LEN[suite.cipher]
    block = prf12(suite.hash, master, b"key expansion", server_random + client_random,
                  2 * (mac_len + suite.key_len + iv_len))
    sizes = (mac_len, mac_len, suite.key_len, suite.key_len, iv_len, iv_len)
    parts, at = [], 0
    for size in sizes:
        parts.append(block[at:at + size])
        at += size
    client_mac, server_mac, client_key, server_key, client_iv, server_iv = parts
    return (RecordKeys(suite, client_key, client_iv, client_mac, encrypt_then_mac),
            RecordKeys(suite, server_key, server_iv, server_mac, encrypt_then_mac))


# ---------------------------------------------------------------------------------------------- hellos

class Hello(NamedTuple):
    random: bytes
    suite_id: int | None  # the server's choice
    version: int | None  # the server's choice
    server_name: str | None
    encrypt_then_mac: bool


def parse_hello(body: bytes, server: bool) -> Hello:
    """A ClientHello's or ServerHello's body (after the handshake header). Raises ValueError if malformed."""
    try:
        version = _LEN.unpack_from(body, 0)[0]
        random = body[2:34]
        at = 35 + body[34]
        suite_id = None
        if server:
            suite_id = _LEN.unpack_from(body, at)[0]
            at += 3
        else:
            at += 2 + _LEN.unpack_from(body, at)[0]
            at += 1 + body[at]
        server_name, etm = None, False
        if at < len(body):
            end = at + 2 + _LEN.unpack_from(body, at)[0]
            at += 2
            while at + 4 <= end:
                ext, size = struct.unpack_from(">HH", body, at)
                data = body[at + 4:at + 4 + size]
                at += 4 + size
                if ext == EXT_SUPPORTED_VERSIONS and server and len(data) == 2:
                    version = _LEN.unpack(data)[0]
                elif ext == EXT_ENCRYPT_THEN_MAC:
                    etm = True
                elif ext == EXT_SERVER_NAME and not server and len(data) >= 5 and data[2] == 0:
                    server_name = data[5:5 + _LEN.unpack_from(data, 3)[0]].decode("ascii", "replace")
        if len(random) != 32 or at > len(body):
            raise ValueError("hello cut short")
    except (struct.error, IndexError) as e:
        raise ValueError("hello cut short") from e
    return Hello(random, suite_id, version, server_name, etm)


# ---------------------------------------------------------------------------------------------- records

class TlsConnection:
    """Both directions of one TLS connection. `data` returns (side, plaintext) pieces in stream order."""

    def __init__(self, keylog: KeyLog, from_start: tuple[bool, bool]):
        self.keylog = keylog
        self.sides = (Direction(from_start[0]), Direction(from_start[1]))
        self.from_start = from_start
        self.client_side: int | None = None
        self.client_hello: Hello | None = None
        self.server_hello: Hello | None = None
        self.suite: Suite | None = None
        self.version: int | None = None
        self.failure: str | None = None  # why the connection is not decrypted (any further)
        self.decrypting = False  # keys found
        self.guesses = 0
        self.guessed_random: bytes | None = None  # whose secrets opened a connection without its handshake
        self.out: list = []

    # -- what the connection is ---------------------------------------------------------------------------

    @property
    def info(self) -> dict:
        """What --json shows of the connection: {"version", "cipher"}."""
        return {"version": version_text(self.version) if self.version else None,
                "cipher": self.suite.name if self.suite else None}

    def description(self) -> str:
        """Version, cipher suite, SNI and client random, as far as the captured handshake tells."""
        hello = self.client_hello
        parts = [f"TLS {version_text(self.version)}" if self.version else "TLS",
                 self.suite.name if self.suite else
                 f"cipher suite 0x{self.server_hello.suite_id:04x}" if self.server_hello else "no ServerHello"]
        if hello is None:
            parts.append("handshake not captured")
        else:
            parts.append(f"SNI {hello.server_name}" if hello.server_name else "no SNI")
            parts.append(f"client random {hello.random.hex()}")
        return ", ".join(parts)

    # -- input ----------------------------------------------------------------------------------------------

    def data(self, side: int, data: bytes) -> list[tuple[int, bytes]]:
        direction = self.sides[side]
        direction.captured += len(data)
        if self.failure is not None:
            return []
        self._deliver(side, direction.feed(self, side, data))
        other = self.sides[1 - side]
        if other.waiting_for_keys and self.failure is None:
            self._deliver(1 - side, other.pump(self, 1 - side))  # this side may have told them (a hello)
        if self.failure is None and len(direction.buf) + len(other.buf) > MAX_HELD:
            self._fail(f"{self._no_key()} ({MAX_HELD >> 20} MiB of records held waiting for it)")
        return self._take()

    @property
    def waiting(self) -> bool:
        """Records are held, waiting for keys (or for more bytes)."""
        return self.failure is None and any(d.buf for d in self.sides)

    def poll(self) -> list[tuple[int, bytes]]:
        """Keys may have appeared in a followed key log: decrypt what waits for them."""
        if self.waiting:
            for side in (0, 1):
                if self.failure is None:
                    self._deliver(side, self.sides[side].pump(self, side))
        return self._take()

    def gap(self, side: int, size: int) -> None:
        """Bytes of a direction that were never captured: its records are found again after them."""
        direction = self.sides[side]
        if self.failure is not None:
            return
        if not direction.encrypted or direction.keys is None:
            self._fail(f"{size:,} bytes of the handshake or of records waiting for keys were not captured")
            return
        direction.buf = bytearray()
        direction.synced = False
        direction.seq_unknown += size // (HEADER + TAG) + 1

    def end(self) -> list[tuple[int, bytes]]:
        """The connection is over: a followed key log is read a last time for what waits, then the connection
        says why it was not decrypted, if it was not."""
        out = []
        if self.keylog.follow and self.waiting:
            self.keylog.refresh()
            out = self.poll()
        if self.failure is None and not self.decrypting:
            if self.client_hello is not None or not self.keylog:
                self._fail(self._no_key())
            elif any(d.captured for d in self.sides):
                self._fail("the handshake was not captured and no TLS 1.3 traffic secret of the key log opens "
                           "its records")
        return out

    def _no_key(self) -> str:
        return "no key for this client random" if self.keylog else \
            "no key log given (--tls-keylog FILE, or SSLKEYLOGFILE)"

    def _take(self) -> list[tuple[int, bytes]]:
        out, self.out = self.out, []
        return out

    def _fail(self, why: str) -> None:
        self.failure = why
        for direction in self.sides:
            direction.buf = bytearray()  # new buffers: the records being read may still be viewed

    # -- records: what the compiled loop (Direction, stream/tlsdirection.pyx) asks of the connection ------------

    def _deliver(self, side: int, plaintext: bytes | None) -> None:
        """Hand out the plaintext of a call, if it opened application data records (an empty piece too: a
        Session takes the time of every piece)."""
        if plaintext is not None:
            self.sides[side].delivered += len(plaintext)
            self.out.append((side, plaintext))

    def _record_in_clear(self, side: int, content_type: int, content: bytes) -> None:
        """A record that is not encrypted: the handshake until keys are in use, an alert, a ChangeCipherSpec."""
        if content_type == HANDSHAKE:
            self._handshake(side, content)
        elif content_type == ALERT and not self.decrypting:
            description = content[1] if len(content) >= 2 else None
            sender = "" if self.client_side is None else \
                " from the client" if side == self.client_side else " from the server"
            self._fail(f"the handshake ended with alert {description} "
                       f"({ALERTS.get(description, 'unknown')}){sender}")
        elif content_type == CHANGE_CIPHER_SPEC and self.version == TLS12:
            self.sides[side].encrypted = True  # TLS 1.2: this direction's next records are encrypted
            if not self.decrypting:
                self._keys_from_log()

    def _find_sequence(self, side: int, record: bytes) -> bool:
        """After bytes missing from the capture: the sequence number of this record, among those the lost
        records may have taken. False after failing the connection."""
        direction = self.sides[side]
        found = self._guess_sequence(direction.keys, record, direction.seq, direction.seq + direction.seq_unknown)
        if found is None:
            self._fail("after bytes missing from the capture, no record sequence number fits the keys")
            return False
        direction.seq, direction.seq_unknown = found, 0
        return True

    def _guess_sequence(self, keys: RecordKeys, record, first: int, last: int) -> int | None:
        for seq in range(first, min(last, first + MAX_SEQUENCE_GUESS) + 1):
            self.guesses += 1
            if self.guesses > MAX_GUESSES:
                return None
            if keys.authenticates(seq, record):
                return seq
        return None

    # -- handshake ------------------------------------------------------------------------------------------

    def _handshake(self, side: int, content: bytes) -> None:
        """Handshake messages, gathered across records; only hellos, Finished and KeyUpdate are read."""
        direction = self.sides[side]
        data = memoryview(content)
        while data:
            if direction.handshake_skip:
                n = min(direction.handshake_skip, len(data))
                direction.handshake_skip -= n
                data = data[n:]
                continue
            gathered = direction.handshake
            if len(gathered) < 4:
                take = 4 - len(gathered)
                gathered += data[:take]
                data = data[take:]
                if len(gathered) < 4:
                    return
                size = int.from_bytes(gathered[1:4], "big")
                if size > MAX_HANDSHAKE_MESSAGE or gathered[0] not in (CLIENT_HELLO, SERVER_HELLO, FINISHED,
                                                                       KEY_UPDATE):
                    direction.handshake_skip = size
                    gathered.clear()
                    continue
            size = int.from_bytes(gathered[1:4], "big")
            take = 4 + size - len(gathered)
            gathered += data[:take]
            data = data[take:]
            if len(gathered) == 4 + size:
                kind, body = gathered[0], bytes(gathered[4:])
                gathered.clear()
                self._handshake_message(side, kind, body)
                if self.failure is not None:
                    return

    def _handshake_message(self, side: int, kind: int, body: bytes) -> None:
        direction = self.sides[side]
        if kind == CLIENT_HELLO and not direction.encrypted:
            try:
                self.client_hello = parse_hello(body, server=False)
            except ValueError:
                self._fail("malformed ClientHello")
                return
            self.client_side = side
        elif kind == SERVER_HELLO and not direction.encrypted:
            try:
                hello = parse_hello(body, server=True)
            except ValueError:
                self._fail("malformed ServerHello")
                return
            self.server_hello = hello
            self.version = hello.version
            self.suite = SUITES.get(hello.suite_id)
            if self.client_side is None:
                self.client_side = 1 - side
            if hello.random == RETRY_RANDOM:
                return  # a HelloRetryRequest: the real ServerHello follows the client's second hello
            if self.suite is None or self.version not in (TLS12, TLS13) or self.suite.tls13 != (self.version == TLS13):
                self._fail("this cipher suite is not supported")
                return
            if self.version == TLS13:
                self.sides[side].encrypted = self.sides[1 - side].encrypted = True
                self._keys_from_log()
        elif kind == FINISHED and self.version == TLS13 and direction.secret is not None:
            # The handshake of this direction is over: its application traffic secret takes over.
            name = "client_traffic" if side == self.client_side else "server_traffic"
            secrets = self.keylog.get(self.client_hello.random, (name,))
            if name in secrets:
                self._set_tls13_keys(side, secrets[name])
            elif self.keylog.follow:
                direction.keys, direction.awaiting = None, name  # clients log it as the handshake ends
            else:
                self._fail(f"the key log has no {name.upper()}_SECRET_0 for this client random")
        elif kind == KEY_UPDATE and self.version == TLS13 and direction.secret is not None:
            self._set_tls13_keys(side, hkdf_expand_label(self.suite.hash, direction.secret, b"traffic upd",
                                                         MAC_LEN[self.suite.hash]))

    def _set_tls13_keys(self, side: int, secret: bytes) -> None:
        direction = self.sides[side]
        direction.secret = secret
        direction.keys = tls13_keys(self.suite, secret)
        direction.seq = 0

    # -- keys -----------------------------------------------------------------------------------------------

    def _keys_from_log(self) -> bool:
        """Set both directions' keys from the key log, once both hellos are in. False while they are missing
        (a followed key log may get them later; else the connection fails)."""
        if self.client_hello is None:
            return False
        suite = self.suite
        needed = ("client_handshake", "server_handshake") if suite.tls13 else ("master",)
        secrets = self.keylog.get(self.client_hello.random, needed)
        if any(name not in secrets for name in needed):
            if not self.keylog.follow:
                self._fail(self._no_key())
            return False
        client = self.client_side
        if suite.tls13:
            self._set_tls13_keys(client, secrets["client_handshake"])
            self._set_tls13_keys(1 - client, secrets["server_handshake"])
        else:
            keys = tls12_keys(suite, secrets["master"], self.client_hello.random, self.server_hello.random,
                              self.server_hello.encrypt_then_mac)
            self.sides[client].keys, self.sides[1 - client].keys = keys
        self.decrypting = True
        return True

    def _find_keys(self, side: int, record: bytes) -> None:
        """Set this side's keys for an encrypted record of it, if they can be had yet: from the key log by the
        hellos, or, the handshake not captured, a TLS 1.3 traffic secret that authenticates the record at
        some sequence number."""
        direction = self.sides[side]
        if direction.awaiting is not None:
            secret = self.keylog.get(self.client_hello.random, (direction.awaiting,)).get(direction.awaiting)
            if secret is not None:
                self._set_tls13_keys(side, secret)
                direction.awaiting = None
        elif self.server_hello is not None:
            self._keys_from_log()
        elif self.client_hello is None:  # with a ClientHello, the ServerHello comes first
            self._guess_keys(side, record)

    def _guess_keys(self, side: int, record: bytes) -> None:
        """The handshake was not captured: a TLS 1.3 traffic secret of the key log that opens this record at
        some sequence number (small numbers first: a capture usually starts early in a connection)."""
        name = "client_traffic" if side == self.client_side else "server_traffic"
        if self.guessed_random is not None:  # the other direction's secret was found: this one is its pair
            secret = self.keylog.secrets[self.guessed_random].get(name)
            candidates = [(self.guessed_random, name, secret, self.suite)] if secret else []
        else:
            names = (name,) if self.client_side is not None else ("client_traffic", "server_traffic")
            candidates = [(random, n, secrets[n], suite) for random, secrets in list(self.keylog.secrets.items())
                          for n in names if n in secrets for suite in _tls13_suites_for(secrets[n])]
        keys = [(random, n, secret, tls13_keys(suite, secret)) for random, n, secret, suite in candidates]
        for first, last in _SEQUENCE_ROUNDS:
            for random, n, secret, found in keys:
                seq = self._guess_sequence(found, record, first, last - 1)
                if seq is not None:
                    self.suite, self.version, self.guessed_random = found.suite, TLS13, random
                    direction = self.sides[side]
                    direction.keys, direction.secret, direction.seq, direction.encrypted = found, secret, seq, True
                    if self.client_side is None:
                        self.client_side = side if n == "client_traffic" else 1 - side
                    self.decrypting = True
                    return
                if self.guesses > MAX_GUESSES:
                    break
        if not self.keylog.follow or self.guesses > MAX_GUESSES:
            self._fail(self._no_key() if not self.keylog else "the handshake was not captured and no TLS 1.3 "
                       "traffic secret of the key log opens its records")


def _tls13_suites_for(secret: bytes) -> tuple[Suite, ...]:
    """The TLS 1.3 suites a traffic secret may belong to: its length is its suite's hash length."""
    return (SUITES[0x1302],) if len(secret) == 48 else (SUITES[0x1301], SUITES[0x1303])
