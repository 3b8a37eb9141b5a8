#pragma once

// Bearer tokens: random secrets shown once, kept only as their SHA-256 (docs/api.md, "Roles and
// teams"). OpenSSL's RAND_bytes and SHA-256 underneath.

#include <optional>
#include <string>
#include <string_view>

namespace gpufleet::server {

// "gpf_" and 64 hex digits: 32 bytes from the system's CSPRNG.
std::string NewTokenSecret();
// "tok-" and 8 hex digits: names a token in lists and the audit log; not a secret.
std::string NewTokenId();
// Lower-case hex SHA-256 of `text`.
std::string Sha256Hex(std::string_view text);
// Equal strings, in time that depends only on their lengths.
bool ConstantTimeEquals(std::string_view a, std::string_view b);
// Whether `text` looks like a secret NewTokenSecret() makes.
bool IsWellFormedSecret(std::string_view text);
// The token of an "Authorization: Bearer <token>" header value; nothing for another scheme.
std::optional<std::string> BearerToken(std::string_view authorization);

}  // namespace gpufleet::server
