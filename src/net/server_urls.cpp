#include "net/server_urls.h"

#include <mutex>

#include <fmt/format.h>

namespace gpufleet::net {

struct ServerUrls::State {
  std::vector<std::string> bases;
  std::mutex mutex;
  size_t current = 0;
};

std::optional<ServerUrls> ServerUrls::Parse(std::string_view list, std::string& error) {
  auto state = std::make_shared<State>();
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = list.find(',', start);
    std::string base(list.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    while (!base.empty() && base.back() == '/')
      base.pop_back();
    std::string why;
    if (base.empty() || !ParseHttpUrl(base, why)) {
      error = base.empty() ? fmt::format("'{}': an empty server URL in the list", list)
                           : fmt::format("'{}': {}", base, why);
      return std::nullopt;
    }
    state->bases.push_back(std::move(base));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return ServerUrls(std::move(state));
}

HttpResult ServerUrls::Call(std::string_view method, std::string_view path,
                            const HttpCallOptions& options) const {
  size_t first;
  {
    std::lock_guard lock(state_->mutex);
    first = state_->current;
  }
  std::vector<std::string> failures;
  const size_t count = state_->bases.size();
  for (size_t n = 0; n < count; ++n) {
    const size_t i = (first + n) % count;
    HttpResult result = HttpCall(method, state_->bases[i] + std::string(path), options);
    if (result.ok()) {
      if (i != first) {
        std::lock_guard lock(state_->mutex);
        state_->current = i;
      }
      return result;
    }
    failures.push_back(count == 1 ? result.error
                                  : fmt::format("{}: {}", state_->bases[i], result.error));
  }
  HttpResult failed;
  failed.error = fmt::format("{}", fmt::join(failures, "; "));
  return failed;
}

const std::vector<std::string>& ServerUrls::all() const {
  return state_->bases;
}

std::string ServerUrls::current() const {
  std::lock_guard lock(state_->mutex);
  return state_->bases[state_->current];
}

}  // namespace gpufleet::net
