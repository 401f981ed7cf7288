// rope.cu: rotary position embedding, in place (common.cuh is prepended).

// x is [rows, n_heads * head_dim] row-major; row r (blockIdx.x) has position pos[r],
// head h is blockIdx.y. The first n_pairs pairs of each head rotate (n_pairs <= head_dim / 2;
// fewer is partial RoPE): pair i rotates by the angle pos[r] * inv_freq[i], with cos and
// sin both scaled by attn_factor:
//   x0' = x0·cos − x1·sin,  x1' = x1·cos + x0·sin
// where (x0, x1) = (x[i], x[i + n_pairs]) (NEOX, interleaved == 0) or
// (x[2i], x[2i + 1]) (interleaved != 0). Dimensions 2·n_pairs.. of each head are left
// as they are.
// Launch: grid (rows, n_heads), block n_pairs (any block size works: threads loop
// over the pairs). Uses sinf/cosf with full-range argument reduction (do not compile
// with --use_fast_math: positions times frequencies reach 1e5+ radians).
extern "C" __global__ void __launch_bounds__(1024) rope_f32(float* __restrict__ x, const unsigned int* __restrict__ pos,
                                                            const float* __restrict__ inv_freq, unsigned int n_heads,
                                                            unsigned int head_dim, unsigned int n_pairs,
                                                            float attn_factor, int interleaved) {
    const unsigned int row = blockIdx.x, h = blockIdx.y;
    const unsigned int half = head_dim / 2u;
    const unsigned int np = n_pairs < half ? n_pairs : half;  // never past the head
    float* head = x + ((unsigned long long)row * n_heads + h) * head_dim;
    const float p = (float)pos[row];
    for (unsigned int i = threadIdx.x; i < np; i += blockDim.x) {
        const unsigned int i0 = interleaved ? 2u * i : i;
        const unsigned int i1 = interleaved ? 2u * i + 1u : i + np;
        strata_rope_pair(head, i0, i1, p, inv_freq[i], attn_factor);
    }
}
