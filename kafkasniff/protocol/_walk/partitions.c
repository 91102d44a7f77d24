/* The partitions builder: what a message says about each partition it names, without its records.
 *
 * For the analyses (lag, end-to-end latency) that need, per partition of a Produce, Fetch or ListOffsets
 * message, a handful of numbers: fetch offsets, high watermarks, base offsets, and where the record batches
 * start and how many records they hold. Records are never read: batch headers say what is needed.
 *
 *   partition_facts(program, buf, pos, end, decompress_limit, wanted) -> (root facts, [partition, ...])
 *   partition: (topic, topic id, partition index, facts, batches or None), in wire order
 *   facts:     {snake_case name: int or bool} of the struct's fixed-width fields (uuids and floats left out),
 *              and of the structs nested in it that are not array items, named by path ("current_leader.leader_id");
 *              a records field that is not empty adds its size in bytes, as "<name>_bytes" ("records_bytes");
 *              with `wanted` (a set of those names; None: all), only the facts it names
 *   batch:     (base offset, last offset delta, record count, is control, max timestamp ms); a legacy message
 *              is (its first offset, last - first, messages, False, timestamp or -1)
 *
 * A partition struct is one with a partition field of its own; its topic name and id are its own or those of
 * the structs around it (the innermost wins), as in rows.c. The root struct's facts come first. Facts of array
 * items that name no partition (topics, aborted transactions) are left out. Partial and malformed record items
 * give no batch. A walk that fails keeps what it closed before the failure.
 */
#include "walk.h"

#define MAX_NEST 200

typedef struct {
    PyObject *facts;     /* dict, or NULL until a fact is found */
    PyObject *prefix;    /* "name." path of a nested struct inside its owner, or NULL */
    PyObject *topic, *topic_id; /* borrowed: kept alive by `held` */
    PyObject *partition; /* the struct's partition index, or NULL */
    PyObject *batches;   /* list, or NULL until a batch is found */
    int element;         /* an array item */
} Frame;

typedef struct {
    PyObject *wanted;     /* the set of fact names to keep, or NULL for all (borrowed) */
    int memo;             /* wanted is a frozenset: the program's memo of it can be trusted (kept_unnested) */
    PyObject *root;       /* the root struct's facts, once it ends */
    PyObject *partitions; /* the result list */
    PyObject *held;       /* keeps topic values alive */
    int depth;
    Frame frames[MAX_NEST]; /* each set when its struct begins: left unset before (11 KB zeroed per call was a
                               third of a call's work) */
} Facts;

/* Key bytes of the programs' fields -> snake_case str, made once for the process: they are the schemas'
 * field names, so it holds a few thousand at most. */
static PyObject *snake_names;

static Frame *top(Facts *f) { return &f->frames[f->depth - 1]; }

static void frame_clear(Frame *frame) {
    Py_CLEAR(frame->facts);
    Py_CLEAR(frame->prefix);
    Py_CLEAR(frame->partition);
    Py_CLEAR(frame->batches);
}

/* The snake_case name of a field, from its JSON key '"name":' (program.py's keys). */
static PyObject *snake_name(Walker *w, int name) {
    PyObject *key = PyTuple_GET_ITEM(w->prog->keys, name);
    PyObject *found = PyDict_GetItemWithError(snake_names, key);
    if (found != NULL)
        return Py_NewRef(found);
    if (PyErr_Occurred())
        return NULL;
    Py_ssize_t n = PyBytes_GET_SIZE(key);
    const char *text = PyBytes_AS_STRING(key);
    PyObject *made = n >= 3 ? PyUnicode_DecodeUTF8(text + 1, n - 3, "replace")
                            : PyUnicode_DecodeUTF8(text, n, "replace");
    if (made == NULL || PyDict_SetItem(snake_names, key, made) < 0) {
        Py_XDECREF(made);
        return NULL;
    }
    return made;
}

/* The key of a fact in its owner's dict: the field's name after the struct's path. */
static PyObject *fact_key(Walker *w, Facts *f, int name) {
    PyObject *snake = snake_name(w, name);
    if (snake == NULL || top(f)->prefix == NULL)
        return snake;
    PyObject *key = PyUnicode_Concat(top(f)->prefix, snake);
    Py_DECREF(snake);
    return key;
}

/* Whether a fact named `key` is kept (1), left out (0), or -1 on a failure (key NULL: one already). */
static int wanted(Facts *f, PyObject *key) {
    if (key == NULL)
        return -1;
    return f->wanted == NULL ? 1 : PySet_Contains(f->wanted, key);
}

