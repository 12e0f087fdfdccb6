/* kvlab's CPU decode kernels: a bf16 matrix-vector product (the weights) and decode attention
 * over the block-major KV cache, bf16 or int8 (the history). Both exist for one reason: a
 * one-token decode step should move its bytes at the memory's speed, and PyTorch's CPU
 * kernels do not (its bf16 batched matmul reads KV at 12-20 GB/s where the memory gives 40+).
 *
 * What makes them stream: each thread reads long contiguous runs (packed weight tiles, whole
 * cache blocks), prefetches a few KB ahead of itself (with the hint this machine streams best
 * with, see prefetch_line), and does its arithmetic on data already in L1 with few instructions
 * per byte: AVX-512 BF16 dot products (weights: 32 output rows in lanes, no horizontal sums;
 * keys: 4 keys x 4 query heads per tile, 16 sums in one shuffle tree), an AVX-512 exp for the
 * softmax, and V reduced 64 rows at a time so the rows stay in L1 across the head_dim tiles, its
 * bf16 widened by a shift (even dims) and a mask (odd dims) and re-interleaved once per block.
 * Where the CPU has AMX tiles (Intel Xeon since Sapphire Rapids) and the caller asks for them,
 * the batch 2-16 weights, the scores and p V run on tiles instead: on two cores the AVX-512
 * forms ran out of instructions before the memory ran out of bytes (batch-8 weights 14 GB/s per
 * core from L2, attention 22), the tile forms do not.
 * Variants measured slower and dropped: weights as row-by-x dot products (half the speed at
 * batch 8), keys one at a time (1.7x the instructions), V as bf16 row pairs in dot products
 * (faster from cache, 5-10% slower from DRAM on the reference machine).
 *
 * Built on first use by kvlab/native/__init__.py with the system C compiler
 * (-O3 -march=native -fopenmp) and called through ctypes; needs AVX512F + AVX512-BF16. Which
 * variant (prefetch hint, tiles or not) a machine runs is timed there, not guessed.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if !defined(__AVX512F__) || !defined(__AVX512BF16__)
#error "kvlab native kernels need AVX512F and AVX512-BF16 (compile with -march=native on such a CPU)"
#endif

/* AMX (Intel's tile matrix unit), where the compiler targets it and Linux grants it: built in
 * with -march=native on a CPU that has it, used when `flags` asks for it and the process may. */
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#define KVLAB_HAVE_AMX 1
#include <sys/syscall.h>
#include <unistd.h>
#else
#define KVLAB_HAVE_AMX 0
#endif

/* `flags` of the entry points: bit 0 the prefetch hint (see prefetch_line), bit 1 AMX. */
#define KVLAB_FLAG_PREFETCH_L2 1
#define KVLAB_FLAG_AMX 2

#ifndef PREFETCH_ROWS
#define PREFETCH_ROWS 32 /* rows ahead: 8 KB at head_dim 128 */
#endif
#define V_TILE_ROWS 64   /* V rows reduced per pass; 16 KB at head_dim 128, inside L1 */
#define MAX_HEAD_DIM 512 /* int8 keys are widened 4 rows at a time into a stack buffer */

const char *kvlab_native_isa(void) { return KVLAB_HAVE_AMX ? "avx512f+avx512bf16+amx-bf16" : "avx512f+avx512bf16"; }

/* 1 when this process may use AMX tiles: Linux hands the tile state out on request
 * (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA, once per process, all threads). */
int kvlab_amx_available(void) {
#if KVLAB_HAVE_AMX
    static int state = -1;
    if (state < 0) state = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
    return state;
#else
    return 0;
#endif
}

#if KVLAB_HAVE_AMX
/* The 64-byte tile configuration (palette 1): rows and bytes per row of tiles 0..7. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed, aligned(64))) tile_config;

static void configure_tiles(const int rows[8], const int colsb[8]) {
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++) {
        c.rows[i] = (uint8_t)rows[i];
        c.colsb[i] = (uint16_t)colsb[i];
    }
    _tile_loadconfig(&c);
}
#endif

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even, as torch does */
    union { float f; uint32_t u; } v = {f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40); /* NaN stays NaN */
    v.u += 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)(v.u >> 16);
}

/* hsum16 leaves the sum of input slot HSUM_SLOT[j] in lane j (the permutation is its own inverse),
 * so the accumulator of key j goes to slot HSUM_SLOT[j] and the lanes come out in key order. */
static const int HSUM_SLOT[16] = {0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15};

/* Sixteen horizontal sums at once: lane j of the result = sum of the 16 lanes of v[HSUM_SLOT[j]]. */
static inline __m512 hsum16(const __m512 *v) {
    __m512 u[8], w[4], x[2];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[i], v[i + 8], 0x44), _mm512_shuffle_f32x4(v[i], v[i + 8], 0xEE));
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[i], u[i + 4], 0x88), _mm512_shuffle_f32x4(u[i], u[i + 4], 0xDD));
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++)
        x[i] = _mm512_add_ps(_mm512_shuffle_ps(w[i], w[i + 2], 0x44), _mm512_shuffle_ps(w[i], w[i + 2], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_ps(x[0], x[1], 0x88), _mm512_shuffle_ps(x[0], x[1], 0xDD));
}

/* Software prefetch a few KB ahead of each thread's stream, with one of two hints chosen at run
 * time (kvlab.native times both on first use on a machine, kvlab.decoder.tune):
 *   KVLAB_PF_NTA (0): non-temporal. Every weight and cached K/V byte is read once per step, so on
 *     the AMD EPYC reference machine it kept them from pushing anything else out of L2/L3
 *     (+3-7% attention at ~45 GB/s, +8-15% weights at ~80 GB/s against a prefetch into L1).
 *   KVLAB_PF_L2 (1): into L2. On an Intel Xeon (Sapphire Rapids class, AVX-512 BF16 + AMX) a
 *     non-temporal prefetch fills only L1 and does not train the L2 streamer, so a core has
 *     just its ~16 L1 fill buffers in flight: 5.9 GB/s per core, 41% of the copy bandwidth
 *     for a whole step. Into L2 the same loops stream at 105-110% of the copy bandwidth
 *     (weights, read-only) and ~80% (attention).
 * __builtin_prefetch, not _mm_prefetch, in loops: GCC 12 deleted the attention loop when written
 * with the latter (no prefetch left in the attention code, 20-30% slower). */
