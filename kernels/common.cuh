// common.cuh: prepended to every kernel source before NVRTC compiles it.
//
// No toolkit headers are available: this file defines the few constants, conversions
// and reductions the kernels share. Everything here is plain C++ over the CUDA
// built-ins listed in kernels/README.md, so tools/cuda_emu can compile it with g++.
//
// f16 values are carried as `unsigned short` bit patterns, bf16 likewise.

#ifndef STRATA_COMMON_CUH
#define STRATA_COMMON_CUH

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

#define STRATA_FULL_MASK 0xffffffffu

// +inf / -inf as values (usable where INFINITY may be a macro of another kind).
__device__ __forceinline__ float strata_pos_inf() { return __int_as_float(0x7f800000); }
__device__ __forceinline__ float strata_neg_inf() { return __int_as_float((int)0xff800000u); }

// ---------------------------------------------------------------------------------
// f16 / bf16 <-> f32 conversions (bit manipulation only).
// ---------------------------------------------------------------------------------

// IEEE binary16 -> binary32, exact for every input: subnormals, ±0, ±inf, NaN
// (payload kept, as the hardware and the `half` crate do). On the GPU this is the
// conversion instruction itself (one instruction: the bit-manipulation form below
// compiled to ~10 instructions and branches per value, which made attention over an
// f16 KV cache 3x slower than over f32 on an H200); elsewhere (tools/cuda_emu) the
// same conversion in plain C++. The bit form never produces or consumes an f32
// subnormal, so it gives the same answer whether or not subnormals are flushed.
__device__ __forceinline__ float f16_to_f32(unsigned short h) {
#ifdef __CUDA_ARCH__
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    const unsigned int sign = ((unsigned int)h & 0x8000u) << 16;
    const unsigned int exp = ((unsigned int)h >> 10) & 0x1fu;
    const unsigned int mant = (unsigned int)h & 0x3ffu;
    unsigned int bits;
    if (exp == 0x1fu) {
        // inf (mant == 0) or NaN (payload shifted into the f32 mantissa)
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0u) {
        // normal: rebias 15 -> 127
        bits = sign | ((exp + 112u) << 23) | (mant << 13);
    } else if (mant == 0u) {
        bits = sign;  // ±0
    } else {
        // subnormal: mant · 2^-24. (float)mant is exact (< 2^10) and the product is an
        // exact, normal f32 (>= 2^-24).
        const float f = (float)mant * 5.9604644775390625e-8f;  // 2^-24
        bits = sign | __float_as_uint(f);
    }
    return __uint_as_float(bits);
#endif
}

// IEEE binary32 -> binary16 bits, round to nearest, ties to even. Overflow gives ±inf,
// values below half the smallest subnormal give ±0, NaN stays NaN (quiet, top payload
// bits kept), subnormal results are rounded exactly.
__device__ __forceinline__ unsigned short f16_from_f32(float f) {
    const unsigned int x = __float_as_uint(f);
    const unsigned int sign = (x >> 16) & 0x8000u;
    unsigned int ax = x & 0x7fffffffu;
    unsigned int h;
    if (ax > 0x7f800000u) {
        h = 0x7e00u | ((ax >> 13) & 0x3ffu);  // NaN
    } else if (ax >= 0x47800000u) {
        h = 0x7c00u;  // >= 65536 (or inf): inf
    } else if (ax >= 0x38800000u) {
        // normal f16 range (>= 2^-14). Rebias the exponent (−112 << 23) and round the 13
        // dropped mantissa bits to nearest even; a carry out of the mantissa bumps the
        // exponent, and 65520.. rounds up to 0x7c00 (inf) as it must.
        const unsigned int mant_odd = (ax >> 13) & 1u;
        ax += 0xc8000fffu + mant_odd;  // == ax − (112 << 23) + 0xfff + mant_odd (mod 2^32)
        h = ax >> 13;
    } else if (ax > 0x33000000u) {
        // subnormal f16 result: m = round(|f| · 2^24), |f| = mant · 2^(e − 150).
        const unsigned int e = ax >> 23;                      // 102 ..= 112
        const unsigned int mant = (ax & 0x7fffffu) | 0x800000u;
        const unsigned int s = 126u - e;                      // 14 ..= 24
        unsigned int m = mant >> s;
        const unsigned int rem = mant & ((1u << s) - 1u);
        const unsigned int half = 1u << (s - 1u);
        if (rem > half || (rem == half && (m & 1u))) m += 1u;  // may carry into 0x400: fine
        h = m;
    } else {
        h = 0u;  // |f| <= 2^-25 rounds (ties to even) to zero
    }
    return (unsigned short)(sign | h);
}

