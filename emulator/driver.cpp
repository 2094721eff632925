// libcuda.so of kiln's emulated CUDA device: the driver API entry points kiln uses, over host
// memory. `KILN_EMULATOR_DEVICES` devices (default 2, at most 8: "kiln emulated CUDA device",
// compute capability 9.0, 4 multiprocessors), one primary context each; every stream runs its
// work at once, in order, so events and synchronization are immediate, unless it is capturing
// a CUDA graph (then its work is recorded, and each launch of the graph runs it in order).
// Device memory is host memory with a guard page after every allocation, so a kernel that
// writes past the end of a buffer faults at once; copies and memsets are checked against the
// allocations they touch.
// Each allocation, module and function belongs to the device whose context was current when
// it was made: a kernel launched from another device's context, or given another device's
// memory, fails as it would on real GPUs without peer access.
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void* CUcontext;
typedef void* CUstream;
typedef void* CUevent;
typedef void* CUmodule;
typedef void* CUfunction;

enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_INVALID_DEVICE = 101,
  CUDA_ERROR_INVALID_IMAGE = 200,
  CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222,
  CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_INVALID_HANDLE = 400,
  CUDA_ERROR_NOT_FOUND = 500,
  CUDA_ERROR_ILLEGAL_ADDRESS = 700,
  CUDA_ERROR_LAUNCH_FAILED = 719,
  CUDA_ERROR_NOT_SUPPORTED = 801,
  CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
  CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
};

