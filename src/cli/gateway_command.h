#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace gpufleet::cli {

// Flags of `gpufleet gateway`, as typed; RunGateway validates them.
struct GatewayArgs {
  std::string listen = "127.0.0.1:8000";
  // With the control plane: routes from its endpoint set, callers' tokens checked by it, load
  // reported to its autoscalers (a token of role gateway).
  std::string server;
  std::string token_file;
  std::string ca_file;
  std::string id;           // empty: gateway-<hostname>-<port>
  std::string routes_file;  // standalone: routes from this file, reloaded on SIGHUP
  bool no_auth = false;     // only on a loopback address
  std::string policy = "least_outstanding";
  int io_threads = 2;
  int64_t max_body_mib = 16;
  std::string request_timeout = "300s";
  std::string idle_timeout = "60s";
  std::string connect_timeout = "5s";
  size_t max_connections_per_client = 256;
  int64_t buffer_size = 100;
  std::string buffer_timeout = "60s";
  int retries = 2;
  int eject_after = 5;
  std::string ejection_time = "30s";
  std::string scrape_interval = "50ms";
};

CLI::App* AddGatewayCommand(CLI::App& app, GatewayArgs& args);

// Runs the gateway until SIGINT or SIGTERM; SIGHUP reloads --routes. Exit status: 0 after a
// signal, 2 for bad flags or a bad routes file at start, 1 when it cannot listen.
int RunGateway(const GatewayArgs& args);

}  // namespace gpufleet::cli
