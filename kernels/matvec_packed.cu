// matvec_packed.cu: the decode products on packed weights (the block formats repacked at
// upload, kernels/README.md "Packed weights", and 16-byte aligned element rows): the
// matvec, its residual add, up to three weights of one input, and the fused gated MLP
// (common.cuh and quant.cuh are prepended).
//
// matvec_packed_FMT(q, d, x, y, rows, out, in): the same product for the block formats
// (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, Q4_K, Q5_K, Q6_K, AffineQ4 and I8) in the packed
// layout (quant.cuh: `q` the 16-byte aligned quants, `d` the scales), and for F32, F16
// and BF16 weights in their stored layout with 16-byte aligned rows (`q` the weight, `d`
// unused). Launch: grid ceil(out / 8), block 128 (any multiple of 32 up to 256: a block
// computes MATVEC_PACKED_WARP_ROWS · blockDim.x / 32 output rows, warp w rows 2w and
// 2w + 1 of them). `in` is a whole number of blocks (of units for the element formats).
//
// A "unit" is what one lane decodes from 16-byte loads: a Q4_0, Q4_1, Q5_0, Q5_1 or
// MXFP4 block (one uint4 of quants) or a Q8_0 or I8 block (two), 32 values of a Q4_K
// super-block (one uint4) or of a Q5_K one (two: qs and qh), 64 of a Q6_K one (three
// uint4: two of ql, one of qh), 32 of an AffineQ4 block (one uint4), 8 values of an
// element format (one uint4 of f16/bf16, two of f32; a block of its own). Unit g of the
// tensor is unit g % UPB (units per block: 1 for the 32-value blocks, 8 for Q4_K and
// Q5_K, 4 for Q6_K and AffineQ4, 1) of block g / UPB. The activations are staged in
// shared memory a tile at a time (MATVEC_PACKED_STAGE · MATVEC_PACKED_PAD floats over
// all activation rows), each unit's values contiguously in the order the unit decodes
// them (mvp_slot_FMT maps value v of a block to its staged float), UV + 4 floats a unit
// so that the float4 reads of a quarter-warp hit distinct banks. A tile is as many
// whole blocks per activation row as the stage holds, whole multiples of 32 units when
// that is at least 32 (always but for Q6_K at 5 to 8 rows). Lane l takes the tile's
// units g with g ≡ l (mod 32) of its warp's two rows, reading quants with 16-byte loads
// and scales with u8/u16/u32 loads; every staged activation value feeds both rows. So a
// lane meets the same units in the same order whatever the row count and tile size: a
// row comes out the same in any launch. Accumulation per (output row, activation row)
// in f32, value by value, except that a scale shared by a unit's values (Q4_0's, Q5_0's,
// Q8_0's, MXFP4's and I8's d, Q6_K's d · scale) multiplies the sum of each 4 or 8 of its
// products instead of each value; warp-reduced at the end, lane 0 writes y[r * out + o]. Rows
// past `out` (the last block) load row out - 1 and store nothing.

#define MATVEC_PACKED_WARP_ROWS 2u
#define MATVEC_PACKED_STAGE 256u
#define MATVEC_PACKED_PAD 36u

__device__ __forceinline__ unsigned int u4_word(uint4 v, unsigned int k) {
    return k == 0u ? v.x : k == 1u ? v.y : k == 2u ? v.z : v.w;
}

// Byte i of `w` (0..255) less `bias` as a float, without a conversion instruction: the
// byte moved (PRMT) under the exponent of 2^23, whose last mantissa bits it then is, and
// 2^23 + bias subtracted. Exact (both are integers below 2^24 and so is the difference),
// so the same float as (float)((int)byte - bias): a permute and an add, where the
// conversion takes a shift, a mask, an integer add and a convert.
__device__ __forceinline__ float mvp_byte(unsigned int w, unsigned int i, float bias) {
    return __uint_as_float(__byte_perm(0x4B000000u, w, 0x3104u + i)) - (8388608.0f + bias);
}

// Bits 0..4 of `t` moved to bit 4 of bytes 0..4 (the fifth bits of four 5-bit values):
// bit i of t times 2^(7i + 4) lands on bit 8i + 4, and no two products overlap.
__device__ __forceinline__ unsigned int mvp_spread4(unsigned int t) {
    return ((t & 0xFu) * 0x02040810u) & 0x10101010u;
}

// acc[j][r] += lo[j][i] · xs[r * stride + i] + hi[j][i] · xs[r * stride + GAP + i] for
// i = 0..4, in that order: 4 low- and 4 high-nibble values of each of the warp's rows
// (Q4_0 and Q4_K stage a unit's low values at 0..16 and its high values at 16..32: GAP
// 16), or values 0..4 and 4..8 of an element format's unit (GAP 4). With `scale`, those
// 8 products are summed first and the sum times scale[j] added (a block's d, once).
template <unsigned int GAP>
__device__ __forceinline__ void mvp_add_lohi(const float (*lo)[4], const float (*hi)[4], const float* xs,
                                             unsigned int stride, unsigned int rows,
                                             float (*acc)[MATVEC_MAX_ROWS], const float* scale = nullptr) {
#pragma unroll
    for (unsigned int r = 0; r < MATVEC_MAX_ROWS; ++r) {
        if (r < rows) {
            const float4 xa = *(const float4*)(xs + r * stride);
            const float4 xb = *(const float4*)(xs + r * stride + GAP);
#pragma unroll
            for (unsigned int j = 0; j < MATVEC_PACKED_WARP_ROWS; ++j) {
                float s = scale ? lo[j][0] * xa.x : acc[j][r] + lo[j][0] * xa.x;
                s += hi[j][0] * xb.x;
                s += lo[j][1] * xa.y;
                s += hi[j][1] * xb.y;
                s += lo[j][2] * xa.z;
                s += hi[j][2] * xb.z;
                s += lo[j][3] * xa.w;
                s += hi[j][3] * xb.w;
                acc[j][r] = scale ? acc[j][r] + scale[j] * s : s;
            }
        }
    }
}

