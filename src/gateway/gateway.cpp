#include "gateway/gateway.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "net/asio_serve.h"
#include "net/http.h"

namespace gpufleet::gateway {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
// What a connection's handlers run on: a strand of the io_context, or with one io thread the
// io_context itself (its handlers are serial already; a strand then only adds a lock, a queue and
// a heap-allocated copy of itself for every operation's work tracking).
using Serial = asio::any_io_executor;

constexpr auto kLingerTime = std::chrono::seconds(1);
constexpr size_t kUpstreamHeaderLimit = size_t{64} << 10;
constexpr size_t kMetricsBodyLimit = size_t{8} << 20;
constexpr size_t kRelayBufferBytes = 16 << 10;
// Request bodies up to this size are read whole before forwarding (so they can be retried and
// routed by `model`); larger or chunked ones are streamed through.
constexpr uint64_t kHeldBodyBytes = uint64_t{1} << 20;
// The status counted for a request whose client left before its answer (nginx's 499).
constexpr int kClientClosedStatus = 499;
// A replica's /metrics that takes longer is skipped: its numbers then age into staleness.
constexpr auto kScrapeTimeout = std::chrono::seconds(2);

const std::vector<double> kDurationBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                              1,     2.5,  5,     10,   30,  60,   120};

double Seconds(Clock::duration duration) {
  return std::chrono::duration<double>(duration).count();
}

struct Histogram {
  std::vector<uint64_t> counts = std::vector<uint64_t>(kDurationBuckets.size(), 0);
  uint64_t count = 0;
  double sum = 0;
  void Observe(double value) {
    for (size_t i = 0; i < kDurationBuckets.size(); ++i)
      if (value <= kDurationBuckets[i]) ++counts[i];
    ++count;
    sum += value;
  }
};

std::string LabelEscape(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

std::string EndpointKey(const Endpoint& endpoint) {
  return fmt::format("{}@{}:{}", endpoint.id, endpoint.host, endpoint.port);
}

std::string AddressKey(const std::string& host, uint16_t port) {
  return fmt::format("{}:{}", host, port);
}

// Headers a request does not take to the replica: hop-by-hop ones, the caller's gpufleet token,
// and the length (the body's own is set).
constexpr std::array kNotForwarded = {http::field::connection,       http::field::keep_alive,
                                      http::field::proxy_connection, http::field::te,
                                      http::field::trailer,          http::field::upgrade,
                                      http::field::expect,           http::field::transfer_encoding,
                                      http::field::authorization,    http::field::content_length};
constexpr char kForwardedFor[] = "X-Forwarded-For";
constexpr char kDeploymentHeader[] = "X-Gpufleet-Deployment";

std::string_view Std(beast::string_view text) {
  return {text.data(), text.size()};
}

void AppendField(std::string& out, std::string_view name, std::string_view value) {
  out.append(name).append(": ").append(value).append("\r\n");
}

// A header's fields as HTTP text, in their order.
void AppendFields(std::string& out, const http::fields& fields) {
  for (const auto& field : fields)
    AppendField(out, Std(field.name_string()), Std(field.value()));
}

// An error answer: OpenAI's shape on /v1 paths, {"error": message} elsewhere.
std::string ErrorBody(bool openai, int status, std::string_view message) {
  if (!openai) return fmt::format("{{\"error\": \"{}\"}}\n", net::JsonEscape(message));
  std::string_view type = status == 401   ? "authentication_error"
                          : status == 404 ? "not_found_error"
                          : status >= 500 ? "server_error"
                                          : "invalid_request_error";
  return fmt::format("{{\"error\": {{\"message\": \"{}\", \"type\": \"{}\", \"code\": {}}}}}\n",
                     net::JsonEscape(message), type, status);
}

// The text an LLM request's prompt is matched on for prefix-cache affinity.
std::string PromptOf(const nlohmann::json& body) {
  std::string prompt;
  if (const auto found = body.find("prompt"); found != body.end()) {
    if (found->is_string()) return found->get<std::string>();
    if (found->is_array())
      for (const auto& part : *found)
        if (part.is_string()) prompt += part.get<std::string>() + "\n";
    return prompt;
  }
  if (const auto messages = body.find("messages"); messages != body.end() && messages->is_array()) {
    for (const auto& message : *messages) {
      if (!message.is_object()) continue;
      if (auto role = message.find("role"); role != message.end() && role->is_string())
        prompt += role->get<std::string>() + ": ";
      if (auto content = message.find("content"); content != message.end()) {
        if (content->is_string()) {
          prompt += content->get<std::string>();
        } else if (content->is_array()) {
          for (const auto& part : *content)
            if (part.is_object())
              if (auto text = part.find("text"); text != part.end() && text->is_string())
                prompt += text->get<std::string>();
        }
      }
      prompt += "\n";
    }
  }
  return prompt;
}

struct CachedCaller {
  std::optional<Caller> caller;
  Clock::time_point expires;
};

struct EndpointHealth {
  // Whose replica it is and its id: a draining replica left the routes, but its requests in
  // flight are still reported, so the control plane stops it only once they are done.
  std::string deployment;
  std::string id;
  int consecutive_failures = 0;
  int ejections = 0;
  Clock::time_point ejected_until{};
  int64_t in_flight = 0;
  std::optional<serving::EndpointMetrics> metrics;
  bool scraping = false;
};

// A request held while its deployment has no ready endpoint.
struct Waiter {
  std::function<void()> resume;  // posts back onto the session's strand
  bool done = false;             // resumed or timed out (under the gateway's mutex)
};

struct DeploymentState {
  Route route;
  // EndpointKey and AddressKey of route.endpoints, index for index: formatted once per
  // SetRoutes, not per request.
  std::vector<std::string> endpoint_keys;
  std::vector<std::string> address_keys;
  void SetRoute(Route new_route) {
    route = std::move(new_route);
    endpoint_keys.clear();
    address_keys.clear();
    for (const Endpoint& endpoint : route.endpoints) {
      endpoint_keys.push_back(EndpointKey(endpoint));
      address_keys.push_back(AddressKey(endpoint.host, endpoint.port));
    }
  }
  bool present = false;
  serving::PickerState picker;
  std::deque<std::shared_ptr<Waiter>> waiting;
  int64_t in_flight = 0;
  // Load since the last TakeLoad: the integral of in-flight + buffered over time.
  double load_area_ms = 0;
  Clock::time_point load_last_change = Clock::now();
  Clock::time_point load_interval_start = Clock::now();
  uint64_t arrivals = 0;
  // Metrics.
  std::map<int, uint64_t> requests_by_code;
  Histogram duration;
  Histogram time_to_first_byte;
  uint64_t retries = 0;
  uint64_t ejections = 0;
  std::map<std::string, uint64_t> upstream_errors;  // by kind

  int64_t Load() const { return in_flight + static_cast<int64_t>(waiting.size()); }
  void LoadChanging(Clock::time_point now) {
    load_area_ms += static_cast<double>(Load()) *
                    std::chrono::duration<double, std::milli>(now - load_last_change).count();
    load_last_change = now;
  }
};

struct PooledConnection {
  std::unique_ptr<tcp::socket> socket;
  Clock::time_point idle_since;
};

class ClientSession;

}  // namespace

struct Gateway::Impl {
  explicit Impl(GatewayOptions gateway_options)
      : options(std::move(gateway_options)),
        blocking(2),
        ioc(std::max(1, options.io_threads)),
        acceptor(MakeSerial()),
        scrape_strand(MakeSerial()),
        scrape_timer(scrape_strand) {}

  Serial MakeSerial() {
    if (options.io_threads <= 1) return ioc.get_executor();
    return asio::make_strand(ioc);
  }
  void Accept();
  void Forget(uint64_t id);
  void ScrapeTick();
  // Prometheus text of every deployment's counters; takes the lock.
  std::string MetricsTextLocked() const;
  // Counts a new client connection against the limits: its session id, or nothing with why
  // (empty when the client is gone already).
  std::optional<uint64_t> Admit(const std::string& client, std::string& refusal);

  // Pool of idle keep-alive connections to replicas, by "host:port".
  std::unique_ptr<tcp::socket> TakeIdle(const std::string& address) {
    std::lock_guard lock(pool_mutex);
    auto found = pool.find(address);
    if (found == pool.end()) return nullptr;
    const auto now = Clock::now();
    while (!found->second.empty()) {
      PooledConnection connection = std::move(found->second.back());
      found->second.pop_back();
      if (now - connection.idle_since < options.idle_timeout) return std::move(connection.socket);
    }
    return nullptr;
  }
  void GiveIdle(const std::string& address, std::unique_ptr<tcp::socket> socket) {
    std::lock_guard lock(pool_mutex);
    if (stopping) return;
    auto& idle = pool[address];
    // Oldest first out when the pool of one replica grows past what any burst needs.
    if (idle.size() >= 256) idle.erase(idle.begin());
    idle.push_back({std::move(socket), Clock::now()});
    ++pooled_total;
  }

  const GatewayOptions options;
  std::atomic<bool> stopping{false};

  // Routes, per-deployment and per-endpoint state, metrics.
  mutable std::mutex mutex;
  std::map<std::string, DeploymentState> deployments;
  std::map<std::string, EndpointHealth> endpoints;  // by EndpointKey
  std::mt19937_64 random{std::random_device{}()};
  DemandCallback on_demand;
  std::map<std::string, CachedCaller> token_cache;
  uint64_t accepted_connections = 0;
  uint64_t upstream_connections_opened = 0;

  std::mutex pool_mutex;
  std::map<std::string, std::vector<PooledConnection>> pool;
  uint64_t pooled_total = 0;

