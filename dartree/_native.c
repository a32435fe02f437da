/* Compiled host loops of the fast backend on CPU tensors (see dartree/native.py, the only caller).
 *
 * A draft tree has tens to hundreds of nodes: on one CPU thread the numpy / torch versions of these
 * loops cost a few microseconds per call, dozens of calls per depth.  Each function below is one call
 * that reads numpy buffers and writes preallocated numpy outputs, with the same results bit for bit:
 *
 *   candidates    per row: the K best tokens (logit descending, ties by token id; one vocabulary read),
 *                 the vocabulary normaliser rest_lse, and log q
 *   log_normalize log q = z - logaddexp(lse(z), rest), float64, one rounding to float32
 *   depth_step    one depth of the depth-wise builders: log q of every branch's candidates, child
 *                 scores (parent + log q) + beta, the best `width` (score descending, then position)
 *   bound_frontier dartree-pruned's exact bound: the branches of a depth that do not rank after the
 *                 budget-th best node so far (docs/builders.md, "Bound pruning")
 *   select_tree   the best n nodes of a depth-wise supertree in the total order, as a tree
 *   best_first    DDTree's best-first with lazy sibling pushing over per-depth sorted log q
 *   tree_struct   ancestor mask, depths, first-child and next-sibling links from parents
 *   move_rows     the KV compaction of one buffer: rows src[j] -> dst + j in every plane (memmove)
 *   greedy_accept the greedy acceptance walk over a tree's full logits: the argmax (torch.argmax's:
 *                 the first maximum, a NaN counting as the largest) only at the nodes the walk visits
 *   gru_step      one step of a GRU correction head on one sequence: the GRU cell from the gate table and
 *                 W_hh, then the corrected logits of the next depth's candidates, with torch's own
 *                 kernels for everything that rounds (MKL's sgemm_, SLEEF's expf, MKL's vmsTanh, found in
 *                 the loaded libtorch_cpu by gru_init) and the same IEEE operations in torch's order
 *                 for the rest; dartree/models/heads.py compares it with torch's ops before using it
 *   gru_build     a whole such build of one sequence: candidates, the head's per-depth terms, the depth loop
 *                 and the selection in one call
 *   gru_expand    the whole depth loop of dartree-pruned (and the other depth-wise builders) for one sequence
 *                 with such a GRU head: depth_step, bound_frontier and gru_step's arithmetic per depth, in
 *                 one call (the same functions as the three calls, so the same bits)
 *
 * Float rules: every float32 result is computed with the same IEEE operations, in the same order, as
 * the numpy / torch formula it replaces (scores: float32 additions; log q: float64 with numpy's pairwise
 * sum and logaddexp, rounded once).  Build with -ffp-contract=off so that no a*b+c becomes an fma.
 * Buffers are checked for item size, C-contiguity and length before any write; the Python side checks
 * values (NaN, ranges) through the status codes returned here.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

static int get_ssize(PyObject *obj, Py_ssize_t *out, const char *name) {
    *out = PyLong_AsSsize_t(obj);
    if (*out == -1 && PyErr_Occurred()) return -1;
    if (*out < 0) {
        PyErr_Format(PyExc_ValueError, "%s: must be >= 0", name);
        return -1;
    }
    return 0;
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
 * as candidates returns it, with *bad_row and *finite), or -1 when out of memory.  Also gru_build's first step. */
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
    if (!maxima || !keys || !scratch || (with_rest && !terms)) {
        free(maxima);
        free(keys);
        free(terms);
        free(scratch);
        return -1;
    }
    for (Py_ssize_t r = 0; r < rows && status != 1; r++) {
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
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "candidates: expected 9 arguments");
        return NULL;
    }
    Py_ssize_t rows, vocab, topk, with_rest;
    if (get_ssize(args[1], &rows, "rows") < 0 || get_ssize(args[2], &vocab, "vocab") < 0 ||
        get_ssize(args[3], &topk, "topk") < 0 || get_ssize(args[4], &with_rest, "vocab_normalize") < 0)
        return NULL;
    if (topk < 1 || topk > vocab) {
        PyErr_SetString(PyExc_ValueError, "topk: must be in 1..vocab");
        return NULL;
    }
    with_rest = with_rest && topk < vocab;
    Buf b[5];
    memset(b, 0, sizeof b);
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

/* log_normalize(z f32 [rows, K], rows, K, rest f64 [rows] | None, out f32 [rows, K]) -> 1 if any output
 * is NaN or infinite, else 0. */
static PyObject *native_log_normalize(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "log_normalize: expected 5 arguments");
        return NULL;
    }
    Py_ssize_t rows, k;
    if (get_ssize(args[1], &rows, "rows") < 0 || get_ssize(args[2], &k, "topk") < 0) return NULL;
    Buf b[3];
    memset(b, 0, sizeof b);
    if (acquire(args[0], &b[0], 4, mul(rows, k), 0, 0, "cand_logits") < 0 ||
        acquire(args[3], &b[1], 8, rows, 0, 1, "rest_lse") < 0 || acquire(args[4], &b[2], 4, mul(rows, k), 1, 0, "out") < 0) {
        release(b, 3);
        return NULL;
    }
    double *scratch = malloc(sizeof(double) * (size_t)(k ? k : 1));
    if (!scratch) {
        release(b, 3);
        return PyErr_NoMemory();
    }
    const float *z = F32(b[0]);
    const double *rest = b[1].held ? (const double *)b[1].view.buf : NULL;
    float *out = F32(b[2]);
    int bad = 0;
    if (k > 0)
        for (Py_ssize_t r = 0; r < rows; r++) bad |= normalize_row(z + r * k, k, rest ? rest + r : NULL, out + r * k, scratch);
    free(scratch);
    release(b, 3);
    return PyLong_FromLong(bad);
}

/* -------------------------------------------------------------------------------------- depth step */
/* depth_step's work on checked buffers (scratch: K doubles, child: 2 m K floats); returns nonfinite and sets
 * *identity_out.  Also the depth loop of gru_expand. */
static int depth_rows(const float *logits, Py_ssize_t b, Py_ssize_t m, Py_ssize_t k, const double *rest,
                      const float *parent, float beta, Py_ssize_t width, const int64_t *cand, float *log_q,
                      int64_t *parents, int64_t *ranks, int64_t *tokens, float *scores, const int64_t *anc_in,
                      int64_t *anc_out, Py_ssize_t gamma, Py_ssize_t depth, int64_t *gather, double *scratch,
                      float *child, int *identity_out) {
    const Py_ssize_t total = m * k;
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
            if (gather) gather[w] = r * m + par;
            if (anc_out) {
                memcpy(anc_out + w * gamma, anc_in + (r * m + par) * gamma, sizeof(int64_t) * (size_t)gamma);
                anc_out[w * gamma + depth - 1] = kept + 1;
            }
            kept++;
        }
    }
    *identity_out = identity && !bad;
    return bad;
}

/* depth_step(logits f32 [b, m, K], b, m, K, rest f64 [b] | None, parent f32 [b, m], beta (float), width,
 *            cand_tokens i64 [b, K], log_q f32 [b, m, K] (out), parents i64 [b, W], ranks i64 [b, W],
 *            tokens i64 [b, W], scores f32 [b, W], anc_in i64 [b, m, gamma] | None, anc_out i64 [b, W, gamma] | None,
 *            gamma, depth, gather i64 [b, W] | None)
 * -> (nonfinite, identity): nonfinite = some log q is NaN or infinite (nothing else is then meaningful);
 *    identity = W == m and every kept child's parent is its own index (the branch states need no gather).
 * gather: r * m + parent, the row of each kept child's parent state in the [b * m, S] states.
 *
 * Per row: log q of every branch's K candidates; child scores (parent + log q) + beta in float32; the best
 * `width` of the m*K flat positions under (score descending, position), listed in position order. */
