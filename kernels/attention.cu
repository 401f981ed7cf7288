// attention.cu: causal (optionally sliding-window) attention over the KV cache,
// split over key ranges and merged (flash-decoding). common.cuh is prepended.
//
// Shapes: q and out are [rows, n_heads * head_dim]; k and v are
// [capacity, n_kv_heads * head_dim]; query head h reads kv head h / (n_heads / n_kv_heads).
// head_dim <= 256.

#define ATTN_WARPS 4u
#define ATTN_MAX_HEAD_DIM 256u
#define ATTN_DPL (ATTN_MAX_HEAD_DIM / 32u)  // head dimensions per lane, at most
#define ATTN_KPI 4u                          // keys per warp per loop iteration

// attn_partial_f32: for query row r = blockIdx.x / n_heads (position pos = start_pos + r)
// and head h = blockIdx.x % n_heads, over the keys j of split s = blockIdx.y:
//   first <= j <= pos, s·split_len <= j < (s+1)·split_len,
//   first = pos + 1 − window if window > 0 and pos + 1 > window, else 0,
// with score_j = (q · k_j) · scale, then, when softcap != 0,
// score_j = softcap · tanh(score_j / softcap) (Gemma 2; 0 turns it off), m = max score,
// writes at
// part[((r·n_heads + h)·splits + s)·(head_dim + 2)]:
//   [0, head_dim)  acc = Σ_j e^(score_j − m) · v_j
//   [head_dim]     m  (−inf for an empty slice)
//   [head_dim + 1] l  = Σ_j e^(score_j − m)  (0 for an empty slice, acc = 0 then too)
// Launch: grid (rows · n_heads, splits), block 128 (4 warps), no dynamic shared memory.
// Warp w takes the keys lo + w, lo + w + 4, ... (four at a time, so their loads and
// reductions overlap): per key the warp computes q·k (each lane holds head_dim/32
// dimensions, warp-reduced) and updates its running (m, l, acc) with online-softmax
// rescaling; the 4 warps then merge (m, l, acc) through shared memory.
// KV cache row layouts (the CPU backend's, crates/strata-backend/src/cpu/kv.rs), each in a float buffer:
//   KV_F32  row_len = width floats;
//   KV_F16  two f16 bit patterns per float, row_len = ceil(width / 2);
//   KV_Q8_0 per 32 values a float scale d then 32 signed bytes (9 floats), value = d · q,
//           row_len = ceil(width / 32) · 9.
#define KV_F32 0
#define KV_F16 1
#define KV_Q8_0 2
#define KV_Q8_BLOCK 32u
#define KV_Q8_SLOTS 9u

template <int KV>
__device__ __forceinline__ unsigned long long kv_row_len(unsigned long long width) {
    if (KV == KV_F16) return (width + 1ull) / 2ull;
    if (KV == KV_Q8_0) return (width + KV_Q8_BLOCK - 1ull) / KV_Q8_BLOCK * KV_Q8_SLOTS;
    return width;
}

// Value e of cache row `row` (rows `row_len` floats apart), decoded to f32 exactly as the
// CPU decodes it.
template <int KV>
__device__ __forceinline__ float kv_at(const float* cache, unsigned long long row, unsigned long long row_len,
                                       unsigned long long e) {
    const float* r = cache + row * row_len;
    if (KV == KV_F16) return f16_to_f32(((const unsigned short*)r)[e]);
    if (KV == KV_Q8_0) {
        const float* b = r + (e / KV_Q8_BLOCK) * KV_Q8_SLOTS;
        return b[0] * (float)((const signed char*)(b + 1))[e % KV_Q8_BLOCK];
    }
    return r[e];
}

