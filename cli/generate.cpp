// The normcore program's generate: a train-lm checkpoint, or a Hugging Face GPT-2 folder with
// its tokenizer, continuing a prompt with each token's bytes written as it is chosen.
#include <cstdio>
#include <filesystem>
#include <string>

#include "cli/commands.h"
#include "normcore/gpt.h"

namespace cli {

namespace nc = normcore;

int generate(const Args& args) {
  nc::Device device = pick_device(args.options.at("device"));
  nc::models::GenerateOptions options;
  options.temperature = number(args, "temperature");
  options.top_k = integer(args, "top-k", 0);
  options.top_p = number(args, "top-p");
  options.seed = static_cast<uint64_t>(integer(args, "seed", 0));
  const int64_t tokens = integer(args, "tokens", 0);
  const std::string& prompt = args.options.at("prompt");
  // A Hugging Face GPT-2 folder (any vocabulary, the prompt through its tokenizer) or a
  // byte-level checkpoint; each token's bytes are written as it is chosen.
  const std::string& folder = args.options.at("model");
  NC_CHECK(!folder.empty() || args.options.at("tokenizer").empty(), ValueError,
           "--tokenizer: goes with --model (a byte-level --checkpoint has no tokenizer)");
  NC_CHECK(folder.empty() || std::filesystem::is_directory(folder), IOError, "--model: ", folder,
           " is not a folder (a Hugging Face GPT-2 folder holds config.json and model.safetensors)");
  nc::models::TextGenerator generator(folder.empty() ? args.options.at("checkpoint") : folder, device,
                                      args.options.at("tokenizer"));
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  std::fflush(stdout);
  generator.generate(prompt, tokens, options, [](const std::string& piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  });
  std::printf("\n");
  return 0;
}

}  // namespace cli
