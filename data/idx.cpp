// IDX reader (the MNIST file format): 00 00 <type> <ndims>, ndims big-endian u32 sizes, then
// the big-endian data. A gzip file is decompressed as a stream whose output is counted
// against what the header promises, so neither a lying header nor a decompression bomb can
// make the reader allocate more than the data actually present (and at most 4 GiB).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <vector>

#include "normcore/data.h"
#include "normcore/error.h"

namespace normcore {
namespace data {
namespace {

constexpr uint64_t kMaxDataBytes = uint64_t(4) << 30;
constexpr int kMaxDims = 8;
constexpr size_t kChunkBytes = size_t(1) << 16;
// Decompressed bytes past the data that are counted for the error message before giving up.
constexpr uint64_t kMaxTrailingCount = uint64_t(1) << 20;

template <class... Args>
[[noreturn]] void fail(const std::string& path, const Args&... args) {
  throw IOError(detail::cat_str("read_idx: ", path, ": ", args...));
}

std::string hex_byte(uint8_t b) {
  char text[5];
  std::snprintf(text, sizeof text, "0x%02X", b);
  return text;
}

struct IdxType {
  uint8_t code;
  DType dtype;
};
constexpr IdxType kIdxTypes[] = {{0x08, DType::U8}, {0x0C, DType::I32}, {0x0D, DType::F32}, {0x0E, DType::F64}};

DType dtype_of_code(uint8_t code, const std::string& path) {
  for (const IdxType& t : kIdxTypes)
    if (t.code == code) return t.dtype;
  const char* kind = code == 0x09 ? " (signed 8-bit)" : code == 0x0B ? " (signed 16-bit)" : nullptr;
  if (kind)
    fail(path, "unsupported IDX type code ", hex_byte(code), kind,
         "; normcore reads 0x08 (u8), 0x0C (i32), 0x0D (f32) and 0x0E (f64)");
  fail(path, "unknown IDX type code ", hex_byte(code));
}

// An open regular file, closed on destruction.
class File {
 public:
  explicit File(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail(path, "cannot open (", std::strerror(errno), ")");
    struct stat info;
    if (::fstat(fd_, &info) != 0) {
      int err = errno;
      ::close(fd_);
      fail(path, "cannot stat (", std::strerror(err), ")");
    }
    if (!S_ISREG(info.st_mode)) {
      ::close(fd_);
      fail(path, "not a regular file");
    }
    size_ = static_cast<uint64_t>(info.st_size);
  }
  ~File() { ::close(fd_); }
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  void rewind() {
    if (::lseek(fd_, 0, SEEK_SET) != 0) fail(path_, "cannot seek (", std::strerror(errno), ")");
  }

  // Reads up to n bytes; fewer only at the end of the file.
  size_t read(uint8_t* dst, size_t n) {
    size_t done = 0;
    while (done < n) {
      ssize_t got = ::read(fd_, dst + done, n - done);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) fail(path_, "read failed (", std::strerror(errno), ")");
      if (got == 0) break;
      done += static_cast<size_t>(got);
    }
    return done;
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// The bytes of the IDX content: read() fills dst and returns fewer than n bytes only at
// the end of the content.
class Source {
 public:
  virtual ~Source() = default;
  virtual size_t read(uint8_t* dst, size_t n) = 0;
  // Bytes left, when known without reading them (plain files).
  virtual std::optional<uint64_t> remaining() const = 0;
};

class PlainSource : public Source {
 public:
  explicit PlainSource(File& file) : file_(file), left_(file.size()) {}
  size_t read(uint8_t* dst, size_t n) override {
    size_t got = file_.read(dst, n);
    left_ -= std::min<uint64_t>(left_, got);
    return got;
  }
  std::optional<uint64_t> remaining() const override { return left_; }

 private:
  File& file_;
  uint64_t left_;
};

// Decompresses one or more concatenated gzip members (RFC 1952 allows several); any other
// bytes after a member are an error. zlib checks each member's CRC-32 and length.
class GzipSource : public Source {
 public:
  explicit GzipSource(File& file) : file_(file), input_(kChunkBytes) {
    std::memset(&stream_, 0, sizeof stream_);
    if (inflateInit2(&stream_, 16 + MAX_WBITS) != Z_OK) fail(file.path(), "cannot start zlib");
  }
  ~GzipSource() override { inflateEnd(&stream_); }

