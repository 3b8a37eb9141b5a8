#include "net/http_server.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <vector>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/core/detect_ssl.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <fmt/format.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/resource.h>

#include "net/asio_serve.h"

namespace gpufleet::net {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;

std::string FormatEndpoint(const tcp::endpoint& endpoint) {
  const asio::ip::address address = endpoint.address();
  return address.is_v6() ? fmt::format("[{}]:{}", address.to_string(), endpoint.port())
                         : fmt::format("{}:{}", address.to_string(), endpoint.port());
}

// What the first read of an idle connection asks for: a whole small request, usually.
constexpr size_t kFirstReadBytes = 4096;

// After an error answer sent before the request was read whole (413, 400), the unread rest is
// drained for at most this long before closing: closing with unread data makes the kernel send
// a reset, and the client could lose the answer.
constexpr auto kLingerTime = std::chrono::seconds(1);

// OpenSSL's reason for the last failure ("no start line", "key values mismatch"), or `fallback`.
std::string OpenSslReason(const beast::error_code& code) {
  const unsigned long last = ::ERR_peek_last_error();
  ::ERR_clear_error();
  if (last != 0) {
    char text[256];
    ::ERR_error_string_n(last, text, sizeof text);
    return text;
  }
  return code.message();
}

// TLS 1.2 or later with the certificate chain and key from PEM files; nothing (and why) when they
// cannot be read or do not belong together.
std::optional<ssl::context> ServerTlsContext(const std::string& cert_file,
                                             const std::string& key_file, std::string& error) {
  ssl::context context(ssl::context::tls_server);
  ::SSL_CTX_set_min_proto_version(context.native_handle(), TLS1_2_VERSION);
  context.set_options(ssl::context::default_workarounds | ssl::context::single_dh_use);
  beast::error_code code;
  context.use_certificate_chain_file(cert_file, code);
  if (code) {
    error = fmt::format("TLS certificate '{}': {}", cert_file, OpenSslReason(code));
    return std::nullopt;
  }
  context.use_private_key_file(key_file, ssl::context::pem, code);
  if (code) {
    const std::string reason = OpenSslReason(code);
    error = reason.find("key values mismatch") != std::string::npos
                ? fmt::format("TLS private key '{}' does not belong to the certificate '{}'",
                              key_file, cert_file)
                : fmt::format("TLS private key '{}': {}", key_file, reason);
    return std::nullopt;
  }
  if (::SSL_CTX_check_private_key(context.native_handle()) != 1) {
    error = fmt::format("TLS private key '{}' does not belong to the certificate '{}'", key_file,
                        cert_file);
    ::ERR_clear_error();
    return std::nullopt;
  }
  return context;
}

// What the server keeps of a connection, whatever its stream (plain or TLS).
class SessionBase {
 public:
  virtual ~SessionBase() = default;
  virtual void Shutdown() = 0;
};

}  // namespace

struct HttpServer::Impl {
  Impl(const HttpServerOptions& server_options, HttpAsyncHandler request_handler)
      : options(server_options),
        handler(std::move(request_handler)),
        ioc(std::max(1, server_options.io_threads)),
        acceptor(asio::make_strand(ioc)),
        accept_retry(acceptor.get_executor()) {}

  void Accept();
  // Takes a place for a new connection from `client`; nothing (and the refusal) when the server
  // or the client is at its limit.
  std::optional<uint64_t> Admit(const std::string& client, std::string& refusal);
  void Register(uint64_t id, const std::shared_ptr<SessionBase>& session);
  void Forget(uint64_t id);

  const HttpServerOptions options;
  const HttpAsyncHandler handler;
  std::atomic<bool> stopping{false};
  std::shared_ptr<HttpServerCounters> counters;
  size_t max_connections = 0;  // resolved at start

