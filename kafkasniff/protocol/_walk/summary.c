/* The summary builder: reads a whole message, keeps only what pairing, filters, statistics and the one-line
 * view need. No Field objects; records are counted from batch headers, never decoded.
 *
 * Kept: the header's correlation id and client id, Produce's acks, ThrottleTimeMs, the non-zero error codes
 * in wire order (each once), and topic mentions: one per topic (name, id) that a struct or array item names,
 * in the order a depth-first walk meets them, each with the data records and partitions found below them.
 * Also how implausible the reading looks (values no broker sends, illegal nulls, unknown tags), which ranks
 * the schemas that fit a response whose request was not captured.
 */
#include "walk.h"

/* Whether a broker would never send this fixed-width value where its role is: an error code Kafka does not define,
 * a negative throttle time, a node id or an offset below -1 (none), a port outside -1 (none) to 65535. 1 or 0; -1
 * with a Python error. (ReplicaId -2, a debugging consumer, is a request's: only responses are ranked.) */
static int fixed_implausible(int kind, int role, const uint8_t *p) {
    switch (role) {
    case R_ERROR_CODE: {
        int known = error_code_known(fixed_value(kind, p));
        return known < 0 ? -1 : !known;
    }
    case R_THROTTLE_TIME:
        return fixed_value(kind, p) < 0;
    case R_NODE_ID:
    case R_OFFSET:
        return fixed_value(kind, p) < -1;
    case R_PORT: {
        int64_t port = fixed_value(kind, p);
        return port < -1 || port > 65535;
    }
    }
    return 0;
}

/* Whether a string that names something (a topic, group, transactional id, host) holds a control character: 1 or 0.
 * The walk has checked it is UTF-8, whose multi-byte sequences hold no byte below 0x80. */
static int text_implausible(int form, int role, const uint8_t *p, Py_ssize_t n) {
    if (form != FORM_STRING || (role != R_TOPIC_NAME && role != R_NAME))
        return 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (p[i] < 0x20 || p[i] == 0x7f)
            return 1;
    return 0;
}

#define MAX_FRAMES 80

typedef struct {
    PyObject *mention;   /* [name, topic id, records, partitions] once the struct names a topic; borrowed */
    Py_ssize_t order;    /* where its mention goes: depth-first order */
    int64_t records;     /* data records found below, not yet given to a mention */
    PyObject *partitions; /* partition numbers found below, not yet given to a mention (a list, or NULL) */
} Frame;

typedef struct {
    Frame frames[MAX_FRAMES];
    int depth;
    PyObject *correlation_id, *client_id, *acks, *throttle;
    PyObject *errors, *mentions;
    PyObject *errors_seen; /* the codes in errors: each is kept once (readers show each name once) */
    PyObject *by_topic;  /* (name, topic id) -> its first mention: one mention a topic */
    int64_t batches, records;
    int suspicion;
} Summary;

#define ZERO_UUID "\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0"

static Frame *top(Summary *s) { return &s->frames[s->depth - 1]; }

static int set_value(PyObject **slot, PyObject *value) {
    if (value == NULL)
        return -1;
    Py_XSETREF(*slot, value);
    return 0;
}

static PyObject *new_mention(void) {
    PyObject *m = PyList_New(4);
    if (m == NULL)
        return NULL;
    PyList_SET_ITEM(m, 0, Py_NewRef(Py_None));
    PyList_SET_ITEM(m, 1, Py_NewRef(Py_None));
    PyList_SET_ITEM(m, 2, PyLong_FromLong(0));
    PyList_SET_ITEM(m, 3, PyList_New(0));
    if (PyList_GET_ITEM(m, 2) == NULL || PyList_GET_ITEM(m, 3) == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

/* The mention of the innermost struct, made (and put in depth-first order) on first use. */
static PyObject *frame_mention(Summary *s) {
    Frame *f = top(s);
    if (f->mention == NULL) {
        PyObject *m = new_mention();
        if (m == NULL)
            return NULL;
        int failed = PyList_Insert(s->mentions, f->order, m);
        Py_DECREF(m);
        if (failed)
            return NULL;
        f->mention = m;
    }
    return f->mention;
}

static PyObject *uuid_text(const uint8_t *p) {
    char text[37];
    static const char hex[] = "0123456789abcdef";
    int at = 0;
    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10)
            text[at++] = '-';
        text[at++] = hex[p[i] >> 4];
        text[at++] = hex[p[i] & 15];
    }
    return PyUnicode_FromStringAndSize(text, 36);
}

