// quant.cuh: per-format block decoders, prepended (after common.cuh) to embedding.cu,
// dequant.cu, matvec.cu and matvec_packed.cu.
//
// Every block format is decoded in "parts" of 8 values: part `p` of a block is two runs
// of 4 consecutive values, v[0..4] at value offsets off0..off0+4 of the block and
// v[4..8] at off0+GAP..off0+GAP+4, where off0 is what the decoder returns and GAP is a
// per-format constant. The split follows each format's nibble/bit packing so that a
// part reads 4 consecutive bytes of quants (two u16 loads), and consecutive parts read
// consecutive bytes: when consecutive lanes take consecutive parts a warp streams the
// blocks contiguously.
//
// Each decoder evaluates exactly the expression of the matching `dequantize` in
// crates/strata-quant/src/*.rs (ggml's dequantize_row_* for the GGML formats), in the same order.
//
// Blocks are only 2-byte aligned (4 for i8, 1 for mxfp4's 17-byte blocks): fields are
// read with u8/u16 loads (u32 for i8; u8 only for mxfp4), never through a struct.
//
// Per format:  FMT_QK values per block, FMT_BYTES bytes per block, FMT_PARTS = QK / 8
// parts per block, FMT_GAP the offset of the second run, and
//     unsigned int dec8_FMT(const unsigned char* blk, unsigned int part, float* v)
// which fills v[0..8] and returns off0.

#ifndef STRATA_QUANT_CUH
#define STRATA_QUANT_CUH

// The most activation rows a decode product takes (matvec.cu, matvec_packed.cu).
#define MATVEC_MAX_ROWS 8u

// Byte i (0..4) of a little-endian u32.
#define QBYTE(w, i) (((w) >> (8u * (i))) & 0xffu)

// ---------------------------------------------------------------------------------
// Q4_0: { f16 d; u8 qs[16]; } 18 bytes. Value j = (qs[j] & 0xF) − 8, value j + 16 =
// (qs[j] >> 4) − 8, times d. Part p: values 4p..4p+4 and 16+4p..16+4p+4.
// ---------------------------------------------------------------------------------
#define Q4_0_QK 32u
#define Q4_0_BYTES 18u
#define Q4_0_PARTS 4u
#define Q4_0_GAP 16u
__device__ __forceinline__ unsigned int dec8_q4_0(const unsigned char* __restrict__ b, unsigned int p,
                                                  float* v) {
    const float d = ld_f16(b);
    const unsigned int q = ld_u32_a2(b + 2u + 4u * p);
#pragma unroll
    for (unsigned int i = 0; i < 4u; ++i) {
        const unsigned int byte = QBYTE(q, i);
        v[i] = (float)((int)(byte & 0xFu) - 8) * d;
        v[4u + i] = (float)((int)(byte >> 4) - 8) * d;
    }
    return 4u * p;
}

// ---------------------------------------------------------------------------------
// Q4_1: { f16 d; f16 m; u8 qs[16]; } 20 bytes. Value = nibble · d + m (layout as Q4_0).
// ---------------------------------------------------------------------------------
#define Q4_1_QK 32u
#define Q4_1_BYTES 20u
#define Q4_1_PARTS 4u
#define Q4_1_GAP 16u
__device__ __forceinline__ unsigned int dec8_q4_1(const unsigned char* __restrict__ b, unsigned int p,
                                                  float* v) {
    const float d = ld_f16(b);
    const float m = ld_f16(b + 2u);
    const unsigned int q = ld_u32_a2(b + 4u + 4u * p);
#pragma unroll
    for (unsigned int i = 0; i < 4u; ++i) {
        const unsigned int byte = QBYTE(q, i);
        v[i] = (float)(byte & 0xFu) * d + m;
        v[4u + i] = (float)(byte >> 4) * d + m;
    }
    return 4u * p;
}

