/* Fast path of IncrementalBPE: the same algorithm as _reference.py and _pretokenize.py, in C.
 *
 * Engine(token_bytes, lengths, node_of, node_token, right_len, lo, hi, byte_token, classes)
 *   .encode_text(str) -> list[int]   pre-tokenize (GPT-2 regex, batch) + incremental BPE
 *   .encode_word(bytes) -> list[int] BPE of one pre-token
 *   .eager_word() -> EagerWord       .push(bytes) -> final ids, .finish() -> the rest
 *
 * Read _reference.py first: every function here mirrors one there, comments say only what is
 * C-specific. Positions hold suffix-forest nodes (_forest.py), not token ids: the test of a
 * candidate is one load and one unsigned comparison. Where the time goes on a fresh engine is
 * cache misses, so the layout is for them: the automaton is a double array (a transition reads
 * the child's own record; the root and depth-1 states have resolved 256-wide rows), each state
 * carries its first candidate inline and the rest sit in one contiguous run, and results are
 * lists of int objects shared by every engine of the process (no allocation per token, none per
 * engine). The hash map only builds the trie.
 *
 * Per call, encode_text finds pre-tokens a few words ahead and prefetches their word-cache slots;
 * a one-byte word is its byte's token (no cache); a cached word costs one 64-byte line, compared
 * as three 8-byte words; for a word length whose words never repeat the cache switches itself
 * off for a while (WINDOW, counted per length). The ids go to a buffer the engine keeps (no malloc per call: the first call of
 * a fresh engine otherwise paid for sorting whatever another library had just freed).
 *
 * Profiling builds (not used by the package): -DIBPE_PROFILE adds _fast.phases(), the thread CPU
 * time of encode_text's phases (utf-8, reserve, words, list, free) since the last call;
 * -DIBPE_CALLGRIND brackets encode_text with callgrind's start/stop, for
 * `valgrind --tool=callgrind --instr-atstart=no --cache-sim=yes --branch-sim=yes`.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define OTHER 0
#define LETTER 1
#define NUMBER 2
#define SPACE 3

/* ---------- open-addressing map uint32 -> int32, key and value side by side (one cache line a probe) ---------- */
typedef struct {
    uint32_t key;
    int32_t val;
} MapEntry;

typedef struct {
    MapEntry *slots;
    size_t mask;
} Map;

#define MAP_EMPTY UINT32_MAX

static inline size_t map_hash(uint32_t k) {
    uint64_t h = (uint64_t)k * 0x9E3779B97F4A7C15ULL;
    return (size_t)(h >> 32);
}

static int map_init(Map *m, size_t n) {
    size_t cap = 16;
    while (cap < 2 * n + 2) cap <<= 1;
    m->slots = PyMem_Malloc(cap * sizeof(MapEntry));
    if (!m->slots) return -1;
    memset(m->slots, 0xff, cap * sizeof(MapEntry));
    m->mask = cap - 1;
    return 0;
}

static void map_free(Map *m) {
    PyMem_Free(m->slots);
    m->slots = NULL;
}

static inline void map_put(Map *m, uint32_t k, int32_t v) {
    size_t i = map_hash(k) & m->mask;
    while (m->slots[i].key != MAP_EMPTY && m->slots[i].key != k) i = (i + 1) & m->mask;
    m->slots[i].key = k;
    m->slots[i].val = v;
}

static inline int32_t map_get(const Map *m, uint32_t k, int32_t missing) {
    size_t i = map_hash(k) & m->mask;
    for (;;) {
        MapEntry slot = m->slots[i];
        if (slot.key == k) return slot.val;
        if (slot.key == MAP_EMPTY) return missing;
        i = (i + 1) & m->mask;
    }
}

/* ---------- growable int32 buffer ---------- */
typedef struct {
    int32_t *data;
    Py_ssize_t len, cap;
} IntBuf;

static int buf_reserve(IntBuf *b, Py_ssize_t need) {
    if (need <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap *= 2;
    int32_t *d = PyMem_Realloc(b->data, cap * sizeof(int32_t));
    if (!d) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = d;
    b->cap = cap;
    return 0;
}

static inline int buf_push(IntBuf *b, int32_t v) {
    if (b->len == b->cap && buf_reserve(b, b->len + 1) < 0) return -1;
    b->data[b->len++] = v;
    return 0;
}

/* a list of token ids, sharing the engine's int objects (no allocation per token) */
static PyObject *buf_to_list(const IntBuf *b, Py_ssize_t from, PyObject *const *ints) {
    PyObject *list = PyList_New(b->len - from);
    if (!list) return NULL;
    for (Py_ssize_t i = from; i < b->len; i++) {
        PyObject *v = ints[b->data[i]];
        Py_INCREF(v);
        PyList_SET_ITEM(list, i - from, v);
    }
    return list;
}

/* ---------- the engine ---------- */
/* A candidate's test: node(L(end - rlen)) - lo < span (unsigned); rlen is the bytes of the
 * token's right part, 0 for a single byte (always passes). */
typedef struct {
    uint32_t lo, span;
    int16_t rlen;
    uint8_t tlen, pad; /* tlen: bytes of the candidate's token (what emission steps back by) */
    int32_t node;
} Cand;

/* A state of the Aho-Corasick automaton, stored as a double array: its children sit at
 * base + byte and name it in check, so a transition reads the child's own record (no hash). */
typedef struct {
    int32_t base, check; /* check: the parent's position; FREE for an unused slot */
    int32_t fail;
    int32_t chain;       /* bits 0-22: where its candidates start (tokens that are suffixes of the state, longest
                          * first: cands[chain..]); bit 23: its fail-resolved row is shallow; bits 24-31: that row's byte */
    uint32_t lo, span;   /* cands[chain] inline (usually the winner, read with the state itself) */
    int32_t node;
    uint8_t rlen, depth, n_chain, tlen; /* lengths <= 255 (checked at build); tlen: the inline candidate's token bytes */
} State;

#define FREE (-1)
#define CHAIN_BITS 23
#define CHAIN_MASK ((1 << CHAIN_BITS) - 1)
#define VIA_ROW (1 << CHAIN_BITS) /* the state's own row (depth 1) or its fail's (a depth-1 fail) is in shallow */
static inline int32_t chain_of(const State *st) { return st->chain & CHAIN_MASK; }


#define CACHE_WORD 22 /* bytes of the longest word the cache keeps */
typedef struct {
    PyObject_HEAD
    int32_t n_tokens, n_nodes;
    int32_t *length;     /* by token id (automaton build) */
    int32_t *node_token; /* by node */
    uint8_t ascii_bits[4][16]; /* [class][low nibble]: bit h set when byte h << 4 | low (ASCII) has the class */
    uint8_t lack_bits[2][16];  /* [high nibble >= 8][low nibble]: bit h & 7 set when byte h << 4 | low is no token */
    PyObject **ints;     /* by token id: the int object returned for it (shared_ints, not owned) */
    int32_t *node_len;   /* by node: bytes of its token */
    int32_t byte_token[256];
    int32_t byte_node[256];   /* by byte: the node of its token (a one-byte word's state's own), -1: no token */
    int32_t n_slots, root_base;
    State *states;
    Cand *cands;
    int32_t *shallow; /* [row << 8 | byte] -> next state, fail links resolved: row 0 the root, 1 + b the state "b" */
    uint8_t *classes;       /* 0x110000 entries */
    Py_ssize_t n_cands;
    int32_t *cand_rlen, *cand_lo, *cand_span; /* the candidates' tests as three arrays (chain_avx2 loads 8 at once) */
    IntBuf last, walk;      /* scratch for encode_word: nodes and automaton states by position */
    IntBuf ids;             /* scratch for encode_text: the ids before they become a list (kept: no malloc per call) */
    uint8_t *lens;          /* scratch by position: bytes of the last token there, so emission steps back without a dependent load */
    Py_ssize_t lens_cap;
    int all_bytes;          /* every byte is a token: a long word's bytes are walked as they are */
    uint8_t *kept;          /* scratch: a long word's bytes without those the vocabulary lacks */
    Py_ssize_t kept_cap;
    struct CacheEntry *cache; /* direct-mapped cache of short words (most words repeat), 64-byte aligned in cache_mem */
    void *cache_mem;
    uint32_t cache_mask;
    struct Bypass { /* by word length: words of some lengths repeat (base64's pairs), others never (its longer runs) */
        uint32_t words, hits; /* lookups and hits since the window began */
        int32_t left;         /* words still to encode without the cache */
        int32_t windows;      /* how many windows the next bypass lasts: doubles while lookups keep missing */
    } bypass[CACHE_WORD + 1];
    Py_buffer backing;      /* Engine.load: the tables above point into this buffer (a memory-mapped file) */
    int backed;
    struct Specials *specials; /* added tokens found in encode_text's input (set_specials), NULL: none */
} Engine;

/* One entry is one 64-byte cache line (aligned), so a lookup costs at most one miss. Its first 24
 * bytes are the key: the word's length, its bytes, zeros, and then (the key's last byte, masked
 * out of the comparison) how many ids follow: a lookup compares three 8-byte words. */
#ifndef CACHE_SLOTS
#define CACHE_SLOTS (1 << 16)
#endif
#define CACHE_IDS 10
typedef struct CacheEntry {
    union {
        struct {
            uint8_t len; /* 0: empty slot */
            uint8_t bytes[CACHE_WORD];
            uint8_t n_ids;
        };
        uint64_t key[3];
    };
    int32_t ids[CACHE_IDS];
} __attribute__((aligned(64))) CacheEntry;

/* one transition, a branch per case (root? depth 1? child?): the step of short words, where loading both the child
 * and a shallow row costs more misses than the branches cost, and of long words whose branches their structure
 * predicts (digits, CJK: see bpe_long_word) */
static inline int32_t ac_step(const Engine *e, int32_t s, uint8_t b) {
    for (;;) {
        if (s == 0) return e->shallow[b];
        const State *st = &e->states[s];
        if (st->check == 0) return e->shallow[((size_t)(s - e->root_base + 1) << 8) | b];
        int32_t t = st->base + b;
        if (t >= 0 && t < e->n_slots && e->states[t].check == s) return t;
        s = st->fail;
    }
}

/* One transition. Every depth-1 and depth-2 state, and a deeper one whose fail is a depth-1 state, carries the
 * byte of a resolved shallow row (its own, or its fail's): its next state is its child if the child exists, else
 * that row's entry, chosen without a branch (both are loaded). Only a deeper state whose fail is deep too, and
 * whose child is missing, follows its fail link: the one branch, rarely taken (random letters: depth-2 states
 * are most steps, and their fails are all depth 1). */
static inline int32_t ac_step_rows(const Engine *e, int32_t s, uint8_t b) {
    for (;;) {
        if (s == 0) return e->shallow[b];
        const State *st = &e->states[s];
        uint32_t t = (uint32_t)(st->base + b);
        t &= -(uint32_t)(t < (uint32_t)e->n_slots); /* out of range: the root, nobody's child */
        int32_t via = e->shallow[((size_t)((uint32_t)st->chain >> 24) + 1) << 8 | b];
        int32_t child = -(int32_t)(e->states[t].check == s); /* all ones or zero: selects without a branch */
        if (__builtin_expect((child | st->chain) & VIA_ROW, VIA_ROW)) return ((int32_t)t & child) | (via & ~child);
        s = st->fail;
    }
}

/* Long candidate chains (a run of '-': every run of hyphens the vocabulary has is a suffix, ~30 tests a
 * byte, 400 instructions) are tested 8 at a time where the CPU has AVX2: the 8 right-part lengths, lows
 * and spans load as vectors, last[] is gathered (lanes of single bytes, which always pass, and lanes past
 * the chain gather nothing), and the first lane that passes is the longest candidate, as in the loop. */
#define CHAIN_SIMD 8
static int have_avx2;
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
__attribute__((target("avx2"))) static int32_t chain_avx2(const Engine *e, const int32_t *last, Py_ssize_t at, int32_t from, int32_t stop) {
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), sign = _mm256_set1_epi32(INT32_MIN), zero = _mm256_setzero_si256();
    const __m256i vat = _mm256_set1_epi32((int32_t)at);
    for (int32_t k = from; k < stop; k += 8) {
        __m256i r = _mm256_loadu_si256((const __m256i *)(e->cand_rlen + k));
        __m256i in = _mm256_cmpgt_epi32(_mm256_set1_epi32(stop - k), lanes);
        __m256i single = _mm256_and_si256(in, _mm256_cmpeq_epi32(r, zero));
        __m256i gather = _mm256_andnot_si256(single, in);
        __m256i x = _mm256_mask_i32gather_epi32(zero, last, _mm256_sub_epi32(vat, r), gather, 4);
        __m256i d = _mm256_sub_epi32(x, _mm256_loadu_si256((const __m256i *)(e->cand_lo + k)));
        __m256i span = _mm256_loadu_si256((const __m256i *)(e->cand_span + k));
        __m256i pass = _mm256_and_si256(gather, _mm256_cmpgt_epi32(_mm256_xor_si256(span, sign), _mm256_xor_si256(d, sign)));
        unsigned mask = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_or_si256(pass, single)));
        if (mask) return k + __builtin_ctz(mask);
    }
    return -1;
}
#endif

