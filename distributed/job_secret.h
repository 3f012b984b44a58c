// The job secret of the rendezvous store and the proofs of its challenge-response
// (docs/DESIGN.md, "The rendezvous"). Randomness and HMAC-SHA256 are OpenSSL's libcrypto.
// A proof is HMAC(secret, label || server nonce || client nonce); the client's and the
// server's labels differ, so neither side's proof can be replayed as the other's. Internal
// to distributed/ (not installed).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace normcore {
namespace distributed {

constexpr const char* kJobSecretVariable = "NORMCORE_JOB_SECRET";
// Shorter secrets are refused: a guessable one protects nothing.
constexpr size_t kMinSecretBytes = 16;
constexpr size_t kMaxSecretBytes = 4096;

constexpr size_t kNonceBytes = 32;
constexpr size_t kProofBytes = 32;  // SHA-256
using Nonce = std::array<uint8_t, kNonceBytes>;
using Proof = std::array<uint8_t, kProofBytes>;

enum class Role { Client, Server };

// bytes from the operating system's generator through libcrypto; DistributedError when it
// has none to give.
void random_bytes(uint8_t* bytes, size_t count);

// 32 random bytes as 64 hex digits, for a launcher to hand to its ranks.
std::string make_job_secret();

// The secret a store uses: given (when not empty), else NORMCORE_JOB_SECRET, else one made
// once for this process (its in-process clients share it; no other process has it). what
// names the caller in the ValueError for a secret outside [kMinSecretBytes, kMaxSecretBytes].
std::string resolve_job_secret(const std::string& given, const char* what);

// Whether NORMCORE_JOB_SECRET is set (and not empty).
bool job_secret_in_environment();

Proof make_proof(const std::string& secret, Role role, const Nonce& server_nonce, const Nonce& client_nonce);

// Compares in constant time, so a wrong proof's timing tells nothing about the right one.
bool same_proof(const Proof& a, const Proof& b);

}  // namespace distributed
}  // namespace normcore
