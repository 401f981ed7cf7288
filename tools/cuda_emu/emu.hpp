// emu.hpp: run Strata's CUDA C kernels (kernels/*.cu) on the CPU, for tests.
//
// Force-included before the kernel sources:
//   g++ -std=c++20 -O1 -include tools/cuda_emu/emu.hpp -shared -fPIC kernel.cpp
// It turns the CUDA dialect the kernels use into C++ with CUDA's execution semantics:
//
// * Every block runs its blockDim.x*y*z threads as real OS threads (a reusable pool),
//   all at once; blocks run one after another, never two at a time (one launch at a
//   time per process, guarded by a mutex). That is what makes `__shared__` -> `static`
//   sound: a block's shared arrays are function/file statics that only it touches.
// * threadIdx / blockIdx / blockDim / gridDim are thread_local; warpSize is 32; a
//   thread's warp and lane follow CUDA's linear order (x fastest, then y, then z).
// * __syncthreads() is a block-wide barrier. The CUDA rule that every thread of the
//   block must reach the same __syncthreads is checked: a thread that returns while
//   others wait at (or later reach) a barrier, or threads that meet at two different
//   __syncthreads call sites, is reported as an emulator error (file:line of each side)
//   instead of hanging; so is any other deadlock, found by a watchdog (the launching
//   thread): no barrier or intrinsic completing and no thread returning for EMU_TIMEOUT
//   seconds (default 20). The launch then returns non-zero and emu_last_error() says why.
// * Warp intrinsics (__shfl_sync, __shfl_xor_sync, __shfl_up_sync, __shfl_down_sync,
//   __ballot_sync, __any_sync, __all_sync, __syncwarp) are a rendezvous of the lanes
//   named in the mask through a per-warp buffer (double-buffered, futex waits): every
//   named lane must execute the same intrinsic with the same mask, as on hardware. A lane
//   that exited, a lane missing (watchdog), a mask that does not contain the calling lane, or lanes that disagree on
//   the intrinsic or mask is an emulator error. Lanes past the end of a partial last
//   warp are ignored in the mask; reading from one (or from a lane outside the mask)
//   returns a NaN poison value (0x7fffdead) instead of garbage.
// * Math (expf, __expf, logf, sqrtf, rsqrtf, ...) maps to the C library (so the fast
//   __expf is exact here: precision differences vs the GPU are not modelled).
//
// Host side: emu_launch(kernel, dim3 grid, dim3 block, args...) runs a launch
// synchronously and returns 0, or non-zero after an emulator error (also printed to
// stderr). emu_alloc/emu_free give exactly-sized 256-byte-aligned buffers so that
// AddressSanitizer (-fsanitize=address) catches any access past a buffer's end.
//
// Not modelled: two disjoint lane subsets of one warp in warp intrinsics at the same time
// (each with its own mask; reported as lanes disagreeing), performance, the GPU's weak memory model (x86 is much stronger, so a
// missing fence may pass here), shared-memory capacity limits, dynamic (extern)
// shared memory, uninitialised shared memory (statics start at zero, then keep the
// previous block's values), and warp-synchronous code that communicates through
// shared memory without __syncwarp (threads here are fully independent, so such code
// is more likely to fail here than on hardware, which is the desired direction).
#pragma once

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <semaphore>
#include <source_location>
#include <string>
#include <tuple>
#include <thread>
#include <vector>

// ---------------------------------------------------------------- qualifiers
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __shared__ static
#define __constant__ static
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// __restrict__ is a GCC keyword already.

// ---------------------------------------------------------------- vector types
struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
  constexpr dim3(uint3 u) : x(u.x), y(u.y), z(u.z) {}
};

#define EMU_VEC2(T, N, A)                                                   \
  struct __attribute__((aligned(A))) N##2 { T x, y; };                       \
  inline N##2 make_##N##2(T x, T y) { return N##2{x, y}; }
#define EMU_VEC4(T, N, A)                                                   \
  struct __attribute__((aligned(A))) N##4 { T x, y, z, w; };                 \
  inline N##4 make_##N##4(T x, T y, T z, T w) { return N##4{x, y, z, w}; }
