/* Compiled host loops of the fast backend on CPU tensors (see dartree/native.py, the only caller).
 *
 * A draft tree has tens to hundreds of nodes: on one CPU thread the numpy / torch versions of these
 * loops cost a few microseconds per call, dozens of calls per depth.  Each of the module's five functions
 * (candidates, depth_step, bound_frontier, select_tree, best_first: each described above its wrapper, and in
 * docs/kernels.md, "How the CPU path is made fast"; bound_frontier in docs/builders.md, "Bound pruning") is one
 * call that reads numpy buffers and writes
 * preallocated numpy outputs, with the same results bit for bit.
 *
 * Float rules: every float32 result is computed with the same IEEE operations, in the same order, as
 * the numpy / torch formula it replaces (scores: float32 additions; log q: float64 with numpy's pairwise
 * sum and logaddexp, rounded once).  Build with -ffp-contract=off so that no a*b+c becomes an fma.
 * Buffers are checked for item size, C-contiguity and length before any write; the Python side checks
 * values (NaN, ranges) through the status codes returned here.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ buffers */
typedef struct {
    Py_buffer view;
    int held;
} Buf;

static void release(Buf *b, int n) {
    for (int i = 0; i < n; i++)
        if (b[i].held) PyBuffer_Release(&b[i].view);
}

/* a * b, or -1 if either is negative or the product overflows (acquire then refuses the call). */
static inline Py_ssize_t mul(Py_ssize_t a, Py_ssize_t b) {
    Py_ssize_t r;
    if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r)) return -1;
    return r;
}

/* Acquire `obj` as a C-contiguous buffer of `count` items of `itemsize` bytes (None allowed iff `optional`).
 * On failure the caller still releases `b` (held may be set). */
static int acquire(PyObject *obj, Buf *b, Py_ssize_t itemsize, Py_ssize_t count, int writable, int optional,
                   const char *name) {
    b->held = 0;
    if (obj == Py_None) {
        if (optional) return 0;
        PyErr_Format(PyExc_TypeError, "%s: a buffer is required", name);
        return -1;
    }
    if (count < 0 || count > PY_SSIZE_T_MAX / itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: the sizes overflow", name);
        return -1;
    }
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &b->view, flags) < 0) return -1;
    b->held = 1;
    if (b->view.itemsize != itemsize || b->view.len < count * itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd items of %zd bytes, got %zd bytes of items of %zd",
                     name, count, itemsize, b->view.len, b->view.itemsize);
        return -1;
    }
    return 0;
}

#define F32(b) ((float *)(b).view.buf)
#define I64(b) ((int64_t *)(b).view.buf)
#define I64_OR_NULL(b) ((b).held ? (int64_t *)(b).view.buf : NULL)

/* 0 when the call of `fn` has `want` arguments, else -1 with a TypeError. */
static int expect_args(Py_ssize_t nargs, Py_ssize_t want, const char *fn) {
    if (nargs == want) return 0;
    PyErr_Format(PyExc_TypeError, "%s: expected %zd arguments", fn, want);
    return -1;
}

static int get_ssize(PyObject *obj, Py_ssize_t *out, const char *name) {
    *out = PyLong_AsSsize_t(obj);
    if (*out == -1 && PyErr_Occurred()) return -1;
    if (*out < 0) {
        PyErr_Format(PyExc_ValueError, "%s: must be >= 0", name);
        return -1;
    }
    return 0;
}

/* The cumulative widths offset[0..n] (offset[0] = 0) of the int64 buffer `obj` of n widths, malloc'd; NULL with
 * an error set when a width is negative or their sum overflows (`fn` names the call). */
static Py_ssize_t *width_offsets(PyObject *obj, Py_ssize_t n, const char *fn) {
    Buf w;
    if (acquire(obj, &w, 8, n, 0, 0, "widths") < 0) {
        release(&w, 1);
        return NULL;
    }
    Py_ssize_t *offset = malloc(sizeof(Py_ssize_t) * (size_t)(n + 1));
    int bad_width = 0;
    if (offset) {
        offset[0] = 0;
        for (Py_ssize_t d = 0; d < n && !bad_width; d++) {
            int64_t wd = I64(w)[d];
            bad_width = wd < 0 || __builtin_add_overflow(offset[d], (Py_ssize_t)wd, &offset[d + 1]);
        }
    }
    release(&w, 1);
    if (!offset) {
        PyErr_NoMemory();
    } else if (bad_width) {
        free(offset);
        offset = NULL;
        PyErr_Format(PyExc_ValueError, "%s: every width must be >= 0 (and their sum representable)", fn);
    }
    return offset;
}

static int normalize_row(const float *z, Py_ssize_t k, const double *rest, float *out, double *scratch);

/* ------------------------------------------------------------------------------------ sort keys */
/* A uint64 key whose ascending order is (value descending, token ascending); -0.0 ties with +0.0. */
static inline uint64_t desc_key(float v, int64_t token) {
    float w = v + 0.0f; /* -0.0 + 0.0 = +0.0 */
    uint32_t bits;
    memcpy(&bits, &w, 4);
    uint32_t asc = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u); /* ascending float order */
    return ((uint64_t)(~asc) << 32) | (uint64_t)(uint32_t)token;
}

static void sort_u64(uint64_t *a, Py_ssize_t n) {
    /* introsort-free quicksort (median of three, smaller side first) with insertion sort below 16 */
    while (n > 16) {
        uint64_t x = a[0], y = a[n / 2], z = a[n - 1];
        uint64_t pivot = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
        Py_ssize_t i = 0, j = n - 1;
        for (;;) {
            while (a[i] < pivot) i++;
            while (a[j] > pivot) j--;
            if (i >= j) break;
            uint64_t t = a[i];
            a[i] = a[j];
            a[j] = t;
            i++;
            j--;
        }
        Py_ssize_t left = j + 1; /* a[0..j] <= pivot <= a[j+1..] */
        if (left < n - left) {
            sort_u64(a, left);
            a += left;
            n -= left;
        } else {
            sort_u64(a + left, n - left);
            n = left;
        }
    }
    for (Py_ssize_t i = 1; i < n; i++) {
        uint64_t v = a[i];
        Py_ssize_t j = i;
        while (j > 0 && a[j - 1] > v) {
            a[j] = a[j - 1];
            j--;
        }
        a[j] = v;
    }
}

/* ------------------------------------------------------------------------------------------ select */
static inline float key_value(uint64_t key) { /* the (zero-normalised) float of desc_key */
    uint32_t asc = ~(uint32_t)(key >> 32);
    uint32_t bits = (asc & 0x80000000u) ? (asc & 0x7FFFFFFFu) : ~asc;
    float v;
    memcpy(&v, &bits, 4);
    return v;
}