  struct Tracked {
    std::weak_ptr<SessionBase> session;
    std::string client;  // remote address, without the port
  };
  std::mutex mutex;
  std::condition_variable sessions_gone;
  std::map<uint64_t, Tracked> sessions;
  std::map<std::string, size_t> connections_by_client;
  uint64_t next_session_id = 0;
  bool stop_called = false;

  // Set when the server speaks HTTPS: the certificate and key, shared by every session.
  std::optional<ssl::context> tls;

  // Declared after the members sessions touch when they are destroyed with the io_context.
  asio::io_context ioc;
  tcp::acceptor acceptor;
  asio::steady_timer accept_retry;
  tcp::endpoint endpoint;
  std::vector<std::thread> threads;
};

namespace {

// One connection over a plain TCP stream or a TLS one (the only difference: a TLS connection
// starts with a handshake). All its handlers run on its own strand, so it needs no lock; the
// server reaches it only through asio::post.
template <typename Stream>
class Session : public SessionBase, public std::enable_shared_from_this<Session<Stream>> {
  static constexpr bool kTls = std::is_same_v<Stream, TlsStream>;
  using std::enable_shared_from_this<Session<Stream>>::shared_from_this;

 public:
  Session(tcp::socket socket, HttpServer::Impl& server, uint64_t id) requires(!kTls)
      : stream_(std::move(socket)), server_(server), id_(id) {}
  Session(tcp::socket socket, HttpServer::Impl& server, uint64_t id) requires(kTls)
      : stream_(std::move(socket), *server.tls), server_(server), id_(id) {}
  ~Session() override { server_.Forget(id_); }

  void Start() {
    asio::dispatch(stream_.get_executor(), [self = shared_from_this()] {
      if constexpr (kTls)
        self->DetectTls();
      else
        self->ReadHeader();
    });
  }

  // From Stop(): an idle connection is closed now; one with a request in progress after its
  // answer (ReadHeader sees `stopping`).
  void Shutdown() override {
    asio::post(stream_.get_executor(), [self = shared_from_this()] {
      if (self->idle_) self->Tcp().cancel();
    });
  }

 private:
  beast::tcp_stream& Tcp() { return beast::get_lowest_layer(stream_); }

  // A TLS connection must start with a ClientHello. Anything else is most likely plain HTTP sent
  // to the HTTPS port: answered in plain text, so the client sees why instead of a reset.
  void DetectTls() {
    idle_ = true;
    Tcp().expires_after(server_.options.idle_timeout);
    beast::async_detect_ssl(Tcp(), buffer_,
                            beast::bind_front_handler(&Session::OnDetected, shared_from_this()));
  }

  void OnDetected(beast::error_code error, bool tls) {
    if (error) return Close();
    if (!tls) {
      idle_ = false;
      plain_ = true;
      return SendError(400,
                       "this server speaks HTTPS only: the request came as plain HTTP (use an "
                       "https:// URL)");
    }
    if constexpr (kTls) {
      // The bytes read while detecting are the start of the handshake, which is under the
      // request's clock: a client that stalls it is cut off like one that stalls a request.
      idle_ = false;
      Tcp().expires_after(server_.options.request_timeout);
      stream_.async_handshake(ssl::stream_base::server, buffer_.data(),
                              beast::bind_front_handler(&Session::OnHandshake, shared_from_this()));
    }
  }

  void OnHandshake(beast::error_code error, size_t used) {
    // A client that refuses our certificate, or speaks no TLS we accept: nothing to answer.
    if (error) return Close();
    buffer_.consume(used);
    ReadHeader();
  }

  void ReadHeader() {
    if (server_.stopping) return Close();
    // Bytes already buffered: a pipelined request is in progress.
    if (buffer_.size() > 0) return ReadRequest();
    // Idle (keep-alive) until a request's first byte; from then on its own, shorter, clock.
    idle_ = true;
    Tcp().expires_after(server_.options.idle_timeout);
    stream_.async_read_some(buffer_.prepare(kFirstReadBytes),
                            [self = shared_from_this()](beast::error_code error, size_t read) {
                              self->idle_ = false;
                              if (error) return self->Close();
                              self->buffer_.commit(read);
                              self->ReadRequest();
                            });
  }

