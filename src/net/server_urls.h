#pragma once

// The control plane as clients see it: one or more servers' base URLs ("http://a:8080,
// http://b:8080"), of which one leads and the others wait as standbys (docs/ha.md). A call goes
// to the server that answered last, and on to the next ones when it cannot be reached or is a
// standby, so agents, the CLI and gateways follow a takeover by themselves. A standby that knows
// the leader redirects (307) to it: the call follows, and later calls go to the leader directly,
// so a client given any one server finds the leader.

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "net/http_client.h"

namespace gpufleet::net {

// Every answer of a standby server carries this header with the value "standby", and every 503
// of a leader on its way out (its store failed or its lease lapsed, or it is stopping) "stopping":
// either way, ask another server.
inline constexpr std::string_view kServerRoleHeader = "Gpufleet-Role";

// True for an answer of a standby or of a server that is stopping: another server should answer.
bool AnotherServerShouldAnswer(const HttpResult& result);

// The entries of a comma-separated server list, each without trailing slashes; empty entries
// are kept, for the caller to refuse.
std::vector<std::string> SplitServerList(std::string_view list);

class ServerUrls {
 public:
  // "http://a:8080" or a comma-separated list; trailing slashes dropped. Nothing, with `error`
  // naming the bad one, when one is not an http(s) URL or the list is empty.
  static std::optional<ServerUrls> Parse(std::string_view list, std::string& error);

  // `method` on `path` ("/api/v1/agents/sync") of the current server, then of each other in
  // turn while none can be reached or AnotherServerShouldAnswer (any other HTTP answer, 4xx and
  // 5xx too, ends the search). A redirect (307, 308) to a URL of the same scheme, or from http to
  // https, is followed once, with the same method, body and headers; the server it led to is
  // added to the list and becomes the current one. The error names every server tried.
  HttpResult Call(std::string_view method, std::string_view path,
                  const HttpCallOptions& options) const;

  std::string current() const;           // the base URL calls go to now, for messages
  std::vector<std::string> all() const;  // as given, then any a redirect led to

 private:
  struct State;
  explicit ServerUrls(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;  // shared by copies: they follow the same leader
};

}  // namespace gpufleet::net
