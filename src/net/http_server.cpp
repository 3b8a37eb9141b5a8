#include "net/http_server.h"

#include <atomic>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>

namespace gpufleet::net {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

std::string FormatEndpoint(const tcp::endpoint& endpoint) {
  const asio::ip::address address = endpoint.address();
  return address.is_v6() ? fmt::format("[{}]:{}", address.to_string(), endpoint.port())
                         : fmt::format("{}:{}", address.to_string(), endpoint.port());
}

// After an error answer sent before the request was read whole (413, 400), the unread rest is
// drained for at most this long before closing: closing with unread data makes the kernel send
// a reset, and the client could lose the answer.
constexpr auto kLingerTime = std::chrono::seconds(1);

class Session;

}  // namespace

struct HttpServer::Impl {
  Impl(const HttpServerOptions& server_options, HttpAsyncHandler request_handler)
      : options(server_options),
        handler(std::move(request_handler)),
        ioc(std::max(1, server_options.io_threads)),
        acceptor(asio::make_strand(ioc)),
        accept_retry(acceptor.get_executor()) {}

  void Accept();
  void Register(uint64_t id, const std::shared_ptr<Session>& session);
  void Forget(uint64_t id);

  const HttpServerOptions options;
  const HttpAsyncHandler handler;
  std::atomic<bool> stopping{false};

  std::mutex mutex;
  std::condition_variable sessions_gone;
  std::map<uint64_t, std::weak_ptr<Session>> sessions;
  uint64_t next_session_id = 0;
  bool stop_called = false;

  // Declared after the members sessions touch when they are destroyed with the io_context.
  asio::io_context ioc;
  tcp::acceptor acceptor;
  asio::steady_timer accept_retry;
  tcp::endpoint endpoint;
  std::vector<std::thread> threads;
};

namespace {

// One connection. All its handlers run on its own strand, so it needs no lock; the server reaches
// it only through asio::post.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, HttpServer::Impl& server, uint64_t id)
      : stream_(std::move(socket)), server_(server), id_(id) {}
  ~Session() { server_.Forget(id_); }

  void Start() {
    asio::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->ReadHeader(); });
  }

  // From Stop(): an idle connection is closed now; one with a request in progress after its
  // answer (ReadHeader sees `stopping`).
  void Shutdown() {
    asio::post(stream_.get_executor(), [self = shared_from_this()] {
      if (self->idle_) self->stream_.cancel();
    });
  }

 private:
  void ReadHeader() {
    if (server_.stopping) return Close();
    parser_.emplace();
    parser_->body_limit(server_.options.max_body_bytes);
    parser_->header_limit(static_cast<uint32_t>(server_.options.max_header_bytes));
    stream_.expires_after(server_.options.idle_timeout);
    idle_ = buffer_.size() == 0;  // bytes already buffered: a pipelined request is in progress
    http::async_read_header(stream_, buffer_, *parser_,
                            beast::bind_front_handler(&Session::OnHeader, shared_from_this()));
  }

  void OnHeader(beast::error_code error, size_t) {
    idle_ = false;
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
    stream_.expires_after(server_.options.idle_timeout);
    http::async_read(stream_, buffer_, *parser_,
                     beast::bind_front_handler(&Session::OnBody, shared_from_this()));
  }

  void OnBody(beast::error_code error, size_t) {
    if (error) return OnReadError(error);
    Dispatch();
  }

  void OnReadError(beast::error_code error) {
    if (error == http::error::body_limit)
      return SendError(
          413, fmt::format("request body larger than {} bytes", server_.options.max_body_bytes));
    if (error == http::error::header_limit)
      return SendError(431, fmt::format("request header larger than {} bytes",
                                        server_.options.max_header_bytes));
    // The peer left, the idle timeout expired, or the server is stopping: nobody to answer.
    if (error == http::error::end_of_stream || error == http::error::partial_message ||
        error.category() != http::make_error_code(http::error::bad_target).category())
      return Close();
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
    stream_.expires_after(server_.options.idle_timeout);
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
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.expires_after(kLingerTime);
    Drain();
  }

  void Drain() {
    stream_.async_read_some(asio::buffer(drain_buffer_),
                            [self = shared_from_this()](beast::error_code error, size_t) {
                              if (error) return self->Close();
                              self->Drain();
                            });
  }

  void Close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

  beast::tcp_stream stream_;
  HttpServer::Impl& server_;
  const uint64_t id_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::optional<http::response<http::empty_body>> continue_;
  http::response<http::string_body> response_;
  bool idle_ = false;  // waiting for the first byte of a request
  bool linger_ = false;
  char drain_buffer_[4096];
};

}  // namespace

void HttpServer::Impl::Accept() {
  acceptor.async_accept(asio::make_strand(ioc),
                        [this](beast::error_code error, tcp::socket socket) {
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
                          uint64_t id;
                          {
                            std::lock_guard lock(mutex);
                            id = next_session_id++;
                          }
                          auto session = std::make_shared<Session>(std::move(socket), *this, id);
                          Register(id, session);
                          session->Start();
                          Accept();
                        });
}

void HttpServer::Impl::Register(uint64_t id, const std::shared_ptr<Session>& session) {
  std::lock_guard lock(mutex);
  sessions.emplace(id, session);
}

void HttpServer::Impl::Forget(uint64_t id) {
  std::lock_guard lock(mutex);
  sessions.erase(id);
  if (sessions.empty()) sessions_gone.notify_all();
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
  beast::error_code error;
  const asio::ip::address address = asio::ip::make_address(options.host, error);
  if (error) {
    result.error = fmt::format(
        "invalid listen address '{}': expected an IP address such as 127.0.0.1", options.host);
    return result;
  }
  const tcp::endpoint wanted(address, options.port);
  const std::string where = FormatEndpoint(wanted);
  auto fail = [&](const char* step) {
    result.error = fmt::format("{} {}: {}", step, where, error.message());
    return std::move(result);
  };
  if (impl->acceptor.open(wanted.protocol(), error); error) return fail("open a socket for");
  if (impl->acceptor.set_option(asio::socket_base::reuse_address(true), error); error)
    return fail("set SO_REUSEADDR on");
  if (impl->acceptor.bind(wanted, error); error) return fail("listen on");
  if (impl->acceptor.listen(asio::socket_base::max_listen_connections, error); error)
    return fail("listen on");
  impl->endpoint = impl->acceptor.local_endpoint(error);
  if (error) return fail("read the bound address of");

  impl->Accept();
  const int thread_count = std::max(1, options.io_threads);
  try {
    for (int i = 0; i < thread_count; ++i)
      impl->threads.emplace_back([raw = impl.get()] { raw->ioc.run(); });
  } catch (const std::system_error& thread_error) {
    impl->ioc.stop();
    for (std::thread& thread : impl->threads)
      thread.join();
    result.error = fmt::format("start the HTTP server's threads: {}", thread_error.what());
    return result;
  }
  result.server.reset(new HttpServer(std::move(impl)));
  return result;
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() {
  Stop();
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
  std::vector<std::shared_ptr<Session>> live;
  {
    std::lock_guard lock(server.mutex);
    for (const auto& [id, weak] : server.sessions)
      if (auto session = weak.lock()) live.push_back(std::move(session));
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
