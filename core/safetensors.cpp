// safetensors reader and writer. A read checks, in order: the 8-byte length prefix against
// the actual size, the header JSON (well-formed, no duplicate keys, every entry exactly
// dtype/shape/data_offsets), each tensor's byte count (overflow-checked) against its
// offsets, and that the tensors tile the data area exactly. Only then are tensors
// allocated, and their total size is at most the data area's. Writes pad the header with
// spaces to a multiple of 8 bytes and put "__metadata__" first, like the reference writer.
#include "normcore/safetensors.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "core/temp_file.h"
#include "normcore/error.h"
#ifdef NORMCORE_HAS_CUDA
#include "runtime/cuda/runtime.h"
#endif

// Tensor memory is copied to and from the file byte for byte, and the format is little-endian.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes a little-endian host");

namespace normcore {
namespace safetensors {
namespace {

using Json = nlohmann::ordered_json;

// The reference implementation's limit; no real header comes close.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";
constexpr const char* kMemorySource = "<memory>";

struct FormatName {
  DType dtype;
  const char* name;
};
constexpr FormatName kFormatNames[] = {
    {DType::F32, "F32"}, {DType::F64, "F64"}, {DType::F16, "F16"}, {DType::BF16, "BF16"},
    {DType::I32, "I32"}, {DType::I64, "I64"}, {DType::U8, "U8"},   {DType::Bool, "BOOL"},
};

const char* format_name(DType dtype) {
  for (const FormatName& f : kFormatNames)
    if (f.dtype == dtype) return f.name;
  throw DTypeError(detail::cat_str("safetensors: no file dtype for ", dtype_name(dtype)));
}

std::string supported_format_names() {
  std::string names;
  for (const FormatName& f : kFormatNames) names += std::string(names.empty() ? "" : ", ") + f.name;
  return names;
}

template <class... Args>
[[noreturn]] void fail(const std::string& source, const Args&... args) {
  throw IOError(detail::cat_str("safetensors: ", source, ": ", args...));
}

// A JSON value for an error message, cut short: it may come from a hostile 100 MB header.
std::string excerpt(const Json& value) {
  std::string text = value.dump(-1, ' ', false, Json::error_handler_t::replace);
  constexpr size_t kMax = 40;
  if (text.size() > kMax) text = text.substr(0, kMax) + "...";
  return text;
}

uint64_t read_le64(const uint8_t* bytes) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | bytes[i];
  return v;
}

// One tensor as the header describes it; begin and end are relative to the data area.
struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin;
  uint64_t end;
};

struct Header {
  std::vector<Entry> entries;  // in data order
  std::map<std::string, std::string> metadata;
};

// Returns the header length from the 8-byte prefix after checking it against total_size
// (the whole file, prefix included), so that the header buffer can be allocated safely.
uint64_t checked_header_length(const uint8_t* prefix, uint64_t total_size, const std::string& source) {
  const uint64_t length = read_le64(prefix);
  if (length > kMaxHeaderBytes)
    fail(source, "header length ", length, " is too large (the limit is ", kMaxHeaderBytes,
         " bytes); not a safetensors file?");
  if (length > total_size - 8)
    fail(source, "header length ", length, " exceeds the ", total_size - 8,
         " bytes that follow the length prefix; the file is truncated or not safetensors");
  return length;
}

// Parses the header text, rejecting duplicate keys in any object (nlohmann would keep one).
Json parse_json(const char* text, size_t length, const std::string& source) {
  std::vector<std::set<std::string>> open_objects;
  auto on_event = [&](int, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start: open_objects.emplace_back(); break;
      case Json::parse_event_t::object_end: open_objects.pop_back(); break;
      case Json::parse_event_t::key: {
        const std::string& key = parsed.get_ref<const std::string&>();
        if (!open_objects.back().insert(key).second) fail(source, "duplicate key \"", key, "\" in the header");
        break;
      }
      default: break;
    }
    return true;
  };
  try {
    return Json::parse(text, text + length, on_event);
  } catch (const nlohmann::json::exception& e) {
    fail(source, "header is not well-formed JSON (", e.what(), ")");
  }
}

std::map<std::string, std::string> parse_metadata(const Json& value, const std::string& source) {
  if (!value.is_object())
    fail(source, "\"", kMetadataKey, "\" is a JSON ", value.type_name(), ", not an object of strings");
  std::map<std::string, std::string> metadata;
  for (const auto& item : value.items()) {
    if (!item.value().is_string())
      fail(source, "\"", kMetadataKey, "\" value for \"", item.key(), "\" is a JSON ", item.value().type_name(),
           ", not a string");
    metadata.emplace(item.key(), item.value().get<std::string>());
  }
  return metadata;
}