// One step of attn_partial's online softmax over the ATTN_KPI keys j + t·nw (t < ATTN_KPI;
// those at or past hi are masked): a lane's N dimensions of the query (qv), of the keys
// (kk) and of the values (vv) update its running (m, l, acc).
template <unsigned int N>
__device__ __forceinline__ void attn_step(const float (&qv)[N], const float (&kk)[ATTN_KPI][N],
                                          const float (&vv)[ATTN_KPI][N], float (&acc)[N], float& m, float& l,
                                          unsigned long long j, unsigned long long hi, unsigned int nw, float scale,
                                          float softcap) {
    const float NEG_INF = strata_neg_inf();
    float dot[ATTN_KPI];
#pragma unroll
    for (unsigned int t = 0; t < ATTN_KPI; ++t) {
        float a = 0.0f;
#pragma unroll
        for (unsigned int i = 0; i < N; ++i) a += qv[i] * kk[t][i];
        dot[t] = a;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
        for (unsigned int t = 0; t < ATTN_KPI; ++t) dot[t] += __shfl_xor_sync(STRATA_FULL_MASK, dot[t], o);
    }
    float sc[ATTN_KPI];
    float m_new = m;
#pragma unroll
    for (unsigned int t = 0; t < ATTN_KPI; ++t) {
        float st = dot[t] * scale;
        if (softcap != 0.0f) st = strata_softcap(st, softcap);  // uniform
        sc[t] = (j + (unsigned long long)t * nw < hi) ? st : NEG_INF;
        m_new = fmaxf(m_new, sc[t]);
    }
    const float corr = strata_exp_diff(m, m_new);  // 0 while m is −inf
    float p[ATTN_KPI];
    l *= corr;
#pragma unroll
    for (unsigned int t = 0; t < ATTN_KPI; ++t) {
        p[t] = strata_exp_diff(sc[t], m_new);  // 0 for keys past the end
        l += p[t];
    }
#pragma unroll
    for (unsigned int i = 0; i < N; ++i) {
        float a = acc[i] * corr;
#pragma unroll
        for (unsigned int t = 0; t < ATTN_KPI; ++t) a += p[t] * vv[t][i];
        acc[i] = a;
    }
    m = m_new;
}

// attn_partial's merge of its nw warps' (m, l, acc) into one partial at `out` (hd values,
// then M and L): warp w's m and l at sm_m[w·ml_stride], sm_l[w·ml_stride], its acc at
// sm_acc[w·acc_stride ..]. The whole block takes part.
__device__ __forceinline__ void attn_merge(const float* sm_m, const float* sm_l, const float* sm_acc,
                                           unsigned int ml_stride, unsigned int acc_stride, unsigned int nw,
                                           unsigned int hd, float* __restrict__ out) {
    float M = strata_neg_inf();
    for (unsigned int w = 0; w < nw; ++w) M = fmaxf(M, sm_m[w * ml_stride]);
    float f[ATTN_WARPS];
#pragma unroll
    for (unsigned int w = 0; w < ATTN_WARPS; ++w) f[w] = w < nw ? strata_exp_diff(sm_m[w * ml_stride], M) : 0.0f;
    for (unsigned int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.0f;
#pragma unroll
        for (unsigned int w = 0; w < ATTN_WARPS; ++w) {
            if (w < nw) a += sm_acc[w * acc_stride + d] * f[w];
        }
        out[d] = a;
    }
    if (threadIdx.x == 0u) {
        float L = 0.0f;
#pragma unroll
        for (unsigned int w = 0; w < ATTN_WARPS; ++w) {
            if (w < nw) L += sm_l[w * ml_stride] * f[w];
        }
        out[hd] = M;
        out[hd + 1u] = L;
    }
}

// The keys [lo, hi) that query row r (position start_pos + r) sees in split s, in 64-bit
// to rule out overflow.
__device__ __forceinline__ void attn_keys(unsigned int start_pos, unsigned int r, unsigned int window,
                                          unsigned int s, unsigned int split_len, unsigned long long* lo,
                                          unsigned long long* hi) {
    const unsigned long long pos = (unsigned long long)start_pos + r;
    const unsigned long long first = (window > 0u && pos + 1ull > window) ? pos + 1ull - window : 0ull;
    const unsigned long long s_lo = (unsigned long long)s * split_len;
    const unsigned long long s_hi = s_lo + split_len;
    *lo = first > s_lo ? first : s_lo;
    *hi = (pos + 1ull) < s_hi ? (pos + 1ull) : s_hi;  // exclusive
}

