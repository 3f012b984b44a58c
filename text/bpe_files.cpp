// The readers of text::BpeTokenizer's files (normcore/text.h): OpenAI's encoder.json and
// vocab.bpe, Hugging Face's vocab.json and merges.txt, and tokenizer.json. They turn a file
// into a BpeSource (text/bpe_impl.h), which the tokenizer checks; a defect of the file's
// syntax is an IOError naming the file and the line, or the JSON field.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "normcore/error.h"
#include "text/bpe_impl.h"

namespace normcore {
namespace text {

namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

std::string read_file(const std::string& path) {
  std::error_code ec;
  NC_CHECK(fs::is_regular_file(path, ec), IOError, "BpeTokenizer: cannot open ", path,
           fs::exists(path, ec) ? " (not a regular file)" : " (no such file)");
  std::ifstream in(path, std::ios::binary);
  NC_CHECK(in.good(), IOError, "BpeTokenizer: cannot open ", path);
  std::ostringstream text;
  text << in.rdbuf();
  NC_CHECK(!in.bad(), IOError, "BpeTokenizer: cannot read ", path);
  return text.str();
}

Json parse_json(const std::string& text, const std::string& path) {
  try {
    return Json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    // e.byte counts from 1 to the byte the parser stopped at; the line and column are of it.
    const size_t at = e.byte > 0 ? std::min<size_t>(e.byte - 1, text.size()) : 0;
    size_t line = 1, column = 1;
    for (size_t i = 0; i < at; ++i) {
      column = text[i] == '\n' ? 1 : column + 1;
      line += text[i] == '\n';
    }
    throw IOError(detail::cat_str(path, ": not valid JSON at line ", line, ", column ", column, " (", e.what(), ")"));
  } catch (const nlohmann::json::exception& e) {  // a number past what a double holds
    throw IOError(detail::cat_str(path, ": not valid JSON (", e.what(), ")"));
  }
}

// A JSON object of token -> id.
void read_vocab(const Json& object, BpeSource& source) {
  NC_CHECK(object.is_object(), IOError, source.vocab_where, ": a JSON ", object.type_name(),
           ", not an object of token -> id");
  source.vocab.reserve(object.size());
  for (const auto& item : object.items()) {
    NC_CHECK(item.value().is_number_integer(), IOError, source.vocab_where, ": the id of token \"", item.key(),
             "\" is a JSON ", item.value().type_name(), " (", item.value().dump(), "), not a whole number");
    source.vocab.emplace_back(item.key(), item.value().get<int64_t>());
  }
}

// "first second": two tokens separated by one space.
void add_merge(const std::string& merge, std::string where, BpeSource& source) {
  const size_t space = merge.find(' ');
  const bool two = space != std::string::npos && space > 0 && space + 1 < merge.size() &&
                   merge.find(' ', space + 1) == std::string::npos;
  NC_CHECK(two, IOError, source.merges_where, " ", where, ": a merge is two tokens separated by a space, got \"",
           merge.substr(0, 100), merge.size() > 100 ? "...\"" : "\"");
  source.merges.push_back({merge.substr(0, space), merge.substr(space + 1), std::move(where)});
}

// vocab.bpe or merges.txt: "#version ..." first (optional), one merge a line; the file may
// end in a newline.
void read_merges(const std::string& text, BpeSource& source) {
  size_t start = 0;
  for (size_t line = 1; start < text.size(); ++line) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string merge = text.substr(start, end - start);
    start = end + 1;
    if (line == 1 && merge.rfind("#version", 0) == 0) continue;
    add_merge(merge, "line " + std::to_string(line), source);
  }
}

// A field of a JSON object, or null when it is absent.
const Json& field(const Json& object, const char* name) {
  static const Json kNull;
  const auto it = object.find(name);
  return it == object.end() ? kNull : *it;
}

// tokenizer.json's settings must be GPT-2's: no normalizer, a ByteLevel pre-tokenizer without a
// prefix space (and with the pattern), a plain BPE model.
void check_gpt2_kind(const Json& root, const std::string& path) {
  const auto refuse = [&](const std::string& name, const Json& value) {
    throw IOError(detail::cat_str(path, ": ", name, " is ", value.dump(),
                                  "; only GPT-2's kind of tokenizer.json is "
                                  "read (no normalizer, a ByteLevel pre-tokenizer without a prefix space, a BPE model "
                                  "without dropout, unknown token or affixes)"));
  };
  NC_CHECK(root.is_object(), IOError, path, ": a JSON ", root.type_name(), ", not an object");
  const Json& model = field(root, "model");
  NC_CHECK(model.is_object(), IOError, path, ": \"model\" is a JSON ", model.type_name(), ", not an object");
  if (!field(root, "normalizer").is_null()) refuse("normalizer", field(root, "normalizer"));
  const Json& pre = field(root, "pre_tokenizer");
  if (!pre.is_object() || field(pre, "type") != "ByteLevel") refuse("pre_tokenizer", pre);
  if (field(pre, "add_prefix_space") == true) refuse("pre_tokenizer.add_prefix_space", field(pre, "add_prefix_space"));
  if (field(pre, "use_regex") == false) refuse("pre_tokenizer.use_regex", field(pre, "use_regex"));
  if (!field(model, "type").is_null() && field(model, "type") != "BPE") refuse("model.type", field(model, "type"));
  for (const char* name : {"dropout", "unk_token"})
    if (!field(model, name).is_null()) refuse(std::string("model.") + name, field(model, name));
  for (const char* name : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const Json& affix = field(model, name);
    if (!affix.is_null() && affix != "") refuse(std::string("model.") + name, affix);
  }
}

// Added tokens must already be in the vocabulary, under the same id.
void check_added_tokens(const Json& added, const Json& vocab, const std::string& path) {
  if (added.is_null()) return;
  NC_CHECK(added.is_array(), IOError, path, ": \"added_tokens\" is a JSON ", added.type_name(), ", not an array");
  for (size_t i = 0; i < added.size(); ++i) {
    const Json& token = added[i];
    const Json& content = token.is_object() ? field(token, "content") : token;
    const Json& id = token.is_object() ? field(token, "id") : token;
    NC_CHECK(content.is_string() && id.is_number_integer(), IOError, path, " added_tokens[", i,
             "]: not an object with a string \"content\" and a whole-number \"id\"");
    const auto it = vocab.find(content.get<std::string>());
    NC_CHECK(it != vocab.end() && *it == id, IOError, path, " added_tokens[", i, "]: ", content.dump(), " (id ",
             id.dump(), ") is not in model.vocab under that id");
  }
}

}  // namespace

