// What the HTTP layer parses from a caller's bytes before any handler runs: the raw request as
// the server reads it (Beast's request parser under the server's header and body limits, then
// the target split into path and query and the bearer token taken from it, as
// net/http_server.cpp does), and the same bytes as a request target, an Authorization header
// and a URL given to the clients.

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "net/http.h"
#include "net/http_client.h"
#include "net/http_server.h"
#include "net/secrets.h"

namespace {

namespace http = boost::beast::http;

// In two pieces, as a socket may deliver them: the parser must not depend on where reads end.
void ParseAsTheServerDoes(std::string_view bytes) {
  const gpufleet::net::HttpServerOptions limits;
  http::request_parser<http::string_body> parser;
  parser.header_limit(static_cast<uint32_t>(limits.max_header_bytes));
  parser.body_limit(limits.max_body_bytes);
  parser.eager(true);
  const size_t split = bytes.empty() ? 0 : static_cast<unsigned char>(bytes[0]) % bytes.size();
  for (std::string_view piece : {bytes.substr(0, split), bytes.substr(split)}) {
    boost::beast::error_code error;
    while (!piece.empty() && !parser.is_done()) {
      const size_t used = parser.put(boost::asio::buffer(piece.data(), piece.size()), error);
      if (error || used == 0) break;
      piece.remove_prefix(used);
    }
    if (error && error != http::error::need_more) return;
  }
  if (!parser.is_done()) return;
  const http::request<http::string_body>& request = parser.get();
  std::string path;
  std::map<std::string, std::string> query;
  gpufleet::net::SplitTarget(std::string(request.target()), path, query);
  gpufleet::net::BearerToken(std::string(request[http::field::authorization]));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  ParseAsTheServerDoes(text);
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