  size_t read(uint8_t* dst, size_t n) override {
    size_t done = 0;
    // zlib counts in 32 bits.
    constexpr size_t kMaxPiece = size_t(1) << 30;
    while (done < n && !finished_) {
      size_t piece = std::min(n - done, kMaxPiece);
      done += read_piece(dst + done, piece);
    }
    return done;
  }
  std::optional<uint64_t> remaining() const override { return std::nullopt; }

 private:
  size_t read_piece(uint8_t* dst, size_t n) {
    stream_.next_out = dst;
    stream_.avail_out = static_cast<uInt>(n);
    while (stream_.avail_out > 0 && !finished_) {
      if (!fill_input(1)) fail(file_.path(), "gzip stream is truncated (the compressed data ends inside a member)");
      int rc = inflate(&stream_, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) {
        end_member();
      } else if (rc == Z_MEM_ERROR) {
        fail(file_.path(), "zlib ran out of memory");
      } else if (rc != Z_OK) {
        const std::string reason = stream_.msg ? stream_.msg : "error code " + std::to_string(rc);
        fail(file_.path(), "corrupted gzip stream (zlib: ", reason, ")");
      }
    }
    return n - stream_.avail_out;
  }

  // After a member: the file ends, or another member starts.
  void end_member() {
    fill_input(2);
    if (stream_.avail_in == 0) {
      finished_ = true;
      return;
    }
    if (stream_.avail_in < 2 || stream_.next_in[0] != 0x1f || stream_.next_in[1] != 0x8b)
      fail(file_.path(), "trailing bytes after the end of the gzip stream that are not a gzip member");
    inflateReset(&stream_);
  }

  // Makes at least want bytes of input available unless the file ends first; returns
  // whether any input is available.
  bool fill_input(size_t want) {
    if (stream_.avail_in >= want) return true;
    if (stream_.avail_in > 0) std::memmove(input_.data(), stream_.next_in, stream_.avail_in);
    size_t have = stream_.avail_in;
    have += file_.read(input_.data() + have, input_.size() - have);
    stream_.next_in = input_.data();
    stream_.avail_in = static_cast<uInt>(have);
    return have > 0;
  }

