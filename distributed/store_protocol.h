// The rendezvous store's wire protocol without the sockets: the handshake's messages, the
// requests and what they do to the table of keys, so that what the server reads can be fed
// from a byte buffer (tests/fuzz/store.cpp). Integers are little-endian (every machine
// normcore builds for). A connection opens with the handshake (store.cpp):
//   server: hello   "NCST", u8 version, u8 status (kReady, kBusy), then a nonce when ready
//   client: answer  client nonce, client proof           (job_secret.h)
//   server: verdict u8 (kAccepted, kRejected), then the server's proof when accepted
// then carries one request and one reply at a time:
//   request: u8 command, u32 key length, key, u32 value length, value
//   SET   -> u8 0                      (value: the bytes)
//   GET   -> u32 length, bytes         (the server waits until the key is set)
//   ADD   -> i64 sum                   (value: the i64 delta)
//   DEL   -> u8 0                      (removes the key; no value)
// A length over its bound (TcpStore::kMaxKeyBytes, kMaxValueBytes) is refused as soon as it
// is read, before anything is allocated for it. Internal to distributed/ (not installed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "distributed/job_secret.h"

namespace normcore {
namespace distributed {
namespace protocol {

constexpr char kMagic[4] = {'N', 'C', 'S', 'T'};
constexpr uint8_t kVersion = 1;
enum HelloStatus : uint8_t { kReady = 0, kBusy = 1 };
enum Verdict : uint8_t { kAccepted = 0, kRejected = 1 };
constexpr size_t kHelloBytes = sizeof kMagic + 2;  // before the nonce
constexpr size_t kAnswerBytes = kNonceBytes + kProofBytes;

enum Command : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kRemove = 4 };

struct Request {
  uint8_t command = 0;
  std::string key;
  std::string value;
};

// The largest request the bounds allow, in bytes.
size_t max_request_bytes();

std::string encode_request(uint8_t command, const std::string& key, const std::string& value);

// Reads the request at the front of bytes: the number of bytes it took, with *request
// filled, when a whole request is there; 0 when more bytes are needed. A request that can
// never be valid throws DistributedError naming what is wrong: an unknown command, a key or
// value longer than its bound, an add whose value is not 8 bytes, a get or remove with a
// value.
size_t parse_request(std::string_view bytes, Request* request);

// The keys and their values. Not thread-safe: the server holds its lock around it.
class Table {
 public:
  // The reply to request; nothing for a get of a key not set yet (the server waits for it
  // and applies the get again).
  std::optional<std::string> apply(const Request& request);
  bool contains(const std::string& key) const { return values_.count(key) > 0; }

 private:
  std::map<std::string, std::string> values_;
};

}  // namespace protocol
}  // namespace distributed
}  // namespace normcore
