/* A dense linear layer for a few rows of input on the CPU: y[m] = W x[m] (+ bias), W read once.
 *
 *   x (M, K) fp32, W (N, K) fp32 or bf16 row-major, bias (N,) fp32 or none, y (M, N) fp32.
 *
 * Why: at batch 1 a decoder's linears are memory-bound, and a verify of k+1 draft tokens should
 * cost about what one token costs, since every weight is read once either way. On this project's
 * CPUs torch's BLAS does neither: its one-row product streams a model's weights at ~12 GB/s of
 * the ~30 the memory gives, and its product for 2..8 rows costs 1.3-2.4x one row
 * (benchmarks/dense_cpu.py measures both). Here each output row of W is streamed once and dotted
 * with up to 8 rows of x held in L1 (more rows: further passes over the same W row, still in L1).
 *
 * Summation order: every output is the sum of its 16-float blocks into two accumulators (even and
 * odd blocks), a masked tail block into the first, then one fixed 16-lane reduction. It depends
 * on neither M nor the thread count, so a row's output is bit-identical whether it is computed
 * alone or beside other rows, and with one thread or many: the property a speculative verify
 * needs to reproduce one-token greedy decoding exactly.
 *
 * Each step also asks for every cache line of the weights 6 KB ahead into L2 (_mm_prefetch, T1):
 * without it the hardware prefetcher falls behind once the FMAs of several rows of x keep the core
 * busy, and a verify of 4-5 tokens costs 1.3-1.5x one token instead of about the same.
 *
 * Threads: OpenMP (torch's own libgomp.so.1, one pool for both) over blocks of output rows.
 * Three paths picked at run time (_cpu_paths.h): AVX-512 (avx512f), AVX2 + FMA (8-float blocks:
 * the same even/odd scheme over 16-float pairs of them, up to 6 rows of x a pass so that the
 * accumulators fit the 16 registers) and portable scalar C; the same arithmetic up to rounding
 * (the tests compare every path the CPU runs with the exact product).
 * The Python wrapper (compute_kernels/dense_cpu.py) checks dtypes, shapes and contiguity.
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

#define ROWS_PER_PASS 8
/* Bytes of W asked for ahead into L2, every cache line: the stream stays ahead of the FMAs of several
 * rows of x. A model's worth of SmolLM2 weights (538 MB fp32, cold, 2 threads): 1 row 14 ms either
 * way; 4 rows 17.6 ms with every other line 2 KB ahead (the hardware prefetcher left to fetch the
 * rest), 14.1 ms with every line 6 KB ahead; 8 rows 27 -> 19 ms. bf16 weights: 4 rows 11.2 -> 8.4 ms. */
#define PREFETCH_BYTES 6144

typedef struct {
    const float *x;
    const void *w;
    const float *bias;
    float *y;
    int64_t m, k, n;
    int bf16;
} Linear;

static inline float bf16_to_float(uint16_t v) {
    uint32_t bits = (uint32_t)v << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* ---------- portable path ---------- */

static void rows_scalar(const Linear *p, int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; n++) {
        for (int64_t m = 0; m < p->m; m++) {
            const float *x = p->x + m * p->k;
            float lanes[32] = {0};
            for (int64_t j = 0; j < p->k; j++) {
                float w = p->bf16 ? bf16_to_float(((const uint16_t *)p->w)[n * p->k + j]) : ((const float *)p->w)[n * p->k + j];
                lanes[j & 31] += w * x[j];
            }
            float s = 0.0f;
            for (int i = 0; i < 16; i++) s += lanes[i] + lanes[i + 16];
            p->y[m * p->n + n] = s + (p->bias ? p->bias[n] : 0.0f);
        }
    }
}

/* ---------- AVX-512 path ---------- */
#ifdef HAVE_X86
#define AVX512 __attribute__((target("avx512f")))

