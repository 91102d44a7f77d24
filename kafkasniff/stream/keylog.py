"""TLS secrets by client random, from NSS key log text: `--tls-keylog` files (read again as clients append to
them), `SSLKEYLOGFILE`, and the Decryption Secrets Blocks of pcapng captures.

A key log line is `LABEL <client random, 64 hex digits> <secret in hex>`; `#` starts a comment. TLS 1.2
sessions log `CLIENT_RANDOM` (the master secret), TLS 1.3 sessions their traffic secrets (see LABELS).
"""

from __future__ import annotations

import os

# The labels we use, by the name the TLS layer asks for. Others (EXPORTER_SECRET, early secrets) are skipped.
LABELS = {
    b"CLIENT_RANDOM": "master",
    b"CLIENT_HANDSHAKE_TRAFFIC_SECRET": "client_handshake",
    b"SERVER_HANDSHAKE_TRAFFIC_SECRET": "server_handshake",
    b"CLIENT_TRAFFIC_SECRET_0": "client_traffic",
    b"SERVER_TRAFFIC_SECRET_0": "server_traffic",
}
# Labels of key log lines that decrypt nothing here (exporters, 0-RTT, RSA premaster secrets): not damage.
UNUSED_LABELS = frozenset((b"EXPORTER_SECRET", b"EARLY_EXPORTER_SECRET", b"CLIENT_EARLY_TRAFFIC_SECRET", b"RSA"))
MAX_LINE = 512  # the longest line a key log holds is about 170 characters; longer ones are not key log lines


class KeyLogError(Exception):
    pass


class KeyLog:
    """Secrets by client random: {client random: {"master" | "client_traffic" | ...: secret}}."""

    def __init__(self, paths: list[str] = (), *, follow: bool = False):
        """follow: the files may grow (sniff): read what was appended when keys are looked for and missing.
        Without it, a file that cannot be read is an error."""
        self.secrets: dict[bytes, dict[str, bytes]] = {}
        self.follow = follow and bool(paths)
        self._files = {path: [0, b""] for path in paths}  # path: [bytes read, unfinished last line]
        self.bad_lines = 0
        for path in paths:
            self._read(path, must_exist=not follow)

    def __bool__(self) -> bool:
        return bool(self.secrets) or bool(self._files)

    def add_text(self, text: bytes) -> int:
        """Add the key log lines of text (whole lines); returns how many secrets were new."""
        new = 0
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith(b"#"):
                continue
            parts = line.split()
            name = LABELS.get(parts[0]) if len(parts) == 3 and len(line) <= MAX_LINE else None
            try:
                client_random, secret = bytes.fromhex(parts[1].decode()), bytes.fromhex(parts[2].decode())
            except (ValueError, IndexError, UnicodeDecodeError):
                name = None
            if name is None:
                if parts[0] not in UNUSED_LABELS:
                    self.bad_lines += 1
                continue
            if len(client_random) != 32 or not secret:
                self.bad_lines += 1
                continue
            known = self.secrets.setdefault(client_random, {})
            if known.get(name) != secret:
                known[name] = secret
                new += 1
        return new

    def get(self, client_random: bytes, needed: tuple[str, ...] = ()) -> dict[str, bytes]:
        """The secrets of a client random ({} if none). Followed files are read again (now and then) while
        any of `needed` is missing: clients log a connection's secrets as its handshake goes on."""
        found = self.secrets.get(client_random, {})
        if self.follow and (not found or any(name not in found for name in needed)) and self.refresh():
            found = self.secrets.get(client_random, {})
        return found

    def refresh(self) -> bool:
        """Read what the followed files gained since last time (a stat each when they did not change).
        True if new secrets came."""
        new = False
        for path, (position, _) in self._files.items():
            try:
                size = os.stat(path).st_size
            except OSError:
                continue
            if size != position:
                new = self._read(path, must_exist=False) > 0 or new
        return new

    def _read(self, path: str, must_exist: bool) -> int:
        state = self._files[path]
        try:
            with open(path, "rb") as f:
                if os.fstat(f.fileno()).st_size < state[0]:
                    state[0], state[1] = 0, b""  # the file was truncated or replaced: read it anew
                f.seek(state[0])
                text = f.read()
        except OSError as e:
            if must_exist:
                raise KeyLogError(f"cannot read the TLS key log {path}: {e.strerror or e}") from None
            return 0
        state[0] += len(text)
        text = state[1] + text
        whole, _, rest = text.rpartition(b"\n")
        # An unfinished last line waits for the rest, unless it is too long to be a key log line.
        state[1] = rest if len(rest) <= MAX_LINE else b""
        return self.add_text(whole)


def keylog_paths(options: tuple[str, ...]) -> list[str]:
    """The key logs to read: the --tls-keylog files, else the file SSLKEYLOGFILE names."""
    if options:
        return list(options)
    env = os.environ.get("SSLKEYLOGFILE")
    return [env] if env else []
