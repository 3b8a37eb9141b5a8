#pragma once

// Secrets: the server's bearer tokens (shown once, kept only as their SHA-256; docs/api.md, "Roles
// and teams") and the agent's API key (docs/security.md). OpenSSL's RAND_bytes and SHA-256
// underneath, here in net so the agent and the server share them.

#include <optional>
#include <string>
#include <string_view>

namespace gpufleet::net {

// "gpf_" and 64 hex digits: 32 bytes from the system's CSPRNG.
std::string NewTokenSecret();
// `bytes` bytes from the system's CSPRNG as lower-case hex (at most 64 bytes).
std::string RandomHex(size_t bytes);
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

}  // namespace gpufleet::net
