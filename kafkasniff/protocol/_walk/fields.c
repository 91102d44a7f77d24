/* The Field builder: every item the walk reads becomes a Field (fields.py) with its offset and length, the
 * one model behind -V, --hex, explain and malformed reports. Records become the items records.py used to
 * describe: batches with their header fields and records, legacy messages, partial and malformed items.
 *
 * FieldBase is defined here so that Fields are made without calling Python: fields.py subclasses it with
 * the methods, and the walk allocates instances of that subclass and fills their slots.
 */
#include "walk.h"

#include <structmember.h>

#include "field.h"

static void field_dealloc(FieldObject *self) {
    Py_XDECREF(self->name);
    Py_XDECREF(self->type);
    Py_XDECREF(self->value);
    Py_XDECREF(self->children);
    Py_XDECREF(self->note);
    Py_XDECREF(self->role);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int field_init(FieldObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"name", "type", "offset", "length", "value", "children", "note", NULL};
    PyObject *name, *type, *value = Py_None, *children = Py_None, *note = Py_None;
    Py_ssize_t offset, length = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOn|nOOO:Field", kwlist, &name, &type, &offset, &length, &value,
                                     &children, &note))
        return -1;
    Py_XSETREF(self->name, Py_NewRef(name));
    Py_XSETREF(self->type, Py_NewRef(type));
    self->offset = offset;
    self->length = length;
    Py_XSETREF(self->value, Py_NewRef(value));
    Py_XSETREF(self->children, Py_NewRef(children));
    Py_XSETREF(self->note, Py_NewRef(note));
    Py_XSETREF(self->role, Py_NewRef(Py_None));
    return 0;
}

static PyMemberDef field_members[] = {
    {"name", T_OBJECT, offsetof(FieldObject, name), 0, "field name (array items: [i])"},
    {"type", T_OBJECT, offsetof(FieldObject, type), 0, "wire type as Kafka's schemas spell it, or a record kind"},
    {"offset", T_PYSSIZET, offsetof(FieldObject, offset), 0, "first byte, in the decoded buffer"},
    {"length", T_PYSSIZET, offsetof(FieldObject, length), 0, "bytes"},
    {"value", T_OBJECT, offsetof(FieldObject, value), 0, "decoded value of a leaf"},
    {"children", T_OBJECT, offsetof(FieldObject, children), 0, "list of Fields of a container, else None"},
    {"note", T_OBJECT, offsetof(FieldObject, note), 0, "a short annotation (error name, CRC verdict, ...)"},
    {"role", T_OBJECT, offsetof(FieldObject, role), 0, "what the schema field is for (program.ROLES), or None"},
    {NULL},
};

PyTypeObject FieldBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kafkasniff.protocol._walk.FieldBase",
    .tp_basicsize = sizeof(FieldObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Storage of a decoded wire item (see fields.Field).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)field_init,
    .tp_dealloc = (destructor)field_dealloc,
    .tp_members = field_members,
};

/* --- making Fields ------------------------------------------------------------------------------ */

static PyObject *text_of(const char *s) { return PyUnicode_InternFromString(s); }

/* Constant names and types, made once. */
enum {
    S_STRING, S_BYTES, S_RECORDS, S_TAGGED_FIELDS_NAME, S_TAGGED_FIELDS_TYPE, S_UNKNOWN_TAG, S_MALFORMED_NAME,
    S_MALFORMED_TYPE, S_PARTIAL_NAME, S_PARTIAL_TYPE, S_BATCH_NAME, S_BATCH_TYPE, S_RECORD_NAME, S_RECORD_TYPE,
    S_RECORD_LIST, S_DECOMPRESSED_RECORDS, S_DECOMPRESSED_MESSAGES, S_MESSAGES, S_MESSAGE_NAME, S_MESSAGE_TYPE,
    S_BITS, S_LENGTH, S_ATTRIBUTES, S_TIMESTAMP_DELTA, S_OFFSET_DELTA, S_KEY, S_VALUE, S_HEADERS, S_HEADER_LIST,
    S_HEADER_NAME, S_HEADER_TYPE, S_VARINT, S_VARLONG, S_CODEC, S_TIMESTAMP_TYPE, S_IS_TRANSACTIONAL,
    S_IS_CONTROL, S_HAS_DELETE_HORIZON, S_VERSION, S_CONTROL_KEY, S_CONTROL_VALUE, S_TOKEN, S_NOT_NULLABLE,
    S_UNSHOWN_NAME, S_UNSHOWN_TYPE, S_ITEMS_UNSHOWN_NAME, S_ITEMS_UNSHOWN_TYPE, S_COUNT
};
static const char *const constant_texts[S_COUNT] = {
    "string", "bytes", "records", "_tagged_fields", "tagged_fields", "unknown_tag", "malformed", "Malformed",
    "partial_batch", "PartialBatch", "record_batch", "RecordBatch", "record", "Record", "[]Record",
    "[]DecompressedRecord", "[]DecompressedMessage", "messages", "message", "Message", "bits", "length",
    "attributes", "timestamp_delta", "offset_delta", "key", "value", "headers", "[]Header", "header", "Header",
    "varint", "varlong", "codec", "timestamp_type", "is_transactional", "is_control", "has_delete_horizon",
    "Version", "ControlRecordKey", "ControlRecordValue", "sasl_token", "not nullable at this version",
    "records_not_shown", "RecordsNotShown", "items_not_shown", "ItemsNotShown"};
static PyObject *constants[S_COUNT];
static PyObject *kind_names[K_COUNT];
static PyObject *role_names[R_COUNT];
#define INDEX_NAMES 4096
static PyObject *index_names[INDEX_NAMES];

static int constants_ready(void) {
    if (constants[0] != NULL)
        return 0;
    for (int i = 0; i < S_COUNT; i++)
        if ((constants[i] = text_of(constant_texts[i])) == NULL)
            return -1;
    for (int i = 0; i < K_COUNT; i++)
        if ((kind_names[i] = text_of(kind_text[i])) == NULL)
            return -1;
    for (int i = 1; i < R_COUNT; i++)
        if ((role_names[i] = text_of(role_text[i])) == NULL)
            return -1;
    return 0;
}

static PyObject *index_name(Py_ssize_t i) {
    if (i < INDEX_NAMES) {
        if (index_names[i] == NULL && (index_names[i] = PyUnicode_FromFormat("[%zd]", i)) == NULL)
            return NULL;
        return Py_NewRef(index_names[i]);
    }
    return PyUnicode_FromFormat("[%zd]", i);
}