static PyObject *native_depth_step(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 19) {
        PyErr_SetString(PyExc_TypeError, "depth_step: expected 19 arguments");
        return NULL;
    }
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
    Buf a[12];
    memset(a, 0, sizeof a);
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
        acquire(args[18], &a[11], 8, mul(b, width), 1, 1, "gather") < 0) {
        release(a, 12);
        return NULL;
    }
    if (a[9].held != a[10].held) {
        release(a, 12);
        PyErr_SetString(PyExc_ValueError, "depth_step: anc_in and anc_out go together");
        return NULL;
    }
    const float *logits = F32(a[0]), *parent = F32(a[2]);
    const double *rest = a[1].held ? (const double *)a[1].view.buf : NULL;
    const int64_t *cand = I64(a[3]), *anc_in = I64_OR_NULL(a[9]);
    float *log_q = F32(a[4]), *scores = F32(a[8]);
    int64_t *parents = I64(a[5]), *ranks = I64(a[6]), *tokens = I64(a[7]), *anc_out = I64_OR_NULL(a[10]);
    int64_t *gather = I64_OR_NULL(a[11]);
    double *scratch = malloc(sizeof(double) * (size_t)k);
    float *child = malloc(sizeof(float) * (size_t)(2 * total)); /* the scores, then a copy to select in */
    if (!scratch || !child) {
        free(scratch);
        free(child);
        release(a, 12);
        return PyErr_NoMemory();
    }
    int identity;
    int bad = depth_rows(logits, b, m, k, rest, parent, beta, width, cand, log_q, parents, ranks, tokens, scores, anc_in,
                         anc_out, gamma, depth, gather, scratch, child, &identity);
    free(scratch);
    free(child);
    release(a, 12);
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
 * nodes, -1 when out of memory.  Also gru_build's last step. */
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
    int broken = 0;
    if (!src || !depth_of || !idx || !tmp || !slot || !score || (path_in && !path)) {
        free(src); free(depth_of); free(idx); free(tmp); free(slot); free(score); free(path);
        return -1;
    }
    int few = 0;
    for (Py_ssize_t r = 0; r < b && !broken && !few; r++) {
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
            few = 1;
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
                    broken = 1;
                    break;
                }
                parent = slot[offset[d - 1] + pc];
                if (!parent) broken = 1;
            }
            o_tok[o + i + 1] = tok_in[f];
            o_par[o + i + 1] = parent;
            o_dep[o + i + 1] = d + 1;
            o_rk[o + i + 1] = rk_in[f];
            o_sc[o + i + 1] = score[j];
        }
    }
    free(src); free(depth_of); free(idx); free(tmp); free(slot); free(score); free(path);
    return broken ? 1 : few ? 2 : 0;
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
    if (nargs != 15) {
        PyErr_SetString(PyExc_TypeError, "select_tree: expected 15 arguments");
        return NULL;
    }
    Py_ssize_t b, gamma, n_out;
    if (get_ssize(args[0], &b, "b") < 0 || get_ssize(args[1], &gamma, "gamma") < 0 || get_ssize(args[3], &n_out, "n_out") < 0)
        return NULL;
    if (gamma < 1) {
        PyErr_SetString(PyExc_ValueError, "select_tree: gamma >= 1");
        return NULL;
    }
    Buf w;
    if (acquire(args[2], &w, 8, gamma, 0, 0, "widths") < 0) {
        release(&w, 1);
        return NULL;
    }
    Py_ssize_t *offset = malloc(sizeof(Py_ssize_t) * (size_t)(gamma + 1));
    if (!offset) {
        release(&w, 1);
        return PyErr_NoMemory();
    }
    offset[0] = 0;
    int bad_width = 0;
    for (Py_ssize_t d = 0; d < gamma; d++) {
        int64_t wd = I64(w)[d];
        bad_width |= wd < 0 || __builtin_add_overflow(offset[d], (Py_ssize_t)wd, &offset[d + 1]);
        if (bad_width) break;
    }
    release(&w, 1);
    if (bad_width) {
        free(offset);
        PyErr_SetString(PyExc_ValueError, "select_tree: every width must be >= 0 (and their sum representable)");
        return NULL;
    }
    Py_ssize_t total = offset[gamma];
    if (n_out > total) {
        free(offset);
        PyErr_SetString(PyExc_ValueError, "select_tree: n_out larger than the supertree");
        return NULL;
    }
    Buf a[11];
    memset(a, 0, sizeof a);
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
 * count of live frontier nodes in a row, or -1 when out of memory.  Also the depth loop of gru_expand. */