  // One deadline for the whole request, header and body: a client that trickles bytes to keep a
  // connection (slowloris) loses it after request_timeout however it paces them.
  void ReadRequest() {
    parser_.emplace();
    parser_->body_limit(server_.options.max_body_bytes);
    parser_->header_limit(static_cast<uint32_t>(server_.options.max_header_bytes));
    Tcp().expires_after(server_.options.request_timeout);
    http::async_read_header(stream_, buffer_, *parser_,
                            beast::bind_front_handler(&Session::OnHeader, shared_from_this()));
  }

  void OnHeader(beast::error_code error, size_t) {
    if (error) return OnReadError(error);
    // curl and others wait for this before sending a body (up to a second, then they send anyway).
    if (beast::iequals(parser_->get()[http::field::expect], "100-continue")) {
      continue_.emplace(http::status::continue_, parser_->get().version());
      http::async_write(stream_, *continue_,
                        beast::bind_front_handler(&Session::OnContinueSent, shared_from_this()));
      return;
    }
    ReadBody();
  }

  void OnContinueSent(beast::error_code error, size_t) {
    if (error) return Close();
    ReadBody();
  }

  void ReadBody() {
    if (parser_->is_done()) return Dispatch();
    // Still under ReadRequest's deadline.
    http::async_read(stream_, buffer_, *parser_,
                     beast::bind_front_handler(&Session::OnBody, shared_from_this()));
  }

  void OnBody(beast::error_code error, size_t) {
    if (error) return OnReadError(error);
    Dispatch();
  }

  void OnReadError(beast::error_code error) {
    HttpServerCounters& counters = *server_.counters;
    if (error == http::error::body_limit) {
      ++counters.body_too_large;
      return SendError(
          413, fmt::format("request body larger than {} bytes", server_.options.max_body_bytes));
    }
    if (error == http::error::header_limit) {
      ++counters.header_too_large;
      return SendError(431, fmt::format("request header larger than {} bytes",
                                        server_.options.max_header_bytes));
    }
    // The stream closed the socket when its deadline passed: there is no one left to answer.
    if (error == beast::error::timeout) {
      ++counters.request_timeouts;
      return Close();
    }
    // The peer left, or the server is stopping: nobody to answer.
    if (error == http::error::end_of_stream || error == http::error::partial_message ||
        error.category() != http::make_error_code(http::error::bad_target).category())
      return Close();
    ++counters.malformed;
    SendError(400, "malformed HTTP request: " + error.message());
  }

  void SendError(int status, std::string message) {
    HttpResponse response = HttpResponse::Error(status, message);
    Send(std::move(response), false, 11, true);
  }

  void Dispatch() {
    http::request<http::string_body> raw = parser_->release();
    HttpRequest request;
    request.method = std::string(raw.method_string());
    request.target = std::string(raw.target());
    for (const auto& field : raw)
      request.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
    request.body = std::move(raw.body());
    const bool keep_alive = raw.keep_alive();
    const unsigned version = raw.version();
    if (!SplitTarget(request.target, request.path, request.query)) {
      return Send(HttpResponse::Error(400, "malformed percent-encoding in the request target"),
                  keep_alive && !server_.stopping, version, false);
    }
    // The answer may come from another thread, later: it is posted back onto this session's
    // strand. A responder dropped unanswered (or a handler that throws) answers 500.
    auto answer = std::make_shared<PendingAnswer>(shared_from_this(), keep_alive, version);
    HttpResponder respond = [answer](HttpResponse response) { answer->Give(std::move(response)); };
    try {
      server_.handler(std::move(request), std::move(respond));
    } catch (const std::exception& error) {
      answer->Give(HttpResponse::Error(500, std::string("internal error: ") + error.what()));
    } catch (...) {
      answer->Give(HttpResponse::Error(500, "internal error"));
    }
  }