/* node of the last token of BPE(word[:end]); last[] holds nodes, indexed by position minus base */
static inline __attribute__((always_inline)) int32_t last_token(const Engine *e, const int32_t *last, Py_ssize_t base, Py_ssize_t end,
                                                                 int32_t state, uint8_t byte, uint8_t *tlen, int pick_byte) {
    const State *st = &e->states[state];
    /* one branch, not one per condition, and rarely taken: a single byte (rlen 0, always passes) reads last[] one
     * place back, which is written, and its value does not matter; a chain of two ends in the word's last byte
     * (every chain does), so when the inline candidate fails the byte is the token, chosen without a branch
     * (random letters: the inline candidate fails at 1 byte in 5, and 9 in 10 of those are this case) */
    int pass = (st->rlen == 0) | ((uint32_t)last[end - st->rlen - base - (st->rlen == 0)] - st->lo < st->span);
    if (!pick_byte) { /* where the inline candidate fails at random, the byte below saves a branch; elsewhere it costs instructions */
        if (__builtin_expect(pass, 1)) return *tlen = st->tlen, st->node;
        goto chain;
    }
    int ok = pass | (st->n_chain == 2);
    __asm__("" : "+r"(ok)); /* one value, one branch: not the compiler's two */
    if (__builtin_expect(ok, 1)) {
        int32_t keep = -(int32_t)pass;
        *tlen = (uint8_t)((st->tlen & keep) | (1 & ~keep));
        return (st->node & keep) | (e->byte_node[byte] & ~keep);
    }
chain:
#if defined(__x86_64__) && defined(__GNUC__)
    if (st->n_chain > CHAIN_SIMD && have_avx2 && e->cand_rlen) {
        int32_t k = chain_avx2(e, last, end - base, chain_of(st) + 1, chain_of(st) + st->n_chain);
        return k < 0 ? -1 : (*tlen = e->cands[k].tlen, e->cands[k].node);
    }
#endif
    for (const Cand *c = e->cands + chain_of(st), *stop = c + st->n_chain; ++c < stop;)
        if (c->rlen == 0 || (uint32_t)last[end - c->rlen - base] - c->lo < c->span) return *tlen = c->tlen, c->node;
    return -1; /* unreachable for a consistent vocabulary */
}

/* the tokens of BPE(word[:end]), read back from last[] (nodes by position) and lens[] (their lengths), appended to out in one pass */
static int emit_tokens(const Engine *e, const int32_t *last, const uint8_t *lens, Py_ssize_t end, IntBuf *out) {
    if (buf_reserve(out, out->len + end) < 0) return -1;
    int32_t *top = out->data + out->len + end, *k = top; /* written backwards at the far end, then moved down */
    for (Py_ssize_t p = end; p > 0; p -= lens[p]) *--k = e->node_token[last[p]];
    Py_ssize_t count = top - k;
    int32_t *dst = out->data + out->len;
    if (count <= 16) /* a short word's few ids: no call */
        for (Py_ssize_t j = 0; j < count; j++) dst[j] = k[j];
    else
        memmove(dst, k, count * sizeof(int32_t));
    out->len += count;
    return 0;
}

static int reserve_lens(Engine *e, Py_ssize_t n) {
    if (e->lens_cap >= n) return 0;
    uint8_t *l = PyMem_Realloc(e->lens, n);
    if (!l) {
        PyErr_NoMemory();
        return -1;
    }
    e->lens = l, e->lens_cap = n;
    return 0;
}

/* one step of a word's BPE: the last token of word[:end] (state: the automaton's there) into last[] and lens[] */
static inline __attribute__((always_inline)) int take_last(const Engine *e, int32_t *last, uint8_t *lens, Py_ssize_t end, int32_t state,
                                                           uint8_t byte, int pick_byte) {
    int32_t u = last_token(e, last, 0, end, state, byte, &lens[end], pick_byte);
    if (u < 0) {
        PyErr_SetString(PyExc_RuntimeError, "incremental BPE: no candidate passes (inconsistent vocabulary)");
        return -1;
    }
    last[end] = u;
    return 0;
}

/* BPE of one pre-token, appended to out */
static int bpe_word_uncached(Engine *e, const uint8_t *w, Py_ssize_t n, IntBuf *out) {
    if (buf_reserve(&e->last, n + 1) < 0 || reserve_lens(e, n + 1) < 0) return -1;
    int32_t *last = e->last.data;
    uint8_t *lens = e->lens;
    last[0] = 0;
    Py_ssize_t end = 0;
    int32_t state = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (e->byte_token[w[i]] < 0) continue;
        state = ac_step(e, state, w[i]);
        end++;
        if (take_last(e, last, lens, end, state, w[i], 0) < 0) return -1;
    }
    return emit_tokens(e, last, lens, end, out);
}

/* A short word (2..CACHE_WORD bytes) the cache did not answer, on the stack. Its first two steps need
 * no automaton record: the first byte's state is the root's row, the second the first byte's row of
 * the shallow table, so the branches a step takes (root? depth 1?) are not taken at random per word.
 * Its ids are read back into a stack buffer and copied out 24 at once (out has ID_SLACK spare ids),
 * so how many tokens a word has decides no branch but the read-back loop's own. */
#define ID_SLACK 32
static int bpe_short_word(Engine *e, const uint8_t *w, Py_ssize_t n, IntBuf *out) {
    if ((e->byte_token[w[0]] | e->byte_token[w[1]]) < 0) return bpe_word_uncached(e, w, n, out);
    int32_t last[CACHE_WORD + 1];
    uint8_t lens[CACHE_WORD + 1];
    int32_t s1 = e->shallow[w[0]], state = e->shallow[((size_t)(1 + w[0]) << 8) | w[1]];
    last[0] = 0, lens[0] = 0;
    last[1] = e->states[s1].node, lens[1] = 1; /* a byte's state: its own token */
    Py_ssize_t end = 1;
    for (Py_ssize_t i = 1; i < n; i++) {
        if (i > 1) {
            if (e->byte_token[w[i]] < 0) continue;
            state = ac_step(e, state, w[i]);
        }
        end++;
        if (take_last(e, last, lens, end, state, w[i], 0) < 0) return -1;
    }
    int32_t ids[2 * CACHE_WORD + 2], *top = ids + CACHE_WORD + 1, *k = top;
    for (Py_ssize_t p = end; p > 0; p -= lens[p]) *--k = e->node_token[last[p]];
    int32_t *dst = out->data + out->len;
    for (int j = 0; j < CACHE_WORD; j += 8) memcpy(dst + j, k + j, 8 * sizeof(int32_t));
    out->len += top - k;
    return 0;
}

/* Long words (runs without spaces: unspaced letters, CJK, base64 lines, emoji runs). On these the
 * cost was the automaton walk: one dependent chain of loads a byte (a state, then its child's
 * check, a fail link on a miss), so every cache miss stalled the byte. Here WALKS walks go over
 * WALKS segments at once and their misses overlap. Walk k starts at the root at its segment's
 * start: its state is the longest trie suffix of the bytes since then, which is the true state
 * once the true one is no deeper than that, so after the walks, each segment is re-walked from the
 * (by then true) state before it until it meets its own walk's state, from where they agree: at
 * most the deepest state's length (255 bytes) per segment, usually a few. The candidate tests then
 * run over the known states, with the state records prefetched ahead. A long word goes WALK_BLOCK
 * bytes at a time (the block's first walk goes on from the state the previous block ended in), so the
 * states are a small array that stays in cache, not 4 bytes a byte of fresh memory (a 2 MB run of
 * digits: 9.2 -> 8.0 ns/B). Bytes the vocabulary lacks (HF drops them) are taken out first. */