static Py_ssize_t bound_rows(Py_ssize_t b, Py_ssize_t gamma, Py_ssize_t depth, const Py_ssize_t *offset,
                             Py_ssize_t budget, const int64_t *rank, const float *score, const int64_t *paths,
                             float beta) {
    Py_ssize_t total = offset[depth], wd = offset[depth] - offset[depth - 1];
    float *vals = malloc(sizeof(float) * (size_t)(total + 1));
    Py_ssize_t *ties = malloc(sizeof(Py_ssize_t) * (size_t)(total + 1));
    Py_ssize_t *tmp = malloc(sizeof(Py_ssize_t) * (size_t)(total + 1));
    char *in = malloc((size_t)(wd + 1));
    if (!vals || !ties || !tmp || !in) {
        free(vals); free(ties); free(tmp); free(in);
        return -1;
    }
    TreeOrder order = {score, paths, gamma};
    Py_ssize_t most = 0;
    for (Py_ssize_t r = 0; r < b; r++) {
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
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "bound_frontier: expected 9 arguments");
        return NULL;
    }
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
    Buf w;
    if (acquire(args[3], &w, 8, depth, 0, 0, "widths") < 0) {
        release(&w, 1);
        return NULL;
    }
    Py_ssize_t *offset = malloc(sizeof(Py_ssize_t) * (size_t)(depth + 1));
    if (!offset) {
        release(&w, 1);
        return PyErr_NoMemory();
    }
    offset[0] = 0;
    int bad_width = 0;
    for (Py_ssize_t d = 0; d < depth && !bad_width; d++) {
        int64_t wd = I64(w)[d];
        bad_width |= wd < 0 || __builtin_add_overflow(offset[d], (Py_ssize_t)wd, &offset[d + 1]);
    }
    release(&w, 1);
    if (bad_width) {
        free(offset);
        PyErr_SetString(PyExc_ValueError, "bound_frontier: every width must be >= 0 (and their sum representable)");
        return NULL;
    }
    Py_ssize_t total = offset[depth];
    Buf a[3];
    memset(a, 0, sizeof a);
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
    if (nargs != 13) {
        PyErr_SetString(PyExc_TypeError, "best_first: expected 13 arguments");
        return NULL;
    }
    Py_ssize_t b, gamma, k, n;
    if (get_ssize(args[1], &b, "b") < 0 || get_ssize(args[2], &gamma, "gamma") < 0 ||
        get_ssize(args[3], &k, "topk") < 0 || get_ssize(args[5], &n, "n") < 0)
        return NULL;
    if (gamma < 1 || k < 1 || n < 1 || n > (Py_ssize_t)1 << 30) {
        PyErr_SetString(PyExc_ValueError, "best_first: need gamma, topk, n >= 1");
        return NULL;
    }
    Buf a[9];
    memset(a, 0, sizeof a);
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
    if (!heap || !path_rank) {
        free(heap);
        free(path_rank);
        release(a, 9);
        return PyErr_NoMemory();
    }
    int empty = 0;
    for (Py_ssize_t r = 0; r < b && !empty; r++) {
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
            if (!size) { /* n beyond the trie */
                empty = 1;
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
    if (empty) {
        PyErr_SetString(PyExc_ValueError, "best_first: n is larger than the trie of gamma depths and K candidates");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------------ tree structure */
/* tree_struct(parents i64 [b, n], num_nodes i64 [b], b, n, mask u8 [b, n, n] (zeroed by the caller),
 *             depths i64 [b, n] | None, first_child i64 [b, n] | None, next_sibling i64 [b, n] | None)
 * -> (0, 0, 0) ok | (1, row, node): num_nodes outside 0..n, or a node whose parent is outside
 *    0..num_nodes-1, or whose ancestors do not reach node 0 (a cycle).
 * mask[r, i, j] iff j is i or an ancestor of i (valid nodes only); depths: ancestors excluding self
 * (padding 0); first_child: the smallest child index, next_sibling: the next larger index with the same
 * parent (-1 if none; padding -1). */
static PyObject *native_tree_struct(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "tree_struct: expected 8 arguments");
        return NULL;
    }
    Py_ssize_t b, n;
    if (get_ssize(args[2], &b, "b") < 0 || get_ssize(args[3], &n, "n") < 0) return NULL;
    Buf a[6];
    memset(a, 0, sizeof a);
    if (acquire(args[0], &a[0], 8, mul(b, n), 0, 0, "parents") < 0 || acquire(args[1], &a[1], 8, b, 0, 0, "num_nodes") < 0 ||
        acquire(args[4], &a[2], 1, mul(mul(b, n), n), 1, 0, "mask") < 0 || acquire(args[5], &a[3], 8, mul(b, n), 1, 1, "depths") < 0 ||
        acquire(args[6], &a[4], 8, mul(b, n), 1, 1, "first_child") < 0 ||
        acquire(args[7], &a[5], 8, mul(b, n), 1, 1, "next_sibling") < 0) {
        release(a, 6);
        return NULL;
    }
    const int64_t *parents = I64(a[0]), *count = I64(a[1]);
    uint8_t *mask = (uint8_t *)a[2].view.buf;
    int64_t *depths = I64_OR_NULL(a[3]), *first = I64_OR_NULL(a[4]), *next = I64_OR_NULL(a[5]);
    int64_t *last = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    if (!last) {
        release(a, 6);
        return PyErr_NoMemory();
    }
    long status = 0, bad_row = 0, bad_node = 0;
    for (Py_ssize_t r = 0; r < b && !status; r++) {
        const int64_t *par = parents + r * n;
        int64_t c = count[r];
        if (c < 0 || c > n) {
            status = 1;
            bad_row = (long)r;
            bad_node = -1;
            break;
        }
        uint8_t *mr = mask + r * n * n;
        if (depths) for (Py_ssize_t i = 0; i < n; i++) depths[r * n + i] = 0;
        if (first) for (Py_ssize_t i = 0; i < n; i++) first[r * n + i] = -1;
        if (next) for (Py_ssize_t i = 0; i < n; i++) next[r * n + i] = -1;
        for (Py_ssize_t i = 0; i < c; i++) last[i] = -1;
        for (Py_ssize_t i = 0; i < c; i++) {
            uint8_t *row = mr + i * n;
            row[i] = 1;
            if (i == 0) continue;
            int64_t p = par[i], d = 0;
            if (p < 0 || p >= c) {
                status = 1;
                bad_row = (long)r;
                bad_node = (long)i;
                break;
            }
            if (first && first[r * n + p] < 0) first[r * n + p] = i;
            if (next && last[p] >= 0) next[r * n + last[p]] = i;
            last[p] = i;
            for (int64_t j = p;; j = par[j]) { /* every ancestor up to the root */
                row[j] = 1;
                d++;
                if (j == 0) break;
                if (d >= c || par[j] < 0 || par[j] >= c) {
                    status = 1;
                    break;
                }
            }
            if (status) {
                bad_row = (long)r;
                bad_node = (long)i;
                break;
            }
            if (depths) depths[r * n + i] = d;
        }
    }
    free(last);
    release(a, 6);
    return Py_BuildValue("(lll)", status, bad_row, bad_node);
}

/* ------------------------------------------------------------------------------------ greedy_accept */
/* torch.argmax of one row: the first index of the maximum; the first NaN if there is one.  Two passes
 * that vectorise: the maximum (16 lanes; which of -0.0 / +0.0 a lane keeps does not matter, they compare
 * equal) and NaN-ness, then the first index equal to it. */
static inline int64_t argmax_row(const float *x, Py_ssize_t v) {
    float lane[16];
    int nan[16];
    for (int k = 0; k < 16; k++) {
        lane[k] = x[0];
        nan[k] = 0;
    }
    Py_ssize_t i = 0;
    for (; i + 16 <= v; i += 16)
        for (int k = 0; k < 16; k++) {
            float y = x[i + k];
            nan[k] |= y != y;
            lane[k] = y > lane[k] ? y : lane[k];
        }
    float top = x[0];
    int any = 0;
    for (; i < v; i++) {
        any |= x[i] != x[i];
        top = x[i] > top ? x[i] : top;
    }
    for (int k = 0; k < 16; k++) {
        any |= nan[k];
        top = lane[k] > top ? lane[k] : top;
    }
    if (any) {
        for (i = 0; i < v; i++)
            if (x[i] != x[i]) return (int64_t)i;
    }
    for (i = 0; i < v; i++)
        if (x[i] == top) return (int64_t)i;
    return 0;
}

/* greedy_accept(tokens, parents, num_nodes, logits, b, n, v, picks, accepted, committed, tail):
 * per row, from the root: pick = argmax(logits[r, node]); go to the child of node whose token is the
 * pick; the pick at the last node is the bonus.  picks (PAD at the nodes never visited), accepted
 * (the path, root first, PAD after), committed (the accepted nodes' tokens, then the bonus, PAD after)
 * and tail [b, 2] (accepted length, bonus) are written.  Returns (status, row): 1 for a node count or
 * a parent out of range. */
static PyObject *native_greedy_accept(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "greedy_accept: expected 11 arguments");
        return NULL;
    }
    Py_ssize_t b, n, v;
    if (get_ssize(args[4], &b, "b") < 0 || get_ssize(args[5], &n, "n") < 0 || get_ssize(args[6], &v, "v") < 0)
        return NULL;
    if (v < 1) {
        PyErr_SetString(PyExc_ValueError, "v: must be >= 1");
        return NULL;
    }
    Buf a[8];
    memset(a, 0, sizeof a);
    if (acquire(args[0], &a[0], 8, mul(b, n), 0, 0, "tokens") < 0 || acquire(args[1], &a[1], 8, mul(b, n), 0, 0, "parents") < 0 ||
        acquire(args[2], &a[2], 8, b, 0, 0, "num_nodes") < 0 || acquire(args[3], &a[3], 4, mul(mul(b, n), v), 0, 0, "logits") < 0 ||
        acquire(args[7], &a[4], 8, mul(b, n), 1, 0, "picks") < 0 || acquire(args[8], &a[5], 8, mul(b, n), 1, 0, "accepted") < 0 ||
        acquire(args[9], &a[6], 8, mul(b, n), 1, 0, "committed") < 0 || acquire(args[10], &a[7], 8, mul(b, 2), 1, 0, "tail") < 0) {
        release(a, 8);
        return NULL;
    }
    const int64_t *tokens = I64(a[0]), *parents = I64(a[1]), *count = I64(a[2]);
    const float *logits = F32(a[3]);
    int64_t *picks = I64(a[4]), *accepted = I64(a[5]), *committed = I64(a[6]), *tail = I64(a[7]);
    long status = 0, bad_row = 0;
    for (Py_ssize_t r = 0; r < b && !status; r++) {
        const int64_t *tok = tokens + r * n, *par = parents + r * n;
        int64_t c = count[r];
        int64_t *pk = picks + r * n, *acc = accepted + r * n, *com = committed + r * n;
        for (Py_ssize_t i = 0; i < n; i++) pk[i] = acc[i] = com[i] = -1;
        if (c < 1 || c > n) {
            status = 1;
            bad_row = (long)r;
            break;
        }
        for (Py_ssize_t i = 1; i < c; i++)
            if (par[i] < 0 || par[i] >= c) {
                status = 1;
                bad_row = (long)r;
                break;
            }
        if (status) break;
        int64_t node = 0, length = 0;
        acc[0] = 0;
        for (;;) {
            int64_t pick = argmax_row(logits + (r * n + node) * v, v);
            pk[node] = pick;
            int64_t next = -1;
            for (Py_ssize_t i = 1; i < c; i++) /* siblings carry distinct tokens: the first match is the one */
                if (par[i] == node && tok[i] == pick) {
                    next = (int64_t)i;
                    break;
                }
            if (next < 0 || length + 1 >= c) {
                com[length] = pick;
                tail[r * 2] = length;
                tail[r * 2 + 1] = pick;
                break;
            }
            com[length] = tok[next];
            length++;
            acc[length] = next;
            node = next;
        }
    }
    release(a, 8);
    return Py_BuildValue("(ll)", status, bad_row);
}

/* ---------------------------------------------------------------------------------------- move_rows */
/* move_rows(buf, planes, rows, row_bytes, dst, src): in each of `planes` planes of `rows` rows of
 * `row_bytes` bytes (a contiguous [planes, rows, row] buffer), row dst + j takes row src[j], for j in
 * order.  Rows move only forwards-to-backwards (src strictly increasing, src[j] >= dst + j), so each
 * source is read before anything overwrites it; anything else is refused before any write (status 1),
 * as is a row out of range. */
static PyObject *native_move_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "move_rows: expected 6 arguments");
        return NULL;
    }
    Py_ssize_t planes, rows, row_bytes, dst;
    if (get_ssize(args[1], &planes, "planes") < 0 || get_ssize(args[2], &rows, "rows") < 0 ||
        get_ssize(args[3], &row_bytes, "row_bytes") < 0 || get_ssize(args[4], &dst, "dst") < 0)
        return NULL;
    Buf a[2];
    memset(a, 0, sizeof a);
    if (acquire(args[0], &a[0], 1, mul(mul(planes, rows), row_bytes), 1, 0, "buf") < 0 ||
        acquire(args[5], &a[1], 8, 0, 0, 0, "src") < 0) {
        release(a, 2);
        return NULL;
    }
    Py_ssize_t k = a[1].view.len / 8;
    const int64_t *src = I64(a[1]);
    long status = 0;
    for (Py_ssize_t j = 0; j < k && !status; j++)
        if (src[j] < (int64_t)(dst + j) || src[j] >= (int64_t)rows || (j > 0 && src[j] <= src[j - 1])) status = 1;
    if (dst + k > rows) status = 1;
    if (!status) {
        char *buf = (char *)a[0].view.buf;
        for (Py_ssize_t p = 0; p < planes; p++) {
            char *base = buf + p * rows * row_bytes;
            for (Py_ssize_t j = 0; j < k; j++)
                if (src[j] != (int64_t)(dst + j))
                    memmove(base + (dst + j) * row_bytes, base + (Py_ssize_t)src[j] * row_bytes, (size_t)row_bytes);
        }
    }
    release(a, 2);
    return PyLong_FromLong(status);
}

