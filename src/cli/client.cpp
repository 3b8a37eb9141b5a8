#include "cli/client.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <system_error>

#include <fmt/format.h>

namespace gpufleet::cli {
namespace {

std::string Getenv(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::string(value) : std::string();
}

struct FileConfig {
  std::string server;
  std::string token;
};

// Reads {"server": "...", "token": "..."}; both optional. Unknown members are ignored, so a
// newer `gpufleet dev` may add some.
std::optional<FileConfig> ReadConfigFile(const std::filesystem::path& path, std::string& error) {
  std::ifstream in(path);
  if (!in) {
    error = fmt::format("cannot read {}", path.string());
    return std::nullopt;
  }
  std::stringstream text;
  text << in.rdbuf();
  auto document = nlohmann::json::parse(text.str(), nullptr, false);
  if (document.is_discarded() || !document.is_object()) {
    error = fmt::format(
        "{}: expected a JSON object such as {{\"server\": \"{}\", \"token\": "
        "\"gpf_...\"}}",
        path.string(), kDefaultServer);
    return std::nullopt;
  }
  FileConfig config;
  for (auto [key, field] :
       {std::pair{"server", &config.server}, std::pair{"token", &config.token}}) {
    auto it = document.find(key);
    if (it == document.end() || it->is_null()) continue;
    if (!it->is_string()) {
      error = fmt::format("{}: '{}' must be a string", path.string(), key);
      return std::nullopt;
    }
    *field = it->get<std::string>();
  }
  return config;
}

bool Exists(const std::filesystem::path& path) {
  std::error_code error;
  return std::filesystem::is_regular_file(path, error);
}

// "GET http://host/api/v1/jobs: connect: Connection refused" -> "connect: Connection refused":
// the URL is already in our own message.
std::string_view WithoutRequestPrefix(std::string_view error) {
  if (size_t at = error.find(": ");
      at != std::string_view::npos && error.substr(0, at).find("://") != std::string_view::npos)
    return error.substr(at + 2);
  return error;
}

bool IsSafeUrlChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
         c == '~';
}

}  // namespace

void AddConnectionOptions(CLI::App& command, ConnectionArgs& args) {
  command.add_option("--server", args.server,
                     "Server URL, or a leader and its standbys comma-separated (default: "
                     "$GPUFLEET_SERVER, .gpufleet/client.json, "
                     "~/.config/gpufleet/client.json, http://127.0.0.1:8080)");
  command.add_option("--token", args.token,
                     "API token (default: $GPUFLEET_TOKEN, then the same files)");
  command.add_option("-o,--output", args.output, "Output format: table or json")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
}

ConfigSources SourcesFromEnvironment(const ConnectionArgs& args) {
  ConfigSources sources;
  sources.flag_server = args.server;
  sources.flag_token = args.token;
  sources.env_server = Getenv("GPUFLEET_SERVER");
  sources.env_token = Getenv("GPUFLEET_TOKEN");
  sources.env_ca_file = Getenv("GPUFLEET_CA_FILE");
  std::error_code error;
  sources.cwd = std::filesystem::current_path(error);
  std::string config_home = Getenv("XDG_CONFIG_HOME");
  if (config_home.empty()) {
    const std::string home = Getenv("HOME");
    if (!home.empty()) config_home = home + "/.config";
  }
  if (!config_home.empty())
    sources.user_config = std::filesystem::path(config_home) / "gpufleet" / "client.json";
  return sources;
}

std::filesystem::path FindProjectConfig(const std::filesystem::path& dir) {
  if (dir.empty()) return {};
  std::error_code error;
  std::filesystem::path at = std::filesystem::absolute(dir, error);
  if (error) return {};
  for (;;) {
    std::filesystem::path candidate = at / ".gpufleet" / "client.json";
    if (Exists(candidate)) return candidate;
    if (!at.has_relative_path()) return {};  // the root
    at = at.parent_path();
  }
}

std::optional<ClientConfig> ResolveConfig(const ConfigSources& sources, std::string& error) {
  ClientConfig config;
  auto take = [](std::string& field, std::string& source, const std::string& value,
                 std::string_view from) {
    if (field.empty() && !value.empty()) {
      field = value;
      source = std::string(from);
    }
  };
  take(config.server, config.server_source, sources.flag_server, "--server");
  take(config.token, config.token_source, sources.flag_token, "--token");
  take(config.server, config.server_source, sources.env_server, "GPUFLEET_SERVER");
  take(config.token, config.token_source, sources.env_token, "GPUFLEET_TOKEN");
  // Files are read only when something is still missing, so a broken file in some parent
  // directory does not stop a user who passed both flags.
  for (const std::filesystem::path& file :
       {FindProjectConfig(sources.cwd),
        Exists(sources.user_config) ? sources.user_config : std::filesystem::path()}) {
    if (file.empty() || (!config.server.empty() && !config.token.empty())) continue;
    auto contents = ReadConfigFile(file, error);
    if (!contents) return std::nullopt;
    take(config.server, config.server_source, contents->server, file.string());
    take(config.token, config.token_source, contents->token, file.string());
  }
  take(config.server, config.server_source, std::string(kDefaultServer), "default");
  config.ca_file = sources.env_ca_file;
  // "127.0.0.1:8080" is what people paste; the scheme is the only one there is. A list of
  // servers (a leader and its standbys, docs/ha.md) is normalised one by one.
  std::vector<std::string> servers = net::SplitServerList(config.server);
  for (std::string& server : servers)
    if (!server.empty() && server.find("://") == std::string::npos) server = "http://" + server;
  config.server = fmt::format("{}", fmt::join(servers, ","));
  return config;
}

