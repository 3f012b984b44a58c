// text::BpeTokenizer and text::pretokenize: pieces and ids against tests/data/bpe/reference.json
// (GPT-2's encoder, tests/data/bpe/make_bpe_reference.js), round trips of text, random bytes
// and the fortunes corpus, the end-of-text option, the three file formats giving the same ids,
// merges by rank on a small vocabulary, and the readers' errors. The tests that need GPT-2's
// vocabulary skip without it (scripts/gpt2-vocab.sh fetches it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "normcore/gpt.h"
#include "normcore/normcore_c.h"
#include "normcore/text.h"
#include "tests/test_support.h"

namespace nc = normcore;
namespace fs = std::filesystem;
using nc::text::BpeTokenizer;
using Json = nlohmann::json;
using normcore_test::throws;

namespace {

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_bytes(const fs::path& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

// Where scripts/gpt2-vocab.sh puts GPT-2's encoder.json and vocab.bpe.
fs::path gpt2_dir() {
  if (const char* dir = std::getenv("NORMCORE_GPT2_DIR"); dir && *dir) return dir;
  if (const char* cache = std::getenv("XDG_CACHE_HOME"); cache && *cache) return fs::path(cache) / "normcore/gpt2";
  const char* home = std::getenv("HOME");
  return fs::path(home ? home : "/") / ".cache/normcore/gpt2";
}

// GPT-2's tokenizer, loaded once; null without the files.
const BpeTokenizer* gpt2() {
  static const std::unique_ptr<BpeTokenizer> tokenizer = []() -> std::unique_ptr<BpeTokenizer> {
    if (!fs::exists(gpt2_dir() / "encoder.json")) return nullptr;
    return std::make_unique<BpeTokenizer>(BpeTokenizer::load(gpt2_dir().string()));
  }();
  return tokenizer.get();
}

#define NEED_GPT2()                                             \
  if (gpt2() == nullptr)                                        \
  GTEST_SKIP() << "GPT-2's vocabulary is not in " << gpt2_dir() \
               << " (bash scripts/gpt2-vocab.sh "               \
                  "fetches it)"

struct Case {
  std::string name, text;
  std::vector<std::string> pieces;
  std::vector<int32_t> ids, ids_special;
  bool has_special = false;
};

// The reference cases; a fortune's text is read from the corpus (cases of a corpus that is
// not installed are left out, and so is every fortune when it differs from the reference's).
std::vector<Case> reference_cases() {
  const Json reference = Json::parse(read_bytes(fs::path(NORMCORE_TEST_DATA_DIR) / "bpe/reference.json"));
  std::vector<Case> cases;
  for (const Json& c : reference.at("cases")) {
    Case one;
    one.name = c.at("name").get<std::string>();
    one.pieces = c.at("pieces").get<std::vector<std::string>>();
    one.ids = c.at("ids").get<std::vector<int32_t>>();
    one.has_special = c.contains("ids_special");
    if (one.has_special) one.ids_special = c.at("ids_special").get<std::vector<int32_t>>();
    if (c.contains("fortune_file")) {
      const fs::path file = fs::path(nc::models::kFortunesDir) / c.at("fortune_file").get<std::string>();
      if (!fs::exists(file)) continue;
      one.text = nc::models::split_fortunes(read_bytes(file)).at(c.at("fortune_index").get<size_t>());
      EXPECT_EQ(one.text.size(), c.at("bytes").get<size_t>())
          << one.name << ": the corpus differs from the reference's";
    } else {
      one.text = c.at("text").get<std::string>();
    }
    cases.push_back(std::move(one));
  }
  return cases;
}

std::string fortunes_corpus() {
  std::string all;
  for (const std::string& file : nc::models::fortune_files(nc::models::kFortunesDir)) all += read_bytes(file);
  return all;
}

}  // namespace

TEST(Pretokenize, MatchesTheReferencePieces) {
  const std::vector<Case> cases = reference_cases();
  ASSERT_GE(cases.size(), 27u);
  for (const Case& c : cases) {
    const std::vector<std::string_view> pieces = nc::text::pretokenize(c.text);
    EXPECT_EQ(std::vector<std::string>(pieces.begin(), pieces.end()), c.pieces) << c.name;
  }
}

// Bytes outside well-formed UTF-8 count as characters of none of the classes, each alone.
TEST(Pretokenize, BytesThatAreNotUtf8) {
  const struct {
    std::string text;
    std::vector<std::string> pieces;
  } rows[] = {
      {"\xff\xfe abc", {"\xff\xfe", " abc"}},
      {"a\xc3", {"a", "\xc3"}},                                          // a truncated sequence
      {"x\xc0\xaf!", {"x", "\xc0\xaf!"}},                                // an overlong '/', then punctuation
      {"\xed\xa0\x80z", {"\xed\xa0\x80", "z"}},                          // a surrogate
      {"\xf4\x90\x80\x80", {"\xf4\x90\x80\x80"}},                        // past U+10FFFF
      {"caf\xc3\xa9 \xe9t\xe9", {"caf\xc3\xa9", " \xe9", "t", "\xe9"}},  // UTF-8, then Latin-1
      {" \x80's", {" \x80'", "s"}},
      {"x\xe2\x80\x83y", {"x", "\xe2\x80\x83", "y"}},  // U+2003 EM SPACE is white space
      {"1\xc2\x85"
       "2",
       {"1", "\xc2\x85", "2"}},  // so is U+0085
  };
  for (const auto& row : rows) {
    const std::vector<std::string_view> pieces = nc::text::pretokenize(row.text);
    EXPECT_EQ(std::vector<std::string>(pieces.begin(), pieces.end()), row.pieces);
  }
}

TEST(BpeTokenizer, EncodesAsGpt2) {
  NEED_GPT2();
  EXPECT_EQ(gpt2()->vocab_size(), 50257);
  EXPECT_EQ(gpt2()->merge_count(), 50000);
  EXPECT_EQ(gpt2()->end_of_text(), 50256);
  for (const Case& c : reference_cases()) {
    EXPECT_EQ(gpt2()->encode(c.text), c.ids) << c.name;
    if (c.has_special) EXPECT_EQ(gpt2()->encode(c.text, true), c.ids_special) << c.name;
    EXPECT_EQ(gpt2()->decode(c.ids), c.text) << c.name;
  }
}

TEST(BpeTokenizer, EndOfTextOnlyWhenAsked) {
  NEED_GPT2();
  EXPECT_EQ(gpt2()->encode(nc::text::kEndOfText, true), std::vector<int32_t>{50256});
  const std::vector<int32_t> plain = gpt2()->encode(nc::text::kEndOfText);
  EXPECT_GT(plain.size(), 1u);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 50256), 0);
  EXPECT_EQ(gpt2()->decode(plain), nc::text::kEndOfText);
  EXPECT_EQ(gpt2()->decode({50256, 50256}), "<|endoftext|><|endoftext|>");
}

