/* The non-linear work of a Llama decoder layer for a few tokens on the CPU, one call each.
 *
 * At batch 1 a decoding step of SmolLM2-135M spends ~7 ms outside its linears: ~40 small torch
 * operations a layer (RMSNorm alone is 6, rotary 14), each a few microseconds of dispatch for a
 * few hundred floats. These four functions do the same arithmetic in one call each:
 *
 *   rms_norm(x, w, y, rows, dim, eps)         y = w * (x * (1 / sqrt(mean(x^2) + eps)))   (transformers' LlamaRMSNorm)
 *   rotary(t, cos, sin, rows, heads, dim)      t = t * cos + rotate_half(t) * sin, in place  (apply_rotary_pos_emb)
 *   attention(q, k, v, out, ...)               softmax(q k^T * scale) v over the cache, grouped heads, causal or a tree mask;
 *                                              optionally first rotary on q and the block's keys, which it writes into the cache
 *   silu_mul(g, u, out, n)                     out = silu(g) * u                              (LlamaMLP's act_fn(gate) * up)
 *
 * All fp32, row-major. Rotary is bit-identical to transformers' (this file is compiled with
 * -ffp-contract=off: every product is rounded before its sum, as torch's separate mul and add
 * are); the others agree up to rounding (their sums run in another order, exp is a polynomial).
 * Every row's result depends only on that row and the keys it sees, visited in position order,
 * so a token computed alone or inside a verify block of several gets the same bits: what a
 * speculative verify needs to reproduce one-token greedy decoding exactly.
 *
 * Two paths, picked at run time (_cpu_paths.h): AVX-512 and portable scalar C (the reference
 * the tests hold the AVX-512 path to). The Python side (compute_kernels/lean_cpu.py) checks
 * dtypes, shapes and contiguity and takes these only where the AVX-512 path runs: on a CPU
 * without it the scalar loops would be slower than torch's vectorised operations.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define HAVE_X86 1
#endif
#include "_cpu_paths.h"

/* ---------- scalar path ---------- */

static void rms_norm_scalar(const float *x, const float *w, float *y, int64_t rows, int64_t dim, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * dim;
        float sum = 0.0f;
        for (int64_t i = 0; i < dim; i++) sum += xr[i] * xr[i];
        float inv = 1.0f / sqrtf(sum / (float)dim + eps);
        for (int64_t i = 0; i < dim; i++) y[r * dim + i] = w[i] * (xr[i] * inv);
    }
}

static void rotary_scalar(float *t, const float *cos_, const float *sin_, int64_t rows, int64_t heads, int64_t dim) {
    int64_t half = dim / 2;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t h = 0; h < heads; h++) {
            float *v = t + (r * heads + h) * dim;
            const float *c = cos_ + r * dim, *s = sin_ + r * dim;
            for (int64_t i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a * c[i] + (-b) * s[i];
                v[i + half] = b * c[i + half] + a * s[i + half];
            }
        }
}

static void silu_mul_scalar(const float *g, const float *u, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* ---------- attention (both paths share the driver) ---------- */

typedef struct {
    const float *q;         /* (T, heads * dim) */
    const float *k, *v;     /* (kv_heads, k_stride) each: position p of kv head g at g * k_stride + p * dim */
    float *out;             /* (T, heads * dim) */
    const uint8_t *mask;    /* (T, T) which block rows each row sees, or NULL: causal */
    int64_t tokens, heads, kv_heads, dim, past, k_stride;
    float scale;
} Attention;

/* Positions row t sees, in increasing order: the whole past, then the block rows its mask allows. */
static int64_t visible(const Attention *a, int64_t t, int64_t *pos) {
    int64_t n = 0;
    for (int64_t p = 0; p < a->past; p++) pos[n++] = p;
    for (int64_t u = 0; u < a->tokens; u++)
        if (a->mask ? a->mask[t * a->tokens + u] != 0 : u <= t) pos[n++] = a->past + u;
    return n;
}

static void attention_scalar(const Attention *a, int64_t *pos, float *score) {
    int64_t group = a->heads / a->kv_heads, dim = a->dim;
    for (int64_t t = 0; t < a->tokens; t++) {
        int64_t n = visible(a, t, pos);
        for (int64_t h = 0; h < a->heads; h++) {
            const float *q = a->q + (t * a->heads + h) * dim;
            const float *k = a->k + (h / group) * a->k_stride, *v = a->v + (h / group) * a->k_stride;
            float *o = a->out + (t * a->heads + h) * dim;
            float top = -INFINITY, sum = 0.0f;
            for (int64_t j = 0; j < n; j++) {
                float s = 0.0f;
                for (int64_t i = 0; i < dim; i++) s += q[i] * k[pos[j] * dim + i];
                score[j] = s * a->scale;
                if (score[j] > top) top = score[j];
            }
            for (int64_t i = 0; i < dim; i++) o[i] = 0.0f;
            for (int64_t j = 0; j < n; j++) {
                float e = expf(score[j] - top);
                sum += e;
                for (int64_t i = 0; i < dim; i++) o[i] += e * v[pos[j] * dim + i];
            }
            for (int64_t i = 0; i < dim; i++) o[i] /= sum;
        }
    }
}

/* ---------- AVX-512 path ---------- */
#ifdef HAVE_X86
#define AVX512 __attribute__((target("avx512f")))

/* e^x for 16 lanes: 2^n e^r with n = round(x / ln 2), |r| <= ln 2 / 2, e^r by Cephes' degree-6
 * polynomial (~1 ulp); below -103 the scaling underflows to 0. */
AVX512 static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.7228f)), _mm512_set1_ps(-103.9721f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* -x, flipping the sign bit (avx512f alone has no float xor) */
AVX512 static inline __m512 negate(__m512 x) {
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u)));
}

