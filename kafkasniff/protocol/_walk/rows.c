/* The records builder: the Spark `records` table's columns of a Produce request's or Fetch response's records,
 * read in the walk itself (no Field tree, no object per record), handed on in chunks of at most `every` records (a
 * few KB of compressed records can be millions). Per record, native-endian values, one bytes object per column
 * (RECORD_COLUMNS in walker.py):
 *
 *   offset int64, timestamp µs int64, key size int32, value size int32, header count int32, crc valid uint8,
 *   group int32
 *
 * where a value that is null (no key, no value, no timestamp) or does not fit (base + delta past 64 bits on
 * hostile input) is NULL_INT64 / NULL_INT32 (walk.h), and `group` indexes the chunk's list of what the records
 * of one batch share: (topic, topic id, partition, codec, magic, producer id, transactional, control). Topic and
 * partition come from the fields whose roles say so, in the structs around the records field (a struct's own
 * override those around it). Legacy messages give a record each; a compressed wrapper's inner messages give
 * theirs, in the wrapper's group, with its CRC verdict and their own. Partial and malformed items give none.
 */
#include "walk.h"

#define MAX_NEST 200

typedef struct {
    PyObject *topic, *topic_id, *partition; /* borrowed: owned by `held` */
} Context;

enum { C_OFFSET, C_TIMESTAMP, C_KEY_SIZE, C_VALUE_SIZE, C_HEADER_COUNT, C_CRC_VALID, C_GROUP, COLUMNS };

typedef struct {
    Out columns[COLUMNS]; /* the records not handed on yet: at most `every` */
    Py_ssize_t count, every, total;
    PyObject *emit; /* takes each chunk: emit(count, groups, column bytes...) */
    PyObject *groups; /* list of the shared values of the chunk's batches */
    PyObject *held; /* a list keeping the context values alive */
    Context context[MAX_NEST];
    int depth;
    /* the item whose records are read */
    const char *codec;
    int codec_id, magic, transactional, control, crc_valid;
    int64_t producer_id;
    int legacy_depth;
} Rows;

static Context *here(Rows *r) { return &r->context[r->depth - 1]; }

static int keep(Rows *r, PyObject *value, PyObject **slot) {
    if (value == NULL || PyList_Append(r->held, value) < 0) {
        Py_XDECREF(value);
        return -1;
    }
    Py_DECREF(value);
    *slot = value;
    return 0;
}

static int r_fixed(Walker *w, int name, Py_ssize_t index, int kind, int role, Py_ssize_t at, const uint8_t *p) {
    Rows *r = w->state;
    if (role == R_TOPIC_ID && kind == K_UUID && r->depth) {
        char text[36];
        Out o = {text, 0, sizeof text};
        out_uuid(&o, p);
        return keep(r, PyUnicode_FromStringAndSize(text, 36), &here(r)->topic_id);
    }
    if (role == R_PARTITION && kind == K_INT32 && name != INDEX_NAME && r->depth)
        return keep(r, PyLong_FromLong((long)fixed_value(kind, p)), &here(r)->partition);
    return 0;
}

static int r_text(Walker *w, int name, Py_ssize_t index, int form, int role, Py_ssize_t at, Py_ssize_t size,
                  const uint8_t *p, Py_ssize_t n, int not_nullable) {
    Rows *r = w->state;
    if (role != R_TOPIC_NAME || form != FORM_STRING || name == INDEX_NAME || !r->depth)
        return 0;
    return keep(r, n < 0 ? Py_NewRef(Py_None) : PyUnicode_DecodeUTF8((const char *)p, n, NULL), &here(r)->topic);
}

static int r_nothing(Walker *w, int name, int type, int role, Py_ssize_t at, int64_t count) { return 0; }
static int r_null(Walker *w, int name, int type, Py_ssize_t at, Py_ssize_t size, int not_nullable) { return 0; }
static int r_end(Walker *w, Py_ssize_t end, int ok) { return 0; }

static int r_struct_begin(Walker *w, int name, Py_ssize_t index, int type, Py_ssize_t at) {
    Rows *r = w->state;
    if (r->depth >= MAX_NEST) {
        PyErr_SetString(PyExc_RecursionError, "rows: structs nested too deep");
        return -1;
    }
    r->context[r->depth] = r->depth ? *here(r) : (Context){Py_None, Py_None, Py_None};
    r->depth++;
    return 0;
}

static int r_struct_null(Walker *w, int name, int type, Py_ssize_t at) { return 0; }

static int r_struct_end(Walker *w, Py_ssize_t end, int ok) {
    ((Rows *)w->state)->depth--;
    return 0;
}

