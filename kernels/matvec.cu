// matvec.cu: the decode matmul y[r, o] = Σ_k x[r, k] · w[o, k] for up to 8 activation
// rows, weights in their stored format (common.cuh and quant.cuh are prepended).
//
// matvec_FMT(w, x, y, rows, out, in):
//   w  [out, in] row-major, stored format (`in` a whole number of blocks)
//   x  [rows, in] f32, y [rows, out] f32, 1 <= rows <= 8 (rows above 8 are ignored)
// Launch: grid ceil(out / 8), block 256 = 8 warps; warp w of block b computes output
// row o = 8b + w (any multiple of 32 threads works: warps per block = blockDim.x / 32).
//
// One warp per output row. Block formats: the row is cut into 8-value parts (see
// quant.cuh) and lane l takes parts l, l + 32, ...: consecutive lanes read consecutive
// bytes of the row, and a K-quant super-block is one step of the warp. Element formats:
// lane l takes elements l, l + 32, ... Each lane keeps one partial sum per activation row
// in registers (acc[8]); x is read from global (small, cached). The partial sums are
// warp-reduced at the end and lane 0 writes y[r * out + o].

// Warp-reduces acc[0..rows] and stores them. All 32 lanes must call it.
__device__ __forceinline__ void matvec_store(float* acc, float* __restrict__ y, unsigned int rows,
                                             unsigned int out, unsigned int o, unsigned int lane) {
#pragma unroll
    for (unsigned int r = 0; r < MATVEC_MAX_ROWS; ++r) {
        if (r < rows) {  // rows is uniform across the warp: every lane shuffles
            const float s = warp_sum(acc[r]);
            if (lane == 0u) y[(unsigned long long)r * out + o] = s;
        }
    }
}

// The loop bodies both kernels share, inside a kernel with `row`, `x`, `rows`, `in` and
// `acc` in scope. Element formats: acc[r] += w[o, k] · x[r, k].
#define MATVEC_ADD_ELEM(NAME, k)                                                                  \
    {                                                                                             \
        const float wv = load_elem_##NAME(row, (k));                                              \
        _Pragma("unroll") for (unsigned int r = 0; r < MATVEC_MAX_ROWS; ++r) {                    \
            if (r < rows) acc[r] += wv * x[r * in + (k)];                                         \
        }                                                                                         \
    }

// Block formats: part p of the row (8 values, quant.cuh) against each activation row.
#define MATVEC_ADD_PART(NAME, QK, BYTES, PARTS, GAP, p)                                          \
    {                                                                                             \
        const unsigned int blk = (p) / (PARTS), part = (p) % (PARTS);                             \
        float v[8];                                                                               \
        const unsigned int off = dec8_##NAME(row + (unsigned long long)blk * (BYTES), part, v);  \
        const float* xb = x + blk * (QK) + off;                                                   \
        _Pragma("unroll") for (unsigned int r = 0; r < MATVEC_MAX_ROWS; ++r) {                    \
            if (r < rows) {                                                                       \
                const float* xr = xb + r * in;                                                    \
                float s = acc[r];                                                                 \
                _Pragma("unroll") for (unsigned int i = 0; i < 4u; ++i) {                         \
                    s += v[i] * xr[i];                                                            \
                    s += v[4u + i] * xr[(GAP) + i];                                               \
                }                                                                                 \
                acc[r] = s;                                                                       \
            }                                                                                     \
        }                                                                                         \
    }

#define MATVEC_ELEM(NAME, ESIZE)                                                                  \
    extern "C" __global__ void __launch_bounds__(256)                                             \
        matvec_##NAME(const unsigned char* __restrict__ w, const float* __restrict__ x,           \
                      float* __restrict__ y, unsigned int rows, unsigned int out, unsigned int in) { \
        const unsigned int lane = threadIdx.x & 31u;                                              \
        const unsigned int o = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);               \
        if (o < out) { /* warp-uniform */                                                         \
            const unsigned char* row = w + (unsigned long long)o * in * (ESIZE);                 \
            float acc[MATVEC_MAX_ROWS];                                                           \
            _Pragma("unroll") for (unsigned int r = 0; r < MATVEC_MAX_ROWS; ++r) acc[r] = 0.0f;   \
            _Pragma("unroll 4") for (unsigned int k = lane; k < in; k += 32u) {                   \
                MATVEC_ADD_ELEM(NAME, k);                                                         \
            }                                                                                     \
            matvec_store(acc, y, rows, out, o, lane);                                             \
        }                                                                                         \
    }
STRATA_ELEM_FORMATS(MATVEC_ELEM)

