#pragma once

// A small HTTP/1.1 client for the CLI, the agent and tests (synchronous), and for many calls at
// once (AsyncHttpClient): one request per connection, one deadline for the whole exchange (connect,
// TLS handshake, send, receive). https:// URLs verify the server's certificate (against
// HttpCallOptions::ca_file or the system's CAs) and that it names the URL's host (DNS name or IP
// address); the host name goes as SNI.

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "net/http.h"

namespace gpufleet::net {

struct HttpClientResponse {
  int status = 0;
  std::string content_type;
  std::string body;
  HttpHeaders headers;

  std::string Header(std::string_view name) const;  // case-insensitive; empty when absent
};

struct HttpResult {
  std::optional<HttpClientResponse> response;  // any status, 4xx and 5xx included
  std::string error;                           // no response: what went wrong

  bool ok() const { return response.has_value(); }
};

// "http://host:port/path?query" or "https://..." split up.
struct HttpUrl {
  bool tls = false;  // https
  std::string host;
  uint16_t port = 80;  // 443 for https when the URL gives none
  std::string target = "/";
};
std::optional<HttpUrl> ParseHttpUrl(std::string_view url, std::string& error);

inline constexpr std::chrono::milliseconds kDefaultHttpTimeout{std::chrono::seconds(10)};

struct HttpCallOptions {
  std::string body;
  std::chrono::milliseconds timeout = kDefaultHttpTimeout;
  std::string content_type = "application/json";
  HttpHeaders headers;  // extra request headers: Authorization, ...
  // https: a PEM file of the CA certificates to trust; empty: the system's (/etc/ssl/certs).
  std::string ca_file;
  // The connection's source IP; empty: the kernel's choice. The fleet simulator gives each
  // simulated node its own loopback address, as real nodes have their own.
  std::string local_address;
};

HttpResult HttpCall(std::string_view method, std::string_view url, const HttpCallOptions& options);
HttpResult HttpCall(std::string_view method, std::string_view url, std::string_view body = {},
                    std::chrono::milliseconds timeout = kDefaultHttpTimeout,
                    std::string_view content_type = "application/json");
// Many HTTP calls in flight at once on a few threads, for a process that holds thousands of long
// polls open (the fleet simulator, docs/scale.md). Each call is one request on its own
// connection with one deadline, exactly as HttpCall makes it.
class AsyncHttpClient {
 public:
  explicit AsyncHttpClient(int threads = 1);
  ~AsyncHttpClient();  // Stop()
  AsyncHttpClient(const AsyncHttpClient&) = delete;
  AsyncHttpClient& operator=(const AsyncHttpClient&) = delete;

  using Done = std::function<void(HttpResult)>;
  // `done` runs once on one of the client's threads, unless Stop() comes first.
  void Call(std::string_view method, std::string_view url, HttpCallOptions options, Done done);
  // Runs `work` on one of the client's threads after `delay`, unless Stop() comes first.
  void After(std::chrono::milliseconds delay, std::function<void()> work);
  // Drops what is in flight (no callback runs after it returns) and joins the threads.
  // Idempotent; not from one of the client's own threads.
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Calls over kept-alive plain-HTTP connections, reused per host and port, for a client that calls
// one service all the time (the etcd store: a connection per call cost it a TCP handshake and a
// TIME_WAIT socket each). Safe from several threads; each call holds a connection of its own
// while it runs. A call that fails on a reused connection (the server closed it while idle) is
// sent once more on a new one, as HttpCall would have sent it. https URLs go through HttpCall.
class KeepAliveHttpClient {
 public:
  KeepAliveHttpClient();
  ~KeepAliveHttpClient();
  KeepAliveHttpClient(const KeepAliveHttpClient&) = delete;
  KeepAliveHttpClient& operator=(const KeepAliveHttpClient&) = delete;

  HttpResult Call(std::string_view method, std::string_view url, const HttpCallOptions& options);
  uint64_t connections_opened() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

HttpResult HttpGet(std::string_view url, std::chrono::milliseconds timeout = kDefaultHttpTimeout);
HttpResult HttpPost(std::string_view url, std::string_view body,
                    std::chrono::milliseconds timeout = kDefaultHttpTimeout);

}  // namespace gpufleet::net
