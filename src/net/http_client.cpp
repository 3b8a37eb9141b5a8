#include "net/http_client.h"

#include <algorithm>
#include <cctype>
#include <charconv>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>

namespace gpufleet::net {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// Large enough for any log tail or listing the agent returns.
constexpr uint64_t kMaxResponseBodyBytes = uint64_t{256} << 20;

}  // namespace

std::string HttpClientResponse::Header(std::string_view name) const {
  for (const auto& [key, value] : headers)
    if (beast::iequals(key, name)) return value;
  return "";
}

std::optional<HttpUrl> ParseHttpUrl(std::string_view url, std::string& error) {
  constexpr std::string_view kScheme = "http://";
  if (url.substr(0, kScheme.size()) != kScheme) {
    error = fmt::format("'{}' is not an http:// URL", url);
    return std::nullopt;
  }
  std::string_view rest = url.substr(kScheme.size());
  size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  HttpUrl parsed;
  parsed.target = slash == std::string_view::npos ? "/" : std::string(rest.substr(slash));
  std::string_view port_text;
  if (!authority.empty() && authority.front() == '[') {  // [::1]:9400
    size_t close = authority.find(']');
    if (close == std::string_view::npos) {
      error = fmt::format("'{}': unterminated IPv6 address", url);
      return std::nullopt;
    }
    parsed.host = std::string(authority.substr(1, close - 1));
    std::string_view after = authority.substr(close + 1);
    if (!after.empty() && after.front() == ':') port_text = after.substr(1);
  } else {
    size_t colon = authority.rfind(':');
    parsed.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) port_text = authority.substr(colon + 1);
  }
  if (parsed.host.empty()) {
    error = fmt::format("'{}': no host", url);
    return std::nullopt;
  }
  if (!port_text.empty()) {
    unsigned port = 0;
    auto [end, status] =
        std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (status != std::errc() || end != port_text.data() + port_text.size() || port == 0 ||
        port > 65535) {
      error = fmt::format("'{}': bad port '{}'", url, port_text);
      return std::nullopt;
    }
    parsed.port = static_cast<uint16_t>(port);
  }
  return parsed;
}

HttpResult HttpCall(std::string_view method, std::string_view url, std::string_view body,
                    std::chrono::milliseconds timeout, std::string_view content_type) {
  HttpCallOptions options;
  options.body = std::string(body);
  options.timeout = timeout;
  options.content_type = std::string(content_type);
  return HttpCall(method, url, options);
}

HttpResult HttpCall(std::string_view method, std::string_view url, const HttpCallOptions& options) {
  const std::string& body = options.body;
  const std::chrono::milliseconds timeout = options.timeout;
  HttpResult result;
  std::string error;
  const std::optional<HttpUrl> parsed = ParseHttpUrl(url, error);
  if (!parsed) {
    result.error = error;
    return result;
  }
  const std::string what = fmt::format("{} {}", method, url);
  const http::verb verb = http::string_to_verb(method);
  if (verb == http::verb::unknown) {
    result.error = fmt::format("{}: unknown HTTP method", what);
    return result;
  }

  asio::io_context ioc;
  tcp::resolver resolver(ioc);
  beast::tcp_stream stream(ioc);
  beast::flat_buffer buffer;
  http::request<http::string_body> request{verb, parsed->target, 11};
  request.set(http::field::host, fmt::format("{}:{}", parsed->host, parsed->port));
  request.set(http::field::user_agent, "gpufleet");
  if (!body.empty() || verb == http::verb::post || verb == http::verb::put) {
    request.set(http::field::content_type, options.content_type);
    request.body() = std::string(body);
  }
  for (const auto& [name, value] : options.headers)
    request.set(name, value);
  request.keep_alive(false);
  request.prepare_payload();
  http::response_parser<http::string_body> parser;
  parser.body_limit(kMaxResponseBodyBytes);

  // One deadline for the whole exchange; the stream's timer fails whatever is pending then.
  stream.expires_after(timeout);
  bool done = false;
  auto failed = [&](const char* step, const beast::error_code& step_error) {
    result.error = step_error == beast::error::timeout
                       ? fmt::format("{}: no answer within {} ms", what, timeout.count())
                       : fmt::format("{}: {}: {}", what, step, step_error.message());
    done = true;
  };
  resolver.async_resolve(
      parsed->host, std::to_string(parsed->port),
      [&](beast::error_code resolve_error, const tcp::resolver::results_type& endpoints) {
        if (resolve_error) return failed("resolve", resolve_error);
        stream.async_connect(endpoints, [&](beast::error_code connect_error, const tcp::endpoint&) {
          if (connect_error) return failed("connect", connect_error);
          http::async_write(stream, request, [&](beast::error_code write_error, size_t) {
            if (write_error) return failed("send", write_error);
            http::async_read(stream, buffer, parser, [&](beast::error_code read_error, size_t) {
              if (read_error) return failed("receive", read_error);
              const auto& response = parser.get();
              HttpClientResponse answer;
              answer.status = static_cast<int>(response.result_int());
              answer.content_type = std::string(response[http::field::content_type]);
              for (const auto& field : response)
                answer.headers.emplace_back(std::string(field.name_string()),
                                            std::string(field.value()));
              answer.body = parser.release().body();
              result.response = std::move(answer);
              done = true;
            });
          });
        });
      });
  // Name resolution is not covered by the stream's timer; this bounds it too.
  ioc.run_for(timeout + std::chrono::milliseconds(100));
  if (!done) result.error = fmt::format("{}: no answer within {} ms", what, timeout.count());
  return result;
}

HttpResult HttpGet(std::string_view url, std::chrono::milliseconds timeout) {
  return HttpCall("GET", url, {}, timeout);
}

HttpResult HttpPost(std::string_view url, std::string_view body,
                    std::chrono::milliseconds timeout) {
  return HttpCall("POST", url, body, timeout);
}

}  // namespace gpufleet::net