template <int KV>
__device__ __forceinline__ void attn_partial(const float* __restrict__ q, const float* __restrict__ k,
                                             const float* __restrict__ v, float* __restrict__ part,
                                             unsigned int start_pos, unsigned int n_heads, unsigned int n_kv_heads,
                                             unsigned int head_dim, float scale, float softcap, unsigned int window,
                                             unsigned int split_len) {
    __shared__ float sm_m[ATTN_WARPS];
    __shared__ float sm_l[ATTN_WARPS];
    __shared__ float sm_acc[ATTN_WARPS][ATTN_MAX_HEAD_DIM];

    const float NEG_INF = strata_neg_inf();
    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const unsigned int bw = blockDim.x >> 5;
    const unsigned int nw = bw < ATTN_WARPS ? bw : ATTN_WARPS;  // warps that take keys
    const unsigned int bh = blockIdx.x;
    const unsigned int r = bh / n_heads, h = bh % n_heads;
    const unsigned int s = blockIdx.y, splits = gridDim.y;
    const unsigned int hd = head_dim < ATTN_MAX_HEAD_DIM ? head_dim : ATTN_MAX_HEAD_DIM;

    unsigned long long lo, hi;
    attn_keys(start_pos, r, window, s, split_len, &lo, &hi);

    const unsigned int group = n_kv_heads > 0u ? n_heads / n_kv_heads : 1u;
    const unsigned int kvh = h / (group > 0u ? group : 1u);
    const unsigned long long row_len = kv_row_len<KV>((unsigned long long)n_kv_heads * head_dim);
    const unsigned long long kv_off = (unsigned long long)kvh * head_dim;  // this head's first value
    const float* qr = q + (unsigned long long)bh * head_dim;

    float qv[ATTN_DPL], acc[ATTN_DPL];
#pragma unroll
    for (unsigned int i = 0; i < ATTN_DPL; ++i) {
        const unsigned int d = lane + 32u * i;
        qv[i] = d < hd ? qr[d] : 0.0f;
        acc[i] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;

    if (warp < nw) {  // warp-uniform
        // ATTN_KPI keys per iteration (j, j + nw, ...): their loads and reductions overlap.
        for (unsigned long long j = lo + warp; j < hi; j += ATTN_KPI * nw) {
            float kk[ATTN_KPI][ATTN_DPL], vv[ATTN_KPI][ATTN_DPL];
#pragma unroll
            for (unsigned int t = 0; t < ATTN_KPI; ++t) {
                const unsigned long long jt = j + (unsigned long long)t * nw;
                const bool live = jt < hi;  // warp-uniform
#pragma unroll
                for (unsigned int i = 0; i < ATTN_DPL; ++i) {
                    const unsigned int d = lane + 32u * i;
                    kk[t][i] = (live && d < hd) ? kv_at<KV>(k, jt, row_len, kv_off + d) : 0.0f;
                    vv[t][i] = (live && d < hd) ? kv_at<KV>(v, jt, row_len, kv_off + d) : 0.0f;
                }
            }
            attn_step<ATTN_DPL>(qv, kk, vv, acc, m, l, j, hi, nw, scale, softcap);
        }
    }

    if (warp < nw) {
        if (lane == 0u) {
            sm_m[warp] = m;
            sm_l[warp] = l;
        }
#pragma unroll
        for (unsigned int i = 0; i < ATTN_DPL; ++i) {
            const unsigned int d = lane + 32u * i;
            if (d < hd) sm_acc[warp][d] = acc[i];
        }
    }
    __syncthreads();

    attn_merge(sm_m, sm_l, &sm_acc[0][0], 1u, ATTN_MAX_HEAD_DIM, nw, hd,
               part + ((unsigned long long)bh * splits + s) * (head_dim + 2u));
}

// attn_partial_f32 over f32 caches, attn_partial_f16 and attn_partial_q8_0 over caches
// stored as KV_F16 and KV_Q8_0 (same arguments; k and v are the caches' float buffers);
// attn_group_* below are the same kernels' entries for attn_group<KV>.
#define STRATA_ATTN_KERNEL(NAME, FN, KV)                                                                  \
    extern "C" __global__ void __launch_bounds__(128)                                                     \
        NAME(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,      \
             float* __restrict__ part, unsigned int start_pos, unsigned int n_heads, unsigned int n_kv_heads, \
             unsigned int head_dim, float scale, float softcap, unsigned int window, unsigned int split_len) { \
        FN<KV>(q, k, v, part, start_pos, n_heads, n_kv_heads, head_dim, scale, softcap, window, split_len);  \
    }
STRATA_ATTN_KERNEL(attn_partial_f32, attn_partial, KV_F32)
STRATA_ATTN_KERNEL(attn_partial_f16, attn_partial, KV_F16)
STRATA_ATTN_KERNEL(attn_partial_q8_0, attn_partial, KV_Q8_0)

// attn_group_f32, attn_group_f16, attn_group_q8_0: attn_partial_* (same arguments, same
// partials, bit for bit) with a block per (query row · KV head, split): grid
// (rows · n_kv_heads, splits), block 128. Block x = r·n_kv_heads + kvh computes the
// partials of query heads kvh·group .. (kvh+1)·group − 1 (group = n_heads / n_kv_heads)
// of row r, reading each K/V row of its slice once for up to ATTN_GROUP_HEADS heads (a
// larger group takes the slice again per ATTN_GROUP_HEADS heads). Each warp takes the keys
// attn_partial's warp of the same index takes, ATTN_KPI at a time: it first copies those
// keys' K and V head slices into its own shared memory (16-byte loads where the slice is
// 16-byte aligned, 4-byte words otherwise: whole q8_0 blocks, f16 pairs), then every head
// of the group runs attn_partial's per-key arithmetic in attn_partial's order on the same
// lane-to-dimension mapping, so each head's (m, l, acc) are its bits.
#define ATTN_STAGE_WORDS 256u  // 32-bit words of one staged head slice, at most (f32, head_dim 256)
#define ATTN_GROUP_HEADS 8u    // query heads held in registers at once (4 for head_dim > 128)

// The 32-bit words of a cache row that hold values [e0, e0 + n): first word and count.
template <int KV>
__device__ __forceinline__ void kv_words(unsigned long long e0, unsigned int n, unsigned long long* w0,
                                         unsigned int* nw) {
    if (KV == KV_F16) {
        *w0 = e0 / 2ull;
        *nw = (unsigned int)((e0 + n + 1ull) / 2ull - e0 / 2ull);
    } else if (KV == KV_Q8_0) {
        const unsigned long long b0 = e0 / KV_Q8_BLOCK, b1 = (e0 + n - 1ull) / KV_Q8_BLOCK + 1ull;
        *w0 = b0 * KV_Q8_SLOTS;
        *nw = (unsigned int)((b1 - b0) * KV_Q8_SLOTS);
    } else {
        *w0 = e0;
        *nw = n;
    }
}

// Value e of a row whose words from w0 were staged at `st`, decoded exactly as kv_at.
template <int KV>
__device__ __forceinline__ float kv_staged(const float* st, unsigned long long w0, unsigned long long e) {
    if (KV == KV_F16) return f16_to_f32(((const unsigned short*)st)[e - 2ull * w0]);
    if (KV == KV_Q8_0) {
        const float* b = st + (e / KV_Q8_BLOCK * KV_Q8_SLOTS - w0);
        return b[0] * (float)((const signed char*)(b + 1))[e % KV_Q8_BLOCK];
    }
    return st[e - w0];
}

// A warp copies n words from src to dst (16-byte aligned): 16 bytes a lane where src is
// 16-byte aligned (warp-uniform), 4 bytes for the rest.
__device__ __forceinline__ void attn_stage(float* dst, const float* __restrict__ src, unsigned int n,
                                           unsigned int lane) {
    unsigned int done = 0u;
    if ((((unsigned long long)src) & 15ull) == 0ull) {
        const unsigned int n4 = n / 4u;
        for (unsigned int i = lane; i < n4; i += 32u) ((float4*)dst)[i] = ((const float4*)src)[i];
        done = n4 * 4u;
    }
    for (unsigned int i = done + lane; i < n; i += 32u) dst[i] = src[i];
}

// One pass of attn_group_*: heads h0 .. h0 + ng − 1 (ng <= HG) of row r over keys [lo, hi)
// of split s, DPL dimensions per lane (head_dim <= 32·DPL). `stage` is the block's
// [ATTN_WARPS][2·ATTN_KPI][ATTN_STAGE_WORDS] staging area, reused for the merge once every
// warp is past its keys; sm_m and sm_l are [ATTN_WARPS][ATTN_GROUP_HEADS].
template <int KV, unsigned int DPL, unsigned int HG>
__device__ __forceinline__ void attn_group_pass(const float* __restrict__ q, const float* __restrict__ k,
                                                const float* __restrict__ v, float* __restrict__ part,
                                                float* stage, float* sm_m, float* sm_l, unsigned int r,
                                                unsigned int h0, unsigned int ng, unsigned int kvh,
                                                unsigned long long lo, unsigned long long hi, unsigned int n_heads,
                                                unsigned int n_kv_heads, unsigned int hd, float scale, float softcap) {
    const float NEG_INF = strata_neg_inf();
    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const unsigned int bw = blockDim.x >> 5;
    const unsigned int nw = bw < ATTN_WARPS ? bw : ATTN_WARPS;  // warps that take keys
    const unsigned int s = blockIdx.y, splits = gridDim.y;
    const unsigned long long row_len = kv_row_len<KV>((unsigned long long)n_kv_heads * hd);
    const unsigned long long kv_off = (unsigned long long)kvh * hd;
    unsigned long long w0;
    unsigned int n_words;
    kv_words<KV>(kv_off, hd, &w0, &n_words);

    float qv[HG][DPL], acc[HG][DPL], m[HG], l[HG];
#pragma unroll
    for (unsigned int g = 0; g < HG; ++g) {
        const float* qr = q + ((unsigned long long)r * n_heads + h0 + g) * hd;
#pragma unroll
        for (unsigned int i = 0; i < DPL; ++i) {
            const unsigned int d = lane + 32u * i;
            qv[g][i] = (g < ng && d < hd) ? qr[d] : 0.0f;
            acc[g][i] = 0.0f;
        }
        m[g] = NEG_INF;
        l[g] = 0.0f;
    }

    if (warp < nw) {  // warp-uniform
        float* ws = stage + warp * (2u * ATTN_KPI * ATTN_STAGE_WORDS);
        for (unsigned long long j = lo + warp; j < hi; j += ATTN_KPI * nw) {
            // This iteration's keys' K and V head slices, once for every head.
#pragma unroll
            for (unsigned int t = 0; t < ATTN_KPI; ++t) {
                const unsigned long long jt = j + (unsigned long long)t * nw;
                if (jt < hi) {  // warp-uniform
                    attn_stage(ws + (2u * t) * ATTN_STAGE_WORDS, k + jt * row_len + w0, n_words, lane);
                    attn_stage(ws + (2u * t + 1u) * ATTN_STAGE_WORDS, v + jt * row_len + w0, n_words, lane);
                }
            }
            __syncwarp();
            float kk[ATTN_KPI][DPL], vv[ATTN_KPI][DPL];
#pragma unroll
            for (unsigned int t = 0; t < ATTN_KPI; ++t) {
                const bool live = j + (unsigned long long)t * nw < hi;  // warp-uniform
#pragma unroll
                for (unsigned int i = 0; i < DPL; ++i) {
                    const unsigned int d = lane + 32u * i;
                    const bool on = live && d < hd;
                    kk[t][i] = on ? kv_staged<KV>(ws + (2u * t) * ATTN_STAGE_WORDS, w0, kv_off + d) : 0.0f;
                    vv[t][i] = on ? kv_staged<KV>(ws + (2u * t + 1u) * ATTN_STAGE_WORDS, w0, kv_off + d) : 0.0f;
                }
            }
            __syncwarp();  // the next iteration's copies overwrite these
#pragma unroll
            for (unsigned int g = 0; g < HG; ++g) {
                if (g < ng) attn_step<DPL>(qv[g], kk, vv, acc[g], m[g], l[g], j, hi, nw, scale, softcap);  // uniform
            }
        }
    }

    // Merge the warps per head as attn_partial does, in the staging area (every warp is past
    // its copies after the barrier): sm_acc[w][g·hd + d].
    __syncthreads();
    float* sm_acc = stage;
    const unsigned int acc_stride = HG * 32u * DPL;
    if (warp < nw) {
#pragma unroll
        for (unsigned int g = 0; g < HG; ++g) {
            if (g >= ng) continue;
            if (lane == 0u) {
                sm_m[warp * ATTN_GROUP_HEADS + g] = m[g];
                sm_l[warp * ATTN_GROUP_HEADS + g] = l[g];
            }
#pragma unroll
            for (unsigned int i = 0; i < DPL; ++i) {
                const unsigned int d = lane + 32u * i;
                if (d < hd) sm_acc[warp * acc_stride + g * hd + d] = acc[g][i];
            }
        }
    }
    __syncthreads();

    for (unsigned int g = 0; g < ng; ++g) {
        const unsigned long long bh = (unsigned long long)r * n_heads + h0 + g;
        attn_merge(sm_m + g, sm_l + g, sm_acc + g * hd, ATTN_GROUP_HEADS, acc_stride, nw, hd,
                   part + (bh * splits + s) * (hd + 2u));
    }
    __syncthreads();  // the next pass copies keys over the merge area
}

template <int KV>
__device__ __forceinline__ void attn_group(const float* __restrict__ q, const float* __restrict__ k,
                                           const float* __restrict__ v, float* __restrict__ part,
                                           unsigned int start_pos, unsigned int n_heads, unsigned int n_kv_heads,
                                           unsigned int head_dim, float scale, float softcap, unsigned int window,
                                           unsigned int split_len) {
    __shared__ __align__(16) float stage[ATTN_WARPS * 2u * ATTN_KPI * ATTN_STAGE_WORDS];
    __shared__ float sm_m[ATTN_WARPS * ATTN_GROUP_HEADS];
    __shared__ float sm_l[ATTN_WARPS * ATTN_GROUP_HEADS];

    if (n_kv_heads == 0u) return;  // uniform (no heads)
    const unsigned int r = blockIdx.x / n_kv_heads, kvh = blockIdx.x % n_kv_heads;
    const unsigned int s = blockIdx.y;
    const unsigned int hd = head_dim < ATTN_MAX_HEAD_DIM ? head_dim : ATTN_MAX_HEAD_DIM;
    const unsigned int group = n_heads / n_kv_heads;

    unsigned long long lo, hi;
    attn_keys(start_pos, r, window, s, split_len, &lo, &hi);

    for (unsigned int c = 0; c < group;) {
        const unsigned int h0 = kvh * group + c, left = group - c;
        if (hd <= 64u) {
            const unsigned int ng = left < ATTN_GROUP_HEADS ? left : ATTN_GROUP_HEADS;
            attn_group_pass<KV, 2u, ATTN_GROUP_HEADS>(q, k, v, part, stage, sm_m, sm_l, r, h0, ng, kvh, lo, hi,
                                                      n_heads, n_kv_heads, hd, scale, softcap);
            c += ng;
        } else if (hd <= 128u) {
            const unsigned int ng = left < ATTN_GROUP_HEADS ? left : ATTN_GROUP_HEADS;
            attn_group_pass<KV, 4u, ATTN_GROUP_HEADS>(q, k, v, part, stage, sm_m, sm_l, r, h0, ng, kvh, lo, hi,
                                                      n_heads, n_kv_heads, hd, scale, softcap);
            c += ng;
        } else {
            const unsigned int ng = left < ATTN_GROUP_HEADS / 2u ? left : ATTN_GROUP_HEADS / 2u;
            attn_group_pass<KV, 8u, ATTN_GROUP_HEADS / 2u>(q, k, v, part, stage, sm_m, sm_l, r, h0, ng, kvh, lo,
                                                           hi, n_heads, n_kv_heads, hd, scale, softcap);
            c += ng;
        }
    }
}

STRATA_ATTN_KERNEL(attn_group_f32, attn_group, KV_F32)
STRATA_ATTN_KERNEL(attn_group_f16, attn_group, KV_F16)
STRATA_ATTN_KERNEL(attn_group_q8_0, attn_group, KV_Q8_0)

// kv_store_f16: stores row i < n_rows of src (`width` floats; source row rows[i], or i when
// rows is null) as cache row i of dst in KV_F16: grid (n_rows, ceil(width / 256)),
// block 256, a thread per value (round to nearest even, as the CPU's F16C conversion).
// The padding half of an odd-width row is left as it is.
extern "C" __global__ void __launch_bounds__(256)
    kv_store_f16(const float* __restrict__ src, const unsigned int* __restrict__ rows, float* __restrict__ dst,
                 unsigned int width, unsigned int n_rows) {
    const unsigned int i = blockIdx.x;
    const unsigned long long e = (unsigned long long)blockIdx.y * blockDim.x + threadIdx.x;
    if (i >= n_rows || e >= width) return;
    const unsigned long long sr = rows ? rows[i] : i;
    unsigned short* out = (unsigned short*)(dst + (unsigned long long)i * kv_row_len<KV_F16>(width));
    out[e] = f16_from_f32(src[sr * width + e]);
}

// Stores one KV_Q8_0 block of 32 values at `b` (its scale, then 32 bytes), lane `lane`
// holding value x (`valid`: inside the row; a lane past it stores byte 0 and gives x = 0).
// All 32 lanes must call it. d = max |x| / 127, each value round(x / d) (halves away from
// zero) clamped to ±127, as the CPU encodes it.
__device__ __forceinline__ void kv_q8_store_block(float x, bool valid, unsigned int lane, float* b) {
    float amax = fabsf(x);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(STRATA_FULL_MASK, amax, o));
    const float d = amax / 127.0f;
    const float inv = d > 0.0f ? 1.0f / d : 0.0f;
    const float r = fminf(fmaxf(roundf(x * inv), -127.0f), 127.0f);
    if (lane == 0u) b[0] = d;
    ((signed char*)(b + 1))[lane] = valid ? (signed char)(int)r : (signed char)0;
}

