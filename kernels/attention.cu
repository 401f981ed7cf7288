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

    // Visible key range of this split, in 64-bit to rule out overflow.
    const unsigned long long pos = (unsigned long long)start_pos + r;
    const unsigned long long first = (window > 0u && pos + 1ull > window) ? pos + 1ull - window : 0ull;
    const unsigned long long s_lo = (unsigned long long)s * split_len;
    const unsigned long long s_hi = s_lo + split_len;
    const unsigned long long lo = first > s_lo ? first : s_lo;
    const unsigned long long hi = (pos + 1ull) < s_hi ? (pos + 1ull) : s_hi;  // exclusive

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
            float kk[ATTN_KPI][ATTN_DPL], vv[ATTN_KPI][ATTN_DPL], dot[ATTN_KPI];
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
#pragma unroll
            for (unsigned int t = 0; t < ATTN_KPI; ++t) {
                float a = 0.0f;
#pragma unroll
                for (unsigned int i = 0; i < ATTN_DPL; ++i) a += qv[i] * kk[t][i];
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
            for (unsigned int i = 0; i < ATTN_DPL; ++i) {
                float a = acc[i] * corr;
#pragma unroll
                for (unsigned int t = 0; t < ATTN_KPI; ++t) a += p[t] * vv[t][i];
                acc[i] = a;
            }
            m = m_new;
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

    float M = NEG_INF;
    for (unsigned int w = 0; w < nw; ++w) M = fmaxf(M, sm_m[w]);
    float f[ATTN_WARPS];
#pragma unroll
    for (unsigned int w = 0; w < ATTN_WARPS; ++w) f[w] = w < nw ? strata_exp_diff(sm_m[w], M) : 0.0f;

    float* out = part + ((unsigned long long)bh * splits + s) * (head_dim + 2u);
    for (unsigned int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.0f;
#pragma unroll
        for (unsigned int w = 0; w < ATTN_WARPS; ++w) {
            if (w < nw) a += sm_acc[w][d] * f[w];
        }
        out[d] = a;
    }
    if (threadIdx.x == 0u) {
        float L = 0.0f;
#pragma unroll
        for (unsigned int w = 0; w < ATTN_WARPS; ++w) {
            if (w < nw) L += sm_l[w] * f[w];
        }
        out[head_dim] = M;
        out[head_dim + 1u] = L;
    }
}

// attn_partial_f32 over f32 caches, attn_partial_f16 and attn_partial_q8_0 over caches
// stored as KV_F16 and KV_Q8_0 (same arguments; k and v are the caches' float buffers).
#define STRATA_ATTN_PARTIAL(NAME, KV)                                                                     \
    extern "C" __global__ void __launch_bounds__(128)                                                     \
        NAME(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,      \
             float* __restrict__ part, unsigned int start_pos, unsigned int n_heads, unsigned int n_kv_heads, \
             unsigned int head_dim, float scale, float softcap, unsigned int window, unsigned int split_len) { \
        attn_partial<KV>(q, k, v, part, start_pos, n_heads, n_kv_heads, head_dim, scale, softcap, window,   \
                         split_len);                                                                      \
    }
STRATA_ATTN_PARTIAL(attn_partial_f32, KV_F32)
STRATA_ATTN_PARTIAL(attn_partial_f16, KV_F16)
STRATA_ATTN_PARTIAL(attn_partial_q8_0, KV_Q8_0)

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
    float amax = fabsf(x);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(STRATA_FULL_MASK, amax, o));
    const float d = amax / 127.0f;
    const float inv = d > 0.0f ? 1.0f / d : 0.0f;
    const float r = fminf(fmaxf(roundf(x * inv), -127.0f), 127.0f);
    float* b = dst + (unsigned long long)i * kv_row_len<KV_Q8_0>(width) + blk * KV_Q8_SLOTS;
    if (lane == 0u) b[0] = d;
    ((signed char*)(b + 1))[lane] = e < width ? (signed char)(int)r : (signed char)0;
}

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
