// elementwise.cu: 1-D elementwise kernels (common.cuh is prepended).
//
// Launch shape for all of them: 1-D grid, block 256 (any block size works), grid
// ceil(n / 256). Every kernel walks a grid-stride loop over 64-bit indices, so a
// smaller grid (or a capped one) is also correct.

// Start index and stride of a 1-D grid-stride loop.
#define GRID_STRIDE_LOOP(i, n)                                                                  \
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;      \
         i < (n); i += (unsigned long long)gridDim.x * blockDim.x)

// x[i] += y[i], i < n. Grid ceil(n / 256), block 256.
extern "C" __global__ void __launch_bounds__(256) add_f32(float* __restrict__ x, const float* __restrict__ y,
                                                          unsigned int n) {
    GRID_STRIDE_LOOP(i, (unsigned long long)n) { x[i] += y[i]; }
}

// x[r, j] += b[j] for a [rows, width] row-major x. Grid ceil(rows * width / 256),
// block 256.
extern "C" __global__ void __launch_bounds__(256) add_bias_f32(float* __restrict__ x, const float* __restrict__ b,
                                                               unsigned int rows, unsigned int width) {
    const unsigned long long n = (unsigned long long)rows * width;
    GRID_STRIDE_LOOP(i, n) { x[i] += b[i % width]; }
}

// g[i] = silu(g[i]) * u[i] = g / (1 + e^-g) * u (the CPU's evaluation order), i < n.
// Grid ceil(n / 256), block 256.
extern "C" __global__ void __launch_bounds__(256) silu_mul_f32(float* __restrict__ g, const float* __restrict__ u,
                                                               unsigned int n) {
    GRID_STRIDE_LOOP(i, (unsigned long long)n) { g[i] = strata_silu_mul(g[i], u[i]); }
}

// g[i] = gelu_tanh(g[i]) * u[i], with PyTorch's gelu(approximate="tanh")
//   gelu_tanh(a) = 0.5·a·(1 + tanh(√(2/π)·(a + 0.044715·a³)))
// in the CPU's evaluation order (crates/strata-backend/src/cpu/mod.rs `gelu_tanh`), i < n.
// Grid ceil(n / 256), block 256.
extern "C" __global__ void __launch_bounds__(256) gelu_mul_f32(float* __restrict__ g, const float* __restrict__ u,
                                                               unsigned int n) {
    GRID_STRIDE_LOOP(i, (unsigned long long)n) { g[i] = strata_gelu_mul(g[i], u[i]); }
}

// g[i] = sigmoid(g[i]) * u[i] = u / (1 + e^-g) (the CPU's evaluation order), i < n: a
// gate on u (Qwen3-Next's attention output). Grid ceil(n / 256), block 256.
extern "C" __global__ void __launch_bounds__(256) sigmoid_mul_f32(float* __restrict__ g, const float* __restrict__ u,
                                                                  unsigned int n) {
    GRID_STRIDE_LOOP(i, (unsigned long long)n) { g[i] = strata_sigmoid_mul(g[i], u[i]); }
}

// gpt-oss's clamped SwiGLU, i < n: x = min(g[i], limit), y = clamp(u[i], −limit, limit),
// g[i] = x / (1 + e^(−alpha·x)) · (y + 1), in the CPU's evaluation order
// (crates/strata-backend/src/cpu/mod.rs `glu_slices`, Activation::SwigluOai). fminf
// gives `limit` for a NaN gate, as Rust's f32::min; a NaN up stays NaN, as f32::clamp.
// Grid ceil(n / 256), block 256.
extern "C" __global__ void __launch_bounds__(256) swiglu_oai_f32(float* __restrict__ g, const float* __restrict__ u,
                                                                 unsigned int n, float alpha, float limit) {
    GRID_STRIDE_LOOP(i, (unsigned long long)n) { g[i] = strata_swiglu_oai_mul(g[i], u[i], alpha, limit); }
}

// x[i] *= factor, i < n. Grid ceil(n / 256), block 256.
extern "C" __global__ void __launch_bounds__(256) scale_f32(float* __restrict__ x, unsigned int n, float factor) {
    GRID_STRIDE_LOOP(i, (unsigned long long)n) { x[i] *= factor; }
}

// x[i] = cap · tanh(x[i] / cap) (logit softcapping), i < n; cap != 0.
// Grid ceil(n / 256), block 256.
extern "C" __global__ void __launch_bounds__(256) softcap_f32(float* __restrict__ x, unsigned int n, float cap) {
    GRID_STRIDE_LOOP(i, (unsigned long long)n) { x[i] = strata_softcap(x[i], cap); }
}

// y[i] = f16 bits of x[i], round to nearest even (inf/NaN/subnormals handled), i < n.
// Grid ceil(n / 256) (may be capped: grid-stride), block 256.
extern "C" __global__ void __launch_bounds__(256) f32_to_f16(const float* __restrict__ x, unsigned short* __restrict__ y,
                                                             unsigned long long n) {
    GRID_STRIDE_LOOP(i, n) { y[i] = f16_from_f32(x[i]); }
}
