/* Link, IP and TCP headers of captured frames, and the record loop of pcap files, in C.
 *
 * Every frame of a capture passes through here, so the per-frame work is native: Python
 * spent about 5 us a frame on it, a third of what the one-line view costs in all.
 *
 * parse_frame(frame, linktype, ts, wire_len) -> TcpSegment, or the reason it holds none (str)
 * scan_pcap(buf, big_endian, record_header_len, units, linktype, max_record, skipped, parse[, shard, owners,
 *           counts, clock])
 *     -> (items, records, pos, bad_caplen, reached): the whole records at the start of buf, parsed
 *     into TcpSegments (parse true; frames without one are counted in the dict `skipped`) or as
 *     (ts, linktype, frame, wire_len) tuples; how many records that was; pos where the first
 *     incomplete record starts; bad_caplen is None, or the length a record at pos claims
 *     beyond max_record. With `owners` (a 16-bit share per connection bucket), the segments of
 *     other shards' connections are None; with `counts` (a writable 64-bit count per bucket),
 *     no items are made and each TCP frame's captured bytes are added to its bucket's count.
 *     With `clock` (one writable native double, kept from scan to scan of a file: the latest
 *     time of any TCP packet so far), `reached` is None when no item was made behind the clock,
 *     else bytes holding the clock's time at each item (native doubles); without, it is None.
 * scan_pcapng(buf, big_endian, interfaces, max_record, skipped, parse[, shard, owners, counts, clock])
 *     -> (items, records, pos, at_block, reached): the whole packet blocks (enhanced, simple, obsolete) at
 *     the start of buf, made as scan_pcap makes records; `interfaces` holds (linktype, units per
 *     second, offset in seconds), or None, per interface of the section. Blocks whose packet cannot
 *     be read are counted in `skipped`. pos is where the scan stopped: at_block false when buf holds
 *     no further whole block, true at a block left to the Python reader (section headers, interface
 *     descriptions, other blocks, and lengths that are not valid).
 *
 * Skip reasons, as packets.py documents them: "link type N", "not IP", "not TCP",
 * "IP fragment", "malformed".
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <arpa/inet.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define LINKTYPE_NULL 0
#define LINKTYPE_ETHERNET 1
#define LINKTYPE_RAW 101
#define LINKTYPE_LOOP 108
#define LINKTYPE_LINUX_SLL 113
#define LINKTYPE_IPV4 228
#define LINKTYPE_IPV6 229
#define LINKTYPE_LINUX_SLL2 276
#define ETHERTYPE_IPV4 0x0800
#define ETHERTYPE_IPV6 0x86DD
#define IPPROTO_TCP_ 6

enum skip { SKIP_NONE, SKIP_MALFORMED, SKIP_NOT_IP, SKIP_NOT_TCP, SKIP_FRAGMENT, SKIP_LINKTYPE };

static PyTypeObject *segment_type;  /* packets.TcpSegment, handed over by use_segment_type() */
static PyObject *reason_text[SKIP_LINKTYPE];

typedef struct {
    const uint8_t *src, *dst;  /* the raw addresses in the frame */
    int address_len;           /* 4 or 16 */
    uint16_t sport, dport;
    uint32_t seq, ack;
    uint8_t flags;
    Py_ssize_t start, end, missing;
} tcp_fields;

static inline unsigned be16(const uint8_t *p) { return (unsigned)p[0] << 8 | p[1]; }
static inline uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static inline uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0];
}

static int is_vlan(unsigned ethertype) {
    return ethertype == 0x8100 || ethertype == 0x88A8 || ethertype == 0x9100;
}

static int tcp_header(const uint8_t *f, Py_ssize_t n, Py_ssize_t off, Py_ssize_t ip_end, Py_ssize_t cut,
                      tcp_fields *t) {
    if (off + 14 > n)
        return SKIP_MALFORMED;
    Py_ssize_t start = off + (f[off + 12] >> 4) * 4;
    if (start - off < 20 || start > ip_end)
        return SKIP_MALFORMED;
    Py_ssize_t present_end = ip_end < n ? ip_end : n;
    if (start > present_end)  /* options cut by the snaplen */
        return SKIP_MALFORMED;
    t->sport = be16(f + off);
    t->dport = be16(f + off + 2);
    t->seq = be32(f + off + 4);
    t->ack = be32(f + off + 8);
    t->flags = f[off + 13];
    t->start = start;
    t->end = present_end;
    /* Trust the IP length for what is missing only as far as the capture admits a cut,
       so a lying length field in an uncut frame does not invent a gap. */
    t->missing = 0;
    if (cut < 0)
        t->missing = ip_end - present_end < -cut ? ip_end - present_end : -cut;
    return SKIP_NONE;
}

static int ipv4(const uint8_t *f, Py_ssize_t n, Py_ssize_t off, Py_ssize_t cut, tcp_fields *t) {
    if (off + 20 > n)
        return SKIP_MALFORMED;
    unsigned version_ihl = f[off], total_len = be16(f + off + 2), fragment = be16(f + off + 6);
    Py_ssize_t header_len = (version_ihl & 0x0F) * 4;
    if (version_ihl >> 4 != 4 || header_len < 20)
        return SKIP_MALFORMED;
    if (f[off + 9] != IPPROTO_TCP_)
        return SKIP_NOT_TCP;
    if (fragment & 0x3FFF)  /* more-fragments flag or offset */
        return SKIP_FRAGMENT;
    /* TSO-captured packets carry total length 0: the frame length is all there is. */
    Py_ssize_t end = total_len ? off + total_len : n - (cut < 0 ? cut : 0);
    t->src = f + off + 12;
    t->dst = f + off + 16;
    t->address_len = 4;
    return tcp_header(f, n, off + header_len, end, cut, t);
}

