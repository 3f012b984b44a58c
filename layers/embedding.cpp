// Embedding: rows of weight picked by index with index_select (whose backward adds each
// row's gradient back, summing repeats), then shaped [*index, embedding_dim].
#include "normcore/nn.h"
#include "normcore/ops.h"

namespace normcore {
namespace nn {

namespace {

int64_t checked_size(const char* name, int64_t n) {
  NC_CHECK(n >= 0, ValueError, "Embedding: ", name, " must be non-negative, got ", n);
  return n;
}

}  // namespace

Embedding::Embedding(int64_t num, int64_t dim, Generator* gen)
    : num_embeddings(checked_size("num_embeddings", num)), embedding_dim(checked_size("embedding_dim", dim)) {
  weight = register_parameter("weight", randn({num, dim}, DType::F32, gen));
}

Tensor Embedding::forward(const Tensor& index) {
  const char* op = "Embedding";
  NC_CHECK(index.defined(), ValueError, op, ": index is an undefined tensor");
  NC_CHECK(index.dtype() == DType::I64 || index.dtype() == DType::I32, DTypeError, op,
           ": index must be i32 or i64, got ", describe(index));
  NC_CHECK(index.device() == weight.device(), DeviceError, op, ": index is on ", index.device(),
           " but weight is on ", weight.device());
  if (index.numel() > 0) {
    // index_select would also accept negative indices (counting from the end); PyTorch's
    // embedding does not.
    int64_t lo = min(index).item<int64_t>(), hi = max(index).item<int64_t>();
    NC_CHECK(lo >= 0 && hi < num_embeddings, IndexError, op, ": index ", lo < 0 ? lo : hi,
             " is out of range for ", num_embeddings, " embeddings");
  }
  Shape shape = index.shape();
  shape.push_back(embedding_dim);
  return index_select(weight, 0, index.reshape({index.numel()})).view(shape);
}

}  // namespace nn
}  // namespace normcore
