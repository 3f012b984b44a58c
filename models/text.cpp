// Text for the GPT model (normcore/gpt.h): the fortunes corpus read into a fixed
// train/validation split of byte streams, windows of those streams as token batches, and
// the validation loss. Tokens are the stream's bytes.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "normcore/autograd.h"
#include "normcore/gpt.h"
#include "normcore/ops.h"

namespace normcore {
namespace models {

namespace fs = std::filesystem;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  NC_CHECK(in.good(), IOError, "load_fortunes: cannot open ", path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The windows starting at offsets, as i64 [offsets.size(), context] inputs and targets.
TextBatch windows_at(const std::string& stream, const std::vector<int64_t>& offsets, int64_t context, Device device) {
  std::vector<int64_t> inputs, targets;
  inputs.reserve(offsets.size() * static_cast<size_t>(context));
  targets.reserve(inputs.capacity());
  for (int64_t start : offsets) {
    for (int64_t t = 0; t < context; ++t) {
      inputs.push_back(static_cast<unsigned char>(stream[static_cast<size_t>(start + t)]));
      targets.push_back(static_cast<unsigned char>(stream[static_cast<size_t>(start + t + 1)]));
    }
  }
  const Shape shape{static_cast<int64_t>(offsets.size()), context};
  return TextBatch{from_vector(inputs, shape, device), from_vector(targets, shape, device)};
}

void check_windows(const char* op, const std::string& stream, int64_t count, int64_t context) {
  NC_CHECK(count > 0 && context > 0, ValueError, op, ": the window count and context must be positive, got ", count,
           " and ", context);
  NC_CHECK(static_cast<int64_t>(stream.size()) > context, ValueError, op, ": a stream of ", stream.size(),
           " bytes has no window of ", context + 1, " bytes");
}

}  // namespace

std::vector<std::string> fortune_files(const std::string& path) {
  std::error_code ec;
  NC_CHECK(fs::exists(path, ec), IOError, "fortune_files: ", path,
           " does not exist (Debian's 'fortunes' "
           "package installs the corpus in ",
           kFortunesDir, ")");
  if (!fs::is_directory(path, ec)) return {path};
  std::vector<std::string> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(path)) {
    const fs::path name = entry.path().filename();
    if (entry.is_symlink() || !entry.is_regular_file()) continue;
    if (name.string().find('.') != std::string::npos) continue;
    files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  NC_CHECK(!files.empty(), IOError, "fortune_files: ", path, " holds no fortune files (regular files without a '.')");
  return files;
}

std::vector<std::string> split_fortunes(const std::string& text) {
  std::vector<std::string> fortunes;
  std::string current;
  auto finish = [&]() {
    if (current.find_first_not_of(" \t\r\n") != std::string::npos) fortunes.push_back(current);
    current.clear();
  };
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    const bool last = end == std::string::npos;
    const std::string line = text.substr(start, last ? std::string::npos : end - start);
    if (line == "%") finish();
    else current += line + "\n";
    start = last ? text.size() : end + 1;
  }
  finish();
  return fortunes;
}

TextCorpus load_fortunes(const std::string& path) {
  TextCorpus corpus;
  corpus.files = fortune_files(path);
  int64_t number = 0;
  for (const std::string& file : corpus.files) {
    for (const std::string& fortune : split_fortunes(read_file(file))) {
      const bool validation = number % 10 == 9;
      (validation ? corpus.validation : corpus.train) += fortune + "%\n";
      ++(validation ? corpus.validation_fortunes : corpus.train_fortunes);
      ++number;
    }
  }
  NC_CHECK(corpus.validation_fortunes > 0, IOError, "load_fortunes: ", path, " holds ", number,
           " fortunes; the split needs at least 10");
  return corpus;
}

TextBatch random_windows(const std::string& stream, int64_t batch, int64_t context, Generator& gen, Device device) {
  check_windows("random_windows", stream, batch, context);
  const int64_t starts = static_cast<int64_t>(stream.size()) - context;  // offsets 0 .. starts - 1
  return windows_at(stream, randint(0, starts, {batch}, DType::I64, &gen).to_vector<int64_t>(), context, device);
}

TextBatch spaced_windows(const std::string& stream, int64_t count, int64_t context, Device device) {
  check_windows("spaced_windows", stream, count, context);
  const int64_t last = static_cast<int64_t>(stream.size()) - context - 1;
  std::vector<int64_t> offsets;
  for (int64_t i = 0; i < count; ++i) offsets.push_back(count == 1 ? 0 : i * last / (count - 1));
  return windows_at(stream, offsets, context, device);
}

double evaluate_lm(GPT& model, const std::string& stream, int64_t windows, int64_t batch, Device device) {
  check_windows("evaluate_lm", stream, windows, model.config.context);
  // TextWindows' evenly spaced samples are spaced_windows' offsets.
  return evaluate_lm(model, data::TextWindows(stream, model.config.context), windows, batch, device);
}

double evaluate_lm(GPT& model, const data::Dataset& windows, int64_t count, int64_t batch, Device device) {
  NC_CHECK(batch > 0, ValueError, "evaluate_lm: batch must be positive, got ", batch);
  NC_CHECK(count > 0 && windows.size() > 0, ValueError, "evaluate_lm: ", count, " windows of a dataset of ",
           windows.size(), " (both must be positive)");
  const bool was_training = model.is_training();
  model.eval();
  autograd::InferenceModeGuard inference;
  const int64_t last = windows.size() - 1;
  double total = 0;
  for (int64_t first = 0; first < count; first += batch) {
    std::vector<data::Example> samples;
    for (int64_t i = first; i < std::min(count, first + batch); ++i)
      samples.push_back(windows.get(count == 1 ? 0 : i * last / (count - 1)));
    const data::Batch b = data::collate(samples);
    const Tensor loss = lm_loss(model, b.inputs.to(device), b.targets.to(device));
    total += loss.item<double>() * static_cast<double>(samples.size());
  }
  model.train(was_training);
  return total / static_cast<double>(count);
}

}  // namespace models
}  // namespace normcore