/* A new Field; takes the references to value, children and note (any may be NULL: None). */
static PyObject *make(PyObject *name, PyObject *type, Py_ssize_t offset, Py_ssize_t length, PyObject *value,
                      PyObject *children, PyObject *note) {
    PyTypeObject *field_type = (PyTypeObject *)hook(H_FIELD_TYPE);
    FieldObject *f = (FieldObject *)field_type->tp_alloc(field_type, 0);
    if (f == NULL) {
        Py_XDECREF(value);
        Py_XDECREF(children);
        Py_XDECREF(note);
        return NULL;
    }
    f->name = Py_NewRef(name);
    f->type = Py_NewRef(type);
    f->offset = offset;
    f->length = length;
    f->value = value ? value : Py_NewRef(Py_None);
    f->children = children ? children : Py_NewRef(Py_None);
    f->note = note ? note : Py_NewRef(Py_None);
    f->role = Py_NewRef(Py_None);
    return (PyObject *)f;
}

/* make() for a name that is a new reference (an index name), consumed */
static PyObject *make_named(PyObject *name, PyObject *type, Py_ssize_t offset, Py_ssize_t length, PyObject *value,
                            PyObject *children, PyObject *note) {
    if (name == NULL) {
        Py_XDECREF(value);
        Py_XDECREF(children);
        Py_XDECREF(note);
        return NULL;
    }
    PyObject *f = make(name, type, offset, length, value, children, note);
    Py_DECREF(name);
    return f;
}

static int append(PyObject *list, PyObject *item) {
    if (item == NULL)
        return -1;
    int failed = PyList_Append(list, item);
    Py_DECREF(item);
    return failed;
}

static PyObject *int_value(i128 v) {
    if (v >= INT64_MIN && v <= INT64_MAX)
        return PyLong_FromLongLong((long long)v);
    char text[48];
    format_i128(text, sizeof text, v);
    return PyLong_FromString(text, NULL, 10);
}

static PyObject *bytes_or_none(const uint8_t *p, Py_ssize_t n) {
    return n < 0 ? Py_NewRef(Py_None) : PyBytes_FromStringAndSize((const char *)p, n);
}

/* --- the builder's state ----------------------------------------------------------------------- */

#define MAX_NEST 200

typedef struct {
    PyObject *field;     /* borrowed: the list below holds it, or it is the root */
    PyObject *children;  /* borrowed from field */
    int limited;         /* its children are the items of an array or the fields of a tagged section: past the
                            record limit, they are not made */
} Level;

typedef struct {
    Level levels[MAX_NEST];
    int depth;
    PyObject *root;      /* owned */
    PyObject *ctx;
    /* records */
    PyObject *records_field;    /* borrowed: the open batch's records Field */
    int records_problem;        /* that Field's note says why there are no records */
    int64_t record_limit;       /* records made as Fields per walk (0: no limit); the rest are counted */
    int64_t records_made;
    struct {                    /* records past the limit, in the open records list */
        int open;
        Py_ssize_t start, end;
        int64_t count;
    } unshown;
    int skipped_messages;       /* open legacy messages past the limit, not made */
    int skipping_batch;         /* the open batch is past the limit: not made */
    int64_t made;               /* schema items made (records apart): past TREE_FIELDS_MAX, no more items */
    struct {                    /* items of an array past the limit (the record limit too), not made */
        int open;
        int level;              /* the depth of their array */
        int depth;              /* > 0 inside one of them: containers open in it */
        int past_tree_limit;    /* opened by TREE_FIELDS_MAX, not by the array's own count */
        Py_ssize_t start;
        int64_t count;
    } hidden;
} Fields;

static Level *current(Fields *s) { return &s->levels[s->depth - 1]; }

static int push(Fields *s, PyObject *field) {
    if (s->depth >= MAX_NEST) {
        PyErr_SetString(PyExc_RecursionError, "fields: nested too deep");
        return -1;
    }
    s->levels[s->depth].field = field;
    s->levels[s->depth].children = ((FieldObject *)field)->children;
    s->levels[s->depth].limited = 0;
    s->depth++;
    return 0;
}

/* Add a new Field to the open container (or make it the root); with `open`, it becomes the open one. */
static int add(Fields *s, PyObject *field, int open) {
    if (field == NULL)
        return -1;
    if (s->depth == 0) {
        Py_XSETREF(s->root, field);
    } else {
        int failed = PyList_Append(current(s)->children, field);
        Py_DECREF(field);
        if (failed)
            return -1;
    }
    return open ? push(s, field) : 0;
}

/* add() for a leaf, which knows its role */
static int add_role(Fields *s, PyObject *field, int role) {
    if (field != NULL && role != R_NONE)
        Py_XSETREF(((FieldObject *)field)->role, Py_NewRef(role_names[role]));
    return add(s, field, 0);
}

static PyObject *name_of(Walker *w, int name, Py_ssize_t index) {
    return name >= 0 ? Py_NewRef(PyTuple_GET_ITEM(w->prog->names, name)) : index_name(index);
}

/* --- schema items ------------------------------------------------------------------------------ */

static int f_fixed(Walker *w, int name, Py_ssize_t index, int kind, int role, Py_ssize_t at, const uint8_t *p) {
    Fields *s = w->state;
    PyObject *value, *note = NULL;
    if (kind == K_BOOL) {
        value = PyBool_FromLong(p[0]);
    } else if (kind == K_FLOAT64) {
        uint64_t bits = (uint64_t)fixed_value(K_INT64, p);
        double v;
        memcpy(&v, &bits, 8);
        value = PyFloat_FromDouble(v);
    } else if (kind == K_UUID) {
        char text[37];
        static const char hex[] = "0123456789abcdef";
        int at_text = 0;
        for (int i = 0; i < 16; i++) {
            if (i == 4 || i == 6 || i == 8 || i == 10)
                text[at_text++] = '-';
            text[at_text++] = hex[p[i] >> 4];
            text[at_text++] = hex[p[i] & 15];
        }
        value = PyUnicode_FromStringAndSize(text, 36);
    } else {
        int64_t v = fixed_value(kind, p);
        value = PyLong_FromLongLong(v);
        if (role == R_ERROR_CODE && (note = error_name_of(v)) == NULL) {
            Py_XDECREF(value);
            return -1;
        }
        if (role == R_CONTROL_TYPE && (note = text_of(control_type_name(v))) == NULL) {
            Py_XDECREF(value);
            return -1;
        }
    }
    if (value == NULL) {
        Py_XDECREF(note);
        return -1;
    }
    return add_role(s, make_named(name_of(w, name, index), kind_names[kind], at, kind_size[kind], value, NULL, note),
                    role);
}