TEST(BpeTokenizer, RoundTripsRandomBytes) {
  NEED_GPT2();
  std::mt19937 gen(7);
  // Bytes drawn from all 256, and from a few that the pattern treats specially.
  const std::string special_bytes = " '\t\n\r\xc3\xa9\xe2\x80\x83sSl0<|>";
  for (int i = 0; i < 2000; ++i) {
    std::string s(gen() % 300, '\0');
    for (char& b : s) b = gen() % 2 ? static_cast<char>(gen() % 256) : special_bytes[gen() % special_bytes.size()];
    if (i % 10 == 0) s += nc::text::kEndOfText;
    ASSERT_EQ(gpt2()->decode(gpt2()->encode(s)), s) << "random string " << i;
    ASSERT_EQ(gpt2()->decode(gpt2()->encode(s, true)), s) << "random string " << i << " with end of text";
  }
}

TEST(BpeTokenizer, RoundTripsTheFortunesCorpus) {
  NEED_GPT2();
  if (!fs::exists(nc::models::kFortunesDir)) GTEST_SKIP() << "no " << nc::models::kFortunesDir;
  const std::string corpus = fortunes_corpus();
  ASSERT_GT(corpus.size(), 1000000u);
  const std::vector<int32_t> ids = gpt2()->encode(corpus);
  EXPECT_LT(ids.size(), corpus.size() / 3);
  EXPECT_EQ(gpt2()->decode(ids), corpus);
  // The same ids from several threads at once, through the shared cache.
  std::vector<std::vector<int32_t>> results(4);
  std::vector<std::thread> threads;
  for (auto& r : results) threads.emplace_back([&r, &corpus] { r = gpt2()->encode(corpus.substr(0, 200000)); });
  for (auto& t : threads) t.join();
  const std::vector<int32_t> first = gpt2()->encode(corpus.substr(0, 200000));
  for (const auto& r : results) EXPECT_EQ(r, first);
}

