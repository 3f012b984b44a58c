// Loading NCCL at run time (distributed/nccl.h).
#include "distributed/nccl.h"

#include <dlfcn.h>

#include <cstdlib>
#include <memory>
#include <mutex>

#include "normcore/error.h"

namespace normcore {
namespace distributed {
namespace nccl {

namespace {

template <class F>
void resolve(void* handle, const std::string& library, const char* name, F*& out) {
  dlerror();
  void* symbol = dlsym(handle, name);
  const char* error = dlerror();
  NC_CHECK(symbol != nullptr && error == nullptr, DistributedError, "NCCL: ", library, " has no ", name, " (",
           error ? error : "null symbol", "); normcore needs NCCL 2.10 or later");
  out = reinterpret_cast<F*>(symbol);
}

}  // namespace

Api load(const std::string& library) {
  // Kept loaded for the life of the process: communicators may outlive any one caller.
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = dlerror();
    throw DistributedError(detail::cat_str("NCCL: cannot load ", library, " (", error ? error : "unknown error",
                                           "); install NCCL (libnccl2) or point NORMCORE_NCCL_LIBRARY at it"));
  }
  Api api;
  // Each field F of Api is NCCL's function "nccl" F.
#define NC_RESOLVE(field) resolve(handle, library, "nccl" #field, api.field)
  NC_RESOLVE(GetVersion), NC_RESOLVE(GetUniqueId), NC_RESOLVE(CommInitRank), NC_RESOLVE(CommDestroy);
  NC_RESOLVE(CommAbort), NC_RESOLVE(CommGetAsyncError), NC_RESOLVE(GetErrorString), NC_RESOLVE(AllReduce);
  NC_RESOLVE(Broadcast), NC_RESOLVE(AllGather), NC_RESOLVE(ReduceScatter), NC_RESOLVE(GroupStart);
  NC_RESOLVE(GroupEnd);
#undef NC_RESOLVE
  NC_CHECK(api.GetVersion(&api.version) == 0, DistributedError, "NCCL: ncclGetVersion failed in ", library);
  NC_CHECK(api.version >= 21000, DistributedError, "NCCL: ", library, " is version ", api.version,
           "; normcore needs 2.10 or later (bf16, the Avg reduction)");
  return api;
}

const Api& api() {
  static std::mutex mutex;
  static std::unique_ptr<Api> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  if (!loaded) {
    const char* name = std::getenv("NORMCORE_NCCL_LIBRARY");
    loaded = std::make_unique<Api>(load(name != nullptr && *name != '\0' ? name : "libnccl.so.2"));
  }
  return *loaded;
}

}  // namespace nccl
}  // namespace distributed
}  // namespace normcore
