/* The JSON builder: a message body as JSON text, records included, written in the same pass that reads it.
 *
 * The shape is the `--json` body of the README: field names as snake_case keys (program.py supplies each
 * name's key), arrays as lists, structs as objects, tagged fields in line with the others and unknown tags
 * under "_unknown_tags", bytes as {"base64", "text"}, record batches and legacy messages as objects with
 * their records. A body cut short by a malformed frame holds what was read before the cut: every open list
 * and object is closed where the walk stopped.
 *
 * Text is flushed to a `write` callable after whole record batches, structs and arrays once the buffer holds
 * enough, so a Fetch response of many batches, or a body of a million structs, never sits in memory as one
 * string.
 */
#include "walk.h"

#define MAX_NEST 200

typedef struct {
    char first;             /* nothing written in it yet */
    Py_ssize_t unknown_at;  /* where the next unknown tag goes inside its "_unknown_tags" object, or -1 */
} Open;

typedef struct {
    Out out;
    PyObject *write;        /* flush target, or NULL: everything is returned at the end */
    Py_ssize_t flush_at;
    PyObject *ctx;          /* the message's context: SASL tokens (auth_json), or None */
    int prefix;             /* added to frame offsets in malformed reports: the size prefix */
    Open open[MAX_NEST];
    int depth;
    int merge_root;         /* an embedded schema's object is already open (its version written) */
    int pending_inserts;    /* open objects waiting for more unknown tags: no flush meanwhile */
    int tentative;          /* inside an embedded schema that may yet be taken back: no flush meanwhile */
    char legacy[8];         /* open legacy messages: 'w' a wrapper, 'm' a message, 'i' one inside a wrapper */
    int legacy_depth;
    int items_depth;        /* depth inside the open records field's list: whole items end there */
    char problem[400];      /* why a batch's or wrapper's records are not shown */
    int has_problem;
} Json;

static int push(Json *j) {
    if (j->depth >= MAX_NEST) {
        PyErr_SetString(PyExc_RecursionError, "json: nested too deep");
        return -1;
    }
    j->open[j->depth].first = 1;
    j->open[j->depth].unknown_at = -1;
    j->depth++;
    return 0;
}

static int pop(Json *j, char close) {
    Open *o = &j->open[--j->depth];
    if (o->unknown_at >= 0)
        j->pending_inserts--;
    return out_char(&j->out, close);
}

/* A comma before all but the first item, and the key of a named member. */
static int member(Walker *w, Json *j, int name) {
    if (j->depth) {
        Open *o = &j->open[j->depth - 1];
        if (!o->first && out_char(&j->out, ',') < 0)
            return -1;
        o->first = 0;
    }
    if (name >= 0) {
        PyObject *key = PyTuple_GET_ITEM(w->prog->keys, name);
        return out_write(&j->out, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key));
    }
    return 0;
}

/* Hand the text so far to `write` once there is enough; only between whole items (a record, a batch, a struct,
 * an array), never while an "_unknown_tags" object may still grow or an embedded schema be taken back. */
static int flush(Json *j) {
    /* After a failed write the walk still closes what it opened: nothing more goes to `write` then (it would
     * be called with its exception pending), and the exception is what the walk ends with. */
    if (PyErr_Occurred())
        return -1;
    if (j->write == NULL || j->out.len < j->flush_at || j->pending_inserts || j->tentative)
        return 0;
    PyObject *chunk = PyBytes_FromStringAndSize(j->out.data, j->out.len);
    if (chunk == NULL)
        return -1;
    PyObject *done = PyObject_CallOneArg(j->write, chunk);
    Py_DECREF(chunk);
    if (done == NULL)
        return -1;
    Py_DECREF(done);
    j->out.len = 0;
    return 0;
}