// bfloat16 -> f32: the high half of an f32.
__device__ __forceinline__ float bf16_to_f32(unsigned short b) {
    return __uint_as_float(((unsigned int)b) << 16);
}

// ---------------------------------------------------------------------------------
// Unaligned-safe little-endian loads from byte pointers (blocks are 2-byte aligned).
// ---------------------------------------------------------------------------------

// Reads the u16 at `p` (p must be 2-byte aligned).
__device__ __forceinline__ unsigned int ld_u16(const unsigned char* p) {
    return (unsigned int)*(const unsigned short*)p;
}

// Reads 4 bytes at a 2-byte aligned `p` as a little-endian u32 (two u16 loads).
__device__ __forceinline__ unsigned int ld_u32_a2(const unsigned char* p) {
    const unsigned short* s = (const unsigned short*)p;
    return (unsigned int)s[0] | ((unsigned int)s[1] << 16);
}

// The f16 at a 2-byte aligned `p`, as f32.
__device__ __forceinline__ float ld_f16(const unsigned char* p) {
    return f16_to_f32(*(const unsigned short*)p);
}

// ---------------------------------------------------------------------------------
// Warp and block reductions. Every lane of the warp must call the warp ones; every
// thread of the block must call the block ones (they contain __syncthreads).
// ---------------------------------------------------------------------------------

__device__ __forceinline__ float warp_sum(float v) {
    v += __shfl_xor_sync(STRATA_FULL_MASK, v, 16);
    v += __shfl_xor_sync(STRATA_FULL_MASK, v, 8);
    v += __shfl_xor_sync(STRATA_FULL_MASK, v, 4);
    v += __shfl_xor_sync(STRATA_FULL_MASK, v, 2);
    v += __shfl_xor_sync(STRATA_FULL_MASK, v, 1);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(STRATA_FULL_MASK, v, 16));
    v = fmaxf(v, __shfl_xor_sync(STRATA_FULL_MASK, v, 8));
    v = fmaxf(v, __shfl_xor_sync(STRATA_FULL_MASK, v, 4));
    v = fmaxf(v, __shfl_xor_sync(STRATA_FULL_MASK, v, 2));
    v = fmaxf(v, __shfl_xor_sync(STRATA_FULL_MASK, v, 1));
    return v;
}

__device__ __forceinline__ unsigned int warp_sum_u32(unsigned int v) {
    v += __shfl_xor_sync(STRATA_FULL_MASK, v, 16);
    v += __shfl_xor_sync(STRATA_FULL_MASK, v, 8);
    v += __shfl_xor_sync(STRATA_FULL_MASK, v, 4);
    v += __shfl_xor_sync(STRATA_FULL_MASK, v, 2);
    v += __shfl_xor_sync(STRATA_FULL_MASK, v, 1);
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024). `scratch` is a __shared__
// float[32] owned by the caller; the result is returned to every thread. Safe to call
// repeatedly with the same scratch.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const unsigned int nwarps = (blockDim.x + 31u) >> 5;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = (lane < nwarps) ? scratch[lane] : 0.0f;
    t = warp_sum(t);
    return t;
}