// ---------------------------------------------------------------------------------
// Q5_0: { f16 d; u8 qh[4]; u8 qs[16]; } 22 bytes. 5-bit q: low nibbles as Q4_0, bit 4
// of value j (0..32) is bit j of the little-endian u32 qh. Value = (q − 16) · d.
// ---------------------------------------------------------------------------------
#define Q5_0_QK 32u
#define Q5_0_BYTES 22u
#define Q5_0_PARTS 4u
#define Q5_0_GAP 16u
__device__ __forceinline__ unsigned int dec8_q5_0(const unsigned char* __restrict__ b, unsigned int p,
                                                  float* v) {
    const float d = ld_f16(b);
    const unsigned int qh = ld_u32_a2(b + 2u);
    const unsigned int q = ld_u32_a2(b + 6u + 4u * p);
#pragma unroll
    for (unsigned int i = 0; i < 4u; ++i) {
        const unsigned int j = 4u * p + i;
        const unsigned int byte = QBYTE(q, i);
        const int x0 = (int)((byte & 0xFu) | (((qh >> j) & 1u) << 4));
        const int x1 = (int)((byte >> 4) | (((qh >> (j + 16u)) & 1u) << 4));
        v[i] = (float)(x0 - 16) * d;
        v[4u + i] = (float)(x1 - 16) * d;
    }
    return 4u * p;
}

// ---------------------------------------------------------------------------------
// Q5_1: { f16 d; f16 m; u8 qh[4]; u8 qs[16]; } 24 bytes. Bits as Q5_0; value = q·d + m.
// ---------------------------------------------------------------------------------
#define Q5_1_QK 32u
#define Q5_1_BYTES 24u
#define Q5_1_PARTS 4u
#define Q5_1_GAP 16u
__device__ __forceinline__ unsigned int dec8_q5_1(const unsigned char* __restrict__ b, unsigned int p,
                                                  float* v) {
    const float d = ld_f16(b);
    const float m = ld_f16(b + 2u);
    const unsigned int qh = ld_u32_a2(b + 4u);
    const unsigned int q = ld_u32_a2(b + 8u + 4u * p);
#pragma unroll
    for (unsigned int i = 0; i < 4u; ++i) {
        const unsigned int j = 4u * p + i;
        const unsigned int byte = QBYTE(q, i);
        const unsigned int x0 = (byte & 0xFu) | (((qh >> j) & 1u) << 4);
        const unsigned int x1 = (byte >> 4) | (((qh >> (j + 16u)) & 1u) << 4);
        v[i] = (float)x0 * d + m;
        v[4u + i] = (float)x1 * d + m;
    }
    return 4u * p;
}

// ---------------------------------------------------------------------------------
// Q8_0: { f16 d; i8 qs[32]; } 34 bytes. Value = q · d. Part p: values 8p..8p+8.
// ---------------------------------------------------------------------------------
#define Q8_0_QK 32u
#define Q8_0_BYTES 34u
#define Q8_0_PARTS 4u
#define Q8_0_GAP 4u
__device__ __forceinline__ unsigned int dec8_q8_0(const unsigned char* __restrict__ b, unsigned int p,
                                                  float* v) {
    const float d = ld_f16(b);
    const unsigned int q0 = ld_u32_a2(b + 2u + 8u * p);
    const unsigned int q1 = ld_u32_a2(b + 6u + 8u * p);
#pragma unroll
    for (unsigned int i = 0; i < 4u; ++i) {
        v[i] = (float)(int)(signed char)(unsigned char)QBYTE(q0, i) * d;
        v[4u + i] = (float)(int)(signed char)(unsigned char)QBYTE(q1, i) * d;
    }
    return 8u * p;
}

