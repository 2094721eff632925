// libnccl.so of kiln's emulated CUDA device: a world of one. A communicator has one rank on
// the device current when it was made; every collective over one rank is a copy of its input
// (an all-reduce, a mean included, of one tensor is that tensor; a broadcast, an all-gather
// and a reduce-scatter over one rank move it unchanged), done on the emulated device's memory
// when it is queued (the emulated streams run work as it is queued). Arguments are checked as
// NCCL checks them: a world of more than one rank, an unknown type or reduction, or memory on
// another device than the communicator's fail with NCCL's error codes.
#include <stdint.h>
#include <string.h>

#include <atomic>

typedef int ncclResult_t;
enum { ncclSuccess = 0, ncclInvalidArgument = 4, ncclInvalidUsage = 5 };
struct ncclUniqueId {
  char internal[128];
};
struct Comm {
  int device;
};
typedef Comm* ncclComm_t;

// From the emulated libcuda.so (this library links against it).
extern "C" int kiln_emulator_current_device();
extern "C" int kiln_emulator_device_of(unsigned long long p);

// Bytes per element of each ncclDataType_t (int8, uint8, int32, uint32, int64, uint64,
// float16, float32, float64, bfloat16); 0 for any other.
static size_t element_size(int type) {
  static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
  return type >= 0 && type < 10 ? sizes[type] : 0;
}

// A copy of `count` elements from `send` to `recv` on the communicator's device.
static ncclResult_t copy(const void* send, void* recv, size_t count, int type, ncclComm_t comm) {
  size_t size = element_size(type);
  if (comm == nullptr || size == 0) return ncclInvalidArgument;
  if (count == 0) return ncclSuccess;
  auto on_device = [&](const void* p) {
    return kiln_emulator_device_of((unsigned long long)(uintptr_t)p) == comm->device;
  };
  if (!on_device(send) || !on_device(recv)) return ncclInvalidArgument;
  memmove(recv, send, count * size);
  return ncclSuccess;
}

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = 23203;  // 2.32.3, the version CI installs from PyPI
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  static std::atomic<uint64_t> next{1};
  if (id == nullptr) return ncclInvalidArgument;
  memset(id->internal, 0, sizeof id->internal);
  uint64_t n = next++;
  memcpy(id->internal, "kiln-emulator", 13);
  memcpy(id->internal + 16, &n, sizeof n);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId, int rank) {
  if (comm == nullptr) return ncclInvalidArgument;
  if (nranks != 1 || rank != 0) return ncclInvalidUsage;  // a world of one only
  int device = kiln_emulator_current_device();
  if (device < 0) return ncclInvalidUsage;
  *comm = new Comm{device};
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, int type, int op,
                           ncclComm_t comm, void*) {
  if (op < 0 || op > 4) return ncclInvalidArgument;  // sum, prod, max, min, avg
  return copy(send, recv, count, type, comm);
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, int type, int root,
                           ncclComm_t comm, void*) {
  if (root != 0) return ncclInvalidArgument;
  return copy(send, recv, count, type, comm);
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, int type,
                           ncclComm_t comm, void*) {
  return copy(send, recv, count, type, comm);
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, int type, int op,
                               ncclComm_t comm, void*) {
  if (op < 0 || op > 4) return ncclInvalidArgument;
  return copy(send, recv, count, type, comm);
}

}  // extern "C"
