/* The partitions builder: what a message says about each partition it names, without its records.
 *
 * For the analyses (lag, end-to-end latency) that need, per partition of a Produce, Fetch or ListOffsets
 * message, a handful of numbers: fetch offsets, high watermarks, base offsets, and where the record batches
 * start and how many records they hold. Records are never read: batch headers say what is needed.
 *
 *   partition_facts(program, buf, pos, end, decompress_limit, wanted) -> (root facts, topics, packed)
 *   wanted:    a tuple of fact names (its order numbers the slots of the packed facts); a fact is a fixed-width
 *              field by snake_case name (uuids and floats left out), or a field of a struct nested in its struct
 *              that is not an array item, named by path ("current_leader.leader_id"); a records field that is not
 *              empty gives its size in bytes, as "<name>_bytes" ("records_bytes"). Bools are 1 and 0.
 *   root facts: {name: int} of the root struct's wanted facts
 *   topics:    a tuple of (topic, topic id) pairs, which the partitions give by index
 *   packed:    bytes of native int64 words, a record per partition in wire order, nothing else made per partition:
 *                topic index, partition index,                                  (PACKED_HEAD_WORDS)
 *                mask words (bit i of word i / 64: slot i was found), a value per slot (0 when not found),
 *                batch count, then per batch: base offset, last offset delta, record count, is control,
 *                max timestamp ms                                               (PACKED_BATCH_WORDS)
 *              a legacy message is a batch of (its first offset, last - first, messages, 0, timestamp or -1),
 *              its spread held at the int64 range (wider only on hostile bytes)
 *
 * Packed, the facts of a Fetch response of many partitions cross a pipe and are read by compiled analyses
 * without a dict, tuple or int made per partition (on the benchmark they were half the objects a --stats run
 * marshalled).
 *
 * A partition struct is one with a partition field of its own; its topic name and id are its own or those of
 * the structs around it (the innermost wins), as in rows.c. Facts of array items that name no partition (topics,
 * aborted transactions) are left out. Partial and malformed record items give no batch. A walk that fails keeps
 * what it closed before the failure.
 */
#include "walk.h"

#define MAX_NEST 200
#define MAX_WANTED 4096 /* slots at most: a mask word per 64 */

typedef struct {
    int64_t *facts;      /* mask words then a value per slot (PyMem), or NULL until a fact is found */
    int64_t *batches;    /* PACKED_BATCH_WORDS per batch (PyMem), or NULL until a batch is found */
    Py_ssize_t batch_count, batch_room;
    PyObject *prefix;    /* "name." path of a nested struct inside its owner, or NULL */
    PyObject *topic, *topic_id; /* borrowed: kept alive by `held` */
    int64_t partition;   /* the struct's partition index, when has_partition */
    int has_partition;
    int element;         /* an array item */
} Frame;

typedef struct {
    PyObject *wanted;     /* the tuple of fact names (borrowed) */
    Py_ssize_t slots, mask_words;
    PyObject *root;       /* the root struct's facts, once it ends */
    int64_t *out;         /* the packed partitions (PyMem) */
    Py_ssize_t out_len, out_room;
    PyObject *topics;     /* list of (topic, topic id) pairs */
    PyObject *held;       /* keeps topic values alive */
    int depth;
    Frame frames[MAX_NEST]; /* each set when its struct begins: left unset before (11 KB zeroed per call was a
                               third of a call's work) */
} Facts;

/* Key bytes of the programs' fields -> snake_case str, made once for the process: they are the schemas'
 * field names, so it holds a few thousand at most. */
static PyObject *snake_names;
/* The slot of each name of the last `wanted` tuple (str -> int), made anew for another tuple. */
static PyObject *slots_for, *slot_of_name;

static Frame *top(Facts *f) { return &f->frames[f->depth - 1]; }