AVX512 static inline __m512 load_w(const void *w, int64_t at, int bf16) {
    if (bf16) {
        __m256i raw = _mm256_loadu_si256((const __m256i *)((const uint16_t *)w + at));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
    }
    return _mm512_loadu_ps((const float *)w + at);
}

AVX512 static inline __m512 load_w_tail(const void *w, int64_t at, __mmask16 mask, int bf16) {
    if (bf16) { /* avx512f alone has no masked 16-bit load: copy the tail into a zeroed block */
        uint16_t tail[16] = {0};
        for (int i = 0; i < 16; i++)
            if (mask >> i & 1) tail[i] = ((const uint16_t *)w)[at + i];
        return load_w(tail, 0, 1);
    }
    return _mm512_maskz_loadu_ps(mask, (const float *)w + at);
}

/* ROWS rows of x (a compile-time constant after inlining, so the accumulators stay in registers)
 * against one row of W starting at element `row`; writes ROWS outputs with stride n. Every loop
 * over the rows is unrolled: left to itself GCC kept the accumulators in stack arrays for the
 * tail and the sums (and zeroed them with `rep stos` each call), which cost SmolLM2's linears at
 * 8 rows of x 7 % (26.2 -> 24.5 ms on a two-core Xeon; 1 row unchanged). */
#define DOT_ROWS(ROWS)                                                                                     \
    AVX512 static void dot_rows_##ROWS(const Linear *p, int64_t row, const float *x, float *y) {            \
        const int64_t k = p->k;                                                                               \
        __m512 even[ROWS], odd[ROWS];                                                                         \
        _Pragma("GCC unroll 16") for (int r = 0; r < ROWS; r++) even[r] = odd[r] = _mm512_setzero_ps();                                \
        int64_t j = 0;                                                                                        \
        for (; j + 32 <= k; j += 32) {                                                                        \
            const char *ahead = (const char *)p->w + (row + j) * (p->bf16 ? 2 : 4) + PREFETCH_BYTES;            \
            _mm_prefetch(ahead, _MM_HINT_T1);                                                                   \
            if (!p->bf16) _mm_prefetch(ahead + 64, _MM_HINT_T1); /* fp32: the block's second cache line */      \
            __m512 w0 = load_w(p->w, row + j, p->bf16), w1 = load_w(p->w, row + j + 16, p->bf16);             \
            _Pragma("GCC unroll 16") for (int r = 0; r < ROWS; r++) {                                                                  \
                even[r] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + r * k + j), even[r]);                       \
                odd[r] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + r * k + j + 16), odd[r]);                    \
            }                                                                                                 \
        }                                                                                                     \
        for (; j < k; j += 16) {                                                                              \
            __mmask16 mask = k - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (k - j)) - 1);              \
            __m512 w0 = load_w_tail(p->w, row + j, mask, p->bf16);                                            \
            _Pragma("GCC unroll 16") for (int r = 0; r < ROWS; r++) even[r] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(mask, x + r * k + j), even[r]); \
        }                                                                                                     \
        _Pragma("GCC unroll 16") for (int r = 0; r < ROWS; r++) y[r * p->n] = _mm512_reduce_add_ps(_mm512_add_ps(even[r], odd[r]));  \
    }
DOT_ROWS(1)
DOT_ROWS(2)
DOT_ROWS(3)
DOT_ROWS(4)
DOT_ROWS(5)
DOT_ROWS(6)
DOT_ROWS(7)
DOT_ROWS(8)