  File& file_;
  std::vector<uint8_t> input_;
  z_stream stream_;
  bool finished_ = false;
};

// Reads the data of a header that promised nbytes, comparing what the file holds with the
// promise before the tensor is allocated.
std::vector<uint8_t> read_unknown_length(Source& source, uint64_t nbytes, const std::string& path, const Shape& dims) {
  std::vector<uint8_t> bytes;
  size_t have = 0;
  while (have < nbytes) {
    // Grow with what arrives, not with what the header claims.
    size_t capacity = static_cast<size_t>(std::min<uint64_t>(nbytes, std::max<uint64_t>(2 * have, kChunkBytes)));
    bytes.resize(capacity);
    size_t got = source.read(bytes.data() + have, capacity - have);
    have += got;
    if (have < capacity) break;
  }
  if (have < nbytes)
    fail(path, "truncated data: dims ", dims, " promise ", nbytes, " bytes of data but the file holds ", have);
  uint64_t trailing = 0;
  uint8_t scratch[4096];
  // Reading to the end also makes zlib check the CRC of the last member.
  while (trailing <= kMaxTrailingCount) {
    size_t got = source.read(scratch, sizeof scratch);
    trailing += got;
    if (got < sizeof scratch) break;
  }
  if (trailing > kMaxTrailingCount)
    fail(path, "trailing data: more than ", kMaxTrailingCount, " bytes after the ", nbytes, " bytes of data that dims ",
         dims, " promise");
  if (trailing > 0)
    fail(path, "trailing data: ", trailing, " bytes after the ", nbytes, " bytes of data that dims ", dims, " promise");
  return bytes;
}

void swap_to_host_order(uint8_t* data, uint64_t count, size_t element_size) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  if (element_size == 1) return;
  for (uint64_t i = 0; i < count; ++i) std::reverse(data + i * element_size, data + (i + 1) * element_size);
#else
  (void)data;
  (void)count;
  (void)element_size;
#endif
}

}  // namespace

Tensor read_idx(const std::string& path) {
  File file(path);
  uint8_t lead[2] = {0, 0};
  const size_t lead_bytes = file.read(lead, 2);
  if (lead_bytes == 0) fail(path, "file is empty");
  const bool gzip = lead_bytes == 2 && lead[0] == 0x1f && lead[1] == 0x8b;
  if (!gzip && (lead_bytes < 2 || lead[0] != 0 || lead[1] != 0))
    fail(path, "neither gzip nor IDX: starts with ", hex_byte(lead[0]),
         lead_bytes == 2 ? " " + hex_byte(lead[1]) : std::string(),
         " (gzip starts with 0x1F 0x8B, IDX with 0x00 0x00)");
  file.rewind();
  std::optional<PlainSource> plain;
  std::optional<GzipSource> compressed;
  Source& source = gzip ? static_cast<Source&>(compressed.emplace(file)) : plain.emplace(file);

  uint8_t magic[4];
  if (source.read(magic, 4) < 4) fail(path, "truncated header: fewer than the 4 bytes of the IDX magic");
  if (magic[0] != 0 || magic[1] != 0)
    fail(path, "bad IDX magic ", hex_byte(magic[0]), " ", hex_byte(magic[1]), " ", hex_byte(magic[2]), " ",
         hex_byte(magic[3]), " in the decompressed data (expected 0x00 0x00 <type> <dims>)");
  const DType dtype = dtype_of_code(magic[2], path);
  const int ndims = magic[3];
  if (ndims == 0) fail(path, "header declares 0 dims (an IDX array has at least 1)");
  if (ndims > kMaxDims) fail(path, "header declares ", ndims, " dims (at most ", kMaxDims, " are supported)");

  uint8_t sizes[4 * kMaxDims];
  if (source.read(sizes, 4 * ndims) < static_cast<size_t>(4 * ndims))
    fail(path, "truncated header: the file ends inside the ", ndims, " dim sizes");
  Shape dims(ndims);
  // The limit also binds when a dim is 0: the tensor's strides are products of the others.
  uint64_t nbytes = dtype_size(dtype), extent = dtype_size(dtype);
  bool overflow = false;
  for (int d = 0; d < ndims; ++d) {
    const uint8_t* b = sizes + 4 * d;
    const uint32_t size = (uint32_t(b[0]) << 24) | (uint32_t(b[1]) << 16) | (uint32_t(b[2]) << 8) | b[3];
    dims[d] = size;
    nbytes *= size;  // at most extent, which is checked for overflow
    overflow = overflow || __builtin_mul_overflow(extent, uint64_t(std::max<uint32_t>(size, 1)), &extent);
  }
  if (overflow) fail(path, "dims ", dims, " of ", dtype_name(dtype), " overflow the byte count");
  if (extent > kMaxDataBytes)
    fail(path, "dims ", dims, " of ", dtype_name(dtype), " exceed the limit of ", kMaxDataBytes, " bytes (4 GiB)");

  Tensor out;
  if (std::optional<uint64_t> left = source.remaining()) {
    if (*left < nbytes)
      fail(path, "truncated data: dims ", dims, " promise ", nbytes, " bytes of data but the file holds ", *left);
    if (*left > nbytes)
      fail(path, "trailing data: ", *left - nbytes, " bytes after the ", nbytes, " bytes of data that dims ", dims,
           " promise");
    out = empty(dims, TensorOptions(dtype));
    if (source.read(static_cast<uint8_t*>(out.data_ptr()), nbytes) < nbytes)
      fail(path, "truncated data: the file shrank while it was read");
  } else {
    const std::vector<uint8_t> bytes = read_unknown_length(source, nbytes, path, dims);
    out = empty(dims, TensorOptions(dtype));
    if (nbytes > 0) std::memcpy(out.data_ptr(), bytes.data(), nbytes);
  }
  swap_to_host_order(static_cast<uint8_t*>(out.data_ptr()), static_cast<uint64_t>(out.numel()), dtype_size(dtype));
  return out;
}

}  // namespace data
}  // namespace normcore
