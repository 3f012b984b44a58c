// Writing text with a trained GPT in an application: load a checkpoint (from
// `normcore train-lm`) once, then stream continuations of prompts, byte by byte, as they are
// decoded. Build it against normcore like any other library (see CMakeLists.txt beside this file).
#include <cstdio>
#include <cstdlib>
#include <string>

#include <normcore/device.h>
#include <normcore/gpt.h>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s CHECKPOINT PROMPT [BYTES [SEED [DEVICE]]]\n", argv[0]);
    return 2;
  }
  try {
    const normcore::Device device = argc > 5 ? normcore::Device(argv[5]) : normcore::best_device();
    normcore::models::TextGenerator generator(argv[1], device);
    normcore::models::GenerateOptions options;  // temperature 0.8, all bytes
    options.seed = argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 0;
    const long bytes = argc > 3 ? std::strtol(argv[3], nullptr, 10) : 200;
    std::fputs(argv[2], stdout);
    generator.generate(argv[2], bytes, options, [](const std::string& piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    });
    std::printf("\n");
  } catch (const normcore::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
