/* The compiled line scanner of bcgtune's SGLang log parser (an optional extension: the
 * numpy fast path in fastpath.py gives the same results where it is not built).
 *
 * One pass over a piece of whole lines finds, for each line:
 *   - its end (the offset of its b"\n", or the piece's end for an unterminated last line);
 *   - the record heads it holds, as fastpath._ChunkLines.batch_lines finds them: every
 *     "batch" with "Prefill " (prefill), "Decode " (decode) or "new fill " after an "n"
 *     (pre-2024 prefill) right before it, anything else being another head (a line with
 *     another head, none of the three, and a "#new-seq" may hold a prefill record whose
 *     head was cut off);
 *   - for a line with none of the three heads, whether it holds one of the needles the
 *     per-line parser acts on (fastpath._RARE_NEEDLES, passed in);
 *   - for a prefill or pre-2024 line, its layout: the id of its text with every ASCII digit read as
 *     "0" (the key of fastpath._Plans.index); for a line with a needle, the id of its exact
 *     text. Ids persist across calls on one LineTable, so the caller plans a layout, or
 *     parses a rare line's text, once per distinct text, not once per line.
 *
 * Bounded: a prefill or pre-2024 line longer than max_key bytes, or a rare line longer than max_rare,
 * gets no id (-1: the caller reads it per line);
 * the table keeps the texts it has seen (nbytes says how many bytes) until clear().
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem */
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stddef.h>
#include <string.h>

#define K_PREFILL 1
#define K_DECODE 2
#define K_LEGACY 4
#define K_GLUED 8
#define K_HEAD_CUT 16
#define K_RARE 32

typedef struct {
    uint64_t hash;
    int64_t id;  /* -1: empty slot */
} Slot;

typedef struct {
    PyObject_HEAD
    Slot *slots;
    size_t cap;       /* slots, a power of two */
    size_t used;
    char *arena;      /* the texts, one after another (masked for layouts) */
    size_t arena_len, arena_cap;
    int64_t *key_off; /* per id: offset in the arena, length, and whether it is a layout */
    int64_t *key_len;
    uint8_t *key_masked;
    size_t nkeys, keys_cap;
    int level; /* the pass asked for: 0 line by line, 1 SSE2, 2 AVX2 (each where available) */
    int busy;  /* a scan is running (without the GIL): another thread's call is refused */
} LineTable;

static void table_free(LineTable *t) {
    PyMem_RawFree(t->slots);
    PyMem_RawFree(t->arena);
    PyMem_RawFree(t->key_off);
    PyMem_RawFree(t->key_len);
    PyMem_RawFree(t->key_masked);
    t->slots = NULL;
    t->arena = NULL;
    t->key_off = t->key_len = NULL;
    t->key_masked = NULL;
    t->cap = t->used = t->arena_len = t->arena_cap = t->nkeys = t->keys_cap = 0;
}

static int table_init_slots(LineTable *t, size_t cap) {
    Slot *s = PyMem_RawMalloc(cap * sizeof(Slot));
    if (!s) return -1;
    for (size_t i = 0; i < cap; i++) s[i].id = -1;
    PyMem_RawFree(t->slots);
    t->slots = s;
    t->cap = cap;
    t->used = 0;
    return 0;
}

/* *array (of any pointer type) reallocated to cap items of size bytes: 0, or -1 when no
 * memory (the array left as it was). Raw memory: callable without the GIL. */
static int grow(void *array, size_t cap, size_t size) {
    void **p = (void **)array;
    void *q = PyMem_RawRealloc(*p, cap * size);
    if (!q) return -1;
    *p = q;
    return 0;
}

static inline int is_digit(unsigned char c) { return (unsigned)(c - '0') < 10u; }

/* Each ASCII digit byte of w set to "0" (SWAR: a byte is a digit when w ^ "0" is below
 * 10, tested on the high bit of (x & 0x7f) + 0x76, which never carries into the next byte). */
static inline uint64_t mask_digits(uint64_t w) {
    const uint64_t zeros = 0x3030303030303030ull, high = 0x8080808080808080ull;
    uint64_t a = w ^ zeros;
    uint64_t nondigit = ((a & 0x7f7f7f7f7f7f7f7full) + 0x7676767676767676ull) | a;
    uint64_t m = ((~nondigit & high) >> 7) * 0xffu;
    return (w & ~m) | (zeros & m);
}