#define MATVEC_BLOCK(NAME, QK, BYTES, PARTS, GAP)                                                 \
    extern "C" __global__ void __launch_bounds__(256)                                             \
        matvec_##NAME(const unsigned char* __restrict__ w, const float* __restrict__ x,           \
                      float* __restrict__ y, unsigned int rows, unsigned int out, unsigned int in) { \
        const unsigned int lane = threadIdx.x & 31u;                                              \
        const unsigned int o = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);               \
        if (o < out) { /* warp-uniform */                                                         \
            const unsigned int nblk = in / (QK);                                                  \
            const unsigned char* row = w + (unsigned long long)o * nblk * (BYTES);               \
            const unsigned int nparts = nblk * (PARTS);                                           \
            float acc[MATVEC_MAX_ROWS];                                                           \
            _Pragma("unroll") for (unsigned int r = 0; r < MATVEC_MAX_ROWS; ++r) acc[r] = 0.0f;   \
            _Pragma("unroll 1") for (unsigned int p = lane; p < nparts; p += 32u) {               \
                MATVEC_ADD_PART(NAME, QK, BYTES, PARTS, GAP, p);                                  \
            }                                                                                     \
            matvec_store(acc, y, rows, out, o, lane);                                             \
        }                                                                                         \
    }
STRATA_BLOCK_FORMATS(MATVEC_BLOCK)

// matvec_wide_FMT(w, x, y, rows, out, in): the same product with a block per output row.
// Launch: grid `out`, block 128 (4 warps; any multiple of 32 up to 256 works). Thread t
// of block o takes parts (element formats: elements) t, t + blockDim.x, ... of row o, so
// a short row keeps every thread of its block reading and a matrix of few rows still has
// blocks for every SM; the loop is unrolled so that a thread's loads are in flight
// together. Each warp sums its lanes; thread r < rows then adds the warps' sums in warp
// order and writes y[r * out + o]. The order of the additions depends on the shape
// alone, never on the row count, so a row comes out the same in any launch.

#define MATVEC_WIDE_MAX_WARPS 8u

// Sums acc[0..rows] over the block and stores them. Every thread of the block must call it.
__device__ __forceinline__ void matvec_wide_store(float* acc, float* __restrict__ y,
                                                  float (*sums)[MATVEC_MAX_ROWS], unsigned int rows,
                                                  unsigned int out, unsigned int o) {
    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
#pragma unroll
    for (unsigned int r = 0; r < MATVEC_MAX_ROWS; ++r) {
        if (r < rows) {  // rows is uniform across the block: every lane shuffles
            const float s = warp_sum(acc[r]);
            if (lane == 0u) sums[warp][r] = s;
        }
    }
    __syncthreads();
    if (threadIdx.x < rows) {
        float s = 0.0f;
        for (unsigned int w = 0; w < (blockDim.x >> 5); ++w) s += sums[w][threadIdx.x];
        y[(unsigned long long)threadIdx.x * out + o] = s;
    }
}

#define MATVEC_WIDE_ELEM(NAME, ESIZE)                                                             \
    extern "C" __global__ void __launch_bounds__(256)                                             \
        matvec_wide_##NAME(const unsigned char* __restrict__ w, const float* __restrict__ x,      \
                           float* __restrict__ y, unsigned int rows, unsigned int out,            \
                           unsigned int in) {                                                     \
        __shared__ float sums[MATVEC_WIDE_MAX_WARPS][MATVEC_MAX_ROWS];                            \
        const unsigned int o = blockIdx.x;                                                        \
        if (o < out) { /* block-uniform */                                                        \
            const unsigned char* row = w + (unsigned long long)o * in * (ESIZE);                 \
            float acc[MATVEC_MAX_ROWS];                                                           \
            _Pragma("unroll") for (unsigned int r = 0; r < MATVEC_MAX_ROWS; ++r) acc[r] = 0.0f;   \
            _Pragma("unroll 4") for (unsigned int k = threadIdx.x; k < in; k += blockDim.x) {     \
                MATVEC_ADD_ELEM(NAME, k);                                                         \
            }                                                                                     \
            matvec_wide_store(acc, y, sums, rows, out, o);                                        \
        }                                                                                         \
    }
STRATA_ELEM_FORMATS(MATVEC_WIDE_ELEM)

#define MATVEC_WIDE_BLOCK(NAME, QK, BYTES, PARTS, GAP)                                            \
    extern "C" __global__ void __launch_bounds__(256)                                             \
        matvec_wide_##NAME(const unsigned char* __restrict__ w, const float* __restrict__ x,      \
                           float* __restrict__ y, unsigned int rows, unsigned int out,            \
                           unsigned int in) {                                                     \
        __shared__ float sums[MATVEC_WIDE_MAX_WARPS][MATVEC_MAX_ROWS];                            \
        const unsigned int o = blockIdx.x;                                                        \
        if (o < out) { /* block-uniform */                                                        \
            const unsigned int nblk = in / (QK);                                                  \
            const unsigned char* row = w + (unsigned long long)o * nblk * (BYTES);               \
            const unsigned int nparts = nblk * (PARTS);                                           \
            float acc[MATVEC_MAX_ROWS];                                                           \
            _Pragma("unroll") for (unsigned int r = 0; r < MATVEC_MAX_ROWS; ++r) acc[r] = 0.0f;   \
            _Pragma("unroll 2") for (unsigned int p = threadIdx.x; p < nparts; p += blockDim.x) { \
                MATVEC_ADD_PART(NAME, QK, BYTES, PARTS, GAP, p);                                  \
            }                                                                                     \
            matvec_wide_store(acc, y, sums, rows, out, o);                                        \
        }                                                                                         \
    }
STRATA_BLOCK_FORMATS(MATVEC_WIDE_BLOCK)
