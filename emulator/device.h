// The kernel side of kiln's emulated CUDA device: CUDA C's built-in variables, types and
// intrinsics for a host C++ compiler, and a scheduler that runs a launch's threads.
//
// Each block's threads run as cooperative fibers on the launching OS thread, so
// `__syncthreads()` and warp shuffles are real rendezvous points: a thread that reaches one
// waits (yields) until every live thread of its block (or warp) has reached it. Kernels that
// use neither run their threads one after another without fibers. A barrier that can never
// complete (threads of a block that wait at different barriers) is reported as a failed
// launch instead of hanging.
#pragma once
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>

// libm, declared rather than included: <math.h> in C++ mode costs more compile time than a
// whole kernel, and every fused kernel is compiled on its own.
extern "C" {
#define KEMU_MATH(name) float name##f(float); double name(double);
KEMU_MATH(fabs) KEMU_MATH(sqrt) KEMU_MATH(exp) KEMU_MATH(log) KEMU_MATH(sin) KEMU_MATH(cos) KEMU_MATH(tan)
KEMU_MATH(tanh) KEMU_MATH(erf) KEMU_MATH(erfc) KEMU_MATH(floor) KEMU_MATH(ceil) KEMU_MATH(rint)
#undef KEMU_MATH
float powf(float, float); double pow(double, double);
float fmodf(float, float); double fmod(double, double);
float fmaxf(float, float); double fmax(double, double);
float fminf(float, float); double fmin(double, double);
float ldexpf(float, int); double ldexp(double, int);
float nextafterf(float, float);
}

struct kemu_dim3 {
  unsigned x, y, z;
};
static thread_local kemu_dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __launch_bounds__(...)
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
// Shared memory: one copy per OS thread, and a launch's blocks run one after another on it.
#define __shared__ static thread_local
#define KILN_HOST_EMULATION 1

struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) ushort4 { unsigned short x, y, z, w; };
struct alignas(4) uchar4 { unsigned char x, y, z, w; };
struct alignas(4) char4 { signed char x, y, z, w; };

static inline float __int_as_float(int v) { float f; memcpy(&f, &v, 4); return f; }
static inline float __uint_as_float(unsigned v) { float f; memcpy(&f, &v, 4); return f; }
static inline int __float_as_int(float f) { int v; memcpy(&v, &f, 4); return v; }
static inline double __longlong_as_double(long long v) { double d; memcpy(&d, &v, 8); return d; }
static inline long long __double_as_longlong(double d) { long long v; memcpy(&v, &d, 8); return v; }
static inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
static inline float __double2float_rz(double x) {
  float f = (float)x;
  if (fabs((double)f) > fabs(x)) f = nextafterf(f, 0.0f);
  return f;
}

// The 16-bit float conversions the generated prelude does with PTX `cvt` (round to nearest
// even, NaN kept quiet, overflow to infinity).
static inline float k_h2f(unsigned short h) {
  unsigned sign = (unsigned)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0);
  } else if (exp == 0) {
    float f = ldexpf((float)man, -24);
    return sign ? -f : f;
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  return __uint_as_float(bits);
}
static inline unsigned short k_f2h(float f) {
  unsigned bits = (unsigned)__float_as_int(f), sign = (bits >> 16) & 0x8000;
  unsigned exp = (bits >> 23) & 0xff, man = bits & 0x7fffff;
  if (exp == 0xff) return (unsigned short)(sign | 0x7c00 | (man ? 0x200 | (man >> 13) : 0));
  float a = fabsf(f);
  if (a >= 65520.0f) return (unsigned short)(sign | 0x7c00);
  if (a < 6.103515625e-05f) {  // subnormal half: a multiple of 2^-24, rounded to even
    float q = rintf(a * 16777216.0f);
    return (unsigned short)(sign | (unsigned)q);
  }
  // Normal: round the 23-bit mantissa to 10 bits, to nearest even; a carry bumps the exponent.
  unsigned e = exp - 112, m = man >> 13, rest = man & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (m & 1))) m++;
  unsigned h = (e << 10) + m;
  return (unsigned short)(sign | h);
}
static inline float k_b2f(unsigned short b) { return __uint_as_float(((unsigned)b) << 16); }
static inline unsigned short k_f2b(float f) {
  unsigned bits = (unsigned)__float_as_int(f);
  if ((bits & 0x7fffffff) > 0x7f800000) return (unsigned short)((bits >> 16) | 0x40);
  unsigned rounding = 0x7fff + ((bits >> 16) & 1);
  return (unsigned short)((bits + rounding) >> 16);
}