/* ----------------------------------------------------------------------------------------- gru_step */
/* torch's kernels, from the libtorch_cpu already loaded (gru_init): MKL's Fortran sgemm_ (what
 * at::native::cpublas::gemm calls for float32 mm / addmm / bmm), SLEEF's 16-lane expf (ATen's AVX-512
 * Vectorized<float>::exp, used by sigmoid and silu) and MKL VML's vmsTanh (ATen's vml::vtanh). */
typedef void (*sgemm_fn)(const char *, const char *, const int *, const int *, const int *, const float *,
                         const float *, const int *, const float *, const int *, const float *, float *, const int *);
typedef __m512 (*exp16_fn)(__m512);
typedef __m256 (*exp8_fn)(__m256);
typedef void (*vtanh_fn)(int64_t, const float *, float *, int64_t);
static sgemm_fn gru_sgemm;
static exp16_fn gru_exp16;
static exp8_fn gru_exp8;
static int gru_lanes; /* 16: ATen's AVX-512 Vectorized<float> (SLEEF's expf16), 8: its AVX2 one (expf8) */
static vtanh_fn gru_vtanh;
#define VML_MODE (0x2 | 0x140000 | 0x100) /* VML_HA | VML_FTZDAZ_OFF | VML_ERRMODE_IGNORE, as ATen's vml.h */

/* gru_init(path, lanes): find the kernels in the loaded library at `path` (never loads it); True when all
 * three are there and the CPU has the lanes' instructions: lanes 16 for AVX-512F (SLEEF's expf16, the exp
 * of ATen's AVX-512 Vectorized<float>), 8 for AVX2 + FMA (SLEEF's dispatching expf8, ATen's AVX2 one); the
 * caller passes the lanes of torch's CPU capability (AVX512 / AVX2). */
static PyObject *native_gru_init(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyUnicode_Check(args[0]) || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "gru_init: expected the library path (str) and the lanes (16 or 8)");
        return NULL;
    }
    const char *path = PyUnicode_AsUTF8(args[0]);
    const long lanes = PyLong_AsLong(args[1]);
    if (!path || PyErr_Occurred()) return NULL;
    if (lanes != 16 && lanes != 8) {
        PyErr_SetString(PyExc_ValueError, "gru_init: lanes must be 16 (AVX-512) or 8 (AVX2)");
        return NULL;
    }
    __builtin_cpu_init();
    const int cpu = lanes == 16 ? __builtin_cpu_supports("avx512f")
                                : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    void *h = cpu ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
    sgemm_fn sgemm = NULL;
    exp16_fn exp16 = NULL;
    exp8_fn exp8 = NULL;
    vtanh_fn vtanh = NULL;
    if (h) {
        sgemm = (sgemm_fn)dlsym(h, "sgemm_");
        exp16 = lanes == 16 ? (exp16_fn)dlsym(h, "Sleef_expf16_u10") : NULL;
        exp8 = lanes == 8 ? (exp8_fn)dlsym(h, "Sleef_expf8_u10") : NULL;
        vtanh = (vtanh_fn)dlsym(h, "vmsTanh");
        dlclose(h); /* RTLD_NOLOAD took a reference to the loaded library: give it back (torch keeps it) */
    }
    const int found = sgemm && vtanh && (lanes == 16 ? exp16 != NULL : exp8 != NULL);
    if (found) { /* a call that finds nothing leaves what an earlier one found */
        gru_lanes = (int)lanes;
        gru_sgemm = sgemm;
        gru_exp16 = exp16;
        gru_exp8 = exp8;
        gru_vtanh = vtanh;
    }
    return PyBool_FromLong(found);
}

/* x[i] = exp(0 - x[i]) for n % 16 == 0, 16 lanes at a time as ATen's vectorized loop */
__attribute__((target("avx512f"))) static void exp_neg16(float *x, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i += 16)
        _mm512_storeu_ps(x + i, gru_exp16(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_loadu_ps(x + i))));
}

/* the same 8 lanes at a time (ATen's AVX2 Vectorized<float>), for n % 8 == 0 */
__attribute__((target("avx2"))) static void exp_neg8(float *x, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i += 8)
        _mm256_storeu_ps(x + i, gru_exp8(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_loadu_ps(x + i))));
}

static void exp_neg(float *x, Py_ssize_t n) {
    if (gru_lanes == 16)
        exp_neg16(x, n);
    else
        exp_neg8(x, n);
}

/* C [n, m] (row-major) = A . B as torch's mm passes it to sgemm_: out[i, j] = sum_k x[i, k] w[k, j]
 * with w K-major [k, m] (trans 0, ld m) or the transposed view of a row-major [m, k] (trans 1, ld k);
 * beta 1 adds to what C holds (addmm's bias, copied in first). */
static void gemm_rows(int n, int m, int k, const float *x, int ldx, const float *w, int trans, int ldw,
                      float beta, float *c) {
    const float one = 1.0f;
    gru_sgemm(trans ? "T" : "N", "N", &m, &n, &k, &one, w, &ldw, x, &ldx, &beta, c, &m);
}

/* gru_step's arithmetic on checked buffers, once gi holds the tokens' table rows and found the next
 * candidates' rows (see gru_step).  Also the depth loop of gru_expand. */
static void gru_rows(const float *h, const float *w_hh, Py_ssize_t hh_trans, const float *bias_hh, float *gi, float *gh,
                     float *out_h, const float *w_s, Py_ssize_t s_trans, const float *part, const float *found,
                     Py_ssize_t e1, const float *base, float *mid, float *act, float *logits, Py_ssize_t n,
                     Py_ssize_t g, Py_ssize_t e, Py_ssize_t k) {
    const Py_ssize_t g3 = 3 * g;
    /* gh = bias_hh + h W_hh^T (addmm: the bias copied into every row, then beta 1) */
    if (bias_hh)
        for (Py_ssize_t i = 0; i < n; i++) memcpy(gh + i * g3, bias_hh, (size_t)g3 * sizeof(float));
    gemm_rows((int)n, (int)g3, (int)g, h, (int)g, w_hh, (int)hh_trans, hh_trans ? (int)g : (int)g3,
              bias_hh ? 1.0f : 0.0f, gh);
    for (Py_ssize_t i = 0; i < n; i++) {
        float *rz = gh + i * g3, *hn = rz + 2 * g;
        const float *xi = gi + i * g3;
        for (Py_ssize_t j = 0; j < 2 * g; j++) rz[j] = rz[j] + xi[j];
        exp_neg(rz, 2 * g);                                          /* sigmoid: 1 / (1 + exp(0 - x)) */
        for (Py_ssize_t j = 0; j < 2 * g; j++) rz[j] = 1.0f / (rz[j] + 1.0f);
        for (Py_ssize_t j = 0; j < g; j++) hn[j] = hn[j] * rz[j] + xi[2 * g + j];  /* no fma: -ffp-contract=off */
        gru_vtanh((int64_t)g, hn, hn, VML_MODE);                     /* tanh_ of one row, as ATen's strided loop */
        const float *hi = h + i * g, *z = rz + g;
        float *o = out_h + i * g;
        for (Py_ssize_t j = 0; j < g; j++) o[j] = (hi[j] - hn[j]) * z[j] + hn[j];
    }
    /* mid = out_h W_s^T + part; act = silu(mid) = mid / (1 + exp(-mid)) */
    gemm_rows((int)n, (int)e, (int)g, out_h, (int)g, w_s, (int)s_trans, s_trans ? (int)g : (int)e, 0.0f, mid);
    for (Py_ssize_t i = 0; i < n; i++)
        for (Py_ssize_t j = 0; j < e; j++) mid[i * e + j] = mid[i * e + j] + part[j];
    /* ATen's vectorized loop takes the elements two vectors (2 x lanes) at a time and the rest with the
     * scalar formula (std::exp): the silu runs over the n * e elements of one contiguous tensor */
    const Py_ssize_t total = n * e, whole = total - total % (2 * gru_lanes);
    memcpy(act, mid, (size_t)whole * sizeof(float));
    exp_neg(act, whole);
    for (Py_ssize_t j = whole; j < total; j++) act[j] = expf(-mid[j]);
    for (Py_ssize_t j = 0; j < total; j++) act[j] = mid[j] / (1.0f + act[j]);
    /* logits = act rows^T (bmm with the transposed [k, e1] rows), + bias column, + base */
    const float zero = 0.0f, one = 1.0f;
    int ki = (int)k, ni = (int)n, ei = (int)e, ld = (int)e1;
    gru_sgemm("T", "N", &ki, &ni, &ei, &one, found, &ld, act, &ei, &zero, logits, &ki);
    for (Py_ssize_t i = 0; i < n; i++) {
        float *row = logits + i * k;
        if (e1 == e + 1)
            for (Py_ssize_t j = 0; j < k; j++) row[j] = row[j] + found[j * e1 + e];
        for (Py_ssize_t j = 0; j < k; j++) row[j] = row[j] + base[j];
    }
}