  std::mutex sessions_mutex;
  std::condition_variable sessions_gone;
  // Open client connections by id: their session (once started) and the client's address.
  struct Tracked {
    std::weak_ptr<ClientSession> session;
    std::string client;
  };
  std::map<uint64_t, Tracked> sessions;
  std::map<std::string, size_t> connections_by_client;
  uint64_t next_session_id = 0;
  size_t max_connections = 0;  // resolved at start
  // Under `mutex`, for /metrics.
  uint64_t refused_client_limit = 0;
  uint64_t refused_connection_limit = 0;
  std::atomic<size_t> open_connections{0};
  bool stop_called = false;

  // For the blocking calls: verify_token and the demand callback.
  asio::thread_pool blocking;
  // Declared after what sessions touch when they are destroyed with the io_context.
  asio::io_context ioc;
  tcp::acceptor acceptor;
  Serial scrape_strand;
  asio::steady_timer scrape_timer;
  tcp::endpoint endpoint;
  std::vector<std::thread> threads;
};

namespace {

using Impl = Gateway::Impl;

// Opens a connection to a replica (or takes an idle one from the pool) within the connect
// timeout; the callback runs on `strand`.
class Connector : public std::enable_shared_from_this<Connector> {
 public:
  using Done = std::function<void(beast::error_code, std::unique_ptr<tcp::socket>, bool reused)>;
  Connector(Impl& gateway, Serial strand, std::string host, uint16_t port, bool allow_reuse,
            Done done)
      : gateway_(gateway),
        strand_(strand),
        resolver_(strand),
        timer_(strand),
        host_(std::move(host)),
        port_(port),
        allow_reuse_(allow_reuse),
        done_(std::move(done)) {}

  void Start() {
    asio::dispatch(strand_, [self = shared_from_this()] { self->Begin(); });
  }
  void Cancel() {
    asio::dispatch(strand_, [self = shared_from_this()] {
      self->cancelled_ = true;
      self->resolver_.cancel();
      beast::error_code ignored;
      if (self->socket_) self->socket_->close(ignored);
    });
  }

 private:
  void Begin() {
    if (allow_reuse_) {
      if (auto idle = gateway_.TakeIdle(AddressKey(host_, port_)))
        return Finish({}, std::move(idle), true);
    }
    timer_.expires_after(gateway_.options.connect_timeout);
    timer_.async_wait([self = shared_from_this()](beast::error_code error) {
      if (error) return;
      self->timed_out_ = true;
      self->resolver_.cancel();
      beast::error_code ignored;
      if (self->socket_) self->socket_->close(ignored);
    });
    resolver_.async_resolve(host_, std::to_string(port_),
                            asio::bind_executor(strand_, [self = shared_from_this()](
                                                             beast::error_code error,
                                                             tcp::resolver::results_type results) {
                              self->OnResolved(error, std::move(results));
                            }));
  }

  void OnResolved(beast::error_code error, tcp::resolver::results_type results) {
    if (error || cancelled_ || timed_out_) return Finish(Why(error), nullptr, false);
    socket_ = std::make_unique<tcp::socket>(gateway_.ioc);
    asio::async_connect(
        *socket_, results,
        asio::bind_executor(strand_, [self = shared_from_this()](beast::error_code connect_error,
                                                                 const tcp::endpoint&) {
          self->OnConnected(connect_error);
        }));
  }

  void OnConnected(beast::error_code error) {
    if (error || cancelled_ || timed_out_) return Finish(Why(error), nullptr, false);
    beast::error_code ignored;
    socket_->set_option(tcp::no_delay(true), ignored);
    {
      std::lock_guard lock(gateway_.mutex);
      ++gateway_.upstream_connections_opened;
    }
    Finish({}, std::move(socket_), false);
  }

  beast::error_code Why(beast::error_code error) const {
    if (timed_out_) return asio::error::timed_out;
    if (cancelled_) return asio::error::operation_aborted;
    return error ? error : asio::error::not_connected;
  }

  void Finish(beast::error_code error, std::unique_ptr<tcp::socket> socket, bool reused) {
    timer_.cancel();
    if (!done_) return;
    Done done = std::move(done_);
    done_ = nullptr;
    done(error, std::move(socket), reused);
  }

  Impl& gateway_;
  Serial strand_;
  tcp::resolver resolver_;
  asio::steady_timer timer_;
  std::string host_;
  uint16_t port_;
  bool allow_reuse_;
  Done done_;
  std::unique_ptr<tcp::socket> socket_;
  bool cancelled_ = false;
  bool timed_out_ = false;
};

// One client connection. All its handlers, those of its upstream exchange included, run on its
// strand.
class ClientSession : public std::enable_shared_from_this<ClientSession> {
 public:
  ClientSession(tcp::socket socket, Serial strand, Impl& gateway, uint64_t id)
      : client_(std::move(socket)),
        strand_(std::move(strand)),
        gateway_(gateway),
        id_(id),
        timer_(strand_),
        wait_timer_(strand_) {}
  ~ClientSession() { gateway_.Forget(id_); }

  void Start() {
    asio::dispatch(client_.get_executor(), [self = shared_from_this()] {
      // The client watch reads without waiting (WatchClient); Asio's own operations are alike
      // either way.
      beast::error_code ignored;
      self->client_.socket().non_blocking(true, ignored);
      self->ReadHeader();
    });
  }

  // From Stop(): an idle connection is closed now, a busy one after its answer.
  void Shutdown() {
    asio::post(client_.get_executor(), [self = shared_from_this()] {
      beast::error_code ignored;
      if (self->idle_) self->client_.socket().cancel(ignored);
    });
  }

 private:
  // The strand client_ was accepted on: every handler below runs on it.
  Serial Exec() { return strand_; }

  void ReadHeader() {
    if (gateway_.stopping) return Close();
    parser_.emplace();
    parser_->body_limit(gateway_.options.max_body_bytes);
    parser_->header_limit(static_cast<uint32_t>(gateway_.options.max_header_bytes));
    client_.expires_after(gateway_.options.idle_timeout);
    idle_ = buffer_.size() == 0;
    // A request already here (read by the client watch, or pipelined) is parsed at once:
    // async_read_header would end with a zero-byte read of the socket to post its completion,
    // a system call (EAGAIN) and a trip through the scheduler each request.
    if (!idle_) {
      beast::error_code error;
      const size_t used = parser_->put(buffer_.data(), error);
      buffer_.consume(used);
      // need_more: the rest of the header is still to come, read into the same parser.
      if (error != http::error::need_more) return OnHeader(error, used);
    }
    http::async_read_header(
        client_, buffer_, *parser_,
        beast::bind_front_handler(&ClientSession::OnHeader, shared_from_this()));
  }

  void OnHeader(beast::error_code error, size_t) {
    idle_ = false;
    if (error) return OnReadError(error);
    const auto& header = parser_->get();
    started_ = Clock::now();
    method_ = header.method();
    version_ = header.version();
    keep_alive_ = header.keep_alive();
    target_ = std::string(header.target());
    std::map<std::string, std::string> query;
    if (!net::SplitTarget(target_, path_, query))
      return SendError(400, "malformed percent-encoding in the request target");
    openai_ = path_.rfind("/v1/", 0) == 0 || path_ == "/v1";
    deployment_.clear();
    unknown_deployment_ = false;
    streaming_ = false;
    stream_parser_.reset();
    forward_target_ = target_;
    model_.clear();
    prompt_.clear();

    // An explicit deployment: a /d/NAME/ prefix or the Host.
    if (path_.rfind("/d/", 0) == 0) {
      const size_t end = path_.find('/', 3);
      deployment_ = path_.substr(3, end == std::string::npos ? std::string::npos : end - 3);
      // The raw target keeps its query and escapes: cut "/d/NAME" from it.
      const std::string raw_prefix = "/d/" + deployment_;
      std::string rest = target_.rfind(raw_prefix, 0) == 0 ? target_.substr(raw_prefix.size())
                                                           : target_.substr(target_.find('/', 3));
      if (rest.empty() || rest.front() != '/') rest.insert(rest.begin(), '/');
      forward_target_ = std::move(rest);
      // Unknown is answered after the token check, as another team's is: whether a name
      // exists is not told to callers without a token.
      unknown_deployment_ = deployment_.empty() || !KnownDeployment(deployment_);
    } else {
      std::string host(header[http::field::host]);
      if (const size_t colon = host.rfind(':');
          colon != std::string::npos && host.find(']') == std::string::npos)
        host.resize(colon);
      if (!host.empty() && KnownDeployment(host)) {
        deployment_ = host;
      } else if (const size_t dot = host.find('.'); dot != std::string::npos) {
        if (KnownDeployment(host.substr(0, dot))) deployment_ = host.substr(0, dot);
      }
    }
    if (deployment_.empty() && method_ == http::verb::get && path_ == "/healthz")
      return SendLocal(200, "ok\n", "text/plain; charset=utf-8");
    Authenticate();
  }

  bool KnownDeployment(const std::string& name) {
    std::lock_guard lock(gateway_.mutex);
    const auto found = gateway_.deployments.find(name);
    return found != gateway_.deployments.end() && found->second.present;
  }

  void Authenticate() {
    if (gateway_.options.auth_disabled) {
      caller_ = Caller{"", "", true};
      return OnCaller();
    }
    const std::string authorization(parser_->get()[http::field::authorization]);
    constexpr std::string_view kBearer = "Bearer ";
    if (authorization.size() <= kBearer.size() ||
        !beast::iequals(authorization.substr(0, kBearer.size()), kBearer))
      return SendError(401, "missing bearer token (Authorization: Bearer TOKEN)");
    std::string token = authorization.substr(kBearer.size());
    bool cached = false;
    {
      std::lock_guard lock(gateway_.mutex);
      const auto found = gateway_.token_cache.find(token);
      if (found != gateway_.token_cache.end() && found->second.expires > Clock::now()) {
        caller_ = found->second.caller;
        cached = true;
      }
    }
    if (cached) return OnCaller();
    // verify_token may block (it may ask the control plane): off the io threads.
    asio::post(gateway_.blocking, [self = shared_from_this(), token = std::move(token)] {
      std::optional<Caller> caller;
      try {
        caller = self->gateway_.options.verify_token(token);
      } catch (...) {
        caller.reset();
      }
      {
        std::lock_guard lock(self->gateway_.mutex);
        auto& cache = self->gateway_.token_cache;
        const auto now = Clock::now();
        if (cache.size() > 10000)
          std::erase_if(cache, [&](const auto& entry) { return entry.second.expires <= now; });
        cache[token] = {caller, now + (caller ? self->gateway_.options.token_cache_ttl
                                              : self->gateway_.options.negative_token_cache_ttl)};
      }
      asio::post(self->Exec(), [self, caller] {
        self->caller_ = caller;
        self->OnCaller();
      });
    });
  }

