/* kvlab's CPU decode kernels: a bf16 matrix-vector product (the weights) and decode attention
 * over the block-major KV cache, bf16 or int8 (the history). Both exist for one reason: a
 * one-token decode step should move its bytes at the memory's speed, and PyTorch's CPU
 * kernels do not (its bf16 batched matmul reads KV at 12-20 GB/s where the memory gives 40+).
 *
 * What makes them stream: each thread reads long contiguous runs (packed weight tiles, whole
 * cache blocks), prefetches a few KB ahead of itself (non-temporal: every byte is used once),
 * and does its arithmetic on data already in L1 with few instructions per byte: AVX-512 BF16
 * dot products (weights: 32 output rows in lanes, no horizontal sums; keys: 4 keys x 4 query
 * heads per tile, 16 sums in one shuffle tree), an AVX-512 exp for the softmax, and V reduced
 * 64 rows at a time so the rows stay in L1 across the head_dim tiles, its bf16 widened by a
 * shift (even dims) and a mask (odd dims) and re-interleaved once per block. Variants measured slower and dropped: weights as row-by-x dot products
 * (half the speed at batch 8), keys one at a time (1.7x the instructions), V as bf16 row
 * pairs in dot products (faster from cache, 5-10% slower from DRAM on the reference machine).
 *
 * Built on first use by kvlab/native/__init__.py with the system C compiler
 * (-O3 -march=native -fopenmp) and called through ctypes; needs AVX512F + AVX512-BF16.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#if !defined(__AVX512F__) || !defined(__AVX512BF16__)
#error "kvlab native kernels need AVX512F and AVX512-BF16 (compile with -march=native on such a CPU)"
#endif

#ifndef PREFETCH_ROWS
#define PREFETCH_ROWS 32 /* rows ahead: 8 KB at head_dim 128 */
#endif
#define V_TILE_ROWS 64   /* V rows reduced per pass; 16 KB at head_dim 128, inside L1 */
#define MAX_HEAD_DIM 512 /* int8 keys are widened 4 rows at a time into a stack buffer */

const char *kvlab_native_isa(void) { return "avx512f+avx512bf16"; }

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

/* Non-temporal prefetch: a step reads each weight and each cached K/V byte once, so they should
 * not push anything else out of L2/L3 (measured: +3-7% for attention at ~45 GB/s, +8-15% for
 * the weights at ~80 GB/s). __builtin_prefetch, not _mm_prefetch: GCC 12 deleted this loop
 * when written with the latter (no prefetch left in the attention code, 20-30% slower). */