// The 4- and 5-bit formats' values, as dec8_FMT, from a block's MB scale bytes at `m`:
// MvpNibD (q − OFF) · d (Q4_0: 8, Q5_0: 16, its qh at m + 2), MvpNibDM q · d + m (Q4_1,
// Q5_1 with its qh at m + 4, AffineQ4's scale and bias), MvpNibE8m0 KVALUES[q] ·
// 2^(e − 128) (MXFP4). HIGH: a u32 qh whose bit v is value v's fifth.
template <int OFF, bool H>
struct MvpNibD {
    // d multiplies each 8 values' products' sum (mvp_add_lohi's scale), not each value.
    static constexpr bool HIGH = H, WORDS = false, SCALED = true;
    static constexpr float BIAS = OFF;
    static __device__ __forceinline__ void scales(const unsigned char* m, float& d, float& mn, unsigned int& qh) {
        d = ld_f16(m);
        mn = 0.0f;
        qh = H ? ld_u32_a2(m + 2u) : 0u;
    }
    static __device__ __forceinline__ float value(float x, float, float) { return x; }
};
template <bool H>
struct MvpNibDM {
    static constexpr bool HIGH = H, WORDS = false, SCALED = false;
    static constexpr float BIAS = 0.0f;
    static __device__ __forceinline__ void scales(const unsigned char* m, float& d, float& mn, unsigned int& qh) {
        d = ld_f16(m);
        mn = ld_f16(m + 2u);
        qh = H ? ld_u32_a2(m + 4u) : 0u;
    }
    static __device__ __forceinline__ float value(float x, float d, float mn) { return x * d + mn; }
};
struct MvpNibE8m0 {
    static constexpr bool HIGH = false, WORDS = true, SCALED = true;
    static constexpr float BIAS = 0.0f;
    static __device__ __forceinline__ void scales(const unsigned char* m, float& d, float& mn, unsigned int& qh) {
        d = mxfp4_e8m0_half(m[0]);
        mn = 0.0f;
        qh = 0u;
    }
    // The 8 values of quant word `wd` at once: KVALUES as signed bytes (nibbles 0..7 in
    // the first pair of words, 8..15 in the second), looked up by byte permutes four
    // nibbles at a time; each is the integer mxfp4_value multiplies by d (here d
    // multiplies each 8 values' products' sum, as MvpNibD's).
    static __device__ __forceinline__ void word(unsigned int wd, float, float* lo, float* hi) {
#pragma unroll
        for (unsigned int h = 0; h < 2u; ++h) {
            const unsigned int n = wd >> (16u * h);
            const unsigned int pos = __byte_perm(0x03020100u, 0x0C080604u, n & 0x7777u);
            const unsigned int neg = __byte_perm(0xFDFEFF00u, 0xF4F8FAFCu, n & 0x7777u);
            // Bytes of b (as b + 128): byte 2h's low and high nibble, byte 2h + 1's.
            const unsigned int b = __byte_perm(pos, neg, 0x3210u | ((n & 0x8888u) >> 1)) ^ 0x80808080u;
            lo[2u * h] = mvp_byte(b, 0u, 128.0f);
            hi[2u * h] = mvp_byte(b, 1u, 128.0f);
            lo[2u * h + 1u] = mvp_byte(b, 2u, 128.0f);
            hi[2u * h + 1u] = mvp_byte(b, 3u, 128.0f);
        }
    }
};

// acc[j][r] += Σ_v w(unit g[j], v) · xs[r * stride + v] for one 32-value unit of each of
// the warp's rows from one uint4 of quants (unit g at q[g]), word k holding values
// 4k..4k+4 (low nibbles) and 16+4k..16+4k+4 (high nibbles), with the scales F reads at
// `d` + MB · (g / UPB): a unit is a block (Q4_0, Q4_1, Q5_0, Q5_1, MXFP4: UPB 1) or a
// quarter of one (AffineQ4: UPB 4).
template <unsigned int MB, unsigned int UPB, class F>
__device__ __forceinline__ void mvp_unit_nib(const uint4* __restrict__ q, const unsigned short* __restrict__ d,
                                             const unsigned long long* g, const float* xs, unsigned int stride,
                                             unsigned int rows, float (*acc)[MATVEC_MAX_ROWS]) {
    uint4 qv[MATVEC_PACKED_WARP_ROWS];
    float dv[MATVEC_PACKED_WARP_ROWS], mv[MATVEC_PACKED_WARP_ROWS];
    unsigned int hv[MATVEC_PACKED_WARP_ROWS];
#pragma unroll
    for (unsigned int j = 0; j < MATVEC_PACKED_WARP_ROWS; ++j) {
        qv[j] = q[g[j]];
        F::scales((const unsigned char*)d + g[j] / UPB * MB, dv[j], mv[j], hv[j]);
    }
#pragma unroll
    for (unsigned int k = 0; k < 4u; ++k) {
        float lo[MATVEC_PACKED_WARP_ROWS][4], hi[MATVEC_PACKED_WARP_ROWS][4];
#pragma unroll
        for (unsigned int j = 0; j < MATVEC_PACKED_WARP_ROWS; ++j) {
            const unsigned int wd = u4_word(qv[j], k);
            if constexpr (F::WORDS) {
                F::word(wd, dv[j], lo[j], hi[j]);
            } else {
                // Byte i of w0 (w1): value 4k + i's (16 + 4k + i's) quant, fifth bit included.
                const unsigned int w0 = (wd & 0x0F0F0F0Fu) | (F::HIGH ? mvp_spread4(hv[j] >> (4u * k)) : 0u);
                const unsigned int w1 =
                    ((wd >> 4) & 0x0F0F0F0Fu) | (F::HIGH ? mvp_spread4(hv[j] >> (16u + 4u * k)) : 0u);
#pragma unroll
                for (unsigned int i = 0; i < 4u; ++i) {
                    lo[j][i] = F::value(mvp_byte(w0, i, F::BIAS), dv[j], mv[j]);
                    hi[j][i] = F::value(mvp_byte(w1, i, F::BIAS), dv[j], mv[j]);
                }
            }
        }
        mvp_add_lohi<16u>(lo, hi, xs + 4u * k, stride, rows, acc, F::SCALED ? dv : nullptr);
    }
}
// mvp_unit_FMT as UNIT(q, d, g, xs, stride, rows, acc); MVP_UNIT_BLOCK: for a format
// whose unit is a block, staged in value order.
#define MVP_UNIT_OF(NAME, ...)                                                                    \
    __device__ __forceinline__ void mvp_unit_##NAME(const uint4* __restrict__ q,                  \
                                                    const unsigned short* __restrict__ d,         \
                                                    const unsigned long long* g, const float* xs, \
                                                    unsigned int stride, unsigned int rows,       \
                                                    float (*acc)[MATVEC_MAX_ROWS]) {              \
        __VA_ARGS__(q, d, g, xs, stride, rows, acc);                                              \
    }