__device__ __forceinline__ unsigned int block_sum_u32(unsigned int v, unsigned int* scratch) {
    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const unsigned int nwarps = (blockDim.x + 31u) >> 5;
    v = warp_sum_u32(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    unsigned int t = (lane < nwarps) ? scratch[lane] : 0u;
    t = warp_sum_u32(t);
    return t;
}

// exp(a − b) for a <= b, with exp(−inf − x) = 0 and no NaN when both are −inf
// (returns 0 then; callers treat a −inf max as "nothing seen").
__device__ __forceinline__ float strata_exp_diff(float a, float b) {
    return (a == strata_neg_inf()) ? 0.0f : expf(a - b);
}

// cap · tanh(x / cap): logit softcapping (Gemma 2), the CPU's evaluation order. Any
// non-zero cap works (the sign of cap does not change the result).
__device__ __forceinline__ float strata_softcap(float x, float cap) {
    return cap * tanhf(x / cap);
}

// The gated activations act(g) · u of elementwise.cu's GLU kernels and of
// matvec_packed.cu's fused gate/up products, in the CPU's evaluation order
// (crates/strata-backend/src/cpu/mod.rs `glu_slices`): one expression for both, so the
// fused product gives the unfused one's bits. STRATA_GLU_* are the `act` codes
// (crates/strata-backend/src/cuda/launch.rs `glu_code`).
#define STRATA_GLU_SILU 0u
#define STRATA_GLU_GELU_TANH 1u
#define STRATA_GLU_SIGMOID 2u
#define STRATA_GLU_SWIGLU_OAI 3u

// silu(g) · u = g / (1 + e^-g) · u.
__device__ __forceinline__ float strata_silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// gelu_tanh(g) · u with PyTorch's gelu(approximate="tanh"):
// 0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³))) · u.
__device__ __forceinline__ float strata_gelu_mul(float g, float u) {
    const float SQRT_2_OVER_PI = 0.7978846f;
    const float inner = SQRT_2_OVER_PI * (g + 0.044715f * g * g * g);
    return 0.5f * g * (1.0f + tanhf(inner)) * u;
}

// sigmoid(g) · u = u / (1 + e^-g).
__device__ __forceinline__ float strata_sigmoid_mul(float g, float u) { return u / (1.0f + expf(-g)); }

// gpt-oss's clamped SwiGLU: x = min(g, limit), y = clamp(u, −limit, limit),
// x / (1 + e^(−alpha·x)) · (y + 1). fminf gives `limit` for a NaN gate, as Rust's
// f32::min; a NaN up stays NaN, as f32::clamp.
__device__ __forceinline__ float strata_swiglu_oai_mul(float g, float u, float alpha, float limit) {
    const float x = fminf(g, limit);
    const float y = u < -limit ? -limit : (u > limit ? limit : u);
    return x / (1.0f + expf(-alpha * x)) * (y + 1.0f);
}

// act(g) · u for an `act` code (STRATA_GLU_*; alpha and limit: SwigluOai's only).
__device__ __forceinline__ float strata_glu(unsigned int act, float g, float u, float alpha, float limit) {
    switch (act) {
        case STRATA_GLU_GELU_TANH: return strata_gelu_mul(g, u);
        case STRATA_GLU_SIGMOID: return strata_sigmoid_mul(g, u);
        case STRATA_GLU_SWIGLU_OAI: return strata_swiglu_oai_mul(g, u, alpha, limit);
        default: return strata_silu_mul(g, u);
    }
}

// RoPE of one pair of a head (rope.cu's rope_f32 and attention.cu's rope_store_*: one
// expression for both, so the fused store gives the unfused rotation's bits): the pair
// (head[i0], head[i1]) rotated by the angle p · inv_freq, cos and sin scaled by
// attn_factor: x0' = x0·cos − x1·sin, x1' = x1·cos + x0·sin. sinf/cosf with full-range
// argument reduction (never --use_fast_math: angles reach 1e5+ radians).
__device__ __forceinline__ void strata_rope_pair(float* head, unsigned int i0, unsigned int i1, float p,
                                                 float inv_freq, float attn_factor) {
    const float angle = p * inv_freq;
    const float c = cosf(angle) * attn_factor;
    const float s = sinf(angle) * attn_factor;
    const float x0 = head[i0], x1 = head[i1];
    head[i0] = x0 * c - x1 * s;
    head[i1] = x1 * c + x0 * s;
}

// Orderable key of an f32: larger key <=> larger value in IEEE totalOrder (Rust's
// f32::total_cmp): −NaN < −inf < … < −0 < +0 < … < +inf < +NaN.
__device__ __forceinline__ unsigned int f32_order_key(float f) {
    const unsigned int b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

#endif  // STRATA_COMMON_CUH
