/* The text builder: a message as the -V tree of text lines, records included, in the walk that reads it.
 *
 *   ├── header  RequestHeader v2
 *   │   ├── CorrelationId: 3  int32
 *   ...
 *   └── body  ProduceRequest
 *       └── TopicData: 1 items  []TopicProduceData
 *
 * A line's connector says whether its item is the last of its parent's, which the bytes tell only later
 * for the fields of a struct (a tagged section may follow). So the message's own fields are first made into
 * a small tree of labelled nodes (its size follows the frame's), then drawn; a records field is drawn by
 * reading its records there and then, item by item, and the text goes to `write` as it grows, so a Fetch of
 * millions of records never sits in memory. Items of a records list are last when they reach its end; a
 * record waits until the next one (or the end of its batch) says whether it was the last.
 *
 * With spans, every styled stretch of text is also given as (start, end, style) for a terminal's colours.
 */
#include "walk.h"

#ifdef __SSE2__
#include <emmintrin.h>
#endif

#define MAX_NEST 200

enum style { ST_NONE, ST_BOLD, ST_DIM, ST_RED, ST_BOLD_RED, ST_GREEN, ST_YELLOW, ST_MAGENTA, ST_BOLD_CYAN };

/* --- writing text with styles ------------------------------------------------------------------ */

typedef struct {
    Out *text;
    Out *spans; /* int32 triples (start, end, style), positions in text; NULL: no styles wanted */
} Writer;

/* The small writers here and the line's (label_*, line_*, leaf*) are inline: each runs several times for
 * every line, millions of lines in a records-heavy -V, and inlined, the lengths of the literal strings they
 * write are known where they are called (no strlen, no memcpy call). */
static inline int styled(Writer *wr, Py_ssize_t start, int style) {
    if (wr->spans == NULL || style == ST_NONE || wr->text->len == start)
        return 0;
    int32_t span[3] = {(int32_t)start, (int32_t)wr->text->len, style};
    return out_write(wr->spans, span, sizeof span);
}

static inline int put(Writer *wr, const char *s, Py_ssize_t n, int style) {
    Py_ssize_t start = wr->text->len;
    if (out_write(wr->text, s, n) < 0)
        return -1;
    return styled(wr, start, style);
}
#define PUT(wr, s, style) put((wr), (s), (Py_ssize_t)strlen(s), (style))

static int put_i128(Writer *wr, i128 v) { return out_i128(wr->text, v); }

/* n with a comma between each three digits; written backwards into a small buffer (no snprintf: a record
 * batch's sizes and counts are written this way, hundreds of thousands of times in a records-heavy -V). */
static int put_commas(Writer *wr, int64_t n) {
    char out[32];
    int at = sizeof out, digits = 0;
    uint64_t v = n < 0 ? (uint64_t)0 - (uint64_t)n : (uint64_t)n;
    do {
        if (digits && digits % 3 == 0)
            out[--at] = ',';
        out[--at] = (char)('0' + v % 10);
        v /= 10;
        digits++;
    } while (v);
    if (n < 0)
        out[--at] = '-';
    return put(wr, out + at, (Py_ssize_t)sizeof out - at, ST_NONE);
}

/* Python's repr() of a str, by Python: for text that is not plain printable ASCII. */
static int put_python_repr(Writer *wr, PyObject *text) {
    PyObject *shown = PyObject_Repr(text);
    if (shown == NULL)
        return -1;
    Py_ssize_t n;
    const char *utf8 = PyUnicode_AsUTF8AndSize(shown, &n);
    int failed = utf8 == NULL || put(wr, utf8, n, ST_NONE) < 0;
    Py_DECREF(shown);
    return failed ? -1 : 0;
}

/* The first `limit` characters of text and an ellipsis (a new reference, or NULL). */
static PyObject *cut_text(PyObject *text, Py_ssize_t limit) {
    PyObject *head = PyUnicode_Substring(text, 0, limit);
    PyObject *ellipsis = PyUnicode_FromOrdinal(0x2026);
    PyObject *cut = head && ellipsis ? PyUnicode_Concat(head, ellipsis) : NULL;
    Py_XDECREF(head);
    Py_XDECREF(ellipsis);
    return cut;
}

static int plain_ascii(const uint8_t *p, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (p[i] < 0x20 || p[i] > 0x7E)
            return 0;
    return 1;
}

enum { MARK_SINGLE = 1, MARK_DOUBLE = 2, MARK_BACKSLASH = 4 };
static const uint8_t quote_mark[256] = {['\''] = MARK_SINGLE, ['"'] = MARK_DOUBLE, ['\\'] = MARK_BACKSLASH};

/* Which of ' " \ p[0:n] holds (MARK_ bits): what repr() chooses its quote by and escapes. One pass, where
 * three memchr calls read a value three times (a records-heavy -V shows two values a record). */
static int quote_marks(const uint8_t *p, Py_ssize_t n) {
    int marks = 0;
#ifdef __SSE2__
    if (n >= 16) {
        const __m128i single = _mm_set1_epi8('\''), dbl = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\');
        __m128i s = _mm_setzero_si128(), d = s, b = s;
        for (Py_ssize_t i = 0;; i += 16) {
            if (i + 16 > n)
                i = n - 16; /* the last 16 bytes, overlapping some already seen: only whether any is found counts */
            __m128i x = _mm_loadu_si128((const __m128i *)(p + i));
            s = _mm_or_si128(s, _mm_cmpeq_epi8(x, single));
            d = _mm_or_si128(d, _mm_cmpeq_epi8(x, dbl));
            b = _mm_or_si128(b, _mm_cmpeq_epi8(x, backslash));
            if (i + 16 >= n)
                break;
        }
        return (_mm_movemask_epi8(s) ? MARK_SINGLE : 0) | (_mm_movemask_epi8(d) ? MARK_DOUBLE : 0) |
               (_mm_movemask_epi8(b) ? MARK_BACKSLASH : 0);
    }
#endif
    for (Py_ssize_t i = 0; i < n; i++)
        marks |= quote_mark[p[i]];
    return marks;
}

/* repr() of plain printable ASCII (no quotes chosen yet): what Python writes, without asking Python. */
static int put_ascii_repr(Writer *wr, const uint8_t *p, Py_ssize_t shown, int cut) {
    int marks = quote_marks(p, shown);
    int single = marks & MARK_SINGLE, dbl = marks & MARK_DOUBLE;
    char quote = single && !dbl ? '"' : '\'';
    Out *o = wr->text;
    if (out_reserve(o, 2 * shown + 8) < 0)
        return -1;
    char *d = o->data + o->len;
    *d++ = quote;
    if (!(marks & MARK_BACKSLASH) && !(single && dbl)) { /* nothing to escape (most values): copied whole */
        memcpy(d, p, shown);
        d += shown;
    } else {
        for (Py_ssize_t i = 0; i < shown; i++) {
            if (p[i] == '\\' || p[i] == (uint8_t)quote)
                *d++ = '\\';
            *d++ = (char)p[i];
        }
    }
    if (cut) {
        memcpy(d, "\xe2\x80\xa6", 3);
        d += 3;
    }
    *d++ = quote;
    o->len = d - o->data;
    return 0;
}

/* repr() of UTF-8 text cut to `limit` characters (an ellipsis marks the cut; limit < 0: no cut). */
static int put_repr(Writer *wr, const uint8_t *p, Py_ssize_t n, int limit) {
    int cut = limit >= 0 && n > limit;
    Py_ssize_t shown = cut ? limit : n;
    /* the shown characters are its first `shown` bytes when those are ASCII */
    if (plain_ascii(p, shown))
        return put_ascii_repr(wr, p, shown, cut);
    PyObject *text = PyUnicode_DecodeUTF8((const char *)p, n, "strict");
    if (text == NULL)
        return -1;
    if (limit >= 0 && PyUnicode_GET_LENGTH(text) > limit) {
        Py_SETREF(text, cut_text(text, limit));
        if (text == NULL)
            return -1;
    }
    int failed = put_python_repr(wr, text);
    Py_DECREF(text);
    return failed;
}

/* Whether bytes are text a person can read: valid UTF-8, every character printable (or a tab or newline).
 * The whole value is looked at, nothing is allocated: a value can be megabytes long. `plain` says whether it
 * is printable ASCII only (no tabs or newlines either), which repr() shows as it is. */
#ifdef __SSE2__
/* Whether p[0:16] is printable ASCII: none below 0x20 as signed bytes (so no high bit), none 0x7F. */
static inline int printable16(const uint8_t *p) {
    __m128i x = _mm_loadu_si128((const __m128i *)p);
    __m128i unprintable = _mm_or_si128(_mm_cmplt_epi8(x, _mm_set1_epi8(0x20)), _mm_cmpeq_epi8(x, _mm_set1_epi8(0x7F)));
    return !_mm_movemask_epi8(unprintable);
}
#endif

