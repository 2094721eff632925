// libcublas.so of kiln's emulated CUDA device: handles and cublasGemmStridedBatchedEx, with
// cuBLAS's column-major conventions and argument checks, computed with plain loops (f64
// accumulation for f64, f32 for the rest, as CUBLAS_COMPUTE_32F does). A handle belongs to
// the device current when it was created: calls made with another device current, or on
// another device's memory, fail (the emulated driver says which device owns what).
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <initializer_list>

typedef int cublasStatus_t;
enum {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum { CUDA_R_32F = 0, CUDA_R_64F = 1, CUDA_R_16F = 2, CUDA_R_16BF = 14 };
enum { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_64F = 70 };
enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };

struct Handle {
  void* stream;
  int device;
};

// From the emulated libcuda.so (this library links against it).
extern "C" int kiln_emulator_current_device();
extern "C" int kiln_emulator_device_of(unsigned long long p);
extern "C" int kiln_emulator_enqueue(void* stream, void (*run)(void*), void* data,
                                     void (*drop)(void*));

static float half_to_float(uint16_t h) {
  unsigned sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float v = exp == 0 ? ldexpf((float)man, -24)
            : exp == 31 ? (man ? NAN : INFINITY)
                        : ldexpf((float)(man | 0x400), (int)exp - 25);
  return sign ? -v : v;
}
static uint16_t float_to_half(float f) {
  // Through the emulated device's own conversion rules: round to nearest even.
  uint32_t bits;
  memcpy(&bits, &f, 4);
  uint32_t sign = (bits >> 16) & 0x8000, exp = (bits >> 23) & 0xff, man = bits & 0x7fffff;
  if (exp == 0xff) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
  float a = fabsf(f);
  if (a >= 65520.0f) return (uint16_t)(sign | 0x7c00);
  if (a < 6.103515625e-05f) return (uint16_t)(sign | (uint32_t)rintf(a * 16777216.0f));
  uint32_t e = exp - 112, m = man >> 13, rest = man & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (m & 1))) m++;
  return (uint16_t)(sign | ((e << 10) + m));
}
static float bf16_to_float(uint16_t b) {
  uint32_t bits = (uint32_t)b << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}