static int float_json(Out *o, double v) {
    PyObject *number = PyFloat_FromDouble(v);
    if (number == NULL)
        return -1;
    PyObject *text = PyObject_CallOneArg(hook(H_FLOAT_JSON), number);
    Py_DECREF(number);
    if (text == NULL)
        return -1;
    int failed = !PyBytes_Check(text) || out_write(o, PyBytes_AS_STRING(text), PyBytes_GET_SIZE(text)) < 0;
    if (failed && !PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "float_json must return bytes");
    Py_DECREF(text);
    return failed ? -1 : 0;
}

static int j_fixed(Walker *w, int name, Py_ssize_t index, int kind, int role, Py_ssize_t at, const uint8_t *p) {
    Json *j = w->state;
    Out *o = &j->out;
    if (member(w, j, name) < 0)
        return -1;
    switch (kind) {
    case K_BOOL:
        return p[0] ? OUT_LIT(o, "true") : OUT_LIT(o, "false");
    case K_FLOAT64: {
        uint64_t bits = (uint64_t)fixed_value(K_INT64, p);
        double v;
        memcpy(&v, &bits, 8);
        return float_json(o, v);
    }
    case K_UUID:
        return out_char(o, '"') < 0 || out_uuid(o, p) < 0 ? -1 : out_char(o, '"');
    default:
        return out_i64(o, fixed_value(kind, p));
    }
}

static int j_text(Walker *w, int name, Py_ssize_t index, int form, int role, Py_ssize_t at, Py_ssize_t size,
                  const uint8_t *p, Py_ssize_t n, int not_nullable) {
    Json *j = w->state;
    if (member(w, j, name) < 0)
        return -1;
    if (n < 0)
        return OUT_LIT(&j->out, "null");
    if (form == FORM_STRING)
        return out_json_string(&j->out, p, n);
    if (form == FORM_RECORDS)
        return OUT_LIT(&j->out, "[]"); /* only empty records come here */
    return out_json_bytes(&j->out, p, n);
}

static int j_array_begin(Walker *w, int name, int type, int role, Py_ssize_t at, int64_t count) {
    Json *j = w->state;
    if (member(w, j, name) < 0 || out_char(&j->out, '[') < 0)
        return -1;
    return push(j);
}

static int j_array_null(Walker *w, int name, int type, Py_ssize_t at, Py_ssize_t size, int not_nullable) {
    Json *j = w->state;
    return member(w, j, name) < 0 ? -1 : OUT_LIT(&j->out, "null");
}

static int j_array_end(Walker *w, Py_ssize_t end, int ok) { return pop(w->state, ']') < 0 ? -1 : flush(w->state); }

static int j_struct_begin(Walker *w, int name, Py_ssize_t index, int type, Py_ssize_t at) {
    Json *j = w->state;
    if (j->merge_root) {
        j->merge_root = 0;
        if (push(j) < 0)
            return -1;
        j->open[j->depth - 1].first = 0; /* "version" is in it already */
        return 0;
    }
    if ((j->depth && member(w, j, name) < 0) || out_char(&j->out, '{') < 0) /* the root has no key */
        return -1;
    return push(j);
}

static int j_struct_null(Walker *w, int name, int type, Py_ssize_t at) {
    Json *j = w->state;
    return member(w, j, name) < 0 ? -1 : OUT_LIT(&j->out, "null");
}

/* A struct's end: the text may go (so that a body of a million structs does not sit in memory as one string). */
static int j_struct_end(Walker *w, Py_ssize_t end, int ok) { return pop(w->state, '}') < 0 ? -1 : flush(w->state); }

static int j_tagged_begin(Walker *w, Py_ssize_t at) { return 0; }