static inline uint64_t load8(const unsigned char *p) {
    uint64_t w;
    memcpy(&w, p, 8);
    return w;
}

/* The last n % 8 bytes of the text as one zero-padded word. */
static inline uint64_t load_tail(const unsigned char *p, size_t n) {
    uint64_t w = 0;
    memcpy(&w, p + (n & ~(size_t)7), n & 7);
    return w;
}

/* A 64-bit hash of the text (digits read as "0" when masked): two independent lanes of
 * 8-byte words, then mixed. */
static uint64_t text_hash(const unsigned char *p, size_t n, int masked) {
    uint64_t a = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull) ^ (uint64_t)masked, b = ~a;
    size_t i = 0;
    if (masked) {
        for (; i + 16 <= n; i += 16) {
            a = (a ^ mask_digits(load8(p + i))) * 0x100000001b3ull;
            b = (b ^ mask_digits(load8(p + i + 8))) * 0xc2b2ae3d27d4eb4full;
        }
        if (i + 8 <= n) a = (a ^ mask_digits(load8(p + i))) * 0x100000001b3ull;
        b = (b ^ mask_digits(load_tail(p, n))) * 0xc2b2ae3d27d4eb4full;
    } else {
        for (; i + 16 <= n; i += 16) {
            a = (a ^ load8(p + i)) * 0x100000001b3ull;
            b = (b ^ load8(p + i + 8)) * 0xc2b2ae3d27d4eb4full;
        }
        if (i + 8 <= n) a = (a ^ load8(p + i)) * 0x100000001b3ull;
        b = (b ^ load_tail(p, n)) * 0xc2b2ae3d27d4eb4full;
    }
    uint64_t h = a ^ (b >> 29) ^ (b << 35);
    h ^= h >> 32;
    h *= 0xd6e8feb86659fd93ull;
    h ^= h >> 32;
    return h;
}

static int text_equal(const LineTable *t, int64_t id, const unsigned char *p, size_t n, int masked) {
    if ((size_t)t->key_len[id] != n || t->key_masked[id] != masked) return 0;
    const unsigned char *k = (const unsigned char *)t->arena + t->key_off[id];
    if (!masked) return memcmp(k, p, n) == 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        if (load8(k + i) != mask_digits(load8(p + i))) return 0;
    return load_tail(k, n) == mask_digits(load_tail(p, n));
}

static int table_grow(LineTable *t) {
    size_t cap = t->cap * 2;
    Slot *s = PyMem_RawMalloc(cap * sizeof(Slot));
    if (!s) return -1;
    for (size_t i = 0; i < cap; i++) s[i].id = -1;
    for (size_t i = 0; i < t->cap; i++) {
        if (t->slots[i].id < 0) continue;
        size_t j = t->slots[i].hash & (cap - 1);
        while (s[j].id >= 0) j = (j + 1) & (cap - 1);
        s[j] = t->slots[i];
    }
    PyMem_RawFree(t->slots);
    t->slots = s;
    t->cap = cap;
    return 0;
}

/* The id of the text, added when new. -2 on memory error. */
static int64_t table_id(LineTable *t, const unsigned char *p, size_t n, int masked) {
    uint64_t h = text_hash(p, n, masked);
    size_t j = h & (t->cap - 1);
    while (t->slots[j].id >= 0) {
        if (t->slots[j].hash == h && text_equal(t, t->slots[j].id, p, n, masked)) {
            return t->slots[j].id;
        }
        j = (j + 1) & (t->cap - 1);
    }
    if (t->arena_len + n > t->arena_cap) {
        size_t cap = t->arena_cap ? t->arena_cap : 1 << 16;
        while (cap < t->arena_len + n) cap *= 2;
        if (grow(&t->arena, cap, 1)) return -2;
        t->arena_cap = cap;
    }
    if (t->nkeys == t->keys_cap) {
        size_t cap = t->keys_cap ? 2 * t->keys_cap : 1024;
        if (grow(&t->key_off, cap, sizeof(int64_t)) || grow(&t->key_len, cap, sizeof(int64_t)) ||
            grow(&t->key_masked, cap, 1))
            return -2;
        t->keys_cap = cap;
    }
    char *dst = t->arena + t->arena_len;
    if (masked) {
        for (size_t i = 0; i < n; i++) dst[i] = is_digit(p[i]) ? '0' : (char)p[i];
    } else {
        memcpy(dst, p, n);
    }
    int64_t id = (int64_t)t->nkeys++;
    t->key_off[id] = (int64_t)t->arena_len;
    t->key_len[id] = (int64_t)n;
    t->key_masked[id] = (uint8_t)masked;
    t->arena_len += n;
    t->slots[j].hash = h;
    t->slots[j].id = id;
    if (++t->used * 2 > t->cap && table_grow(t) < 0) return -2;
    return id;
}

