/* The `records` bytes of Produce and Fetch: record batches (magic 2) and legacy message sets (magic 0/1).
 *
 * Both formats put the magic byte at offset 16 of an item, after an int64 offset and an int32 length. Items
 * are reported to a RecordSink (walk.h) in wire order. Records inside a compressed batch or wrapper message
 * are read from the decompressed bytes, which Python's codecs produce (compression.py, bounded by a limit per
 * batch and a budget per message); their positions then count within those bytes (a detached Span).
 *
 * Nothing stops the reading: a broken item is reported as malformed and reading goes on wherever a length
 * field says the next item starts. A run of consecutive broken items (or records) is one malformed report,
 * so bytes that are not records cost one report, not one per byte.
 */
#include "walk.h"

const char *const DECOMPRESSED_NOTE = "offsets within decompressed bytes";

#define BATCH_HEADER 61
#define BATCH_CRC_FROM 21   /* CRC-32C covers a batch from its attributes to the end */
#define MESSAGE_CRC_FROM 16 /* CRC-32 covers a legacy message from its magic to the end */
#define MiB (1024 * 1024)

static const char *const codec_names[] = {"none", "gzip", "snappy", "lz4", "zstd"};

const char *codec_text(int codec) { return codec >= 0 && codec < 5 ? codec_names[codec] : NULL; }

static int64_t be(const uint8_t *p, int size) {
    uint64_t v = 0;
    for (int i = 0; i < size; i++)
        v = v << 8 | p[i];
    return (int64_t)v;
}

typedef struct {
    Walker *w;
    const RecordSink *sink;
    void *state;
    int full;            /* read every record; else only what batch and message headers say */
    int64_t batch_limit; /* decompressed bytes one batch may produce */
    int64_t message_limit;
    struct {             /* for the messages inside a wrapper: what the wrapper says of them */
        int made_absolute, has_log_append_time;
        int64_t shift, log_append_time;
    } inner;
} Reader;

/* A run of malformed items or records waiting to be reported as one. */
typedef struct {
    int open;
    Py_ssize_t start, end, at;
    int64_t more;
    char reason[320];
} Broken;

static int broken_flush(Reader *r, const Span *span, Broken *broken) {
    if (!broken->open)
        return 0;
    broken->open = 0;
    if (broken->more) {
        char reason[400];
        snprintf(reason, sizeof reason, "%s (and %lld more that do not decode: %zd bytes in all)", broken->reason,
                 (long long)broken->more, broken->end - broken->start);
        return r->sink->malformed(r->w, r->state, span, broken->start, broken->end, broken->at, reason);
    }
    return r->sink->malformed(r->w, r->state, span, broken->start, broken->end, broken->at, broken->reason);
}

/* Another malformed item or record: joins the open run when it follows it directly. */
static int broken_add(Reader *r, const Span *span, Broken *broken, Py_ssize_t start, Py_ssize_t end, Py_ssize_t at,
                      const char *reason) {
    if (broken->open && broken->end == start) {
        broken->end = end;
        broken->more++;
        return 0;
    }
    if (broken_flush(r, span, broken) < 0)
        return -1;
    broken->open = 1;
    broken->start = start;
    broken->end = end;
    broken->at = at;
    broken->more = 0;
    snprintf(broken->reason, sizeof broken->reason, "%s", reason);
    return 0;
}

/* The walk's failure (a decoding failure inside a record or message) taken as a malformed item. */
static int take_failure(Reader *r, const Span *span, Broken *broken, Py_ssize_t start, Py_ssize_t end) {
    Walker *w = r->w;
    if (w->failed != 1)
        return -1; /* a Python error */
    w->failed = 0;
    return broken_add(r, span, broken, start, end, w->fail_at, w->reason);
}

/* --- primitives on a span's bytes (failures go to the walker, as in walk.c) --------------------- */

static int uvarint(Walker *w, const uint8_t *b, Py_ssize_t *pos, Py_ssize_t end, u128 *value) {
    Py_ssize_t start = *pos, p = start;
    u128 result = 0;
    for (int shift = 0;; shift += 7) {
        if (shift > 63)
            return walk_fail(w, start, "varint longer than 10 bytes");
        if (p >= end)
            return walk_fail(w, start, "varint runs past the end of the bytes");
        uint8_t byte = b[p++];
        result |= (u128)(byte & 0x7F) << shift;
        if (!(byte & 0x80))
            break;
    }
    *pos = p;
    *value = result;
    return 0;
}

