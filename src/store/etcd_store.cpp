#include "store/etcd_store.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "net/http_client.h"

namespace gpufleet::store {
namespace {

using nlohmann::json;

constexpr std::string_view kAlphabet =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
// Keys per range request while listing: each page is one round trip, and bounded in memory.
constexpr int kPageSize = 1000;
constexpr auto kRequestTimeout = std::chrono::seconds(10);
constexpr auto kMinMemberTimeout = std::chrono::milliseconds(200);

// What one call to a member came to.
struct Answer {
  std::optional<json> body;  // a 200 with a JSON body
  std::string error;         // otherwise: why
  bool try_another = false;  // unreachable, or not able to serve now (no leader, 5xx)
};

class EtcdStore final : public Store {
 public:
  explicit EtcdStore(EtcdOptions options) : options_(std::move(options)) {
    std::vector<std::string> failures;
    bool reached = false;
    for (size_t i = 0; i < options_.endpoints.size() && !reached; ++i) {
      Answer answer = CallOne(i, "/v3/maintenance/status", json::object(), kRequestTimeout);
      if (answer.body) {
        preferred_ = i;
        version_ = answer.body->value("version", "");
        reached = true;
      } else {
        failures.push_back(fmt::format("{}: {}", options_.endpoints[i], answer.error));
      }
    }
    if (!reached) throw StoreError(fmt::format("cannot reach etcd: {}", fmt::join(failures, "; ")));
    TakeLock();
    keepalive_ = std::thread([this] { KeepAlive(); });
  }

  ~EtcdStore() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    stop_.notify_all();
    if (keepalive_.joinable()) keepalive_.join();
    // Revoking the lease deletes the lock: the next server need not wait out its TTL. A lost
    // lease is gone already, or etcd is out of reach.
    if (!Lost()) {
      try {
        Call("/v3/lease/revoke", json{{"ID", lease_}});
      } catch (const StoreError&) {
      }
    }
  }

  std::string_view backend() const override { return "etcd"; }
  std::string location() const override {
    return fmt::format("{} (etcd {}), keys under '{}'", fmt::join(options_.endpoints, ","),
                       version_, options_.key_prefix);
  }

  std::optional<std::string> Lost() const override {
    if (lease_expired_.load())
      return fmt::format(
          "etcd: this server's lease on '{}' expired (etcd said so when it was renewed): another "
          "server may hold the lock now",
          options_.key_prefix);
    if (const auto left = LeaseLeft(); left && *left < std::chrono::steady_clock::duration::zero())
      return fmt::format(
          "etcd: this server's lease on '{}' was not renewed for {} s (etcd out of reach, or this "
          "process stalled): "
          "another server may hold the lock now",
          options_.key_prefix, options_.lease_ttl_s);
    return std::nullopt;
  }

  void Commit(std::span<const Mutation> batch) override {
    CheckKeys(batch);
    if (batch.empty()) return;
    // Fenced off by etcd anyway; this says so at once instead of after a call that cannot reach it.
    if (auto lost = Lost()) throw StoreError(*lost + ": nothing was written");
    // etcd refuses a transaction that names a key twice: keep each key's last mutation, in the
    // order of first appearance (the result is the same as applying them in order).
    std::map<std::string_view, size_t> last;
    for (size_t i = 0; i < batch.size(); ++i)
      last[batch[i].key] = i;
    json success = json::array();
    for (size_t i = 0; i < batch.size(); ++i) {
      const Mutation& mutation = batch[i];
      if (last[mutation.key] != i) continue;
      const std::string key = Base64Encode(options_.key_prefix + mutation.key);
      if (mutation.kind == Mutation::Kind::kPut)
        success.push_back(
            {{"request_put", {{"key", key}, {"value", Base64Encode(mutation.value)}}}});
      else
        success.push_back({{"request_delete_range", {{"key", key}}}});
    }
    // Retrying after a failure that may have come after etcd applied the batch is safe: puts and
    // deletes of fixed keys give the same state when applied twice.
    const json answer = Call("/v3/kv/txn", json{{"compare", json::array({HoldingLock()})},
                                                {"success", std::move(success)}});
    if (!answer.value("succeeded", false))
      throw StoreError(fmt::format(
          "etcd: this server no longer holds the lock on '{}' (its lease expired, or another "
          "server took over): nothing was written",
          options_.key_prefix));
  }

