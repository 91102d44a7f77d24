/* The skim's interpreter: walks a message along a program that skim.py assembles from a schema.
 *
 * run(program, names, buf, pos, end, out) -> the position after what the program reads, or -1
 *
 * program is an array('i') of ops (below), names a tuple of field names. The walk checks every
 * length against the bytes present, as the full decoder does, and appends (name, value) to out
 * for the fields the program marks. -1 means the walk stopped on something it does not accept:
 * the caller then asks the full decoder, which says where and why. So this code must never
 * accept what the full decoder rejects; refusing more than it would only costs time.
 *
 * Ops, each a run of int32s; a body follows its op, and lengths count int32s:
 *   RUN size parts (kind role name)*parts       fixed-width fields under one bounds check
 *   STRING compact keep                         keep: the name's index, or -1
 *   BYTES compact
 *   ARRAY compact length body                   elements walked one by one
 *   ARRAY_SKIP compact element_size             elements of skipped fixed-width fields, jumped over
 *   NULLABLE length body                        a struct behind a presence byte
 *   TAGGED known length (tag length body)*known the known tags of a tagged-field section
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

enum op { OP_RUN = 1, OP_STRING, OP_BYTES, OP_ARRAY, OP_ARRAY_SKIP, OP_NULLABLE, OP_TAGGED };
enum role { ROLE_SKIP, ROLE_ERROR_CODE, ROLE_WANTED, ROLE_BOOL };
enum kind { K_BOOL, K_INT8, K_INT16, K_UINT16, K_INT32, K_UINT32, K_INT64, K_FLOAT64, K_UUID };
static const int kind_size[] = {1, 1, 2, 2, 4, 4, 8, 8, 16};

#define REFUSED (-1)
#define FAILED (-2) /* a Python exception is set */

typedef struct {
    const uint8_t *b;
    PyObject *names, *out;
} walk;

static int read_uvarint(const uint8_t *b, Py_ssize_t *pos, Py_ssize_t end, uint64_t *value) {
    uint64_t result = 0;
    Py_ssize_t p = *pos;
    for (int shift = 0;; shift += 7) {
        if (shift > 63 || p >= end)
            return -1;
        uint8_t byte = b[p++];
        if (shift == 63 && (byte & 0x7E))
            result = UINT64_MAX; /* beyond 64 bits: more than any length can be */
        else if (result != UINT64_MAX)
            result |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80))
            break;
    }
    *pos = p;
    *value = result;
    return 0;
}

static int64_t read_signed(const uint8_t *p, int kind) {
    switch (kind) {
    case K_INT8: return (int8_t)p[0];
    case K_INT16: return (int16_t)(p[0] << 8 | p[1]);
    case K_UINT16: return p[0] << 8 | p[1];
    case K_INT32: return (int32_t)((uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]);
    case K_UINT32: return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
    default: {
        uint64_t v = 0;
        for (int i = 0; i < 8; i++)
            v = v << 8 | p[i];
        return (int64_t)v;
    }
    }
}

static int append(walk *w, int32_t name, PyObject *value) {
    if (value == NULL)
        return -1;
    PyObject *pair = PyTuple_Pack(2, PyTuple_GET_ITEM(w->names, name), value);
    Py_DECREF(value);
    if (pair == NULL)
        return -1;
    int failed = PyList_Append(w->out, pair);
    Py_DECREF(pair);
    return failed;
}

/* A length or count: a compact one is an unsigned varint holding n + 1, else a big-endian
   int16 or int32. Sets *n (-1 for null); refuses negatives below -1 and more than is left. */
static Py_ssize_t read_length(const uint8_t *b, Py_ssize_t pos, Py_ssize_t end, int compact, int width,
                              int64_t *n) {
    if (compact) {
        uint64_t raw;
        if (pos < end && b[pos] < 0x80)
            raw = b[pos++];
        else if (read_uvarint(b, &pos, end, &raw))
            return REFUSED;
        if (raw && raw - 1 > (uint64_t)(end - pos))
            return REFUSED;
        *n = (int64_t)raw - 1;
        return pos;
    }
    if (end - pos < width)
        return REFUSED;
    *n = width == 2 ? (int16_t)(b[pos] << 8 | b[pos + 1]) : read_signed(b + pos, K_INT32);
    pos += width;
    if (*n < -1 || *n > end - pos)
        return REFUSED;
    return pos;
}

static Py_ssize_t run_ops(walk *w, const int32_t *pc, const int32_t *stop, Py_ssize_t pos, Py_ssize_t end);

static Py_ssize_t run_fixed(walk *w, const int32_t *pc, Py_ssize_t pos, Py_ssize_t end) {
    int32_t size = pc[1], parts = pc[2];
    if (end - pos < size)
        return REFUSED;
    const uint8_t *b = w->b;
    pc += 3;
    for (int32_t i = 0; i < parts; i++, pc += 3) {
        int32_t kind = pc[0], role = pc[1], name = pc[2];
        if (role == ROLE_BOOL && b[pos] > 1)
            return REFUSED;
        if (role == ROLE_ERROR_CODE || role == ROLE_WANTED) {
            if (kind == K_BOOL || kind == K_FLOAT64 || kind == K_UUID)
                return REFUSED; /* no such fields are kept; the full decoder would show them */
            int64_t value = read_signed(b + pos, kind);
            if ((value || role == ROLE_WANTED) && append(w, name, PyLong_FromLongLong(value)))
                return FAILED;
        }
        pos += kind_size[kind];
    }
    return pos;
}