std::string ApiResult::Header(std::string_view name) const {
  for (const auto& [key, value] : headers)
    if (key.size() == name.size() &&
        std::equal(key.begin(), key.end(), name.begin(), [](char a, char b) {
          return std::tolower(static_cast<unsigned char>(a)) ==
                 std::tolower(static_cast<unsigned char>(b));
        }))
      return value;
  return "";
}

std::string UrlEncode(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (IsSafeUrlChar(c))
      out += c;
    else
      out += fmt::format("%{:02X}", static_cast<unsigned char>(c));
  }
  return out;
}

std::string DescribeTransportError(const ClientConfig& config, std::string_view error) {
  return fmt::format(
      "cannot reach the gpufleet server at {}: {} (is it running? start one with 'gpufleet "
      "dev'{})",
      config.server, WithoutRequestPrefix(error),
      config.server_source == "default"
          ? ""
          : fmt::format("; the URL came from {}", config.server_source));
}

std::string DescribeHttpError(const ClientConfig& config, int status, std::string_view body) {
  std::string message;
  auto document = nlohmann::json::parse(body, nullptr, false);
  if (document.is_object() && document.contains("error") && document["error"].is_string())
    message = document["error"].get<std::string>();
  else if (body.empty())
    message = fmt::format("the server answered HTTP {}", status);
  else
    message = fmt::format("the server answered HTTP {}: {}", status,
                          body.substr(0, std::min<size_t>(body.size(), 200)));
  if (status == 401) {
    if (config.token.empty())
      return fmt::format(
          "{}\nno API token: pass --token, set GPUFLEET_TOKEN, or write it to "
          ".gpufleet/client.json or ~/.config/gpufleet/client.json as "
          "{{\"server\": \"{}\", \"token\": \"gpf_...\"}}. 'gpufleet dev' writes that file for "
          "its own cluster; on a shared cluster an admin creates one with 'gpufleet token create "
          "--user YOU --team TEAM --role user'",
          message, config.server);
    return fmt::format("{} (the token came from {})", message, config.token_source);
  }
  return message;
}

std::optional<Client> Client::FromArgs(const ConnectionArgs& args) {
  std::string error;
  auto config = ResolveConfig(SourcesFromEnvironment(args), error);
  if (!config) {
    Fail(error);
    return std::nullopt;
  }
  auto servers = net::ServerUrls::Parse(config->server, error);
  if (!servers) {
    Fail(fmt::format("server URL from {}: {}", config->server_source, error));
    return std::nullopt;
  }
  return Client(std::move(*config), std::move(*servers));
}

ApiResult Client::Call(std::string_view method, std::string_view path, const nlohmann::json* body,
                       std::chrono::milliseconds timeout) const {
  net::HttpCallOptions options;
  options.timeout = timeout;
  options.ca_file = config_.ca_file;
  if (body) options.body = body->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  // Without a token the call still goes out: an unreachable server is the first thing to say,
  // and a 401 then says how to get a token.
  if (!config_.token.empty())
    options.headers.emplace_back("Authorization", "Bearer " + config_.token);
  net::HttpResult result = servers_.Call(method, fmt::format("/api/v1{}", path), options);
  ApiResult answer;
  if (!result.ok()) {
    answer.message = DescribeTransportError(config_, result.error);
    return answer;
  }
  net::HttpClientResponse& response = *result.response;
  answer.status = response.status;
  answer.headers = std::move(response.headers);
  if (response.status < 200 || response.status > 299) {
    answer.message = DescribeHttpError(config_, response.status, response.body);
    answer.text = std::move(response.body);
    return answer;
  }
  if (response.content_type.find("json") != std::string::npos) {
    answer.body = nlohmann::json::parse(response.body, nullptr, false);
    if (answer.body.is_discarded()) {
      answer.message = fmt::format("the server at {} answered malformed JSON", servers_.current());
      answer.body = nullptr;
    }
  }
  answer.text = std::move(response.body);
  return answer;
}

int Fail(std::string_view message) {
  std::fflush(stdout);  // keep what was already printed ahead of the error
  fmt::print(stderr, "error: {}\n", message);
  return kExitFailure;
}

void PrintJson(const nlohmann::json& value) {
  fmt::print("{}\n", value.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
}

const nlohmann::json& ListIn(const nlohmann::json& body, const char* key) {
  static const nlohmann::json kEmpty = nlohmann::json::array();
  if (body.is_array()) return body;
  if (body.is_object()) {
    auto it = body.find(key);
    if (it != body.end() && it->is_array()) return *it;
  }
  return kEmpty;
}

}  // namespace gpufleet::cli
