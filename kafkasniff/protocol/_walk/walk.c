/* The walk: reads bytes along a Program and tells the builder what it read (see walk.h). */
#include "walk.h"

#include <stdarg.h>

const int kind_size[K_COUNT] = {1, 1, 2, 2, 4, 4, 8, 8, 16};
const char *const kind_text[K_COUNT] = {"bool", "int8", "int16", "uint16", "int32", "uint32", "int64", "float64",
                                        "uuid"};

const char *const role_text[R_COUNT] = {
    "none", "errorCode", "topicName", "topicId", "partition", "records", "throttleTimeMs", "acks", "correlationId",
    "clientId", "protocolType", "consumerSubscription", "consumerAssignment", "authBytes", "controlType", "apiKey",
    "checksum", "timestamp", "nodeId", "port", "name", "offset"};

static PyObject *hooks[H_COUNT];

PyObject *hook(int which) { return hooks[which]; }

/* --- failures ----------------------------------------------------------------------------------- */

void format_i128(char *out, size_t size, i128 v) {
    char digits[48];
    int n = 0, negative = v < 0;
    u128 u = negative ? (u128)0 - (u128)v : (u128)v;
    do {
        digits[n++] = (char)('0' + (int)(u % 10));
        u /= 10;
    } while (u && n < 47);
    size_t at = 0;
    if (negative && at + 1 < size)
        out[at++] = '-';
    while (n && at + 1 < size)
        out[at++] = digits[--n];
    out[at] = 0;
}

int walk_fail(Walker *w, Py_ssize_t at, const char *fmt, ...) {
    if (!w->failed) {
        w->failed = 1;
        w->fail_at = at;
        va_list args;
        va_start(args, fmt);
        vsnprintf(w->reason, sizeof w->reason, fmt, args);
        va_end(args);
    }
    return -1;
}

int walk_is_decode_failure(Walker *w) { return w->failed == 1; }

/* A builder failed: a Python exception is set, and it outranks a decoding failure. */
static int python_failed(Walker *w) {
    w->failed = 2;
    return -1;
}
#define BUILD(call)                                                                                                  \
    do {                                                                                                             \
        if ((call) < 0)                                                                                              \
            return python_failed(w);                                                                                 \
    } while (0)

/* --- primitives --------------------------------------------------------------------------------- */

/* Kafka's unsigned varint; like Kafka's readers, at most 10 bytes (so the value fits 70 bits). */
static int read_uvarint(Walker *w, Py_ssize_t *pos, Py_ssize_t end, u128 *value) {
    Py_ssize_t start = *pos, p = start;
    u128 result = 0;
    for (int shift = 0;; shift += 7) {
        if (shift > 63)
            return walk_fail(w, start, "varint longer than 10 bytes");
        if (p >= end)
            return walk_fail(w, start, "varint runs past the end of the bytes");
        uint8_t byte = w->b[p++];
        result |= (u128)(byte & 0x7F) << shift;
        if (!(byte & 0x80))
            break;
    }
    *pos = p;
    *value = result;
    return 0;
}

int64_t fixed_value(int kind, const uint8_t *p) {
    switch (kind) {
    case K_BOOL:
        return p[0];
    case K_INT8:
        return (int8_t)p[0];
    case K_INT16:
        return (int16_t)(p[0] << 8 | p[1]);
    case K_UINT16:
        return p[0] << 8 | p[1];
    case K_INT32:
        return (int32_t)((uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]);
    case K_UINT32:
        return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
    default: {
        uint64_t v = 0;
        for (int i = 0; i < 8; i++)
            v = v << 8 | p[i];
        return (int64_t)v;
    }
    }
}

static int64_t read_be(const uint8_t *p, int size) {
    uint64_t v = 0;
    for (int i = 0; i < size; i++)
        v = v << 8 | p[i];
    return (int64_t)v;
}

static int need(Walker *w, Py_ssize_t pos, Py_ssize_t end, int size, const char *what) {
    if (end - pos < size)
        return walk_fail(w, pos, "%s needs %d bytes, %zd left", what, size, end > pos ? end - pos : 0);
    return 0;
}