static Py_ssize_t run_string(walk *w, const int32_t *pc, Py_ssize_t pos, Py_ssize_t end) {
    int64_t n;
    int32_t keep = pc[2];
    pos = read_length(w->b, pos, end, pc[1], 2, &n);
    if (pos < 0)
        return pos;
    const char *text = (const char *)w->b + pos;
    int ascii = 1;
    for (int64_t i = 0; i < n && ascii; i++)
        ascii = (uint8_t)text[i] < 0x80;
    PyObject *value = NULL;
    if (!ascii || keep >= 0) {
        if (n < 0) {
            value = Py_NewRef(Py_None);
        } else {
            value = PyUnicode_DecodeUTF8(text, n, "strict");
            if (value == NULL) {
                if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                    return FAILED;
                PyErr_Clear();
                return REFUSED;
            }
        }
    }
    if (keep >= 0) {
        if (append(w, keep, value))
            return FAILED;
    } else {
        Py_XDECREF(value);
    }
    return pos + (n > 0 ? n : 0);
}

static Py_ssize_t run_tagged(walk *w, const int32_t *pc, Py_ssize_t pos, Py_ssize_t end) {
    const uint8_t *b = w->b;
    if (pos < end && !b[pos])
        return pos + 1; /* no tagged fields: by far the most common case */
    int32_t known = pc[1];
    uint64_t count, tag, size;
    if (read_uvarint(b, &pos, end, &count) || count > (uint64_t)(end - pos))
        return REFUSED;
    for (uint64_t i = 0; i < count; i++) {
        if (read_uvarint(b, &pos, end, &tag) || read_uvarint(b, &pos, end, &size) || size > (uint64_t)(end - pos))
            return REFUSED;
        Py_ssize_t value_end = pos + (Py_ssize_t)size;
        const int32_t *entry = pc + 3;
        for (int32_t k = 0; k < known; k++) {
            int32_t length = entry[1];
            if ((uint64_t)entry[0] == tag) {
                Py_ssize_t got = run_ops(w, entry + 2, entry + 2 + length, pos, value_end);
                if (got < 0)
                    return got;
                if (got != value_end)
                    return REFUSED;
                break;
            }
            entry += 2 + length;
        }
        pos = value_end;
    }
    return pos;
}

static Py_ssize_t run_ops(walk *w, const int32_t *pc, const int32_t *stop, Py_ssize_t pos, Py_ssize_t end) {
    const uint8_t *b = w->b;
    int64_t n;
    while (pc < stop && pos >= 0) {
        switch (pc[0]) {
        case OP_RUN:
            pos = run_fixed(w, pc, pos, end);
            pc += 3 + 3 * pc[2];
            break;
        case OP_STRING:
            pos = run_string(w, pc, pos, end);
            pc += 3;
            break;
        case OP_BYTES:
            pos = read_length(b, pos, end, pc[1], 4, &n);
            if (pos >= 0 && n > 0)
                pos += n;
            pc += 2;
            break;
        case OP_ARRAY:
            pos = read_length(b, pos, end, pc[1], 4, &n);
            for (int64_t i = 0; i < n && pos >= 0; i++)
                pos = run_ops(w, pc + 3, pc + 3 + pc[2], pos, end);
            pc += 3 + pc[2];
            break;
        case OP_ARRAY_SKIP:
            pos = read_length(b, pos, end, pc[1], 4, &n);
            if (pos >= 0 && n > 0) {
                if (n > (end - pos) / pc[2])
                    return REFUSED;
                pos += n * pc[2];
            }
            pc += 3;
            break;
        case OP_NULLABLE:
            if (pos >= end)
                return REFUSED;
            if (b[pos++] < 0x80) /* the presence marker: -1 is null */
                pos = run_ops(w, pc + 2, pc + 2 + pc[1], pos, end);
            pc += 2 + pc[1];
            break;
        case OP_TAGGED:
            pos = run_tagged(w, pc, pos, end);
            pc += 3 + pc[2];
            break;
        default:
            PyErr_Format(PyExc_ValueError, "bad skim op %d", pc[0]);
            return FAILED;
        }
    }
    return pos;
}

static PyObject *run(PyObject *self, PyObject *args) {
    Py_buffer program, buf;
    PyObject *names, *out;
    Py_ssize_t pos, end;
    if (!PyArg_ParseTuple(args, "y*O!y*nnO!:run", &program, &PyTuple_Type, &names, &buf, &pos, &end, &PyList_Type,
                          &out))
        return NULL;
    Py_ssize_t result = REFUSED;
    if (0 <= pos && pos <= end && end <= buf.len) {
        walk w = {buf.buf, names, out};
        const int32_t *ops = program.buf;
        result = run_ops(&w, ops, ops + program.len / (Py_ssize_t)sizeof(int32_t), pos, end);
    }
    PyBuffer_Release(&program);
    PyBuffer_Release(&buf);
    if (result == FAILED)
        return NULL;
    return PyLong_FromSsize_t(result < 0 ? REFUSED : result);
}

static PyMethodDef methods[] = {
    {"run", run, METH_VARARGS, "Walk buf[pos:end] along a skim program; the end position, or -1 if refused."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_skim", NULL, -1, methods};

PyMODINIT_FUNC PyInit__skim(void) { return PyModule_Create(&module); }
