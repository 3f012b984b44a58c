// ShardedOptimizer (normcore/distributed.h): ZeRO stage 1 over a per-parameter optimizer.
// A rank's step drops the gradients of the parameters it does not own, so the optimizer
// neither updates them nor makes state for them; each rank then broadcasts its parameters,
// one flat buffer per dtype. The whole state_dict is put together by broadcasts from each
// rank in turn: a description of its entries (index, name, dtype, shape) as i64, then each
// entry.
#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "normcore/autograd.h"
#include "normcore/distributed.h"
#include "normcore/ops.h"

namespace normcore {
namespace distributed {

namespace {

constexpr const char* kStatePrefix = "state.";

// The parameter index of a "state.<index>.<name>" entry, and the name; {-1, ""} for any
// other entry or a malformed one.
std::pair<int64_t, std::string> state_entry(const std::string& key) {
  const std::string prefix(kStatePrefix);
  if (key.compare(0, prefix.size(), prefix) != 0) return {-1, ""};
  const size_t dot = key.find('.', prefix.size());
  if (dot == std::string::npos || dot == prefix.size() || dot - prefix.size() > 18) return {-1, ""};
  int64_t index = 0;
  for (size_t k = prefix.size(); k < dot; ++k) {
    if (key[k] < '0' || key[k] > '9') return {-1, ""};
    index = index * 10 + (key[k] - '0');
  }
  return {index, key.substr(dot + 1)};
}

}  // namespace

ShardedOptimizer::ShardedOptimizer(optim::Optimizer& optimizer, ProcessGroup& group)
    : optimizer_(optimizer), group_(group) {
  const std::vector<Tensor>& params = optimizer_.params();
  // Every rank must deal out the same parameters: the count first (so that the sizes'
  // reductions below have one length), then the sizes, as their max and min over the ranks.
  auto same_on_every_rank = [&](const std::vector<int64_t>& values) {
    const Tensor mine = from_vector(values, {static_cast<int64_t>(values.size())}).to(group_.device());
    Tensor largest = mine.clone(), smallest = mine.clone();
    group_.all_reduce(largest, ReduceOp::Max);
    group_.all_reduce(smallest, ReduceOp::Min);
    return largest.to(Device::cpu()).to_vector<int64_t>() == smallest.to(Device::cpu()).to_vector<int64_t>();
  };
  NC_CHECK(same_on_every_rank({static_cast<int64_t>(params.size())}), ValueError, "ShardedOptimizer: rank ",
           group_.rank(), " has an optimizer over ", params.size(),
           " parameters, another rank over a different number");
  std::vector<int64_t> sizes;
  for (const Tensor& p : params) sizes.push_back(p.numel());
  NC_CHECK(same_on_every_rank(sizes), ValueError, "ShardedOptimizer: rank ", group_.rank(),
           " has parameters of other sizes than another rank's");
  std::vector<int64_t> held(static_cast<size_t>(group_.world_size()), 0);
  owners_.reserve(params.size());
  for (const Tensor& p : params) {
    const int r = static_cast<int>(std::min_element(held.begin(), held.end()) - held.begin());
    owners_.push_back(r);
    held[static_cast<size_t>(r)] += p.numel();
  }
}

ShardedOptimizer::~ShardedOptimizer() = default;

int ShardedOptimizer::owner(size_t index) const {
  NC_CHECK(index < owners_.size(), IndexError, "ShardedOptimizer.owner: index ", index, " is out of range for ",
           owners_.size(), " parameters");
  return owners_[index];
}

void ShardedOptimizer::step() { step_unless(Tensor()); }

void ShardedOptimizer::step_unless(const Tensor& found_inf) {
  const std::vector<Tensor>& params = optimizer_.params();
  for (size_t i = 0; i < params.size(); ++i)
    if (owners_[i] != group_.rank()) params[i].zero_grad();
  optimizer_.step_unless(found_inf);
  share_parameters();
}

void ShardedOptimizer::share_parameters() {
  autograd::NoGradGuard no_grad;
  const std::vector<Tensor>& params = optimizer_.params();
  for (int r = 0; r < group_.world_size(); ++r) {
    std::map<DType, std::vector<size_t>> by_dtype;
    for (size_t i = 0; i < params.size(); ++i)
      if (owners_[i] == r) by_dtype[params[i].dtype()].push_back(i);
    for (const auto& [dtype, indices] : by_dtype) {
      int64_t total = 0;
      for (size_t i : indices) total += params[i].numel();
      Tensor flat;
      if (r == group_.rank()) {
        std::vector<Tensor> pieces;
        for (size_t i : indices) pieces.push_back(params[i].detach().reshape({-1}));
        flat = cat(pieces, 0);
      } else {
        flat = empty({total}, TensorOptions(dtype, params[indices[0]].device()));
      }
      group_.broadcast(flat, r);
      if (r == group_.rank()) continue;
      int64_t offset = 0;
      for (size_t i : indices) {
        Tensor p = params[i].detach();
        p.copy_(flat.narrow(0, offset, p.numel()).view(p.shape()));
        offset += p.numel();
      }
    }
  }
}

optim::StateDict ShardedOptimizer::state_dict() {
  const optim::StateDict local = optimizer_.state_dict();
  optim::StateDict out;
  for (const auto& [key, value] : local)
    if (state_entry(key).first < 0) out.emplace_back(key, value);  // hyperparameters: the same on every rank
  // A parameter's entries, from its owner, in the optimizer's order.
  std::map<int64_t, optim::StateDict> by_index;
  for (int r = 0; r < group_.world_size(); ++r) {
    // The description: [count, then per entry: index, name id, dtype, dim, sizes...], and
    // the names as bytes after it (an entry's name id indexes them).
    std::vector<int64_t> description;
    std::vector<std::pair<std::string, Tensor>> own;
    if (r == group_.rank()) {
      std::vector<std::string> own_names;
      for (const auto& [key, value] : local) {
        const auto [index, name] = state_entry(key);
        if (index < 0) continue;
        own.emplace_back(key, value);
        auto it = std::find(own_names.begin(), own_names.end(), name);
        if (it == own_names.end()) it = own_names.insert(own_names.end(), name);
        description.push_back(index);
        description.push_back(it - own_names.begin());
        description.push_back(static_cast<int64_t>(value.dtype()));
        description.push_back(value.dim());
        for (int64_t d : value.shape()) description.push_back(d);
      }
      std::string joined;
      for (const std::string& n : own_names) joined += n + '\0';
      description.insert(description.begin(), static_cast<int64_t>(own.size()));
      description.insert(description.begin() + 1, static_cast<int64_t>(joined.size()));
      for (char c : joined) description.push_back(static_cast<unsigned char>(c));
    }
    Tensor length = full({1}, static_cast<int64_t>(description.size()), TensorOptions(DType::I64, group_.device()));
    group_.broadcast(length, r);
    const int64_t n = length.to(Device::cpu()).item<int64_t>();
    Tensor text = r == group_.rank() ? from_vector(description, {n}).to(group_.device())
                                     : empty({n}, TensorOptions(DType::I64, group_.device()));
    group_.broadcast(text, r);
    const std::vector<int64_t> d = text.to(Device::cpu()).to_vector<int64_t>();
    const int64_t count = d[0], joined_size = d[1];
    std::vector<std::string> rank_names;
    {
      std::string current;
      for (int64_t k = n - joined_size; k < n; ++k) {
        if (d[static_cast<size_t>(k)] == 0) {
          rank_names.push_back(current);
          current.clear();
        } else {
          current += static_cast<char>(d[static_cast<size_t>(k)]);
        }
      }
    }
    size_t at = 2;
    for (int64_t e = 0; e < count; ++e) {
      const int64_t index = d[at], name_id = d[at + 1];
      const auto dtype = static_cast<DType>(d[at + 2]);
      const int64_t dims = d[at + 3];
      Shape shape(d.begin() + static_cast<std::ptrdiff_t>(at + 4),
                  d.begin() + static_cast<std::ptrdiff_t>(at + 4 + dims));
      at += static_cast<size_t>(4 + dims);
      Tensor t = r == group_.rank() ? own[static_cast<size_t>(e)].second.to(group_.device())
                                    : empty(shape, TensorOptions(dtype, group_.device()));
      group_.broadcast(t, r);
      by_index[index].emplace_back(
          std::string(kStatePrefix) + std::to_string(index) + "." + rank_names[static_cast<size_t>(name_id)], t);
    }
  }
  // The order an optimizer holding everything gives: by index, then its names' order.
  for (auto& [index, list] : by_index)
    for (auto& entry : list) out.push_back(std::move(entry));
  return out;
}

void ShardedOptimizer::load_state_dict(const optim::StateDict& state) {
  optim::StateDict mine;
  for (const auto& [key, value] : state) {
    const int64_t index = state_entry(key).first;
    // Malformed entries and indices past the parameters go through: the optimizer names them.
    if (index < 0 || index >= static_cast<int64_t>(owners_.size()) ||
        owners_[static_cast<size_t>(index)] == group_.rank())
      mine.emplace_back(key, value);
  }
  optimizer_.load_state_dict(mine);
}

}  // namespace distributed
}  // namespace normcore