#define KVLAB_PF_NTA 0
#define KVLAB_PF_L2 1

static inline __attribute__((always_inline)) void prefetch_line(const void *p, const int hint) {
    if (hint == KVLAB_PF_L2)
        __builtin_prefetch(p, 0, 2);
    else
        __builtin_prefetch(p, 0, 0);
}

static inline __attribute__((always_inline)) void prefetch_bytes(const void *start, int64_t n_bytes, const int hint) {
    const char *p = (const char *)start;
    for (int64_t o = 0; o < n_bytes; o += 64) prefetch_line(p + o, hint);
}

/* e^x for x <= 0 (scores minus their max), 16 lanes: 2^(x log2 e) split into an integer
 * power (scalef) and a degree-6 polynomial on [-0.5, 0.5]; relative error about 2e-7. */
static inline __m512 exp_nonpositive(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f)); /* e^-104 is below the smallest float */
    __m512 y = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
    __m512 n = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(y, n);
    __m512 p = _mm512_set1_ps(1.5353362e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3398874e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022651e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* y (M, N) = x (M, K) W^T, bf16 in and out, fp32 accumulation, K % 2 == 0. W comes packed
 * (kvlab.native.pack_weight) as [N / 32][K / 2][32][2]: per group of 32 output rows, each k pair
 * of all 32 rows side by side, so one thread reads one contiguous stream and one 64-byte load
 * holds 16 rows x 2 k. Each load feeds a BF16 dot-product instruction per row of x, against
 * that row's (x[k], x[k+1]) pair broadcast to every lane: the 16 lanes accumulate 16 different
 * output rows, so no horizontal sums are needed at all (the row-dot-product form spent as many
 * instructions reducing as multiplying at batch 8, and ran at half the speed). Rows of x go 8 at
 * a time: 16 accumulators. Returns 0. */
#define GEMV_MT 8
#define GEMV_PREFETCH_BYTES 8192

static inline __attribute__((always_inline)) void gemv_group(const uint16_t *wg, const uint16_t *x, uint16_t *y,
                                                             int64_t N, int64_t K, int64_t n0, const int MT,
                                                             const int prefetch, const int hint) {
    __m512 a0[GEMV_MT], a1[GEMV_MT];
#pragma GCC unroll 8
    for (int m = 0; m < MT; m++) a0[m] = a1[m] = _mm512_setzero_ps();
    const uint32_t *xp[GEMV_MT];
#pragma GCC unroll 8
    for (int m = 0; m < MT; m++) xp[m] = (const uint32_t *)(x + m * K);
    for (int64_t kp = 0; kp < K / 2; kp++) {
        const uint16_t *wk = wg + kp * 64;
        if (prefetch) {
            prefetch_line((const char *)wk + GEMV_PREFETCH_BYTES, hint);
            prefetch_line((const char *)wk + GEMV_PREFETCH_BYTES + 64, hint);
        }
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(wk), w1 = (__m512bh)_mm512_loadu_si512(wk + 32);
#pragma GCC unroll 8
        for (int m = 0; m < MT; m++) {
            const __m512bh xb = (__m512bh)_mm512_set1_epi32((int)xp[m][kp]);
            a0[m] = _mm512_dpbf16_ps(a0[m], w0, xb);
            a1[m] = _mm512_dpbf16_ps(a1[m], w1, xb);
        }
    }
#pragma GCC unroll 8
    for (int m = 0; m < MT; m++) { /* lanes are output rows n0..n0+15, n0+16..n0+31 */
        uint16_t out[32];
        _mm256_storeu_si256((__m256i *)out, (__m256i)_mm512_cvtneps_pbh(a0[m]));
        _mm256_storeu_si256((__m256i *)(out + 16), (__m256i)_mm512_cvtneps_pbh(a1[m]));
        const int64_t rows = N - n0 < 32 ? N - n0 : 32;
        for (int64_t r = 0; r < rows; r++) y[m * N + n0 + r] = out[r];
    }
}

/* Rows m0.. of x (up to GEMV_MT of them) against one group of 32 output rows; `hint` a literal
 * at each call so every variant is compiled with its prefetch instruction in place. */
static inline __attribute__((always_inline)) void gemv_rows(const uint16_t *wg, const uint16_t *x, uint16_t *y,
                                                            int64_t N, int64_t K, int64_t n0, int64_t rows,
                                                            const int prefetch, const int hint) {
    switch (rows < GEMV_MT ? rows : GEMV_MT) {
    case 1: gemv_group(wg, x, y, N, K, n0, 1, prefetch, hint); break;
    case 2: gemv_group(wg, x, y, N, K, n0, 2, prefetch, hint); break;
    case 3: gemv_group(wg, x, y, N, K, n0, 3, prefetch, hint); break;
    case 4: gemv_group(wg, x, y, N, K, n0, 4, prefetch, hint); break;
    case 5: gemv_group(wg, x, y, N, K, n0, 5, prefetch, hint); break;
    case 6: gemv_group(wg, x, y, N, K, n0, 6, prefetch, hint); break;
    case 7: gemv_group(wg, x, y, N, K, n0, 7, prefetch, hint); break;
    default: gemv_group(wg, x, y, N, K, n0, 8, prefetch, hint); break;
    }
}

#if KVLAB_HAVE_AMX
/* The same product on AMX tiles, for 2..16 rows of x: the packed layout is already what the
 * tile unit wants for its second operand (pairs of k side by side, "VNNI"), so one group of 32
 * output rows is two 16-column tiles read straight from the stream (16 k pairs x 64 bytes,
 * stride 128), x is a (rows x 32 k) tile, and one tile instruction does the work of 16 x rows
 * AVX-512 dot products. At batch 8 the AVX-512 form spends 16 dot products per 128 bytes and
 * runs out of core before the memory runs out of bytes (14 GB/s per core from L2, ~50 with
 * tiles). Two groups go at once, each its own stream (see gemv_m1_streams): tiles 0-1 y of
 * group a, 2-3 of group b (rows x 16 fp32 each), 4: x (rows x 32 k), 5-6: W. */
static inline __attribute__((always_inline)) void gemv_amx_pair(const uint16_t *wa, const uint16_t *wb, int64_t K,
                                                                float *ca, float *cb, const uint16_t *x,
                                                                const int hint) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t k = 0; k < K; k += 32) {
        const char *pa = (const char *)(wa + k * 32), *pb = (const char *)(wb + k * 32); /* k/2 pairs x 64 */
        for (int o = 0; o < 2048; o += 64) {
            prefetch_line(pa + GEMV_PREFETCH_BYTES + o, hint);
            prefetch_line(pb + GEMV_PREFETCH_BYTES + o, hint);
        }
        _tile_loadd(4, x + k, K * 2);
        _tile_loadd(5, pa, 128);
        _tile_loadd(6, pa + 64, 128);
        _tile_dpbf16ps(0, 4, 5);
        _tile_dpbf16ps(1, 4, 6);
        _tile_loadd(5, pb, 128);
        _tile_loadd(6, pb + 64, 128);
        _tile_dpbf16ps(2, 4, 5);
        _tile_dpbf16ps(3, 4, 6);
    }
    _tile_stored(0, ca, 128);
    _tile_stored(1, ca + 16, 128);
    _tile_stored(2, cb, 128);
    _tile_stored(3, cb + 16, 128);
}

