// sample.cu: greedy argmax and top-k over rows of logits (common.cuh is prepended).
//
// Ordering (as the CPU's top_k_row): larger logit first, lower index first on ties;
// −0 and +0 are equal; NaN logits are never chosen and are left out of logsumexp.
// logsumexp = max + log Σ e^(x − max) over the non-NaN logits, or max itself when max is
// ±inf (also when every logit is NaN: −inf).
//
// Both kernels: grid (rows), block 1024 (any multiple of 32 up to 1024 works), row r
// reads logits[r · vocab ..], and writes lse[r].

#define SAMPLE_NONE 0xffffffffu
// Per-thread candidates kept by topk_f32's first pass.
#define TOPK_T 8
#define TOPK_MAX_K 256u

// Sort key of a logit: larger key <=> larger value, −0 and +0 share a key, every
// non-NaN value has a key > 0 (key 0 marks "no candidate").
__device__ __forceinline__ unsigned int logit_key(float x) {
    return f32_order_key(x == 0.0f ? 0.0f : x);
}

__device__ __forceinline__ bool cand_better(unsigned int ka, unsigned int ia, unsigned int kb, unsigned int ib) {
    return ka > kb || (ka == kb && ia < ib);
}

// logsumexp as the host computes it (the CPU's top_k_row), so that a sequence's
// log-probs do not depend on where its top entries were picked: M = the largest
// non-NaN logit (a thread's running max, then block_max_f32); when M is finite,
// lse = (float)((double)M + log(Σ exp((double)x − (double)M))), summed in f64 (the sum's
// order differs from the host's, far below what the final rounding to f32 keeps);
// else lse = M. Contains __syncthreads; every thread must call it.
__device__ __forceinline__ float row_lse(const float* __restrict__ row, unsigned int vocab, float m, float* sm,
                                         double* sd) {
    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const unsigned int nwarps = (blockDim.x + 31u) >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(STRATA_FULL_MASK, m, o));
    __syncthreads();
    if (lane == 0u) sm[warp] = m;
    __syncthreads();
    m = lane < nwarps ? sm[lane] : strata_neg_inf();
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(STRATA_FULL_MASK, m, o));
    if (m == strata_neg_inf() || m == strata_pos_inf()) return m;  // uniform: m is the block's
    double s = 0.0;
    for (unsigned int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float x = row[i];
        if (x == x) s += exp((double)x - (double)m);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(STRATA_FULL_MASK, s, o);
    __syncthreads();
    if (lane == 0u) sd[warp] = s;
    __syncthreads();
    s = lane < nwarps ? sd[lane] : 0.0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(STRATA_FULL_MASK, s, o);
    return (float)((double)m + log(s));
}

// Warp-wide best (key, idx); every lane gets the result.
__device__ __forceinline__ void warp_best(unsigned int& key, unsigned int& idx) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned int k2 = __shfl_xor_sync(STRATA_FULL_MASK, key, o);
        const unsigned int i2 = __shfl_xor_sync(STRATA_FULL_MASK, idx, o);
        if (cand_better(k2, i2, key, idx)) {
            key = k2;
            idx = i2;
        }
    }
}

// Block-wide best (key, idx); every thread gets the result. Contains __syncthreads.
__device__ __forceinline__ void block_best(unsigned int& key, unsigned int& idx, unsigned int* sk, unsigned int* si) {
    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const unsigned int nwarps = (blockDim.x + 31u) >> 5;
    warp_best(key, idx);
    __syncthreads();
    if (lane == 0u) {
        sk[warp] = key;
        si[warp] = idx;
    }
    __syncthreads();
    key = lane < nwarps ? sk[lane] : 0u;
    idx = lane < nwarps ? si[lane] : SAMPLE_NONE;
    warp_best(key, idx);
}

__device__ __forceinline__ unsigned int block_max_u32(unsigned int v, unsigned int* scratch) {
    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const unsigned int nwarps = (blockDim.x + 31u) >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned int t = __shfl_xor_sync(STRATA_FULL_MASK, v, o);
        v = t > v ? t : v;
    }
    __syncthreads();
    if (lane == 0u) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : 0u;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned int t = __shfl_xor_sync(STRATA_FULL_MASK, v, o);
        v = t > v ? t : v;
    }
    return v;
}

// Exclusive prefix sum of v over the block (in thread order); `total` gets the sum.
// Contains __syncthreads.
__device__ __forceinline__ unsigned int block_exclusive_scan(unsigned int v, unsigned int* scratch,
                                                             unsigned int& total) {
    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const unsigned int nwarps = (blockDim.x + 31u) >> 5;
    unsigned int incl = v;
#pragma unroll
    for (unsigned int o = 1; o < 32u; o <<= 1) {
        const unsigned int t = __shfl_sync(STRATA_FULL_MASK, incl, lane >= o ? lane - o : lane);
        if (lane >= o) incl += t;
    }
    __syncthreads();
    if (lane == 31u) scratch[warp] = incl;
    __syncthreads();
    // Every warp scans the warp totals itself (32 values).
    unsigned int wt = lane < nwarps ? scratch[lane] : 0u;
    unsigned int wincl = wt;
#pragma unroll
    for (unsigned int o = 1; o < 32u; o <<= 1) {
        const unsigned int t = __shfl_sync(STRATA_FULL_MASK, wincl, lane >= o ? lane - o : lane);
        if (lane >= o) wincl += t;
    }
    total = __shfl_sync(STRATA_FULL_MASK, wincl, 31);
    const unsigned int warp_excl = __shfl_sync(STRATA_FULL_MASK, wincl - wt, warp & 31u);
    return warp_excl + incl - v;
}

