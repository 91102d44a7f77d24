# cython: language_level=3
"""One direction of a TLS connection: its record keys, and the loop that opens its records (the hot part of
stream/tls.py, which keeps the handshake, the key schedule and every decision that is not per record).

Per record the loop only reads the header, builds the nonce and the additional data in place and has the
`cryptography` package's AEAD decrypt straight into the plaintext that goes out: one bytes object per call,
no Python object per record but the two views `decrypt_into` is handed. Records that need a decision (keys
not known yet, records in the clear, handshake messages, a sequence number lost with missing bytes, failure)
are given to the connection's methods. Record lengths are trusted only after the header's checks and only
within the bytes that arrived.
"""

from cpython.buffer cimport PyBUF_READ, PyBUF_SIMPLE, PyBUF_WRITE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, _PyBytes_Resize
from cpython.memoryview cimport PyMemoryView_FromMemory
from cpython.object cimport PyObject
from cpython.ref cimport Py_XDECREF
from libc.string cimport memcpy

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, hmac
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

from kafkasniff.stream import tlsrecord

cdef extern from "Python.h":
    # The bytes being filled are this module's own until returned: written through a pointer, then cut.
    PyObject* PyBytes_FromStringAndSize_new "PyBytes_FromStringAndSize"(const char* v, Py_ssize_t size) except NULL

HASHES = {"sha1": hashes.SHA1, "sha256": hashes.SHA256, "sha384": hashes.SHA384}
MAC_LEN = {"sha1": 20, "sha256": 32, "sha384": 48}
TAG = 16

cdef int HEADER = tlsrecord.HEADER
cdef int MAX_RECORD = tlsrecord.MAX_RECORD
cdef int CHANGE_CIPHER_SPEC = tlsrecord.CHANGE_CIPHER_SPEC
cdef int HANDSHAKE = tlsrecord.HANDSHAKE
cdef int APPLICATION_DATA = tlsrecord.APPLICATION_DATA

# How a suite makes each record's nonce and additional data (RFC 8446 5.2-5.3, RFC 5288 3, RFC 7905 2).
cdef enum Protection:
    TLS13_AEAD      # nonce: the IV XOR the sequence number; additional data: the record header
    TLS12_CHACHA    # nonce as TLS 1.3's; additional data: sequence number, type, version, plaintext length
    TLS12_GCM       # nonce: 4-byte salt + the record's first 8 bytes; additional data as ChaCha's
    TLS12_CBC       # AES-CBC and HMAC, in either order: opened by Python-level code (rarely chosen)

cdef enum:
    FAILED = -1  # the loop's position when the connection failed


def hmac_digest(hash_name: str, key: bytes, data: bytes) -> bytes:
    h = hmac.HMAC(key, HASHES[hash_name]())
    h.update(data)
    return h.finalize()