/* Unknown tags gather in one "_unknown_tags" object, placed where the first one was met. */
static int j_tagged_unknown(Walker *w, uint64_t tag, Py_ssize_t at, Py_ssize_t size, const uint8_t *p) {
    Json *j = w->state;
    Open *o = &j->open[j->depth - 1];
    Out entry = {0};
    int failed = out_char(&entry, '"') < 0 || out_u64(&entry, tag) < 0 || OUT_LIT(&entry, "\":") < 0 ||
                 out_json_bytes(&entry, p, size) < 0;
    if (!failed && o->unknown_at < 0) {
        failed = member(w, j, INDEX_NAME) < 0 || OUT_LIT(&j->out, "\"_unknown_tags\":{") < 0 ||
                 out_write(&j->out, entry.data, entry.len) < 0 || out_char(&j->out, '}') < 0;
        o->unknown_at = j->out.len - 1;
        j->pending_inserts++;
    } else if (!failed) {
        Py_ssize_t move = j->out.len - o->unknown_at;
        failed = out_reserve(&j->out, entry.len + 1) < 0;
        if (!failed) {
            char *d = j->out.data + o->unknown_at;
            memmove(d + entry.len + 1, d, move);
            d[0] = ',';
            memcpy(d + 1, entry.data, entry.len);
            j->out.len += entry.len + 1;
            o->unknown_at += entry.len + 1;
        }
    }
    out_free(&entry);
    return failed ? -1 : 0;
}

static int j_tagged_end(Walker *w, Py_ssize_t end, uint64_t count, int ok) { return 0; }

/* --- records ----------------------------------------------------------------------------------- */

static int offset_json(Json *j, const Span *span, Py_ssize_t at) {
    return out_i64(&j->out, (int64_t)at + (span->detached ? 0 : j->prefix));
}

static int rs_malformed(Walker *w, void *st, const Span *span, Py_ssize_t start, Py_ssize_t end, Py_ssize_t at,
                        const char *reason) {
    Json *j = st;
    Out *o = &j->out;
    if (member(w, j, INDEX_NAME) < 0 || OUT_LIT(o, "{\"malformed\":{\"offset\":") < 0 || offset_json(j, span, at) < 0 ||
        OUT_LIT(o, ",\"reason\":") < 0 || out_json_string(o, (const uint8_t *)reason, (Py_ssize_t)strlen(reason)) < 0)
        return -1;
    return OUT_LIT(o, "}}");
}

static int rs_partial(Walker *w, void *st, const Span *span, Py_ssize_t start, Py_ssize_t end, int magic,
                      int64_t total) {
    Json *j = st;
    Out *o = &j->out;
    if (member(w, j, INDEX_NAME) < 0 || OUT_LIT(o, "{\"magic\":") < 0 ||
        (magic == NO_MAGIC ? OUT_LIT(o, "null") : out_i64(o, magic)) < 0 || OUT_LIT(o, ",\"bytes_present\":") < 0 ||
        out_i64(o, end - start) < 0 || OUT_LIT(o, ",\"bytes_total\":") < 0 ||
        (total < 0 ? OUT_LIT(o, "null") : out_i64(o, total)) < 0)
        return -1;
    return OUT_LIT(o, ",\"partial\":true}");
}

static int codec_json(Out *o, int codec) {
    const char *name = codec_text(codec);
    if (name != NULL)
        return out_char(o, '"') < 0 || out_write(o, name, (Py_ssize_t)strlen(name)) < 0 ? -1 : out_char(o, '"');
    return OUT_LIT(o, "\"unknown(") < 0 || out_i64(o, codec) < 0 ? -1 : OUT_LIT(o, ")\"");
}