static inline __mmask16 tail_mask(int64_t left) { return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1); }

AVX512 static void rms_norm_avx512(const float *x, const float *w, float *y, int64_t rows, int64_t dim, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * dim;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t i = 0; i < dim; i += 16) {
            __m512 v = _mm512_maskz_loadu_ps(tail_mask(dim - i), xr + i);
            acc = _mm512_fmadd_ps(v, v, acc);
        }
        __m512 inv = _mm512_set1_ps(1.0f / sqrtf(_mm512_reduce_add_ps(acc) / (float)dim + eps));
        for (int64_t i = 0; i < dim; i += 16) {
            __mmask16 m = tail_mask(dim - i);
            __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + i), inv);
            _mm512_mask_storeu_ps(y + r * dim + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + i), v));
        }
    }
}

AVX512 static void rotary_avx512(float *t, const float *cos_, const float *sin_, int64_t rows, int64_t heads, int64_t dim) {
    int64_t half = dim / 2;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t h = 0; h < heads; h++) {
            float *v = t + (r * heads + h) * dim;
            const float *c = cos_ + r * dim, *s = sin_ + r * dim;
            for (int64_t i = 0; i < half; i += 16) {
                __mmask16 m = tail_mask(half - i);
                __m512 a = _mm512_maskz_loadu_ps(m, v + i), b = _mm512_maskz_loadu_ps(m, v + half + i);
                __m512 lo = _mm512_add_ps(_mm512_mul_ps(a, _mm512_maskz_loadu_ps(m, c + i)),
                                          _mm512_mul_ps(negate(b), _mm512_maskz_loadu_ps(m, s + i)));
                __m512 hi = _mm512_add_ps(_mm512_mul_ps(b, _mm512_maskz_loadu_ps(m, c + half + i)),
                                          _mm512_mul_ps(a, _mm512_maskz_loadu_ps(m, s + half + i)));
                _mm512_mask_storeu_ps(v + i, m, lo);
                _mm512_mask_storeu_ps(v + half + i, m, hi);
            }
        }
}

AVX512 static void silu_mul_avx512(const float *g, const float *u, float *out, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 x = _mm512_maskz_loadu_ps(m, g + i);
        __m512 silu = _mm512_div_ps(x, _mm512_add_ps(one, exp16(negate(x))));
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(m, u + i)));
    }
}

/* q . k over dim (a multiple of 16: checked by the caller), one accumulator, then one fixed reduction. */
AVX512 static inline float dot16(const float *q, const float *k, int64_t dim) {
    __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(q), _mm512_loadu_ps(k));
    for (int64_t i = 16; i < dim; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), _mm512_loadu_ps(k + i), acc);
    return _mm512_reduce_add_ps(acc);
}

#define MAX_DIM 256 /* head dims the AVX-512 path keeps in registers (4..16 vectors); larger take the scalar path */

