// The HTTP server and client over real loopback sockets: round trips on port 0, routing, the body
// limit, the request timeout and connection caps (slowloris), keep-alive, "Expect: 100-continue",
// graceful stop, client timeouts, and HTTPS with certificates the openssl tool makes at test time.

#include "net/http.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/http_client.h"
#include "net/http_server.h"
#include "net/server_urls.h"

namespace gpufleet::net {
namespace {

using namespace std::chrono_literals;

std::string Url(const HttpServer& server, const std::string& target) {
  return "http://" + server.address() + target;
}

std::unique_ptr<HttpServer> StartServer(HttpHandler handler, HttpServerOptions options = {}) {
  auto started = HttpServer::Start(options, std::move(handler));
  EXPECT_TRUE(started.server) << started.error;
  return std::move(started.server);
}

Router EchoRouter() {
  Router router;
  router.Add("GET", "/hello", [](const HttpRequest& request) {
    return HttpResponse::Text(200, "hello " + request.Query("name").value_or("nobody"));
  });
  router.Add("POST", "/echo", [](const HttpRequest& request) {
    HttpResponse response = HttpResponse::Text(200, request.body, "application/octet-stream");
    response.headers.emplace_back("X-Method", request.method);
    return response;
  });
  router.Add("GET", "/items/{id}/parts/{part}", [](const HttpRequest& request) {
    return HttpResponse::Json(200, "{\"id\": \"" + JsonEscape(request.PathParam("id")) +
                                       "\", \"part\": \"" + JsonEscape(request.PathParam("part")) +
                                       "\"}");
  });
  router.Add("DELETE", "/items/{id}/parts/{part}",
             [](const HttpRequest&) { return HttpResponse::Json(204, ""); });
  return router;
}

HttpHandler Handler(Router router) {
  return
      [router = std::move(router)](const HttpRequest& request) { return router.Handle(request); };
}

// A raw client socket, to see what the server does on the wire.
class RawConnection {
 public:
  // From `source` (any 127.x.y.z: a second client address on one machine) when given.
  explicit RawConnection(uint16_t port, const char* source = nullptr) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (source) {
      sockaddr_in local{};
      local.sin_family = AF_INET;
      ::inet_pton(AF_INET, source, &local.sin_addr);
      if (::bind(fd_, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0) return;
    }
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  }
  ~RawConnection() { ::close(fd_); }
  bool connected() const { return connected_; }

  void Send(const std::string& data) {
    size_t sent = 0;
    while (sent < data.size()) {
      ssize_t put = ::send(fd_, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
      ASSERT_GT(put, 0);
      sent += static_cast<size_t>(put);
    }
  }

  // False once the server has closed the connection.
  bool TrySend(const std::string& data) {
    return ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(data.size());
  }

  // One response: the header block, then Content-Length bytes of body. Empty on timeout or EOF
  // before a whole response.
  std::string ReadResponse(std::chrono::milliseconds timeout = 5s) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      size_t header_end = buffer_.find("\r\n\r\n");
      if (header_end != std::string::npos) {
        size_t length = 0;
        size_t field = buffer_.find("Content-Length: ");
        if (field != std::string::npos && field < header_end)
          length = std::stoul(buffer_.substr(field + 16));
        const size_t total = header_end + 4 + length;
        if (buffer_.size() >= total) {
          std::string response = buffer_.substr(0, total);
          buffer_.erase(0, total);
          return response;
        }
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return "";
      pollfd wait{fd_, POLLIN, 0};
      if (::poll(&wait, 1, static_cast<int>(left.count())) <= 0) return "";
      char chunk[4096];
      ssize_t got = ::recv(fd_, chunk, sizeof chunk, 0);
      if (got <= 0) return "";
      buffer_.append(chunk, static_cast<size_t>(got));
    }
  }