int readable_text(const uint8_t *p, Py_ssize_t n, int *plain) {
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    *plain = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
#ifdef __SSE2__
        /* sixteen printable ASCII bytes at a time */
        while (i + 16 <= n && printable16(p + i))
            i += 16;
        /* fewer than 16 left: the last 16 bytes, some read already, say at once whether they are all printable
         * (most values end so, and their last bytes are not read one by one) */
        if (i < n && i + 16 > n && n >= 16 && printable16(p + n - 16))
            break;
#endif
        /* eight printable ASCII bytes at a time (the rest of them, or all without SSE2): no high bit, none
         * below 0x20, none at 0x7F */
        while (i + 8 <= n) {
            uint64_t x;
            memcpy(&x, p + i, 8);
            if ((x | ((x - ones * 0x20) & ~x) | (x + ones)) & highs)
                break;
            i += 8;
        }
        if (i >= n)
            break;
        uint8_t c = p[i];
        if (c >= 0x20 && c < 0x7F)
            continue;
        *plain = 0;
        if (c < 0x80) {
            if (c == 0x7F || (c != '\t' && c != '\n' && c != '\r'))
                return 0;
            continue;
        }
        int more = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
        if (n - i <= more || !utf8_valid(p + i, more + 1))
            return 0;
        Py_UCS4 code = c & (0x3F >> more);
        for (int k = 1; k <= more; k++)
            code = code << 6 | (p[i + k] & 0x3F);
        if (!Py_UNICODE_ISPRINTABLE(code))
            return 0;
        i += more;
    }
    return 1;
}

/* Bytes as people read them: quoted text when readable, else hex; long ones cut, with their size. */
static int put_bytes(Writer *wr, const uint8_t *p, Py_ssize_t n, int limit) {
    int plain;
    if (readable_text(p, n, &plain)) {
        int cut = limit >= 0 && n > limit;
        if (plain) {
            if (put_ascii_repr(wr, p, cut ? limit : n, cut) < 0)
                return -1;
        } else if (put_repr(wr, p, n, limit) < 0) { /* tabs and newlines are escaped; characters, not bytes */
            return -1;
        }
    } else {
        static const char hex[] = "0123456789abcdef";
        Py_ssize_t shown = limit >= 0 && n > limit / 2 ? limit / 2 : n;
        Out *o = wr->text;
        if (out_reserve(o, 3 * shown + 8) < 0)
            return -1;
        char *d = o->data + o->len; /* a local cursor: stores through o->data could change o->len, to the compiler */
        *d++ = '0';
        *d++ = 'x';
        for (Py_ssize_t i = 0; i < shown; i++) {
            if (i)
                *d++ = ' ';
            *d++ = hex[p[i] >> 4];
            *d++ = hex[p[i] & 15];
        }
        o->len = d - o->data;
        if (shown < n && OUT_LIT(o, " \xe2\x80\xa6") < 0)
            return -1;
    }
    if (limit >= 0 && n > limit / 2)
        return OUT_LIT(wr->text, " (") < 0 || put_commas(wr, n) < 0 ? -1 : OUT_LIT(wr->text, " bytes)");
    return 0;
}

/* A time in milliseconds since the epoch, as UTC with milliseconds. Records of a batch mostly share their
 * second: its text is remembered. */
static int put_timestamp(Writer *wr, i128 ms) {
    static int64_t last_second = INT64_MIN;
    static char last_text[64];
    static Py_ssize_t last_len;
    if (ms < 0)
        return PUT(wr, "no timestamp", ST_NONE);
    int64_t second;
    int millis;
    if (ms <= INT64_MAX) { /* every real time: 64-bit division (128-bit division is a library call) */
        second = (int64_t)ms / 1000;
        millis = (int)((int64_t)ms % 1000);
    } else {
        if (ms / 1000 > (i128)INT64_MAX / 2)
            return put_i128(wr, ms);
        second = (int64_t)(ms / 1000);
        millis = (int)(ms % 1000);
    }
    if (second != last_second) {
        time_t seconds = (time_t)second;
        struct tm tm;
        size_t len;
        if (gmtime_r(&seconds, &tm) == NULL || (len = strftime(last_text, sizeof last_text, "%Y-%m-%dT%H:%M:%S",
                                                              &tm)) == 0) {
            last_second = INT64_MIN;
            return put_i128(wr, ms);
        }
        last_second = second;
        last_len = (Py_ssize_t)len;
    }
    char tail[6] = {'.', (char)('0' + millis / 100), (char)('0' + millis / 10 % 10), (char)('0' + millis % 10), 'Z'};
    if (put(wr, last_text, last_len, ST_NONE) < 0)
        return -1;
    return put(wr, tail, 5, ST_NONE);
}

static int put_object_text(Writer *wr, PyObject *value) {
    PyObject *text = PyObject_Str(value);
    if (text == NULL)
        return -1;
    Py_ssize_t n;
    const char *utf8 = PyUnicode_AsUTF8AndSize(text, &n);
    int failed = utf8 == NULL || put(wr, utf8, n, ST_NONE) < 0;
    Py_DECREF(text);
    return failed ? -1 : 0;
}

/* --- the builder's state ----------------------------------------------------------------------- */

typedef struct {
    Py_ssize_t text_at, text_len;   /* its label in the arena */
    Py_ssize_t spans_at, spans_len; /* its styles in the arena's spans, positions from text_at */
    int32_t first, last, next;      /* children and siblings; -1: none */
    /* a records field, drawn with its records */
    int records;
    Py_ssize_t data_at, data_n;
} Node;

typedef struct {
    int node;         /* the open node */
    int kind;         /* what it is: for arrays, the label is made at the end */
    int name, type;
    int64_t count;    /* an array's count on the wire */
    int items;        /* an array's items read */
    int named_topic;  /* a struct that names its topic: its topic id needs no name beside it */
} Open;

enum open_kind { O_STRUCT, O_ARRAY, O_EMBEDDED };

typedef struct {
    /* output */
    Out out, spans;
    int want_spans;
    PyObject *write;
    Py_ssize_t flush_at;
    int limit;                     /* characters of a value shown; -1: all */
    int show_secrets;
    PyObject *ctx, *api_names;
    PyObject *topic_names;         /* topic id -> name, as learned from the capture so far (or NULL) */
    int mark_topic_ids;            /* instead: NUL, the id, NUL where a name would go (TOPIC_ID_MARK) */
    /* the message's fields, before they are drawn */
    Node *nodes;
    int n_nodes, cap_nodes;
    Out arena, arena_spans;
    Open open[MAX_NEST];
    int depth;
    int merge_root;                /* an embedded schema's fields go under the open node */
    const char *root_label;        /* the type text of the root being walked */
    /* drawing */
    Out prefix;
    struct {                       /* items of an array past ITEMS_SHOWN, or of any array once the tree has
                                      TREE_FIELDS_MAX nodes (unless all values are shown), not made */
        int open;
        int level;                 /* the depth of their array */
        int depth;                 /* > 0 inside one of them: containers open in it */
        int past_tree_limit;       /* opened by TREE_FIELDS_MAX, not by the array's own count */
        Py_ssize_t start;
        int64_t count;
    } hidden;
} Text;

static Writer output(Text *t) { return (Writer){&t->out, t->want_spans ? &t->spans : NULL}; }
static Writer arena(Text *t) { return (Writer){&t->arena, t->want_spans ? &t->arena_spans : NULL}; }