static int ipv6(const uint8_t *f, Py_ssize_t n, Py_ssize_t off, Py_ssize_t cut, tcp_fields *t) {
    if (off + 40 > n || f[off] >> 4 != 6)
        return SKIP_MALFORMED;
    unsigned payload_len = be16(f + off + 4);
    Py_ssize_t end = payload_len ? off + 40 + payload_len : n - (cut < 0 ? cut : 0);
    unsigned next_header = f[off + 6];
    t->src = f + off + 8;
    t->dst = f + off + 24;
    t->address_len = 16;
    Py_ssize_t pos = off + 40;
    while (next_header != IPPROTO_TCP_) {
        Py_ssize_t header_len;
        if (next_header == 0 || next_header == 43 || next_header == 60) {  /* hop-by-hop, routing, options */
            if (pos + 1 >= n)
                return SKIP_MALFORMED;
            header_len = (f[pos + 1] + 1) * 8;
        } else if (next_header == 44) {  /* fragment */
            if (pos + 3 >= n)
                return SKIP_MALFORMED;
            if (be16(f + pos + 2) & 0xFFF9)  /* offset or more-fragments */
                return SKIP_FRAGMENT;
            header_len = 8;
        } else if (next_header == 51) {  /* authentication */
            if (pos + 1 >= n)
                return SKIP_MALFORMED;
            header_len = (f[pos + 1] + 2) * 4;
        } else {
            return SKIP_NOT_TCP;
        }
        next_header = f[pos];
        pos += header_len;
    }
    return tcp_header(f, n, pos, end, cut, t);
}

/* The address family of BSD loopback/null headers is in the capturing host's byte order
   (DLT_NULL) or network order (DLT_LOOP); it fits one byte, so whichever end holds it tells. */
static int loopback_ethertype(const uint8_t *f, Py_ssize_t n, unsigned *ethertype) {
    if (n < 1 || (!f[0] && n < 4))
        return SKIP_MALFORMED;
    unsigned family = f[0] ? f[0] : f[3];
    if (family == 2)
        *ethertype = ETHERTYPE_IPV4;
    else if (family == 10 || family == 24 || family == 28 || family == 30)  /* Linux, Net/OpenBSD, FreeBSD, macOS */
        *ethertype = ETHERTYPE_IPV6;
    else
        *ethertype = 0;
    return SKIP_NONE;
}

static int parse(const uint8_t *f, Py_ssize_t n, long linktype, Py_ssize_t wire_len, tcp_fields *t) {
    unsigned ethertype;
    Py_ssize_t off;
    switch (linktype) {
    case LINKTYPE_ETHERNET:
        if (n < 14) return SKIP_MALFORMED;
        ethertype = be16(f + 12);
        off = 14;
        break;
    case LINKTYPE_LINUX_SLL:
        if (n < 16) return SKIP_MALFORMED;
        ethertype = be16(f + 14);
        off = 16;
        break;
    case LINKTYPE_LINUX_SLL2:
        if (n < 2) return SKIP_MALFORMED;
        ethertype = be16(f);
        off = 20;
        break;
    case LINKTYPE_RAW: case 12: case 14: case LINKTYPE_IPV4: case LINKTYPE_IPV6:
        /* the OS values of DLT_RAW (12 on most BSDs, 14 on OpenBSD) end up in some files */
        if (n < 1) return SKIP_MALFORMED;
        ethertype = f[0] >> 4 == 6 ? ETHERTYPE_IPV6 : ETHERTYPE_IPV4;
        off = 0;
        break;
    case LINKTYPE_NULL: case LINKTYPE_LOOP:
        if (loopback_ethertype(f, n, &ethertype) != SKIP_NONE) return SKIP_MALFORMED;
        off = 4;
        break;
    default:
        return SKIP_LINKTYPE;
    }
    while (is_vlan(ethertype)) {
        if (off + 4 > n) return SKIP_MALFORMED;
        ethertype = be16(f + off + 2);
        off += 4;
    }
    Py_ssize_t cut = n - (wire_len >= 0 ? wire_len : n);
    if (ethertype == ETHERTYPE_IPV4)
        return ipv4(f, n, off, cut, t);
    if (ethertype == ETHERTYPE_IPV6)
        return ipv6(f, n, off, cut, t);
    return SKIP_NOT_IP;
}

/* Address texts, remembered: hosts talk to few peers, and formatting one costs more than the rest
   of a segment. Direct-mapped by a hash of the address bytes. */
#define ADDRESS_CACHE_SIZE 512
typedef struct {
    int len;
    uint8_t bytes[16];
    PyObject *text;
} address_entry;
static address_entry address_cache[ADDRESS_CACHE_SIZE];