static int f_text(Walker *w, int name, Py_ssize_t index, int form, int role, Py_ssize_t at, Py_ssize_t size,
                  const uint8_t *p, Py_ssize_t n, int not_nullable) {
    Fields *s = w->state;
    PyObject *value;
    if (n < 0)
        value = Py_NewRef(Py_None);
    else if (form == FORM_STRING)
        value = PyUnicode_DecodeUTF8((const char *)p, n, NULL);
    else
        value = PyBytes_FromStringAndSize((const char *)p, n);
    if (value == NULL)
        return -1;
    PyObject *type = constants[form == FORM_STRING ? S_STRING : form == FORM_BYTES ? S_BYTES : S_RECORDS];
    PyObject *note = not_nullable ? Py_NewRef(constants[S_NOT_NULLABLE]) : NULL;
    return add_role(s, make_named(name_of(w, name, index), type, at, size, value, NULL, note), role);
}

static PyObject *type_of(Walker *w, int type) { return PyTuple_GET_ITEM(w->prog->names, type); }

static int f_array_begin(Walker *w, int name, int type, int role, Py_ssize_t at, int64_t count) {
    PyObject *items = PyList_New(0), *value = PyLong_FromLongLong(count);
    if (items == NULL || value == NULL) {
        Py_XDECREF(items);
        Py_XDECREF(value);
        return -1;
    }
    return add(w->state, make_named(name_of(w, name, 0), type_of(w, type), at, 0, value, items, NULL), 1);
}

static int f_array_null(Walker *w, int name, int type, Py_ssize_t at, Py_ssize_t size, int not_nullable) {
    PyObject *note = not_nullable ? Py_NewRef(constants[S_NOT_NULLABLE]) : NULL;
    return add(w->state, make_named(name_of(w, name, 0), type_of(w, type), at, size, NULL, NULL, note), 0);
}

static int close_level(Fields *s, Py_ssize_t end) {
    FieldObject *f = (FieldObject *)current(s)->field;
    f->length = end - f->offset;
    s->depth--;
    return 0;
}

static int f_end(Walker *w, Py_ssize_t end, int ok) { return close_level(w->state, end); }

static int f_struct_begin(Walker *w, int name, Py_ssize_t index, int type, Py_ssize_t at) {
    PyObject *kids = PyList_New(0);
    if (kids == NULL)
        return -1;
    return add(w->state, make_named(name_of(w, name, index), type_of(w, type), at, 0, NULL, kids, NULL), 1);
}

static int f_struct_null(Walker *w, int name, int type, Py_ssize_t at) {
    return add(w->state, make_named(name_of(w, name, 0), type_of(w, type), at, 1, NULL, NULL, NULL), 0);
}

static int f_tagged_begin(Walker *w, Py_ssize_t at) {
    PyObject *kids = PyList_New(0);
    if (kids == NULL)
        return -1;
    return add(w->state, make(constants[S_TAGGED_FIELDS_NAME], constants[S_TAGGED_FIELDS_TYPE], at, 0, NULL, kids,
                              NULL),
               1);
}

static int f_tagged_unknown(Walker *w, uint64_t tag, Py_ssize_t at, Py_ssize_t size, const uint8_t *p) {
    PyObject *name = PyUnicode_FromFormat("tag_%llu", (unsigned long long)tag);
    PyObject *note = PyUnicode_FromFormat("unknown tag %llu", (unsigned long long)tag);
    PyObject *value = PyBytes_FromStringAndSize((const char *)p, size);
    if (note == NULL || value == NULL) {
        Py_XDECREF(name);
        Py_XDECREF(note);
        Py_XDECREF(value);
        return -1;
    }
    return add(w->state, make_named(name, constants[S_UNKNOWN_TAG], at, size, value, NULL, note), 0);
}

static int f_tagged_end(Walker *w, Py_ssize_t end, uint64_t count, int ok) {
    Fields *s = w->state;
    FieldObject *f = (FieldObject *)current(s)->field;
    if (ok) {
        PyObject *value = PyLong_FromUnsignedLongLong(count);
        if (value == NULL)
            return -1;
        Py_SETREF(f->value, value);
    }
    return close_level(s, end);
}

/* --- records ----------------------------------------------------------------------------------- */

static PyObject *dict_of(const char *const *keys, PyObject **values, int n) {
    PyObject *d = PyDict_New();
    for (int i = 0; i < n && d != NULL; i++) {
        if (values[i] == NULL || PyDict_SetItemString(d, keys[i], values[i]) < 0)
            Py_CLEAR(d);
    }
    for (int i = 0; i < n; i++)
        Py_XDECREF(values[i]);
    return d;
}

/* The fixed header fields that lie wholly before `end`. */
static PyObject *header_fields(const uint8_t *b, Py_ssize_t pos, Py_ssize_t end, const HeaderLayout *layout) {
    PyObject *list = PyList_New(0);
    for (const HeaderLayout *h = layout; h->name != NULL && list != NULL; h++) {
        Py_ssize_t at = pos + h->at;
        if (at + h->size > end)
            break;
        PyObject *name = text_of(h->name), *type = text_of(h->type);
        PyObject *f = name && type ? make(name, type, at, h->size, PyLong_FromLongLong(header_value(b + at, h)), NULL,
                                          NULL)
                                   : NULL;
        if (f != NULL && h->role != R_NONE)
            Py_XSETREF(((FieldObject *)f)->role, Py_NewRef(role_names[h->role]));
        Py_XDECREF(name);
        Py_XDECREF(type);
        if (append(list, f) < 0)
            Py_CLEAR(list);
    }
    return list;
}

static PyObject *crc_note(uint32_t stored, uint32_t computed) {
    if (stored == computed)
        return text_of("valid");
    char text[40];
    snprintf(text, sizeof text, "INVALID (computed 0x%08x)", computed);
    return PyUnicode_FromString(text);
}

static PyObject *codec_name_object(int codec) {
    const char *name = codec_text(codec);
    return name ? text_of(name) : PyUnicode_FromFormat("unknown(%d)", codec);
}

/* The i-th of a list of header fields (header_fields made them all: the item is long enough). */
static PyObject *child_at(PyObject *list, Py_ssize_t i) { return PyList_GET_ITEM(list, i); }

static int set_note(PyObject *field, PyObject *note) {
    if (note == NULL)
        return -1;
    Py_SETREF(((FieldObject *)field)->note, note);
    return 0;
}

static int set_children(PyObject *field, PyObject *children) {
    if (children == NULL)
        return -1;
    Py_SETREF(((FieldObject *)field)->children, children);
    return 0;
}

static PyObject *bits(const char *name, Py_ssize_t at, int size, PyObject *value, PyObject *note) {
    PyObject *n = text_of(name);
    return make_named(n, constants[S_BITS], at, size, value, NULL, note);
}

static PyObject *malformed_value(Py_ssize_t at, const char *reason) {
    return PyObject_CallFunction(hook(H_MALFORMED_TYPE), "ns", at, reason);
}