/* Growable int64 / uint8 output columns (raw memory: filled without the GIL). */
typedef struct {
    int64_t *line, *key;
    uint8_t *kind;
    size_t n, cap;
} Out;

static int out_push(Out *o, int64_t line, uint8_t kind, int64_t key) {
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 1024;
        if (grow(&o->line, cap, sizeof(int64_t)) || grow(&o->key, cap, sizeof(int64_t)) || grow(&o->kind, cap, 1))
            return -1;
        o->cap = cap;
    }
    o->line[o->n] = line;
    o->kind[o->n] = kind;
    o->key[o->n] = key;
    o->n++;
    return 0;
}

static void out_free(Out *o) {
    PyMem_RawFree(o->line);
    PyMem_RawFree(o->key);
    PyMem_RawFree(o->kind);
}

#define MAX_NEEDLES 16

typedef struct {
    const unsigned char *p[MAX_NEEDLES];
    size_t n[MAX_NEEDLES];
    int count;
} Needles;

static int holds(const unsigned char *s, size_t len, const unsigned char *needle, size_t n) {
    return n == 0 || (len >= n && memmem(s, len, needle, n) != NULL);
}

/* What one line holds so far. */
typedef struct {
    int prefill, decode, legacy, other;
    unsigned rare; /* bit k: needle k was found */
} LineState;

/* A "batch" at offset pos of the piece, judged by the bytes before it within the piece
 * (fastpath._ChunkLines.batch_lines: "Prefill ", "Decode ", "n" + "ew fill "). */
static inline void on_batch(const unsigned char *buf, size_t pos, LineState *s) {
    const unsigned char *hit = buf + pos;
    if (pos >= 8 && memcmp(hit - 8, "Prefill ", 8) == 0)
        s->prefill++;
    else if (pos >= 7 && memcmp(hit - 7, "Decode ", 7) == 0)
        s->decode++;
    else if (pos >= 9 && memcmp(hit - 8, "ew fill ", 8) == 0 && hit[-9] == 'n')
        s->legacy++;
    else
        s->other++;
}

/* The bit of the needle found at pos, 0 if none. */
static inline unsigned rare_at(const unsigned char *buf, size_t pos, size_t size, const Needles *rare) {
    for (int k = 0; k < rare->count; k++) {
        size_t n = rare->n[k];
        if (n && pos + n <= size && memcmp(buf + pos, rare->p[k], n) == 0) return 1u << k;
    }
    return 0;
}

typedef struct {
    LineTable *t;
    const unsigned char *buf;
    const unsigned char *new_seq;
    size_t new_seq_len, max_key, max_rare;
    unsigned layout_rare; /* needles whose lines are keyed by layout when nothing else is on them */
    Out *o;
    int64_t *ends;
    size_t nlines, ends_cap;
} Scan;

/* Line buf[start:end) is complete: its end recorded, and if it is of interest, its kind
 * and the id of its text. -1 on a memory error. */