static int r_tagged_begin(Walker *w, Py_ssize_t at) { return 0; }
static int r_tagged_unknown(Walker *w, uint64_t tag, Py_ssize_t at, Py_ssize_t size, const uint8_t *p) { return 0; }
static int r_tagged_end(Walker *w, Py_ssize_t end, uint64_t count, int ok) { return 0; }
static int r_embedded(Walker *w, int name, int role, Py_ssize_t at, Py_ssize_t size, Py_ssize_t data_at,
                      Py_ssize_t n) { return 0; }

/* --- records ------------------------------------------------------------------------------------ */

static int64_t micros_of(i128 ms) { return ms < 0 || ms > INT64_MAX / 1000 ? NULL_INT64 : (int64_t)(ms * 1000); }

static int64_t offset_of(i128 offset) {
    return offset >= INT64_MIN && offset <= INT64_MAX ? (int64_t)offset : NULL_INT64;
}

static int32_t size_of(Py_ssize_t n) { return n < 0 || n > INT32_MAX ? NULL_INT32 : (int32_t)n; }

/* A batch (or legacy message, or wrapper) begins: what its records share, as a new group. */
static int begin_group(Rows *r) {
    const Context *c = here(r);
    PyObject *codec = r->codec ? PyUnicode_FromString(r->codec) : PyUnicode_FromFormat("unknown(%d)", r->codec_id);
    PyObject *group = codec ? Py_BuildValue("(OOONiLOO)", c->topic, c->topic_id, c->partition, codec, r->magic,
                                            (long long)r->producer_id, r->transactional ? Py_True : Py_False,
                                            r->control ? Py_True : Py_False)
                            : NULL;
    if (group == NULL)
        return -1;
    int failed = PyList_Append(r->groups, group);
    Py_DECREF(group);
    return failed;
}

/* Hand the chunk on and start the next one, in the batch being read (its group, the chunk's last, comes along). */
static int emit(Rows *r) {
    PyObject *chunk = PyTuple_New(2 + COLUMNS);
    if (chunk == NULL)
        return -1;
    PyTuple_SET_ITEM(chunk, 0, PyLong_FromSsize_t(r->count));
    PyTuple_SET_ITEM(chunk, 1, Py_NewRef(r->groups));
    for (int i = 0; i < COLUMNS; i++)
        PyTuple_SET_ITEM(chunk, 2 + i, PyBytes_FromStringAndSize(r->columns[i].data, r->columns[i].len));
    for (int i = 0; i < 2 + COLUMNS; i++) {
        if (PyTuple_GET_ITEM(chunk, i) == NULL) {
            Py_DECREF(chunk);
            return -1;
        }
    }
    PyObject *done = PyObject_Call(r->emit, chunk, NULL);
    Py_DECREF(chunk);
    if (done == NULL)
        return -1;
    Py_DECREF(done);
    Py_ssize_t groups = PyList_GET_SIZE(r->groups);
    PyObject *next = PyList_GetSlice(r->groups, groups ? groups - 1 : 0, groups);
    if (next == NULL)
        return -1;
    Py_SETREF(r->groups, next);
    for (int i = 0; i < COLUMNS; i++)
        r->columns[i].len = 0;
    r->count = 0;
    return 0;
}

static int row(Rows *r, int64_t offset, int64_t timestamp, Py_ssize_t key_len, Py_ssize_t value_len,
               int header_count, int crc_valid) {
    int32_t key_size = size_of(key_len), value_size = size_of(value_len), headers = header_count;
    int32_t group = (int32_t)(PyList_GET_SIZE(r->groups) - 1);
    uint8_t crc = crc_valid != 0;
    Out *c = r->columns;
    if (out_write(&c[C_OFFSET], &offset, 8) || out_write(&c[C_TIMESTAMP], &timestamp, 8) ||
        out_write(&c[C_KEY_SIZE], &key_size, 4) || out_write(&c[C_VALUE_SIZE], &value_size, 4) ||
        out_write(&c[C_HEADER_COUNT], &headers, 4) || out_write(&c[C_CRC_VALID], &crc, 1) ||
        out_write(&c[C_GROUP], &group, 4))
        return -1;
    r->total++;
    return ++r->count < r->every ? 0 : emit(r);
}

static int rr_malformed(Walker *w, void *st, const Span *span, Py_ssize_t start, Py_ssize_t end, Py_ssize_t at,
                        const char *reason) { return 0; }
static int rr_partial(Walker *w, void *st, const Span *span, Py_ssize_t start, Py_ssize_t end, int magic,
                      int64_t total) { return 0; }

