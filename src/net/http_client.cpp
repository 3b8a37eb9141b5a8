#include "net/http_client.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <boost/asio/connect.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
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

namespace {

// "GET http://...: connect: Connection refused", or "...: no answer within N ms" when the deadline
// cut the step off: how HttpCall and KeepAliveHttpClient say a step failed.
std::string StepFailure(const std::string& what, const char* step, const beast::error_code& code,
                        std::chrono::milliseconds timeout) {
  return code == beast::error::timeout || code == asio::error::operation_aborted
             ? fmt::format("{}: no answer within {} ms", what, timeout.count())
             : fmt::format("{}: {}: {}", what, step, code.message());
}

// The request HttpCall and KeepAliveHttpClient send.
http::request<http::string_body> BuildRequest(http::verb verb, const HttpUrl& url,
                                              HttpCallOptions& options, bool keep_alive) {
  http::request<http::string_body> request{verb, url.target, 11};
  request.set(http::field::host, fmt::format("{}:{}", url.host, url.port));
  request.set(http::field::user_agent, "gpufleet");
  if (!options.body.empty() || verb == http::verb::post || verb == http::verb::put) {
    request.set(http::field::content_type, options.content_type);
    request.body() = std::move(options.body);
  }
  for (const auto& [name, value] : options.headers)
    request.set(name, value);
  request.keep_alive(keep_alive);
  request.prepare_payload();
  return request;
}

HttpResult ResultOf(http::response_parser<http::string_body>& parser) {
  const auto& response = parser.get();
  HttpClientResponse answer;
  answer.status = static_cast<int>(response.result_int());
  answer.content_type = std::string(response[http::field::content_type]);
  for (const auto& field : response)
    answer.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  answer.body = parser.release().body();
  HttpResult result;
  result.response = std::move(answer);
  return result;
}

// One call in flight: everything its handlers touch, owned by them through a shared_ptr so that
// the async client can have thousands at once. `finish` runs exactly once: the handlers
// (deadline, resolve, connect, send, receive) run on one strand, as on a client with several
// threads the deadline would otherwise fire on one thread while the answer is read on another,
// and both would finish the call (the second with a moved-from callback).
struct Exchange : std::enable_shared_from_this<Exchange> {
  using Strand = asio::strand<asio::io_context::executor_type>;
  Exchange(asio::io_context& ioc, HttpCallOptions call_options,
           std::function<void(HttpResult)> callback)
      : options(std::move(call_options)),
        strand(asio::make_strand(ioc)),
        resolver(strand),
        plain(strand),
        deadline(strand),
        on_done(std::move(callback)) {}

  HttpCallOptions options;
  Strand strand;
  std::string what;  // "POST http://...": the start of every error
  std::optional<HttpUrl> url;
  std::optional<ssl::context> tls_context;
  tcp::resolver resolver;
  beast::tcp_stream plain;
  std::optional<beast::ssl_stream<beast::tcp_stream>> secure;
  asio::steady_timer deadline;  // bounds name resolution too, which the stream's timer does not
  beast::flat_buffer buffer;
  http::request<http::string_body> request;
  http::response_parser<http::string_body> parser;
  std::function<void(HttpResult)> on_done;
  bool done = false;

  beast::tcp_stream& tcp_layer() { return secure ? beast::get_lowest_layer(*secure) : plain; }

  void Finish(HttpResult result) {
    if (done) return;
    done = true;
    deadline.cancel();
    resolver.cancel();
    beast::error_code ignored;
    tcp_layer().socket().close(ignored);
    auto callback = std::move(on_done);
    callback(std::move(result));
  }
  void Fail(std::string error) {
    HttpResult result;
    result.error = std::move(error);
    Finish(std::move(result));
  }
  void Failed(const char* step, const beast::error_code& step_error) {
    Fail(StepFailure(what, step, step_error, options.timeout));
  }

  // Checks the call and starts it; a bad URL or method finishes it at once.
  void Start(std::string_view method, std::string_view target_url) {
    what = fmt::format("{} {}", method, target_url);
    std::string error;
    url = ParseHttpUrl(target_url, error);
    if (!url) return Fail(error);
    const http::verb verb = http::string_to_verb(method);
    if (verb == http::verb::unknown) return Fail(fmt::format("{}: unknown HTTP method", what));
    if (url->tls) {
      tls_context = ClientTlsContext(options.ca_file, error);
      if (!tls_context) return Fail(fmt::format("{}: {}", what, error));
      secure.emplace(plain.get_executor(), *tls_context);
      ExpectPeer(secure->native_handle(), url->host);
    }
    request = BuildRequest(verb, *url, options, /*keep_alive=*/false);
    parser.body_limit(kMaxResponseBodyBytes);

    auto self = shared_from_this();
    deadline.expires_after(options.timeout + std::chrono::milliseconds(100));
    deadline.async_wait([self](beast::error_code timer_error) {
      if (timer_error) return;  // cancelled: finished in time
      self->Fail(
          fmt::format("{}: no answer within {} ms", self->what, self->options.timeout.count()));
    });
    // One deadline for the whole exchange; the stream's timer fails whatever is pending then.
    tcp_layer().expires_after(options.timeout);
    // An address needs no resolver: Asio resolves on a thread of its own, which a one-call
    // process (every CLI verb) would start only for this.
    beast::error_code not_an_address;
    const asio::ip::address address = asio::ip::make_address(url->host, not_an_address);
    if (!not_an_address) return Connect({tcp::endpoint(address, url->port)});
    resolver.async_resolve(
        url->host, std::to_string(url->port),
        [self](beast::error_code resolve_error, const tcp::resolver::results_type& results) {
          if (self->done) return;
          if (resolve_error) return self->Failed("resolve", resolve_error);
          std::vector<tcp::endpoint> endpoints;
          for (const auto& entry : results)
            endpoints.push_back(entry.endpoint());
          self->Connect(endpoints);
        });
  }