EMU_VEC2(float, float, 8)
EMU_VEC4(float, float, 16)
EMU_VEC2(int, int, 8)
EMU_VEC4(int, int, 16)
EMU_VEC2(unsigned, uint, 8)
EMU_VEC4(unsigned, uint, 16)
EMU_VEC2(signed char, char, 2)
EMU_VEC4(signed char, char, 4)
EMU_VEC2(unsigned char, uchar, 2)
EMU_VEC4(unsigned char, uchar, 4)
EMU_VEC2(short, short, 4)
EMU_VEC4(short, short, 8)
EMU_VEC2(unsigned short, ushort, 4)
EMU_VEC4(unsigned short, ushort, 8)
#undef EMU_VEC2
#undef EMU_VEC4
struct float3 { float x, y, z; };
inline float3 make_float3(float x, float y, float z) { return float3{x, y, z}; }
inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return uint3{x, y, z}; }

// ---------------------------------------------------------------- built-in variables
inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;
inline constexpr int warpSize = 32;

// ---------------------------------------------------------------- emulator core
namespace emu {

using SrcLoc = std::source_location;
using Clock = std::chrono::steady_clock;
constexpr auto RLX = std::memory_order_relaxed;

// Thrown inside a kernel thread to unwind it after an emulator error was detected.
struct Abort {};

enum State : int { RUNNING = 0, AT_SYNC, AT_WARP, EXITED };

inline double g_timeout = [] {
  const char* e = getenv("EMU_TIMEOUT");
  double v = e ? atof(e) : 20.0;
  return v > 0 ? v : 20.0;
}();
inline double timeout_s() { return g_timeout; }

inline std::string loc_str(const char* file, unsigned line) {
  return std::string(file ? file : "?") + ":" + std::to_string(line);
}

// Where a thread is (for diagnostics; written by the thread, read by anyone).
struct ThreadInfo {
  std::atomic<int> state{RUNNING};
  std::atomic<const char*> file{nullptr};
  std::atomic<unsigned> line{0};
  void set(int s, const char* f, unsigned l) {
    file.store(f, RLX);
    line.store(l, RLX);
    state.store(s, RLX);
  }
};

// One warp's rendezvous for the warp intrinsics. A round collects the lanes of one mask;
// the last lane to arrive completes it (bumps gen); values are double-buffered by the
// parity of gen, since a lane can be at most one round ahead of the slowest reader.
struct Warp {
  uint32_t existing = 0;               // lanes that exist in this block
  std::atomic<uint32_t> exited{0};     // lanes whose kernel call returned
  std::atomic<uint32_t> arrived{0};    // lanes in the round being collected
  std::atomic<uint64_t> desc{0};       // (op + 1) << 32 | mask of that round; 0: none
  std::atomic<uint32_t> gen{0};        // completed rounds
  std::atomic<const char*> file{nullptr};
  std::atomic<unsigned> line{0};
  uint64_t vals[2][32];
  void reset(uint32_t ex) {
    existing = ex;
    exited.store(0);
    arrived.store(0);
    desc.store(0);
    file.store(nullptr);
    line.store(0);
  }
};

struct Block {
  unsigned n = 0;  // threads in the block
  uint3 idx{};     // blockIdx
  std::atomic<unsigned> arrived{0}, exited{0};
  std::atomic<int> count{0};  // __syncthreads_count/and/or
  int last_count = 0;
  std::atomic<uint32_t> gen{0};
  std::vector<std::unique_ptr<Warp>> warps;
  std::unique_ptr<ThreadInfo[]> info;
  unsigned info_n = 0;
};

inline std::atomic<bool> g_failed{false};
inline std::atomic<uint64_t> g_progress{0};  // barrier/intrinsic completions and exits
inline std::mutex g_err_m;
inline std::string g_err;
inline Block g_block;
inline thread_local unsigned t_tid = 0;

inline std::string block_str() {
  char b[64];
  snprintf(b, sizeof b, "block (%u,%u,%u)", g_block.idx.x, g_block.idx.y, g_block.idx.z);
  return b;
}

inline std::string tid_str(unsigned tid) {
  const dim3 bd = blockDim;
  char b[96];
  snprintf(b, sizeof b, "thread %u (x=%u,y=%u,z=%u; warp %u lane %u)", tid, tid % bd.x,
           (tid / bd.x) % bd.y, tid / (bd.x * bd.y), tid / 32, tid % 32);
  return b;
}

inline const char* op_name(int op) {
  static const char* n[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync",
                            "__shfl_xor_sync", "__ballot/__any/__all_sync", "__syncwarp"};
  return op >= 0 && op <= 5 ? n[op] : "?";
}

// Where every thread of the current block is, grouped (for error reports).
inline std::string states_summary() {
  std::string s;
  const char* names[] = {"running", "at __syncthreads", "at a warp intrinsic", "exited"};
  unsigned n = g_block.n, i = 0;
  auto key = [&](unsigned t) {
    const ThreadInfo& a = g_block.info[t];
    int st = a.state.load(RLX);
    return std::make_tuple(st, st == AT_SYNC || st == AT_WARP ? a.file.load(RLX) : nullptr,
                           st == AT_SYNC || st == AT_WARP ? a.line.load(RLX) : 0u);
  };
  while (i < n) {
    auto k = key(i);
    unsigned j = i + 1;
    while (j < n && key(j) == k) ++j;
    char b[256];
    int st = std::get<0>(k);
    if (st == AT_SYNC || st == AT_WARP)
      snprintf(b, sizeof b, "\n    threads %u..%u: %s %s", i, j - 1, names[st],
               loc_str(std::get<1>(k), std::get<2>(k)).c_str());
    else
      snprintf(b, sizeof b, "\n    threads %u..%u: %s", i, j - 1, names[st]);
    s += b;
    i = j;
  }
  return s;
}

// Wakes every thread sleeping in a barrier or intrinsic (they then see g_failed).
inline void wake_all() {
  g_block.gen.fetch_add(1);
  g_block.gen.notify_all();
  unsigned nw = (g_block.n + 31) / 32;
  for (unsigned i = 0; i < nw && i < g_block.warps.size(); ++i) {
    g_block.warps[i]->gen.fetch_add(1);
    g_block.warps[i]->gen.notify_all();
  }
}

// Records the first error of the launch; every waiting thread then unwinds.
inline void fail(const std::string& msg) {
  {
    std::lock_guard<std::mutex> g(g_err_m);
    if (!g_failed.load()) {
      g_err = "EMU ERROR in " + block_str() + ": " + msg;
      g_failed.store(true);
    }
  }
  wake_all();
}

[[noreturn]] inline void fail_throw(const std::string& msg) {
  fail(msg);
  throw Abort{};
}

// ---- __syncthreads and friends
inline int block_barrier(int pred, const SrcLoc& loc) {
  Block& b = g_block;
  if (g_failed.load()) throw Abort{};
  unsigned tid = t_tid;
  b.info[tid].set(AT_SYNC, loc.file_name(), loc.line());
  uint32_t g = b.gen.load(std::memory_order_acquire);
  if (pred) b.count.fetch_add(1);
  unsigned a = b.arrived.fetch_add(1) + 1;
  // Returned threads are an error only while this barrier is still open: a thread
  // preempted after its arrival may run again after the barrier completed and other
  // threads legitimately returned.
  if (unsigned ex = b.exited.load(); ex && b.gen.load(std::memory_order_acquire) == g) {
    fail_throw(tid_str(tid) + " reached __syncthreads at " + loc_str(loc.file_name(), loc.line()) +
               " but " + std::to_string(ex) +
               " thread(s) of the block already returned: every thread must reach every "
               "__syncthreads (thread states:" + states_summary() + ")");
  }
  if (a == b.n) {  // the last to arrive: check that all met at the same call site
    for (unsigned i = 0; i < b.n; ++i) {
      const ThreadInfo& t = b.info[i];
      const char* f = t.file.load(RLX);
      unsigned l = t.line.load(RLX);
      if (l != loc.line() || f != loc.file_name()) {
        if (l == loc.line() && f && strcmp(f, loc.file_name()) == 0) continue;
        fail_throw("threads meet at different __syncthreads: " + tid_str(i) + " at " + loc_str(f, l) +
                   ", " + tid_str(tid) + " at " + loc_str(loc.file_name(), loc.line()) +
                   " (undefined in CUDA: every thread must reach the same __syncthreads)");
      }
    }
    b.last_count = b.count.exchange(0);
    b.arrived.store(0);
    g_progress.fetch_add(1, RLX);
    b.gen.fetch_add(1, std::memory_order_release);
    b.gen.notify_all();
  } else {
    while (b.gen.load(std::memory_order_acquire) == g) b.gen.wait(g, std::memory_order_acquire);
    if (g_failed.load()) throw Abort{};
  }
  b.info[tid].state.store(RUNNING, RLX);
  return b.last_count;
}

// ---- warp rendezvous
enum WarpOp : int { OP_SHFL = 0, OP_SHFL_UP, OP_SHFL_DOWN, OP_SHFL_XOR, OP_BALLOT, OP_SYNCWARP };

inline constexpr uint64_t POISON = 0x7fffdead7fffdeadull;

// All lanes of `mask` deposit `mine`; once all have, each calls read(vals, participants)
// and returns its result.
template <class Read>
inline auto warp_rendezvous(int op, unsigned mask, uint64_t mine, Read read, const SrcLoc& loc) {
  Block& b = g_block;
  if (g_failed.load()) throw Abort{};
  unsigned tid = t_tid, lane = tid % 32;
  uint32_t bit = 1u << lane;
  Warp& w = *b.warps[tid / 32];
  auto here = [&] { return std::string(op_name(op)) + " at " + loc_str(loc.file_name(), loc.line()); };
  if (!(mask & bit)) {
    char mb[16];
    snprintf(mb, sizeof mb, "0x%08x", mask);
    fail_throw(tid_str(tid) + " called " + here() + " with mask " + mb +
               " that does not contain its own lane (undefined in CUDA)");
  }
  uint32_t part = mask & w.existing;
  uint64_t d = ((uint64_t)(op + 1) << 32) | part;
  b.info[tid].set(AT_WARP, loc.file_name(), loc.line());
  uint32_t g = w.gen.load(std::memory_order_acquire);
  uint64_t cur = 0;
  if (w.desc.compare_exchange_strong(cur, d)) {
    w.file.store(loc.file_name(), RLX);
    w.line.store(loc.line(), RLX);
  } else if (cur != d) {
    char mb[160];
    snprintf(mb, sizeof mb, " (mask 0x%08x) while lanes 0x%08x wait in %s (mask 0x%08x) at ", part,
             w.arrived.load(), op_name((int)(cur >> 32) - 1), (uint32_t)cur);
    fail_throw("warp lanes disagree: " + tid_str(tid) + " called " + here() + mb +
               loc_str(w.file.load(RLX), w.line.load(RLX)) +
               " (every lane named in the mask must execute the same intrinsic with the same mask)");
  }
  w.vals[g & 1][lane] = mine;
  uint32_t prev = w.arrived.fetch_or(bit);
  // As for __syncthreads: exited lanes matter only while this round is still open.
  if (uint32_t ex = w.exited.load() & part; ex && w.gen.load(std::memory_order_acquire) == g) {
    char mb[64];
    snprintf(mb, sizeof mb, "mask 0x%08x names exited lanes 0x%08x", mask, ex);
    fail_throw(tid_str(tid) + " called " + here() + ": " + mb +
               " (a lane returned early; all named lanes must execute the intrinsic)");
  }
  if ((prev | bit) == part) {  // the last lane of the round
    w.arrived.store(0);
    w.desc.store(0);
    g_progress.fetch_add(1, RLX);
    w.gen.fetch_add(1, std::memory_order_release);
    w.gen.notify_all();
  } else {
    while (w.gen.load(std::memory_order_acquire) == g) w.gen.wait(g, std::memory_order_acquire);
    if (g_failed.load()) throw Abort{};
  }
  auto r = read(w.vals[g & 1], part);
  b.info[tid].state.store(RUNNING, RLX);
  return r;
}

template <class T>
inline uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8, "warp shuffle of a type wider than 8 bytes");
  uint64_t u = 0;
  memcpy(&u, &v, sizeof(T));
  return u;
}
template <class T>
inline T from_bits(uint64_t u) {
  T v;
  memcpy(&v, &u, sizeof(T));
  return v;
}

