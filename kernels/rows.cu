// rows.cu: row gathers and scatter-adds over [rows, row_len] row-major f32 buffers, for
// mixture-of-experts routing (common.cuh is prepended).
//
// Launch shape for both: grid (n_rows, ceil(row_len / 256)), block 256 (any block size
// works). Block (r, c) handles row r, values c * blockDim.x + threadIdx.x of it. Both
// dimensions are grid-stride loops, so a smaller grid (or a capped one: the launcher
// caps y at 65535) is also correct. Row offsets are 64-bit. The host checks every
// listed row against its buffer before launching; the kernels trust them.

// Rows handled by this block: r = blockIdx.x, blockIdx.x + gridDim.x, ... < n_rows.
#define ROW_LOOP(r, n_rows) for (unsigned int r = blockIdx.x; r < (n_rows); r += gridDim.x)
// Values of a row handled by this thread: j = blockIdx.y * blockDim.x + threadIdx.x, ...
#define COL_LOOP(j, row_len)                                                                     \
    for (unsigned long long j = (unsigned long long)blockIdx.y * blockDim.x + threadIdx.x;      \
         j < (row_len); j += (unsigned long long)gridDim.y * blockDim.x)

// dst[i, :] = src[rows[i], :] for i < n_rows (rows may repeat). `src` holds at least
// max(rows) + 1 rows, `dst` n_rows rows, of row_len floats each.
extern "C" __global__ void __launch_bounds__(1024) gather_rows_f32(const float* __restrict__ src,
                                                                   const unsigned int* __restrict__ rows,
                                                                   float* __restrict__ dst, unsigned int row_len,
                                                                   unsigned int n_rows) {
    ROW_LOOP(i, n_rows) {
        const float* s = src + (unsigned long long)rows[i] * row_len;
        float* d = dst + (unsigned long long)i * row_len;
        COL_LOOP(j, (unsigned long long)row_len) { d[j] = s[j]; }
    }
}

// x[rows[i], :] += w[i] * y[i, :] for i < n_rows. `rows` null: row i itself; `w` null:
// weight 1 (a plain add). Listed rows must be distinct (no atomics: each destination row
// has one writer). `x` holds at least max(rows) + 1 rows (n_rows when `rows` is null),
// `y` n_rows rows, of row_len floats each.
extern "C" __global__ void __launch_bounds__(1024) add_rows_f32(float* __restrict__ x, const float* __restrict__ y,
                                                                const unsigned int* __restrict__ rows,
                                                                const float* __restrict__ w, unsigned int row_len,
                                                                unsigned int n_rows) {
    ROW_LOOP(i, n_rows) {
        float* d = x + (unsigned long long)(rows ? rows[i] : i) * row_len;
        const float* s = y + (unsigned long long)i * row_len;
        if (w) {
            const float wi = w[i];
            COL_LOOP(j, (unsigned long long)row_len) { d[j] += wi * s[j]; }
        } else {
            COL_LOOP(j, (unsigned long long)row_len) { d[j] += s[j]; }
        }
    }
}

// dst[r * dst_stride + j] = src[r * src_stride + j] for r < n_rows, j < width: a block of
// columns copied between row-major buffers (one head's part of a row of heads). The
// pointers are already offset to each block's first column.
extern "C" __global__ void __launch_bounds__(1024) copy_cols_f32(const float* __restrict__ src, unsigned int src_stride,
                                                                 float* __restrict__ dst, unsigned int dst_stride,
                                                                 unsigned int width, unsigned int n_rows) {
    ROW_LOOP(r, n_rows) {
        const float* s = src + (unsigned long long)r * src_stride;
        float* d = dst + (unsigned long long)r * dst_stride;
        COL_LOOP(j, (unsigned long long)width) { d[j] = s[j]; }
    }
}

// pack_blocks_u8(src, dst, n_blocks, block, q0, q_len): a tensor of n_blocks blocks of
// `block` bytes (src, the stored layout) in the packed layout (dst, as many bytes;
// kernels/README.md "Packed weights"): block i's quant bytes src[i·block + q0 ..
// + q_len] at dst[i·q_len], its other bytes (the scales: those before q0, then those after
// q0 + q_len) at dst[n_blocks·q_len + i·(block − q_len)]. src and dst do not overlap.
// Launch: grid ceil(n_blocks / 256) (at most 65535: a grid-stride loop), block 256, a
// thread per block.
extern "C" __global__ void __launch_bounds__(256) pack_blocks_u8(const unsigned char* __restrict__ src,
                                                                 unsigned char* __restrict__ dst,
                                                                 unsigned long long n_blocks, unsigned int block,
                                                                 unsigned int q0, unsigned int q_len) {
    const unsigned int m_len = block - q_len;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n_blocks;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned char* s = src + i * block;
        unsigned char* q = dst + i * q_len;
        unsigned char* m = dst + n_blocks * q_len + i * m_len;
        for (unsigned int b = 0; b < q_len; ++b) q[b] = s[q0 + b];
        for (unsigned int b = 0; b < q0; ++b) m[b] = s[b];
        for (unsigned int b = q0 + q_len; b < block; ++b) m[b - q_len] = s[b];
    }
}