  void Connect(const std::vector<tcp::endpoint>& endpoints) {
    auto self = shared_from_this();
    auto connected = [self](beast::error_code connect_error) {
      if (self->done) return;
      if (connect_error) return self->Failed("connect", connect_error);
      if (!self->secure) return self->SendAndReceive(self->plain);
      self->secure->async_handshake(ssl::stream_base::client, [self](beast::error_code tls_error) {
        if (self->done) return;
        if (!tls_error) return self->SendAndReceive(*self->secure);
        // Say why the certificate was refused (unknown CA, wrong host), not only that it was.
        const long verify = ::SSL_get_verify_result(self->secure->native_handle());
        std::string why;
        if (tls_error != beast::error::timeout && verify != X509_V_OK)
          why = fmt::format(" ({})", ::X509_verify_cert_error_string(verify));
        self->Fail(fmt::format("{}: TLS handshake: {}{}", self->what, tls_error.message(), why));
      });
    };
    if (options.local_address.empty()) {
      tcp_layer().async_connect(endpoints,
                                [connected](beast::error_code connect_error, const tcp::endpoint&) {
                                  connected(connect_error);
                                });
      return;
    }
    // From a given source address: bind before connecting, to the first server address of the
    // same family.
    beast::error_code code;
    const asio::ip::address local = asio::ip::make_address(options.local_address, code);
    if (code) return Fail(fmt::format("{}: bad local address '{}'", what, options.local_address));
    for (const tcp::endpoint& endpoint : endpoints) {
      if (endpoint.address().is_v4() != local.is_v4()) continue;
      tcp::socket& socket = tcp_layer().socket();
      if (socket.open(endpoint.protocol(), code); !code) socket.bind(tcp::endpoint(local, 0), code);
      if (code)
        return Fail(fmt::format("{}: bind to {}: {}", what, options.local_address, code.message()));
      tcp_layer().async_connect(endpoint, connected);
      return;
    }
    Fail(fmt::format("{}: no server address of the local address {}'s family", what,
                     options.local_address));
  }

  // Sends and receives over the plain or the TLS stream.
  template <typename Stream>
  void SendAndReceive(Stream& stream) {
    auto self = shared_from_this();
    http::async_write(stream, request, [self, &stream](beast::error_code write_error, size_t) {
      if (self->done) return;
      if (write_error) return self->Failed("send", write_error);
      http::async_read(stream, self->buffer, self->parser,
                       [self](beast::error_code read_error, size_t) {
                         if (self->done) return;
                         if (read_error) return self->Failed("receive", read_error);
                         self->Finish(ResultOf(self->parser));
                       });
    });
  }
};

}  // namespace

HttpResult HttpCall(std::string_view method, std::string_view url, const HttpCallOptions& options) {
  asio::io_context ioc;
  HttpResult result;
  auto exchange = std::make_shared<Exchange>(
      ioc, options, [&result](HttpResult answer) { result = std::move(answer); });
  exchange->Start(method, url);
  exchange.reset();  // the handlers own it now
  ioc.run();         // the exchange's deadline ends it
  return result;
}

struct AsyncHttpClient::Impl {
  asio::io_context ioc;
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(ioc);
  std::vector<std::thread> threads;
  std::mutex stop_mutex;
  bool stopped = false;
};

AsyncHttpClient::AsyncHttpClient(int threads) : impl_(std::make_unique<Impl>()) {
  for (int i = 0; i < std::max(threads, 1); ++i)
    impl_->threads.emplace_back([ioc = &impl_->ioc] { ioc->run(); });
}

AsyncHttpClient::~AsyncHttpClient() {
  Stop();
}

void AsyncHttpClient::Call(std::string_view method, std::string_view url, HttpCallOptions options,
                           Done done) {
  auto exchange = std::make_shared<Exchange>(impl_->ioc, std::move(options), std::move(done));
  // On an io thread, so that a call that fails at once does not run `done` on the caller's.
  asio::post(exchange->strand, [exchange, method = std::string(method), url = std::string(url)] {
    exchange->Start(method, url);
  });
}