  // Holds the session until its answer is given (once; later calls are ignored).
  class PendingAnswer {
   public:
    PendingAnswer(std::shared_ptr<Session> session, bool keep_alive, unsigned version)
        : session_(std::move(session)), keep_alive_(keep_alive), version_(version) {}
    ~PendingAnswer() {
      if (!given_.exchange(true))
        Post(HttpResponse::Error(500, "internal error: the request was dropped unanswered"));
    }
    void Give(HttpResponse response) {
      if (!given_.exchange(true)) Post(std::move(response));
    }

   private:
    void Post(HttpResponse response) {
      asio::post(session_->stream_.get_executor(),
                 [session = session_, keep_alive = keep_alive_, version = version_,
                  response = std::move(response)]() mutable {
                   session->Send(std::move(response), keep_alive && !session->server_.stopping,
                                 version, false);
                 });
    }
    std::shared_ptr<Session> session_;
    const bool keep_alive_;
    const unsigned version_;
    std::atomic<bool> given_{false};
  };

  void Send(HttpResponse response, bool keep_alive, unsigned version, bool linger) {
    response_ = {};
    response_.version(version);
    response_.result(static_cast<unsigned>(response.status));
    if (response_.result() == http::status::unknown) {
      std::string_view reason = StatusReason(response.status);
      response_.reason(reason.empty() ? "Unknown" : reason);
    }
    response_.set(http::field::server, "gpufleet");
    response_.set(http::field::content_type, response.content_type);
    for (const auto& [name, value] : response.headers)
      response_.set(name, value);
    response_.body() = std::move(response.body);
    response_.keep_alive(keep_alive);
    response_.prepare_payload();
    linger_ = linger;
    Tcp().expires_after(server_.options.idle_timeout);
    if (plain_) {
      // The refusal of plain HTTP on the HTTPS port goes out unencrypted, as it came.
      http::async_write(Tcp(), response_,
                        beast::bind_front_handler(&Session::OnWritten, shared_from_this()));
      return;
    }
    http::async_write(stream_, response_,
                      beast::bind_front_handler(&Session::OnWritten, shared_from_this()));
  }

  void OnWritten(beast::error_code error, size_t) {
    if (error) return Close();
    if (linger_) return Linger();
    if (response_.need_eof()) return Close();
    ReadHeader();
  }

  void Linger() {
    beast::error_code ignored;
    Tcp().socket().shutdown(tcp::socket::shutdown_send, ignored);
    Tcp().expires_after(kLingerTime);
    Drain();
  }

  // Reads and discards what the client still sends; raw bytes, TLS or not, as none is used.
  void Drain() {
    Tcp().async_read_some(asio::buffer(drain_buffer_),
                          [self = shared_from_this()](beast::error_code error, size_t) {
                            if (error) return self->Close();
                            self->Drain();
                          });
  }

  // Without a TLS close_notify: every answer carries its length, so no client reads to the end
  // of the stream to find where it stops.
  void Close() {
    beast::error_code ignored;
    Tcp().socket().shutdown(tcp::socket::shutdown_both, ignored);
    Tcp().socket().close(ignored);
  }

  Stream stream_;
  HttpServer::Impl& server_;
  const uint64_t id_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::optional<http::response<http::empty_body>> continue_;
  http::response<http::string_body> response_;
  bool idle_ = false;  // waiting for the first byte of a request
  bool linger_ = false;
  bool plain_ = false;  // plain HTTP on the HTTPS port: answered unencrypted
  char drain_buffer_[4096];
};

void Refuse(tcp::socket socket, const std::string& refusal, bool tls) {
  const HttpResponse answer = HttpResponse::Error(503, refusal);
  RefuseConnection(std::move(socket), answer.content_type, answer.body, !tls);
}

}  // namespace