#define WALKS 4
#define LONG_WORD 512
#define PREFETCH_AHEAD 12
#define WALK_BLOCK 16384 /* bytes walked at once: their states stay in cache, not an array as long as the word */

static inline __attribute__((always_inline)) int32_t walk_step(const Engine *e, int32_t s, uint8_t b, int rows) {
    return rows ? ac_step_rows(e, s, b) : ac_step(e, s, b);
}

static inline __attribute__((always_inline)) void walk_states(const Engine *e, const uint8_t *w, Py_ssize_t n, int32_t *st, int32_t start, int rows) {
    Py_ssize_t seg = n / WALKS;
    if (seg < 16) { /* a short last block: one walk */
        for (Py_ssize_t p = 0; p < n; p++) st[p] = start = walk_step(e, start, w[p], rows);
        return;
    }
    int32_t s0 = start, s1 = 0, s2 = 0, s3 = 0; /* the first segment goes on from the state before it */
    const uint8_t *w0 = w, *w1 = w + seg, *w2 = w + 2 * seg, *w3 = w + 3 * seg;
    int32_t *t0 = st, *t1 = st + seg, *t2 = st + 2 * seg, *t3 = st + 3 * seg;
    for (Py_ssize_t j = 0; j < seg; j++) {
        s0 = walk_step(e, s0, w0[j], rows);
        s1 = walk_step(e, s1, w1[j], rows);
        s2 = walk_step(e, s2, w2[j], rows);
        s3 = walk_step(e, s3, w3[j], rows);
        t0[j] = s0, t1[j] = s1, t2[j] = s2, t3[j] = s3;
    }
    for (Py_ssize_t p = WALKS * seg; p < n; p++) st[p] = s3 = walk_step(e, s3, w[p], rows);
    for (int k = 1; k < WALKS; k++) {
        int32_t t = st[k * seg - 1];
        for (Py_ssize_t p = k * seg; p < n; p++) {
            t = walk_step(e, t, w[p], rows);
            if (t == st[p]) break;
            st[p] = t;
        }
    }
}

/* the first byte of w[0:n] the vocabulary lacks (n: none); 32 bytes at a time where the CPU has AVX2
 * (the nibble-shuffle test of run_end, on a bitmap of all 256 bytes: two tables, chosen by the top bit) */
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) static Py_ssize_t first_lacking_avx2(const Engine *e, const uint8_t *w, Py_ssize_t n) {
    const __m256i lo_tab = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)e->lack_bits[0]));
    const __m256i hi_tab = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)e->lack_bits[1]));
    const __m256i rowbit = _mm256_broadcastsi128_si256(_mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128));
    const __m256i nib = _mm256_set1_epi8(0x0F), zero = _mm256_setzero_si256();
    Py_ssize_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i b = _mm256_loadu_si256((const __m256i *)(w + i)), low = _mm256_and_si256(b, nib);
        __m256i bits = _mm256_blendv_epi8(_mm256_shuffle_epi8(lo_tab, low), _mm256_shuffle_epi8(hi_tab, low), b);
        __m256i m = _mm256_and_si256(bits, _mm256_shuffle_epi8(rowbit, _mm256_and_si256(_mm256_srli_epi16(b, 4), nib)));
        unsigned hit = ~(unsigned)_mm256_movemask_epi8(_mm256_cmpeq_epi8(m, zero));
        if (hit) return i + __builtin_ctz(hit);
    }
    return i; /* the tail is the caller's */
}
#endif

static Py_ssize_t first_lacking(const Engine *e, const uint8_t *w, Py_ssize_t n) {
    Py_ssize_t i = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    if (have_avx2) i = first_lacking_avx2(e, w, n);
#endif
    while (i < n && e->byte_token[w[i]] >= 0) i++;
    return i;
}

/* Periodic text (a run of one character, of one emoji, "=-=-"): once a long word's last[] has repeated with
 * period P for RLEN_MAX positions in a row, the next position's last token equals the one P back whenever its
 * automaton state does: last_token reads only the state and last[] at most RLEN_MAX places back, and those
 * agree. So such positions are copied, not tested. P is looked for every PERIOD_EVERY positions while none
 * holds: the smallest P <= PERIOD_MAX with which the last RLEN_MAX positions repeat (a text that is not
 * periodic fails at once for nearly every P: about PERIOD_MAX comparisons per PERIOD_EVERY bytes). */
#define RLEN_MAX 255 /* a candidate's right part is at most this long (lengths are checked to fit a byte at build) */
#define PERIOD_MAX 256
#define PERIOD_EVERY 1024

static inline int repeats(const int32_t *last, Py_ssize_t end, Py_ssize_t p) {
    Py_ssize_t i = end;
    while (i > end - RLEN_MAX && last[i] == last[i - p]) i--;
    return i == end - RLEN_MAX;
}

#if defined(__x86_64__) && defined(__GNUC__)
/* the periods p whose last[end - p] equals last[end], found 8 at a time; each then checked in full, smallest first */
__attribute__((target("avx2"))) static Py_ssize_t find_period_avx2(const int32_t *last, Py_ssize_t end) {
    const __m256i x = _mm256_set1_epi32(last[end]);
    for (Py_ssize_t k = 0; k < PERIOD_MAX; k += 8) { /* p = k + 1 .. k + 8: last[end - k - 8 .. end - k - 1], lane 7 is p = k + 1 */
        __m256i v = _mm256_loadu_si256((const __m256i *)(last + end - k - 8));
        unsigned hit = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(v, x)));
        while (hit) {
            int lane = 31 - __builtin_clz(hit);
            hit &= ~(1u << lane);
            if (repeats(last, end, k + 8 - lane)) return k + 8 - lane;
        }
    }
    return 0;
}
#endif

static Py_ssize_t find_period(const int32_t *last, Py_ssize_t end) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (have_avx2) return find_period_avx2(last, end);
#endif
    for (Py_ssize_t p = 1; p <= PERIOD_MAX; p++)
        if (repeats(last, end, p)) return p;
    return 0;
}

/* a long word's walk and tests, block by block; rows: the branch-free step and the byte pick (see bpe_long_word) */
static inline __attribute__((always_inline)) int walk_and_take(Engine *e, const uint8_t *w, Py_ssize_t n, int rows) {
    int32_t *last = e->last.data;
    uint8_t *lens = e->lens;
    int32_t *st = e->walk.data, state = 0;
    Py_ssize_t period = 0, agree = 0; /* agree: positions in a row whose last token is the one period back */
    last[0] = 0;
    for (Py_ssize_t a = 0; a < n; a += WALK_BLOCK) {
        Py_ssize_t m = n - a < WALK_BLOCK ? n - a : WALK_BLOCK;
        walk_states(e, w + a, m, st, state, rows);
        memset(st + m, 0, PREFETCH_AHEAD * sizeof(int32_t)); /* the prefetches past the block read the root */
        for (Py_ssize_t c = 0; c < m; c += PERIOD_EVERY) {
            Py_ssize_t stop = m - c < PERIOD_EVERY ? m : c + PERIOD_EVERY;
            if (agree < RLEN_MAX) {
                for (Py_ssize_t j = c; j < stop; j++) {
                    __builtin_prefetch(&e->states[st[j + PREFETCH_AHEAD]]);
                    if (take_last(e, last, lens, a + j + 1, st[j], w[a + j], rows) < 0) return -1;
                }
                if (a + stop > PERIOD_MAX + RLEN_MAX) agree = (period = find_period(last, a + stop)) ? RLEN_MAX : 0;
                continue;
            }
            for (Py_ssize_t j = c; j < stop; j++) { /* periodic so far */
                Py_ssize_t end = a + j + 1;
                if (agree >= RLEN_MAX && j >= period && st[j] == st[j - period]) {
                    last[end] = last[end - period], lens[end] = lens[end - period];
                    continue;
                }
                if (take_last(e, last, lens, end, st[j], w[a + j], rows) < 0) return -1;
                agree = last[end] == last[end - period] ? agree + 1 : 0;
            }
        }
        state = st[m - 1];
    }
    return 0;
}

/* each compiled on its own: both inlined into bpe_long_word cost random letters ~5 % */
static __attribute__((noinline)) int walk_and_take_rows(Engine *e, const uint8_t *w, Py_ssize_t n) { return walk_and_take(e, w, n, 1); }
static __attribute__((noinline)) int walk_and_take_branchy(Engine *e, const uint8_t *w, Py_ssize_t n) { return walk_and_take(e, w, n, 0); }

static int bpe_long_word(Engine *e, const uint8_t *w, Py_ssize_t n, IntBuf *out) {
    if (buf_reserve(&e->last, n + 1) < 0 || buf_reserve(&e->walk, WALK_BLOCK + PREFETCH_AHEAD) < 0 || reserve_lens(e, n + 1) < 0) return -1;
    Py_ssize_t lack = e->all_bytes ? n : first_lacking(e, w, n); /* most words lack none: walked in place */
    if (!e->all_bytes && lack < n) {
        if (e->kept_cap < n) {
            uint8_t *k = PyMem_Realloc(e->kept, n);
            if (!k) {
                PyErr_NoMemory();
                return -1;
            }
            e->kept = k, e->kept_cap = n;
        }
        memcpy(e->kept, w, lack);
        Py_ssize_t m = lack;
        for (Py_ssize_t i = lack; i < n; i++) {
            e->kept[m] = w[i];
            m += e->byte_token[w[i]] >= 0;
        }
        w = e->kept, n = m;
        if (n == 0) return 0;
    }
    /* Unspaced ASCII letters step and pick their tokens without branches: which way a random letter's step
     * and test go is random. Digits, CJK and the rest take the branches, which their regular structure
     * predicts (a run of digits never leaves depth 1): there the branch-free step only adds instructions. */
    int rows = w[0] < 0x80 && e->classes[w[0]] == LETTER;
    if ((rows ? walk_and_take_rows(e, w, n) : walk_and_take_branchy(e, w, n)) < 0) return -1;
    return emit_tokens(e, e->last.data, e->lens, n, out);
}

#define WORD_AHEAD 3
/* Words that never repeat (base64's letter runs of 4+, hex's of 6+, random letters) only miss the
 * cache and evict: counted by word length, when fewer than 1 in 8 of a window's lookups of that
 * length hit, the next windows' words of that length skip it (8 windows, doubling up to 256 while
 * the retries keep missing), then it is tried again. By length, because one text mixes both: in
 * base64 97 % of the 2-byte runs repeat and none of the 4-byte ones, 31 % overall, so a hit rate
 * over all words never switched the cache off (2 MB of base64: 26.5 -> 21.1 ns/B, prose unchanged). */
