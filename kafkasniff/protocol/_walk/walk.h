/* The schema walker: one interpreter of version-resolved schema programs, driving a builder per view.
 *
 * program.py resolves a schema at a version (presence, compact or classic encoding, nullability, tags,
 * field roles) into a program of int32 words; Program (program.c) checks the words once when it is made,
 * so the walk can trust their structure, never the bytes. walk.c reads the bytes along the program and
 * calls a Builder for every item it reads; records.c reads record batches and legacy message sets for the
 * fields whose role is "records". Builders:
 *   summary.c  the values pairing, filters and the one-line view need (ids, error codes, topics, counts)
 *   json.c     the body as JSON text, records included, written in the same pass
 *   fields.c   the Field tree (for -V, --hex and explain): every item with its offset and length
 *   partitions.c  per partition: fixed-width fields and record batch headers (lag, end-to-end latency)
 *
 * Nothing here trusts a length field: every length and count is checked against the bytes present
 * before anything is read or allocated from it. Where the bytes are wrong, the walk stops with an
 * offset and a reason (the same in every mode), and each builder closes what it had opened.
 */
#ifndef KAFKASNIFF_WALK_H
#define KAFKASNIFF_WALK_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef __int128 i128;
typedef unsigned __int128 u128;

/* Program words (see program.py, which writes them, and program.c, which checks them):
 *   FIXED   kind role name                      a fixed-width value
 *   STRING  compact nullable role name
 *   BYTES   compact nullable role name          role RECORDS: record batches; embedded schemas by role
 *   ARRAY   compact nullable role name type length element   element: one leaf op or one STRUCT
 *   STRUCT  nullable name type length members...             name -1: an array element
 *   TAGGED  known length (tag length op)*known               the tagged-field section of a struct
 * A name of -1 on a leaf means an array element: the builder names it by its index. */
enum op { OP_FIXED = 1, OP_STRING, OP_BYTES, OP_ARRAY, OP_STRUCT, OP_TAGGED };
enum kind { K_BOOL, K_INT8, K_INT16, K_UINT16, K_INT32, K_UINT32, K_INT64, K_FLOAT64, K_UUID, K_COUNT };
/* Field roles: facts from the generated table (and quirks.py), the same numbers as program.py's ROLES. */
enum role {
    R_NONE, R_ERROR_CODE, R_TOPIC_NAME, R_TOPIC_ID, R_PARTITION, R_RECORDS, R_THROTTLE_TIME, R_ACKS,
    R_CORRELATION_ID, R_CLIENT_ID, R_PROTOCOL_TYPE, R_CONSUMER_SUBSCRIPTION, R_CONSUMER_ASSIGNMENT,
    R_AUTH_BYTES, R_CONTROL_TYPE, R_API_KEY, R_CHECKSUM, R_TIMESTAMP, R_NODE_ID, R_PORT, R_NAME, R_OFFSET, R_COUNT
};
extern const char *const role_text[R_COUNT];
#define INDEX_NAME (-1)
#define NO_TYPE (-1)
/* Views that hold a message's tree (Field trees with a record limit; the -V text unless every value is shown)
 * make at most this many of the fields of its header or body (records apart): past it, the items of every array
 * are counted, not made, as past the limit of items per array. Arrays nested in arrays, each under that limit,
 * could otherwise make a field of every byte of a frame. */
#define TREE_FIELDS_MAX 100000

extern const int kind_size[K_COUNT];
extern const char *const kind_text[K_COUNT];

typedef struct {
    PyObject_HEAD
    int32_t *ops;
    Py_ssize_t length;
    PyObject *names;      /* tuple of str: field and type names */
    PyObject *keys;       /* tuple of bytes: each name as a JSON key, '"snake_case":' */
    const char **texts;   /* UTF-8 of each name, for reasons */
    int root_name, root_type;
    /* partitions.c's memo: the slot in the `wanted` tuple facts_for (held) of each name's fact outside nested
       structs, then of its records size's ("<name>_bytes"): -1 not wanted, -2 not asked yet. A tuple is asked
       once per name, not once per field read */
    PyObject *facts_for;
    int32_t *fact_slots;
} Program;