  // True when the server closed the connection (EOF) within the timeout.
  bool ClosedByPeer(std::chrono::milliseconds timeout = 5s) {
    pollfd wait{fd_, POLLIN, 0};
    if (::poll(&wait, 1, static_cast<int>(timeout.count())) <= 0) return false;
    char chunk[256];
    return ::recv(fd_, chunk, sizeof chunk, 0) <= 0;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
  std::string buffer_;
};

TEST(HttpServer, RoundTripOnPortZero) {
  auto server = StartServer(Handler(EchoRouter()));
  ASSERT_TRUE(server);
  EXPECT_NE(server->port(), 0);
  EXPECT_EQ(server->address(), "127.0.0.1:" + std::to_string(server->port()));

  HttpResult hello = HttpGet(Url(*server, "/hello?name=ada%20lovelace"));
  ASSERT_TRUE(hello.ok()) << hello.error;
  EXPECT_EQ(hello.response->status, 200);
  EXPECT_EQ(hello.response->body, "hello ada lovelace");
  EXPECT_EQ(hello.response->content_type, "text/plain; charset=utf-8");
  EXPECT_EQ(hello.response->Header("server"), "gpufleet");

  HttpResult echo = HttpPost(Url(*server, "/echo"), "{\"x\": 1}");
  ASSERT_TRUE(echo.ok()) << echo.error;
  EXPECT_EQ(echo.response->status, 200);
  EXPECT_EQ(echo.response->body, "{\"x\": 1}");
  EXPECT_EQ(echo.response->Header("X-Method"), "POST");

  HttpResult item = HttpGet(Url(*server, "/items/w-1/parts/a%2Fb"));
  ASSERT_TRUE(item.ok()) << item.error;
  EXPECT_EQ(item.response->body, "{\"id\": \"w-1\", \"part\": \"a/b\"}");
}

TEST(HttpServer, RouterAnswers404And405) {
  auto server = StartServer(Handler(EchoRouter()));
  ASSERT_TRUE(server);
  HttpResult missing = HttpGet(Url(*server, "/nothing/here"));
  ASSERT_TRUE(missing.ok()) << missing.error;
  EXPECT_EQ(missing.response->status, 404);
  EXPECT_EQ(missing.response->content_type, "application/json");
  EXPECT_EQ(missing.response->body, "{\"error\": \"no such resource: GET /nothing/here\"}\n");

  HttpResult wrong_method = HttpPost(Url(*server, "/hello"), "");
  ASSERT_TRUE(wrong_method.ok()) << wrong_method.error;
  EXPECT_EQ(wrong_method.response->status, 405);
  EXPECT_EQ(wrong_method.response->Header("Allow"), "GET");

  HttpResult two_methods = HttpCall("PUT", Url(*server, "/items/1/parts/2"));
  ASSERT_TRUE(two_methods.ok()) << two_methods.error;
  EXPECT_EQ(two_methods.response->status, 405);
  EXPECT_EQ(two_methods.response->Header("Allow"), "DELETE, GET");

  // A parameter matches one whole, non-empty segment.
  HttpResult too_deep = HttpGet(Url(*server, "/items/1/parts/2/3"));
  ASSERT_TRUE(too_deep.ok());
  EXPECT_EQ(too_deep.response->status, 404);
}

TEST(HttpServer, BodyOverTheLimitIs413AndTheServerCarriesOn) {
  HttpServerOptions options;
  options.max_body_bytes = 1024;
  auto server = StartServer(Handler(EchoRouter()), options);
  ASSERT_TRUE(server);

  HttpResult fits = HttpPost(Url(*server, "/echo"), std::string(1024, 'a'));
  ASSERT_TRUE(fits.ok()) << fits.error;
  EXPECT_EQ(fits.response->status, 200);
  EXPECT_EQ(fits.response->body.size(), 1024u);

  HttpResult too_big = HttpPost(Url(*server, "/echo"), std::string(64 * 1024, 'b'));
  ASSERT_TRUE(too_big.ok()) << too_big.error;
  EXPECT_EQ(too_big.response->status, 413);
  EXPECT_NE(too_big.response->body.find("request body larger than 1024 bytes"), std::string::npos);
  EXPECT_EQ(too_big.response->Header("Connection"), "close");
  EXPECT_EQ(server->counters().body_too_large.load(), 1u);

  HttpResult after = HttpGet(Url(*server, "/hello"));
  ASSERT_TRUE(after.ok()) << after.error;
  EXPECT_EQ(after.response->status, 200);
}

TEST(HttpServer, KeepAliveServesSeveralRequestsOnOneConnection) {
  std::atomic<int> requests{0};
  auto server = StartServer([&](const HttpRequest& request) {
    ++requests;
    return HttpResponse::Text(200, request.path);
  });
  ASSERT_TRUE(server);
  RawConnection connection(server->port());
  ASSERT_TRUE(connection.connected());
  for (const char* path : {"/one", "/two", "/three"}) {
    connection.Send(std::string("GET ") + path + " HTTP/1.1\r\nHost: test\r\n\r\n");
    std::string response = connection.ReadResponse();
    ASSERT_EQ(response.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << response;
    EXPECT_EQ(response.find("Connection: close"), std::string::npos) << response;
    EXPECT_TRUE(response.ends_with(std::string("\r\n\r\n") + path)) << response;
  }
  // Two requests sent back to back (pipelined) are answered in order.
  connection.Send(
      "GET /four HTTP/1.1\r\nHost: test\r\n\r\nGET /five HTTP/1.1\r\nHost: test\r\n\r\n");
  EXPECT_TRUE(connection.ReadResponse().ends_with("/four"));
  EXPECT_TRUE(connection.ReadResponse().ends_with("/five"));
  EXPECT_EQ(requests.load(), 5);

  // "Connection: close" is honoured: the answer comes, then the server closes.
  connection.Send("GET /last HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
  EXPECT_NE(connection.ReadResponse().find("Connection: close"), std::string::npos);
  EXPECT_TRUE(connection.ClosedByPeer());
}

TEST(HttpServer, ExpectContinueGetsA100BeforeTheBody) {
  auto server = StartServer(Handler(EchoRouter()));
  ASSERT_TRUE(server);
  RawConnection connection(server->port());
  ASSERT_TRUE(connection.connected());
  connection.Send(
      "POST /echo HTTP/1.1\r\nHost: test\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n");
  EXPECT_EQ(connection.ReadResponse(), "HTTP/1.1 100 Continue\r\n\r\n");
  connection.Send("12345");
  std::string response = connection.ReadResponse();
  EXPECT_EQ(response.rfind("HTTP/1.1 200 OK", 0), 0u) << response;
  EXPECT_TRUE(response.ends_with("12345")) << response;
}

TEST(HttpServer, MalformedRequestIs400) {
  auto server = StartServer(Handler(EchoRouter()));
  ASSERT_TRUE(server);
  RawConnection connection(server->port());
  ASSERT_TRUE(connection.connected());
  connection.Send("GET /hello HTTP/1.1\r\nHost test\r\n\r\n");
  std::string response = connection.ReadResponse();
  EXPECT_EQ(response.rfind("HTTP/1.1 400 Bad Request", 0), 0u) << response;
  EXPECT_TRUE(connection.ClosedByPeer());
  EXPECT_EQ(server->counters().malformed.load(), 1u);
}

// Polls `done` every 10 ms for up to 5 s.
template <typename Done>
bool Eventually(Done done) {
  for (int i = 0; i < 500; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return done();
}

TEST(HttpServer, ARequestMustArriveWholeWithinTheRequestTimeout) {
  HttpServerOptions options;
  options.request_timeout = 300ms;
  options.idle_timeout = 5s;
  auto server = StartServer(Handler(EchoRouter()), options);
  ASSERT_TRUE(server);

  // Idle longer than the request timeout is fine: that clock starts with a request's first byte.
  RawConnection patient(server->port());
  ASSERT_TRUE(patient.connected());
  std::this_thread::sleep_for(600ms);
  patient.Send("GET /hello HTTP/1.1\r\nHost: test\r\n\r\n");
  EXPECT_EQ(patient.ReadResponse().rfind("HTTP/1.1 200 OK", 0), 0u);

  // A header trickled a line every 100 ms (slowloris) is cut off, however steady the trickle.
  RawConnection trickle(server->port());
  ASSERT_TRUE(trickle.connected());
  ASSERT_TRUE(trickle.TrySend("GET /hello HTTP/1.1\r\nHost: test\r\n"));
  const auto started = std::chrono::steady_clock::now();
  bool cut_off = false;
  while (!cut_off && std::chrono::steady_clock::now() - started < 5s) {
    std::this_thread::sleep_for(100ms);
    cut_off = !trickle.TrySend("X-Slow: 1\r\n") || trickle.ClosedByPeer(0ms);
  }
  EXPECT_TRUE(cut_off || trickle.ClosedByPeer());
  // So is a body trickled after a whole header.
  RawConnection slow_body(server->port());
  ASSERT_TRUE(slow_body.connected());
  ASSERT_TRUE(
      slow_body.TrySend("POST /echo HTTP/1.1\r\nHost: test\r\nContent-Length: 100\r\n\r\n"));
  for (int i = 0; i < 10 && slow_body.TrySend("x"); ++i)
    std::this_thread::sleep_for(100ms);
  EXPECT_TRUE(slow_body.ClosedByPeer());
  EXPECT_TRUE(Eventually([&] { return server->counters().request_timeouts.load() == 2; }))
      << server->counters().request_timeouts.load();
  EXPECT_EQ(HttpGet(Url(*server, "/hello")).response->status, 200);
}

TEST(HttpServer, ConnectionsAreCappedPerClientAddressAndInAll) {
  HttpServerOptions options;
  options.max_connections_per_client = 3;
  options.max_connections = 5;
  auto server = StartServer(Handler(EchoRouter()), options);
  ASSERT_TRUE(server);
  EXPECT_EQ(server->max_connections(), 5u);

  std::vector<std::unique_ptr<RawConnection>> held;
  for (int i = 0; i < 3; ++i)
    held.push_back(std::make_unique<RawConnection>(server->port()));
  ASSERT_TRUE(Eventually([&] { return server->counters().connections.load() == 3; }));
  // A fourth from the same address is told why and closed...
  RawConnection greedy(server->port());
  ASSERT_TRUE(greedy.connected());
  std::string refused = greedy.ReadResponse();
  EXPECT_EQ(refused.rfind("HTTP/1.1 503 Service Unavailable", 0), 0u) << refused;
  EXPECT_NE(refused.find("too many connections from 127.0.0.1: 3 open"), std::string::npos)
      << refused;
  EXPECT_NE(refused.find("Retry-After: 1"), std::string::npos) << refused;
  EXPECT_TRUE(greedy.ClosedByPeer());
  // ...while another client is served, and the held ones still work.
  RawConnection other(server->port(), "127.0.0.2");
  ASSERT_TRUE(other.connected());
  other.Send("GET /hello HTTP/1.1\r\nHost: test\r\n\r\n");
  EXPECT_EQ(other.ReadResponse().rfind("HTTP/1.1 200 OK", 0), 0u);
  held[0]->Send("GET /hello HTTP/1.1\r\nHost: test\r\n\r\n");
  EXPECT_EQ(held[0]->ReadResponse().rfind("HTTP/1.1 200 OK", 0), 0u);

  // In all: 3 + 1 (127.0.0.2) + 1 (127.0.0.3) = 5; a sixth, from anyone, finds the server full.
  RawConnection fifth(server->port(), "127.0.0.3");
  ASSERT_TRUE(Eventually([&] { return server->counters().connections.load() == 5; }));
  RawConnection sixth(server->port(), "127.0.0.4");
  std::string full = sixth.ReadResponse();
  EXPECT_EQ(full.rfind("HTTP/1.1 503", 0), 0u) << full;
  EXPECT_NE(full.find("server busy: 5 connections open"), std::string::npos) << full;

  // A client that closes one gets its place back.
  held.pop_back();
  ASSERT_TRUE(Eventually([&] { return server->counters().connections.load() == 4; }));
  RawConnection again(server->port());
  again.Send("GET /hello HTTP/1.1\r\nHost: test\r\n\r\n");
  EXPECT_EQ(again.ReadResponse().rfind("HTTP/1.1 200 OK", 0), 0u);

  const std::string metrics = HttpCountersMetricsText(server->counters(), "test");
  EXPECT_NE(metrics.find("test_http_connections 5\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("test_http_refused_total{reason=\"client_connection_limit\"} 1\n"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("test_http_refused_total{reason=\"connection_limit\"} 1\n"),
            std::string::npos)
      << metrics;
}

TEST(HttpServer, HandlerExceptionIs500) {
  auto server =
      StartServer([](const HttpRequest&) -> HttpResponse { throw std::runtime_error("boom"); });
  ASSERT_TRUE(server);
  HttpResult result = HttpGet(Url(*server, "/"));
  ASSERT_TRUE(result.ok()) << result.error;
  EXPECT_EQ(result.response->status, 500);
  EXPECT_EQ(result.response->body, "{\"error\": \"internal error: boom\"}\n");
}

TEST(HttpServer, BindErrorsAreReported) {
  auto first = StartServer(Handler(EchoRouter()));
  ASSERT_TRUE(first);
  HttpServerOptions taken;
  taken.port = first->port();
  auto second = HttpServer::Start(taken, Handler(EchoRouter()));
  EXPECT_FALSE(second.server);
  EXPECT_NE(second.error.find("listen on 127.0.0.1:" + std::to_string(first->port())),
            std::string::npos)
      << second.error;
  EXPECT_NE(second.error.find("in use"), std::string::npos) << second.error;

  HttpServerOptions bad_host;
  bad_host.host = "not-an-address";
  auto third = HttpServer::Start(bad_host, Handler(EchoRouter()));
  EXPECT_FALSE(third.server);
  EXPECT_NE(third.error.find("invalid listen address 'not-an-address'"), std::string::npos);
}

TEST(HttpServer, StopLetsARequestInProgressFinishAndClosesIdleConnections) {
  std::mutex mutex;
  std::condition_variable changed;
  bool entered = false;
  bool release = false;
  HttpServerOptions options;
  options.io_threads = 2;  // one is held by the slow handler below
  auto server = StartServer(
      [&](const HttpRequest&) {
        std::unique_lock lock(mutex);
        entered = true;
        changed.notify_all();
        changed.wait(lock, [&] { return release; });
        return HttpResponse::Text(200, "finished");
      },
      options);
  ASSERT_TRUE(server);
  const uint16_t port = server->port();
  RawConnection idle(port);
  ASSERT_TRUE(idle.connected());

  auto slow = std::async(std::launch::async, [&] { return HttpGet(Url(*server, "/slow")); });
  {
    std::unique_lock lock(mutex);
    ASSERT_TRUE(changed.wait_for(lock, 5s, [&] { return entered; }));
  }
  auto stopped = std::async(std::launch::async, [&] { server->Stop(); });
  EXPECT_TRUE(idle.ClosedByPeer());  // the idle connection goes at once
  EXPECT_EQ(stopped.wait_for(50ms), std::future_status::timeout);  // waits for the slow one
  {
    std::lock_guard lock(mutex);
    release = true;
  }
  changed.notify_all();
  HttpResult answer = slow.get();
  ASSERT_TRUE(answer.ok()) << answer.error;
  EXPECT_EQ(answer.response->body, "finished");
  EXPECT_EQ(answer.response->Header("Connection"), "close");
  ASSERT_EQ(stopped.wait_for(5s), std::future_status::ready);

  HttpResult refused = HttpGet("http://127.0.0.1:" + std::to_string(port) + "/", 2s);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.error.find("connect"), std::string::npos) << refused.error;
}

// A long poll: the handler keeps the responder and another thread answers later, while the
// same single io thread goes on serving other requests.
TEST(HttpServer, AsyncRouteAnswersLaterFromAnotherThread) {
  std::mutex mutex;
  std::condition_variable parked_cv;
  std::vector<HttpResponder> parked;
  Router router;
  router.AddAsync("GET", "/wait", [&](HttpRequest request, HttpResponder respond) {
    std::lock_guard lock(mutex);
    parked.push_back([respond = std::move(respond),
                      name = request.Query("name").value_or("")](HttpResponse response) mutable {
      response.body += " " + name;
      respond(std::move(response));
    });
    parked_cv.notify_all();
  });
  router.AddAsync("GET", "/drop", [](HttpRequest, HttpResponder) {});
  router.Add("GET", "/now", [](const HttpRequest&) { return HttpResponse::Text(200, "now"); });
  auto started = HttpServer::Start({}, [&router](HttpRequest request, HttpResponder respond) {
    router.Dispatch(std::move(request), std::move(respond));
  });
  ASSERT_TRUE(started.server) << started.error;
  HttpServer& server = *started.server;

  auto waiting =
      std::async(std::launch::async, [&] { return HttpGet(Url(server, "/wait?name=later"), 5s); });
  {
    std::unique_lock lock(mutex);
    ASSERT_TRUE(parked_cv.wait_for(lock, 5s, [&] { return !parked.empty(); }));
  }
  // The io thread is free while the long poll is parked.
  HttpResult now = HttpGet(Url(server, "/now"), 5s);
  ASSERT_TRUE(now.ok()) << now.error;
  EXPECT_EQ(now.response->body, "now");
  EXPECT_EQ(waiting.wait_for(0s), std::future_status::timeout);

  std::thread([&] {
    std::lock_guard lock(mutex);
    parked.front()(HttpResponse::Text(202, "answered"));
    parked.front()(HttpResponse::Text(200, "a second answer is ignored"));
  }).join();
  HttpResult answered = waiting.get();
  ASSERT_TRUE(answered.ok()) << answered.error;
  EXPECT_EQ(answered.response->status, 202);
  EXPECT_EQ(answered.response->body, "answered later");

  HttpResult dropped = HttpGet(Url(server, "/drop"), 5s);
  ASSERT_TRUE(dropped.ok()) << dropped.error;
  EXPECT_EQ(dropped.response->status, 500);
  EXPECT_NE(dropped.response->body.find("dropped unanswered"), std::string::npos);
  parked.clear();
  server.Stop();
}

TEST(HttpClient, SendsExtraHeaders) {
  auto server = StartServer([](const HttpRequest& request) {
    return HttpResponse::Text(200, request.Header("authorization"));
  });
  HttpCallOptions options;
  options.headers.emplace_back("Authorization", "Bearer abc");
  HttpResult result = HttpCall("GET", Url(*server, "/"), options);
  ASSERT_TRUE(result.ok()) << result.error;
  EXPECT_EQ(result.response->body, "Bearer abc");
}

TEST(HttpClient, TimesOutAgainstAListenerThatNeverAnswers) {
  // Listens (the kernel completes the handshake) but never accepts or reads.
  int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  socklen_t length = sizeof address;
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const std::string url = "http://127.0.0.1:" + std::to_string(ntohs(address.sin_port)) + "/x";

  const auto start = std::chrono::steady_clock::now();
  HttpResult result = HttpGet(url, 200ms);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  ::close(listener);
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(result.error, "GET " + url + ": no answer within 200 ms");
  EXPECT_GE(elapsed, 190ms);
  EXPECT_LT(elapsed, 2s);
}

TEST(HttpClient, ReportsRefusedConnectionsAndBadUrls) {
  // Port 1 on loopback: nothing listens there in the test environment.
  HttpResult refused = HttpGet("http://127.0.0.1:1/", 2s);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.error.find("connect: Connection refused"), std::string::npos) << refused.error;

  HttpResult ftp = HttpGet("ftp://127.0.0.1/");
  EXPECT_EQ(ftp.error, "'ftp://127.0.0.1/' is not an http:// or https:// URL");
  HttpResult bad_port = HttpGet("http://127.0.0.1:99999/");
  EXPECT_EQ(bad_port.error, "'http://127.0.0.1:99999/': bad port '99999'");
}

TEST(AsyncHttpClient, FinishesEachCallOnceWhenAnswersRaceTheirDeadlines) {
  // Answers arrive around each call's deadline while four threads run the client's handlers: a
  // call whose deadline and answer are handled on two threads at once would finish twice (and
  // call a moved-from callback) or be torn down under its own read. Each call finishes once.
  constexpr int kCalls = 600;
  std::atomic<int> dispatched{0}, answered{0};
  Router router;
  router.AddAsync("GET", "/late", [&](HttpRequest request, HttpResponder respond) {
    ++dispatched;
    const int delay_ms = std::atoi(request.target.substr(request.target.find('=') + 1).c_str());
    std::thread([respond = std::move(respond), delay_ms, &answered]() mutable {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      respond(HttpResponse::Text(200, "late"));
      ++answered;
    }).detach();
  });
  auto started = HttpServer::Start({}, [&router](HttpRequest request, HttpResponder respond) {
    router.Dispatch(std::move(request), std::move(respond));
  });
  ASSERT_TRUE(started.server) << started.error;
  HttpServer& server = *started.server;

  std::mutex mutex;
  std::condition_variable all_done;
  std::map<int, int> finishes;  // call -> how often its callback ran
  int ok = 0;
  {
    AsyncHttpClient client(4);
    for (int i = 0; i < kCalls; ++i) {
      HttpCallOptions call;
      call.timeout = 40ms;
      // 30..150 ms: before the stream's timer, around it, and around the deadline after it.
      const int delay_ms = 30 + i % 121;
      client.Call("GET", Url(server, "/late?ms=" + std::to_string(delay_ms)), call,
                  [&, i](HttpResult result) {
                    std::lock_guard lock(mutex);
                    ++finishes[i];
                    if (result.ok()) ++ok;
                    all_done.notify_all();
                  });
    }
    std::unique_lock lock(mutex);
    ASSERT_TRUE(all_done.wait_for(lock, 30s, [&] { return finishes.size() == kCalls; }));
    lock.unlock();
    std::this_thread::sleep_for(300ms);  // room for a second finish of any call
  }
  for (const auto& [call, count] : finishes)
    EXPECT_EQ(count, 1) << "call " << call;
  RecordProperty("answered_in_time", ok);  // how many beat the deadline: varies with the load
  // The answering threads hold `answered` and the server: both outlive them. (A call given up
  // before the server read it was never dispatched.)
  while (answered < dispatched)
    std::this_thread::sleep_for(10ms);
}

TEST(AsyncHttpClient, HoldsManyCallsAtOnceFromChosenSourceAddresses) {
  // Every request is held until 300 are in: a client that ran them one at a time would never
  // get there. One connection per client address: a call from an address already holding one is
  // refused, which shows each call came from the address it was given.
  constexpr int kCalls = 300;
  std::mutex mutex;
  std::vector<HttpResponder> parked;
  Router router;
  router.AddAsync("GET", "/hold", [&](HttpRequest, HttpResponder respond) {
    std::lock_guard lock(mutex);
    parked.push_back(std::move(respond));
    if (parked.size() < kCalls) return;
    for (HttpResponder& waiting : parked)
      waiting(HttpResponse::Text(200, "released"));
    parked.clear();
  });
  HttpServerOptions options;
  options.max_connections_per_client = 1;
  auto started = HttpServer::Start(options, [&router](HttpRequest request, HttpResponder respond) {
    router.Dispatch(std::move(request), std::move(respond));
  });
  ASSERT_TRUE(started.server) << started.error;
  HttpServer& server = *started.server;

  AsyncHttpClient client(2);
  std::mutex results_mutex;
  std::condition_variable all_done;
  std::vector<HttpResult> results;
  for (int i = 0; i < kCalls; ++i) {
    HttpCallOptions call;
    call.timeout = 10s;
    call.local_address = "127.20." + std::to_string(i / 250) + "." + std::to_string(i % 250 + 1);
    client.Call("GET", Url(server, "/hold"), call, [&](HttpResult result) {
      std::lock_guard lock(results_mutex);
      results.push_back(std::move(result));
      all_done.notify_all();
    });
  }
  {
    std::unique_lock lock(results_mutex);
    ASSERT_TRUE(all_done.wait_for(lock, 20s, [&] { return results.size() == kCalls; }));
  }
  for (const HttpResult& result : results) {
    ASSERT_TRUE(result.ok()) << result.error;
    EXPECT_EQ(result.response->body, "released");
  }

  // Two at once from one address: the second is over the per-client limit.
  results.clear();
  router.AddAsync("GET", "/park", [&](HttpRequest, HttpResponder respond) {
    std::lock_guard lock(mutex);
    parked.push_back(std::move(respond));
  });
  HttpCallOptions same;
  same.local_address = "127.20.9.9";
  same.timeout = 300ms;
  auto note = [&](HttpResult result) {
    std::lock_guard lock(results_mutex);
    results.push_back(std::move(result));
    all_done.notify_all();
  };
  client.Call("GET", Url(server, "/park"), same, note);
  {
    // Until the first holds its connection.
    auto deadline = std::chrono::steady_clock::now() + 5s;
    while (std::chrono::steady_clock::now() < deadline) {
      std::lock_guard lock(mutex);
      if (!parked.empty()) break;
    }
  }
  client.Call("GET", Url(server, "/park"), same, note);
  {
    std::unique_lock lock(results_mutex);
    ASSERT_TRUE(all_done.wait_for(lock, 5s, [&] { return results.size() == 2; }));
  }
  // The second call, refused at once: a 503, or a reset when the refusal closed the socket
  // before the request was written.
  EXPECT_TRUE(!results[0].ok() || results[0].response->status == 503);
  EXPECT_EQ(results[0].error.find("no answer"), std::string::npos) << results[0].error;
  EXPECT_FALSE(results[1].ok());  // the first, parked past its deadline
  EXPECT_NE(results[1].error.find("no answer within 300 ms"), std::string::npos)
      << results[1].error;

  HttpCallOptions bad;
  bad.local_address = "not-an-address";
  std::promise<HttpResult> refused;
  client.Call("GET", Url(server, "/hold"), bad,
              [&](HttpResult result) { refused.set_value(std::move(result)); });
  EXPECT_NE(refused.get_future().get().error.find("bad local address 'not-an-address'"),
            std::string::npos);

  // Stopped with calls in flight: none of their callbacks runs afterwards.
  std::atomic<int> late{0};
  client.Call("GET", Url(server, "/park"), {}, [&](HttpResult) { ++late; });
  std::atomic<int> timer{0};
  client.After(10s, [&] { ++timer; });
  client.Stop();
  EXPECT_EQ(late.load(), 0);
  EXPECT_EQ(timer.load(), 0);
  {
    std::lock_guard lock(mutex);
    parked.clear();
  }
  server.Stop();
}

TEST(HttpUrl, Parses) {
  std::string error;
  auto url = ParseHttpUrl("http://127.0.0.1:9400/v1/gpus?x=1", error);
  ASSERT_TRUE(url);
  EXPECT_EQ(url->host, "127.0.0.1");
  EXPECT_EQ(url->port, 9400);
  EXPECT_EQ(url->target, "/v1/gpus?x=1");
  url = ParseHttpUrl("http://[::1]:80", error);
  ASSERT_TRUE(url);
  EXPECT_EQ(url->host, "::1");
  EXPECT_EQ(url->target, "/");
  url = ParseHttpUrl("http://node-a", error);
  ASSERT_TRUE(url);
  EXPECT_EQ(url->port, 80);
  EXPECT_FALSE(url->tls);
  url = ParseHttpUrl("https://control.example/api", error);
  ASSERT_TRUE(url);
  EXPECT_TRUE(url->tls);
  EXPECT_EQ(url->host, "control.example");
  EXPECT_EQ(url->port, 443);
  EXPECT_EQ(url->target, "/api");
  url = ParseHttpUrl("https://127.0.0.1:8443", error);
  ASSERT_TRUE(url);
  EXPECT_EQ(url->port, 8443);
  EXPECT_FALSE(ParseHttpUrl("http://:80/", error));
  EXPECT_FALSE(ParseHttpUrl("ftp://node-a/", error));
}

// ---- HTTPS ------------------------------------------------------------------------------------

namespace fs = std::filesystem;

// Self-signed certificates made with the openssl tool (Debian's `openssl`, installed by
// scripts/deps.sh) in a fresh directory, so no key is ever checked in.
class HttpsTest : public ::testing::Test {
 protected:
  struct Pem {
    std::string cert;
    std::string key;
  };

  void SetUp() override {
    ASSERT_EQ(std::system("command -v openssl >/dev/null 2>&1"), 0)
        << "the openssl command-line tool is missing: install Debian's openssl (make deps)";
    dir_ = fs::temp_directory_path() /
           ("gpufleet-tls-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A P-256 key and a self-signed certificate naming `names` ("IP:127.0.0.1,DNS:localhost").
  Pem Make(const std::string& name, const std::string& names) {
    Pem pem{(dir_ / (name + ".crt")).string(), (dir_ / (name + ".key")).string()};
    const std::string command =
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
        "-subj /CN=gpufleet-test -addext subjectAltName=" +
        names + " -keyout " + pem.key + " -out " + pem.cert + " >" +
        (dir_ / "openssl.log").string() + " 2>&1";
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
    return pem;
  }

  std::unique_ptr<HttpServer> StartHttps(const Pem& pem) {
    HttpServerOptions options;
    options.tls_cert_file = pem.cert;
    options.tls_key_file = pem.key;
    return StartServer(Handler(EchoRouter()), options);
  }

  static std::string HttpsUrl(const HttpServer& server, const std::string& host,
                              const std::string& target) {
    return "https://" + host + ":" + std::to_string(server.port()) + target;
  }

  fs::path dir_;
};

// A call carries a token: a standby's redirect from https to plain http is not followed, and the
// redirect itself is what the caller gets.
TEST_F(HttpsTest, ServerUrlsDoesNotFollowARedirectFromHttpsToHttp) {
  const Pem pem = Make("server", "IP:127.0.0.1");
  std::atomic<int> plain_calls{0};
  auto plain = StartServer([&](const HttpRequest&) {
    ++plain_calls;
    return HttpResponse::Text(200, "plain");
  });
  const std::string plain_url = "http://" + plain->address();
  HttpServerOptions options;
  options.tls_cert_file = pem.cert;
  options.tls_key_file = pem.key;
  auto standby = StartServer(
      [&](const HttpRequest& request) {
        HttpResponse response = HttpResponse::Error(307, "a standby");
        response.headers.emplace_back("Location", plain_url + request.target);
        response.headers.emplace_back(std::string(kServerRoleHeader), "standby");
        return response;
      },
      options);
  std::string error;
  auto servers = ServerUrls::Parse(HttpsUrl(*standby, "127.0.0.1", ""), error);
  ASSERT_TRUE(servers) << error;
  HttpCallOptions call;
  call.ca_file = pem.cert;
  call.headers.emplace_back("Authorization", "Bearer gpf_secret");
  HttpResult result = servers->Call("GET", "/api/v1/jobs", call);
  EXPECT_EQ(plain_calls, 0);
  ASSERT_FALSE(result.ok());  // a standby's answer, with nothing to follow
  EXPECT_NE(result.error.find("a standby"), std::string::npos) << result.error;
}

TEST_F(HttpsTest, RoundTripOnLoopback) {
  const Pem pem = Make("server", "IP:127.0.0.1,DNS:localhost");
  auto server = StartHttps(pem);
  ASSERT_TRUE(server);
  EXPECT_TRUE(server->tls());
  HttpCallOptions options;
  options.ca_file = pem.cert;
  HttpResult hello = HttpCall("GET", HttpsUrl(*server, "127.0.0.1", "/hello?name=tls"), options);
  ASSERT_TRUE(hello.ok()) << hello.error;
  EXPECT_EQ(hello.response->status, 200);
  EXPECT_EQ(hello.response->body, "hello tls");

  // By DNS name too (verified against the certificate's DNS name, sent as SNI), with a body.
  options.body = std::string(100000, 'b');
  HttpResult echo = HttpCall("POST", HttpsUrl(*server, "localhost", "/echo"), options);
  ASSERT_TRUE(echo.ok()) << echo.error;
  EXPECT_EQ(echo.response->body, options.body);
  EXPECT_EQ(echo.response->Header("X-Method"), "POST");
}

TEST_F(HttpsTest, RefusesACertificateFromAnUnknownCa) {
  const Pem pem = Make("server", "IP:127.0.0.1");
  const Pem stranger = Make("stranger", "IP:127.0.0.1");
  auto server = StartHttps(pem);
  ASSERT_TRUE(server);
  HttpCallOptions options;
  options.ca_file = stranger.cert;
  HttpResult refused = HttpCall("GET", HttpsUrl(*server, "127.0.0.1", "/hello"), options);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.error.find("TLS handshake: certificate verify failed"), std::string::npos)
      << refused.error;
  EXPECT_NE(refused.error.find("self-signed certificate"), std::string::npos) << refused.error;
  // The system's CAs do not know it either.
  HttpResult system = HttpCall("GET", HttpsUrl(*server, "127.0.0.1", "/hello"), HttpCallOptions{});
  EXPECT_FALSE(system.ok());
  EXPECT_NE(system.error.find("certificate verify failed"), std::string::npos) << system.error;
  // The server carries on with clients that trust it.
  options.ca_file = pem.cert;
  HttpResult good = HttpCall("GET", HttpsUrl(*server, "127.0.0.1", "/hello"), options);
  EXPECT_TRUE(good.ok()) << good.error;
}

TEST_F(HttpsTest, RefusesACertificateForAnotherHost) {
  const Pem pem = Make("server", "DNS:other.example,IP:10.9.8.7");
  auto server = StartHttps(pem);
  ASSERT_TRUE(server);
  HttpCallOptions options;
  options.ca_file = pem.cert;
  HttpResult by_ip = HttpCall("GET", HttpsUrl(*server, "127.0.0.1", "/hello"), options);
  EXPECT_FALSE(by_ip.ok());
  EXPECT_NE(by_ip.error.find("IP address mismatch"), std::string::npos) << by_ip.error;
  HttpResult by_name = HttpCall("GET", HttpsUrl(*server, "localhost", "/hello"), options);
  EXPECT_FALSE(by_name.ok());
  EXPECT_NE(by_name.error.find("hostname mismatch"), std::string::npos) << by_name.error;
}

TEST_F(HttpsTest, PlainHttpToTheHttpsPortGetsAPlainRefusal) {
  const Pem pem = Make("server", "IP:127.0.0.1");
  auto server = StartHttps(pem);
  ASSERT_TRUE(server);
  HttpResult plain = HttpGet(Url(*server, "/hello"), 5s);
  ASSERT_TRUE(plain.ok()) << plain.error;
  EXPECT_EQ(plain.response->status, 400);
  EXPECT_NE(plain.response->body.find("speaks HTTPS only"), std::string::npos)
      << plain.response->body;
  // Any first byte but a TLS handshake's gets the same answer, and the connection is closed.
  RawConnection raw(server->port());
  ASSERT_TRUE(raw.connected());
  raw.Send(std::string("\x01\x02\x03\x04\x05\x06\x07\x08", 8) + "\r\n\r\n");
  EXPECT_EQ(raw.ReadResponse().rfind("HTTP/1.1 400 ", 0), 0u);
  EXPECT_TRUE(raw.ClosedByPeer());
  // And HTTPS to a plain HTTP server fails the handshake instead of hanging.
  auto plain_server = StartServer(Handler(EchoRouter()));
  HttpCallOptions options;
  options.ca_file = pem.cert;
  options.timeout = 5s;
  HttpResult mismatch = HttpCall("GET", HttpsUrl(*plain_server, "127.0.0.1", "/hello"), options);
  EXPECT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.error.find("TLS handshake"), std::string::npos) << mismatch.error;
  // The HTTPS server still serves.
  HttpResult good = HttpCall("GET", HttpsUrl(*server, "127.0.0.1", "/hello"), options);
  EXPECT_TRUE(good.ok()) << good.error;
}

TEST_F(HttpsTest, UnusableCertificatesAreStartErrors) {
  const Pem pem = Make("server", "IP:127.0.0.1");
  const Pem other = Make("other", "IP:127.0.0.1");
  auto start_error = [](const std::string& cert, const std::string& key) {
    HttpServerOptions options;
    options.tls_cert_file = cert;
    options.tls_key_file = key;
    auto started =
        HttpServer::Start(options, [](const HttpRequest&) { return HttpResponse::Text(200, ""); });
    EXPECT_FALSE(started.server);
    return started.error;
  };
  EXPECT_NE(start_error(pem.cert, "").find("both a certificate and a private key"),
            std::string::npos);
  const std::string missing = (dir_ / "missing.crt").string();
  EXPECT_NE(start_error(missing, pem.key).find("TLS certificate '" + missing + "'"),
            std::string::npos)
      << start_error(missing, pem.key);
  EXPECT_NE(start_error(pem.key, pem.key).find("TLS certificate"), std::string::npos);
  EXPECT_NE(start_error(pem.cert, other.key).find("does not belong to the certificate"),
            std::string::npos)
      << start_error(pem.cert, other.key);
}

TEST(HttpTarget, SplitsAndDecodes) {
  std::string path;
  std::map<std::string, std::string> query;
  ASSERT_TRUE(SplitTarget("/a%20b/c?x=1&y=two+words&z=%3D&flag&x=2", path, query));
  EXPECT_EQ(path, "/a b/c");
  EXPECT_EQ(query.at("x"), "2");  // the last one wins
  EXPECT_EQ(query.at("y"), "two words");
  EXPECT_EQ(query.at("z"), "=");
  EXPECT_EQ(query.at("flag"), "");
  EXPECT_FALSE(SplitTarget("/bad%2", path, query));
  EXPECT_FALSE(SplitTarget("/x?y=%zz", path, query));
  EXPECT_EQ(JsonEscape("a\"b\\c\nd\x01"), "a\\\"b\\\\c\\nd\\u0001");
}

// A leader and its standbys: calls go to the one that answers, and stay with it.
TEST(ServerUrls, CallsFollowTheServerThatAnswers) {
  std::string error;
  EXPECT_FALSE(ServerUrls::Parse("", error));
  EXPECT_FALSE(ServerUrls::Parse("http://a:1,,http://b:2", error));
  EXPECT_NE(error.find("empty server URL"), std::string::npos) << error;
  EXPECT_FALSE(ServerUrls::Parse("http://a:1,ftp://b", error));
  EXPECT_NE(error.find("ftp://b"), std::string::npos) << error;
  auto parsed = ServerUrls::Parse("http://a:1/,http://b:2", error);
  ASSERT_TRUE(parsed) << error;
  EXPECT_EQ(parsed->all(), (std::vector<std::string>{"http://a:1", "http://b:2"}));

  // The first server is gone (nothing listens on its port); the second answers.
  std::string gone;
  {
    auto closed = StartServer(Handler(EchoRouter()));
    gone = "http://" + closed->address();
  }
  auto server = StartServer(Handler(EchoRouter()));
  const std::string live = "http://" + server->address();
  auto servers = ServerUrls::Parse(gone + "," + live, error);
  ASSERT_TRUE(servers) << error;
  EXPECT_EQ(servers->current(), gone);
  HttpCallOptions options;
  options.timeout = 2s;
  HttpResult result = servers->Call("GET", "/hello?name=ha", options);
  ASSERT_TRUE(result.ok()) << result.error;
  EXPECT_EQ(result.response->body, "hello ha");
  EXPECT_EQ(servers->current(), live);  // and copies share it
  const ServerUrls copy = *servers;
  EXPECT_EQ(copy.current(), live);
  // Any HTTP answer ends the search: a 404 is the server's answer, not a reason to move on.
  result = servers->Call("GET", "/nowhere", options);
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result.response->status, 404);
  server.reset();
  result = servers->Call("GET", "/hello", options);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.error.find(gone), std::string::npos) << result.error;
  EXPECT_NE(result.error.find(live), std::string::npos) << result.error;
}

// Calls reuse a kept connection; one the server closed while it sat idle is replaced without the
// caller seeing it; calls from several threads each get a connection.
TEST(KeepAliveHttpClient, ReusesConnectionsAndReplacesOnesTheServerClosed) {
  HttpServerOptions options;
  auto server = StartServer(Handler(EchoRouter()), options);
  const uint16_t port = server->port();
  const std::string base = "http://127.0.0.1:" + std::to_string(port);
  KeepAliveHttpClient client;
  HttpCallOptions call;
  call.timeout = 2s;
  for (int i = 0; i < 20; ++i) {
    HttpResult result = client.Call("GET", base + "/hello?name=k" + std::to_string(i), call);
    ASSERT_TRUE(result.ok()) << result.error;
    EXPECT_EQ(result.response->body, "hello k" + std::to_string(i));
  }
  EXPECT_EQ(client.connections_opened(), 1u);

  // The server goes away and another takes its port: the kept connection is dead.
  server.reset();
  options.port = port;
  server = StartServer(Handler(EchoRouter()), options);
  HttpResult result = client.Call("GET", base + "/hello?name=again", call);
  ASSERT_TRUE(result.ok()) << result.error;
  EXPECT_EQ(result.response->body, "hello again");
  EXPECT_EQ(client.connections_opened(), 2u);

  std::vector<std::thread> threads;
  std::atomic<int> answered{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 25; ++i)
        if (HttpResult r = client.Call("GET", base + "/hello?name=t", call);
            r.ok() && r.response->body == "hello t")
          ++answered;
    });
  for (auto& thread : threads)
    thread.join();
  EXPECT_EQ(answered, 100);
  EXPECT_LE(client.connections_opened(), 6u);  // at most one more per thread

