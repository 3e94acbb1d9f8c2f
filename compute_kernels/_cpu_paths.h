/* The instruction paths of the CPU kernels (_dense_cpu.c, _macko_cpu.c, _sparse_ffn_cpu.c).
 *
 * Each kernel has up to three paths, picked at run time: AVX-512, AVX2 (with FMA and F16C: every
 * x86-64 CPU since ~2013-2015, e.g. AMD Zen 1-3, Intel Haswell on) and portable scalar C. A call
 * takes the best path its CPU runs, capped by the caller's `cap` (the Python wrappers' `path=`),
 * so a test can run every path the CPU has. Each path's summation order is fixed (it depends on
 * neither the number of input rows nor the thread count); two paths agree up to rounding.
 */
#ifndef PARETOLAB_CPU_PATHS_H
#define PARETOLAB_CPU_PATHS_H

#include <Python.h>

#define PATH_SCALAR 0
#define PATH_AVX2 1
#define PATH_AVX512 2

static const char *const path_names[] = {"scalar", "avx2", "avx512"};

#if defined(__x86_64__) || defined(_M_X64)
#define AVX2 __attribute__((target("avx2,fma,f16c")))
static int cpu_has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

#include <immintrin.h>

/* The sum of 8 lanes in one fixed order (the AVX2 paths' final reduction). */
AVX2 static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#else
static int cpu_has_avx2(void) { return 0; }
#endif

/* The path a call takes: the best this CPU runs (`best`), at most `cap`. */
static inline int pick_path(int best, int cap) { return cap < best ? (cap < 0 ? 0 : cap) : best; }

/* isa(): the best path's name; paths(): every path this CPU runs, best first. */
static PyObject *path_name(int best) { return PyUnicode_FromString(path_names[best]); }

static PyObject *path_tuple(int best) {
    PyObject *out = PyTuple_New(best + 1);
    if (!out) return NULL;
    for (int i = best; i >= 0; i--) {
        PyObject *name = PyUnicode_FromString(path_names[i]);
        if (!name) { Py_DECREF(out); return NULL; }
        PyTuple_SET_ITEM(out, best - i, name);
    }
    return out;
}

#endif