cdef class RecordKeys:
    """One direction's keys: opens its records, into memory the caller gives, or says they do not
    authenticate."""

    cdef readonly object suite
    cdef readonly bint tls13
    cdef int protection
    cdef unsigned char iv[12]
    cdef object key, mac_key
    cdef bint encrypt_then_mac
    cdef object decrypt_into
    cdef bytearray nonce, additional  # written in place for each record

    def __init__(self, suite, bytes key, bytes iv, bytes mac_key=b"", bint encrypt_then_mac=False):
        self.suite = suite
        self.tls13 = suite.tls13
        self.key, self.mac_key, self.encrypt_then_mac = key, mac_key, encrypt_then_mac
        if len(iv) > 12:
            raise ValueError("an IV of more than 12 bytes")
        memcpy(self.iv, <const char*>iv, len(iv))
        self.nonce = bytearray(12)
        self.additional = bytearray(HEADER if suite.tls13 else 8 + 3 + 2)
        if suite.cipher == "gcm":
            self.decrypt_into = AESGCM(key).decrypt_into
            self.protection = TLS13_AEAD if suite.tls13 else TLS12_GCM
        elif suite.cipher == "chacha":
            self.decrypt_into = ChaCha20Poly1305(key).decrypt_into
            self.protection = TLS13_AEAD if suite.tls13 else TLS12_CHACHA
        else:
            self.protection = TLS12_CBC

    def authenticates(self, unsigned long long seq, const unsigned char[::1] record not None) -> bool:
        """Whether a whole record (header included) opens with these keys at this sequence number."""
        cdef Py_ssize_t length = record.shape[0]
        if length <= HEADER:
            return False
        scratch = PyBytes_FromStringAndSize(NULL, length)
        return self.open_into(seq, &record[0], length, <unsigned char*>PyBytes_AS_STRING(scratch)) >= 0

    cdef Py_ssize_t open_into(self, unsigned long long seq, const unsigned char* record, Py_ssize_t length,
                              unsigned char* out) except -2:
        """Decrypt a whole record of `length` bytes (header included, more than HEADER) into out, which
        has room for length - HEADER bytes: the plaintext's length, or -1 if the record does not
        authenticate. TLS 1.3: the inner plaintext, content type and padding included."""
        cdef Py_ssize_t body = length - HEADER, sealed_at = HEADER, size
        cdef unsigned char* nonce = <unsigned char*>PyByteArray_AS_STRING(self.nonce)
        cdef unsigned char* additional = <unsigned char*>PyByteArray_AS_STRING(self.additional)
        cdef int i
        if self.protection == TLS12_CBC:
            return self._open_cbc_into(seq, record, length, out)
        if self.protection == TLS12_GCM:
            if body < 8 + TAG:
                return -1
            memcpy(nonce, self.iv, 4)
            memcpy(nonce + 4, record + HEADER, 8)
            sealed_at += 8
        else:
            if body < TAG:
                return -1
            memcpy(nonce, self.iv, 12)
            for i in range(8):
                nonce[4 + i] ^= <unsigned char>(seq >> (56 - 8 * i))
        size = length - sealed_at - TAG
        if self.protection == TLS13_AEAD:
            memcpy(additional, record, HEADER)
        else:
            for i in range(8):
                additional[i] = <unsigned char>(seq >> (56 - 8 * i))
            memcpy(additional + 8, record, 3)
            additional[11] = <unsigned char>(size >> 8)
            additional[12] = <unsigned char>size
        try:
            self.decrypt_into(self.nonce, PyMemoryView_FromMemory(<char*>record + sealed_at, length - sealed_at,
                                                                  PyBUF_READ),
                              self.additional, PyMemoryView_FromMemory(<char*>out, size, PyBUF_WRITE))
        except InvalidTag:
            return -1
        return size

    cdef Py_ssize_t _open_cbc_into(self, unsigned long long seq, const unsigned char* record, Py_ssize_t length,
                                   unsigned char* out) except -2:
        cdef bytes plaintext = self._open_cbc(seq, PyBytes_FromStringAndSize(<const char*>record, 3),
                                   PyBytes_FromStringAndSize(<const char*>record + HEADER, length - HEADER))
        if plaintext is None:
            return -1
        memcpy(out, <const char*>plaintext, len(plaintext))  # shorter than the body it came from
        return len(plaintext)

    def _open_cbc(self, unsigned long long seq, bytes head, bytes body):
        mac_name = self.suite.mac
        mac_len = MAC_LEN[mac_name]
        mac_input = seq.to_bytes(8, "big") + head
        if self.encrypt_then_mac:
            sealed, mac = body[:-mac_len], body[-mac_len:]
            if len(sealed) < 32 or len(sealed) % 16 or \
                    hmac_digest(mac_name, self.mac_key, mac_input + len(sealed).to_bytes(2, "big") + sealed) != mac:
                return None
            return _unpad(self._cbc(sealed))
        if len(body) < 16 + max(16, mac_len + 1) or len(body) % 16:
            return None
        unpadded = _unpad(self._cbc(body))
        if unpadded is None or len(unpadded) < mac_len:
            return None
        content, mac = unpadded[:-mac_len], unpadded[-mac_len:]
        if hmac_digest(mac_name, self.mac_key, mac_input + len(content).to_bytes(2, "big") + content) != mac:
            return None
        return content

    def _cbc(self, bytes sealed):
        """Decrypt an explicit IV and its ciphertext."""
        decryptor = Cipher(algorithms.AES(self.key), modes.CBC(sealed[:16])).decryptor()
        return decryptor.update(sealed[16:]) + decryptor.finalize()


def _unpad(bytes data):
    if not data:
        return None
    pad = data[-1]
    if pad + 1 > len(data) or data[-pad - 1:] != bytes((pad,)) * (pad + 1):
        return None
    return data[:-pad - 1]