  void OnCaller() {
    if (!caller_) return SendError(401, "invalid or expired token");
    if (unknown_deployment_) return SendError(404, fmt::format("no deployment '{}'", deployment_));
    // The metrics name every team's deployments: an admin's (Prometheus's) token only.
    if (deployment_.empty() && method_ == http::verb::get && path_ == "/metrics") {
      if (!caller_->admin) return SendError(403, "the gateway's metrics need an admin token");
      return SendLocal(200, gateway_.MetricsTextLocked(), "text/plain; version=0.0.4");
    }
    if (deployment_.empty() && method_ == http::verb::get && path_ == "/v1/models")
      return SendLocal(200, ModelList(), "application/json");
    if (!deployment_.empty() && !Visible(deployment_))
      return SendError(404, fmt::format("no deployment '{}'", deployment_));
    const bool model_routed = method_ == http::verb::post &&
                              (path_ == "/v1/completions" || path_ == "/v1/chat/completions");
    if (deployment_.empty() && !model_routed)
      return SendError(404, fmt::format("no deployment serves {} (route by Host, /d/NAME/ or the "
                                        "model field of /v1/completions and /v1/chat/completions)",
                                        path_));
    ReadBody();
  }

  bool Visible(const std::string& deployment) {
    if (caller_->admin) return true;
    std::lock_guard lock(gateway_.mutex);
    const auto found = gateway_.deployments.find(deployment);
    return found != gateway_.deployments.end() && found->second.route.team == caller_->team;
  }

  std::string ModelList() {
    nlohmann::json data = nlohmann::json::array();
    std::lock_guard lock(gateway_.mutex);
    for (const auto& [name, state] : gateway_.deployments) {
      if (!state.present || (!caller_->admin && state.route.team != caller_->team)) continue;
      std::set<std::string> names{name};
      names.insert(state.route.model_names.begin(), state.route.model_names.end());
      for (const std::string& model : names)
        data.push_back({{"id", model},
                        {"object", "model"},
                        {"created", 0},
                        {"owned_by", state.route.team},
                        {"deployment", name}});
    }
    return nlohmann::json{{"object", "list"}, {"data", data}}.dump() + "\n";
  }

  void ReadBody() {
    // A large or chunked body for a deployment routed without it is streamed through instead of
    // held: llm routes need the prompt for the picker, so theirs is always read first.
    const auto& header = parser_->get();
    streaming_ = !deployment_.empty() && !IsLlm(deployment_) &&
                 (header.chunked() || parser_->content_length().value_or(0) > kHeldBodyBytes);
    if (beast::iequals(parser_->get()[http::field::expect], "100-continue")) {
      continue_.emplace(http::status::continue_, version_);
      http::async_write(client_, *continue_,
                        [self = shared_from_this()](beast::error_code error, size_t) {
                          if (error) return self->Close();
                          self->ReadBodyNow();
                        });
      return;
    }
    ReadBodyNow();
  }

  void ReadBodyNow() {
    if (streaming_) {
      request_ = {};
      request_.base() = parser_->get().base();
      stream_parser_.emplace(std::move(*parser_));
      parser_.reset();
      stream_parser_->body_limit(gateway_.options.max_body_bytes);
      return BeginExchange();
    }
    // The body's bytes already read with the header go in now, as above.
    parser_->eager(true);
    while (!parser_->is_done() && buffer_.size() > 0) {
      beast::error_code error;
      const size_t used = parser_->put(buffer_.data(), error);
      buffer_.consume(used);
      if (error == http::error::need_more) break;
      if (error) return OnBody(error, 0);
      if (used == 0) break;
    }
    if (parser_->is_done()) return OnBody({}, 0);
    client_.expires_after(gateway_.options.idle_timeout);
    http::async_read(client_, buffer_, *parser_,
                     beast::bind_front_handler(&ClientSession::OnBody, shared_from_this()));
  }

  void OnBody(beast::error_code error, size_t) {
    if (error) return OnReadError(error);
    client_.expires_never();
    request_ = parser_->release();
    parser_.reset();
    if (deployment_.empty() || IsLlm(deployment_)) {
      nlohmann::json body = nlohmann::json::parse(request_.body(), nullptr, false);
      if (deployment_.empty()) {
        if (body.is_discarded() || !body.is_object())
          return SendError(400, "the request body is not a JSON object");
        const auto model = body.find("model");
        if (model == body.end() || !model->is_string() || model->get<std::string>().empty())
          return SendError(400, "the request names no model (the \"model\" field)");
        model_ = model->get<std::string>();
        deployment_ = DeploymentOfModel(model_);
        if (deployment_.empty()) return SendError(404, fmt::format("no model '{}'", model_));
      } else if (body.is_object()) {
        if (auto model = body.find("model"); model != body.end() && model->is_string())
          model_ = model->get<std::string>();
      }
      if (body.is_object()) prompt_ = PromptOf(body);
    }
    BeginExchange();
  }

  void BeginExchange() {
    client_.expires_never();  // the exchange's own timers apply from here
    {
      std::lock_guard lock(gateway_.mutex);
      auto& state = gateway_.deployments[deployment_];
      const auto now = Clock::now();
      state.LoadChanging(now);
      ++state.arrivals;
    }
    tried_.clear();
    attempts_ = 0;
    client_gone_ = false;
    reply_status_ = 0;
    response_started_ = false;
    force_new_connection_ = false;
    stream_started_ = false;
    // While a body is still to be read from the client, reading it is the watch.
    if (!streaming_) WatchClient();
    Forward();
  }

  bool IsLlm(const std::string& deployment) {
    std::lock_guard lock(gateway_.mutex);
    const auto found = gateway_.deployments.find(deployment);
    return found != gateway_.deployments.end() && found->second.route.llm;
  }

  // The deployment serving `model` the caller may see: its own team's first.
  std::string DeploymentOfModel(const std::string& model) {
    std::lock_guard lock(gateway_.mutex);
    std::string other_team;
    for (const auto& [name, state] : gateway_.deployments) {
      if (!state.present) continue;
      const auto& names = state.route.model_names;
      if (name != model && std::find(names.begin(), names.end(), model) == names.end()) continue;
      if (state.route.team == caller_->team) return name;
      if (caller_->admin && other_team.empty()) other_team = name;
    }
    return other_team;
  }

  // Watches the client while its request is served: a client that leaves cancels the upstream
  // request (its connection is closed, so the replica stops working on it).
  void WatchClient() {
    if (buffer_.size() > 0) return;  // a pipelined request is already here
    watching_ = true;
    // A wait, then a read of what came: a read started now would first try the socket (Asio
    // reads speculatively), an EAGAIN each request, as the client sends nothing while it waits.
    client_.socket().async_wait(
        tcp::socket::wait_read, [self = shared_from_this()](beast::error_code error) {
          self->watching_ = false;
          size_t bytes = 0;
          if (!error) {
            // Non-blocking (set at the session's start): readable means data, an end or an error.
            bytes = self->client_.socket().read_some(self->buffer_.prepare(1024), error);
            self->buffer_.commit(bytes);
          }
          if (self->exchange_done_) return self->AfterExchange();
          if (error == asio::error::would_block) return self->WatchClient();
          if (error && bytes == 0) self->ClientGone();
        });
  }

  void ClientGone() {
    client_gone_ = true;
    if (waiter_) {
      bool removed = false;
      {
        std::lock_guard lock(gateway_.mutex);
        if (!waiter_->done) {
          waiter_->done = true;
          auto& state = gateway_.deployments[deployment_];
          state.LoadChanging(Clock::now());
          std::erase(state.waiting, waiter_);
          removed = true;
        }
      }
      if (removed) {
        waiter_.reset();
        wait_timer_.cancel();
        reply_status_ = kClientClosedStatus;
        return Finished(false);
      }
    }
    AbortUpstream();
  }

  void AbortUpstream() {
    DisarmTimer();
    if (auto connector = connector_.lock()) connector->Cancel();
    beast::error_code ignored;
    if (upstream_) upstream_->close(ignored);
  }

  struct Choice {
    Endpoint endpoint;
    std::string key;      // EndpointKey
    std::string address;  // AddressKey: the pool's
  };

