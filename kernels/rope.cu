// rope.cu: rotary position embedding, in place (common.cuh is prepended).

// x is [rows, n_heads * head_dim] row-major; row r (blockIdx.x) has position pos[r],
// head h is blockIdx.y. Pair i (0 <= i < head_dim / 2) rotates by the angle
// pos[r] * inv_freq[i], with cos and sin both scaled by attn_factor:
//   x0' = x0·cos − x1·sin,  x1' = x1·cos + x0·sin
// where (x0, x1) = (x[i], x[i + head_dim/2]) (NEOX, interleaved == 0) or
// (x[2i], x[2i + 1]) (interleaved != 0).
// Launch: grid (rows, n_heads), block head_dim / 2 (any block size works: threads loop
// over the pairs). Uses sinf/cosf with full-range argument reduction (do not compile
// with --use_fast_math: positions times frequencies reach 1e5+ radians).
extern "C" __global__ void __launch_bounds__(1024) rope_f32(float* __restrict__ x, const unsigned int* __restrict__ pos,
                                                            const float* __restrict__ inv_freq, unsigned int n_heads,
                                                            unsigned int head_dim, float attn_factor,
                                                            int interleaved) {
    const unsigned int row = blockIdx.x, h = blockIdx.y;
    const unsigned int half = head_dim / 2u;
    float* head = x + ((unsigned long long)row * n_heads + h) * head_dim;
    const float p = (float)pos[row];
    for (unsigned int i = threadIdx.x; i < half; i += blockDim.x) {
        const float angle = p * inv_freq[i];
        const float c = cosf(angle) * attn_factor;
        const float s = sinf(angle) * attn_factor;
        const unsigned int i0 = interleaved ? 2u * i : i;
        const unsigned int i1 = interleaved ? 2u * i + 1u : i + half;
        const float x0 = head[i0], x1 = head[i1];
        head[i0] = x0 * c - x1 * s;
        head[i1] = x1 * c + x0 * s;
    }
}