template <class T>
inline T shfl(int op, unsigned mask, T var, int arg, int width, const SrcLoc& loc) {
  if (width <= 0 || width > 32 || (width & (width - 1))) {
    fail_throw(std::string(op_name(op)) + " at " + loc_str(loc.file_name(), loc.line()) +
               ": width " + std::to_string(width) + " is not a power of two <= 32");
  }
  unsigned lane = t_tid % 32;
  int seg = lane & ~(width - 1);  // first lane of this lane's segment
  int src;
  switch (op) {
    case OP_SHFL: src = seg + (arg & (width - 1)); break;
    case OP_SHFL_UP: src = (int)lane - arg < seg ? (int)lane : (int)lane - arg; break;
    case OP_SHFL_DOWN:
      src = (int)(lane - seg) + arg >= width ? (int)lane : (int)lane + arg;
      break;
    default: {  // xor: a later segment returns the lane's own value
      int s = lane ^ (arg & 31);
      src = (s & ~(width - 1)) > seg ? (int)lane : s;
    }
  }
  uint64_t got = warp_rendezvous(op, mask, to_bits(var), [&](const uint64_t* vals, uint32_t part) {
    return ((part >> src) & 1u) ? vals[src] : POISON;
  }, loc);
  return from_bits<T>(got);
}

