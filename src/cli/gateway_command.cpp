#include "cli/gateway_command.h"

#include <cctype>
#include <csignal>
#include <fstream>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <pthread.h>
#include <unistd.h>

#include "agent/agent_api.h"
#include "cli/server_command.h"
#include "cli/stop_signals.h"
#include "core/version.h"
#include "gateway/control_plane.h"
#include "gateway/gateway.h"
#include "gateway/routes_file.h"

namespace gpufleet::cli {
namespace {

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

bool IsLoopback(const std::string& host) {
  return host.rfind("127.", 0) == 0 || host == "::1";
}

std::string Hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == 0) return "unknown";
  return name;
}

size_t EndpointCount(const std::vector<gateway::Route>& routes) {
  size_t count = 0;
  for (const auto& route : routes)
    count += route.endpoints.size();
  return count;
}

}  // namespace

CLI::App* AddGatewayCommand(CLI::App& app, GatewayArgs& args) {
  CLI::App* command = app.add_subcommand(
      "gateway", "Run the inference gateway: a reverse proxy to deployments' replicas");
  command->add_option("--server", args.server,
                      "The control plane's URL: routes, token checks and autoscaling from it; a "
                      "leader and its standbys comma-separated (docs/ha.md)");
  command->add_option("--token-file", args.token_file,
                      "With --server: a file holding a token of role gateway "
                      "(gpufleet token create --user gw-1 --role gateway)");
  command->add_option("--ca-file", args.ca_file, "With an https:// --server: the CA to trust");
  command->add_option("--id", args.id,
                      "This gateway's id in its load reports [gateway-HOSTNAME-PORT]");
  command->add_option("--listen", args.listen, "Address to serve on (port 0: any free port)")
      ->capture_default_str();
  command->add_option(
      "--routes", args.routes_file,
      "Standalone: a YAML or JSON list of deployments and their endpoints (reloaded "
      "on SIGHUP)");
  command->add_flag("--no-auth", args.no_auth,
                    "Accept requests without a token (only on a loopback --listen address)");
  command
      ->add_option("--policy", args.policy,
                   "Replica choice for plain routes: round_robin, least_outstanding or "
                   "endpoint_picker (llm routes always use endpoint_picker)")
      ->capture_default_str();
  command->add_option("--io-threads", args.io_threads, "Threads serving connections")
      ->capture_default_str();
  command->add_option("--max-body-mib", args.max_body_mib, "Larger request bodies get 413")
      ->capture_default_str();
  command
      ->add_option("--request-timeout", args.request_timeout,
                   "Wait this long for a replica's response header")
      ->capture_default_str();
  command
      ->add_option("--idle-timeout", args.idle_timeout,
                   "Close connections silent this long (clients, replicas, pooled)")
      ->capture_default_str();
  command->add_option("--connect-timeout", args.connect_timeout, "Connecting to a replica")
      ->capture_default_str();
  command
      ->add_option("--max-connections-per-client", args.max_connections_per_client,
                   "Connections one client address may hold open; more get 503 (0: no limit)")
      ->capture_default_str();
  command
      ->add_option("--buffer-size", args.buffer_size,
                   "Requests held per deployment while it has no ready replica")
      ->capture_default_str();
  command
      ->add_option("--buffer-timeout", args.buffer_timeout,
                   "How long a held request waits before a 503")
      ->capture_default_str();
  command->add_option("--retries", args.retries, "Other replicas tried after a failure")
      ->capture_default_str();
  command
      ->add_option("--eject-after", args.eject_after,
                   "Consecutive failures that leave a replica out for --ejection-time")
      ->capture_default_str();
  command
      ->add_option("--ejection-time", args.ejection_time,
                   "First ejection's length (longer each time again)")
      ->capture_default_str();
  command
      ->add_option("--scrape-interval", args.scrape_interval,
                   "How often llm replicas' /metrics are read")
      ->capture_default_str();
  return command;
}

