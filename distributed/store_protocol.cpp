// The store's requests and table (distributed/store_protocol.h).
#include "distributed/store_protocol.h"

#include <cstring>

#include "normcore/distributed.h"

namespace normcore {
namespace distributed {
namespace protocol {

namespace {

constexpr size_t kLengthBytes = sizeof(uint32_t);

void put_u32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); }

uint32_t get_u32(std::string_view bytes, size_t at) {
  uint32_t v = 0;
  std::memcpy(&v, bytes.data() + at, sizeof v);
  return v;
}

const char* command_name(uint8_t command) {
  switch (command) {
    case kSet: return "set";
    case kGet: return "get";
    case kAdd: return "add";
    case kRemove: return "remove";
    default: return "?";
  }
}

}  // namespace

size_t max_request_bytes() { return 1 + 2 * kLengthBytes + TcpStore::kMaxKeyBytes + TcpStore::kMaxValueBytes; }

std::string encode_request(uint8_t command, const std::string& key, const std::string& value) {
  std::string out(1, static_cast<char>(command));
  put_u32(out, static_cast<uint32_t>(key.size()));
  out += key;
  put_u32(out, static_cast<uint32_t>(value.size()));
  out += value;
  return out;
}

size_t parse_request(std::string_view bytes, Request* request) {
  if (bytes.empty()) return 0;
  const uint8_t command = static_cast<uint8_t>(bytes[0]);
  NC_CHECK(command >= kSet && command <= kRemove, DistributedError, "TcpStore: unknown command ",
           static_cast<int>(command));
  const size_t key_at = 1 + kLengthBytes;
  if (bytes.size() < key_at) return 0;
  const uint32_t key_bytes = get_u32(bytes, 1);
  NC_CHECK(key_bytes <= TcpStore::kMaxKeyBytes, DistributedError, "TcpStore: a ", command_name(command),
           " with a key of ", key_bytes, " bytes (at most ", TcpStore::kMaxKeyBytes, ")");
  const size_t value_length_at = key_at + key_bytes;
  if (bytes.size() < value_length_at + kLengthBytes) return 0;
  const uint32_t value_bytes = get_u32(bytes, value_length_at);
  NC_CHECK(value_bytes <= TcpStore::kMaxValueBytes, DistributedError, "TcpStore: a ", command_name(command),
           " with a value of ", value_bytes, " bytes (at most ", TcpStore::kMaxValueBytes, ")");
  NC_CHECK(command != kAdd || value_bytes == sizeof(int64_t), DistributedError, "TcpStore: an add with a value of ",
           value_bytes, " bytes (its delta has 8)");
  NC_CHECK(command == kSet || command == kAdd || value_bytes == 0, DistributedError, "TcpStore: a ",
           command_name(command), " with a value of ", value_bytes, " bytes (it takes none)");
  const size_t value_at = value_length_at + kLengthBytes;
  if (bytes.size() < value_at + value_bytes) return 0;
  request->command = command;
  request->key.assign(bytes.substr(key_at, key_bytes));
  request->value.assign(bytes.substr(value_at, value_bytes));
  return value_at + value_bytes;
}

std::optional<std::string> Table::apply(const Request& request) {
  std::string reply;
  switch (request.command) {
    case kSet:
      values_[request.key] = request.value;
      reply.push_back('\0');
      break;
    case kGet: {
      const auto found = values_.find(request.key);
      if (found == values_.end()) return std::nullopt;
      put_u32(reply, static_cast<uint32_t>(found->second.size()));
      reply += found->second;
      break;
    }
    case kAdd: {
      int64_t delta = 0, sum = 0;
      std::memcpy(&delta, request.value.data(), sizeof delta);
      std::string& stored = values_[request.key];
      if (stored.size() == sizeof(int64_t)) std::memcpy(&sum, stored.data(), sizeof sum);
      // Wraps around like the two's-complement counter it is, rather than overflowing.
      sum = static_cast<int64_t>(static_cast<uint64_t>(sum) + static_cast<uint64_t>(delta));
      stored.assign(reinterpret_cast<const char*>(&sum), sizeof sum);
      reply = stored;
      break;
    }
    case kRemove:
      values_.erase(request.key);
      reply.push_back('\0');
      break;
    default: throw DistributedError(detail::cat_str("TcpStore: unknown command ", static_cast<int>(request.command)));
  }
  return reply;
}

}  // namespace protocol
}  // namespace distributed
}  // namespace normcore
