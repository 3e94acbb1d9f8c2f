/* The one-token FFN of a ReLU-gated GLU on the CPU, reading only the weights of active units.
 *
 *   out = down(h),  h_i = act(gate_i . x) * (up_i . x),  act = relu or relu^2
 *
 * gate (I, H), up (I, H) and down_t (I, H) = down_proj's weight transposed, all fp32 row-major;
 * x (H,) and out (H,) fp32. Phase 1 computes every gate row (the only weights read in full:
 * which units are active is not known before), and for an active unit (act != 0) its up row;
 * phase 2 adds h_i * down_t[i] for the units with h_i != 0, so down_proj is read only for them.
 * Bytes read: I*H*4 for gate plus 2*k*H*4 for k active units, against 3*I*H*4 dense.
 *
 * Threads (OpenMP, torch's own libgomp.so.1): phase 1 splits the units, phase 2 the columns of
 * out; a unit's dot products and a column's sum over units (in unit order) are done by one
 * thread, so the result is bit-identical for any thread count. Three paths picked at run time
 * (_cpu_paths.h): AVX-512, AVX2 + FMA, portable scalar C. Software prefetch (a hint, into L2)
 * keeps the weights' streams ahead of the sums: the gate 6 KB ahead, each active unit's up and
 * down rows while the previous unit is summed. The Python wrapper
 * (kernels/sparse_ffn_cpu.py) checks dtypes, shapes and contiguity and passes raw addresses.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define HAVE_X86 1
#endif
#include "_cpu_paths.h"

#define PREFETCH_BYTES 6144 /* how far ahead the gate stream is asked for (as the dense kernel) */

typedef struct {
    const float *x, *gate, *up, *down_t;
    float *out, *h;
    int64_t hidden, units;
    int relu2;
} Ffn;

static inline float activate(float g, int relu2) {
    float a = g > 0.0f ? g : (g == g ? 0.0f : g); /* relu; nan stays nan, as in torch */
    return relu2 ? a * a : a;
}

/* ---------- portable path ---------- */

static float dot_scalar(const float *a, const float *b, int64_t n) {
    float s = 0.0f;
    for (int64_t j = 0; j < n; j++) s += a[j] * b[j];
    return s;
}

static void axpy_scalar(float *out, const float *w, float h, int64_t n) {
    for (int64_t j = 0; j < n; j++) out[j] += h * w[j];
}

/* ---------- AVX-512 path ---------- */
#ifdef HAVE_X86
#define AVX512 __attribute__((target("avx512f")))

AVX512 static float dot_avx512(const float *a, const float *b, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 64 <= n; j += 64) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + j), _mm512_loadu_ps(b + j), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + j + 16), _mm512_loadu_ps(b + j + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + j + 32), _mm512_loadu_ps(b + j + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + j + 48), _mm512_loadu_ps(b + j + 48), s3);
    }
    for (; j < n; j += 16) {
        __mmask16 m = n - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - j)) - 1);
        s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + j), _mm512_maskz_loadu_ps(m, b + j), s0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

AVX512 static void axpy_avx512(float *out, const float *w, float h, int64_t n) {
    __m512 hv = _mm512_set1_ps(h);
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = n - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - j)) - 1);
        _mm512_mask_storeu_ps(out + j, m, _mm512_fmadd_ps(hv, _mm512_maskz_loadu_ps(m, w + j), _mm512_maskz_loadu_ps(m, out + j)));
    }
}

/* ---------- AVX2 path ---------- */

/* The first n < 8 floats at a, zeros after (copied: no load past the buffer). */
AVX2 static inline __m256 load8_part(const float *a, int64_t n) {
    float part[8] = {0};
    memcpy(part, a, (size_t)n * sizeof(float));
    return _mm256_loadu_ps(part);
}

AVX2 static float dot_avx2(const float *a, const float *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j + 8), _mm256_loadu_ps(b + j + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j + 16), _mm256_loadu_ps(b + j + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j + 24), _mm256_loadu_ps(b + j + 24), s3);
    }
    for (; j < n; j += 8) {
        int64_t m = n - j < 8 ? n - j : 8;
        s0 = _mm256_fmadd_ps(m == 8 ? _mm256_loadu_ps(a + j) : load8_part(a + j, m), m == 8 ? _mm256_loadu_ps(b + j) : load8_part(b + j, m), s0);
    }
    return hsum8(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}

AVX2 static void axpy_avx2(float *out, const float *w, float h, int64_t n) {
    __m256 hv = _mm256_set1_ps(h);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(out + j, _mm256_fmadd_ps(hv, _mm256_loadu_ps(w + j), _mm256_loadu_ps(out + j)));
    for (; j < n; j++) out[j] = fmaf(h, w[j], out[j]); /* one rounding, as the vector FMA */
}

static int best_path(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") ? PATH_AVX512 : cpu_has_avx2() ? PATH_AVX2 : PATH_SCALAR;
}
#else
static int best_path(void) { return PATH_SCALAR; }
#endif

static float dot(const float *a, const float *b, int64_t n, int path) {
#ifdef HAVE_X86
    if (path == PATH_AVX512) return dot_avx512(a, b, n);
    if (path == PATH_AVX2) return dot_avx2(a, b, n);
#endif
    return dot_scalar(a, b, n);
}

static void axpy(float *out, const float *w, float h, int64_t n, int path) {
#ifdef HAVE_X86
    if (path == PATH_AVX512) { axpy_avx512(out, w, h, n); return; }
    if (path == PATH_AVX2) { axpy_avx2(out, w, h, n); return; }
#endif
    axpy_scalar(out, w, h, n);
}

