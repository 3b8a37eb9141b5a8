#include "net/http.h"

#include <algorithm>
#include <cctype>
#include <set>

#include <fmt/format.h>

namespace gpufleet::net {
namespace {

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

// "/v1/a/b" -> {"v1", "a", "b"}; "/" -> {}.
std::vector<std::string> SplitPath(std::string_view path) {
  std::vector<std::string> segments;
  size_t start = 0;
  while (start < path.size()) {
    if (path[start] == '/') {
      ++start;
      continue;
    }
    size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    segments.emplace_back(path.substr(start, end - start));
    start = end;
  }
  return segments;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string HttpRequest::Header(std::string_view name) const {
  for (const auto& [key, value] : headers)
    if (EqualsIgnoreCase(key, name)) return value;
  return "";
}

std::optional<std::string> HttpRequest::Query(const std::string& name) const {
  auto found = query.find(name);
  if (found == query.end()) return std::nullopt;
  return found->second;
}

std::string HttpRequest::PathParam(const std::string& name) const {
  auto found = path_params.find(name);
  return found == path_params.end() ? "" : found->second;
}

HttpResponse HttpResponse::Json(int status, std::string body) {
  HttpResponse response;
  response.status = status;
  response.body = std::move(body);
  return response;
}

HttpResponse HttpResponse::Text(int status, std::string body, std::string content_type) {
  HttpResponse response;
  response.status = status;
  response.content_type = std::move(content_type);
  response.body = std::move(body);
  return response;
}

HttpResponse HttpResponse::Error(int status, std::string_view message) {
  return Json(status, fmt::format("{{\"error\": \"{}\"}}\n", JsonEscape(message)));
}

void Router::Add(std::string method, std::string_view pattern, HttpHandler handler) {
  routes_.push_back({std::move(method), SplitPath(pattern), std::move(handler), {}});
}

void Router::AddAsync(std::string method, std::string_view pattern, HttpAsyncHandler handler) {
  routes_.push_back({std::move(method), SplitPath(pattern), {}, std::move(handler)});
}

bool Router::Match(const Route& route, const std::vector<std::string>& segments,
                   std::map<std::string, std::string>& params) {
  if (route.segments.size() != segments.size()) return false;
  std::map<std::string, std::string> found;
  for (size_t i = 0; i < segments.size(); ++i) {
    const std::string& pattern = route.segments[i];
    if (pattern.size() >= 2 && pattern.front() == '{' && pattern.back() == '}') {
      if (segments[i].empty()) return false;
      found[pattern.substr(1, pattern.size() - 2)] = segments[i];
    } else if (pattern != segments[i]) {
      return false;
    }
  }
  params = std::move(found);
  return true;
}

const Router::Route* Router::Find(HttpRequest& request,
                                  std::optional<HttpResponse>& refusal) const {
  // Split the path as sent, then decode each segment: an escaped '/' ("a%2Fb") stays inside its
  // segment instead of adding one.
  std::vector<std::string> segments;
  if (request.target.empty()) {
    segments = SplitPath(request.path);
  } else {
    for (std::string& segment :
         SplitPath(std::string_view(request.target)
                       .substr(0, std::min(request.target.find('?'), request.target.size())))) {
      auto decoded = PercentDecode(segment, false);
      if (!decoded) {
        refusal = HttpResponse::Error(400, "malformed percent-encoding in the path");
        return nullptr;
      }
      segments.push_back(std::move(*decoded));
    }
  }
  std::set<std::string> allowed;
  for (const Route& route : routes_) {
    std::map<std::string, std::string> params;
    if (!Match(route, segments, params)) continue;
    if (route.method != request.method) {
      allowed.insert(route.method);
      continue;
    }
    request.path_params = std::move(params);
    return &route;
  }
  if (allowed.empty()) {
    refusal = HttpResponse::Error(
        404, fmt::format("no such resource: {} {}", request.method, request.path));
    return nullptr;
  }
  std::string allow = fmt::format("{}", fmt::join(allowed, ", "));
  refusal = HttpResponse::Error(405, fmt::format("method {} is not allowed on {} (allowed: {})",
                                                 request.method, request.path, allow));
  refusal->headers.emplace_back("Allow", allow);
  return nullptr;
}

void Router::Dispatch(HttpRequest request, HttpResponder respond) const {
  std::optional<HttpResponse> refusal;
  const Route* route = Find(request, refusal);
  if (!route) return respond(std::move(*refusal));
  if (route->async_handler) return route->async_handler(std::move(request), std::move(respond));
  respond(route->handler(request));
}

HttpResponse Router::Handle(HttpRequest request) const {
  std::optional<HttpResponse> refusal;
  const Route* route = Find(request, refusal);
  if (!route) return std::move(*refusal);
  if (!route->handler)
    return HttpResponse::Error(500, "internal error: an asynchronous route called synchronously");
  return route->handler(request);
}

std::optional<std::string> PercentDecode(std::string_view text, bool plus_is_space) {
  std::string decoded;
  decoded.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '%') {
      if (i + 2 >= text.size()) return std::nullopt;
      int high = HexValue(text[i + 1]);
      int low = HexValue(text[i + 2]);
      if (high < 0 || low < 0) return std::nullopt;
      decoded.push_back(static_cast<char>(high * 16 + low));
      i += 2;
    } else if (c == '+' && plus_is_space) {
      decoded.push_back(' ');
    } else {
      decoded.push_back(c);
    }
  }
  return decoded;
}

bool SplitTarget(std::string_view target, std::string& path,
                 std::map<std::string, std::string>& query) {
  size_t question = target.find('?');
  auto decoded_path = PercentDecode(target.substr(0, question), false);
  if (!decoded_path) return false;
  path = std::move(*decoded_path);
  query.clear();
  if (question == std::string_view::npos) return true;
  std::string_view rest = target.substr(question + 1);
  while (!rest.empty()) {
    size_t amp = rest.find('&');
    std::string_view pair = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
    if (pair.empty()) continue;
    size_t equals = pair.find('=');
    auto key = PercentDecode(pair.substr(0, equals), true);
    auto value = PercentDecode(
        equals == std::string_view::npos ? std::string_view() : pair.substr(equals + 1), true);
    if (!key || !value) return false;
    query[*key] = std::move(*value);
  }
  return true;
}

std::string JsonEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 8);
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20)
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        else
          out.push_back(c);
    }
  }
  return out;
}

std::string_view StatusReason(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 201:
      return "Created";
    case 202:
      return "Accepted";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 413:
      return "Payload Too Large";
    case 422:
      return "Unprocessable Entity";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "";
  }
}

}  // namespace gpufleet::net