static PyObject *address_text(const uint8_t *raw, int len) {
    uint32_t hash = 2166136261u;
    for (int i = 0; i < len; i++)
        hash = (hash ^ raw[i]) * 16777619u;
    address_entry *entry = &address_cache[hash % ADDRESS_CACHE_SIZE];
    if (entry->text != NULL && entry->len == len && memcmp(entry->bytes, raw, len) == 0)
        return Py_NewRef(entry->text);
    char text[INET6_ADDRSTRLEN];
    if (len == 4)
        snprintf(text, sizeof text, "%u.%u.%u.%u", raw[0], raw[1], raw[2], raw[3]);
    else
        inet_ntop(AF_INET6, raw, text, sizeof text);
    PyObject *obj = PyUnicode_FromString(text);
    if (obj == NULL)
        return NULL;
    Py_XSETREF(entry->text, Py_NewRef(obj));
    entry->len = len;
    memcpy(entry->bytes, raw, len);
    return obj;
}

static PyObject *make_segment(const uint8_t *f, double ts, const tcp_fields *t) {
    PyObject *seg = segment_type->tp_alloc(segment_type, 10);
    if (seg == NULL)
        return NULL;
    PyObject *items[10] = {
        PyFloat_FromDouble(ts), address_text(t->src, t->address_len), PyLong_FromLong(t->sport),
        address_text(t->dst, t->address_len), PyLong_FromLong(t->dport), PyLong_FromUnsignedLong(t->seq),
        PyLong_FromUnsignedLong(t->ack), PyLong_FromLong(t->flags),
        PyBytes_FromStringAndSize((const char *)f + t->start, t->end - t->start),
        PyLong_FromSsize_t(t->missing),
    };
    for (int i = 0; i < 10; i++) {
        if (items[i] == NULL) {
            for (int j = 0; j < 10; j++)
                Py_XDECREF(items[j]);
            Py_DECREF(seg);
            return NULL;
        }
    }
    for (int i = 0; i < 10; i++)
        PyTuple_SET_ITEM(seg, i, items[i]);
    return seg;
}

/* A connection's bucket: the same in both directions (the endpoints in a fixed order) and in every process (FNV-1a
 * over their bytes, not a seeded hash). Buckets are what a scan shares out (Share) and counts bytes by. */
#define CONNECTION_BUCKETS 4096

static unsigned connection_bucket(const tcp_fields *t) {
    const uint8_t *a = t->src, *b = t->dst;
    unsigned a_port = t->sport, b_port = t->dport;
    int order = memcmp(a, b, t->address_len);
    if (order > 0 || (order == 0 && a_port > b_port)) {
        const uint8_t *address = a;
        a = b;
        b = address;
        unsigned port = a_port;
        a_port = b_port;
        b_port = port;
    }
    uint64_t hash = 14695981039346656037u;
#define MIX(byte) (hash = (hash ^ (uint8_t)(byte)) * 1099511628211u)
    for (int i = 0; i < t->address_len; i++)
        MIX(a[i]);
    MIX(a_port >> 8);
    MIX(a_port);
    for (int i = 0; i < t->address_len; i++)
        MIX(b[i]);
    MIX(b_port >> 8);
    MIX(b_port);
#undef MIX
    return (unsigned)(hash % CONNECTION_BUCKETS);
}

/* What a scan makes of the TCP frames: every connection's segments (owners NULL), or only those of the connections
 * whose bucket's owner is `shard` (a Spark task's share of the run, pipeline/reading.pyx: each task reads every
 * file, and the others' packets cost no objects); or, with bucket_bytes, nothing but the captured bytes of each
 * bucket's frames added up (from which the shares are drawn). */
typedef struct {
    Py_buffer owners_view;    /* CONNECTION_BUCKETS native uint16: the share each bucket belongs to */
    const uint8_t *owners;    /* its bytes; NULL: every connection */
    unsigned shard;
    Py_buffer counts_view;    /* CONNECTION_BUCKETS native uint64, writable */
    uint64_t *bucket_bytes;   /* the sums while scanning, added to counts_view at the end; NULL: not counting */
} Share;

static const Share EVERY_CONNECTION;  /* (all zero) */

/* The capture time a file has reached while it is read: the latest time of its TCP packets so far (a packet's own
 * time goes back when the capture's clock is stepped back). Files merged by time, as mergecap merges them (the file
 * whose next packet has the least time goes next), give their packets in the order of the times reached (then
 * file, then place in it), and a single file in its own order: the pipeline sorts by it (reading.pyx). It is also
 * the capture time TCP reassembly keeps (stream/tcp.pyx), which sees the TCP packets only. A scan with a clock
 * notes its time at each item made, and hands the notes over only when some item was behind it. */
typedef struct {
    Py_buffer view;      /* one native double, writable, kept between a file's scans; view.obj NULL: no clock */
    double reached;
    double *at_items;    /* the clock's time at each item made */
    Py_ssize_t items, capacity;
    int behind;          /* some item was made behind the clock */
} Clock;

/* The scan's optional clock argument (None: none) as its Clock: 0, or -1 with an exception set. */
static int clock_from(Clock *clock, PyObject *given) {
    memset(clock, 0, sizeof *clock);
    if (given == Py_None)
        return 0;
    if (PyObject_GetBuffer(given, &clock->view, PyBUF_WRITABLE) < 0)
        return -1;
    if (clock->view.len != (Py_ssize_t)sizeof(double)) {
        PyErr_SetString(PyExc_ValueError, "clock must hold one native double");
        return -1;
    }
    memcpy(&clock->reached, clock->view.buf, sizeof clock->reached);
    return 0;
}