/* gru_step(table, tokens, h, w_hh, hh_trans, bias_hh, gi, gh, out_h, w_s, s_trans, part, rows_table, cands,
 *          found, e1, base, mid, act, logits, n, g, e, k, v) -> status, for one sequence of n rows:
 *   gi = table[tokens]; gh = bias_hh + h W_hh^T; r, z = sigmoid(gh_rz + gi_rz);
 *   c = tanh(gh_n * r + gi_n); out_h = (h - c) * z + c             (torch's GRU cell, GRUHead._cell)
 *   mid = out_h W_s^T + part; act = silu(mid); logits = act rows^T (+ rows' bias column) + base
 *                                                                    (GRUHead._corrected, no gate)
 * table [v, 3g], w_hh [g, 3g] K-major (hh_trans 0) or [3g, g] (1), w_s [g, e] K-major or [e, g],
 * rows_table [v, e1] (a token's output row, then its bias when e1 == e + 1), cands [k] (the next depth's
 * candidates, whose rows are gathered into the scratch found [k, e1]), base [k]; scratch gi, gh [n, 3g],
 * mid, act [n, e].  g and e must be multiples of 16 (the GRU's rows are whole pairs of SLEEF vectors, as
 * ATen's loop takes them; the silu's scalar tail is ATen's too).  Status: 1 for
 * a token or candidate out of range (nothing written but scratch), 2 without gru_init. */
static PyObject *native_gru_step(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 25) {
        PyErr_SetString(PyExc_TypeError, "gru_step: expected 25 arguments");
        return NULL;
    }
    Py_ssize_t hh_trans, e1, s_trans, n, g, e, k, v;
    if (get_ssize(args[4], &hh_trans, "hh_trans") < 0 || get_ssize(args[10], &s_trans, "s_trans") < 0 ||
        get_ssize(args[15], &e1, "e1") < 0 || get_ssize(args[20], &n, "n") < 0 || get_ssize(args[21], &g, "g") < 0 ||
        get_ssize(args[22], &e, "e") < 0 || get_ssize(args[23], &k, "k") < 0 || get_ssize(args[24], &v, "v") < 0)
        return NULL;
    if (g % 16 || e % 16 || g < 16 || e < 16 || n < 1 || k < 1 || (e1 != e && e1 != e + 1) ||
        mul(n, 3 * g) > INT32_MAX || mul(k, e1) > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "gru_step: g and e must be positive multiples of 16, n and k >= 1, "
                                          "e1 e or e + 1, sizes below 2**31");
        return NULL;
    }
    if (!gru_sgemm) return PyLong_FromLong(2);
    Buf a[18];
    memset(a, 0, sizeof a);
    if (acquire(args[0], &a[0], 4, mul(v, 3 * g), 0, 0, "table") < 0 || acquire(args[1], &a[1], 8, n, 0, 0, "tokens") < 0 ||
        acquire(args[2], &a[2], 4, mul(n, g), 0, 0, "h") < 0 || acquire(args[3], &a[3], 4, mul(g, 3 * g), 0, 0, "w_hh") < 0 ||
        acquire(args[5], &a[4], 4, 3 * g, 0, 1, "bias_hh") < 0 || acquire(args[6], &a[5], 4, mul(n, 3 * g), 1, 0, "gi") < 0 ||
        acquire(args[7], &a[6], 4, mul(n, 3 * g), 1, 0, "gh") < 0 || acquire(args[8], &a[7], 4, mul(n, g), 1, 0, "out_h") < 0 ||
        acquire(args[9], &a[8], 4, mul(g, e), 0, 0, "w_s") < 0 || acquire(args[11], &a[9], 4, e, 0, 0, "part") < 0 ||
        acquire(args[12], &a[15], 4, mul(v, e1), 0, 0, "rows_table") < 0 || acquire(args[13], &a[16], 8, k, 0, 0, "cands") < 0 ||
        acquire(args[14], &a[10], 4, mul(k, e1), 1, 0, "found") < 0 || acquire(args[16], &a[11], 4, k, 0, 0, "base") < 0 ||
        acquire(args[17], &a[12], 4, mul(n, e), 1, 0, "mid") < 0 || acquire(args[18], &a[13], 4, mul(n, e), 1, 0, "act") < 0 ||
        acquire(args[19], &a[14], 4, mul(n, k), 1, 0, "logits") < 0) {
        release(a, 18);
        return NULL;
    }
    const float *table = F32(a[0]), *h = F32(a[2]), *w_hh = F32(a[3]), *w_s = F32(a[8]), *part = F32(a[9]);
    const float *rows_table = F32(a[15]), *base = F32(a[11]);
    const int64_t *cands = I64(a[16]);
    float *found = F32(a[10]);
    const float *bias_hh = a[4].held ? F32(a[4]) : NULL;
    const int64_t *tokens = I64(a[1]);
    float *gi = F32(a[5]), *gh = F32(a[6]), *out_h = F32(a[7]), *mid = F32(a[12]), *act = F32(a[13]), *logits = F32(a[14]);
    const Py_ssize_t g3 = 3 * g;
    long status = 0;
    for (Py_ssize_t i = 0; i < n && !status; i++) {
        if (tokens[i] < 0 || tokens[i] >= v) status = 1;
        else memcpy(gi + i * g3, table + tokens[i] * g3, (size_t)g3 * sizeof(float));
    }
    for (Py_ssize_t j = 0; j < k && !status; j++) {
        if (cands[j] < 0 || cands[j] >= v) status = 1;
        else memcpy(found + j * e1, rows_table + cands[j] * e1, (size_t)e1 * sizeof(float));
    }
    if (!status)
        gru_rows(h, w_hh, hh_trans, bias_hh, gi, gh, out_h, w_s, s_trans, part, found, e1, base, mid, act, logits, n, g,
                 e, k);
    release(a, 18);
    return PyLong_FromLong(status);
}