/* The length of a string or bytes field (-1: null), checked against the bytes left. */
static int read_length(Walker *w, Py_ssize_t *pos, Py_ssize_t end, int compact, int is_bytes, i128 *n) {
    Py_ssize_t start = *pos, p = start;
    const char *what = is_bytes ? "bytes" : "string";
    if (compact) {
        if (p < end && w->b[p] < 0x80) {
            *n = (i128)w->b[p] - 1;
            p++;
        } else {
            u128 raw = 0;
            if (read_uvarint(w, &p, end, &raw) < 0)
                return -1;
            *n = (i128)raw - 1;
        }
    } else if (is_bytes) {
        if (need(w, p, end, 4, "int32") < 0)
            return -1;
        *n = (int32_t)read_be(w->b + p, 4);
        p += 4;
    } else {
        if (need(w, p, end, 2, "int16") < 0)
            return -1;
        *n = (int16_t)read_be(w->b + p, 2);
        p += 2;
    }
    char text[48];
    if (*n < -1) {
        format_i128(text, sizeof text, *n);
        return walk_fail(w, start, "%s length %s is negative", what, text);
    }
    if (*n > end - p) {
        format_i128(text, sizeof text, *n);
        return walk_fail(w, start, "%s length %s exceeds the %zd bytes left", what, text, end - p);
    }
    *pos = p;
    return 0;
}

/* UTF-8 as Python's strict decoder accepts it: no overlong forms, surrogates or code points past U+10FFFF. */
int utf8_valid(const uint8_t *p, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        /* eight ASCII bytes at a time: most text is ASCII */
        while (i + 8 <= n) {
            uint64_t chunk;
            memcpy(&chunk, p + i, 8);
            if (chunk & 0x8080808080808080ULL)
                break;
            i += 8;
        }
        if (i >= n)
            break;
        uint8_t c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int more;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF)
            more = 1;
        else if (c == 0xE0)
            more = 2, lo = 0xA0;
        else if (c >= 0xE1 && c <= 0xEC)
            more = 2;
        else if (c == 0xED)
            more = 2, hi = 0x9F;
        else if (c >= 0xEE && c <= 0xEF)
            more = 2;
        else if (c == 0xF0)
            more = 3, lo = 0x90;
        else if (c >= 0xF1 && c <= 0xF3)
            more = 3;
        else if (c == 0xF4)
            more = 3, hi = 0x8F;
        else
            return 0;
        if (n - i <= more)
            return 0;
        if (p[i + 1] < lo || p[i + 1] > hi)
            return 0;
        for (int k = 2; k <= more; k++)
            if ((p[i + k] & 0xC0) != 0x80)
                return 0;
        i += more + 1;
    }
    return 1;
}

/* --- the walk ----------------------------------------------------------------------------------- */

static int run_members(Walker *w, const int32_t *pc, const int32_t *stop, Py_ssize_t *pos, Py_ssize_t end);
static int run_op(Walker *w, const int32_t *pc, Py_ssize_t *pos, Py_ssize_t end, Py_ssize_t index);

static int op_fixed(Walker *w, const int32_t *pc, Py_ssize_t *pos, Py_ssize_t end, Py_ssize_t index) {
    int kind = pc[1], size = kind_size[kind];
    Py_ssize_t p = *pos;
    if (kind == K_BOOL) {
        if (p >= end)
            return walk_fail(w, p, "bool needs 1 byte, 0 left");
        if (w->b[p] > 1)
            return walk_fail(w, p, "bool byte is %d, not 0 or 1", w->b[p]);
    } else if (need(w, p, end, size, kind_text[kind]) < 0) {
        return -1;
    }
    BUILD(w->builder->fixed(w, pc[3], index, kind, pc[2], p, w->b + p));
    *pos = p + size;
    return 0;
}

static void note_protocol_type(Walker *w, const uint8_t *p, Py_ssize_t n) {
    w->protocol_type = n < 0 || (n == 8 && memcmp(p, "consumer", 8) == 0) ? PT_CONSUMER : PT_OTHER;
}