static int new_node(Text *t) {
    if (t->n_nodes == t->cap_nodes) {
        int cap = t->cap_nodes ? t->cap_nodes * 2 : 256;
        Node *nodes = PyMem_Realloc(t->nodes, cap * sizeof(Node));
        if (nodes == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        t->nodes = nodes;
        t->cap_nodes = cap;
    }
    int i = t->n_nodes++;
    t->nodes[i] = (Node){.first = -1, .last = -1, .next = -1};
    if (t->depth) {
        Node *parent = &t->nodes[t->open[t->depth - 1].node];
        if (parent->last >= 0)
            t->nodes[parent->last].next = i;
        else
            parent->first = i;
        parent->last = i;
    }
    return i;
}

/* Start the label of a new node in the arena; finish_label closes it. */
static int start_label(Text *t) {
    int i = new_node(t);
    if (i < 0)
        return -1;
    t->nodes[i].text_at = t->arena.len;
    t->nodes[i].spans_at = t->arena_spans.len;
    return i;
}

static void finish_label(Text *t, int i) {
    t->nodes[i].text_len = t->arena.len - t->nodes[i].text_at;
    t->nodes[i].spans_len = t->arena_spans.len - t->nodes[i].spans_at;
}

static int push(Text *t, int node, int kind) {
    if (t->depth >= MAX_NEST) {
        PyErr_SetString(PyExc_RecursionError, "text: nested too deep");
        return -1;
    }
    t->open[t->depth++] = (Open){.node = node, .kind = kind};
    return 0;
}

static const char *name_text(Walker *w, int name, Py_ssize_t index, char *buf, size_t size) {
    if (name >= 0)
        return w->prog->texts[name];
    snprintf(buf, size, "[%zd]", index);
    return buf;
}

/* "name: value  type": the value is written by the caller between label_value and label_type. */
static inline int label_name(Writer *wr, const char *name) { return PUT(wr, name, ST_BOLD); }
static inline int label_value(Writer *wr) { return PUT(wr, ": ", ST_NONE); }
static inline int label_type(Writer *wr, const char *type) {
    Py_ssize_t start = wr->text->len;
    if (OUT_LIT(wr->text, "  ") < 0 || PUT(wr, type, ST_NONE) < 0)
        return -1;
    return styled(wr, start, ST_DIM);
}
static int note(Writer *wr, const char *text) {
    return OUT_LIT(wr->text, " (") < 0 || PUT(wr, text, ST_NONE) < 0 ? -1 : OUT_LIT(wr->text, ")");
}
static int note_object(Writer *wr, PyObject *text) {
    return OUT_LIT(wr->text, " (") < 0 || put_object_text(wr, text) < 0 ? -1 : OUT_LIT(wr->text, ")");
}

/* A topic's name as the capture gave it, as every view shows it (topics.topic_text: escaped unless printable). */
static int note_topic_name(Writer *wr, PyObject *name) {
    PyObject *text = PyObject_CallOneArg(hook(H_TOPIC_TEXT), name);
    if (text == NULL)
        return -1;
    int failed = note_object(wr, text);
    Py_DECREF(text);
    return failed;
}

/* A fixed-width value as the tree shows it (with its error name, API name, hex or time by role). */
static int put_fixed(Text *t, Writer *wr, int kind, int role, const uint8_t *p) {
    if (kind == K_BOOL)
        return p[0] ? PUT(wr, "true", ST_NONE) : PUT(wr, "false", ST_NONE);
    if (kind == K_UUID) {
        char text[38];
        Out o = {text, 0, sizeof text};
        text[0] = '\'';
        o.len = 1;
        out_uuid(&o, (const uint8_t *)p);
        text[37] = '\'';
        if (put(wr, text, 38, ST_NONE) < 0)
            return -1;
        if (role != R_TOPIC_ID || (t->topic_names == NULL && !t->mark_topic_ids) ||
            (t->depth && t->open[t->depth - 1].named_topic))
            return 0;
        if (t->mark_topic_ids) { /* a parallel worker's: the parent, reading in capture order, puts the name */
            text[0] = text[37] = '\0';
            return put(wr, text, 38, ST_NONE);
        }
        /* a topic named by id only: the name the capture gave that id, when it did */
        PyObject *id = PyUnicode_FromStringAndSize(text + 1, 36);
        PyObject *name = id ? PyDict_GetItemWithError(t->topic_names, id) : NULL;
        Py_XDECREF(id);
        if (name != NULL)
            return note_topic_name(wr, name);
        return PyErr_Occurred() ? -1 : 0;
    }
    if (kind == K_FLOAT64) {
        uint64_t bits = (uint64_t)fixed_value(K_INT64, p);
        double v;
        memcpy(&v, &bits, 8);
        PyObject *number = PyFloat_FromDouble(v);
        if (number == NULL)
            return -1;
        int failed = put_object_text(wr, number);
        Py_DECREF(number);
        return failed;
    }
    int64_t v = fixed_value(kind, p);
    if (role == R_CHECKSUM) {
        char text[16];
        snprintf(text, sizeof text, "0x%08llx", (unsigned long long)(uint32_t)v);
        return PUT(wr, text, ST_NONE);
    }
    Py_ssize_t start = wr->text->len;
    if (out_i64(wr->text, v) < 0)
        return -1;
    if (role == R_ERROR_CODE) {
        PyObject *name = error_name_of(v);
        if (name == NULL || note_object(wr, name) < 0) {
            Py_XDECREF(name);
            return -1;
        }
        Py_DECREF(name);
        return v ? styled(wr, start, ST_RED) : 0;
    }
    if (role == R_API_KEY && t->api_names != NULL) {
        PyObject *key = PyLong_FromLongLong(v);
        PyObject *name = key ? PyDict_GetItemWithError(t->api_names, key) : NULL;
        Py_XDECREF(key);
        if (name != NULL)
            return note_object(wr, name);
        return PyErr_Occurred() ? -1 : 0;
    }
    if (role == R_CONTROL_TYPE)
        return note(wr, control_type_name(v));
    if (role == R_TIMESTAMP)
        return OUT_LIT(wr->text, " (") < 0 || put_timestamp(wr, v) < 0 ? -1 : OUT_LIT(wr->text, ")");
    return 0;
}

/* --- the message's fields ---------------------------------------------------------------------- */

static int tb_fixed(Walker *w, int name, Py_ssize_t index, int kind, int role, Py_ssize_t at, const uint8_t *p) {
    Text *t = w->state;
    Writer wr = arena(t);
    char buf[32];
    int i = start_label(t);
    if (i < 0 || label_name(&wr, name_text(w, name, index, buf, sizeof buf)) < 0 || label_value(&wr) < 0 ||
        put_fixed(t, &wr, kind, role, p) < 0 || label_type(&wr, kind_text[kind]) < 0)
        return -1;
    finish_label(t, i);
    if (t->depth)
        t->open[t->depth - 1].items++;
    return 0;
}

static int tb_text(Walker *w, int name, Py_ssize_t index, int form, int role, Py_ssize_t at, Py_ssize_t size,
                   const uint8_t *p, Py_ssize_t n, int not_nullable) {
    Text *t = w->state;
    Writer wr = arena(t);
    char buf[32];
    int i = start_label(t);
    if (i < 0 || label_name(&wr, name_text(w, name, index, buf, sizeof buf)) < 0 || label_value(&wr) < 0)
        return -1;
    int failed;
    if (n < 0)
        failed = PUT(&wr, "null", ST_NONE) < 0 || (not_nullable && note(&wr, "not nullable at this version") < 0);
    else if (form == FORM_STRING)
        failed = put_repr(&wr, p, n, t->limit);
    else
        failed = put_bytes(&wr, p, n, t->limit);
    if (failed || label_type(&wr, form == FORM_STRING ? "string" : form == FORM_BYTES ? "bytes" : "records") < 0)
        return -1;
    finish_label(t, i);
    if (role == R_TOPIC_NAME && n >= 0 && name >= 0 && t->depth)
        t->open[t->depth - 1].named_topic = 1;
    if (t->depth)
        t->open[t->depth - 1].items++;
    return 0;
}

static int tb_array_begin(Walker *w, int name, int type, int role, Py_ssize_t at, int64_t count) {
    Text *t = w->state;
    int i = new_node(t);
    if (i < 0 || push(t, i, O_ARRAY) < 0)
        return -1;
    Open *o = &t->open[t->depth - 1];
    o->name = name;
    o->type = type;
    o->count = count;
    return 0;
}

/* An array's label, made at its end: how many items it has (on the wire and read, when they differ). */
static int tb_array_end(Walker *w, Py_ssize_t end, int ok) {
    (void)ok; /* a failed array says how many of its items were decoded */
    Text *t = w->state;
    Open *o = &t->open[t->depth - 1];
    Node *node = &t->nodes[o->node];
    Writer wr = arena(t);
    node->text_at = t->arena.len;
    node->spans_at = t->arena_spans.len;
    char text[96];
    if (o->items == o->count)
        snprintf(text, sizeof text, "%d items", o->items);
    else
        snprintf(text, sizeof text, "%lld on the wire, %d decoded", (long long)o->count, o->items);
    if (label_name(&wr, w->prog->texts[o->name]) < 0 || label_value(&wr) < 0 || PUT(&wr, text, ST_NONE) < 0 ||
        label_type(&wr, w->prog->texts[o->type]) < 0)
        return -1;
    finish_label(t, o->node);
    t->depth--;
    if (t->depth)
        t->open[t->depth - 1].items++;
    return 0;
}

static int tb_array_null(Walker *w, int name, int type, Py_ssize_t at, Py_ssize_t size, int not_nullable) {
    Text *t = w->state;
    Writer wr = arena(t);
    int i = start_label(t);
    if (i < 0 || label_name(&wr, w->prog->texts[name]) < 0 || label_value(&wr) < 0 || PUT(&wr, "null", ST_NONE) < 0 ||
        (not_nullable && note(&wr, "not nullable at this version") < 0) || label_type(&wr, w->prog->texts[type]) < 0)
        return -1;
    finish_label(t, i);
    return 0;
}

static int tb_struct_begin(Walker *w, int name, Py_ssize_t index, int type, Py_ssize_t at) {
    Text *t = w->state;
    if (t->merge_root) { /* an embedded schema: its fields join the node of the bytes that hold them */
        t->merge_root = 0;
        return push(t, t->open[t->depth - 1].node, O_EMBEDDED);
    }
    Writer wr = arena(t);
    char buf[32];
    int i = start_label(t);
    if (i < 0)
        return -1;
    if (t->depth == 0) { /* the header or the body */
        if (label_name(&wr, w->prog->texts[name]) < 0 || label_type(&wr, t->root_label) < 0)
            return -1;
    } else if (name < 0) { /* an array's item */
        if (label_name(&wr, name_text(w, name, index, buf, sizeof buf)) < 0)
            return -1;
    } else if (label_name(&wr, w->prog->texts[name]) < 0 || label_type(&wr, w->prog->texts[type]) < 0) {
        return -1;
    }
    finish_label(t, i);
    return push(t, i, O_STRUCT);
}

static int tb_struct_null(Walker *w, int name, int type, Py_ssize_t at) {
    Text *t = w->state;
    Writer wr = arena(t);
    int i = start_label(t);
    if (i < 0 || label_name(&wr, w->prog->texts[name]) < 0 || label_value(&wr) < 0 || PUT(&wr, "null", ST_NONE) < 0 ||
        label_type(&wr, w->prog->texts[type]) < 0)
        return -1;
    finish_label(t, i);
    return 0;
}

static int tb_struct_end(Walker *w, Py_ssize_t end, int ok) {
    Text *t = w->state;
    t->depth--;
    if (t->depth && t->open[t->depth].kind == O_STRUCT)
        t->open[t->depth - 1].items++;
    return 0;
}

static int tb_tagged_begin(Walker *w, Py_ssize_t at) { return 0; }

static int tb_tagged_unknown(Walker *w, uint64_t tag, Py_ssize_t at, Py_ssize_t size, const uint8_t *p) {
    Text *t = w->state;
    Writer wr = arena(t);
    char name[48], text[48];
    snprintf(name, sizeof name, "tag_%llu", (unsigned long long)tag);
    snprintf(text, sizeof text, "unknown tag %llu", (unsigned long long)tag);
    int i = start_label(t);
    if (i < 0 || label_name(&wr, name) < 0 || label_value(&wr) < 0 || put_bytes(&wr, p, size, t->limit) < 0 ||
        note(&wr, text) < 0 || label_type(&wr, "unknown_tag") < 0)
        return -1;
    finish_label(t, i);
    return 0;
}

static int tb_tagged_end(Walker *w, Py_ssize_t end, uint64_t count, int ok) { return 0; }

/* Counting the items of a records field before it is drawn (its label says how many). */
typedef struct {
    int64_t items;
    int first_is_message;
} Tally;

static int tally(Tally *c, int message) {
    if (c->items++ == 0)
        c->first_is_message = message;
    return 0;
}
static int ct_malformed(Walker *w, void *s, const Span *sp, Py_ssize_t a, Py_ssize_t b, Py_ssize_t c, const char *r) {
    return tally(s, 0);
}
static int ct_partial(Walker *w, void *s, const Span *sp, Py_ssize_t a, Py_ssize_t b, int m, int64_t t) {
    return tally(s, 0);
}
static int ct_batch_begin(Walker *w, void *s, const Span *sp, const BatchHeader *h) { return tally(s, 0); }
static int ct_none(Walker *w, void *s, const Span *o, const Span *i, Py_ssize_t a, Py_ssize_t b, const char *p,
                   int tl) { return 0; }
static int ct_record(Walker *w, void *s, const Span *sp, const BatchHeader *h, const RecordInfo *r) { return 0; }
static int ct_batch_end(Walker *w, void *s, const BatchHeader *h, int64_t d) { return 0; }
static int ct_message_begin(Walker *w, void *s, const Span *sp, const MessageInfo *m) { return tally(s, 1); }
static int ct_wrapper(Walker *w, void *s, const Span *o, const Span *i, const MessageInfo *m, const char *p, int tl) {
    return 0;
}
static int ct_message_end(Walker *w, void *s, const MessageInfo *m, int64_t n) { return 0; }
static const RecordSink item_counter = {ct_malformed, ct_partial, ct_batch_begin, ct_none, ct_record,
                                        ct_batch_end, ct_message_begin, ct_wrapper, ct_message_end};

static int tb_records(Walker *w, int name, Py_ssize_t at, Py_ssize_t size, Py_ssize_t data_at, Py_ssize_t n) {
    Text *t = w->state;
    Tally counted = {0};
    int64_t budget = w->decompress_budget; /* counting legacy wrappers decompresses them: not on the budget */
    int failed = records_read(w, &item_counter, &counted, data_at, data_at + n, 0, 1);
    w->decompress_budget = budget;
    if (failed < 0)
        return -1;
    const char *kind = counted.first_is_message ? "legacy message" : "record batch";
    char text[96];
    snprintf(text, sizeof text, "%lld %s%s in ", (long long)counted.items, kind,
             counted.items == 1 ? "" : counted.first_is_message ? "s" : "es");
    Writer wr = arena(t);
    int i = start_label(t);
    if (i < 0 || label_name(&wr, w->prog->texts[name]) < 0 || label_value(&wr) < 0 || PUT(&wr, text, ST_NONE) < 0 ||
        put_commas(&wr, size) < 0 || OUT_LIT(wr.text, " bytes") < 0 || label_type(&wr, "records") < 0)
        return -1;
    finish_label(t, i);
    t->nodes[i].records = 1;
    t->nodes[i].data_at = data_at;
    t->nodes[i].data_n = n;
    return 0;
}

/* A SASL token's parts (sasl.TokenReader): each a string, or a secret shown masked unless asked. */
static int token_parts(Walker *w, Text *t, int name, Py_ssize_t data_at, Py_ssize_t n) {
    if (t->ctx == NULL || t->ctx == Py_None)
        return 0;
    PyObject *token = PyBytes_FromStringAndSize((const char *)w->b + data_at, n);
    PyObject *parts = token ? PyObject_CallMethod(t->ctx, "auth_fields", "On", token, data_at) : NULL;
    Py_XDECREF(token);
    if (parts == NULL)
        return -1;
    if (!PyList_Check(parts)) {
        Py_DECREF(parts);
        return 0;
    }
    Writer wr = arena(t);
    char text[48];
    snprintf(text, sizeof text, "%zd bytes", n);
    int i = start_label(t), failed = i < 0 || label_name(&wr, w->prog->texts[name]) < 0 || label_value(&wr) < 0 ||
                                     PUT(&wr, text, ST_NONE) < 0 || label_type(&wr, "SASL token") < 0;
    if (!failed) {
        finish_label(t, i);
        failed = push(t, i, O_STRUCT) < 0;
    }
    for (Py_ssize_t k = 0; !failed && k < PyList_GET_SIZE(parts); k++) {
        PyObject *part = PyList_GET_ITEM(parts, k);
        PyObject *part_name = PyObject_GetAttrString(part, "name"), *type = PyObject_GetAttrString(part, "type");
        PyObject *value = PyObject_GetAttrString(part, "value");
        const char *name_utf8 = part_name ? PyUnicode_AsUTF8(part_name) : NULL;
        const char *type_utf8 = type ? PyUnicode_AsUTF8(type) : NULL;
        int j = start_label(t);
        failed = j < 0 || name_utf8 == NULL || type_utf8 == NULL || value == NULL || label_name(&wr, name_utf8) < 0 ||
                 label_value(&wr) < 0;
        if (!failed) {
            int secret = strcmp(type_utf8, "secret") == 0;
            Py_ssize_t start = wr.text->len, len;
            if (secret && !t->show_secrets)
                failed = PUT(&wr, "********", ST_NONE) < 0;
            else {
                const char *v = PyUnicode_Check(value) ? PyUnicode_AsUTF8AndSize(value, &len) : NULL;
                failed = v == NULL || put_repr(&wr, (const uint8_t *)v, len, t->limit) < 0;
            }
            failed = failed || (secret && styled(&wr, start, ST_MAGENTA) < 0) || label_type(&wr, type_utf8) < 0;
            if (!failed)
                finish_label(t, j);
        }
        Py_XDECREF(part_name);
        Py_XDECREF(type);
        Py_XDECREF(value);
    }
    Py_DECREF(parts);
    if (failed)
        return -1;
    t->depth--;
    return 1;
}

/* The consumer protocol inside JoinGroup and SyncGroup bytes: its fields under the bytes' node when the
 * schema reads them exactly, or the message says the protocol is "consumer" (as json.c and fields.c). */
static int consumer_fields(Walker *w, Text *t, int name, int role, Py_ssize_t data_at, Py_ssize_t n) {
    if (w->protocol_type == PT_OTHER || n < 2)
        return 0;
    int version = (int16_t)(w->b[data_at] << 8 | w->b[data_at + 1]);
    const Program *program =
        embedded_program(role == R_CONSUMER_SUBSCRIPTION ? E_SUBSCRIPTION : E_ASSIGNMENT, version);
    if (program == NULL)
        return PyErr_Occurred() ? -1 : 0;
    /* everything made from here on is taken back if the schema does not fit */
    int saved_nodes = t->n_nodes, saved_depth = t->depth;
    Py_ssize_t saved_arena = t->arena.len, saved_spans = t->arena_spans.len;
    int parent = t->depth ? t->open[t->depth - 1].node : -1;
    int saved_last = parent >= 0 ? t->nodes[parent].last : -1;
    Writer wr = arena(t);
    char text[32];
    snprintf(text, sizeof text, "%d", version);
    int i = start_label(t);
    if (i < 0 || label_name(&wr, w->prog->texts[name]) < 0 || label_type(&wr, "bytes") < 0)
        return -1;
    finish_label(t, i);
    int v = push(t, i, O_STRUCT) < 0 ? -1 : start_label(t);
    if (v < 0 || label_name(&wr, "Version") < 0 || label_value(&wr) < 0 || PUT(&wr, text, ST_NONE) < 0 ||
        label_type(&wr, "int16") < 0)
        return -1;
    finish_label(t, v);
    Walker inner = *w;
    inner.failed = 0;
    t->merge_root = 1;
    Py_ssize_t stop;
    walk_program(&inner, program, data_at + 2, data_at + n, &stop);
    t->merge_root = 0;
    if (inner.failed == 2)
        return -1;
    t->depth = saved_depth;
    if (!inner.failed && (stop == data_at + n || w->protocol_type == PT_CONSUMER))
        return 1;
    t->n_nodes = saved_nodes; /* not this schema after all */
    t->arena.len = saved_arena;
    t->arena_spans.len = saved_spans;
    if (parent >= 0) {
        t->nodes[parent].last = saved_last;
        if (saved_last >= 0)
            t->nodes[saved_last].next = -1;
        else
            t->nodes[parent].first = -1;
    }
    return 0;
}

static int tb_embedded(Walker *w, int name, int role, Py_ssize_t at, Py_ssize_t size, Py_ssize_t data_at,
                       Py_ssize_t n) {
    Text *t = w->state;
    int shown = role == R_AUTH_BYTES ? token_parts(w, t, name, data_at, n) : consumer_fields(w, t, name, role, data_at, n);
    if (shown)
        return shown < 0 ? -1 : 0;
    return tb_text(w, name, 0, FORM_BYTES, R_NONE, at, size, w->b + data_at, n, 0);
}

/* --- array items past ITEMS_SHOWN ------------------------------------------------------------------
 * Unless every value is shown whole (--full), the items of an array past ITEMS_SHOWN, and those of any array
 * once the tree has TREE_FIELDS_MAX nodes, are not made into nodes but counted into one line, so that an array
 * of millions of small items (or arrays of arrays) costs memory for what is shown only. */

#define ITEMS_SHOWN 10000

/* Whether what starts here is not made: it is inside an item past the limit, or it is such an item (which
 * opens or extends the run of items not made). `opens`: it is a container, closed by an end call. */
static int hidden(Text *t, Py_ssize_t at, int opens) {
    if (t->hidden.depth) {
        t->hidden.depth += opens;
        return 1;
    }
    if (t->limit < 0 || t->depth == 0 || t->open[t->depth - 1].kind != O_ARRAY)
        return 0;
    int past_count = t->open[t->depth - 1].items >= ITEMS_SHOWN;
    if (!past_count && t->n_nodes < TREE_FIELDS_MAX)
        return 0;
    if (!t->hidden.open) {
        t->hidden.open = 1;
        t->hidden.level = t->depth;
        t->hidden.past_tree_limit = !past_count;
        t->hidden.start = at;
        t->hidden.count = 0;
    }
    t->hidden.count++;
    t->hidden.depth = opens;
    return 1;
}

static int g_fixed(Walker *w, int name, Py_ssize_t index, int kind, int role, Py_ssize_t at, const uint8_t *p) {
    return hidden(w->state, at, 0) ? 0 : tb_fixed(w, name, index, kind, role, at, p);
}

static int g_text(Walker *w, int name, Py_ssize_t index, int form, int role, Py_ssize_t at, Py_ssize_t size,
                  const uint8_t *p, Py_ssize_t n, int not_nullable) {
    return hidden(w->state, at, 0) ? 0 : tb_text(w, name, index, form, role, at, size, p, n, not_nullable);
}

static int g_array_begin(Walker *w, int name, int type, int role, Py_ssize_t at, int64_t count) {
    return hidden(w->state, at, 1) ? 0 : tb_array_begin(w, name, type, role, at, count);
}

static int g_array_null(Walker *w, int name, int type, Py_ssize_t at, Py_ssize_t size, int not_nullable) {
    return hidden(w->state, at, 0) ? 0 : tb_array_null(w, name, type, at, size, not_nullable);
}

/* The end of an array: inside an item not made, nothing; with items not made, their line first. */
static int g_array_end(Walker *w, Py_ssize_t end, int ok) {
    Text *t = w->state;
    if (t->hidden.depth) {
        t->hidden.depth--;
        return 0;
    }
    if (t->hidden.open && t->hidden.level == t->depth) {
        t->hidden.open = 0;
        Writer wr = arena(t);
        char text[160];
        if (t->hidden.past_tree_limit)
            snprintf(text, sizeof text, "\xe2\x80\xa6 %lld more items in %zd bytes, past the %d fields this view "
                     "shows of a message (--full shows them all)", (long long)t->hidden.count, end - t->hidden.start,
                     TREE_FIELDS_MAX);
        else
            snprintf(text, sizeof text, "\xe2\x80\xa6 %lld more items in %zd bytes, past the %d this view shows "
                     "(--full shows them all)", (long long)t->hidden.count, end - t->hidden.start, ITEMS_SHOWN);
        int i = start_label(t);
        if (i < 0 || PUT(&wr, text, ST_DIM) < 0)
            return -1;
        finish_label(t, i);
        t->open[t->depth - 1].items += (int)t->hidden.count;
    }
    return tb_array_end(w, end, ok);
}

static int g_struct_begin(Walker *w, int name, Py_ssize_t index, int type, Py_ssize_t at) {
    return hidden(w->state, at, 1) ? 0 : tb_struct_begin(w, name, index, type, at);
}

static int g_struct_null(Walker *w, int name, int type, Py_ssize_t at) {
    return hidden(w->state, at, 0) ? 0 : tb_struct_null(w, name, type, at);
}

static int g_struct_end(Walker *w, Py_ssize_t end, int ok) {
    Text *t = w->state;
    if (t->hidden.depth) {
        t->hidden.depth--;
        return 0;
    }
    return tb_struct_end(w, end, ok);
}

/* A tagged section opens no node: inside an item not made, it is skipped like the rest. */
static int g_tagged_begin(Walker *w, Py_ssize_t at) {
    return ((Text *)w->state)->hidden.depth ? 0 : tb_tagged_begin(w, at);
}

static int g_tagged_unknown(Walker *w, uint64_t tag, Py_ssize_t at, Py_ssize_t size, const uint8_t *p) {
    return hidden(w->state, at, 0) ? 0 : tb_tagged_unknown(w, tag, at, size, p);
}

static int g_tagged_end(Walker *w, Py_ssize_t end, uint64_t count, int ok) {
    return ((Text *)w->state)->hidden.depth ? 0 : tb_tagged_end(w, end, count, ok);
}

static int g_records(Walker *w, int name, Py_ssize_t at, Py_ssize_t size, Py_ssize_t data_at, Py_ssize_t n) {
    return hidden(w->state, at, 0) ? 0 : tb_records(w, name, at, size, data_at, n);
}

static int g_embedded(Walker *w, int name, int role, Py_ssize_t at, Py_ssize_t size, Py_ssize_t data_at,
                      Py_ssize_t n) {
    return hidden(w->state, at, 0) ? 0 : tb_embedded(w, name, role, at, size, data_at, n);
}

const Builder text_builder = {g_fixed, g_text, g_array_begin, g_array_null, g_array_end,
                              g_struct_begin, g_struct_null, g_struct_end, g_tagged_begin, g_tagged_unknown,
                              g_tagged_end, g_records, g_embedded};

/* --- drawing ------------------------------------------------------------------------------------ */

#define BRANCH "\xe2\x94\x9c\xe2\x94\x80\xe2\x94\x80 " /* "├── " */
#define LAST "\xe2\x94\x94\xe2\x94\x80\xe2\x94\x80 "   /* "└── " */
#define GUIDE "\xe2\x94\x82   "                        /* "│   " */
#define SPACE "    "

static int flush(Text *t) {
    /* After a failed write the walk still closes what it opened: nothing more goes to `write` then (it would
     * be called with its exception pending), and the exception is what the walk ends with. */
    if (PyErr_Occurred())
        return -1;
    if (t->write == NULL || t->out.len < t->flush_at)
        return 0;
    /* The text as a view of the buffer, not a copy (records-heavy -V writes hundreds of MB): released once
     * `write` returns, so that a view it kept raises instead of reading the buffer as it is reused. */
    PyObject *text = PyMemoryView_FromMemory(t->out.data, t->out.len, PyBUF_READ);
    PyObject *spans = t->want_spans ? PyBytes_FromStringAndSize(t->spans.data ? t->spans.data : "", t->spans.len)
                                    : Py_NewRef(Py_None);
    PyObject *done = text && spans ? PyObject_CallFunctionObjArgs(t->write, text, spans, NULL) : NULL;
    if (text != NULL) {
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback); /* write's exception, if it raised: kept across the release */
        PyObject *released = PyObject_CallMethod(text, "release", NULL);
        if (released == NULL) {
            Py_CLEAR(done);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(traceback);
        } else {
            PyErr_Restore(type, value, traceback);
        }
        Py_XDECREF(released);
        Py_DECREF(text);
    }
    Py_XDECREF(spans);
    if (done == NULL)
        return -1;
    Py_DECREF(done);
    t->out.len = 0;
    t->spans.len = 0;
    return 0;
}

