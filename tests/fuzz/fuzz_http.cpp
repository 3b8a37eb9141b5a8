// What the HTTP layer parses from a caller's bytes before any handler runs: the request target
// (path and query, percent-decoding), the Authorization header, and URLs given to the clients.

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "net/http.h"
#include "net/http_client.h"
#include "net/secrets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::string path;
  std::map<std::string, std::string> query;
  gpufleet::net::SplitTarget(text, path, query);
  gpufleet::net::PercentDecode(text, true);
  gpufleet::net::JsonEscape(text);
  gpufleet::net::BearerToken(text);
  std::string error;
  gpufleet::net::ParseHttpUrl(text, error);
  return 0;
}
