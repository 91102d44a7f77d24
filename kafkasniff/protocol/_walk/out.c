/* A growable byte buffer, and the JSON text the builders write into it (as orjson writes it). */
#include "walk.h"

int out_reserve(Out *o, Py_ssize_t more) {
    if (o->cap - o->len >= more)
        return 0;
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

int out_write(Out *o, const void *p, Py_ssize_t n) {
    if (n == 0) /* p may be NULL then (an empty prefix, say), which memcpy must not see */
        return 0;
    if (out_reserve(o, n) < 0)
        return -1;
    memcpy(o->data + o->len, p, n);
    o->len += n;
    return 0;
}

int out_char(Out *o, char c) {
    if (o->len == o->cap && out_reserve(o, 1) < 0)
        return -1;
    o->data[o->len++] = c;
    return 0;
}

int out_u64(Out *o, uint64_t v) {
    char digits[24];
    int n = 0;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    if (out_reserve(o, n) < 0)
        return -1;
    while (n)
        o->data[o->len++] = digits[--n];
    return 0;
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
        if (c >= 0x20 && c != '"' && c != '\\') {
            *d++ = (char)c;
            continue;
        }
        *d++ = '\\';
        switch (c) {
        case '"': *d++ = '"'; break;
        case '\\': *d++ = '\\'; break;
        case '\b': *d++ = 'b'; break;
        case '\t': *d++ = 't'; break;
        case '\n': *d++ = 'n'; break;
        case '\f': *d++ = 'f'; break;
        case '\r': *d++ = 'r'; break;
        default:
            *d++ = 'u';
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

/* Bytes, losslessly: {"base64": ..., "text": ...}, text only when the bytes are valid UTF-8; null for null. */
int out_json_bytes(Out *o, const uint8_t *p, Py_ssize_t n) {
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    if (n < 0)
        return OUT_LIT(o, "null");
    Py_ssize_t encoded = (n + 2) / 3 * 4;
    if (OUT_LIT(o, "{\"base64\":\"") < 0 || out_reserve(o, encoded + 2) < 0)
        return -1;
    char *d = o->data + o->len;
    Py_ssize_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        *d++ = alphabet[v >> 18];
        *d++ = alphabet[(v >> 12) & 63];
        *d++ = alphabet[(v >> 6) & 63];
        *d++ = alphabet[v & 63];
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