static int finish_line(Scan *sc, size_t start, size_t end, LineState *s) {
    if (sc->nlines == sc->ends_cap) {
        size_t cap = sc->ends_cap ? 2 * sc->ends_cap : 4096;
        if (grow(&sc->ends, cap, sizeof(int64_t))) return -1;
        sc->ends_cap = cap;
    }
    int64_t li = (int64_t)sc->nlines;
    sc->ends[sc->nlines++] = (int64_t)end;
    uint8_t kind = 0;
    if (s->prefill) kind |= K_PREFILL;
    if (s->decode) kind |= K_DECODE;
    if (s->legacy) kind |= K_LEGACY;
    if (s->prefill > 1) kind |= K_GLUED;
    const unsigned char *line = sc->buf + start;
    size_t len = end - start;
    if (s->other && !s->prefill && !s->decode && !s->legacy && holds(line, len, sc->new_seq, sc->new_seq_len))
        kind |= K_HEAD_CUT;
    if (s->rare && !s->prefill && !s->decode && !s->legacy) kind |= K_RARE; /* a record line's needles mean nothing */
    /* keyed by its layout (digits masked): a record line, or a rare line with no "batch" whose
     * needles are all of layout_rare (what the per-line parser does with it does not depend
     * on its digits) */
    int record = (kind & (K_PREFILL | K_LEGACY)) != 0;
    int masked = record || ((kind & K_RARE) && !s->other && !(s->rare & ~sc->layout_rare));
    memset(s, 0, sizeof(*s));
    if (!kind) return 0;
    int64_t key = -1;
    if (record ? len <= sc->max_key : (kind & K_RARE) && len <= sc->max_rare) {
        key = table_id(sc->t, line, len, masked);
        if (key == -2) return -1;
    }
    return out_push(sc->o, li, kind, key);
}

/* The SIMD pass over a piece, W bytes at a time (16: SSE2, 32: AVX2): newlines, and
 * where the first and last bytes of "batch" and of each rare needle match (candidates,
 * then compared in full), in position order. The needles are not looked for in the rest
 * of a line once it holds a prefill or decode head (such a line is never a rare line).
 * Returns the offset reached (the rest is scanned a byte at a time), or -1 on a memory
 * error. */
#define SIMD_PASS(NAME, ATTR, VEC, SPLAT, LOADU, CMPEQ, AND, MOVEMASK, W)                              \
    ATTR static ptrdiff_t NAME(Scan *sc, size_t size, const Needles *rare, size_t *line_start,          \
                               LineState *st) {                                                       \
        const unsigned char *buf = sc->buf;                                                           \
        size_t reach = 5, p = 0;                                                                      \
        for (int k = 0; k < rare->count; k++)                                                         \
            if (rare->n[k] > reach) reach = rare->n[k];                                               \
        VEC nlv = SPLAT('\n'), bf = SPLAT('b'), bl = SPLAT('h');                                      \
        VEC rf[MAX_NEEDLES], rl[MAX_NEEDLES];                                                         \
        size_t roff[MAX_NEEDLES];                                                                     \
        int nr = 0;                                                                                   \
        for (int k = 0; k < rare->count; k++) {                                                       \
            if (!rare->n[k]) continue;                                                                \
            rf[nr] = SPLAT((char)rare->p[k][0]);                                                      \
            rl[nr] = SPLAT((char)rare->p[k][rare->n[k] - 1]);                                         \
            roff[nr++] = rare->n[k] - 1;                                                              \
        }                                                                                             \
        for (; p + W + reach <= size; p += W) {                                                       \
            const unsigned char *b0 = buf + p;                                                        \
            VEC v = LOADU(b0);                                                                        \
            uint32_t nl = (uint32_t)MOVEMASK(CMPEQ(v, nlv));                                          \
            uint32_t bm = (uint32_t)MOVEMASK(AND(CMPEQ(v, bf), CMPEQ(LOADU(b0 + 4), bl)));            \
            uint32_t rm = 0;                                                                          \
            if (nl || !(st->prefill | st->decode))                                                    \
                for (int k = 0; k < nr; k++)                                                          \
                    rm |= (uint32_t)MOVEMASK(AND(CMPEQ(v, rf[k]), CMPEQ(LOADU(b0 + roff[k]), rl[k]))); \
            uint32_t all = nl | bm | rm;                                                              \
            while (all) {                                                                             \
                uint32_t bit = all & (0u - all);                                                      \
                all ^= bit;                                                                           \
                size_t q = p + (size_t)__builtin_ctz(bit);                                            \
                if ((bm & bit) && memcmp(buf + q, "batch", 5) == 0) on_batch(buf, q, st);             \
                if (rm & bit) st->rare |= rare_at(buf, q, size, rare);                                \
                if (nl & bit) {                                                                       \
                    if (finish_line(sc, *line_start, q, st) < 0) return -1;                           \
                    *line_start = q + 1;                                                              \
                }                                                                                     \
            }                                                                                         \
        }                                                                                             \
        return (ptrdiff_t)p;                                                                          \
    }