static inline void clock_passes(Clock *clock, double ts) {
    if (clock != NULL && ts > clock->reached)  /* (NaN never moves it) */
        clock->reached = ts;
}

/* Notes the clock's time at an item made of a record of time ts: 0, or -1 with an exception set. */
static int clock_note(Clock *clock, double ts) {
    if (clock == NULL || clock->view.obj == NULL)
        return 0;
    if (clock->items == clock->capacity) {
        Py_ssize_t more = clock->capacity ? 2 * clock->capacity : 1024;
        double *grown = PyMem_Realloc(clock->at_items, (size_t)more * sizeof *grown);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        clock->at_items = grown;
        clock->capacity = more;
    }
    clock->at_items[clock->items++] = clock->reached;
    if (ts < clock->reached)
        clock->behind = 1;
    return 0;
}

/* Ends a scan's Clock: its time kept for the next scan (scanned true: the scan went through); returns the scan's
 * `reached` (a new reference), or NULL with an exception set. */
static PyObject *clock_done(Clock *clock, int scanned) {
    PyObject *reached = Py_None;
    if (clock->view.obj != NULL && scanned) {
        memcpy(clock->view.buf, &clock->reached, sizeof clock->reached);
        if (clock->behind)
            reached = PyBytes_FromStringAndSize((const char *)clock->at_items,
                                                clock->items * (Py_ssize_t)sizeof *clock->at_items);
    }
    PyMem_Free(clock->at_items);
    if (clock->view.obj != NULL)
        PyBuffer_Release(&clock->view);
    return reached == Py_None ? Py_NewRef(Py_None) : reached;
}

static inline unsigned owner_of(const Share *share, unsigned bucket) {
    uint16_t owner;
    memcpy(&owner, share->owners + bucket * sizeof owner, sizeof owner);  /* (a bytes object's data: any alignment) */
    return owner;
}

/* The segment in a frame (None when its connection is another share's), or a new reference to the reason it has
 * none. */
static PyObject *segment_or_reason(const uint8_t *f, Py_ssize_t n, long linktype, double ts, Py_ssize_t wire_len,
                                   const Share *share) {
    tcp_fields t;
    int skip = parse(f, n, linktype, wire_len, &t);
    if (skip == SKIP_NONE)
        return share->owners != NULL && owner_of(share, connection_bucket(&t)) != share->shard
                   ? Py_NewRef(Py_None) : make_segment(f, ts, &t);
    if (skip == SKIP_LINKTYPE)
        return PyUnicode_FromFormat("link type %ld", linktype);
    return Py_NewRef(reason_text[skip]);
}

