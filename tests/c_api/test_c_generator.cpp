// The C API's text generator (nc_generator_*) against models::TextGenerator on the same
// checkpoint: the same bytes, greedy and sampled, streamed and returned, on every device;
// and its bad arguments as statuses with messages.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "normcore/normcore.h"
#include "normcore/normcore_c.h"
#include "tests/test_support.h"

namespace nc = normcore;
namespace models = normcore::models;

namespace {

class CGenerator : public normcore_test::TempDirTest {
 protected:
  // A small GPT with seeded random weights, saved as `normcore train-lm` saves one.
  std::string checkpoint() {
    models::GPTConfig c;
    c.context = 16;
    c.layers = 2;
    c.heads = 2;
    c.embed = 16;
    nc::Generator gen(3);
    models::GPT model(c, &gen);
    const std::string path = (dir_ / "lm.safetensors").string();
    models::save_gpt_checkpoint(path, model, 0, {}, {}, {});
    return path;
  }
};

std::vector<nc::Device> devices() {
  std::vector<nc::Device> out{nc::Device::cpu()};
  if (nc::cuda_is_available()) out.push_back(nc::Device::cuda());
  return out;
}

void collect(const char* text, size_t length, void* user) { static_cast<std::string*>(user)->append(text, length); }

TEST_F(CGenerator, GivesTheBytesTheCppGeneratorGives) {
  const std::string path = checkpoint();
  for (const nc::Device& device : devices()) {
    models::TextGenerator reference(path, device);
    nc_generator* g = nullptr;
    ASSERT_EQ(nc_generator_load(path.c_str(), device.str().c_str(), &g), NC_OK) << nc_last_error();
    EXPECT_EQ(nc_generator_context(g), 16);
    struct Case {
      const char* prompt;
      int64_t tokens;
      double temperature;
      int64_t top_k;
      uint64_t seed;
    };
    // Greedy, sampled with and without top-k, an empty prompt, and past the context.
    for (const Case& k : {Case{"Hello", 12, 0.0, 0, 0}, Case{"Hello", 12, 0.8, 0, 7}, Case{"x", 30, 1.0, 5, 9},
                          Case{"", 8, 0.8, 0, 1}}) {
      models::GenerateOptions options;
      options.temperature = k.temperature;
      options.top_k = k.top_k;
      options.seed = k.seed;
      const std::string expected = reference.generate(k.prompt, k.tokens, options);
      ASSERT_EQ(expected.size(), static_cast<size_t>(k.tokens));
      std::vector<char> text(static_cast<size_t>(k.tokens) + 1, 'z');
      size_t length = 0;
      std::string streamed;
      ASSERT_EQ(nc_generator_generate(g, k.prompt, k.tokens, k.temperature, k.top_k, k.seed, text.data(), text.size(),
                                      &length, collect, &streamed),
                NC_OK)
          << nc_last_error();
      EXPECT_EQ(length, expected.size());
      EXPECT_EQ(std::string(text.data(), length), expected) << device << " prompt '" << k.prompt << "'";
      EXPECT_EQ(text[length], '\0');
      EXPECT_EQ(streamed, expected);
    }
    // Streaming alone, with no buffer.
    std::string streamed;
    ASSERT_EQ(nc_generator_generate(g, "ab", 5, 0.0, 0, 0, nullptr, 0, nullptr, collect, &streamed), NC_OK);
    EXPECT_EQ(streamed, reference.generate("ab", 5, models::GenerateOptions{0.0, 0, 0}));
    nc_generator_free(g);
  }
}

TEST_F(CGenerator, BadArgumentsAreStatusesThatNameThem) {
  const std::string path = checkpoint();
  nc_generator* g = nullptr;
  ASSERT_EQ(nc_generator_load(path.c_str(), "cpu", &g), NC_OK) << nc_last_error();
  auto expect = [](nc_status got, nc_status want, const std::vector<std::string>& words) {
    EXPECT_EQ(got, want) << nc_last_error();
    for (const std::string& w : words)
      EXPECT_NE(std::string(nc_last_error()).find(w), std::string::npos) << nc_last_error();
  };
  char text[4];
  expect(nc_generator_generate(g, "a", 4, 0.0, 0, 0, text, sizeof text, nullptr, nullptr, nullptr), NC_ERROR_VALUE,
         {"nc_generator_generate", "capacity", "4 bytes"});
  expect(nc_generator_generate(g, "a", -1, 0.0, 0, 0, nullptr, 0, nullptr, nullptr, nullptr), NC_ERROR_VALUE,
         {"tokens", "-1"});
  expect(nc_generator_generate(g, nullptr, 1, 0.0, 0, 0, nullptr, 0, nullptr, nullptr, nullptr), NC_ERROR_VALUE,
         {"prompt", "NULL"});
  expect(nc_generator_generate(nullptr, "a", 1, 0.0, 0, 0, nullptr, 0, nullptr, nullptr, nullptr), NC_ERROR_VALUE,
         {"'g'", "NULL"});
  expect(nc_generator_generate(g, "a", 1, -1.0, 0, 0, nullptr, 0, nullptr, nullptr, nullptr), NC_ERROR_VALUE,
         {"temperature"});
  nc_generator_free(g);
  nc_generator* none = reinterpret_cast<nc_generator*>(&text);
  expect(nc_generator_load((dir_ / "missing.safetensors").c_str(), "cpu", &none), NC_ERROR_IO, {"missing.safetensors"});
  EXPECT_EQ(none, nullptr);
  expect(nc_generator_load(path.c_str(), "tpu", &none), NC_ERROR_DEVICE, {"tpu"});
  EXPECT_EQ(nc_generator_context(nullptr), 0);
  nc_generator_free(nullptr);
}

}  // namespace