/* A zig-zag varint of 32 bits longer than two bytes, or a broken one: kept out of line, so that the short
 * ones (varint32 below) are read where they are needed, several times a record. */
static __attribute__((noinline)) int varint32_long(Walker *w, const uint8_t *b, Py_ssize_t *pos, Py_ssize_t end,
                                                   int32_t *value) {
    Py_ssize_t p = *pos;
    u128 raw = 0;
    if (uvarint(w, b, &p, end, &raw) < 0)
        return -1;
    if (raw >> 32) {
        char text[48];
        format_i128(text, sizeof text, (i128)raw);
        return walk_fail(w, *pos, "varint %s exceeds 32 bits", text);
    }
    uint32_t u = (uint32_t)raw;
    *value = (int32_t)((u >> 1) ^ -(u & 1));
    *pos = p;
    return 0;
}

/* A zig-zag varint of 32 bits; most record fields are one byte. */
static inline int varint32(Walker *w, const uint8_t *b, Py_ssize_t *pos, Py_ssize_t end, int32_t *value) {
    Py_ssize_t p = *pos;
    if (p < end && b[p] < 0x80) {
        *value = (int32_t)((b[p] >> 1) ^ -(b[p] & 1));
        *pos = p + 1;
        return 0;
    }
    if (end - p >= 2 && b[p + 1] < 0x80) { /* two bytes: the lengths of values of 64 to 8,191 bytes */
        uint32_t u = (uint32_t)(b[p] & 0x7F) | (uint32_t)b[p + 1] << 7;
        *value = (int32_t)((u >> 1) ^ -(u & 1));
        *pos = p + 2;
        return 0;
    }
    return varint32_long(w, b, pos, end, value);
}

/* A zig-zag varlong; up to 70 bits on the wire, as Kafka's ten-byte varints allow. */
static int varlong(Walker *w, const uint8_t *b, Py_ssize_t *pos, Py_ssize_t end, i128 *value) {
    Py_ssize_t p = *pos;
    if (p < end && b[p] < 0x80) {
        *value = (b[p] >> 1) ^ -(b[p] & 1);
        *pos = p + 1;
        return 0;
    }
    if (end - p >= 2 && b[p + 1] < 0x80) { /* two bytes: offset and time deltas up to 8,191 */
        int64_t u = (int64_t)(b[p] & 0x7F) | (int64_t)b[p + 1] << 7;
        *value = (u >> 1) ^ -(u & 1);
        *pos = p + 2;
        return 0;
    }
    u128 raw = 0;
    if (uvarint(w, b, &p, end, &raw) < 0)
        return -1;
    *value = (i128)(raw >> 1) ^ -(i128)(raw & 1);
    *pos = p;
    return 0;
}

/* Bytes behind a zig-zag varint length (-1: null), as in record keys, values and headers. */
static inline int varint_bytes(Walker *w, const uint8_t *b, Py_ssize_t *pos, Py_ssize_t end, const uint8_t **data,
                               Py_ssize_t *len) {
    Py_ssize_t start = *pos, p = start;
    int32_t n = 0;
    if (varint32(w, b, &p, end, &n) < 0)
        return -1;
    if (n < -1)
        return walk_fail(w, start, "length %d is negative", n);
    if (n == -1) {
        *data = NULL;
        *len = -1;
    } else {
        if (n > end - p)
            return walk_fail(w, start, "length %d exceeds the %zd bytes left", n, end - p);
        *data = b + p;
        *len = n;
        p += n;
    }
    *pos = p;
    return 0;
}

/* Bytes behind an int32 length (-1: null), as in legacy message keys and values. */
static int int32_bytes(Walker *w, const uint8_t *b, Py_ssize_t *pos, Py_ssize_t end, const uint8_t **data,
                       Py_ssize_t *len) {
    Py_ssize_t start = *pos, p = start;
    if (end - p < 4)
        return walk_fail(w, p, "int32 needs 4 bytes, %zd left", end > p ? end - p : 0);
    int32_t n = (int32_t)be(b + p, 4);
    p += 4;
    if (n < -1)
        return walk_fail(w, start, "bytes length %d is negative", n);
    if (n > end - p)
        return walk_fail(w, start, "bytes length %d exceeds the %zd bytes left", n, end - p);
    *data = n < 0 ? NULL : b + p;
    *len = n;
    *pos = p + (n > 0 ? n : 0);
    return 0;
}