AVX512 static void rows_avx512(const Linear *p, int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; n++) {
        int64_t row = n * p->k;
        for (int64_t m0 = 0; m0 < p->m; m0 += ROWS_PER_PASS) {
            int64_t rows = p->m - m0 < ROWS_PER_PASS ? p->m - m0 : ROWS_PER_PASS;
            const float *x = p->x + m0 * p->k;
            float *y = p->y + m0 * p->n + n;
            switch (rows) {
                case 1: dot_rows_1(p, row, x, y); break;
                case 2: dot_rows_2(p, row, x, y); break;
                case 3: dot_rows_3(p, row, x, y); break;
                case 4: dot_rows_4(p, row, x, y); break;
                case 5: dot_rows_5(p, row, x, y); break;
                case 6: dot_rows_6(p, row, x, y); break;
                case 7: dot_rows_7(p, row, x, y); break;
                default: dot_rows_8(p, row, x, y); break;
            }
            if (p->bias)
                for (int64_t r = 0; r < rows; r++) y[r * p->n] += p->bias[n];
        }
    }
}

/* ---------- AVX2 path ---------- */

AVX2 static inline __m256 load8_w(const void *w, int64_t at, int bf16) {
    if (bf16) {
        __m128i raw = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + at));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
    }
    return _mm256_loadu_ps((const float *)w + at);
}

/* The first n < 8 elements at `at`, zeros after (copied: no load past the buffer). */
AVX2 static inline __m256 load8_part(const void *src, int64_t at, int64_t n, int bf16) {
    if (bf16) {
        uint16_t part[8] = {0};
        memcpy(part, (const uint16_t *)src + at, (size_t)n * 2);
        return load8_w(part, 0, 1);
    }
    float part[8] = {0};
    memcpy(part, (const float *)src + at, (size_t)n * 4);
    return _mm256_loadu_ps(part);
}

#define ROWS_PER_PASS_AVX2 6 /* 2 accumulators a row + 2 weight vectors: 14 of the 16 registers */

/* As DOT_ROWS with 8-float vectors: even accumulates elements j..j+7 of each 16-float pair, odd
 * j+8..j+15, a tail of 8-float blocks (the last one partial) goes to even. */
#define DOT8_ROWS(ROWS)                                                                                    \
    AVX2 static void dot8_rows_##ROWS(const Linear *p, int64_t row, const float *x, float *y) {             \
        const int64_t k = p->k;                                                                               \
        __m256 even[ROWS], odd[ROWS];                                                                         \
        for (int r = 0; r < ROWS; r++) even[r] = odd[r] = _mm256_setzero_ps();                                \
        int64_t j = 0;                                                                                        \
        for (; j + 16 <= k; j += 16) {                                                                        \
            _mm_prefetch((const char *)p->w + (row + j) * (p->bf16 ? 2 : 4) + PREFETCH_BYTES, _MM_HINT_T1);    \
            __m256 w0 = load8_w(p->w, row + j, p->bf16), w1 = load8_w(p->w, row + j + 8, p->bf16);            \
            for (int r = 0; r < ROWS; r++) {                                                                  \
                even[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * k + j), even[r]);                       \
                odd[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + r * k + j + 8), odd[r]);                     \
            }                                                                                                 \
        }                                                                                                     \
        for (; j < k; j += 8) {                                                                               \
            int64_t n = k - j < 8 ? k - j : 8;                                                                \
            __m256 w0 = n == 8 ? load8_w(p->w, row + j, p->bf16) : load8_part(p->w, row + j, n, p->bf16);    \
            for (int r = 0; r < ROWS; r++)                                                                    \
                even[r] = _mm256_fmadd_ps(w0, n == 8 ? _mm256_loadu_ps(x + r * k + j) : load8_part(x + r * k, j, n, 0), even[r]); \
        }                                                                                                     \
        for (int r = 0; r < ROWS; r++) y[r * p->n] = hsum8(_mm256_add_ps(even[r], odd[r]));                 \
    }
DOT8_ROWS(1)
DOT8_ROWS(2)
DOT8_ROWS(3)
DOT8_ROWS(4)
DOT8_ROWS(5)
DOT8_ROWS(6)