// kv_store_q8_0: as kv_store_f16 into KV_Q8_0: a warp per block of 32 values, grid
// (n_rows, ceil(ceil(width / 32) / 8)), block 256 (8 warps). d = max |x| / 127, each
// value round(x / d) (halves away from zero) clamped to ±127, as the CPU encodes it;
// the bytes of a last partial block past `width` are 0.
extern "C" __global__ void __launch_bounds__(256)
    kv_store_q8_0(const float* __restrict__ src, const unsigned int* __restrict__ rows, float* __restrict__ dst,
                  unsigned int width, unsigned int n_rows) {
    const unsigned int i = blockIdx.x;
    const unsigned int lane = threadIdx.x & 31u;
    const unsigned long long blk = (unsigned long long)blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const unsigned long long blocks = ((unsigned long long)width + KV_Q8_BLOCK - 1ull) / KV_Q8_BLOCK;
    if (i >= n_rows || blk >= blocks) return;  // warp-uniform
    const unsigned long long sr = rows ? rows[i] : i;
    const unsigned long long e = blk * KV_Q8_BLOCK + lane;
    const float x = e < width ? src[sr * width + e] : 0.0f;
    kv_q8_store_block(x, e < width, lane, dst + (unsigned long long)i * kv_row_len<KV_Q8_0>(width) + blk * KV_Q8_SLOTS);
}