int record_header_next(const uint8_t *b, Py_ssize_t *pos, Py_ssize_t end, Py_ssize_t *key_at, const uint8_t **key,
                       Py_ssize_t *key_len, Py_ssize_t *value_at, const uint8_t **value, Py_ssize_t *value_len) {
    /* Only for headers record_read already checked: a scratch walker takes the (impossible) failures. Only
     * `failed` is read (walk_fail writes the rest): clearing the whole struct, its 320-byte reason too, cost
     * more than reading the header, for every record with headers. */
    Walker scratch;
    scratch.failed = 0;
    *key_at = *pos;
    if (varint_bytes(&scratch, b, pos, end, key, key_len) < 0)
        return 0;
    *value_at = *pos;
    if (varint_bytes(&scratch, b, pos, end, value, value_len) < 0)
        return 0;
    return 1;
}

/* --- Python calls: checksums and decompression ------------------------------------------------- */

static int checksum(int which, const uint8_t *p, Py_ssize_t n, uint32_t *out) {
    PyObject *view = PyMemoryView_FromMemory((char *)p, n, PyBUF_READ);
    if (view == NULL)
        return -1;
    PyObject *value = PyObject_CallOneArg(hook(which), view);
    Py_DECREF(view);
    if (value == NULL)
        return -1;
    *out = (uint32_t)PyLong_AsUnsignedLongMask(value);
    Py_DECREF(value);
    return PyErr_Occurred() ? -1 : 0;
}

static void size_text(char *out, size_t size, int64_t n) {
    if (n % MiB == 0)
        snprintf(out, size, "%lld MiB", (long long)(n / MiB));
    else
        snprintf(out, size, "%lld bytes", (long long)n);
}

/* Decompress p[0:n]. Returns the bytes (a new reference), or NULL with `problem` worded and no Python error
 * (decompression failed or was refused), or NULL with a Python error (a bug). */
static PyObject *decompress(Reader *r, int codec, const uint8_t *p, Py_ssize_t n, char *problem, size_t size,
                            int *too_large) {
    Walker *w = r->w;
    int64_t limit = r->batch_limit, budget = w->decompress_budget;
    int by_budget = budget < limit;
    if (by_budget)
        limit = budget > 0 ? budget : 0;
    PyObject *view = PyMemoryView_FromMemory((char *)p, n, PyBUF_READ);
    if (view == NULL)
        return NULL;
    PyObject *data = PyObject_CallFunction(hook(H_DECOMPRESS), "iOL", codec, view, (long long)limit);
    Py_DECREF(view);
    *too_large = 0;
    if (data != NULL) {
        if (!PyByteArray_Check(data)) {
            Py_DECREF(data);
            PyErr_SetString(PyExc_TypeError, "decompress must return a bytearray");
            return NULL;
        }
        w->decompress_budget -= PyByteArray_GET_SIZE(data);
        return data;
    }
    if (!PyErr_ExceptionMatches(hook(H_DECOMPRESSION_FAILED)))
        return NULL;
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);
    PyErr_NormalizeException(&type, &value, &trace);
    *too_large = PyErr_GivenExceptionMatches(value, hook(H_TOO_LARGE));
    PyObject *text = value ? PyObject_Str(value) : NULL;
    const char *utf8 = text ? PyUnicode_AsUTF8(text) : NULL;
    if (*too_large && by_budget) {
        char limit_text[48];
        size_text(limit_text, sizeof limit_text, r->message_limit);
        snprintf(problem, size, "decompressed size of the message's batches exceeds %s limit; records not shown",
                 limit_text);
    } else if (*too_large) {
        snprintf(problem, size, "%s; records not shown", utf8 ? utf8 : "decompressed size exceeds the limit");
    } else {
        snprintf(problem, size, "decompression failed: %s", utf8 ? utf8 : "?");
    }
    Py_XDECREF(text);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(trace);
    PyErr_Clear();
    return NULL;
}

/* --- record batches (magic 2) ------------------------------------------------------------------- */