AVX2 static void rows_avx2(const Linear *p, int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; n++) {
        int64_t row = n * p->k;
        for (int64_t m0 = 0; m0 < p->m; m0 += ROWS_PER_PASS_AVX2) {
            int64_t rows = p->m - m0 < ROWS_PER_PASS_AVX2 ? p->m - m0 : ROWS_PER_PASS_AVX2;
            const float *x = p->x + m0 * p->k;
            float *y = p->y + m0 * p->n + n;
            switch (rows) {
                case 1: dot8_rows_1(p, row, x, y); break;
                case 2: dot8_rows_2(p, row, x, y); break;
                case 3: dot8_rows_3(p, row, x, y); break;
                case 4: dot8_rows_4(p, row, x, y); break;
                case 5: dot8_rows_5(p, row, x, y); break;
                default: dot8_rows_6(p, row, x, y); break;
            }
            if (p->bias)
                for (int64_t r = 0; r < rows; r++) y[r * p->n] += p->bias[n];
        }
    }
}

static int best_path(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") ? PATH_AVX512 : cpu_has_avx2() ? PATH_AVX2 : PATH_SCALAR;
}
#else
static int best_path(void) { return PATH_SCALAR; }
#endif

static void rows(const Linear *p, int64_t n0, int64_t n1, int path) {
#ifdef HAVE_X86
    if (path == PATH_AVX512) { rows_avx512(p, n0, n1); return; }
    if (path == PATH_AVX2) { rows_avx2(p, n0, n1); return; }
#endif
    (void)path;
    rows_scalar(p, n0, n1);
}

static void linear(const Linear *p, int threads, int path) {
#ifdef _OPENMP
    if (threads > 1) {
        int64_t blocks = (p->n + 15) / 16; /* 16 outputs a block: threads never share a cache line of y */
#pragma omp parallel num_threads(threads)
        {
            int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
            int64_t n0 = blocks * t / nt * 16, n1 = blocks * (t + 1) / nt * 16;
            if (n1 > p->n) n1 = p->n;
            if (n0 < n1) rows(p, n0, n1, path);
        }
        return;
    }
#endif
    (void)threads;
    rows(p, 0, p->n, path);
}

static PyObject *py_linear(PyObject *self, PyObject *args) {
    unsigned long long x, w, bias, y;
    long long m, k, n;
    int bf16, threads, cap;
    if (!PyArg_ParseTuple(args, "KKKKLLLpii", &x, &w, &bias, &y, &m, &k, &n, &bf16, &threads, &cap)) return NULL;
    if (m < 0 || k < 0 || n < 0) {
        PyErr_Format(PyExc_ValueError, "dense linear: bad sizes m=%lld k=%lld n=%lld", m, k, n);
        return NULL;
    }
    Linear p = {(const float *)(uintptr_t)x, (const void *)(uintptr_t)w, (const float *)(uintptr_t)bias, (float *)(uintptr_t)y, m, k, n, bf16};
    int path = pick_path(best_path(), cap);
    Py_BEGIN_ALLOW_THREADS
    linear(&p, threads, path);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_isa(PyObject *self, PyObject *noargs) { return path_name(best_path()); }

static PyObject *py_paths(PyObject *self, PyObject *noargs) { return path_tuple(best_path()); }

static PyMethodDef methods[] = {
    {"linear", py_linear, METH_VARARGS,
     "linear(x, w, bias, y, m, k, n, bf16, threads, cap) -> None: y (m, n) = x (m, k) W^T (+ bias); "
     "addresses of contiguous CPU buffers (bias 0 for none); the best path this CPU runs, at most cap (0 scalar, 1 avx2, 2 avx512)"},
    {"isa", py_isa, METH_NOARGS, "the best instruction path linear takes on this CPU: 'avx512', 'avx2' or 'scalar'"},
    {"paths", py_paths, METH_NOARGS, "every instruction path this CPU runs, best first"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_dense_cpu", "Dense linear for a few rows on the CPU (see compute_kernels/dense_cpu.py)",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__dense_cpu(void) { return PyModule_Create(&module); }