// ---------------------------------------------------------------------------------
// MXFP4 (GGML type 39): { u8 e; u8 qs[16]; } 17 bytes, so blocks sit at any byte address:
// read with u8 loads only. Byte j: value j in the low nibble, value j + 16 in the high
// one (layout as Q4_0). Value = KVALUES[nibble] · 2^(e − 128), KVALUES = the E2M1 values
// doubled: magnitudes 0 1 2 3 4 6 8 12 for nibble & 7 (packed as the nibbles of
// 0xC8643210), negative when nibble & 8 (nibble 8 is +0, as in the table).
// 2^(e − 128) is ggml_e8m0_to_fp32_half: the float bits 0x00200000 << e for e < 2
// (denormals), else (e − 1) << 23; every product is exact, or ±inf past f32's range
// (e = 254 and |KVALUES| ≥ 4), as on the CPU.
// ---------------------------------------------------------------------------------
#define MXFP4_QK 32u
#define MXFP4_BYTES 17u
#define MXFP4_PARTS 4u
#define MXFP4_GAP 16u
__device__ __forceinline__ float mxfp4_e8m0_half(unsigned int e) {
    return __uint_as_float(e < 2u ? 0x00200000u << e : (e - 1u) << 23);
}
__device__ __forceinline__ float mxfp4_value(unsigned int nibble, float d) {
    const int mag = (int)((0xC8643210u >> (4u * (nibble & 7u))) & 0xFu);
    return (float)((nibble & 8u) ? -mag : mag) * d;
}
__device__ __forceinline__ unsigned int dec8_mxfp4(const unsigned char* __restrict__ b, unsigned int p,
                                                   float* v) {
    const float d = mxfp4_e8m0_half(b[0]);
    const unsigned char* q = b + 1u + 4u * p;
#pragma unroll
    for (unsigned int i = 0; i < 4u; ++i) {
        const unsigned int byte = q[i];
        v[i] = mxfp4_value(byte & 0xFu, d);
        v[4u + i] = mxfp4_value(byte >> 4, d);
    }
    return 4u * p;
}

// ---------------------------------------------------------------------------------
// I8 (Strata): { f32 scale; i8 qs[32]; } 36 bytes, 4-byte aligned. Value = q · scale.
// ---------------------------------------------------------------------------------
#define I8_QK 32u
#define I8_BYTES 36u
#define I8_PARTS 4u
#define I8_GAP 4u
__device__ __forceinline__ unsigned int dec8_i8(const unsigned char* __restrict__ b, unsigned int p,
                                                float* v) {
    const float s = *(const float*)b;
    const unsigned int* qs = (const unsigned int*)(b + 4u);
    const unsigned int q0 = qs[2u * p];
    const unsigned int q1 = qs[2u * p + 1u];
#pragma unroll
    for (unsigned int i = 0; i < 4u; ++i) {
        v[i] = (float)(int)(signed char)(unsigned char)QBYTE(q0, i) * s;
        v[4u + i] = (float)(int)(signed char)(unsigned char)QBYTE(q1, i) * s;
    }
    return 8u * p;
}

// ---------------------------------------------------------------------------------
// AffineQ4 (Strata): { f16 scale; f16 bias; u8 qs[64]; } 68 bytes, 128 values. Byte j:
// value j in the low nibble, value j + 64 in the high one. Value = q · scale + bias.
// Part p (0..16): values 4p..4p+4 and 64+4p..64+4p+4.
// ---------------------------------------------------------------------------------
#define AFFINE_Q4_QK 128u
#define AFFINE_Q4_BYTES 68u
#define AFFINE_Q4_PARTS 16u
#define AFFINE_Q4_GAP 64u
__device__ __forceinline__ unsigned int dec8_affine_q4(const unsigned char* __restrict__ b, unsigned int p,
                                                       float* v) {
    const float scale = ld_f16(b);
    const float bias = ld_f16(b + 2u);
    const unsigned int q = ld_u32_a2(b + 4u + 4u * p);
#pragma unroll
    for (unsigned int i = 0; i < 4u; ++i) {
        const unsigned int byte = QBYTE(q, i);
        v[i] = (float)(byte & 0xFu) * scale + bias;
        v[4u + i] = (float)(byte >> 4) * scale + bias;
    }
    return 4u * p;
}

// ---------------------------------------------------------------------------------
// K-quants: 256-value super-blocks.
// ---------------------------------------------------------------------------------