#define WINDOW 256
#define MIN_BYPASS_WINDOWS 8
#define MAX_BYPASS_WINDOWS 256
#define KEY_MASK 0x00FFFFFFFFFFFFFFULL /* the key's last 8-byte word without n_ids */

/* A word's cache key (length, bytes, zeros) and its slot, computed once per word as the look-ahead
 * finds it and carried to the lookup. Where 24 bytes can be read from the word's start (all but the
 * text's last 23 bytes) the key is three 8-byte loads, shifted and masked, and the slot mixes the
 * three words (a multiply each); elsewhere the bytes are copied one by one into the same key. */
typedef struct { uint64_t q[3]; uint32_t slot; } WordKey;

static const uint64_t LOW_BYTES[9] = {0, 0xFF, 0xFFFF, 0xFFFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFULL, 0xFFFFFFFFFFFFULL, 0xFFFFFFFFFFFFFFULL, ~0ULL};
static inline uint64_t low_bytes(Py_ssize_t k) { return LOW_BYTES[k < 0 ? 0 : k > 8 ? 8 : k]; } /* a load, not a branch on the word's length */
static inline uint64_t load64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static inline void word_key(const Engine *e, const uint8_t *w, Py_ssize_t n, Py_ssize_t avail, WordKey *k) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (avail >= 24) {
        k->q[0] = ((load64(w) << 8) & low_bytes(1 + n)) | (uint64_t)n;
        k->q[1] = load64(w + 7) & low_bytes(n - 7);
        k->q[2] = load64(w + 15) & low_bytes(n - 15 < 7 ? n - 15 : 7);
    } else
#endif
    {
        union { uint64_t q[3]; uint8_t b[24]; } u = {{0, 0, 0}};
        u.b[0] = (uint8_t)n;
        for (Py_ssize_t i = 0; i < n; i++) u.b[1 + i] = w[i];
        k->q[0] = u.q[0], k->q[1] = u.q[1], k->q[2] = u.q[2];
    }
    uint64_t x = k->q[0] * 0x9E3779B97F4A7C15ULL ^ k->q[1] * 0xC2B2AE3D27D4EB4FULL ^ k->q[2] * 0x165667B19E3779F9ULL;
    k->slot = (uint32_t)(x >> 32) & e->cache_mask;
}

/* the key of a word the cache may be asked for (a length it keeps, not bypassed), its slot prefetched;
 * slot UINT32_MAX: the look-ahead left it to the lookup */
static inline void word_prefetch(const Engine *e, const uint8_t *w, Py_ssize_t n, Py_ssize_t avail, WordKey *k) {
    /* one branch, not four on the word's length and bypass: most words have 24 readable bytes after them,
     * and computing a key that goes unused costs less than a mispredicted branch (base64, hex) */
    int cached = ((size_t)(n - 2) < CACHE_WORD - 1) & (e->bypass[n < CACHE_WORD ? n : CACHE_WORD].left <= 0);
    if (avail >= 24 && e->cache) {
        word_key(e, w, n < CACHE_WORD ? n : CACHE_WORD, avail, k);
        __builtin_prefetch(&e->cache[k->slot]);
        k->slot = cached ? k->slot : UINT32_MAX;
        return;
    }
    if (cached && e->cache) {
        word_key(e, w, n, avail, k);
        __builtin_prefetch(&e->cache[k->slot]);
    } else {
        k->slot = UINT32_MAX;
    }
}

/* BPE of one pre-token, appended to out (which has room for n more ids: a word of n bytes has at most n tokens) */
static int bpe_word(Engine *e, const uint8_t *w, Py_ssize_t n, const WordKey *key, IntBuf *out) {
    if (n == 1) { /* one byte is its own token (or dropped, as HF drops a byte the vocabulary lacks) */
        int32_t t = e->byte_token[w[0]];
        if (t >= 0) out->data[out->len++] = t;
        return 0;
    }
    if (n > CACHE_WORD || !e->cache) return n >= LONG_WORD ? bpe_long_word(e, w, n, out) : bpe_word_uncached(e, w, n, out);
    struct Bypass *by = &e->bypass[n];
    if (by->left > 0) {
        by->left--;
        return bpe_short_word(e, w, n, out);
    }
    WordKey late;
    if (key->slot == UINT32_MAX) { /* bypassed when the look-ahead saw it, no longer */
        word_key(e, w, n, 0, &late);
        key = &late;
    }
    CacheEntry *c = &e->cache[key->slot];
    int hit = c->key[0] == key->q[0] && c->key[1] == key->q[1] && ((c->key[2] ^ key->q[2]) & KEY_MASK) == 0;
    by->hits += hit;
    if (++by->words == WINDOW) {
        if (by->hits * 8 < WINDOW) {
            by->left = by->windows * WINDOW;
            if (by->windows < MAX_BYPASS_WINDOWS) by->windows *= 2;
        } else {
            by->windows = MIN_BYPASS_WINDOWS;
        }
        by->words = by->hits = 0;
    }
    if (hit) {
        memcpy(out->data + out->len, c->ids, sizeof(c->ids)); /* all of them: out has ID_SLACK spare */
        out->len += c->n_ids;
        return 0;
    }
    Py_ssize_t before = out->len;
    if (bpe_short_word(e, w, n, out) < 0) return -1;
    Py_ssize_t made = out->len - before;
    if (made <= CACHE_IDS) {
        c->key[0] = key->q[0], c->key[1] = key->q[1], c->key[2] = key->q[2];
        c->n_ids = (uint8_t)made;
        memcpy(c->ids, out->data + before, sizeof(c->ids));
    }
    return 0;
}

/* UTF-8 decode of a valid sequence (Python produced it) */
static inline uint32_t utf8_at(const uint8_t *s, Py_ssize_t i, int *len) {
    uint8_t c = s[i];
    if (c < 0x80) { *len = 1; return c; }
    if (c < 0xE0) { *len = 2; return ((uint32_t)(c & 0x1F) << 6) | (s[i + 1] & 0x3F); }
    if (c < 0xF0) { *len = 3; return ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F); }
    *len = 4;
    return ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[i + 1] & 0x3F) << 12) | ((uint32_t)(s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
}

/* Where the run of class cls starting at i ends. Run lengths are random (base64's letters and digits,
 * words of prose): a byte-at-a-time loop mispredicts its exit once a run; with AVX2, 32 bytes are
 * classified at once (two nibble-indexed shuffles of the class's ASCII bitmap) and the first byte
 * outside the class is found by its bit. A non-ASCII byte goes to the decoding loop. */
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) static Py_ssize_t ascii_run_avx2(const Engine *e, const uint8_t *s, Py_ssize_t i, Py_ssize_t n, int cls) {
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)e->ascii_bits[cls]));
    const __m256i rowbit = _mm256_broadcastsi128_si256(_mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 0, 0, 0, 0, 0, 0, 0, 0));
    const __m256i nib = _mm256_set1_epi8(0x0F), zero = _mm256_setzero_si256();
    while (i + 32 <= n) {
        __m256i b = _mm256_loadu_si256((const __m256i *)(s + i));
        __m256i m = _mm256_and_si256(_mm256_shuffle_epi8(table, _mm256_and_si256(b, nib)),
                                     _mm256_shuffle_epi8(rowbit, _mm256_and_si256(_mm256_srli_epi16(b, 4), nib)));
        unsigned out = (unsigned)_mm256_movemask_epi8(_mm256_cmpeq_epi8(m, zero));
        if (out) return i + __builtin_ctz(out);
        i += 32;
    }
    while (i < n && s[i] < 0x80 && e->classes[s[i]] == cls) i++;
    return i;
}
#endif

static inline Py_ssize_t run_end(const Engine *e, const uint8_t *s, Py_ssize_t i, Py_ssize_t n, int cls) {
    for (;;) { /* ASCII bytes are their own code points: no decoding while the run stays ASCII */
#if defined(__x86_64__) && defined(__GNUC__)
        if (have_avx2) i = ascii_run_avx2(e, s, i, n, cls);
        else
#endif
            while (i < n && s[i] < 0x80 && e->classes[s[i]] == cls) i++;
        if (i >= n || s[i] < 0x80) return i;
        int len;
        uint32_t cp = utf8_at(s, i, &len);
        if (e->classes[cp] != cls) return i;
        i += len;
    }
}

/* the end (byte index) of the pre-token starting at i; the whole text is known (batch) */
static Py_ssize_t pretoken_end(const Engine *e, const uint8_t *s, Py_ssize_t i, Py_ssize_t n) {
    int len;
    uint32_t cp = utf8_at(s, i, &len);
    if (cp == '\'' && i + 1 < n) {
        uint8_t a = s[i + 1];
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if (i + 2 < n) {
            uint8_t b = s[i + 2];
            if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
        }
    }
    if (cp == ' ' && i + 1 < n) {
        int len2;
        uint32_t cp2 = utf8_at(s, i + 1, &len2);
        int k2 = e->classes[cp2];
        if (k2 != SPACE) return run_end(e, s, i + 1 + len2, n, k2);
    }
    int k = e->classes[cp];
    if (k != SPACE) return run_end(e, s, i + len, n, k);
    Py_ssize_t j = i, last_start = i, count = 0;
    while (j < n) {
        int l2;
        uint32_t c2 = utf8_at(s, j, &l2);
        if (e->classes[c2] != SPACE) break;
        last_start = j;
        j += l2;
        count++;
    }
    if (j == n) return n;
    return count >= 2 ? last_start : j;
}