// The Hugging Face files (vocab.json, merges.txt; tokenizer.json) written from OpenAI's give
// the same tokenizer.
class BpeFiles : public normcore_test::TempDirTest {};

TEST_F(BpeFiles, FormatsAgree) {
  NEED_GPT2();
  const Json vocab = Json::parse(read_bytes(gpt2_dir() / "encoder.json"));
  const std::string merges = read_bytes(gpt2_dir() / "vocab.bpe");
  fs::create_directories(dir_ / "hf");
  write_bytes(dir_ / "hf/vocab.json", vocab.dump(2, ' ', false));
  write_bytes(dir_ / "hf/merges.txt", merges.substr(merges.find('\n') + 1));  // without "#version"
  Json pairs = Json::array();
  for (std::istringstream lines(merges.substr(merges.find('\n') + 1));;) {
    std::string first, second;
    if (!(lines >> first >> second)) break;
    pairs.push_back(pairs.size() % 2 ? Json(first + " " + second) : Json::array({first, second}));
  }
  const Json tokenizer = {
      {"version", "1.0"},
      {"added_tokens", Json::array({{{"id", 50256}, {"content", nc::text::kEndOfText}, {"special", true}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""},
        {"vocab", vocab},
        {"merges", pairs}}}};
  fs::create_directories(dir_ / "json");
  write_bytes(dir_ / "json/tokenizer.json", tokenizer.dump());

  const BpeTokenizer hf = BpeTokenizer::load((dir_ / "hf").string());
  const BpeTokenizer from_json = BpeTokenizer::load((dir_ / "json").string());
  const BpeTokenizer explicit_paths =
      BpeTokenizer::load((dir_ / "hf/vocab.json").string(), (gpt2_dir() / "vocab.bpe").string());
  for (const BpeTokenizer* t : {&hf, &from_json, &explicit_paths}) {
    EXPECT_EQ(t->vocab_size(), 50257);
    EXPECT_EQ(t->merge_count(), 50000);
    EXPECT_EQ(t->end_of_text(), 50256);
    for (const Case& c : reference_cases()) EXPECT_EQ(t->encode(c.text), c.ids) << c.name;
  }
  EXPECT_EQ(BpeTokenizer::load_tokenizer_json((dir_ / "json/tokenizer.json").string()).encode("x<|endoftext|>", true),
            (std::vector<int32_t>{87, 50256}));
}

// ---------------------------------------------------------------- a small vocabulary
namespace {

// GPT-2's byte alphabet: the character that stands for byte b in a vocabulary file.
std::string byte_char(int b) {
  const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  int cp = b;
  if (!printable) {
    cp = 256;
    for (int c = 0; c < b; ++c)
      if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF))) ++cp;
  }
  std::string s;
  if (cp < 0x80) return std::string(1, static_cast<char>(cp));
  s += static_cast<char>(0xC0 | cp >> 6);
  s += static_cast<char>(0x80 | (cp & 0x3F));
  return s;
}