AVX512 static void attention_avx512(const Attention *a, int64_t *pos, float *score) {
    int64_t group = a->heads / a->kv_heads, dim = a->dim, vecs = dim / 16;
    for (int64_t t = 0; t < a->tokens; t++) {
        int64_t n = visible(a, t, pos);
        for (int64_t h = 0; h < a->heads; h++) {
            const float *q = a->q + (t * a->heads + h) * dim;
            const float *k = a->k + (h / group) * a->k_stride, *v = a->v + (h / group) * a->k_stride;
            float top = -INFINITY;
            for (int64_t j = 0; j < n; j++) {
                score[j] = dot16(q, k + pos[j] * dim, dim) * a->scale;
                if (score[j] > top) top = score[j];
            }
            __m512 sums = _mm512_setzero_ps(), topv = _mm512_set1_ps(top);
            for (int64_t j = 0; j < n; j += 16) {
                __mmask16 m = tail_mask(n - j);
                __m512 e = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, score + j), topv)));
                _mm512_mask_storeu_ps(score + j, m, e);
                sums = _mm512_add_ps(sums, e);
            }
            __m512 o[MAX_DIM / 16];
            for (int64_t i = 0; i < vecs; i++) o[i] = _mm512_setzero_ps();
            for (int64_t j = 0; j < n; j++) {
                __m512 e = _mm512_set1_ps(score[j]);
                const float *vj = v + pos[j] * dim;
                for (int64_t i = 0; i < vecs; i++) o[i] = _mm512_fmadd_ps(e, _mm512_loadu_ps(vj + 16 * i), o[i]);
            }
            __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sums));
            float *out = a->out + (t * a->heads + h) * dim;
            for (int64_t i = 0; i < vecs; i++) _mm512_storeu_ps(out + 16 * i, _mm512_mul_ps(o[i], inv));
        }
    }
}

static int best_path(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") ? PATH_AVX512 : PATH_SCALAR;
}
#else
static int best_path(void) { return PATH_SCALAR; }
#endif

/* ---------- Python entry points (addresses of contiguous fp32 CPU buffers; lean_cpu.py checks them) ---------- */

static PyObject *py_rms_norm(PyObject *self, PyObject *args) {
    unsigned long long x, w, y;
    long long rows, dim;
    float eps;
    int cap;
    if (!PyArg_ParseTuple(args, "KKKLLfi", &x, &w, &y, &rows, &dim, &eps, &cap)) return NULL;
#ifdef HAVE_X86
    if (pick_path(best_path(), cap) == PATH_AVX512) {
        rms_norm_avx512((const float *)(uintptr_t)x, (const float *)(uintptr_t)w, (float *)(uintptr_t)y, rows, dim, eps);
        Py_RETURN_NONE;
    }
#endif
    rms_norm_scalar((const float *)(uintptr_t)x, (const float *)(uintptr_t)w, (float *)(uintptr_t)y, rows, dim, eps);
    Py_RETURN_NONE;
}

static PyObject *py_rotary(PyObject *self, PyObject *args) {
    unsigned long long t, c, s;
    long long rows, heads, dim;
    int cap;
    if (!PyArg_ParseTuple(args, "KKKLLLi", &t, &c, &s, &rows, &heads, &dim, &cap)) return NULL;
#ifdef HAVE_X86
    if (pick_path(best_path(), cap) == PATH_AVX512) {
        rotary_avx512((float *)(uintptr_t)t, (const float *)(uintptr_t)c, (const float *)(uintptr_t)s, rows, heads, dim);
        Py_RETURN_NONE;
    }
#endif
    rotary_scalar((float *)(uintptr_t)t, (const float *)(uintptr_t)c, (const float *)(uintptr_t)s, rows, heads, dim);
    Py_RETURN_NONE;
}

static PyObject *py_silu_mul(PyObject *self, PyObject *args) {
    unsigned long long g, u, out;
    long long n;
    int cap;
    if (!PyArg_ParseTuple(args, "KKKLi", &g, &u, &out, &n, &cap)) return NULL;
#ifdef HAVE_X86
    if (pick_path(best_path(), cap) == PATH_AVX512) {
        silu_mul_avx512((const float *)(uintptr_t)g, (const float *)(uintptr_t)u, (float *)(uintptr_t)out, n);
        Py_RETURN_NONE;
    }
#endif
    silu_mul_scalar((const float *)(uintptr_t)g, (const float *)(uintptr_t)u, (float *)(uintptr_t)out, n);
    Py_RETURN_NONE;
}

/* The cache's rows past .. past + T - 1 of every kv head from a projection's (T, kv_heads * dim) output. */
static void write_rows(float *buf, const float *rows, int64_t tokens, int64_t kv_heads, int64_t dim, int64_t past, int64_t stride) {
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t g = 0; g < kv_heads; g++)
            memcpy(buf + g * stride + (past + t) * dim, rows + (t * kv_heads + g) * dim, (size_t)dim * sizeof(float));
}