/* The optional arguments of a scan (shard, owners, counts) as its Share: 0, or -1 with an exception set. */
static int share_from(Share *share, int shard, PyObject *owners, PyObject *counts) {
    memset(share, 0, sizeof *share);
    if (owners != Py_None) {
        if (PyObject_GetBuffer(owners, &share->owners_view, PyBUF_SIMPLE) < 0)
            return -1;
        share->owners = share->owners_view.buf;
        if (share->owners_view.len != CONNECTION_BUCKETS * (Py_ssize_t)sizeof(uint16_t)) {
            PyErr_SetString(PyExc_ValueError, "owners must hold a 16-bit share for each of CONNECTION_BUCKETS");
            return -1;
        }
    }
    if (shard < 0 || shard > UINT16_MAX) {
        PyErr_SetString(PyExc_ValueError, "shard must be in 0 .. 65535");
        return -1;
    }
    share->shard = (unsigned)shard;
    if (counts != Py_None) {
        if (PyObject_GetBuffer(counts, &share->counts_view, PyBUF_WRITABLE) < 0)
            return -1;
        if (share->counts_view.len != CONNECTION_BUCKETS * (Py_ssize_t)sizeof(uint64_t)) {
            PyErr_SetString(PyExc_ValueError, "counts must hold a 64-bit count for each of CONNECTION_BUCKETS");
            return -1;
        }
        share->bucket_bytes = PyMem_Calloc(CONNECTION_BUCKETS, sizeof(uint64_t));
        if (share->bucket_bytes == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    return 0;
}

/* Ends a scan's Share: the bytes counted (scanned true: the scan went through) added to its counts. */
static void share_done(Share *share, int scanned) {
    if (share->bucket_bytes != NULL) {
        if (scanned) {
            uint8_t *counts = share->counts_view.buf;
            for (unsigned i = 0; i < CONNECTION_BUCKETS; i++) {
                uint64_t count;
                memcpy(&count, counts + i * sizeof count, sizeof count);
                count += share->bucket_bytes[i];
                memcpy(counts + i * sizeof count, &count, sizeof count);
            }
        }
        PyMem_Free(share->bucket_bytes);
    }
    if (share->counts_view.obj != NULL)
        PyBuffer_Release(&share->counts_view);
    if (share->owners_view.obj != NULL)
        PyBuffer_Release(&share->owners_view);
}

/* A scan's Share and Clock from its optional arguments: 0, or -1 with an exception set (and neither held). */
static int scan_begins(Share *share, Clock *clock, int shard, PyObject *owners, PyObject *counts,
                       PyObject *given_clock, int parse_segments) {
    memset(clock, 0, sizeof *clock);
    int failed = share_from(share, shard, owners, counts) < 0 || clock_from(clock, given_clock) < 0;
    if (!failed && parse_segments && segment_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "use_segment_type() was not called");
        failed = 1;
    }
    if (failed) {
        share_done(share, 0);
        Py_DECREF(clock_done(clock, 0));
        return -1;
    }
    return 0;
}

static PyObject *parse_frame(PyObject *self, PyObject *args) {
    Py_buffer frame;
    long linktype;
    double ts;
    PyObject *wire_len_obj = Py_None;
    if (!PyArg_ParseTuple(args, "y*ld|O:parse_frame", &frame, &linktype, &ts, &wire_len_obj))
        return NULL;
    Py_ssize_t wire_len = -1;
    if (wire_len_obj != Py_None) {
        wire_len = PyLong_AsSsize_t(wire_len_obj);
        if (wire_len == -1 && PyErr_Occurred()) {
            PyBuffer_Release(&frame);
            return NULL;
        }
    }
    if (segment_type == NULL) {
        PyBuffer_Release(&frame);
        PyErr_SetString(PyExc_RuntimeError, "use_segment_type() was not called");
        return NULL;
    }
    PyObject *result = segment_or_reason(frame.buf, frame.len, linktype, ts, wire_len, &EVERY_CONNECTION);
    PyBuffer_Release(&frame);
    return result;
}

static int count_skips(PyObject *skipped, PyObject *reason, long n) {
    PyObject *count = PyDict_GetItemWithError(skipped, reason);
    if (count == NULL && PyErr_Occurred())
        return -1;
    PyObject *more = PyLong_FromLong(count ? PyLong_AsLong(count) + n : n);
    if (more == NULL)
        return -1;
    int failed = PyDict_SetItem(skipped, reason, more);
    Py_DECREF(more);
    return failed;
}

static int count_skip(PyObject *skipped, PyObject *reason) { return count_skips(skipped, reason, 1); }

/* One captured record: its segment (segments; None when it is another share's), or its (ts, linktype, frame,
 * wire_len); a frame without a segment is counted in `skipped` by its reason. When the share counts bytes, only
 * that: a TCP frame's captured bytes added to its connection's bucket. The clock (NULL: none) passes every TCP
 * packet's time. */
static int add_record(PyObject *items, PyObject *skipped, int segments, const Share *share, Clock *clock,
                      const uint8_t *f, Py_ssize_t caplen, long linktype, double ts, Py_ssize_t wire_len) {
    if (share->bucket_bytes != NULL) {
        tcp_fields t;
        if (parse(f, caplen, linktype, wire_len, &t) == SKIP_NONE)
            share->bucket_bytes[connection_bucket(&t)] += (uint64_t)caplen;
        return 0;
    }
    PyObject *item;
    if (segments) {
        item = segment_or_reason(f, caplen, linktype, ts, wire_len, share);
        if (item != NULL && PyUnicode_CheckExact(item)) {
            int failed = count_skip(skipped, item);
            Py_DECREF(item);
            return failed;
        }
    } else {
        item = Py_BuildValue("(dly#n)", ts, linktype, (const char *)f, caplen, wire_len);
    }
    if (item == NULL)
        return -1;
    int failed = PyList_Append(items, item);
    Py_DECREF(item);
    if (segments)
        clock_passes(clock, ts);
    return failed ? failed : clock_note(clock, ts);
}

static PyObject *scan_pcap(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t pos = 0, record_header_len, max_record;
    int big_endian, parse_segments;
    double units;
    long linktype;
    PyObject *skipped, *owners = Py_None, *counts = Py_None, *given_clock = Py_None;
    int shard = 0;
    Share share;
    Clock clock;
    if (!PyArg_ParseTuple(args, "y*pndlnO!p|iOOO:scan_pcap", &buf, &big_endian, &record_header_len, &units,
                          &linktype, &max_record, &PyDict_Type, &skipped, &parse_segments, &shard, &owners, &counts,
                          &given_clock))
        return NULL;
    if (scan_begins(&share, &clock, shard, owners, counts, given_clock, parse_segments) < 0) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    const uint8_t *b = buf.buf;
    Py_ssize_t n = buf.len;
    Py_ssize_t records = 0;
    PyObject *items = PyList_New(0), *bad_caplen = Py_None;
    if (items == NULL)
        goto fail;
    while (n - pos >= record_header_len) {
        const uint8_t *h = b + pos;
        uint32_t seconds = big_endian ? be32(h) : le32(h), fraction = big_endian ? be32(h + 4) : le32(h + 4);
        uint32_t caplen = big_endian ? be32(h + 8) : le32(h + 8), wire_len = big_endian ? be32(h + 12) : le32(h + 12);
        if (caplen > max_record) {
            bad_caplen = PyLong_FromUnsignedLong(caplen);
            if (bad_caplen == NULL)
                goto fail;
            break;
        }
        if (n - pos - record_header_len < (Py_ssize_t)caplen)
            break;
        records++;
        double ts = (double)seconds + (double)fraction / units;
        if (add_record(items, skipped, parse_segments, &share, &clock, h + record_header_len, caplen, linktype, ts,
                       wire_len))
            goto fail;
        pos += record_header_len + caplen;
    }
    share_done(&share, 1);
    PyObject *reached = clock_done(&clock, 1);
    PyBuffer_Release(&buf);
    if (reached == NULL)
        goto failed;
    return Py_BuildValue("(NnnNN)", items, records, pos, bad_caplen == Py_None ? Py_NewRef(Py_None) : bad_caplen,
                         reached);
fail:
    share_done(&share, 0);
    Py_DECREF(clock_done(&clock, 0));
    PyBuffer_Release(&buf);
failed:
    Py_XDECREF(items);
    if (bad_caplen != Py_None)
        Py_XDECREF(bad_caplen);
    return NULL;
}

#define PCAPNG_PB 2    /* obsolete packet block */
#define PCAPNG_SPB 3   /* simple packet block */
#define PCAPNG_EPB 6   /* enhanced packet block */
#define PCAPNG_PACKET_HEADER 20  /* interface, timestamp high and low, captured and original length */

static PyObject *malformed_record_text, *undescribed_interface_text;

static PyObject *scan_pcapng(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t pos = 0, max_record;
    int big_endian, parse_segments, at_block = 0;
    PyObject *interfaces, *skipped, *owners = Py_None, *counts = Py_None, *given_clock = Py_None;
    int shard = 0;
    Share share;
    Clock clock;
    if (!PyArg_ParseTuple(args, "y*pO!nO!p|iOOO:scan_pcapng", &buf, &big_endian, &PyList_Type, &interfaces,
                          &max_record, &PyDict_Type, &skipped, &parse_segments, &shard, &owners, &counts,
                          &given_clock))
        return NULL;
    if (scan_begins(&share, &clock, shard, owners, counts, given_clock, parse_segments) < 0) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    const uint8_t *b = buf.buf;
    Py_ssize_t n = buf.len, records = 0;
    PyObject *items = PyList_New(0);
    if (items == NULL)
        goto fail;
    PyObject *last_described = NULL;  /* held by the list of interfaces, which nothing changes during the call */
    long linktype = 0;
    double units = 1, offset = 0;
#define U32(p) (big_endian ? be32(p) : le32(p))
    while (n - pos >= 8) {
        const uint8_t *block = b + pos;
        uint32_t type = U32(block), block_len = U32(block + 4);
        if ((type != PCAPNG_EPB && type != PCAPNG_SPB && type != PCAPNG_PB) || block_len < 12 || block_len % 4 ||
            block_len > (uint64_t)max_record) {
            at_block = 1;
            break;
        }
        if (n - pos < (Py_ssize_t)block_len)
            break;
        const uint8_t *body = block + 8;
        Py_ssize_t data_end = (Py_ssize_t)block_len - 12;  /* the block ends with a copy of its length */
        uint32_t iface = 0, caplen = 0, wire_len = 0;
        uint64_t stamp = 0;
        const uint8_t *frame = NULL;
        pos += block_len;
        records++;
        PyObject *reason = NULL;
        if (type == PCAPNG_SPB) {
            if (data_end < 4) {
                reason = malformed_record_text;
            } else {
                wire_len = U32(body);
                caplen = wire_len < (uint64_t)(data_end - 4) ? wire_len : (uint32_t)(data_end - 4);
                frame = body + 4;  /* the block holds at most snaplen bytes */
            }
        } else if (data_end < PCAPNG_PACKET_HEADER) {
            reason = malformed_record_text;
        } else {
            iface = U32(body);
            if (type == PCAPNG_PB)  /* 16-bit interface id, then a drop count */
                iface = big_endian ? iface >> 16 : iface & 0xFFFF;
            stamp = (uint64_t)U32(body + 4) << 32 | U32(body + 8);
            caplen = U32(body + 12);
            wire_len = U32(body + 16);
            frame = body + PCAPNG_PACKET_HEADER;
            if (caplen > (uint64_t)(data_end - PCAPNG_PACKET_HEADER))
                reason = malformed_record_text;
        }
        PyObject *described = NULL;
        if (reason == NULL) {
            described = iface < (uint64_t)PyList_GET_SIZE(interfaces) ? PyList_GET_ITEM(interfaces, iface) : Py_None;
            if (described == Py_None)
                reason = undescribed_interface_text;
        }
        if (reason != NULL) {
            if (count_skip(skipped, reason))
                goto fail;
            continue;
        }
        if (described != last_described) {  /* a packet names its interface's tuple: read once a run */
            if (!PyArg_ParseTuple(described, "ldd:interface", &linktype, &units, &offset))
                goto fail;
            last_described = described;
        }
        if (add_record(items, skipped, parse_segments, &share, &clock, frame, caplen, linktype,
                       offset + (double)stamp / units, wire_len))
            goto fail;
    }
#undef U32
    share_done(&share, 1);
    PyObject *reached = clock_done(&clock, 1);
    PyBuffer_Release(&buf);
    if (reached == NULL) {
        Py_DECREF(items);
        return NULL;
    }
    return Py_BuildValue("(NnnON)", items, records, pos, at_block ? Py_True : Py_False, reached);
fail:
    share_done(&share, 0);
    Py_DECREF(clock_done(&clock, 0));
    PyBuffer_Release(&buf);
    Py_XDECREF(items);
    return NULL;
}

#ifdef __linux__
#include <linux/if_packet.h>

#define ETHERNET_ADDRESSES 12  /* destination and source MAC: an 802.1Q tag goes after them */

static PyObject *malformed_ring_frame_text;

/* A 16- or 32-bit field of a header in the ring, read without relying on its alignment. */
#define RING_FIELD(base, type, field) ring_field((base) + offsetof(type, field), sizeof(((type *)0)->field))
static inline uint32_t ring_field(const uint8_t *p, size_t size) {
    if (size == 2) {
        uint16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static int append_pcap_record(PyObject *records, uint32_t seconds, uint32_t nanoseconds, const uint8_t *frame,
                              uint32_t caplen, uint32_t wire_len) {
    Py_ssize_t at = PyByteArray_GET_SIZE(records);
    if ((size_t)caplen > (size_t)(PY_SSIZE_T_MAX - 16 - at)) {
        PyErr_NoMemory();
        return -1;
    }
    if (PyByteArray_Resize(records, at + 16 + (Py_ssize_t)caplen) < 0)
        return -1;
    uint8_t *out = (uint8_t *)PyByteArray_AS_STRING(records) + at;
    uint32_t header[4] = {seconds, nanoseconds, caplen, wire_len};  /* in the host's order, as is the file's header */
    memcpy(out, header, sizeof header);
    memcpy(out + sizeof header, frame, caplen);
    return 0;
}

/* The frames of a block the kernel handed over, each parsed (and written to pcap_records), in order. Every
 * offset and length is read once and checked against the block before it is used: the ring is shared memory.
 * Frames the block claims beyond the first that does not fit are counted as skipped. */
static int walk_ring_block(const uint8_t *block, size_t size, long linktype, PyObject *skipped,
                           PyObject *pcap_records, PyObject *segments, uint32_t *claimed) {
    const size_t frame_header = sizeof(struct tpacket3_hdr);
    const uint8_t *bh1 = block + offsetof(struct tpacket_block_desc, hdr.bh1);
    uint32_t packets = RING_FIELD(bh1, struct tpacket_hdr_v1, num_pkts);
    size_t offset = RING_FIELD(bh1, struct tpacket_hdr_v1, offset_to_first_pkt);
    size_t end = RING_FIELD(bh1, struct tpacket_hdr_v1, blk_len);
    if (end > size)
        end = size;
    *claimed = packets;
    uint8_t *tagged = NULL;  /* a frame with its 802.1Q tag put back */
    uint32_t read = 0;
    int failed = 0;
    while (read < packets) {
        if (offset < sizeof(struct tpacket_block_desc) || offset > end || end - offset < frame_header)
            break;
        const uint8_t *h = block + offset;
        uint32_t next = RING_FIELD(h, struct tpacket3_hdr, tp_next_offset);
        uint32_t seconds = RING_FIELD(h, struct tpacket3_hdr, tp_sec);
        uint32_t nanoseconds = RING_FIELD(h, struct tpacket3_hdr, tp_nsec);
        uint32_t caplen = RING_FIELD(h, struct tpacket3_hdr, tp_snaplen);
        uint32_t wire_len = RING_FIELD(h, struct tpacket3_hdr, tp_len);
        uint32_t status = RING_FIELD(h, struct tpacket3_hdr, tp_status);
        size_t mac = RING_FIELD(h, struct tpacket3_hdr, tp_mac);
        uint32_t vlan_tci = RING_FIELD(h, struct tpacket3_hdr, hv1.tp_vlan_tci);
        uint32_t vlan_tpid = RING_FIELD(h, struct tpacket3_hdr, hv1.tp_vlan_tpid);
        if (mac < frame_header || mac > end - offset || caplen > end - offset - mac)
            break;
        const uint8_t *frame = h + mac;
        if ((vlan_tci || status & TP_STATUS_VLAN_VALID) && linktype == LINKTYPE_ETHERNET &&
                caplen >= ETHERNET_ADDRESSES) {
            /* the NIC took the 802.1Q tag off; put it back where it was on the wire */
            PyMem_Free(tagged);
            tagged = PyMem_Malloc((size_t)caplen + 4);
            if (tagged == NULL) {
                PyErr_NoMemory();
                failed = -1;
                break;
            }
            unsigned tpid = status & TP_STATUS_VLAN_TPID_VALID ? vlan_tpid : 0x8100;
            memcpy(tagged, frame, ETHERNET_ADDRESSES);
            tagged[12] = tpid >> 8;
            tagged[13] = tpid & 0xFF;
            tagged[14] = (vlan_tci >> 8) & 0xFF;
            tagged[15] = vlan_tci & 0xFF;
            memcpy(tagged + 16, frame + ETHERNET_ADDRESSES, caplen - ETHERNET_ADDRESSES);
            frame = tagged;
            caplen += 4;  /* at most the block's size, plus 4 */
            wire_len = wire_len > UINT32_MAX - 4 ? UINT32_MAX : wire_len + 4;
        }
        if (add_record(segments, skipped, 1, &EVERY_CONNECTION, NULL, frame, caplen, linktype,
                       (double)seconds + nanoseconds * 1e-9, wire_len) ||
                (pcap_records != Py_None &&
                 append_pcap_record(pcap_records, seconds, nanoseconds, frame, caplen, wire_len))) {
            failed = -1;
            break;
        }
        read++;
        /* the last frame's is 0; one shorter than a header, or past the end, cannot lead to another frame */
        if (next < frame_header || next > end - offset)
            break;
        offset += next;
    }
    PyMem_Free(tagged);
    if (failed)
        return -1;
    return read < packets ? count_skips(skipped, malformed_ring_frame_text, (long)(packets - read)) : 0;
}

static PyObject *scan_ring_block(PyObject *self, PyObject *args) {
    Py_buffer block;
    long linktype;
    PyObject *skipped, *pcap_records;
    if (!PyArg_ParseTuple(args, "w*lO!O:scan_ring_block", &block, &linktype, &PyDict_Type, &skipped, &pcap_records))
        return NULL;
    PyObject *result = NULL;
    if (pcap_records != Py_None && !PyByteArray_CheckExact(pcap_records)) {
        PyErr_SetString(PyExc_TypeError, "pcap_records must be a bytearray or None");
        goto done;
    }
    if (segment_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "use_segment_type() was not called");
        goto done;
    }
    if ((size_t)block.len < sizeof(struct tpacket_block_desc) || (uintptr_t)block.buf % _Alignof(uint32_t)) {
        PyErr_SetString(PyExc_ValueError, "not a ring block: too short, or not aligned");
        goto done;
    }
    uint32_t *status = (uint32_t *)((uint8_t *)block.buf + offsetof(struct tpacket_block_desc, hdr.bh1.block_status));
    /* acquire: the frames are read only after the kernel's release of the block */
    if (!(__atomic_load_n(status, __ATOMIC_ACQUIRE) & TP_STATUS_USER)) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *segments = PyList_New(0);
    uint32_t claimed = 0;
    int failed = segments == NULL ||
                 walk_ring_block(block.buf, block.len, linktype, skipped, pcap_records, segments, &claimed);
    /* Back to the kernel even after an error, or the ring would stall. Release: what was read of the block is
       read before the kernel may write it again. */
    __atomic_store_n(status, TP_STATUS_KERNEL, __ATOMIC_RELEASE);
    if (failed)
        Py_XDECREF(segments);
    else
        result = Py_BuildValue("(NI)", segments, claimed);
done:
    PyBuffer_Release(&block);
    return result;
}
#endif

static PyObject *use_segment_type(PyObject *self, PyObject *type) {
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "use_segment_type() needs a tuple subclass");
        return NULL;
    }
    Py_XSETREF(segment_type, (PyTypeObject *)Py_NewRef(type));
    Py_RETURN_NONE;
}