/* Reorder a[0..n) so that a[k - 1] is the k-th largest (1 <= k <= n; no NaN) and return it: quickselect. */
static float nth_largest(float *a, Py_ssize_t n, Py_ssize_t k) {
    Py_ssize_t lo = 0, hi = n - 1, want = k - 1; /* descending order: index k - 1 */
    while (hi > lo) {
        float x = a[lo], y = a[lo + (hi - lo) / 2], z = a[hi];
        float pivot = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
        Py_ssize_t i = lo, j = hi;
        for (;;) {
            while (a[i] > pivot) i++;
            while (a[j] < pivot) j--;
            if (i >= j) break;
            float t = a[i];
            a[i] = a[j];
            a[j] = t;
            i++;
            j--;
        }
        /* a[lo..j] >= pivot >= a[j+1..hi] */
        if (want <= j) hi = j;
        else lo = j + 1;
    }
    return a[want];
}

#define LANES 32 /* groups per chunk: 8 SSE registers of maxima */

/* One row: the K best (value descending, token ascending) as sorted keys; returns their number (m >= K),
 * -1 for NaN / +inf, or -2 - f when fewer than K values are above -inf (f of them).
 *
 * Exact two-stage selection that reads the row once.  The row is cut into chunks of S x LANES tokens;
 * group (chunk c, lane j) holds the S tokens c S LANES + i LANES + j.  A vertical max over each chunk
 * (LANES independent lanes: vectorised, no dependency chain across lanes) gives its groups' maxima.  The
 * K-th largest group maximum t is a lower bound of the K-th largest logit (K distinct tokens reach it), so
 * every candidate is >= t and lies in a group whose maximum is >= t, or in the tail past the last chunk:
 * those tokens are collected (branch-free) and sorted. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))  /* the vocabulary pass at 8 floats a step where the CPU has AVX2 */
#endif
static Py_ssize_t select_row(const float *x, Py_ssize_t vocab, Py_ssize_t k, Py_ssize_t S, float *maxima,
                             float *scratch, uint64_t *keys) {
    const Py_ssize_t chunk = S * LANES, chunks = vocab / chunk, n = LANES * chunks;
    int finite = 1;
    for (Py_ssize_t c = 0; c < chunks; c++) {
        const float *restrict xc = x + c * chunk;
        float mx[LANES]; /* in registers */
        int32_t ok[LANES];
        for (int j = 0; j < LANES; j++) {
            mx[j] = xc[j];
            ok[j] = xc[j] < INFINITY; /* false for NaN and +inf */
        }
        for (Py_ssize_t i = 1; i < S; i++) {
            const float *restrict xi = xc + i * LANES;
            for (int j = 0; j < LANES; j++) {
                mx[j] = xi[j] > mx[j] ? xi[j] : mx[j];
                ok[j] &= xi[j] < INFINITY;
            }
        }
        for (int j = 0; j < LANES; j++) {
            maxima[c * LANES + j] = mx[j];
            finite &= ok[j];
        }
    }
    for (Py_ssize_t v = n * S; v < vocab; v++) finite &= x[v] < INFINITY;
    if (!finite) return -1;
    float t = -INFINITY; /* fewer than K groups: every token is a candidate */
    if (n >= k) {
        memcpy(scratch, maxima, sizeof(float) * (size_t)n);
        t = nth_largest(scratch, n, k);
    }
    Py_ssize_t m = 0;
    for (Py_ssize_t g = 0; g < n; g++) {
        if (!(maxima[g] >= t)) continue;
        Py_ssize_t base = (g / LANES) * chunk + g % LANES;
        for (Py_ssize_t i = 0; i < S; i++) { /* branch-free: write, then advance if kept */
            float v = x[base + i * LANES];
            keys[m] = desc_key(v, base + i * LANES);
            m += v >= t;
        }
    }
    for (Py_ssize_t v = n * S; v < vocab; v++) {
        keys[m] = desc_key(x[v], v);
        m += x[v] >= t;
    }
    sort_u64(keys, m);
    Py_ssize_t above = 0; /* values above -inf among the first K (all of them when the row is fine) */
    for (Py_ssize_t i = 0; i < k && i < m; i++) above += key_value(keys[i]) > -INFINITY;
    return above < k ? -2 - above : m;
}

/* ----------------------------------------------------------------------------- vocabulary normaliser */
/* exp2 as dartree.scoring.exp2_f32_ defines it, operation for operation in float32: y clamped at -127,
 * n = floor(y), f = y - n (exact), 2^f by a degree-6 polynomial (Horner; interpolation at Chebyshev nodes,
 * relative error < 1e-7), times 2^n built from its exponent bits (exact; n = -127 gives 0: every y < -126,
 * and -inf, contributes 0). */
static const float EXP2_POLY[7] = {0.00021865784947294742f, 0.0012391331838443875f, 0.009684186428785324f,
                                   0.055480629205703735f,  0.24023045599460602f,   0.6931469440460205f, 1.0f};
#define LOG2E_F 1.4426950408889634f

static inline float rest_term(float x, float top) {
    float y = (x - top) * LOG2E_F;
    y = y > -127.0f ? y : -127.0f;
    float n = (float)(int32_t)y; /* truncation, then down by one where it rounded up: floor(y), exact */
    n -= n > y ? 1.0f : 0.0f;
    float f = y - n;
    float p = f * EXP2_POLY[0] + EXP2_POLY[1];
    for (int i = 2; i < 7; i++) p = p * f + EXP2_POLY[i];
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return p * scale;
}

/* rest_term of 8 logits at once (GCC / Clang vector extensions: two SSE registers, or one AVX2 register in
 * the avx2 clone), the same operations lane by lane. */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

static inline __attribute__((always_inline)) v8f rest_terms8(const float *x, float top) {
    v8f xv;
    memcpy(&xv, x, 32);
    const v8f lo = {-127.0f, -127.0f, -127.0f, -127.0f, -127.0f, -127.0f, -127.0f, -127.0f};
    const v8f one = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
    v8f y = (xv - top) * LOG2E_F;
    v8i above = y > lo;
    y = (v8f)(((v8i)y & above) | ((v8i)lo & ~above));
    v8f n = __builtin_convertvector(__builtin_convertvector(y, v8i), v8f);
    n = n - (v8f)((v8i)one & (n > y));
    v8f f = y - n;
    v8f p = f * EXP2_POLY[0] + EXP2_POLY[1];
    for (int i = 2; i < 7; i++) p = p * f + EXP2_POLY[i];
    v8i bits = (__builtin_convertvector(n, v8i) + 127) << 23;
    return p * (v8f)bits;
}

/* The fixed-point scale of the exact sum: 2**s with s = min(50, 62 - bit_length(V)), so that each term
 * (<= 1) rounds to an integer below 2**51 and V of them sum below 2**62. */
static int rest_shift(Py_ssize_t vocab) {
    int bits = 0;
    for (Py_ssize_t v = vocab; v; v >>= 1) bits++;
    return 62 - bits < 50 ? 62 - bits : 50;
}