BpeTokenizer BpeTokenizer::load(const std::string& vocab_path, const std::string& merges_path) {
  BpeSource source;
  source.vocab_where = vocab_path;
  source.merges_where = merges_path;
  read_vocab(parse_json(read_file(vocab_path), vocab_path), source);
  read_merges(read_file(merges_path), source);
  return BpeTokenizer(std::make_unique<Impl>(source));
}

BpeTokenizer BpeTokenizer::load_tokenizer_json(const std::string& path) {
  const Json root = parse_json(read_file(path), path);
  check_gpt2_kind(root, path);
  const Json& model = field(root, "model");
  BpeSource source;
  source.vocab_where = path + " model.vocab";
  source.merges_where = path + " model.merges";
  const Json& vocab = field(model, "vocab");
  read_vocab(vocab, source);
  check_added_tokens(field(root, "added_tokens"), vocab, path);
  const Json& merges = field(model, "merges");
  NC_CHECK(merges.is_array(), IOError, source.merges_where, ": a JSON ", merges.type_name(), ", not an array");
  source.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const Json& m = merges[i];
    const std::string where = "[" + std::to_string(i) + "]";
    if (m.is_string()) {
      add_merge(m.get<std::string>(), where, source);
      continue;
    }
    NC_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(), IOError, source.merges_where, " ",
             where, ": a merge is a string \"a b\" or a pair of strings, got ", m.dump().substr(0, 100));
    source.merges.push_back({m[0].get<std::string>(), m[1].get<std::string>(), where});
  }
  return BpeTokenizer(std::make_unique<Impl>(source));
}

BpeTokenizer BpeTokenizer::load(const std::string& dir) {
  std::error_code ec;
  NC_CHECK(fs::is_directory(dir, ec), IOError, "BpeTokenizer: ", dir, " is not a folder");
  const fs::path d(dir);
  for (const auto& [vocab, merges] : {std::pair{"encoder.json", "vocab.bpe"}, std::pair{"vocab.json", "merges.txt"}}) {
    if (fs::exists(d / vocab, ec) || fs::exists(d / merges, ec))
      return load((d / vocab).string(), (d / merges).string());
  }
  if (fs::exists(d / "tokenizer.json", ec)) return load_tokenizer_json((d / "tokenizer.json").string());
  throw IOError(detail::cat_str("BpeTokenizer: ", dir,
                                " holds none of encoder.json and vocab.bpe (OpenAI's GPT-2 "
                                "files), vocab.json and merges.txt, or tokenizer.json (Hugging Face's)"));
}

}  // namespace text
}  // namespace normcore