// The 256 byte tokens (id = byte), then extra tokens from id 256.
Json small_vocab(const std::vector<std::string>& extra) {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  for (size_t i = 0; i < extra.size(); ++i) vocab[extra[i]] = 256 + i;
  return vocab;
}

class SmallBpe : public normcore_test::TempDirTest {
 protected:
  // Writes vocab.json and merges.txt and loads them.
  BpeTokenizer load(const std::string& vocab, const std::string& merges) {
    write_bytes(dir_ / "vocab.json", vocab);
    write_bytes(dir_ / "merges.txt", merges);
    return BpeTokenizer::load(dir_.string());
  }
  BpeTokenizer load(const Json& vocab, const std::string& merges) { return load(vocab.dump(), merges); }
  std::function<void()> loading(const std::string& vocab, const std::string& merges) {
    return [this, vocab, merges] { load(vocab, merges); };
  }
  std::function<void()> loading(const Json& vocab, const std::string& merges) { return loading(vocab.dump(), merges); }
};

}  // namespace

TEST_F(SmallBpe, MergesByRank) {
  // "b c" ranks before "a b": "abc" is a + bc; "abd" is ab + d. "a a" merges from the left.
  const BpeTokenizer t =
      load(small_vocab({"bc", "ab", "aa", "Ġx", "Ġxy"}), "#version: 0.2\nb c\na b\na a\nĠ x\nĠx y\n");
  EXPECT_EQ(t.vocab_size(), 261);
  EXPECT_EQ(t.merge_count(), 5);
  EXPECT_EQ(t.end_of_text(), -1);
  EXPECT_EQ(t.encode("abc"), (std::vector<int32_t>{'a', 256}));
  EXPECT_EQ(t.encode("abd"), (std::vector<int32_t>{257, 'd'}));
  EXPECT_EQ(t.encode("aaa"), (std::vector<int32_t>{258, 'a'}));
  EXPECT_EQ(t.encode("aaaa"), (std::vector<int32_t>{258, 258}));
  EXPECT_EQ(t.encode("q xy"), (std::vector<int32_t>{'q', 260}));
  EXPECT_EQ(t.decode({'q', 260, 258}), "q xyaa");
  throws<nc::ValueError>([&] { t.encode("abc", true); }, {"no \"<|endoftext|>\""})();
  throws<nc::IndexError>([&] { t.decode({'a', 261}); }, {"id 261 at position 1", "vocabulary of 261"})();
  throws<nc::IndexError>([&] { t.decode({-1}); }, {"id -1 at position 0"})();
}