#define MVP_UNIT_BLOCK(NAME, ...)                                                                 \
    MVP_UNIT_OF(NAME, __VA_ARGS__)                                                                \
    __device__ __forceinline__ unsigned int mvp_slot_##NAME(unsigned int v) { return v; }
MVP_UNIT_BLOCK(q4_0, mvp_unit_nib<Q4_0_PACKED_MB, 1u, MvpNibD<8, false>>)
MVP_UNIT_BLOCK(q4_1, mvp_unit_nib<Q4_1_PACKED_MB, 1u, MvpNibDM<false>>)
MVP_UNIT_BLOCK(q5_0, mvp_unit_nib<Q5_0_PACKED_MB, 1u, MvpNibD<16, true>>)
MVP_UNIT_BLOCK(q5_1, mvp_unit_nib<Q5_1_PACKED_MB, 1u, MvpNibDM<true>>)
MVP_UNIT_BLOCK(mxfp4, mvp_unit_nib<MXFP4_PACKED_MB, 1u, MvpNibE8m0>)
#define Q4_0_UNIT_VALUES 32u
#define Q4_1_UNIT_VALUES 32u
#define Q5_0_UNIT_VALUES 32u
#define Q5_1_UNIT_VALUES 32u
#define MXFP4_UNIT_VALUES 32u

// AffineQ4 unit u = 0..4 of a block: quant bytes 16u .. + 16, whose low nibbles are values
// 16u + (0..16) and high nibbles 64 + 16u + (0..16), q · scale + bias as Q4_1's. Staged
// as the Q4_0 block: low values at 0..16, high at 16..32.
#define AFFINE_Q4_UNIT_VALUES 32u
MVP_UNIT_OF(affine_q4, mvp_unit_nib<AFFINE_Q4_PACKED_MB, 4u, MvpNibDM<false>>)
__device__ __forceinline__ unsigned int mvp_slot_affine_q4(unsigned int v) {
    return ((v & 63u) >> 4) * (AFFINE_Q4_UNIT_VALUES + 4u) + 16u * (v >> 6) + (v & 15u);
}

// Q8_0 and I8: two uint4 of quants; word k (0..8) holds values 4k..4k+4, q · the
// block's scale: Q8_0's f16 d, I8's f32 scale (F32S), as dec8_FMT.
template <bool F32S>
__device__ __forceinline__ void mvp_unit_q8(const uint4* __restrict__ q, const unsigned short* __restrict__ d,
                                            const unsigned long long* ib, const float* xs, unsigned int stride,
                                            unsigned int rows, float (*acc)[MATVEC_MAX_ROWS]) {
    uint4 qv[MATVEC_PACKED_WARP_ROWS][2];
    float dv[MATVEC_PACKED_WARP_ROWS];
#pragma unroll
    for (unsigned int j = 0; j < MATVEC_PACKED_WARP_ROWS; ++j) {
        qv[j][0] = q[2u * ib[j]];
        qv[j][1] = q[2u * ib[j] + 1u];
        dv[j] = F32S ? ((const float*)d)[ib[j]] : f16_to_f32(d[ib[j]]);
    }
#pragma unroll
    for (unsigned int k = 0; k < 8u; ++k) {
        float v[MATVEC_PACKED_WARP_ROWS][4];
#pragma unroll
        for (unsigned int j = 0; j < MATVEC_PACKED_WARP_ROWS; ++j) {
            // Each signed byte b as b + 128 (0..255), its bias 128.
            const unsigned int wd = u4_word(qv[j][k / 4u], k % 4u) ^ 0x80808080u;
#pragma unroll
            for (unsigned int i = 0; i < 4u; ++i) v[j][i] = mvp_byte(wd, i, 128.0f);
        }
#pragma unroll
        for (unsigned int r = 0; r < MATVEC_MAX_ROWS; ++r) {
            if (r < rows) {
                const float4 xa = *(const float4*)(xs + r * stride + 4u * k);
#pragma unroll
                for (unsigned int j = 0; j < MATVEC_PACKED_WARP_ROWS; ++j) {
                    // The scale multiplies each 4 values' products' sum, once.
                    float s = v[j][0] * xa.x;
                    s += v[j][1] * xa.y;
                    s += v[j][2] * xa.z;
                    s += v[j][3] * xa.w;
                    acc[j][r] += dv[j] * s;
                }
            }
        }
    }
}

MVP_UNIT_BLOCK(q8_0, mvp_unit_q8<false>)
MVP_UNIT_BLOCK(i8, mvp_unit_q8<true>)
#define Q8_0_UNIT_VALUES 32u
#define I8_UNIT_VALUES 32u

