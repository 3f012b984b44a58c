// Fuzz target: the rendezvous store's server reading an authenticated connection
// (distributed/store_protocol.h), on arbitrary bytes: requests are taken from the front of
// the input as the server takes them from what it has received, and applied to a table.
// Each must be taken whole, wait for more bytes, or be refused with a normcore::Error; a
// request taken stays within the bounds, a strict prefix of it only waits, the bytes
// waiting never reach the largest request, and a get after a set gives the value set. A get
// of an absent key, which the server would wait on, is passed over.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "distributed/store_protocol.h"
#include "normcore/distributed.h"
#include "tests/fuzz/fuzz_support.h"

namespace wire = normcore::distributed::protocol;
using normcore::distributed::TcpStore;
using normcore_fuzz::require;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  wire::Table table;
  normcore_fuzz::expect_only_normcore_errors([&] {
    for (;;) {
      wire::Request request;
      const size_t used = wire::parse_request(bytes, &request);
      if (used == 0) {
        require(bytes.size() < wire::max_request_bytes(), "a request waits for more than the largest request");
        return;
      }
      require(used <= bytes.size(), "a request took more bytes than there were");
      require(request.key.size() <= TcpStore::kMaxKeyBytes && request.value.size() <= TcpStore::kMaxValueBytes,
              "a request past the bounds was taken");
      wire::Request again;
      require(wire::parse_request(bytes.substr(0, used - 1), &again) == 0, "a strict prefix of a request was taken");
      bytes.remove_prefix(used);
      const std::optional<std::string> reply = table.apply(request);
      if (request.command == wire::kGet) {
        require(!reply || reply->size() >= 4, "a get's reply lacks its length");
        continue;
      }
      require(reply.has_value(), "a request other than get was not answered");
      if (request.command == wire::kSet) {
        const std::optional<std::string> value = table.apply({wire::kGet, request.key, ""});
        const uint32_t length = static_cast<uint32_t>(request.value.size());
        require(value && value->size() == 4 + request.value.size() && std::memcmp(value->data(), &length, 4) == 0 &&
                    value->compare(4, std::string::npos, request.value) == 0,
                "a get after a set did not give the value set");
      }
    }
  });
  return 0;
}