/* ------------------------------------------------------------------------------------- gru expand */
static inline double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* gru_expand(z1 f32 [K], gamma, K, widths i64 [gamma], rest f64 [gamma] | None, beta (float), budget (0: no bound),
 *            cand_tokens i64 [gamma, K], parents, ranks, tokens, gather i64 [total], scores f32 [total],
 *            paths i64 [(total + 1) gamma] | None (zeros: the root's path first), used i64 [gamma] (out),
 *            h0 f32 [G], table f32 [V, 3G], w_hh f32 [3G, G], hh_copy f32 [G, 3G] | None, hh_from,
 *            bias_hh f32 [3G] | None, w_s f32 [E, G], s_copy f32 [G, E] | None, s_from, part f32 [gamma, E],
 *            rows_table f32 [V, e1], base f32 [gamma, K], g, e, e1, v)
 * -> (status, depths, branches, head_seconds, head_calls)
 *
 * The depth loop of dartree.fast.host_builders._expand_native for one sequence with a GRU head whose steps
 * are gru_step's (dartree/models/heads.py decides that: the bundled head, every step shape checked against
 * torch's ops first): per depth depth_step's rows, bound_frontier's bound (budget > 0) once the depths hold
 * `budget` nodes, the kept branches' states gathered by parent, and gru_step's arithmetic with the K-major
 * weight copies from hh_from / s_from rows (-1: never), as that call runs them.  z1 is the root's logits
 * (depth 1), h0 its state; total = sum(widths).  The outputs are depth_step's, depth d's block at
 * offset_d, for select_tree; used[d - 1] is d's width when it was expanded, else 0; depths the depths
 * expanded, branches the branch rows scored, head_seconds the time inside the GRU steps (with their row
 * gathers), head_calls their number.  Status: 0 ok, 1 a NaN or infinite log q (the outputs are then not
 * meaningful), 2 a token or candidate outside [0, v), 3 without gru_init. */
/* The GRU head's weights as gru_step reads them (hh_copy, s_copy: the K-major copies, NULL without;
 * hh_from, s_from: the row counts from which they are used, -1 never; bias_hh NULL without biases). */
typedef struct {
    const float *table, *w_hh, *hh_copy, *bias_hh, *w_s, *s_copy, *rows_table;
    long long hh_from, s_from;
    Py_ssize_t g, e, e1, v;
} GruWeights;

/* The weights of `w` from their acquired buffers (the optional ones NULL when not held). */
static void fill_weights(GruWeights *w, const Buf *table, const Buf *w_hh, const Buf *hh_copy, const Buf *bias_hh,
                         const Buf *w_s, const Buf *s_copy, const Buf *rows_table, Py_ssize_t g, Py_ssize_t e,
                         Py_ssize_t e1, Py_ssize_t v) {
    w->table = F32(*table);
    w->w_hh = F32(*w_hh);
    w->hh_copy = hh_copy->held ? F32(*hh_copy) : NULL;
    w->bias_hh = bias_hh->held ? F32(*bias_hh) : NULL;
    w->w_s = F32(*w_s);
    w->s_copy = s_copy->held ? F32(*s_copy) : NULL;
    w->rows_table = F32(*rows_table);
    w->g = g, w->e = e, w->e1 = e1, w->v = v;
}

/* gru_expand's loop on checked buffers (widths checked: 1 <= widths[d] <= widths[d - 1] K): the status
 * (0, 1, 2 as gru_expand returns it) or -1 when out of memory, and what gru_expand returns besides. */
static int expand_gru(const float *z1, const float *h0, Py_ssize_t gamma, Py_ssize_t k, const int64_t *widths,
                      const double *rest, float beta, Py_ssize_t budget, const int64_t *cand, const float *part,
                      const float *base, const GruWeights *w, int64_t *parents, int64_t *ranks, int64_t *tokens,
                      int64_t *gather, float *scores, int64_t *paths, int64_t *used, Py_ssize_t *expanded_out,
                      Py_ssize_t *branches_out, double *seconds_out, int *calls_out) {
    Py_ssize_t most = 1;
    for (Py_ssize_t d = 0; d < gamma; d++) most = widths[d] > most ? widths[d] : most;
    const Py_ssize_t g = w->g, e = w->e, e1 = w->e1, v = w->v, g3 = 3 * g, wk = most * k;
    /* scratch: log q and child scores of a depth, the states before and after a step, the step's buffers */
    float *lq = malloc(sizeof(float) * (size_t)wk), *child = malloc(sizeof(float) * (size_t)(2 * wk));
    float *logits = malloc(sizeof(float) * (size_t)wk), *found = malloc(sizeof(float) * (size_t)(k * e1));
    float *h_in = malloc(sizeof(float) * (size_t)(most * g)), *h_out = malloc(sizeof(float) * (size_t)(most * g));
    float *gi = malloc(sizeof(float) * (size_t)(most * g3)), *gh = malloc(sizeof(float) * (size_t)(most * g3));
    float *mid = malloc(sizeof(float) * (size_t)(most * e)), *act = malloc(sizeof(float) * (size_t)(most * e));
    double *dscratch = malloc(sizeof(double) * (size_t)k);
    Py_ssize_t *offset = malloc(sizeof(Py_ssize_t) * (size_t)(gamma + 1));
    int status = 0, nomem = !lq || !child || !logits || !found || !h_in || !h_out || !gi || !gh || !mid || !act ||
                              !dscratch || !offset;
    Py_ssize_t expanded = 0, branches = 0;
    double head_seconds = 0.0;
    int head_calls = 0;
    if (!nomem) {
        for (Py_ssize_t d = 0; d < gamma; d++) used[d] = 0;
        const float *z = z1, *h = h0;
        float zero_score = 0.0f;
        const float *parent_scores = &zero_score;
        Py_ssize_t lo = 0;
        offset[0] = 0;
        for (Py_ssize_t depth = 1; depth <= gamma; depth++) {
            const Py_ssize_t width = widths[depth - 1], m = depth == 1 ? 1 : widths[depth - 2], hi = lo + width;
            const int64_t *anc_in = NULL;
            int64_t *anc_out = NULL;
            if (paths) { /* the previous depth's paths (the root's zeros at depth 1), then this depth's */
                anc_in = depth == 1 ? paths : paths + gamma + (lo - m) * gamma;
                anc_out = paths + gamma + lo * gamma;
            }
            int identity;
            if (depth_rows(z, 1, m, k, rest ? rest + depth - 1 : NULL, parent_scores, beta, width, cand + (depth - 1) * k,
                           lq, parents + lo, ranks + lo, tokens + lo, scores + lo, anc_in, anc_out, gamma, depth,
                           gather + lo, dscratch, child, &identity)) {
                status = 1;
                break;
            }
            used[depth - 1] = width;
            expanded = depth;
            branches += m;
            offset[depth] = hi;
            parent_scores = scores + lo;
            if (depth == gamma) break; /* the last depth's step would never be used */
            if (budget > 0 && hi >= budget) { /* does a branch not rank after the budget-th node? */
                Py_ssize_t keep = bound_rows(1, gamma, depth, offset, budget, ranks, scores, paths ? paths + gamma : NULL,
                                             beta);
                if (keep < 0) {
                    nomem = 1;
                    break;
                }
                if (keep == 0) break; /* nothing deeper can enter the tree */
            }
            double start = now_seconds();
            for (Py_ssize_t j = 0; j < width && !status; j++) { /* the kept branches' states and tokens' gates */
                int64_t t = tokens[lo + j];
                if (t < 0 || t >= v) status = 2;
                else {
                    memcpy(h_in + j * g, h + gather[lo + j] * g, sizeof(float) * (size_t)g);
                    memcpy(gi + j * g3, w->table + t * g3, sizeof(float) * (size_t)g3);
                }
            }
            const int64_t *next = cand + depth * k; /* C_{depth + 1} */
            for (Py_ssize_t j = 0; j < k && !status; j++) {
                if (next[j] < 0 || next[j] >= v) status = 2;
                else memcpy(found + j * e1, w->rows_table + next[j] * e1, sizeof(float) * (size_t)e1);
            }
            if (status) break;
            const int hh = w->hh_copy && w->hh_from >= 0 && width >= w->hh_from;
            const int sc = w->s_copy && w->s_from >= 0 && width >= w->s_from;
            gru_rows(h_in, hh ? w->hh_copy : w->w_hh, !hh, w->bias_hh, gi, gh, h_out, sc ? w->s_copy : w->w_s, !sc,
                     part + depth * e, found, e1, base + depth * k, mid, act, logits, width, g, e, k);
            head_seconds += now_seconds() - start;
            head_calls++;
            h = h_out; /* the next gather reads the new states from h_out into h_in */
            z = logits;
            lo = hi;
        }
    }
    free(lq); free(child); free(logits); free(found); free(h_in); free(h_out);
    free(gi); free(gh); free(mid); free(act); free(dscratch); free(offset);
    *expanded_out = expanded;
    *branches_out = branches;
    *seconds_out = head_seconds;
    *calls_out = head_calls;
    return nomem ? -1 : status;
}

/* Check a width schedule (1 <= widths[d] <= widths[d - 1] K, 1 before the first; sizes below 2**31) and
 * return its sum, or -1 with a ValueError set. */
static Py_ssize_t check_widths(const char *name, const int64_t *widths, Py_ssize_t gamma, Py_ssize_t k, Py_ssize_t g,
                               Py_ssize_t e1) {
    Py_ssize_t total = 0;
    int bad = mul(k, e1) < 0 || mul(k, e1) > INT32_MAX;
    for (Py_ssize_t d = 0, prev = 1; d < gamma && !bad; d++) {
        int64_t w = widths[d];
        bad |= w < 1 || w > mul(prev, k) || mul(w, 3 * g) < 0 || mul(w, 3 * g) > INT32_MAX ||
               __builtin_add_overflow(total, (Py_ssize_t)w, &total);
        prev = w;
    }
    if (bad) {
        PyErr_Format(PyExc_ValueError, "%s: need 1 <= widths[d] <= widths[d - 1] * K (1 before the first), sizes "
                                       "below 2**31", name);
        return -1;
    }
    return total;
}

static int gru_sizes(const char *name, Py_ssize_t gamma, Py_ssize_t k, Py_ssize_t g, Py_ssize_t e, Py_ssize_t e1,
                     Py_ssize_t v) {
    if (gamma < 1 || k < 1 || g % 16 || e % 16 || g < 16 || e < 16 || (e1 != e && e1 != e + 1) || v < 1) {
        PyErr_Format(PyExc_ValueError, "%s: need gamma, topk >= 1, g and e positive multiples of 16, e1 e or e + 1",
                     name);
        return -1;
    }
    return 0;
}

static PyObject *native_gru_expand(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 31) {
        PyErr_SetString(PyExc_TypeError, "gru_expand: expected 31 arguments");
        return NULL;
    }
    Py_ssize_t gamma, k, budget, g, e, e1, v;
    if (get_ssize(args[1], &gamma, "gamma") < 0 || get_ssize(args[2], &k, "topk") < 0 ||
        get_ssize(args[6], &budget, "budget") < 0 || get_ssize(args[27], &g, "g") < 0 || get_ssize(args[28], &e, "e") < 0 ||
        get_ssize(args[29], &e1, "e1") < 0 || get_ssize(args[30], &v, "v") < 0)
        return NULL;
    GruWeights w;
    w.hh_from = PyLong_AsLongLong(args[19]);
    if (w.hh_from == -1 && PyErr_Occurred()) return NULL;
    w.s_from = PyLong_AsLongLong(args[23]);
    if (w.s_from == -1 && PyErr_Occurred()) return NULL;
    double beta_d = PyFloat_AsDouble(args[5]);
    if (beta_d == -1.0 && PyErr_Occurred()) return NULL;
    if (budget > 0 && !(beta_d <= 0.0)) {
        PyErr_SetString(PyExc_ValueError, "gru_expand: beta must be <= 0 (a depth penalty) with the bound");
        return NULL;
    }
    if (gru_sizes("gru_expand", gamma, k, g, e, e1, v) < 0) return NULL;
    Buf a[22];
    memset(a, 0, sizeof a);
    if (acquire(args[3], &a[20], 8, gamma, 0, 0, "widths") < 0) {
        release(a, 22);
        return NULL;
    }
    Py_ssize_t total = check_widths("gru_expand", I64(a[20]), gamma, k, g, e1);
    if (total < 0 || acquire(args[0], &a[0], 4, k, 0, 0, "z1") < 0 || acquire(args[4], &a[1], 8, gamma, 0, 1, "rest") < 0 ||
        acquire(args[7], &a[2], 8, mul(gamma, k), 0, 0, "cand_tokens") < 0 ||
        acquire(args[8], &a[3], 8, total, 1, 0, "parents") < 0 || acquire(args[9], &a[4], 8, total, 1, 0, "ranks") < 0 ||
        acquire(args[10], &a[5], 8, total, 1, 0, "tokens") < 0 || acquire(args[11], &a[6], 8, total, 1, 0, "gather") < 0 ||
        acquire(args[12], &a[7], 4, total, 1, 0, "scores") < 0 ||
        acquire(args[13], &a[8], 8, mul(total + 1, gamma), 1, 1, "paths") < 0 ||
        acquire(args[14], &a[9], 8, gamma, 1, 0, "used") < 0 || acquire(args[15], &a[10], 4, g, 0, 0, "h0") < 0 ||
        acquire(args[16], &a[11], 4, mul(v, 3 * g), 0, 0, "table") < 0 ||
        acquire(args[17], &a[12], 4, mul(g, 3 * g), 0, 0, "w_hh") < 0 ||
        acquire(args[18], &a[13], 4, mul(g, 3 * g), 0, 1, "hh_copy") < 0 ||
        acquire(args[20], &a[14], 4, 3 * g, 0, 1, "bias_hh") < 0 || acquire(args[21], &a[15], 4, mul(g, e), 0, 0, "w_s") < 0 ||
        acquire(args[22], &a[16], 4, mul(g, e), 0, 1, "s_copy") < 0 ||
        acquire(args[24], &a[17], 4, mul(gamma, e), 0, 0, "part") < 0 ||
        acquire(args[25], &a[18], 4, mul(v, e1), 0, 0, "rows_table") < 0 ||
        acquire(args[26], &a[19], 4, mul(gamma, k), 0, 0, "base") < 0) {
        release(a, 22);
        return NULL;
    }
    if (!gru_sgemm) {
        release(a, 22);
        return Py_BuildValue("(inndi)", 3, (Py_ssize_t)0, (Py_ssize_t)0, 0.0, 0);
    }
    fill_weights(&w, &a[11], &a[12], &a[13], &a[14], &a[15], &a[16], &a[18], g, e, e1, v);
    Py_ssize_t expanded, branches;
    double seconds;
    int calls;
    int status;
    Py_BEGIN_ALLOW_THREADS /* no Python object is touched: other threads run meanwhile */
    status = expand_gru(F32(a[0]), F32(a[10]), gamma, k, I64(a[20]), a[1].held ? (const double *)a[1].view.buf : NULL,
                        (float)beta_d, budget, I64(a[2]), F32(a[17]), F32(a[19]), &w, I64(a[3]), I64(a[4]), I64(a[5]),
                        I64(a[6]), F32(a[7]), I64_OR_NULL(a[8]), I64(a[9]), &expanded, &branches, &seconds, &calls);
    Py_END_ALLOW_THREADS
    release(a, 22);
    if (status < 0) return PyErr_NoMemory();
    return Py_BuildValue("(inndi)", status, expanded, branches, seconds, calls);
}