/* The facts every record batch and legacy message has, in the README's order. */
static int facts_json(Out *o, int magic, int codec, uint32_t crc, uint32_t computed, int64_t record_count,
                      int64_t base_offset, int64_t producer_id, int transactional, int control) {
    return OUT_LIT(o, "{\"magic\":") < 0 || out_i64(o, magic) < 0 || OUT_LIT(o, ",\"codec\":") < 0 ||
                   codec_json(o, codec) < 0 || OUT_LIT(o, ",\"crc_valid\":") < 0 ||
                   (crc == computed ? OUT_LIT(o, "true") : OUT_LIT(o, "false")) < 0 ||
                   OUT_LIT(o, ",\"crc_computed\":") < 0 || out_u64(o, computed) < 0 ||
                   OUT_LIT(o, ",\"record_count\":") < 0 || out_i64(o, record_count) < 0 ||
                   OUT_LIT(o, ",\"base_offset\":") < 0 || out_i64(o, base_offset) < 0 ||
                   OUT_LIT(o, ",\"producer_id\":") < 0 || out_i64(o, producer_id) < 0 ||
                   OUT_LIT(o, ",\"is_transactional\":") < 0 ||
                   (transactional ? OUT_LIT(o, "true") : OUT_LIT(o, "false")) < 0 ||
                   OUT_LIT(o, ",\"is_control\":") < 0 || (control ? OUT_LIT(o, "true") : OUT_LIT(o, "false")) < 0
               ? -1
               : 0;
}

static int rs_batch_begin(Walker *w, void *st, const Span *span, const BatchHeader *h) {
    Json *j = st;
    if (j->legacy_depth)
        return 0; /* a record batch inside a legacy wrapper: not a message of it */
    j->has_problem = 0;
    if (member(w, j, INDEX_NAME) < 0 ||
        facts_json(&j->out, 2, h->attributes & 7, h->crc, h->crc_computed, h->record_count, h->base_offset,
                   h->producer_id, h->attributes & 0x10, h->attributes & 0x20) < 0 ||
        OUT_LIT(&j->out, ",\"records\":[") < 0)
        return -1;
    return push(j);
}

static int rs_batch_records(Walker *w, void *st, const Span *outer, const Span *records, Py_ssize_t at,
                            Py_ssize_t end, const char *problem, int too_large) {
    Json *j = st;
    if (problem != NULL && !j->legacy_depth) {
        snprintf(j->problem, sizeof j->problem, "%s", problem);
        j->has_problem = 1;
    }
    return 0;
}

static int header_pair(Json *j, const uint8_t *key, Py_ssize_t key_len, const uint8_t *value, Py_ssize_t value_len,
                       int first) {
    Out *o = &j->out;
    if ((!first && out_char(o, ',') < 0) || out_char(o, '[') < 0 || out_json_string(o, key, key_len) < 0 ||
        out_char(o, ',') < 0 || out_json_bytes(o, value, value_len) < 0)
        return -1;
    return out_char(o, ']');
}

static int rs_record(Walker *w, void *st, const Span *span, const BatchHeader *h, const RecordInfo *r) {
    Json *j = st;
    Out *o = &j->out;
    if (j->legacy_depth)
        return 0;
    if (member(w, j, INDEX_NAME) < 0 || OUT_LIT(o, "{\"offset\":") < 0 || out_i128(o, r->offset) < 0 ||
        OUT_LIT(o, ",\"timestamp\":") < 0 || out_i128(o, r->timestamp) < 0 || OUT_LIT(o, ",\"key\":") < 0 ||
        out_json_bytes(o, r->key, r->key_len) < 0 || OUT_LIT(o, ",\"value\":") < 0 ||
        out_json_bytes(o, r->value, r->value_len) < 0 || OUT_LIT(o, ",\"headers\":[") < 0)
        return -1;
    Py_ssize_t pos = r->headers_pos, key_at, value_at, key_len, value_len;
    const uint8_t *key, *value;
    for (int32_t i = 0; i < r->header_count; i++) {
        if (!record_header_next(span->b, &pos, r->end, &key_at, &key, &key_len, &value_at, &value, &value_len) ||
            header_pair(j, key, key_len, value, value_len, i == 0) < 0)
            return PyErr_Occurred() ? -1 : 0;
    }
    if (out_char(o, ']') < 0)
        return -1;
    if ((h->attributes & 0x20) && r->key != NULL) {
        int64_t type;
        int found = record_control_type(span->b, PY_SSIZE_T_MAX, r->key - span->b, r->key_len, &type);
        if (found < 0)
            return -1;
        if (found) {
            const char *name = control_type_name(type);
            if (OUT_LIT(o, ",\"control_type\":\"") < 0 || out_write(o, name, (Py_ssize_t)strlen(name)) < 0 ||
                out_char(o, '"') < 0)
                return -1;
        }
    }
    /* a batch can hold millions of records: the text goes out between them too */
    return out_char(o, '}') < 0 ? -1 : flush(j);
}