int RunGateway(const GatewayArgs& args) {
  std::string error;
  auto listen = agent::ParseListenAddress(args.listen, error);
  if (!listen) {
    fmt::print(stderr, "error: --listen: {}\n", error);
    return kExitUsage;
  }
  const bool controlled = !args.server.empty();
  if (controlled == !args.routes_file.empty()) {
    fmt::print(stderr,
               "error: give --server URL (routes from the control plane) or --routes FILE "
               "(standalone), one of the two\n");
    return kExitUsage;
  }
  std::string token;
  if (controlled) {
    if (args.no_auth) {
      fmt::print(stderr, "error: --no-auth is for the standalone gateway (--routes) only\n");
      return kExitUsage;
    }
    std::ifstream file(args.token_file);
    std::getline(file, token);
    while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back())))
      token.pop_back();
    if (args.token_file.empty() || token.empty()) {
      fmt::print(stderr, "error: --server needs --token-file with a gateway token{}\n",
                 args.token_file.empty()
                     ? ""
                     : fmt::format(" ('{}' is unreadable or empty)", args.token_file));
      return kExitUsage;
    }
  } else if (!args.no_auth) {
    fmt::print(stderr,
               "error: the standalone gateway (--routes) checks no tokens: pass --no-auth, on a "
               "loopback --listen address\n");
    return kExitUsage;
  }
  if (!controlled && !IsLoopback(listen->host)) {
    fmt::print(stderr,
               "error: --no-auth is refused on {}: anyone who can reach it could use every "
               "deployment; listen on 127.0.0.1 (or ::1)\n",
               listen->host);
    return kExitUsage;
  }
  gateway::GatewayOptions options;
  options.host = listen->host;
  options.port = listen->port;
  options.auth_disabled = !controlled;
  if (controlled) options.verify_token = gateway::ServerTokenVerifier(args.server, args.ca_file);
  const auto policy = serving::ParseRoutingPolicy(args.policy);
  if (!policy) {
    fmt::print(stderr,
               "error: --policy '{}': expected round_robin, least_outstanding or "
               "endpoint_picker\n",
               args.policy);
    return kExitUsage;
  }
  options.picker.policy = *policy;
  if (args.io_threads < 1 || args.max_body_mib < 1 || args.buffer_size < 0 || args.retries < 0 ||
      args.eject_after < 1) {
    fmt::print(stderr,
               "error: --io-threads, --max-body-mib and --eject-after must be at least 1, "
               "--buffer-size and --retries at least 0\n");
    return kExitUsage;
  }
  options.io_threads = args.io_threads;
  options.max_body_bytes = static_cast<size_t>(args.max_body_mib) << 20;
  options.max_buffered_per_deployment = args.buffer_size;
  options.retries = args.retries;
  options.eject_after_failures = args.eject_after;
  options.max_connections_per_client = args.max_connections_per_client;
  struct Duration {
    const char* flag;
    const std::string& text;
    std::chrono::milliseconds& into;
  };
  for (const Duration& duration :
       {Duration{"--request-timeout", args.request_timeout, options.request_timeout},
        Duration{"--idle-timeout", args.idle_timeout, options.idle_timeout},
        Duration{"--connect-timeout", args.connect_timeout, options.connect_timeout},
        Duration{"--buffer-timeout", args.buffer_timeout, options.buffer_timeout},
        Duration{"--ejection-time", args.ejection_time, options.ejection_time},
        Duration{"--scrape-interval", args.scrape_interval, options.scrape_interval}}) {
    const auto ms = PositiveDuration(duration.flag, duration.text);
    if (!ms) return kExitUsage;
    duration.into = std::chrono::milliseconds(*ms);
  }
  std::optional<std::vector<gateway::Route>> routes;
  if (!controlled) {
    routes = gateway::LoadRoutesFile(args.routes_file, error);
    if (!routes) {
      fmt::print(stderr, "error: {}\n", error);
      return kExitUsage;
    }
  }

  sigset_t signals = BlockStopSignals();
  sigaddset(&signals, SIGHUP);
  ::pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto started = gateway::Gateway::Start(std::move(options));
  if (!started.gateway) {
    fmt::print(stderr, "error: {}\n", started.error);
    return kExitFailure;
  }
  std::unique_ptr<gateway::Gateway> gateway = std::move(started.gateway);
  std::unique_ptr<gateway::ControlPlaneLink> link;
  fmt::print("gpufleet gateway {}: listening on {}\n", kVersion, gateway->url());
  if (controlled) {
    gateway::ControlPlaneOptions link_options;
    link_options.server_url = args.server;
    link_options.token = token;
    link_options.ca_file = args.ca_file;
    link_options.gateway_id =
        !args.id.empty() ? args.id : fmt::format("gateway-{}-{}", Hostname(), gateway->port());
    link_options.log = [](const std::string& line) {
      fmt::print(stderr, "gpufleet gateway: {}\n", line);
    };
    link = std::make_unique<gateway::ControlPlaneLink>(*gateway, link_options);
    if (auto link_error = link->Start()) {
      fmt::print(stderr, "error: {}\n", *link_error);
      return kExitUsage;
    }
    fmt::print("  routes: from {} (id {}), tokens checked by it, policy {}\n", args.server,
               link_options.gateway_id, args.policy);
  } else {
    gateway->SetRoutes(*routes);
    fmt::print("  routes: {} ({} deployments, {} endpoints), policy {}, no auth\n",
               args.routes_file, routes->size(), EndpointCount(*routes), args.policy);
  }
  std::fflush(stdout);

  while (true) {
    siginfo_t info{};
    const int signal_number = ::sigwaitinfo(&signals, &info);
    if (signal_number == SIGHUP) {
      if (controlled) continue;  // the control plane's routes change on their own
      auto reloaded = gateway::LoadRoutesFile(args.routes_file, error);
      if (!reloaded) {
        // A bad edit keeps the routes that work.
        fmt::print(stderr, "gpufleet gateway: SIGHUP: {}; keeping the current routes\n", error);
        continue;
      }
      gateway->SetRoutes(*reloaded);
      fmt::print(stderr, "gpufleet gateway: SIGHUP: {} deployments, {} endpoints\n",
                 reloaded->size(), EndpointCount(*reloaded));
      continue;
    }
    if (signal_number == SIGINT || signal_number == SIGTERM) {
      fmt::print(stderr, "gpufleet gateway: {} received, stopping\n",
                 signal_number == SIGINT ? "SIGINT" : "SIGTERM");
      break;
    }
  }
  if (link) link->Stop();
  gateway->Stop();
  return 0;
}

}  // namespace gpufleet::cli
