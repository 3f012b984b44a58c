// ShardedOptimizer (normcore/distributed.h): ZeRO stage 1 over an optimizer whose update
// goes element by element. The parameters, flattened and laid end to end, are cut into
// world_size pieces of ceil(total / world_size) elements (a parameter may straddle two
// ranks); a rank's own optimizer (make_like, so it shares the learning rate, also in a
// replayed CUDA graph) runs over views of its pieces, whose gradients are views of the whole
// gradients. After its update the ranks all-gather their pieces, one flat buffer per dtype.
// The whole state_dict is put together by broadcasts from each rank in turn: a description
// of its entries (parameter, first element, name, dtype, shape) as i64, then each entry; a
// piece's state of the piece's shape is a slice of the parameter's, a 0-dim one (Adam's step
// count) the parameter's as it is.
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

// The index of a "state.<index>.<name>" entry, and the name; {-1, ""} for any other entry
// or a malformed one.
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

std::string state_key(int64_t index, const std::string& name) {
  return kStatePrefix + std::to_string(index) + "." + name;
}

// The entries of state that are not per parameter (the hyperparameters).
optim::StateDict hyperparameters(const optim::StateDict& state) {
  optim::StateDict out;
  for (const auto& entry : state)
    if (entry.first.compare(0, std::string(kStatePrefix).size(), kStatePrefix) != 0) out.push_back(entry);
  return out;
}

}  // namespace

ShardedOptimizer::ShardedOptimizer(optim::Optimizer& optimizer, ProcessGroup& group)
    : optimizer_(optimizer), group_(group) {
  const std::vector<Tensor>& params = optimizer_.params();
  // Every rank must cut the same parameters: the count first (so that the sizes' reductions
  // below have one length), then the sizes, as their max and min over the ranks.
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
  int64_t total = 0;
  for (const Tensor& p : params) {
    sizes.push_back(p.numel());
    total += p.numel();
  }
  NC_CHECK(same_on_every_rank(sizes), ValueError, "ShardedOptimizer: rank ", group_.rank(),
           " has parameters of other sizes than another rank's");
  const int world = group_.world_size();
  const int64_t share = (total + world - 1) / world;
  pieces_.resize(static_cast<size_t>(world));
  int64_t start = 0;  // of the parameter in the whole
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t n = params[i].numel();
    for (int64_t at = start; at < start + n;) {
      const int rank = static_cast<int>(at / share);
      const int64_t end = std::min(start + n, (rank + 1) * share);
      const Tensor view = params[i].detach().reshape({-1}).narrow(0, at - start, end - at);
      pieces_[static_cast<size_t>(rank)].push_back({i, at - start, end - at, view});
      at = end;
    }
    start += n;
  }
  // The all-gathers, the same on every rank (every rank knows every rank's pieces).
  std::map<DType, Gather> by_dtype;
  for (int r = 0; r < world; ++r) {
    const std::vector<Piece>& pieces = pieces_[static_cast<size_t>(r)];
    std::map<DType, int64_t> counts;
    for (size_t k = 0; k < pieces.size(); ++k) {
      const DType dtype = pieces[k].view.dtype();
      Gather& g = by_dtype.emplace(dtype, Gather{dtype, 0, std::vector<std::vector<size_t>>(world)}).first->second;
      g.pieces[static_cast<size_t>(r)].push_back(k);
      g.longest = std::max(g.longest, counts[dtype] += pieces[k].count);
    }
  }
  for (auto& entry : by_dtype) gathers_.push_back(std::move(entry.second));

  const std::vector<Piece>& own = pieces_[static_cast<size_t>(group_.rank())];
  if (own.empty()) return;
  std::vector<Tensor> views;
  for (const Piece& piece : own) views.push_back(piece.view);
  own_ = optimizer_.make_like(std::move(views));
}

ShardedOptimizer::~ShardedOptimizer() = default;

int64_t ShardedOptimizer::elements() const {
  int64_t n = 0;
  for (const Piece& piece : pieces_[static_cast<size_t>(group_.rank())]) n += piece.count;
  return n;
}