static inline void gemv_amx_store(const float *c, uint16_t *y, int64_t M, int64_t N, int64_t n0) {
    const int64_t rows = N - n0 < 32 ? N - n0 : 32;
    for (int64_t m = 0; m < M; m++) {
        uint16_t out[32];
        _mm256_storeu_si256((__m256i *)out, (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(c + m * 32)));
        _mm256_storeu_si256((__m256i *)(out + 16), (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(c + m * 32 + 16)));
        for (int64_t r = 0; r < rows; r++) y[m * N + n0 + r] = out[r];
    }
}

static void gemv_amx(const uint16_t *Wp, const uint16_t *x, uint16_t *y, int64_t M, int64_t N, int64_t K,
                     int nthreads, const int hint_l2) {
    const int64_t groups = (N + 31) / 32;
#pragma omp parallel num_threads(nthreads)
    {
        const int rows[8] = {(int)M, (int)M, (int)M, (int)M, (int)M, 16, 16, 0};
        const int colsb[8] = {64, 64, 64, 64, 64, 64, 64, 0};
        configure_tiles(rows, colsb);
        const int64_t nt = omp_get_num_threads(), tid = omp_get_thread_num();
        const int64_t g0 = groups * tid / nt, g1 = groups * (tid + 1) / nt, half = (g1 - g0 + 1) / 2;
        float ca[16 * 32] __attribute__((aligned(64))), cb[16 * 32] __attribute__((aligned(64)));
        for (int64_t i = 0; i < half; i++) { /* groups g0 + i and g0 + half + i: two streams */
            const int64_t ga = g0 + i, gb = g0 + half + i < g1 ? g0 + half + i : ga;
            const uint16_t *wa = Wp + ga * 32 * K, *wb = Wp + gb * 32 * K;
            if (hint_l2)
                gemv_amx_pair(wa, wb, K, ca, cb, x, KVLAB_PF_L2);
            else
                gemv_amx_pair(wa, wb, K, ca, cb, x, KVLAB_PF_NTA);
            gemv_amx_store(ca, y, M, N, ga * 32);
            if (gb != ga) gemv_amx_store(cb, y, M, N, gb * 32);
        }
        _tile_release();
    }
}
#endif

/* Batch 1, GEMV_STREAMS groups of 32 output rows at once, each from its own quarter of the
 * thread's share of W: a core reading one stream stalls on its few outstanding misses (on a
 * 2-core Intel Xeon VM: ~11 GB/s per core, 21 GB/s in all, below the copy bandwidth); four
 * streams keep more lines in flight (+20-30% there, 27-29 GB/s). Rows of W in [g0, g1). */
#define GEMV_STREAMS 4
static inline __attribute__((always_inline)) void gemv_m1_streams(const uint16_t *Wp, const uint16_t *x, uint16_t *y,
                                                                  int64_t N, int64_t K, int64_t g0, int64_t g1,
                                                                  const int hint) {
    const int64_t per = (g1 - g0 + GEMV_STREAMS - 1) / GEMV_STREAMS;
    const uint32_t *xp = (const uint32_t *)x;
    for (int64_t i = 0; i < per; i++) {
        __m512 a0[GEMV_STREAMS], a1[GEMV_STREAMS];
        const uint16_t *w[GEMV_STREAMS];
        int64_t g[GEMV_STREAMS];
#pragma GCC unroll 4
        for (int j = 0; j < GEMV_STREAMS; j++) {
            g[j] = g0 + j * per + i;
            w[j] = Wp + (g[j] < g1 ? g[j] : g0 + i) * 32 * K; /* a stream past the end repeats one */
            a0[j] = a1[j] = _mm512_setzero_ps();
        }
        for (int64_t kp = 0; kp < K / 2; kp++) {
            const __m512bh xb = (__m512bh)_mm512_set1_epi32((int)xp[kp]);
#pragma GCC unroll 4
            for (int j = 0; j < GEMV_STREAMS; j++) {
                const uint16_t *wk = w[j] + kp * 64;
                prefetch_line((const char *)wk + GEMV_PREFETCH_BYTES, hint);
                prefetch_line((const char *)wk + GEMV_PREFETCH_BYTES + 64, hint);
                a0[j] = _mm512_dpbf16_ps(a0[j], (__m512bh)_mm512_loadu_si512(wk), xb);
                a1[j] = _mm512_dpbf16_ps(a1[j], (__m512bh)_mm512_loadu_si512(wk + 32), xb);
            }
        }
        for (int j = 0; j < GEMV_STREAMS; j++) {
            if (g[j] >= g1) continue;
            uint16_t out[32];
            _mm256_storeu_si256((__m256i *)out, (__m256i)_mm512_cvtneps_pbh(a0[j]));
            _mm256_storeu_si256((__m256i *)(out + 16), (__m256i)_mm512_cvtneps_pbh(a1[j]));
            const int64_t n0 = g[j] * 32, rows = N - n0 < 32 ? N - n0 : 32;
            for (int64_t r = 0; r < rows; r++) y[n0 + r] = out[r];
        }
    }
}

