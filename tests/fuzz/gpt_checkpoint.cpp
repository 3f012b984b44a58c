// Fuzz target: models::load_gpt_checkpoint on arbitrary bytes written to a private file, then
// the model it gives over one token, whole and through its KV cache. Each must succeed or
// throw a normcore::Error; a config claiming a larger model than the file holds must be
// refused before the model is built (libFuzzer's malloc and RSS limits catch one that is not).
#include <cstddef>
#include <cstdint>

#include "normcore/gpt.h"
#include "normcore/normcore.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = normcore_fuzz::write_private_file("gpt_checkpoint", data, size);
  normcore_fuzz::expect_only_normcore_errors([&] {
    const normcore::models::GPTCheckpoint checkpoint = normcore::models::load_gpt_checkpoint(path);
    normcore::models::GPT& model = *checkpoint.model;
    const normcore::Tensor token = normcore::zeros({1, 1}, normcore::DType::I64);
    normcore_fuzz::touch(model(token));
    model.eval();
    normcore::models::GPTCache cache = model.make_cache(1);
    normcore_fuzz::touch(model.forward(token, cache));
    for (const auto& [name, t] : checkpoint.optimizer_state) normcore_fuzz::touch(t);
    for (const auto& [name, t] : checkpoint.schedule_state) normcore_fuzz::touch(t);
  });
  return 0;
}