void ShardedOptimizer::step() { step_unless(Tensor()); }

void ShardedOptimizer::step_unless(const Tensor& found_inf) {
  if (own_) {
    const std::vector<Tensor>& params = optimizer_.params();
    for (const Piece& piece : pieces_[static_cast<size_t>(group_.rank())]) {
      const Tensor grad = params[piece.param].grad();
      piece.view.set_grad(grad.defined() ? grad.reshape({-1}).narrow(0, piece.begin, piece.count) : Tensor());
    }
    own_->step_unless(found_inf);
    for (const Piece& piece : pieces_[static_cast<size_t>(group_.rank())]) piece.view.zero_grad();
  }
  share_parameters();
}

// Every rank's pieces to every rank: one all_gather per dtype (gathers_).
void ShardedOptimizer::share_parameters() {
  autograd::NoGradGuard no_grad;
  const int world = group_.world_size(), me = group_.rank();
  for (const Gather& g : gathers_) {
    const TensorOptions options(g.dtype, group_.device());
    std::vector<Tensor> mine;
    int64_t count = 0;
    for (size_t k : g.pieces[static_cast<size_t>(me)]) {
      mine.push_back(pieces_[static_cast<size_t>(me)][k].view);
      count += pieces_[static_cast<size_t>(me)][k].count;
    }
    if (count < g.longest) mine.push_back(zeros({g.longest - count}, options));
    Tensor gathered = empty({world * g.longest}, options);
    group_.all_gather(gathered, cat(mine, 0));
    for (int r = 0; r < world; ++r) {
      if (r == me) continue;
      int64_t offset = r * g.longest;
      for (size_t k : g.pieces[static_cast<size_t>(r)]) {
        const Piece& piece = pieces_[static_cast<size_t>(r)][k];
        Tensor view = piece.view;
        view.copy_(gathered.narrow(0, offset, piece.count));
        offset += piece.count;
      }
    }
  }
}