// ---- the thread pool and the launch
struct Worker {
  std::binary_semaphore go{0};
  std::thread th;
};

struct Pool {
  std::vector<std::unique_ptr<Worker>> workers;
  std::function<void()> job;  // the kernel call with its arguments bound
  std::atomic<unsigned> remaining{0};
  std::mutex done_m;
  std::condition_variable done_cv;
};
inline Pool* g_pool = nullptr;
inline std::mutex g_launch_m;

inline void thread_exit(unsigned tid) {
  Block& b = g_block;
  b.info[tid].state.store(EXITED, RLX);
  b.exited.fetch_add(1);
  if (unsigned a = b.arrived.load(); a > 0 && !g_failed.load()) {
    fail(tid_str(tid) + " returned while " + std::to_string(a) + " thread(s) wait at __syncthreads" +
         ": every thread must reach every __syncthreads (thread states:" + states_summary() + ")");
  }
  Warp& w = *b.warps[tid / 32];
  uint32_t bit = 1u << (tid % 32);
  w.exited.fetch_or(bit);
  uint32_t arr = w.arrived.load();
  uint64_t d = w.desc.load();
  if (arr && ((uint32_t)d & bit) && !(arr & bit) && !g_failed.load()) {
    char mb[160];
    snprintf(mb, sizeof mb, " returned while lanes 0x%08x wait for it in %s (mask 0x%08x) at ", arr,
             op_name((int)(d >> 32) - 1), (uint32_t)d);
    fail(tid_str(tid) + mb + loc_str(w.file.load(RLX), w.line.load(RLX)) +
         " (all named lanes must execute the intrinsic)");
  }
  g_progress.fetch_add(1, RLX);
}