// Reads a non-negative JSON integer; what names it in the error message.
uint64_t parse_unsigned(const Json& value, const std::string& what, const std::string& source) {
  if (!value.is_number_unsigned()) {
    const char* problem = value.is_number_integer() ? "is negative" : "is not an integer";
    fail(source, what, " ", problem, " (", excerpt(value), "); expected a non-negative integer");
  }
  return value.get<uint64_t>();
}

// Checks one header entry on its own: its keys and their types, the dtype, the shape's
// byte count against its offsets and the offsets against the data area.
Entry parse_entry(const std::string& name, const Json& value, uint64_t data_size, const std::string& source) {
  const std::string tensor = "tensor \"" + name + "\"";
  if (!value.is_object()) fail(source, tensor, ": entry is a JSON ", value.type_name(), ", not an object");
  for (const auto& item : value.items()) {
    const std::string& key = item.key();
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      fail(source, tensor, ": unexpected key \"", key, "\" (an entry has exactly dtype, shape and data_offsets)");
  }
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!value.contains(key)) fail(source, tensor, ": missing \"", key, "\"");

  Entry entry;
  entry.name = name;

  const Json& dtype = value["dtype"];
  if (!dtype.is_string()) fail(source, tensor, ": \"dtype\" is a JSON ", dtype.type_name(), ", not a string");
  const std::string& dtype_text = dtype.get_ref<const std::string&>();
  const FormatName* format = nullptr;
  for (const FormatName& f : kFormatNames)
    if (dtype_text == f.name) format = &f;
  if (!format)
    fail(source, tensor, ": unsupported dtype \"", dtype_text, "\" (normcore reads ", supported_format_names(), ")");
  entry.dtype = format->dtype;

  const Json& shape = value["shape"];
  if (!shape.is_array()) fail(source, tensor, ": \"shape\" is a JSON ", shape.type_name(), ", not an array");
  constexpr uint64_t kMaxCount = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  uint64_t numel = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    const uint64_t size = parse_unsigned(shape[d], detail::cat_str(tensor, ": shape[", d, "]"), source);
    // The reference rejects any overflowing prefix product, even when a later size is 0.
    if (size > kMaxCount || __builtin_mul_overflow(numel, size, &numel) || numel > kMaxCount)
      fail(source, tensor, ": shape ", excerpt(shape), " overflows the element count");
    entry.shape.push_back(static_cast<int64_t>(size));
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(entry.dtype)), &nbytes) || nbytes > kMaxCount)
    fail(source, tensor, ": shape ", excerpt(shape), " of ", format->name, " overflows the byte count");

  const Json& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2)
    fail(source, tensor, ": \"data_offsets\" is ", excerpt(offsets), ", not an array [begin, end]");
  entry.begin = parse_unsigned(offsets[0], tensor + ": data_offsets[0]", source);
  entry.end = parse_unsigned(offsets[1], tensor + ": data_offsets[1]", source);
  if (entry.begin > entry.end)
    fail(source, tensor, ": data_offsets [", entry.begin, ", ", entry.end, "] are out of order (begin > end)");
  if (entry.end > data_size)
    fail(source, tensor, ": data_offsets [", entry.begin, ", ", entry.end, "] reach beyond the data area (", data_size,
         " bytes); the file is truncated or the offsets are wrong");
  if (entry.end - entry.begin != nbytes)
    fail(source, tensor, ": size mismatch: shape ", entry.shape, " of ", format->name, " is ", nbytes,
         " bytes but data_offsets [", entry.begin, ", ", entry.end, "] span ", entry.end - entry.begin);
  return entry;
}