#ifdef IBPE_PROFILE
#include <time.h>
static double phase_ns[5];
static inline double now_ns(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
#define PHASE(k) do { double t_ = now_ns(); phase_ns[k] += t_ - t_prev; t_prev = t_; } while (0)
static PyObject *fast_phases(PyObject *m, PyObject *a) {
    PyObject *r = Py_BuildValue("(ddddd)", phase_ns[0], phase_ns[1], phase_ns[2], phase_ns[3], phase_ns[4]);
    memset(phase_ns, 0, sizeof(phase_ns));
    return r;
}
#else
#define PHASE(k) do { } while (0)
#endif

#ifdef IBPE_CALLGRIND
#include <valgrind/callgrind.h>
#endif
static PyObject *encode_text(Engine *e, PyObject *arg);
static PyObject *Engine_encode_text(Engine *e, PyObject *arg) {
#ifdef IBPE_CALLGRIND
    CALLGRIND_START_INSTRUMENTATION;
    PyObject *r = encode_text(e, arg);
    CALLGRIND_STOP_INSTRUMENTATION;
    return r;
#else
    return encode_text(e, arg);
#endif
}

/* ---------- added tokens (<|im_start|>, ...) in the text ----------
 * Found where HF finds them, leftmost then longest, in the UTF-8 bytes (a token's first byte is never a
 * continuation byte, so a match starts on a character). The next first byte is found with memchr when
 * all tokens share one (SmolLM2's '<'); a run of first bytes that start no token ("<<<<", where a
 * regex tried every position) is stepped over by a table of the pairs tokens start with. */
typedef struct Specials {
    Map trie;                /* node << 8 | byte -> child (root 0) */
    int32_t *id;             /* by node: the added token ending there, -1: none */
    uint8_t lead[256];       /* bytes some token starts with */
    uint8_t pair[256][32];   /* [first byte]: bitmap of the bytes that may follow it in a token (all, for a one-byte token) */
    int n_leads;
    uint8_t only_lead;       /* the lead when n_leads == 1 */
} Specials;

static void specials_free(Specials *sp) {
    if (!sp) return;
    map_free(&sp->trie);
    PyMem_Free(sp->id);
    PyMem_Free(sp);
}

static inline int pair_ok(const Specials *sp, uint8_t a, uint8_t b) { return sp->pair[a][b >> 3] >> (b & 7) & 1; }

/* the start of the first added token at or after q (its end and id through the pointers), -1: none */
static Py_ssize_t next_special(const Specials *sp, const uint8_t *s, Py_ssize_t q, Py_ssize_t n, Py_ssize_t *end, int32_t *id) {
    while (q < n) {
        if (sp->n_leads == 1) {
            const uint8_t *f = memchr(s + q, sp->only_lead, (size_t)(n - q));
            if (!f) return -1;
            q = f - s;
        } else {
            while (q < n && !sp->lead[s[q]]) q++;
            if (q >= n) return -1;
        }
        while (q + 1 < n && sp->lead[s[q]] && !pair_ok(sp, s[q], s[q + 1])) q++;
        if (!sp->lead[s[q]]) continue;
        int32_t node = 0, best = -1;
        for (Py_ssize_t p = q; p < n && (node = map_get(&sp->trie, (uint32_t)node << 8 | s[p], -1)) >= 0; p++)
            if (sp->id[node] >= 0) best = sp->id[node], *end = p + 1;
        if (best >= 0) return *id = best, q;
        q++;
    }
    return -1;
}

static PyObject *Engine_set_specials(Engine *e, PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "set_specials takes a sequence of (bytes, id)");
    if (!seq) return NULL;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(seq), total = 1;
    for (Py_ssize_t k = 0; k < m; k++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, k);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(item, 0))) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_TypeError, "set_specials: each added token is (bytes, id)");
            return NULL;
        }
        total += PyBytes_GET_SIZE(PyTuple_GET_ITEM(item, 0));
    }
    Specials *sp = PyMem_Calloc(1, sizeof(Specials));
    if (!sp || map_init(&sp->trie, (size_t)total) < 0 || !(sp->id = PyMem_Malloc((size_t)total * sizeof(int32_t)))) {
        specials_free(sp);
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t k = 0; k < total; k++) sp->id[k] = -1;
    int32_t nodes = 1;
    for (Py_ssize_t k = 0; k < m; k++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, k);
        const uint8_t *b = (const uint8_t *)PyBytes_AS_STRING(PyTuple_GET_ITEM(item, 0));
        Py_ssize_t len = PyBytes_GET_SIZE(PyTuple_GET_ITEM(item, 0));
        long tid = PyLong_AsLong(PyTuple_GET_ITEM(item, 1));
        if (tid < 0 || tid >= e->n_tokens) {
            specials_free(sp);
            Py_DECREF(seq);
            if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "set_specials: id %ld is not a token id", tid);
            return NULL;
        }
        if (len == 0) continue;
        int32_t node = 0;
        for (Py_ssize_t p = 0; p < len; p++) {
            int32_t child = map_get(&sp->trie, (uint32_t)node << 8 | b[p], -1);
            if (child < 0) map_put(&sp->trie, (uint32_t)node << 8 | b[p], child = nodes++);
            node = child;
        }
        sp->id[node] = (int32_t)tid;
        if (!sp->lead[b[0]]) sp->lead[b[0]] = 1, sp->n_leads++, sp->only_lead = b[0];
        if (len == 1) memset(sp->pair[b[0]], 0xff, 32);
        else sp->pair[b[0]][b[1] >> 3] |= (uint8_t)(1 << (b[1] & 7));
    }
    Py_DECREF(seq);
    specials_free(e->specials);
    e->specials = sp->n_leads ? sp : NULL;
    if (!sp->n_leads) specials_free(sp);
    Py_RETURN_NONE;
}

/* BPE of the pre-tokens of s[0:n], appended to out (which has room for n more ids) */
static int encode_span(Engine *e, const uint8_t *s, Py_ssize_t n, IntBuf *out) {
    /* pre-tokens are found WORD_AHEAD words ahead of the one being encoded, and their word-cache
     * slots prefetched: a slot is a miss on text whose words do not repeat */
    Py_ssize_t bound[WORD_AHEAD + 1];
    WordKey keys[WORD_AHEAD + 1];
    int have = 0;
    Py_ssize_t at = 0; /* where the next pre-token to find starts */
    while (have <= WORD_AHEAD && at < n) {
        Py_ssize_t end = pretoken_end(e, s, at, n);
        word_prefetch(e, s + at, end - at, n - at, &keys[have]);
        bound[have++] = at = end;
    }
    Py_ssize_t i = 0;
    for (int k = 0; have > 0; k = (k + 1) % (WORD_AHEAD + 1), have--) {
        Py_ssize_t end = bound[k];
        WordKey key = keys[k];
        if (at < n) {
            Py_ssize_t next = pretoken_end(e, s, at, n);
            word_prefetch(e, s + at, next - at, n - at, &keys[k]);
            bound[k] = at = next, have++;
        }
        if (bpe_word(e, s + i, end - i, &key, out) < 0) return -1;
        i = end;
    }
    return 0;
}

static PyObject *encode_text(Engine *e, PyObject *arg) {
#ifdef IBPE_PROFILE
    double t_prev = now_ns();
#endif
    Py_ssize_t n;
    const char *text = PyUnicode_AsUTF8AndSize(arg, &n);
    if (!text) return NULL;
    PHASE(0);
    const uint8_t *s = (const uint8_t *)text;
    IntBuf *out = &e->ids;
    out->len = 0;
    if (buf_reserve(out, n + ID_SLACK) < 0) return NULL; /* at most one id a byte (an added token too): no check per word */
    PHASE(1);
    Py_ssize_t from = 0;
    if (e->specials) {
        Py_ssize_t q = 0, end = 0;
        int32_t id = -1;
        while ((q = next_special(e->specials, s, q, n, &end, &id)) >= 0) {
            if (encode_span(e, s + from, q - from, out) < 0) return NULL;
            out->data[out->len++] = id;
            from = q = end;
        }
    }
    if (encode_span(e, s + from, n - from, out) < 0) return NULL;
    PHASE(2);
    PyObject *list = buf_to_list(out, 0, e->ints);
    PHASE(3);
    PHASE(4);
    return list;
}

static PyObject *Engine_encode_word(Engine *e, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    IntBuf out = {0};
    int rc = buf_reserve(&out, view.len + ID_SLACK) < 0 ? -1 : bpe_word(e, view.buf, view.len, &(WordKey){.slot = UINT32_MAX}, &out);
    PyBuffer_Release(&view);
    PyObject *list = rc < 0 ? NULL : buf_to_list(&out, 0, e->ints);
    PyMem_Free(out.data);
    return list;
}

/* ---------- construction ---------- */
static int32_t *int_array(PyObject *seq, Py_ssize_t n, const char *name) {
    PyObject *fast = PySequence_Fast(seq, name);
    if (!fast) return NULL;
    if (PySequence_Fast_GET_SIZE(fast) != n) {
        PyErr_Format(PyExc_ValueError, "Engine: %s has %zd entries, expected %zd", name, PySequence_Fast_GET_SIZE(fast), n);
        Py_DECREF(fast);
        return NULL;
    }
    int32_t *out = PyMem_Malloc((n ? n : 1) * sizeof(int32_t));
    if (!out) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
        if (v == -1 && PyErr_Occurred()) {
            PyMem_Free(out);
            Py_DECREF(fast);
            return NULL;
        }
        out[i] = (int32_t)v;
    }
    Py_DECREF(fast);
    return out;
}

/* Trie and automaton in trie numbering (build time only); then laid out as a double array. */
typedef struct {
    int32_t fail, node, link, first_child, next_sibling, chain, n_chain;
    int32_t depth;
    uint8_t edge;
} TrieNode;

static int32_t trie_child(const Map *gotos, int32_t v, uint8_t b) { return map_get(gotos, ((uint32_t)v << 8) | b, -1); }

/* the double-array position of every trie node, children placed breadth-first at base + byte */
static int layout(Engine *e, TrieNode *tn, const int32_t *order, int32_t n, int32_t *pos) {
    Py_ssize_t cap = 2 * (Py_ssize_t)n + 1024;
    State *da = PyMem_Malloc(cap * sizeof(State));
    if (!da) return -1;
    for (Py_ssize_t k = 0; k < cap; k++) da[k].check = FREE;
    da[0].check = -2; /* the root: taken, parent of nobody's check by accident */
    pos[0] = 0;
    Py_ssize_t first_free = 1, used = 1;
    for (int32_t k = 0; k < n; k++) {
        int32_t v = order[k];
        State *sv = &da[pos[v]];
        sv->base = 0;
        if (tn[v].first_child < 0) continue;
        int lo_b = 256;
        for (int32_t c = tn[v].first_child; c >= 0; c = tn[c].next_sibling)
            if (tn[c].edge < lo_b) lo_b = tn[c].edge;
        for (Py_ssize_t p = first_free;; p++) {
            if (p + 256 >= cap) {
                Py_ssize_t grown = 2 * cap;
                State *d = PyMem_Realloc(da, grown * sizeof(State));
                if (!d) {
                    PyMem_Free(da);
                    return -1;
                }
                for (Py_ssize_t q = cap; q < grown; q++) d[q].check = FREE;
                da = d, cap = grown;
                sv = &da[pos[v]];
            }
            if (da[p].check != FREE) continue;
            Py_ssize_t base = p - lo_b;
            int fits = 1;
            for (int32_t c = tn[v].first_child; c >= 0 && fits; c = tn[c].next_sibling)
                fits = da[base + tn[c].edge].check == FREE;
            if (!fits) continue;
            sv->base = (int32_t)base;
            for (int32_t c = tn[v].first_child; c >= 0; c = tn[c].next_sibling) {
                pos[c] = (int32_t)(base + tn[c].edge);
                da[pos[c]].check = pos[v];
                if (pos[c] + 1 > used) used = pos[c] + 1;
            }
            break;
        }
        while (da[first_free].check != FREE) first_free++;
    }
    for (int32_t v = 0; v < n; v++) {
        State *sv = &da[pos[v]];
        sv->fail = pos[tn[v].fail];
        int32_t row = tn[v].depth == 1 ? v : tn[tn[v].fail].depth == 1 ? tn[v].fail : -1; /* the shallow row it steps by */
        sv->chain = tn[v].chain | (row > 0 ? VIA_ROW | (int32_t)((uint32_t)tn[row].edge << 24) : 0);
        sv->n_chain = (uint8_t)tn[v].n_chain;
        sv->depth = (uint8_t)tn[v].depth;
        Cand first = tn[v].n_chain ? e->cands[tn[v].chain] : (Cand){0, 0, 0, 0, 0, -1};
        sv->lo = first.lo, sv->span = first.span, sv->node = first.node, sv->rlen = (uint8_t)first.rlen, sv->tlen = first.tlen;
    }
    e->states = da;
    e->n_slots = (int32_t)used;
    e->root_base = da[0].base;
    return 0;
}