// Atomics: a launch runs on one OS thread, so plain read-modify-writes are atomic here.
static inline long long atomicMin(long long* p, long long v) { long long o = *p; if (v < o) *p = v; return o; }
static inline unsigned long long atomicMin(unsigned long long* p, unsigned long long v) { unsigned long long o = *p; if (v < o) *p = v; return o; }
static inline int atomicMin(int* p, int v) { int o = *p; if (v < o) *p = v; return o; }
static inline double atomicAdd(double* p, double v) { double o = *p; *p = o + v; return o; }
static inline float atomicAdd(float* p, float v) { float o = *p; *p = o + v; return o; }
static inline long long atomicAdd(long long* p, long long v) { long long o = *p; *p = (long long)((unsigned long long)o + (unsigned long long)v); return o; }
static inline int atomicAdd(int* p, int v) { int o = *p; *p = (int)((unsigned)o + (unsigned)v); return o; }
static inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long c, unsigned long long v) { unsigned long long o = *p; if (o == c) *p = v; return o; }

namespace kemu {

enum { MAX_THREADS = 1024, STACK = 64 * 1024 };

// Switching fibers. glibc's `swapcontext` saves and restores the signal mask with a system
// call at every switch, which made that call most of the run time of a barrier-heavy
// launch. On x86-64 a switch here saves only what the calling convention asks a callee to
// keep (rbx, rbp, r12-r15, and MXCSR's and the x87 unit's control words) and swaps stacks;
// elsewhere `ucontext` does it.
#if defined(__x86_64__)
// kemu_switch(save, to): pushes the callee-saved state, stores the stack pointer in *save,
// loads `to` as the stack pointer and pops the state saved there. The symbol is local to
// each compiled kernel.
asm(R"(
  .text
  .p2align 4
  .type kemu_switch, @function
kemu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size kemu_switch, .-kemu_switch
)");
extern "C" void kemu_switch(void** save, void* to);
struct Context {
  void* sp;
};
#else
struct Context {
  ucontext_t uc;
};
#endif

struct Fiber {
  Context ctx;
  unsigned tid;
  bool done;
};

struct Block {
  Fiber fibers[MAX_THREADS];
  char* stacks = nullptr;
  unsigned threads = 0, live = 0;
  // Block barrier and one barrier per warp: arrivals and a generation that a completed
  // barrier advances. `progress` counts arrivals and exits, for deadlock detection.
  unsigned arrived = 0, generation = 0;
  unsigned warp_arrived[32] = {}, warp_generation[32] = {}, warp_live[32] = {};
  unsigned long long progress = 0;
  unsigned long long slots[32][32];
  bool deadlock = false;
};

static thread_local Block* block;
static thread_local Fiber* current;
static thread_local Context scheduler;
static thread_local void (*body)(void*);
static thread_local void* closure;

// Saves the running context in `from` and resumes `to`.
static inline void switch_context(Context* from, Context* to) {
#if defined(__x86_64__)
  kemu_switch(&from->sp, to->sp);
#else
  swapcontext(&from->uc, &to->uc);
#endif
}

static inline void yield() { switch_context(&current->ctx, &scheduler); }

static inline void wait_until(const unsigned* generation, unsigned seen) {
  while (*generation == seen) {
    yield();
    if (block->deadlock) {
      // Unwinding is not possible across fibers: park this thread until the launch ends.
      for (;;) yield();
    }
  }
}

static inline void sync_block() {
  Block* b = block;
  unsigned seen = b->generation;
  b->progress++;
  if (++b->arrived == b->live) {
    b->arrived = 0;
    b->generation++;
    return;
  }
  wait_until(&b->generation, seen);
}

static inline void sync_warp() {
  Block* b = block;
  unsigned w = threadIdx.x / 32, seen = b->warp_generation[w];
  b->progress++;
  if (++b->warp_arrived[w] == b->warp_live[w]) {
    b->warp_arrived[w] = 0;
    b->warp_generation[w]++;
    return;
  }
  wait_until(&b->warp_generation[w], seen);
}

// A thread that finishes may complete the barriers the others wait at.
static inline void exit_thread() {
  Block* b = block;
  unsigned w = current->tid / 32;
  b->progress++;
  b->live--;
  b->warp_live[w]--;
  if (b->arrived > 0 && b->arrived == b->live) {
    b->arrived = 0;
    b->generation++;
  }
  if (b->warp_arrived[w] > 0 && b->warp_arrived[w] == b->warp_live[w]) {
    b->warp_arrived[w] = 0;
    b->warp_generation[w]++;
  }
}

static void fiber_main() {
  body(closure);
  exit_thread();
  current->done = true;
  switch_context(&current->ctx, &scheduler);
}

// Makes `f` start at `fiber_main` on `stack` when first switched to.
static inline void start_fiber(Fiber* f, char* stack, size_t size) {
#if defined(__x86_64__)
  // What kemu_switch pops: the control words, six registers (zero), then the address its
  // `ret` enters fiber_main at. That leaves the stack as a call leaves it: the return
  // address's slot (0: fiber_main never returns) on a 16-byte boundary.
  uint64_t* top = (uint64_t*)((uintptr_t)(stack + size) & ~(uintptr_t)15);
  uint64_t* sp = top - 9;
  uint32_t mxcsr;
  uint16_t fpucw;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  sp[0] = (uint64_t)mxcsr | ((uint64_t)fpucw << 32);
  for (int r = 1; r <= 6; r++) sp[r] = 0;
  sp[7] = (uint64_t)(uintptr_t)&fiber_main;
  sp[8] = 0;
  f->ctx.sp = sp;
#else
  getcontext(&f->ctx.uc);
  f->ctx.uc.uc_stack.ss_sp = stack;
  f->ctx.uc.uc_stack.ss_size = size;
  f->ctx.uc.uc_link = nullptr;
  makecontext(&f->ctx.uc, fiber_main, 0);
#endif
}

// Runs one launch: `fn(env)` once per thread of every block. Returns 0, or 1 when a block's
// threads deadlocked at barriers (reported on stderr), or 2 for a bad configuration.
static inline int launch(const unsigned grid[3], const unsigned blk[3], bool cooperative,
                         void (*fn)(void*), void* env, const char* name) {
  unsigned long long threads = (unsigned long long)blk[0] * blk[1] * blk[2];
  if (threads == 0 || threads > MAX_THREADS || grid[0] == 0 || grid[1] == 0 || grid[2] == 0) {
    fprintf(stderr, "kiln emulator: %s launched with %u x %u x %u blocks of %u x %u x %u threads\n",
            name, grid[0], grid[1], grid[2], blk[0], blk[1], blk[2]);
    return 2;
  }
  if (blk[1] != 1 || blk[2] != 1) {
    fprintf(stderr, "kiln emulator: %s: only 1-D blocks are emulated\n", name);
    return 2;
  }
  gridDim = {grid[0], grid[1], grid[2]};
  blockDim = {blk[0], blk[1], blk[2]};
  body = fn;
  closure = env;
  // A GPU runs blocks (and the threads of a block) in no fixed order: every other launch runs
  // them last to first, so results that depend on the order differ between runs of a test.
  // KILN_EMULATOR_ORDER=forward keeps them in order.
  static unsigned long long launches = 0;
  static const char* order = getenv("KILN_EMULATOR_ORDER");
  bool reverse = (launches++ & 1) && !(order && strcmp(order, "forward") == 0);
  auto nth = [reverse](unsigned i, unsigned n) { return reverse ? n - 1 - i : i; };
  if (!cooperative) {
    for (unsigned bz = 0; bz < grid[2]; bz++)
      for (unsigned by = 0; by < grid[1]; by++)
        for (unsigned i = 0; i < grid[0]; i++) {
          blockIdx = {nth(i, grid[0]), by, bz};
          for (unsigned t = 0; t < threads; t++) {
            threadIdx = {nth(t, (unsigned)threads), 0, 0};
            fn(env);
          }
        }
    return 0;
  }
  static thread_local Block* storage;
  if (!storage) {
    storage = new Block();
    storage->stacks = (char*)mmap(nullptr, (size_t)MAX_THREADS * STACK, PROT_READ | PROT_WRITE,
                                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (storage->stacks == MAP_FAILED) {
      fprintf(stderr, "kiln emulator: no memory for fiber stacks\n");
      return 2;
    }
  }
  Block* b = storage;
  block = b;
  for (unsigned bz = 0; bz < grid[2]; bz++)
    for (unsigned by = 0; by < grid[1]; by++)
      for (unsigned i = 0; i < grid[0]; i++) {
        unsigned bx = nth(i, grid[0]);
        blockIdx = {bx, by, bz};
        b->threads = b->live = (unsigned)threads;
        b->arrived = 0;
        b->deadlock = false;
        for (unsigned w = 0; w < 32; w++) {
          b->warp_arrived[w] = 0;
          unsigned first = w * 32;
          b->warp_live[w] = first >= threads ? 0 : (threads - first < 32 ? threads - first : 32);
        }
        for (unsigned t = 0; t < threads; t++) {
          Fiber* f = &b->fibers[t];
          f->tid = t;
          f->done = false;
          start_fiber(f, b->stacks + (size_t)t * STACK, STACK);
        }
        // Round robin until every thread has finished; a whole round in which no thread
        // arrives anywhere or exits means the remaining ones wait forever.
        while (b->live > 0) {
          unsigned long long before = b->progress;
          for (unsigned i = 0; i < threads; i++) {
            unsigned t = nth(i, (unsigned)threads);
            Fiber* f = &b->fibers[t];
            if (f->done) continue;
            current = f;
            threadIdx = {t, 0, 0};
            switch_context(&scheduler, &f->ctx);
          }
          if (b->live > 0 && b->progress == before) {
            if (b->deadlock) {
              fprintf(stderr,
                      "kiln emulator: %s: block (%u, %u, %u): %u threads wait at barriers the "
                      "others never reach\n",
                      name, bx, by, bz, b->live);
              return 1;
            }
            b->deadlock = true;  // one more round lets parked threads see it
          }
        }
      }
  return 0;
}

// `v` of lane `from` of this thread's warp: every live thread of the warp publishes its value,
// then reads; a lane outside the warp (or past the block's last thread) reads its own.
template <class T>
static inline T shfl_from(T v, long from) {
  Block* b = block;
  unsigned lane = threadIdx.x % 32, w = threadIdx.x / 32;
  unsigned long long bits = 0;
  memcpy(&bits, &v, sizeof(T));
  b->slots[w][lane] = bits;
  sync_warp();
  T r = v;
  if (from >= 0 && from < 32 && w * 32 + (unsigned)from < b->threads)
    memcpy(&r, &b->slots[w][from], sizeof(T));
  sync_warp();
  return r;
}

template <class T>
static inline T shfl_down(T v, int delta) {
  return shfl_from(v, (long)(threadIdx.x % 32) + delta);
}

template <class T>
static inline T shfl_up(T v, int delta) {
  return shfl_from(v, (long)(threadIdx.x % 32) - delta);
}

template <class T>
static inline T shfl_xor(T v, int mask) {
  return shfl_from(v, (long)((threadIdx.x % 32) ^ (unsigned)mask));
}

}  // namespace kemu

static inline void __syncthreads() { kemu::sync_block(); }
template <class T>
static inline T __shfl_up_sync(unsigned, T v, int delta) { return kemu::shfl_up(v, delta); }
template <class T>
static inline T __shfl_down_sync(unsigned, T v, int delta) { return kemu::shfl_down(v, delta); }
template <class T>
static inline T __shfl_xor_sync(unsigned, T v, int mask) { return kemu::shfl_xor(v, mask); }