static int problem_note(Json *j) {
    if (!j->has_problem)
        return 0;
    j->has_problem = 0;
    return OUT_LIT(&j->out, ",\"note\":") < 0
               ? -1
               : out_json_string(&j->out, (const uint8_t *)j->problem, (Py_ssize_t)strlen(j->problem));
}

static int rs_batch_end(Walker *w, void *st, const BatchHeader *h, int64_t decoded) {
    Json *j = st;
    if (j->legacy_depth)
        return 0;
    if (pop(j, ']') < 0 || problem_note(j) < 0 || out_char(&j->out, '}') < 0)
        return -1;
    return j->depth == j->items_depth ? flush(j) : 0; /* between the items of a records field */
}

/* A legacy message's record: {"offset", "timestamp", "key", "value", "headers": []}. */
static int legacy_record(Walker *w, Json *j, const MessageInfo *m) {
    Out *o = &j->out;
    if (member(w, j, INDEX_NAME) < 0 || OUT_LIT(o, "{\"offset\":") < 0 || out_i64(o, m->absolute_offset) < 0 ||
        OUT_LIT(o, ",\"timestamp\":") < 0 || (m->has_timestamp ? out_i64(o, m->timestamp) : OUT_LIT(o, "null")) < 0 ||
        OUT_LIT(o, ",\"key\":") < 0 || out_json_bytes(o, m->key, m->key_len) < 0 || OUT_LIT(o, ",\"value\":") < 0 ||
        out_json_bytes(o, m->value, m->value_len) < 0)
        return -1;
    return OUT_LIT(o, ",\"headers\":[]}");
}

static int rs_message_begin(Walker *w, void *st, const Span *span, const MessageInfo *m) {
    Json *j = st;
    Out *o = &j->out;
    if (j->legacy_depth >= (int)sizeof j->legacy) {
        PyErr_SetString(PyExc_RecursionError, "json: legacy messages nested too deep");
        return -1;
    }
    if (j->legacy_depth && j->legacy[j->legacy_depth - 1] == 'w') {
        j->legacy[j->legacy_depth++] = 'i';
        return legacy_record(w, j, m);
    }
    int codec = m->attributes & 7, wrapper = codec && m->value != NULL && !m->value_note;
    j->legacy[j->legacy_depth++] = wrapper ? 'w' : 'm';
    j->has_problem = 0;
    if (member(w, j, INDEX_NAME) < 0 ||
        facts_json(o, m->magic, codec, m->crc, m->crc_computed, m->record_count, m->base_offset, -1, 0, 0) < 0 ||
        OUT_LIT(o, ",\"offset\":") < 0 || out_i64(o, m->absolute_offset) < 0 || OUT_LIT(o, ",\"timestamp\":") < 0 ||
        (m->has_timestamp ? out_i64(o, m->timestamp) : OUT_LIT(o, "null")) < 0 || OUT_LIT(o, ",\"records\":[") < 0 ||
        push(j) < 0)
        return -1;
    return wrapper ? 0 : legacy_record(w, j, m);
}

static int rs_wrapper(Walker *w, void *st, const Span *outer, const Span *inner, const MessageInfo *m,
                      const char *problem, int too_large) {
    Json *j = st;
    if (problem != NULL) {
        snprintf(j->problem, sizeof j->problem, "%s", problem);
        j->has_problem = 1;
    }
    return 0;
}