static int add_partition(Summary *s, int64_t partition) {
    Frame *f = top(s);
    if (f->partitions == NULL && (f->partitions = PyList_New(0)) == NULL)
        return -1;
    PyObject *value = PyLong_FromLongLong(partition);
    if (value == NULL)
        return -1;
    int failed = PyList_Append(f->partitions, value);
    Py_DECREF(value);
    return failed;
}

static int s_fixed(Walker *w, int name, Py_ssize_t index, int kind, int role, Py_ssize_t at, const uint8_t *p) {
    Summary *s = w->state;
    int implausible = fixed_implausible(kind, role, p);
    if (implausible < 0)
        return -1;
    s->suspicion += implausible;
    switch (role) {
    case R_NONE:
        return 0;
    case R_ERROR_CODE: {
        int64_t code = fixed_value(kind, p);
        if (!code)
            return 0;
        PyObject *value = PyLong_FromLongLong(code);
        if (value == NULL)
            return -1;
        int seen = PySet_Contains(s->errors_seen, value);
        int failed = seen < 0 || (!seen && (PyList_Append(s->errors, value) < 0 ||
                                            PySet_Add(s->errors_seen, value) < 0));
        Py_DECREF(value);
        return failed ? -1 : 0;
    }
    case R_TOPIC_ID:
        if (kind == K_UUID && memcmp(p, ZERO_UUID, 16) != 0) {
            PyObject *m = frame_mention(s);
            if (m == NULL)
                return -1;
            PyObject *id = uuid_text(p);
            if (id == NULL)
                return -1;
            Py_SETREF(PyList_GET_ITEM(m, 1), id);
        }
        return 0;
    case R_PARTITION:
        return add_partition(s, fixed_value(kind, p));
    case R_CORRELATION_ID:
        return set_value(&s->correlation_id, PyLong_FromLongLong(fixed_value(kind, p)));
    case R_ACKS:
        return set_value(&s->acks, PyLong_FromLongLong(fixed_value(kind, p)));
    case R_THROTTLE_TIME:
        return set_value(&s->throttle, PyLong_FromLongLong(fixed_value(kind, p)));
    }
    return 0;
}

static int s_text(Walker *w, int name, Py_ssize_t index, int form, int role, Py_ssize_t at, Py_ssize_t size,
                  const uint8_t *p, Py_ssize_t n, int not_nullable) {
    Summary *s = w->state;
    s->suspicion += not_nullable + text_implausible(form, role, p, n);
    if (role == R_CLIENT_ID)
        return set_value(&s->client_id, n < 0 ? Py_NewRef(Py_None) : PyUnicode_DecodeUTF8((const char *)p, n, NULL));
    if (role != R_TOPIC_NAME || form != FORM_STRING || n < 0)
        return 0;
    PyObject *topic = PyUnicode_DecodeUTF8((const char *)p, n, NULL);
    if (topic == NULL)
        return -1;
    if (name == INDEX_NAME) { /* an item of a list of topic names: a mention of its own, unless it was named */
        PyObject *key = PyTuple_Pack(2, topic, Py_None);
        PyObject *m = key == NULL ? NULL : new_mention();
        int failed = m == NULL;
        if (!failed) {
            PyObject *known = PyDict_GetItemWithError(s->by_topic, key);
            Py_SETREF(PyList_GET_ITEM(m, 0), Py_NewRef(topic));
            failed = known == NULL && (PyErr_Occurred() || PyList_Append(s->mentions, m) < 0 ||
                                       PyDict_SetItem(s->by_topic, key, m) < 0);
        }
        Py_XDECREF(m);
        Py_XDECREF(key);
        Py_DECREF(topic);
        return failed ? -1 : 0;
    }
    PyObject *m = frame_mention(s);
    if (m == NULL) {
        Py_DECREF(topic);
        return -1;
    }
    Py_SETREF(PyList_GET_ITEM(m, 0), topic);
    return 0;
}

