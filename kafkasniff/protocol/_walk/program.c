/* Program: a resolved schema's words, checked once when made so that the walk can trust their structure. */
#include "walk.h"

#define MAX_DEPTH 64

static int check_ops(const Program *p, Py_ssize_t at, Py_ssize_t stop, int depth, int one);

static int bad(const char *what, Py_ssize_t at) {
    PyErr_Format(PyExc_ValueError, "bad walk program: %s at word %zd", what, at);
    return -1;
}

static int name_ok(const Program *p, int32_t name, int element) {
    Py_ssize_t n = PyTuple_GET_SIZE(p->names);
    return (name >= 0 && name < n) || (element && name == INDEX_NAME);
}

/* One op at `at`; returns the word after it, or -1. `element`: the op is an array's element. */
static Py_ssize_t check_op(const Program *p, Py_ssize_t at, Py_ssize_t stop, int depth, int element) {
    const int32_t *w = p->ops;
    if (depth > MAX_DEPTH)
        return bad("nested too deep", at);
    if (at >= stop)
        return bad("op missing", at);
    Py_ssize_t room = stop - at;
    switch (w[at]) {
    case OP_FIXED:
        if (room < 4 || w[at + 1] < 0 || w[at + 1] >= K_COUNT || w[at + 2] < 0 || w[at + 2] >= R_COUNT ||
            !name_ok(p, w[at + 3], element))
            return bad("FIXED", at);
        return at + 4;
    case OP_STRING:
    case OP_BYTES:
        if (room < 5 || (w[at + 1] & ~1) || (w[at + 2] & ~1) || w[at + 3] < 0 || w[at + 3] >= R_COUNT ||
            !name_ok(p, w[at + 4], element))
            return bad("STRING/BYTES", at);
        return at + 5;
    case OP_ARRAY: {
        if (room < 7 || (w[at + 1] & ~1) || (w[at + 2] & ~1) || w[at + 3] < 0 || w[at + 3] >= R_COUNT ||
            !name_ok(p, w[at + 4], 0) || !name_ok(p, w[at + 5], 0) || w[at + 6] < 1 || w[at + 6] > room - 7)
            return bad("ARRAY", at);
        Py_ssize_t body = at + 7, end = body + w[at + 6];
        if (w[body] == OP_ARRAY || w[body] == OP_TAGGED)
            return bad("ARRAY element", at);
        if (check_ops(p, body, end, depth + 1, 1) < 0)
            return -1;
        return end;
    }
    case OP_STRUCT: {
        if (room < 5 || (w[at + 1] & ~1) || !name_ok(p, w[at + 2], element) || !name_ok(p, w[at + 3], 0) ||
            w[at + 4] < 0 || w[at + 4] > room - 5)
            return bad("STRUCT", at);
        Py_ssize_t body = at + 5, end = body + w[at + 4];
        if (check_ops(p, body, end, depth + 1, 0) < 0)
            return -1;
        return end;
    }
    case OP_TAGGED: {
        if (element || room < 3 || w[at + 1] < 0 || w[at + 2] < 0 || w[at + 2] > room - 3)
            return bad("TAGGED", at);
        Py_ssize_t pos = at + 3, end = pos + w[at + 2];
        for (int32_t k = 0; k < w[at + 1]; k++) {
            if (end - pos < 2 || w[pos] < 0 || w[pos + 1] < 1 || w[pos + 1] > end - pos - 2 ||
                w[pos + 2] == OP_TAGGED)
                return bad("TAGGED entry", pos);
            if (check_ops(p, pos + 2, pos + 2 + w[pos + 1], depth + 1, 2) < 0)
                return -1;
            pos += 2 + w[pos + 1];
        }
        if (pos != end)
            return bad("TAGGED length", at);
        return end;
    }
    default:
        return bad("unknown op", at);
    }
}

/* The ops in [at, stop); with `one`, exactly one op (1: an array element, whose leaf may be unnamed;
   2: a tagged field). A tagged section closes its struct: nothing may follow it. */