static int record_read(Walker *w, const uint8_t *b, Py_ssize_t start, Py_ssize_t body, Py_ssize_t end,
                       const BatchHeader *h, RecordInfo *rec) {
    rec->start = start;
    rec->body = body;
    rec->end = end;
    if (body >= end)
        return walk_fail(w, body, "record has no attributes byte");
    rec->attributes = (int8_t)b[body];
    Py_ssize_t p = body + 1;
    rec->ts_at = p;
    i128 ts_delta;
    if (varlong(w, b, &p, end, &ts_delta) < 0)
        return -1;
    rec->od_at = p;
    if (varint32(w, b, &p, end, &rec->offset_delta) < 0)
        return -1;
    rec->key_at = p;
    if (varint_bytes(w, b, &p, end, &rec->key, &rec->key_len) < 0)
        return -1;
    rec->value_at = p;
    if (varint_bytes(w, b, &p, end, &rec->value, &rec->value_len) < 0)
        return -1;
    rec->headers_at = p;
    if (varint32(w, b, &p, end, &rec->header_count) < 0)
        return -1;
    if (rec->header_count < 0)
        return walk_fail(w, rec->headers_at, "header count %d is negative", rec->header_count);
    rec->headers_pos = p;
    for (int32_t i = 0; i < rec->header_count; i++) {
        Py_ssize_t header_at = p, key_len = 0, value_len = 0;
        const uint8_t *key = NULL, *value = NULL;
        if (varint_bytes(w, b, &p, end, &key, &key_len) < 0)
            return -1;
        if (key == NULL)
            return walk_fail(w, header_at, "header key is null");
        if (!utf8_valid(key, key_len))
            return walk_fail(w, header_at, "header key is not valid UTF-8");
        if (varint_bytes(w, b, &p, end, &value, &value_len) < 0)
            return -1;
    }
    if (p != end)
        return walk_fail(w, p, "%zd bytes left over after the record's headers", end - p);
    rec->timestamp_delta = (int64_t)ts_delta;
    rec->offset = (i128)h->base_offset + rec->offset_delta;
    rec->timestamp = h->attributes & 0x08 ? (i128)h->max_timestamp : (i128)h->base_timestamp + ts_delta;
    return 0;
}

static int record_list(Reader *r, const Span *span, const BatchHeader *h, Py_ssize_t pos, Py_ssize_t end,
                       int64_t *decoded) {
    Walker *w = r->w;
    const uint8_t *b = span->b;
    Broken broken = {0};
    *decoded = 0;
    while (pos < end) {
        Py_ssize_t start = pos, body = pos;
        int32_t length = 0;
        if (b[pos] == 0 && broken.open && broken.end == pos) {
            /* a record of length 0 (no attributes byte) right after unreadable ones: bytes of zeros, say */
            broken.end = ++pos;
            broken.more++;
            continue;
        }
        if (varint32(w, b, &body, end, &length) == 0 && (length < 0 || length > end - body))
            walk_fail(w, start, "record length %d does not fit the %zd bytes left", length, end - body);
        if (w->failed) {
            if (take_failure(r, span, &broken, start, end) < 0)
                return -1;
            break;
        }
        pos = body + length;
        RecordInfo rec;
        if (record_read(w, b, start, body, pos, h, &rec) < 0) {
            if (take_failure(r, span, &broken, start, pos) < 0)
                return -1;
            continue;
        }
        if (broken_flush(r, span, &broken) < 0 || r->sink->record(w, r->state, span, h, &rec) < 0)
            return -1;
        (*decoded)++;
    }
    return broken_flush(r, span, &broken);
}

