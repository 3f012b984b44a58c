// The one checkpoint format of every model (normcore/train.h: TrainingState): written here,
// and read here from it and from the two older formats (the classifier's, the GPT's), so
// that their files still resume.
#include <string>

#include "models/checkpoint_text.h"
#include "normcore/error.h"
#include "normcore/safetensors.h"
#include "normcore/train.h"

namespace normcore {
namespace train {

namespace {

constexpr const char* kOldClassifierFormat = "normcore-classifier";
constexpr const char* kOldGptFormat = "normcore-gpt";

void add_prefixed(safetensors::TensorList& out, const std::string& prefix, const nn::NamedTensors& tensors) {
  for (const auto& [name, t] : tensors) out.emplace_back(prefix + name, t);
}

// The entries of state whose names start with prefix, taken out of it (prefix removed).
nn::NamedTensors take_out(nn::NamedTensors& state, const std::string& prefix) {
  nn::NamedTensors mine, rest;
  for (auto& [name, t] : state) {
    if (name.compare(0, prefix.size(), prefix) == 0) mine.emplace_back(name.substr(prefix.size()), t);
    else rest.emplace_back(name, t);
  }
  state = std::move(rest);
  return mine;
}

}  // namespace

void save_training_state(const std::string& path, const TrainingState& state) {
  safetensors::TensorList tensors;
  add_prefixed(tensors, "model.", state.model_state);
  add_prefixed(tensors, "optim.", state.optimizer_state);
  add_prefixed(tensors, "schedule.", state.schedule_state);
  add_prefixed(tensors, "scaler.", state.scaler_state);
  std::map<std::string, std::string> metadata;
  for (const auto& [k, v] : state.options) metadata["option." + k] = v;
  for (const auto& [k, v] : state.description) metadata["config." + k] = v;
  metadata["format"] = kCheckpointFormat;
  metadata["model"] = state.model;
  NC_CHECK(state.step >= 0 || (state.epoch >= 0 && state.batch >= 0), ValueError, "save_training_state: ", path,
           ": the state has neither a step nor a data position (epoch ", state.epoch, ", batch ", state.batch, ")");
  if (state.step >= 0) metadata["step"] = std::to_string(state.step);
  if (state.epoch >= 0 && state.batch >= 0) {
    metadata["data.epoch"] = std::to_string(state.epoch);
    metadata["data.batch"] = std::to_string(state.batch);
  }
  if (state.has_rng) {
    metadata["data.seed"] = std::to_string(state.data_seed);
    metadata["rng.seed"] = std::to_string(state.seed);
    metadata["rng.offset"] = std::to_string(state.rng_offset);
  }
  safetensors::save(path, tensors, metadata);
}

TrainingState load_training_state(const std::string& path) {
  safetensors::File file = safetensors::load(path);
  auto meta = [&](const std::string& key) -> const std::string& {
    auto it = file.metadata.find(key);
    NC_CHECK(it != file.metadata.end(), IOError, "load_training_state: ", path,
             " is not a normcore checkpoint (its metadata has no '", key, "')");
    return it->second;
  };
  auto whole = [&](const std::string& key) {
    int64_t value = 0;
    NC_CHECK(models::parse_whole(meta(key), &value) && value >= 0, IOError, "load_training_state: ", path,
             " has a malformed ", key, " '", meta(key), "' (expected a whole number >= 0)");
    return value;
  };
  const std::string format = meta("format");
  const bool old_classifier = format == kOldClassifierFormat, old_gpt = format == kOldGptFormat;
  NC_CHECK(format == kCheckpointFormat || old_classifier || old_gpt, IOError, "load_training_state: ", path,
           " has format '", format, "', expected '", kCheckpointFormat, "' (or the older '", kOldClassifierFormat,
           "' or '", kOldGptFormat, "')");
  TrainingState s;
  s.model = old_gpt ? "gpt" : meta("model");
  for (const auto& [k, v] : file.metadata) {
    if (k.compare(0, 7, "option.") == 0) s.options[k.substr(7)] = v;
    if (k.compare(0, 7, "config.") == 0) s.description[k.substr(7)] = v;
  }
  s.model_state = models::take_prefixed(file.tensors, "model.");
  s.optimizer_state = models::take_prefixed(file.tensors, "optim.");
  s.schedule_state = models::take_prefixed(file.tensors, "schedule.");
  s.scaler_state = models::take_prefixed(file.tensors, "scaler.");
  // The generator: "rng.*" here, the "option.seed" and "option.rng.offset" the older
  // commands saved among their options.
  const std::string seed_key = old_classifier || old_gpt ? "option.seed" : "rng.seed";
  const std::string offset_key = old_classifier || old_gpt ? "option.rng.offset" : "rng.offset";
  s.has_rng = file.metadata.count(seed_key) && file.metadata.count(offset_key);
  if (s.has_rng) {
    s.seed = static_cast<uint64_t>(whole(seed_key));
    s.rng_offset = static_cast<uint64_t>(whole(offset_key));
    // The older commands seeded the generator and the loader alike.
    s.data_seed = file.metadata.count("data.seed") ? static_cast<uint64_t>(whole("data.seed")) : s.seed;
  }
  s.options.erase("rng.offset");
  if (old_classifier) {
    // Saved at the end of an epoch; the fp16 scaler among the optimizer's entries.
    s.epoch = whole("epoch");
    s.batch = 0;
    s.scaler_state = take_out(s.optimizer_state, "grad_scaler.");
  } else if (old_gpt) {
    s.step = whole("step");
    s.scaler_state = take_out(s.optimizer_state, "grad_scaler.");
  } else {
    // A step, a data position or both (a model saved between epochs has no step count).
    if (file.metadata.count("step")) s.step = whole("step");
    if (file.metadata.count("data.epoch") || !file.metadata.count("step")) {
      s.epoch = whole("data.epoch");
      s.batch = whole("data.batch");
    }
  }
  s.metadata = std::move(file.metadata);
  return s;
}

}  // namespace train
}  // namespace normcore