/* term * 2**s rounded to the nearest integer (ties to even), for 0 <= term * 2**s < 2**51: adding 1.5 * 2**52
 * rounds to an integer in the current (nearest) mode, whose low mantissa bits are the integer. */
#define ROUND_MAGIC 6755399441055744.0 /* 1.5 * 2**52 */

/* rest_lse of one row (see dartree.scoring.rest_logsumexp): the terms of the tokens other than the
 * candidates `cand` (K token ids in increasing order), each rounded to a multiple of 2**-s and summed as
 * integers (exact: no order to agree on), then top + log(sum) in float64, rounded to float32 (-inf for a zero
 * sum).  A candidate's term is 0, so blocks of 8 terms are computed at once and the few candidates zeroed. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
static float rest_row(const float *restrict x, Py_ssize_t vocab, float top, const int64_t *restrict cand, Py_ssize_t k,
                      float *restrict terms) {
    const int s = rest_shift(vocab);
    const double scale = ldexp(1.0, s);
    Py_ssize_t v = 0;
    for (; v + 32 <= vocab; v += 32) { /* pass 1: the terms, 4 x 8 at a time (independent chains) */
        v8f t0 = rest_terms8(x + v, top), t1 = rest_terms8(x + v + 8, top);
        v8f t2 = rest_terms8(x + v + 16, top), t3 = rest_terms8(x + v + 24, top);
        memcpy(terms + v, &t0, 32);
        memcpy(terms + v + 8, &t1, 32);
        memcpy(terms + v + 16, &t2, 32);
        memcpy(terms + v + 24, &t3, 32);
    }
    for (; v + 8 <= vocab; v += 8) {
        v8f t = rest_terms8(x + v, top);
        memcpy(terms + v, &t, 32);
    }
    for (; v < vocab; v++) terms[v] = rest_term(x[v], top);
    for (Py_ssize_t i = 0; i < k; i++) terms[cand[i]] = 0.0f;
    int64_t sum = 0; /* pass 2: fixed point, exact integer sum */
    for (v = 0; v < vocab; v++) {
        double d = (double)terms[v] * scale + ROUND_MAGIC;
        int64_t q;
        memcpy(&q, &d, 8);
        sum += q - (int64_t)0x4338000000000000LL; /* the bits of ROUND_MAGIC */
    }
    return sum > 0 ? (float)((double)top + log(ldexp((double)sum, -s))) : -INFINITY;
}

/* candidates' work on checked buffers (rest_out NULL without the vocabulary normaliser): the status (0, 1, 2
 * as candidates returns it, with *bad_row and *finite), or -1 when out of memory. */
static long candidate_rows(const float *logits, Py_ssize_t rows, Py_ssize_t vocab, Py_ssize_t topk, Py_ssize_t with_rest,
                           int64_t *tokens, float *values, float *rest_out, float *log_q, long *bad_out,
                           long *finite_out) {
    Py_ssize_t S = 1;
    while (S < 64 && (2 * S) * 8 * topk <= vocab) S *= 2;
    Py_ssize_t n = LANES * (vocab / (LANES * S));
    float *maxima = malloc(sizeof(float) * (size_t)(2 * n + 1));
    uint64_t *keys = malloc(sizeof(uint64_t) * (size_t)(vocab + 1));
    float *terms = with_rest ? malloc(sizeof(float) * (size_t)vocab) : NULL;
    double *scratch = malloc(sizeof(double) * (size_t)topk);
    long status = 0, bad_row = 0, finite = 0;
    if (!maxima || !keys || !scratch || (with_rest && !terms)) status = -1; /* out of memory: no row is read */
    for (Py_ssize_t r = 0; r < rows && status >= 0; r++) { /* status 1 breaks out; 2 goes on to look for a 1 */
        const float *x = logits + r * vocab;
        Py_ssize_t m = select_row(x, vocab, topk, S, maxima, maxima + n, keys);
        if (m == -1) {
            status = 1;
            bad_row = (long)r;
            break;
        }
        if (m < -1) {
            if (!status) {
                status = 2;
                bad_row = (long)r;
                finite = (long)(-2 - m);
            }
            continue;
        }
        int64_t *tok = tokens + r * topk;
        float *val = values + r * topk;
        for (Py_ssize_t i = 0; i < topk; i++) {
            tok[i] = (int64_t)(uint32_t)keys[i];
            val[i] = x[tok[i]];
        }
        double rest;
        if (with_rest) {
            rest_out[r] = rest_row(x, vocab, val[0], tok, topk, terms);
            rest = (double)rest_out[r];
        }
        normalize_row(val, topk, with_rest ? &rest : NULL, log_q + r * topk, scratch);
    }
    free(maxima);
    free(keys);
    free(terms);
    free(scratch);
    *bad_out = bad_row;
    *finite_out = finite;
    return status;
}

/* candidates(logits f32 [rows, V], rows, V, K, vocab (0/1), tokens i64 [rows, K], values f32 [rows, K],
 *            rest f32 [rows] | None, log_q f32 [rows, K])
 * -> (0, 0, 0) ok | (1, row, 0) NaN or +inf in a row (the first such row) | (2, row, finite) no NaN / +inf, and
 * the first row with fewer than K logits above -inf has `finite` of them.
 * tokens: the K best of each row by (logit descending, token id; -0.0 ties with +0.0); values: their logits.
 * select, then (with `vocab` and K < V) the row's rest_lse, then log q = z - logaddexp(lse(z), rest) (rest
 * -inf without it): dartree.fast.host_builders.HostCandidates in one call. */
static PyObject *native_candidates(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (expect_args(nargs, 9, "candidates") < 0) return NULL;
    Py_ssize_t rows, vocab, topk, with_rest;
    if (get_ssize(args[1], &rows, "rows") < 0 || get_ssize(args[2], &vocab, "vocab") < 0 ||
        get_ssize(args[3], &topk, "topk") < 0 || get_ssize(args[4], &with_rest, "vocab_normalize") < 0)
        return NULL;
    if (topk < 1 || topk > vocab) {
        PyErr_SetString(PyExc_ValueError, "topk: must be in 1..vocab");
        return NULL;
    }
    with_rest = with_rest && topk < vocab;
    Buf b[5] = {0};
    if (acquire(args[0], &b[0], 4, mul(rows, vocab), 0, 0, "logits") < 0 ||
        acquire(args[5], &b[1], 8, mul(rows, topk), 1, 0, "tokens") < 0 ||
        acquire(args[6], &b[2], 4, mul(rows, topk), 1, 0, "values") < 0 ||
        acquire(args[7], &b[3], 4, rows, 1, !with_rest, "rest") < 0 ||
        acquire(args[8], &b[4], 4, mul(rows, topk), 1, 0, "log_q") < 0) {
        release(b, 5);
        return NULL;
    }
    long bad_row = 0, finite = 0, status;
    Py_BEGIN_ALLOW_THREADS
    status = candidate_rows(F32(b[0]), rows, vocab, topk, with_rest, I64(b[1]), F32(b[2]), b[3].held ? F32(b[3]) : NULL,
                            F32(b[4]), &bad_row, &finite);
    Py_END_ALLOW_THREADS
    release(b, 5);
    if (status < 0) return PyErr_NoMemory();
    return Py_BuildValue("(lll)", status, bad_row, finite);
}

