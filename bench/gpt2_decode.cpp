// Benchmark: GPT-2 124M (models::gpt2_config("gpt2"), random weights, eval and inference
// mode) serving one sequence on the GPU, in f32 (TF32 matrix products) and in bf16 (weights
// converted): the prefill of a --prompt-token prompt (GPT::prefill: the blocks over every
// position, the head over the last), and batch-1 greedy decoding of --tokens new tokens
// after an 8-token prompt through generate_tokens, each decoding step a CUDA graph replay and,
// beside it, run kernel by kernel. Decoding time is the whole call, its short prefill and
// every host read of a chosen id included; tokens/s = new tokens / that time. Medians of
// --reps. With --device cpu: the same in f32 on --threads CPU threads (wall-clock medians; no
// graphs). One table line and one JSON line per row; bench/gpt2_decode_torch.py times
// transformers' GPT2LMHeadModel the same way.
//   gpt2_decode [--tokens 256] [--prompt-tokens 1024] [--reps 5] [--device cuda|cpu] [--threads N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_timing.h"
#include "normcore/normcore.h"

namespace nc = normcore;
namespace models = normcore::models;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  int64_t new_tokens = 256, prompt_tokens = 1024;
  int reps = 5, threads = 0;
  std::string device_name = "cuda";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokens")) new_tokens = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--device")) device_name = argv[i + 1];
    else if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--prompt-tokens")) prompt_tokens = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s [--tokens N] [--prompt-tokens N] [--reps N] [--device cuda|cpu] [--threads N]\n",
                   argv[0]);
      return 2;
    }
  }
  if (argc % 2 == 0 || reps < 1 || new_tokens < 1 || prompt_tokens < 1 || prompt_tokens > 1024 ||
      new_tokens + 8 > 1024) {
    std::fprintf(stderr, "gpt2_decode: options come in pairs; --reps and --tokens positive, --tokens + 8 and "
                         "--prompt-tokens at most the context of 1024\n");
    return 2;
  }
  const bool on_cpu = device_name == "cpu";
  if (!on_cpu && (device_name != "cuda" || !nc::cuda_is_available())) {
    std::fprintf(stderr, "gpt2_decode: --device cuda needs a CUDA device (or pass --device cpu)\n");
    return 1;
  }
  if (threads > 0) nc::set_num_threads(threads);
  const nc::Device gpu = on_cpu ? nc::Device::cpu() : nc::Device::cuda(0);
  if (!on_cpu) nc::cuda::set_allow_tf32(true);
  if (on_cpu) std::printf("CPU, %d threads\n", nc::num_threads());
  nc::autograd::InferenceModeGuard inference;
  std::printf("%-6s %-28s %10s %12s\n", "dtype", "case", "ms", "tokens/s");
  const struct {
    const char* name;
    nc::DType dtype;
  } precisions[] = {{"f32", nc::DType::F32}, {"bf16", nc::DType::BF16}};
  for (const auto& precision : precisions) {
    if (on_cpu && precision.dtype != nc::DType::F32) continue;
    nc::Generator gen(0);
    models::GPT model(models::gpt2_config("gpt2"), &gen);
    model.to(gpu);
    model.to(precision.dtype);
    model.eval();
    const int64_t vocab = model.config.vocab_size;

    // The prefill: a fresh cache filled by prompt_tokens positions, the last one's logits.
    const nc::Tensor prompt = nc::randint(0, vocab, {1, prompt_tokens}, nc::TensorOptions(nc::DType::I64, gpu), &gen);
    models::GPTCache cache = model.make_cache(1);
    const auto prefill = [&] {
      cache.clear();
      model.prefill(prompt, cache);
    };
    double prefill_ms = 0;
    if (on_cpu) {
      std::vector<double> times;
      for (int r = 0; r < reps + 1; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        prefill();
        if (r > 0) times.push_back(seconds_since(t0) * 1e3);
      }
      prefill_ms = median(times);
    } else {
      prefill_ms = bench::median_ms(prefill, reps * 4);
    }
    std::printf("%-6s prefill of %-17lld %10.3f %12.0f\n", precision.name, static_cast<long long>(prompt_tokens),
                prefill_ms, static_cast<double>(prompt_tokens) / prefill_ms * 1e3);
    std::printf("{\"dtype\": \"%s\", \"case\": \"prefill\", \"tokens\": %lld, \"ms\": %.4f}\n", precision.name,
                static_cast<long long>(prompt_tokens), prefill_ms);

    std::vector<int64_t> start;
    for (int i = 0; i < 8; ++i) start.push_back((i * 7919) % vocab);
    std::vector<int64_t> reference;
    for (bool graphed : {true, false}) {
      if (on_cpu && graphed) continue;
      models::GenerateOptions options{0.0, 0, 0};
      options.cuda_graph = graphed;
      std::vector<double> times;
      std::vector<int64_t> ids;
      for (int r = 0; r < reps + 1; ++r) {  // the first run warms up
        if (!on_cpu) nc::cuda::synchronize(0);
        const auto t0 = std::chrono::steady_clock::now();
        ids = models::generate_tokens(model, start, new_tokens, options);
        if (r > 0) times.push_back(seconds_since(t0));
      }
      if (reference.empty()) reference = ids;
      else if (ids != reference) std::printf("%-6s WARNING: the direct decoding chose other tokens\n", precision.name);
      const double ms = median(times) * 1e3;
      const char* mode = graphed ? "graph" : "direct";
      std::printf("%-6s decode %lld greedy, %-6s %10.3f %12.0f  (%.3f ms a token)\n", precision.name,
                  static_cast<long long>(new_tokens), mode, ms, static_cast<double>(new_tokens) / ms * 1e3,
                  ms / static_cast<double>(new_tokens));
      std::printf("{\"dtype\": \"%s\", \"case\": \"decode\", \"mode\": \"%s\", \"tokens\": %lld, \"ms\": %.4f}\n",
                  precision.name, mode, static_cast<long long>(new_tokens), ms);
    }
  }
  return 0;
}