/* Past the record limit, records (and what lies between them) are counted into one item, not made. */
static int over_limit(Fields *s) { return s->record_limit && s->records_made >= s->record_limit; }

static void unshown_add(Fields *s, Py_ssize_t start, Py_ssize_t end, int64_t count) {
    if (!s->unshown.open) {
        s->unshown.open = 1;
        s->unshown.start = start;
        s->unshown.count = 0;
    }
    s->unshown.end = end;
    s->unshown.count += count;
}

static int unshown_flush(Fields *s) {
    if (!s->unshown.open)
        return 0;
    s->unshown.open = 0;
    PyObject *note = PyUnicode_FromFormat("%lld more records in %zd bytes, past the %lld this view makes; --json shows "
                                          "them all", (long long)s->unshown.count,
                                          s->unshown.end - s->unshown.start, (long long)s->record_limit);
    if (note == NULL)
        return -1;
    return add(s, make(constants[S_UNSHOWN_NAME], constants[S_UNSHOWN_TYPE], s->unshown.start,
                       s->unshown.end - s->unshown.start, PyLong_FromLongLong(s->unshown.count), NULL, note),
               0);
}

static int rf_malformed(Walker *w, void *st, const Span *span, Py_ssize_t start, Py_ssize_t end, Py_ssize_t at,
                        const char *reason) {
    Fields *s = st;
    if (s->skipping_batch)
        return 0;
    if (over_limit(s)) {
        unshown_add(s, start, end, 0);
        return 0;
    }
    PyObject *note = PyUnicode_FromFormat("offset %zd: %s", at, reason);
    PyObject *value = malformed_value(at, reason);
    if (note == NULL || value == NULL) {
        Py_XDECREF(note);
        Py_XDECREF(value);
        return -1;
    }
    return add(st, make(constants[S_MALFORMED_NAME], constants[S_MALFORMED_TYPE], start, end - start, value, NULL,
                        note),
               0);
}

static int rf_partial(Walker *w, void *st, const Span *span, Py_ssize_t start, Py_ssize_t end, int magic,
                      int64_t total) {
    Py_ssize_t present = end - start;
    if (over_limit(st)) {
        unshown_add(st, start, end, 0);
        return 0;
    }
    if (unshown_flush(st) < 0)
        return -1;
    static const char *const keys[] = {"magic", "bytes_present", "bytes_total"};
    PyObject *values[] = {magic == NO_MAGIC ? Py_NewRef(Py_None) : PyLong_FromLong(magic),
                          PyLong_FromSsize_t(present),
                          total < 0 ? Py_NewRef(Py_None) : PyLong_FromLongLong(total)};
    PyObject *value = dict_of(keys, values, 3);
    const HeaderLayout *layout = magic == 2   ? batch_layout
                                 : magic == 0 ? message0_layout
                                 : magic == 1 ? message1_layout
                                              : prefix_layout;
    PyObject *kids = header_fields(span->b, start, end, layout);
    PyObject *note = total >= 0 ? PyUnicode_FromFormat("partial batch: %zd of %lld bytes present", present,
                                                       (long long)total)
                                : PyUnicode_FromFormat("partial batch: %zd bytes present, length unreadable", present);
    if (value == NULL || kids == NULL || note == NULL) {
        Py_XDECREF(value);
        Py_XDECREF(kids);
        Py_XDECREF(note);
        return -1;
    }
    return add(st, make(constants[S_PARTIAL_NAME], constants[S_PARTIAL_TYPE], start, present, value, kids, note), 0);
}

static const char *const TIMESTAMP_TYPES[] = {"CreateTime", "LogAppendTime"};

static int rf_batch_begin(Walker *w, void *st, const Span *span, const BatchHeader *h) {
    Fields *s = st;
    int codec = h->attributes & 7, ts_type = (h->attributes >> 3) & 1;
    if (over_limit(s)) {
        s->skipping_batch = 1;
        unshown_add(s, h->start, h->end, h->record_count > 0 ? h->record_count : 0);
        return 0;
    }
    if (unshown_flush(s) < 0)
        return -1;
    s->records_made++;
    PyObject *kids = header_fields(span->b, h->start, h->end, batch_layout);
    if (kids == NULL)
        return -1;
    Py_ssize_t at = h->start + 21;
    PyObject *attribute_bits = Py_BuildValue(
        "[NNNNN]", bits("codec", at, 2, PyLong_FromLong(codec), codec_name_object(codec)),
        bits("timestamp_type", at, 2, PyLong_FromLong(ts_type), text_of(TIMESTAMP_TYPES[ts_type])),
        bits("is_transactional", at, 2, PyBool_FromLong(h->attributes & 0x10), NULL),
        bits("is_control", at, 2, PyBool_FromLong(h->attributes & 0x20), NULL),
        bits("has_delete_horizon", at, 2, PyBool_FromLong(h->attributes & 0x40), NULL));
    if (attribute_bits == NULL || set_note(child_at(kids, 4), crc_note(h->crc, h->crc_computed)) < 0 ||
        set_children(child_at(kids, 5), attribute_bits) < 0) {
        Py_DECREF(kids);
        return -1;
    }
    static const char *const keys[] = {"magic", "codec", "crc_valid", "crc_computed", "record_count",
                                       "base_offset", "producer_id", "is_transactional", "is_control"};
    PyObject *values[] = {PyLong_FromLong(2), codec_name_object(codec), PyBool_FromLong(h->crc == h->crc_computed),
                          PyLong_FromUnsignedLong(h->crc_computed), PyLong_FromLong(h->record_count),
                          PyLong_FromLongLong(h->base_offset), PyLong_FromLongLong(h->producer_id),
                          PyBool_FromLong(h->attributes & 0x10), PyBool_FromLong(h->attributes & 0x20)};
    PyObject *value = dict_of(keys, values, 9);
    if (value == NULL) {
        Py_DECREF(kids);
        return -1;
    }
    return add(s, make(constants[S_BATCH_NAME], constants[S_BATCH_TYPE], h->start, h->end - h->start, value, kids,
                       NULL),
               1);
}

static int rf_batch_records(Walker *w, void *st, const Span *outer, const Span *records, Py_ssize_t at,
                            Py_ssize_t end, const char *problem, int too_large) {
    Fields *s = st;
    if (s->skipping_batch)
        return 0;
    PyObject *kids = PyList_New(0);
    if (kids == NULL)
        return -1;
    PyObject *type, *value = NULL, *note = NULL;
    if (problem != NULL) {
        type = constants[S_DECOMPRESSED_RECORDS];
        if ((note = PyUnicode_FromString(problem)) == NULL) {
            Py_DECREF(kids);
            return -1;
        }
    } else if (records->detached) {
        type = constants[S_DECOMPRESSED_RECORDS];
        value = Py_NewRef(records->data);
    } else {
        type = constants[S_RECORD_LIST];
    }
    PyObject *field = make(constants[S_RECORDS], type, at, end - at, value, kids, note);
    if (add(s, field, 1) < 0)
        return -1;
    s->records_field = field;
    s->records_problem = problem != NULL;
    return 0;
}