  // Nothing listens any more: the error says where and why.
  server.reset();
  result = client.Call("GET", base + "/hello", call);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.error.find("GET " + base + "/hello"), std::string::npos) << result.error;
}

// A standby redirects to the leader: the call follows with its method and body, and later calls
// go to the leader directly. A standby that knows no leader is passed over like one that is down.
TEST(ServerUrls, FollowsAStandbysRedirectAndPassesOverAStandbyWithoutALeader) {
  std::atomic<int> leader_posts{0};
  auto leader = StartServer([&](const HttpRequest& request) {
    if (request.method == "POST") ++leader_posts;
    return HttpResponse::Text(200, request.method + " " + request.target + " " + request.body);
  });
  const std::string leader_url = "http://" + leader->address();
  std::atomic<int> standby_calls{0};
  auto standby = StartServer([&](const HttpRequest& request) {
    ++standby_calls;
    HttpResponse response = HttpResponse::Error(307, "a standby");
    response.headers.emplace_back("Location", leader_url + request.target);
    response.headers.emplace_back(std::string(kServerRoleHeader), "standby");
    return response;
  });
  auto lost = StartServer([](const HttpRequest&) {
    HttpResponse response = HttpResponse::Error(503, "a standby that knows no leader");
    response.headers.emplace_back(std::string(kServerRoleHeader), "standby");
    return response;
  });
  std::string error;
  const std::string standby_url = "http://" + standby->address();
  auto servers = ServerUrls::Parse(standby_url, error);
  ASSERT_TRUE(servers) << error;
  HttpCallOptions options;
  options.timeout = 2s;
  options.body = R"({"x": 1})";
  HttpResult result = servers->Call("POST", "/api/v1/jobs?a=b", options);
  ASSERT_TRUE(result.ok()) << result.error;
  EXPECT_EQ(result.response->status, 200);
  EXPECT_EQ(result.response->body, R"(POST /api/v1/jobs?a=b {"x": 1})");
  EXPECT_EQ(leader_posts, 1);
  EXPECT_EQ(servers->current(), leader_url);
  EXPECT_EQ(servers->all(), (std::vector<std::string>{standby_url, leader_url}));
  servers->Call("GET", "/again", options);
  EXPECT_EQ(standby_calls, 1);  // straight to the leader now

  // A server that should not answer comes first: the call moves on to the next server; when it
  // is the only one, the error says why (each of `says`).
  const auto passed_over = [&](const std::string& address, std::vector<std::string> says) {
    auto listed = ServerUrls::Parse("http://" + address + "," + leader_url, error);
    ASSERT_TRUE(listed) << error;
    HttpResult answer = listed->Call("GET", "/x", options);
    ASSERT_TRUE(answer.ok()) << answer.error;
    EXPECT_EQ(answer.response->status, 200);
    EXPECT_EQ(listed->current(), leader_url);
    auto alone = ServerUrls::Parse("http://" + address, error);
    ASSERT_TRUE(alone) << error;
    answer = alone->Call("GET", "/x", options);
    ASSERT_FALSE(answer.ok());
    for (const std::string& reason : says)
      EXPECT_NE(answer.error.find(reason), std::string::npos) << answer.error;
  };
  // The standby without a leader.
  passed_over(lost->address(), {"a standby"});
  // A leader on its way out (its store failed, its lease lapsed).
  auto stopping = StartServer([](const HttpRequest&) {
    HttpResponse response = HttpResponse::Error(503, "store failed: disk full");
    response.headers.emplace_back(std::string(kServerRoleHeader), "stopping");
    return response;
  });
  passed_over(stopping->address(), {"stopping: ", "disk full"});
}

}  // namespace
}  // namespace gpufleet::net