/* gru_build(logits f32 [gamma, V], gamma, V, K, vocab (0/1), hidden f32 [gamma, H], H, fc1_w f32 [E, ld], ld,
 *           fc1_b f32 [E] | None, h0 f32 [G], table, w_hh, hh_copy | None, hh_from, bias_hh | None, w_s, s_copy | None,
 *           s_from, rows_table, g, e, e1, v, widths i64 [gamma], beta, budget (0: no bound), n_out, root,
 *           out i64 [4, n_out + 1] (tokens, parents, depths, ranks), out_scores f32 [n_out + 1], part f32 [gamma, E] (out))
 * -> (status, row, finite, depths, branches, head_seconds, head_calls)
 *
 * A whole depth-wise build of one sequence with a GRU head whose first depth is not corrected (prefix_len 1),
 * in one call: candidates (top-K, with `vocab` the normaliser, log q) of every depth; fc1's hidden half
 * part = fc1_b + hidden fc1_w[:, :H]^T (addmm as torch's F.linear passes it to sgemm_: the bias copied into
 * every row, then beta 1; dartree/models/heads.py compares it with torch's before using it); the depth loop
 * of gru_expand from the root state h0, with the candidates' logits as the base logits and depth 1's as its
 * logits; and select_tree's best n_out nodes, the root first.  Status: 0 ok; 1 NaN or +inf in row `row` of
 * logits; 2 fewer than K logits above -inf in row `row` (`finite` of them); 3 NaN or infinite corrected
 * logits; 4 a candidate outside [0, v); 5 without gru_init; 6 the selection not prefix-closed; 7 fewer than
 * n_out nodes (n_out above a bound's budget). */