static PyObject *shown_timestamp(i128 timestamp) {
    char text[48];
    format_i128(text, sizeof text, timestamp);
    return PyUnicode_FromFormat("timestamp %s", text);
}

static PyObject *shown_offset(i128 offset) {
    char text[48];
    format_i128(text, sizeof text, offset);
    return PyUnicode_FromFormat("offset %s", text);
}

/* A control record's key or value as the Kafka data schema it holds (ControlRecordTypeSchema, EndTxnMarker):
 * an int16 version, then that schema. Unreadable: the field says how many bytes it needs. */
static int control_part(Walker *w, PyObject *field, const Span *span, const uint8_t *raw, Py_ssize_t len, int which,
                        PyObject *kind) {
    PyObject *children = NULL;
    const Program *program = NULL;
    Py_ssize_t at = raw ? raw - span->b : 0;
    if (raw != NULL && len >= 2) {
        int version = (int16_t)(raw[0] << 8 | raw[1]);
        program = embedded_program(which, version);
        if (program == NULL && PyErr_Occurred())
            return -1;
        if (program != NULL) {
            Fields inner_state = {.ctx = NULL};
            Walker inner = {.b = span->b, .buflen = PY_SSIZE_T_MAX, .bufobj = span->data,
                            .builder = &fields_builder, .state = &inner_state};
            Py_ssize_t stop;
            walk_program(&inner, program, at + 2, at + len, &stop);
            PyObject *root = inner_state.root;
            if (inner.failed == 2) {
                Py_XDECREF(root);
                return -1;
            }
            PyObject *kids = ((FieldObject *)root)->children;
            if (PyList_GET_SIZE(kids) > 0) {
                children = Py_BuildValue("[N]", make(constants[S_VERSION], kind_names[K_INT16], at, 2,
                                                     PyLong_FromLong(version), NULL, NULL));
                if (children == NULL || PyList_SetSlice(children, 1, 1, kids) < 0) {
                    Py_XDECREF(children);
                    Py_DECREF(root);
                    return -1;
                }
            }
            Py_DECREF(root);
        }
    }
    if (children == NULL) {
        PyObject *size = PyObject_CallFunction(hook(H_EMBEDDED_SIZE), "i", which);
        if (size == NULL)
            return -1;
        PyObject *note = PyUnicode_FromFormat("control record %U needs %S bytes", ((FieldObject *)field)->name, size);
        Py_DECREF(size);
        return set_note(field, note);
    }
    Py_SETREF(((FieldObject *)field)->type, Py_NewRef(kind));
    return set_children(field, children);
}

static int rf_record(Walker *w, void *st, const Span *span, const BatchHeader *h, const RecordInfo *r) {
    Fields *s = st;
    const uint8_t *b = span->b;
    if (s->skipping_batch)
        return 0;
    if (over_limit(s)) {
        unshown_add(s, r->start, r->end, 1);
        return 0;
    }
    s->records_made++;
    PyObject *header_list = PyList_New(0), *header_pairs = PyList_New(0);
    if (header_list == NULL || header_pairs == NULL)
        goto fail_lists;
    Py_ssize_t pos = r->headers_pos, key_at, value_at, key_len, value_len;
    const uint8_t *key, *value;
    for (int32_t i = 0; i < r->header_count; i++) {
        Py_ssize_t header_at = pos;
        if (!record_header_next(b, &pos, r->end, &key_at, &key, &key_len, &value_at, &value, &value_len))
            break;
        PyObject *k = PyUnicode_DecodeUTF8((const char *)key, key_len, NULL);
        PyObject *v = bytes_or_none(value, value_len);
        if (k == NULL || v == NULL) {
            Py_XDECREF(k);
            Py_XDECREF(v);
            goto fail_lists;
        }
        PyObject *pair = Py_BuildValue("[OO]", k, v);
        PyObject *pair_fields = Py_BuildValue(
            "[NN]", make(constants[S_KEY], constants[S_STRING], header_at, value_at - header_at, Py_NewRef(k), NULL, NULL),
            make(constants[S_VALUE], constants[S_BYTES], value_at, pos - value_at, Py_NewRef(v), NULL, NULL));
        Py_DECREF(k);
        Py_DECREF(v);
        if (append(header_pairs, pair) < 0 ||
            append(header_list, pair_fields ? make(constants[S_HEADER_NAME], constants[S_HEADER_TYPE], header_at,
                                                   pos - header_at, NULL, pair_fields, NULL)
                                            : NULL) < 0)
            goto fail_lists;
    }
    PyObject *key_value = bytes_or_none(r->key, r->key_len), *value_value = bytes_or_none(r->value, r->value_len);
    PyObject *key_field = make(constants[S_KEY], constants[S_BYTES], r->key_at, r->value_at - r->key_at,
                               Py_XNewRef(key_value), NULL, NULL);
    PyObject *value_field = make(constants[S_VALUE], constants[S_BYTES], r->value_at, r->headers_at - r->value_at,
                                 Py_XNewRef(value_value), NULL, NULL);
    static const char *const keys[] = {"offset", "timestamp", "key", "value", "headers"};
    PyObject *values[] = {int_value(r->offset), int_value(r->timestamp), key_value, value_value, header_pairs};
    PyObject *facts = dict_of(keys, values, 5);
    if (key_field == NULL || value_field == NULL || facts == NULL)
        goto fail_fields;
    if ((h->attributes & 0x20) &&
        (control_part(w, key_field, span, r->key, r->key_len, E_CONTROL_KEY, constants[S_CONTROL_KEY]) < 0 ||
         control_part(w, value_field, span, r->value, r->value_len, E_CONTROL_VALUE, constants[S_CONTROL_VALUE]) < 0))
        goto fail_fields;
    PyObject *kids = Py_BuildValue(
        "[NNNNNNN]",
        make(constants[S_LENGTH], constants[S_VARINT], r->start, r->body - r->start,
             PyLong_FromSsize_t(r->end - r->body), NULL, NULL),
        make(constants[S_ATTRIBUTES], kind_names[K_INT8], r->body, 1, PyLong_FromLong(r->attributes), NULL, NULL),
        make(constants[S_TIMESTAMP_DELTA], constants[S_VARLONG], r->ts_at, r->od_at - r->ts_at,
             PyLong_FromLongLong(r->timestamp_delta), NULL, shown_timestamp(r->timestamp)),
        make(constants[S_OFFSET_DELTA], constants[S_VARINT], r->od_at, r->key_at - r->od_at,
             PyLong_FromLong(r->offset_delta), NULL, shown_offset(r->offset)),
        key_field, value_field,
        make(constants[S_HEADERS], constants[S_HEADER_LIST], r->headers_at, r->end - r->headers_at, NULL, header_list,
             NULL));
    if (kids == NULL) {
        Py_DECREF(facts);
        return -1;
    }
    return add(s, make(constants[S_RECORD_NAME], constants[S_RECORD_TYPE], r->start, r->end - r->start, facts, kids,
                       NULL),
               0);
fail_fields:
    Py_XDECREF(key_field);
    Py_XDECREF(value_field);
    Py_XDECREF(facts);
    Py_XDECREF(header_list);
    return -1;
fail_lists:
    Py_XDECREF(header_list);
    Py_XDECREF(header_pairs);
    return -1;
}