extern PyTypeObject ProgramType, FieldBaseType;

/* Embedded schemas, found by role: the walker asks Python for their program at the version the bytes give. */
enum embedded { E_SUBSCRIPTION, E_ASSIGNMENT, E_CONTROL_KEY, E_CONTROL_VALUE, E_COUNT };

typedef struct Walker Walker;
enum form { FORM_STRING, FORM_BYTES, FORM_RECORDS };

/* A builder: what a view makes of what the walk reads. Every call returns 0, or -1 with a Python
 * exception set. `ok` on an end call is 0 when the walk failed inside the container: the builder closes
 * it at the failure's offset. Offsets are absolute in the walked buffer. */
typedef struct Builder {
    int (*fixed)(Walker *, int name, Py_ssize_t index, int kind, int role, Py_ssize_t at, const uint8_t *p);
    /* strings (already checked UTF-8), bytes, and empty or null records; n < 0 for null */
    int (*text)(Walker *, int name, Py_ssize_t index, int form, int role, Py_ssize_t at, Py_ssize_t size,
                const uint8_t *p, Py_ssize_t n, int not_nullable);
    int (*array_begin)(Walker *, int name, int type, int role, Py_ssize_t at, int64_t count);
    int (*array_null)(Walker *, int name, int type, Py_ssize_t at, Py_ssize_t size, int not_nullable);
    int (*array_end)(Walker *, Py_ssize_t end, int ok);
    int (*struct_begin)(Walker *, int name, Py_ssize_t index, int type, Py_ssize_t at);
    int (*struct_null)(Walker *, int name, int type, Py_ssize_t at);
    int (*struct_end)(Walker *, Py_ssize_t end, int ok);
    int (*tagged_begin)(Walker *, Py_ssize_t at);
    int (*tagged_unknown)(Walker *, uint64_t tag, Py_ssize_t at, Py_ssize_t size, const uint8_t *p);
    int (*tagged_end)(Walker *, Py_ssize_t end, uint64_t count, int ok);
    /* a bytes field whose role is records: the builder reads it with records.c (or not at all) */
    int (*records)(Walker *, int name, Py_ssize_t at, Py_ssize_t size, Py_ssize_t data_at, Py_ssize_t n);
    /* a bytes field carrying an embedded schema (consumer protocol, SASL): the builder decides */
    int (*embedded)(Walker *, int name, int role, Py_ssize_t at, Py_ssize_t size, Py_ssize_t data_at, Py_ssize_t n);
} Builder;

struct Walker {
    const uint8_t *b;          /* the buffer being walked */
    Py_ssize_t buflen;
    PyObject *bufobj;          /* the object behind b (bytes-like), for builders that keep slices */
    const Program *prog;
    const Builder *builder;
    void *state;               /* the builder's own */
    /* the failure that stopped the walk */
    int failed;
    Py_ssize_t fail_at;
    char reason[320];
    /* what the message said so far that later fields depend on */
    int protocol_type;         /* PT_UNSEEN, PT_CONSUMER (or null), PT_OTHER */
    int64_t decompress_budget; /* decompressed bytes this message may still produce */
};
enum { PT_UNSEEN, PT_CONSUMER, PT_OTHER };

/* walk.c */
int walk_program(Walker *w, const Program *prog, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t *stop);
int walk_fail(Walker *w, Py_ssize_t at, const char *fmt, ...);
int walk_is_decode_failure(Walker *w);
void format_i128(char *out, size_t size, i128 v);
/* The layout of partition_facts' packed partitions (partitions.c): words before a partition's facts, and per
 * record batch. */
#define PACKED_HEAD_WORDS 2
#define PACKED_BATCH_WORDS 5

