// ONNX's indexing ops beyond Gather: OneHot and EyeLike (comparisons with an arange),
// GatherND and ScatterND (the indexed dims flattened into one and indexed there),
// ScatterElements and Scatter (on scatter_add), and the ops whose output shape depends on the
// data, which read it on the host: TopK, NonZero and Compress. Negative indices count from
// the end, as ONNX defines them.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "onnx/proto.h"

namespace normcore {
namespace onnx {

namespace {

using Outputs = std::vector<Tensor>;

// OneHot: indices [*] (negative ones count from depth) -> [*] with a dim of depth inserted at
// axis, on_value where the index is, off_value elsewhere (an index outside the depth: off
// throughout).
Tensor one_hot_op(const NodeRun& n) {
  const Tensor& values = n.input(2);
  NC_CHECK(values.numel() == 2, ShapeError, n.where, ": values must hold [off_value, on_value], got ",
           describe(values));
  const double depth_value = scalar_input(n, 1);
  NC_CHECK(depth_value >= 1 && depth_value < 9.0e15, ValueError, n.where, ": depth must be positive, got ",
           depth_value);
  const int64_t depth = static_cast<int64_t>(depth_value);
  const Tensor index = n.input(0).to(DType::I64);
  const int64_t axis = axis_of(n.int_attribute("axis", -1), index.dim() + 1, n);
  const Device device = index.device();
  const Tensor wrapped = where(lt(index, Scalar(int64_t{0})), add(index, Scalar(depth)), index);
  Shape along(static_cast<size_t>(index.dim() + 1), 1);
  along[static_cast<size_t>(axis)] = depth;
  const Tensor classes = arange(0, depth, 1, TensorOptions(DType::I64, device)).reshape(along);
  const Tensor flat = values.reshape({2});
  return where(eq(wrapped.unsqueeze(axis), classes), flat.narrow(0, 1, 1).reshape({}),
               flat.narrow(0, 0, 1).reshape({}));
}

// EyeLike: ones on diagonal k of a 2-D shape like the input's, in dtype (the input's by default).
Tensor eye_like(const NodeRun& n) {
  const Tensor& x = n.input(0);
  NC_CHECK(x.dim() == 2, ShapeError, n.where, ": input must be 2-D, got ", describe(x));
  const DType dtype =
      n.attribute("dtype") ? dtype_of(static_cast<int>(n.int_attribute("dtype", 1)), n.where) : x.dtype();
  const TensorOptions i64(DType::I64, x.device());
  const Tensor rows = arange(0, x.size(0), 1, i64).unsqueeze(1), cols = arange(0, x.size(1), 1, i64).unsqueeze(0);
  return eq(sub(cols, rows), Scalar(n.int_attribute("k", 0))).to(dtype);
}

// The rows of data flattened over its dims [first, first + k) that an indices tensor [..., k]
// names, as one i64 index each (negative coordinates counted from the dim's end).
Tensor linear_index(const Tensor& data, const Tensor& indices, int64_t first) {
  const int64_t k = indices.size(-1);
  std::vector<int64_t> sizes, strides(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) sizes.push_back(data.size(first + j));
  int64_t stride = 1;
  for (int64_t j = k - 1; j >= 0; --j)
    strides[static_cast<size_t>(j)] = stride, stride *= sizes[static_cast<size_t>(j)];
  const Tensor idx = indices.to(DType::I64);
  const Tensor wrapped = where(lt(idx, Scalar(int64_t{0})), add(idx, index_vector(sizes, idx.device())), idx);
  return sum(mul(wrapped, index_vector(strides, idx.device())), {-1});
}

// GatherND: data [b..., d1..dk, rest...], indices [b..., m..., k] -> [b..., m..., rest...].
Tensor gather_nd(const NodeRun& n) {
  const Tensor &data = n.input(0), &indices = n.input(1);
  const int64_t b = n.int_attribute("batch_dims", 0);
  NC_CHECK(indices.dim() >= 1 && b >= 0 && b < std::min(indices.dim(), data.dim()), ShapeError, n.where,
           ": batch_dims ", b, " does not fit data ", describe(data), " and indices ", describe(indices));
  const int64_t k = indices.size(-1);
  NC_CHECK(k >= 1 && k <= data.dim() - b, ShapeError, n.where, ": indices' last dim ", k, " must be in [1, ",
           data.dim() - b, "] for data ", describe(data));
  int64_t batch = 1, cells = 1;
  for (int64_t d = 0; d < b; ++d) {
    NC_CHECK(data.size(d) == indices.size(d), ShapeError, n.where, ": batch dim ", d, " of data ", describe(data),
             " and indices ", describe(indices), " differ");
    batch *= data.size(d);
  }
  for (int64_t d = b; d < b + k; ++d) cells *= data.size(d);
  Shape rest(data.shape().begin() + b + k, data.shape().end());
  Tensor linear = linear_index(data, indices, b).reshape({batch, -1});
  linear = add(linear, mul(arange(0, batch, 1, TensorOptions(DType::I64, data.device())).unsqueeze(1), Scalar(cells)));
  Shape flat_shape{batch * cells};
  flat_shape.insert(flat_shape.end(), rest.begin(), rest.end());
  Shape out_shape(indices.shape().begin(), indices.shape().end() - 1);
  out_shape.insert(out_shape.end(), rest.begin(), rest.end());
  return index_select(data.contiguous().reshape(flat_shape), 0, linear.reshape({-1})).reshape(out_shape);
}

// x with the positions index names (along dim, scatter_add's convention) set to updates, or
// updates added with reduction "add". Duplicate indices with "none" add up (ONNX leaves them
// undefined).
Tensor scatter_into(const NodeRun& n, const Tensor& x, int64_t dim, const Tensor& index, const Tensor& updates) {
  const std::string reduction = n.attribute("reduction") ? n.attribute("reduction")->s() : "none";
  NC_CHECK(reduction == "none" || reduction == "add", ValueError, n.where, ": reduction '", reduction,
           "' is not supported (none and add are)");
  if (reduction == "add") return scatter_add(x, dim, index, updates);
  const Tensor zero = zeros_like(x);
  const Tensor hits = gt(scatter_add(zero, dim, index, ones_like(updates)), Scalar(0.0));
  return where(hits, scatter_add(zero, dim, index, updates), x);
}

Tensor scatter_elements(const NodeRun& n) {
  const Tensor &data = n.input(0), &updates = n.input(2);
  const int64_t axis = axis_of(n.int_attribute("axis", 0), data.dim(), n);
  const Tensor idx = n.input(1).to(DType::I64);
  NC_CHECK(idx.shape() == updates.shape() && idx.dim() == data.dim(), ShapeError, n.where,
           ": indices and updates must have one shape of data's rank, got ", describe(idx), " and ", describe(updates),
           " for ", describe(data));
  const Tensor wrapped = where(lt(idx, Scalar(int64_t{0})), add(idx, Scalar(data.size(axis))), idx);
  return scatter_into(n, data, axis, wrapped, updates.to(data.dtype()));
}

// ScatterND: data [d1..dk, rest...], indices [m..., k], updates [m..., rest...].
Tensor scatter_nd(const NodeRun& n) {
  const Tensor &data = n.input(0), &indices = n.input(1), &updates = n.input(2);
  NC_CHECK(indices.dim() >= 1 && indices.size(-1) >= 1 && indices.size(-1) <= data.dim(), ShapeError, n.where,
           ": indices [..., k] need 1 <= k <= data's rank, got ", describe(indices), " for ", describe(data));
  const int64_t k = indices.size(-1);
  int64_t cells = 1;
  for (int64_t d = 0; d < k; ++d) cells *= data.size(d);
  Shape rest(data.shape().begin() + k, data.shape().end());
  const int64_t count = indices.numel() / k;
  Shape want(indices.shape().begin(), indices.shape().end() - 1);
  want.insert(want.end(), rest.begin(), rest.end());
  NC_CHECK(updates.shape() == want, ShapeError, n.where, ": updates must be ", shape_str(want), ", got ",
           describe(updates));
  Shape flat{cells}, rows{count};
  flat.insert(flat.end(), rest.begin(), rest.end());
  rows.insert(rows.end(), rest.begin(), rest.end());
  Shape column(rows.size(), 1);
  column[0] = count;
  const Tensor index = linear_index(data, indices, 0).reshape(column).expand(rows).contiguous();
  return scatter_into(n, data.contiguous().reshape(flat), 0, index, updates.to(data.dtype()).reshape(rows))
      .reshape(data.shape());
}

// TopK on the host: the k largest (or smallest) along axis, ties to the lower index, values
// gathered from the input in its dtype, indices i64; sorted either way.
Outputs top_k(const NodeRun& n) {
  const Tensor& x = n.input(0);
  const int64_t axis = axis_of(n.int_attribute("axis", -1), x.dim(), n);
  const std::vector<int64_t> ks = n.opset >= 10 ? n.int_values(1) : std::vector<int64_t>{n.int_attribute("k", -1)};
  NC_CHECK(ks.size() == 1, ShapeError, n.where, ": K must hold one value, got ", ks.size());
  const int64_t k = ks[0], length = x.size(axis);
  NC_CHECK(k >= 0 && k <= length, ValueError, n.where, ": K = ", k, " is outside [0, ", length, "] for ", describe(x));
  const bool largest = n.int_attribute("largest", 1) != 0;
  const Tensor moved = x.transpose(axis, x.dim() - 1).to(Device::cpu(), DType::F64).contiguous();
  const std::vector<double> v = moved.numel() > 0 ? moved.to_vector<double>() : std::vector<double>{};
  const int64_t rows = length > 0 ? moved.numel() / length : 0;
  std::vector<int64_t> picked;
  picked.reserve(static_cast<size_t>(rows * k));
  std::vector<int64_t> order(static_cast<size_t>(length));
  for (int64_t r = 0; r < rows; ++r) {
    const double* row = v.data() + r * length;
    std::iota(order.begin(), order.end(), int64_t{0});
    // NaN above every number (as the largest), then by value, ties to the lower index.
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      const double p = row[a], q = row[b];
      if (std::isnan(p) || std::isnan(q))
        return largest ? std::isnan(p) && !std::isnan(q) : !std::isnan(p) && std::isnan(q);
      return largest ? p > q : p < q;
    });
    picked.insert(picked.end(), order.begin(), order.begin() + k);
  }
  Shape shape = moved.shape();
  shape.back() = k;
  const Tensor index = from_vector(picked, shape).to(x.device()).transpose(axis, x.dim() - 1).contiguous();
  return {gather(x, axis, index), index};
}

// NonZero: the coordinates [rank, count] of the non-zero elements in row-major order.
Tensor non_zero(const NodeRun& n) {
  const Tensor& x = n.input(0);
  const Tensor mask = ne(x, Scalar(0.0)).to(Device::cpu(), DType::U8).contiguous();
  const std::vector<uint8_t> hit = mask.numel() > 0 ? mask.to_vector<uint8_t>() : std::vector<uint8_t>{};
  const int64_t rank = x.dim();
  std::vector<int64_t> flat;
  for (int64_t i = 0; i < static_cast<int64_t>(hit.size()); ++i)
    if (hit[static_cast<size_t>(i)]) flat.push_back(i);
  const int64_t count = static_cast<int64_t>(flat.size());
  std::vector<int64_t> coords(static_cast<size_t>(std::max<int64_t>(rank, 1) * count));
  for (int64_t j = 0; j < count; ++j) {
    int64_t rem = flat[static_cast<size_t>(j)];
    for (int64_t d = rank - 1; d >= 0; --d) {
      coords[static_cast<size_t>(d * count + j)] = rem % x.size(d);
      rem /= x.size(d);
    }
  }
  if (rank == 0) return from_vector(coords, {1, count}).to(x.device());  // a scalar: [1, 0 or 1] of zeros
  return from_vector(coords, {rank, count}).to(x.device());
}

// Compress: the slices along axis (of the flattened input without one) whose condition is
// true; a condition shorter than the axis leaves the rest out.
Tensor compress(const NodeRun& n) {
  const Tensor& input = n.input(0);
  const bool has_axis = n.attribute("axis") != nullptr;
  const Tensor x = has_axis ? input : input.reshape({-1});
  const int64_t axis = has_axis ? axis_of(n.int_attribute("axis", 0), x.dim(), n) : 0;
  const Tensor cond = n.input(1).to(Device::cpu(), DType::U8).contiguous();
  NC_CHECK(cond.dim() == 1 && cond.numel() <= x.size(axis), ShapeError, n.where, ": condition must be 1-D of at most ",
           x.size(axis), " values, got ", describe(n.input(1)));
  const std::vector<uint8_t> keep = cond.numel() > 0 ? cond.to_vector<uint8_t>() : std::vector<uint8_t>{};
  std::vector<int64_t> index;
  for (size_t i = 0; i < keep.size(); ++i)
    if (keep[i]) index.push_back(static_cast<int64_t>(i));
  return index_select(x, axis, index_vector(index, x.device()));
}

}  // namespace

void add_indexing_ops(std::map<std::string, OpSpec>& t) {
  t["OneHot"] = single_output(one_hot_op, {"axis"});
  t["EyeLike"] = single_output(eye_like, {"dtype", "k"});
  t["GatherND"] = single_output(gather_nd, {"batch_dims"});
  t["ScatterElements"] = single_output(scatter_elements, {"axis", "reduction"});
  t["Scatter"] = single_output(scatter_elements, {"axis"});
  t["ScatterND"] = single_output(scatter_nd, {"reduction"});
  t["TopK"] = {top_k, {"axis", "largest", "sorted", "k"}};
  t["NonZero"] = single_output(non_zero);
  t["Compress"] = single_output(compress, {"axis"});
}

}  // namespace onnx
}  // namespace normcore