// The scales and mins of sub-blocks 2c and 2c + 1 of a Q4_K/Q5_K super-block whose
// d, dmin and scales[12] are at `m`: d · sc and dmin · m of each.
__device__ __forceinline__ void mvp_k4_scales(const unsigned char* m, unsigned int c, float& d1, float& m1,
                                              float& d2, float& m2) {
    const float dd = ld_f16(m), dmin = ld_f16(m + 2u);
    unsigned int sc, mn;
    scale_min_k4(2u * c, m + 4u, sc, mn);
    d1 = dd * (float)sc;
    m1 = dmin * (float)mn;
    scale_min_k4(2u * c + 1u, m + 4u, sc, mn);
    d2 = dd * (float)sc;
    m2 = dmin * (float)mn;
}

// Q4_K unit u = 2c + h of a super-block: quant bytes 32c + 16h .. + 16; low nibbles are
// values 64c + 16h + (0..16) (sub-block 2c), high nibbles 64c + 32 + 16h + (0..16)
// (sub-block 2c + 1). Staged as the Q4_0 block: low values at 0..16, high at 16..32.
#define Q4_K_UNIT_VALUES 32u
__device__ __forceinline__ unsigned int mvp_slot_q4_k(unsigned int v) {
    const unsigned int c = v >> 6, hi = (v >> 5) & 1u, h = (v >> 4) & 1u;
    return (2u * c + h) * (Q4_K_UNIT_VALUES + 4u) + 16u * hi + (v & 15u);
}
__device__ __forceinline__ void mvp_unit_q4_k(const uint4* __restrict__ q, const unsigned short* __restrict__ d,
                                              const unsigned long long* g, const float* xs, unsigned int stride,
                                              unsigned int rows, float (*acc)[MATVEC_MAX_ROWS]) {
    uint4 qv[MATVEC_PACKED_WARP_ROWS];
    float d1[MATVEC_PACKED_WARP_ROWS], m1[MATVEC_PACKED_WARP_ROWS];
    float d2[MATVEC_PACKED_WARP_ROWS], m2[MATVEC_PACKED_WARP_ROWS];
#pragma unroll
    for (unsigned int j = 0; j < MATVEC_PACKED_WARP_ROWS; ++j) {
        qv[j] = q[g[j]];
        const unsigned char* m = (const unsigned char*)d + (g[j] >> 3) * Q4_K_PACKED_MB;
        mvp_k4_scales(m, ((unsigned int)g[j] & 7u) >> 1, d1[j], m1[j], d2[j], m2[j]);
    }
#pragma unroll
    for (unsigned int k = 0; k < 4u; ++k) {
        float lo[MATVEC_PACKED_WARP_ROWS][4], hi[MATVEC_PACKED_WARP_ROWS][4];
#pragma unroll
        for (unsigned int j = 0; j < MATVEC_PACKED_WARP_ROWS; ++j) {
            const unsigned int wd = u4_word(qv[j], k);
#pragma unroll
            for (unsigned int i = 0; i < 4u; ++i) {
                const unsigned int byte = QBYTE(wd, i);
                lo[j][i] = d1[j] * (float)(byte & 0xFu) - m1[j];
                hi[j][i] = d2[j] * (float)(byte >> 4) - m2[j];
            }
        }
        mvp_add_lohi<16u>(lo, hi, xs + 4u * k, stride, rows, acc);
    }
}

// Q5_K unit u = 2c + h of a super-block: Q4_K's unit from qs (quant bytes 32 + 32c + 16h
// .. + 16) with the fifth bits from qh (quant bytes 16h .. + 16): bit 2c of qh byte t for
// the low-nibble value 64c + 16h + t, bit 2c + 1 for the high one. Staged as Q4_K.
#define Q5_K_UNIT_VALUES 32u
__device__ __forceinline__ unsigned int mvp_slot_q5_k(unsigned int v) { return mvp_slot_q4_k(v); }
__device__ __forceinline__ void mvp_unit_q5_k(const uint4* __restrict__ q, const unsigned short* __restrict__ d,
                                              const unsigned long long* g, const float* xs, unsigned int stride,
                                              unsigned int rows, float (*acc)[MATVEC_MAX_ROWS]) {
    uint4 qv[MATVEC_PACKED_WARP_ROWS], hv[MATVEC_PACKED_WARP_ROWS];
    float d1[MATVEC_PACKED_WARP_ROWS], m1[MATVEC_PACKED_WARP_ROWS];
    float d2[MATVEC_PACKED_WARP_ROWS], m2[MATVEC_PACKED_WARP_ROWS];
    unsigned int c[MATVEC_PACKED_WARP_ROWS];
#pragma unroll
    for (unsigned int j = 0; j < MATVEC_PACKED_WARP_ROWS; ++j) {
        const uint4* b = q + (g[j] >> 3) * (Q5_K_PACKED_QB / 16u);
        const unsigned int u = (unsigned int)g[j] & 7u;
        qv[j] = b[2u + u];
        hv[j] = b[u & 1u];
        const unsigned char* m = (const unsigned char*)d + (g[j] >> 3) * Q5_K_PACKED_MB;
        c[j] = u >> 1;
        mvp_k4_scales(m, c[j], d1[j], m1[j], d2[j], m2[j]);
    }
#pragma unroll
    for (unsigned int k = 0; k < 4u; ++k) {
        float lo[MATVEC_PACKED_WARP_ROWS][4], hi[MATVEC_PACKED_WARP_ROWS][4];
#pragma unroll
        for (unsigned int j = 0; j < MATVEC_PACKED_WARP_ROWS; ++j) {
            const unsigned int wd = u4_word(qv[j], k), wh = u4_word(hv[j], k) >> (2u * c[j]);
            const unsigned int w0 = (wd & 0x0F0F0F0Fu) | ((wh & 0x01010101u) << 4);
            const unsigned int w1 = ((wd >> 4) & 0x0F0F0F0Fu) | ((wh & 0x02020202u) << 3);
#pragma unroll
            for (unsigned int i = 0; i < 4u; ++i) {
                lo[j][i] = d1[j] * mvp_byte(w0, i, 0.0f) - m1[j];
                hi[j][i] = d2[j] * mvp_byte(w1, i, 0.0f) - m2[j];
            }
        }
        mvp_add_lohi<16u>(lo, hi, xs + 4u * k, stride, rows, acc);
    }
}