/* Ask for the lines of `bytes` bytes at `at` into L2 (a hint: never faults, changes no result). */
static inline void prefetch_span(const void *at, int64_t bytes) {
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch((const char *)at + b, 0, 2);
}

/* The first unit at or after i with h != 0 (or `end`). */
static inline int64_t first_active(const float *h, int64_t i, int64_t end) {
    for (; i < end && h[i] == 0.0f; i++) {}
    return i;
}

/* Phase 1 for units [u0, u1): h_i, and the count of active units. First every gate row, in order,
 * its lines asked for PREFETCH_BYTES ahead (one stream: the rows are contiguous); then the up rows
 * of the active units, each asked for while the previous one is summed (which rows are needed is
 * known only now, so the hardware prefetcher cannot guess them). */
static int64_t hidden_units(const Ffn *p, int64_t u0, int64_t u1, int path) {
    const int64_t row_bytes = p->hidden * (int64_t)sizeof(float);
    int64_t active = 0;
    for (int64_t i = u0; i < u1; i++) {
        prefetch_span((const char *)(p->gate + i * p->hidden) + PREFETCH_BYTES, row_bytes);
        p->h[i] = activate(dot(p->gate + i * p->hidden, p->x, p->hidden, path), p->relu2);
    }
    int64_t i = first_active(p->h, u0, u1);
    if (i < u1) prefetch_span(p->up + i * p->hidden, row_bytes);
    while (i < u1) {
        int64_t next = first_active(p->h, i + 1, u1);
        if (next < u1) prefetch_span(p->up + next * p->hidden, row_bytes);
        p->h[i] *= dot(p->up + i * p->hidden, p->x, p->hidden, path);
        active++;
        i = next;
    }
    return active;
}

/* Phase 2 for columns [c0, c1) of out: the sum over units with h != 0, in unit order; the next
 * active unit's part of down_t asked for while this one is added. */
static void down_columns(const Ffn *p, int64_t c0, int64_t c1, int path) {
    const int64_t span = (c1 - c0) * (int64_t)sizeof(float);
    memset(p->out + c0, 0, (size_t)(c1 - c0) * sizeof(float));
    int64_t i = first_active(p->h, 0, p->units);
    while (i < p->units) {
        int64_t next = first_active(p->h, i + 1, p->units);
        if (next < p->units) prefetch_span(p->down_t + next * p->hidden + c0, span);
        axpy(p->out + c0, p->down_t + i * p->hidden + c0, p->h[i], c1 - c0, path);
        i = next;
    }
}

static int64_t ffn(const Ffn *p, int threads, int path) {
    int64_t active = 0;
#ifdef _OPENMP
    if (threads > 1) {
#pragma omp parallel num_threads(threads) reduction(+ : active)
        {
            int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
            active += hidden_units(p, p->units * t / n, p->units * (t + 1) / n, path);
#pragma omp barrier
            int64_t blocks = (p->hidden + 15) / 16; /* columns in 64-byte blocks: no two threads share a cache line */
            int64_t c0 = blocks * t / n * 16, c1 = blocks * (t + 1) / n * 16;
            if (c1 > p->hidden) c1 = p->hidden;
            if (c0 < c1) down_columns(p, c0, c1, path);
        }
        return active;
    }
#endif
    (void)threads;
    active = hidden_units(p, 0, p->units, path);
    down_columns(p, 0, p->hidden, path);
    return active;
}

static PyObject *py_ffn(PyObject *self, PyObject *args) {
    unsigned long long x, gate, up, down_t, out;
    long long hidden, units;
    int relu2, threads, cap;
    if (!PyArg_ParseTuple(args, "KKKKKLLpii", &x, &gate, &up, &down_t, &out, &hidden, &units, &relu2, &threads, &cap))
        return NULL;
    if (hidden < 0 || units < 0) {
        PyErr_Format(PyExc_ValueError, "sparse ffn: bad sizes hidden=%lld units=%lld", hidden, units);
        return NULL;
    }
    float *h = PyMem_RawMalloc((size_t)(units > 0 ? units : 1) * sizeof(float));
    if (!h) return PyErr_NoMemory();
    Ffn p = {(const float *)(uintptr_t)x, (const float *)(uintptr_t)gate, (const float *)(uintptr_t)up,
             (const float *)(uintptr_t)down_t, (float *)(uintptr_t)out, h, hidden, units, relu2};
    int64_t active;
    int path = pick_path(best_path(), cap);
    Py_BEGIN_ALLOW_THREADS
    active = ffn(&p, threads, path);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(h);
    return PyLong_FromLongLong(active);
}

static PyObject *py_isa(PyObject *self, PyObject *noargs) { return path_name(best_path()); }

static PyObject *py_paths(PyObject *self, PyObject *noargs) { return path_tuple(best_path()); }

static PyMethodDef methods[] = {
    {"ffn", py_ffn, METH_VARARGS,
     "ffn(x, gate, up, down_t, out, hidden, units, relu2, threads, cap) -> active units "
     "(addresses of contiguous fp32 CPU buffers; out (hidden,) is written; the best path at most cap: 0 scalar, 1 avx2, 2 avx512)"},
    {"isa", py_isa, METH_NOARGS, "the best instruction path ffn takes on this CPU: 'avx512', 'avx2' or 'scalar'"},
    {"paths", py_paths, METH_NOARGS, "every instruction path this CPU runs, best first"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sparse_ffn_cpu", "ReLU-gated one-token FFN on the CPU (see kernels/sparse_ffn_cpu.py)",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__sparse_ffn_cpu(void) { return PyModule_Create(&module); }