static int op_text(Walker *w, const int32_t *pc, Py_ssize_t *pos, Py_ssize_t end, Py_ssize_t index) {
    int is_bytes = pc[0] == OP_BYTES, compact = pc[1], nullable = pc[2], role = pc[3], name = pc[4];
    Py_ssize_t start = *pos, p = start;
    i128 n;
    if (read_length(w, &p, end, compact, is_bytes, &n) < 0)
        return -1;
    Py_ssize_t len = (Py_ssize_t)n;
    if (!is_bytes && len > 0 && !utf8_valid(w->b + p, len))
        return walk_fail(w, p, "string is not valid UTF-8");
    Py_ssize_t stop = p + (len > 0 ? len : 0);
    if (role == R_PROTOCOL_TYPE)
        note_protocol_type(w, w->b + p, len);
    if (len > 0 && role == R_RECORDS)
        BUILD(w->builder->records(w, name, start, stop - start, p, len));
    else if (len > 0 && (role == R_CONSUMER_SUBSCRIPTION || role == R_CONSUMER_ASSIGNMENT || role == R_AUTH_BYTES))
        BUILD(w->builder->embedded(w, name, role, start, stop - start, p, len));
    else
        BUILD(w->builder->text(w, name, index, !is_bytes ? FORM_STRING : role == R_RECORDS ? FORM_RECORDS : FORM_BYTES,
                               role, start, stop - start, w->b + p, len, len < 0 && !nullable));
    *pos = stop;
    return 0;
}

static int op_array(Walker *w, const int32_t *pc, Py_ssize_t *pos, Py_ssize_t end) {
    int compact = pc[1], nullable = pc[2], role = pc[3], name = pc[4], type = pc[5];
    const int32_t *element = pc + 7;
    Py_ssize_t start = *pos, p = start;
    i128 n;
    if (compact) {
        u128 raw = 0;
        if (read_uvarint(w, &p, end, &raw) < 0)
            return -1;
        n = (i128)raw - 1;
    } else {
        if (need(w, p, end, 4, "int32") < 0)
            return -1;
        n = (int32_t)read_be(w->b + p, 4);
        p += 4;
    }
    char text[48];
    if (n < 0) {
        if (n == -1) {
            BUILD(w->builder->array_null(w, name, type, start, p - start, !nullable));
            *pos = p;
            return 0;
        }
        format_i128(text, sizeof text, n);
        return walk_fail(w, start, "%s: array length %s is not allowed here", w->prog->texts[name], text);
    }
    if (n > end - p) {
        format_i128(text, sizeof text, n);
        return walk_fail(w, start, "%s: array count %s exceeds the %zd bytes left", w->prog->texts[name], text,
                         end - p);
    }
    BUILD(w->builder->array_begin(w, name, type, role, start, (int64_t)n));
    for (int64_t i = 0; i < (int64_t)n; i++) {
        if (run_op(w, element, &p, end, (Py_ssize_t)i) < 0) {
            if (w->builder->array_end(w, w->fail_at, 0) < 0)
                return python_failed(w);
            return -1;
        }
    }
    BUILD(w->builder->array_end(w, p, 1));
    *pos = p;
    return 0;
}

static int op_struct(Walker *w, const int32_t *pc, Py_ssize_t *pos, Py_ssize_t end, Py_ssize_t index) {
    int nullable = pc[1], name = pc[2], type = pc[3];
    Py_ssize_t start = *pos, p = start;
    if (nullable) {
        /* Kafka marks a nullable struct with a presence byte: -1 null, 1 present */
        if (need(w, p, end, 1, "int8") < 0)
            return -1;
        if ((int8_t)w->b[p++] < 0) {
            BUILD(w->builder->struct_null(w, name, type, start));
            *pos = p;
            return 0;
        }
    }
    BUILD(w->builder->struct_begin(w, name, index, type, start));
    if (run_members(w, pc + 5, pc + 5 + pc[4], &p, end) < 0) {
        if (w->builder->struct_end(w, w->fail_at, 0) < 0)
            return python_failed(w);
        return -1;
    }
    BUILD(w->builder->struct_end(w, p, 1));
    *pos = p;
    return 0;
}

/* The name word of a named op (a tagged field's: never an element). */
static int op_name(const int32_t *op) {
    switch (op[0]) {
    case OP_FIXED:
        return op[3];
    case OP_STRUCT:
        return op[2];
    default: /* STRING, BYTES, ARRAY */
        return op[4];
    }
}