/* A line's start: the guides of its ancestors, and its own connector. */
static inline int line_start(Text *t, int last) {
    Writer wr = output(t);
    Py_ssize_t start = t->out.len;
    if (out_write(&t->out, t->prefix.data, t->prefix.len) < 0 ||
        (last ? OUT_LIT(&t->out, LAST) : OUT_LIT(&t->out, BRANCH)) < 0)
        return -1;
    return styled(&wr, start, ST_DIM);
}

/* flush's first tests, here: a line seldom completes a chunk, and the call cost more than the tests. */
static inline int line_end(Text *t) {
    if (out_char(&t->out, '\n') < 0)
        return -1;
    if (t->out.len < t->flush_at)
        return PyErr_Occurred() ? -1 : 0;
    return flush(t);
}

/* Go one level down below a line drawn as last (or not); returns the prefix length to come back to. */
static Py_ssize_t descend(Text *t, int last) {
    Py_ssize_t saved = t->prefix.len;
    if ((last ? OUT_LIT(&t->prefix, SPACE) : OUT_LIT(&t->prefix, GUIDE)) < 0)
        return -1;
    return saved;
}

static int draw_records(Walker *w, Text *t, const Node *node);

/* Draw node i of `src`'s tree (its label, then its children) with t's output and prefix. */
static int draw(Walker *w, Text *t, const Text *src, int i, int last) {
    const Node *node = &src->nodes[i];
    if (line_start(t, last) < 0)
        return -1;
    Py_ssize_t at = t->out.len;
    if (out_write(&t->out, src->arena.data + node->text_at, node->text_len) < 0)
        return -1;
    if (t->want_spans) {
        const int32_t *spans = (const int32_t *)(src->arena_spans.data + node->spans_at);
        Py_ssize_t count = node->spans_len / (Py_ssize_t)sizeof(int32_t) / 3;
        for (Py_ssize_t k = 0; k < count; k++) {
            int32_t span[3] = {(int32_t)(at + spans[3 * k] - node->text_at),
                               (int32_t)(at + spans[3 * k + 1] - node->text_at), spans[3 * k + 2]};
            if (out_write(&t->spans, span, sizeof span) < 0)
                return -1;
        }
    }
    if (line_end(t) < 0)
        return -1;
    Py_ssize_t saved = descend(t, last);
    if (saved < 0)
        return -1;
    int failed = 0;
    if (node->records)
        failed = draw_records(w, t, node) < 0;
    for (int c = node->first; !failed && c >= 0; c = src->nodes[c].next)
        failed = draw(w, t, src, c, src->nodes[c].next < 0) < 0;
    t->prefix.len = saved;
    return failed ? -1 : 0;
}