int64_t fixed_value(int kind, const uint8_t *p); /* a fixed-width integer (or bool) of the kind */
int utf8_valid(const uint8_t *p, Py_ssize_t n);
PyObject *hook(int which);
enum hooks { H_FIELD_TYPE, H_MALFORMED_TYPE, H_ERROR_NAME, H_DECOMPRESS, H_DECOMPRESSION_FAILED,
             H_TOO_LARGE, H_EMBEDDED, H_EMBEDDED_SIZE, H_CRC32C, H_CRC32, H_FLOAT_JSON, H_TOPIC_TEXT,
             H_COUNT };
const Program *embedded_program(int which, int version);
PyObject *error_name_of(int64_t code);
int error_code_known(int64_t code);

/* records.c: record batches (magic 2) and legacy message sets (magic 0/1) */
typedef struct RecordSink RecordSink;
/* The items of a records field in w->b[pos:end]. full: every record (else what batch and message headers say);
   partial_ok: an item cut off by `end` is partial (a Fetch response filled to its limit), else malformed. */
int records_read(Walker *w, const RecordSink *sink, void *state, Py_ssize_t pos, Py_ssize_t end, int full,
                 int partial_ok);

/* Items of a records field, as records.c reports them. Positions are in the buffer given (the frame, or
 * decompressed bytes: `detached`). */
typedef struct {
    const uint8_t *b;          /* the bytes the positions point into */
    PyObject *data;            /* decompressed bytes (a bytearray) when detached, else NULL */
    int detached;
} Span;

typedef struct {
    Py_ssize_t start, end;
    int64_t base_offset;
    int32_t batch_length, partition_leader_epoch;
    int8_t magic;
    uint32_t crc, crc_computed;
    int16_t attributes;
    int32_t last_offset_delta;
    int64_t base_timestamp, max_timestamp, producer_id;
    int16_t producer_epoch;
    int32_t base_sequence, record_count;
} BatchHeader;

typedef struct {
    Py_ssize_t start, body, ts_at, od_at, key_at, value_at, headers_at, end;
    int8_t attributes;
    int64_t timestamp_delta;
    int32_t offset_delta;
    i128 offset, timestamp;    /* absolute (base + delta may pass 64 bits on hostile input) */
    const uint8_t *key, *value;
    Py_ssize_t key_len, value_len; /* -1: null */
    int32_t header_count;
    Py_ssize_t headers_pos;    /* where the headers are, to read them again (records_header) */
} RecordInfo;

typedef struct {
    Py_ssize_t start, end, header_end;
    int magic;
    int64_t offset;            /* as on the wire */
    int64_t absolute_offset;   /* inside a magic-1 wrapper: made absolute (made_absolute says so) */
    int made_absolute;
    int32_t message_size;
    uint32_t crc, crc_computed;
    int8_t attributes;
    int64_t wire_timestamp;    /* magic 1 */
    int64_t timestamp;         /* what the record's time is: the wire's, or the wrapper's log-append time */
    int has_timestamp;
    Py_ssize_t key_at, value_at, value_end;
    const uint8_t *key, *value;
    Py_ssize_t key_len, value_len; /* -1: null */
    const char *value_note;    /* nested compressed, or compressed without a value */
    int64_t record_count;      /* a wrapper's inner messages (0 when not decompressed), else 1 */
    int64_t base_offset;       /* a wrapper's first inner offset, else its own */
} MessageInfo;

/* What a builder does with the items of a records field. Every call returns 0 or -1 (Python error). */
struct RecordSink {
    int (*malformed)(Walker *, void *, const Span *, Py_ssize_t start, Py_ssize_t end, Py_ssize_t at,
                     const char *reason);
    int (*partial)(Walker *, void *, const Span *, Py_ssize_t start, Py_ssize_t end, int magic, int64_t total);
    int (*batch_begin)(Walker *, void *, const Span *, const BatchHeader *);
    /* the batch's records: their bytes (detached when decompressed), or why they are not shown */
    int (*batch_records)(Walker *, void *, const Span *outer, const Span *records, Py_ssize_t at, Py_ssize_t end,
                         const char *problem, int too_large);
    int (*record)(Walker *, void *, const Span *, const BatchHeader *, const RecordInfo *);
    int (*batch_end)(Walker *, void *, const BatchHeader *, int64_t decoded);
    int (*message_begin)(Walker *, void *, const Span *, const MessageInfo *);
    /* a compressed wrapper's contents: inner messages follow, then message_end */
    int (*wrapper)(Walker *, void *, const Span *outer, const Span *inner, const MessageInfo *, const char *problem,
                   int too_large);
    int (*message_end)(Walker *, void *, const MessageInfo *, int64_t inner_messages);
};