// ggml's get_scale_min_k4: 6-bit scale and min of sub-block j (0..8) from the 12 packed
// bytes at q.
__device__ __forceinline__ void scale_min_k4(unsigned int j, const unsigned char* __restrict__ q,
                                             unsigned int& sc, unsigned int& m) {
    if (j < 4u) {
        sc = (unsigned int)q[j] & 63u;
        m = (unsigned int)q[j + 4u] & 63u;
    } else {
        sc = ((unsigned int)q[j + 4u] & 0xFu) | (((unsigned int)q[j - 4u] >> 6) << 4);
        m = ((unsigned int)q[j + 4u] >> 4) | (((unsigned int)q[j] >> 6) << 4);
    }
}

// Q4_K: { f16 d; f16 dmin; u8 scales[12]; u8 qs[128]; } 144 bytes. Each 64 values
// (chunk c = 0..4) use qs[32c..32c+32]: value 64c + l in the low nibble of byte l
// (sub-block 2c), value 64c + 32 + l in the high nibble (sub-block 2c + 1).
// Value = (d · sc) · q − dmin · m. Part p: chunk c = p / 8, bytes l = 4(p % 8)..+4.
#define Q4_K_QK 256u
#define Q4_K_BYTES 144u
#define Q4_K_PARTS 32u
#define Q4_K_GAP 32u
__device__ __forceinline__ unsigned int dec8_q4_k(const unsigned char* __restrict__ b, unsigned int p,
                                                  float* v) {
    const unsigned int c = p >> 3, r = p & 7u;
    const float d = ld_f16(b);
    const float dmin = ld_f16(b + 2u);
    unsigned int sc1, m1, sc2, m2;
    scale_min_k4(2u * c, b + 4u, sc1, m1);
    scale_min_k4(2u * c + 1u, b + 4u, sc2, m2);
    const float d1 = d * (float)sc1, mm1 = dmin * (float)m1;
    const float d2 = d * (float)sc2, mm2 = dmin * (float)m2;
    const unsigned int q = ld_u32_a2(b + 16u + 32u * c + 4u * r);
#pragma unroll
    for (unsigned int i = 0; i < 4u; ++i) {
        const unsigned int byte = QBYTE(q, i);
        v[i] = d1 * (float)(byte & 0xFu) - mm1;
        v[4u + i] = d2 * (float)(byte >> 4) - mm2;
    }
    return 64u * c + 4u * r;
}

// Q5_K: { f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]; } 176 bytes. As Q4_K
// plus a fifth bit: value 64c + l has it in bit 2c of qh[l], value 64c + 32 + l in bit
// 2c + 1. Value = (d · sc) · q − dmin · m.
#define Q5_K_QK 256u
#define Q5_K_BYTES 176u
#define Q5_K_PARTS 32u
#define Q5_K_GAP 32u
__device__ __forceinline__ unsigned int dec8_q5_k(const unsigned char* __restrict__ b, unsigned int p,
                                                  float* v) {
    const unsigned int c = p >> 3, r = p & 7u;
    const float d = ld_f16(b);
    const float dmin = ld_f16(b + 2u);
    unsigned int sc1, m1, sc2, m2;
    scale_min_k4(2u * c, b + 4u, sc1, m1);
    scale_min_k4(2u * c + 1u, b + 4u, sc2, m2);
    const float d1 = d * (float)sc1, mm1 = dmin * (float)m1;
    const float d2 = d * (float)sc2, mm2 = dmin * (float)m2;
    const unsigned int qh = ld_u32_a2(b + 16u + 4u * r);
    const unsigned int ql = ld_u32_a2(b + 48u + 32u * c + 4u * r);
#pragma unroll
    for (unsigned int i = 0; i < 4u; ++i) {
        const unsigned int lo = QBYTE(ql, i), hb = QBYTE(qh, i);
        const unsigned int q0 = (lo & 0xFu) + (((hb >> (2u * c)) & 1u) << 4);
        const unsigned int q1 = (lo >> 4) + (((hb >> (2u * c + 1u)) & 1u) << 4);
        v[i] = d1 * (float)q0 - mm1;
        v[4u + i] = d2 * (float)q1 - mm2;
    }
    return 64u * c + 4u * r;
}

