// norm.cu: RMS norm (common.cuh is prepended).

// out[r, j] = w[j] * (x[r, j] * inv), inv = 1 / sqrt(mean_j(x[r, j]²) + eps), for a
// [rows, dim] row-major x; w is f32 [dim].
// Launch: grid (rows), block 256 (any multiple of 32 up to 1024 works). The sum of
// squares is accumulated in f32 per thread and tree-reduced across the block.
extern "C" __global__ void __launch_bounds__(1024) rms_norm_f32(const float* __restrict__ x, const float* __restrict__ w,
                                                                float* __restrict__ out, unsigned int dim, float eps) {
    __shared__ float scratch[32];
    const unsigned long long base = (unsigned long long)blockIdx.x * dim;
    const float* xr = x + base;
    float* orow = out + base;
    float ss = 0.0f;
    for (unsigned int j = threadIdx.x; j < dim; j += blockDim.x) {
        const float v = xr[j];
        ss += v * v;
    }
    ss = block_sum(ss, scratch);
    const float mean = ss / (float)dim;
    const float inv = 1.0f / sqrtf(mean + eps);
    for (unsigned int j = threadIdx.x; j < dim; j += blockDim.x) {
        orow[j] = w[j] * (xr[j] * inv);
    }
}
