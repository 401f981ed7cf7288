// deltanet.cu: the gated delta rule, the linear attention of Qwen3-Next and Qwen3.5
// (common.cuh is prepended). crates/strata-backend/src/delta.rs describes the rule and holds the host
// form these kernels follow step for step. Both take one sequence's n tokens, in order;
// the state carries between calls, so a prompt in one call, in chunks or token by
// token gives the same numbers.
//
// Shapes: key_dim = nk * dk, value_dim = nv * dv, conv_dim = 2 key_dim + value_dim,
// r = nv / nk. A token's qkvz row holds 2 key_dim + 2 value_dim values: queries, keys,
// values and z, either each whole in head order (`grouped` 0) or grouped by key head
// (`grouped` 1: per key head g, [q_g (dk), k_g (dk), v of its r value heads (r dv),
// z of the same (r dv)]). The state: (taps - 1) conv_dim floats (the convolution's last
// inputs, oldest first, channel-major within a row), then S, nv matrices of dk x dv.

#define DELTA_MAX_TAPS 8u
#define DELTA_MAX_DK 256u

__device__ __forceinline__ float delta_silu(float x) { return x / (1.0f + expf(-x)); }

// The qkvz column of conv channel c (queries, keys, values in head order).
__device__ __forceinline__ unsigned int delta_conv_col(unsigned int c, unsigned int nk, unsigned int nv,
                                                       unsigned int dk, unsigned int dv, int grouped) {
    if (!grouped) return c;
    const unsigned int key_dim = nk * dk, rdv = (nv / nk) * dv, group = 2u * dk + 2u * rdv;
    if (c < key_dim) return (c / dk) * group + c % dk;
    if (c < 2u * key_dim) return ((c - key_dim) / dk) * group + dk + (c - key_dim) % dk;
    const unsigned int j = c - 2u * key_dim;
    return (j / rdv) * group + 2u * dk + j % rdv;
}

// The qkvz column of z's value channel j.
__device__ __forceinline__ unsigned int delta_z_col(unsigned int j, unsigned int nk, unsigned int nv,
                                                    unsigned int dk, unsigned int dv, int grouped) {
    const unsigned int rdv = (nv / nk) * dv;
    if (!grouped) return 2u * nk * dk + nv * dv + j;
    return (j / rdv) * (2u * dk + 2u * rdv) + 2u * dk + rdv + j % rdv;
}

// delta_conv_f32(qkvz, conv_w, state, mixed, n, nk, nv, dk, dv, taps, grouped):
//   qkvz [n, 2 key_dim + 2 value_dim]; conv_w [conv_dim, taps]; state: the conv part of
//   the sequence's state (read, then updated to the last taps - 1 inputs); mixed
//   [n, conv_dim] out: silu(the causal depthwise convolution) of each token's queries,
//   keys and values, in head order. 2 <= taps <= 8.
// Launch: grid ceil(conv_dim / 256), block 256; thread c owns channel c for every token.
extern "C" __global__ void __launch_bounds__(256)
    delta_conv_f32(const float* __restrict__ qkvz, const float* __restrict__ conv_w, float* __restrict__ state,
                   float* __restrict__ mixed, unsigned int n, unsigned int nk, unsigned int nv, unsigned int dk,
                   unsigned int dv, unsigned int taps, int grouped) {
    const unsigned int conv_dim = 2u * nk * dk + nv * dv;
    const unsigned int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= conv_dim || taps < 2u || taps > DELTA_MAX_TAPS) return;
    const unsigned int row_len = 2u * nk * dk + 2u * nv * dv, col = delta_conv_col(c, nk, nv, dk, dv, grouped);
    const float* w = conv_w + (unsigned long long)c * taps;
    float hist[DELTA_MAX_TAPS - 1u];
#pragma unroll
    for (unsigned int j = 0; j < DELTA_MAX_TAPS - 1u; ++j) hist[j] = j < taps - 1u ? state[j * conv_dim + c] : 0.0f;
    for (unsigned int t = 0; t < n; ++t) {
        const float x = qkvz[(unsigned long long)t * row_len + col];
        float acc = 0.0f;
#pragma unroll
        for (unsigned int j = 0; j < DELTA_MAX_TAPS - 1u; ++j) {
            if (j < taps - 1u) acc += w[j] * hist[j];
        }
        acc += w[taps - 1u] * x;
        mixed[(unsigned long long)t * conv_dim + c] = delta_silu(acc);
#pragma unroll
        for (unsigned int j = 0; j + 1u < DELTA_MAX_TAPS - 1u; ++j) {
            if (j + 1u < taps - 1u) hist[j] = hist[j + 1u];
        }
        hist[taps - 2u] = x;
    }