static int rf_batch_end(Walker *w, void *st, const BatchHeader *h, int64_t decoded) {
    Fields *s = st;
    PyObject *records = s->records_field;
    if (s->skipping_batch) {
        s->skipping_batch = 0;
        return 0;
    }
    if (unshown_flush(s) < 0)
        return -1;
    if (records != NULL && !s->records_problem) {
        int detached = ((FieldObject *)records)->type == constants[S_DECOMPRESSED_RECORDS];
        PyObject *note = NULL;
        if (decoded != h->record_count)
            note = detached ? PyUnicode_FromFormat("%s; record_count is %d but %lld records decoded",
                                                   DECOMPRESSED_NOTE, h->record_count, (long long)decoded)
                            : PyUnicode_FromFormat("record_count is %d but %lld records decoded", h->record_count,
                                                   (long long)decoded);
        else if (detached)
            note = PyUnicode_FromString(DECOMPRESSED_NOTE);
        if ((decoded != h->record_count || detached) && set_note(records, note) < 0)
            return -1;
    }
    if (records != NULL)
        close_level(s, ((FieldObject *)records)->offset + ((FieldObject *)records)->length);
    s->records_field = NULL;
    close_level(s, h->end);
    return 0;
}

static int rf_message_begin(Walker *w, void *st, const Span *span, const MessageInfo *m) {
    Fields *s = st;
    const uint8_t *b = span->b;
    if (s->skipped_messages || over_limit(s)) {
        s->skipped_messages++;
        unshown_add(s, m->start, m->end, m->record_count);
        return 0;
    }
    if (unshown_flush(s) < 0)
        return -1;
    s->records_made++;
    int codec = m->attributes & 7;
    PyObject *kids = header_fields(b, m->start, m->end, m->magic == 1 ? message1_layout : message0_layout);
    if (kids == NULL)
        return -1;
    PyObject *attribute_bits = m->magic == 1
                                   ? Py_BuildValue("[NN]",
                                                   bits("codec", m->start + 17, 1, PyLong_FromLong(codec),
                                                        codec_name_object(codec)),
                                                   bits("timestamp_type", m->start + 17, 1,
                                                        PyLong_FromLong((m->attributes >> 3) & 1),
                                                        text_of(TIMESTAMP_TYPES[(m->attributes >> 3) & 1])))
                                   : Py_BuildValue("[N]", bits("codec", m->start + 17, 1, PyLong_FromLong(codec),
                                                               codec_name_object(codec)));
    if (attribute_bits == NULL || set_note(child_at(kids, 2), crc_note(m->crc, m->crc_computed)) < 0 ||
        set_children(child_at(kids, 4), attribute_bits) < 0)
        goto fail;
    if (m->made_absolute && set_note(child_at(kids, 0), PyUnicode_FromFormat("absolute offset %lld",
                                                                             (long long)m->absolute_offset)) < 0)
        goto fail;
    if (append(kids, make(constants[S_KEY], constants[S_BYTES], m->key_at, m->value_at - m->key_at,
                          bytes_or_none(m->key, m->key_len), NULL, NULL)) < 0 ||
        append(kids, make(constants[S_VALUE], constants[S_BYTES], m->value_at, m->value_end - m->value_at,
                          bytes_or_none(m->value, m->value_len), NULL,
                          m->value_note ? PyUnicode_FromString(m->value_note) : NULL)) < 0)
        goto fail;
    static const char *const keys[] = {"magic", "codec", "crc_valid", "crc_computed", "record_count", "base_offset",
                                       "producer_id", "is_transactional", "is_control", "offset", "timestamp", "key",
                                       "value", "headers"};
    PyObject *values[] = {PyLong_FromLong(m->magic), codec_name_object(codec), PyBool_FromLong(m->crc == m->crc_computed),
                          PyLong_FromUnsignedLong(m->crc_computed), PyLong_FromLongLong(m->record_count),
                          PyLong_FromLongLong(m->base_offset), PyLong_FromLong(-1), Py_NewRef(Py_False),
                          Py_NewRef(Py_False), PyLong_FromLongLong(m->absolute_offset),
                          m->has_timestamp ? PyLong_FromLongLong(m->timestamp) : Py_NewRef(Py_None),
                          bytes_or_none(m->key, m->key_len), bytes_or_none(m->value, m->value_len), PyList_New(0)};
    PyObject *facts = dict_of(keys, values, 14);
    PyObject *note = m->value_end != m->end
                         ? PyUnicode_FromFormat("%zd bytes left over after the value", m->end - m->value_end)
                         : NULL;
    if (facts == NULL) {
        Py_XDECREF(note);
        goto fail;
    }
    return add(s, make(constants[S_MESSAGE_NAME], constants[S_MESSAGE_TYPE], m->start, m->end - m->start, facts, kids,
                       note),
               1);
fail:
    Py_XDECREF(attribute_bits);
    Py_DECREF(kids);
    return -1;
}

static int rf_wrapper(Walker *w, void *st, const Span *outer, const Span *inner, const MessageInfo *m,
                      const char *problem, int too_large) {
    PyObject *kids = PyList_New(0);
    if (kids == NULL)
        return -1;
    Py_ssize_t start = m->value_at + 4;
    PyObject *note = PyUnicode_FromString(problem ? problem : DECOMPRESSED_NOTE);
    PyObject *field = make(constants[S_MESSAGES], constants[S_DECOMPRESSED_MESSAGES], start, m->value_end - start,
                           inner ? Py_NewRef(inner->data) : NULL, kids, note);
    return add(st, field, 1);
}