// argmax_f32(logits, vocab, idx, val, lse): idx[r] = index of the largest logit of row r
// (lowest index on ties, NaN skipped), val[r] = that logit, lse[r] = logsumexp of the row.
// A row of only NaN gives idx = 0xffffffff, val = NaN, lse = −inf.
// Launch: grid (rows), block 1024.
extern "C" __global__ void __launch_bounds__(1024)
    argmax_f32(const float* __restrict__ logits, unsigned int vocab, unsigned int* __restrict__ idx,
               float* __restrict__ val, float* __restrict__ lse) {
    __shared__ unsigned int sk[32], si[32];
    __shared__ float sm[32];
    __shared__ double sd[32];
    const unsigned int r = blockIdx.x;
    const float* row = logits + (unsigned long long)r * vocab;
    unsigned int bk = 0u, bi = SAMPLE_NONE;
    float m = strata_neg_inf();
    for (unsigned int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float x = row[i];
        if (x == x) {
            const unsigned int key = logit_key(x);
            if (key > bk) {  // i increases: an equal key keeps the lower index
                bk = key;
                bi = i;
            }
            m = fmaxf(m, x);
        }
    }
    block_best(bk, bi, sk, si);
    const float l = row_lse(row, vocab, m, sm, sd);
    if (threadIdx.x == 0u) {
        idx[r] = bi;
        val[r] = bi != SAMPLE_NONE ? row[bi] : __int_as_float(0x7fc00000);
        lse[r] = l;
    }
}

