// dequant.cu: whole tensors to f16 bits for the cuBLAS prefill GEMM (common.cuh and
// quant.cuh are prepended).
//
// dequant_FMT_f16(w, out, n): out[i] = f16(value i of w), i < n, rounded to nearest
// even; n is a whole number of blocks for the block formats and may exceed 2^32.
// Launch: any 1-D grid, block 256 (any block size works); every kernel is a grid-stride
// loop over 64-bit indices. The element formats take one value per thread per step; the
// block formats one 8-value part per thread per step (consecutive threads read
// consecutive bytes of a block). The launcher's grid of ceil(blocks / 256) capped at
// 65535 covers it in a few steps; ceil(n / 8 / 256) capped likewise would be one step.

#define DQ_GRID_STRIDE_LOOP(i, n)                                                                 \
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;      \
         i < (n); i += (unsigned long long)gridDim.x * blockDim.x)

// f16 is a copy; f32 and bf16 convert (bf16 -> f32 is exact, then RNE to f16).
extern "C" __global__ void __launch_bounds__(1024) dequant_f16_f16(const unsigned char* __restrict__ w,
                                                                   unsigned short* __restrict__ out,
                                                                   unsigned long long n) {
    const unsigned short* s = (const unsigned short*)w;
    DQ_GRID_STRIDE_LOOP(i, n) { out[i] = s[i]; }
}

extern "C" __global__ void __launch_bounds__(1024) dequant_f32_f16(const unsigned char* __restrict__ w,
                                                                   unsigned short* __restrict__ out,
                                                                   unsigned long long n) {
    DQ_GRID_STRIDE_LOOP(i, n) { out[i] = f16_from_f32(load_elem_f32(w, i)); }
}

extern "C" __global__ void __launch_bounds__(1024) dequant_bf16_f16(const unsigned char* __restrict__ w,
                                                                    unsigned short* __restrict__ out,
                                                                    unsigned long long n) {
    DQ_GRID_STRIDE_LOOP(i, n) { out[i] = f16_from_f32(load_elem_bf16(w, i)); }
}

#define DEQUANT_BLOCK(NAME, QK, BYTES, PARTS, GAP)                                                \
    extern "C" __global__ void __launch_bounds__(1024)                                            \
        dequant_##NAME##_f16(const unsigned char* __restrict__ w, unsigned short* __restrict__ out, \
                             unsigned long long n) {                                              \
        const unsigned long long nparts = n / (QK) * (PARTS);                                     \
        DQ_GRID_STRIDE_LOOP(p, nparts) {                                                          \
            const unsigned long long blk = p / (PARTS);                                           \
            const unsigned int part = (unsigned int)(p % (PARTS));                                \
            float v[8];                                                                           \
            const unsigned int off = dec8_##NAME(w + blk * (BYTES), part, v);                     \
            unsigned short* ob = out + blk * (QK) + off;                                          \
            _Pragma("unroll") for (unsigned int i = 0; i < 4u; ++i) {                             \
                ob[i] = f16_from_f32(v[i]);                                                         \
                ob[(GAP) + i] = f16_from_f32(v[4u + i]);                                            \
            }                                                                                     \
        }                                                                                         \
    }
STRATA_BLOCK_FORMATS(DEQUANT_BLOCK)

// dequant_packed_FMT_f16(q, d, out, n): the same for the first n values (a whole number
// of rows) of a tensor in the packed layout (quant.cuh), `q` and `d` pointing at its
// first block's quants and scales. One value per thread per step.
#define DEQUANT_PACKED(NAME, QK, QB)                                                                  \
    extern "C" __global__ void __launch_bounds__(1024)                                            \
        dequant_packed_##NAME##_f16(const unsigned char* __restrict__ q,                          \
                                    const unsigned short* __restrict__ d,                         \
                                    unsigned short* __restrict__ out, unsigned long long n) {     \
        DQ_GRID_STRIDE_LOOP(i, n) { out[i] = f16_from_f32(packed_##NAME(q, d, i / (QK), (unsigned int)(i % (QK)))); } \
    }
STRATA_PACKED_FORMATS(DEQUANT_PACKED)