static int s_array_begin(Walker *w, int name, int type, int role, Py_ssize_t at, int64_t count) { return 0; }

static int s_array_null(Walker *w, int name, int type, Py_ssize_t at, Py_ssize_t size, int not_nullable) {
    ((Summary *)w->state)->suspicion += not_nullable;
    return 0;
}

static int s_array_end(Walker *w, Py_ssize_t end, int ok) { return 0; }

static int s_struct_begin(Walker *w, int name, Py_ssize_t index, int type, Py_ssize_t at) {
    Summary *s = w->state;
    if (s->depth >= MAX_FRAMES) {
        PyErr_SetString(PyExc_RecursionError, "summary: structs nested too deep");
        return -1;
    }
    Frame *f = &s->frames[s->depth++];
    f->mention = NULL;
    f->order = PyList_GET_SIZE(s->mentions);
    f->records = 0;
    f->partitions = NULL;
    return 0;
}

/* A struct's mention of a topic mentioned before: what it found goes to the earlier mention, and it is taken
 * out of the list (near its end: the mentions after it are those of the structs inside it), so that a message
 * naming one topic a million times keeps one mention. Readers sum a topic's mentions (topics.py): the same. */
static int merge_mention(Summary *s, Frame *f) { /* 1: merged, 0: the first mention of its topic, -1: error */
    PyObject *m = f->mention;
    PyObject *key = PyTuple_Pack(2, PyList_GET_ITEM(m, 0), PyList_GET_ITEM(m, 1));
    if (key == NULL)
        return -1;
    PyObject *known = PyDict_GetItemWithError(s->by_topic, key);
    if (known == NULL) {
        int failed = PyErr_Occurred() || PyDict_SetItem(s->by_topic, key, m) < 0;
        Py_DECREF(key);
        return failed ? -1 : 0;  /* the first: the struct's findings go to it as usual */
    }
    Py_DECREF(key);
    if (f->records) {
        PyObject *records = PyLong_FromLongLong(PyLong_AsLongLong(PyList_GET_ITEM(known, 2)) + f->records);
        if (records == NULL)
            return -1;
        Py_SETREF(PyList_GET_ITEM(known, 2), records);
    }
    if (f->partitions != NULL && PyList_SetSlice(PyList_GET_ITEM(known, 3), PY_SSIZE_T_MAX, PY_SSIZE_T_MAX,
                                                 f->partitions) < 0)
        return -1;
    for (Py_ssize_t i = PyList_GET_SIZE(s->mentions) - 1; i >= 0; i--)
        if (PyList_GET_ITEM(s->mentions, i) == m)
            return PyList_SetSlice(s->mentions, i, i + 1, NULL) < 0 ? -1 : 1;
    return 1;
}

/* What a struct found below it goes to its mention, or up to the struct around it. */
static int s_struct_end(Walker *w, Py_ssize_t end, int ok) {
    Summary *s = w->state;
    Frame *f = top(s);
    int failed = 0;
    int merged = f->mention != NULL ? merge_mention(s, f) : 0;
    if (merged < 0) {
        failed = 1;
    } else if (f->mention != NULL && !merged) { /* merged: what it found went to the topic's first mention */
        if (f->records) {
            PyObject *records = PyLong_FromLongLong(f->records);
            if (records == NULL)
                failed = 1;
            else
                Py_SETREF(PyList_GET_ITEM(f->mention, 2), records);
        }
        if (!failed && f->partitions != NULL)
            Py_SETREF(PyList_GET_ITEM(f->mention, 3), Py_NewRef(f->partitions));
    } else if (f->mention == NULL && s->depth > 1) {
        Frame *up = &s->frames[s->depth - 2];
        up->records += f->records;
        if (f->partitions != NULL) {
            if (up->partitions == NULL)
                up->partitions = Py_NewRef(f->partitions);
            else
                failed = PyList_SetSlice(up->partitions, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, f->partitions) < 0;
        }
    }
    Py_CLEAR(f->partitions);
    s->depth--;
    return failed ? -1 : 0;
}

static int s_struct_null(Walker *w, int name, int type, Py_ssize_t at) { return 0; }

static int s_tagged_begin(Walker *w, Py_ssize_t at) { return 0; }

