#pragma once

// A small HTTP/1.1 server (Boost.Beast underneath, kept out of this header): keep-alive, a request
// body limit, "Expect: 100-continue", a graceful stop, and optionally HTTPS only (TLS 1.2+,
// OpenSSL). Handlers run on the server's io threads
// and must not block for long: a handler that waits for news (a long poll) is an async handler
// that keeps the responder and answers later from any thread.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "net/http.h"

namespace gpufleet::net {

struct HttpServerOptions {
  std::string host = "127.0.0.1";  // loopback unless told otherwise
  uint16_t port = 0;               // 0: the kernel picks a free port; port() says which
  int io_threads = 1;
  size_t max_body_bytes = size_t{1} << 20;  // larger bodies are answered 413
  size_t max_header_bytes = size_t{16} << 10;
  // A connection that sends no (complete) request for this long is closed.
  std::chrono::milliseconds idle_timeout{std::chrono::seconds(60)};
  // How long Stop() lets requests in progress finish before it closes their connections.
  std::chrono::milliseconds stop_timeout{std::chrono::seconds(5)};
  // Both set: the server speaks HTTPS only, with this certificate (PEM, the chain after the
  // server's own) and private key (PEM, unencrypted). A plain HTTP request gets a plain 400 that
  // says so. One without the other is an error.
  std::string tls_cert_file;
  std::string tls_key_file;
};

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

  // Stops accepting, closes idle connections, lets requests in progress be answered (within
  // stop_timeout), then joins the io threads. Idempotent.
  void Stop();

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpufleet::net