// Q6_K unit u = 2n + h of a super-block: ql bytes 64n + 16h .. + 16 (A) and
// 64n + 32 + 16h .. + 16 (B), qh bytes 128 + 32n + 16h .. + 16 (H). Byte t (0..16) of
// them gives the values 128n + 32a + 16h + t for a = 0..3: A low / B low / A high / B
// high nibble, with bits 2a..2a+2 of H, minus 32, times d · scales[8n + 2a + h]. Staged
// as a · 16 + t.
#define Q6_K_UNIT_VALUES 64u
__device__ __forceinline__ unsigned int mvp_slot_q6_k(unsigned int v) {
    const unsigned int n = v >> 7, a = (v >> 5) & 3u, h = (v >> 4) & 1u;
    return (2u * n + h) * (Q6_K_UNIT_VALUES + 4u) + 16u * a + (v & 15u);
}
__device__ __forceinline__ void mvp_unit_q6_k(const uint4* __restrict__ q, const unsigned short* __restrict__ d,
                                              const unsigned long long* g, const float* xs, unsigned int stride,
                                              unsigned int rows, float (*acc)[MATVEC_MAX_ROWS]) {
    uint4 qa[MATVEC_PACKED_WARP_ROWS], qb[MATVEC_PACKED_WARP_ROWS], qh[MATVEC_PACKED_WARP_ROWS];
    float da[MATVEC_PACKED_WARP_ROWS][4];
#pragma unroll
    for (unsigned int j = 0; j < MATVEC_PACKED_WARP_ROWS; ++j) {
        const unsigned long long s = g[j] >> 2;
        const unsigned int n = ((unsigned int)g[j] >> 1) & 1u, h = (unsigned int)g[j] & 1u;
        const uint4* b = q + s * (Q6_K_PACKED_QB / 16u);
        qa[j] = b[4u * n + h];
        qb[j] = b[4u * n + 2u + h];
        qh[j] = b[8u + 2u * n + h];
        const unsigned char* m = (const unsigned char*)d + s * Q6_K_PACKED_MB;
        const float dd = ld_f16(m + 16u);
#pragma unroll
        for (unsigned int a = 0; a < 4u; ++a) da[j][a] = dd * (float)(int)(signed char)m[8u * n + 2u * a + h];
    }
#pragma unroll
    for (unsigned int k = 0; k < 4u; ++k) {
        float v[MATVEC_PACKED_WARP_ROWS][4][4];
#pragma unroll
        for (unsigned int j = 0; j < MATVEC_PACKED_WARP_ROWS; ++j) {
            const unsigned int wa = u4_word(qa[j], k), wb = u4_word(qb[j], k), wh = u4_word(qh[j], k);
            // Byte i of x[a] is the 6-bit quant of the value at slot 16a + 4k + i.
            const unsigned int x[4] = {(wa & 0x0F0F0F0Fu) | ((wh & 0x03030303u) << 4),
                                       (wb & 0x0F0F0F0Fu) | ((wh & 0x0C0C0C0Cu) << 2),
                                       ((wa >> 4) & 0x0F0F0F0Fu) | (wh & 0x30303030u),
                                       ((wb >> 4) & 0x0F0F0F0Fu) | ((wh >> 2) & 0x30303030u)};
#pragma unroll
            for (unsigned int i = 0; i < 4u; ++i) {
#pragma unroll
                for (unsigned int a = 0; a < 4u; ++a) v[j][a][i] = mvp_byte(x[a], i, 32.0f);
            }
        }
#pragma unroll
        for (unsigned int r = 0; r < MATVEC_MAX_ROWS; ++r) {
            if (r < rows) {
                float4 xv[4];
#pragma unroll
                for (unsigned int a = 0; a < 4u; ++a) xv[a] = *(const float4*)(xs + r * stride + 16u * a + 4u * k);
#pragma unroll
                for (unsigned int j = 0; j < MATVEC_PACKED_WARP_ROWS; ++j) {
                    float s = acc[j][r];
#pragma unroll
                    for (unsigned int a = 0; a < 4u; ++a) {
                        // The sub-block's d · scale multiplies the sum of its 4 products.
                        float t = v[j][a][0] * xv[a].x;
                        t += v[j][a][1] * xv[a].y;
                        t += v[j][a][2] * xv[a].z;
                        t += v[j][a][3] * xv[a].w;
                        s += da[j][a] * t;
                    }
                    acc[j][r] = s;
                }
            }
        }
    }
}

// Element formats (f32, f16, bf16), read in their stored layout when every row starts
// 16-byte aligned (`in` a multiple of 8, the weight 16-byte aligned): a unit is 8 values,
// unit g of the tensor at byte 16g (f16, bf16: one 16-byte load) or 32g (f32: two), a
// "block" of one unit, staged in stored order. `d` is not read (null).
#define F32_UNIT_VALUES 8u
#define F16_UNIT_VALUES 8u
#define BF16_UNIT_VALUES 8u
__device__ __forceinline__ unsigned int mvp_slot_f32(unsigned int v) { return v; }
__device__ __forceinline__ unsigned int mvp_slot_f16(unsigned int v) { return v; }
__device__ __forceinline__ unsigned int mvp_slot_bf16(unsigned int v) { return v; }

