// The NCCL entry points normcore calls, loaded from libnccl.so.2 when a process group is
// first made (dlopen), so one build runs on machines with and without NCCL. The types are
// normcore's own declarations of nccl.h's (its ABI has been stable since NCCL 2.0; bf16 and
// the Avg reduction need 2.10); a stream is passed as void* so this header needs no CUDA.
#pragma once

#include <cstddef>
#include <string>

namespace normcore {
namespace distributed {
namespace nccl {

using Result = int;  // ncclResult_t; 0 is ncclSuccess
struct UniqueId {
  char internal[128];  // NCCL_UNIQUE_ID_BYTES
};
struct CommImpl;
using Comm = CommImpl*;  // ncclComm_t

enum DataType : int {
  kInt8 = 0,
  kUint8 = 1,
  kInt32 = 2,
  kUint32 = 3,
  kInt64 = 4,
  kUint64 = 5,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBfloat16 = 9,
};
enum RedOp : int { kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4 };

struct Api {
  Result (*GetVersion)(int* version);
  Result (*GetUniqueId)(UniqueId* id);
  Result (*CommInitRank)(Comm* comm, int nranks, UniqueId id, int rank);
  Result (*CommDestroy)(Comm comm);
  Result (*CommAbort)(Comm comm);
  Result (*CommGetAsyncError)(Comm comm, Result* error);
  const char* (*GetErrorString)(Result result);
  Result (*AllReduce)(const void* send, void* recv, size_t count, DataType type, RedOp op, Comm comm, void* stream);
  Result (*Broadcast)(const void* send, void* recv, size_t count, DataType type, int root, Comm comm, void* stream);
  Result (*AllGather)(const void* send, void* recv, size_t send_count, DataType type, Comm comm, void* stream);
  Result (*ReduceScatter)(const void* send, void* recv, size_t recv_count, DataType type, RedOp op, Comm comm,
                          void* stream);
  Result (*GroupStart)();
  Result (*GroupEnd)();
  int version = 0;  // e.g. 22806 for 2.28.6
};

// Loads library (a file name dlopen searches for, or a path) and every entry point above.
// Throws DistributedError naming the library and what dlopen or dlsym said.
Api load(const std::string& library);

// load() of NORMCORE_NCCL_LIBRARY, default "libnccl.so.2", once per process (a failure is
// not remembered: the next call tries again).
const Api& api();

}  // namespace nccl
}  // namespace distributed
}  // namespace normcore