// Parses and validates the header; data_size is the number of bytes after it.
Header parse_header(const char* text, size_t length, uint64_t data_size, const std::string& source) {
  const Json root = parse_json(text, length, source);
  if (!root.is_object()) fail(source, "header is a JSON ", root.type_name(), ", not an object");

  Header header;
  for (const auto& item : root.items()) {
    if (item.key() == kMetadataKey) header.metadata = parse_metadata(item.value(), source);
    else header.entries.push_back(parse_entry(item.key(), item.value(), data_size, source));
  }

  // The format requires the tensors to tile the data area: sorted by offset, each starts
  // where the previous one ended, the first at 0 and the last at the end.
  std::stable_sort(header.entries.begin(), header.entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry& entry : header.entries) {
    if (entry.begin < covered)
      fail(source, "the data of tensors \"", previous->name, "\" [", previous->begin, ", ", previous->end, ") and \"",
           entry.name, "\" [", entry.begin, ", ", entry.end, ") overlap");
    if (entry.begin > covered)
      fail(source, "hole in the data area: bytes [", covered, ", ", entry.begin, ") before tensor \"", entry.name,
           "\" belong to no tensor");
    covered = entry.end;
    previous = &entry;
  }
  if (covered != data_size)
    fail(source, "the trailing ", data_size - covered, " bytes of the data area (", data_size,
         " bytes) belong to no tensor");
  return header;
}

// Copies n host bytes to dst on device (a GPU: a CPU-only build has none to load to).
void copy_to_device(void* dst, Device device, const void* src, size_t n) {
#ifdef NORMCORE_HAS_CUDA
  cuda::copy_bytes(dst, device, src, Device::cpu(), n);
#else
  (void)dst, (void)src, (void)n;
  throw DeviceError(detail::cat_str("safetensors: cannot load to ", device, " in a build without CUDA"));
#endif
}

// A load to a GPU passes the data through a host buffer of at most this many bytes, so that
// host memory holds a piece of one tensor at a time, not a whole tensor.
constexpr size_t kStagingBytes = size_t(16) << 20;

// Anything but 0 and 1 in a bool would break ops that index by it. first is the index of
// bytes[0] in the tensor.
void check_bools(const uint8_t* bytes, size_t n, size_t first, const Entry& entry, const std::string& source) {
  for (size_t i = 0; i < n; ++i)
    if (bytes[i] > 1)
      fail(source, "tensor \"", entry.name, "\": invalid BOOL byte ", int(bytes[i]), " at element ", first + i);
}

// Creates the tensors of a validated header. read_next copies the next bytes of the data
// area into its destination; tensors are read in data order, so the reads are sequential.
// CPU tensors are read straight into their memory; device tensors through the staging
// buffer, piece by piece.
File build_file(Header header, const std::function<void(void*, size_t)>& read_next, Device device,
                const std::string& source) {
  File file;
  file.source = source;
  file.metadata = std::move(header.metadata);
  file.tensors.reserve(header.entries.size());
  std::vector<uint8_t> staging;
  for (Entry& entry : header.entries) {
    Tensor tensor = empty(entry.shape, TensorOptions(entry.dtype, device));
    const size_t nbytes = static_cast<size_t>(entry.end - entry.begin);
    if (device.is_cpu()) {
      if (nbytes > 0) read_next(tensor.data_ptr(), nbytes);
      if (entry.dtype == DType::Bool)
        check_bools(static_cast<const uint8_t*>(tensor.data_ptr()), nbytes, 0, entry, source);
    } else {
      staging.resize(std::max(staging.size(), std::min(nbytes, kStagingBytes)));
      for (size_t done = 0; done < nbytes;) {
        const size_t n = std::min(kStagingBytes, nbytes - done);
        read_next(staging.data(), n);
        if (entry.dtype == DType::Bool) check_bools(staging.data(), n, done, entry, source);
        // Complete on return from pageable memory: the buffer can be refilled.
        copy_to_device(static_cast<uint8_t*>(tensor.data_ptr()) + done, device, staging.data(), n);
        done += n;
      }
    }
    file.tensors.emplace_back(std::move(entry.name), tensor);
  }
  return file;
}