/* Without SIMD (not x86): line by line, memchr for the end, memmem for the needles. */
static ptrdiff_t pass_lines(Scan *sc, size_t size, const Needles *rare, size_t *line_start, LineState *st) {
    const unsigned char *buf = sc->buf;
    for (;;) {
        size_t start = *line_start;
        const unsigned char *nl = memchr(buf + start, '\n', size - start);
        if (!nl) return (ptrdiff_t)start; /* the unterminated last line: a byte at a time */
        size_t end = (size_t)(nl - buf);
        for (const unsigned char *q = buf + start; q + 5 <= nl;) {
            const unsigned char *hit = memmem(q, (size_t)(nl - q), "batch", 5);
            if (!hit) break;
            on_batch(buf, (size_t)(hit - buf), st);
            q = hit + 1;
        }
        if (!st->prefill && !st->decode)
            for (int k = 0; k < rare->count; k++)
                if (holds(buf + start, end - start, rare->p[k], rare->n[k])) st->rare |= 1u << k;
        if (finish_line(sc, start, end, st) < 0) return -1;
        *line_start = end + 1;
    }
}

#if defined(__SSE2__)
#include <emmintrin.h>
#define SSE_SPLAT(c) _mm_set1_epi8(c)
#define SSE_LOADU(p) _mm_loadu_si128((const __m128i *)(p))
SIMD_PASS(pass_sse2, , __m128i, SSE_SPLAT, SSE_LOADU, _mm_cmpeq_epi8, _mm_and_si128, _mm_movemask_epi8, 16)
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_AVX2_PASS 1
#define AVX_SPLAT(c) _mm256_set1_epi8(c)
#define AVX_LOADU(p) _mm256_loadu_si256((const __m256i *)(p))
SIMD_PASS(pass_avx2, __attribute__((target("avx2"))), __m256i, AVX_SPLAT, AVX_LOADU, _mm256_cmpeq_epi8,
          _mm256_and_si256, _mm256_movemask_epi8, 32)
#endif

/* Scan piece buf[0:size) into sc (ends of every line; lines of interest into sc->o). -1 on
 * a memory error. Runs without the GIL. */
static int scan_piece(Scan *sc, size_t size, const Needles *rare) {
    const unsigned char *buf = sc->buf;
    LineState st = {0};
    size_t p = 0, line_start = 0;
    ptrdiff_t reached;
    int level = sc->t->level;
#if defined(HAVE_AVX2_PASS)
    if (level >= 2 && __builtin_cpu_supports("avx2"))
        reached = pass_avx2(sc, size, rare, &line_start, &st);
    else
#endif
#if defined(__SSE2__)
        if (level >= 1)
        reached = pass_sse2(sc, size, rare, &line_start, &st);
    else
#endif
        reached = pass_lines(sc, size, rare, &line_start, &st);
    if (reached < 0) return -1;
    p = (size_t)reached;
    for (; p < size; p++) { /* the rest, a byte at a time */
        if (buf[p] == '\n') {
            if (finish_line(sc, line_start, p, &st) < 0) return -1;
            line_start = p + 1;
            continue;
        }
        if (p + 5 <= size && memcmp(buf + p, "batch", 5) == 0) on_batch(buf, p, &st);
        st.rare |= rare_at(buf, p, size, rare);
    }
    if (line_start < size) /* an unterminated last line */
        if (finish_line(sc, line_start, size, &st) < 0) return -1;
    return 0;
}

static PyObject *bytes_of(const void *p, size_t nbytes) {
    return PyBytes_FromStringAndSize(nbytes ? (const char *)p : "", (Py_ssize_t)nbytes);
}

