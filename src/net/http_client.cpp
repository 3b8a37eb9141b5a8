#include "net/http_client.h"

#include <algorithm>
#include <cctype>
#include <charconv>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <fmt/format.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>

namespace gpufleet::net {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;

// Large enough for any log tail or listing the agent returns.
constexpr uint64_t kMaxResponseBodyBytes = uint64_t{256} << 20;

// TLS 1.2 or later, trusting `ca_file` (or the system's CAs), verifying the peer. One per call:
// cheap next to a handshake, and a CA file replaced on disk is read again.
std::optional<ssl::context> ClientTlsContext(const std::string& ca_file, std::string& error) {
  ssl::context context(ssl::context::tls_client);
  ::SSL_CTX_set_min_proto_version(context.native_handle(), TLS1_2_VERSION);
  context.set_verify_mode(ssl::verify_peer);
  beast::error_code code;
  if (ca_file.empty()) {
    context.set_default_verify_paths(code);
    if (code) error = fmt::format("load the system's CA certificates: {}", code.message());
  } else {
    context.load_verify_file(ca_file, code);
    if (code) error = fmt::format("read the CA file '{}': {}", ca_file, code.message());
  }
  if (code) return std::nullopt;
  return context;
}

// Makes the handshake check that the certificate names `host` (an IP address or a DNS name, the
// latter also sent as SNI). OpenSSL's own check, so a mismatch is reported as such.
void ExpectPeer(SSL* native, const std::string& host) {
  X509_VERIFY_PARAM* param = ::SSL_get0_param(native);
  beast::error_code not_ip;
  asio::ip::make_address(host, not_ip);
  if (!not_ip) {
    ::X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str());
    return;
  }
  ::X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
  ::X509_VERIFY_PARAM_set1_host(param, host.c_str(), 0);
  // SSL_set_tlsext_host_name, without its macro's old-style cast.
  ::SSL_ctrl(native, SSL_CTRL_SET_TLSEXT_HOSTNAME, TLSEXT_NAMETYPE_host_name,
             const_cast<char*>(host.c_str()));
}

}  // namespace

std::string HttpClientResponse::Header(std::string_view name) const {
  for (const auto& [key, value] : headers)
    if (beast::iequals(key, name)) return value;
  return "";
}

std::optional<HttpUrl> ParseHttpUrl(std::string_view url, std::string& error) {
  constexpr std::string_view kHttp = "http://";
  constexpr std::string_view kHttps = "https://";
  HttpUrl parsed;
  std::string_view rest;
  if (url.substr(0, kHttp.size()) == kHttp) {
    rest = url.substr(kHttp.size());
  } else if (url.substr(0, kHttps.size()) == kHttps) {
    rest = url.substr(kHttps.size());
    parsed.tls = true;
    parsed.port = 443;
  } else {
    error = fmt::format("'{}' is not an http:// or https:// URL", url);
    return std::nullopt;
  }
  size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
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

  std::optional<ssl::context> tls_context;
  if (parsed->tls) {
    tls_context = ClientTlsContext(options.ca_file, error);
    if (!tls_context) {
      result.error = fmt::format("{}: {}", what, error);
      return result;
    }
  }

  asio::io_context ioc;
  tcp::resolver resolver(ioc);
  beast::tcp_stream plain(ioc);
  std::optional<beast::ssl_stream<beast::tcp_stream>> secure;
  if (tls_context) {
    secure.emplace(ioc, *tls_context);
    ExpectPeer(secure->native_handle(), parsed->host);
  }
  beast::tcp_stream& tcp_layer = secure ? beast::get_lowest_layer(*secure) : plain;
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
  tcp_layer.expires_after(timeout);
  bool done = false;
  auto failed = [&](const char* step, const beast::error_code& step_error) {
    result.error = step_error == beast::error::timeout
                       ? fmt::format("{}: no answer within {} ms", what, timeout.count())
                       : fmt::format("{}: {}: {}", what, step, step_error.message());
    done = true;
  };
  // Send and receive over the plain or the TLS stream.
  auto exchange = [&](auto& stream) {
    http::async_write(stream, request, [&](beast::error_code write_error, size_t) {
      if (write_error) return failed("send", write_error);
      http::async_read(stream, buffer, parser, [&](beast::error_code read_error, size_t) {
        if (read_error) return failed("receive", read_error);
        const auto& response = parser.get();
        HttpClientResponse answer;
        answer.status = static_cast<int>(response.result_int());
        answer.content_type = std::string(response[http::field::content_type]);
        for (const auto& field : response)
          answer.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
        answer.body = parser.release().body();
        result.response = std::move(answer);
        done = true;
      });
    });
  };
  resolver.async_resolve(
      parsed->host, std::to_string(parsed->port),
      [&](beast::error_code resolve_error, const tcp::resolver::results_type& endpoints) {
        if (resolve_error) return failed("resolve", resolve_error);
        tcp_layer.async_connect(
            endpoints, [&](beast::error_code connect_error, const tcp::endpoint&) {
              if (connect_error) return failed("connect", connect_error);
              if (!secure) return exchange(plain);
              secure->async_handshake(ssl::stream_base::client, [&](beast::error_code tls_error) {
                if (!tls_error) return exchange(*secure);
                failed("TLS handshake", tls_error);
                // Say why the certificate was refused (unknown CA, wrong host), not only that it
                // was.
                const long verify = ::SSL_get_verify_result(secure->native_handle());
                if (tls_error != beast::error::timeout && verify != X509_V_OK)
                  result.error += fmt::format(" ({})", ::X509_verify_cert_error_string(verify));
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