namespace {

bool initialized = false;
const int MAX_DEVICES = 8;
int context_tags[MAX_DEVICES];  // device d's primary context's handle is &context_tags[d]
thread_local CUcontext current = nullptr;

int devices() {
  const char* e = getenv("KILN_EMULATOR_DEVICES");
  int n = e && *e ? atoi(e) : 2;
  return n < 1 ? 1 : n > MAX_DEVICES ? MAX_DEVICES : n;
}

// The device whose primary context `c` is, or -1.
int device_of_context(CUcontext c) {
  for (int d = 0; d < devices(); d++)
    if (c == &context_tags[d]) return d;
  return -1;
}

bool valid_device(CUdevice d) { return d >= 0 && d < devices(); }

struct Alloc {
  void* map;
  size_t map_len, len;
  int device;
};
std::mutex lock;
std::map<CUdeviceptr, Alloc> allocations;  // by start address
size_t in_use = 0;
const size_t TOTAL = size_t(16) << 30;

size_t page() { return (size_t)sysconf(_SC_PAGESIZE); }

// The device of the live allocation holding [p, p + n), or -1.
int holder(CUdeviceptr p, size_t n) {
  std::lock_guard<std::mutex> g(lock);
  auto it = allocations.upper_bound(p);
  if (it == allocations.begin()) return -1;
  --it;
  return p >= it->first && p + n <= it->first + it->second.len ? it->second.device : -1;
}

bool inside(CUdeviceptr p, size_t n) { return holder(p, n) >= 0; }

CUresult checked(CUdeviceptr p, size_t n, const char* what) {
  if (n == 0 || inside(p, n)) return CUDA_SUCCESS;
  fprintf(stderr, "kiln emulator: %s of %zu bytes at 0x%llx is outside every device allocation\n",
          what, n, p);
  return CUDA_ERROR_INVALID_VALUE;
}

struct Module {
  void* handle;
  CUcontext ctx;
};
struct Function {
  int (*launch)(void**, const unsigned*, const unsigned*);
  unsigned params;
  unsigned long long pointers;  // bit i: parameter i is a pointer
  std::string name;
  CUcontext ctx;
  const unsigned* sizes;  // each parameter's size (null for a library built without them)
};

// Stream capture and graphs. A capturing stream records its work as nodes instead of running
// it; an instantiated graph (an "exec") is a copy of the nodes, run in order by each launch.
// Kernel nodes keep a copy of their arguments, which `cuGraphExecKernelNodeSetParams`
// replaces. Host nodes are work that another emulated library (cuBLAS) queued.
struct HostWork {
  void (*run)(void*);
  void* data;
  void (*drop)(void*);
  ~HostWork() {
    if (drop) drop(data);
  }
};
struct Node {
  enum Kind { KERNEL, COPY, SET, HOST } kind;
  Function* fn = nullptr;
  unsigned grid[3] = {1, 1, 1}, block[3] = {1, 1, 1};
  std::vector<std::vector<char>> args;
  CUdeviceptr dst = 0, src = 0;
  size_t n = 0;
  unsigned char value = 0;
  std::shared_ptr<HostWork> host;
};
struct Graph {
  std::vector<std::unique_ptr<Node>> nodes;
};
struct Exec {
  std::vector<Node> nodes;
  std::map<const Node*, size_t> index;  // the captured node each copy came from
};
struct Stream {
  Graph* capture = nullptr;
  bool invalidated = false;
  const Node* last = nullptr;  // the node captured last: the capture's dependency
};
std::atomic<int> capturing_streams{0};

// The stream `s` if it is capturing (the null stream never is).
Stream* capturing(void* s) {
  Stream* st = (Stream*)s;
  return st && st->capture ? st : nullptr;
}

// Work that cannot be captured ends the capture as invalid, as the driver does.
CUresult uncapturable(Stream* st) {
  st->invalidated = true;
  return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

Node* record(Stream* st, Node::Kind kind) {
  st->capture->nodes.emplace_back(new Node{});
  Node* n = st->capture->nodes.back().get();
  n->kind = kind;
  st->last = n;
  return n;
}

}  // namespace

extern "C" {

// For the emulated cuBLAS: the device of the current context, and of an address (-1 when it
// is in no allocation).
int kiln_emulator_current_device() { return device_of_context(current); }
int kiln_emulator_device_of(CUdeviceptr p) { return holder(p, 1); }

CUresult cuInit(unsigned flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  initialized = true;
  return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int* v) {
  *v = 13000;
  return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult e, const char** s) {
  switch (e) {
    case CUDA_SUCCESS: *s = "CUDA_SUCCESS"; break;
    case CUDA_ERROR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *s = "CUDA_ERROR_NOT_INITIALIZED"; break;
    case CUDA_ERROR_INVALID_DEVICE: *s = "CUDA_ERROR_INVALID_DEVICE"; break;
    case CUDA_ERROR_INVALID_IMAGE: *s = "CUDA_ERROR_INVALID_IMAGE"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *s = "CUDA_ERROR_INVALID_CONTEXT"; break;
    case CUDA_ERROR_INVALID_HANDLE: *s = "CUDA_ERROR_INVALID_HANDLE"; break;
    case CUDA_ERROR_NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; break;
    case CUDA_ERROR_ILLEGAL_ADDRESS: *s = "CUDA_ERROR_ILLEGAL_ADDRESS"; break;
    case CUDA_ERROR_LAUNCH_FAILED: *s = "CUDA_ERROR_LAUNCH_FAILED"; break;
    case CUDA_ERROR_NOT_SUPPORTED: *s = "CUDA_ERROR_NOT_SUPPORTED"; break;
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: *s = "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"; break;
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: *s = "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"; break;
    default: *s = "CUDA_ERROR_UNKNOWN"; return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult e, const char** s) {
  return cuGetErrorName(e, s);
}

CUresult cuDeviceGetCount(int* n) {
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  *n = devices();
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!valid_device(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
  if (!valid_device(d)) return CUDA_ERROR_INVALID_DEVICE;
  snprintf(name, (size_t)len, "%s", "kiln emulated CUDA device");
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int* v, int attribute, CUdevice d) {
  if (!valid_device(d)) return CUDA_ERROR_INVALID_DEVICE;
  switch (attribute) {
    case 1: *v = 1024; break;   // max threads per block
    case 16: *v = 4; break;     // multiprocessors
    case 75: *v = 9; break;     // compute capability major
    case 76: *v = 0; break;     // minor
    case 10: *v = 32; break;    // warp size
    case 115: *v = 0; break;    // memory pools: not supported (cudarc then allocates synchronously)
    default: *v = 0; break;
  }
  return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice d) {
  if (!valid_device(d)) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = TOTAL;
  return CUDA_SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  std::lock_guard<std::mutex> g(lock);
  *free = TOTAL - in_use;
  *total = TOTAL;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice d) {
  if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!valid_device(d)) return CUDA_ERROR_INVALID_DEVICE;
  *ctx = &context_tags[d];
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice) { return CUDA_SUCCESS; }

CUresult cuCtxGetCurrent(CUcontext* ctx) {
  *ctx = current;
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  if (ctx && device_of_context(ctx) < 0) return CUDA_ERROR_INVALID_CONTEXT;
  current = ctx;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice* d) {
  if (!current) return CUDA_ERROR_INVALID_CONTEXT;
  *d = device_of_context(current);
  return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize() {
  if (capturing_streams > 0) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return current ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

// Streams and events: work runs when it is queued, so there is never anything to wait for.
CUresult cuStreamCreate(CUstream* s, unsigned) {
  *s = new Stream{};
  return CUDA_SUCCESS;
}
CUresult cuStreamDestroy_v2(CUstream s) {
  if (capturing(s)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  delete (Stream*)s;
  return CUDA_SUCCESS;
}
CUresult cuStreamSynchronize(CUstream s) {
  if (Stream* st = capturing(s)) return uncapturable(st);
  return current ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}
CUresult cuStreamWaitEvent(CUstream, CUevent, unsigned) { return CUDA_SUCCESS; }
CUresult cuEventCreate(CUevent* e, unsigned) {
  *e = new int(0);
  return CUDA_SUCCESS;
}
CUresult cuEventDestroy_v2(CUevent e) {
  delete (int*)e;
  return CUDA_SUCCESS;
}
CUresult cuEventRecord(CUevent e, CUstream) { return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE; }
CUresult cuEventSynchronize(CUevent e) { return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE; }
CUresult cuEventQuery(CUevent e) { return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE; }

CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t bytes) {
  if (!current) return CUDA_ERROR_INVALID_CONTEXT;
  if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  size_t pg = page(), body = (bytes + pg - 1) / pg * pg, len = body + pg;
  {
    std::lock_guard<std::mutex> g(lock);
    if (in_use + bytes > TOTAL) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  // The block ends where the guard page starts, at a 256-byte aligned address (as cuMemAlloc
  // aligns): sizes that are multiples of 256 end exactly at the guard.
  char* guard = (char*)m + body;
  mprotect(guard, pg, PROT_NONE);
  CUdeviceptr start = ((CUdeviceptr)(uintptr_t)guard - bytes) & ~(CUdeviceptr)255;
  // Fresh device memory holds garbage: kernels must not read what nobody wrote.
  memset((void*)(uintptr_t)start, 0xa5, bytes);
  std::lock_guard<std::mutex> g(lock);
  allocations[start] = Alloc{m, len, bytes, device_of_context(current)};
  in_use += bytes;
  *p = start;
  return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
  Alloc a;
  {
    std::lock_guard<std::mutex> g(lock);
    auto it = allocations.find(p);
    if (it == allocations.end()) {
      fprintf(stderr, "kiln emulator: freeing 0x%llx, which is not a device allocation\n", p);
      return CUDA_ERROR_INVALID_VALUE;
    }
    a = it->second;
    in_use -= a.len;
    allocations.erase(it);
  }
  munmap(a.map, a.map_len);
  return CUDA_SUCCESS;
}

CUresult cuMemHostAlloc(void** p, size_t bytes, unsigned) {
  *p = malloc(bytes ? bytes : 1);
  return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
CUresult cuMemFreeHost(void* p) {
  free(p);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
  CUresult r = checked(dst, n, "a copy to the device");
  if (r == CUDA_SUCCESS && n) memcpy((void*)(uintptr_t)dst, src, n);
  return r;
}
// A capture takes no copies from or to pageable host memory (all host memory here is).
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, CUstream s) {
  if (Stream* st = capturing(s)) return uncapturable(st);
  return cuMemcpyHtoD_v2(dst, src, n);
}
CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
  CUresult r = checked(src, n, "a copy from the device");
  if (r == CUDA_SUCCESS && n) memcpy(dst, (const void*)(uintptr_t)src, n);
  return r;
}
CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, CUstream s) {
  if (Stream* st = capturing(s)) return uncapturable(st);
  return cuMemcpyDtoH_v2(dst, src, n);
}
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  CUresult r = checked(src, n, "a device-to-device copy's source");
  if (r == CUDA_SUCCESS) r = checked(dst, n, "a device-to-device copy's destination");
  if (r == CUDA_SUCCESS && n) memmove((void*)(uintptr_t)dst, (const void*)(uintptr_t)src, n);
  return r;
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  if (Stream* st = capturing(s)) {
    Node* node = record(st, Node::COPY);
    node->dst = dst, node->src = src, node->n = n;
    return CUDA_SUCCESS;
  }
  return cuMemcpyDtoD_v2(dst, src, n);
}
CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) {
  CUresult r = checked(dst, n, "a memset");
  if (r == CUDA_SUCCESS && n) memset((void*)(uintptr_t)dst, v, n);
  return r;
}
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s) {
  if (Stream* st = capturing(s)) {
    Node* node = record(st, Node::SET);
    node->dst = dst, node->value = v, node->n = n;
    return CUDA_SUCCESS;
  }
  return cuMemsetD8_v2(dst, v, n);
}

// A module is the shared library the emulated NVRTC built; its "PTX" names it.
CUresult cuModuleLoadData(CUmodule* m, const void* image) {
  if (!current) return CUDA_ERROR_INVALID_CONTEXT;
  const char* text = (const char*)image;
  const char* marker = "// kiln emulator module\n";
  const char* cubin = "// kiln emulator cubin\n";
  bool is_cubin = strncmp(text, cubin, strlen(cubin)) == 0;
  if (is_cubin) {
    // $KILN_EMULATOR_REJECT_CUBIN plays a driver older than the NVRTC that made the cubin.
    const char* reject = getenv("KILN_EMULATOR_REJECT_CUBIN");
    if (reject && strcmp(reject, "1") == 0) return CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
    marker = cubin;
  }
  if (strncmp(text, marker, strlen(marker)) != 0) {
    fprintf(stderr, "kiln emulator: a module that the emulated NVRTC did not build\n");
    return CUDA_ERROR_INVALID_IMAGE;
  }
  std::string path(text + strlen(marker));
  while (!path.empty() && (path.back() == '\n' || path.back() == '\0')) path.pop_back();
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "kiln emulator: loading %s: %s\n", path.c_str(), dlerror());
    return CUDA_ERROR_INVALID_IMAGE;
  }
  *m = new Module{h, current};
  return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule m) {
  // The library stays loaded: functions taken from it may still be cached by the caller.
  delete (Module*)m;
  return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction* f, CUmodule m, const char* name) {
  if (!m) return CUDA_ERROR_INVALID_HANDLE;
  void* h = ((Module*)m)->handle;
  std::string launch = std::string("kiln_emulator_launch_") + name;
  std::string params = std::string("kiln_emulator_params_") + name;
  std::string pointers = std::string("kiln_emulator_pointers_") + name;
  void* l = dlsym(h, launch.c_str());
  void* p = dlsym(h, params.c_str());
  void* ptrs = dlsym(h, pointers.c_str());
  void* sizes = dlsym(h, (std::string("kiln_emulator_sizes_") + name).c_str());
  if (!l || !p || !ptrs) return CUDA_ERROR_NOT_FOUND;
  *f = new Function{(int (*)(void**, const unsigned*, const unsigned*))l, *(const unsigned*)p,
                    *(const unsigned long long*)ptrs, name, ((Module*)m)->ctx,
                    (const unsigned*)sizes};
  return CUDA_SUCCESS;
}