TEST_F(SmallBpe, ReadersRefuseBadFiles) {
  const std::string vocab = dir_.string() + "/vocab.json";
  const std::string merges = dir_.string() + "/merges.txt";
  Json missing_byte = small_vocab({});
  missing_byte.erase("A");
  missing_byte["ab"] = 65;
  Json not_alphabet = small_vocab({"\xe6\x97\xa5"});
  const struct {
    const char* name;
    std::function<void()> check;
  } rows[] = {
      {"missing vocabulary", throws<nc::IOError>([&] { BpeTokenizer::load(dir_.string() + "/none.json", merges); },
                                                 {"none.json", "no such file"})},
      {"a folder of nothing", throws<nc::IOError>([&] { BpeTokenizer::load(dir_.string()); }, {"holds none of"})},
      {"not a folder", throws<nc::IOError>([&] { BpeTokenizer::load(dir_.string() + "/none"); }, {"not a folder"})},
      {"malformed JSON", throws<nc::IOError>(loading(std::string("{\"a\": 0,\n\"b\" 1}"), "a b\n"),
                                             {"vocab.json", "not valid JSON at line 2"})},
      {"a number past a double", throws<nc::IOError>(loading(std::string("{\"a\": 1e999}"), ""),
                                                     {"vocab.json", "not valid JSON", "number overflow"})},
      {"an array", throws<nc::IOError>(loading(std::string("[1, 2]"), ""), {"vocab.json", "not an object"})},
      {"an id that is a string", throws<nc::IOError>(loading(std::string("{\"a\": \"0\"}"), ""),
                                                     {"vocab.json", "id of token \"a\"", "not a whole number"})},
      {"a huge id", throws<nc::IOError>(loading(std::string("{\"a\": 1099511627776}"), ""),
                                        {"vocab.json", "has id 1099511627776", "outside [0, 1)"})},
      {"an id twice", throws<nc::IOError>(loading(std::string("{\"a\": 0, \"b\": 0}"), ""), {"id 0 is given to both"})},
      {"no token for a byte", throws<nc::IOError>(loading(missing_byte, ""), {"vocab.json", "no token for byte 65"})},
      {"outside the alphabet",
       throws<nc::IOError>(loading(not_alphabet, ""), {"id 256", "outside GPT-2's byte alphabet"})},
      {"a merge of one token", throws<nc::IOError>(loading(small_vocab({"ab"}), "#version: 0.2\na b\nab\n"),
                                                   {"merges.txt line 3", "two tokens separated by a space", "\"ab\""})},
      {"a merge of three", throws<nc::IOError>(loading(small_vocab({"ab"}), "a b c\n"), {"merges.txt line 1"})},
      {"an empty line", throws<nc::IOError>(loading(small_vocab({"ab"}), "a b\n\n"), {"merges.txt line 2"})},
      {"a merge of an unknown token", throws<nc::IOError>(loading(small_vocab({"ab"}), "a b\nab q\n"),
                                                          {"merges.txt line 2", "\"abq\" is not in the vocabulary"})},
      {"a merge twice", throws<nc::IOError>(loading(small_vocab({"ab"}), "a b\na b\n"), {"line 2", "comes twice"})},
      {"missing merges", throws<nc::IOError>(
                             [&] {
                               write_bytes(vocab, small_vocab({}).dump());
                               fs::remove(merges);
                               BpeTokenizer::load(dir_.string());
                             },
                             {"merges.txt", "no such file"})},
  };
  for (const auto& row : rows) {
    SCOPED_TRACE(row.name);
    row.check();
  }
}