#define PCAPNG_SHB 0x0A0D0D0A  /* section header: the same in either byte order */
#define PCAPNG_DSB 0x0000000A  /* decryption secrets */

/* skip_blocks(buf, at, big_endian) -> where the walk stopped: from `at`, the pcapng blocks whose headers are in buf
   and that are neither a section header nor decryption secrets are skipped, by their lengths; it stops at such a
   block, at a header not whole in buf, past the end of buf (the rest of a longer block is not buffered) or at a
   length that cannot be one. Looking for the secrets before the packets (capture/secrets.py) walks every block
   of a file: a few nanoseconds a block here. */
static PyObject *skip_blocks(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t at;
    int big_endian;
    if (!PyArg_ParseTuple(args, "y*np:skip_blocks", &buf, &at, &big_endian))
        return NULL;
    const uint8_t *b = buf.buf;
    Py_ssize_t n = buf.len;
    while (at >= 0 && n - at >= 12) {
        uint32_t kind = big_endian ? be32(b + at) : le32(b + at);
        uint32_t length = big_endian ? be32(b + at + 4) : le32(b + at + 4);
        if (kind == PCAPNG_SHB || kind == PCAPNG_DSB || length < 12 || length % 4)
            break;
        at += length;
    }
    PyBuffer_Release(&buf);
    return PyLong_FromSsize_t(at);
}