static int batch_read(Reader *r, const Span *span, Py_ssize_t pos, Py_ssize_t end, Broken *broken) {
    Walker *w = r->w;
    const uint8_t *b = span->b;
    BatchHeader h = {
        .start = pos, .end = end, .base_offset = be(b + pos, 8), .batch_length = (int32_t)be(b + pos + 8, 4),
        .partition_leader_epoch = (int32_t)be(b + pos + 12, 4), .magic = (int8_t)b[pos + 16],
        .crc = (uint32_t)be(b + pos + 17, 4), .attributes = (int16_t)be(b + pos + 21, 2),
        .last_offset_delta = (int32_t)be(b + pos + 23, 4), .base_timestamp = be(b + pos + 27, 8),
        .max_timestamp = be(b + pos + 35, 8), .producer_id = be(b + pos + 43, 8),
        .producer_epoch = (int16_t)be(b + pos + 51, 2), .base_sequence = (int32_t)be(b + pos + 53, 4),
        .record_count = (int32_t)be(b + pos + 57, 4)};
    if (r->full && checksum(H_CRC32C, b + pos + BATCH_CRC_FROM, end - pos - BATCH_CRC_FROM, &h.crc_computed) < 0)
        return -1;
    if (broken_flush(r, span, broken) < 0 || r->sink->batch_begin(w, r->state, span, &h) < 0)
        return -1;
    int64_t decoded = 0;
    PyObject *data = NULL; /* decompressed records: alive until the batch ends (a sink may hold a record) */
    Span inner;            /* their span: alive as long (a sink may hold it, with the record) */
    if (r->full) {
        Py_ssize_t start = pos + BATCH_HEADER;
        int codec = h.attributes & 7;
        if (codec == 0) {
            if (r->sink->batch_records(w, r->state, span, span, start, end, NULL, 0) < 0 ||
                record_list(r, span, &h, start, end, &decoded) < 0)
                return -1;
        } else {
            char problem[400];
            int too_large;
            data = decompress(r, codec, b + start, end - start, problem, sizeof problem, &too_large);
            if (data == NULL) {
                if (PyErr_Occurred() ||
                    r->sink->batch_records(w, r->state, span, NULL, start, end, problem, too_large) < 0)
                    return -1;
            } else {
                inner = (Span){(const uint8_t *)PyByteArray_AS_STRING(data), data, 1};
                if (r->sink->batch_records(w, r->state, span, &inner, start, end, NULL, 0) < 0 ||
                    record_list(r, &inner, &h, 0, PyByteArray_GET_SIZE(data), &decoded) < 0) {
                    Py_DECREF(data);
                    return -1;
                }
            }
        }
    }
    int result = r->sink->batch_end(w, r->state, &h, decoded);
    Py_XDECREF(data);
    return result;
}

/* --- legacy messages (magic 0 and 1) ----------------------------------------------------------- */

static int items_read(Reader *r, const Span *span, Py_ssize_t pos, Py_ssize_t end, int partial_ok, int nested);

/* What a wrapper's contents say before they are reported: how many messages, and their offsets. */
typedef struct {
    int64_t messages, first_offset, last_offset;
} InnerFacts;

static int count_malformed(Walker *w, void *s, const Span *span, Py_ssize_t a, Py_ssize_t b, Py_ssize_t c,
                           const char *d) { return 0; }
static int count_partial(Walker *w, void *s, const Span *span, Py_ssize_t a, Py_ssize_t b, int m, int64_t t) {
    return 0;
}
static int count_batch_begin(Walker *w, void *s, const Span *span, const BatchHeader *h) { return 0; }
static int count_batch_records(Walker *w, void *s, const Span *o, const Span *i, Py_ssize_t a, Py_ssize_t b,
                               const char *p, int t) { return 0; }
static int count_record(Walker *w, void *s, const Span *span, const BatchHeader *h, const RecordInfo *rec) {
    return 0;
}
static int count_batch_end(Walker *w, void *s, const BatchHeader *h, int64_t d) { return 0; }
static int count_message_begin(Walker *w, void *s, const Span *span, const MessageInfo *m) {
    InnerFacts *facts = s;
    if (facts->messages++ == 0)
        facts->first_offset = m->offset;
    facts->last_offset = m->offset;
    return 0;
}
static int count_wrapper(Walker *w, void *s, const Span *o, const Span *i, const MessageInfo *m, const char *p,
                         int t) { return 0; }
static int count_message_end(Walker *w, void *s, const MessageInfo *m, int64_t n) { return 0; }

static const RecordSink inner_counter = {count_malformed, count_partial, count_batch_begin, count_batch_records,
                                         count_record, count_batch_end, count_message_begin, count_wrapper,
                                         count_message_end};