// topk_f32(logits, vocab, k, idx, val, lse): the k (<= 256) largest logits of row r in
// descending order (lower index first on ties, NaN never chosen) at idx[r·k + i],
// val[r·k + i], and lse[r]. When the row has fewer than k non-NaN logits the slots past
// them get idx = 0xffffffff, val = NaN.
// Launch: grid (rows), block 1024.
//
// Method: one pass keeps each thread's best TOPK_T (8) logits of its strided slice in
// registers (and the logsumexp); binary searches over block-wide counts find the k-th
// best candidate θ = (key V, index I); the candidates at least as good as θ are
// compacted into shared memory and ranked. That is exact unless some thread dropped a
// logit that beats θ, which the kernel detects (a thread that saw more than 8 and whose
// 8th candidate beats θ); it then falls back to k rounds of block-wide "best logit worse
// than the previous one" over the whole row (slow, exact, rare: it needs 8 of the top k
// in one thread's slice).
extern "C" __global__ void __launch_bounds__(1024, 1)
    topk_f32(const float* __restrict__ logits, unsigned int vocab, unsigned int k, unsigned int* __restrict__ idx,
             float* __restrict__ val, float* __restrict__ lse) {
    __shared__ unsigned int sk[32], si[32], su[32];
    __shared__ float sm[32];
    __shared__ double sd[32];
    __shared__ unsigned int sel_key[TOPK_MAX_K], sel_idx[TOPK_MAX_K];

    const unsigned int r = blockIdx.x;
    const float* row = logits + (unsigned long long)r * vocab;
    const unsigned int kmax = k < TOPK_MAX_K ? k : TOPK_MAX_K;
    unsigned int* oidx = idx + (unsigned long long)r * k;
    float* oval = val + (unsigned long long)r * k;

    // Pass 1: per-thread best TOPK_T (sorted, best first) and logsumexp.
    unsigned int ck[TOPK_T], ci[TOPK_T];
#pragma unroll
    for (int t = 0; t < TOPK_T; ++t) {
        ck[t] = 0u;
        ci[t] = SAMPLE_NONE;
    }
    unsigned int seen = 0u;
    float m = strata_neg_inf();
    for (unsigned int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float x = row[i];
        if (x == x) {
            ++seen;
            m = fmaxf(m, x);
            const unsigned int key = logit_key(x);
            if (key > ck[TOPK_T - 1]) {  // i increases: equal keys keep the earlier index
                ck[TOPK_T - 1] = key;
                ci[TOPK_T - 1] = i;
#pragma unroll
                for (int t = TOPK_T - 1; t > 0; --t) {
                    if (ck[t] > ck[t - 1]) {
                        const unsigned int a = ck[t], b = ci[t];
                        ck[t] = ck[t - 1];
                        ci[t] = ci[t - 1];
                        ck[t - 1] = a;
                        ci[t - 1] = b;
                    }
                }
            }
        }
    }
    const float l = row_lse(row, vocab, m, sm, sd);
    if (threadIdx.x == 0u) lse[r] = l;

    const unsigned int nvalid = block_sum_u32(seen, su);
    const unsigned int kk = kmax < nvalid ? kmax : nvalid;  // slots that get a logit
    const unsigned int ncand = block_sum_u32(seen < (unsigned int)TOPK_T ? seen : (unsigned int)TOPK_T, su);

    bool fallback = ncand < kk;
    unsigned int V = 0u, I = SAMPLE_NONE;
    if (!fallback && kk > 0u) {  // block-uniform
        // V: the largest key with at least kk candidates >= V.
        unsigned int lo = 1u, hi = 0xffffffffu;
        while (lo < hi) {
            const unsigned int mid = lo + (hi - lo) / 2u + ((hi - lo) & 1u);  // ceil midpoint
            unsigned int c = 0u;
#pragma unroll
            for (int t = 0; t < TOPK_T; ++t) c += ck[t] >= mid ? 1u : 0u;
            c = block_sum_u32(c, su);
            if (c >= kk) lo = mid;
            else hi = mid - 1u;
        }
        V = lo;
        unsigned int cgt = 0u, ceq = 0u;
#pragma unroll
        for (int t = 0; t < TOPK_T; ++t) {
            cgt += ck[t] > V ? 1u : 0u;
            ceq += ck[t] == V ? 1u : 0u;
        }
        cgt = block_sum_u32(cgt, su);
        ceq = block_sum_u32(ceq, su);
        const unsigned int need = kk - cgt;  // 1 ..= ceq
        if (ceq == need) {
            // All candidates with key V are taken; I is the largest of their indices.
            unsigned int mx = 0u;
#pragma unroll
            for (int t = 0; t < TOPK_T; ++t) {
                if (ck[t] == V && ci[t] > mx) mx = ci[t];
            }
            I = block_max_u32(mx, su);
        } else {
            // I: the smallest index with `need` candidates of key V at or below it.
            unsigned int ilo = 0u, ihi = vocab - 1u;
            while (ilo < ihi) {
                const unsigned int mid = ilo + (ihi - ilo) / 2u;
                unsigned int c = 0u;
#pragma unroll
                for (int t = 0; t < TOPK_T; ++t) c += (ck[t] == V && ci[t] <= mid) ? 1u : 0u;
                c = block_sum_u32(c, su);
                if (c >= need) ihi = mid;
                else ilo = mid + 1u;
            }
            I = ilo;
        }
        // Did a thread drop a logit that may beat θ = (V, I)?
        const unsigned int dropped =
            (seen > (unsigned int)TOPK_T && cand_better(ck[TOPK_T - 1], ci[TOPK_T - 1], V, I)) ? 1u : 0u;
        fallback = block_sum_u32(dropped, su) > 0u;
    }

    if (!fallback) {  // block-uniform
        // Compact the selected candidates (exactly kk of them) into shared memory.
        unsigned int c = 0u;
#pragma unroll
        for (int t = 0; t < TOPK_T; ++t) c += (ck[t] > V || (ck[t] == V && ci[t] <= I)) ? 1u : 0u;
        unsigned int total;
        unsigned int off = block_exclusive_scan(c, su, total);
#pragma unroll
        for (int t = 0; t < TOPK_T; ++t) {
            if (ck[t] > V || (ck[t] == V && ci[t] <= I)) {
                if (off < TOPK_MAX_K) {
                    sel_key[off] = ck[t];
                    sel_idx[off] = ci[t];
                }
                ++off;
            }
        }
        __syncthreads();
        // Rank by comparison with every other selected candidate (keys are distinct pairs).
        for (unsigned int a = threadIdx.x; a < kk; a += blockDim.x) {
            const unsigned int ka = sel_key[a], ia = sel_idx[a];
            unsigned int rank = 0u;
            for (unsigned int b = 0; b < kk; ++b) rank += cand_better(sel_key[b], sel_idx[b], ka, ia) ? 1u : 0u;
            oidx[rank] = ia;
            oval[rank] = row[ia];
        }
    } else {
        // Exact fallback: round j picks the best logit strictly worse than round j − 1's.
        unsigned int pk = 0xffffffffu, pi = 0u;  // worse-than-this bound; nothing is better
        bool open = true;                        // no bound yet in round 0
        for (unsigned int j = 0; j < kk; ++j) {
            unsigned int bk = 0u, bi = SAMPLE_NONE;
            for (unsigned int i = threadIdx.x; i < vocab; i += blockDim.x) {
                const float x = row[i];
                if (x == x) {
                    const unsigned int key = logit_key(x);
                    if ((open || cand_better(pk, pi, key, i)) && key > bk) {
                        bk = key;
                        bi = i;
                    }
                }
            }
            block_best(bk, bi, sk, si);
            if (threadIdx.x == 0u) {
                oidx[j] = bi;
                oval[j] = row[bi];
            }
            pk = bk;
            pi = bi;
            open = false;
        }
    }
    for (unsigned int j = kk + threadIdx.x; j < k; j += blockDim.x) {
        oidx[j] = SAMPLE_NONE;
        oval[j] = __int_as_float(0x7fc00000);
    }
}