optim::StateDict ShardedOptimizer::state_dict() {
  const std::vector<Tensor>& params = optimizer_.params();
  const optim::StateDict local = own_ ? own_->state_dict() : optim::StateDict();
  optim::StateDict out = hyperparameters(optimizer_.state_dict());
  // Per parameter, its entries in the order they first come (an optimizer's own order).
  std::map<size_t, std::vector<std::pair<std::string, Tensor>>> whole;
  auto entry_of = [&](size_t param, const std::string& name) -> Tensor* {
    auto& list = whole[param];
    for (auto& entry : list)
      if (entry.first == name) return &entry.second;
    return nullptr;
  };
  for (int r = 0; r < group_.world_size(); ++r) {
    const std::vector<Piece>& pieces = pieces_[static_cast<size_t>(r)];
    // The description: [count, names' bytes, then per entry: piece, name id, dtype, dim,
    // sizes...], then the names, each ended by a 0.
    std::vector<int64_t> description;
    std::vector<Tensor> own;
    if (r == group_.rank()) {
      std::vector<std::string> names;
      std::vector<int64_t> entries;
      for (const auto& [key, value] : local) {
        const auto [piece, name] = state_entry(key);
        if (piece < 0) continue;
        own.push_back(value);
        auto it = std::find(names.begin(), names.end(), name);
        if (it == names.end()) it = names.insert(names.end(), name);
        entries.insert(entries.end(), {piece, it - names.begin(), static_cast<int64_t>(value.dtype()), value.dim()});
        for (int64_t d : value.shape()) entries.push_back(d);
      }
      std::vector<int64_t> text;
      for (const std::string& name : names) {
        for (char c : name) text.push_back(static_cast<unsigned char>(c));
        text.push_back(0);
      }
      description = {static_cast<int64_t>(own.size()), static_cast<int64_t>(text.size())};
      description.insert(description.end(), entries.begin(), entries.end());
      description.insert(description.end(), text.begin(), text.end());
    }
    Tensor length = full({1}, static_cast<int64_t>(description.size()), TensorOptions(DType::I64, group_.device()));
    group_.broadcast(length, r);
    const int64_t n = length.to(Device::cpu()).item<int64_t>();
    Tensor sent = r == group_.rank() ? from_vector(description, {n}).to(group_.device())
                                     : empty({n}, TensorOptions(DType::I64, group_.device()));
    group_.broadcast(sent, r);
    const std::vector<int64_t> d = sent.to(Device::cpu()).to_vector<int64_t>();
    std::vector<std::string> names(1);
    for (int64_t k = n - d[1]; k < n; ++k) {
      if (d[static_cast<size_t>(k)] != 0) names.back() += static_cast<char>(d[static_cast<size_t>(k)]);
      else names.emplace_back();
    }
    size_t at = 2;
    for (int64_t e = 0; e < d[0]; ++e) {
      const Piece& piece = pieces[static_cast<size_t>(d[at])];
      const std::string& name = names[static_cast<size_t>(d[at + 1])];
      const auto dtype = static_cast<DType>(d[at + 2]);
      const auto dims = static_cast<size_t>(d[at + 3]);
      const Shape shape(d.begin() + static_cast<std::ptrdiff_t>(at + 4),
                        d.begin() + static_cast<std::ptrdiff_t>(at + 4 + dims));
      at += 4 + dims;
      Tensor t = r == group_.rank() ? own[static_cast<size_t>(e)].to(group_.device())
                                    : empty(shape, TensorOptions(dtype, group_.device()));
      group_.broadcast(t, r);
      const Tensor& param = params[piece.param];
      Tensor* whole_entry = entry_of(piece.param, name);
      const bool sliced = shape == Shape{piece.count};
      if (whole_entry == nullptr) {
        whole[piece.param].emplace_back(name, sliced ? empty({param.numel()}, TensorOptions(dtype, t.device())) : t);
        whole_entry = &whole[piece.param].back().second;
      }
      if (sliced) whole_entry->narrow(0, piece.begin, piece.count).copy_(t);
    }
  }
  for (auto& [param, list] : whole) {
    for (auto& [name, value] : list) {
      const Shape& shape = params[param].shape();
      out.emplace_back(state_key(static_cast<int64_t>(param), name),
                       value.numel() == params[param].numel() && value.dim() == 1 ? value.reshape(shape) : value);
    }
  }
  return out;
}

void ShardedOptimizer::load_state_dict(const optim::StateDict& state) {
  const std::vector<Tensor>& params = optimizer_.params();
  const optim::StateDict hyper = hyperparameters(state);
  optimizer_.load_state_dict(hyper);  // checks them; the pieces' optimizer takes them too
  optim::StateDict mine = hyper;
  const std::vector<Piece>& own = pieces_[static_cast<size_t>(group_.rank())];
  for (const auto& [key, value] : state) {
    const auto [index, name] = state_entry(key);
    if (key.compare(0, std::string(kStatePrefix).size(), kStatePrefix) != 0) continue;
    NC_CHECK(index >= 0 && index < static_cast<int64_t>(params.size()), ValueError,
             "ShardedOptimizer.load_state_dict: entry '", key, "' names no parameter (", params.size(), " parameters)");
    const Tensor& param = params[static_cast<size_t>(index)];
    const bool whole = value.shape() == param.shape();
    NC_CHECK(whole || value.dim() == 0, ShapeError, "ShardedOptimizer.load_state_dict: entry '", key, "' is ",
             describe(value), ", neither parameter ", index, "'s shape ", shape_str(param.shape()), " nor 0-dim");
    for (size_t k = 0; k < own.size(); ++k) {
      if (own[k].param != static_cast<size_t>(index)) continue;
      mine.emplace_back(state_key(static_cast<int64_t>(k), name),
                        whole ? value.reshape({-1}).narrow(0, own[k].begin, own[k].count).clone() : value.clone());
    }
  }
  if (own_) own_->load_state_dict(mine);
}

}  // namespace distributed
}  // namespace normcore