  std::optional<std::string> Get(std::string_view key) const override {
    if (!IsValidKey(key)) return std::nullopt;
    const json answer =
        Call("/v3/kv/range", json{{"key", Base64Encode(options_.key_prefix + std::string(key))}});
    const auto kvs = answer.find("kvs");
    if (kvs == answer.end() || kvs->empty()) return std::nullopt;
    return Decode(kvs->at(0), "value");
  }

  std::vector<std::pair<std::string, std::string>> List(std::string_view prefix) const override {
    std::vector<std::pair<std::string, std::string>> pairs;
    Scan(prefix, [&pairs](std::string_view key, std::string_view value) {
      pairs.emplace_back(key, value);
    });
    return pairs;
  }

  void Scan(std::string_view prefix,
            const std::function<void(std::string_view, std::string_view)>& visit) const override {
    const std::string start = options_.key_prefix + std::string(prefix);
    const std::optional<std::string> end = PrefixEnd(start);
    std::string from = start;
    while (true) {
      json request = {{"key", Base64Encode(from)}, {"limit", kPageSize}};
      // No end: every key from `start` on (etcd's "\0" range end).
      request["range_end"] = Base64Encode(end ? *end : std::string(1, '\0'));
      const json answer = Call("/v3/kv/range", request);
      const auto kvs = answer.find("kvs");
      if (kvs == answer.end() || kvs->empty()) return;
      std::string key;
      for (const json& kv : *kvs) {
        key = Decode(kv, "key");
        const std::string value = Decode(kv, "value");
        visit(std::string_view(key).substr(options_.key_prefix.size()), value);
      }
      if (!answer.value("more", false)) return;
      from = key + '\0';  // the next key after the last one seen
    }
  }

 private:
  std::string LockKey() const {
    std::string key = options_.key_prefix;
    if (key.size() > 1 && key.back() == '/') key.pop_back();
    return key + ".lock";
  }

  // The compare that fences every commit: the lock is still the one this store created.
  json HoldingLock() const {
    return {{"key", Base64Encode(LockKey())},
            {"target", "CREATE"},
            {"result", "EQUAL"},
            {"create_revision", lock_revision_}};
  }

  // `value`: the lock's, {"holder": "host pid N", "url": "http://..."}.
  EtcdLockHeld HeldBy(const std::string& value) const {
    const json lock = json::parse(value, nullptr, false);
    std::string holder = value, url;
    if (lock.is_object()) {
      holder = lock.value("holder", "unknown");
      url = lock.value("url", "");
    }
    return EtcdLockHeld(
        fmt::format("etcd keys '{}' are in use by another gpufleet server ({}{}); they are free "
                    "once it stops, or {} s after it dies",
                    options_.key_prefix, holder, url.empty() ? "" : ", serving " + url,
                    options_.lease_ttl_s),
        holder, url);
  }

  void TakeLock() {
    const std::string key = Base64Encode(LockKey());
    // A standby asks four times a second: while the lock is held, a read answers it, not a
    // lease granted and revoked again (two writes through etcd's log each time).
    const json current = Call("/v3/kv/range", json{{"key", key}});
    if (const auto kvs = current.find("kvs"); kvs != current.end() && !kvs->empty())
      throw HeldBy(Decode(kvs->at(0), "value"));
    const auto asked = std::chrono::steady_clock::now();
    const json grant = Call("/v3/lease/grant", json{{"TTL", options_.lease_ttl_s}});
    ExtendLease(asked);
    lease_ = Int64Text(grant, "ID");
    if (lease_.empty()) throw StoreError("etcd granted no lease");
    std::string holder = options_.holder;
    if (holder.empty()) {
      char host[256] = {};
      ::gethostname(host, sizeof host - 1);
      holder = fmt::format("{} pid {}", host, ::getpid());
    }
    const std::string value = json{{"holder", holder}, {"url", options_.url}}.dump();
    // Taken meanwhile by another: the transaction's compare still decides.
    const json answer = Call(
        "/v3/kv/txn",
        json{{"compare", json::array({{{"key", key},
                                       {"target", "CREATE"},
                                       {"result", "EQUAL"},
                                       {"create_revision", 0}}})},
             {"success",
              json::array({{{"request_put",
                             {{"key", key}, {"value", Base64Encode(value)}, {"lease", lease_}}}}})},
             {"failure", json::array({{{"request_range", {{"key", key}}}}})}});
    if (!answer.value("succeeded", false)) {
      std::string other = R"({"holder": "unknown"})";
      try {
        other = Decode(answer.at("responses").at(0).at("response_range").at("kvs").at(0), "value");
      } catch (const json::exception&) {
      }
      try {
        Call("/v3/lease/revoke", json{{"ID", lease_}});
      } catch (const StoreError&) {
      }
      throw HeldBy(other);
    }
    // The lock was created by this transaction: its revision is the transaction's.
    lock_revision_ = Int64Text(answer.value("header", json::object()), "revision");
    if (lock_revision_.empty())
      throw StoreError("etcd answered the lock's transaction without a revision");
  }