// Under a sanitizer, its report of a bad access is followed by the CUDA coordinates of
// the thread that made it (the callback runs in the failing thread).
inline thread_local bool t_in_kernel = false;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
}  // namespace emu
extern "C" void __sanitizer_set_death_callback(void (*)(void));
namespace emu {
inline void death_callback() {
  if (t_in_kernel)
    fprintf(stderr, "EMU: the failing thread is blockIdx (%u,%u,%u) threadIdx (%u,%u,%u)\n", blockIdx.x,
            blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z);
}
inline int g_death_callback_set = (__sanitizer_set_death_callback(death_callback), 0);
#endif

inline void worker_main(Pool* p, Worker* me, unsigned tid) {
  for (;;) {
    me->go.acquire();
    t_tid = tid;
    try {
      p->job();
    } catch (const Abort&) {
      t_in_kernel = false;
    }
    thread_exit(tid);
    if (p->remaining.fetch_sub(1) == 1) {
      std::lock_guard<std::mutex> g(p->done_m);
      p->done_cv.notify_all();
    }
  }
}

inline void ensure_workers(unsigned n) {
  if (!g_pool) g_pool = new Pool();  // never freed: the threads live as long as the process
  while (g_pool->workers.size() < n) {
    auto w = std::make_unique<Worker>();
    unsigned tid = (unsigned)g_pool->workers.size();
    w->th = std::thread(worker_main, g_pool, w.get(), tid);
    w->th.detach();
    g_pool->workers.push_back(std::move(w));
  }
}

inline std::string last_error() {
  std::lock_guard<std::mutex> g(g_err_m);
  return g_err;
}

// What is waiting on what, for a deadlock report.
inline std::string deadlock_report() {
  Block& b = g_block;
  std::string s;
  if (unsigned a = b.arrived.load())
    s += "\n    " + std::to_string(a) + " of " + std::to_string(b.n) + " threads wait at __syncthreads";
  unsigned nw = (b.n + 31) / 32;
  for (unsigned i = 0; i < nw; ++i) {
    Warp& w = *b.warps[i];
    uint32_t arr = w.arrived.load();
    uint64_t d = w.desc.load();
    if (arr && d) {
      char mb[200];
      snprintf(mb, sizeof mb, "\n    warp %u: lanes 0x%08x of mask 0x%08x wait in %s at ", i, arr,
               (uint32_t)d, op_name((int)(d >> 32) - 1));
      s += mb + loc_str(w.file.load(RLX), w.line.load(RLX)) + " (missing lanes 0x";
      snprintf(mb, sizeof mb, "%08x)", (uint32_t)d & ~arr);
      s += mb;
    }
  }
  return s;
}

template <class... P, class... A>
inline int launch(void (*kernel)(P...), dim3 grid, dim3 block, A... args) {
  std::lock_guard<std::mutex> launch_guard(g_launch_m);  // one launch (so one block) at a time
  {
    std::lock_guard<std::mutex> g(g_err_m);
    g_err.clear();
    g_failed.store(false);
  }
  char buf[256];
  unsigned long long nt = (unsigned long long)block.x * block.y * block.z;
  if (block.x == 0 || block.y == 0 || block.z == 0 || nt > 1024 || block.z > 64 || grid.x == 0 ||
      grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535) {
    snprintf(buf, sizeof buf,
             "EMU ERROR: invalid launch configuration grid (%u,%u,%u) block (%u,%u,%u) "
             "(cudaErrorInvalidConfiguration on a GPU)",
             grid.x, grid.y, grid.z, block.x, block.y, block.z);
    std::lock_guard<std::mutex> g(g_err_m);
    g_err = buf;
    g_failed.store(true);
    fprintf(stderr, "%s\n", buf);
    return 1;
  }
  unsigned n = (unsigned)nt;
  ensure_workers(n);
  Block& b = g_block;
  b.n = n;
  if (b.info_n < n) {
    b.info.reset(new ThreadInfo[n]);
    b.info_n = n;
  }
  unsigned nw = (n + 31) / 32;
  while (b.warps.size() < nw) b.warps.push_back(std::make_unique<Warp>());
  const char* order = getenv("EMU_BLOCK_ORDER");
  const bool reverse = order && strcmp(order, "reverse") == 0;
  unsigned long long total = (unsigned long long)grid.x * grid.y * grid.z;
  for (unsigned long long bi = 0; bi < total && !g_failed.load(); ++bi) {
    unsigned long long lin = reverse ? total - 1 - bi : bi;
    uint3 bidx{(unsigned)(lin % grid.x), (unsigned)((lin / grid.x) % grid.y),
               (unsigned)(lin / ((unsigned long long)grid.x * grid.y))};
    b.idx = bidx;
    b.arrived.store(0);
    b.exited.store(0);
    b.count.store(0);
    b.last_count = 0;
    for (unsigned i = 0; i < n; ++i) b.info[i].set(RUNNING, nullptr, 0);
    for (unsigned wi = 0; wi < nw; ++wi) {
      unsigned lanes = std::min(32u, n - wi * 32);
      b.warps[wi]->reset(lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1));
    }
    g_pool->job = [&, bidx] {
      unsigned tid = t_tid;
      threadIdx = uint3{tid % block.x, (tid / block.x) % block.y, tid / (block.x * block.y)};
      blockIdx = bidx;
      blockDim = block;
      gridDim = grid;
      t_in_kernel = true;
      kernel(args...);
      t_in_kernel = false;
    };
    g_pool->remaining.store(n);
    for (unsigned i = 0; i < n; ++i) g_pool->workers[i]->go.release();
    // Wait for the block, acting as the watchdog: no barrier/intrinsic completion and no
    // thread exit for EMU_TIMEOUT seconds is a deadlock.
    std::unique_lock<std::mutex> lk(g_pool->done_m);
    uint64_t seen = g_progress.load();
    auto last = Clock::now(), failed_at = Clock::time_point{};
    while (g_pool->remaining.load() != 0) {
      g_pool->done_cv.wait_for(lk, std::chrono::milliseconds(20));
      if (g_pool->remaining.load() == 0) break;
      auto now = Clock::now();
      if (g_failed.load()) {
        wake_all();  // again, for threads that went to sleep after the error
        if (failed_at == Clock::time_point{}) failed_at = now;
        if (std::chrono::duration<double>(now - failed_at).count() > timeout_s() + 5) {
          fprintf(stderr,
                  "EMU FATAL in %s: %u thread(s) still running %.0f s after an error (endless "
                  "loop?); thread states:%s\n%s\n",
                  block_str().c_str(), g_pool->remaining.load(), timeout_s() + 5,
                  states_summary().c_str(), last_error().c_str());
          fflush(stderr);
          _exit(70);
        }
        continue;
      }
      uint64_t p = g_progress.load();
      if (p != seen) {
        seen = p;
        last = now;
      } else if (std::chrono::duration<double>(now - last).count() > timeout_s()) {
        char tb[64];
        snprintf(tb, sizeof tb, "%.1f", timeout_s());
        fail(std::string("deadlock: no barrier or warp intrinsic completed and no thread returned for ") +
             tb + " s (EMU_TIMEOUT):" + deadlock_report() + "\n  thread states:" + states_summary());
      }
    }
  }
  if (g_failed.load()) {
    fprintf(stderr, "%s\n", last_error().c_str());
    fflush(stderr);
    return 1;
  }
  return 0;
}

}  // namespace emu