/* --- records, drawn as they are read ---------------------------------------------------------- */

/* A record waits until the next item (or its list's end) says whether it was the last. Its span and batch
 * header are records.c's, which stay until the batch ends (as the record's bytes do), and the batch's end
 * draws what waits: they are pointed to, not copied for every record. */
typedef struct {
    int waiting;
    int is_record;
    const Span *span;
    const BatchHeader *batch;
    RecordInfo record;
    Py_ssize_t at;
    char reason[400];
} Pending;

#define MAX_LEVELS 16

/* What the open levels of the records being drawn are. */
enum level_kind {
    LV_ITEMS,    /* the items of a records field, or of a wrapper's decompressed contents */
    LV_BATCH,    /* a batch's header fields */
    LV_RECORDS,  /* a batch's records: their lastness known only when the next item comes */
    LV_MESSAGE,  /* a legacy message's fields */
};

typedef struct {
    int kind;
    Py_ssize_t prefix;   /* the prefix length to come back to when the level closes */
    Py_ssize_t end;      /* where its items end: the last one reaches it */
    int unread;          /* a batch's records that were not read (decompression failed or refused) */
} Level;

typedef struct {
    Text *t;
    Level levels[MAX_LEVELS];
    int depth;
    Pending pending;
} Draw;

/* Open a level whose items are drawn under the current prefix; `prefix` is where to come back to. */
static int level_push(Draw *d, int kind, Py_ssize_t prefix, Py_ssize_t end) {
    if (d->depth >= MAX_LEVELS) {
        PyErr_SetString(PyExc_RecursionError, "text: records nested too deep");
        return -1;
    }
    d->levels[d->depth++] = (Level){.kind = kind, .prefix = prefix, .end = end};
    return 0;
}

