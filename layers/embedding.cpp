// embedding and the Embedding layer: rows of weight picked by index with index_select (whose
// backward adds each row's gradient back, summing repeats), then shaped [*index, dim]. The
// indices are checked against num_embeddings first: on the CPU at the call, on CUDA on the
// device, with the IndexError raised at the host's next wait (core/internal.h).
#include "core/internal.h"
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

}  // namespace nn

Tensor embedding(const Tensor& weight, const Tensor& index, std::optional<int64_t> padding_idx) {
  const char* op = "embedding";
  NC_CHECK(weight.defined(), ValueError, op, ": weight is an undefined tensor");
  NC_CHECK(index.defined(), ValueError, op, ": index is an undefined tensor");
  NC_CHECK(weight.dim() == 2, ShapeError, op, ": weight must be [num_embeddings, embedding_dim], got ",
           describe(weight));
  NC_CHECK(is_floating(weight.dtype()), DTypeError, op, ": weight must be floating, got ", describe(weight));
  NC_CHECK(index.dtype() == DType::I64 || index.dtype() == DType::I32, DTypeError, op,
           ": index must be i32 or i64, got ", describe(index));
  NC_CHECK(index.device() == weight.device(), DeviceError, op, ": index is on ", index.device(), " but weight is on ",
           weight.device());
  const int64_t num = weight.size(0);
  Shape shape = index.shape();
  shape.push_back(weight.size(1));
  const Tensor flat = index.to(DType::I64).contiguous().reshape({index.numel()});
  // In the layer's own words, before index_select (which rejects the same values); on CUDA
  // the first error recorded is the one reported, so this message wins there too.
  detail::check_index_range(flat, num, std::nullopt, op, "index", "embeddings");
  Tensor rows = index_select(weight, 0, flat);
  if (padding_idx) {
    const int64_t p = *padding_idx < 0 ? *padding_idx + num : *padding_idx;
    NC_CHECK(p >= 0 && p < num, IndexError, op, ": padding_idx ", *padding_idx, " is out of range for ", num,
             " embeddings");
    // The padding row's values come through a detached weight, so no gradient reaches it.
    const Tensor padding = eq(flat, Scalar(p)).unsqueeze(1);
    rows = where(padding, index_select(weight.detach(), 0, flat), rows);
  }
  return rows.view(shape);
}

namespace nn {

Tensor Embedding::forward(const Tensor& index) { return normcore::embedding(weight, index); }

}  // namespace nn
}  // namespace normcore