/* `flags`: KVLAB_FLAG_PREFETCH_L2 (else non-temporal), KVLAB_FLAG_AMX (tiles for 2..16 rows of x
 * with K % 32 == 0, where this process may use them). In the AVX-512 form the first GEMV_MT rows
 * of x prefetch the weights; later rows find them in cache. Returns 0. */
int kvlab_gemv_bf16(const uint16_t *Wp, const uint16_t *x, uint16_t *y, int64_t M, int64_t N, int64_t K,
                     int nthreads, int flags) {
    const int hint_l2 = flags & KVLAB_FLAG_PREFETCH_L2;
#if KVLAB_HAVE_AMX
    if ((flags & KVLAB_FLAG_AMX) && M >= 2 && M <= 16 && K % 32 == 0 && kvlab_amx_available()) {
        gemv_amx(Wp, x, y, M, N, K, nthreads, hint_l2);
        return 0;
    }
#endif
    const int64_t groups = (N + 31) / 32;
    if (M == 1) {
#pragma omp parallel num_threads(nthreads)
        {
            const int64_t nt = omp_get_num_threads(), tid = omp_get_thread_num();
            const int64_t g0 = groups * tid / nt, g1 = groups * (tid + 1) / nt;
            if (hint_l2)
                gemv_m1_streams(Wp, x, y, N, K, g0, g1, KVLAB_PF_L2);
            else
                gemv_m1_streams(Wp, x, y, N, K, g0, g1, KVLAB_PF_NTA);
        }
        return 0;
    }
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t g = 0; g < groups; g++) {
        const uint16_t *wg = Wp + g * 32 * K;
        for (int64_t m0 = 0; m0 < M; m0 += GEMV_MT) {
            const uint16_t *xr = x + m0 * K;
            uint16_t *yr = y + m0 * N;
            const int pf = m0 == 0;
            if (hint_l2)
                gemv_rows(wg, xr, yr, N, K, g * 32, M - m0, pf, KVLAB_PF_L2);
            else
                gemv_rows(wg, xr, yr, N, K, g * 32, M - m0, pf, KVLAB_PF_NTA);
        }
    }
    return 0;
}

/* 32 keys of a row as bf16: bf16 storage as is; int8 widened (exact: |v| <= 127 fits bf16). */
static inline __m512bh key32(const void *row, int64_t d, const int QUANT) {
    if (!QUANT) return (__m512bh)_mm512_loadu_si512((const uint16_t *)row + d);
    const int8_t *p = (const int8_t *)row + d;
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
    const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 16))));
    return _mm512_cvtne2ps_pbh(hi, lo);
}

/* 16 int8 values of a row as fp32 (bf16 rows are widened in place, see the V loop). */
static inline __m512 int8x16_to_f32(const void *row, int64_t d) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)((const int8_t *)row + d))));
}

#if KVLAB_HAVE_AMX
/* Word indices that interleave two rows a, b of 32 values: (a0 b0 a1 b1 ... a15 b15), then the
 * same for a16..a31 (a permutex2var index: 0-31 pick from a, 32-63 from b). */