static Level *top_level(Draw *d) { return &d->levels[d->depth - 1]; }

/* Close the top level: the prefix goes back to what it was before the level's own line. */
static void level_pop(Draw *d) { d->t->prefix.len = d->levels[--d->depth].prefix; }

static inline int leaf(Text *t, int last, const char *name, const char *type) {
    Writer wr = output(t);
    return line_start(t, last) < 0 || label_name(&wr, name) < 0 || label_value(&wr) < 0 ? -1 : 0;
}

static inline int leaf_end(Text *t, const char *type) {
    Writer wr = output(t);
    return label_type(&wr, type) < 0 ? -1 : line_end(t);
}

typedef struct {
    int checked;     /* the CRC was computed: say whether it matches */
    uint32_t crc[2]; /* stored, computed */
    char bits[200];  /* how the attributes read */
} HeaderExtras;

static int header_fields(Text *t, const uint8_t *b, Py_ssize_t pos, Py_ssize_t end, const HeaderLayout *layout,
                         int last_is_last, const char *(*extra)(const HeaderLayout *, void *), HeaderExtras *ctx,
                         PyObject *offset_note) {
    int count = 0;
    while (layout[count].name != NULL && pos + layout[count].at + layout[count].size <= end)
        count++;
    for (int k = 0; k < count; k++) {
        const HeaderLayout *h = &layout[k];
        Writer wr = output(t);
        int64_t v = header_value(b + pos + h->at, h);
        uint8_t raw[8];
        for (int i = 0; i < 8; i++)
            raw[i] = (uint8_t)((uint64_t)v >> (8 * (7 - i)));
        if (leaf(t, last_is_last && k == count - 1, h->name, h->type) < 0)
            return -1;
        const char *bits = extra ? extra(h, ctx) : NULL;
        int failed;
        if (bits != NULL)
            failed = out_i64(&t->out, v) < 0 || PUT(&wr, bits, ST_NONE) < 0;
        else
            failed = put_fixed(t, &wr, K_INT64, h->role, raw) < 0;
        const HeaderExtras *extras = ctx;
        if (!failed && h->role == R_CHECKSUM && extras->checked) {
            char text[48];
            if (extras->crc[0] == extras->crc[1])
                snprintf(text, sizeof text, " (valid)");
            else
                snprintf(text, sizeof text, " (INVALID (computed 0x%08x))", extras->crc[1]);
            failed = PUT(&wr, text, ST_NONE) < 0;
        }
        if (!failed && offset_note != NULL && !strcmp(h->name, "offset"))
            failed = note_object(&wr, offset_note) < 0;
        if (failed || leaf_end(t, h->type) < 0)
            return -1;
    }
    return 0;
}

static const char *const TIMESTAMP_TYPES[] = {"CreateTime", "LogAppendTime"};


static const char *batch_bits(const HeaderLayout *h, void *ctx) {
    return !strcmp(h->name, "attributes") ? ((HeaderExtras *)ctx)->bits : NULL;
}

static int item_last(Draw *d, Py_ssize_t end) { return end >= top_level(d)->end; }

static int malformed_line(Draw *d, int last, const Span *span, Py_ssize_t at, const char *reason) {
    Text *t = d->t;
    Writer wr = output(t);
    char text[64];
    snprintf(text, sizeof text, "MALFORMED at %s %zd: ", span->detached ? "decompressed byte" : "byte",
             at + (span->detached ? 0 : 4));
    Py_ssize_t start = t->out.len;
    if (line_start(t, last) < 0)
        return -1;
    start = t->out.len;
    if (PUT(&wr, text, ST_NONE) < 0 || PUT(&wr, reason, ST_NONE) < 0 || styled(&wr, start, ST_BOLD_RED) < 0)
        return -1;
    return line_end(t);
}

static int record_lines(Draw *d, int last, const Span *span, const BatchHeader *h, const RecordInfo *r);

/* Draw the waiting item of a batch's records, now that its lastness is known. */
static int pending_flush(Draw *d, int last) {
    Pending *p = &d->pending;
    if (!p->waiting)
        return 0;
    p->waiting = 0;
    if (p->is_record)
        return record_lines(d, last, p->span, p->batch, &p->record);
    return malformed_line(d, last, p->span, p->at, p->reason);
}

static int rt_malformed(Walker *w, void *st, const Span *span, Py_ssize_t start, Py_ssize_t end, Py_ssize_t at,
                        const char *reason) {
    Draw *d = st;
    if (top_level(d)->kind == LV_RECORDS) {
        if (pending_flush(d, 0) < 0)
            return -1;
        d->pending = (Pending){.waiting = 1, .span = span, .at = at};
        snprintf(d->pending.reason, sizeof d->pending.reason, "%s", reason);
        return 0;
    }
    return malformed_line(d, item_last(d, end), span, at, reason);
}

static int rt_partial(Walker *w, void *st, const Span *span, Py_ssize_t start, Py_ssize_t end, int magic,
                      int64_t total) {
    Draw *d = st;
    Text *t = d->t;
    Writer wr = output(t);
    char text[96];
    if (total >= 0)
        snprintf(text, sizeof text, "partial batch: %zd of %lld bytes present", end - start, (long long)total);
    else
        snprintf(text, sizeof text, "partial batch: %zd bytes present, length unreadable", end - start);
    int last = item_last(d, end);
    if (line_start(t, last) < 0 || PUT(&wr, text, ST_YELLOW) < 0 || line_end(t) < 0)
        return -1;
    Py_ssize_t saved = descend(t, last);
    const HeaderLayout *layout = magic == 2 ? batch_layout : magic == 0 ? message0_layout
                                 : magic == 1                      ? message1_layout
                                                                   : prefix_layout;
    if (saved < 0)
        return -1;
    HeaderExtras unchecked = {0}; /* a partial item's CRC cannot be checked: its fields are shown as they are */
    int failed = header_fields(t, span->b, start, end, layout, 1, NULL, &unchecked, NULL);
    t->prefix.len = saved;
    return failed;
}

static int crc_text(Writer *wr, uint32_t stored, uint32_t computed) {
    if (stored == computed)
        return PUT(wr, "CRC valid", ST_GREEN);
    char text[48];
    snprintf(text, sizeof text, "CRC INVALID (computed 0x%08x)", computed);
    return PUT(wr, text, ST_BOLD_RED);
}