static PyMethodDef methods[] = {
    {"parse_frame", parse_frame, METH_VARARGS, "The TcpSegment in a frame, or the reason it holds none."},
    {"scan_pcap", scan_pcap, METH_VARARGS,
     "Whole pcap records in a buffer, as segments or frames (a share of the connections: shard, owners), or the "
     "bytes of each connection bucket (counts)."},
    {"scan_pcapng", scan_pcapng, METH_VARARGS,
     "Whole pcapng packet blocks in a buffer, as segments or frames (a share of the connections: shard, owners), "
     "or the bytes of each connection bucket (counts)."},
    {"skip_blocks", skip_blocks, METH_VARARGS, "Where a walk of pcapng blocks reaches a section header or secrets."},
#ifdef __linux__
    {"scan_ring_block", scan_ring_block, METH_VARARGS, "The frames of one block of a TPACKET_V3 ring, as segments."},
#endif
    {"use_segment_type", use_segment_type, METH_O, "The tuple subclass that segments are made as."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_headers", NULL, -1, methods};

PyMODINIT_FUNC PyInit__headers(void) {
    static const char *texts[] = {NULL, "malformed", "not IP", "not TCP", "IP fragment"};
    for (int i = SKIP_MALFORMED; i < SKIP_LINKTYPE; i++) {
        reason_text[i] = PyUnicode_InternFromString(texts[i]);
        if (reason_text[i] == NULL)
            return NULL;
    }
    malformed_record_text = PyUnicode_InternFromString("malformed record");
    undescribed_interface_text = PyUnicode_InternFromString("packet of an undescribed interface");
    if (malformed_record_text == NULL || undescribed_interface_text == NULL)
        return NULL;
#ifdef __linux__
    malformed_ring_frame_text = PyUnicode_InternFromString("malformed ring frame");
    if (malformed_ring_frame_text == NULL)
        return NULL;
#endif
    PyObject *created = PyModule_Create(&module);
    if (created != NULL && PyModule_AddIntConstant(created, "CONNECTION_BUCKETS", CONNECTION_BUCKETS) < 0)
        Py_CLEAR(created);
    return created;
}