static const uint16_t PAIR_LO[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                     8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
static const uint16_t PAIR_HI[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                     24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};

/* o (G, D) += p V on AMX tiles, 32 keys at a time. The tile unit wants V with pairs of keys
 * side by side per dimension ("VNNI"): each 32 keys are re-laid into vbuf (two rows merged by
 * one permute per 32 dims; int8 widened to bf16 on the way, exactly) while they are in L1, and
 * rows past n are zeros, not whatever a stale cache slot holds. p goes in as two bf16 tiles,
 * p = hi + lo (hi = p rounded, lo = the rest rounded): products summed in fp32 keep p to about
 * 16 bits, closer than PyTorch's bf16 p. Tiles 0-3: o (G x 16 fp32 each), 4-5: p hi/lo
 * (G x 32 keys), 6-7: V (16 key pairs x 16 dims). Against the AVX-512 form (16 FMAs and four
 * widenings per V row and head group) this is a permute and a store per 64 bytes of V. */
static inline __attribute__((always_inline)) void attend_values_amx(const void *vb, const float *s, float *o,
                                                                    int64_t n, int64_t G, int64_t BLK, int64_t D,
                                                                    const void *kn, int64_t nn, const int QUANT,
                                                                    const int HINT) {
    const int64_t row_bytes = QUANT ? D : 2 * D;
#define VROW(t) ((const char *)vb + (t) * row_bytes)
    const int64_t blk32 = (BLK + 31) / 32 * 32;
    uint16_t *phi = (uint16_t *)(s + (G * BLK + 15) / 16 * 16), *plo = phi + G * blk32;
    for (int64_t g = 0; g < G; g++) { /* p = hi + lo, zeros past n up to the 32-key boundary */
        const float *sg = s + g * BLK;
        for (int64_t t = 0; t < (n + 31) / 32 * 32; t += 16) {
            const __mmask16 k = t + 16 <= n ? (__mmask16)0xffff : t < n ? (__mmask16)((1u << (n - t)) - 1u) : 0;
            const __m512 p = _mm512_maskz_loadu_ps(k, sg + t);
            const __m256bh hi = _mm512_cvtneps_pbh(p);
            const __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)hi), 16));
            _mm256_storeu_si256((__m256i *)(phi + g * blk32 + t), (__m256i)hi);
            _mm256_storeu_si256((__m256i *)(plo + g * blk32 + t), (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(p, back)));
        }
    }
    const int rows[8] = {(int)G, (int)G, (int)G, (int)G, (int)G, (int)G, 16, 16};
    const int colsb[8] = {64, 64, 64, 64, 64, 64, 64, 64};
    configure_tiles(rows, colsb);
    uint16_t vbuf[32 * MAX_HEAD_DIM] __attribute__((aligned(64))); /* [D/16][16 key pairs][16 dims x 2] */
    const __m512i lo_idx = _mm512_loadu_si512(PAIR_LO), hi_idx = _mm512_loadu_si512(PAIR_HI);
    for (int64_t t0 = 0; t0 < n; t0 += 32) {
        for (int64_t kp = 0; kp < 16; kp++) {
            const int64_t r0 = t0 + 2 * kp, r1 = r0 + 1;
            if (r0 + PREFETCH_ROWS < n) prefetch_bytes(VROW(r0 + PREFETCH_ROWS), 2 * row_bytes, HINT);
            if (HINT == KVLAB_PF_L2 && kn && r0 < nn) /* the next block's keys, meanwhile */
                prefetch_bytes((const char *)kn + r0 * row_bytes, 2 * row_bytes, HINT);
            for (int64_t d = 0; d < D; d += 32) {
                const __m512i a = r0 < n ? (__m512i)key32(VROW(r0), d, QUANT) : _mm512_setzero_si512();
                const __m512i b = r1 < n ? (__m512i)key32(VROW(r1), d, QUANT) : _mm512_setzero_si512();
                _mm512_store_si512(vbuf + ((d / 16) * 16 + kp) * 32, _mm512_permutex2var_epi16(a, lo_idx, b));
                _mm512_store_si512(vbuf + ((d / 16 + 1) * 16 + kp) * 32, _mm512_permutex2var_epi16(a, hi_idx, b));
            }
        }
        for (int64_t c = 0; c < D / 16; c += 4) { /* 64 dims: four o tiles */
            float *oc = o + c * 16;
            _tile_loadd(0, oc, D * 4);
            _tile_loadd(1, oc + 16, D * 4);
            _tile_loadd(2, oc + 32, D * 4);
            _tile_loadd(3, oc + 48, D * 4);
            _tile_loadd(4, phi + t0, blk32 * 2);
            _tile_loadd(5, plo + t0, blk32 * 2);
            _tile_loadd(6, vbuf + (c + 0) * 512, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(0, 5, 6);
            _tile_loadd(7, vbuf + (c + 1) * 512, 64);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(1, 5, 7);
            _tile_loadd(6, vbuf + (c + 2) * 512, 64);
            _tile_dpbf16ps(2, 4, 6);
            _tile_dpbf16ps(2, 5, 6);
            _tile_loadd(7, vbuf + (c + 3) * 512, 64);
            _tile_dpbf16ps(3, 4, 7);
            _tile_dpbf16ps(3, 5, 7);
            _tile_stored(0, oc, D * 4);
            _tile_stored(1, oc + 16, D * 4);
            _tile_stored(2, oc + 32, D * 4);
            _tile_stored(3, oc + 48, D * 4);
        }
    }
#undef VROW
}
#endif

/* One block of one (sequence, KV head): scores, local softmax, and p V for its G query heads.
 * Writes o (G, D) unnormalised, and per head the local max m and sum l (split-K, as in
 * flash-decoding: blocks are independent, combined afterwards). QUANT: K/V are int8 with one
 * fp16 scale per token (ks, vs), applied to the scores and to p, never to the big tensors. */