  // Renews the lease three times a TTL; a lease found expired stays expired (commits then fail).
  void KeepAlive() {
    const auto every = std::chrono::milliseconds(options_.lease_ttl_s * 1000 / 3);
    std::unique_lock lock(mutex_);
    while (!stop_.wait_for(lock, every, [this] { return stopping_; })) {
      lock.unlock();
      try {
        const auto asked = std::chrono::steady_clock::now();
        // A third of the TTL per member: a silent one leaves time to renew through another.
        const json answer = Call("/v3/lease/keepalive", json{{"ID", lease_}}, every);
        // proto3's JSON leaves out a TTL of 0: the lease had expired before etcd saw this.
        const json result = answer.value("result", json::object());
        if (result.contains("header")) {
          const std::string ttl = Int64Text(result, "TTL");
          if (ttl.empty() || ttl == "0")
            lease_expired_ = true;
          else
            ExtendLease(asked);
        }
      } catch (const std::exception&) {
        // Unreachable for now, or an answer we cannot read: the next round tries again. The TTL
        // bounds how long renewing may fail before commits are fenced off.
      }
      lock.lock();
    }
  }

  // A renewal asked for at `asked` that etcd granted keeps the lease at least a TTL from then
  // (etcd counts from when it saw the call, later still).
  void ExtendLease(std::chrono::steady_clock::time_point asked) {
    lease_valid_until_ =
        (asked + std::chrono::seconds(options_.lease_ttl_s)).time_since_epoch().count();
  }

  // How long one member may take to answer. While this store holds the lock, no longer than the
  // lease surely lasts: a commit answered after that may have been fenced off, and a server
  // whose store is lost should stop within a TTL, not after a timeout per member.
  std::chrono::milliseconds MemberTimeout() const {
    const auto left = LeaseLeft();
    if (!left) return kRequestTimeout;
    return std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(*left),
                      kMinMemberTimeout, std::chrono::milliseconds(kRequestTimeout));
  }

  // How much longer the lease surely holds (negative once it may have run out); nothing before
  // the lock is taken.
  std::optional<std::chrono::steady_clock::duration> LeaseLeft() const {
    const int64_t until = lease_valid_until_.load();
    if (until == 0) return std::nullopt;
    return std::chrono::steady_clock::duration(until) -
           std::chrono::steady_clock::now().time_since_epoch();
  }

  // Posts `body` to each member in turn, starting with the one that answered last, until one
  // answers; throws StoreError with every member's reason otherwise. `timeout`: for each member
  // (default MemberTimeout()). Once the lock is lost, no further member is tried.
  json Call(std::string_view path, const json& body,
            std::optional<std::chrono::milliseconds> timeout = std::nullopt) const {
    std::vector<std::string> failures;
    size_t first;
    {
      std::lock_guard lock(mutex_);
      first = preferred_;
    }
    for (size_t n = 0; n < options_.endpoints.size(); ++n) {
      const size_t i = (first + n) % options_.endpoints.size();
      if (n > 0) {
        if (auto lost = Lost()) {
          failures.push_back(std::move(*lost));
          break;
        }
      }
      Answer answer = CallOne(i, path, body, timeout ? *timeout : MemberTimeout());
      if (answer.body) {
        if (i != first) {
          std::lock_guard lock(mutex_);
          preferred_ = i;
        }
        return std::move(*answer.body);
      }
      failures.push_back(fmt::format("{}: {}", options_.endpoints[i], answer.error));
      if (!answer.try_another) break;
    }
    throw StoreError(fmt::format("etcd {}: {}", path, fmt::join(failures, "; ")));
  }