static const int32_t *known_tag(const int32_t *pc, u128 tag) {
    const int32_t *entry = pc + 3;
    for (int32_t k = 0; k < pc[1]; k++) {
        if ((u128)(uint32_t)entry[0] == tag)
            return entry;
        entry += 2 + entry[1];
    }
    return NULL;
}

static int tagged_entries(Walker *w, const int32_t *pc, Py_ssize_t *pos, Py_ssize_t end, uint64_t *count_out) {
    Py_ssize_t start = *pos, p = start;
    u128 count = 0, tag = 0, size = 0;
    char a[48], b[48];
    if (read_uvarint(w, &p, end, &count) < 0)
        return -1;
    *count_out = (uint64_t)count;
    if (count > (u128)(end - p)) {
        format_i128(a, sizeof a, (i128)count);
        return walk_fail(w, start, "tagged field count %s exceeds the %zd bytes left", a, end - p);
    }
    for (u128 i = 0; i < count; i++) {
        if (read_uvarint(w, &p, end, &tag) < 0 || read_uvarint(w, &p, end, &size) < 0)
            return -1;
        if (size > (u128)(end - p)) {
            format_i128(a, sizeof a, (i128)tag);
            format_i128(b, sizeof b, (i128)size);
            return walk_fail(w, p, "tagged field %s size %s exceeds the %zd bytes left", a, b, end - p);
        }
        Py_ssize_t stop = p + (Py_ssize_t)size;
        const int32_t *entry = known_tag(pc, tag);
        if (entry != NULL) {
            const int32_t *op = entry + 2;
            Py_ssize_t got = p;
            if (run_op(w, op, &got, stop, 0) < 0)
                return -1;
            if (got != stop) {
                format_i128(a, sizeof a, (i128)tag);
                return walk_fail(w, got, "tagged field %s (tag %s) has %zd bytes left over",
                                 w->prog->texts[op_name(op)], a, stop - got);
            }
        } else {
            BUILD(w->builder->tagged_unknown(w, tag > UINT64_MAX ? UINT64_MAX : (uint64_t)tag, p, stop - p, w->b + p));
        }
        p = stop;
    }
    *pos = p;
    return 0;
}

static int op_tagged(Walker *w, const int32_t *pc, Py_ssize_t *pos, Py_ssize_t end) {
    Py_ssize_t start = *pos, p = start;
    BUILD(w->builder->tagged_begin(w, start));
    if (p < end && w->b[p] == 0) { /* no tagged fields: by far the most common case */
        BUILD(w->builder->tagged_end(w, p + 1, 0, 1));
        *pos = p + 1;
        return 0;
    }
    uint64_t count = 0;
    if (tagged_entries(w, pc, &p, end, &count) < 0) {
        if (w->builder->tagged_end(w, w->fail_at, count, 0) < 0)
            return python_failed(w);
        return -1;
    }
    BUILD(w->builder->tagged_end(w, p, count, 1));
    *pos = p;
    return 0;
}

static int run_op(Walker *w, const int32_t *pc, Py_ssize_t *pos, Py_ssize_t end, Py_ssize_t index) {
    switch (pc[0]) {
    case OP_FIXED:
        return op_fixed(w, pc, pos, end, index);
    case OP_STRING:
    case OP_BYTES:
        return op_text(w, pc, pos, end, index);
    case OP_ARRAY:
        return op_array(w, pc, pos, end);
    case OP_STRUCT:
        return op_struct(w, pc, pos, end, index);
    case OP_TAGGED:
        return op_tagged(w, pc, pos, end);
    }
    PyErr_Format(PyExc_SystemError, "walk: op %d", pc[0]); /* Program checked its words: cannot happen */
    return python_failed(w);
}

static Py_ssize_t op_length(const int32_t *pc) {
    switch (pc[0]) {
    case OP_FIXED:
        return 4;
    case OP_STRING:
    case OP_BYTES:
        return 5;
    case OP_ARRAY:
        return 7 + pc[6];
    case OP_STRUCT:
        return 5 + pc[4];
    default:
        return 3 + pc[2];
    }
}

static int run_members(Walker *w, const int32_t *pc, const int32_t *stop, Py_ssize_t *pos, Py_ssize_t end) {
    while (pc < stop) {
        if (run_op(w, pc, pos, end, 0) < 0)
            return -1;
        pc += op_length(pc);
    }
    return 0;
}