static uint16_t float_to_bf16(float f) {
  uint32_t bits;
  memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffff) > 0x7f800000) return (uint16_t)((bits >> 16) | 0x40);
  return (uint16_t)((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}

static double get(const void* p, int type, long long i) {
  switch (type) {
    case CUDA_R_32F: return ((const float*)p)[i];
    case CUDA_R_64F: return ((const double*)p)[i];
    case CUDA_R_16F: return half_to_float(((const uint16_t*)p)[i]);
    default: return bf16_to_float(((const uint16_t*)p)[i]);
  }
}
static void put(void* p, int type, long long i, double v) {
  switch (type) {
    case CUDA_R_32F: ((float*)p)[i] = (float)v; break;
    case CUDA_R_64F: ((double*)p)[i] = v; break;
    case CUDA_R_16F: ((uint16_t*)p)[i] = float_to_half((float)v); break;
    default: ((uint16_t*)p)[i] = float_to_bf16((float)v); break;
  }
}

static cublasStatus_t invalid(const char* why) {
  fprintf(stderr, "kiln emulator: cublasGemmStridedBatchedEx: %s\n", why);
  return CUBLAS_STATUS_INVALID_VALUE;
}

// One call's arguments, kept until it runs (at once, or in each launch of a captured graph).
struct Gemm {
  int ta, tb, m, n, k;
  const void* A;
  int at, lda;
  long long sa;
  const void* B;
  int bt, ldb;
  long long sb;
  void* C;
  int ct, ldc;
  long long sc;
  int batch;
  bool f64;
  double al, be;
};

static void run_gemm(void* data) {
  const Gemm& g = *(const Gemm*)data;
  for (long long b = 0; b < g.batch; b++)
    for (int j = 0; j < g.n; j++)
      for (int i = 0; i < g.m; i++) {
        double acc64 = 0;
        float acc32 = 0;
        for (int l = 0; l < g.k; l++) {
          long long ai = g.ta == CUBLAS_OP_N ? i + (long long)l * g.lda : l + (long long)i * g.lda;
          long long bi = g.tb == CUBLAS_OP_N ? l + (long long)j * g.ldb : j + (long long)l * g.ldb;
          double x = get(g.A, g.at, b * g.sa + ai), y = get(g.B, g.bt, b * g.sb + bi);
          if (g.f64) acc64 += x * y;
          else acc32 += (float)x * (float)y;
        }
        long long ci = b * g.sc + i + (long long)j * g.ldc;
        double acc = g.f64 ? acc64 : (double)acc32;
        double v = g.be == 0 ? g.al * acc : g.al * acc + g.be * get(g.C, g.ct, ci);
        if (!g.f64) v = (float)v;
        put(g.C, g.ct, ci, v);
      }
}

static void drop_gemm(void* data) { delete (Gemm*)data; }

extern "C" {

cublasStatus_t cublasCreate_v2(Handle** h) {
  int device = kiln_emulator_current_device();
  if (device < 0) return CUBLAS_STATUS_NOT_INITIALIZED;
  *h = new Handle{nullptr, device};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(Handle* h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(Handle* h, void* s) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(Handle* h, int) { return h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED; }

// C[b] = alpha * op(A[b]) op(B[b]) + beta * C[b], every matrix column-major: element (i, j)
// of an m x n matrix with leading dimension ld is at i + j * ld.
cublasStatus_t cublasGemmStridedBatchedEx(Handle* h, int ta, int tb, int m, int n, int k,
                                          const void* alpha, const void* A, int at, int lda,
                                          long long sa, const void* B, int bt, int ldb,
                                          long long sb, const void* beta, void* C, int ct,
                                          int ldc, long long sc, int batch, int compute, int) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (kiln_emulator_current_device() != h->device)
    return invalid("called with another device current than the handle's");
  for (const void* p : {A, B, (const void*)C}) {
    int owner = kiln_emulator_device_of((unsigned long long)(uintptr_t)p);
    if (owner >= 0 && owner != h->device) return invalid("a matrix in another device's memory");
  }
  if (m < 0 || n < 0 || k < 0 || batch < 0) return invalid("negative size");
  if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T))
    return invalid("unsupported operation");
  int a_rows = ta == CUBLAS_OP_N ? m : k, b_rows = tb == CUBLAS_OP_N ? k : n;
  if (lda < (a_rows > 1 ? a_rows : 1)) return invalid("lda below the rows of A");
  if (ldb < (b_rows > 1 ? b_rows : 1)) return invalid("ldb below the rows of B");
  if (ldc < (m > 1 ? m : 1)) return invalid("ldc below m");
  if (at != bt || at != ct) return invalid("A, B and C of different types (kiln never mixes them)");
  bool f64 = at == CUDA_R_64F;
  if (f64 != (compute == CUBLAS_COMPUTE_64F)) return invalid("compute type does not match data");
  if (!f64 && compute != CUBLAS_COMPUTE_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (at != CUDA_R_32F && at != CUDA_R_64F && at != CUDA_R_16F && at != CUDA_R_16BF)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  Gemm* g = new Gemm{ta, tb, m, n, k, A, at, lda, sa, B, bt, ldb, sb, C, ct, ldc, sc, batch, f64,
                     f64 ? *(const double*)alpha : *(const float*)alpha,
                     f64 ? *(const double*)beta : *(const float*)beta};
  // Queued on the handle's stream: recorded there while it captures a graph.
  if (kiln_emulator_enqueue(h->stream, run_gemm, g, drop_gemm) != 0) return invalid("queueing");
  return CUBLAS_STATUS_SUCCESS;
}
}