PyDoc_STRVAR(scan_doc,
             "scan(data, start, stop, rare_needles, new_seq, max_key, max_rare, layout_rare=0)\n"
             "    -> (ends, lines, kinds, keys)\n\n"
             "The lines of data[start:stop] (whole lines): ends (int64, one per line, offsets from\n"
             "start), and for each line of interest (int64 line indices; uint8 kinds: 1 prefill,\n"
             "2 decode, 4 pre-2024 prefill, 8 two prefill heads, 16 head maybe cut off, 32 holds a\n"
             "rare needle) the id of its text (int64; -1: none, a prefill line longer than max_key\n"
             "or a rare line longer than max_rare). A rare line with no \"batch\" whose needles are all\n"
             "among the bits of layout_rare (bit k: rare_needles[k]) is keyed by its layout, digits masked.");

static PyObject *LineTable_scan(LineTable *self, PyObject *args) {
    Py_buffer data, seq;
    Py_ssize_t start, stop, max_key, max_rare;
    unsigned int layout_rare = 0;
    PyObject *needles;
    if (!PyArg_ParseTuple(args, "y*nnO!y*nn|I", &data, &start, &stop, &PyTuple_Type, &needles, &seq, &max_key, &max_rare,
                          &layout_rare))
        return NULL;
    PyObject *result = NULL;
    Py_buffer nb[MAX_NEEDLES];
    int held = 0;
    Needles rare = {.count = 0};
    int64_t *ends = NULL;
    Out o = {0};
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "scan: this LineTable is already scanning in another thread");
        goto done;
    }
    if (!self->slots && table_init_slots(self, 1024) < 0) { /* made without __init__ */
        PyErr_NoMemory();
        goto done;
    }
    if (start < 0 || stop < start || stop > data.len || max_key < 0 || max_rare < 0) {
        PyErr_SetString(PyExc_ValueError, "scan: bad range");
        goto done;
    }
    if (PyTuple_GET_SIZE(needles) > MAX_NEEDLES) {
        PyErr_SetString(PyExc_ValueError, "scan: too many needles");
        goto done;
    }
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(needles); k++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(needles, k), &nb[k], PyBUF_SIMPLE) < 0) goto done;
        held++;
        rare.p[k] = nb[k].buf;
        rare.n[k] = (size_t)nb[k].len;
        rare.count++;
    }
    Scan sc = {.t = self, .buf = (const unsigned char *)data.buf + start, .new_seq = seq.buf,
               .new_seq_len = (size_t)seq.len, .max_key = (size_t)max_key,
               .max_rare = (size_t)max_rare, .layout_rare = layout_rare, .o = &o};
    size_t size = (size_t)(stop - start);
    int rc;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = scan_piece(&sc, size, &rare);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    ends = sc.ends;
    if (rc < 0) {
        PyErr_NoMemory();
        goto done;
    }
    result = Py_BuildValue("(NNNN)", bytes_of(ends, sc.nlines * sizeof(int64_t)), bytes_of(o.line, o.n * sizeof(int64_t)),
                           bytes_of(o.kind, o.n), bytes_of(o.key, o.n * sizeof(int64_t)));
done:
    for (int k = 0; k < held; k++) PyBuffer_Release(&nb[k]);
    PyBuffer_Release(&data);
    PyBuffer_Release(&seq);
    PyMem_RawFree(ends);
    out_free(&o);
    return result;
}