/* The headers of a record, one at a time: returns 1 and fills key/value while there are more. */
int record_header_next(const uint8_t *b, Py_ssize_t *pos, Py_ssize_t end, Py_ssize_t *key_at, const uint8_t **key,
                       Py_ssize_t *key_len, Py_ssize_t *value_at, const uint8_t **value, Py_ssize_t *value_len);
const char *codec_text(int codec);
/* A control record's type (0 ABORT, 1 COMMIT) from its key: 1 when the key says it, 0 when not, -1 on error. */
int record_control_type(const uint8_t *b, Py_ssize_t buflen, Py_ssize_t at, Py_ssize_t len, int64_t *type);
const char *control_type_name(int64_t type);
#define NO_MAGIC (-1000) /* a partial item too short to hold its magic byte */

/* The fixed header fields of record batches, legacy messages and bare item prefixes; roles R_CHECKSUM and
   R_TIMESTAMP tell views to show a CRC in hex and a time readably. */
typedef struct {
    const char *name, *type;
    int size, at, role;
} HeaderLayout;
extern const HeaderLayout batch_layout[], message0_layout[], message1_layout[], prefix_layout[];
int64_t header_value(const uint8_t *p, const HeaderLayout *h);
extern const char *const DECOMPRESSED_NOTE;

/* out.c: a growable byte buffer, and JSON text */
typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Out;
int out_grow(Out *o, Py_ssize_t more);
/* Room for `more` bytes; 0, or -1 with MemoryError. */
static inline int out_reserve(Out *o, Py_ssize_t more) { return o->cap - o->len >= more ? 0 : out_grow(o, more); }
static inline int out_write(Out *o, const void *p, Py_ssize_t n) {
    if (n == 0) /* p may be NULL then (an empty prefix, say), which memcpy must not see */
        return 0;
    if (out_reserve(o, n) < 0)
        return -1;
    memcpy(o->data + o->len, p, n);
    o->len += n;
    return 0;
}
#define OUT_LIT(o, s) out_write((o), (s), (Py_ssize_t)(sizeof(s) - 1))
static inline int out_char(Out *o, char c) {
    if (o->len == o->cap && out_grow(o, 1) < 0)
        return -1;
    o->data[o->len++] = c;
    return 0;
}
int out_i64(Out *o, int64_t v);
int out_u64(Out *o, uint64_t v);
int out_i128(Out *o, i128 v);
int out_json_string(Out *o, const uint8_t *p, Py_ssize_t n);   /* p must be valid UTF-8 */
int out_json_bytes(Out *o, const uint8_t *p, Py_ssize_t n);    /* {"base64": ..., "text": ...} or null */
int out_uuid(Out *o, const uint8_t *p);                        /* as JSON string contents, no quotes */
void out_free(Out *o);

/* builders */
extern const Builder summary_builder, json_builder, fields_builder, text_builder, partitions_builder;
PyObject *summarize(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *screen(PyObject *self, PyObject *args);
PyObject *json_body(PyObject *self, PyObject *args);
PyObject *field_tree(PyObject *self, PyObject *args);
PyObject *records_fields(PyObject *self, PyObject *args);
PyObject *records_json(PyObject *self, PyObject *args);
PyObject *text_tree(PyObject *self, PyObject *args);
/* record_columns' values for null (and, for int64, out of range): the module's NULL_INT64 and NULL_INT32 */
#define NULL_INT64 INT64_MIN
#define NULL_INT32 (-1)
PyObject *record_columns(PyObject *self, PyObject *args);
PyObject *partition_facts(PyObject *self, PyObject *args);

#endif