void AsyncHttpClient::After(std::chrono::milliseconds delay, std::function<void()> work) {
  auto timer = std::make_shared<asio::steady_timer>(impl_->ioc, delay);
  timer->async_wait([timer, work = std::move(work)](beast::error_code error) {
    if (!error) work();
  });
}

void AsyncHttpClient::Stop() {
  std::lock_guard lock(impl_->stop_mutex);
  if (impl_->stopped) return;
  impl_->stopped = true;
  impl_->work.reset();
  impl_->ioc.stop();
  for (std::thread& thread : impl_->threads)
    thread.join();
}

// A kept-alive connection with the io_context its calls run on, one call at a time.
struct KeptConnection {
  asio::io_context ioc;
  beast::tcp_stream stream{ioc};
  beast::flat_buffer buffer;
};

struct KeepAliveHttpClient::Impl {
  std::mutex mutex;
  std::map<std::string, std::vector<std::unique_ptr<KeptConnection>>> idle;  // by "host:port"
  std::atomic<uint64_t> opened{0};

  std::unique_ptr<KeptConnection> Take(const std::string& key) {
    std::lock_guard lock(mutex);
    auto& pool = idle[key];
    if (pool.empty()) return nullptr;
    auto connection = std::move(pool.back());
    pool.pop_back();
    return connection;
  }
  void Give(const std::string& key, std::unique_ptr<KeptConnection> connection) {
    std::lock_guard lock(mutex);
    idle[key].push_back(std::move(connection));
  }
};

KeepAliveHttpClient::KeepAliveHttpClient() : impl_(std::make_unique<Impl>()) {}
KeepAliveHttpClient::~KeepAliveHttpClient() = default;

uint64_t KeepAliveHttpClient::connections_opened() const {
  return impl_->opened.load();
}

HttpResult KeepAliveHttpClient::Call(std::string_view method, std::string_view url,
                                     const HttpCallOptions& options) {
  std::string error;
  auto parsed = ParseHttpUrl(url, error);
  if (!parsed || parsed->tls || !options.local_address.empty())
    return HttpCall(method, url, options);  // its error, or a connection of its own
  const std::string what = fmt::format("{} {}", method, url);
  const http::verb verb = http::string_to_verb(method);
  HttpResult failed;
  if (verb == http::verb::unknown) {
    failed.error = fmt::format("{}: unknown HTTP method", what);
    return failed;
  }
  const std::string key = fmt::format("{}:{}", parsed->host, parsed->port);
  for (int attempt = 0; attempt < 2; ++attempt) {
    // A retry opens a new connection: the others idle since as long may be closed too.
    std::unique_ptr<KeptConnection> connection = attempt == 0 ? impl_->Take(key) : nullptr;
    const bool reused = connection != nullptr;
    if (!connection) {
      connection = std::make_unique<KeptConnection>();
      beast::error_code code;
      // Store endpoints are addresses or names in /etc/hosts; a resolution is not bounded here.
      const auto endpoints =
          tcp::resolver(connection->ioc).resolve(parsed->host, std::to_string(parsed->port), code);
      if (code) {
        failed.error = StepFailure(what, "resolve", code, options.timeout);
        return failed;
      }
      connection->stream.expires_after(options.timeout);
      connection->stream.async_connect(
          endpoints,
          [&code](beast::error_code connect_error, const tcp::endpoint&) { code = connect_error; });
      connection->ioc.run();
      if (code) {
        failed.error = StepFailure(what, "connect", code, options.timeout);
        return failed;
      }
      connection->stream.socket().set_option(tcp::no_delay(true), code);
      ++impl_->opened;
    }
    HttpCallOptions call = options;
    auto request = BuildRequest(verb, *parsed, call, /*keep_alive=*/true);
    http::response_parser<http::string_body> parser;
    parser.body_limit(kMaxResponseBodyBytes);
    beast::error_code code;
    const char* step = "send";
    connection->stream.expires_after(options.timeout);
    http::async_write(connection->stream, request, [&](beast::error_code write_error, size_t) {
      if ((code = write_error)) return;
      step = "receive";
      http::async_read(connection->stream, connection->buffer, parser,
                       [&code](beast::error_code read_error, size_t) { code = read_error; });
    });
    connection->ioc.restart();
    connection->ioc.run();
    if (!code) {
      const bool keep = parser.get().keep_alive();
      HttpResult result = ResultOf(parser);
      if (keep) impl_->Give(key, std::move(connection));
      return result;
    }
    // Closed by the server while it sat idle: once more on a new connection. A timeout is not
    // that, and is not sent twice.
    if (!reused || code == beast::error::timeout) {
      failed.error = StepFailure(what, step, code, options.timeout);
      return failed;
    }
  }
  return failed;  // not reached: the second attempt is on a new connection
}

HttpResult HttpGet(std::string_view url, std::chrono::milliseconds timeout) {
  return HttpCall("GET", url, {}, timeout);
}

HttpResult HttpPost(std::string_view url, std::string_view body,
                    std::chrono::milliseconds timeout) {
  return HttpCall("POST", url, body, timeout);
}

}  // namespace gpufleet::net
