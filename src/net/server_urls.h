#pragma once

// The control plane as clients see it: one or more servers' base URLs ("http://a:8080,
// http://b:8080"), of which one leads and the others wait as standbys that do not listen
// (docs/ha.md). A call goes to the server that answered last, and on to the next ones when it
// cannot be reached, so agents, the CLI and gateways follow a takeover by themselves.

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "net/http_client.h"

namespace gpufleet::net {

class ServerUrls {
 public:
  // "http://a:8080" or a comma-separated list; trailing slashes dropped. Nothing, with `error`
  // naming the bad one, when one is not an http(s) URL or the list is empty.
  static std::optional<ServerUrls> Parse(std::string_view list, std::string& error);

  // `method` on `path` ("/api/v1/agents/sync") of the current server, then of each other in
  // turn while none can be reached (any HTTP answer, 4xx and 5xx too, ends the search). The
  // error names every server tried.
  HttpResult Call(std::string_view method, std::string_view path,
                  const HttpCallOptions& options) const;

  std::string current() const;  // the base URL calls go to now, for messages
  const std::vector<std::string>& all() const;

 private:
  struct State;
  explicit ServerUrls(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;  // shared by copies: they follow the same leader
};

}  // namespace gpufleet::net