cdef class Direction:
    """One direction's record stream. `feed` takes its bytes as they come and returns the plaintext of the
    application data they complete; `pump` opens what was held (records waiting for keys). The connection
    (stream/tls.py's TlsConnection) decides everything that is not the opening of a record: see `_records`."""

    cdef public bytearray buf  # bytes held: a record cut by the end of what came, records waiting for keys, or
    # (not synced) the bytes in which a record boundary is looked for
    cdef public bint synced  # record boundary known
    cdef public bint waiting_for_keys  # what buf holds waits for keys (the other direction or the key log)
    cdef public RecordKeys keys
    cdef public unsigned long long seq
    cdef public bint encrypted
    cdef public object secret  # TLS 1.3: the traffic secret the keys come from
    cdef public object awaiting  # TLS 1.3: the traffic secret to come from a followed key log
    cdef public bytearray handshake  # a handshake message being gathered
    cdef public long long handshake_skip  # bytes of a large handshake message still to pass over unread
    cdef public long long seq_unknown  # after missing bytes: how many records may have been lost (0: seq known)
    cdef public long long delivered  # plaintext bytes handed out
    cdef public long long captured  # bytes that came in
    cdef bint opened_data  # an application data record was opened by this call (its content may be empty)

    def __init__(self, bint from_start):
        self.buf = bytearray()
        self.synced = from_start
        self.handshake = bytearray()

    cpdef object feed(self, connection, int side, bytes data):
        """The direction's next bytes (`captured` already counts them): the plaintext of the application data
        records they complete, None if they complete none or if the connection failed. Records are opened where
        they lie in data; only what is left after its last whole record is copied, into buf. A record buf holds
        the start of is completed from data first."""
        cdef Py_ssize_t size = len(data), taken = 0, written = 0, pos
        cdef PyObject* out = NULL
        self.opened_data = False
        try:
            out = PyBytes_FromStringAndSize_new(NULL, len(self.buf) + size)
            if self.buf or not self.synced:
                if self.synced and not self.waiting_for_keys:
                    taken = self._complete_record(data)
                else:
                    _append(self.buf, data, 0, size)
                    taken = size
                if not self._open_held(connection, side, self.captured - (size - taken), out, &written):
                    return None
                if connection.failure is not None or taken == size:
                    return self._plaintext(&out, written)
                if self.buf:  # waiting for keys: what follows waits too
                    _append(self.buf, data, taken, size)
                    return self._plaintext(&out, written)
            pos = self._records(connection, side, <const unsigned char*>PyBytes_AS_STRING(data), taken, size,
                                self.captured, <unsigned char*>PyBytes_AS_STRING(<object>out), &written)
            if pos == FAILED:
                return None
            if pos < size and connection.failure is None:
                _append(self.buf, data, pos, size)
            return self._plaintext(&out, written)
        finally:
            Py_XDECREF(out)

    cpdef object pump(self, connection, int side):
        """Open the whole records buf holds (keys may have come): their plaintext, as `feed`."""
        cdef Py_ssize_t written = 0
        cdef PyObject* out = NULL
        self.opened_data = False
        try:
            out = PyBytes_FromStringAndSize_new(NULL, len(self.buf))
            if not self._open_held(connection, side, self.captured, out, &written):
                return None
            return self._plaintext(&out, written)
        finally:
            Py_XDECREF(out)

    cdef object _plaintext(self, PyObject** out, Py_ssize_t size):
        """What a call returns: None if it opened no application data record, else the bytes *out cut to their
        first `size` (in place: nothing else refers to them; *out stays the caller's to release)."""
        if not self.opened_data:
            return None
        if size == 0:
            return b""
        _PyBytes_Resize(out, size)  # on failure it frees them, sets NULL and raises
        return <bytes><object>out[0]

    cdef Py_ssize_t _complete_record(self, bytes data) except -1:
        """Move from data to buf the bytes that complete the record buf starts: its header, then its body
        (none if it is whole: buf holds no more than one record cut short, but nothing here relies on it).
        Returns how many were moved. A header that fails the checks takes all of data (the loop reports it)."""
        cdef Py_ssize_t held = len(self.buf), size = len(data), taken = 0, length
        cdef const unsigned char* head
        if held < HEADER:
            taken = min(HEADER - held, size)
            _append(self.buf, data, 0, taken)
            if held + taken < HEADER:
                return taken
        head = <const unsigned char*>PyByteArray_AS_STRING(self.buf)
        length = (head[3] << 8) | head[4]
        if not _plausible_header(head, length):
            _append(self.buf, data, taken, size)
            return size
        length = max(0, min(HEADER + length - len(self.buf), size - taken))
        _append(self.buf, data, taken, taken + length)
        return taken + length

    cdef bint _open_held(self, connection, int side, long long end_offset, PyObject* out,
                         Py_ssize_t* written) except -1:
        """Open the whole records of buf (whose last byte is end_offset's), synchronising first when the record
        boundary is not known; keep the rest. False if the connection failed."""
        cdef Py_buffer view
        cdef Py_ssize_t pos
        buf = self.buf
        if not self.synced:
            boundary = tlsrecord.record_boundary(buf)
            if boundary is None:
                if len(buf) > 2 * (MAX_RECORD + HEADER):
                    connection._fail("no TLS record boundary found")
                    return False
                return True
            del buf[:boundary]
            self.synced = True
        # Held while the loop reads it: a callback that tried to resize buf would raise, not move it under us.
        PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
        try:
            pos = self._records(connection, side, <const unsigned char*>view.buf, 0, view.len, end_offset,
                                <unsigned char*>PyBytes_AS_STRING(<object>out), written)
        finally:
            PyBuffer_Release(&view)
        if pos == FAILED:
            return False
        if self.buf is buf:  # not replaced by a failure
            del buf[:pos]
        return True

    cdef Py_ssize_t _records(self, connection, int side, const unsigned char* p, Py_ssize_t pos, Py_ssize_t end,
                             long long end_offset, unsigned char* out, Py_ssize_t* written) except -2:
        """Open the whole records of p[pos:end] in order, application data into out + written (out has room
        for every byte of p[pos:end]); stop at a record cut by end, or one waiting for keys. Returns where it
        stopped, or FAILED: the connection failed on a record, and the plaintext of this call is dropped. (A
        connection that fails on finding its keys stops it too, but keeps what was opened before.)
        end_offset: the stream offset of p[end], for the notice of a bad header."""
        cdef int content_type
        cdef Py_ssize_t length, stop, opened
        cdef RecordKeys keys
        self.waiting_for_keys = False
        while end - pos >= HEADER:
            content_type = p[pos]
            length = (p[pos + 3] << 8) | p[pos + 4]
            if not _plausible_header(p + pos, length):
                connection._fail(f"not a TLS record header at stream offset {end_offset - end + pos:,}")
                return FAILED
            stop = pos + HEADER + length
            if stop > end:
                break
            if content_type == APPLICATION_DATA or (self.encrypted and content_type != CHANGE_CIPHER_SPEC):
                if self.keys is None:
                    connection._find_keys(side, p[pos:stop])
                    if self.keys is None:  # they may come later (or the connection failed)
                        self.waiting_for_keys = connection.failure is None
                        break
                if self.seq_unknown and not connection._find_sequence(side, p[pos:stop]):
                    return FAILED
                keys = self.keys
                opened = keys.open_into(self.seq, p + pos, stop - pos, out + written[0])
                if opened < 0:
                    connection._fail("keys do not authenticate the records")
                    return FAILED
                self.seq += 1
                if keys.tls13:  # the inner plaintext: content, its type, then zero padding (rarely any)
                    opened -= 1
                    while opened >= 0 and not out[written[0] + opened]:
                        opened -= 1
                    if opened < 0:
                        connection._fail("a TLS 1.3 record without a content type")
                        return FAILED
                    content_type = out[written[0] + opened]
                if content_type == APPLICATION_DATA:
                    written[0] += opened
                    self.opened_data = True
                elif content_type == HANDSHAKE:
                    connection._handshake(side, PyBytes_FromStringAndSize(<const char*>out + written[0], opened))
            else:
                connection._record_in_clear(side, content_type, p[pos + HEADER:stop])
            if connection.failure is not None:
                return FAILED
            pos = stop
        return pos


cdef int _append(bytearray buf, bytes data, Py_ssize_t start, Py_ssize_t stop) except -1:
    """buf += data[start:stop], without the slice's copy. (Raises rather than resize a buffer being read.)"""
    cdef Py_ssize_t held = len(buf)
    if not 0 <= start <= stop <= len(data):
        raise IndexError(f"bytes {start}:{stop} of {len(data)}")
    PyByteArray_Resize(buf, held + stop - start)
    memcpy(PyByteArray_AS_STRING(buf) + held, PyBytes_AS_STRING(data) + start, stop - start)
    return 0


cdef inline bint _plausible_header(const unsigned char* head, Py_ssize_t length):
    return (CHANGE_CIPHER_SPEC <= head[0] <= APPLICATION_DATA and head[1] == 3 and head[2] <= 4
            and 0 < length <= MAX_RECORD)