#pragma unroll
    for (unsigned int j = 0; j < DELTA_MAX_TAPS - 1u; ++j) {
        if (j < taps - 1u) state[j * conv_dim + c] = hist[j];
    }
}

// delta_rule_f32(mixed, qkvz, ba, neg_a, dt_bias, norm_w, s, out, n, nk, nv, dk, dv,
//                qkvz_grouped, ba_grouped, v_tiled, eps):
//   mixed [n, conv_dim] (delta_conv_f32's output); qkvz for z; ba [n, 2 nv] (`b` then `a`
//   per value head, or grouped by key head: [b.. (r), a.. (r)] per key head); neg_a,
//   dt_bias [nv]; norm_w [dv]; s: the sequence's S (nv x dk x dv, updated); out
//   [n, value_dim]: each head's gated, normalized output. dk <= 256.
// Launch: grid nv, block dv rounded up to a multiple of 32 (<= 1024): block h is value
// head h (key head h % nk when v_tiled, else h / r); thread j owns column j of S_h.
extern "C" __global__ void __launch_bounds__(1024)
    delta_rule_f32(const float* __restrict__ mixed, const float* __restrict__ qkvz, const float* __restrict__ ba,
                   const float* __restrict__ neg_a, const float* __restrict__ dt_bias,
                   const float* __restrict__ norm_w, float* __restrict__ s, float* __restrict__ out,
                   unsigned int n, unsigned int nk, unsigned int nv, unsigned int dk, unsigned int dv,
                   int qkvz_grouped, int ba_grouped, int v_tiled, float eps) {
    __shared__ float sq[DELTA_MAX_DK];
    __shared__ float sk[DELTA_MAX_DK];
    __shared__ float scratch[32];
    if (dk > DELTA_MAX_DK) return;  // uniform: the launcher refuses it
    const unsigned int h = blockIdx.x, j = threadIdx.x, r = nv / nk;
    const unsigned int g = v_tiled ? h % nk : h / r;
    const unsigned int key_dim = nk * dk, value_dim = nv * dv, conv_dim = 2u * key_dim + value_dim;
    const unsigned int row_len = 2u * key_dim + 2u * value_dim;
    const float scale = 1.0f / sqrtf((float)dk);
    float* sh = s + (unsigned long long)h * dk * dv;
    for (unsigned int t = 0; t < n; ++t) {
        const float* m = mixed + (unsigned long long)t * conv_dim;
        // This head's query and key, L2-normalized (the query then scaled).
        float qq = 0.0f, kk = 0.0f;
        for (unsigned int i = j; i < dk; i += blockDim.x) {
            const float q = m[g * dk + i], k = m[key_dim + g * dk + i];
            sq[i] = q;
            sk[i] = k;
            qq += q * q;
            kk += k * k;
        }
        qq = block_sum(qq, scratch);
        kk = block_sum(kk, scratch);
        const float qinv = 1.0f / sqrtf(qq + 1e-6f), kinv = 1.0f / sqrtf(kk + 1e-6f);
        for (unsigned int i = j; i < dk; i += blockDim.x) {
            sq[i] = (sq[i] * qinv) * scale;
            sk[i] = sk[i] * kinv;
        }
        __syncthreads();
        const float* bat = ba + (unsigned long long)t * 2u * nv;
        const float b = ba_grouped ? bat[g * 2u * r + h % r] : bat[h];
        const float a = ba_grouped ? bat[g * 2u * r + r + h % r] : bat[nv + h];
        const float beta = 1.0f / (1.0f + expf(-b));
        const float x = a + dt_bias[h];
        const float sp = x > 20.0f ? x : log1pf(expf(x));
        const float decay = expf(neg_a[h] * sp);
        float o = 0.0f;
        if (j < dv) {
            // delta = beta (v - (decay S)^T k); then S = decay S + k delta^T, o = S^T q.
            float acc = 0.0f;
            for (unsigned int i = 0; i < dk; ++i) acc += (sh[i * dv + j] * decay) * sk[i];
            const float delta = (m[2u * key_dim + h * dv + j] - acc) * beta;
            for (unsigned int i = 0; i < dk; ++i) {
                const float v = sh[i * dv + j] * decay + sk[i] * delta;
                sh[i * dv + j] = v;
                o += v * sq[i];
            }
        }
        // The gated RMS norm over the head's dv outputs.
        const float ss = block_sum(o * o, scratch);
        const float inv = 1.0f / sqrtf(ss / (float)dv + eps);
        if (j < dv) {
            const float z = qkvz[(unsigned long long)t * row_len + delta_z_col(h * dv + j, nk, nv, dk, dv, qkvz_grouped)];
            out[(unsigned long long)t * value_dim + h * dv + j] = norm_w[j] * (o * inv) * delta_silu(z);
        }
        __syncthreads();  // sq and sk are rewritten for the next token
    }
}
