#pragma once

// How the CLI finds and talks to a gpufleet server: the connection options every verb takes,
// where the server URL and token come from, authenticated calls to /api/v1, and the one way
// every failure is shown ("error: ..." and exit 1).

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "net/http_client.h"
#include "net/server_urls.h"

namespace gpufleet::cli {

inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;
inline constexpr std::string_view kDefaultServer = "http://127.0.0.1:8080";

// --server, --token and -o: on every verb that talks to the server.
struct ConnectionArgs {
  std::string server;
  std::string token;
  std::string output = "table";  // "table" or "json"

  bool json() const { return output == "json"; }
};
void AddConnectionOptions(CLI::App& command, ConnectionArgs& args);

// Everything the server URL and token may come from, gathered first so the choice is testable.
struct ConfigSources {
  std::string flag_server;  // --server, --token ("" when not given)
  std::string flag_token;
  std::string env_server;  // GPUFLEET_SERVER, GPUFLEET_TOKEN ("" when unset)
  std::string env_token;
  std::string env_ca_file;    // GPUFLEET_CA_FILE: the CA an https:// server's certificate is from
  std::filesystem::path cwd;  // .gpufleet/client.json is looked for here and above
  std::filesystem::path user_config;  // ~/.config/gpufleet/client.json; empty: none
};
ConfigSources SourcesFromEnvironment(const ConnectionArgs& args);

// The chosen server and token and where each came from ("--server", "GPUFLEET_TOKEN", a file
// path, "default"), for messages.
struct ClientConfig {
  std::string server;
  std::string token;  // empty: none found anywhere
  std::string server_source;
  std::string token_source;
  std::string ca_file;  // empty: the system's CAs
};

// Each of server and token comes from the first that has it: the flag, the environment, the
// nearest ./.gpufleet/client.json (current directory, then its parents), the user's
// client.json; the server defaults to kDefaultServer. Nothing (and `error` set) when a config
// file exists but is not valid JSON of that shape.
std::optional<ClientConfig> ResolveConfig(const ConfigSources& sources, std::string& error);

// The nearest .gpufleet/client.json at or above `dir`; empty when there is none.
std::filesystem::path FindProjectConfig(const std::filesystem::path& dir);

// One answer of the API, or why there is none; `message` is ready for "error: <message>".
struct ApiResult {
  int status = 0;  // 0: no answer (cannot reach the server)
  nlohmann::json body;
  std::string text;  // the raw body (logs)
  net::HttpHeaders headers;
  std::string message;  // empty on success (2xx)

  bool ok() const { return message.empty(); }
  std::string Header(std::string_view name) const;
};

// Percent-encodes one path segment or query value.
std::string UrlEncode(std::string_view text);

// "error: ..." for an answer that is not 2xx, or no answer at all. Exposed for tests.
std::string DescribeTransportError(const ClientConfig& config, std::string_view error);
std::string DescribeHttpError(const ClientConfig& config, int status, std::string_view body);

class Client {
 public:
  Client(ClientConfig config, net::ServerUrls servers)
      : config_(std::move(config)), servers_(std::move(servers)) {}

  // Resolves the configuration from the flags and environment; prints the error and returns
  // nothing when a config file is broken or the server URL is not usable.
  static std::optional<Client> FromArgs(const ConnectionArgs& args);

  // `path` starts after /api/v1: "/jobs?state=pending". JSON answers are parsed into `body`.
  ApiResult Call(std::string_view method, std::string_view path,
                 const nlohmann::json* body = nullptr,
                 std::chrono::milliseconds timeout = net::kDefaultHttpTimeout) const;
  ApiResult Get(std::string_view path) const { return Call("GET", path); }
  ApiResult Post(std::string_view path, const nlohmann::json& body) const {
    return Call("POST", path, &body);
  }

  const ClientConfig& config() const { return config_; }

 private:
  ClientConfig config_;
  net::ServerUrls servers_;  // config_.server, of which calls follow the one answering
};

// Prints "error: <message>" on stderr and returns kExitFailure.
int Fail(std::string_view message);
// Prints JSON for -o json: indented, one document, trailing newline.
void PrintJson(const nlohmann::json& value);
// The list in an answer: the answer itself when it is an array, else its member `key`
// ({"jobs": [...]}); an empty array when neither.
const nlohmann::json& ListIn(const nlohmann::json& body, const char* key);

}  // namespace gpufleet::cli