static int build_automaton(Engine *e, const uint8_t *bytes, const int32_t *offset, const int32_t *node_of,
                           const Cand *tests) {
    Py_ssize_t total = 1;
    for (int32_t t = 0; t < e->n_tokens; t++)
        if (node_of[t] > 0) total += e->length[t];
    if (total >= (1 << 23)) {
        PyErr_SetString(PyExc_ValueError, "Engine: the vocabulary needs more than 2**23 automaton states");
        return -1;
    }
    for (int32_t t = 0; t < e->n_tokens; t++)
        if (node_of[t] > 0 && e->length[t] > 255) {
            PyErr_Format(PyExc_ValueError, "Engine: token %d is %d bytes long; the C path keeps lengths in one byte (255 at most)",
                         t, e->length[t]);
            return -1;
        }
    Map gotos = {0};
    TrieNode *tn = PyMem_Malloc(total * sizeof(TrieNode));
    int32_t *queue = PyMem_Malloc(total * sizeof(int32_t));
    int32_t *pos = PyMem_Malloc(total * sizeof(int32_t));
    int32_t *row = PyMem_Malloc(256 * sizeof(int32_t)); /* trie child of the root by byte, -1 if none */
    e->shallow = PyMem_Malloc(257 * 256 * sizeof(int32_t));
    int rc = -1;
    if (!tn || !queue || !pos || !row || !e->shallow || map_init(&gotos, total) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    int32_t n = 1;
    tn[0] = (TrieNode){0, -1, -1, -1, -1, 0, 0, 0, 0};
    for (int32_t t = 0; t < e->n_tokens; t++) {
        if (node_of[t] <= 0 || e->length[t] == 0) continue;
        int32_t v = 0;
        for (int32_t k = 0; k < e->length[t]; k++) {
            uint8_t b = bytes[offset[t] + k];
            int32_t c = trie_child(&gotos, v, b);
            if (c < 0) {
                c = n++;
                map_put(&gotos, ((uint32_t)v << 8) | b, c);
                tn[c] = (TrieNode){0, -1, -1, -1, tn[v].first_child, 0, 0, tn[v].depth + 1, b};
                tn[v].first_child = c;
            }
            v = c;
        }
        tn[v].node = node_of[t];
    }
    /* breadth-first: fail and dictionary links */
    Py_ssize_t head = 0, tail = 0;
    queue[tail++] = 0;
    while (head < tail) {
        int32_t v = queue[head++];
        for (int32_t c = tn[v].first_child; c >= 0; c = tn[c].next_sibling) {
            int32_t target = 0;
            if (v != 0) {
                for (int32_t f = tn[v].fail;; f = tn[f].fail) {
                    target = trie_child(&gotos, f, tn[c].edge);
                    if (target >= 0 || f == 0) break;
                }
                if (target < 0) target = 0;
            }
            tn[c].fail = target;
            tn[c].link = tn[target].node >= 0 ? target : tn[target].link;
            queue[tail++] = c;
        }
    }
    /* flat candidate runs: one per token state, shared by the states whose longest token suffix it is */
    Py_ssize_t n_cands = 0;
    for (int32_t v = 1; v < n; v++)
        if (tn[v].node >= 0)
            for (int32_t t = v; t > 0; t = tn[t].link) n_cands++;
    if (n_cands > CHAIN_MASK) {
        PyErr_Format(PyExc_ValueError, "incremental BPE: %zd candidates, more than the %d a state's chain field holds", n_cands, CHAIN_MASK);
        goto done;
    }
    e->cands = PyMem_Malloc((n_cands ? n_cands : 1) * sizeof(Cand));
    if (!e->cands) {
        PyErr_NoMemory();
        goto done;
    }
    n_cands = 0;
    for (int32_t v = 1; v < n; v++) {
        if (tn[v].node < 0) continue;
        tn[v].chain = (int32_t)n_cands;
        for (int32_t t = v; t > 0; t = tn[t].link) {
            e->cands[n_cands++] = tests[tn[t].node];
        }
        tn[v].n_chain = (int32_t)(n_cands - tn[v].chain);
    }
    e->n_cands = n_cands;
    for (int32_t v = 1; v < n; v++) {
        if (tn[v].node >= 0 || tn[v].link <= 0) continue;
        tn[v].chain = tn[tn[v].link].chain;
        tn[v].n_chain = tn[tn[v].link].n_chain;
    }
    if (layout(e, tn, queue, n, pos) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    /* resolved transitions of the root (row 0) and of every depth-1 state (row 1 + its byte) */
    for (int b = 0; b < 256; b++) {
        row[b] = trie_child(&gotos, 0, (uint8_t)b);
        e->shallow[b] = row[b] < 0 ? 0 : pos[row[b]];
    }
    for (int b0 = 0; b0 < 256; b0++) {
        int32_t *out = e->shallow + ((size_t)(b0 + 1) << 8);
        for (int b = 0; b < 256; b++) {
            int32_t g = row[b0] < 0 ? -1 : trie_child(&gotos, row[b0], (uint8_t)b);
            out[b] = g >= 0 ? pos[g] : e->shallow[b];
        }
    }
    rc = 0;
done:
    map_free(&gotos);
    PyMem_Free(tn);
    PyMem_Free(queue);
    PyMem_Free(pos);
    PyMem_Free(row);
    return rc;
}

/* what every engine allocates for itself, built or loaded: the int objects and an empty word cache */
/* The int objects returned for token ids, shared by every engine of the process (an id is an id,
 * whatever the vocabulary): made once, so a new engine costs no allocation per token and its first
 * encode finds them where the last engine left them. Grown by a new array when a vocabulary is
 * larger; an old array stays alive for the engines that point into it. */
static PyObject **shared_ints;
static Py_ssize_t n_shared_ints;

static PyObject **ints_upto(Py_ssize_t n) {
    if (n <= n_shared_ints) return shared_ints;
    PyObject **grown = PyMem_Malloc((n ? n : 1) * sizeof(PyObject *));
    if (!grown) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t t = 0; t < n; t++) {
        if (t < n_shared_ints) {
            grown[t] = shared_ints[t];
            Py_INCREF(grown[t]);
        } else if (!(grown[t] = PyLong_FromSsize_t(t))) {
            while (t-- > 0) Py_DECREF(grown[t]);
            PyMem_Free(grown);
            return NULL;
        }
    }
    shared_ints = grown, n_shared_ints = n; /* the old array is kept: engines may point into it */
    return grown;
}

static int engine_runtime(Engine *e) {
    if (!(e->ints = ints_upto(e->n_tokens))) return -1;
    for (int b = 0; b < 256; b++) e->byte_node[b] = e->byte_token[b] < 0 ? -1 : e->states[e->shallow[b]].node;
    size_t n = (size_t)e->n_cands + 8; /* padded: a vector load past the last chain stays inside */
    e->cand_rlen = PyMem_Calloc(n, sizeof(int32_t)), e->cand_lo = PyMem_Calloc(n, sizeof(int32_t)), e->cand_span = PyMem_Calloc(n, sizeof(int32_t));
    if (!e->cand_rlen || !e->cand_lo || !e->cand_span) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < e->n_cands; k++)
        e->cand_rlen[k] = e->cands[k].rlen, e->cand_lo[k] = (int32_t)e->cands[k].lo, e->cand_span[k] = (int32_t)e->cands[k].span;
    if (buf_reserve(&e->ids, 1 << 14) < 0) return -1;
    e->cache_mask = CACHE_SLOTS - 1;
    e->cache_mem = PyMem_Calloc(CACHE_SLOTS + 1, sizeof(CacheEntry));
    e->cache = e->cache_mem ? (CacheEntry *)(((uintptr_t)e->cache_mem + 63) & ~(uintptr_t)63) : NULL;
    for (int k = 0; k <= CACHE_WORD; k++) e->bypass[k] = (struct Bypass){0, 0, 0, MIN_BYPASS_WINDOWS};

    if (!e->cache) {
        PyErr_NoMemory();
        return -1;
    }
    e->all_bytes = 1;
    for (int b = 0; b < 256; b++) e->all_bytes &= e->byte_token[b] >= 0;
    memset(e->ascii_bits, 0, sizeof(e->ascii_bits));
    for (int b = 0; b < 128; b++) e->ascii_bits[e->classes[b] & 3][b & 15] |= (uint8_t)(1 << (b >> 4));
    memset(e->lack_bits, 0, sizeof(e->lack_bits));
    for (int b = 0; b < 256; b++)
        if (e->byte_token[b] < 0) e->lack_bits[b >> 7][b & 15] |= (uint8_t)(1 << ((b >> 4) & 7));
    return 0;
}