CUresult cuFuncGetAttribute(int* v, int, CUfunction) {
  *v = 0;
  return CUDA_SUCCESS;
}

}  // extern "C"

namespace {

// Runs a launch of `fn` with the checks a launch makes: the function's and its pointer
// arguments' device against the current context's.
CUresult run_kernel(Function* fn, const unsigned* grid, const unsigned* block, void** params) {
  int device = device_of_context(current);
  if (fn->ctx != current) {
    fprintf(stderr, "kiln emulator: %s was loaded on device %d and launched on device %d\n",
            fn->name.c_str(), device_of_context(fn->ctx), device);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  for (unsigned i = 0; i < fn->params && i < 64; i++) {
    if (!(fn->pointers >> i & 1)) continue;
    CUdeviceptr p = *(CUdeviceptr*)params[i];
    int owner = holder(p, 1);
    if (owner >= 0 && owner != device) {
      fprintf(stderr, "kiln emulator: %s on device %d was given device %d's memory (argument %u)\n",
              fn->name.c_str(), device, owner, i);
      return CUDA_ERROR_ILLEGAL_ADDRESS;
    }
  }
  int r = fn->launch(params, grid, block);
  if (r == 2) return CUDA_ERROR_INVALID_VALUE;
  return r == 0 ? CUDA_SUCCESS : CUDA_ERROR_LAUNCH_FAILED;
}

// A copy of the arguments `params` points at, by the function's parameter sizes.
std::vector<std::vector<char>> copy_args(Function* fn, void** params) {
  std::vector<std::vector<char>> args(fn->params);
  for (unsigned i = 0; i < fn->params; i++)
    args[i].assign((const char*)params[i], (const char*)params[i] + fn->sizes[i]);
  return args;
}

CUresult run_node(const Node& n) {
  switch (n.kind) {
    case Node::KERNEL: {
      std::vector<void*> params(n.args.size());
      for (size_t i = 0; i < n.args.size(); i++) params[i] = (void*)n.args[i].data();
      return run_kernel(n.fn, n.grid, n.block, params.data());
    }
    case Node::COPY: return cuMemcpyDtoD_v2(n.dst, n.src, n.n);
    case Node::SET: return cuMemsetD8_v2(n.dst, n.value, n.n);
    case Node::HOST: n.host->run(n.host->data); return CUDA_SUCCESS;
  }
  return CUDA_ERROR_INVALID_VALUE;
}

}  // namespace

extern "C" {

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shared, CUstream stream, void** params,
                        void** extra) {
  if (!current) return CUDA_ERROR_INVALID_CONTEXT;
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  Function* fn = (Function*)f;
  if (extra || (fn->params > 0 && !params)) return CUDA_ERROR_INVALID_VALUE;
  if (shared > 48 * 1024) return CUDA_ERROR_INVALID_VALUE;
  unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
  if (Stream* st = capturing(stream)) {
    if (fn->ctx != current) return CUDA_ERROR_INVALID_HANDLE;
    if (!fn->sizes) return uncapturable(st);
    Node* node = record(st, Node::KERNEL);
    node->fn = fn;
    memcpy(node->grid, grid, sizeof grid);
    memcpy(node->block, block, sizeof block);
    node->args = copy_args(fn, params);
    return CUDA_SUCCESS;
  }
  return run_kernel(fn, grid, block, params);
}

// For the emulated cuBLAS: runs `run(data)` now, or records it when `stream` is capturing.
// `drop(data)` frees the data once nothing will run it again.
CUresult kiln_emulator_enqueue(CUstream stream, void (*run)(void*), void* data,
                               void (*drop)(void*)) {
  std::shared_ptr<HostWork> work(new HostWork{run, data, drop});
  if (Stream* st = capturing(stream)) {
    record(st, Node::HOST)->host = work;
    return CUDA_SUCCESS;
  }
  work->run(work->data);
  return CUDA_SUCCESS;
}

CUresult cuStreamBeginCapture_v2(CUstream s, int) {
  if (!s) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;  // the legacy stream cannot capture
  Stream* st = (Stream*)s;
  if (st->capture) return CUDA_ERROR_INVALID_VALUE;
  st->capture = new Graph{};
  st->invalidated = false;
  st->last = nullptr;
  capturing_streams++;
  return CUDA_SUCCESS;
}

CUresult cuStreamEndCapture(CUstream s, void** graph) {
  Stream* st = capturing(s);
  if (!st) return CUDA_ERROR_INVALID_VALUE;
  capturing_streams--;
  Graph* g = st->capture;
  st->capture = nullptr;
  if (st->invalidated) {
    delete g;
    *graph = nullptr;
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  *graph = g;
  return CUDA_SUCCESS;
}

CUresult cuStreamIsCapturing(CUstream s, int* status) {
  Stream* st = capturing(s);
  *status = !st ? 0 : st->invalidated ? 2 : 1;
  return CUDA_SUCCESS;
}

CUresult cuStreamGetCaptureInfo_v3(CUstream s, int* status, unsigned long long* id, void** graph,
                                   const Node* const** deps, const void** edges, size_t* count) {
  Stream* st = capturing(s);
  if (status) *status = !st ? 0 : st->invalidated ? 2 : 1;
  if (id) *id = (unsigned long long)(uintptr_t)st;
  if (graph) *graph = st ? st->capture : nullptr;
  if (deps) *deps = st && st->last ? &st->last : nullptr;
  if (edges) *edges = nullptr;
  if (count) *count = st && st->last ? 1 : 0;
  return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(void* graph) {
  delete (Graph*)graph;
  return CUDA_SUCCESS;
}

CUresult cuGraphInstantiateWithFlags(void** exec, void* graph, unsigned long long) {
  if (!graph) return CUDA_ERROR_INVALID_VALUE;
  Exec* e = new Exec{};
  for (auto& n : ((Graph*)graph)->nodes) {
    e->index[n.get()] = e->nodes.size();
    e->nodes.push_back(*n);
  }
  *exec = e;
  return CUDA_SUCCESS;
}

CUresult cuGraphExecDestroy(void* exec) {
  delete (Exec*)exec;
  return CUDA_SUCCESS;
}

CUresult cuGraphUpload(void* exec, CUstream) { return exec ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }

// A graph launch runs the nodes in capture order; the first failure is its result.
CUresult cuGraphLaunch(void* exec, CUstream s) {
  if (!exec) return CUDA_ERROR_INVALID_VALUE;
  if (capturing(s)) return uncapturable(capturing(s));
  for (const Node& n : ((Exec*)exec)->nodes) {
    CUresult r = run_node(n);
    if (r != CUDA_SUCCESS) return r;
  }
  return CUDA_SUCCESS;
}

// CUDA_KERNEL_NODE_PARAMS (v2).
struct KernelNodeParams {
  void* func;
  unsigned grid[3], block[3], shared;
  void** params;
  void** extra;
  void* kern;
  void* ctx;
};

CUresult cuGraphExecKernelNodeSetParams_v2(void* exec, const Node* node, const KernelNodeParams* p) {
  Exec* e = (Exec*)exec;
  if (!e) return CUDA_ERROR_INVALID_VALUE;
  auto it = e->index.find(node);
  if (it == e->index.end()) return CUDA_ERROR_INVALID_VALUE;
  Node& n = e->nodes[it->second];
  // As the driver requires: a kernel node keeps its function.
  if (n.kind != Node::KERNEL || (Function*)p->func != n.fn || p->extra) return CUDA_ERROR_INVALID_VALUE;
  memcpy(n.grid, p->grid, sizeof n.grid);
  memcpy(n.block, p->block, sizeof n.block);
  n.args = copy_args(n.fn, p->params);
  return CUDA_SUCCESS;
}
}