TEST_F(SmallBpe, TokenizerJsonOfAnotherKindIsRefused) {
  const Json good = {{"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
                     {"model", {{"type", "BPE"}, {"vocab", small_vocab({"ab"})}, {"merges", Json::array({"a b"})}}}};
  const std::string path = (dir_ / "tokenizer.json").string();
  write_bytes(path, good.dump());
  EXPECT_EQ(BpeTokenizer::load(dir_.string()).encode("abab"), (std::vector<int32_t>{256, 256}));
  const auto refused = [&](const Json& changed, std::vector<std::string> fragments) {
    return throws<nc::IOError>(
        [path, changed] {
          write_bytes(path, changed.dump());
          BpeTokenizer::load_tokenizer_json(path);
        },
        std::move(fragments));
  };
  Json prefix = good, wordpiece = good, pairs = good, added = good, no_model = good;
  prefix["pre_tokenizer"]["add_prefix_space"] = true;
  wordpiece["model"]["type"] = "WordPiece";
  pairs["model"]["merges"] = Json::array({Json::array({"a"})});
  added["added_tokens"] = Json::array({{{"id", 3}, {"content", "<|endoftext|>"}}});
  no_model.erase("model");
  refused(prefix, {"tokenizer.json", "pre_tokenizer.add_prefix_space is true"})();
  refused(wordpiece, {"model.type is \"WordPiece\""})();
  refused(pairs, {"tokenizer.json model.merges [0]", "a pair of strings"})();
  refused(added, {"added_tokens[0]", "not in model.vocab under that id"})();
  refused(no_model, {"\"model\" is a JSON null"})();
}

// ---------------------------------------------------------------- a model folder and the C API
namespace {

// The small tokenizer with <|endoftext|> (ids 256 to 259) in dir, as a GPT-2 folder has it.
const std::string kMerges = "#version: 0.2\nb c\na b\na a\n";
Json folder_vocab() { return small_vocab({"bc", "ab", "aa", "<|endoftext|>"}); }

std::string decoded(const BpeTokenizer& t, const std::vector<int64_t>& ids) {
  std::string text;
  for (int64_t id : ids) text += t.decode({static_cast<int32_t>(id)});
  return text;
}

}  // namespace

TEST_F(SmallBpe, TextGeneratorOnAModelFolder) {
  const BpeTokenizer t = load(folder_vocab(), kMerges);
  ASSERT_EQ(t.end_of_text(), 259);
  nc::models::GPTConfig c;
  c.vocab_size = 260;
  c.context = 16;
  c.layers = 2;
  c.heads = 2;
  c.embed = 16;
  nc::Generator gen(8);
  nc::models::save_hf_gpt2(nc::models::GPT(c, &gen), dir_.string());
  const auto model = nc::models::load_hf_gpt2(dir_.string());

  nc::models::TextGenerator generator(dir_.string());
  ASSERT_NE(generator.tokenizer(), nullptr);
  EXPECT_EQ(generator.max_token_bytes(), 13);  // "<|endoftext|>"
  // The prompt through the tokenizer, generate_tokens, each token decoded as it comes.
  std::vector<int64_t> prompt;
  for (int32_t id : t.encode("abcab")) prompt.push_back(id);
  const std::string expected = decoded(t, nc::models::generate_tokens(*model, prompt, 10, {0.0, 0, 0}));
  std::string streamed;
  EXPECT_EQ(generator.generate("abcab", 10, {0.0, 0, 0}, [&](const std::string& piece) { streamed += piece; }),
            expected);
  EXPECT_EQ(streamed, expected);
  // An empty prompt starts a document from <|endoftext|>; sampling follows the seed.
  EXPECT_EQ(generator.generate("", 6, {0.9, 0, 4, 0.8}),
            decoded(t, nc::models::generate_tokens(*model, {259}, 6, {0.9, 0, 4, 0.8})));

  // The C API on the same folder.
  nc_generator* g = nullptr;
  ASSERT_EQ(nc_generator_load(dir_.c_str(), "cpu", &g), NC_OK) << nc_last_error();
  EXPECT_EQ(nc_generator_max_bytes(g, 10), 131u);
  EXPECT_EQ(nc_generator_max_bytes(nullptr, 10), 0u);
  EXPECT_EQ(nc_generator_max_bytes(g, INT64_MAX), SIZE_MAX);  // never a product that wraps around
  std::vector<char> text(nc_generator_max_bytes(g, 10));
  size_t length = 0;
  ASSERT_EQ(nc_generator_generate_top_p(g, "abcab", 10, 0.0, 0, 1.0, 0, text.data(), text.size(), &length, nullptr,
                                        nullptr),
            NC_OK)
      << nc_last_error();
  EXPECT_EQ(std::string(text.data(), length), expected);
  EXPECT_EQ(text[length], '\0');
  EXPECT_EQ(nc_generator_generate(g, "abcab", 10, 0.0, 0, 0, text.data(), 100, &length, nullptr, nullptr),
            NC_ERROR_VALUE);
  EXPECT_NE(std::string(nc_last_error()).find("'capacity' is 100 bytes"), std::string::npos) << nc_last_error();
  EXPECT_EQ(nc_generator_generate(g, "ab", INT64_MAX, 0.0, 0, 0, text.data(), text.size(), &length, nullptr, nullptr),
            NC_ERROR_VALUE);
  EXPECT_EQ(nc_generator_generate_top_p(g, "ab", 2, 1.0, 0, 0.0, 0, nullptr, 0, nullptr, nullptr, nullptr),
            NC_ERROR_VALUE);
  EXPECT_NE(std::string(nc_last_error()).find("top_p"), std::string::npos) << nc_last_error();
  nc_generator_free(g);
  // A byte-level checkpoint takes no tokenizer.
  const std::string checkpoint = (dir_ / "lm.safetensors").string();
  nc::models::save_gpt_checkpoint(checkpoint, nc::models::GPT(nc::models::GPTConfig{}, &gen), 0, {}, {}, {});
  throws<nc::ValueError>([&] { nc::models::TextGenerator(checkpoint, nc::Device::cpu(), dir_.string()); },
                         {"TextGenerator", "byte-level", "tokenizer"})();
}

TEST_F(SmallBpe, CApiEncodesAndDecodes) {
  const BpeTokenizer t = load(folder_vocab(), kMerges);
  nc_tokenizer* tok = nullptr;
  ASSERT_EQ(nc_tokenizer_load(dir_.c_str(), &tok), NC_OK) << nc_last_error();
  EXPECT_EQ(nc_tokenizer_vocab_size(tok), 260);
  EXPECT_EQ(nc_tokenizer_end_of_text(tok), 259);
  const std::string text = "abcab q<|endoftext|>aaa";
  for (int special : {0, 1}) {
    const std::vector<int32_t> expected = t.encode(text, special != 0);
    size_t count = 0;
    ASSERT_EQ(nc_tokenizer_encode(tok, text.data(), text.size(), special, nullptr, 0, &count), NC_OK);
    EXPECT_EQ(count, expected.size());
    std::vector<int32_t> ids(count);
    ASSERT_EQ(nc_tokenizer_encode(tok, text.data(), text.size(), special, ids.data(), ids.size(), &count), NC_OK);
    EXPECT_EQ(ids, expected);
    EXPECT_EQ(nc_tokenizer_encode(tok, text.data(), text.size(), special, ids.data(), count - 1, &count),
              NC_ERROR_VALUE);
    EXPECT_NE(std::string(nc_last_error()).find("too small for the " + std::to_string(expected.size()) + " ids"),
              std::string::npos)
        << nc_last_error();
    size_t length = 0;
    ASSERT_EQ(nc_tokenizer_decode(tok, ids.data(), ids.size(), nullptr, 0, &length), NC_OK);
    EXPECT_EQ(length, text.size());
    std::vector<char> back(length + 1, 'x');
    ASSERT_EQ(nc_tokenizer_decode(tok, ids.data(), ids.size(), back.data(), back.size(), &length), NC_OK);
    EXPECT_EQ(std::string(back.data(), length), text);
    EXPECT_EQ(back[length], '\0');
    EXPECT_EQ(nc_tokenizer_decode(tok, ids.data(), ids.size(), back.data(), length, &length), NC_ERROR_VALUE);
  }
  const int32_t bad[] = {'a', 260};
  size_t length = 0;
  EXPECT_EQ(nc_tokenizer_decode(tok, bad, 2, nullptr, 0, &length), NC_ERROR_INDEX);
  EXPECT_NE(std::string(nc_last_error()).find("position 1"), std::string::npos) << nc_last_error();
  size_t count = 0;
  EXPECT_EQ(nc_tokenizer_encode(nullptr, "a", 1, 0, nullptr, 0, &count), NC_ERROR_VALUE);
  EXPECT_NE(std::string(nc_last_error()).find("nc_tokenizer_encode"), std::string::npos) << nc_last_error();
  EXPECT_EQ(nc_tokenizer_encode(tok, "", 0, 0, nullptr, 0, &count), NC_OK);
  EXPECT_EQ(count, 0u);
  nc_tokenizer_free(tok);
  nc_tokenizer* none = nullptr;
  EXPECT_EQ(nc_tokenizer_load((dir_ / "missing").c_str(), &none), NC_ERROR_IO);
  EXPECT_EQ(none, nullptr);
  nc_tokenizer_free(nullptr);
}