static int rt_batch_begin(Walker *w, void *st, const Span *span, const BatchHeader *h) {
    Draw *d = st;
    Text *t = d->t;
    Writer wr = output(t);
    int last = item_last(d, h->end), codec = h->attributes & 7;
    char text[256];
    const char *codec_name = codec_text(codec);
    char unknown[24];
    snprintf(unknown, sizeof unknown, "unknown(%d)", codec);
    int at = snprintf(text, sizeof text, " (magic 2): codec %s, %d records, base offset %lld",
                      codec_name ? codec_name : unknown, h->record_count, (long long)h->base_offset);
    if (h->producer_id != -1)
        at += snprintf(text + at, sizeof text - at, ", producer id %lld", (long long)h->producer_id);
    if (h->attributes & 0x10)
        at += snprintf(text + at, sizeof text - at, ", transactional");
    if (h->attributes & 0x20)
        at += snprintf(text + at, sizeof text - at, ", control");
    snprintf(text + at, sizeof text - at, ", ");
    if (line_start(t, last) < 0 || PUT(&wr, "record batch", ST_BOLD) < 0 || PUT(&wr, text, ST_NONE) < 0 ||
        crc_text(&wr, h->crc, h->crc_computed) < 0 || line_end(t) < 0)
        return -1;
    Py_ssize_t saved = descend(t, last);
    if (saved < 0 || level_push(d, LV_BATCH, saved, h->end) < 0)
        return -1;
    HeaderExtras extras = {1, {h->crc, h->crc_computed}, ""};
    snprintf(extras.bits, sizeof extras.bits,
             " (codec=%s, timestamp_type=%s, is_transactional=%s, is_control=%s, has_delete_horizon=%s)",
             codec_name ? codec_name : unknown, TIMESTAMP_TYPES[(h->attributes >> 3) & 1],
             h->attributes & 0x10 ? "True" : "False", h->attributes & 0x20 ? "True" : "False",
             h->attributes & 0x40 ? "True" : "False");
    return header_fields(t, span->b, h->start, h->end, batch_layout, 0, batch_bits, &extras, NULL);
}

static int rt_batch_records(Walker *w, void *st, const Span *outer, const Span *records, Py_ssize_t at,
                            Py_ssize_t end, const char *problem, int too_large) {
    Draw *d = st;
    Text *t = d->t;
    Writer wr = output(t);
    if (line_start(t, 1) < 0)
        return -1;
    int failed;
    if (problem != NULL) {
        Py_ssize_t start = t->out.len;
        failed = PUT(&wr, "records: not decompressed (", ST_NONE) < 0 || PUT(&wr, problem, ST_NONE) < 0 ||
                 OUT_LIT(&t->out, ")") < 0 || styled(&wr, start, ST_BOLD_RED) < 0;
    } else if (records->detached) {
        failed = PUT(&wr, "records: ", ST_NONE) < 0 || put_commas(&wr, PyByteArray_GET_SIZE(records->data)) < 0 ||
                 PUT(&wr, " bytes decompressed (", ST_NONE) < 0 || PUT(&wr, DECOMPRESSED_NOTE, ST_NONE) < 0 ||
                 OUT_LIT(&t->out, ")") < 0;
    } else {
        failed = label_name(&wr, "records") < 0 || label_type(&wr, "[]Record") < 0;
    }
    Py_ssize_t saved;
    if (failed || line_end(t) < 0 || (saved = descend(t, 1)) < 0 ||
        level_push(d, LV_RECORDS, saved, problem || !records->detached ? end : PyByteArray_GET_SIZE(records->data)) < 0)
        return -1;
    top_level(d)->unread = problem != NULL;
    return 0;
}

static int rt_record(Walker *w, void *st, const Span *span, const BatchHeader *h, const RecordInfo *r) {
    Draw *d = st;
    if (pending_flush(d, 0) < 0)
        return -1;
    /* field by field: a compound literal would clear the whole struct, its 400-byte reason too, per record */
    Pending *p = &d->pending;
    p->waiting = 1;
    p->is_record = 1;
    p->span = span;
    p->batch = h;
    p->record = *r;
    return 0;
}

/* A control record's key or value: the fields of its schema, when it reads at least one (as fields.c).
 * 1 when shown, 0 when not (the bytes are shown instead), -1 on error. */
static int control_part(Draw *d, int last, const Span *span, const char *name, const uint8_t *raw, Py_ssize_t len,
                        int which, const char *kind) {
    Text *t = d->t;
    if (raw == NULL || len < 2)
        return 0;
    int version = (int16_t)(raw[0] << 8 | raw[1]);
    const Program *program = embedded_program(which, version);
    if (program == NULL)
        return PyErr_Occurred() ? -1 : 0;
    Text inner = {.want_spans = t->want_spans, .limit = t->limit, .show_secrets = t->show_secrets,
                  .api_names = t->api_names, .root_label = kind};
    Walker walker = {.b = span->b, .buflen = PY_SSIZE_T_MAX, .builder = &text_builder, .state = &inner};
    Py_ssize_t at = raw - span->b, stop;
    walk_program(&walker, program, at + 2, at + len, &stop);
    int shown = walker.failed == 2 ? -1 : 0;
    if (!shown && inner.n_nodes && inner.nodes[0].first >= 0) {
        /* "key  ControlRecordKey", then Version and the schema's fields */
        Writer wr = output(t);
        char text[32];
        snprintf(text, sizeof text, "%d", version);
        Py_ssize_t saved = -1;
        shown = line_start(t, last) < 0 || label_name(&wr, name) < 0 || label_type(&wr, kind) < 0 ||
                        line_end(t) < 0 || (saved = descend(t, last)) < 0 || leaf(t, 0, "Version", "int16") < 0 ||
                        PUT(&wr, text, ST_NONE) < 0 || leaf_end(t, "int16") < 0
                    ? -1
                    : 1;
        for (int c = inner.nodes[0].first; shown > 0 && c >= 0; c = inner.nodes[c].next)
            shown = draw(NULL, t, &inner, c, inner.nodes[c].next < 0) < 0 ? -1 : 1;
        if (saved >= 0)
            t->prefix.len = saved;
    }
    PyMem_Free(inner.nodes);
    out_free(&inner.arena);
    out_free(&inner.arena_spans);
    return shown;
}

/* A record's key or value: a control record's as the fields of its schema when they read, else as bytes.
 * Inline and called with the names written out, so that their lengths are known where they are written. */
static inline int record_part(Draw *d, int last, const Span *span, const BatchHeader *h, const char *name,
                              const uint8_t *data, Py_ssize_t len, int which, const char *kind) {
    Text *t = d->t;
    Writer wr = output(t);
    if (h->attributes & 0x20) {
        int shown = control_part(d, last, span, name, data, len, which, kind);
        if (shown)
            return shown < 0 ? -1 : 0;
    }
    return leaf(t, last, name, "bytes") < 0 ||
                   (len < 0 ? PUT(&wr, "null", ST_NONE) : put_bytes(&wr, data, len, t->limit)) < 0 ||
                   leaf_end(t, "bytes") < 0
               ? -1
               : 0;
}

static int record_lines(Draw *d, int last, const Span *span, const BatchHeader *h, const RecordInfo *r) {
    Text *t = d->t;
    Writer wr = output(t);
    int64_t type = -1;
    int control = 0;
    if ((h->attributes & 0x20) && r->key != NULL) {
        control = record_control_type(span->b, PY_SSIZE_T_MAX, r->key - span->b, r->key_len, &type);
        if (control < 0)
            return -1;
    }
    if (line_start(t, last) < 0)
        return -1;
    int failed = control ? PUT(&wr, "control record ", ST_BOLD) < 0 || PUT(&wr, control_type_name(type), ST_BOLD_CYAN) < 0
                         : PUT(&wr, "record", ST_BOLD) < 0;
    if (failed || OUT_LIT(&t->out, " offset ") < 0 || put_i128(&wr, r->offset) < 0 ||
        OUT_LIT(&t->out, ", timestamp ") < 0 || put_timestamp(&wr, r->timestamp) < 0 || line_end(t) < 0)
        return -1;
    Py_ssize_t saved = descend(t, last);
    if (saved < 0)
        return -1;
    int headers = r->header_count;
    if (record_part(d, 0, span, h, "key", r->key, r->key_len, E_CONTROL_KEY, "ControlRecordKey") < 0 ||
        record_part(d, headers == 0, span, h, "value", r->value, r->value_len, E_CONTROL_VALUE,
                    "ControlRecordValue") < 0)
        return -1;
    Py_ssize_t pos = r->headers_pos, key_at, value_at, key_len, value_len;
    const uint8_t *key, *value;
    for (int k = 0; k < headers; k++) {
        if (!record_header_next(span->b, &pos, r->end, &key_at, &key, &key_len, &value_at, &value, &value_len))
            break;
        if (line_start(t, k == headers - 1) < 0 || PUT(&wr, "header ", ST_BOLD) < 0 ||
            put(&wr, (const char *)key, key_len, ST_NONE) < 0 || OUT_LIT(&t->out, ": ") < 0 ||
            (value_len < 0 ? PUT(&wr, "null", ST_NONE) : put_bytes(&wr, value, value_len, t->limit)) < 0 ||
            line_end(t) < 0)
            return -1;
    }
    t->prefix.len = saved;
    return 0;
}

static int rt_batch_end(Walker *w, void *st, const BatchHeader *h, int64_t decoded) {
    Draw *d = st;
    Text *t = d->t;
    if (top_level(d)->kind == LV_RECORDS) {
        /* a count that differs from the header's closes the list, after the last record */
        int mismatch = decoded != h->record_count && !top_level(d)->unread;
        if (pending_flush(d, !mismatch) < 0)
            return -1;
        if (mismatch) {
            Writer wr = output(t);
            char text[96];
            snprintf(text, sizeof text, "record_count is %d but %lld records decoded", h->record_count,
                     (long long)decoded);
            if (line_start(t, 1) < 0 || PUT(&wr, text, ST_BOLD_RED) < 0 || line_end(t) < 0)
                return -1;
        }
        level_pop(d);
    }
    level_pop(d);
    return 0;
}