static int s_tagged_unknown(Walker *w, uint64_t tag, Py_ssize_t at, Py_ssize_t size, const uint8_t *p) {
    ((Summary *)w->state)->suspicion++;
    return 0;
}

static int s_tagged_end(Walker *w, Py_ssize_t end, uint64_t count, int ok) { return 0; }

/* Counting records: batch headers say how many; a legacy message is one, a wrapper holds several. */

static int c_malformed(Walker *w, void *st, const Span *span, Py_ssize_t a, Py_ssize_t b, Py_ssize_t c,
                       const char *d) { return 0; }
static int c_partial(Walker *w, void *st, const Span *span, Py_ssize_t a, Py_ssize_t b, int m, int64_t t) {
    return 0;
}
static int c_batch_begin(Walker *w, void *st, const Span *span, const BatchHeader *h) {
    Summary *s = st;
    s->batches++;
    if (!(h->attributes & 0x20) && h->record_count > 0) { /* control records are markers, not data */
        s->records += h->record_count;
        top(s)->records += h->record_count;
    }
    return 0;
}
static int c_batch_records(Walker *w, void *st, const Span *o, const Span *i, Py_ssize_t a, Py_ssize_t b,
                           const char *p, int t) { return 0; }
static int c_record(Walker *w, void *st, const Span *span, const BatchHeader *h, const RecordInfo *r) { return 0; }
static int c_batch_end(Walker *w, void *st, const BatchHeader *h, int64_t d) { return 0; }
static int c_message_begin(Walker *w, void *st, const Span *span, const MessageInfo *m) { return 0; }
static int c_wrapper(Walker *w, void *st, const Span *o, const Span *i, const MessageInfo *m, const char *p, int t) {
    return 0;
}
static int c_message_end(Walker *w, void *st, const MessageInfo *m, int64_t records) {
    Summary *s = st;
    s->batches++;
    s->records += records;
    top(s)->records += records;
    return 0;
}

static const RecordSink counter = {c_malformed, c_partial, c_batch_begin, c_batch_records, c_record,
                                   c_batch_end, c_message_begin, c_wrapper, c_message_end};

static int s_records(Walker *w, int name, Py_ssize_t at, Py_ssize_t size, Py_ssize_t data_at, Py_ssize_t n) {
    return records_read(w, &counter, w->state, data_at, data_at + n, 0, 1);
}

static int s_embedded(Walker *w, int name, int role, Py_ssize_t at, Py_ssize_t size, Py_ssize_t data_at,
                      Py_ssize_t n) { return 0; }

const Builder summary_builder = {s_fixed, s_text, s_array_begin, s_array_null, s_array_end,
                                 s_struct_begin, s_struct_null, s_struct_end, s_tagged_begin, s_tagged_unknown,
                                 s_tagged_end, s_records, s_embedded};

/* summarize(programs, buf, pos, end, decompress_limit) -> (stops, failure, correlation_id, client_id, acks,
 * throttle_time_ms, errors, mentions, batches, records, suspicion)
 *
 * programs: a tuple of Programs walked one after the other (a header, then its body). stops: where each
 * ended (-1: it failed or was not reached); failure is None or (offset, reason) where the walk stopped. */