static int check_ops(const Program *p, Py_ssize_t at, Py_ssize_t stop, int depth, int one) {
    int count = 0;
    while (at < stop) {
        int tagged = p->ops[at] == OP_TAGGED;
        Py_ssize_t next = check_op(p, at, stop, depth, one == 1);
        if (next < 0)
            return -1;
        if (tagged && (one || next != stop))
            return bad("misplaced tagged section", at);
        at = next;
        count++;
    }
    if (one && count != 1)
        return bad("not exactly one op", at);
    return 0;
}

static void program_dealloc(Program *self) {
    PyMem_Free(self->ops);
    PyMem_Free((void *)self->texts);
    PyMem_Free(self->fact_slots);
    Py_XDECREF(self->facts_for);
    Py_XDECREF(self->names);
    Py_XDECREF(self->keys);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *program_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"ops", "names", "keys", "root_name", "root_type", NULL};
    Py_buffer ops;
    PyObject *names, *keys;
    int root_name, root_type;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*O!O!ii:Program", kwlist, &ops, &PyTuple_Type, &names,
                                     &PyTuple_Type, &keys, &root_name, &root_type))
        return NULL;
    Program *self = NULL;
    if (ops.itemsize != 4 && ops.format && strcmp(ops.format, "B") != 0) {
        PyErr_SetString(PyExc_ValueError, "ops must be int32 words");
        goto done;
    }
    if (ops.len % 4 || PyTuple_GET_SIZE(keys) != PyTuple_GET_SIZE(names)) {
        PyErr_SetString(PyExc_ValueError, "ops must be int32 words, one key per name");
        goto done;
    }
    self = (Program *)type->tp_alloc(type, 0);
    if (self == NULL)
        goto done;
    self->length = ops.len / 4;
    self->ops = PyMem_Malloc(ops.len ? ops.len : 1);
    self->texts = PyMem_Calloc(PyTuple_GET_SIZE(names) + 1, sizeof(char *));
    if (self->ops == NULL || self->texts == NULL) {
        PyErr_NoMemory();
        Py_CLEAR(self);
        goto done;
    }
    memcpy(self->ops, ops.buf, ops.len);
    self->names = Py_NewRef(names);
    self->keys = Py_NewRef(keys);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names); i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i), *key = PyTuple_GET_ITEM(keys, i);
        if (!PyUnicode_Check(name) || !PyBytes_Check(key)) {
            PyErr_SetString(PyExc_TypeError, "names must be str and keys bytes");
            Py_CLEAR(self);
            goto done;
        }
        self->texts[i] = PyUnicode_AsUTF8(name);
        if (self->texts[i] == NULL) {
            Py_CLEAR(self);
            goto done;
        }
    }
    self->root_name = root_name;
    self->root_type = root_type;
    if (!name_ok(self, root_name, 0) || !name_ok(self, root_type, 0) ||
        check_ops(self, 0, self->length, 0, 0) < 0)
        Py_CLEAR(self);
done:
    PyBuffer_Release(&ops);
    return (PyObject *)self;
}

static PyObject *program_get_names(Program *self, void *closure) { return Py_NewRef(self->names); }

static PyObject *program_get_words(Program *self, void *closure) { return PyLong_FromSsize_t(self->length); }

static PyObject *program_get_type(Program *self, void *closure) {
    return Py_NewRef(PyTuple_GET_ITEM(self->names, self->root_type));
}

static PyGetSetDef program_getset[] = {
    {"names", (getter)program_get_names, NULL, "field and type names", NULL},
    {"words", (getter)program_get_words, NULL, "length in int32 words", NULL},
    {"type", (getter)program_get_type, NULL, "the type name of the program's root struct", NULL},
    {NULL},
};

PyTypeObject ProgramType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kafkasniff.protocol._walk.Program",
    .tp_basicsize = sizeof(Program),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A resolved schema as checked walk words: Program(ops, names, keys, root_name, root_type).",
    .tp_new = program_new,
    .tp_dealloc = (destructor)program_dealloc,
    .tp_getset = program_getset,
};
