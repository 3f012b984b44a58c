// Hugging Face GPT-2 checkpoints (normcore/gpt.h: load_hf_gpt2, save_hf_gpt2): a
// GPT2LMHeadModel's config.json and model.safetensors mapped onto models::GPT. The names
// differ (transformer.h.N.attn.c_attn ~ blocks.N.attn.qkv) and so does the layout of the
// projections: GPT-2's Conv1D keeps its weight as [in, out], a Linear as [out, in], so each
// is transposed on the way in and out. The head is tied to the token embedding on both sides.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "normcore/autograd.h"
#include "normcore/gpt.h"
#include "normcore/ops.h"
#include "normcore/safetensors.h"

namespace normcore {
namespace models {

namespace {

using Json = nlohmann::json;

constexpr const char* kConfigFile = "config.json";
constexpr const char* kWeightsFile = "model.safetensors";
constexpr int64_t kMaxConfigBytes = int64_t{1} << 20;  // config.json files are a few KB

Json read_config(const std::string& path) {
  std::error_code error;
  const auto size = std::filesystem::file_size(path, error);
  NC_CHECK(!error, IOError, "load_hf_gpt2: cannot read ", path, " (", error.message(), ")");
  NC_CHECK(static_cast<int64_t>(size) <= kMaxConfigBytes, IOError, "load_hf_gpt2: ", path, " is ", size,
           " bytes; a GPT-2 config.json is a few KB");
  std::ifstream in(path, std::ios::binary);
  NC_CHECK(in, IOError, "load_hf_gpt2: cannot open ", path);
  std::stringstream text;
  text << in.rdbuf();
  try {
    Json config = Json::parse(text.str());
    NC_CHECK(config.is_object(), IOError, "load_hf_gpt2: ", path, " is not a JSON object");
    return config;
  } catch (const Json::parse_error& e) {
    throw IOError(detail::cat_str("load_hf_gpt2: ", path, " is not valid JSON: ", e.what()));
  }
}

// config[key] as a whole number >= min (IOError naming the file and the field otherwise).
int64_t whole_field(const Json& config, const std::string& path, const char* key, int64_t min) {
  NC_CHECK(config.contains(key), IOError, "load_hf_gpt2: ", path, " has no \"", key, "\"");
  const Json& value = config[key];
  NC_CHECK(value.is_number_integer() && value.get<int64_t>() >= min, IOError, "load_hf_gpt2: ", path, " has \"", key,
           "\": ", value.dump(), " (a whole number >= ", min, " is needed)");
  return value.get<int64_t>();
}

GPTConfig config_from(const Json& config, const std::string& path) {
  if (config.contains("model_type"))
    NC_CHECK(config["model_type"] == "gpt2", IOError, "load_hf_gpt2: ", path,
             " has \"model_type\": ", config["model_type"].dump(), ", not \"gpt2\"");
  GPTConfig c;
  c.vocab_size = whole_field(config, path, "vocab_size", 1);
  c.context = whole_field(config, path, "n_positions", 1);
  c.embed = whole_field(config, path, "n_embd", 1);
  c.layers = whole_field(config, path, "n_layer", 1);
  c.heads = whole_field(config, path, "n_head", 1);
  // What changes the arithmetic must be what models::GPT computes; the rest (dropout rates,
  // token ids, task parameters) does not matter to inference and is not read.
  if (config.contains("n_inner") && !config["n_inner"].is_null())
    NC_CHECK(config["n_inner"] == 4 * c.embed, IOError, "load_hf_gpt2: ", path,
             " has \"n_inner\": ", config["n_inner"].dump(), "; only 4 * n_embd (", 4 * c.embed, ") is supported");
  const std::string activation = config.value("activation_function", std::string("gelu_new"));
  NC_CHECK(activation == "gelu_new" || activation == "gelu_pytorch_tanh", IOError, "load_hf_gpt2: ", path,
           " has \"activation_function\": \"", activation, "\"; GPT's MLP is the tanh GELU (gelu_new)");
  const double eps = config.value("layer_norm_epsilon", 1e-5);
  NC_CHECK(std::fabs(eps - 1e-5) <= 1e-12, IOError, "load_hf_gpt2: ", path, " has \"layer_norm_epsilon\": ", eps,
           "; GPT's LayerNorm uses 1e-5");
  NC_CHECK(config.value("scale_attn_weights", true) && !config.value("scale_attn_by_inverse_layer_idx", false), IOError,
           "load_hf_gpt2: ", path, " scales attention other than by 1 / sqrt(head dim)");
  NC_CHECK(config.value("tie_word_embeddings", true), IOError, "load_hf_gpt2: ", path,
           " unties the head from the token embedding; GPT's head is tied");
  NC_CHECK(c.embed % c.heads == 0, IOError, "load_hf_gpt2: ", path, " has \"n_embd\" ", c.embed,
           " not divisible by \"n_head\" ", c.heads);
  return c;
}

// One of GPT's tensors and its name in the checkpoint (without "transformer."), with whether
// the checkpoint holds it transposed (Conv1D).
struct Mapped {
  std::string ours, theirs;
  bool transposed;
};

std::vector<Mapped> name_map(int64_t layers) {
  std::vector<Mapped> map = {{"tok_emb.weight", "wte.weight", false}, {"pos_emb.weight", "wpe.weight", false}};
  const std::pair<const char*, const char*> norms[] = {{"norm1", "ln_1"}, {"norm2", "ln_2"}};
  const std::pair<const char*, const char*> linears[] = {
      {"attn.qkv", "attn.c_attn"}, {"attn.proj", "attn.c_proj"}, {"mlp.fc", "mlp.c_fc"}, {"mlp.proj", "mlp.c_proj"}};
  for (int64_t i = 0; i < layers; ++i) {
    const std::string ours = "blocks." + std::to_string(i) + ".", theirs = "h." + std::to_string(i) + ".";
    for (const auto& [a, b] : norms) {
      map.push_back({ours + a + ".weight", theirs + b + ".weight", false});
      map.push_back({ours + a + ".bias", theirs + b + ".bias", false});
    }
    for (const auto& [a, b] : linears) {
      map.push_back({ours + a + ".weight", theirs + b + ".weight", true});
      map.push_back({ours + a + ".bias", theirs + b + ".bias", false});
    }
  }
  map.push_back({"norm_f.weight", "ln_f.weight", false});
  map.push_back({"norm_f.bias", "ln_f.bias", false});
  return map;
}

}  // namespace

std::shared_ptr<GPT> load_hf_gpt2(const std::string& dir, Device device) {
  const std::string config_path = (std::filesystem::path(dir) / kConfigFile).string();
  const std::string weights_path = (std::filesystem::path(dir) / kWeightsFile).string();
  const GPTConfig config = config_from(read_config(config_path), config_path);
  const safetensors::File file = safetensors::load(weights_path);
  // GPT2LMHeadModel's names start with "transformer."; GPT2Model's do not.
  std::map<std::string, const Tensor*> tensors;
  for (const auto& [name, t] : file.tensors) {
    const bool prefixed = name.compare(0, 12, "transformer.") == 0;
    tensors[prefixed ? name.substr(12) : name] = &t;
  }
  // Every tensor is checked against the config before the model is built, so a config
  // cannot make the loader allocate more than the file holds.
  const std::vector<Mapped> map = name_map(config.layers);
  const int64_t C = config.embed;
  auto expected_shape = [&](const Mapped& m) -> Shape {
    const std::string& n = m.ours;
    auto ends = [&n](const char* tail) {
      const std::string t(tail);
      return n.size() >= t.size() && n.compare(n.size() - t.size(), t.size(), t) == 0;
    };
    if (n == "tok_emb.weight") return {config.vocab_size, C};
    if (n == "pos_emb.weight") return {config.context, C};
    if (ends("attn.qkv.weight")) return {C, 3 * C};
    if (ends("attn.qkv.bias")) return {3 * C};
    if (ends("attn.proj.weight")) return {C, C};
    if (ends("mlp.fc.weight")) return {C, 4 * C};
    if (ends("mlp.fc.bias")) return {4 * C};
    if (ends("mlp.proj.weight")) return {4 * C, C};
    return {C};  // norms and the other biases
  };
  for (const Mapped& m : map) {
    auto it = tensors.find(m.theirs);
    NC_CHECK(it != tensors.end(), IOError, "load_hf_gpt2: ", weights_path, " has no tensor \"transformer.", m.theirs,
             "\" (", config_path, " has ", config.layers, " layers)");
    const Shape want = expected_shape(m);
    NC_CHECK(it->second->shape() == want, ShapeError, "load_hf_gpt2: ", weights_path, ": \"transformer.", m.theirs,
             "\" is ", describe(*it->second), ", but ", config_path, " calls for ", shape_str(want));
    NC_CHECK(is_floating(it->second->dtype()), IOError, "load_hf_gpt2: ", weights_path, ": \"transformer.", m.theirs,
             "\" is ", describe(*it->second), ", not floating");
  }
  auto head = tensors.find("lm_head.weight");
  if (head == tensors.end()) head = tensors.find("transformer.lm_head.weight");
  if (head != tensors.end())
    NC_CHECK(head->second->shape() == Shape({config.vocab_size, C}), ShapeError, "load_hf_gpt2: ", weights_path,
             ": \"lm_head.weight\" is ", describe(*head->second), ", not the token embedding's ",
             shape_str({config.vocab_size, C}));

  GPTConfig padded = config;
  padded.vocab_multiple = 128;  // the head's product prefers it; the padded rows are never used
  auto model = std::make_shared<GPT>(padded);
  {
    autograd::NoGradGuard no_grad;
    const nn::NamedTensors ours = model->state_dict();
    std::map<std::string, Tensor> by_name(ours.begin(), ours.end());
    Tensor& embedding = by_name.at("tok_emb.weight");
    embedding.narrow(0, config.vocab_size, padded.padded_vocab_size() - config.vocab_size).zero_();
    for (const Mapped& m : map) {
      const Tensor& source = *tensors.at(m.theirs);
      Tensor target = by_name.at(m.ours);
      if (m.ours == "tok_emb.weight") target = target.narrow(0, 0, config.vocab_size);
      target.copy_(m.transposed ? source.t() : source);
    }
  }
  model->to(device);
  model->eval();
  return model;
}

void save_hf_gpt2(const GPT& model, const std::string& dir) {
  const GPTConfig& c = model.config;
  NC_CHECK(c.norm == "layernorm" && c.bias, ValueError,
           "save_hf_gpt2: GPT-2 has LayerNorm with biases; this model has ", c.norm, c.bias ? "" : " without biases");
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  NC_CHECK(!error, IOError, "save_hf_gpt2: cannot create ", dir, " (", error.message(), ")");
  const nn::NamedTensors ours = model.state_dict();
  std::map<std::string, Tensor> by_name(ours.begin(), ours.end());
  safetensors::TensorList tensors;
  for (const Mapped& m : name_map(c.layers)) {
    Tensor t = by_name.at(m.ours);
    if (m.ours == "tok_emb.weight") t = t.narrow(0, 0, c.vocab_size);  // the padded rows stay here
    tensors.emplace_back("transformer." + m.theirs, m.transposed ? t.t().contiguous() : t);
  }
  safetensors::save((std::filesystem::path(dir) / kWeightsFile).string(), tensors, {{"format", "pt"}});
  Json config = {{"model_type", "gpt2"},
                 {"architectures", {"GPT2LMHeadModel"}},
                 {"vocab_size", c.vocab_size},
                 {"n_positions", c.context},
                 {"n_embd", c.embed},
                 {"n_layer", c.layers},
                 {"n_head", c.heads},
                 {"n_inner", nullptr},
                 {"activation_function", "gelu_new"},
                 {"layer_norm_epsilon", 1e-5},
                 {"resid_pdrop", c.dropout},
                 {"embd_pdrop", c.dropout},
                 {"attn_pdrop", 0.0},
                 {"tie_word_embeddings", true}};
  const std::string config_path = (std::filesystem::path(dir) / kConfigFile).string();
  std::ofstream out(config_path, std::ios::binary | std::ios::trunc);
  out << config.dump(2) << "\n";
  NC_CHECK(out.good(), IOError, "save_hf_gpt2: cannot write ", config_path);
}

}  // namespace models
}  // namespace normcore