struct CloseFile {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

// Checks the tensors and metadata for save and returns the padded header text.
std::string make_header(const TensorList& tensors, const std::map<std::string, std::string>& metadata) {
  Json root = Json::object();
  if (!metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    root[kMetadataKey] = std::move(meta);
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, tensor] = tensors[i];
    NC_CHECK(tensor.defined(), ValueError, "safetensors::save: tensor ", i, " (\"", name, "\") is undefined");
    NC_CHECK(name != kMetadataKey, ValueError, "safetensors::save: tensor ", i, " uses the reserved name \"",
             kMetadataKey, "\"");
    NC_CHECK(!root.contains(name), ValueError, "safetensors::save: duplicate tensor name \"", name, "\"");
    const uint64_t nbytes = tensor.nbytes();
    root[name] = Json{
        {"dtype", format_name(tensor.dtype())}, {"shape", tensor.shape()}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text;
  try {
    text = root.dump();
  } catch (const nlohmann::json::exception&) {
    throw ValueError("safetensors::save: a tensor name or metadata string is not valid UTF-8");
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

// Writes the length prefix, the header and every tensor's bytes to sink, one tensor at a
// time so that only one host copy of a device tensor exists at once.
void write_file(const std::string& header, const TensorList& tensors,
                const std::function<void(const void*, size_t)>& sink) {
  uint8_t prefix[8];
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));
  sink(prefix, sizeof prefix);
  sink(header.data(), header.size());
  for (const auto& entry : tensors) {
    const Tensor host = entry.second.to(Device::cpu()).contiguous();
    if (host.nbytes() > 0) sink(host.data_ptr(), host.nbytes());
  }
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

bool File::contains(const std::string& name) const {
  return std::any_of(tensors.begin(), tensors.end(), [&](const auto& entry) { return entry.first == name; });
}

const Tensor& File::at(const std::string& name) const {
  for (const auto& entry : tensors)
    if (entry.first == name) return entry.second;
  fail(source, "no tensor named \"", name, "\" (the file has ", tensors.size(), " tensors)");
}

File load_bytes(const uint8_t* data, size_t size, Device device) {
  const std::string source = kMemorySource;
  NC_CHECK(data != nullptr || size == 0, ValueError, "safetensors::load_bytes: data is null but size is ", size);
  if (size < 8) fail(source, "shorter than 8 bytes (", size, " bytes); not a safetensors file");
  const uint64_t header_length = checked_header_length(data, size, source);
  const uint64_t data_start = 8 + header_length;
  Header header = parse_header(reinterpret_cast<const char*>(data + 8), header_length, size - data_start, source);
  size_t cursor = data_start;
  auto read_next = [&](void* dst, size_t n) {
    std::memcpy(dst, data + cursor, n);
    cursor += n;
  };
  return build_file(std::move(header), read_next, device, source);
}

File load(const std::string& path, Device device) {
  std::unique_ptr<std::FILE, CloseFile> file(std::fopen(path.c_str(), "rb"));
  if (!file) fail(path, "cannot open (", errno_text(), ")");
  struct stat info;
  if (::fstat(::fileno(file.get()), &info) != 0) fail(path, "cannot stat (", errno_text(), ")");
  if (!S_ISREG(info.st_mode)) fail(path, "not a regular file");
  const uint64_t size = static_cast<uint64_t>(info.st_size);

  auto read_exactly = [&](void* dst, size_t n, const char* what) {
    if (std::fread(dst, 1, n, file.get()) != n) {
      if (std::ferror(file.get())) fail(path, "cannot read the ", what, " (", errno_text(), ")");
      fail(path, "the file ended while reading the ", what, "; it was truncated while being read");
    }
  };
  if (size < 8) fail(path, "shorter than 8 bytes (", size, " bytes); not a safetensors file");
  uint8_t prefix[8];
  read_exactly(prefix, sizeof prefix, "header length");
  const uint64_t header_length = checked_header_length(prefix, size, path);
  std::string text(static_cast<size_t>(header_length), '\0');
  read_exactly(text.data(), text.size(), "header");
  Header header = parse_header(text.data(), text.size(), size - 8 - header_length, path);
  auto read_next = [&](void* dst, size_t n) { read_exactly(dst, n, "tensor data"); };
  return build_file(std::move(header), read_next, device, path);
}

std::vector<uint8_t> save_bytes(const TensorList& tensors, const std::map<std::string, std::string>& metadata) {
  const std::string header = make_header(tensors, metadata);
  size_t total = 8 + header.size();
  for (const auto& entry : tensors) total += entry.second.nbytes();
  std::vector<uint8_t> bytes;
  bytes.reserve(total);
  write_file(header, tensors, [&](const void* data, size_t size) {
    const uint8_t* begin = static_cast<const uint8_t*>(data);
    bytes.insert(bytes.end(), begin, begin + size);
  });
  return bytes;
}

void save(const std::string& path, const TensorList& tensors, const std::map<std::string, std::string>& metadata) {
  // Everything that can be checked is checked before the temporary file exists.
  const std::string header = make_header(tensors, metadata);
  detail::TempFile temp("safetensors", path);
  write_file(header, tensors, [&](const void* data, size_t size) { temp.write(data, size); });
  temp.commit();
}

}  // namespace safetensors
}  // namespace normcore