void HttpServer::Impl::Accept() {
  acceptor.async_accept(
      asio::make_strand(ioc), [this](beast::error_code error, tcp::socket socket) {
        if (stopping || !acceptor.is_open()) return;
        if (error) {
          // Out of file descriptors and the like: try again shortly rather than
          // spin.
          accept_retry.expires_after(std::chrono::milliseconds(100));
          accept_retry.async_wait([this](beast::error_code wait_error) {
            if (!wait_error && !stopping) Accept();
          });
          return;
        }
        beast::error_code no_peer;
        const tcp::endpoint peer = socket.remote_endpoint(no_peer);
        if (no_peer) {  // gone already
          Accept();
          return;
        }
        std::string refusal;
        const std::optional<uint64_t> admitted = Admit(peer.address().to_string(), refusal);
        if (!admitted) {
          Refuse(std::move(socket), refusal, tls.has_value());
          Accept();
          return;
        }
        const uint64_t id = *admitted;
        if (tls) {
          auto session = std::make_shared<Session<TlsStream>>(std::move(socket), *this, id);
          Register(id, session);
          session->Start();
        } else {
          auto session = std::make_shared<Session<beast::tcp_stream>>(std::move(socket), *this, id);
          Register(id, session);
          session->Start();
        }
        Accept();
      });
}

std::optional<uint64_t> HttpServer::Impl::Admit(const std::string& client, std::string& refusal) {
  std::lock_guard lock(mutex);
  if (sessions.size() >= max_connections) {
    ++counters->refused_connection_limit;
    refusal = fmt::format("server busy: {} connections open, the most it takes", sessions.size());
    return std::nullopt;
  }
  size_t& from_client = connections_by_client[client];
  if (options.max_connections_per_client > 0 && from_client >= options.max_connections_per_client) {
    ++counters->refused_client_limit;
    refusal = fmt::format("too many connections from {}: {} open, the most one client may have",
                          client, from_client);
    return std::nullopt;
  }
  ++from_client;
  const uint64_t id = next_session_id++;
  sessions.emplace(id, Tracked{{}, client});
  ++counters->connections;
  return id;
}

void HttpServer::Impl::Register(uint64_t id, const std::shared_ptr<SessionBase>& session) {
  std::lock_guard lock(mutex);
  sessions[id].session = session;
}

void HttpServer::Impl::Forget(uint64_t id) {
  std::lock_guard lock(mutex);
  auto tracked = sessions.find(id);
  if (tracked == sessions.end()) return;
  auto from_client = connections_by_client.find(tracked->second.client);
  if (from_client != connections_by_client.end() && --from_client->second == 0)
    connections_by_client.erase(from_client);
  sessions.erase(tracked);
  --counters->connections;
  if (sessions.empty()) sessions_gone.notify_all();
}

std::string HttpCountersMetricsText(const HttpServerCounters& counters, std::string_view prefix) {
  std::string text = fmt::format(
      "# HELP {0}_http_connections Connections open to the HTTP API now.\n"
      "# TYPE {0}_http_connections gauge\n"
      "{0}_http_connections {1}\n"
      "# HELP {0}_http_refused_total Connections and requests the HTTP layer refused or cut "
      "off, by reason.\n"
      "# TYPE {0}_http_refused_total counter\n",
      prefix, counters.connections.load());
  const std::pair<const char*, uint64_t> reasons[] = {
      {"connection_limit", counters.refused_connection_limit.load()},
      {"client_connection_limit", counters.refused_client_limit.load()},
      {"request_timeout", counters.request_timeouts.load()},
      {"body_too_large", counters.body_too_large.load()},
      {"header_too_large", counters.header_too_large.load()},
      {"malformed", counters.malformed.load()},
  };
  for (const auto& [reason, count] : reasons)
    text += fmt::format("{}_http_refused_total{{reason=\"{}\"}} {}\n", prefix, reason, count);
  return text;
}