/* The whole program as one struct named after its root. 0 with *stop set, or -1 (w->failed says why). */
int walk_program(Walker *w, const Program *prog, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t *stop) {
    const Program *outer = w->prog;
    w->prog = prog;
    int32_t root[5] = {OP_STRUCT, 0, prog->root_name, prog->root_type, 0};
    Py_ssize_t p = pos;
    int result = 0;
    if (w->builder->struct_begin(w, root[2], 0, root[3], pos) < 0) {
        result = python_failed(w);
    } else if (run_members(w, prog->ops, prog->ops + prog->length, &p, end) < 0) {
        if (w->builder->struct_end(w, w->fail_at, 0) < 0)
            python_failed(w);
        result = -1;
    } else if (w->builder->struct_end(w, p, 1) < 0) {
        result = python_failed(w);
    }
    w->prog = outer;
    *stop = p;
    return result;
}

/* --- what the walk asks of Python --------------------------------------------------------------- */

#define EMBEDDED_VERSIONS 64
static PyObject *embedded_cache[E_COUNT][EMBEDDED_VERSIONS];

/* The program of an embedded schema at a version, or NULL (no such version; or a Python error is set). */
const Program *embedded_program(int which, int version) {
    int cached = version >= 0 && version < EMBEDDED_VERSIONS;
    if (cached && embedded_cache[which][version] != NULL)
        return embedded_cache[which][version] == Py_None ? NULL : (const Program *)embedded_cache[which][version];
    PyObject *found = PyObject_CallFunction(hooks[H_EMBEDDED], "ii", which, version);
    if (found == NULL)
        return NULL;
    if (found != Py_None && !PyObject_TypeCheck(found, &ProgramType)) {
        Py_DECREF(found);
        PyErr_SetString(PyExc_TypeError, "embedded hook must return a Program or None");
        return NULL;
    }
    if (cached) {
        embedded_cache[which][version] = found; /* kept for the process: a few small programs */
    } else if (found != Py_None) {
        /* Rare versions past the cache stay alive through the hook's own cache in Python. */
        Py_DECREF(found);
    }
    return found == Py_None ? NULL : (const Program *)found;
}

#define KNOWN_ERRORS 512
static PyObject *error_names[KNOWN_ERRORS]; /* codes -1 .. KNOWN_ERRORS-2, filled on first use */
static char error_known[KNOWN_ERRORS];

PyObject *error_name_of(int64_t code) {
    int cached = code >= -1 && code < KNOWN_ERRORS - 1;
    if (cached && error_names[code + 1] != NULL)
        return Py_NewRef(error_names[code + 1]);
    PyObject *name = PyObject_CallFunction(hooks[H_ERROR_NAME], "L", (long long)code);
    if (name != NULL && cached && PyUnicode_Check(name)) {
        const char *text = PyUnicode_AsUTF8(name);
        if (text == NULL) {
            Py_DECREF(name);
            return NULL;
        }
        error_names[code + 1] = Py_NewRef(name);
        error_known[code + 1] = strncmp(text, "UNKNOWN(", 8) != 0;
    }
    return name;
}

/* Whether Kafka defines the code (error_name_of's name is not UNKNOWN(...)); -1 with a Python error. */
int error_code_known(int64_t code) {
    if (code < -1 || code >= KNOWN_ERRORS - 1)
        return 0;
    if (error_names[code + 1] == NULL) {
        PyObject *name = error_name_of(code);
        if (name == NULL)
            return -1;
        Py_DECREF(name);
    }
    return error_known[code + 1];
}

static PyObject *set_hooks(PyObject *self, PyObject *args) {
    static const char *const names[H_COUNT] = {
        "field_type", "malformed_type", "error_name", "decompress", "decompression_failed", "too_large",
        "embedded", "embedded_size", "crc32c", "crc32", "float_json", "topic_text"};
    PyObject *given;
    if (!PyArg_ParseTuple(args, "O!:set_hooks", &PyDict_Type, &given))
        return NULL;
    for (int i = 0; i < H_COUNT; i++) {
        PyObject *value = PyDict_GetItemString(given, names[i]);
        if (value == NULL)
            return PyErr_Format(PyExc_KeyError, "hook %s missing", names[i]);
        Py_XSETREF(hooks[i], Py_NewRef(value));
    }
    Py_RETURN_NONE;
}