static PyObject *py_attention(PyObject *self, PyObject *args) {
    unsigned long long q, k, v, out, mask, new_k = 0, new_v = 0, cos_ = 0, sin_ = 0;
    long long tokens, heads, kv_heads, dim, past, k_stride;
    float scale;
    int cap;
    if (!PyArg_ParseTuple(args, "KKKKKLLLLLLfi|KKKK", &q, &k, &v, &out, &mask, &tokens, &heads, &kv_heads, &dim, &past, &k_stride,
                          &scale, &cap, &new_k, &new_v, &cos_, &sin_))
        return NULL;
    if (tokens < 1 || kv_heads < 1 || heads % kv_heads || dim < 1 || past < 0 || k_stride < (past + tokens) * dim) {
        PyErr_Format(PyExc_ValueError, "lean attention: bad sizes tokens=%lld heads=%lld kv_heads=%lld dim=%lld past=%lld k_stride=%lld",
                     tokens, heads, kv_heads, dim, past, k_stride);
        return NULL;
    }
    Attention a = {(const float *)(uintptr_t)q, (const float *)(uintptr_t)k, (const float *)(uintptr_t)v, (float *)(uintptr_t)out,
                   (const uint8_t *)(uintptr_t)mask, tokens, heads, kv_heads, dim, past, k_stride, scale};
    int64_t n = past + tokens + 16; /* + a vector's worth: the AVX-512 softmax runs over whole vectors */
    int64_t *pos = PyMem_RawMalloc((size_t)n * sizeof(int64_t));
    float *score = PyMem_RawMalloc((size_t)n * sizeof(float));
    if (!pos || !score) {
        PyMem_RawFree(pos);
        PyMem_RawFree(score);
        return PyErr_NoMemory();
    }
    int path = pick_path(best_path(), cap);
    Py_BEGIN_ALLOW_THREADS
    if (new_k && new_v) { /* the block's own keys and values: rotary on q and k (with cos/sin), then into the cache */
        if (cos_ && sin_) {
#ifdef HAVE_X86
            if (path == PATH_AVX512) {
                rotary_avx512((float *)(uintptr_t)q, (const float *)(uintptr_t)cos_, (const float *)(uintptr_t)sin_, tokens, heads, dim);
                rotary_avx512((float *)(uintptr_t)new_k, (const float *)(uintptr_t)cos_, (const float *)(uintptr_t)sin_, tokens, kv_heads, dim);
            } else
#endif
            {
                rotary_scalar((float *)(uintptr_t)q, (const float *)(uintptr_t)cos_, (const float *)(uintptr_t)sin_, tokens, heads, dim);
                rotary_scalar((float *)(uintptr_t)new_k, (const float *)(uintptr_t)cos_, (const float *)(uintptr_t)sin_, tokens, kv_heads, dim);
            }
        }
        write_rows((float *)(uintptr_t)k, (const float *)(uintptr_t)new_k, tokens, kv_heads, dim, past, k_stride);
        write_rows((float *)(uintptr_t)v, (const float *)(uintptr_t)new_v, tokens, kv_heads, dim, past, k_stride);
    }
#ifdef HAVE_X86
    if (path == PATH_AVX512 && dim % 16 == 0 && dim <= MAX_DIM) attention_avx512(&a, pos, score);
    else
#endif
        attention_scalar(&a, pos, score);
    Py_END_ALLOW_THREADS
    (void)path;
    PyMem_RawFree(pos);
    PyMem_RawFree(score);
    Py_RETURN_NONE;
}

static PyObject *py_isa(PyObject *self, PyObject *noargs) {
    (void)path_tuple; /* the shared header's helpers this kernel has no use for */
    (void)cpu_has_avx2;
    return path_name(best_path());
}

static PyObject *py_paths(PyObject *self, PyObject *noargs) { /* no AVX2 path here: avx512 and scalar */
    return best_path() == PATH_AVX512 ? Py_BuildValue("(ss)", "avx512", "scalar") : Py_BuildValue("(s)", "scalar");
}

static PyMethodDef methods[] = {
    {"rms_norm", py_rms_norm, METH_VARARGS, "rms_norm(x, w, y, rows, dim, eps, cap): y = w * (x / sqrt(mean(x^2) + eps)) per row"},
    {"rotary", py_rotary, METH_VARARGS, "rotary(t, cos, sin, rows, heads, dim, cap): t = t * cos + rotate_half(t) * sin, in place"},
    {"silu_mul", py_silu_mul, METH_VARARGS, "silu_mul(g, u, out, n, cap): out = silu(g) * u"},
    {"attention", py_attention, METH_VARARGS,
     "attention(q, k, v, out, mask, tokens, heads, kv_heads, dim, past, k_stride, scale, cap[, new_k, new_v, cos, sin]): "
     "softmax(q k^T * scale) v, each row over the past and the block rows its mask allows (mask 0: causal); with new_k and "
     "new_v (T, kv_heads * dim) the block's keys and values are first written into the cache k, v (rotated with q by cos, sin "
     "where given)"},
    {"isa", py_isa, METH_NOARGS, "the best instruction path on this CPU: 'avx512' or 'scalar'"},
    {"paths", py_paths, METH_NOARGS, "every instruction path this CPU runs, best first"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_lean_cpu", "A decoder layer's non-linear work on the CPU (see compute_kernels/lean_cpu.py)",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__lean_cpu(void) { return PyModule_Create(&module); }
