#pragma once

// A small HTTP/1.1 server (Boost.Beast underneath, kept out of this header): keep-alive, a request
// body limit, "Expect: 100-continue", a graceful stop, and optionally HTTPS only (TLS 1.2+,
// OpenSSL). It holds up against slow and greedy clients: a request must arrive whole within
// request_timeout, and connections are capped in all and per client address, so a few hosts
// trickling bytes over thousands of sockets (slowloris) cannot lock others out. Handlers run on
// the server's io threads
// and must not block for long: a handler that waits for news (a long poll) is an async handler
// that keeps the responder and answers later from any thread.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "net/http.h"

namespace gpufleet::net {

// What the HTTP layer refused or cut off, and how many connections are open: kept apart from the
// server so that a /metrics handler built before the server starts can show it.
struct HttpServerCounters {
  std::atomic<int64_t> connections{0};                // open now
  std::atomic<uint64_t> refused_connection_limit{0};  // max_connections reached
  std::atomic<uint64_t> refused_client_limit{0};      // max_connections_per_client reached
  std::atomic<uint64_t> request_timeouts{0};          // a request not in whole in time
  std::atomic<uint64_t> body_too_large{0};            // 413
  std::atomic<uint64_t> header_too_large{0};          // 431
  std::atomic<uint64_t> malformed{0};                 // 400
};

// Prometheus text: {prefix}_http_connections and {prefix}_http_refused_total{reason=...}.
std::string HttpCountersMetricsText(const HttpServerCounters& counters, std::string_view prefix);

struct HttpServerOptions {
  std::string host = "127.0.0.1";  // loopback unless told otherwise
  uint16_t port = 0;               // 0: the kernel picks a free port; port() says which
  int io_threads = 1;
  size_t max_body_bytes = size_t{1} << 20;  // larger bodies are answered 413
  size_t max_header_bytes = size_t{16} << 10;
  // A connection that starts no request for this long is closed (keep-alive's idle time).
  std::chrono::milliseconds idle_timeout{std::chrono::seconds(60)};
  // From a request's first byte until its header and body are in; later, it is cut off.
  std::chrono::milliseconds request_timeout{std::chrono::seconds(30)};
  // Connections open at once, in all and from one client address; one more is answered 503 and
  // closed at once (over HTTPS closed without an answer: none could be read before the
  // handshake). max_connections 0: half the process's open-file limit, at most 10000;
  // max_connections_per_client 0: no per-client limit.
  size_t max_connections = 0;
  size_t max_connections_per_client = 256;
  // Shared with whoever shows them; unset: the server keeps its own.
  std::shared_ptr<HttpServerCounters> counters;
  // How long Stop() lets requests in progress finish before it closes their connections.
  std::chrono::milliseconds stop_timeout{std::chrono::seconds(5)};
  // Both set: the server speaks HTTPS only, with this certificate (PEM, the chain after the
  // server's own) and private key (PEM, unencrypted). A plain HTTP request gets a plain 400 that
  // says so. One without the other is an error.
  std::string tls_cert_file;
  std::string tls_key_file;
};

// Raises this process's soft open-file limit to its hard limit, as a server holding a connection
// per node needs (systemd's default soft limit is 1024); returns the limit in force.
size_t RaiseOpenFileLimit();

class HttpServer {
 public:
  struct StartResult {
    std::unique_ptr<HttpServer> server;  // set on success
    std::string error;                   // why not: bad address, port in use, ...
  };
  // Binds, listens and starts the io threads.
  static StartResult Start(const HttpServerOptions& options, HttpHandler handler);
  static StartResult Start(const HttpServerOptions& options, HttpAsyncHandler handler);

  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  uint16_t port() const;
  // "127.0.0.1:41234": the bound address, with the real port.
  std::string address() const;
  bool tls() const;  // HTTPS only
  const HttpServerCounters& counters() const;
  size_t max_connections() const;  // as resolved at start (0 in the options: from the file limit)

  // Stops accepting, closes idle connections, lets requests in progress be answered (within
  // stop_timeout), then joins the io threads. Idempotent.
  void Stop();

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpufleet::net