  Answer CallOne(size_t endpoint, std::string_view path, const json& body,
                 std::chrono::milliseconds timeout) const {
    Answer answer;
    net::HttpCallOptions call;
    call.body = body.dump();
    call.timeout = timeout;
    const net::HttpResult result =
        http_.Call("POST", options_.endpoints[endpoint] + std::string(path), call);
    if (!result.ok()) {
      answer.error = result.error;
      answer.try_another = true;
      return answer;
    }
    const net::HttpClientResponse& response = *result.response;
    json parsed;
    try {
      parsed = json::parse(response.body);
    } catch (const json::exception&) {
      answer.error = fmt::format("HTTP {}: not JSON: {:.200}", response.status, response.body);
      answer.try_another = response.status >= 500;
      return answer;
    }
    if (response.status == 200 && !parsed.contains("error")) {
      answer.body = std::move(parsed);
      return answer;
    }
    // gRPC's codes through the gateway: 14 unavailable (no leader, leader changed) and 4
    // deadline exceeded are worth another member; 3 invalid argument (too many operations in a
    // transaction, a request too large) is not. Unary calls say {"error": "...", "code": N};
    // streamed ones (lease keepalive) {"error": {"grpc_code": N, "message": "..."}}.
    int code = 0;
    std::string message = response.body.substr(0, 200);
    if (const auto error = parsed.find("error"); error != parsed.end()) {
      if (error->is_string()) message = error->get<std::string>();
      if (error->is_object()) {
        if (const auto text = error->find("message"); text != error->end() && text->is_string())
          message = text->get<std::string>();
        if (const auto grpc = error->find("grpc_code"); grpc != error->end() && grpc->is_number())
          code = grpc->get<int>();
      }
    }
    if (const auto number = parsed.find("code"); number != parsed.end() && number->is_number())
      code = number->get<int>();
    answer.error = fmt::format("HTTP {}: {}", response.status, message);
    answer.try_another = response.status >= 500 || code == 14 || code == 4;
    if (code == 3 && answer.error.find("too many operations") != std::string::npos)
      answer.error += " (start etcd with a larger --max-txn-ops)";
    return answer;
  }

  // A 64-bit number of etcd's JSON, which writes them as strings ("7587..."); empty if absent.
  static std::string Int64Text(const json& object, const char* field) {
    const auto it = object.find(field);
    if (it == object.end()) return {};
    if (it->is_string()) return it->get<std::string>();
    if (it->is_number_integer()) return std::to_string(it->get<int64_t>());
    return {};
  }

  // A base64 field of an etcd key-value; proto3's JSON leaves out empty ones.
  static std::string Decode(const json& kv, const char* field) {
    const auto it = kv.find(field);
    if (it == kv.end()) return {};
    auto bytes = it->is_string() ? Base64Decode(it->get<std::string>()) : std::nullopt;
    if (!bytes) throw StoreError(fmt::format("etcd answered a {} that is not base64", field));
    return std::move(*bytes);
  }

  const EtcdOptions options_;
  std::string version_;
  std::string lease_;          // its ID, as etcd's JSON writes 64-bit numbers: a string
  std::string lock_revision_;  // the revision that created the lock
  // Until when (steady clock ticks) the lease surely holds, and whether etcd said it expired.
  std::atomic<int64_t> lease_valid_until_{0};
  std::atomic<bool> lease_expired_{false};
  mutable std::mutex mutex_;
  mutable size_t preferred_ = 0;           // the member that answered last
  mutable net::KeepAliveHttpClient http_;  // a connection per member and caller, kept
  bool stopping_ = false;
  std::condition_variable stop_;
  std::thread keepalive_;
};

}  // namespace

