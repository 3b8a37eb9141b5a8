#pragma once

// gpufleet's own light HTTP types and a router by method and path. They carry no Boost types, so
// the modules that serve or call HTTP (agent, cli, later server) compile without Beast; only the
// .cpp files of this module include it.

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gpufleet::net {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // as sent: "/v1/workloads/w-1/logs?tail=10"
  std::string path;    // percent-decoded, without the query: "/v1/workloads/w-1/logs"
  std::map<std::string, std::string> query;        // decoded; a repeated key keeps the last value
  std::map<std::string, std::string> path_params;  // filled by the Router: {"id": "w-1"}
  HttpHeaders headers;
  std::string body;

  // Case-insensitive; empty when absent.
  std::string Header(std::string_view name) const;
  std::optional<std::string> Query(const std::string& name) const;
  std::string PathParam(const std::string& name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  HttpHeaders headers;  // besides Content-Type, Content-Length, Server and Connection

  static HttpResponse Json(int status, std::string body);
  static HttpResponse Text(int status, std::string body,
                           std::string content_type = "text/plain; charset=utf-8");
  // {"error": message}: how every API error is answered.
  static HttpResponse Error(int status, std::string_view message);
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;
// Answers a request later, from any thread: a long poll holds it until there is news. Call it
// once; a responder dropped without a call answers 500, so a client is never left hanging.
using HttpResponder = std::function<void(HttpResponse)>;
using HttpAsyncHandler = std::function<void(HttpRequest, HttpResponder)>;

// Routes by method and path pattern. Patterns are literal segments and `{name}` parameters that
// match one non-empty segment: "/v1/workloads/{id}/cancel". An unknown path answers 404; a known
// path with another method answers 405 with an Allow header.
class Router {
 public:
  void Add(std::string method, std::string_view pattern, HttpHandler handler);
  void AddAsync(std::string method, std::string_view pattern, HttpAsyncHandler handler);
  // Routes with an async handler answer through `respond`, the others before this returns.
  void Dispatch(HttpRequest request, HttpResponder respond) const;
  // For routers without async routes (an async route answers 500 here).
  HttpResponse Handle(HttpRequest request) const;

 private:
  struct Route {
    std::string method;
    std::vector<std::string> segments;  // "{id}" for a parameter
    HttpHandler handler;                // exactly one of these two is set
    HttpAsyncHandler async_handler;
  };
  const Route* Find(HttpRequest& request, std::optional<HttpResponse>& refusal) const;
  static bool Match(const Route& route, const std::vector<std::string>& segments,
                    std::map<std::string, std::string>& params);

  std::vector<Route> routes_;
};

// Splits "/a/b?x=1&y=%20" into the decoded path and query parameters. Returns false when the
// percent-encoding is malformed.
bool SplitTarget(std::string_view target, std::string& path,
                 std::map<std::string, std::string>& query);
// Decodes %XX escapes (and '+' as a space when `plus_is_space`); nothing when malformed.
std::optional<std::string> PercentDecode(std::string_view text, bool plus_is_space);
// Escapes for a JSON string literal (without the quotes).
std::string JsonEscape(std::string_view text);
// "Not Found" for 404, "" for codes it does not know.
std::string_view StatusReason(int status);

}  // namespace gpufleet::net