/* ----------------------------------------------------------------------------------- log normalise */
/* numpy's pairwise float64 sum (numpy/_core/src/umath/loops_utils.h.src), as np.add.reduce runs it on a
 * contiguous row: 0.0 + pairwise(a, n). */
static double pairwise_sum(const double *a, Py_ssize_t n) {
    if (n < 8) {
        double res = -0.0;
        for (Py_ssize_t i = 0; i < n; i++) res += a[i];
        return res;
    }
    if (n <= 128) {
        double r[8];
        for (int j = 0; j < 8; j++) r[j] = a[j];
        Py_ssize_t i;
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += a[i];
        return res;
    }
    Py_ssize_t n2 = n / 2;
    n2 -= n2 % 8;
    return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

static double logaddexp(double x, double y) { /* numpy's npy_logaddexp */
    if (x == y) return x + 0.693147180559945309417232121458176568; /* NPY_LOGE2; infinities of one sign */
    double tmp = x - y;
    if (tmp > 0) return x + log1p(exp(-tmp));
    if (tmp <= 0) return y + log1p(exp(tmp));
    return tmp; /* NaN */
}

/* log q of one row of K candidate logits; returns 1 if an output is not finite.  `scratch`: K doubles. */
static int normalize_row(const float *z, Py_ssize_t k, const double *rest, float *out, double *scratch) {
    double top = z[0];
    for (Py_ssize_t i = 1; i < k; i++) top = (double)z[i] > top || isnan((double)z[i]) ? (double)z[i] : top;
    if (isnan(top)) { /* numpy's max propagates NaN */
        for (Py_ssize_t i = 0; i < k; i++) out[i] = NAN;
        return 1;
    }
    for (Py_ssize_t i = 0; i < k; i++) scratch[i] = exp((double)z[i] - top);
    double total = log(0.0 + pairwise_sum(scratch, k)) + top;
    if (rest) total = logaddexp(total, *rest);
    int bad = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        out[i] = (float)((double)z[i] - total);
        bad |= !isfinite(out[i]);
    }
    return bad;
}

/* -------------------------------------------------------------------------------------- depth step */
/* depth_step's work on checked buffers: nonfinite (and *identity_out set), or -1 when out of memory. */
static int depth_rows(const float *logits, Py_ssize_t b, Py_ssize_t m, Py_ssize_t k, const double *rest,
                      const float *parent, float beta, Py_ssize_t width, const int64_t *cand, float *log_q,
                      int64_t *parents, int64_t *ranks, int64_t *tokens, float *scores, const int64_t *anc_in,
                      int64_t *anc_out, Py_ssize_t gamma, Py_ssize_t depth, int64_t *gather, int *identity_out) {
    const Py_ssize_t total = m * k;
    double *scratch = malloc(sizeof(double) * (size_t)k);
    float *child = malloc(sizeof(float) * (size_t)(2 * total)); /* the scores, then a copy to select in */
    if (!scratch || !child) {
        free(scratch);
        free(child);
        return -1;
    }
    int bad = 0, identity = width == m;
    for (Py_ssize_t r = 0; r < b && !bad; r++) {
        for (Py_ssize_t i = 0; i < m; i++) {
            Py_ssize_t o = (r * m + i) * k;
            bad |= normalize_row(logits + o, k, rest ? rest + r : NULL, log_q + o, scratch);
            float ps = parent[r * m + i];
            for (Py_ssize_t j = 0; j < k; j++) child[i * k + j] = (ps + log_q[o + j]) + beta;
        }
        if (bad) break;
        /* the width-th best score t; all scores > t, then the first ties == t by position */
        Py_ssize_t kept = 0, greater = 0;
        float t = -INFINITY;
        if (width < total) {
            memcpy(child + total, child, sizeof(float) * (size_t)total);
            t = nth_largest(child + total, total, width);
        }
        if (width < total)
            for (Py_ssize_t p = 0; p < total; p++) greater += child[p] > t;
        Py_ssize_t ties = width - greater;
        for (Py_ssize_t p = 0; p < total && kept < width; p++) {
            int take = width == total || child[p] > t;
            if (!take && child[p] == t && ties > 0) {
                take = 1;
                ties--;
            }
            if (!take) continue;
            Py_ssize_t w = r * width + kept;
            Py_ssize_t par = p / k, rk = p % k;
            parents[w] = par;
            ranks[w] = rk;
            tokens[w] = cand[r * k + rk];
            scores[w] = child[p];
            identity &= par == kept;
            gather[w] = r * m + par;
            if (anc_out) {
                memcpy(anc_out + w * gamma, anc_in + (r * m + par) * gamma, sizeof(int64_t) * (size_t)gamma);
                anc_out[w * gamma + depth - 1] = kept + 1;
            }
            kept++;
        }
    }
    free(scratch);
    free(child);
    *identity_out = identity && !bad;
    return bad;
}

/* depth_step(logits f32 [b, m, K], b, m, K, rest f64 [b] | None, parent f32 [b, m], beta (float), width,
 *            cand_tokens i64 [b, K], log_q f32 [b, m, K] (out), parents i64 [b, W], ranks i64 [b, W],
 *            tokens i64 [b, W], scores f32 [b, W], anc_in i64 [b, m, gamma] | None, anc_out i64 [b, W, gamma] | None,
 *            gamma, depth, gather i64 [b, W])
 * -> (nonfinite, identity): nonfinite = some log q is NaN or infinite (nothing else is then meaningful);
 *    identity = W == m and every kept child's parent is its own index (the branch states need no gather).
 * gather: r * m + parent, the row of each kept child's parent state in the [b * m, S] states.
 *
 * Per row: log q of every branch's K candidates; child scores (parent + log q) + beta in float32; the best
 * `width` of the m*K flat positions under (score descending, position), listed in position order. */