// Q6_K: { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d; } 210 bytes. Per 128 values
// (half n): ql[64n..64n+64], qh[32n..32n+32]; for l < 32
//   value 128n + l      = (ql[l] & 0xF)    | ((qh[l] >> 0) & 3) << 4
//   value 128n + l + 32 = (ql[l+32] & 0xF) | ((qh[l] >> 2) & 3) << 4
//   value 128n + l + 64 = (ql[l] >> 4)     | ((qh[l] >> 4) & 3) << 4
//   value 128n + l + 96 = (ql[l+32] >> 4)  | ((qh[l] >> 6) & 3) << 4
// minus 32, and value i = (d · scales[i / 16]) · q.
// Part p: half n = p / 16, t = p % 16, l = 4(t / 2)..+4, w = t % 2 picks the rows
// (l, l + 64) (w = 0) or (l + 32, l + 96) (w = 1).
#define Q6_K_QK 256u
#define Q6_K_BYTES 210u
#define Q6_K_PARTS 32u
#define Q6_K_GAP 64u
__device__ __forceinline__ unsigned int dec8_q6_k(const unsigned char* __restrict__ b, unsigned int p,
                                                  float* v) {
    const unsigned int n = p >> 4, t = p & 15u, g = t >> 1, w = t & 1u;
    const float d = ld_f16(b + 208u);
    const unsigned int si = 192u + 8u * n + 2u * w + (g >> 2);
    const float da = d * (float)(int)(signed char)b[si];
    const float db = d * (float)(int)(signed char)b[si + 4u];
    const unsigned int ql = ld_u32_a2(b + 64u * n + 32u * w + 4u * g);
    const unsigned int qh = ld_u32_a2(b + 128u + 32u * n + 4u * g);
    const unsigned int sa = 2u * w, sb = 2u * w + 4u;
#pragma unroll
    for (unsigned int i = 0; i < 4u; ++i) {
        const unsigned int lo = QBYTE(ql, i), hb = QBYTE(qh, i);
        const int qa = (int)((lo & 0xFu) | (((hb >> sa) & 3u) << 4)) - 32;
        const int qb = (int)((lo >> 4) | (((hb >> sb) & 3u) << 4)) - 32;
        v[i] = da * (float)qa;
        v[4u + i] = db * (float)qb;
    }
    return 128u * n + 32u * w + 4u * g;
}

// The block formats, as X(name, QK, BYTES, PARTS, GAP). Kernel files expand this to
// stamp out one kernel per format.
#define STRATA_BLOCK_FORMATS(X)                                           \
    X(q4_0, Q4_0_QK, Q4_0_BYTES, Q4_0_PARTS, Q4_0_GAP)                    \
    X(q4_1, Q4_1_QK, Q4_1_BYTES, Q4_1_PARTS, Q4_1_GAP)                    \
    X(q5_0, Q5_0_QK, Q5_0_BYTES, Q5_0_PARTS, Q5_0_GAP)                    \
    X(q5_1, Q5_1_QK, Q5_1_BYTES, Q5_1_PARTS, Q5_1_GAP)                    \
    X(q8_0, Q8_0_QK, Q8_0_BYTES, Q8_0_PARTS, Q8_0_GAP)                    \
    X(mxfp4, MXFP4_QK, MXFP4_BYTES, MXFP4_PARTS, MXFP4_GAP)               \
    X(q4_k, Q4_K_QK, Q4_K_BYTES, Q4_K_PARTS, Q4_K_GAP)                    \
    X(q5_k, Q5_K_QK, Q5_K_BYTES, Q5_K_PARTS, Q5_K_GAP)                    \
    X(q6_k, Q6_K_QK, Q6_K_BYTES, Q6_K_PARTS, Q6_K_GAP)                    \
    X(affine_q4, AFFINE_Q4_QK, AFFINE_Q4_BYTES, AFFINE_Q4_PARTS, AFFINE_Q4_GAP) \
    X(i8, I8_QK, I8_BYTES, I8_PARTS, I8_GAP)