static inline void prefetch_bytes(const void *start, int64_t n_bytes) {
    const char *p = (const char *)start;
    for (int64_t o = 0; o < n_bytes; o += 64) __builtin_prefetch(p + o, 0, 0);
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
                                                             const int prefetch) {
    __m512 a0[GEMV_MT], a1[GEMV_MT];
#pragma GCC unroll 8
    for (int m = 0; m < MT; m++) a0[m] = a1[m] = _mm512_setzero_ps();
    const uint32_t *xp[GEMV_MT];
#pragma GCC unroll 8
    for (int m = 0; m < MT; m++) xp[m] = (const uint32_t *)(x + m * K);
    for (int64_t kp = 0; kp < K / 2; kp++) {
        const uint16_t *wk = wg + kp * 64;
        if (prefetch) {
            _mm_prefetch((const char *)wk + GEMV_PREFETCH_BYTES, _MM_HINT_NTA);
            _mm_prefetch((const char *)wk + GEMV_PREFETCH_BYTES + 64, _MM_HINT_NTA);
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

int kvlab_gemv_bf16(const uint16_t *Wp, const uint16_t *x, uint16_t *y, int64_t M, int64_t N, int64_t K,
                     int nthreads) {
    const int64_t groups = (N + 31) / 32;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t g = 0; g < groups; g++) {
        const uint16_t *wg = Wp + g * 32 * K;
        for (int64_t m0 = 0; m0 < M; m0 += GEMV_MT) {
            const uint16_t *xr = x + m0 * K;
            uint16_t *yr = y + m0 * N;
            const int pf = m0 == 0;
            switch (M - m0 < GEMV_MT ? M - m0 : GEMV_MT) {
            case 1: gemv_group(wg, xr, yr, N, K, g * 32, 1, pf); break;
            case 2: gemv_group(wg, xr, yr, N, K, g * 32, 2, pf); break;
            case 3: gemv_group(wg, xr, yr, N, K, g * 32, 3, pf); break;
            case 4: gemv_group(wg, xr, yr, N, K, g * 32, 4, pf); break;
            case 5: gemv_group(wg, xr, yr, N, K, g * 32, 5, pf); break;
            case 6: gemv_group(wg, xr, yr, N, K, g * 32, 6, pf); break;
            case 7: gemv_group(wg, xr, yr, N, K, g * 32, 7, pf); break;
            default: gemv_group(wg, xr, yr, N, K, g * 32, 8, pf); break;
            }
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

/* One block of one (sequence, KV head): scores, local softmax, and p V for its G query heads.
 * Writes o (G, D) unnormalised, and per head the local max m and sum l (split-K, as in
 * flash-decoding: blocks are independent, combined afterwards). QUANT: K/V are int8 with one
 * fp16 scale per token (ks, vs), applied to the scores and to p, never to the big tensors. */
static inline __attribute__((always_inline)) void attend_block(
        const uint16_t *q, const void *kb, const void *vb, const uint16_t *ks, const uint16_t *vs, int64_t n,
        int64_t G, int64_t BLK, int64_t D, float *s, float *o, float *m_out, float *l_out, const int QUANT) {
    const int64_t row_bytes = QUANT ? D : 2 * D;
#define KROW(t) ((const char *)kb + (t) * row_bytes)
#define VROW(t) ((const char *)vb + (t) * row_bytes)
    /* scores, 4 keys x 4 query heads at a time: each loaded chunk of a key or a query feeds four
     * dot-product instructions, and the 16 sums come out of one 16-way horizontal sum (a dozen
     * shuffles instead of 16 reductions). int8 keys are widened to bf16 once, into kbuf. */
    uint16_t kbuf[QUANT ? 4 * MAX_HEAD_DIM : 1];
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) {
        if (t + PREFETCH_ROWS < n) prefetch_bytes(KROW(t + PREFETCH_ROWS), 4 * row_bytes);
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
                    if (d0 == 0 && g0 == 0 && t + PREFETCH_ROWS < n) prefetch_bytes(VROW(t + PREFETCH_ROWS), row_bytes);
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

/* One out-of-line copy per storage type. */
static __attribute__((noinline)) void attend_block_bf16(const uint16_t *q, const void *kb, const void *vb, int64_t n,
                                                        int64_t G, int64_t BLK, int64_t D, float *s, float *o,
                                                        float *m, float *l) {
    attend_block(q, kb, vb, NULL, NULL, n, G, BLK, D, s, o, m, l, 0);
}

static __attribute__((noinline)) void attend_block_int8(const uint16_t *q, const void *kb, const void *vb,
                                                        const uint16_t *ks, const uint16_t *vs, int64_t n, int64_t G,
                                                        int64_t BLK, int64_t D, float *s, float *o, float *m, float *l) {
    attend_block(q, kb, vb, ks, vs, n, G, BLK, D, s, o, m, l, 1);
}

/* Decode attention: one query token per sequence against its first lengths[b] cached positions.
 * q (B, KV, G, D) bf16, already scaled by 1/sqrt(D); k, v (NB, B, KV, BLK, D) block-major, bf16,
 * or int8 with fp16 scales ks, vs (NB, B, KV, BLK) (NULL for bf16); lengths (B) int64;
 * out (B, KV, G, D) fp32. D % 64 == 0.
 * Work items are (block, sequence, KV head): enough to keep every thread busy at batch 1.
 * Returns 0, or -1 when scratch memory cannot be allocated (out untouched). */
static int decode_attention(const uint16_t *q, const void *k, const void *v, const uint16_t *ks, const uint16_t *vs,
                            const int64_t *lengths, float *out, int64_t NB, int64_t B, int64_t KV, int64_t G,
                            int64_t BLK, int64_t D, int nthreads, const int QUANT) {
    const int64_t row_bytes = QUANT ? D : 2 * D;
    const int64_t items = NB * B * KV, part = G * (D + 2);
    float *partials = (float *)malloc(sizeof(float) * (size_t)(items * part));
    if (!partials) return -1;
    int failed = 0;
#pragma omp parallel num_threads(nthreads)
    {
        float *s = (float *)aligned_alloc(64, sizeof(float) * (size_t)(((G * BLK + 15) / 16) * 16)); /* scores */
        if (!s) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        if (!failed) {
#pragma omp for schedule(static)
            for (int64_t it = 0; it < items; it++) {
                const int64_t j = it / (B * KV), b = (it / KV) % B, h = it % KV;
                float *o = partials + it * part, *m = o + G * D, *l = m + G;
                int64_t n = lengths[b] - j * BLK;
                n = n > BLK ? BLK : n;
                if (n <= 0) {
                    for (int64_t g = 0; g < G; g++) { m[g] = -INFINITY; l[g] = 0.0f; }
                    continue;
                }
                const int64_t base = it * BLK;  /* first row of this block */
                if (QUANT)
                    attend_block_int8(q + (b * KV + h) * G * D, (const char *)k + base * row_bytes,
                                      (const char *)v + base * row_bytes, ks + base, vs + base, n, G, BLK, D, s, o, m, l);
                else
                    attend_block_bf16(q + (b * KV + h) * G * D, (const char *)k + base * row_bytes,
                                      (const char *)v + base * row_bytes, n, G, BLK, D, s, o, m, l);
            }
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
    }
    free(partials);
    return failed ? -1 : 0;
}

int kvlab_decode_attention_bf16(const uint16_t *q, const uint16_t *k, const uint16_t *v, const int64_t *lengths,
                                float *out, int64_t NB, int64_t B, int64_t KV, int64_t G, int64_t BLK, int64_t D,
                                int nthreads) {
    return decode_attention(q, k, v, NULL, NULL, lengths, out, NB, B, KV, G, BLK, D, nthreads, 0);
}

int kvlab_decode_attention_int8(const uint16_t *q, const int8_t *k, const int8_t *v, const uint16_t *ks,
                                const uint16_t *vs, const int64_t *lengths, float *out, int64_t NB, int64_t B,
                                int64_t KV, int64_t G, int64_t BLK, int64_t D, int nthreads) {
    return decode_attention(q, k, v, ks, vs, lengths, out, NB, B, KV, G, BLK, D, nthreads, 1);
}