static int message_read(Reader *r, const Span *span, Py_ssize_t pos, Py_ssize_t end, int magic, int nested,
                        Broken *broken) {
    Walker *w = r->w;
    const uint8_t *b = span->b;
    MessageInfo m = {.start = pos, .end = end, .magic = magic};
    m.header_end = pos + (magic == 1 ? 26 : 18);
    if (m.header_end + 8 > end) { /* + int32 key length + int32 value length */
        char reason[160];
        snprintf(reason, sizeof reason, "message_size %zd is below the %zd-byte minimum for magic %d", end - pos - 12,
                 m.header_end + 8 - pos - 12, magic);
        return broken_add(r, span, broken, pos, end, pos + 8, reason);
    }
    m.offset = be(b + pos, 8);
    m.message_size = (int32_t)be(b + pos + 8, 4);
    m.crc = (uint32_t)be(b + pos + 12, 4);
    m.attributes = (int8_t)b[pos + 17];
    m.wire_timestamp = magic == 1 ? be(b + pos + 18, 8) : 0;
    m.has_timestamp = magic == 1;
    m.timestamp = m.wire_timestamp;
    Py_ssize_t p = m.header_end;
    m.key_at = p;
    if (int32_bytes(w, b, &p, end, &m.key, &m.key_len) < 0)
        return take_failure(r, span, broken, pos, end);
    m.value_at = p;
    if (int32_bytes(w, b, &p, end, &m.value, &m.value_len) < 0)
        return take_failure(r, span, broken, pos, end);
    m.value_end = p;
    if (r->full && checksum(H_CRC32, b + pos + MESSAGE_CRC_FROM, end - pos - MESSAGE_CRC_FROM, &m.crc_computed) < 0)
        return -1;
    m.absolute_offset = m.offset;
    if (nested && r->inner.made_absolute) {
        m.absolute_offset = m.offset + r->inner.shift;
        m.made_absolute = 1;
    }
    if (nested && r->inner.has_log_append_time) {
        m.timestamp = r->inner.log_append_time;
        m.has_timestamp = 1;
    }
    m.record_count = 1;
    m.base_offset = m.absolute_offset;
    int codec = m.attributes & 7;
    int wrapper = codec && !nested && m.value != NULL;
    if (codec && nested)
        m.value_note = "nested compressed message (Kafka rejects these); not decompressed";
    else if (codec && m.value == NULL)
        m.value_note = "compressed wrapper message without a value";
    PyObject *data = NULL;
    char problem[400] = "";
    int too_large = 0;
    InnerFacts facts = {0};
    Span inner = {0};
    Reader contents = *r;
    if (wrapper) {
        /* the value's bytes after its int32 length; also when only counting: the count is inside */
        data = decompress(r, codec, b + m.value_at + 4, m.value_end - m.value_at - 4, problem, sizeof problem,
                          &too_large);
        if (data == NULL && PyErr_Occurred())
            return -1;
        m.record_count = 0;
    }
    if (data != NULL) {
        inner = (Span){(const uint8_t *)PyByteArray_AS_STRING(data), data, 1};
        Reader counting = {w, &inner_counter, &facts, 0, r->batch_limit, r->message_limit, {0}};
        if (items_read(&counting, &inner, 0, PyByteArray_GET_SIZE(data), 0, 1) < 0) {
            Py_DECREF(data);
            return -1;
        }
        m.record_count = facts.messages;
        /* Inner offsets of a magic-1 wrapper are relative and the wrapper holds the last absolute one; like
           Kafka, keep them as they are when that would make offsets negative (some producers write 0). */
        if (magic == 1 && facts.messages && m.offset - facts.last_offset >= 0) {
            contents.inner.made_absolute = 1;
            contents.inner.shift = m.offset - facts.last_offset;
        }
        if (facts.messages)
            m.base_offset = facts.first_offset + contents.inner.shift;
        if (magic == 1 && (m.attributes & 0x08)) {
            contents.inner.has_log_append_time = 1;
            contents.inner.log_append_time = m.wire_timestamp;
        }
    }
    int failed = broken_flush(r, span, broken) < 0 || r->sink->message_begin(w, r->state, span, &m) < 0;
    if (!failed && wrapper && r->full) {
        failed = r->sink->wrapper(w, r->state, span, data ? &inner : NULL, &m, data ? NULL : problem, too_large) < 0;
        if (!failed && data != NULL)
            failed = items_read(&contents, &inner, 0, PyByteArray_GET_SIZE(data), 0, 1) < 0;
    }
    /* records the message carries: itself, or a wrapper's inner messages; its contents live until it ends */
    if (!failed)
        failed = r->sink->message_end(w, r->state, &m, codec ? facts.messages : 1) < 0;
    Py_XDECREF(data);
    return failed ? -1 : 0;
}

/* --- items ------------------------------------------------------------------------------------- */

