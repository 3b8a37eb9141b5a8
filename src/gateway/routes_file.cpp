#include "gateway/routes_file.h"

#include <charconv>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

namespace gpufleet::gateway {
namespace {

// "host:port" or "[v6]:port".
bool ParseAddress(const std::string& text, Endpoint& endpoint) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) return false;
  std::string host = text.substr(0, colon);
  if (host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  unsigned port = 0;
  const char* first = text.data() + colon + 1;
  const char* last = text.data() + text.size();
  const auto [end, status] = std::from_chars(first, last, port);
  if (status != std::errc() || end != last || port == 0 || port > 65535) return false;
  endpoint.host = std::move(host);
  endpoint.port = static_cast<uint16_t>(port);
  return true;
}

}  // namespace

std::optional<std::vector<Route>> ParseRoutes(std::string_view text, std::string& error) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& parse_error) {
    error = fmt::format("not YAML or JSON: {}", parse_error.what());
    return std::nullopt;
  }
  if (root.IsMap() && root["routes"]) root = root["routes"];
  if (root.IsNull()) return std::vector<Route>{};
  if (!root.IsSequence()) {
    error = "expected a list of routes (or a map with `routes:`)";
    return std::nullopt;
  }
  std::vector<Route> routes;
  std::set<std::string> names;
  try {
    for (size_t i = 0; i < root.size(); ++i) {
      const YAML::Node node = root[i];
      const std::string where = fmt::format("route {}", i + 1);
      if (!node.IsMap() || !node["deployment"] || !node["deployment"].IsScalar()) {
        error = where + ": needs `deployment: NAME`";
        return std::nullopt;
      }
      Route route;
      route.deployment = node["deployment"].as<std::string>();
      if (route.deployment.empty() || route.deployment.find_first_of("/ .:") != std::string::npos) {
        error = fmt::format(
            "{}: deployment name '{}' must be non-empty, without '/', '.', ':' or "
            "spaces",
            where, route.deployment);
        return std::nullopt;
      }
      if (!names.insert(route.deployment).second) {
        error = fmt::format("{}: deployment '{}' is listed twice", where, route.deployment);
        return std::nullopt;
      }
      if (node["team"]) route.team = node["team"].as<std::string>();
      if (node["llm"]) route.llm = node["llm"].as<bool>();
      if (const YAML::Node models = node["models"]) {
        if (!models.IsSequence()) {
          error = where + ": `models` must be a list of names";
          return std::nullopt;
        }
        for (const auto& model : models)
          route.model_names.push_back(model.as<std::string>());
      }
      if (const YAML::Node endpoints = node["endpoints"]) {
        if (!endpoints.IsSequence()) {
          error = where + ": `endpoints` must be a list of host:port";
          return std::nullopt;
        }
        for (const auto& item : endpoints) {
          Endpoint endpoint;
          std::string address;
          if (item.IsScalar()) {
            address = item.as<std::string>();
          } else if (item.IsMap() && item["address"]) {
            address = item["address"].as<std::string>();
            if (item["id"]) endpoint.id = item["id"].as<std::string>();
            if (item["draining"]) endpoint.draining = item["draining"].as<bool>();
          } else {
            error = where + ": an endpoint is \"host:port\" or {id, address, draining}";
            return std::nullopt;
          }
          if (!ParseAddress(address, endpoint)) {
            error = fmt::format("{}: endpoint '{}' is not host:port", where, address);
            return std::nullopt;
          }
          if (endpoint.id.empty()) endpoint.id = address;
          route.endpoints.push_back(std::move(endpoint));
        }
      }
      routes.push_back(std::move(route));
    }
  } catch (const YAML::Exception& type_error) {
    error = fmt::format("bad value: {}", type_error.what());
    return std::nullopt;
  }
  return routes;
}

std::optional<std::vector<Route>> LoadRoutesFile(const std::string& path, std::string& error) {
  std::ifstream file(path);
  if (!file) {
    error = fmt::format("cannot read routes file '{}'", path);
    return std::nullopt;
  }
  std::stringstream text;
  text << file.rdbuf();
  auto routes = ParseRoutes(text.str(), error);
  if (!routes) error = fmt::format("routes file '{}': {}", path, error);
  return routes;
}

}  // namespace gpufleet::gateway