int readable_text(const uint8_t *p, Py_ssize_t n, int *plain);

static PyObject *readable(PyObject *self, PyObject *arg) {
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    int plain, found = readable_text(buf.buf, buf.len, &plain);
    PyBuffer_Release(&buf);
    return PyBool_FromLong(found);
}

/* unfilled(n) -> a bytearray of n bytes, not zeroed: for a decompressor to write into, its caller then trimming it
 * to what was written. Zeroing every batch's output buffer first cost 2 % of -V's instructions on records. */
static PyObject *unfilled(PyObject *self, PyObject *arg) {
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 0)
        return PyErr_Format(PyExc_ValueError, "unfilled: negative size %zd", n);
    return PyByteArray_FromStringAndSize(NULL, n);
}

static PyMethodDef methods[] = {
    {"readable", readable, METH_O, "readable(bytes) -> whether they are UTF-8 text of printable characters"},
    {"unfilled", unfilled, METH_O, "unfilled(n) -> bytearray of n bytes, not zeroed (a decompressor's output)"},
    {"set_hooks", set_hooks, METH_VARARGS, "The Python functions the walk calls (see walker.py)."},
    {"summarize", (PyCFunction)(void (*)(void))summarize, METH_FASTCALL,
     "summarize(programs, buf, pos, end, decompress_limit) -> summary tuple"},
    {"screen", screen, METH_VARARGS,
     "screen(schemas, buf, pos, end, steps_allowed) -> ([(index, suspicion)], tried)"},
    {"json_body", json_body, METH_VARARGS, "json_body(program, buf, pos, end, ctx, write) -> None"},
    {"field_tree", field_tree, METH_VARARGS,
     "field_tree(program, buf, pos, end, ctx, limit, record_limit) -> (Field, stop, failure)"},
    {"records_fields", records_fields, METH_VARARGS,
     "records_fields(buf, pos, end, limit, partial_ok, record_limit) -> [Field]"},
    {"records_json", records_json, METH_VARARGS, "records_json(buf, pos, end, prefix, limit) -> bytes"},
    {"record_columns", record_columns, METH_VARARGS,
     "record_columns(program, buf, pos, end, limit, emit, every) -> records (emit(count, groups, column bytes...))"},
    {"partition_facts", partition_facts, METH_VARARGS,
     "partition_facts(program, buf, pos, end, limit, wanted) -> (root facts, topics, packed partitions)"},
    {"text_tree", text_tree, METH_VARARGS, "text_tree(roots, buf, limit, show_secrets, spans, ctx, api_names, "
                                           "topic_names, write, flush_at, decompress_limit) -> (text, spans)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_walk", "The schema walker and its builders.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__walk(void) {
    if (PyType_Ready(&ProgramType) < 0 || PyType_Ready(&FieldBaseType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    PyObject *roles = PyTuple_New(R_COUNT);
    for (int i = 0; roles != NULL && i < R_COUNT; i++) {
        PyObject *role = PyUnicode_InternFromString(role_text[i]);
        if (role == NULL)
            Py_CLEAR(roles);
        else
            PyTuple_SET_ITEM(roles, i, role);
    }
    PyObject *null_int64 = PyLong_FromLongLong(NULL_INT64);
    int failed = roles == NULL || null_int64 == NULL || PyModule_AddObjectRef(m, "ROLES", roles) < 0 ||
                 PyModule_AddObjectRef(m, "Program", (PyObject *)&ProgramType) < 0 ||
                 PyModule_AddObjectRef(m, "FieldBase", (PyObject *)&FieldBaseType) < 0 ||
                 PyModule_AddObjectRef(m, "NULL_INT64", null_int64) < 0 ||
                 PyModule_AddIntConstant(m, "NULL_INT32", NULL_INT32) < 0 ||
                 PyModule_AddIntConstant(m, "PACKED_HEAD_WORDS", PACKED_HEAD_WORDS) < 0 ||
                 PyModule_AddIntConstant(m, "PACKED_BATCH_WORDS", PACKED_BATCH_WORDS) < 0;
    Py_XDECREF(roles);
    Py_XDECREF(null_int64);
    if (failed) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