__device__ __forceinline__ void mvp_unit_f32(const uint4* __restrict__ q, const unsigned short* __restrict__ d,
                                             const unsigned long long* g, const float* xs, unsigned int stride,
                                             unsigned int rows, float (*acc)[MATVEC_MAX_ROWS]) {
    (void)d;
    float lo[MATVEC_PACKED_WARP_ROWS][4], hi[MATVEC_PACKED_WARP_ROWS][4];
#pragma unroll
    for (unsigned int j = 0; j < MATVEC_PACKED_WARP_ROWS; ++j) {
        const uint4 a = q[2u * g[j]], b = q[2u * g[j] + 1u];
#pragma unroll
        for (unsigned int k = 0; k < 4u; ++k) {
            lo[j][k] = __uint_as_float(u4_word(a, k));
            hi[j][k] = __uint_as_float(u4_word(b, k));
        }
    }
    mvp_add_lohi<4u>(lo, hi, xs, stride, rows, acc);
}

// f16 and bf16: value 2k + h of a unit is half h (low first) of word k of its load.
// Both element units add values i and 4 + i (i = 0..4) in turn (mvp_add_lohi<4>).
#define MVP_UNIT_HALF(NAME, TO_F32)                                                               \
    __device__ __forceinline__ void mvp_unit_##NAME(const uint4* __restrict__ q, const unsigned short* __restrict__ d, \
                                                    const unsigned long long* g, const float* xs,  \
                                                    unsigned int stride, unsigned int rows,       \
                                                    float (*acc)[MATVEC_MAX_ROWS]) {               \
        (void)d;                                                                                  \
        float lo[MATVEC_PACKED_WARP_ROWS][4], hi[MATVEC_PACKED_WARP_ROWS][4];                     \
        _Pragma("unroll") for (unsigned int j = 0; j < MATVEC_PACKED_WARP_ROWS; ++j) {            \
            const uint4 w = q[g[j]];                                                              \
            _Pragma("unroll") for (unsigned int k = 0; k < 2u; ++k) {                             \
                const unsigned int a = u4_word(w, k), b = u4_word(w, k + 2u);                     \
                lo[j][2u * k] = TO_F32((unsigned short)(a & 0xffffu));                            \
                lo[j][2u * k + 1u] = TO_F32((unsigned short)(a >> 16));                           \
                hi[j][2u * k] = TO_F32((unsigned short)(b & 0xffffu));                            \
                hi[j][2u * k + 1u] = TO_F32((unsigned short)(b >> 16));                           \
            }                                                                                     \
        }                                                                                         \
        mvp_add_lohi<4u>(lo, hi, xs, stride, rows, acc);                                          \
    }
MVP_UNIT_HALF(f16, f16_to_f32)
MVP_UNIT_HALF(bf16, bf16_to_f32)

// Every format the packed kernels read: (name, values a block, values a unit), the
// packed layouts and the element formats.
#define MVP_QUANT_FORMATS(X)                                                                      \
    X(q4_0, Q4_0_QK, Q4_0_UNIT_VALUES)                                                            \
    X(q4_1, Q4_1_QK, Q4_1_UNIT_VALUES)                                                            \
    X(q5_0, Q5_0_QK, Q5_0_UNIT_VALUES)                                                            \
    X(q5_1, Q5_1_QK, Q5_1_UNIT_VALUES)                                                            \
    X(q8_0, Q8_0_QK, Q8_0_UNIT_VALUES)                                                            \
    X(mxfp4, MXFP4_QK, MXFP4_UNIT_VALUES)                                                         \
    X(q4_k, Q4_K_QK, Q4_K_UNIT_VALUES)                                                            \
    X(q5_k, Q5_K_QK, Q5_K_UNIT_VALUES)                                                            \
    X(q6_k, Q6_K_QK, Q6_K_UNIT_VALUES)                                                            \
    X(affine_q4, AFFINE_Q4_QK, AFFINE_Q4_UNIT_VALUES)                                             \
    X(i8, I8_QK, I8_UNIT_VALUES)
#define MVP_ELEM_FORMATS(X)                                                                       \
    X(f32, F32_UNIT_VALUES, F32_UNIT_VALUES)                                                      \
    X(f16, F16_UNIT_VALUES, F16_UNIT_VALUES)                                                      \
    X(bf16, BF16_UNIT_VALUES, BF16_UNIT_VALUES)
#define MVP_FORMATS(X) MVP_QUANT_FORMATS(X) MVP_ELEM_FORMATS(X)