static PyObject *LineTable_clear(LineTable *self, PyObject *Py_UNUSED(ignored)) {
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "clear: this LineTable is scanning in another thread");
        return NULL;
    }
    table_free(self);
    if (table_init_slots(self, 1024) < 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *LineTable_nbytes(LineTable *self, void *Py_UNUSED(closure)) {
    return PyLong_FromSize_t(self->arena_len + self->cap * sizeof(Slot) + self->keys_cap * (2 * sizeof(int64_t) + 1));
}

static PyObject *LineTable_nkeys(LineTable *self, void *Py_UNUSED(closure)) { return PyLong_FromSize_t(self->nkeys); }

static int LineTable_init(LineTable *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"level", NULL};
    int level = 2;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|i:LineTable", kwlist, &level)) return -1;
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "LineTable: scanning in another thread");
        return -1;
    }
    self->level = level;
    table_free(self);
    if (table_init_slots(self, 1024) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void LineTable_dealloc(LineTable *self) {
    table_free(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef LineTable_methods[] = {
    {"scan", (PyCFunction)LineTable_scan, METH_VARARGS, scan_doc},
    {"clear", (PyCFunction)LineTable_clear, METH_NOARGS, "Forget every text (ids start again at 0)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef LineTable_getset[] = {
    {"nbytes", (getter)LineTable_nbytes, NULL, "Bytes the table holds.", NULL},
    {"nkeys", (getter)LineTable_nkeys, NULL, "Distinct texts seen since the last clear().", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject LineTableType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "bcgtune.adapters.sglang.log._lines.LineTable",
    .tp_basicsize = sizeof(LineTable),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "LineTable(level=2): ids of the texts of prefill layouts and rare lines, kept across scan()\n"
              "calls. level: the widest pass to use where the processor has it (2: AVX2, 1: SSE2,\n"
              "0: line by line); every level finds the same.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)LineTable_init,
    .tp_dealloc = (destructor)LineTable_dealloc,
    .tp_methods = LineTable_methods,
    .tp_getset = LineTable_getset,
};

PyDoc_STRVAR(read_fields_doc,
             "read_fields(data, offset, starts, plans, offsets, lengths, width) -> bytes\n\n"
             "The numbers of prefill lines of known layouts (fastpath._read_digits): for line j,\n"
             "starting at data[offset + starts[j]] with layout plans[j], field f is the ASCII digit\n"
             "run at offsets[plans[j], f] of length lengths[plans[j], f] (-1 where the length is 0).\n"
             "starts, plans: int64; offsets, lengths: int64 tables, rows of `width` fields. Returns\n"
             "the int64 values, one row per line.");

/* A run of at most 18 ASCII digits, as fastpath._read_digits reads it. */
static inline int64_t digits_value(const unsigned char *p, int64_t n) {
    int64_t v = 0;
    for (int64_t i = 0; i < n; i++) v = v * 10 + (int64_t)(p[i] - '0');
    return v;
}

static PyObject *read_fields(PyObject *Py_UNUSED(module), PyObject *args) {
    Py_buffer data, starts, plans, offsets, lengths;
    Py_ssize_t offset, width;
    if (!PyArg_ParseTuple(args, "y*ny*y*y*y*n", &data, &offset, &starts, &plans, &offsets, &lengths, &width)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = starts.len / 8;
    if (plans.len != starts.len || starts.len % 8 || offsets.len != lengths.len || width <= 0 ||
        offsets.len % (8 * width) || offset < 0 || offset > data.len) {
        PyErr_SetString(PyExc_ValueError, "read_fields: bad arguments");
        goto done;
    }
    const int64_t *st = starts.buf, *pl = plans.buf, *off = offsets.buf, *len = lengths.buf;
    Py_ssize_t rows = offsets.len / (8 * width);
    result = PyBytes_FromStringAndSize(NULL, n * width * 8);
    if (!result) goto done;
    int64_t *out = (int64_t *)PyBytes_AS_STRING(result);
    const unsigned char *buf = (const unsigned char *)data.buf;
    int bad = 0;
    for (Py_ssize_t j = 0; j < n && !bad; j++) {
        int64_t p = pl[j];
        if (p < 0 || p >= rows) {
            bad = 1;
            break;
        }
        for (Py_ssize_t f = 0; f < width; f++) {
            int64_t k = len[p * width + f];
            if (k == 0) {
                out[j * width + f] = -1;
                continue;
            }
            int64_t at = (int64_t)offset + st[j] + off[p * width + f];
            if (k < 0 || k > 18 || at < offset || at + k > (int64_t)data.len) {
                bad = 1;
                break;
            }
            out[j * width + f] = digits_value(buf + at, k);
        }
    }
    if (bad) {
        Py_CLEAR(result);
        PyErr_SetString(PyExc_ValueError, "read_fields: a field lies outside the data");
    }
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&plans);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&lengths);
    return result;
}

static PyMethodDef module_methods[] = {
    {"read_fields", (PyCFunction)read_fields, METH_VARARGS, read_fields_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_lines",
    .m_doc = "The compiled line scanner of the SGLang log parser.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__lines(void) {
    if (PyType_Ready(&LineTableType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m) return NULL;
    Py_INCREF(&LineTableType);
    if (PyModule_AddObject(m, "LineTable", (PyObject *)&LineTableType) < 0) {
        Py_DECREF(&LineTableType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