static int rs_message_end(Walker *w, void *st, const MessageInfo *m, int64_t records) {
    Json *j = st;
    char kind = j->legacy[--j->legacy_depth];
    if (kind == 'i')
        return 0;
    if (pop(j, ']') < 0 || problem_note(j) < 0 || out_char(&j->out, '}') < 0)
        return -1;
    return j->depth == j->items_depth ? flush(j) : 0;
}

static const RecordSink json_sink = {rs_malformed, rs_partial, rs_batch_begin, rs_batch_records, rs_record,
                                     rs_batch_end, rs_message_begin, rs_wrapper, rs_message_end};

static int j_records(Walker *w, int name, Py_ssize_t at, Py_ssize_t size, Py_ssize_t data_at, Py_ssize_t n) {
    Json *j = w->state;
    if (member(w, j, name) < 0 || out_char(&j->out, '[') < 0 || push(j) < 0)
        return -1;
    int outer_depth = j->items_depth = j->depth;
    if (records_read(w, &json_sink, j, data_at, data_at + n, 1, 1) < 0)
        return -1;
    if (j->depth != outer_depth) {
        PyErr_SetString(PyExc_SystemError, "json: records left open");
        return -1;
    }
    return pop(j, ']');
}

/* --- embedded schemas -------------------------------------------------------------------------- */

static int auth_json(Walker *w, Json *j, int name, const uint8_t *p, Py_ssize_t n) {
    if (j->ctx == NULL || j->ctx == Py_None)
        return 0;
    PyObject *bytes = PyBytes_FromStringAndSize((const char *)p, n);
    if (bytes == NULL)
        return -1;
    PyObject *text = PyObject_CallMethod(j->ctx, "auth_json", "O", bytes);
    Py_DECREF(bytes);
    if (text == NULL)
        return -1;
    int shown = 0;
    if (PyBytes_Check(text)) {
        shown = member(w, j, name) < 0 || out_write(&j->out, PyBytes_AS_STRING(text), PyBytes_GET_SIZE(text)) < 0
                    ? -1
                    : 1;
    }
    Py_DECREF(text);
    return shown;
}

/* The consumer protocol inside JoinGroup and SyncGroup bytes: an int16 version, then that schema. Shown as
 * an object when the schema reads the bytes exactly, or when the message says its protocol is "consumer" and
 * the schema reads them without a fault (bytes left over: a newer version's fields). Bytes the schema cannot
 * read are shown as they are: a partial object would hide where they went wrong. */
static int consumer_json(Walker *w, Json *j, int name, int role, Py_ssize_t data_at, Py_ssize_t n) {
    if (w->protocol_type == PT_OTHER || n < 2)
        return 0;
    int version = (int16_t)(w->b[data_at] << 8 | w->b[data_at + 1]);
    const Program *program =
        embedded_program(role == R_CONSUMER_SUBSCRIPTION ? E_SUBSCRIPTION : E_ASSIGNMENT, version);
    if (program == NULL)
        return PyErr_Occurred() ? -1 : 0;
    Py_ssize_t saved_len = j->out.len;
    char saved_first = j->depth ? j->open[j->depth - 1].first : 0;
    int saved_depth = j->depth;
    if (member(w, j, name) < 0 || OUT_LIT(&j->out, "{\"version\":") < 0 || out_i64(&j->out, version) < 0)
        return -1;
    Walker inner = *w;
    inner.failed = 0;
    j->merge_root = 1;
    j->tentative++;
    Py_ssize_t stop;
    walk_program(&inner, program, data_at + 2, data_at + n, &stop);
    j->tentative--;
    j->merge_root = 0;
    if (inner.failed == 2)
        return -1;
    int exact = !inner.failed && stop == data_at + n;
    if (exact || (!inner.failed && w->protocol_type == PT_CONSUMER))
        return 1;
    j->out.len = saved_len; /* not this schema after all: the bytes as they are */
    j->depth = saved_depth;
    if (j->depth)
        j->open[j->depth - 1].first = saved_first;
    return 0;
}