static int rt_message_begin(Walker *w, void *st, const Span *span, const MessageInfo *m) {
    Draw *d = st;
    Text *t = d->t;
    Writer wr = output(t);
    int last = item_last(d, m->end), codec = m->attributes & 7;
    int wrapper = codec && m->value != NULL && !m->value_note;
    const char *codec_name = codec_text(codec);
    char unknown[24], text[160];
    snprintf(unknown, sizeof unknown, "unknown(%d)", codec);
    snprintf(text, sizeof text, " (magic %d): codec %s, offset %lld, timestamp ", m->magic,
             codec_name ? codec_name : unknown, (long long)m->absolute_offset);
    if (line_start(t, last) < 0 || PUT(&wr, "message", ST_BOLD) < 0 || PUT(&wr, text, ST_NONE) < 0 ||
        (m->has_timestamp ? put_timestamp(&wr, m->timestamp) : PUT(&wr, "no timestamp", ST_NONE)) < 0 ||
        OUT_LIT(&t->out, ", ") < 0 || crc_text(&wr, m->crc, m->crc_computed) < 0 || line_end(t) < 0)
        return -1;
    Py_ssize_t saved = descend(t, last);
    if (saved < 0 || level_push(d, LV_MESSAGE, saved, m->end) < 0)
        return -1;
    HeaderExtras extras = {1, {m->crc, m->crc_computed}, ""};
    if (m->magic == 1)
        snprintf(extras.bits, sizeof extras.bits, " (codec=%s, timestamp_type=%s)", codec_name ? codec_name : unknown,
                 TIMESTAMP_TYPES[(m->attributes >> 3) & 1]);
    else
        snprintf(extras.bits, sizeof extras.bits, " (codec=%s)", codec_name ? codec_name : unknown);
    PyObject *absolute = m->made_absolute ? PyUnicode_FromFormat("absolute offset %lld", (long long)m->absolute_offset)
                                          : NULL;
    if (m->made_absolute && absolute == NULL)
        return -1;
    int failed = header_fields(t, span->b, m->start, m->end, m->magic == 1 ? message1_layout : message0_layout, 0,
                               batch_bits, &extras, absolute) < 0;
    Py_XDECREF(absolute);
    if (failed || leaf(t, 0, "key", "bytes") < 0 ||
        (m->key_len < 0 ? PUT(&wr, "null", ST_NONE) : put_bytes(&wr, m->key, m->key_len, t->limit)) < 0 ||
        leaf_end(t, "bytes") < 0 || leaf(t, !wrapper, "value", "bytes") < 0 ||
        (m->value_len < 0 ? PUT(&wr, "null", ST_NONE) : put_bytes(&wr, m->value, m->value_len, t->limit)) < 0 ||
        (m->value_note && note(&wr, m->value_note) < 0) || leaf_end(t, "bytes") < 0)
        return -1;
    return 0;
}

static int rt_wrapper(Walker *w, void *st, const Span *outer, const Span *inner, const MessageInfo *m,
                      const char *problem, int too_large) {
    Draw *d = st;
    Text *t = d->t;
    Writer wr = output(t);
    Py_ssize_t start;
    if (line_start(t, 1) < 0)
        return -1;
    start = t->out.len;
    int failed;
    if (inner == NULL)
        failed = PUT(&wr, "messages: not decompressed (", ST_NONE) < 0 || PUT(&wr, problem, ST_NONE) < 0 ||
                 OUT_LIT(&t->out, ")") < 0 || styled(&wr, start, ST_BOLD_RED) < 0;
    else
        failed = PUT(&wr, "messages: ", ST_NONE) < 0 || put_commas(&wr, PyByteArray_GET_SIZE(inner->data)) < 0 ||
                 PUT(&wr, " bytes decompressed (", ST_NONE) < 0 || PUT(&wr, DECOMPRESSED_NOTE, ST_NONE) < 0 ||
                 OUT_LIT(&t->out, ")") < 0;
    Py_ssize_t saved;
    if (failed || line_end(t) < 0 || (saved = descend(t, 1)) < 0)
        return -1;
    return level_push(d, LV_ITEMS, saved, inner ? PyByteArray_GET_SIZE(inner->data) : 0);
}

static int rt_message_end(Walker *w, void *st, const MessageInfo *m, int64_t records) {
    Draw *d = st;
    if (top_level(d)->kind == LV_ITEMS) /* a wrapper's contents */
        level_pop(d);
    level_pop(d);
    return 0;
}

static const RecordSink text_sink = {rt_malformed, rt_partial, rt_batch_begin, rt_batch_records, rt_record,
                                     rt_batch_end, rt_message_begin, rt_wrapper, rt_message_end};

static int draw_records(Walker *w, Text *t, const Node *node) {
    Draw d = {.t = t};
    if (level_push(&d, LV_ITEMS, t->prefix.len, node->data_at + node->data_n) < 0)
        return -1;
    /* The records are read after the walk, which may have stopped on bytes further on: its failure is not
       theirs. The reading starts clean, and the walk's failure is back after it. */
    Walker reading = *w;
    reading.failed = 0;
    int result = records_read(&reading, &text_sink, &d, node->data_at, node->data_at + node->data_n, 1, 1);
    if (reading.failed == 2)
        w->failed = 2;
    return result;
}

/* text_tree(roots, buf, limit, show_secrets, spans, ctx, api_names, topic_names, write, flush_at,
 *           decompress_limit) -> (text, spans)
 *
 * roots: ((program, type text, pos, end), ...): the header and, when it was read, the body; each drawn as a
 * child of the message's headline (which the caller writes). Text goes to write(text, spans) in chunks of
 * about flush_at bytes (text: a memoryview of the buffer, valid during the call; spans: bytes of int32
 * triples, or None), the rest is returned. topic_names: topic id -> name, for the topics a struct gives by id
 * only; or True: each such id is marked, NUL id NUL after the quoted id, for a parallel decode's parent to name. */
PyObject *text_tree(PyObject *self, PyObject *args) {
    PyObject *roots, *ctx, *api_names, *topic_names, *write;
    Py_buffer buf;
    int limit, show_secrets, want_spans;
    Py_ssize_t flush_at;
    long long decompress_limit;
    if (!PyArg_ParseTuple(args, "O!y*ippOOOOnL:text_tree", &PyTuple_Type, &roots, &buf, &limit, &show_secrets,
                          &want_spans, &ctx, &api_names, &topic_names, &write, &flush_at, &decompress_limit))
        return NULL;
    PyObject *result = NULL;
    Text t = {.want_spans = want_spans, .limit = limit, .show_secrets = show_secrets, .ctx = ctx,
              .api_names = PyDict_Check(api_names) ? api_names : NULL,
              .topic_names = PyDict_Check(topic_names) ? topic_names : NULL, .mark_topic_ids = topic_names == Py_True,
              .write = write == Py_None ? NULL : write,
              .flush_at = flush_at};
    Walker w = {.b = buf.buf, .buflen = buf.len, .bufobj = buf.obj, .builder = &text_builder, .state = &t,
                .decompress_budget = decompress_limit};
    Py_ssize_t count = PyTuple_GET_SIZE(roots);
    int *tops = PyMem_Calloc(count + 1, sizeof(int));
    if (tops == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* Written in chunks: the buffer holds a chunk from the start, instead of growing to it for every message */
    if (t.write != NULL && flush_at > 0 && flush_at < (1 << 24) && out_grow(&t.out, flush_at + 4096) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *program, *type;
        Py_ssize_t pos, end, stop;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(roots, i), "O!Unn:text_tree root", &ProgramType, &program, &type,
                              &pos, &end))
            goto done;
        if (pos < 0 || end > buf.len || pos > end) {
            PyErr_SetString(PyExc_ValueError, "text_tree: range outside the buffer");
            goto done;
        }
        t.root_label = PyUnicode_AsUTF8(type);
        if (t.root_label == NULL)
            goto done;
        tops[i] = t.n_nodes;
        w.failed = 0;
        w.protocol_type = PT_UNSEEN;
        walk_program(&w, (const Program *)program, pos, end, &stop);
        if (w.failed == 2)
            goto done;
        if (draw(&w, &t, &t, tops[i], i == count - 1) < 0)
            goto done;
        t.n_nodes = 0;
        t.arena.len = t.arena_spans.len = 0;
    }
    result = Py_BuildValue("(y#O)", t.out.data ? t.out.data : "", t.out.len, Py_None);
    if (result != NULL && want_spans) {
        PyObject *spans = PyBytes_FromStringAndSize(t.spans.data ? t.spans.data : "", t.spans.len);
        if (spans == NULL)
            Py_CLEAR(result);
        else
            Py_SETREF(result, Py_BuildValue("(y#N)", t.out.data ? t.out.data : "", t.out.len, spans));
    }
done:
    PyMem_Free(tops);
    PyMem_Free(t.nodes);
    out_free(&t.out);
    out_free(&t.spans);
    out_free(&t.arena);
    out_free(&t.arena_spans);
    out_free(&t.prefix);
    PyBuffer_Release(&buf);
    return result;
}