static int rf_message_end(Walker *w, void *st, const MessageInfo *m, int64_t records) {
    Fields *s = st;
    if (s->skipped_messages) {
        s->skipped_messages--;
        return 0;
    }
    PyObject *open = current(s)->field;
    if (((FieldObject *)open)->type == constants[S_DECOMPRESSED_MESSAGES]) {
        if (unshown_flush(s) < 0)
            return -1;
        close_level(s, ((FieldObject *)open)->offset + ((FieldObject *)open)->length);
    }
    return close_level(s, m->end);
}

static const RecordSink fields_sink = {rf_malformed, rf_partial, rf_batch_begin, rf_batch_records, rf_record,
                                       rf_batch_end, rf_message_begin, rf_wrapper, rf_message_end};

static int f_records(Walker *w, int name, Py_ssize_t at, Py_ssize_t size, Py_ssize_t data_at, Py_ssize_t n) {
    Fields *s = w->state;
    PyObject *kids = PyList_New(0), *value = PyBytes_FromStringAndSize((const char *)w->b + data_at, n);
    if (kids == NULL || value == NULL) {
        Py_XDECREF(kids);
        Py_XDECREF(value);
        return -1;
    }
    if (add(s, make_named(name_of(w, name, 0), constants[S_RECORDS], at, size, value, kids, NULL), 1) < 0)
        return -1;
    int depth = s->depth;
    if (records_read(w, &fields_sink, s, data_at, data_at + n, 1, 1) < 0 || unshown_flush(s) < 0)
        return -1;
    if (s->depth != depth) {
        PyErr_SetString(PyExc_SystemError, "fields: records left open");
        return -1;
    }
    return close_level(s, at + size);
}

/* --- embedded schemas -------------------------------------------------------------------------- */

static int f_embedded(Walker *w, int name, int role, Py_ssize_t at, Py_ssize_t size, Py_ssize_t data_at,
                      Py_ssize_t n) {
    Fields *s = w->state;
    PyObject *value = PyBytes_FromStringAndSize((const char *)w->b + data_at, n);
    if (value == NULL)
        return -1;
    PyObject *field = make_named(name_of(w, name, 0), constants[S_BYTES], at, size, value, NULL, NULL);
    if (add(s, field, 0) < 0)
        return -1;
    if (role == R_AUTH_BYTES) {
        if (s->ctx == NULL || s->ctx == Py_None)
            return 0;
        PyObject *parts = PyObject_CallMethod(s->ctx, "auth_fields", "On", ((FieldObject *)field)->value, data_at);
        if (parts == NULL)
            return -1;
        if (parts == Py_None) {
            Py_DECREF(parts);
            return 0;
        }
        Py_SETREF(((FieldObject *)field)->type, Py_NewRef(constants[S_TOKEN]));
        return set_children(field, parts);
    }
    if (w->protocol_type == PT_OTHER || n < 2)
        return 0;
    int version = (int16_t)(w->b[data_at] << 8 | w->b[data_at + 1]);
    const Program *program = embedded_program(role == R_CONSUMER_SUBSCRIPTION ? E_SUBSCRIPTION : E_ASSIGNMENT,
                                              version);
    if (program == NULL)
        return PyErr_Occurred() ? -1 : 0;
    Fields inner_state = {.ctx = s->ctx};
    Walker inner = *w;
    inner.failed = 0;
    inner.state = &inner_state;
    Py_ssize_t stop;
    walk_program(&inner, program, data_at + 2, data_at + n, &stop);
    PyObject *root = inner_state.root;
    if (inner.failed == 2) {
        Py_XDECREF(root);
        return -1;
    }
    int exact = !inner.failed && stop == data_at + n;
    int failed = 0;
    if (exact || (!inner.failed && w->protocol_type == PT_CONSUMER)) {
        PyObject *children = Py_BuildValue("[N]", make(constants[S_VERSION], kind_names[K_INT16], data_at, 2,
                                                       PyLong_FromLong(version), NULL, NULL));
        PyObject *schema = PyTuple_GET_ITEM(program->names, program->root_type);
        failed = children == NULL ||
                 PyList_SetSlice(children, 1, 1, ((FieldObject *)root)->children) < 0 ||
                 set_children(field, Py_NewRef(children)) < 0 ||
                 set_note(field, exact ? Py_NewRef(schema) : PyUnicode_FromFormat("%U (bytes left over)", schema)) < 0;
        Py_XDECREF(children);
    }
    Py_DECREF(root);
    return failed ? -1 : 0;
}

/* --- array items past the limit ---------------------------------------------------------------
 * Views that hold a whole tree set a record limit; past as many items, the items of an array (or the fields of
 * a tagged section) are not made either, nor any item once the tree has TREE_FIELDS_MAX fields: they are
 * counted into one ItemsNotShown Field that covers their bytes, so that millions of small items cost memory for
 * the limit only. The walk still reads them (and fails where they are bad). */

/* Whether what starts here is not made: it is inside an item past the limit, or it is such an item (which
 * opens or extends the run of items not made). `opens`: it is a container, closed by an end call. */
static int hidden(Fields *s, Py_ssize_t at, int opens) {
    if (s->hidden.depth) {
        s->hidden.depth += opens;
        return 1;
    }
    if (!s->record_limit || s->depth == 0 || !current(s)->limited) {
        s->made++;
        return 0;
    }
    int past_count = PyList_GET_SIZE(current(s)->children) >= s->record_limit;
    if (!past_count && s->made < TREE_FIELDS_MAX) {
        s->made++;
        return 0;
    }
    if (!s->hidden.open) {
        s->hidden.open = 1;
        s->hidden.level = s->depth;
        s->hidden.past_tree_limit = !past_count;
        s->hidden.start = at;
        s->hidden.count = 0;
    }
    s->hidden.count++;
    s->hidden.depth = opens;
    return 1;
}

/* The end of a container: inside an item not made, nothing; the end of an array with items not made, their
 * Field first. */
static int hidden_end(Fields *s, Py_ssize_t end) {
    if (s->hidden.depth) {
        s->hidden.depth--;
        return 1;
    }
    if (s->hidden.open && s->hidden.level == s->depth) {
        s->hidden.open = 0;
        PyObject *note = s->hidden.past_tree_limit
            ? PyUnicode_FromFormat("%lld more items in %zd bytes, past the %d fields this view makes of a message; "
                                   "--json shows them all", (long long)s->hidden.count, end - s->hidden.start,
                                   TREE_FIELDS_MAX)
            : PyUnicode_FromFormat("%lld more items in %zd bytes, past the %lld this view makes; --json shows them "
                                   "all", (long long)s->hidden.count, end - s->hidden.start, (long long)s->record_limit);
        if (note == NULL ||
            add(s, make(constants[S_ITEMS_UNSHOWN_NAME], constants[S_ITEMS_UNSHOWN_TYPE], s->hidden.start,
                        end - s->hidden.start, PyLong_FromLongLong(s->hidden.count), NULL, note), 0) < 0)
            return -1;
    }
    return 0;
}

