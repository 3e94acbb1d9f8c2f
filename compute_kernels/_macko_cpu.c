/* MACKO SpMV on the CPU: y[b] = M @ x[b] for a few vectors x[b], read straight from the format.
 *
 * The format is kernels/macko_format.py's (read its docstring): fp16 or bf16 values, one 4-bit
 * code (column step - 1) per value, two per byte, low nibble first, int32 row pointers. The
 * Python wrapper (kernels/macko_cpu.py) checks dtypes, shapes and devices and passes raw
 * addresses; this file checks what only the data can tell (row pointers in order and inside
 * the buffers, no column past the matrix) and raises instead of reading out of bounds.
 *
 * Work: each row is computed whole by one thread (OpenMP, the runtime torch already loaded:
 * both name libgomp.so.1, so one thread pool serves both); rows are split so that every thread
 * gets the same number of stored entries, not of rows. A row's result depends on nothing but
 * the row, so any thread count gives bit-identical output.
 *
 * Three instruction paths, picked at run time (_cpu_paths.h): AVX-512 (16 entries a step: the
 * codes' running sums in general-purpose registers (pdep and a multiply), x picked by two permutes
 * from a 64-column window or by a hardware gather for wider steps, values widened to fp32 in
 * registers, one FMA per vector x), AVX2 (8 entries a step: the 8 codes'
 * running sums in one general-purpose register, x picked by 8 scalar loads, values widened by
 * F16C, one FMA per vector x) and portable scalar C (the same arithmetic one entry at a time;
 * also what the tests compare the vector paths against).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define HAVE_X86 1
#endif
#include "_cpu_paths.h"

#define MAX_BATCH 8 /* vectors of x per pass over the format; more are done in several passes */
#ifndef PREFETCH_BYTES
#define PREFETCH_BYTES 4096 /* values this far ahead (codes a quarter of it), into L2 */
#endif
#define X_PAD 256   /* zeros after each copied row of x: the AVX-512 path loads up to 256 columns from any column <= cols */

typedef struct {
    const uint16_t *values; /* raw 16-bit patterns */
    const uint8_t *deltas;
    const int32_t *row_ptr;
    int64_t rows, cols, n_values;
    int bf16;          /* 0: fp16 values, 1: bf16 values */
    int prefetch;      /* AVX-512 path: prefetch values and codes ahead (on Intel CPUs; see row_avx512) */
    const float *x;    /* (batch, x_stride) fp32 */
    int64_t x_stride;
    int64_t batch;
    float *y;          /* (batch, rows) fp32 */
} Spmv;

/* ---------- scalar path ---------- */

static inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13); /* inf / nan */
    } else if (exp) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man) { /* subnormal: normalise */
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3FF) << 13);
    } else {
        bits = sign;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* One row, scalar; returns 0, or 1 where a column left the matrix (nothing read past x). */
static int row_scalar(const Spmv *p, int64_t r, int64_t b0, int nb) {
    float acc[MAX_BATCH] = {0};
    int64_t col = -1;
    for (int64_t i = p->row_ptr[r]; i < p->row_ptr[r + 1]; i++) {
        col += ((p->deltas[i >> 1] >> ((i & 1) * 4)) & 0xF) + 1;
        if (col >= p->cols) return 1;
        float v = p->bf16 ? bf16_to_float(p->values[i]) : half_to_float(p->values[i]);
        for (int b = 0; b < nb; b++) acc[b] += v * p->x[(b0 + b) * p->x_stride + col];
    }
    for (int b = 0; b < nb; b++) p->y[(b0 + b) * p->rows + r] = acc[b];
    return 0;
}

/* ---------- AVX-512 path ---------- */
#ifdef HAVE_X86
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,bmi2")))

#define ONES 0x0101010101010101ULL

/* Column steps of 8 entries (8 codes in the low 32 bits of d) as 8 bytes, then their running sums
 * (one multiply: byte j of s * ONES is s_0 + ... + s_j; at most 8 * 16 = 128, so no carries). */
AVX512 static inline uint64_t running_steps(uint64_t d) {
    return (_pdep_u64(d, 0x0F0F0F0F0F0F0F0FULL) + ONES) * ONES;
}

AVX512 static inline __m512 widen(__m256i raw, int bf16) {
    if (bf16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
    return _mm512_cvtph_ps(raw);
}

/* x at 16 columns col + 1 + rel (rel < 64): 4 loads from col + 1, one permute per pair of them,
 * then a blend on bit 5 of rel. */
AVX512 static inline __attribute__((always_inline)) __m512 x_window(const float *w, __m512i rel) {
    __m512 low = _mm512_permutex2var_ps(_mm512_loadu_ps(w), rel, _mm512_loadu_ps(w + 16));
    __m512 high = _mm512_permutex2var_ps(_mm512_loadu_ps(w + 32), rel, _mm512_loadu_ps(w + 48));
    return _mm512_mask_blend_ps(_mm512_test_epi32_mask(rel, _mm512_set1_epi32(32)), low, high);
}

/* One step: 16 entries (n < 16 only in a row's last step, whose absent codes step by 1 and
 * whose absent values are 0) given as 8 code bytes d and values v. Returns the new column, or
 * -2 where a column left the matrix. */
AVX512 static inline __attribute__((always_inline)) int64_t step(const float *const *xs, __m512 *acc, int nb, int64_t col,
                                                                   int64_t cols, uint64_t d, __m512 v, int64_t n, int full) {
    uint64_t lo = running_steps(d), hi = running_steps(d >> 32);
    int64_t half = (int64_t)(lo >> 56), span = half + (int64_t)(hi >> 56); /* lane 15 is at col + span <= col + 256 */
    int64_t next = col + span - (16 - n);
    if (next >= cols) return -2; /* the deltas do not belong to this shape */
    /* offsets from col + 1: lo - 1 and hi + half - 1 per byte, all < span <= 256 */
    __m512i rel = _mm512_cvtepu8_epi32(_mm_set_epi64x((long long)(hi + (uint64_t)(half - 1) * ONES), (long long)(lo - ONES)));
    _Pragma("GCC unroll 8") for (int b = 0; b < nb; b++) {
        const float *w = xs[b] + col + 1;
        __m512 xv = span <= 64 ? x_window(w, rel) : _mm512_i32gather_ps(rel, w, 4);
        if (!full) xv = _mm512_maskz_mov_ps((__mmask16)((1u << n) - 1), xv); /* absent lanes: 0, also where x is inf */
        acc[b] = _mm512_fmadd_ps(v, xv, acc[b]);
    }
    return next;
}

/* One row, 16 entries a step. The 16 codes of a step become column offsets in general purpose
 * registers (pdep + multiply). Where the step spans at most 64 columns (the usual case up to
 * ~70 % sparsity) x is read as 4 vectors from the step's first possible column and the 16
 * values picked by two in-register permutes; wider steps (most of them at 90 %) take a hardware
 * gather: on a two-core Xeon (Sapphire/Emerald Rapids class) that made a 90 % 4096x4096 2.2x
 * faster than the permute-and-blend tree it replaced (8 permutes, 7 blends for a 256-column
 * span), neutral at 70 %. x rows are padded by X_PAD zeros, so a window that starts at any
 * column <= cols stays inside the buffer. On Intel CPUs values and codes are prefetched into L2
 * PREFETCH_BYTES ahead: on that Xeon this made the cold cells 10-25 % faster than none (its
 * hardware prefetcher alone did not keep the two streams ahead of this compute-bound loop) and a
 * decode's worth of layers ~3 % faster than 1 KB ahead into L1; on an AMD Zen 4 a software
 * prefetch here measured slower, so AMD has none. */
AVX512 static inline __attribute__((always_inline)) int row_avx512(const Spmv *p, int64_t r, int64_t b0, int nb, int bf16) {
    const float *xs[MAX_BATCH];
    __m512 acc[MAX_BATCH];
    float first[MAX_BATCH] = {0};
    _Pragma("GCC unroll 8") for (int b = 0; b < nb; b++) { xs[b] = p->x + (b0 + b) * p->x_stride; acc[b] = _mm512_setzero_ps(); }
    const uint16_t *values = p->values;
    const uint8_t *deltas = p->deltas;
    const int64_t cols = p->cols;
    int64_t i = p->row_ptr[r], e = p->row_ptr[r + 1], col = -1;
    if (i < e && (i & 1)) { /* an odd start: one entry by hand so that the steps start on a byte */
        col = deltas[i >> 1] >> 4;
        if (col >= cols) return 1;
        float v = bf16 ? bf16_to_float(values[i]) : half_to_float(values[i]);
        _Pragma("GCC unroll 8") for (int b = 0; b < nb; b++) first[b] = v * xs[b][col];
        i++;
    }
    for (; e - i >= 16 && col >= -1; i += 16) {
        uint64_t d;
        if (p->prefetch) {
            _mm_prefetch((const char *)(values + i) + PREFETCH_BYTES, _MM_HINT_T1);
            _mm_prefetch((const char *)(deltas + (i >> 1)) + PREFETCH_BYTES / 4, _MM_HINT_T1);
        }
        memcpy(&d, deltas + (i >> 1), 8);
        __m512 v = widen(_mm256_loadu_si256((const __m256i *)(values + i)), bf16);
        col = step(xs, acc, nb, col, cols, d, v, 16, 1);
    }
    if (i < e && col >= -1) { /* masked loads never touch memory past the row's last entry */
        int64_t left = e - i;
        __m128i bytes = _mm_maskz_loadu_epi8((__mmask16)((1u << ((left + 1) >> 1)) - 1), deltas + (i >> 1));
        uint64_t d = (uint64_t)_mm_cvtsi128_si64(bytes) & ((1ULL << (4 * left)) - 1);
        __m512 v = widen(_mm256_maskz_loadu_epi16((__mmask16)((1u << left) - 1), values + i), bf16);
        col = step(xs, acc, nb, col, cols, d, v, left, 0);
    }
    if (col < -1) return 1;
    _Pragma("GCC unroll 8") for (int b = 0; b < nb; b++) p->y[(b0 + b) * p->rows + r] = first[b] + _mm512_reduce_add_ps(acc[b]);
    return 0;
}

/* One specialisation per batch size and value type, so that the accumulators stay in registers
 * (with the loops over b unrolled: otherwise GCC keeps them in stack arrays for 2+ vectors of x,
 * 10-15 % slower at 2-8 on a two-core Xeon). */
AVX512 static int row_avx512_n(const Spmv *p, int64_t r, int64_t b0, int nb) {
    switch (nb * 2 + p->bf16) {
#define ROW_CASE(k) case 2 * k: return row_avx512(p, r, b0, k, 0); case 2 * k + 1: return row_avx512(p, r, b0, k, 1);
    ROW_CASE(1) ROW_CASE(2) ROW_CASE(3) ROW_CASE(4) ROW_CASE(5) ROW_CASE(6) ROW_CASE(7)
#undef ROW_CASE
    default: return p->bf16 ? row_avx512(p, r, b0, 8, 1) : row_avx512(p, r, b0, 8, 0);
    }
}

/* ---------- AVX2 path ---------- */

/* 8 codes (4 bits each, entry order: low nibble first) as 8 bytes, without pdep (slow on AMD before Zen 3). */
static inline uint64_t spread_nibbles(uint32_t d) {
    uint64_t v = d;
    v = (v | v << 16) & 0x0000FFFF0000FFFFULL;
    v = (v | v << 8) & 0x00FF00FF00FF00FFULL;
    return (v | v << 4) & 0x0F0F0F0F0F0F0F0FULL;
}

AVX2 static inline __m256 widen8(__m128i raw, int bf16) {
    if (bf16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
    return _mm256_cvtph_ps(raw);
}

/* One step: 8 entries (n < 8 only in a row's last step, whose absent codes step by 1 and whose
 * absent values are 0) given as 4 code bytes d and values v. Returns the new column, or -2 where
 * a column left the matrix. */
AVX2 static inline __attribute__((always_inline)) int64_t step8(const float *const *xs, __m256 *acc, int nb, int64_t col,
                                                                 int64_t cols, uint32_t d, __m256 v, int64_t n) {
    uint64_t run = (spread_nibbles(d) + ONES) * ONES; /* byte i: entry i's column - col (at most 8 * 16 = 128) */
    int64_t next = col + (int64_t)(run >> 56) - (8 - n);
    if (next >= cols) return -2; /* the deltas do not belong to this shape */
    const int o0 = (int)(run & 0xFF), o1 = (int)(run >> 8 & 0xFF), o2 = (int)(run >> 16 & 0xFF), o3 = (int)(run >> 24 & 0xFF);
    const int o4 = (int)(run >> 32 & 0xFF), o5 = (int)(run >> 40 & 0xFF), o6 = (int)(run >> 48 & 0xFF), o7 = (int)(run >> 56);
    const __m256 present = n == 8 ? _mm256_castsi256_ps(_mm256_set1_epi32(-1))
                                  : _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
    for (int b = 0; b < nb; b++) {
        const float *w = xs[b] + col; /* x rows are padded by X_PAD zeros: every offset here stays inside */
        __m256 xv = _mm256_setr_ps(w[o0], w[o1], w[o2], w[o3], w[o4], w[o5], w[o6], w[o7]);
        acc[b] = _mm256_fmadd_ps(v, _mm256_and_ps(xv, present), acc[b]); /* absent lanes: 0, also where x is inf */
    }
    return next;
}

/* One row, 8 entries a step (the AVX-512 path's scheme at half the width). */
AVX2 static inline __attribute__((always_inline)) int row_avx2(const Spmv *p, int64_t r, int64_t b0, int nb, int bf16) {
    const float *xs[MAX_BATCH];
    __m256 acc[MAX_BATCH];
    float first[MAX_BATCH] = {0};
    for (int b = 0; b < nb; b++) { xs[b] = p->x + (b0 + b) * p->x_stride; acc[b] = _mm256_setzero_ps(); }
    const uint16_t *values = p->values;
    const uint8_t *deltas = p->deltas;
    const int64_t cols = p->cols;
    int64_t i = p->row_ptr[r], e = p->row_ptr[r + 1], col = -1;
    if (i < e && (i & 1)) { /* an odd start: one entry by hand so that the steps start on a byte */
        col = deltas[i >> 1] >> 4;
        if (col >= cols) return 1;
        float v = bf16 ? bf16_to_float(values[i]) : half_to_float(values[i]);
        for (int b = 0; b < nb; b++) first[b] = v * xs[b][col];
        i++;
    }
    for (; e - i >= 8 && col >= -1; i += 8) {
        uint32_t d;
        memcpy(&d, deltas + (i >> 1), 4);
        col = step8(xs, acc, nb, col, cols, d, widen8(_mm_loadu_si128((const __m128i *)(values + i)), bf16), 8);
    }
    if (i < e && col >= -1) { /* copies: nothing read past the row's last entry */
        int64_t left = e - i;
        uint32_t d = 0;
        uint16_t part[8] = {0};
        memcpy(&d, deltas + (i >> 1), (size_t)((left + 1) >> 1));
        memcpy(part, values + i, (size_t)left * 2);
        d &= (uint32_t)((1ULL << (4 * left)) - 1);
        col = step8(xs, acc, nb, col, cols, d, widen8(_mm_loadu_si128((const __m128i *)part), bf16), left);
    }
    if (col < -1) return 1;
    for (int b = 0; b < nb; b++) p->y[(b0 + b) * p->rows + r] = first[b] + hsum8(acc[b]);
    return 0;
}

AVX2 static int row_avx2_n(const Spmv *p, int64_t r, int64_t b0, int nb) {
    switch (nb * 2 + p->bf16) {
#define ROW_CASE(k) case 2 * k: return row_avx2(p, r, b0, k, 0); case 2 * k + 1: return row_avx2(p, r, b0, k, 1);
    ROW_CASE(1) ROW_CASE(2) ROW_CASE(3) ROW_CASE(4) ROW_CASE(5) ROW_CASE(6) ROW_CASE(7)
#undef ROW_CASE
    default: return p->bf16 ? row_avx2(p, r, b0, 8, 1) : row_avx2(p, r, b0, 8, 0);
    }
}

static int best_path(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("bmi2"))
        return PATH_AVX512;
    return cpu_has_avx2() ? PATH_AVX2 : PATH_SCALAR;
}
#else
static int best_path(void) { return PATH_SCALAR; }
#endif

/* ---------- driver ---------- */

/* First row whose start offset is >= target (row_ptr is non-decreasing). */
static int64_t row_at(const int32_t *row_ptr, int64_t rows, int64_t target) {
    int64_t lo = 0, hi = rows;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (row_ptr[mid] < target) lo = mid + 1; else hi = mid;
    }
    return lo;
}

static int run_rows(const Spmv *p, int64_t r0, int64_t r1, int path) {
    int bad = 0;
    for (int64_t b0 = 0; b0 < p->batch; b0 += MAX_BATCH) {
        int nb = (int)(p->batch - b0 < MAX_BATCH ? p->batch - b0 : MAX_BATCH);
        for (int64_t r = r0; r < r1 && !bad; r++) {
#ifdef HAVE_X86
            if (path == PATH_AVX512) { bad = row_avx512_n(p, r, b0, nb); continue; }
            if (path == PATH_AVX2) { bad = row_avx2_n(p, r, b0, nb); continue; }
#endif
            bad = row_scalar(p, r, b0, nb);
        }
    }
    return bad;
}

static int spmv(const Spmv *p, int threads, int path) {
    int64_t total = p->row_ptr[p->rows];
    int bad = 0;
#ifdef _OPENMP
    if (threads > 1 && p->rows > 1) {
#pragma omp parallel num_threads(threads) reduction(| : bad)
        {
            int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
            int64_t r0 = t == 0 ? 0 : row_at(p->row_ptr, p->rows, total * t / n);
            int64_t r1 = t == n - 1 ? p->rows : row_at(p->row_ptr, p->rows, total * (t + 1) / n);
            bad |= run_rows(p, r0, r1, path);
        }
        return bad;
    }
#endif
    (void)threads;
    return run_rows(p, 0, p->rows, path);
}

static PyObject *py_spmv(PyObject *self, PyObject *args) {
    unsigned long long values, deltas, row_ptr, x, y;
    long long rows, cols, n_values, x_stride, batch;
    int bf16, threads, cap;
    if (!PyArg_ParseTuple(args, "KKKLLLpKLLKii", &values, &deltas, &row_ptr, &rows, &cols, &n_values, &bf16,
                          &x, &x_stride, &batch, &y, &threads, &cap))
        return NULL;
    if (rows < 0 || cols < 0 || n_values < 0 || batch < 0 || x_stride < cols || (n_values & 1)) {
        PyErr_Format(PyExc_ValueError, "macko spmv: bad sizes rows=%lld cols=%lld n_values=%lld batch=%lld x_stride=%lld",
                     rows, cols, n_values, batch, x_stride);
        return NULL;
    }
    Spmv p = {(const uint16_t *)(uintptr_t)values, (const uint8_t *)(uintptr_t)deltas, (const int32_t *)(uintptr_t)row_ptr,
              rows, cols, n_values, bf16, 0, (const float *)(uintptr_t)x, x_stride, batch, (float *)(uintptr_t)y};
#ifdef HAVE_X86
    __builtin_cpu_init();
    p.prefetch = __builtin_cpu_is("intel");
#endif
    /* The row pointers must start at 0, never decrease and stay inside the value buffer. */
    if (p.row_ptr[0] != 0 || p.row_ptr[rows] > n_values) {
        PyErr_Format(PyExc_ValueError, "macko spmv: row_ptr must run from 0 to at most %lld stored values, got %d..%d; "
                     "re-encode the matrix with macko_encode", n_values, p.row_ptr[0], p.row_ptr[rows]);
        return NULL;
    }
    for (int64_t r = 0; r < rows; r++)
        if (p.row_ptr[r + 1] < p.row_ptr[r]) {
            PyErr_Format(PyExc_ValueError, "macko spmv: row_ptr decreases at row %lld (%d > %d); re-encode the matrix with macko_encode",
                         (long long)r, p.row_ptr[r], p.row_ptr[r + 1]);
            return NULL;
        }
    if (rows == 0 || batch == 0) Py_RETURN_NONE;
    if (cols == 0) {
        if (p.row_ptr[rows] != 0) {
            PyErr_SetString(PyExc_ValueError, "macko spmv: a matrix with 0 columns stores entries; re-encode it with macko_encode");
            return NULL;
        }
        memset(p.y, 0, (size_t)(rows * batch) * sizeof(float));
        Py_RETURN_NONE;
    }
    /* x copied into zero-padded rows (a few KB; the matrix is what costs) */
    float *xpad = PyMem_RawMalloc((size_t)(batch * (cols + X_PAD)) * sizeof(float));
    if (!xpad) return PyErr_NoMemory();
    for (int64_t b = 0; b < batch; b++) {
        memcpy(xpad + b * (cols + X_PAD), p.x + b * x_stride, (size_t)cols * sizeof(float));
        memset(xpad + b * (cols + X_PAD) + cols, 0, X_PAD * sizeof(float));
    }
    p.x = xpad;
    p.x_stride = cols + X_PAD;
    int bad;
    int path = pick_path(best_path(), cap);
    Py_BEGIN_ALLOW_THREADS
    bad = spmv(&p, threads, path);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(xpad);
    if (bad) {
        PyErr_Format(PyExc_ValueError, "macko spmv: the column codes step past the matrix's %lld columns; "
                     "the deltas buffer does not belong to this shape (re-encode with macko_encode)", cols);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *py_isa(PyObject *self, PyObject *noargs) { return path_name(best_path()); }

static PyObject *py_paths(PyObject *self, PyObject *noargs) { return path_tuple(best_path()); }

static PyObject *py_openmp(PyObject *self, PyObject *noargs) {
#ifdef _OPENMP
    Py_RETURN_TRUE;
#else
    Py_RETURN_FALSE;
#endif
}

static PyMethodDef methods[] = {
    {"spmv", py_spmv, METH_VARARGS,
     "spmv(values, deltas, row_ptr, rows, cols, n_values, bf16, x, x_stride, batch, y, threads, cap): "
     "y[b, :] = M @ x[b, :] (addresses of contiguous CPU buffers; x and y fp32; the best path at most cap: 0 scalar, 1 avx2, 2 avx512)"},
    {"isa", py_isa, METH_NOARGS, "the best instruction path spmv takes on this CPU: 'avx512', 'avx2' or 'scalar'"},
    {"paths", py_paths, METH_NOARGS, "every instruction path this CPU runs, best first"},
    {"openmp", py_openmp, METH_NOARGS, "whether the extension was built with OpenMP (threads > 1 possible)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_macko_cpu", "MACKO SpMV on the CPU (see kernels/macko_cpu.py)", -1, methods};

PyMODINIT_FUNC PyInit__macko_cpu(void) { return PyModule_Create(&module); }