// rope_store_{f32,f16,q8_0}(q, k, v, k_cache, v_cache, pos0, n_heads, n_kv_heads, head_dim,
// n_pairs, inv_freq, attn_factor, interleaved): one sequence's new rows rotated and
// stored, the work of rope_f32 on q and on k then kv_store_* of k and of v, bit for bit
// (the rotation is strata_rope_pair, the Q8_0 encoding kv_q8_store_block). q, k and v
// point at the sequence's first new row ([n_rows, n_heads · head_dim] and [n_rows,
// n_kv_heads · head_dim]); row i sits at position pos0 + i and goes to cache row i of
// k_cache and v_cache (pointing at cache row pos0; rows kv_row_len(n_kv_heads ·
// head_dim) floats apart). Launch: grid (n_rows, n_heads + 2 · n_kv_heads), block 128
// (any multiple of 32): head h < n_heads of a row is q's, rotated in place; the next
// n_kv_heads are k's, rotated into shared memory and stored (k itself is left as it
// was); the last n_kv_heads are v's, stored. head_dim <= ROPE_STORE_MAX_HEAD_DIM, even;
// for Q8_0 a multiple of 32 (each head whole blocks).
#define ROPE_STORE_MAX_HEAD_DIM 512u
template <int KV>
__device__ __forceinline__ void rope_store(float* __restrict__ q, const float* __restrict__ k,
                                           const float* __restrict__ v, float* __restrict__ k_cache,
                                           float* __restrict__ v_cache, unsigned int pos0, unsigned int n_heads,
                                           unsigned int n_kv_heads, unsigned int head_dim, unsigned int n_pairs,
                                           const float* __restrict__ inv_freq, float attn_factor, int interleaved) {
    __shared__ float vals[ROPE_STORE_MAX_HEAD_DIM];
    const unsigned int row = blockIdx.x, h = blockIdx.y;
    const unsigned int half = head_dim / 2u;
    const unsigned int np = n_pairs < half ? n_pairs : half;  // never past the head
    const float p = (float)(pos0 + row);
    if (h < n_heads) {  // block-uniform
        float* head = q + ((unsigned long long)row * n_heads + h) * head_dim;
        for (unsigned int i = threadIdx.x; i < np; i += blockDim.x)
            strata_rope_pair(head, interleaved ? 2u * i : i, interleaved ? 2u * i + 1u : i + np, p, inv_freq[i],
                             attn_factor);
        return;
    }
    const bool is_k = h < n_heads + n_kv_heads;
    const unsigned int kh = is_k ? h - n_heads : h - n_heads - n_kv_heads;
    const unsigned long long width = (unsigned long long)n_kv_heads * head_dim;
    const float* src = (is_k ? k : v) + row * width + (unsigned long long)kh * head_dim;
    for (unsigned int e = threadIdx.x; e < head_dim; e += blockDim.x) vals[e] = src[e];
    __syncthreads();
    if (is_k) {
        for (unsigned int i = threadIdx.x; i < np; i += blockDim.x)
            strata_rope_pair(vals, interleaved ? 2u * i : i, interleaved ? 2u * i + 1u : i + np, p, inv_freq[i],
                             attn_factor);
        __syncthreads();
    }
    float* cache = (is_k ? k_cache : v_cache) + row * kv_row_len<KV>(width);
    const unsigned long long e0 = (unsigned long long)kh * head_dim;
    if (KV == KV_Q8_0) {
        const unsigned int lane = threadIdx.x & 31u;
        for (unsigned int b = threadIdx.x >> 5; b < head_dim / KV_Q8_BLOCK; b += blockDim.x >> 5)
            kv_q8_store_block(vals[b * KV_Q8_BLOCK + lane], true, lane,
                              cache + (e0 / KV_Q8_BLOCK + b) * KV_Q8_SLOTS);
    } else {
        for (unsigned int e = threadIdx.x; e < head_dim; e += blockDim.x) {
            if (KV == KV_F16) ((unsigned short*)cache)[e0 + e] = f16_from_f32(vals[e]);
            else cache[e0 + e] = vals[e];
        }
    }
}