size_t RaiseOpenFileLimit() {
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) != 0) return 0;
  if (files.rlim_cur < files.rlim_max) {
    rlimit raised = files;
    raised.rlim_cur = raised.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) files = raised;
  }
  return files.rlim_cur == RLIM_INFINITY ? SIZE_MAX : static_cast<size_t>(files.rlim_cur);
}

HttpServer::StartResult HttpServer::Start(const HttpServerOptions& options, HttpHandler handler) {
  if (!handler) return Start(options, HttpAsyncHandler{});
  return Start(options, [handler = std::move(handler)](HttpRequest request, HttpResponder respond) {
    respond(handler(request));
  });
}

HttpServer::StartResult HttpServer::Start(const HttpServerOptions& options,
                                          HttpAsyncHandler handler) {
  StartResult result;
  if (!handler) {
    result.error = "no request handler";
    return result;
  }
  auto impl = std::make_unique<Impl>(options, std::move(handler));
  impl->counters = options.counters ? options.counters : std::make_shared<HttpServerCounters>();
  impl->max_connections = options.max_connections;
  if (impl->max_connections == 0) impl->max_connections = DefaultMaxConnections();
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    result.error = "HTTPS needs both a certificate and a private key (tls_cert_file, tls_key_file)";
    return result;
  }
  if (!options.tls_cert_file.empty()) {
    auto context = ServerTlsContext(options.tls_cert_file, options.tls_key_file, result.error);
    if (!context) return result;
    impl->tls.emplace(std::move(*context));
  }
  auto bound = Listen(impl->acceptor, options.host, options.port, result.error);
  if (!bound) return result;
  impl->endpoint = *bound;
  impl->Accept();
  if (auto error = RunIoThreads(impl->ioc, options.io_threads, impl->threads, "the HTTP server")) {
    result.error = std::move(*error);
    return result;
  }
  result.server.reset(new HttpServer(std::move(impl)));
  return result;
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() {
  Stop();
}

bool HttpServer::tls() const {
  return impl_->tls.has_value();
}

const HttpServerCounters& HttpServer::counters() const {
  return *impl_->counters;
}

size_t HttpServer::max_connections() const {
  return impl_->max_connections;
}

uint16_t HttpServer::port() const {
  return impl_->endpoint.port();
}

std::string HttpServer::address() const {
  return FormatEndpoint(impl_->endpoint);
}

void HttpServer::Stop() {
  Impl& server = *impl_;
  {
    std::lock_guard lock(server.mutex);
    if (server.stop_called) return;
    server.stop_called = true;
  }
  server.stopping = true;
  asio::post(server.acceptor.get_executor(), [&server] {
    beast::error_code ignored;
    server.acceptor.close(ignored);
    server.accept_retry.cancel();
  });
  std::vector<std::shared_ptr<SessionBase>> live;
  {
    std::lock_guard lock(server.mutex);
    for (const auto& [id, tracked] : server.sessions)
      if (auto session = tracked.session.lock()) live.push_back(std::move(session));
  }
  for (const auto& session : live)
    session->Shutdown();
  live.clear();  // a session that ends now must be able to go
  {
    std::unique_lock lock(server.mutex);
    server.sessions_gone.wait_for(lock, server.options.stop_timeout,
                                  [&] { return server.sessions.empty(); });
  }
  // What is left (a request past stop_timeout) is abandoned; its handler, if running, finishes.
  server.ioc.stop();
  for (std::thread& thread : server.threads)
    thread.join();
  server.threads.clear();
  // The posted close may not have run (a handler held the only io thread past stop_timeout):
  // with the threads gone it is safe to close here, so the port is free when Stop returns.
  beast::error_code ignored;
  server.acceptor.close(ignored);
}

}  // namespace gpufleet::net