static int item_read(Reader *r, const Span *span, Py_ssize_t *pos, Py_ssize_t end, int partial_ok, int nested,
                     Broken *broken) {
    const uint8_t *b = span->b;
    Py_ssize_t at = *pos, present = end - at;
    char reason[160];
    if (present < 12) {
        *pos = end;
        if (!partial_ok) {
            snprintf(reason, sizeof reason, "%zd bytes are too few for an item header", present);
            return broken_add(r, span, broken, at, end, at, reason);
        }
        return broken_flush(r, span, broken) < 0 ? -1
                                                 : r->sink->partial(r->w, r->state, span, at, end,
                                                                    present > 16 ? (int8_t)b[at + 16] : NO_MAGIC, -1);
    }
    int32_t size = (int32_t)be(b + at + 8, 4);
    if (size < 0) {
        *pos = end;
        snprintf(reason, sizeof reason, "length %d is negative", size);
        return broken_add(r, span, broken, at, end, at + 8, reason);
    }
    Py_ssize_t item_end = at + 12 + (Py_ssize_t)size;
    if (item_end > end) {
        *pos = end;
        if (!partial_ok) {
            snprintf(reason, sizeof reason, "item needs %lld bytes, %zd present", 12 + (long long)size, present);
            return broken_add(r, span, broken, at, end, at, reason);
        }
        return broken_flush(r, span, broken) < 0 ? -1
                                                 : r->sink->partial(r->w, r->state, span, at, end,
                                                                    present > 16 ? (int8_t)b[at + 16] : NO_MAGIC,
                                                                    12 + (int64_t)size);
    }
    *pos = item_end;
    if (size < 5) {
        snprintf(reason, sizeof reason, "length %d leaves no room for a magic byte", size);
        return broken_add(r, span, broken, at, item_end, at + 8, reason);
    }
    int magic = (int8_t)b[at + 16];
    if (magic == 2) {
        if (item_end - at < BATCH_HEADER) {
            snprintf(reason, sizeof reason, "batch_length %zd is below the %d-byte header", item_end - at - 12,
                     BATCH_HEADER - 12);
            return broken_add(r, span, broken, at, item_end, at + 8, reason);
        }
        return batch_read(r, span, at, item_end, broken);
    }
    if (magic == 0 || magic == 1)
        return message_read(r, span, at, item_end, magic, nested, broken);
    snprintf(reason, sizeof reason, "unknown magic %d", magic);
    return broken_add(r, span, broken, at, item_end, at + 16, reason);
}

static int items_read(Reader *r, const Span *span, Py_ssize_t pos, Py_ssize_t end, int partial_ok, int nested) {
    Broken broken = {0};
    while (pos < end)
        if (item_read(r, span, &pos, end, partial_ok, nested, &broken) < 0)
            return -1;
    return broken_flush(r, span, &broken);
}

int records_read(Walker *w, const RecordSink *sink, void *state, Py_ssize_t pos, Py_ssize_t end, int full,
                 int partial_ok) {
    Span outer = {w->b, NULL, 0};
    Reader r = {w, sink, state, full, w->decompress_budget, w->decompress_budget, {0}};
    return items_read(&r, &outer, pos, end, partial_ok, 0);
}

/* --- the fixed headers of items, for the builders that show them ------------------------------ */

const HeaderLayout batch_layout[] = {
    {"base_offset", "int64", 8, 0, R_NONE}, {"batch_length", "int32", 4, 8, R_NONE},
    {"partition_leader_epoch", "int32", 4, 12, R_NONE}, {"magic", "int8", 1, 16, R_NONE},
    {"crc", "uint32", 4, 17, R_CHECKSUM}, {"attributes", "int16", 2, 21, R_NONE},
    {"last_offset_delta", "int32", 4, 23, R_NONE}, {"base_timestamp", "int64", 8, 27, R_TIMESTAMP},
    {"max_timestamp", "int64", 8, 35, R_TIMESTAMP}, {"producer_id", "int64", 8, 43, R_NONE},
    {"producer_epoch", "int16", 2, 51, R_NONE}, {"base_sequence", "int32", 4, 53, R_NONE},
    {"record_count", "int32", 4, 57, R_NONE}, {NULL}};