static int Engine_init(Engine *e, PyObject *args, PyObject *kwds) {
    PyObject *bytes_obj, *lengths, *node_of_seq, *node_token, *rlens, *los, *his, *byte_tok;
    Py_buffer classes;
    if (!PyArg_ParseTuple(args, "SOOOOOOOy*", &bytes_obj, &lengths, &node_of_seq, &node_token, &rlens, &los, &his,
                          &byte_tok, &classes))
        return -1;
    if (classes.len != 0x110000) {
        PyBuffer_Release(&classes);
        PyErr_SetString(PyExc_ValueError, "Engine: classes must have 0x110000 entries");
        return -1;
    }
    e->classes = PyMem_Malloc(0x110000);
    if (!e->classes) {
        PyBuffer_Release(&classes);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(e->classes, classes.buf, 0x110000);
    PyBuffer_Release(&classes);
    Py_ssize_t n = PySequence_Size(lengths), m = PySequence_Size(node_token);
    if (n < 0 || m < 0) return -1;
    e->n_tokens = (int32_t)n;
    e->n_nodes = (int32_t)m;
    int32_t *node_of = NULL, *offset = NULL, *bt = NULL, *rlen = NULL, *lo = NULL, *hi = NULL;
    Cand *tests = NULL; /* by node: its own test, copied into the candidate runs */
    int rc = -1;
    if (!(e->length = int_array(lengths, n, "lengths")) || !(node_of = int_array(node_of_seq, n, "node_of")) ||
        !(e->node_token = int_array(node_token, m, "node_token")) || !(rlen = int_array(rlens, m, "right_len")) ||
        !(lo = int_array(los, m, "lo")) || !(hi = int_array(his, m, "hi")) ||
        !(bt = int_array(byte_tok, 256, "byte_token")))
        goto done;
    memcpy(e->byte_token, bt, sizeof(e->byte_token));
    e->node_len = PyMem_Malloc((m ? m : 1) * sizeof(int32_t));
    tests = PyMem_Malloc((m ? m : 1) * sizeof(Cand));
    offset = PyMem_Malloc((n ? n : 1) * sizeof(int32_t));
    if (!e->node_len || !tests || !offset) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < m; k++) {
        int32_t t = e->node_token[k];
        e->node_len[k] = t >= 0 && t < n ? e->length[t] : 0;
        tests[k] = (Cand){(uint32_t)lo[k], (uint32_t)(hi[k] - lo[k]), (int16_t)rlen[k], (uint8_t)e->node_len[k], 0, (int32_t)k};
    }
    Py_ssize_t total = 0;
    for (Py_ssize_t t = 0; t < n; t++) {
        offset[t] = (int32_t)total;
        total += e->length[t];
    }
    if (total != PyBytes_GET_SIZE(bytes_obj)) {
        PyErr_SetString(PyExc_ValueError, "Engine: token bytes do not match the lengths");
        goto done;
    }
    if (build_automaton(e, (const uint8_t *)PyBytes_AS_STRING(bytes_obj), offset, node_of, tests) < 0) goto done;
    if (engine_runtime(e) < 0) goto done;
    rc = 0;
done:
    PyMem_Free(node_of);
    PyMem_Free(tests);
    PyMem_Free(offset);
    PyMem_Free(bt);
    PyMem_Free(rlen);
    PyMem_Free(lo);
    PyMem_Free(hi);
    return rc;
}

static void Engine_dealloc(Engine *e) {
    specials_free(e->specials);
    PyMem_Free(e->length);
    if (e->backed) {
        PyBuffer_Release(&e->backing);
    } else {
        PyMem_Free(e->node_token);
        PyMem_Free(e->node_len);
        PyMem_Free(e->states);
        PyMem_Free(e->cands);
        PyMem_Free(e->shallow);
        PyMem_Free(e->classes);
    }
    PyMem_Free(e->last.data);
    PyMem_Free(e->walk.data);
    PyMem_Free(e->cand_rlen);
    PyMem_Free(e->cand_lo);
    PyMem_Free(e->cand_span);
    PyMem_Free(e->ids.data);
    PyMem_Free(e->kept);
    PyMem_Free(e->lens);
    PyMem_Free(e->cache_mem);
    Py_TYPE(e)->tp_free((PyObject *)e);
}

/* ---------- EagerWord: mirrors _reference.EagerWord ---------- */
typedef struct {
    PyObject_HEAD
    Engine *engine;
    int32_t state;
    Py_ssize_t end, base, root, window, scan;
    IntBuf last, refs; /* indexed by position - base */
} EagerWord;

static PyTypeObject EagerWordType;

static int eager_reset(EagerWord *w) {
    w->state = 0;
    w->end = w->base = w->root = w->window = 0;
    w->scan = 1;
    w->last.len = w->refs.len = 0;
    if (buf_push(&w->last, 0) < 0 || buf_push(&w->refs, 1) < 0) return -1;
    return 0;
}

static void eager_release(EagerWord *w, Py_ssize_t pos) {
    const int32_t *node_len = w->engine->node_len;
    for (;;) {
        int32_t *r = &w->refs.data[pos - w->base];
        if (--*r || pos <= w->root) return;
        pos -= node_len[w->last.data[pos - w->base]];
    }
}

static int eager_emit(EagerWord *w, IntBuf *out) {
    while (w->root < w->window && w->refs.data[w->root - w->base] == 1) {
        Py_ssize_t pos = w->scan > w->root + 1 ? w->scan : w->root + 1;
        while (w->refs.data[pos - w->base] == 0) pos++;
        if (buf_push(out, w->engine->node_token[w->last.data[pos - w->base]]) < 0) return -1;
        w->root = pos;
        w->scan = pos + 1;
    }
    Py_ssize_t cut = w->root - w->base;
    if (cut > 4096 && cut > w->last.len / 2) { /* forget emitted positions */
        memmove(w->last.data, w->last.data + cut, (w->last.len - cut) * sizeof(int32_t));
        memmove(w->refs.data, w->refs.data + cut, (w->refs.len - cut) * sizeof(int32_t));
        w->last.len -= cut;
        w->refs.len -= cut;
        w->base = w->root;
    }
    return 0;
}

static PyObject *EagerWord_push(EagerWord *w, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const Engine *e = w->engine;
    const uint8_t *s = view.buf;
    IntBuf out = {0};
    for (Py_ssize_t i = 0; i < view.len; i++) {
        if (e->byte_token[s[i]] < 0) continue;
        w->state = ac_step(e, w->state, s[i]);
        w->end++;
        uint8_t tlen;
        int32_t u = last_token(e, w->last.data, w->base, w->end, w->state, s[i], &tlen, 0);
        if (u < 0) {
            PyErr_SetString(PyExc_RuntimeError, "incremental BPE: no candidate passes (inconsistent vocabulary)");
            goto fail;
        }
        if (buf_push(&w->last, u) < 0 || buf_push(&w->refs, 1) < 0) goto fail;
        w->refs.data[w->end - e->node_len[u] - w->base] += 1;
        Py_ssize_t window = w->end - e->states[w->state].depth;
        for (Py_ssize_t pos = w->window; pos < window; pos++) eager_release(w, pos);
        w->window = window;
        if (eager_emit(w, &out) < 0) goto fail;
    }
    PyBuffer_Release(&view);
    PyObject *list = buf_to_list(&out, 0, w->engine->ints);
    PyMem_Free(out.data);
    return list;
fail:
    PyBuffer_Release(&view);
    PyMem_Free(out.data);
    return NULL;
}

static PyObject *EagerWord_finish(EagerWord *w, PyObject *Py_UNUSED(ignored)) {
    const int32_t *node_len = w->engine->node_len;
    Py_ssize_t count = 0;
    for (Py_ssize_t p = w->end; p > w->root; p -= node_len[w->last.data[p - w->base]]) count++;
    PyObject *list = PyList_New(count);
    if (!list) return NULL;
    Py_ssize_t k = count;
    for (Py_ssize_t p = w->end; p > w->root; p -= node_len[w->last.data[p - w->base]]) {
        PyObject *v = w->engine->ints[w->engine->node_token[w->last.data[p - w->base]]];
        Py_INCREF(v);
        PyList_SET_ITEM(list, --k, v);
    }
    if (eager_reset(w) < 0) {
        Py_DECREF(list);
        return NULL;
    }
    return list;
}