static int rr_batch_begin(Walker *w, void *st, const Span *span, const BatchHeader *h) {
    Rows *r = st;
    if (r->legacy_depth)
        return 0; /* a record batch inside a legacy wrapper: not one of its records */
    r->codec_id = h->attributes & 7;
    r->codec = codec_text(r->codec_id);
    r->magic = 2;
    r->producer_id = h->producer_id;
    r->transactional = (h->attributes & 0x10) != 0;
    r->control = (h->attributes & 0x20) != 0;
    r->crc_valid = h->crc == h->crc_computed;
    return begin_group(r);
}

static int rr_batch_records(Walker *w, void *st, const Span *o, const Span *i, Py_ssize_t a, Py_ssize_t b,
                            const char *p, int t) { return 0; }

static int rr_record(Walker *w, void *st, const Span *span, const BatchHeader *h, const RecordInfo *rec) {
    Rows *r = st;
    if (r->legacy_depth)
        return 0;
    return row(r, offset_of(rec->offset), micros_of(rec->timestamp), rec->key_len, rec->value_len, rec->header_count,
               r->crc_valid);
}

static int rr_batch_end(Walker *w, void *st, const BatchHeader *h, int64_t decoded) { return 0; }

static int rr_message_begin(Walker *w, void *st, const Span *span, const MessageInfo *m) {
    Rows *r = st;
    int64_t timestamp = m->has_timestamp ? micros_of(m->timestamp) : NULL_INT64;
    if (r->legacy_depth++) /* inside a wrapper: the wrapper's group, this message's own CRC verdict */
        return row(r, m->absolute_offset, timestamp, m->key_len, m->value_len, 0,
                   r->crc_valid && m->crc == m->crc_computed);
    r->codec_id = m->attributes & 7;
    r->codec = codec_text(r->codec_id);
    r->magic = m->magic;
    r->producer_id = -1;
    r->transactional = r->control = 0;
    r->crc_valid = m->crc == m->crc_computed;
    if (begin_group(r) < 0)
        return -1;
    if (r->codec_id) /* its records are its inner messages */
        return 0;
    return row(r, m->absolute_offset, timestamp, m->key_len, m->value_len, 0, r->crc_valid);
}

static int rr_wrapper(Walker *w, void *st, const Span *o, const Span *i, const MessageInfo *m, const char *p, int t) {
    return 0;
}

static int rr_message_end(Walker *w, void *st, const MessageInfo *m, int64_t records) {
    ((Rows *)st)->legacy_depth--;
    return 0;
}

static const RecordSink rows_sink = {rr_malformed, rr_partial, rr_batch_begin, rr_batch_records, rr_record,
                                     rr_batch_end, rr_message_begin, rr_wrapper, rr_message_end};

static int r_records(Walker *w, int name, Py_ssize_t at, Py_ssize_t size, Py_ssize_t data_at, Py_ssize_t n) {
    return records_read(w, &rows_sink, w->state, data_at, data_at + n, 1, 1);
}

const Builder rows_builder = {r_fixed, r_text, r_nothing, r_null, r_end, r_struct_begin, r_struct_null,
                              r_struct_end, r_tagged_begin, r_tagged_unknown, r_tagged_end, r_records, r_embedded};

/* record_columns(program, buf, pos, end, decompress_limit, emit, every) -> records: see the top of this file. */
PyObject *record_columns(PyObject *self, PyObject *args) {
    PyObject *program, *emit_to;
    Py_buffer buf;
    Py_ssize_t pos, end, every;
    long long limit;
    if (!PyArg_ParseTuple(args, "O!y*nnLOn:record_columns", &ProgramType, &program, &buf, &pos, &end, &limit,
                          &emit_to, &every))
        return NULL;
    PyObject *result = NULL;
    Rows r = {.emit = emit_to, .every = every, .groups = PyList_New(0), .held = PyList_New(0)};
    if (r.groups == NULL || r.held == NULL)
        goto done;
    if (pos < 0 || end > buf.len || pos > end || every < 1 || !PyCallable_Check(emit_to)) {
        PyErr_SetString(PyExc_ValueError, "record_columns: range outside the buffer, or no way to hand on records");
        goto done;
    }
    Walker w = {.b = buf.buf, .buflen = buf.len, .bufobj = buf.obj, .builder = &rows_builder, .state = &r,
                .decompress_budget = limit};
    Py_ssize_t stop;
    walk_program(&w, (const Program *)program, pos, end, &stop);
    if (w.failed != 2 && (r.count == 0 || emit(&r) == 0))
        result = PyLong_FromSsize_t(r.total);
done:
    for (int i = 0; i < COLUMNS; i++)
        out_free(&r.columns[i]);
    Py_XDECREF(r.groups);
    Py_XDECREF(r.held);
    PyBuffer_Release(&buf);
    return result;
}