static int g_fixed(Walker *w, int name, Py_ssize_t index, int kind, int role, Py_ssize_t at, const uint8_t *p) {
    return hidden(w->state, at, 0) ? 0 : f_fixed(w, name, index, kind, role, at, p);
}

static int g_text(Walker *w, int name, Py_ssize_t index, int form, int role, Py_ssize_t at, Py_ssize_t size,
                  const uint8_t *p, Py_ssize_t n, int not_nullable) {
    return hidden(w->state, at, 0) ? 0 : f_text(w, name, index, form, role, at, size, p, n, not_nullable);
}

static int g_array_begin(Walker *w, int name, int type, int role, Py_ssize_t at, int64_t count) {
    Fields *s = w->state;
    if (hidden(s, at, 1))
        return 0;
    if (f_array_begin(w, name, type, role, at, count) < 0)
        return -1;
    current(s)->limited = 1;
    return 0;
}

static int g_array_null(Walker *w, int name, int type, Py_ssize_t at, Py_ssize_t size, int not_nullable) {
    return hidden(w->state, at, 0) ? 0 : f_array_null(w, name, type, at, size, not_nullable);
}

static int g_end(Walker *w, Py_ssize_t end, int ok) {
    int found = hidden_end(w->state, end);
    return found < 0 ? -1 : found ? 0 : f_end(w, end, ok);
}

static int g_struct_begin(Walker *w, int name, Py_ssize_t index, int type, Py_ssize_t at) {
    return hidden(w->state, at, 1) ? 0 : f_struct_begin(w, name, index, type, at);
}

static int g_struct_null(Walker *w, int name, int type, Py_ssize_t at) {
    return hidden(w->state, at, 0) ? 0 : f_struct_null(w, name, type, at);
}

static int g_tagged_begin(Walker *w, Py_ssize_t at) {
    Fields *s = w->state;
    if (hidden(s, at, 1))
        return 0;
    if (f_tagged_begin(w, at) < 0)
        return -1;
    current(s)->limited = 1; /* a tag may come again and again, each time with its own Field */
    return 0;
}

static int g_tagged_unknown(Walker *w, uint64_t tag, Py_ssize_t at, Py_ssize_t size, const uint8_t *p) {
    return hidden(w->state, at, 0) ? 0 : f_tagged_unknown(w, tag, at, size, p);
}

static int g_tagged_end(Walker *w, Py_ssize_t end, uint64_t count, int ok) {
    int found = hidden_end(w->state, end);
    return found < 0 ? -1 : found ? 0 : f_tagged_end(w, end, count, ok);
}

static int g_records(Walker *w, int name, Py_ssize_t at, Py_ssize_t size, Py_ssize_t data_at, Py_ssize_t n) {
    return hidden(w->state, at, 0) ? 0 : f_records(w, name, at, size, data_at, n);
}

static int g_embedded(Walker *w, int name, int role, Py_ssize_t at, Py_ssize_t size, Py_ssize_t data_at,
                      Py_ssize_t n) {
    return hidden(w->state, at, 0) ? 0 : f_embedded(w, name, role, at, size, data_at, n);
}

const Builder fields_builder = {g_fixed, g_text, g_array_begin, g_array_null, g_end,
                                g_struct_begin, g_struct_null, g_end, g_tagged_begin, g_tagged_unknown,
                                g_tagged_end, g_records, g_embedded};

/* field_tree(program, buf, pos, end, ctx, decompress_limit, record_limit) -> (root Field, stop, failure)
 *
 * failure is None, or (offset, reason) where the walk stopped; the root then holds what was read before.
 * Past record_limit records (0: none), the records of a list are one RecordsNotShown item; past as many items,
 * the items of an array are one ItemsNotShown Field. */
PyObject *field_tree(PyObject *self, PyObject *args) {
    PyObject *program, *ctx;
    Py_buffer buf;
    Py_ssize_t pos, end;
    long long limit, record_limit;
    if (!PyArg_ParseTuple(args, "O!y*nnOLL:field_tree", &ProgramType, &program, &buf, &pos, &end, &ctx, &limit,
                          &record_limit))
        return NULL;
    PyObject *result = NULL;
    Fields s = {.ctx = ctx, .record_limit = record_limit};
    if (constants_ready() < 0)
        goto done;
    if (pos < 0 || end > buf.len || pos > end) {
        PyErr_SetString(PyExc_ValueError, "field_tree: range outside the buffer");
        goto done;
    }
    Walker w = {.b = buf.buf, .buflen = buf.len, .bufobj = buf.obj, .builder = &fields_builder, .state = &s,
                .decompress_budget = limit};
    Py_ssize_t stop;
    walk_program(&w, (const Program *)program, pos, end, &stop);
    if (w.failed == 2)
        goto done;
    if (w.failed)
        result = Py_BuildValue("(On(ns))", s.root, (Py_ssize_t)-1, w.fail_at, w.reason);
    else
        result = Py_BuildValue("(OnO)", s.root, stop, Py_None);
done:
    Py_XDECREF(s.root);
    PyBuffer_Release(&buf);
    return result;
}

/* records_fields(buf, pos, end, decompress_limit, partial_ok, record_limit) -> [Field]: a records field's items. */
PyObject *records_fields(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t pos, end;
    long long limit, record_limit;
    int partial_ok;
    if (!PyArg_ParseTuple(args, "y*nnLpL:records_fields", &buf, &pos, &end, &limit, &partial_ok, &record_limit))
        return NULL;
    PyObject *result = NULL;
    Fields s = {.record_limit = record_limit};
    if (constants_ready() < 0)
        goto done;
    if (pos < 0 || end > buf.len || pos > end) {
        PyErr_SetString(PyExc_ValueError, "records_fields: range outside the buffer");
        goto done;
    }
    PyObject *holder = make(constants[S_RECORDS], constants[S_RECORDS], pos, end - pos, NULL, PyList_New(0), NULL);
    if (holder == NULL || add(&s, holder, 1) < 0)
        goto done;
    Walker w = {.b = buf.buf, .buflen = buf.len, .bufobj = buf.obj, .builder = &fields_builder, .state = &s,
                .decompress_budget = limit};
    if (records_read(&w, &fields_sink, &s, pos, end, 1, partial_ok) < 0 || unshown_flush(&s) < 0)
        goto done;
    result = Py_NewRef(((FieldObject *)s.root)->children);
done:
    Py_XDECREF(s.root);
    PyBuffer_Release(&buf);
    return result;
}