static void EagerWord_dealloc(EagerWord *w) {
    Py_XDECREF(w->engine);
    PyMem_Free(w->last.data);
    PyMem_Free(w->refs.data);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

static PyMethodDef EagerWord_methods[] = {
    {"push", (PyCFunction)EagerWord_push, METH_O, "Append bytes; return the tokens that became final."},
    {"finish", (PyCFunction)EagerWord_finish, METH_NOARGS, "End the word: return the remaining tokens and reset."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject EagerWordType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "paretolab.plugins.incremental_bpe._fast.EagerWord",
    .tp_basicsize = sizeof(EagerWord),
    .tp_dealloc = (destructor)EagerWord_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "BPE of one pre-token fed in pieces (see _reference.EagerWord).",
    .tp_methods = EagerWord_methods,
};

static PyObject *Engine_eager_word(Engine *e, PyObject *Py_UNUSED(ignored)) {
    EagerWord *w = PyObject_New(EagerWord, &EagerWordType);
    if (!w) return NULL;
    Py_INCREF(e);
    w->engine = e;
    w->last = (IntBuf){0};
    w->refs = (IntBuf){0};
    if (eager_reset(w) < 0) {
        Py_DECREF(w);
        return NULL;
    }
    return (PyObject *)w;
}

static PyObject *Engine_dump(Engine *e, PyObject *Py_UNUSED(ignored));

static PyMethodDef Engine_methods[] = {
    {"encode_text", (PyCFunction)Engine_encode_text, METH_O, "Pre-tokenize and BPE a text (added tokens given to set_specials become their ids)."},
    {"set_specials", (PyCFunction)Engine_set_specials, METH_O, "The added tokens encode_text finds in a text: a sequence of (bytes, id)."},
    {"encode_word", (PyCFunction)Engine_encode_word, METH_O, "BPE of one pre-token's bytes."},
    {"eager_word", (PyCFunction)Engine_eager_word, METH_NOARGS, "A new EagerWord."},
    {"dump", (PyCFunction)Engine_dump, METH_NOARGS, "The read-only tables as bytes (load() takes them back)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject EngineType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "paretolab.plugins.incremental_bpe._fast.Engine",
    .tp_basicsize = sizeof(Engine),
    .tp_dealloc = (destructor)Engine_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Incremental BPE tables and automaton (see _reference.py).",
    .tp_methods = Engine_methods,
    .tp_init = (initproc)Engine_init,
    .tp_new = PyType_GenericNew,
};


/* ---------- the table file: Engine.dump() and load(buffer) ----------
 * One header, then the read-only tables, each at a 64-byte aligned offset from the start of the
 * dump (a memory-mapped file keeps them aligned). load() checks every count against the buffer's
 * size and every index the encoder follows against its table, so a damaged dump is refused with
 * ValueError, never read out of bounds; the caller (_cache.py) also checks a CRC and its key. */
#define LAYOUT_VERSION 3
#define N_SECTIONS 7
typedef struct {
    char magic[8];        /* "IBPEFAST" */
    uint32_t layout, state_size, cand_size, n_sections;
    int32_t n_tokens, n_nodes, n_slots, root_base;
    int64_t n_cands;
    int64_t offset[N_SECTIONS], bytes[N_SECTIONS]; /* node_token node_len byte_token states cands shallow classes */
} DumpHeader;

static void dump_sizes(const Engine *e, DumpHeader *h) {
    memset(h, 0, sizeof(*h));
    memcpy(h->magic, "IBPEFAST", 8);
    h->layout = LAYOUT_VERSION;
    h->state_size = sizeof(State);
    h->cand_size = sizeof(Cand);
    h->n_sections = N_SECTIONS;
    h->n_tokens = e->n_tokens, h->n_nodes = e->n_nodes, h->n_slots = e->n_slots, h->root_base = e->root_base;
    h->n_cands = e->n_cands;
    int64_t sizes[N_SECTIONS] = {4 * (int64_t)e->n_nodes, 4 * (int64_t)e->n_nodes, 4 * 256, (int64_t)sizeof(State) * e->n_slots,
                                 (int64_t)sizeof(Cand) * e->n_cands, 4 * 257 * 256, 0x110000};
    int64_t at = (sizeof(DumpHeader) + 63) & ~(int64_t)63;
    for (int k = 0; k < N_SECTIONS; k++) {
        h->offset[k] = at;
        h->bytes[k] = sizes[k];
        at = (at + sizes[k] + 63) & ~(int64_t)63;
    }
}

static PyObject *Engine_dump(Engine *e, PyObject *Py_UNUSED(ignored)) {
    DumpHeader h;
    dump_sizes(e, &h);
    int64_t total = h.offset[N_SECTIONS - 1] + h.bytes[N_SECTIONS - 1];
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (!out) return NULL;
    char *p = PyBytes_AS_STRING(out);
    memset(p, 0, (size_t)total);
    memcpy(p, &h, sizeof(h));
    const void *src[N_SECTIONS] = {e->node_token, e->node_len, e->byte_token, e->states, e->cands, e->shallow, e->classes};
    for (int k = 0; k < N_SECTIONS; k++) memcpy(p + h.offset[k], src[k], (size_t)h.bytes[k]);
    return out;
}

#define BAD(...) do { PyErr_Format(PyExc_ValueError, "incremental BPE table file: " __VA_ARGS__); return -1; } while (0)

static inline int is_state(const Engine *e, int32_t s) { return s >= 0 && s < e->n_slots && e->states[s].check != FREE; }

/* every index the encoder follows, checked once (O(states + candidates)) */
static int validate(const Engine *e) {
    for (int32_t k = 0; k < e->n_nodes; k++) {
        if (e->node_token[k] < (k == 0 ? -1 : 0) || e->node_token[k] >= e->n_tokens) BAD("node %d names token %d", k, e->node_token[k]);
        if (e->node_len[k] < 0 || e->node_len[k] > 255 || (k > 0 && e->node_len[k] == 0)) BAD("node %d has length %d", k, e->node_len[k]);
    }
    for (int b = 0; b < 256; b++)
        if (e->byte_token[b] < -1 || e->byte_token[b] >= e->n_tokens) BAD("byte %d maps to token %d", b, e->byte_token[b]);
    for (int32_t k = 0; k < 0x110000; k++)
        if (e->classes[k] > SPACE) BAD("code point %d has class %d", k, e->classes[k]);
    if (e->n_slots < 1 || e->states[0].check == FREE) BAD("no root state");
    if (e->root_base < 0 || e->root_base > e->n_slots) BAD("root base %d", e->root_base);
    for (int32_t s = 0; s < e->n_slots; s++) {
        const State *st = &e->states[s];
        if (st->check == FREE) continue;
        if (s > 0 && !is_state(e, st->check)) BAD("state %d has parent %d", s, st->check);
        if (s > 0) { /* the shallow row it steps by: its own (depth 1), its fail's (a depth-1 fail), or none */
            int32_t row = st->check == 0 ? s : is_state(e, st->fail) && e->states[st->fail].check == 0 ? st->fail : -1;
            int32_t want = row > 0 ? VIA_ROW | (int32_t)((uint32_t)(row - e->root_base) << 24) : 0;
            if ((st->chain & ~CHAIN_MASK) != want) BAD("state %d steps by the wrong shallow row", s);
        }
        if (s > 0 && st->check == 0 && (s < e->root_base || s - e->root_base > 255)) BAD("depth-1 state %d outside the resolved rows", s);
        if (st->base < -255 || st->base > e->n_slots) BAD("state %d has base %d", s, st->base);
        if (s > 0 && st->check == 0 && st->depth != 1) BAD("depth-1 state %d says depth %d", s, st->depth);
        if (!is_state(e, st->fail) || e->states[st->fail].depth >= st->depth + (s == 0)) BAD("state %d fails to %d", s, st->fail);
        if (s > 0 && st->depth != e->states[st->check].depth + 1) BAD("state %d has depth %d", s, st->depth);
        if (st->n_chain == 0) {
            if (st->node != -1 || st->rlen != 0) BAD("state %d: no candidates, yet an inline one", s);
            continue; /* the encoder reports "no candidate passes" */
        }
        if ((int64_t)chain_of(st) + st->n_chain > e->n_cands) BAD("state %d: candidates %d+%d", s, chain_of(st), st->n_chain);
        const Cand *first = &e->cands[chain_of(st)];
        if (first->lo != st->lo || first->span != st->span || first->node != st->node || first->rlen != st->rlen || first->tlen != st->tlen)
            BAD("state %d: inline candidate differs from its run", s);
        for (int k = 0; k < st->n_chain; k++) {
            const Cand *c = &e->cands[chain_of(st) + k];
            if (c->node <= 0 || c->node >= e->n_nodes) BAD("state %d: candidate node %d", s, c->node);
            int32_t len = e->node_len[c->node];
            if (len > st->depth || c->rlen < 0 || c->rlen >= len || (c->rlen == 0) != (len == 1) || c->tlen != len)
                BAD("state %d: candidate %d has length %d, right part %d", s, k, len, c->rlen);
        }
    }
    for (int32_t k = 0; k < 257 * 256; k++)
        if (!is_state(e, e->shallow[k])) BAD("resolved row entry %d is %d", k, e->shallow[k]);
    return 0;
}

static PyObject *fast_load(PyObject *module, PyObject *arg) {
    Engine *e = (Engine *)PyType_GenericAlloc(&EngineType, 0);
    if (!e) return NULL;
    if (PyObject_GetBuffer(arg, &e->backing, PyBUF_SIMPLE) < 0) {
        Py_DECREF(e);
        return NULL;
    }
    e->backed = 1;
    const char *p = e->backing.buf;
    Py_ssize_t size = e->backing.len;
    DumpHeader h;
    if (size < (Py_ssize_t)sizeof(h) || ((uintptr_t)p & 63)) {
        PyErr_SetString(PyExc_ValueError, "incremental BPE table file: too short or misaligned");
        goto fail;
    }
    memcpy(&h, p, sizeof(h));
    if (memcmp(h.magic, "IBPEFAST", 8) || h.layout != LAYOUT_VERSION || h.state_size != sizeof(State) ||
        h.cand_size != sizeof(Cand) || h.n_sections != N_SECTIONS) {
        PyErr_SetString(PyExc_ValueError, "incremental BPE table file: another layout");
        goto fail;
    }
    if (h.n_tokens < 0 || h.n_nodes < 1 || h.n_slots < 1 || h.n_cands < 0 || h.n_cands > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "incremental BPE table file: bad counts");
        goto fail;
    }
    e->n_tokens = h.n_tokens, e->n_nodes = h.n_nodes, e->n_slots = h.n_slots, e->root_base = h.root_base;
    e->n_cands = (Py_ssize_t)h.n_cands;
    DumpHeader want;
    dump_sizes(e, &want);
    for (int k = 0; k < N_SECTIONS; k++)
        if (h.offset[k] != want.offset[k] || h.bytes[k] != want.bytes[k] || want.offset[k] + want.bytes[k] > size) {
            PyErr_SetString(PyExc_ValueError, "incremental BPE table file: sections do not match its counts or its size");
            goto fail;
        }
    e->node_token = (int32_t *)(p + h.offset[0]);
    e->node_len = (int32_t *)(p + h.offset[1]);
    memcpy(e->byte_token, p + h.offset[2], sizeof(e->byte_token));
    e->states = (State *)(p + h.offset[3]);
    e->cands = (Cand *)(p + h.offset[4]);
    e->shallow = (int32_t *)(p + h.offset[5]);
    e->classes = (uint8_t *)(p + h.offset[6]);
    if (validate(e) < 0 || engine_runtime(e) < 0) goto fail;
    return (PyObject *)e;
fail:
    Py_DECREF(e);
    return NULL;
}

static PyMethodDef fast_functions[] = {
#ifdef IBPE_PROFILE
    {"phases", (PyCFunction)fast_phases, METH_NOARGS, "Profile build: thread CPU ns per phase of encode_text since the last call."},
#endif
    {"load", (PyCFunction)fast_load, METH_O, "An Engine over a dump's buffer (kept referenced, not copied); ValueError if damaged."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fast_module = {
    PyModuleDef_HEAD_INIT, "_fast", "C fast path of paretolab.plugins.incremental_bpe.", -1, fast_functions,
};

PyMODINIT_FUNC PyInit__fast(void) {
    if (PyType_Ready(&EngineType) < 0 || PyType_Ready(&EagerWordType) < 0) return NULL;
#if defined(__x86_64__) && defined(__GNUC__)
    have_avx2 = __builtin_cpu_supports("avx2") && !getenv("IBPE_NO_AVX2");
#endif
    PyObject *m = PyModule_Create(&fast_module);
    if (!m) return NULL;
    Py_INCREF(&EngineType);
    if (PyModule_AddIntConstant(m, "LAYOUT_VERSION", LAYOUT_VERSION) < 0 || PyModule_AddObject(m, "Engine", (PyObject *)&EngineType) < 0) {
        Py_DECREF(&EngineType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