  // The endpoint for the next attempt; nothing and `buffer` when the deployment has no ready
  // endpoint at all.
  std::optional<Choice> Choose(bool& buffer) {
    std::lock_guard lock(gateway_.mutex);
    buffer = false;
    auto& state = gateway_.deployments[deployment_];
    const auto now = Clock::now();
    const std::vector<Endpoint>& endpoints = state.route.endpoints;
    const auto healthy = [&](size_t i) {
      const auto found = gateway_.endpoints.find(state.endpoint_keys[i]);
      return found == gateway_.endpoints.end() || found->second.ejected_until <= now;
    };
    bool any_ready = false;
    bool any_healthy = false;
    for (size_t i = 0; i < endpoints.size() && !any_healthy; ++i) {
      if (endpoints[i].draining) continue;
      any_ready = true;
      any_healthy = healthy(i);
    }
    if (!any_ready) {
      buffer = tried_.empty();
      return std::nullopt;
    }
    // The ready ones not ejected; all ready ones when every one is: better to try them than to
    // refuse everyone (Envoy's panic mode). Then those not tried for this request yet.
    std::vector<size_t> candidates;
    candidates.reserve(endpoints.size());
    for (size_t i = 0; i < endpoints.size(); ++i) {
      if (endpoints[i].draining || (any_healthy && !healthy(i))) continue;
      if (!tried_.empty() && tried_.count(state.endpoint_keys[i])) continue;
      candidates.push_back(i);
    }
    if (candidates.empty()) return std::nullopt;

    std::vector<serving::EndpointState> states;
    states.reserve(candidates.size());
    for (const size_t i : candidates) {
      serving::EndpointState endpoint_state;
      endpoint_state.id = endpoints[i].id;
      const auto& health = gateway_.endpoints[state.endpoint_keys[i]];
      endpoint_state.in_flight = health.in_flight;
      endpoint_state.metrics = health.metrics;
      states.push_back(std::move(endpoint_state));
    }
    serving::PickerConfig config = gateway_.options.picker;
    if (state.route.policy) config.policy = *state.route.policy;
    if (state.route.llm) config.policy = serving::RoutingPolicy::kEndpointPicker;
    serving::PickRequest request;
    request.model = model_.empty() ? deployment_ : model_;
    if (!model_.empty() && model_ != deployment_ &&
        (state.route.model_names.empty() || model_ != state.route.model_names.front()))
      request.adapter = model_;
    request.prompt = prompt_;
    const TimeMs now_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
    const serving::Pick pick =
        serving::ChooseEndpoint(state.picker, states, request, config, now_ms, gateway_.random());
    const size_t chosen = candidates[pick.index];
    serving::RecordPick(state.picker, pick, endpoints[chosen].id, config);
    Choice choice{endpoints[chosen], state.endpoint_keys[chosen], state.address_keys[chosen]};
    state.LoadChanging(now);
    ++state.in_flight;
    EndpointHealth& health = gateway_.endpoints[choice.key];
    health.deployment = deployment_;
    health.id = endpoints[chosen].id;
    ++health.in_flight;
    return choice;
  }

  void Forward() {
    if (client_gone_) {
      reply_status_ = kClientClosedStatus;
      return Finished(false);
    }
    bool buffer = false;
    std::optional<Choice> choice = Choose(buffer);
    if (!choice) {
      if (buffer) return Buffer();
      return Fail(502, last_error_.empty()
                           ? fmt::format("no replica of deployment '{}' is available", deployment_)
                           : fmt::format("no replica of deployment '{}' answered: {}", deployment_,
                                         last_error_));
    }
    choice_ = std::move(*choice);
    counted_in_flight_ = true;
    ++attempts_;
    Connect();
  }

  void Connect() {
    const bool allow_reuse = !force_new_connection_ && !streaming_;
    // A pooled connection needs no connector (its resolver, timer and callback cost more than
    // the rest of a proxied request's bookkeeping): taken here, on the strand, as
    // Connector::Begin would.
    if (allow_reuse) {
      if (auto idle = gateway_.TakeIdle(choice_.address))
        return OnConnected({}, std::move(idle), true);
    }
    auto self = shared_from_this();
    auto connector = std::make_shared<Connector>(
        gateway_, Exec(), choice_.endpoint.host, choice_.endpoint.port, allow_reuse,
        [self](beast::error_code error, std::unique_ptr<tcp::socket> socket, bool reused) {
          self->connector_.reset();
          self->OnConnected(error, std::move(socket), reused);
        });
    connector_ = connector;
    connector->Start();
  }

  void OnConnected(beast::error_code error, std::unique_ptr<tcp::socket> socket, bool reused) {
    if (client_gone_) {
      ReleaseInFlight();
      reply_status_ = kClientClosedStatus;
      return Finished(false);
    }
    if (error) return AttemptFailed("connect", error.message(), true);
    upstream_ = std::move(socket);
    reused_ = reused;
    upstream_buffer_.clear();
    if (peer_address_.empty()) {
      beast::error_code ignored;
      const auto peer = client_.socket().remote_endpoint(ignored);
      peer_address_ = ignored ? "unknown" : peer.address().to_string();
    }
    // The request as it goes to the replica: the target without /d/NAME, no hop-by-hop
    // headers, and not the caller's gpufleet token.
    if (streaming_) {
      upstream_request_ = {};
      upstream_request_.base() = request_.base();
      upstream_request_.target(forward_target_);
      upstream_request_.version(11);
      for (const http::field field : kNotForwarded)
        upstream_request_.erase(field);
      upstream_request_.set(kForwardedFor, peer_address_);
      upstream_request_.set(kDeploymentHeader, deployment_);
      upstream_request_.keep_alive(true);
      return SendStreamedRequest();
    }
    // A held body: header and body go as one gather write, the header as one piece of text
    // (Beast's serializer makes a buffer of each field and walking those views costs more than
    // the copy). What it writes: the fields as Beast's set() and prepare_payload() leave them.
    std::string& head = upstream_head_;
    head.clear();
    head.append(Std(request_.method_string())).append(" ").append(forward_target_);
    head.append(" HTTP/1.1\r\n");
    for (const auto& field : request_.base()) {
      if (std::find(kNotForwarded.begin(), kNotForwarded.end(), field.name()) !=
              kNotForwarded.end() ||
          beast::iequals(field.name_string(), kForwardedFor) ||
          beast::iequals(field.name_string(), kDeploymentHeader))
        continue;
      AppendField(head, Std(field.name_string()), Std(field.value()));
    }
    AppendField(head, kForwardedFor, peer_address_);
    AppendField(head, kDeploymentHeader, deployment_);
    // Where Beast's prepare_payload would put one (an empty PATCH goes without).
    if (!request_.body().empty() || method_ == http::verb::post || method_ == http::verb::put)
      AppendField(head, "Content-Length", std::to_string(request_.body().size()));
    head.append("\r\n");
    ArmTimer(gateway_.options.request_timeout);
    const std::array<asio::const_buffer, 2> pieces{asio::buffer(head),
                                                   asio::buffer(request_.body())};
    asio::async_write(
        *upstream_, pieces,
        asio::bind_executor(
            Exec(), beast::bind_front_handler(&ClientSession::OnRequestSent, shared_from_this())));
  }

  // The request's header, then its body as it comes from the client, piece by piece. Past the
  // header nothing can be retried: the body is not kept.
  void SendStreamedRequest() {
    streamed_request_ = {};
    streamed_request_.base() = upstream_request_.base();
    const auto& client_header = stream_parser_->get();
    if (client_header.chunked())
      streamed_request_.chunked(true);
    else if (auto length = stream_parser_->content_length())
      streamed_request_.content_length(*length);
    streamed_request_.body().data = nullptr;
    streamed_request_.body().size = 0;
    streamed_request_.body().more = !stream_parser_->is_done();
    request_serializer_.emplace(streamed_request_);
    StreamWrite();
  }

  void StreamWrite() {
    ArmTimer(gateway_.options.idle_timeout);
    http::async_write(
        *upstream_, *request_serializer_,
        asio::bind_executor(Exec(), [self = shared_from_this()](beast::error_code error, size_t) {
          if (error == http::error::need_buffer) error = {};
          self->OnStreamWritten(error);
        }));
  }

  void OnStreamWritten(beast::error_code error) {
    if (client_gone_) return UpstreamDone(false);
    if (error) {
      keep_alive_ = false;  // the rest of the body is unread
      if (!stream_started_) return BeforeResponseFailed(error);
      CountUpstreamError("reset");
      RecordFailure();
      CloseUpstream();
      ReleaseInFlight();
      return Fail(502, fmt::format("replica {} of deployment '{}' failed while receiving the "
                                   "request body: {}",
                                   choice_.endpoint.id, deployment_, error.message()));
    }
    if (request_serializer_->is_done()) {
      WatchClient();
      return OnRequestSent({}, 0);
    }
    stream_started_ = true;
    stream_parser_->get().body().data = relay_buffer_;
    stream_parser_->get().body().size = sizeof relay_buffer_;
    ArmTimer(gateway_.options.idle_timeout);
    http::async_read_some(client_, buffer_, *stream_parser_,
                          [self = shared_from_this()](beast::error_code read_error, size_t) {
                            if (read_error == http::error::need_buffer) read_error = {};
                            self->OnStreamRead(read_error);
                          });
  }

  void OnStreamRead(beast::error_code error) {
    if (error) {
      keep_alive_ = false;
      CloseUpstream();
      ReleaseInFlight();
      if (error == http::error::body_limit)
        return Fail(
            413, fmt::format("request body larger than {} bytes", gateway_.options.max_body_bytes));
      client_gone_ = true;
      return UpstreamDone(false);
    }
    const size_t got = sizeof relay_buffer_ - stream_parser_->get().body().size;
    streamed_request_.body().data = got > 0 ? relay_buffer_ : nullptr;
    streamed_request_.body().size = got;
    streamed_request_.body().more = !stream_parser_->is_done();
    StreamWrite();
  }

  // The upstream's deadline, moved at every step of an exchange (several a request). One wait
  // stays pending and is re-armed only when it fires before the deadline that was moved on
  // meanwhile, or when a deadline comes before it: moving a time point is cheaper than
  // cancelling and re-arming the timer, which runs the cancelled wait's handler each time.
  void ArmTimer(std::chrono::milliseconds after) {
    timed_out_ = false;
    deadline_ = Clock::now() + after;
    timer_armed_ = true;
    if (timer_waiting_ && timer_.expiry() <= deadline_) return;
    WaitForDeadline();
  }

  // Lazily: a pending wait that fires finds nothing armed.
  void DisarmTimer() { timer_armed_ = false; }

  void WaitForDeadline() {
    timer_.expires_at(deadline_);  // a pending wait ends with operation_aborted
    timer_waiting_ = true;
    // A handler already queued when the wait was replaced must not act: it checks the
    // generation it was started in. Weak: a wait left pending does not keep the session.
    const uint64_t generation = ++timer_generation_;
    timer_.async_wait([weak = weak_from_this(), generation](beast::error_code error) {
      const auto self = weak.lock();
      if (!self || generation != self->timer_generation_) return;
      self->timer_waiting_ = false;
      if (error || !self->timer_armed_) return;
      if (Clock::now() < self->deadline_) return self->WaitForDeadline();
      self->timer_armed_ = false;
      self->timed_out_ = true;
      beast::error_code ignored;
      if (self->upstream_) self->upstream_->close(ignored);
      // A client that stopped reading the answer holds it no longer than the idle timeout.
      if (self->response_started_) self->client_.socket().cancel(ignored);
    });
  }