// The element formats: X(name, element type, load expression of element `i` of `p`).
__device__ __forceinline__ float load_elem_f32(const unsigned char* p, unsigned long long i) {
    return ((const float*)p)[i];
}
__device__ __forceinline__ float load_elem_f16(const unsigned char* p, unsigned long long i) {
    return f16_to_f32(((const unsigned short*)p)[i]);
}
__device__ __forceinline__ float load_elem_bf16(const unsigned char* p, unsigned long long i) {
    return bf16_to_f32(((const unsigned short*)p)[i]);
}
#define STRATA_ELEM_FORMATS(X) X(f32, 4u) X(f16, 2u) X(bf16, 2u)

// ---------------------------------------------------------------------------------
// The packed layout (kernels/README.md, "Packed weights"): Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
// MXFP4, Q4_K, Q5_K, Q6_K, AffineQ4 and I8 tensors the CUDA backend repacked at upload. A
// [out, in] tensor of nblk = in / QK blocks per row is two arrays: the quant bytes of
// block i = o * nblk + b at byte i * FMT_PACKED_QB of `q` (16-byte aligned: QB = 16 for
// Q4_0, Q4_1, Q5_0, Q5_1 and MXFP4, 32 for Q8_0 and I8, 64 for AffineQ4, 128, 160, 192
// for the K-quants), exactly as stored (Q5_K: qh[32] then qs[128]), then the block's
// other bytes (FMT_PACKED_MB of them, in stored order) at byte i * FMT_PACKED_MB of `d`,
// which starts at q + out * nblk * QB: Q4_0/Q8_0 the f16 scale (MB 2),
// Q4_1 { f16 d; f16 m; } (MB 4), Q5_0 { f16 d; u8 qh[4]; } (MB 6),
// Q5_1 { f16 d; f16 m; u8 qh[4]; } (MB 8), MXFP4 the e8m0 byte (MB 1),
// Q4_K and Q5_K { f16 d; f16 dmin; u8 scales[12]; } (MB 16),
// Q6_K { i8 scales[16]; f16 d; } (MB 18), AffineQ4 { f16 scale; f16 bias; } (MB 4), I8
// the f32 scale (MB 4, 4-byte aligned: `d` is 16-byte aligned). The same bytes as the
// stored tensor, in another order.
// packed_FMT(q, d, i, j) is value j (0..QK) of block i, by the stored decoder's
// expression (dec8_FMT).
// ---------------------------------------------------------------------------------
// The nibble of value j of block i of a 4-bit format with QB quant bytes a block: low
// in byte j for j < QB, high in byte j − QB after (Q4_0's layout; AffineQ4's, QB 64).
template <unsigned int QB>
__device__ __forceinline__ unsigned int packed_nib(const unsigned char* __restrict__ q, unsigned long long i,
                                                   unsigned int j) {
    const unsigned int byte = q[i * QB + j % QB];
    return j < QB ? (byte & 0xFu) : (byte >> 4);
}
#define Q4_0_PACKED_QB 16u
#define Q4_0_PACKED_MB 2u
#define Q8_0_PACKED_QB 32u
__device__ __forceinline__ float packed_q4_0(const unsigned char* __restrict__ q, const unsigned short* __restrict__ d,
                                             unsigned long long i, unsigned int j) {
    return (float)((int)packed_nib<Q4_0_PACKED_QB>(q, i, j) - 8) * f16_to_f32(d[i]);
}
#define Q4_1_PACKED_QB 16u
#define Q4_1_PACKED_MB 4u
#define Q5_0_PACKED_QB 16u
#define Q5_0_PACKED_MB 6u
#define Q5_1_PACKED_QB 16u
#define Q5_1_PACKED_MB 8u
// Q4_1, Q5_0 and Q5_1 value j: the nibble as Q4_0's, plus (Q5_0, Q5_1) bit j of the u32
// qh as its fifth.
__device__ __forceinline__ float packed_q4_1(const unsigned char* __restrict__ q, const unsigned short* __restrict__ d,
                                             unsigned long long i, unsigned int j) {
    const unsigned char* m = (const unsigned char*)d + i * Q4_1_PACKED_MB;
    return (float)packed_nib<Q4_1_PACKED_QB>(q, i, j) * ld_f16(m) + ld_f16(m + 2u);
}
__device__ __forceinline__ float packed_q5_0(const unsigned char* __restrict__ q, const unsigned short* __restrict__ d,
                                             unsigned long long i, unsigned int j) {
    const unsigned char* m = (const unsigned char*)d + i * Q5_0_PACKED_MB;
    const unsigned int x = packed_nib<Q5_0_PACKED_QB>(q, i, j) | (((ld_u32_a2(m + 2u) >> j) & 1u) << 4);
    return (float)((int)x - 16) * ld_f16(m);
}
__device__ __forceinline__ float packed_q5_1(const unsigned char* __restrict__ q, const unsigned short* __restrict__ d,
                                             unsigned long long i, unsigned int j) {
    const unsigned char* m = (const unsigned char*)d + i * Q5_1_PACKED_MB;
    const unsigned int x = packed_nib<Q5_1_PACKED_QB>(q, i, j) | (((ld_u32_a2(m + 4u) >> j) & 1u) << 4);
    return (float)x * ld_f16(m) + ld_f16(m + 2u);
}
#define MXFP4_PACKED_QB 16u
#define MXFP4_PACKED_MB 1u
// MXFP4 value j: the nibble as Q4_0's, scaled by the block's e8m0 byte.
__device__ __forceinline__ float packed_mxfp4(const unsigned char* __restrict__ q, const unsigned short* __restrict__ d,
                                              unsigned long long i, unsigned int j) {
    const float e = mxfp4_e8m0_half(((const unsigned char*)d)[i * MXFP4_PACKED_MB]);
    return mxfp4_value(packed_nib<MXFP4_PACKED_QB>(q, i, j), e);
}
__device__ __forceinline__ float packed_q8_0(const unsigned char* __restrict__ q, const unsigned short* __restrict__ d,
                                             unsigned long long i, unsigned int j) {
    return (float)(int)(signed char)q[i * Q8_0_PACKED_QB + j] * f16_to_f32(d[i]);
}
#define AFFINE_Q4_PACKED_QB 64u
#define AFFINE_Q4_PACKED_MB 4u
// AffineQ4 value j: the nibble of quant byte j % 64 (low for j < 64), · scale + bias.
__device__ __forceinline__ float packed_affine_q4(const unsigned char* __restrict__ q,
                                                  const unsigned short* __restrict__ d, unsigned long long i,
                                                  unsigned int j) {
    const unsigned char* m = (const unsigned char*)d + i * AFFINE_Q4_PACKED_MB;
    return (float)packed_nib<AFFINE_Q4_PACKED_QB>(q, i, j) * ld_f16(m) + ld_f16(m + 2u);
}
#define I8_PACKED_QB 32u
#define I8_PACKED_MB 4u
__device__ __forceinline__ float packed_i8(const unsigned char* __restrict__ q, const unsigned short* __restrict__ d,
                                           unsigned long long i, unsigned int j) {
    return (float)(int)(signed char)q[i * I8_PACKED_QB + j] * ((const float*)d)[i];
}
#define Q4_K_PACKED_QB 128u
#define Q4_K_PACKED_MB 16u
// Q4_K value j: chunk c = j / 64, sub-block 2c + (j % 64) / 32, quant byte 32c + j % 32.
__device__ __forceinline__ float packed_q4_k(const unsigned char* __restrict__ q, const unsigned short* __restrict__ d,
                                             unsigned long long i, unsigned int j) {
    const unsigned char* m = (const unsigned char*)d + i * Q4_K_PACKED_MB;
    const unsigned int c = j >> 6, hi = (j >> 5) & 1u;
    unsigned int sc, mn;
    scale_min_k4(2u * c + hi, m + 4u, sc, mn);
    const float d1 = ld_f16(m) * (float)sc, mm1 = ld_f16(m + 2u) * (float)mn;
    const unsigned int byte = q[i * Q4_K_PACKED_QB + 32u * c + (j & 31u)];
    return d1 * (float)(hi ? byte >> 4 : byte & 0xFu) - mm1;
}
#define Q5_K_PACKED_QB 160u
#define Q5_K_PACKED_MB 16u
// Q5_K value j: as Q4_K's from quant bytes 32 + 32c + j % 32 (qs), plus bit 2c + hi of
// quant byte j % 32 (qh) as its fifth.
__device__ __forceinline__ float packed_q5_k(const unsigned char* __restrict__ q, const unsigned short* __restrict__ d,
                                             unsigned long long i, unsigned int j) {
    const unsigned char* m = (const unsigned char*)d + i * Q5_K_PACKED_MB;
    const unsigned int c = j >> 6, hi = (j >> 5) & 1u, l = j & 31u;
    unsigned int sc, mn;
    scale_min_k4(2u * c + hi, m + 4u, sc, mn);
    const float d1 = ld_f16(m) * (float)sc, mm1 = ld_f16(m + 2u) * (float)mn;
    const unsigned char* b = q + i * Q5_K_PACKED_QB;
    const unsigned int byte = b[32u + 32u * c + l], hb = b[l];
    const unsigned int qv = (hi ? byte >> 4 : byte & 0xFu) + (((hb >> (2u * c + hi)) & 1u) << 4);
    return d1 * (float)qv - mm1;
}
#define Q6_K_PACKED_QB 192u
#define Q6_K_PACKED_MB 18u
// Q6_K value j = 128n + 32a + l: ql byte 64n + 32(a & 1) + l (low nibble for a < 2),
// qh byte 128 + 32n + l bits 2a..2a+2, scale j / 16 (quant.cuh's Q6_K comment).
__device__ __forceinline__ float packed_q6_k(const unsigned char* __restrict__ q, const unsigned short* __restrict__ d,
                                             unsigned long long i, unsigned int j) {
    const unsigned char* m = (const unsigned char*)d + i * Q6_K_PACKED_MB;
    const unsigned char* b = q + i * Q6_K_PACKED_QB;
    const unsigned int n = j >> 7, a = (j >> 5) & 3u, l = j & 31u;
    const unsigned int lo = b[64u * n + 32u * (a & 1u) + l], hb = b[128u + 32u * n + l];
    const int qv = (int)(((a < 2u ? lo & 0xFu : lo >> 4)) | (((hb >> (2u * a)) & 3u) << 4)) - 32;
    const float da = ld_f16(m + 16u) * (float)(int)(signed char)m[j >> 4];
    return da * (float)qv;
}
// X(name, values per block, bytes of quants per block) for the formats with a packed
// layout.
#define STRATA_PACKED_FORMATS(X) \
    X(q4_0, Q4_0_QK, Q4_0_PACKED_QB) X(q4_1, Q4_1_QK, Q4_1_PACKED_QB) X(q5_0, Q5_0_QK, Q5_0_PACKED_QB) \
    X(q5_1, Q5_1_QK, Q5_1_PACKED_QB) X(q8_0, Q8_0_QK, Q8_0_PACKED_QB) X(mxfp4, MXFP4_QK, MXFP4_PACKED_QB) \
    X(q4_k, Q4_K_QK, Q4_K_PACKED_QB) X(q5_k, Q5_K_QK, Q5_K_PACKED_QB) X(q6_k, Q6_K_QK, Q6_K_PACKED_QB) \
    X(affine_q4, AFFINE_Q4_QK, AFFINE_Q4_PACKED_QB) X(i8, I8_QK, I8_PACKED_QB)

#endif  // STRATA_QUANT_CUH
