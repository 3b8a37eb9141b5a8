// The gateway against in-test backends: small blocking HTTP servers on raw sockets, so a test
// can count their connections and hold a response between chunks (handshakes, no timing).

#include "gateway/gateway.h"

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gateway/routes_file.h"

namespace gpufleet::gateway {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr auto kGuard = std::chrono::seconds(20);  // against hangs only

struct BackendRequest {
  std::string method, target, body;
  std::map<std::string, std::string> headers;  // lower-case names
};

// One accepted connection of a Backend.
class BackendConnection {
 public:
  explicit BackendConnection(tcp::socket socket) : socket_(std::move(socket)) {}
  std::optional<BackendRequest> ReadRequest() {
    beast::error_code error;
    http::request_parser<http::string_body> parser;
    parser.body_limit(std::numeric_limits<uint64_t>::max());
    http::read(socket_, buffer_, parser, error);
    if (error) return std::nullopt;
    const auto& request = parser.get();
    BackendRequest out{
        std::string(request.method_string()), std::string(request.target()), request.body(), {}};
    for (const auto& field : request) {
      std::string name(field.name_string());
      for (char& c : name)
        c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      out.headers[name] = std::string(field.value());
    }
    return out;
  }
  bool Write(std::string_view bytes) {
    beast::error_code error;
    asio::write(socket_, asio::buffer(bytes.data(), bytes.size()), error);
    return !error;
  }
  void Respond(int status, std::string_view body, std::string_view content_type = "text/plain") {
    Write(fmt::format("HTTP/1.1 {} X\r\nContent-Type: {}\r\nContent-Length: {}\r\n\r\n{}", status,
                      content_type, body.size(), body));
  }
  // Blocks until the peer closes (true) or sends something (false).
  bool WaitForClose() {
    char byte;
    beast::error_code error;
    socket_.read_some(asio::buffer(&byte, 1), error);
    return static_cast<bool>(error);
  }
  void Close() {
    beast::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

 private:
  tcp::socket socket_;
  beast::flat_buffer buffer_;
};

// Answers each request with the handler, on one thread per connection.
class Backend {
 public:
  // Returns false to close the connection.
  using Handler = std::function<bool(const BackendRequest&, BackendConnection&)>;
  explicit Backend(Handler handler)
      : handler_(std::move(handler)), acceptor_(ioc_, {asio::ip::make_address("127.0.0.1"), 0}) {
    accept_thread_ = std::thread([this] {
      for (;;) {
        beast::error_code error;
        tcp::socket socket(ioc_);
        acceptor_.accept(socket, error);
        if (error || stopping_) return;
        auto connection = std::make_shared<BackendConnection>(std::move(socket));
        std::lock_guard lock(mutex_);
        ++accepted_;
        connections_.push_back(connection);
        threads_.emplace_back([this, connection] {
          while (auto request = connection->ReadRequest()) {
            {
              std::lock_guard request_lock(mutex_);
              requests_.push_back(*request);
            }
            if (!handler_(*request, *connection)) break;
          }
          connection->Close();
        });
      }
    });
  }
  ~Backend() {
    stopping_ = true;
    beast::error_code ignored;
    tcp::socket poke(ioc_);
    poke.connect(acceptor_.local_endpoint(), ignored);
    accept_thread_.join();
    std::vector<std::thread> threads;
    {
      std::lock_guard lock(mutex_);
      for (auto& connection : connections_)
        connection->Close();
      threads = std::move(threads_);
    }
    for (auto& thread : threads)
      thread.join();
  }
  uint16_t port() const { return acceptor_.local_endpoint().port(); }
  int accepted() {
    std::lock_guard lock(mutex_);
    return accepted_;
  }
  std::vector<BackendRequest> requests() {
    std::lock_guard lock(mutex_);
    return requests_;
  }
  Endpoint endpoint(std::string id, bool draining = false) const {
    return {std::move(id), "127.0.0.1", port(), draining};
  }

