# cython: language_level=3, boundscheck=False, wraparound=False
"""TLS record headers: whether a connection's first bytes are TLS, and where its records start. Apart from
tls.py so that telling TLS from plaintext does not import the cryptography it needs to decrypt.

Compiled: a connection captured from its middle has its first bytes searched for a record boundary, byte by byte
over up to a record's length, whether it turns out TLS or not (a capture started on a busy broker: every
connection)."""

CHANGE_CIPHER_SPEC, ALERT, HANDSHAKE, APPLICATION_DATA = 20, 21, 22, 23
MAX_RECORD = (1 << 14) + 2048  # the largest record TLS allows (ciphertext, TLS 1.2)
HEADER = 5
cdef Py_ssize_t _MAX_RECORD = MAX_RECORD, _HEADER = HEADER


cdef inline Py_ssize_t _length(const unsigned char[::1] buf, Py_ssize_t pos):
    """The length of the TLS record whose header is at buf[pos], or -1 if no header is there."""
    cdef Py_ssize_t length
    if buf.shape[0] - pos < _HEADER or not CHANGE_CIPHER_SPEC <= buf[pos] <= APPLICATION_DATA or buf[pos + 1] != 3 \
            or buf[pos + 2] > 4:
        return -1
    length = (<Py_ssize_t>buf[pos + 3] << 8) | buf[pos + 4]
    return length if 0 < length <= _MAX_RECORD else -1


def record_length(const unsigned char[::1] buf, Py_ssize_t pos) -> int | None:
    """The length of the TLS record whose header is at buf[pos], or None if no header is there."""
    cdef Py_ssize_t length = _length(buf, pos)
    return None if length < 0 else length


def is_handshake_start(const unsigned char[::1] buf) -> bool:
    """A TLS handshake record header: how a TLS connection captured from its start begins."""
    return buf.shape[0] >= 3 and buf[0] == HANDSHAKE and buf[1] == 3 and buf[2] <= 4


def record_boundary(const unsigned char[::1] buf, Py_ssize_t limit=MAX_RECORD + HEADER) -> int | None:
    """Where the first record header of buf is: a header whose record ends where the bytes or the next
    record's header do (a header alone fits too many places of other bytes). Looks at the first `limit`
    positions."""
    cdef Py_ssize_t pos, length, after, n = buf.shape[0]
    for pos in range(min(n - _HEADER + 1, limit)):
        length = _length(buf, pos)
        if length < 0:
            continue
        after = pos + _HEADER + length
        if after == n or _length(buf, after) >= 0:
            return pos
    return None


def starts_tls(const unsigned char[::1] buf, bint from_start) -> bool:
    """Whether a direction's first captured bytes are TLS: a handshake record when the connection is captured
    from its start; else any record whose successor's header is where it ends, as far as the bytes show."""
    cdef Py_ssize_t length, after
    if from_start:
        return is_handshake_start(buf)
    length = _length(buf, 0)
    if length < 0:
        return False
    after = _HEADER + length
    return buf.shape[0] - after < _HEADER or _length(buf, after) >= 0