static inline __attribute__((always_inline)) void attend_block(
        const uint16_t *q, const void *kb, const void *vb, const uint16_t *ks, const uint16_t *vs, int64_t n,
        int64_t G, int64_t BLK, int64_t D, float *s, float *o, float *m_out, float *l_out, const void *kn,
        int64_t nn, const int QUANT, const int HINT, const int AMX) {
    const int64_t row_bytes = QUANT ? D : 2 * D;
#define KROW(t) ((const char *)kb + (t) * row_bytes)
#define VROW(t) ((const char *)vb + (t) * row_bytes)
    /* scores, 4 keys x 4 query heads at a time: each loaded chunk of a key or a query feeds four
     * dot-product instructions, and the 16 sums come out of one 16-way horizontal sum (a dozen
     * shuffles instead of 16 reductions). int8 keys are widened to bf16 once, into kbuf. */
    uint16_t kbuf[QUANT ? 16 * MAX_HEAD_DIM : 1];
    int64_t t = 0;
#if KVLAB_HAVE_AMX
    if (AMX) { /* 16 keys x G heads per tile product: 0-1 scores (16 keys x G fp32), 2-3 keys, 4-5 q */
        const int rows[8] = {16, 16, 16, 16, 16, 16, 0, 0};
        const int colsb[8] = {(int)G * 4, (int)G * 4, 64, 64, (int)G * 4, (int)G * 4, 0, 0};
        configure_tiles(rows, colsb);
        uint32_t qv[MAX_HEAD_DIM / 2 * 16]; /* [D/32][16 dim pairs][G]: q as the tile unit's B */
        const uint32_t *q32 = (const uint32_t *)q;
        for (int64_t c = 0; c < D / 32; c++)
            for (int64_t kp = 0; kp < 16; kp++)
                for (int64_t g = 0; g < G; g++) qv[(c * 16 + kp) * G + g] = q32[g * (D / 2) + c * 16 + kp];
        float c0[16 * 16] __attribute__((aligned(64))), c1[16 * 16] __attribute__((aligned(64)));
        for (; t + 16 <= n; t += 16) {
            if (t + PREFETCH_ROWS < n) prefetch_bytes(KROW(t + PREFETCH_ROWS), 16 * row_bytes, HINT);
            if (HINT == KVLAB_PF_L2 && t + PREFETCH_ROWS < n) /* V as a second stream: see below */
                prefetch_bytes(VROW(t + PREFETCH_ROWS), 16 * row_bytes, HINT);
            const char *rows = KROW(t);
            int64_t stride = row_bytes;
            if (QUANT) {
                for (int j = 0; j < 16; j++)
                    for (int64_t d = 0; d < D; d += 32) _mm512_storeu_si512(kbuf + j * D + d, (__m512i)key32(KROW(t + j), d, 1));
                rows = (const char *)kbuf;
                stride = 2 * D;
            }
            _tile_zero(0);
            _tile_zero(1);
            for (int64_t c = 0; c < D / 32; c += 2) { /* D % 64 == 0: chunks in pairs, two accumulators */
                _tile_loadd(2, rows + c * 64, stride);
                _tile_loadd(4, qv + c * 16 * G, G * 4);
                _tile_loadd(3, rows + (c + 1) * 64, stride);
                _tile_loadd(5, qv + (c + 1) * 16 * G, G * 4);
                _tile_dpbf16ps(0, 2, 4);
                _tile_dpbf16ps(1, 3, 5);
            }
            _tile_stored(0, c0, G * 4); /* row i: key t + i, column g: head g */
            _tile_stored(1, c1, G * 4);
            for (int i = 0; i < 16; i++) {
                const float scale = QUANT ? _cvtsh_ss(ks[t + i]) : 1.0f;
                for (int64_t g = 0; g < G; g++) s[g * BLK + t + i] = (c0[i * G + g] + c1[i * G + g]) * scale;
            }
        }
    }
#endif
    for (; t + 4 <= n; t += 4) {
        if (t + PREFETCH_ROWS < n) prefetch_bytes(KROW(t + PREFETCH_ROWS), 4 * row_bytes, HINT);
        /* Into L2, V is fetched while the keys are scored: two streams in flight instead of one
         * (see gemv_m1_streams), and the block's V (256 KB at head_dim 128) waits in L2 for p V.
         * Not with a non-temporal hint: those lines would leave L1 long before p V reads them. */
        if (HINT == KVLAB_PF_L2 && t + PREFETCH_ROWS < n) prefetch_bytes(VROW(t + PREFETCH_ROWS), 4 * row_bytes, HINT);
        const uint16_t *rows = (const uint16_t *)KROW(t);
        __m512 scale = _mm512_set1_ps(1.0f);
        if (QUANT) {
            for (int j = 0; j < 4; j++)
                for (int64_t d = 0; d < D; d += 32) _mm512_storeu_si512(kbuf + j * D + d, (__m512i)key32(KROW(t + j), d, 1));
            rows = kbuf;
            scale = _mm512_broadcast_f32x4(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(ks + t)))); /* lane 4i+j: key j */
        }
        for (int64_t g0 = 0; g0 < G; g0 += 4) {
            const uint16_t *qg[4];
            for (int i = 0; i < 4; i++) qg[i] = q + (g0 + i < G ? g0 + i : G - 1) * D;
            __m512 acc[16];
#pragma GCC unroll 16
            for (int j = 0; j < 16; j++) acc[j] = _mm512_setzero_ps();
            for (int64_t d = 0; d < D; d += 32) {
                __m512bh kv[4], qv[4];
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) kv[j] = (__m512bh)_mm512_loadu_si512(rows + j * D + d);
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) qv[i] = (__m512bh)_mm512_loadu_si512(qg[i] + d);
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
                    for (int j = 0; j < 4; j++) acc[HSUM_SLOT[4 * i + j]] = _mm512_dpbf16_ps(acc[HSUM_SLOT[4 * i + j]], kv[j], qv[i]);
            }
            const __m512 sums = _mm512_mul_ps(hsum16(acc), scale); /* lane 4i + j: head g0 + i, key t + j */
            _mm_storeu_ps(s + g0 * BLK + t, _mm512_castps512_ps128(sums));
            if (g0 + 1 < G) _mm_storeu_ps(s + (g0 + 1) * BLK + t, _mm512_extractf32x4_ps(sums, 1));
            if (g0 + 2 < G) _mm_storeu_ps(s + (g0 + 2) * BLK + t, _mm512_extractf32x4_ps(sums, 2));
            if (g0 + 3 < G) _mm_storeu_ps(s + (g0 + 3) * BLK + t, _mm512_extractf32x4_ps(sums, 3));
        }
    }
    for (; t < n; t++) { /* the last < 4 keys: one reduction each */
        const void *kr = KROW(t);
        const float scale = QUANT ? _cvtsh_ss(ks[t]) : 1.0f;
        for (int64_t g = 0; g < G; g++) {
            __m512 acc = _mm512_setzero_ps();
            for (int64_t d = 0; d < D; d += 32)
                acc = _mm512_dpbf16_ps(acc, key32(kr, d, QUANT), (__m512bh)_mm512_loadu_si512(q + g * D + d));
            s[g * BLK + t] = _mm512_reduce_add_ps(acc) * scale;
        }
    }
    for (int64_t g = 0; g < G; g++) { /* local softmax numerators */
        float *sg = s + g * BLK;
        __m512 mv = _mm512_set1_ps(-INFINITY);
        t = 0;
        for (; t + 16 <= n; t += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(sg + t));
        float m = _mm512_reduce_max_ps(mv);
        for (; t < n; t++) m = sg[t] > m ? sg[t] : m;
        const __m512 mb = _mm512_set1_ps(m);
        __m512 lv = _mm512_setzero_ps();
        for (t = 0; t + 16 <= n; t += 16) {
            __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(sg + t), mb));
            _mm512_storeu_ps(sg + t, e);
            lv = _mm512_add_ps(lv, e);
        }
        if (t < n) {
            __mmask16 k = (__mmask16)((1u << (n - t)) - 1u);
            __m512 e = _mm512_maskz_mov_ps(k, exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, sg + t), mb)));
            _mm512_mask_storeu_ps(sg + t, k, e);
            lv = _mm512_add_ps(lv, e);
        }
        m_out[g] = m;
        l_out[g] = _mm512_reduce_add_ps(lv);
        if (QUANT)
            for (t = 0; t < n; t++) sg[t] *= _cvtsh_ss(vs[t]); /* p x v_scale: V's scale moves onto p */
    }
    for (int64_t i = 0; i < G * D; i++) o[i] = 0.0f;
#if KVLAB_HAVE_AMX
    if (AMX) {
        attend_values_amx(vb, s, o, n, G, BLK, D, kn, nn, QUANT, HINT);
        return;
    }