 private:
  Handler handler_;
  asio::io_context ioc_;
  tcp::acceptor acceptor_;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
  std::mutex mutex_;
  int accepted_ = 0;
  std::vector<std::shared_ptr<BackendConnection>> connections_;
  std::vector<std::thread> threads_;
  std::vector<BackendRequest> requests_;
};

Backend::Handler Echo(std::string name) {
  return [name](const BackendRequest& request, BackendConnection& connection) {
    connection.Respond(200, fmt::format("{} {} {}", name, request.method, request.target));
    return true;
  };
}

// A port with nothing listening.
uint16_t DeadPort() {
  asio::io_context ioc;
  tcp::acceptor acceptor(ioc, {asio::ip::make_address("127.0.0.1"), 0});
  return acceptor.local_endpoint().port();
}

struct Reply {
  int status = 0;
  std::string body;
  std::map<std::string, std::string> headers;
  bool ok = false;
};

// A client connection to the gateway (keep-alive).
class Client {
 public:
  explicit Client(uint16_t port) : socket_(ioc_) {
    socket_.connect({asio::ip::make_address("127.0.0.1"), port});
  }
  Reply Send(http::verb method, std::string target, std::string body = {},
             std::map<std::string, std::string> headers = {}) {
    http::request<http::string_body> request(method, target, 11);
    request.set(http::field::host, "127.0.0.1");
    for (const auto& [name, value] : headers)
      request.set(name, value);
    request.body() = std::move(body);
    if (!request.body().empty() || method == http::verb::post) request.prepare_payload();
    Reply reply;
    beast::error_code error;
    http::write(socket_, request, error);
    if (error) return reply;
    http::response_parser<http::string_body> parser;
    parser.body_limit(std::numeric_limits<uint64_t>::max());
    if (method == http::verb::head) parser.skip(true);
    http::read(socket_, buffer_, parser, error);
    if (error) return reply;
    reply.ok = true;
    reply.status = static_cast<int>(parser.get().result_int());
    reply.body = parser.get().body();
    for (const auto& field : parser.get())
      reply.headers[std::string(field.name_string())] = std::string(field.value());
    return reply;
  }
  // Raw access for streaming tests.
  void WriteRaw(std::string_view bytes) {
    asio::write(socket_, asio::buffer(bytes.data(), bytes.size()));
  }
  // Reads until `needle` has arrived; everything read so far.
  std::string ReadUntil(std::string_view needle) {
    while (raw_.find(needle) == std::string::npos) {
      char data[4096];
      beast::error_code error;
      const size_t got = socket_.read_some(asio::buffer(data), error);
      if (error) break;
      raw_.append(data, got);
    }
    return raw_;
  }
  void Close() {
    beast::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

 private:
  asio::io_context ioc_;
  tcp::socket socket_;
  beast::flat_buffer buffer_;
  std::string raw_;
};

const std::map<std::string, std::string> kAlice = {{"Authorization", "Bearer alice-token"}};

GatewayOptions TestOptions() {
  GatewayOptions options;
  // Two by default; the suite runs again with one (tests/gateway/CMakeLists.txt), where
  // connections share the io_context's executor instead of a strand each.
  const char* io_threads = std::getenv("GPUFLEET_GATEWAY_TEST_IO_THREADS");
  options.io_threads = io_threads ? std::atoi(io_threads) : 2;
  options.auth_disabled = true;
  options.picker.policy = serving::RoutingPolicy::kRoundRobin;
  return options;
}

std::unique_ptr<Gateway> StartGateway(GatewayOptions options) {
  auto started = Gateway::Start(std::move(options));
  EXPECT_TRUE(started.gateway) << started.error;
  return std::move(started.gateway);
}

Route MakeRoute(std::string name, std::vector<Endpoint> endpoints, std::string team = "ml") {
  Route route;
  route.deployment = std::move(name);
  route.team = std::move(team);
  route.endpoints = std::move(endpoints);
  return route;
}

// The value of an unlabelled or exactly labelled sample in Prometheus text; -1 when absent.
double Sample(const std::string& text, const std::string& series) {
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

TEST(GatewayRouting, PrefixIsStrippedBeforeForwarding) {
  Backend backend(Echo("a"));
  auto gateway = StartGateway(TestOptions());
  gateway->SetRoutes({MakeRoute("echo", {backend.endpoint("r1")})});
  Client client(gateway->port());
  Reply reply = client.Send(http::verb::get, "/d/echo/hello/world?x=1");
  ASSERT_TRUE(reply.ok);
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.body, "a GET /hello/world?x=1");
  EXPECT_EQ(client.Send(http::verb::get, "/d/echo").body, "a GET /");
  EXPECT_EQ(client.Send(http::verb::get, "/d/nope/x").status, 404);
  const std::string metrics = gateway->MetricsText();
  EXPECT_EQ(Sample(metrics, "gpufleet_gateway_requests_total{deployment=\"echo\",code=\"200\"}"),
            2);
  EXPECT_EQ(Sample(metrics, "gpufleet_gateway_in_flight{deployment=\"echo\"}"), 0);
  EXPECT_EQ(Sample(metrics, "gpufleet_gateway_request_duration_seconds_count{deployment=\"echo\"}"),
            2);
}

// The header the replica gets and the one the client gets back, as the gateway writes them
// itself (not through Beast's serializer): hop-by-hop fields dropped, X-Forwarded-For and
// X-Gpufleet-Deployment the gateway's own, the length where a body needs one, the replica's
// status, reason and fields passed on.
TEST(GatewayProxy, ForwardedHeadersAreRewrittenAndAnswersPassedOn) {
  Backend backend([](const BackendRequest&, BackendConnection& connection) {
    connection.Write(
        "HTTP/1.1 201 Made Here\r\nX-Reply: r\r\nKeep-Alive: timeout=5\r\n"
        "Content-Length: 2\r\n\r\nok");
    return true;
  });
  auto gateway = StartGateway(TestOptions());
  gateway->SetRoutes({MakeRoute("echo", {backend.endpoint("r1")})});
  Client client(gateway->port());
  Reply reply = client.Send(http::verb::post, "/d/echo/p?q=1", "hi",
                            {{"X-Forwarded-For", "6.6.6.6"},
                             {"X-Gpufleet-Deployment", "other"},
                             {"X-Custom", "v"},
                             {"Keep-Alive", "300"},
                             {"TE", "trailers"}});
  ASSERT_TRUE(reply.ok);
  EXPECT_EQ(reply.status, 201);
  EXPECT_EQ(reply.body, "ok");
  EXPECT_EQ(reply.headers["X-Reply"], "r");
  EXPECT_EQ(reply.headers.count("Keep-Alive"), 0u);
  EXPECT_EQ(reply.headers["Content-Length"], "2");
  ASSERT_EQ(client.Send(http::verb::patch, "/d/echo/e").status, 201);
  ASSERT_EQ(client.Send(http::verb::get, "/d/echo/g").status, 201);
  EXPECT_EQ(backend.accepted(), 1);  // one keep-alive connection for all three
  Client raw(gateway->port());
  raw.WriteRaw("GET /d/echo/r HTTP/1.0\r\nHost: x\r\n\r\n");
  const std::string answer = raw.ReadUntil("\r\n\r\nok");
  EXPECT_EQ(answer.rfind("HTTP/1.0 201 Made Here\r\n", 0), 0u) << answer;

  const auto requests = backend.requests();
  ASSERT_EQ(requests.size(), 4u);
  const BackendRequest& post = requests[0];
  EXPECT_EQ(post.method, "POST");
  EXPECT_EQ(post.target, "/p?q=1");
  EXPECT_EQ(post.body, "hi");
  auto header = [](const BackendRequest& request, const std::string& name) {
    const auto found = request.headers.find(name);
    return found == request.headers.end() ? std::string("(none)") : found->second;
  };
  EXPECT_EQ(header(post, "x-forwarded-for"), "127.0.0.1");
  EXPECT_EQ(header(post, "x-gpufleet-deployment"), "echo");
  EXPECT_EQ(header(post, "x-custom"), "v");
  EXPECT_EQ(header(post, "host"), "127.0.0.1");
  EXPECT_EQ(header(post, "content-length"), "2");
  EXPECT_EQ(header(post, "keep-alive"), "(none)");
  EXPECT_EQ(header(post, "te"), "(none)");
  // As Beast's prepare_payload: an empty PATCH or GET goes without a length.
  EXPECT_EQ(requests[1].method, "PATCH");
  EXPECT_EQ(header(requests[1], "content-length"), "(none)");
  EXPECT_EQ(header(requests[2], "content-length"), "(none)");
}

// A deployment's own `routing` beats the gateway's policy: round robin alternates strictly,
// which least outstanding with its random draws between idle replicas does not.
TEST(GatewayRouting, ARouteMayChooseItsOwnPolicy) {
  Backend a(Echo("a"));
  Backend b(Echo("b"));
  GatewayOptions options = TestOptions();
  options.picker.policy = serving::RoutingPolicy::kLeastOutstanding;
  auto gateway = StartGateway(options);
  Route route = MakeRoute("pair", {a.endpoint("r1"), b.endpoint("r2")});
  route.policy = serving::RoutingPolicy::kRoundRobin;
  gateway->SetRoutes({route});
  Client client(gateway->port());
  std::string seen;
  for (int i = 0; i < 12; ++i)
    seen += client.Send(http::verb::get, "/d/pair/").body.substr(0, 1);
  EXPECT_TRUE(seen == "abababababab" || seen == "babababababa") << seen;
}

TEST(GatewayRouting, HostFirstLabelOrWholeHost) {
  Backend a(Echo("a"));
  Backend b(Echo("b"));
  auto gateway = StartGateway(TestOptions());
  gateway->SetRoutes(
      {MakeRoute("alpha", {a.endpoint("r1")}), MakeRoute("beta", {b.endpoint("r2")})});
  Client client(gateway->port());
  EXPECT_EQ(client.Send(http::verb::get, "/x", {}, {{"Host", "alpha.inference.example:8080"}}).body,
            "a GET /x");
  EXPECT_EQ(client.Send(http::verb::get, "/y", {}, {{"Host", "beta"}}).body, "b GET /y");
  EXPECT_EQ(client.Send(http::verb::get, "/z", {}, {{"Host", "gamma.example"}}).status, 404);
}

TEST(GatewayRouting, OpenAiModelField) {
  Backend a(Echo("a"));
  Backend b(Echo("b"));
  auto gateway = StartGateway(TestOptions());
  Route llama = MakeRoute("llama", {a.endpoint("r1")});
  llama.model_names = {"meta-llama/Llama-3-8B", "sql-lora"};
  gateway->SetRoutes({llama, MakeRoute("qwen", {b.endpoint("r2")})});
  Client client(gateway->port());
  EXPECT_EQ(
      client.Send(http::verb::post, "/v1/completions", R"({"model":"sql-lora","prompt":"hi"})")
          .body,
      "a POST /v1/completions");
  EXPECT_EQ(client
                .Send(http::verb::post, "/v1/chat/completions",
                      R"({"model":"qwen","messages":[{"role":"user","content":"hi"}]})")
                .body,
            "b POST /v1/chat/completions");
  // The replica got the body as sent.
  EXPECT_EQ(a.requests().back().body, R"({"model":"sql-lora","prompt":"hi"})");

  Reply unknown = client.Send(http::verb::post, "/v1/completions", R"({"model":"gpt-9"})");
  EXPECT_EQ(unknown.status, 404);
  auto error = nlohmann::json::parse(unknown.body);
  EXPECT_EQ(error["error"]["code"], 404);
  EXPECT_NE(error["error"]["message"].get<std::string>().find("gpt-9"), std::string::npos);
  EXPECT_EQ(client.Send(http::verb::post, "/v1/completions", "{not json").status, 400);
  EXPECT_EQ(client.Send(http::verb::post, "/v1/completions", R"({"prompt":"x"})").status, 400);
}

TEST(GatewayRouting, BodyOverTheLimitIs413) {
  Backend a(Echo("a"));
  GatewayOptions options = TestOptions();
  options.max_body_bytes = 1000;
  auto gateway = StartGateway(options);
  gateway->SetRoutes({MakeRoute("llama", {a.endpoint("r1")})});
  Client client(gateway->port());
  Reply reply = client.Send(http::verb::post, "/v1/completions",
                            R"({"model":"llama","prompt":")" + std::string(2000, 'x') + "\"}");
  EXPECT_EQ(reply.status, 413);
  EXPECT_TRUE(a.requests().empty());
}

// Slow or greedy clients: one address holds at most its share of connections; one more gets a
// 503 naming the limit and is closed, and is counted; others, and the same client once it lets
// one go, are served.
TEST(GatewayLimits, ConnectionsArePerClientAddressCapped) {
  Backend backend(Echo("a"));
  GatewayOptions options = TestOptions();
  options.max_connections_per_client = 3;
  auto gateway = StartGateway(options);
  gateway->SetRoutes({MakeRoute("echo", {backend.endpoint("r1")})});
  std::vector<std::unique_ptr<Client>> held;
  for (int i = 0; i < 3; ++i)
    held.push_back(std::make_unique<Client>(gateway->port()));
  EXPECT_EQ(held[0]->Send(http::verb::get, "/d/echo/").status, 200);
  Client over(gateway->port());
  const std::string refused = over.ReadUntil("\r\n\r\n{");
  EXPECT_NE(refused.find("HTTP/1.1 503"), std::string::npos) << refused;
  EXPECT_NE(over.ReadUntil("}").find("too many connections from 127.0.0.1: 3 open"),
            std::string::npos);
  const std::string metrics = gateway->MetricsText();
  EXPECT_EQ(Sample(metrics,
                   "gpufleet_gateway_refused_connections_total{reason="
                   "\"client_connection_limit\"}"),
            1);
  EXPECT_EQ(Sample(metrics, "gpufleet_gateway_client_connections"), 3);
  held[1]->Close();
  held.erase(held.begin() + 1);
  // The gateway notices the close when its read ends: give it a moment.
  Reply reply;
  for (int attempt = 0; attempt < 50 && reply.status != 200; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    Client again(gateway->port());
    reply = again.Send(http::verb::get, "/d/echo/");
  }
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(held[0]->Send(http::verb::get, "/d/echo/").status, 200);
}

TEST(GatewayProxy, KeepAliveReusesUpstreamConnections) {
  Backend backend(Echo("a"));
  auto gateway = StartGateway(TestOptions());
  gateway->SetRoutes({MakeRoute("echo", {backend.endpoint("r1")})});
  for (int i = 0; i < 5; ++i) {
    Client client(gateway->port());  // a new client connection each time
    EXPECT_EQ(client.Send(http::verb::get, "/d/echo/" + std::to_string(i)).status, 200);
  }
  EXPECT_EQ(backend.requests().size(), 5u);
  EXPECT_EQ(backend.accepted(), 1);
}

// Server-sent events, chunked: the backend holds the stream open until the client has seen the
// first event, so the event cannot have been buffered until the end.
TEST(GatewayProxy, SseChunksReachTheClientBeforeTheStreamEnds) {
  std::promise<void> client_saw_first;
  auto saw_first = client_saw_first.get_future().share();
  Backend backend([saw_first](const BackendRequest&, BackendConnection& connection) {
    connection.Write(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n");
    connection.Write("d\r\ndata: first\n\n\r\n");
    if (saw_first.wait_for(kGuard) != std::future_status::ready) return false;
    connection.Write("e\r\ndata: second\n\n\r\n0\r\n\r\n");
    return true;
  });
  auto gateway = StartGateway(TestOptions());
  gateway->SetRoutes({MakeRoute("llm", {backend.endpoint("r1")})});
  Client client(gateway->port());
  client.WriteRaw("GET /d/llm/v1/stream HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string first = client.ReadUntil("data: first");
  EXPECT_NE(first.find("text/event-stream"), std::string::npos);
  EXPECT_EQ(first.find("data: second"), std::string::npos);
  client_saw_first.set_value();
  const std::string all = client.ReadUntil("\r\n0\r\n\r\n");
  EXPECT_NE(all.find("data: second"), std::string::npos);
  // A time to first byte was recorded for the stream.
  EXPECT_NE(gateway->MetricsText().find(
                "gpufleet_gateway_time_to_first_byte_seconds_count{deployment=\"llm\"} 1"),
            std::string::npos);
}

// Requests that arrive together (pipelined, or a header with its body) are parsed from what the
// gateway has read already, without another read of the socket: each is answered, in order,
// a body split over the header's read and the next read arrives whole, and a malformed request
// behind good ones is answered 400 after theirs.
TEST(GatewayProxy, PipelinedRequestsAreAnsweredInOrder) {
  Backend backend([](const BackendRequest& request, BackendConnection& connection) {
    connection.Respond(200,
                       fmt::format("{} {} [{}]", request.method, request.target, request.body));
    return true;
  });
  auto gateway = StartGateway(TestOptions());
  gateway->SetRoutes({MakeRoute("echo", {backend.endpoint("r1")})});
  Client client(gateway->port());
  client.WriteRaw(
      "POST /d/echo/one HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nfirst"
      "GET /d/echo/two HTTP/1.1\r\nHost: x\r\n\r\n"
      "POST /d/echo/three HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nsplit");
  std::string all = client.ReadUntil("GET /two []");
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  client.WriteRaw(" body");
  all = client.ReadUntil("POST /three [split body]");
  const size_t one = all.find("POST /one [first]");
  const size_t two = all.find("GET /two []");
  const size_t three = all.find("POST /three [split body]");
  ASSERT_NE(one, std::string::npos) << all;
  ASSERT_NE(three, std::string::npos) << all;
  EXPECT_LT(one, two);
  EXPECT_LT(two, three);
  client.WriteRaw("GET /d/echo/four HTTP/1.1\r\nHost: x\r\n\r\nNOT HTTP\r\n\r\n");
  all = client.ReadUntil("400 Bad Request");
  EXPECT_NE(all.find("GET /four []"), std::string::npos) << all;
  EXPECT_LT(all.find("GET /four []"), all.find("400 Bad Request")) << all;
}

TEST(GatewayProxy, ChunkedAnswerToAnHttp10ClientIsClosedDelimited) {
  Backend backend([](const BackendRequest&, BackendConnection& connection) {
    connection.Write(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        "d\r\ndata: first\n\n\r\n0\r\n\r\n");
    return true;
  });
  auto gateway = StartGateway(TestOptions());
  gateway->SetRoutes({MakeRoute("llm", {backend.endpoint("r1")})});
  Client client(gateway->port());
  client.WriteRaw("GET /d/llm/v1/stream HTTP/1.0\r\nHost: x\r\n\r\n");
  const std::string all = client.ReadUntil("never sent: read to the close");
  EXPECT_NE(all.find("\r\n\r\ndata: first\n\n"), std::string::npos) << all;
  EXPECT_EQ(all.find("chunked"), std::string::npos) << all;
}

TEST(GatewayProxy, ClientDisconnectClosesTheUpstreamConnection) {
  std::promise<bool> upstream_closed;
  Backend backend([&upstream_closed](const BackendRequest&, BackendConnection& connection) {
    connection.Write(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n");
    connection.Write("d\r\ndata: first\n\n\r\n");
    upstream_closed.set_value(connection.WaitForClose());
    return false;
  });
  auto gateway = StartGateway(TestOptions());
  gateway->SetRoutes({MakeRoute("llm", {backend.endpoint("r1")})});
  Client client(gateway->port());
  client.WriteRaw("GET /d/llm/v1/stream HTTP/1.1\r\nHost: x\r\n\r\n");
  client.ReadUntil("data: first");
  client.Close();
  auto closed = upstream_closed.get_future();
  ASSERT_EQ(closed.wait_for(kGuard), std::future_status::ready);
  EXPECT_TRUE(closed.get());
}

TEST(GatewayProxy, ClientDisconnectBeforeTheResponseCancelsTheUpstreamRequest) {
  std::promise<bool> upstream_closed;
  Backend backend([&upstream_closed](const BackendRequest&, BackendConnection& connection) {
    upstream_closed.set_value(connection.WaitForClose());  // never answers
    return false;
  });
  auto gateway = StartGateway(TestOptions());
  gateway->SetRoutes({MakeRoute("llm", {backend.endpoint("r1")})});
  {
    Client client(gateway->port());
    client.WriteRaw("GET /d/llm/slow HTTP/1.1\r\nHost: x\r\n\r\n");
    while (backend.requests().empty())
      std::this_thread::yield();
    client.Close();
  }
  auto closed = upstream_closed.get_future();
  ASSERT_EQ(closed.wait_for(kGuard), std::future_status::ready);
  EXPECT_TRUE(closed.get());
}

// A chunked upload is streamed: the replica has the first chunk before the client sends the
// rest.
TEST(GatewayProxy, ChunkedRequestBodyIsStreamedThrough) {
  asio::io_context ioc;
  tcp::acceptor acceptor(ioc, {asio::ip::make_address("127.0.0.1"), 0});
  std::promise<void> saw_first_part;
  std::promise<std::string> whole;
  std::thread replica([&] {
    tcp::socket socket(ioc);
    acceptor.accept(socket);
    std::string seen;
    auto read_until = [&](std::string_view needle) {
      while (seen.find(needle) == std::string::npos) {
        char data[4096];
        beast::error_code error;
        const size_t got = socket.read_some(asio::buffer(data), error);
        if (error) return false;
        seen.append(data, got);
      }
      return true;
    };
    if (!read_until("first-part")) return;
    saw_first_part.set_value();
    if (!read_until("\r\n0\r\n\r\n")) return;
    whole.set_value(seen);
    const std::string answer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
    asio::write(socket, asio::buffer(answer));
  });
  auto gateway = StartGateway(TestOptions());
  gateway->SetRoutes(
      {MakeRoute("up", {{"r1", "127.0.0.1", acceptor.local_endpoint().port(), false}})});
  Client client(gateway->port());
  client.WriteRaw(
      "POST /d/up/upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
      "a\r\nfirst-part\r\n");
  auto first = saw_first_part.get_future();
  ASSERT_EQ(first.wait_for(kGuard), std::future_status::ready);
  client.WriteRaw("b\r\nsecond-part\r\n0\r\n\r\n");
  EXPECT_NE(client.ReadUntil("ok").find("200 OK"), std::string::npos);
  replica.join();
  const std::string request = whole.get_future().get();
  EXPECT_NE(request.find("POST /upload HTTP/1.1"), std::string::npos);
  EXPECT_NE(request.find("second-part"), std::string::npos);
}

TEST(GatewayProxy, LargeBodyArrivesWhole) {
  Backend backend([](const BackendRequest& request, BackendConnection& connection) {
    connection.Respond(
        200, std::to_string(request.body.size()) + " " +
                 std::to_string(std::count(request.body.begin(), request.body.end(), 'y')));
    return true;
  });
  auto gateway = StartGateway(TestOptions());
  gateway->SetRoutes({MakeRoute("up", {backend.endpoint("r1")})});
  Client client(gateway->port());
  const std::string body = std::string(3 << 20, 'x') + "yy";
  EXPECT_EQ(client.Send(http::verb::put, "/d/up/blob", body).body,
            std::to_string(body.size()) + " 2");
  // The connection goes on serving.
  EXPECT_EQ(client.Send(http::verb::put, "/d/up/blob", "yyy").body, "3 3");
}

TEST(GatewayResilience, RetryOnADeadReplicaGoesToTheLiveOne) {
  Backend live(Echo("live"));
  auto gateway = StartGateway(TestOptions());
  gateway->SetRoutes(
      {MakeRoute("echo", {{"dead", "127.0.0.1", DeadPort(), false}, live.endpoint("live")})});
  Client client(gateway->port());
  // Round robin: one of every two picks lands on the dead replica first.
  for (int i = 0; i < 4; ++i) {
    Reply reply = client.Send(http::verb::post, "/d/echo/x", "{}");
    EXPECT_EQ(reply.status, 200);
    EXPECT_EQ(reply.body, "live POST /x");
  }
  const std::string metrics = gateway->MetricsText();
  EXPECT_GE(Sample(metrics, "gpufleet_gateway_retries_total{deployment=\"echo\"}"), 1);
  EXPECT_GE(Sample(metrics,
                   "gpufleet_gateway_upstream_errors_total{deployment=\"echo\",kind=\"connect\"}"),
            1);
}

TEST(GatewayResilience, GetIsRetriedOn503) {
  Backend sick([](const BackendRequest&, BackendConnection& connection) {
    connection.Respond(503, "busy");
    return true;
  });
  Backend well(Echo("well"));
  auto gateway = StartGateway(TestOptions());
  gateway->SetRoutes({MakeRoute("echo", {sick.endpoint("sick"), well.endpoint("well")})});
  Client client(gateway->port());
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(client.Send(http::verb::get, "/d/echo/x").body, "well GET /x");
  EXPECT_GE(sick.requests().size(), 1u);
  // A POST's 503 is the replica's answer, passed on: round robin sends one of two to it.
  std::set<int> statuses;
  for (int i = 0; i < 2; ++i)
    statuses.insert(client.Send(http::verb::post, "/d/echo/x", "{}").status);
  EXPECT_EQ(statuses, (std::set<int>{200, 503}));
}

TEST(GatewayResilience, RepeatedFailuresEjectTheReplica) {
  Backend live(Echo("live"));
  GatewayOptions options = TestOptions();
  options.eject_after_failures = 2;
  options.ejection_time = std::chrono::hours(1);
  auto gateway = StartGateway(options);
  gateway->SetRoutes(
      {MakeRoute("echo", {{"dead", "127.0.0.1", DeadPort(), false}, live.endpoint("live")})});
  Client client(gateway->port());
  for (int i = 0; i < 20; ++i)
    EXPECT_EQ(client.Send(http::verb::get, "/d/echo/x").status, 200);
  const std::string metrics = gateway->MetricsText();
  EXPECT_EQ(Sample(metrics, "gpufleet_gateway_ejections_total{deployment=\"echo\"}"), 1);
  // Two failures, then the dead replica was never tried again.
  EXPECT_EQ(Sample(metrics,
                   "gpufleet_gateway_upstream_errors_total{deployment=\"echo\",kind=\"connect\"}"),
            2);
  EXPECT_EQ(live.requests().size(), 20u);
}

TEST(GatewayBuffer, RequestWaitsForTheFirstEndpoint) {
  Backend backend(Echo("a"));
  auto gateway = StartGateway(TestOptions());
  std::promise<std::string> demanded;
  std::atomic<int> demands{0};
  gateway->OnDemand([&](const std::string& deployment) {
    if (demands++ == 0) demanded.set_value(deployment);
  });
  gateway->SetRoutes({MakeRoute("cold", {})});
  auto reply = std::async(std::launch::async, [&] {
    Client client(gateway->port());
    return client.Send(http::verb::get, "/d/cold/x");
  });
  auto deployment = demanded.get_future();
  ASSERT_EQ(deployment.wait_for(kGuard), std::future_status::ready);
  EXPECT_EQ(deployment.get(), "cold");
  EXPECT_EQ(Sample(gateway->MetricsText(), "gpufleet_gateway_buffered{deployment=\"cold\"}"), 1);
  auto loads = gateway->TakeLoad();
  ASSERT_EQ(loads.size(), 1u);
  EXPECT_EQ(loads[0].buffered, 1);
  EXPECT_EQ(loads[0].arrivals, 1u);
  gateway->SetRoutes({MakeRoute("cold", {backend.endpoint("r1")})});
  ASSERT_EQ(reply.wait_for(kGuard), std::future_status::ready);
  Reply answered = reply.get();
  EXPECT_EQ(answered.status, 200);
  EXPECT_EQ(answered.body, "a GET /x");
}

TEST(GatewayBuffer, FullBufferAnswers503WithRetryAfter) {
  GatewayOptions options = TestOptions();
  options.max_buffered_per_deployment = 1;
  options.retry_after_s = 7;
  options.stop_timeout = std::chrono::milliseconds(100);
  auto gateway = StartGateway(options);
  std::promise<void> demanded;
  std::atomic<int> demands{0};
  gateway->OnDemand([&](const std::string&) {
    if (demands++ == 0) demanded.set_value();
  });
  gateway->SetRoutes({MakeRoute("cold", {})});
  auto first = std::async(std::launch::async, [&] {
    Client client(gateway->port());
    return client.Send(http::verb::get, "/d/cold/x");
  });
  ASSERT_EQ(demanded.get_future().wait_for(kGuard), std::future_status::ready);
  Client client(gateway->port());
  Reply second = client.Send(http::verb::get, "/d/cold/y");
  EXPECT_EQ(second.status, 503);
  EXPECT_EQ(second.headers["Retry-After"], "7");
  gateway->Stop();  // answers the buffered one
  ASSERT_EQ(first.wait_for(kGuard), std::future_status::ready);
  EXPECT_EQ(first.get().status, 503);
}

TEST(GatewayBuffer, TimeoutAnswers503) {
  GatewayOptions options = TestOptions();
  options.buffer_timeout = std::chrono::milliseconds(20);
  auto gateway = StartGateway(options);
  gateway->SetRoutes({MakeRoute("cold", {})});
  Client client(gateway->port());
  Reply reply = client.Send(http::verb::get, "/d/cold/x");
  EXPECT_EQ(reply.status, 503);
  EXPECT_FALSE(reply.headers["Retry-After"].empty());
  EXPECT_EQ(Sample(gateway->MetricsText(), "gpufleet_gateway_buffered{deployment=\"cold\"}"), 0);
}

TEST(GatewayDraining, DrainingEndpointFinishesItsRequestAndGetsNoNew) {
  std::promise<void> release;
  auto released = release.get_future().share();
  std::atomic<bool> holding{false};
  Backend a([&, released](const BackendRequest& request, BackendConnection& connection) {
    if (request.target == "/hold") {
      holding = true;
      released.wait_for(kGuard);
    }
    connection.Respond(200, "a " + request.target);
    return true;
  });
  Backend b(Echo("b"));
  auto gateway = StartGateway(TestOptions());
  gateway->SetRoutes({MakeRoute("echo", {a.endpoint("a")})});
  auto held = std::async(std::launch::async, [&] {
    Client client(gateway->port());
    return client.Send(http::verb::get, "/d/echo/hold");
  });
  while (!holding)
    std::this_thread::yield();
  gateway->SetRoutes({MakeRoute("echo", {a.endpoint("a", true), b.endpoint("b")})});
  Client client(gateway->port());
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(client.Send(http::verb::get, "/d/echo/new").body, "b GET /new");
  EXPECT_EQ(a.requests().size(), 1u);
  auto loads = gateway->TakeLoad();
  ASSERT_EQ(loads.size(), 1u);
  EXPECT_EQ(loads[0].in_flight_by_endpoint["a"], 1);
  // Gone from the routes altogether (the control plane's drain): its request is still reported,
  // so the replica is not stopped under it.
  gateway->SetRoutes({MakeRoute("echo", {b.endpoint("b")})});
  loads = gateway->TakeLoad();
  ASSERT_EQ(loads.size(), 1u);
  EXPECT_EQ(loads[0].in_flight_by_endpoint["a"], 1);
  release.set_value();
  ASSERT_EQ(held.wait_for(kGuard), std::future_status::ready);
  Reply reply = held.get();
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.body, "a /hold");
}

// An llm route: the gateway reads each replica's vLLM metrics and the endpoint picker leaves out
// the one whose KV cache is nearly full.
// An llm route, or any route whose policy is the endpoint picker (the gateway's --policy, or the
// deployment's routing), is scraped and picked by its metrics alike.
void ScrapedMetricsSteer(bool llm_route, bool route_policy) {
  auto vllm = [](std::string name, int waiting, double kv) {
    return [name, waiting, kv](const BackendRequest& request, BackendConnection& connection) {
      if (request.target == "/metrics") {
        connection.Respond(200, fmt::format("vllm:num_requests_waiting{{model_name=\"m\"}} {}\n"
                                            "vllm:num_requests_running{{model_name=\"m\"}} 1\n"
                                            "vllm:kv_cache_usage_perc{{model_name=\"m\"}} {}\n",
                                            waiting, kv));
      } else {
        connection.Respond(200, name);
      }
      return true;
    };
  };
  Backend full(vllm("full", 0, 0.95));
  Backend roomy(vllm("roomy", 3, 0.2));
  GatewayOptions options = TestOptions();
  options.scrape_interval = std::chrono::milliseconds(1);
  if (!llm_route && !route_policy) options.picker.policy = serving::RoutingPolicy::kEndpointPicker;
  auto gateway = StartGateway(options);
  Route route = MakeRoute("llama", {full.endpoint("full"), roomy.endpoint("roomy")});
  route.llm = llm_route;
  if (route_policy) route.policy = serving::RoutingPolicy::kEndpointPicker;
  gateway->SetRoutes({route});
  // A second scrape starts only after the first was stored.
  auto scrapes = [](Backend& backend) {
    int count = 0;
    for (const auto& request : backend.requests())
      count += request.target == "/metrics";
    return count;
  };
  const auto deadline = std::chrono::steady_clock::now() + kGuard;
  while ((scrapes(full) < 2 || scrapes(roomy) < 2) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
  ASSERT_GE(scrapes(full), 2) << "the route's replicas were never scraped";
  Client client(gateway->port());
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(client
                  .Send(http::verb::post, "/v1/completions",
                        fmt::format(R"({{"model":"llama","prompt":"question {}"}})", i))
                  .body,
              "roomy");
}

TEST(GatewayPicker, ScrapedMetricsSteerLlmRequests) {
  ScrapedMetricsSteer(true, false);
}
TEST(GatewayPicker, TheEndpointPickerPolicyMakesAPlainRouteAnLlmOne) {
  ScrapedMetricsSteer(false, false);
  ScrapedMetricsSteer(false, true);
}

TEST(GatewayResilience, ReplicaSilentPastTheRequestTimeoutIs504) {
  std::promise<void> done;
  auto finished = done.get_future().share();
  Backend silent([finished](const BackendRequest&, BackendConnection&) {
    finished.wait_for(kGuard);  // never answers
    return false;
  });
  GatewayOptions options = TestOptions();
  options.request_timeout = std::chrono::milliseconds(30);
  options.retries = 0;
  auto gateway = StartGateway(options);
  gateway->SetRoutes({MakeRoute("slow", {silent.endpoint("r1")})});
  Client client(gateway->port());
  Reply reply = client.Send(http::verb::get, "/d/slow/x");
  done.set_value();
  EXPECT_EQ(reply.status, 504);
  EXPECT_EQ(Sample(gateway->MetricsText(),
                   "gpufleet_gateway_upstream_errors_total{deployment=\"slow\",kind=\"timeout\"}"),
            1);
}

// An llm route whose replicas export no vLLM metrics still serves: the picker falls back to
// least outstanding.
TEST(GatewayPicker, LlmRouteWithoutMetricsFallsBack) {
  Backend a(Echo("a"));
  Backend b(Echo("b"));
  GatewayOptions options = TestOptions();
  options.scrape_interval = std::chrono::milliseconds(1);
  auto gateway = StartGateway(options);
  Route route = MakeRoute("llama", {a.endpoint("a"), b.endpoint("b")});
  route.llm = true;
  gateway->SetRoutes({route});
  Client client(gateway->port());
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(client.Send(http::verb::post, "/v1/completions", R"({"model":"llama","prompt":"x"})")
                  .status,
              200);
}

GatewayOptions AuthOptions(std::atomic<int>* calls) {
  GatewayOptions options = TestOptions();
  options.auth_disabled = false;
  options.verify_token = [calls](const std::string& token) -> std::optional<Caller> {
    ++*calls;
    if (token == "alice-token") return Caller{"alice", "ml", false};
    if (token == "root-token") return Caller{"root", "ops", true};
    return std::nullopt;
  };
  return options;
}

TEST(GatewayAuth, TokensTeamsAndModelList) {
  Backend a(Echo("a"));
  Backend b(Echo("b"));
  std::atomic<int> calls{0};
  auto gateway = StartGateway(AuthOptions(&calls));
  Route mine = MakeRoute("llama", {a.endpoint("r1")}, "ml");
  mine.model_names = {"llama-3"};
  gateway->SetRoutes({mine, MakeRoute("secret", {b.endpoint("r2")}, "finance")});
  Client client(gateway->port());
  EXPECT_EQ(client.Send(http::verb::get, "/d/llama/x").status, 401);
  // A refusal before the body was read closes the connection: a new one after it.
  Reply bad = Client(gateway->port())
                  .Send(http::verb::post, "/v1/completions", R"({"model":"llama"})",
                        {{"Authorization", "Bearer wrong"}});
  EXPECT_EQ(bad.status, 401);
  EXPECT_EQ(nlohmann::json::parse(bad.body)["error"]["type"], "authentication_error");
  EXPECT_EQ(client.Send(http::verb::get, "/d/llama/x", {}, kAlice).body, "a GET /x");
  // Another team's deployment does not exist for alice, by any route.
  EXPECT_EQ(client.Send(http::verb::get, "/d/secret/x", {}, kAlice).status, 404);
  EXPECT_EQ(
      client.Send(http::verb::post, "/v1/completions", R"({"model":"secret"})", kAlice).status,
      404);
  EXPECT_EQ(
      client.Send(http::verb::get, "/d/secret/x", {}, {{"Authorization", "Bearer root-token"}})
          .body,
      "b GET /x");
  Reply models = client.Send(http::verb::get, "/v1/models", {}, kAlice);
  ASSERT_EQ(models.status, 200);
  auto list = nlohmann::json::parse(models.body);
  EXPECT_EQ(list["object"], "list");
  std::set<std::string> ids;
  for (const auto& model : list["data"])
    ids.insert(model["id"].get<std::string>());
  EXPECT_EQ(ids, (std::set<std::string>{"llama", "llama-3"}));
  // Unknown and foreign deployments look alike, and only once a token was checked.
  EXPECT_EQ(Client(gateway->port()).Send(http::verb::get, "/d/nope/x").status, 401);
  EXPECT_EQ(client.Send(http::verb::get, "/d/nope/x", {}, kAlice).status, 404);
  // Metrics name every team's deployments: admins only.
  EXPECT_EQ(client.Send(http::verb::get, "/metrics", {}, kAlice).status, 403);
  Reply metrics =
      client.Send(http::verb::get, "/metrics", {}, {{"Authorization", "Bearer root-token"}});
  EXPECT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find("gpufleet_gateway_requests_total{deployment=\"llama\",code=\"200\"}"),
            std::string::npos);
  // The replica never sees the caller's gpufleet token.
  EXPECT_EQ(a.requests().back().headers.count("authorization"), 0u);
  // Cached: alice's token was verified once, "wrong" once, root's once.
  EXPECT_EQ(calls.load(), 3);
}

TEST(GatewayStart, RefusesMissingVerifier) {
  GatewayOptions options;
  options.auth_disabled = false;
  auto started = Gateway::Start(options);
  EXPECT_FALSE(started.gateway);
  EXPECT_NE(started.error.find("token verifier"), std::string::npos);
}

TEST(GatewayRoutesFile, ParsesAndRejects) {
  std::string error;
  auto routes = ParseRoutes(R"(
routes:
  - deployment: llama
    team: ml
    llm: true
    models: [llama-3, sql-lora]
    endpoints: ["127.0.0.1:8001", {id: j7, address: "127.0.0.1:8002", draining: true}]
)",
                            error);
  ASSERT_TRUE(routes) << error;
  ASSERT_EQ(routes->size(), 1u);
  const Route& route = routes->front();
  EXPECT_TRUE(route.llm);
  EXPECT_EQ(route.model_names, (std::vector<std::string>{"llama-3", "sql-lora"}));
  ASSERT_EQ(route.endpoints.size(), 2u);
  EXPECT_EQ(route.endpoints[0].id, "127.0.0.1:8001");
  EXPECT_EQ(route.endpoints[1].id, "j7");
  EXPECT_EQ(route.endpoints[1].port, 8002);
  EXPECT_TRUE(route.endpoints[1].draining);
  // JSON works too.
  EXPECT_TRUE(ParseRoutes(R"([{"deployment": "a", "endpoints": ["localhost:1"]}])", error));
  EXPECT_FALSE(ParseRoutes(R"([{"deployment": "a", "endpoints": ["nohost"]}])", error));
  EXPECT_NE(error.find("nohost"), std::string::npos);
  EXPECT_FALSE(ParseRoutes("[{team: x}]", error));
  EXPECT_FALSE(ParseRoutes("[{deployment: a}, {deployment: a}]", error));
}

}  // namespace
}  // namespace gpufleet::gateway