PyObject *summarize(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    /* METH_FASTCALL, its arguments read here: it runs once per message, and parsing a format string cost
     * more than a small message's walk */
    if (nargs != 5 || !PyTuple_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "summarize(programs: tuple, buf, pos, end, decompress_limit)");
        return NULL;
    }
    PyObject *programs = args[0];
    Py_ssize_t pos = PyLong_AsSsize_t(args[2]), end = PyLong_AsSsize_t(args[3]);
    long long limit = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer buf;
    if (PyObject_GetBuffer(args[1], &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *result = NULL, *stops = NULL;
    Summary s = {0};
    s.errors = PyList_New(0);
    s.mentions = PyList_New(0);
    s.by_topic = PyDict_New();
    s.errors_seen = PySet_New(NULL);
    if (s.errors == NULL || s.mentions == NULL || s.by_topic == NULL || s.errors_seen == NULL)
        goto done;
    if (pos < 0 || end > buf.len || pos > end) {
        PyErr_SetString(PyExc_ValueError, "summarize: range outside the buffer");
        goto done;
    }
    Walker w = {.b = buf.buf, .buflen = buf.len, .bufobj = buf.obj, .builder = &summary_builder, .state = &s,
                .decompress_budget = limit};
    Py_ssize_t at = pos, count = PyTuple_GET_SIZE(programs);
    stops = PyTuple_New(count);
    if (stops == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *program = PyTuple_GET_ITEM(programs, i);
        if (!PyObject_TypeCheck(program, &ProgramType)) {
            PyErr_SetString(PyExc_TypeError, "summarize: programs must be Programs");
            goto done;
        }
        if (!w.failed)
            walk_program(&w, (const Program *)program, at, end, &at);
        PyObject *stop = PyLong_FromSsize_t(w.failed ? -1 : at);
        if (stop == NULL)
            goto done;
        PyTuple_SET_ITEM(stops, i, stop);
    }
    if (w.failed == 2)
        goto done;
    PyObject *failure = Py_None;
    if (w.failed)
        failure = Py_BuildValue("(ns)", w.fail_at, w.reason);
    else
        Py_INCREF(failure);
    if (failure == NULL)
        goto done;
    PyObject *batches = PyLong_FromLongLong(s.batches), *records = PyLong_FromLongLong(s.records),
             *suspicion = PyLong_FromLong(s.suspicion);
    if (batches && records && suspicion)
        result = PyTuple_Pack(11, stops, failure, s.correlation_id ? s.correlation_id : Py_None,
                              s.client_id ? s.client_id : Py_None, s.acks ? s.acks : Py_None,
                              s.throttle ? s.throttle : Py_None, s.errors, s.mentions, batches, records, suspicion);
    Py_DECREF(failure);
    Py_XDECREF(batches);
    Py_XDECREF(records);
    Py_XDECREF(suspicion);
done:
    for (int i = 0; i < s.depth; i++)
        Py_CLEAR(s.frames[i].partitions);
    Py_XDECREF(s.correlation_id);
    Py_XDECREF(s.client_id);
    Py_XDECREF(s.acks);
    Py_XDECREF(s.throttle);
    Py_XDECREF(s.errors);
    Py_XDECREF(s.mentions);
    Py_XDECREF(s.by_topic);
    Py_XDECREF(s.errors_seen);
    Py_XDECREF(stops);
    PyBuffer_Release(&buf);
    return result;
}

/* The screen: the summary's walk with nothing kept but how implausible the reading looks. It makes no
 * Python object, so trying every response schema on a frame whose request was not captured costs a walk
 * per schema and no more; only the schemas it ranks best are then summarized. Each walk is given a number of
 * steps (a step per field value, struct and unknown tag) so that the work per frame is bounded by the caller. */

typedef struct {
    int suspicion;
    int64_t steps, steps_allowed;
} Screen;

/* One more step; past those allowed, the walk stops (as a Python exception, which screen() takes back). */
static int step(Screen *s) {
    if (++s->steps <= s->steps_allowed)
        return 0;
    PyErr_SetNone(PyExc_StopIteration);
    return -1;
}

static int sc_fixed(Walker *w, int name, Py_ssize_t index, int kind, int role, Py_ssize_t at, const uint8_t *p) {
    Screen *s = w->state;
    if (step(s) < 0)
        return -1;
    int implausible = fixed_implausible(kind, role, p);
    if (implausible < 0)
        return -1;
    s->suspicion += implausible;
    return 0;
}

static int sc_text(Walker *w, int name, Py_ssize_t index, int form, int role, Py_ssize_t at, Py_ssize_t size,
                   const uint8_t *p, Py_ssize_t n, int not_nullable) {
    Screen *s = w->state;
    s->suspicion += not_nullable + text_implausible(form, role, p, n);
    return step(s);
}

static int sc_array_null(Walker *w, int name, int type, Py_ssize_t at, Py_ssize_t size, int not_nullable) {
    Screen *s = w->state;
    s->suspicion += not_nullable;
    return step(s);
}

static int sc_struct_begin(Walker *w, int name, Py_ssize_t index, int type, Py_ssize_t at) {
    return step(w->state);
}

static int sc_struct_end(Walker *w, Py_ssize_t end, int ok) { return 0; }

static int sc_tagged_unknown(Walker *w, uint64_t tag, Py_ssize_t at, Py_ssize_t size, const uint8_t *p) {
    Screen *s = w->state;
    s->suspicion++;
    return step(s);
}

/* Records are a bytes field to the walk: what they hold does not change where the body ends. */
static int sc_records(Walker *w, int name, Py_ssize_t at, Py_ssize_t size, Py_ssize_t data_at, Py_ssize_t n) {
    return step(w->state);
}

static const Builder screen_builder = {sc_fixed, sc_text, s_array_begin, sc_array_null, s_array_end,
                                       sc_struct_begin, s_struct_null, sc_struct_end, s_tagged_begin,
                                       sc_tagged_unknown, s_tagged_end, sc_records, s_embedded};

/* One schema's walk: its suspicion if the programs, walked one after the other, consume buf[pos:end] exactly, else
 * -1; *steps grows by the steps taken, and past steps_allowed the walk stops (-2). -3 with a Python exception. */
static int screen_one(PyObject *programs, Py_buffer *buf, Py_ssize_t pos, Py_ssize_t end, int64_t *steps,
                      int64_t steps_allowed) {
    if (!PyTuple_Check(programs)) {
        PyErr_SetString(PyExc_TypeError, "screen: each schema's programs must be a tuple");
        return -3;
    }
    Screen s = {.steps = *steps, .steps_allowed = steps_allowed};
    Walker w = {.b = buf->buf, .buflen = buf->len, .bufobj = buf->obj, .builder = &screen_builder, .state = &s};
    Py_ssize_t at = pos;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(programs) && !w.failed; i++) {
        PyObject *program = PyTuple_GET_ITEM(programs, i);
        if (!PyObject_TypeCheck(program, &ProgramType)) {
            PyErr_SetString(PyExc_TypeError, "screen: programs must be Programs");
            return -3;
        }
        walk_program(&w, (const Program *)program, at, end, &at);
    }
    *steps = s.steps;
    if (w.failed == 2) {
        if (s.steps <= s.steps_allowed || !PyErr_ExceptionMatches(PyExc_StopIteration))
            return -3;
        PyErr_Clear();
        return -2;
    }
    return !w.failed && at == end ? s.suspicion : -1;
}