  void OnRequestSent(beast::error_code error, size_t) {
    if (client_gone_) return UpstreamDone(false);
    if (error) return BeforeResponseFailed(error);
    upstream_parser_.emplace();
    upstream_parser_->body_limit(std::numeric_limits<uint64_t>::max());
    upstream_parser_->header_limit(static_cast<uint32_t>(kUpstreamHeaderLimit));
    if (method_ == http::verb::head) upstream_parser_->skip(true);
    http::async_read_header(
        *upstream_, upstream_buffer_, *upstream_parser_,
        asio::bind_executor(Exec(), beast::bind_front_handler(&ClientSession::OnResponseHeader,
                                                              shared_from_this())));
  }

  void BeforeResponseFailed(beast::error_code error) {
    if (client_gone_) return UpstreamDone(false);
    if (timed_out_) {
      CountUpstreamError("timeout");
      RecordFailure();
      CloseUpstream();
      return Fail(504, fmt::format("replica {} of deployment '{}' did not answer within {} ms",
                                   choice_.endpoint.id, deployment_,
                                   gateway_.options.request_timeout.count()));
    }
    // A pooled connection the replica closed while it sat idle: not the replica's fault, and the
    // request never got there; once more on a new connection.
    if (reused_ && !force_new_connection_) {
      CloseUpstream();
      ReleaseInFlight();
      force_new_connection_ = true;
      return Connect2();
    }
    AttemptFailed("reset", error.message(), true);
  }

  // Connect again to the same endpoint, counting it in flight again.
  void Connect2() {
    {
      std::lock_guard lock(gateway_.mutex);
      auto& state = gateway_.deployments[deployment_];
      state.LoadChanging(Clock::now());
      ++state.in_flight;
      ++gateway_.endpoints[choice_.key].in_flight;
    }
    counted_in_flight_ = true;
    Connect();
  }

  // One replica failed before any byte of an answer: the next one, while retries are left.
  void AttemptFailed(const std::string& kind, const std::string& message, bool retryable) {
    CountUpstreamError(kind);
    RecordFailure();
    CloseUpstream();
    ReleaseInFlight();
    last_error_ = fmt::format("{}: {}", choice_.endpoint.id, message);
    tried_.insert(choice_.key);
    force_new_connection_ = false;
    if (retryable && !stream_started_ && attempts_ <= gateway_.options.retries) {
      {
        std::lock_guard lock(gateway_.mutex);
        ++gateway_.deployments[deployment_].retries;
      }
      return Forward();
    }
    Fail(502, fmt::format("no replica of deployment '{}' answered: {}", deployment_, last_error_));
  }

  void OnResponseHeader(beast::error_code error, size_t) {
    if (error) return BeforeResponseFailed(error);
    const unsigned status = upstream_parser_->get().result_int();
    // An interim answer (100 Continue, 103 Early Hints) is not the answer: read on.
    if (status / 100 == 1 && status != 101) return OnRequestSent({}, 0);
    const bool idempotent = method_ == http::verb::get || method_ == http::verb::head;
    if (status >= 502 && status <= 504) {
      CountUpstreamError(fmt::format("status_{}", status));
      RecordFailure();
      if (idempotent && !streaming_ && status != 504 && attempts_ <= gateway_.options.retries &&
          HasAnotherCandidate()) {
        // The rest of this answer is not wanted: the connection goes with it.
        CloseUpstream();
        ReleaseInFlight();
        tried_.insert(choice_.key);
        last_error_ = fmt::format("{}: answered {}", choice_.endpoint.id, status);
        {
          std::lock_guard lock(gateway_.mutex);
          ++gateway_.deployments[deployment_].retries;
        }
        return Forward();
      }
    } else {
      RecordSuccess();
    }
    StartResponse();
  }

  bool HasAnotherCandidate() {
    std::lock_guard lock(gateway_.mutex);
    const auto& state = gateway_.deployments[deployment_];
    for (size_t i = 0; i < state.route.endpoints.size(); ++i) {
      const std::string& key = state.endpoint_keys[i];
      if (!state.route.endpoints[i].draining && key != choice_.key && !tried_.count(key))
        return true;
    }
    return false;
  }

  void StartResponse() {
    auto& upstream = upstream_parser_->get();
    reply_status_ = static_cast<int>(upstream.result_int());
    event_stream_ =
        upstream[http::field::content_type].find("text/event-stream") != std::string_view::npos;
    const bool upstream_chunked = upstream.chunked();
    const bool upstream_has_length = upstream.has_content_length();
    response_ = {};
    // Moved, not copied: past its header the parser needs only its own flags and the body.
    response_.base() = std::move(upstream.base());
    response_.version(version_);
    for (http::field field :
         {http::field::connection, http::field::keep_alive, http::field::proxy_connection})
      response_.erase(field);
    response_.erase("Keep-Alive");
    bool keep_alive = keep_alive_ && !gateway_.stopping;
    const bool bodiless = method_ == http::verb::head || reply_status_ == 204 ||
                          reply_status_ == 304 || reply_status_ / 100 == 1;
    if (version_ < 11 && upstream_chunked) {
      // HTTP/1.0 has no chunks: the body goes as it is and the close ends it.
      response_.chunked(false);
      keep_alive = false;
    } else if (!bodiless && !upstream_has_length && !upstream_chunked) {
      // The replica ends its body by closing: chunked to an HTTP/1.1 client, close for 1.0.
      if (version_ >= 11)
        response_.chunked(true);
      else
        keep_alive = false;
    }
    response_.keep_alive(keep_alive);
    reply_keep_alive_ = keep_alive;
    first_byte_seen_ = false;
    // A chunked answer goes through Beast's serializer (it makes the chunks); any other is the
    // header as one piece of text, then the body's pieces as they are read.
    serializer_.reset();
    if (response_.chunked()) {
      serializer_.emplace(response_);
    } else {
      response_head_ =
          fmt::format("HTTP/{}.{} {:03d} ", version_ / 10, version_ % 10, response_.result_int());
      const auto reason = response_.reason();
      response_head_.append(reason.empty() ? Std(http::obsolete_reason(response_.result()))
                                           : Std(reason));
      response_head_.append("\r\n");
      AppendFields(response_head_, response_.base());
      response_head_.append("\r\n");
      response_head_unsent_ = true;
    }
    response_started_ = true;
    RelayRead();
  }

  // Relay: each piece of the replica's body is written to the client as soon as it is read
  // (one chunk per piece when chunked), so a stream's events are not held back.
  void RelayRead() {
    if (upstream_parser_->is_done()) {
      PoolUpstreamIfReusable();
      response_.body().data = nullptr;
      response_.body().size = 0;
      response_.body().more = false;
      return RelayWrite();
    }
    upstream_parser_->get().body().data = relay_buffer_;
    upstream_parser_->get().body().size = sizeof relay_buffer_;
    ArmTimer(gateway_.options.idle_timeout);
    http::async_read_some(
        *upstream_, upstream_buffer_, *upstream_parser_,
        asio::bind_executor(
            Exec(), beast::bind_front_handler(&ClientSession::OnRelayRead, shared_from_this())));
  }

  void OnRelayRead(beast::error_code error, size_t) {
    if (error == http::error::need_buffer) error = {};
    if (error) {
      // The replica broke off mid-answer: nothing left to tell the client but a cut connection.
      if (!client_gone_) {
        CountUpstreamError(timed_out_ ? "timeout" : "reset");
        RecordFailure();
      }
      CloseUpstream();
      return UpstreamDone(false);
    }
    // What was read with this piece (a burst of a stream's events, each its own chunk) goes out
    // with it in one write, as nginx does, instead of a write and a read per chunk.
    while (!upstream_parser_->is_done() && upstream_buffer_.size() > 0 &&
           upstream_parser_->get().body().size > 0) {
      beast::error_code put_error;
      const size_t used = upstream_parser_->put(upstream_buffer_.data(), put_error);
      upstream_buffer_.consume(used);
      if (put_error == http::error::need_more || put_error == http::error::need_buffer) break;
      if (put_error) return OnRelayRead(put_error, 0);
      if (used == 0) break;
    }
    const size_t got = sizeof relay_buffer_ - upstream_parser_->get().body().size;
    if (got == 0 && !upstream_parser_->is_done()) return RelayRead();
    if (got > 0 && !first_byte_seen_) {
      first_byte_seen_ = true;
      if (event_stream_) {
        std::lock_guard lock(gateway_.mutex);
        gateway_.deployments[deployment_].time_to_first_byte.Observe(
            Seconds(Clock::now() - started_));
      }
    }
    response_.body().data = got > 0 ? relay_buffer_ : nullptr;
    response_.body().size = got;
    response_.body().more = !upstream_parser_->is_done();
    if (upstream_parser_->is_done()) PoolUpstreamIfReusable();
    RelayWrite();
  }

  void RelayWrite() {
    ArmTimer(gateway_.options.idle_timeout);
    if (!serializer_) {
      std::array<asio::const_buffer, 2> pieces{
          asio::const_buffer(), asio::const_buffer(response_.body().data, response_.body().size)};
      if (response_head_unsent_) pieces[0] = asio::buffer(response_head_);
      response_head_unsent_ = false;
      asio::async_write(
          client_, pieces,
          beast::bind_front_handler(&ClientSession::OnRelayWritten, shared_from_this()));
      return;
    }
    http::async_write(
        client_, *serializer_,
        beast::bind_front_handler(&ClientSession::OnRelayWritten, shared_from_this()));
  }

