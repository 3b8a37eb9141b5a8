#include "net/server_urls.h"

#include <algorithm>
#include <mutex>

#include <fmt/format.h>

namespace gpufleet::net {

struct ServerUrls::State {
  std::vector<std::string> bases;
  std::mutex mutex;
  size_t current = 0;
};

std::vector<std::string> SplitServerList(std::string_view list) {
  std::vector<std::string> entries;
  size_t start = 0;
  while (true) {
    const size_t comma = list.find(',', start);
    std::string entry(list.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    while (!entry.empty() && entry.back() == '/')
      entry.pop_back();
    entries.push_back(std::move(entry));
    if (comma == std::string_view::npos) return entries;
    start = comma + 1;
  }
}

std::optional<ServerUrls> ServerUrls::Parse(std::string_view list, std::string& error) {
  auto state = std::make_shared<State>();
  for (std::string& base : SplitServerList(list)) {
    std::string why;
    if (base.empty() || !ParseHttpUrl(base, why)) {
      error = base.empty() ? fmt::format("'{}': an empty server URL in the list", list)
                           : fmt::format("'{}': {}", base, why);
      return std::nullopt;
    }
    state->bases.push_back(std::move(base));
  }
  return ServerUrls(std::move(state));
}

bool AnotherServerShouldAnswer(const HttpResult& result) {
  if (!result.ok()) return false;
  const std::string role = result.response->Header(kServerRoleHeader);
  return role == "standby" || role == "stopping";
}

namespace {

// The redirect's target when it may be followed: a 307/308 to an http(s) URL that does not move
// from https to http (the call carries a token).
std::optional<std::string> RedirectTarget(const HttpResult& result, const std::string& from) {
  if (!result.ok() || (result.response->status != 307 && result.response->status != 308))
    return std::nullopt;
  std::string location = result.response->Header("Location"), error;
  auto target = ParseHttpUrl(location, error);
  if (!target || (from.starts_with("https://") && !target->tls)) return std::nullopt;
  return location;
}

}  // namespace

HttpResult ServerUrls::Call(std::string_view method, std::string_view path,
                            const HttpCallOptions& options) const {
  size_t first;
  std::vector<std::string> bases;
  {
    std::lock_guard lock(state_->mutex);
    first = state_->current;
    bases = state_->bases;
  }
  std::vector<std::string> failures;
  const size_t count = bases.size();
  for (size_t n = 0; n < count; ++n) {
    const size_t i = (first + n) % count;
    const std::string url = bases[i] + std::string(path);
    HttpResult result = HttpCall(method, url, options);
    size_t answered = i;
    if (auto location = RedirectTarget(result, url)) {
      result = HttpCall(method, *location, options);
      // The leader's base URL, when the redirect kept the path (a standby's do).
      if (result.ok() && !AnotherServerShouldAnswer(result) && location->ends_with(path)) {
        const std::string leader = location->substr(0, location->size() - path.size());
        std::lock_guard lock(state_->mutex);
        auto known = std::find(state_->bases.begin(), state_->bases.end(), leader);
        answered = static_cast<size_t>(known - state_->bases.begin());
        if (known == state_->bases.end()) state_->bases.push_back(leader);
      }
    }
    if (result.ok() && !AnotherServerShouldAnswer(result)) {
      if (answered != first) {
        std::lock_guard lock(state_->mutex);
        state_->current = answered;
      }
      return result;
    }
    std::string why = result.error;
    if (result.ok() && result.response->Header(kServerRoleHeader) == "stopping") {
      why = fmt::format("stopping: {}", result.response->body.substr(0, 300));
    } else if (result.ok()) {
      const std::string location = result.response->Header("Location");
      why = location.empty()
                ? "a standby, and it knows no leader yet"
                : fmt::format("a standby, whose redirect to {} was not followed", location);
    }
    failures.push_back(count == 1 ? why : fmt::format("{}: {}", bases[i], why));
  }
  HttpResult failed;
  failed.error = fmt::format("{}", fmt::join(failures, "; "));
  return failed;
}

std::vector<std::string> ServerUrls::all() const {
  std::lock_guard lock(state_->mutex);
  return state_->bases;
}

std::string ServerUrls::current() const {
  std::lock_guard lock(state_->mutex);
  return state_->bases[state_->current];
}

}  // namespace gpufleet::net