static PyObject *native_depth_step(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (expect_args(nargs, 19, "depth_step") < 0) return NULL;
    Py_ssize_t b, m, k, width, gamma, depth;
    if (get_ssize(args[1], &b, "b") < 0 || get_ssize(args[2], &m, "m") < 0 || get_ssize(args[3], &k, "topk") < 0 ||
        get_ssize(args[7], &width, "width") < 0 || get_ssize(args[16], &gamma, "gamma") < 0 ||
        get_ssize(args[17], &depth, "depth") < 0)
        return NULL;
    double beta_d = PyFloat_AsDouble(args[6]);
    if (beta_d == -1.0 && PyErr_Occurred()) return NULL;
    float beta = (float)beta_d;
    Py_ssize_t total = mul(m, k);
    if (total < 0 || width < 1 || width > total || depth < 1 || depth > gamma) {
        PyErr_SetString(PyExc_ValueError, "depth_step: need 1 <= width <= m * K and 1 <= depth <= gamma");
        return NULL;
    }
    Buf a[12] = {0};
    if (acquire(args[0], &a[0], 4, mul(b, total), 0, 0, "logits") < 0 || acquire(args[4], &a[1], 8, b, 0, 1, "rest") < 0 ||
        acquire(args[5], &a[2], 4, mul(b, m), 0, 0, "parent_scores") < 0 ||
        acquire(args[8], &a[3], 8, mul(b, k), 0, 0, "cand_tokens") < 0 ||
        acquire(args[9], &a[4], 4, mul(b, total), 1, 0, "log_q") < 0 ||
        acquire(args[10], &a[5], 8, mul(b, width), 1, 0, "parents") < 0 ||
        acquire(args[11], &a[6], 8, mul(b, width), 1, 0, "ranks") < 0 ||
        acquire(args[12], &a[7], 8, mul(b, width), 1, 0, "tokens") < 0 ||
        acquire(args[13], &a[8], 4, mul(b, width), 1, 0, "scores") < 0 ||
        acquire(args[14], &a[9], 8, mul(mul(b, m), gamma), 0, 1, "anc_in") < 0 ||
        acquire(args[15], &a[10], 8, mul(mul(b, width), gamma), 1, 1, "anc_out") < 0 ||
        acquire(args[18], &a[11], 8, mul(b, width), 1, 0, "gather") < 0) {
        release(a, 12);
        return NULL;
    }
    if (a[9].held != a[10].held) {
        release(a, 12);
        PyErr_SetString(PyExc_ValueError, "depth_step: anc_in and anc_out go together");
        return NULL;
    }
    const double *rest = a[1].held ? (const double *)a[1].view.buf : NULL;
    int identity;
    int bad = depth_rows(F32(a[0]), b, m, k, rest, F32(a[2]), beta, width, I64(a[3]), F32(a[4]), I64(a[5]), I64(a[6]),
                         I64(a[7]), F32(a[8]), I64_OR_NULL(a[9]), I64_OR_NULL(a[10]), gamma, depth, I64(a[11]), &identity);
    release(a, 12);
    if (bad < 0) return PyErr_NoMemory();
    return Py_BuildValue("(ii)", bad, identity);
}

/* ------------------------------------------------------------------------------------- select tree */
typedef struct {
    const float *score;  /* [total] of the row */
    const int64_t *path; /* [total, gamma] 1-based lex index of the ancestor at every depth (0 below) */
    Py_ssize_t gamma;
} TreeOrder;

/* 1 if node a comes before node b: score descending, then rank path (a prefix first). */
static int tree_before(Py_ssize_t a, Py_ssize_t b, const TreeOrder *o) {
    if (o->score[a] != o->score[b]) return o->score[a] > o->score[b];
    if (!o->path) return a < b; /* a chain: depth order (bound_frontier's flat indices grow with the depth) */
    const int64_t *pa = o->path + a * o->gamma, *pb = o->path + b * o->gamma;
    for (Py_ssize_t d = 0; d < o->gamma; d++)
        if (pa[d] != pb[d]) return pa[d] < pb[d];
    return a < b;
}

static void merge_sort(Py_ssize_t *idx, Py_ssize_t *tmp, Py_ssize_t n, const TreeOrder *o) {
    if (n < 2) return;
    Py_ssize_t h = n / 2;
    merge_sort(idx, tmp, h, o);
    merge_sort(idx + h, tmp, n - h, o);
    Py_ssize_t i = 0, j = h, t = 0;
    while (i < h && j < n) tmp[t++] = tree_before(idx[j], idx[i], o) ? idx[j++] : idx[i++];
    while (i < h) tmp[t++] = idx[i++];
    while (j < n) tmp[t++] = idx[j++];
    memcpy(idx, tmp, sizeof(Py_ssize_t) * (size_t)n);
}

/* select_tree's work on checked buffers (offset: the depths' cumulative widths, offset[0] = 0, total =
 * offset[gamma]): 0, 1 when a selected node's parent is not selected, 2 when a row holds fewer than n_out
 * nodes, -1 when out of memory. */
static int select_rows(Py_ssize_t b, Py_ssize_t gamma, const Py_ssize_t *offset, Py_ssize_t n_out,
                       const int64_t *par_in, const int64_t *rk_in, const int64_t *tok_in, const float *sc_in,
                       const int64_t *path_in, const int64_t *root, int64_t *o_tok, int64_t *o_par, int64_t *o_dep,
                       int64_t *o_rk, float *o_sc) {
    const Py_ssize_t total = offset[gamma];
    /* per row, node j (0..total) of depth d at column c: flat input index b * offset[d] + r * W_d + c */
    Py_ssize_t *src = malloc(sizeof(Py_ssize_t) * (size_t)(total + 1));
    Py_ssize_t *depth_of = malloc(sizeof(Py_ssize_t) * (size_t)(total + 1));
    Py_ssize_t *idx = malloc(sizeof(Py_ssize_t) * (size_t)(total + 1));
    Py_ssize_t *tmp = malloc(sizeof(Py_ssize_t) * (size_t)(total + 1));
    Py_ssize_t *slot = malloc(sizeof(Py_ssize_t) * (size_t)(total + 1));
    float *score = malloc(sizeof(float) * (size_t)(total + 1));
    int64_t *path = path_in ? malloc(sizeof(int64_t) * (size_t)(total * gamma + 1)) : NULL;
    int status = 0;
    if (!src || !depth_of || !idx || !tmp || !slot || !score || (path_in && !path)) status = -1; /* no row is read */
    for (Py_ssize_t r = 0; r < b && !status; r++) {
        Py_ssize_t count = 0; /* nodes of the row that are not fillers */
        for (Py_ssize_t d = 0, j = 0; d < gamma; d++) {
            Py_ssize_t wd = offset[d + 1] - offset[d];
            for (Py_ssize_t c = 0; c < wd; c++, j++) {
                Py_ssize_t f = b * offset[d] + r * wd + c;
                src[j] = f;
                depth_of[j] = d;
                score[j] = sc_in[f];
                if (path) memcpy(path + j * gamma, path_in + f * gamma, sizeof(int64_t) * (size_t)gamma);
                if (rk_in[f] >= 0) idx[count++] = j;
            }
        }
        if (count < n_out) {
            status = 2;
            break;
        }
        if (path) {
            TreeOrder o = {score, path, gamma};
            merge_sort(idx, tmp, count, &o);
        }
        for (Py_ssize_t j = 0; j < total; j++) slot[j] = 0;
        for (Py_ssize_t i = 0; i < n_out; i++) slot[idx[i]] = i + 1;
        Py_ssize_t o = r * (n_out + 1);
        o_tok[o] = root[r];
        o_par[o] = -1;
        o_dep[o] = 0;
        o_rk[o] = -1;
        o_sc[o] = 0.0f;
        for (Py_ssize_t i = 0; i < n_out; i++) {
            Py_ssize_t j = idx[i], f = src[j], d = depth_of[j];
            Py_ssize_t parent = 0;
            if (d > 0) { /* the parent's node index: depth d - 1, column par_in[f] */
                int64_t pc = par_in[f];
                if (pc < 0 || pc >= offset[d] - offset[d - 1]) {
                    status = 1;
                    break;
                }
                parent = slot[offset[d - 1] + pc];
                if (!parent) status = 1;
            }
            o_tok[o + i + 1] = tok_in[f];
            o_par[o + i + 1] = parent;
            o_dep[o + i + 1] = d + 1;
            o_rk[o + i + 1] = rk_in[f];
            o_sc[o + i + 1] = score[j];
        }
    }
    free(src); free(depth_of); free(idx); free(tmp); free(slot); free(score); free(path);
    return status;
}

