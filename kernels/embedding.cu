// embedding.cu: row lookups of a [vocab, dim] table in any weight format
// (common.cuh and quant.cuh are prepended).
//
// embed_FMT(table, ids, out, dim): out[r, 0..dim] = dequant(table row ids[r]).
// Launch: grid (rows), block 256 (any block size works). `dim` is a whole number of
// blocks for the block formats. Row byte offsets are 64-bit.

// Element formats: thread j copies values j, j + blockDim.x, ...
#define EMBED_ELEM(NAME, ESIZE)                                                                   \
    extern "C" __global__ void __launch_bounds__(1024)                                            \
        embed_##NAME(const unsigned char* __restrict__ table, const unsigned int* __restrict__ ids, \
                     float* __restrict__ out, unsigned int dim) {                                  \
        const unsigned int r = blockIdx.x;                                                        \
        const unsigned char* row = table + (unsigned long long)ids[r] * dim * (ESIZE);           \
        float* o = out + (unsigned long long)r * dim;                                             \
        for (unsigned int j = threadIdx.x; j < dim; j += blockDim.x) o[j] = load_elem_##NAME(row, j); \
    }
STRATA_ELEM_FORMATS(EMBED_ELEM)

// Block formats: thread t decodes parts t, t + blockDim.x, ... (8 values each) of the row.
#define EMBED_BLOCK(NAME, QK, BYTES, PARTS, GAP)                                                  \
    extern "C" __global__ void __launch_bounds__(1024)                                            \
        embed_##NAME(const unsigned char* __restrict__ table, const unsigned int* __restrict__ ids, \
                     float* __restrict__ out, unsigned int dim) {                                  \
        const unsigned int r = blockIdx.x;                                                        \
        const unsigned int nblk = dim / (QK);                                                     \
        const unsigned char* row = table + (unsigned long long)ids[r] * nblk * (BYTES);          \
        float* o = out + (unsigned long long)r * dim;                                             \
        const unsigned int nparts = nblk * (PARTS);                                               \
        for (unsigned int p = threadIdx.x; p < nparts; p += blockDim.x) {                         \
            const unsigned int blk = p / (PARTS), part = p % (PARTS);                             \
            float v[8];                                                                           \
            const unsigned int off = dec8_##NAME(row + (unsigned long long)blk * (BYTES), part, v); \
            float* ob = o + blk * (QK) + off;                                                     \
            _Pragma("unroll") for (unsigned int i = 0; i < 4u; ++i) {                             \
                ob[i] = v[i];                                                                     \
                ob[(GAP) + i] = v[4u + i];                                                        \
            }                                                                                     \
        }                                                                                         \
    }
STRATA_BLOCK_FORMATS(EMBED_BLOCK)

// embed_packed_FMT(q, d, ids, out, dim): the same lookup in a table in the packed
// layout (quant.cuh): `q` its quants, `d` its scales. Launch as embed_FMT; thread
// j takes values j, j + blockDim.x, ...
#define EMBED_PACKED(NAME, QK, QB)                                                                    \
    extern "C" __global__ void __launch_bounds__(1024)                                            \
        embed_packed_##NAME(const unsigned char* __restrict__ q, const unsigned short* __restrict__ d, \
                            const unsigned int* __restrict__ ids, float* __restrict__ out,        \
                            unsigned int dim) {                                                   \
        const unsigned int r = blockIdx.x;                                                        \
        const unsigned long long blk0 = (unsigned long long)ids[r] * (dim / (QK));                 \
        float* o = out + (unsigned long long)r * dim;                                             \
        for (unsigned int j = threadIdx.x; j < dim; j += blockDim.x)                              \
            o[j] = packed_##NAME(q, d, blk0 + j / (QK), j % (QK));                                  \
    }
STRATA_PACKED_FORMATS(EMBED_PACKED)