  void OnRelayWritten(beast::error_code error, size_t) {
    if (error == http::error::need_buffer) error = {};
    if (error || client_gone_) {
      client_gone_ = true;
      CloseUpstream();
      return UpstreamDone(false);
    }
    if (serializer_ ? !serializer_->is_done() : response_.body().more) return RelayRead();
    // The whole answer is out.
    DisarmTimer();
    UpstreamDone(true);
  }

  // Once the replica's answer is read whole, its connection can serve another request: back to
  // the pool before the client has the last bytes, so the client's next request finds it there.
  void PoolUpstreamIfReusable() {
    const bool reusable = upstream_parser_->keep_alive() && !upstream_parser_->need_eof() &&
                          upstream_buffer_.size() == 0;
    if (!reusable || !upstream_) return;
    DisarmTimer();
    gateway_.GiveIdle(choice_.address, std::move(upstream_));
  }

  void CloseUpstream() {
    DisarmTimer();
    if (!upstream_) return;
    beast::error_code ignored;
    upstream_->shutdown(tcp::socket::shutdown_both, ignored);
    upstream_->close(ignored);
    upstream_.reset();
  }

  void UpstreamDone(bool complete) {
    CloseUpstream();
    ReleaseInFlight();
    if (client_gone_ && reply_status_ == 0) reply_status_ = kClientClosedStatus;
    Finished(complete && reply_keep_alive_);
  }

  void ReleaseInFlight() {
    if (!counted_in_flight_) return;
    counted_in_flight_ = false;
    std::lock_guard lock(gateway_.mutex);
    auto& state = gateway_.deployments[deployment_];
    state.LoadChanging(Clock::now());
    --state.in_flight;
    --gateway_.endpoints[choice_.key].in_flight;
  }

  void RecordFailure() {
    std::lock_guard lock(gateway_.mutex);
    auto& health = gateway_.endpoints[choice_.key];
    const auto now = Clock::now();
    if (health.ejected_until > now) return;
    if (++health.consecutive_failures < gateway_.options.eject_after_failures) return;
    health.consecutive_failures = 0;
    ++health.ejections;
    // Ejected for longer each time, up to ten times the base (Envoy's outlier detection).
    health.ejected_until = now + gateway_.options.ejection_time * std::min(health.ejections, 10);
    ++gateway_.deployments[deployment_].ejections;
  }

  void RecordSuccess() {
    std::lock_guard lock(gateway_.mutex);
    gateway_.endpoints[choice_.key].consecutive_failures = 0;
  }

  void CountUpstreamError(const std::string& kind) {
    std::lock_guard lock(gateway_.mutex);
    ++gateway_.deployments[deployment_].upstream_errors[kind];
  }

  // Scale from zero: hold the request until an endpoint is ready, the buffer timeout, or stop.
  void Buffer() {
    Gateway::DemandCallback demand;
    bool full = false;
    {
      std::lock_guard lock(gateway_.mutex);
      auto& state = gateway_.deployments[deployment_];
      full = gateway_.stopping || static_cast<int64_t>(state.waiting.size()) >=
                                      gateway_.options.max_buffered_per_deployment;
      demand = gateway_.on_demand;
    }
    // Full or not, the deployment is wanted: the demand callback hears of it either way (once
    // the request is in the buffer when it is).
    auto tell = [&] {
      if (!demand) return;
      asio::post(gateway_.blocking, [demand, deployment = deployment_] {
        try {
          demand(deployment);
        } catch (...) {
        }
      });
    };
    if (full) {
      tell();
      return FailBusy(
          fmt::format("deployment '{}' has no ready replica and its buffer of {} requests is full",
                      deployment_, gateway_.options.max_buffered_per_deployment));
    }
    bool ready_now = false;
    {
      std::lock_guard lock(gateway_.mutex);
      auto& state = gateway_.deployments[deployment_];
      // Routes may have come between Choose and here: then there is nothing to wait for.
      ready_now = std::any_of(state.route.endpoints.begin(), state.route.endpoints.end(),
                              [](const Endpoint& endpoint) { return !endpoint.draining; });
      if (!ready_now) {
        waiter_ = std::make_shared<Waiter>();
        std::weak_ptr<ClientSession> weak = shared_from_this();
        waiter_->resume = [weak, exec = Exec()] {
          asio::post(exec, [weak] {
            if (auto self = weak.lock()) self->Resume();
          });
        };
        state.LoadChanging(Clock::now());
        state.waiting.push_back(waiter_);
      }
    }
    if (ready_now) return Forward();
    tell();
    wait_timer_.expires_after(gateway_.options.buffer_timeout);
    wait_timer_.async_wait([self = shared_from_this()](beast::error_code error) {
      if (error || !self->waiter_) return;
      {
        std::lock_guard lock(self->gateway_.mutex);
        if (self->waiter_->done) return;
        self->waiter_->done = true;
        auto& state = self->gateway_.deployments[self->deployment_];
        state.LoadChanging(Clock::now());
        std::erase(state.waiting, self->waiter_);
      }
      self->waiter_.reset();
      self->FailBusy(fmt::format("deployment '{}' had no ready replica within {} ms",
                                 self->deployment_, self->gateway_.options.buffer_timeout.count()));
    });
  }

  void Resume() {
    if (!waiter_) return;
    waiter_.reset();
    wait_timer_.cancel();
    if (gateway_.stopping)
      return FailBusy(fmt::format("the gateway is stopping; deployment '{}' had no ready replica",
                                  deployment_));
    Forward();
  }

  void FailBusy(std::string message) {
    Fail(503, std::move(message),
         {{"Retry-After", std::to_string(gateway_.options.retry_after_s)}});
  }

  // A gateway answer to a request whose body was read: the connection stays open.
  void Fail(int status, std::string message, net::HttpHeaders headers = {}) {
    if (client_gone_) {
      reply_status_ = kClientClosedStatus;
      return Finished(false);
    }
    reply_status_ = status;
    local_ = {};
    local_.version(version_);
    local_.result(static_cast<unsigned>(status));
    local_.set(http::field::server, "gpufleet-gateway");
    local_.set(http::field::content_type, "application/json");
    for (const auto& [name, value] : headers)
      local_.set(name, value);
    local_.body() = ErrorBody(openai_, status, message);
    local_.keep_alive(keep_alive_ && !gateway_.stopping);
    local_.prepare_payload();
    http::async_write(client_, local_,
                      [self = shared_from_this()](beast::error_code error, size_t) {
                        self->Finished(!error && self->local_.keep_alive());
                      });
  }

  // The end of one proxied request: metrics, then the next request once the watch is done.
  void Finished(bool keep_going) {
    {
      std::lock_guard lock(gateway_.mutex);
      auto& state = gateway_.deployments[deployment_];
      ++state.requests_by_code[reply_status_];
      state.duration.Observe(Seconds(Clock::now() - started_));
    }
    exchange_done_ = true;
    continue_after_ = keep_going && !client_gone_;
    if (watching_) {
      beast::error_code ignored;
      client_.socket().cancel(ignored);
      return;  // the watch's handler calls AfterExchange
    }
    AfterExchange();
  }

  void AfterExchange() {
    exchange_done_ = false;
    if (!continue_after_) return Close();
    ReadHeader();
  }

  // Answers from the gateway itself before the body was read: the connection closes after them
  // unless the request had no body left to read.
  void SendLocal(int status, std::string body, std::string content_type,
                 net::HttpHeaders headers = {}) {
    local_ = {};
    local_.version(version_);
    local_.result(static_cast<unsigned>(status));
    local_.set(http::field::server, "gpufleet-gateway");
    local_.set(http::field::content_type, content_type);
    for (const auto& [name, value] : headers)
      local_.set(name, value);
    local_.body() = std::move(body);
    const bool body_left = parser_ && !parser_->is_done();
    local_.keep_alive(keep_alive_ && !body_left && !gateway_.stopping);
    local_.prepare_payload();
    client_.expires_after(gateway_.options.idle_timeout);
    http::async_write(client_, local_,
                      [self = shared_from_this(), body_left](beast::error_code error, size_t) {
                        if (error) return self->Close();
                        if (body_left) return self->Linger();
                        if (!self->local_.keep_alive()) return self->Close();
                        self->ReadHeader();
                      });
  }

  void SendError(int status, std::string_view message) {
    SendLocal(status, ErrorBody(openai_, status, message), "application/json");
  }

  void OnReadError(beast::error_code error) {
    if (error == http::error::body_limit)
      return SendError(
          413, fmt::format("request body larger than {} bytes", gateway_.options.max_body_bytes));
    if (error == http::error::header_limit)
      return SendError(431, fmt::format("request header larger than {} bytes",
                                        gateway_.options.max_header_bytes));
    if (error == http::error::end_of_stream || error == http::error::partial_message ||
        error.category() != http::make_error_code(http::error::bad_target).category())
      return Close();
    SendError(400, "malformed HTTP request: " + error.message());
  }

  void Linger() {
    beast::error_code ignored;
    client_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    client_.expires_after(kLingerTime);
    Drain();
  }

  void Drain() {
    client_.async_read_some(asio::buffer(drain_buffer_),
                            [self = shared_from_this()](beast::error_code error, size_t) {
                              if (error) return self->Close();
                              self->Drain();
                            });
  }

  void Close() {
    beast::error_code ignored;
    client_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    client_.socket().close(ignored);
  }

