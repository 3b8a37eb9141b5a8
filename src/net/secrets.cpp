#include "net/secrets.h"

#include <array>
#include <cctype>
#include <stdexcept>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

namespace gpufleet::net {
namespace {

constexpr std::string_view kSecretPrefix = "gpf_";
constexpr size_t kSecretBytes = 32;

std::string Hex(const unsigned char* bytes, size_t size) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(size * 2);
  for (size_t i = 0; i < size; ++i) {
    out.push_back(kDigits[bytes[i] >> 4]);
    out.push_back(kDigits[bytes[i] & 0xf]);
  }
  return out;
}

}  // namespace

std::string RandomHex(size_t bytes) {
  std::array<unsigned char, 64> buffer{};
  if (bytes > buffer.size() || RAND_bytes(buffer.data(), static_cast<int>(bytes)) != 1)
    throw std::runtime_error("RAND_bytes failed: no randomness for a secret");
  return Hex(buffer.data(), bytes);
}

std::string NewTokenSecret() {
  return std::string(kSecretPrefix) + RandomHex(kSecretBytes);
}

std::string NewTokenId() {
  return "tok-" + RandomHex(4);
}

std::string Sha256Hex(std::string_view text) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (EVP_Digest(text.data(), text.size(), digest, &size, EVP_sha256(), nullptr) != 1)
    throw std::runtime_error("SHA-256 failed");
  return Hex(digest, size);
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

bool IsWellFormedSecret(std::string_view text) {
  if (text.size() != kSecretPrefix.size() + kSecretBytes * 2 || !text.starts_with(kSecretPrefix))
    return false;
  for (char c : text.substr(kSecretPrefix.size()))
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

std::optional<std::string> BearerToken(std::string_view authorization) {
  constexpr std::string_view kScheme = "bearer ";
  if (authorization.size() <= kScheme.size()) return std::nullopt;
  for (size_t i = 0; i < kScheme.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(authorization[i])) != kScheme[i])
      return std::nullopt;
  std::string_view token = authorization.substr(kScheme.size());
  while (!token.empty() && token.front() == ' ')
    token.remove_prefix(1);
  while (!token.empty() && (token.back() == ' ' || token.back() == '\t'))
    token.remove_suffix(1);
  if (token.empty()) return std::nullopt;
  return std::string(token);
}

}  // namespace gpufleet::net
