// Tiny kernels that test the emulator (tools/cuda_emu/emu.hpp) itself; run by
// `run_tests.py selftest`. Written in the same CUDA dialect as kernels/*.cu. The ones
// named bad_* break a CUDA rule on purpose: the harness expects the emulator (or
// AddressSanitizer) to report them.

// Block sum: shared-memory tree reduction. grid ceil(n/256), block 256.
extern "C" __global__ void st_block_sum(const float* __restrict__ x, float* __restrict__ out,
                                        unsigned n) {
  __shared__ float s[256];
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  s[threadIdx.x] = i < n ? x[i] : 0.0f;
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) s[threadIdx.x] += s[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = s[0];
}

// Per-warp shuffles; block 64 (two warps), one block. out is [6][64]:
//   0: xor-butterfly sum (all lanes get the warp sum)
//   1: shfl_down sum (lane 0 has the warp sum; other lanes partial sums)
//   2: broadcast of lane 7 (shfl_sync)
//   3: inclusive prefix sum (shfl_up)
//   4: shfl_xor with width 8 (sum within groups of 8)
//   5: ballot of (x > 0) as float bits
extern "C" __global__ void st_shuffles(const float* __restrict__ x, float* __restrict__ out) {
  unsigned t = threadIdx.x, lane = t % warpSize;
  float v = x[t];
  float a = v;
  for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
  out[0 * 64 + t] = a;
  float b = v;
  for (int o = 16; o > 0; o >>= 1) b += __shfl_down_sync(0xffffffffu, b, o);
  out[1 * 64 + t] = b;
  out[2 * 64 + t] = __shfl_sync(0xffffffffu, v, 7);
  float c = v;
  for (int o = 1; o < 32; o <<= 1) {
    float y = __shfl_up_sync(0xffffffffu, c, o);
    if (lane >= (unsigned)o) c += y;
  }
  out[3 * 64 + t] = c;
  float d = v;
  for (int o = 4; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o, 8);
  out[4 * 64 + t] = d;
  out[5 * 64 + t] = __uint_as_float(__ballot_sync(0xffffffffu, v > 0.0f));
}

// __syncthreads orders shared-memory writes and reads: out[t] = x[(t+1) % n] read
// through shared memory; repeated with a rotation each round. 2-D block (16, 8).
extern "C" __global__ void st_rotate(const float* __restrict__ x, float* __restrict__ out,
                                     unsigned rounds) {
  __shared__ float s[128];
  unsigned t = threadIdx.y * blockDim.x + threadIdx.x;
  unsigned n = blockDim.x * blockDim.y;
  float v = x[blockIdx.x * n + t];
  for (unsigned r = 0; r < rounds; ++r) {
    s[t] = v;
    __syncthreads();
    v = s[(t + 1) % n];
    __syncthreads();
  }
  out[blockIdx.x * n + t] = v;
}

// Warp + block reduction as kernels do it (warp shuffles then one value per warp
// in shared memory); block 1024. out[blockIdx.x] = max, out[grid + blockIdx.x] = sum.
__device__ __forceinline__ float st_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float st_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
extern "C" __global__ void __launch_bounds__(1024)
    st_block_maxsum(const float* __restrict__ x, float* __restrict__ out, unsigned n) {
  __shared__ float red[32];
  const float* row = x + (unsigned long long)blockIdx.x * n;
  float m = -INFINITY, s = 0.0f;
  for (unsigned i = threadIdx.x; i < n; i += blockDim.x) {
    m = fmaxf(m, row[i]);
    s += row[i];
  }
  m = st_warp_max(m);
  unsigned w = threadIdx.x / warpSize, lane = threadIdx.x % warpSize;
  if (lane == 0) red[w] = m;
  __syncthreads();
  m = lane < blockDim.x / warpSize ? red[lane] : -INFINITY;
  m = st_warp_max(m);
  __syncthreads();
  s = st_warp_sum(s);
  if (lane == 0) red[w] = s;
  __syncthreads();
  s = lane < blockDim.x / warpSize ? red[lane] : 0.0f;
  s = st_warp_sum(s);
  if (threadIdx.x == 0) {
    out[blockIdx.x] = m;
    out[gridDim.x + blockIdx.x] = s;
  }
}

// A partial last warp (block 40): lanes 8..31 of warp 1 do not exist, so a shfl_down
// by 16 from lane 0..7 of warp 1 reads nothing defined: the emulator returns NaN.
extern "C" __global__ void st_partial_warp(const float* __restrict__ x, float* __restrict__ out) {
  float v = x[threadIdx.x];
  out[threadIdx.x] = __shfl_down_sync(0xffffffffu, v, 16);
}

// ---- deliberately broken kernels (the emulator must report each)

// Threads past n return before the barrier the others wait at.
extern "C" __global__ void bad_early_return(const float* __restrict__ x, float* __restrict__ out,
                                            unsigned n) {
  __shared__ float s[256];
  unsigned t = threadIdx.x;
  if (t >= n) return;
  s[t] = x[t];
  __syncthreads();
  out[t] = s[(t + 1) % n];
}

// Lane 5 skips a full-mask shuffle and returns.
extern "C" __global__ void bad_missing_lane(const float* __restrict__ x, float* __restrict__ out) {
  float v = x[threadIdx.x];
  if (threadIdx.x % 32 == 5) return;
  out[threadIdx.x] = v + __shfl_xor_sync(0xffffffffu, v, 1);
}

// Lane 3 skips a full-mask shuffle and waits at __syncthreads instead: a deadlock, found
// by the timeout.
extern "C" __global__ void bad_missing_lane_deadlock(const float* __restrict__ x,
                                                     float* __restrict__ out) {
  float v = x[threadIdx.x];
  if (threadIdx.x % 32 != 3) v += __shfl_xor_sync(0xffffffffu, v, 1);
  __syncthreads();
  out[threadIdx.x] = v;
}

// Even and odd threads call two different __syncthreads.
extern "C" __global__ void bad_divergent_sync(const float* __restrict__ x, float* __restrict__ out) {
  float v = x[threadIdx.x];
  if (threadIdx.x % 2) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = v;
}

// Writes one element past the end of out (n elements).
extern "C" __global__ void bad_oob_write(const float* __restrict__ x, float* __restrict__ out,
                                         unsigned n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= n) out[i] = x[i < n ? i : 0];
}

// A data race: threads read a neighbour's shared-memory slot with no __syncthreads
// between the write and the read (run only under --tsan, which must report it).
extern "C" __global__ void bad_race(const float* __restrict__ x, float* __restrict__ out) {
  __shared__ float s[256];
  unsigned t = threadIdx.x;
  s[t] = x[t];
  out[t] = s[(t + 1) % blockDim.x];
}

// A misaligned 4-byte load (a GPU faults with "misaligned address"; UBSan reports it).
extern "C" __global__ void bad_misaligned(const float* __restrict__ x, float* __restrict__ out) {
  const unsigned char* b = (const unsigned char*)x;
  out[threadIdx.x] = *(const float*)(b + 2 + 4 * threadIdx.x);
}