// The tiled walk the packed kernels share, inside a kernel with `x`, `rows`, `out`
// and `in` in scope, for the block of index BLOCK among the weight's (MVP_WALK: the
// launch's blockIdx.x): declares `lane`, `o0` (the warp's first output row) and the
// clamped `rows`, stages the activations a tile at a time and runs UNIT once per unit
// of the warp's rows, with `g` (the units' indices, one per row) and `xu` (its staged
// values) in scope; UNROLL is the unit loop's pragma (the fused GLU kernels choose
// theirs per format so that their four weight rows a warp do not spill on sm_90).
// Returns early (uniformly) when there is nothing to compute.
#define MVP_WALK(NAME, QK, UV, UNROLL, UNIT) MVP_WALK_AT(NAME, QK, UV, UNROLL, blockIdx.x, UNIT)
#define MVP_WALK_AT(NAME, QK, UV, UNROLL, BLOCK, UNIT)                                            \
    __shared__ float4 stage[MATVEC_PACKED_STAGE * MATVEC_PACKED_PAD / 4u];                        \
    float* xs = (float*)stage;                                                                    \
    if (out == 0u || rows == 0u) return; /* uniform: nothing to compute */                       \
    rows = min(rows, MATVEC_MAX_ROWS);                                                            \
    const unsigned int uv = (UV), upad = uv + 4u, upb = (QK) / uv;                                \
    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;                         \
    const unsigned int nunit = in / uv;                                                           \
    /* units per activation row and tile: whole blocks, whole 32s when >= 32 */                 \
    unsigned int tb = MATVEC_PACKED_STAGE * MATVEC_PACKED_PAD / upad / rows;                      \
    tb = tb >= 32u ? tb / 32u * 32u : tb / upb * upb;                                             \
    const unsigned int stride = tb * upad;                                                        \
    const unsigned int o0 = ((BLOCK) * (blockDim.x >> 5) + warp) * MATVEC_PACKED_WARP_ROWS;       \
    unsigned long long rowu[MATVEC_PACKED_WARP_ROWS];                                             \
    _Pragma("unroll") for (unsigned int j = 0; j < MATVEC_PACKED_WARP_ROWS; ++j)                  \
        rowu[j] = (unsigned long long)min(o0 + j, out - 1u) * nunit;                              \
    for (unsigned int b0 = 0; b0 < nunit; b0 += tb) {                                             \
        const unsigned int nb = min(tb, nunit - b0), nv = nb * uv;                                \
        __syncthreads(); /* the previous tile's reads are done */                                \
        for (unsigned int t = threadIdx.x; t < rows * nv; t += blockDim.x) {                      \
            const unsigned int r = t / nv, k = t % nv;                                            \
            xs[r * stride + (k / (QK)) * upb * upad + mvp_slot_##NAME(k % (QK))] =                \
                x[(unsigned long long)r * in + b0 * uv + k];                                      \
        }                                                                                         \
        __syncthreads();                                                                          \
        _Pragma(UNROLL) for (unsigned int bi = (lane + 32u - b0 % 32u) % 32u; bi < nb; bi += 32u) { \
            unsigned long long g[MATVEC_PACKED_WARP_ROWS];                                        \
            _Pragma("unroll") for (unsigned int j = 0; j < MATVEC_PACKED_WARP_ROWS; ++j)          \
                g[j] = rowu[j] + b0 + bi;                                                         \
            const float* xu = xs + bi * upad;                                                     \
            UNIT;                                                                                 \
        }                                                                                         \
    }

// Zeroed accumulators of a warp's rows.
#define MVP_ACC(acc)                                                                              \
    float acc[MATVEC_PACKED_WARP_ROWS][MATVEC_MAX_ROWS];                                          \
    _Pragma("unroll") for (unsigned int j = 0; j < MATVEC_PACKED_WARP_ROWS; ++j)                  \
        _Pragma("unroll") for (unsigned int r = 0; r < MATVEC_MAX_ROWS; ++r) acc[j][r] = 0.0f;

// For each of the warp's rows o0 + j < out and activation row r < rows: SUMS on every
// lane (the warp sums: each lane must shuffle), then STORE on lane 0, with `j` and `r`
// in scope.
#define MVP_REDUCE(SUMS, STORE)                                                                   \
    _Pragma("unroll") for (unsigned int j = 0; j < MATVEC_PACKED_WARP_ROWS; ++j) {                \
        _Pragma("unroll") for (unsigned int r = 0; r < MATVEC_MAX_ROWS; ++r) {                    \
            if (r < rows) { /* uniform across the warp: every lane shuffles */                    \
                SUMS;                                                                             \
                if (lane == 0u && o0 + j < out) STORE;                                            \
            }                                                                                     \
        }                                                                                         \
    }

// matvec_add_packed_FMT(q, d, x, y, rows, out, in): the product added into `y` (a
// residual stream): y[r * out + o] += Σ_k x[r, k] · w[o, k]. Launch and walk as
// matvec_packed_FMT; the sum is the same, added with one f32 add, so y is bit for bit
// matvec_packed_FMT into a buffer followed by add_f32 of it.
//
// Both kernels, KERNEL storing each sum with STORE (`=` or `+=`).
#define MATVEC_PACKED_KERNEL(KERNEL, NAME, QK, UV, STORE)                                         \
    extern "C" __global__ void __launch_bounds__(256)                                             \
        KERNEL(const unsigned char* __restrict__ q, const unsigned short* __restrict__ d,         \
               const float* __restrict__ x, float* __restrict__ y, unsigned int rows, unsigned int out, \
               unsigned int in) {                                                                 \
        MVP_ACC(acc)                                                                              \
        MVP_WALK(NAME, QK, UV, "unroll 2", mvp_unit_##NAME((const uint4*)q, d, g, xu, stride, rows, acc)) \
        MVP_REDUCE(const float s = warp_sum(acc[j][r]), y[(unsigned long long)r * out + o0 + j] STORE s) \
    }
#define MATVEC_PACKED(NAME, QK, UV)                                                               \
    MATVEC_PACKED_KERNEL(matvec_packed_##NAME, NAME, QK, UV, =)                                   \
    MATVEC_PACKED_KERNEL(matvec_add_packed_##NAME, NAME, QK, UV, +=)
MVP_FORMATS(MATVEC_PACKED)

// matvec_multi_packed_FMT(q0, d0, y0, out0, q1, d1, y1, out1, q2, d2, y2, out2, x, rows,
// in): up to three products of one input in one launch (a layer's q, k and v),
//   y_i[r * out_i + o] = Σ_k x[r, k] · w_i[o, k]
// for packed `[out_i, in]` weights of one format (`q_i`/`d_i` their quants and scales,
// `y_i` distinct outputs; `out_i` = 0 for an unused weight). Launch: grid Σ_i ceil(out_i /
// R), R = 2 · blockDim.x / 32 rows a block (8 at block 128, any multiple of 32 up to
// 256): the first ceil(out_0 / R) blocks compute weight 0, the next weight 1, the rest
// weight 2 (the choice is block-uniform), each as block `b - first` of matvec_packed_FMT's
// launch, so every output is bit for bit that kernel's.
#define MATVEC_MULTI_PACKED(NAME, QK, UV)                                                         \
    extern "C" __global__ void __launch_bounds__(256) matvec_multi_packed_##NAME(                 \
        const unsigned char* __restrict__ q0, const unsigned short* __restrict__ d0,              \
        float* __restrict__ y0, unsigned int out0, const unsigned char* __restrict__ q1,          \
        const unsigned short* __restrict__ d1, float* __restrict__ y1, unsigned int out1,         \
        const unsigned char* __restrict__ q2, const unsigned short* __restrict__ d2,              \
        float* __restrict__ y2, unsigned int out2, const float* __restrict__ x, unsigned int rows, \
        unsigned int in) {                                                                        \
        const unsigned int per = MATVEC_PACKED_WARP_ROWS * (blockDim.x >> 5);                     \
        const unsigned int n0 = (out0 + per - 1u) / per, n01 = n0 + (out1 + per - 1u) / per;      \
        const unsigned int wi = blockIdx.x < n0 ? 0u : blockIdx.x < n01 ? 1u : 2u;                \
        const unsigned char* __restrict__ q = wi == 0u ? q0 : wi == 1u ? q1 : q2;                 \
        const unsigned short* __restrict__ d = wi == 0u ? d0 : wi == 1u ? d1 : d2;                \
        float* __restrict__ y = wi == 0u ? y0 : wi == 1u ? y1 : y2;                               \
        const unsigned int out = wi == 0u ? out0 : wi == 1u ? out1 : out2;                        \
        const unsigned int blk = blockIdx.x - (wi == 0u ? 0u : wi == 1u ? n0 : n01);              \
        MVP_ACC(acc)                                                                              \
        MVP_WALK_AT(NAME, QK, UV, "unroll 2", blk,                                                \
                    mvp_unit_##NAME((const uint4*)q, d, g, xu, stride, rows, acc))                \
        MVP_REDUCE(const float s = warp_sum(acc[j][r]), y[(unsigned long long)r * out + o0 + j] = s) \
    }
MVP_FORMATS(MATVEC_MULTI_PACKED)

// matvec_glu_packed_FMT(qg, dg, qu, du, x, y, rows, out, in, act, alpha, limit): a gated
// MLP's gate and up products and its activation in one launch,
//   y[r, o] = act(Σ_k x[r, k] · gate[o, k]) · (Σ_k x[r, k] · up[o, k])
// for two packed `[out, in]` weights of the same format (`qg`/`dg` the gate's quants and
// scales, `qu`/`du` the up's), `act` a STRATA_GLU_* code (common.cuh; `alpha` and
// `limit` are SwigluOai's). Launch and walk as matvec_packed_FMT: every staged value
// feeds the warp's two gate rows and its two up rows, and each product's sums meet the
// same units in the same order as matvec_packed_FMT's, so y is bit for bit
// matvec_packed_FMT of both weights followed by the GLU kernel of `act`.
// UNROLL: the unit loop's pragma, whichever keeps the four weight rows a warp from
// spilling on sm_90 (check_packed_ptx.py): "unroll 1" for Q4_0, Q4_1, Q5_0, Q5_1,
// Q8_0, MXFP4, Q4_K, Q6_K, AffineQ4 and I8, "unroll 2" for Q5_K and the element
// formats.
#define MATVEC_GLU_PACKED_UNROLLED(NAME, QK, UV, UNROLL)                                          \
    extern "C" __global__ void __launch_bounds__(256) matvec_glu_packed_##NAME(                   \
        const unsigned char* __restrict__ qg, const unsigned short* __restrict__ dg,              \
        const unsigned char* __restrict__ qu, const unsigned short* __restrict__ du,              \
        const float* __restrict__ x, float* __restrict__ y, unsigned int rows, unsigned int out,  \
        unsigned int in, unsigned int act, float alpha, float limit) {                            \
        MVP_ACC(accg)                                                                             \
        MVP_ACC(accu)                                                                             \
        MVP_WALK(NAME, QK, UV, UNROLL, {                                                          \
            mvp_unit_##NAME((const uint4*)qg, dg, g, xu, stride, rows, accg);                     \
            mvp_unit_##NAME((const uint4*)qu, du, g, xu, stride, rows, accu);                     \
        })                                                                                        \
        MVP_REDUCE(const float s = warp_sum(accg[j][r]); const float s2 = warp_sum(accu[j][r]),    \
                   y[(unsigned long long)r * out + o0 + j] = strata_glu(act, s, s2, alpha, limit))  \
    }
#define MATVEC_GLU_PACKED(NAME, QK, UV) MATVEC_GLU_PACKED_UNROLLED(NAME, QK, UV, "unroll 1")
#define MATVEC_GLU_PACKED_UNROLL2(NAME, QK, UV) MATVEC_GLU_PACKED_UNROLLED(NAME, QK, UV, "unroll 2")
MATVEC_GLU_PACKED(q4_0, Q4_0_QK, Q4_0_UNIT_VALUES)
MATVEC_GLU_PACKED(q4_1, Q4_1_QK, Q4_1_UNIT_VALUES)
MATVEC_GLU_PACKED(q5_0, Q5_0_QK, Q5_0_UNIT_VALUES)
MATVEC_GLU_PACKED(q5_1, Q5_1_QK, Q5_1_UNIT_VALUES)
MATVEC_GLU_PACKED(q8_0, Q8_0_QK, Q8_0_UNIT_VALUES)
MATVEC_GLU_PACKED(mxfp4, MXFP4_QK, MXFP4_UNIT_VALUES)
MATVEC_GLU_PACKED(q4_k, Q4_K_QK, Q4_K_UNIT_VALUES)
MATVEC_GLU_PACKED_UNROLL2(q5_k, Q5_K_QK, Q5_K_UNIT_VALUES)
MATVEC_GLU_PACKED(q6_k, Q6_K_QK, Q6_K_UNIT_VALUES)
MATVEC_GLU_PACKED(affine_q4, AFFINE_Q4_QK, AFFINE_Q4_UNIT_VALUES)
MATVEC_GLU_PACKED(i8, I8_QK, I8_UNIT_VALUES)
MVP_ELEM_FORMATS(MATVEC_GLU_PACKED_UNROLL2)