std::string Base64Encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t chunk = static_cast<uint32_t>(static_cast<unsigned char>(bytes[i])) << 16 |
                           static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8 |
                           static_cast<unsigned char>(bytes[i + 2]);
    for (int shift = 18; shift >= 0; shift -= 6)
      out += kAlphabet[(chunk >> shift) & 0x3f];
  }
  if (const size_t rest = bytes.size() - i; rest > 0) {
    uint32_t chunk = static_cast<uint32_t>(static_cast<unsigned char>(bytes[i])) << 16;
    if (rest == 2) chunk |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8;
    out += kAlphabet[(chunk >> 18) & 0x3f];
    out += kAlphabet[(chunk >> 12) & 0x3f];
    out += rest == 2 ? kAlphabet[(chunk >> 6) & 0x3f] : '=';
    out += '=';
  }
  return out;
}

std::optional<std::string> Base64Decode(std::string_view text) {
  if (text.size() % 4 != 0) return std::nullopt;
  std::array<int, 256> value{};
  value.fill(-1);
  for (size_t i = 0; i < kAlphabet.size(); ++i)
    value[static_cast<unsigned char>(kAlphabet[i])] = static_cast<int>(i);
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    uint32_t chunk = 0;
    int padding = 0;
    for (size_t j = 0; j < 4; ++j) {
      const char c = text[i + j];
      if (c == '=' && i + 4 == text.size() && j >= 2) {
        ++padding;
        chunk <<= 6;
        continue;
      }
      const int digit = value[static_cast<unsigned char>(c)];
      if (digit < 0 || padding > 0) return std::nullopt;
      chunk = chunk << 6 | static_cast<uint32_t>(digit);
    }
    out += static_cast<char>(chunk >> 16 & 0xff);
    if (padding < 2) out += static_cast<char>(chunk >> 8 & 0xff);
    if (padding < 1) out += static_cast<char>(chunk & 0xff);
  }
  return out;
}

std::optional<EtcdOptions> ParseEtcdUrl(std::string_view url, std::string& error) {
  constexpr std::string_view kScheme = "etcd://";
  if (!url.starts_with(kScheme)) {
    error = fmt::format("'{}': an etcd store is etcd://HOST:PORT[,HOST:PORT...][/PREFIX]", url);
    return std::nullopt;
  }
  std::string_view rest = url.substr(kScheme.size());
  EtcdOptions options;
  if (const size_t slash = rest.find('/'); slash != std::string_view::npos) {
    options.key_prefix = std::string(rest.substr(slash + 1));
    rest = rest.substr(0, slash);
    if (options.key_prefix.empty() || !IsValidKey(options.key_prefix)) {
      error = fmt::format("'{}': the key prefix after the hosts must not be empty", url);
      return std::nullopt;
    }
    if (options.key_prefix.back() != '/') options.key_prefix += '/';
  }
  for (bool more = !rest.empty(); more;) {
    const size_t comma = rest.find(',');
    more = comma != std::string_view::npos;
    const std::string_view host = rest.substr(0, comma);
    const size_t colon = host.rfind(':');
    if (host.empty() || colon == std::string_view::npos || colon == 0 || colon + 1 == host.size() ||
        host.substr(colon + 1).find_first_not_of("0123456789") != std::string_view::npos) {
      error = fmt::format("'{}': '{}' is not HOST:PORT", url, host);
      return std::nullopt;
    }
    options.endpoints.push_back(fmt::format("http://{}", host));
    if (more) rest = rest.substr(comma + 1);
  }
  if (options.endpoints.empty()) {
    error = fmt::format("'{}': no etcd member given", url);
    return std::nullopt;
  }
  return options;
}

std::unique_ptr<Store> OpenEtcdStore(const EtcdOptions& options) {
  if (options.endpoints.empty()) throw StoreError("etcd: no member to connect to");
  if (options.lease_ttl_s < 2) throw StoreError("etcd: the lock's lease needs at least 2 s");
  if (options.key_prefix.empty() || !IsValidKey(options.key_prefix))
    throw StoreError("etcd: the key prefix must not be empty");
  return std::make_unique<EtcdStore>(options);
}

}  // namespace gpufleet::store