  beast::tcp_stream client_;
  Serial strand_;
  Impl& gateway_;
  const uint64_t id_;
  asio::steady_timer timer_;  // the upstream's deadlines (ArmTimer)
  uint64_t timer_generation_ = 0;
  Clock::time_point deadline_{};
  bool timer_armed_ = false;       // deadline_ applies
  bool timer_waiting_ = false;     // a wait is pending on timer_
  asio::steady_timer wait_timer_;  // the buffer timeout
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::optional<http::response<http::empty_body>> continue_;
  http::request<http::string_body> request_;
  http::request<http::string_body> upstream_request_;  // a streamed request's header
  std::string upstream_head_;                          // a held request's header text, reused
  // A streamed request body: the client's parser and what goes to the replica.
  bool streaming_ = false;
  bool stream_started_ = false;
  std::optional<http::request_parser<http::buffer_body>> stream_parser_;
  http::request<http::buffer_body> streamed_request_;
  std::optional<http::request_serializer<http::buffer_body>> request_serializer_;
  http::response<http::string_body> local_;
  bool idle_ = false;
  bool unknown_deployment_ = false;  // a /d/NAME/ prefix naming no deployment
  std::string peer_address_;         // the client's, for X-Forwarded-For; read once per connection

  // The request in progress.
  Clock::time_point started_;
  http::verb method_ = http::verb::get;
  unsigned version_ = 11;
  bool keep_alive_ = true;
  bool openai_ = false;
  std::string target_, path_, forward_target_;
  std::string deployment_, model_, prompt_;
  std::optional<Caller> caller_;
  std::set<std::string> tried_;
  int attempts_ = 0;
  std::string last_error_;
  Choice choice_;
  bool counted_in_flight_ = false;
  bool force_new_connection_ = false;
  bool reused_ = false;
  bool client_gone_ = false;
  bool watching_ = false;
  bool exchange_done_ = false;
  bool continue_after_ = false;
  bool timed_out_ = false;
  int reply_status_ = 0;
  bool reply_keep_alive_ = false;
  bool response_started_ = false;
  bool event_stream_ = false;
  bool first_byte_seen_ = false;
  std::shared_ptr<Waiter> waiter_;
  // Weak: the connector holds this session until it answers, and its handlers hold it.
  std::weak_ptr<Connector> connector_;
  std::unique_ptr<tcp::socket> upstream_;
  beast::flat_buffer upstream_buffer_;
  std::optional<http::response_parser<http::buffer_body>> upstream_parser_;
  http::response<http::buffer_body> response_;
  std::optional<http::response_serializer<http::buffer_body>> serializer_;  // chunked answers
  std::string response_head_;  // other answers' header text
  bool response_head_unsent_ = false;
  char relay_buffer_[kRelayBufferBytes];
  char drain_buffer_[4096];
};

// One scrape of a replica's /metrics over a pooled connection.
class Scraper : public std::enable_shared_from_this<Scraper> {
 public:
  Scraper(Impl& gateway, std::string key, Endpoint endpoint)
      : gateway_(gateway),
        strand_(gateway.MakeSerial()),
        timer_(strand_),
        key_(std::move(key)),
        endpoint_(std::move(endpoint)) {}

  void Start() {
    // The connector keeps this scraper alive until it answers; it is kept by its own handlers.
    auto self = shared_from_this();
    std::make_shared<Connector>(
        gateway_, strand_, endpoint_.host, endpoint_.port, true,
        [self](beast::error_code error, std::unique_ptr<tcp::socket> socket, bool) {
          if (error) return self->Done(std::nullopt);
          self->socket_ = std::move(socket);
          self->Send();
        })
        ->Start();
  }

 private:
  void Send() {
    request_ = {http::verb::get, "/metrics", 11};
    request_.set(http::field::host, AddressKey(endpoint_.host, endpoint_.port));
    request_.keep_alive(true);
    timer_.expires_after(kScrapeTimeout);
    timer_.async_wait([self = shared_from_this()](beast::error_code error) {
      beast::error_code ignored;
      if (!error && self->socket_) self->socket_->close(ignored);
    });
    http::async_write(
        *socket_, request_,
        asio::bind_executor(strand_, [self = shared_from_this()](beast::error_code error, size_t) {
          if (error) return self->Done(std::nullopt);
          self->parser_.body_limit(kMetricsBodyLimit);
          http::async_read(
              *self->socket_, self->buffer_, self->parser_,
              asio::bind_executor(self->strand_, [self](beast::error_code read_error, size_t) {
                self->OnRead(read_error);
              }));
        }));
  }

  void OnRead(beast::error_code error) {
    timer_.cancel();
    if (error || parser_.get().result_int() != 200) return Done(std::nullopt);
    const TimeMs now =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch())
            .count();
    auto metrics = serving::ParseVllmMetrics(parser_.get().body(), now);
    if (parser_.keep_alive() && buffer_.size() == 0)
      gateway_.GiveIdle(AddressKey(endpoint_.host, endpoint_.port), std::move(socket_));
    Done(std::move(metrics));
  }

  void Done(std::optional<serving::EndpointMetrics> metrics) {
    std::lock_guard lock(gateway_.mutex);
    auto& health = gateway_.endpoints[key_];
    health.scraping = false;
    // A failed scrape keeps the last numbers, which age until the picker stops trusting them.
    if (metrics) health.metrics = std::move(metrics);
  }

  Impl& gateway_;
  Serial strand_;
  asio::steady_timer timer_;
  std::string key_;
  Endpoint endpoint_;
  std::unique_ptr<tcp::socket> socket_;
  http::request<http::empty_body> request_;
  beast::flat_buffer buffer_;
  http::response_parser<http::string_body> parser_;
};

}  // namespace

void Gateway::Impl::Accept() {
  Serial strand = MakeSerial();
  acceptor.async_accept(strand, [this, strand](beast::error_code error, tcp::socket socket) {
    if (stopping || !acceptor.is_open()) return;
    if (!error) {
      beast::error_code ignored;
      const tcp::endpoint peer = socket.remote_endpoint(ignored);
      std::optional<uint64_t> admitted;
      std::string refusal;
      if (!ignored) admitted = Admit(peer.address().to_string(), refusal);
      if (!admitted) {
        if (!refusal.empty())
          net::RefuseConnection(std::move(socket), "application/json",
                                ErrorBody(false, 503, refusal));
        Accept();
        return;
      }
      const uint64_t id = *admitted;
      socket.set_option(tcp::no_delay(true), ignored);
      auto session = std::make_shared<ClientSession>(std::move(socket), strand, *this, id);
      {
        std::lock_guard lock(sessions_mutex);
        sessions[id].session = session;
      }
      {
        std::lock_guard lock(mutex);
        ++accepted_connections;
      }
      session->Start();
    }
    Accept();
  });
}

std::optional<uint64_t> Gateway::Impl::Admit(const std::string& client, std::string& refusal) {
  bool client_limit = false;
  {
    std::lock_guard lock(sessions_mutex);
    size_t& from_client = connections_by_client[client];
    if (sessions.size() >= max_connections) {
      refusal =
          fmt::format("gateway busy: {} connections open, the most it takes", sessions.size());
    } else if (options.max_connections_per_client > 0 &&
               from_client >= options.max_connections_per_client) {
      client_limit = true;
      refusal = fmt::format("too many connections from {}: {} open, the most one client may have",
                            client, from_client);
    } else {
      ++from_client;
      const uint64_t id = next_session_id++;
      sessions.emplace(id, Tracked{{}, client});
      ++open_connections;
      return id;
    }
    if (from_client == 0) connections_by_client.erase(client);
  }
  std::lock_guard lock(mutex);
  ++(client_limit ? refused_client_limit : refused_connection_limit);
  return std::nullopt;
}

void Gateway::Impl::Forget(uint64_t id) {
  std::lock_guard lock(sessions_mutex);
  if (auto tracked = sessions.find(id); tracked != sessions.end()) {
    auto from_client = connections_by_client.find(tracked->second.client);
    if (from_client != connections_by_client.end() && --from_client->second == 0)
      connections_by_client.erase(from_client);
    sessions.erase(tracked);
    --open_connections;
  }
  if (sessions.empty()) sessions_gone.notify_all();
}

void Gateway::Impl::ScrapeTick() {
  if (stopping) return;
  std::vector<std::pair<std::string, Endpoint>> due;
  {
    std::lock_guard lock(mutex);
    for (const auto& [name, state] : deployments) {
      if (!state.present || !state.route.llm) continue;
      for (const Endpoint& replica : state.route.endpoints) {
        const std::string key = EndpointKey(replica);
        auto& health = endpoints[key];
        if (health.scraping) continue;
        health.scraping = true;
        due.emplace_back(key, replica);
      }
    }
  }
  for (auto& [key, replica] : due)
    std::make_shared<Scraper>(*this, key, replica)->Start();
  scrape_timer.expires_after(options.scrape_interval);
  scrape_timer.async_wait([this](beast::error_code error) {
    if (!error) ScrapeTick();
  });
}