/* screen(schemas, buf, pos, end, steps_allowed) -> (fits, tried): schemas is a sequence of program tuples (a
 * header's, then a body's), walked in order until they are all tried or steps_allowed steps are spent in all;
 * fits lists (index, suspicion) of those that consume buf[pos:end] exactly, tried how many were walked to
 * the end. */
PyObject *screen(PyObject *self, PyObject *args) {
    PyObject *schemas;
    Py_buffer buf;
    Py_ssize_t pos, end;
    long long steps_allowed;
    if (!PyArg_ParseTuple(args, "Oy*nnL:screen", &schemas, &buf, &pos, &end, &steps_allowed))
        return NULL;
    PyObject *result = NULL, *fits = NULL, *seq = NULL;
    if (pos < 0 || end > buf.len || pos > end) {
        PyErr_SetString(PyExc_ValueError, "screen: range outside the buffer");
        goto done;
    }
    if ((seq = PySequence_Fast(schemas, "screen: schemas must be a sequence")) == NULL ||
        (fits = PyList_New(0)) == NULL)
        goto done;
    int64_t steps = 0;
    Py_ssize_t tried = 0, count = PySequence_Fast_GET_SIZE(seq);
    for (; tried < count; tried++) {
        int found = screen_one(PySequence_Fast_GET_ITEM(seq, tried), &buf, pos, end, &steps, steps_allowed);
        if (found == -3)
            goto done;
        if (found == -2)
            break;
        if (found >= 0) {
            PyObject *fit = Py_BuildValue("(ni)", tried, found);
            if (fit == NULL || PyList_Append(fits, fit) < 0) {
                Py_XDECREF(fit);
                goto done;
            }
            Py_DECREF(fit);
        }
    }
    result = Py_BuildValue("(On)", fits, tried);
done:
    Py_XDECREF(fits);
    Py_XDECREF(seq);
    PyBuffer_Release(&buf);
    return result;
}