static PyObject *native_gru_build(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 32) {
        PyErr_SetString(PyExc_TypeError, "gru_build: expected 32 arguments");
        return NULL;
    }
    Py_ssize_t gamma, vocab, k, with_rest, hsize, ld, g, e, e1, v, budget, n_out;
    if (get_ssize(args[1], &gamma, "gamma") < 0 || get_ssize(args[2], &vocab, "vocab") < 0 ||
        get_ssize(args[3], &k, "topk") < 0 || get_ssize(args[4], &with_rest, "vocab_normalize") < 0 ||
        get_ssize(args[6], &hsize, "hidden_size") < 0 || get_ssize(args[8], &ld, "ld") < 0 ||
        get_ssize(args[20], &g, "g") < 0 || get_ssize(args[21], &e, "e") < 0 || get_ssize(args[22], &e1, "e1") < 0 ||
        get_ssize(args[23], &v, "v") < 0 || get_ssize(args[26], &budget, "budget") < 0 ||
        get_ssize(args[27], &n_out, "n_out") < 0)
        return NULL;
    GruWeights w;
    w.hh_from = PyLong_AsLongLong(args[14]);
    if (w.hh_from == -1 && PyErr_Occurred()) return NULL;
    w.s_from = PyLong_AsLongLong(args[18]);
    if (w.s_from == -1 && PyErr_Occurred()) return NULL;
    long long root = PyLong_AsLongLong(args[28]);
    if (root == -1 && PyErr_Occurred()) return NULL;
    double beta_d = PyFloat_AsDouble(args[25]);
    if (beta_d == -1.0 && PyErr_Occurred()) return NULL;
    if (budget > 0 && !(beta_d <= 0.0)) {
        PyErr_SetString(PyExc_ValueError, "gru_build: beta must be <= 0 (a depth penalty) with the bound");
        return NULL;
    }
    if (gru_sizes("gru_build", gamma, k, g, e, e1, v) < 0) return NULL;
    if (k > vocab || hsize < 1 || ld < hsize || mul(gamma, e) < 0 || mul(gamma, e) > INT32_MAX || ld > INT32_MAX ||
        hsize > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "gru_build: need 1 <= topk <= vocab and 1 <= hidden_size <= ld < 2**31");
        return NULL;
    }
    with_rest = with_rest && k < vocab;
    Buf a[20];
    memset(a, 0, sizeof a);
    if (acquire(args[24], &a[0], 8, gamma, 0, 0, "widths") < 0) {
        release(a, 20);
        return NULL;
    }
    Py_ssize_t total = check_widths("gru_build", I64(a[0]), gamma, k, g, e1);
    if (total >= 0 && n_out > total) {
        PyErr_SetString(PyExc_ValueError, "gru_build: n_out larger than the supertree");
        total = -1;
    }
    if (total < 0 || acquire(args[0], &a[1], 4, mul(gamma, vocab), 0, 0, "logits") < 0 ||
        acquire(args[5], &a[2], 4, mul(gamma, hsize), 0, 0, "hidden") < 0 ||
        acquire(args[7], &a[3], 4, mul(e, ld), 0, 0, "fc1_w") < 0 || acquire(args[9], &a[4], 4, e, 0, 1, "fc1_b") < 0 ||
        acquire(args[10], &a[5], 4, g, 0, 0, "h0") < 0 || acquire(args[11], &a[6], 4, mul(v, 3 * g), 0, 0, "table") < 0 ||
        acquire(args[12], &a[7], 4, mul(g, 3 * g), 0, 0, "w_hh") < 0 ||
        acquire(args[13], &a[8], 4, mul(g, 3 * g), 0, 1, "hh_copy") < 0 ||
        acquire(args[15], &a[9], 4, 3 * g, 0, 1, "bias_hh") < 0 || acquire(args[16], &a[10], 4, mul(g, e), 0, 0, "w_s") < 0 ||
        acquire(args[17], &a[11], 4, mul(g, e), 0, 1, "s_copy") < 0 ||
        acquire(args[19], &a[12], 4, mul(v, e1), 0, 0, "rows_table") < 0 ||
        acquire(args[29], &a[13], 8, mul(4, n_out + 1), 1, 0, "out") < 0 ||
        acquire(args[30], &a[14], 4, n_out + 1, 1, 0, "out_scores") < 0 ||
        acquire(args[31], &a[15], 4, mul(gamma, e), 1, 0, "part") < 0) {
        release(a, 20);
        return NULL;
    }
    if (!gru_sgemm) {
        release(a, 20);
        return Py_BuildValue("(illnndi)", 5, 0L, 0L, (Py_ssize_t)0, (Py_ssize_t)0, 0.0, 0);
    }
    fill_weights(&w, &a[6], &a[7], &a[8], &a[9], &a[10], &a[11], &a[12], g, e, e1, v);
    const int64_t *widths = I64(a[0]);
    float *part = F32(a[15]);
    const Py_ssize_t gk = gamma * k;
    int branching = 0;
    for (Py_ssize_t d = 0; d < gamma; d++) branching |= widths[d] > 1;
    if (mul(4, total) < 0 || mul(total + 1, gamma) < 0) {
        release(a, 20);
        return PyErr_NoMemory();
    }
    int64_t *cand = malloc(sizeof(int64_t) * (size_t)gk), *ints = malloc(sizeof(int64_t) * (size_t)(4 * total));
    float *values = malloc(sizeof(float) * (size_t)gk), *log_q = malloc(sizeof(float) * (size_t)gk);
    float *rest_f = malloc(sizeof(float) * (size_t)gamma), *scores = malloc(sizeof(float) * (size_t)total);
    double *rest = malloc(sizeof(double) * (size_t)gamma);
    int64_t *paths = branching ? calloc((size_t)((total + 1) * gamma), sizeof(int64_t)) : NULL;
    int64_t *used = malloc(sizeof(int64_t) * (size_t)gamma);
    Py_ssize_t *offset = malloc(sizeof(Py_ssize_t) * (size_t)(gamma + 1));
    long status = 0, row = 0, finite = 0;
    Py_ssize_t expanded = 0, branches = 0;
    double seconds = 0.0;
    int calls = 0, nomem = !cand || !ints || !values || !log_q || !rest_f || !scores || !rest || (branching && !paths) ||
                           !used || !offset;
    Py_BEGIN_ALLOW_THREADS /* no Python object is touched: other threads run meanwhile */
    if (!nomem) {
        status = candidate_rows(F32(a[1]), gamma, vocab, k, with_rest, cand, values, with_rest ? rest_f : NULL, log_q,
                                &row, &finite);
        nomem = status < 0;
    }
    if (!nomem && !status) {
        for (Py_ssize_t d = 0; d < gamma; d++) rest[d] = rest_f[d];
        if (a[4].held)
            for (Py_ssize_t d = 0; d < gamma; d++) memcpy(part + d * e, F32(a[4]), sizeof(float) * (size_t)e);
        gemm_rows((int)gamma, (int)e, (int)hsize, F32(a[2]), (int)hsize, F32(a[3]), 1, (int)ld, a[4].held ? 1.0f : 0.0f,
                  part);
        int64_t *parents = ints, *ranks = ints + total, *tokens = ints + 2 * total, *gather = ints + 3 * total;
        int st = expand_gru(values, F32(a[5]), gamma, k, widths, with_rest ? rest : NULL, (float)beta_d, budget, cand,
                            part, values, &w, parents, ranks, tokens, gather, scores, paths, used, &expanded, &branches,
                            &seconds, &calls);
        if (st < 0) nomem = 1;
        else if (st) status = st + 2; /* 1 -> 3, 2 -> 4 */
        else {
            offset[0] = 0;
            for (Py_ssize_t d = 0; d < gamma; d++) offset[d + 1] = offset[d] + used[d];
            int64_t r = root, *out = I64(a[13]);
            Py_ssize_t n1 = n_out + 1;
            int sel = select_rows(1, gamma, offset, n_out, parents, ranks, tokens, scores, paths ? paths + gamma : NULL,
                                  &r, out, out + n1, out + 2 * n1, out + 3 * n1, F32(a[14]));
            if (sel < 0) nomem = 1;
            else if (sel) status = sel == 1 ? 6 : 7;
        }
    }
    Py_END_ALLOW_THREADS
    free(cand); free(ints); free(values); free(log_q); free(rest_f); free(scores); free(rest); free(paths); free(used);
    free(offset);
    release(a, 20);
    if (nomem) return PyErr_NoMemory();
    return Py_BuildValue("(illnndi)", (int)status, row, finite, expanded, branches, seconds, calls);
}

/* ------------------------------------------------------------------------------------------ module */
static PyMethodDef methods[] = {
    {"candidates", (PyCFunction)(void (*)(void))native_candidates, METH_FASTCALL, "Top-K, rest_lse and log q per row."},
    {"log_normalize", (PyCFunction)(void (*)(void))native_log_normalize, METH_FASTCALL, "log q of K candidates."},
    {"depth_step", (PyCFunction)(void (*)(void))native_depth_step, METH_FASTCALL, "One depth of the depth-wise builders."},
    {"best_first", (PyCFunction)(void (*)(void))native_best_first, METH_FASTCALL, "DDTree's best-first pops."},
    {"select_tree", (PyCFunction)(void (*)(void))native_select_tree, METH_FASTCALL, "The best n nodes as a tree."},
    {"bound_frontier", (PyCFunction)(void (*)(void))native_bound_frontier, METH_FASTCALL, "The branches the bound keeps."},
    {"tree_struct", (PyCFunction)(void (*)(void))native_tree_struct, METH_FASTCALL, "Mask, depths and links."},
    {"greedy_accept", (PyCFunction)(void (*)(void))native_greedy_accept, METH_FASTCALL, "The greedy walk over full logits."},
    {"move_rows", (PyCFunction)(void (*)(void))native_move_rows, METH_FASTCALL, "KV compaction of one buffer."},
    {"gru_init", (PyCFunction)(void (*)(void))native_gru_init, METH_FASTCALL, "Find torch's kernels for gru_step."},
    {"gru_step", (PyCFunction)(void (*)(void))native_gru_step, METH_FASTCALL, "One GRU head step and its logits."},
    {"gru_expand", (PyCFunction)(void (*)(void))native_gru_expand, METH_FASTCALL, "The depth loop with a GRU head."},
    {"gru_build", (PyCFunction)(void (*)(void))native_gru_build, METH_FASTCALL, "A whole build with a GRU head."},
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