std::string Gateway::Impl::MetricsTextLocked() const {
  std::lock_guard lock(mutex);
  std::string out;
  auto family = [&](std::string_view name, std::string_view type, std::string_view help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  auto histogram = [&](std::string_view name, const std::string& labels, const Histogram& h) {
    for (size_t i = 0; i < kDurationBuckets.size(); ++i)
      out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, kDurationBuckets[i],
                         h.counts[i]);
    out += fmt::format("{}_bucket{{{},le=\"+Inf\"}} {}\n", name, labels, h.count);
    out += fmt::format("{}_sum{{{}}} {}\n{}_count{{{}}} {}\n", name, labels, h.sum, name, labels,
                       h.count);
  };
  auto label = [](const std::string& deployment) {
    return fmt::format("deployment=\"{}\"", LabelEscape(deployment));
  };
  family("gpufleet_gateway_requests_total", "counter", "Requests answered, by status code.");
  for (const auto& [name, state] : deployments)
    for (const auto& [code, count] : state.requests_by_code)
      out += fmt::format("gpufleet_gateway_requests_total{{{},code=\"{}\"}} {}\n", label(name),
                         code, count);
  family("gpufleet_gateway_request_duration_seconds", "histogram",
         "From the request's header to the end of its answer.");
  for (const auto& [name, state] : deployments)
    histogram("gpufleet_gateway_request_duration_seconds", label(name), state.duration);
  family("gpufleet_gateway_time_to_first_byte_seconds", "histogram",
         "Streams (text/event-stream): from the request's header to the first body byte (TTFT).");
  for (const auto& [name, state] : deployments)
    histogram("gpufleet_gateway_time_to_first_byte_seconds", label(name), state.time_to_first_byte);
  family("gpufleet_gateway_in_flight", "gauge", "Requests sent to a replica and not answered.");
  for (const auto& [name, state] : deployments)
    out += fmt::format("gpufleet_gateway_in_flight{{{}}} {}\n", label(name), state.in_flight);
  family("gpufleet_gateway_buffered", "gauge", "Requests waiting for a ready replica.");
  for (const auto& [name, state] : deployments)
    out += fmt::format("gpufleet_gateway_buffered{{{}}} {}\n", label(name), state.waiting.size());
  family("gpufleet_gateway_retries_total", "counter", "Attempts on another replica.");
  for (const auto& [name, state] : deployments)
    out += fmt::format("gpufleet_gateway_retries_total{{{}}} {}\n", label(name), state.retries);
  family("gpufleet_gateway_ejections_total", "counter",
         "Replicas left out after repeated failures.");
  for (const auto& [name, state] : deployments)
    out += fmt::format("gpufleet_gateway_ejections_total{{{}}} {}\n", label(name), state.ejections);
  family("gpufleet_gateway_upstream_errors_total", "counter",
         "Replica failures: connect, reset, timeout, status_502/503/504.");
  for (const auto& [name, state] : deployments)
    for (const auto& [kind, count] : state.upstream_errors)
      out += fmt::format("gpufleet_gateway_upstream_errors_total{{{},kind=\"{}\"}} {}\n",
                         label(name), kind, count);
  family("gpufleet_gateway_upstream_connections_opened_total", "counter",
         "New connections to replicas (the rest reuse pooled ones).");
  out += fmt::format("gpufleet_gateway_upstream_connections_opened_total {}\n",
                     upstream_connections_opened);
  family("gpufleet_gateway_client_connections_total", "counter", "Client connections accepted.");
  out += fmt::format("gpufleet_gateway_client_connections_total {}\n", accepted_connections);
  family("gpufleet_gateway_client_connections", "gauge", "Client connections open now.");
  out += fmt::format("gpufleet_gateway_client_connections {}\n", open_connections.load());
  family("gpufleet_gateway_refused_connections_total", "counter",
         "Client connections answered 503 and closed at once, by the limit they hit.");
  out += fmt::format(
      "gpufleet_gateway_refused_connections_total{{reason=\"client_connection_limit\"}} {}\n"
      "gpufleet_gateway_refused_connections_total{{reason=\"connection_limit\"}} {}\n",
      refused_client_limit, refused_connection_limit);
  return out;
}

Gateway::StartResult Gateway::Start(GatewayOptions options) {
  StartResult result;
  if (!options.verify_token && !options.auth_disabled) {
    result.error = "the gateway needs a token verifier unless authentication is disabled";
    return result;
  }
  if (options.verify_token && options.auth_disabled) {
    result.error = "authentication is disabled but a token verifier was given";
    return result;
  }
  auto impl = std::make_shared<Impl>(std::move(options));
  const GatewayOptions& opts = impl->options;
  impl->max_connections =
      opts.max_connections > 0 ? opts.max_connections : net::DefaultMaxConnections();
  auto bound = net::Listen(impl->acceptor, opts.host, opts.port, result.error);
  if (!bound) return result;
  impl->endpoint = *bound;
  impl->Accept();
  asio::post(impl->scrape_strand, [raw = impl.get()] { raw->ScrapeTick(); });
  if (auto error = net::RunIoThreads(impl->ioc, opts.io_threads, impl->threads, "the gateway")) {
    result.error = std::move(*error);
    return result;
  }
  result.gateway.reset(new Gateway(std::move(impl)));
  return result;
}

Gateway::Gateway(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Gateway::~Gateway() {
  Stop();
}

void Gateway::SetRoutes(std::vector<Route> routes) {
  std::vector<std::shared_ptr<Waiter>> wake;
  std::set<std::string> addresses;
  {
    std::lock_guard lock(impl_->mutex);
    const auto now = Clock::now();
    std::set<std::string> named;
    std::set<std::string> endpoint_keys;
    for (Route& route : routes) {
      // The endpoint picker needs the replicas' metrics and the prompt: an llm route, whichever
      // way it was asked for.
      if (route.policy.value_or(impl_->options.picker.policy) ==
          serving::RoutingPolicy::kEndpointPicker)
        route.llm = true;
      named.insert(route.deployment);
      auto& state = impl_->deployments[route.deployment];
      std::set<std::string> ids;
      for (const Endpoint& endpoint : route.endpoints) {
        ids.insert(endpoint.id);
        endpoint_keys.insert(EndpointKey(endpoint));
        addresses.insert(AddressKey(endpoint.host, endpoint.port));
      }
      state.picker.prefixes.RetainOnly(ids);
      state.SetRoute(std::move(route));
      state.present = true;
      const bool ready = std::any_of(state.route.endpoints.begin(), state.route.endpoints.end(),
                                     [](const Endpoint& endpoint) { return !endpoint.draining; });
      if (ready && !state.waiting.empty()) {
        state.LoadChanging(now);
        for (auto& waiter : state.waiting) {
          waiter->done = true;
          wake.push_back(waiter);
        }
        state.waiting.clear();
      }
    }
    for (auto& [name, state] : impl_->deployments) {
      if (named.count(name)) continue;
      state.present = false;
      state.route.endpoints.clear();
      state.endpoint_keys.clear();
      state.address_keys.clear();
    }
    // Endpoints gone and idle keep nothing; those with requests in flight keep their counts.
    std::erase_if(impl_->endpoints, [&](const auto& entry) {
      return !endpoint_keys.count(entry.first) && entry.second.in_flight == 0 &&
             !entry.second.scraping;
    });
  }
  {
    std::lock_guard lock(impl_->pool_mutex);
    std::erase_if(impl_->pool, [&](const auto& entry) { return !addresses.count(entry.first); });
  }
  for (auto& waiter : wake)
    waiter->resume();
}

void Gateway::OnDemand(DemandCallback callback) {
  std::lock_guard lock(impl_->mutex);
  impl_->on_demand = std::move(callback);
}

std::vector<Gateway::DeploymentLoad> Gateway::TakeLoad() {
  std::vector<DeploymentLoad> loads;
  std::lock_guard lock(impl_->mutex);
  const auto now = Clock::now();
  for (auto& [name, state] : impl_->deployments) {
    if (!state.present && state.arrivals == 0 && state.Load() == 0) continue;
    state.LoadChanging(now);
    DeploymentLoad load;
    load.deployment = name;
    const double interval =
        std::chrono::duration<double, std::milli>(now - state.load_interval_start).count();
    load.interval_ms = static_cast<TimeMs>(interval);
    load.concurrency =
        interval > 0 ? state.load_area_ms / interval : static_cast<double>(state.Load());
    load.arrivals = state.arrivals;
    load.buffered = static_cast<int64_t>(state.waiting.size());
    for (const Endpoint& endpoint : state.route.endpoints) {
      const auto found = impl_->endpoints.find(EndpointKey(endpoint));
      load.in_flight_by_endpoint[endpoint.id] =
          found == impl_->endpoints.end() ? 0 : found->second.in_flight;
    }
    for (const auto& [key, health] : impl_->endpoints)
      if (health.deployment == name && health.in_flight > 0)
        load.in_flight_by_endpoint[health.id] = health.in_flight;
    state.load_area_ms = 0;
    state.arrivals = 0;
    state.load_interval_start = now;
    loads.push_back(std::move(load));
  }
  return loads;
}

std::string Gateway::MetricsText() const {
  return impl_->MetricsTextLocked();
}

uint16_t Gateway::port() const {
  return impl_->endpoint.port();
}

std::string Gateway::url() const {
  const auto address = impl_->endpoint.address();
  return address.is_v6() ? fmt::format("http://[{}]:{}", address.to_string(), port())
                         : fmt::format("http://{}:{}", address.to_string(), port());
}

void Gateway::Stop() {
  Impl& gateway = *impl_;
  {
    std::lock_guard lock(gateway.sessions_mutex);
    if (gateway.stop_called) return;
    gateway.stop_called = true;
  }
  gateway.stopping = true;
  asio::post(gateway.acceptor.get_executor(), [&gateway] {
    beast::error_code ignored;
    gateway.acceptor.close(ignored);
  });
  asio::post(gateway.scrape_strand, [&gateway] { gateway.scrape_timer.cancel(); });
  // Buffered requests are answered 503 now: nothing will bring them an endpoint.
  std::vector<std::shared_ptr<Waiter>> wake;
  {
    std::lock_guard lock(gateway.mutex);
    for (auto& [name, state] : gateway.deployments) {
      state.LoadChanging(Clock::now());
      for (auto& waiter : state.waiting) {
        waiter->done = true;
        wake.push_back(waiter);
      }
      state.waiting.clear();
    }
  }
  for (auto& waiter : wake)
    waiter->resume();
  {
    std::lock_guard lock(gateway.pool_mutex);
    gateway.pool.clear();
  }
  std::vector<std::shared_ptr<ClientSession>> live;
  {
    std::lock_guard lock(gateway.sessions_mutex);
    for (const auto& [id, tracked] : gateway.sessions)
      if (auto session = tracked.session.lock()) live.push_back(std::move(session));
  }
  for (const auto& session : live)
    session->Shutdown();
  live.clear();
  {
    std::unique_lock lock(gateway.sessions_mutex);
    gateway.sessions_gone.wait_for(lock, gateway.options.stop_timeout,
                                   [&] { return gateway.sessions.empty(); });
  }
  gateway.ioc.stop();
  for (std::thread& thread : gateway.threads)
    thread.join();
  gateway.threads.clear();
  gateway.blocking.join();
  beast::error_code ignored;
  gateway.acceptor.close(ignored);
}

}  // namespace gpufleet::gateway