#endif
    for (int64_t t0 = 0; t0 < n; t0 += V_TILE_ROWS) { /* o += p V, 64 rows x 4 heads x 64 dims at a time */
        const int64_t t1 = t0 + V_TILE_ROWS < n ? t0 + V_TILE_ROWS : n;
        for (int64_t g0 = 0; g0 < G; g0 += 4) {
            const float *p0 = s + (g0 + 0 < G ? g0 + 0 : G - 1) * BLK, *p1 = s + (g0 + 1 < G ? g0 + 1 : G - 1) * BLK;
            const float *p2 = s + (g0 + 2 < G ? g0 + 2 : G - 1) * BLK, *p3 = s + (g0 + 3 < G ? g0 + 3 : G - 1) * BLK;
            for (int64_t d0 = 0; d0 < D; d0 += 64) {
                __m512 a[4][4];
                for (int i = 0; i < 4; i++)
                    for (int c = 0; c < 4; c++)
                        a[i][c] = g0 + i < G ? _mm512_loadu_ps(o + (g0 + i) * D + d0 + 16 * c) : _mm512_setzero_ps();
                for (int64_t t = t0; t < t1; t++) {
                    const void *vr = VROW(t);
                    if (d0 == 0 && g0 == 0 && t + PREFETCH_ROWS < n) prefetch_bytes(VROW(t + PREFETCH_ROWS), row_bytes, HINT);
                    if (HINT == KVLAB_PF_L2 && d0 == 0 && g0 == 0 && kn && t < nn) /* the next block's keys */
                        prefetch_bytes((const char *)kn + t * row_bytes, row_bytes, HINT);
                    __m512 v0, v1, v2, v3;
                    if (QUANT) {
                        v0 = int8x16_to_f32(vr, d0); v1 = int8x16_to_f32(vr, d0 + 16);
                        v2 = int8x16_to_f32(vr, d0 + 32); v3 = int8x16_to_f32(vr, d0 + 48);
                    } else { /* 32 bf16 per load: even dims by a shift, odd dims by a mask, no widening */
                        const __m512i w0 = _mm512_loadu_si512((const uint16_t *)vr + d0);
                        const __m512i w1 = _mm512_loadu_si512((const uint16_t *)vr + d0 + 32);
                        const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
                        v0 = _mm512_castsi512_ps(_mm512_slli_epi32(w0, 16)); v1 = _mm512_castsi512_ps(_mm512_and_si512(w0, hi));
                        v2 = _mm512_castsi512_ps(_mm512_slli_epi32(w1, 16)); v3 = _mm512_castsi512_ps(_mm512_and_si512(w1, hi));
                    }
#define KVLAB_ROW(i, pi)                                                                                    \
    do {                                                                                                    \
        const __m512 w = _mm512_set1_ps(pi[t]);                                                             \
        a[i][0] = _mm512_fmadd_ps(w, v0, a[i][0]); a[i][1] = _mm512_fmadd_ps(w, v1, a[i][1]);              \
        a[i][2] = _mm512_fmadd_ps(w, v2, a[i][2]); a[i][3] = _mm512_fmadd_ps(w, v3, a[i][3]);              \
    } while (0)
                    KVLAB_ROW(0, p0); KVLAB_ROW(1, p1); KVLAB_ROW(2, p2); KVLAB_ROW(3, p3);
#undef KVLAB_ROW
                }
                for (int i = 0; i < 4 && g0 + i < G; i++)
                    for (int c = 0; c < 4; c++) _mm512_storeu_ps(o + (g0 + i) * D + d0 + 16 * c, a[i][c]);
            }
        }
    }
    if (!QUANT) { /* bf16: each 32 dims were summed as 16 even then 16 odd; interleave them back */
        const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
        const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
        for (int64_t i = 0; i < G * D; i += 32) {
            const __m512 even = _mm512_loadu_ps(o + i), odd = _mm512_loadu_ps(o + i + 16);
            _mm512_storeu_ps(o + i, _mm512_permutex2var_ps(even, lo, odd));
            _mm512_storeu_ps(o + i + 16, _mm512_permutex2var_ps(even, hi, odd));
        }
    }
}
#undef KROW
#undef VROW

/* One out-of-line copy per storage type; the flags pick one of the inlined bodies. */
#define KVLAB_ATTEND(QUANT, KS, VS)                                                                    \
    do {                                                                                               \
        const int l2 = flags & KVLAB_FLAG_PREFETCH_L2;                                                 \
        if (KVLAB_HAVE_AMX && (flags & KVLAB_FLAG_AMX)) {                                              \
            if (l2) attend_block(q, kb, vb, KS, VS, n, G, BLK, D, s, o, m, l, kn, nn, QUANT, KVLAB_PF_L2, 1);  \
            else attend_block(q, kb, vb, KS, VS, n, G, BLK, D, s, o, m, l, kn, nn, QUANT, KVLAB_PF_NTA, 1);    \
        } else {                                                                                       \
            if (l2) attend_block(q, kb, vb, KS, VS, n, G, BLK, D, s, o, m, l, kn, nn, QUANT, KVLAB_PF_L2, 0);  \
            else attend_block(q, kb, vb, KS, VS, n, G, BLK, D, s, o, m, l, kn, nn, QUANT, KVLAB_PF_NTA, 0);    \
        }                                                                                              \
    } while (0)

static __attribute__((noinline)) void attend_block_bf16(const uint16_t *q, const void *kb, const void *vb, int64_t n,
                                                        int64_t G, int64_t BLK, int64_t D, float *s, float *o,
                                                        float *m, float *l, const void *kn, int64_t nn, int flags) {
    KVLAB_ATTEND(0, NULL, NULL);
}

static __attribute__((noinline)) void attend_block_int8(const uint16_t *q, const void *kb, const void *vb,
                                                        const uint16_t *ks, const uint16_t *vs, int64_t n, int64_t G,
                                                        int64_t BLK, int64_t D, float *s, float *o, float *m, float *l,
                                                        const void *kn, int64_t nn, int flags) {
    KVLAB_ATTEND(1, ks, vs);
}
#undef KVLAB_ATTEND