template <class... P, class... A>
inline int emu_launch(void (*kernel)(P...), dim3 grid, dim3 block, A... args) {
  return emu::launch(kernel, grid, block, args...);
}

// Deadlock-detection timeout in seconds (EMU_TIMEOUT in the environment sets the default).
extern "C" void emu_set_timeout(double s) {
  if (s > 0) emu::g_timeout = s;
}

extern "C" const char* emu_last_error_cstr() {
  static std::string keep;
  keep = emu::last_error();
  return keep.c_str();
}

// ---------------------------------------------------------------- barriers, warp ops
inline void __syncthreads(const std::source_location loc = std::source_location::current()) {
  emu::block_barrier(0, loc);
}
inline int __syncthreads_count(int p, const std::source_location loc = std::source_location::current()) {
  return emu::block_barrier(p, loc);
}
inline int __syncthreads_and(int p, const std::source_location loc = std::source_location::current()) {
  return emu::block_barrier(p, loc) == (int)emu::g_block.n;
}
inline int __syncthreads_or(int p, const std::source_location loc = std::source_location::current()) {
  return emu::block_barrier(p, loc) != 0;
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }

template <class T>
inline T __shfl_sync(unsigned mask, T var, int srcLane, int width = 32,
                     const std::source_location loc = std::source_location::current()) {
  return emu::shfl(emu::OP_SHFL, mask, var, srcLane, width, loc);
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32,
                        const std::source_location loc = std::source_location::current()) {
  return emu::shfl(emu::OP_SHFL_UP, mask, var, (int)delta, width, loc);
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32,
                          const std::source_location loc = std::source_location::current()) {
  return emu::shfl(emu::OP_SHFL_DOWN, mask, var, (int)delta, width, loc);
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = 32,
                         const std::source_location loc = std::source_location::current()) {
  return emu::shfl(emu::OP_SHFL_XOR, mask, var, laneMask, width, loc);
}
inline unsigned __ballot_sync(unsigned mask, int pred,
                              const std::source_location loc = std::source_location::current()) {
  return emu::warp_rendezvous(emu::OP_BALLOT, mask, pred ? 1 : 0, [](const uint64_t* v, uint32_t part) {
    unsigned r = 0;
    for (int i = 0; i < 32; ++i)
      if (((part >> i) & 1u) && v[i]) r |= 1u << i;
    return r;
  }, loc);
}
inline int __any_sync(unsigned mask, int pred, const std::source_location loc = std::source_location::current()) {
  return __ballot_sync(mask, pred, loc) != 0;
}
inline int __all_sync(unsigned mask, int pred, const std::source_location loc = std::source_location::current()) {
  unsigned part = mask & emu::g_block.warps[emu::t_tid / 32]->existing;
  return __ballot_sync(mask, pred, loc) == part;
}
inline void __syncwarp(unsigned mask = 0xffffffffu,
                       const std::source_location loc = std::source_location::current()) {
  emu::warp_rendezvous(emu::OP_SYNCWARP, mask, 0, [](const uint64_t*, uint32_t) { return 0; }, loc);
}
inline unsigned __activemask() {
  emu::Warp& w = *emu::g_block.warps[emu::t_tid / 32];
  return w.existing & ~w.exited.load();
}