static void frame_clear(Frame *frame) {
    PyMem_Free(frame->facts);
    frame->facts = NULL;
    PyMem_Free(frame->batches);
    frame->batches = NULL;
    frame->batch_count = frame->batch_room = 0;
    Py_CLEAR(frame->prefix);
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

/* The key of a fact in its owner: the field's name after the struct's path. */
static PyObject *fact_key(Walker *w, Facts *f, int name) {
    PyObject *snake = snake_name(w, name);
    if (snake == NULL || top(f)->prefix == NULL)
        return snake;
    PyObject *key = PyUnicode_Concat(top(f)->prefix, snake);
    Py_DECREF(snake);
    return key;
}

/* The slot of the fact named `key` (reference taken), -1 when it is not wanted, -2 on a failure. */
static Py_ssize_t slot_of(PyObject *key) {
    if (key == NULL)
        return -2;
    PyObject *slot = PyDict_GetItemWithError(slot_of_name, key);
    Py_DECREF(key);
    if (slot == NULL)
        return PyErr_Occurred() ? -2 : -1;
    return PyLong_AsSsize_t(slot);
}

/* The slot of the fact a field outside nested structs gives (its own, or with `records`, its size's), -1 when it
 * is not wanted, -2 on a failure: from the program's memo (made anew for another tuple), as most fields a walk
 * reads are such, and few are wanted. */
static Py_ssize_t slot_unnested(Walker *w, Facts *f, int name, int records) {
    Program *prog = (Program *)w->prog; /* its memo only: the walk reads nothing of it */
    Py_ssize_t names = PyTuple_GET_SIZE(prog->keys);
    if (prog->facts_for != f->wanted) {
        int32_t *slots = PyMem_Realloc(prog->fact_slots, (names ? 2 * names : 1) * sizeof *slots);
        if (slots == NULL) {
            PyErr_NoMemory();
            return -2;
        }
        for (Py_ssize_t i = 0; i < 2 * names; i++)
            slots[i] = -2;
        prog->fact_slots = slots;
        Py_XSETREF(prog->facts_for, Py_NewRef(f->wanted));
    }
    int32_t *memo = &prog->fact_slots[records ? names + name : name];
    if (*memo == -2) {
        PyObject *snake = snake_name(w, name);
        Py_ssize_t slot = slot_of(records && snake ? PyUnicode_FromFormat("%U_bytes", snake) : Py_XNewRef(snake));
        Py_XDECREF(snake);
        if (slot == -2)
            return -2;
        *memo = (int32_t)slot;
    }
    return *memo;
}

/* The slot of the fact a field gives in the current struct (-1: not wanted, -2: a failure). */
static Py_ssize_t fact_slot(Walker *w, Facts *f, int name, int records) {
    if (top(f)->prefix == NULL)
        return slot_unnested(w, f, name, records);
    PyObject *key = fact_key(w, f, name);
    if (key != NULL && records)
        Py_SETREF(key, PyUnicode_FromFormat("%U_bytes", key));
    return slot_of(key);
}

/* Sets the fact of `slot` in the current struct. */
static int set_fact(Facts *f, Py_ssize_t slot, int64_t value) {
    Frame *frame = top(f);
    if (frame->facts == NULL) {
        frame->facts = PyMem_Calloc(f->mask_words + f->slots, sizeof(int64_t));
        if (frame->facts == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    frame->facts[slot / 64] |= (int64_t)((uint64_t)1 << (slot % 64));
    frame->facts[f->mask_words + slot] = value;
    return 0;
}

/* Keeps the fact a field gives, if it is wanted. */
static int add_fact(Walker *w, Facts *f, int name, int records, int64_t value) {
    Py_ssize_t slot = fact_slot(w, f, name, records);
    return slot == -2 ? -1 : slot == -1 ? 0 : set_fact(f, slot, value);
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

/* Room for `more` words at the end of the packed partitions. */
static int64_t *out_room(Facts *f, Py_ssize_t more) {
    if (more > PY_SSIZE_T_MAX / 16 - f->out_len) {
        PyErr_NoMemory();
        return NULL;
    }
    if (f->out_len + more > f->out_room) {
        Py_ssize_t room = Py_MAX(f->out_len + more, 2 * f->out_room);
        int64_t *out = PyMem_Realloc(f->out, room * sizeof *out);
        if (out == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        f->out = out;
        f->out_room = room;
    }
    int64_t *at = f->out + f->out_len;
    f->out_len += more;
    return at;
}

/* The index of a partition's (topic, topic id) in the topics list: the last pair again (partitions of a topic
 * come together), else a new one. */
static Py_ssize_t topic_index(Facts *f, Frame *frame) {
    Py_ssize_t n = PyList_GET_SIZE(f->topics);
    if (n) {
        PyObject *last = PyList_GET_ITEM(f->topics, n - 1);
        if (PyTuple_GET_ITEM(last, 0) == frame->topic && PyTuple_GET_ITEM(last, 1) == frame->topic_id)
            return n - 1;
    }
    PyObject *pair = PyTuple_Pack(2, frame->topic, frame->topic_id);
    int failed = pair == NULL || PyList_Append(f->topics, pair) < 0;
    Py_XDECREF(pair);
    return failed ? -1 : n;
}

/* Packs a partition struct that ends. */
static int pack_partition(Facts *f, Frame *frame) {
    Py_ssize_t topic = topic_index(f, frame);
    Py_ssize_t facts = f->mask_words + f->slots, batches = frame->batch_count * PACKED_BATCH_WORDS;
    int64_t *at = topic < 0 ? NULL : out_room(f, PACKED_HEAD_WORDS + facts + 1 + batches);
    if (at == NULL)
        return -1;
    at[0] = topic;
    at[1] = frame->partition;
    at += PACKED_HEAD_WORDS;
    if (frame->facts)
        memcpy(at, frame->facts, facts * sizeof *at);
    else
        memset(at, 0, facts * sizeof *at);
    at += facts;
    *at++ = frame->batch_count;
    if (batches)
        memcpy(at, frame->batches, batches * sizeof *at);
    return 0;
}

/* The root struct's facts as a dict. */
static PyObject *root_facts(Facts *f, Frame *frame) {
    PyObject *root = PyDict_New();
    for (Py_ssize_t slot = 0; root != NULL && frame->facts != NULL && slot < f->slots; slot++) {
        if (!((uint64_t)frame->facts[slot / 64] >> (slot % 64) & 1))
            continue;
        PyObject *value = PyLong_FromLongLong(frame->facts[f->mask_words + slot]);
        if (value == NULL || PyDict_SetItem(root, PyTuple_GET_ITEM(f->wanted, slot), value) < 0)
            Py_CLEAR(root);
        Py_XDECREF(value);
    }
    return root;
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
        frame->partition = fixed_value(kind, p);
        frame->has_partition = 1;
        return 0;
    }
    int64_t value = fixed_value(kind, p);
    return add_fact(w, f, name, 0, kind == K_BOOL ? value != 0 : value);
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

/* Room for `more` batches in a struct's list. */
static int64_t *batch_room(Frame *frame, Py_ssize_t more) {
    if (frame->batch_count + more > frame->batch_room) {
        if (more > PY_SSIZE_T_MAX / 16 / PACKED_BATCH_WORDS - frame->batch_count) {
            PyErr_NoMemory();
            return NULL;
        }
        Py_ssize_t room = Py_MAX(Py_MAX(frame->batch_count + more, 2 * frame->batch_room), 4);
        int64_t *batches = PyMem_Realloc(frame->batches, room * PACKED_BATCH_WORDS * sizeof *batches);
        if (batches == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        frame->batches = batches;
        frame->batch_room = room;
    }
    int64_t *at = frame->batches + frame->batch_count * PACKED_BATCH_WORDS;
    frame->batch_count += more;
    return at;
}

/* Moves what a nested struct found to the struct around it. */
static int merge_up(Facts *f, Frame *from, Frame *up) {
    if (from->facts != NULL) {
        if (up->facts == NULL) {
            up->facts = from->facts;
            from->facts = NULL;
        } else {
            for (Py_ssize_t slot = 0; slot < f->slots; slot++) {
                if ((uint64_t)from->facts[slot / 64] >> (slot % 64) & 1) {
                    up->facts[slot / 64] |= (int64_t)((uint64_t)1 << (slot % 64));
                    up->facts[f->mask_words + slot] = from->facts[f->mask_words + slot];
                }
            }
        }
    }
    if (from->batch_count) {
        int64_t *at = batch_room(up, from->batch_count);
        if (at == NULL)
            return -1;
        memcpy(at, from->batches, from->batch_count * PACKED_BATCH_WORDS * sizeof *at);
    }
    return 0;
}

static int p_struct_end(Walker *w, Py_ssize_t end, int ok) {
    Facts *f = w->state;
    Frame *frame = top(f);
    int failed = 0;
    if (PyErr_Occurred()) { /* a Python error inside: only close */
        failed = 1;
    } else if (frame->has_partition) {
        failed = pack_partition(f, frame) < 0;
    } else if (f->depth == 1) {
        Py_XSETREF(f->root, root_facts(f, frame));
        failed = f->root == NULL;
    } else if (!frame->element) {
        failed = merge_up(f, frame, &f->frames[f->depth - 2]) < 0;
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

static int add_batch(Facts *f, int64_t base_offset, int64_t last_offset_delta, int64_t records, int is_control,
                     int64_t max_timestamp) {
    int64_t *at = batch_room(top(f), 1);
    if (at == NULL)
        return -1;
    at[0] = base_offset;
    at[1] = last_offset_delta;
    at[2] = records;
    at[3] = is_control;
    at[4] = max_timestamp;
    return 0;
}

static int b_malformed(Walker *w, void *st, const Span *span, Py_ssize_t a, Py_ssize_t b, Py_ssize_t c,
                       const char *d) { return 0; }
static int b_partial(Walker *w, void *st, const Span *span, Py_ssize_t a, Py_ssize_t b, int m, int64_t t) {
    return 0;
}

static int b_batch_begin(Walker *w, void *st, const Span *span, const BatchHeader *h) {
    return add_batch(st, h->base_offset, h->last_offset_delta, h->record_count, (h->attributes & 0x20) != 0,
                     h->max_timestamp);
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
 * The spread from its first to its last offset is wider than an int64 only on hostile bytes: held at its range. */
static int b_message_end(Walker *w, void *st, const MessageInfo *m, int64_t messages) {
    i128 spread = (i128)m->absolute_offset - m->base_offset;
    return add_batch(st, m->base_offset, spread > INT64_MAX ? INT64_MAX : spread < INT64_MIN ? INT64_MIN : spread,
                     messages, 0, m->has_timestamp ? m->timestamp : -1);
}

static const RecordSink batch_sink = {b_malformed, b_partial, b_batch_begin, b_batch_records, b_record,
                                      b_batch_end, b_message_begin, b_wrapper, b_message_end};

static int p_records(Walker *w, int name, Py_ssize_t at, Py_ssize_t size, Py_ssize_t data_at, Py_ssize_t n) {
    Facts *f = w->state;
    if (!f->depth)
        return 0;
    if (add_fact(w, f, name, 1, n) < 0)
        return -1;
    return records_read(w, &batch_sink, f, data_at, data_at + n, 0, 1);
}

const Builder partitions_builder = {p_fixed, p_text, p_array_begin, p_array_null, p_array_end,
                                    p_struct_begin, p_struct_null, p_struct_end, p_tagged_begin, p_tagged_unknown,
                                    p_tagged_end, p_records, p_embedded};

/* Makes slot_of_name for another `wanted` tuple. */
static int learn_slots(PyObject *wanted) {
    if (wanted == slots_for)
        return 0;
    Py_ssize_t n = PyTuple_GET_SIZE(wanted);
    if (n > MAX_WANTED) {
        PyErr_Format(PyExc_ValueError, "partition_facts: at most %d facts can be wanted", MAX_WANTED);
        return -1;
    }
    PyObject *slots = PyDict_New();
    for (Py_ssize_t i = 0; slots != NULL && i < n; i++) {
        PyObject *name = PyTuple_GET_ITEM(wanted, i), *slot = PyLong_FromSsize_t(i);
        if (!PyUnicode_Check(name))
            PyErr_SetString(PyExc_TypeError, "partition_facts: wanted must be a tuple of names");
        if (slot == NULL || PyErr_Occurred() || PyDict_SetItem(slots, name, slot) < 0)
            Py_CLEAR(slots);
        Py_XDECREF(slot);
    }
    if (slots == NULL)
        return -1;
    Py_XSETREF(slot_of_name, slots);
    Py_XSETREF(slots_for, Py_NewRef(wanted));
    return 0;
}

/* partition_facts(program, buf, pos, end, decompress_limit, wanted) -> (root facts, topics, packed): see the top
 * of this file. */
PyObject *partition_facts(PyObject *self, PyObject *args) {
    PyObject *program;
    Py_buffer buf;
    Py_ssize_t pos, end;
    long long limit;
    PyObject *wanted;
    if (!PyArg_ParseTuple(args, "O!y*nnLO!:partition_facts", &ProgramType, &program, &buf, &pos, &end, &limit,
                          &PyTuple_Type, &wanted))
        return NULL;
    PyObject *result = NULL;
    Facts f;
    f.wanted = wanted;
    f.slots = PyTuple_GET_SIZE(wanted);
    f.mask_words = (f.slots + 63) / 64;
    f.root = NULL;
    f.out = NULL;
    f.out_len = f.out_room = 0;
    f.depth = 0;
    f.topics = PyList_New(0);
    f.held = PyList_New(0);
    if (snake_names == NULL)
        snake_names = PyDict_New();
    if (f.topics == NULL || f.held == NULL || snake_names == NULL || learn_slots(wanted) < 0)
        goto done;
    if (pos < 0 || end > buf.len || pos > end) {
        PyErr_SetString(PyExc_ValueError, "partition_facts: range outside the buffer");
        goto done;
    }
    Walker w = {.b = buf.buf, .buflen = buf.len, .bufobj = buf.obj, .builder = &partitions_builder, .state = &f,
                .decompress_budget = limit};
    Py_ssize_t stop;
    walk_program(&w, (const Program *)program, pos, end, &stop);
    if (w.failed != 2) {
        PyObject *topics = PyList_AsTuple(f.topics);
        PyObject *packed = PyBytes_FromStringAndSize((const char *)f.out, f.out_len * (Py_ssize_t)sizeof *f.out);
        if (topics != NULL && packed != NULL)
            result = PyTuple_Pack(3, f.root ? f.root : Py_None, topics, packed);
        Py_XDECREF(topics);
        Py_XDECREF(packed);
    }
done:
    for (int i = 0; i < f.depth; i++)
        frame_clear(&f.frames[i]);
    Py_XDECREF(f.root);
    PyMem_Free(f.out);
    Py_XDECREF(f.topics);
    Py_XDECREF(f.held);
    PyBuffer_Release(&buf);
    return result;
}