const HeaderLayout message0_layout[] = {
    {"offset", "int64", 8, 0, R_NONE}, {"message_size", "int32", 4, 8, R_NONE}, {"crc", "uint32", 4, 12, R_CHECKSUM},
    {"magic", "int8", 1, 16, R_NONE}, {"attributes", "int8", 1, 17, R_NONE}, {NULL}};
const HeaderLayout message1_layout[] = {
    {"offset", "int64", 8, 0, R_NONE}, {"message_size", "int32", 4, 8, R_NONE}, {"crc", "uint32", 4, 12, R_CHECKSUM},
    {"magic", "int8", 1, 16, R_NONE}, {"attributes", "int8", 1, 17, R_NONE}, {"timestamp", "int64", 8, 18, R_TIMESTAMP},
    {NULL}};
const HeaderLayout prefix_layout[] = {{"offset", "int64", 8, 0, R_NONE}, {"length", "int32", 4, 8, R_NONE}, {NULL}};

int64_t header_value(const uint8_t *p, const HeaderLayout *h) {
    if (!strcmp(h->type, "uint32"))
        return fixed_value(K_UINT32, p);
    return fixed_value(h->size == 1 ? K_INT8 : h->size == 2 ? K_INT16 : h->size == 4 ? K_INT32 : K_INT64, p);
}

/* --- control records ---------------------------------------------------------------------------- */

typedef struct {
    int found;
    int64_t type;
} Capture;

static int capture_fixed(Walker *w, int name, Py_ssize_t index, int kind, int role, Py_ssize_t at,
                         const uint8_t *p) {
    Capture *c = w->state;
    if (role == R_CONTROL_TYPE && !c->found) {
        c->found = 1;
        c->type = fixed_value(kind, p);
    }
    return 0;
}
static int capture_text(Walker *w, int n, Py_ssize_t i, int f, int r, Py_ssize_t a, Py_ssize_t s, const uint8_t *p,
                        Py_ssize_t l, int nn) { return 0; }
static int capture_array_begin(Walker *w, int n, int t, int r, Py_ssize_t a, int64_t c) { return 0; }
static int capture_array_null(Walker *w, int n, int t, Py_ssize_t a, Py_ssize_t s, int nn) { return 0; }
static int capture_end(Walker *w, Py_ssize_t e, int ok) { return 0; }
static int capture_struct_begin(Walker *w, int n, Py_ssize_t i, int t, Py_ssize_t a) { return 0; }
static int capture_struct_null(Walker *w, int n, int t, Py_ssize_t a) { return 0; }
static int capture_tagged_begin(Walker *w, Py_ssize_t a) { return 0; }
static int capture_tagged_unknown(Walker *w, uint64_t t, Py_ssize_t a, Py_ssize_t s, const uint8_t *p) { return 0; }
static int capture_tagged_end(Walker *w, Py_ssize_t e, uint64_t c, int ok) { return 0; }
static int capture_records(Walker *w, int n, Py_ssize_t a, Py_ssize_t s, Py_ssize_t d, Py_ssize_t l) { return 0; }
static int capture_embedded(Walker *w, int n, int r, Py_ssize_t a, Py_ssize_t s, Py_ssize_t d, Py_ssize_t l) {
    return 0;
}

static const Builder capture_builder = {capture_fixed, capture_text, capture_array_begin, capture_array_null,
                                        capture_end, capture_struct_begin, capture_struct_null, capture_end,
                                        capture_tagged_begin, capture_tagged_unknown, capture_tagged_end,
                                        capture_records, capture_embedded};

/* The key is a ControlRecordTypeSchema: an int16 version, then the schema at that version. */
int record_control_type(const uint8_t *b, Py_ssize_t buflen, Py_ssize_t at, Py_ssize_t len, int64_t *type) {
    if (len < 2)
        return 0;
    const Program *program = embedded_program(E_CONTROL_KEY, (int16_t)be(b + at, 2));
    if (program == NULL)
        return PyErr_Occurred() ? -1 : 0;
    Capture capture = {0};
    Walker inner = {.b = b, .buflen = buflen, .builder = &capture_builder, .state = &capture};
    Py_ssize_t stop;
    walk_program(&inner, program, at + 2, at + len, &stop);
    if (inner.failed == 2)
        return -1;
    *type = capture.type;
    return capture.found;
}

const char *control_type_name(int64_t type) { return type == 0 ? "ABORT" : type == 1 ? "COMMIT" : "unknown"; }