// ---------------------------------------------------------------- math and bit intrinsics
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __exp10f(float x) { return powf(10.0f, x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline void __sincosf(float x, float* s, float* c) { *s = sinf(x); *c = cosf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : (x == x ? x : 0.0f)); }
inline float __int2float_rn(int x) { return (float)x; }
inline float __uint2float_rn(unsigned x) { return (float)x; }
inline int __float2int_rn(float x) { return (int)lrintf(x); }
inline int __float2int_rz(float x) { return (int)x; }
inline int __float2int_rd(float x) { return (int)floorf(x); }
inline int __float2int_ru(float x) { return (int)ceilf(x); }
inline unsigned __float2uint_rn(float x) { return (unsigned)llrintf(x); }
inline unsigned __float2uint_rz(float x) { return (unsigned)x; }

inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline long long __double_as_longlong(double x) { return std::bit_cast<long long>(x); }
inline double __longlong_as_double(long long x) { return std::bit_cast<double>(x); }

inline int __popc(unsigned x) { return std::popcount(x); }
inline int __popcll(unsigned long long x) { return std::popcount(x); }
inline int __clz(int x) { return std::countl_zero((unsigned)x); }
inline int __clzll(long long x) { return std::countl_zero((unsigned long long)x); }
inline int __ffs(int x) { return x ? std::countr_zero((unsigned)x) + 1 : 0; }
inline int __ffsll(long long x) { return x ? std::countr_zero((unsigned long long)x) + 1 : 0; }
inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  unsigned long long v = ((unsigned long long)y << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
inline int __mul24(int a, int b) { return ((a << 8) >> 8) * ((b << 8) >> 8); }
inline unsigned __umul24(unsigned a, unsigned b) { return (a & 0xffffff) * (b & 0xffffff); }

inline int __dp4a(int a, int b, int c) {
  int s = c;
  for (int i = 0; i < 4; ++i) s += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
  return s;
}
inline unsigned __dp4a(unsigned a, unsigned b, unsigned c) {
  unsigned s = c;
  for (int i = 0; i < 4; ++i) s += ((a >> (8 * i)) & 0xff) * ((b >> (8 * i)) & 0xff);
  return s;
}
inline int __dp4a(char4 a, char4 b, int c) {
  return __dp4a(std::bit_cast<int>(a), std::bit_cast<int>(b), c);
}

// CUDA's min/max overloads (NVRTC provides them without headers).
#define EMU_MINMAX(T)                                   \
  inline T min(T a, T b) { return a < b ? a : b; }      \
  inline T max(T a, T b) { return a > b ? a : b; }
EMU_MINMAX(int)
EMU_MINMAX(unsigned)
EMU_MINMAX(long)
EMU_MINMAX(unsigned long)
EMU_MINMAX(long long)
EMU_MINMAX(unsigned long long)
#undef EMU_MINMAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
// mixed signedness: CUDA converts to unsigned, as the usual arithmetic conversions do
inline unsigned min(int a, unsigned b) { return min((unsigned)a, b); }
inline unsigned min(unsigned a, int b) { return min(a, (unsigned)b); }
inline unsigned max(int a, unsigned b) { return max((unsigned)a, b); }
inline unsigned max(unsigned a, int b) { return max(a, (unsigned)b); }
inline unsigned long long min(long long a, unsigned long long b) { return min((unsigned long long)a, b); }
inline unsigned long long min(unsigned long long a, long long b) { return min(a, (unsigned long long)b); }
inline unsigned long long max(long long a, unsigned long long b) { return max((unsigned long long)a, b); }
inline unsigned long long max(unsigned long long a, long long b) { return max(a, (unsigned long long)b); }
inline unsigned umin(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned umax(unsigned a, unsigned b) { return a > b ? a : b; }

template <class T>
inline T __ldg(const T* p) { return *p; }

// Atomics (only one block runs at a time, so these only contend within a block).
template <class T>
inline T atomicAdd(T* p, T v) { return std::atomic_ref<T>(*p).fetch_add(v); }
inline float atomicAdd(float* p, float v) {
  std::atomic_ref<float> a(*p);
  float old = a.load();
  while (!a.compare_exchange_weak(old, old + v)) {}
  return old;
}
template <class T>
inline T atomicSub(T* p, T v) { return std::atomic_ref<T>(*p).fetch_sub(v); }
template <class T>
inline T atomicExch(T* p, T v) { return std::atomic_ref<T>(*p).exchange(v); }
template <class T>
inline T atomicCAS(T* p, T cmp, T v) {
  std::atomic_ref<T>(*p).compare_exchange_strong(cmp, v);
  return cmp;
}
template <class T>
inline T atomicMax(T* p, T v) {
  std::atomic_ref<T> a(*p);
  T old = a.load();
  while (old < v && !a.compare_exchange_weak(old, v)) {}
  return old;
}
template <class T>
inline T atomicMin(T* p, T v) {
  std::atomic_ref<T> a(*p);
  T old = a.load();
  while (old > v && !a.compare_exchange_weak(old, v)) {}
  return old;
}
template <class T>
inline T atomicOr(T* p, T v) { return std::atomic_ref<T>(*p).fetch_or(v); }
template <class T>
inline T atomicAnd(T* p, T v) { return std::atomic_ref<T>(*p).fetch_and(v); }

// ---------------------------------------------------------------- host buffers
// Exactly-sized, 256-byte aligned (cudaMalloc's alignment), so ASan flags any access
// past the end and misaligned-pointer bugs show up as they would on the GPU.
extern "C" void* emu_alloc(unsigned long long bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, 256, bytes ? bytes : 1) != 0) return nullptr;
  return p;
}
extern "C" void emu_free(void* p) { free(p); }