/* select_tree(b, gamma, widths i64 [gamma], n_out, parents, ranks, tokens (i64), scores (f32), paths (i64) | None,
 *             root i64 [b], out_tokens, out_parents, out_depths, out_ranks i64 [b, n_out + 1], out_scores f32)
 * -> None.  The inputs hold depth d's [b, W_d] block at b * offset_d (paths: [b, W_d, gamma] at
 * b * offset_d * gamma); parents are indices into the previous depth's W.  The output is the DraftTree of the
 * best n_out supertree nodes in the total order (score descending, then rank path; without paths, a chain,
 * depth order), the root first.  A selected node whose parent is not selected is a ValueError (prefix closure
 * is the builders' invariant).  Under the bound a depth may be empty (width 0: the expansion stopped) and a row
 * may hold nodes of rank -1 (fillers): they are never selected; fewer than n_out other nodes in a row is a
 * ValueError. */
static PyObject *native_select_tree(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (expect_args(nargs, 15, "select_tree") < 0) return NULL;
    Py_ssize_t b, gamma, n_out;
    if (get_ssize(args[0], &b, "b") < 0 || get_ssize(args[1], &gamma, "gamma") < 0 || get_ssize(args[3], &n_out, "n_out") < 0)
        return NULL;
    if (gamma < 1) {
        PyErr_SetString(PyExc_ValueError, "select_tree: gamma >= 1");
        return NULL;
    }
    Py_ssize_t *offset = width_offsets(args[2], gamma, "select_tree");
    if (!offset) return NULL;
    Py_ssize_t total = offset[gamma];
    if (n_out > total) {
        free(offset);
        PyErr_SetString(PyExc_ValueError, "select_tree: n_out larger than the supertree");
        return NULL;
    }
    Buf a[11] = {0};
    if (acquire(args[4], &a[0], 8, mul(b, total), 0, 0, "parents") < 0 || acquire(args[5], &a[1], 8, mul(b, total), 0, 0, "ranks") < 0 ||
        acquire(args[6], &a[2], 8, mul(b, total), 0, 0, "tokens") < 0 || acquire(args[7], &a[3], 4, mul(b, total), 0, 0, "scores") < 0 ||
        acquire(args[8], &a[4], 8, mul(mul(b, total), gamma), 0, 1, "paths") < 0 || acquire(args[9], &a[5], 8, b, 0, 0, "root") < 0 ||
        acquire(args[10], &a[6], 8, mul(b, (n_out + 1)), 1, 0, "out_tokens") < 0 ||
        acquire(args[11], &a[7], 8, mul(b, (n_out + 1)), 1, 0, "out_parents") < 0 ||
        acquire(args[12], &a[8], 8, mul(b, (n_out + 1)), 1, 0, "out_depths") < 0 ||
        acquire(args[13], &a[9], 8, mul(b, (n_out + 1)), 1, 0, "out_ranks") < 0 ||
        acquire(args[14], &a[10], 4, mul(b, (n_out + 1)), 1, 0, "out_scores") < 0) {
        free(offset);
        release(a, 11);
        return NULL;
    }
    int status = select_rows(b, gamma, offset, n_out, I64(a[0]), I64(a[1]), I64(a[2]), F32(a[3]), I64_OR_NULL(a[4]),
                             I64(a[5]), I64(a[6]), I64(a[7]), I64(a[8]), I64(a[9]), F32(a[10]));
    free(offset);
    release(a, 11);
    if (status < 0) return PyErr_NoMemory();
    if (status == 1) {
        PyErr_SetString(PyExc_ValueError, "select_tree: a selected node's parent is outside the previous depth or not "
                                          "selected (not prefix-closed)");
        return NULL;
    }
    if (status == 2) {
        PyErr_SetString(PyExc_ValueError, "select_tree: a row holds fewer than n_out nodes");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------- bound frontier */
/* bound_frontier's work on checked buffers (offset: the depths' cumulative widths, offset[0] = 0): the largest
 * count of live frontier nodes in a row, or -1 when out of memory. */
static Py_ssize_t bound_rows(Py_ssize_t b, Py_ssize_t gamma, Py_ssize_t depth, const Py_ssize_t *offset,
                             Py_ssize_t budget, const int64_t *rank, const float *score, const int64_t *paths,
                             float beta) {
    Py_ssize_t total = offset[depth], wd = offset[depth] - offset[depth - 1];
    float *vals = malloc(sizeof(float) * (size_t)(total + 1));
    Py_ssize_t *ties = malloc(sizeof(Py_ssize_t) * (size_t)(total + 1));
    Py_ssize_t *tmp = malloc(sizeof(Py_ssize_t) * (size_t)(total + 1));
    char *in = malloc((size_t)(wd + 1));
    TreeOrder order = {score, paths, gamma};
    Py_ssize_t most = 0;
    if (!vals || !ties || !tmp || !in) most = -1; /* out of memory: no row is read */
    for (Py_ssize_t r = 0; r < b && most >= 0; r++) {
        Py_ssize_t n = 0, base = b * offset[depth - 1] + r * wd;
        for (Py_ssize_t d = 0; d < depth; d++) {
            Py_ssize_t wj = offset[d + 1] - offset[d];
            for (Py_ssize_t c = 0, f = b * offset[d] + r * wj; c < wj; c++, f++)
                if (rank[f] >= 0) vals[n++] = score[f];
        }
        float t = -INFINITY;
        int every_tie = 1; /* all nodes scoring t rank before or at theta */
        memset(in, 0, (size_t)wd);
        if (n >= budget) {
            t = nth_largest(vals, n, budget);
            Py_ssize_t greater = 0, nt = 0;
            for (Py_ssize_t d = 0; d < depth; d++) {
                Py_ssize_t wj = offset[d + 1] - offset[d];
                for (Py_ssize_t c = 0, f = b * offset[d] + r * wj; c < wj; c++, f++) {
                    if (rank[f] < 0) continue;
                    greater += score[f] > t;
                    if (score[f] == t) ties[nt++] = f;
                }
            }
            Py_ssize_t need = budget - greater; /* 1 <= need <= nt: theta is the need-th tie in rank-path order */
            if (need < nt) {
                every_tie = 0;
                merge_sort(ties, tmp, nt, &order);
                for (Py_ssize_t i = 0; i < need; i++)
                    if (ties[i] >= base && ties[i] < base + wd) in[ties[i] - base] = 1;
            }
        }
        Py_ssize_t kept = 0;
        for (Py_ssize_t c = 0; c < wd; c++) {
            Py_ssize_t f = base + c;
            if (rank[f] < 0) continue;
            float s = score[f], best_child = s + beta; /* no child of f scores above it */
            kept += n < budget || best_child > t || (best_child == t && (s > t || every_tie || in[c]));
        }
        if (kept > most) most = kept;
    }
    free(vals); free(ties); free(tmp); free(in);
    return most;
}

/* bound_frontier(b, gamma, depth, widths i64 [depth], budget, ranks i64, scores f32, paths i64 | None,
 *                beta (float)) -> the largest count of live frontier nodes in a row (0: stop expanding).
 * The buffers are select_tree's: depth j's [b, W_j] block at b * offset_j (paths: [b, W_j, gamma] blocks at
 * b * offset_j * gamma); fillers (rank -1) are not nodes.  Per row: theta = the budget-th best node of depths
 * 1..depth in the total order (score descending, then rank path; without paths, a chain: depth order).  The
 * live nodes of depth `depth` are those that may have a child ranking at or before theta (all of them while
 * the row holds fewer than `budget` nodes).  A node u has none when it ranks after
 * theta, or when (s(u) + beta) in float32 scores below theta: every child scores (s(u) + log q) + beta <=
 * s(u) + beta, float32 rounding being monotone; such a node has no descendant in the final top budget,
 * whatever else is expanded (docs/builders.md, "Bound pruning"). */
static PyObject *native_bound_frontier(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (expect_args(nargs, 9, "bound_frontier") < 0) return NULL;
    Py_ssize_t b, gamma, depth, budget;
    if (get_ssize(args[0], &b, "b") < 0 || get_ssize(args[1], &gamma, "gamma") < 0 ||
        get_ssize(args[2], &depth, "depth") < 0 || get_ssize(args[4], &budget, "budget") < 0)
        return NULL;
    double beta_d = PyFloat_AsDouble(args[8]);
    if (beta_d == -1.0 && PyErr_Occurred()) return NULL;
    if (!(beta_d <= 0.0)) {
        PyErr_SetString(PyExc_ValueError, "bound_frontier: beta must be <= 0 (a depth penalty)");
        return NULL;
    }
    float beta = (float)beta_d;
    if (gamma < 1 || depth < 1 || depth > gamma || budget < 1) {
        PyErr_SetString(PyExc_ValueError, "bound_frontier: need 1 <= depth <= gamma and budget >= 1");
        return NULL;
    }
    Py_ssize_t *offset = width_offsets(args[3], depth, "bound_frontier");
    if (!offset) return NULL;
    Py_ssize_t total = offset[depth];
    Buf a[3] = {0};
    if (acquire(args[5], &a[0], 8, mul(b, total), 0, 0, "ranks") < 0 || acquire(args[6], &a[1], 4, mul(b, total), 0, 0, "scores") < 0 ||
        acquire(args[7], &a[2], 8, mul(mul(b, total), gamma), 0, 1, "paths") < 0) {
        free(offset);
        release(a, 3);
        return NULL;
    }
    Py_ssize_t most = bound_rows(b, gamma, depth, offset, budget, I64(a[0]), F32(a[1]), I64_OR_NULL(a[2]), beta);
    free(offset);
    release(a, 3);
    if (most < 0) return PyErr_NoMemory();
    return PyLong_FromSsize_t(most);
}

/* -------------------------------------------------------------------------------------- best first */
typedef struct {
    float score;
    int32_t parent; /* node index of the parent (0: the root) */
    int32_t depth;  /* 1-based */
    int32_t pos;    /* position among the parent's children, sorted by (log q descending, rank) */
} Entry;

typedef struct {
    const int64_t *rk; /* [gamma, K] rank at a sorted position, or NULL: position = rank */
    Py_ssize_t k;
    int32_t *path_rank; /* [n, gamma] rank of each popped node's ancestor at every depth */
    int32_t gamma;
} Order;

static inline int32_t rank_at(const Order *o, int32_t depth, int32_t pos) {
    return o->rk ? (int32_t)o->rk[(Py_ssize_t)(depth - 1) * o->k + pos] : pos;
}

/* 1 if a pops before b: higher score; among equal scores the smaller rank path (a prefix first). */
static int before(const Entry *a, const Entry *b, const Order *o) {
    if (a->score != b->score) return a->score > b->score;
    int32_t da = a->depth, db = b->depth;
    int32_t dmax = da > db ? da : db;
    for (int32_t d = 1; d <= dmax; d++) {
        int32_t ra = d > da ? -1 : (d == da ? rank_at(o, da, a->pos) : o->path_rank[a->parent * o->gamma + d - 1]);
        int32_t rb = d > db ? -1 : (d == db ? rank_at(o, db, b->pos) : o->path_rank[b->parent * o->gamma + d - 1]);
        if (ra != rb) return ra < rb;
    }
    return 0; /* the same node: never two entries */
}

static void heap_down(Entry *h, Py_ssize_t size, Py_ssize_t c, const Order *o) {
    Entry v = h[c];
    for (;;) {
        Py_ssize_t l = 2 * c + 1, s = c;
        const Entry *best = &v;
        if (l < size && before(&h[l], best, o)) { s = l; best = &h[l]; }
        if (l + 1 < size && before(&h[l + 1], best, o)) s = l + 1;
        if (s == c) break;
        h[c] = h[s];
        c = s;
    }
    h[c] = v;
}

static void heap_up(Entry *h, Py_ssize_t c, const Order *o) {
    Entry v = h[c];
    while (c > 0) {
        Py_ssize_t p = (c - 1) / 2;
        if (!before(&v, &h[p], o)) break;
        h[c] = h[p];
        c = p;
    }
    h[c] = v;
}

/* best_first(log_q f32 [b, gamma, K] sorted per row, b, gamma, K, order i64 [b, gamma, K] | None, n,
 *            cand_tokens i64 [b, gamma, K], root i64 [b],
 *            tokens i64 [b, n], parents i64 [b, n], depths i64 [b, n], ranks i64 [b, n], scores f32 [b, n]) -> None
 *
 * DDTree's best-first: node 0 is the root (token root, parent -1, depth 0, rank -1, score 0), then the first
 * n - 1 pops.  `order[d][pos]` is the candidate rank at sorted position pos (None: positions are ranks).  A
 * popped node's next sibling replaces it in the heap and its first child is pushed, so the heap holds at
 * most one entry per popped node plus one.  Scores: float32 (parent + log q).  n larger than the trie of
 * gamma depths and K candidates is a ValueError. */
static PyObject *native_best_first(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (expect_args(nargs, 13, "best_first") < 0) return NULL;
    Py_ssize_t b, gamma, k, n;
    if (get_ssize(args[1], &b, "b") < 0 || get_ssize(args[2], &gamma, "gamma") < 0 ||
        get_ssize(args[3], &k, "topk") < 0 || get_ssize(args[5], &n, "n") < 0)
        return NULL;
    if (gamma < 1 || k < 1 || n < 1 || n > (Py_ssize_t)1 << 30) {
        PyErr_SetString(PyExc_ValueError, "best_first: need gamma, topk, n >= 1");
        return NULL;
    }
    Buf a[9] = {0};
    if (acquire(args[0], &a[0], 4, mul(mul(b, gamma), k), 0, 0, "log_q") < 0 ||
        acquire(args[4], &a[1], 8, mul(mul(b, gamma), k), 0, 1, "order") < 0 ||
        acquire(args[6], &a[2], 8, mul(mul(b, gamma), k), 0, 0, "cand_tokens") < 0 || acquire(args[7], &a[3], 8, b, 0, 0, "root") < 0 ||
        acquire(args[8], &a[4], 8, mul(b, n), 1, 0, "tokens") < 0 || acquire(args[9], &a[5], 8, mul(b, n), 1, 0, "parents") < 0 ||
        acquire(args[10], &a[6], 8, mul(b, n), 1, 0, "depths") < 0 || acquire(args[11], &a[7], 8, mul(b, n), 1, 0, "ranks") < 0 ||
        acquire(args[12], &a[8], 4, mul(b, n), 1, 0, "scores") < 0) {
        release(a, 9);
        return NULL;
    }
    const float *lq_all = F32(a[0]);
    const int64_t *rk_all = I64_OR_NULL(a[1]), *cand_all = I64(a[2]), *root = I64(a[3]);
    if (rk_all) { /* ranks index the candidates: each must be in 0..K-1 */
        int out_of_range = 0;
        for (Py_ssize_t i = 0; i < b * gamma * k; i++) out_of_range |= rk_all[i] < 0 || rk_all[i] >= k;
        if (out_of_range) {
            release(a, 9);
            PyErr_SetString(PyExc_ValueError, "best_first: order holds a rank outside 0..K-1");
            return NULL;
        }
    }
    if (mul(n, gamma) < 0) {
        release(a, 9);
        PyErr_SetString(PyExc_ValueError, "best_first: the sizes overflow");
        return NULL;
    }
    Entry *heap = malloc(sizeof(Entry) * (size_t)(n + 1));
    int32_t *path_rank = malloc(sizeof(int32_t) * (size_t)(n * gamma));
    int status = 0; /* 1: n beyond the trie */
    if (!heap || !path_rank) status = -1; /* out of memory: no row is read */
    for (Py_ssize_t r = 0; r < b && !status; r++) {
        const float *lq = lq_all + r * gamma * k;
        const int64_t *cand = cand_all + r * gamma * k;
        Order o = {rk_all ? rk_all + r * gamma * k : NULL, k, path_rank, (int32_t)gamma};
        int64_t *tok = I64(a[4]) + r * n, *par = I64(a[5]) + r * n, *dep = I64(a[6]) + r * n, *rnk = I64(a[7]) + r * n;
        float *sc = F32(a[8]) + r * n;
        tok[0] = root[r];
        par[0] = -1;
        dep[0] = 0;
        rnk[0] = -1;
        sc[0] = 0.0f;
        Py_ssize_t size = 1;
        heap[0] = (Entry){0.0f + lq[0], 0, 1, 0}; /* root score + log q: -0.0 + 0.0 is +0.0, as in the reference */
        for (Py_ssize_t node = 1; node < n; node++) {
            if (!size) {
                status = 1;
                break;
            }
            Entry e = heap[0];
            int32_t rank = rank_at(&o, e.depth, e.pos);
            tok[node] = cand[(Py_ssize_t)(e.depth - 1) * k + rank];
            par[node] = e.parent;
            dep[node] = e.depth;
            rnk[node] = rank;
            sc[node] = e.score;
            int32_t *path = path_rank + node * gamma;
            if (e.depth > 1) memcpy(path, path_rank + (Py_ssize_t)e.parent * gamma, sizeof(int32_t) * (size_t)(e.depth - 1));
            path[e.depth - 1] = rank;
            if (e.pos + 1 < k) { /* its next sibling (never better) replaces it */
                heap[0] = (Entry){sc[e.parent] + lq[(Py_ssize_t)(e.depth - 1) * k + e.pos + 1], e.parent, e.depth, e.pos + 1};
                heap_down(heap, size, 0, &o);
            } else {
                heap[0] = heap[--size];
                if (size) heap_down(heap, size, 0, &o);
            }
            if (e.depth < gamma) { /* its first child enters */
                heap[size] = (Entry){lq[(Py_ssize_t)e.depth * k] + e.score, (int32_t)node, e.depth + 1, 0};
                heap_up(heap, size++, &o);
            }
        }
    }
    free(heap);
    free(path_rank);
    release(a, 9);
    if (status < 0) return PyErr_NoMemory();
    if (status) {
        PyErr_SetString(PyExc_ValueError, "best_first: n is larger than the trie of gamma depths and K candidates");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------------------ module */
static PyMethodDef methods[] = {
    {"candidates", (PyCFunction)(void (*)(void))native_candidates, METH_FASTCALL, "Top-K, rest_lse and log q per row."},
    {"depth_step", (PyCFunction)(void (*)(void))native_depth_step, METH_FASTCALL, "One depth of the depth-wise builders."},
    {"best_first", (PyCFunction)(void (*)(void))native_best_first, METH_FASTCALL, "DDTree's best-first pops."},
    {"select_tree", (PyCFunction)(void (*)(void))native_select_tree, METH_FASTCALL, "The best n nodes as a tree."},
    {"bound_frontier", (PyCFunction)(void (*)(void))native_bound_frontier, METH_FASTCALL, "The branches the bound keeps."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", "Compiled host loops of dartree's fast backend.",
                                    -1, methods};

#ifndef DARTREE_NATIVE_SOURCE
#define DARTREE_NATIVE_SOURCE "unknown"
#endif

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddStringConstant(m, "SOURCE", DARTREE_NATIVE_SOURCE) < 0) { /* setup.py: the source's hash */
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
