"""TLS record headers: whether a connection's first bytes are TLS, and where its records start. Apart from
tls.py so that telling TLS from plaintext does not import the cryptography it needs to decrypt."""

CHANGE_CIPHER_SPEC, ALERT, HANDSHAKE, APPLICATION_DATA = 20, 21, 22, 23
MAX_RECORD = (1 << 14) + 2048  # the largest record TLS allows (ciphertext, TLS 1.2)
HEADER = 5


def record_length(buf, pos: int) -> int | None:
    """The length of the TLS record whose header is at buf[pos], or None if no header is there."""
    if len(buf) - pos < HEADER or not CHANGE_CIPHER_SPEC <= buf[pos] <= APPLICATION_DATA or buf[pos + 1] != 3 \
            or buf[pos + 2] > 4:
        return None
    length = (buf[pos + 3] << 8) | buf[pos + 4]
    return length if 0 < length <= MAX_RECORD else None


def is_handshake_start(buf) -> bool:
    """A TLS handshake record header: how a TLS connection captured from its start begins."""
    return len(buf) >= 3 and buf[0] == HANDSHAKE and buf[1] == 3 and buf[2] <= 4


def record_boundary(buf, limit: int = MAX_RECORD + HEADER) -> int | None:
    """Where the first record header of buf is: a header whose record ends where the bytes or the next
    record's header do (a header alone fits too many places of other bytes). Looks at the first `limit`
    positions."""
    for pos in range(min(len(buf) - HEADER + 1, limit)):
        length = record_length(buf, pos)
        if length is None:
            continue
        after = pos + HEADER + length
        if after == len(buf) or record_length(buf, after) is not None:
            return pos
    return None


def starts_tls(buf, from_start: bool) -> bool:
    """Whether a direction's first captured bytes are TLS: a handshake record when the connection is captured
    from its start; else any record whose successor's header is where it ends, as far as the bytes show."""
    if from_start:
        return is_handshake_start(buf)
    length = record_length(buf, 0)
    if length is None:
        return False
    after = HEADER + length
    return len(buf) - after < HEADER or record_length(buf, after) is not None
