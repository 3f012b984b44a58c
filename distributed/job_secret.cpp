// The job secret and the challenge-response proofs (distributed/job_secret.h).
#include "distributed/job_secret.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdlib>
#include <cstring>

#include "normcore/error.h"

namespace normcore {
namespace distributed {

void random_bytes(uint8_t* bytes, size_t count) {
  NC_CHECK(count <= (1u << 20) && RAND_bytes(bytes, static_cast<int>(count)) == 1, DistributedError,
           "the random number generator gave no bytes (OpenSSL's RAND_bytes failed)");
}

std::string make_job_secret() {
  uint8_t raw[32];
  random_bytes(raw, sizeof raw);
  static const char kDigits[] = "0123456789abcdef";
  std::string hex;
  for (uint8_t b : raw) {
    hex.push_back(kDigits[b >> 4]);
    hex.push_back(kDigits[b & 15]);
  }
  return hex;
}

bool job_secret_in_environment() {
  const char* text = std::getenv(kJobSecretVariable);
  return text != nullptr && *text != '\0';
}

std::string resolve_job_secret(const std::string& given, const char* what) {
  std::string secret = given;
  const char* from = "the secret given";
  if (secret.empty() && job_secret_in_environment()) {
    secret = std::getenv(kJobSecretVariable);
    from = kJobSecretVariable;
  }
  if (secret.empty()) {
    static const std::string process_secret = make_job_secret();
    return process_secret;
  }
  NC_CHECK(secret.size() >= kMinSecretBytes && secret.size() <= kMaxSecretBytes, ValueError, what, ": ", from, " has ",
           secret.size(), " bytes; a job secret has ", kMinSecretBytes, " to ", kMaxSecretBytes,
           " (make one with: openssl rand -hex 32)");
  return secret;
}

Proof make_proof(const std::string& secret, Role role, const Nonce& server_nonce, const Nonce& client_nonce) {
  const char* label = role == Role::Client ? "normcore store client proof" : "normcore store server proof";
  const size_t label_bytes = std::strlen(label) + 1;  // with its '\0', so no label is a prefix of another
  uint8_t message[64 + 2 * kNonceBytes];
  std::memcpy(message, label, label_bytes);
  std::memcpy(message + label_bytes, server_nonce.data(), kNonceBytes);
  std::memcpy(message + label_bytes + kNonceBytes, client_nonce.data(), kNonceBytes);
  Proof proof{};
  unsigned int length = 0;
  const bool made = HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), message,
                         label_bytes + 2 * kNonceBytes, proof.data(), &length) != nullptr;
  NC_CHECK(made && length == kProofBytes, DistributedError, "TcpStore: HMAC-SHA256 failed (OpenSSL)");
  return proof;
}

bool same_proof(const Proof& a, const Proof& b) { return CRYPTO_memcmp(a.data(), b.data(), kProofBytes) == 0; }

}  // namespace distributed
}  // namespace normcore