static int j_embedded(Walker *w, int name, int role, Py_ssize_t at, Py_ssize_t size, Py_ssize_t data_at,
                      Py_ssize_t n) {
    Json *j = w->state;
    int shown = role == R_AUTH_BYTES ? auth_json(w, j, name, w->b + data_at, n)
                                     : consumer_json(w, j, name, role, data_at, n);
    if (shown < 0)
        return -1;
    if (shown)
        return 0;
    return member(w, j, name) < 0 ? -1 : out_json_bytes(&j->out, w->b + data_at, n);
}

const Builder json_builder = {j_fixed, j_text, j_array_begin, j_array_null, j_array_end,
                              j_struct_begin, j_struct_null, j_struct_end, j_tagged_begin, j_tagged_unknown,
                              j_tagged_end, j_records, j_embedded};

/* json_body(program, buf, pos, end, ctx, write, flush_at, prefix, decompress_limit) -> bytes
 *
 * The body walked from pos as JSON. With `write`, text goes to write(bytes) in chunks of about flush_at bytes
 * as whole record batches complete, and the rest is returned. Malformed bytes end the text where the walk
 * stopped (every open list and object closed); the summary says where and why. */
PyObject *json_body(PyObject *self, PyObject *args) {
    PyObject *program, *ctx, *write;
    Py_buffer buf;
    Py_ssize_t pos, end, flush_at;
    int prefix;
    long long limit;
    if (!PyArg_ParseTuple(args, "O!y*nnOOniL:json_body", &ProgramType, &program, &buf, &pos, &end, &ctx, &write,
                          &flush_at, &prefix, &limit))
        return NULL;
    PyObject *result = NULL;
    Json j = {.write = write == Py_None ? NULL : write, .flush_at = flush_at, .ctx = ctx, .prefix = prefix};
    if (pos < 0 || end > buf.len || pos > end) {
        PyErr_SetString(PyExc_ValueError, "json_body: range outside the buffer");
        goto done;
    }
    Walker w = {.b = buf.buf, .buflen = buf.len, .bufobj = buf.obj, .builder = &json_builder, .state = &j,
                .decompress_budget = limit};
    /* a body's JSON is about three times its bytes (records in base64 and as text): room for it at once */
    Py_ssize_t guess = 3 * (end - pos) + 256;
    if (out_reserve(&j.out, guess < 2 * flush_at ? guess : 2 * flush_at) < 0)
        goto done;
    Py_ssize_t stop;
    walk_program(&w, (const Program *)program, pos, end, &stop);
    if (w.failed == 2)
        goto done;
    result = PyBytes_FromStringAndSize(j.out.data ? j.out.data : "", j.out.len);
done:
    out_free(&j.out);
    PyBuffer_Release(&buf);
    return result;
}

/* records_json(buf, pos, end, prefix, decompress_limit) -> bytes: a records field's bytes as its JSON list. */
PyObject *records_json(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t pos, end;
    int prefix;
    long long limit;
    if (!PyArg_ParseTuple(args, "y*nniL:records_json", &buf, &pos, &end, &prefix, &limit))
        return NULL;
    PyObject *result = NULL;
    Json j = {.prefix = prefix};
    if (pos < 0 || end > buf.len || pos > end) {
        PyErr_SetString(PyExc_ValueError, "records_json: range outside the buffer");
        goto done;
    }
    Walker w = {.b = buf.buf, .buflen = buf.len, .bufobj = buf.obj, .builder = &json_builder, .state = &j,
                .decompress_budget = limit};
    j.items_depth = 1;
    if (out_char(&j.out, '[') < 0 || push(&j) < 0 || records_read(&w, &json_sink, &j, pos, end, 1, 1) < 0 ||
        pop(&j, ']') < 0)
        goto done;
    result = PyBytes_FromStringAndSize(j.out.data, j.out.len);
done:
    out_free(&j.out);
    PyBuffer_Release(&buf);
    return result;
}
