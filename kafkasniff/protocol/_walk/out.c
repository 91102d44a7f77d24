/* A growable byte buffer, and the JSON text the builders write into it (as orjson writes it). */
#include "walk.h"

int out_grow(Out *o, Py_ssize_t more) {
    if (more > PY_SSIZE_T_MAX / 2 - o->len) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t cap = o->cap ? o->cap : 4096;
    while (cap - o->len < more)
        cap *= 2;
    char *data = PyMem_Realloc(o->data, cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    o->data = data;
    o->cap = cap;
    return 0;
}

static const char digit_pairs[] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

int out_u64(Out *o, uint64_t v) {
    char digits[24];
    int at = 24;
    while (v >= 100) { /* two digits a step */
        unsigned pair = (unsigned)(v % 100) * 2;
        v /= 100;
        digits[--at] = digit_pairs[pair + 1];
        digits[--at] = digit_pairs[pair];
    }
    if (v >= 10) {
        digits[--at] = digit_pairs[v * 2 + 1];
        digits[--at] = digit_pairs[v * 2];
    } else {
        digits[--at] = (char)('0' + v);
    }
    return out_write(o, digits + at, 24 - at);
}

int out_i64(Out *o, int64_t v) {
    if (v < 0) {
        if (out_char(o, '-') < 0)
            return -1;
        return out_u64(o, (uint64_t)0 - (uint64_t)v);
    }
    return out_u64(o, (uint64_t)v);
}

int out_i128(Out *o, i128 v) {
    if (v >= INT64_MIN && v <= INT64_MAX)
        return out_i64(o, (int64_t)v);
    char text[48];
    format_i128(text, sizeof text, v);
    return out_write(o, text, (Py_ssize_t)strlen(text));
}

/* How each byte is written in a JSON string: 0 as it is, else the letter after its backslash ('u': \u00XX). */
static const char escapes[256] = {
    'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'b', 't', 'n', 'u', 'f', 'r', 'u', 'u',
    'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u',
    0, 0, '"', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, '\\', 0, 0, 0,
    /* the rest: 0 */
};

/* A JSON string of valid UTF-8: quotes, backslashes and control characters escaped, the rest as it is. */
int out_json_string(Out *o, const uint8_t *p, Py_ssize_t n) {
    static const char hex[] = "0123456789abcdef";
    /* at most 6 output bytes per input byte, plus the quotes */
    if (n > (PY_SSIZE_T_MAX - 2) / 6 || out_reserve(o, 6 * n + 2) < 0) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return -1;
    }
    char *d = o->data + o->len;
    *d++ = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        uint8_t c = p[i];
        char escape = escapes[c];
        if (!escape) {
            *d++ = (char)c;
            continue;
        }
        *d++ = '\\';
        *d++ = escape;
        if (escape == 'u') {
            *d++ = '0';
            *d++ = '0';
            *d++ = hex[c >> 4];
            *d++ = hex[c & 15];
        }
    }
    *d++ = '"';
    o->len = d - o->data;
    return 0;
}

static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
static char base64_pairs[4096][2]; /* twelve bits -> two characters, made on first use */

static void base64_pairs_ready(void) {
    if (base64_pairs[1][1])
        return;
    for (int i = 0; i < 4096; i++) {
        base64_pairs[i][0] = alphabet[i >> 6];
        base64_pairs[i][1] = alphabet[i & 63];
    }
}

/* Bytes, losslessly: {"base64": ..., "text": ...}, text only when the bytes are valid UTF-8; null for null. */
int out_json_bytes(Out *o, const uint8_t *p, Py_ssize_t n) {
    if (n < 0)
        return OUT_LIT(o, "null");
    base64_pairs_ready();
    Py_ssize_t encoded = (n + 2) / 3 * 4;
    if (OUT_LIT(o, "{\"base64\":\"") < 0 || out_reserve(o, encoded + 2) < 0)
        return -1;
    char *d = o->data + o->len;
    Py_ssize_t i = 0;
    for (; i + 3 <= n; i += 3, d += 4) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        memcpy(d, base64_pairs[v >> 12], 2);
        memcpy(d + 2, base64_pairs[v & 4095], 2);
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)p[i] << 16;
        *d++ = alphabet[v >> 18];
        *d++ = alphabet[(v >> 12) & 63];
        *d++ = '=';
        *d++ = '=';
    } else if (n - i == 2) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8;
        *d++ = alphabet[v >> 18];
        *d++ = alphabet[(v >> 12) & 63];
        *d++ = alphabet[(v >> 6) & 63];
        *d++ = '=';
    }
    *d++ = '"';
    o->len = d - o->data;
    if (utf8_valid(p, n)) {
        if (OUT_LIT(o, ",\"text\":") < 0 || out_json_string(o, p, n) < 0)
            return -1;
    }
    return out_char(o, '}');
}

int out_uuid(Out *o, const uint8_t *p) {
    static const char hex[] = "0123456789abcdef";
    if (out_reserve(o, 36) < 0)
        return -1;
    char *d = o->data + o->len;
    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10)
            *d++ = '-';
        *d++ = hex[p[i] >> 4];
        *d++ = hex[p[i] & 15];
    }
    o->len += 36;
    return 0;
}

void out_free(Out *o) {
    PyMem_Free(o->data);
    o->data = NULL;
    o->len = o->cap = 0;
}