/* Sets facts[key] = value in the current struct (both references taken; either NULL: a failure). */
static int set_fact(Facts *f, PyObject *key, PyObject *value) {
    Frame *frame = top(f);
    if (key == NULL || value == NULL || (frame->facts == NULL && (frame->facts = PyDict_New()) == NULL)) {
        Py_XDECREF(key);
        Py_XDECREF(value);
        return -1;
    }
    int failed = PyDict_SetItem(frame->facts, key, value);
    Py_DECREF(key);
    Py_DECREF(value);
    return failed;
}

/* Whether `wanted` (a frozenset) keeps the fact of a field outside nested structs (1, 0, -1 on a failure), from
 * the program's memo (made anew for another set): most fields a walk reads are such, and few are kept. */
static int kept_unnested(Walker *w, Facts *f, int name) {
    Program *prog = (Program *)w->prog; /* its memo only: the walk reads nothing of it */
    if (prog->facts_for != f->wanted) {
        Py_ssize_t names = PyTuple_GET_SIZE(prog->keys);
        signed char *kept = PyMem_Realloc(prog->facts_kept, names ? names : 1);
        if (kept == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memset(kept, -1, names);
        prog->facts_kept = kept;
        Py_XSETREF(prog->facts_for, Py_NewRef(f->wanted));
    }
    if (prog->facts_kept[name] < 0) {
        PyObject *snake = snake_name(w, name);
        int keep = wanted(f, snake);
        Py_XDECREF(snake);
        if (keep < 0)
            return -1;
        prog->facts_kept[name] = (signed char)keep;
    }
    return prog->facts_kept[name];
}

/* Keeps the fact a fixed-width field gives, if it is wanted: its value is made only then. */
static int add_fact(Walker *w, Facts *f, int name, int kind, int64_t value) {
    PyObject *key;
    if (f->memo && top(f)->prefix == NULL) {
        int keep = kept_unnested(w, f, name);
        if (keep <= 0)
            return keep;
        key = snake_name(w, name);
    } else {
        key = fact_key(w, f, name);
        int keep = wanted(f, key);
        if (keep <= 0) {
            Py_XDECREF(key);
            return keep;
        }
    }
    return set_fact(f, key, kind == K_BOOL ? PyBool_FromLong(value != 0) : PyLong_FromLongLong(value));
}

static int keep(Facts *f, PyObject *value, PyObject **slot) {
    if (value == NULL || PyList_Append(f->held, value) < 0) {
        Py_XDECREF(value);
        return -1;
    }
    Py_DECREF(value);
    *slot = value;
    return 0;
}

#define ZERO_UUID "\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0"

static int p_fixed(Walker *w, int name, Py_ssize_t index, int kind, int role, Py_ssize_t at, const uint8_t *p) {
    Facts *f = w->state;
    if (name == INDEX_NAME || !f->depth)
        return 0; /* items of an array of numbers (partition lists of other messages): not facts */
    Frame *frame = top(f);
    if (kind == K_UUID) {
        if (role != R_TOPIC_ID || memcmp(p, ZERO_UUID, 16) == 0)
            return 0;
        char text[36];
        Out o = {text, 0, sizeof text};
        out_uuid(&o, p);
        return keep(f, PyUnicode_FromStringAndSize(text, 36), &frame->topic_id);
    }
    if (kind == K_FLOAT64)
        return 0;
    if (role == R_PARTITION && kind == K_INT32) {
        Py_XSETREF(frame->partition, PyLong_FromLongLong(fixed_value(kind, p)));
        return frame->partition == NULL ? -1 : 0;
    }
    return add_fact(w, f, name, kind, fixed_value(kind, p));
}

static int p_text(Walker *w, int name, Py_ssize_t index, int form, int role, Py_ssize_t at, Py_ssize_t size,
                  const uint8_t *p, Py_ssize_t n, int not_nullable) {
    Facts *f = w->state;
    if (role != R_TOPIC_NAME || form != FORM_STRING || name == INDEX_NAME || !f->depth || n < 0)
        return 0;
    return keep(f, PyUnicode_DecodeUTF8((const char *)p, n, NULL), &top(f)->topic);
}

static int p_array_begin(Walker *w, int name, int type, int role, Py_ssize_t at, int64_t count) { return 0; }
static int p_array_null(Walker *w, int name, int type, Py_ssize_t at, Py_ssize_t size, int not_nullable) { return 0; }
static int p_array_end(Walker *w, Py_ssize_t end, int ok) { return 0; }

static int p_struct_begin(Walker *w, int name, Py_ssize_t index, int type, Py_ssize_t at) {
    Facts *f = w->state;
    if (f->depth >= MAX_NEST) {
        PyErr_SetString(PyExc_RecursionError, "partition facts: structs nested too deep");
        return -1;
    }
    Frame *frame = &f->frames[f->depth];
    *frame = (Frame){.topic = Py_None, .topic_id = Py_None, .element = name == INDEX_NAME};
    if (f->depth) {
        Frame *up = top(f);
        frame->topic = up->topic;
        frame->topic_id = up->topic_id;
        if (!frame->element) { /* a struct field: its facts go to its owner under its path */
            PyObject *snake = snake_name(w, name);
            if (snake == NULL)
                return -1;
            frame->prefix = up->prefix ? PyUnicode_FromFormat("%U%U.", up->prefix, snake)
                                       : PyUnicode_FromFormat("%U.", snake);
            Py_DECREF(snake);
            if (frame->prefix == NULL)
                return -1;
        }
    }
    f->depth++;
    return 0;
}

static int p_struct_null(Walker *w, int name, int type, Py_ssize_t at) { return 0; }

/* Moves what a nested struct found to the struct around it. */
static int merge_up(Frame *from, Frame *up) {
    if (from->facts != NULL) {
        if (up->facts == NULL)
            up->facts = Py_NewRef(from->facts);
        else if (PyDict_Update(up->facts, from->facts) < 0)
            return -1;
    }
    if (from->batches != NULL) {
        if (up->batches == NULL)
            up->batches = Py_NewRef(from->batches);
        else if (PyList_SetSlice(up->batches, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, from->batches) < 0)
            return -1;
    }
    return 0;
}

static int p_struct_end(Walker *w, Py_ssize_t end, int ok) {
    Facts *f = w->state;
    Frame *frame = top(f);
    int failed = 0;
    if (PyErr_Occurred()) { /* a Python error inside: only close */
        failed = 1;
    } else if (frame->partition != NULL) {
        PyObject *facts = frame->facts ? Py_NewRef(frame->facts) : PyDict_New();
        PyObject *item = facts ? Py_BuildValue("(OOONO)", frame->topic, frame->topic_id, frame->partition, facts,
                                               frame->batches ? frame->batches : Py_None)
                               : NULL;
        failed = item == NULL || PyList_Append(f->partitions, item) < 0;
        Py_XDECREF(item);
    } else if (f->depth == 1) {
        Py_XSETREF(f->root, frame->facts ? Py_NewRef(frame->facts) : PyDict_New());
        failed = f->root == NULL;
    } else if (!frame->element) {
        failed = merge_up(frame, &f->frames[f->depth - 2]) < 0;
    }
    frame_clear(frame);
    f->depth--;
    return failed ? -1 : 0;
}

static int p_tagged_begin(Walker *w, Py_ssize_t at) { return 0; }
static int p_tagged_unknown(Walker *w, uint64_t tag, Py_ssize_t at, Py_ssize_t size, const uint8_t *p) { return 0; }
static int p_tagged_end(Walker *w, Py_ssize_t end, uint64_t count, int ok) { return 0; }
static int p_embedded(Walker *w, int name, int role, Py_ssize_t at, Py_ssize_t size, Py_ssize_t data_at,
                      Py_ssize_t n) { return 0; }

/* --- batches ------------------------------------------------------------------------------------ */

static int add_batch(Facts *f, PyObject *batch) {
    Frame *frame = top(f);
    if (batch == NULL || (frame->batches == NULL && (frame->batches = PyList_New(0)) == NULL)) {
        Py_XDECREF(batch);
        return -1;
    }
    int failed = PyList_Append(frame->batches, batch);
    Py_DECREF(batch);
    return failed;
}

static int b_malformed(Walker *w, void *st, const Span *span, Py_ssize_t a, Py_ssize_t b, Py_ssize_t c,
                       const char *d) { return 0; }
static int b_partial(Walker *w, void *st, const Span *span, Py_ssize_t a, Py_ssize_t b, int m, int64_t t) {
    return 0;
}

static int b_batch_begin(Walker *w, void *st, const Span *span, const BatchHeader *h) {
    return add_batch(st, Py_BuildValue("(LiiOL)", (long long)h->base_offset, h->last_offset_delta, h->record_count,
                                       h->attributes & 0x20 ? Py_True : Py_False, (long long)h->max_timestamp));
}

static int b_batch_records(Walker *w, void *st, const Span *o, const Span *i, Py_ssize_t a, Py_ssize_t b,
                           const char *p, int t) { return 0; }
static int b_record(Walker *w, void *st, const Span *span, const BatchHeader *h, const RecordInfo *r) { return 0; }
static int b_batch_end(Walker *w, void *st, const BatchHeader *h, int64_t d) { return 0; }
static int b_message_begin(Walker *w, void *st, const Span *span, const MessageInfo *m) { return 0; }
static int b_wrapper(Walker *w, void *st, const Span *o, const Span *i, const MessageInfo *m, const char *p, int t) {
    return 0;
}

/* A legacy message, or a compressed wrapper and the messages it holds (only headers are read: no inner calls).
 * The spread from its first to its last offset is wider than an int64 only on hostile bytes. */
static int b_message_end(Walker *w, void *st, const MessageInfo *m, int64_t messages) {
    i128 spread = (i128)m->absolute_offset - m->base_offset;
    PyObject *spread_value;
    if (spread >= INT64_MIN && spread <= INT64_MAX) {
        spread_value = PyLong_FromLongLong((long long)spread);
    } else {
        char text[48];
        format_i128(text, sizeof text, spread);
        spread_value = PyLong_FromString(text, NULL, 10);
    }
    return add_batch(st, spread_value ? Py_BuildValue("(LNLOL)", (long long)m->base_offset, spread_value,
                                                      (long long)messages, Py_False,
                                                      (long long)(m->has_timestamp ? m->timestamp : -1))
                                      : NULL);
}

static const RecordSink batch_sink = {b_malformed, b_partial, b_batch_begin, b_batch_records, b_record,
                                      b_batch_end, b_message_begin, b_wrapper, b_message_end};

static int p_records(Walker *w, int name, Py_ssize_t at, Py_ssize_t size, Py_ssize_t data_at, Py_ssize_t n) {
    Facts *f = w->state;
    if (!f->depth)
        return 0;
    PyObject *field = fact_key(w, f, name);
    PyObject *key = field ? PyUnicode_FromFormat("%U_bytes", field) : NULL;
    Py_XDECREF(field);
    int keep = wanted(f, key);
    if (keep <= 0)
        Py_XDECREF(key);
    if (keep < 0 || (keep && set_fact(f, key, PyLong_FromSsize_t(n)) < 0))
        return -1;
    return records_read(w, &batch_sink, f, data_at, data_at + n, 0, 1);
}

const Builder partitions_builder = {p_fixed, p_text, p_array_begin, p_array_null, p_array_end,
                                    p_struct_begin, p_struct_null, p_struct_end, p_tagged_begin, p_tagged_unknown,
                                    p_tagged_end, p_records, p_embedded};

/* partition_facts(program, buf, pos, end, decompress_limit, wanted=None) -> (root facts, partitions): see the top of
 * this file. */
PyObject *partition_facts(PyObject *self, PyObject *args) {
    PyObject *program;
    Py_buffer buf;
    Py_ssize_t pos, end;
    long long limit;
    PyObject *wanted_names = Py_None;
    if (!PyArg_ParseTuple(args, "O!y*nnL|O:partition_facts", &ProgramType, &program, &buf, &pos, &end, &limit,
                          &wanted_names))
        return NULL;
    PyObject *result = NULL;
    Facts f;
    f.wanted = wanted_names == Py_None ? NULL : wanted_names;
    f.memo = f.wanted != NULL && PyFrozenSet_Check(f.wanted);
    f.root = NULL;
    f.depth = 0;
    f.partitions = PyList_New(0);
    f.held = PyList_New(0);
    if (snake_names == NULL)
        snake_names = PyDict_New();
    if (f.partitions == NULL || f.held == NULL || snake_names == NULL)
        goto done;
    if (pos < 0 || end > buf.len || pos > end) {
        PyErr_SetString(PyExc_ValueError, "partition_facts: range outside the buffer");
        goto done;
    }
    if (f.wanted != NULL && !PyAnySet_Check(f.wanted)) {
        PyErr_SetString(PyExc_TypeError, "partition_facts: wanted must be a set or frozenset of names, or None");
        goto done;
    }
    Walker w = {.b = buf.buf, .buflen = buf.len, .bufobj = buf.obj, .builder = &partitions_builder, .state = &f,
                .decompress_budget = limit};
    Py_ssize_t stop;
    walk_program(&w, (const Program *)program, pos, end, &stop);
    if (w.failed != 2)
        result = Py_BuildValue("(OO)", f.root ? f.root : Py_None, f.partitions);
done:
    for (int i = 0; i < f.depth; i++)
        frame_clear(&f.frames[i]);
    Py_XDECREF(f.root);
    Py_XDECREF(f.partitions);
    Py_XDECREF(f.held);
    PyBuffer_Release(&buf);
    return result;
}