/* Rows of block j a sequence of `length` positions attends (0 past its end, BLK before it). */
static inline int64_t valid_rows(int64_t length, int64_t j, int64_t BLK) {
    const int64_t n = length - j * BLK;
    return n > BLK ? BLK : n;
}

/* Decode attention: one query token per sequence against its first lengths[b] cached positions.
 * q (B, KV, G, D) bf16, already scaled by 1/sqrt(D); k, v (NB, B, KV, BLK, D) block-major, bf16,
 * or int8 with fp16 scales ks, vs (NB, B, KV, BLK) (NULL for bf16); lengths (B) int64;
 * out (B, KV, G, D) fp32. D % 64 == 0.
 * Work items are (block, sequence, KV head): enough to keep every thread busy at batch 1.
 * Returns 0, or -1 when scratch memory cannot be allocated (out untouched). */
static int decode_attention(const uint16_t *q, const void *k, const void *v, const uint16_t *ks, const uint16_t *vs,
                            const int64_t *lengths, float *out, int64_t NB, int64_t B, int64_t KV, int64_t G,
                            int64_t BLK, int64_t D, int nthreads, int flags, const int QUANT) {
    const int64_t row_bytes = QUANT ? D : 2 * D;
    /* AMX for the scores where asked, allowed, and the heads of a group fit a tile's 16 columns */
    if (!((flags & KVLAB_FLAG_AMX) && G <= 16 && kvlab_amx_available())) flags &= ~KVLAB_FLAG_AMX;
    const int64_t items = NB * B * KV, part = G * (D + 2);
    float *partials = (float *)malloc(sizeof(float) * (size_t)(items * part));
    if (!partials) return -1;
    int failed = 0;
#pragma omp parallel num_threads(nthreads)
    {
        /* scores (G x BLK fp32); with AMX also p as bf16 hi and lo parts (2 x G x BLK rounded up to 32) */
        const int64_t scores = (G * BLK + 15) / 16 * 16, p16 = (flags & KVLAB_FLAG_AMX) ? G * ((BLK + 31) / 32 * 32) : 0;
        float *s = (float *)aligned_alloc(64, sizeof(float) * (size_t)(scores + p16));
        if (!s) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        if (!failed) {
            /* each thread a contiguous run of work items, so that it can fetch its next block's
             * keys while it reduces this block's values (see attend_block) */
            const int64_t nt = omp_get_num_threads(), tid = omp_get_thread_num();
            const int64_t first = items * tid / nt, last = items * (tid + 1) / nt;
            for (int64_t it = first; it < last; it++) {
                const int64_t j = it / (B * KV), b = (it / KV) % B, h = it % KV;
                float *o = partials + it * part, *m = o + G * D, *l = m + G;
                const int64_t n = valid_rows(lengths[b], j, BLK);
                if (n <= 0) {
                    for (int64_t g = 0; g < G; g++) { m[g] = -INFINITY; l[g] = 0.0f; }
                    continue;
                }
                const int64_t base = it * BLK;  /* first row of this block */
                const int64_t nn = it + 1 < last ? valid_rows(lengths[((it + 1) / KV) % B], (it + 1) / (B * KV), BLK) : 0;
                const void *kn = nn > 0 ? (const char *)k + (base + BLK) * row_bytes : NULL;
                if (QUANT)
                    attend_block_int8(q + (b * KV + h) * G * D, (const char *)k + base * row_bytes,
                                      (const char *)v + base * row_bytes, ks + base, vs + base, n, G, BLK, D, s, o, m, l,
                                      kn, nn, flags);
                else
                    attend_block_bf16(q + (b * KV + h) * G * D, (const char *)k + base * row_bytes,
                                      (const char *)v + base * row_bytes, n, G, BLK, D, s, o, m, l, kn, nn, flags);
            }
#pragma omp barrier
#pragma omp for schedule(static)
            for (int64_t r = 0; r < B * KV * G; r++) { /* combine the blocks of one (sequence, head) */
                const int64_t bh = r / G, g = r % G;
                float mx = -INFINITY, l = 0.0f;
                for (int64_t j = 0; j < NB; j++) {
                    const float mj = partials[(j * B * KV + bh) * part + G * D + g];
                    mx = mj > mx ? mj : mx;
                }
                float *dst = out + r * D;
                for (int64_t d = 0; d < D; d++) dst[d] = 0.0f;
                for (int64_t j = 0; j < NB && mx != -INFINITY; j++) {
                    const float *o = partials + (j * B * KV + bh) * part;
                    const float mj = o[G * D + g];
                    if (mj == -INFINITY) continue;
                    const float w = expf(mj - mx);
                    l += w * o[G * D + G + g];
                    for (int64_t d = 0; d < D; d++) dst[d] += w * o[g * D + d];
                }
                const float inv = l > 0.0f ? 1.0f / l : 0.0f;
                for (int64_t d = 0; d < D; d++) dst[d] *= inv;
            }
        }
        free(s);
#if KVLAB_HAVE_AMX
        if (flags & KVLAB_FLAG_AMX) _tile_release();
#endif
    }
    free(partials);
    return failed ? -1 : 0;
}

int kvlab_decode_attention_bf16(const uint16_t *q, const uint16_t *k, const uint16_t *v, const int64_t *lengths,
                                float *out, int64_t NB, int64_t B, int64_t KV, int64_t G, int64_t BLK, int64_t D,
                                int nthreads, int flags) {
    return decode_attention(q, k, v, NULL, NULL, lengths, out, NB, B, KV, G, BLK, D, nthreads, flags, 0);
}

int kvlab_decode_attention_int8(const uint16_t *q, const int8_t *k, const int8_t *v, const uint16_t *ks,
                                const uint16_t *vs, const int64_t *lengths, float *out, int64_t NB, int64_t B,
                                int64_t KV, int64_t G, int64_t BLK, int64_t D, int nthreads, int flags) {
    return decode_attention(q, k, v, ks, vs, lengths, out, NB, B, KV, G, BLK, D, nthreads, flags, 1);
}