#define STRATA_ROPE_STORE_KERNEL(NAME, KV)                                                         \
    extern "C" __global__ void __launch_bounds__(128)                                            \
        NAME(float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,      \
             float* __restrict__ k_cache, float* __restrict__ v_cache, unsigned int pos0,          \
             unsigned int n_heads, unsigned int n_kv_heads, unsigned int head_dim, unsigned int n_pairs, \
             const float* __restrict__ inv_freq, float attn_factor, int interleaved) {             \
        rope_store<KV>(q, k, v, k_cache, v_cache, pos0, n_heads, n_kv_heads, head_dim, n_pairs, inv_freq, \
                       attn_factor, interleaved);                                                  \
    }
STRATA_ROPE_STORE_KERNEL(rope_store_f32, KV_F32)
STRATA_ROPE_STORE_KERNEL(rope_store_f16, KV_F16)
STRATA_ROPE_STORE_KERNEL(rope_store_q8_0, KV_Q8_0)

// attn_combine_f32: merges the splits of one (query row · head) = blockIdx.x:
//   M = max_s m_s, L = Σ_s l_s e^(m_s − M), out[d] = Σ_s acc_s[d] e^(m_s − M) / L
// writing out[(r·n_heads + h)·head_dim + d] (0 where no key was visible at all).
// attn_combine_sinks_f32 does the same with head h's sink logit sinks[h] (gpt-oss) in
// the denominator once, and in no numerator:
//   M = max(max_s m_s, sinks[h]), L = Σ_s l_s e^(m_s − M) + e^(sinks[h] − M).
// Launch: grid (rows · n_heads), block head_dim (any block size works: threads loop
// over the dimensions).
template <bool SINK>
__device__ __forceinline__ void attn_combine(const float* __restrict__ part, const float* __restrict__ sinks,
                                             float* __restrict__ out, unsigned int splits, unsigned int n_heads,
                                             unsigned int head_dim) {
    const unsigned int bh = blockIdx.x;
    const unsigned long long stride = (unsigned long long)head_dim + 2ull;
    const float* p = part + (unsigned long long)bh * splits * stride;
    const float sink = SINK ? sinks[bh % n_heads] : strata_neg_inf();
    float M = sink;
    for (unsigned int s = 0; s < splits; ++s) M = fmaxf(M, p[s * stride + head_dim]);
    const float l_sink = SINK ? strata_exp_diff(sink, M) : 0.0f;
    for (unsigned int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float L = l_sink, a = 0.0f;
        for (unsigned int s = 0; s < splits; ++s) {
            const float* ps = p + s * stride;
            const float f = strata_exp_diff(ps[head_dim], M);
            L += ps[head_dim + 1u] * f;
            a += ps[d] * f;
        }
        out[(unsigned long long)bh * head_dim + d] = L > 0.0f ? a / L : 0.0f;
    }
}

extern "C" __global__ void __launch_bounds__(1024)
    attn_combine_f32(const float* __restrict__ part, float* __restrict__ out, unsigned int splits,
                     unsigned int head_dim) {
    attn_combine<false>(part, nullptr, out, splits, 1u, head_dim);
}

extern "C" __global__ void __launch_bounds__(1024)
    attn_combine_sinks_f32(const float* __restrict__ part, const float* __restrict__ sinks, float* __restrict__ out,
                           unsigned int splits, unsigned int n_heads, unsigned int head_dim) {
    attn_combine<true>(part, sinks, out, splits, n_heads, head_dim);
}
