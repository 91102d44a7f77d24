"""SASL tokens: PLAIN credentials and SCRAM messages, with secrets marked.

Tokens travel either raw (size-prefixed, after SaslHandshake v0) or inside
SaslAuthenticate's AuthBytes (the walker asks a TokenReader). Parsed parts become
child Fields of the token; passwords and SCRAM proofs get the type `secret`, which
every renderer masks unless the user asks for secrets.
"""

from __future__ import annotations

from kafkasniff.protocol.fields import Field

SECRET = "secret"
TOKEN = "sasl_token"
_SCRAM_NAMES = {"n": "username", "r": "nonce", "s": "salt", "i": "iterations", "c": "channel_binding",
                "p": "proof", "v": "server_signature", "e": "error", "a": "authorization_id"}
_SCRAM_SECRETS = {"p"}


def _plain(token: bytes, base: int) -> list[Field] | None:
    parts = token.split(b"\x00")
    if len(parts) != 3:
        return None
    names = ("authorization_id", "username", "password")
    out, pos = [], base
    for name, part in zip(names, parts):
        out.append(Field(name, SECRET if name == "password" else "string", pos, len(part),
                         part.decode("utf-8", "replace")))
        pos += len(part) + 1
    return out


def _scram(token: bytes, base: int) -> list[Field] | None:
    try:
        text = token.decode("ascii")
    except UnicodeDecodeError:
        return None
    out, pos = [], base
    for i, item in enumerate(text.split(",")):
        if i < 2 and text.startswith(("n,", "y,", "p=")) and "=" not in item[:2]:
            pos += len(item) + 1  # gs2 header ("n,," or "y,,"): not an attribute
            continue
        key, eq, value = item.partition("=")
        if not eq or len(key) != 1:
            return None
        name = _SCRAM_NAMES.get(key, key)
        start = pos + 2
        out.append(Field(name, SECRET if key in _SCRAM_SECRETS else "string", start, len(value), value))
        pos += len(item) + 1
    return out or None


def parse_token(mechanism: str | None, token: bytes, from_client: bool, base: int = 0) -> list[Field] | None:
    """Fields of a SASL token, offsets from `base`; None when the mechanism's format does not fit."""
    mech = (mechanism or "").upper()
    if mech == "PLAIN" or (not mech and from_client and token.count(b"\x00") == 2):
        return _plain(token, base) if from_client else None
    if mech.startswith("SCRAM") or (not mech and token[:2] in (b"n,", b"c=", b"r=", b"v=")):
        return _scram(token, base)
    return None


class TokenReader:
    """Reads the SASL token in SaslAuthenticate's AuthBytes for the walker: `auth_fields` for the Field tree,
    `auth_json` for JSON (secrets shown as `mask` unless `show_secrets`)."""

    def __init__(self, mechanism: str | None, from_client: bool, mask: str, show_secrets: bool = False):
        self.mechanism = mechanism
        self.from_client = from_client
        self.mask = mask
        self.show_secrets = show_secrets

    def auth_fields(self, token: bytes, base: int) -> list[Field] | None:
        return parse_token(self.mechanism, token, self.from_client, base)

    def auth_json(self, token: bytes) -> bytes | None:
        import orjson

        parts = parse_token(self.mechanism, token, self.from_client)
        if not parts:
            return None
        return orjson.dumps({f.name: f.value if self.show_secrets or f.type != SECRET else self.mask for f in parts})
