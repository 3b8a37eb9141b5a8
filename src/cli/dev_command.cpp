#include "cli/dev_command.h"

#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <pthread.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/agent_api.h"
#include "agent/control_loop.h"
#include "cli/server_command.h"
#include "cli/stop_signals.h"
#include "core/version.h"
#include "gateway/control_plane.h"
#include "gateway/gateway.h"
#include "net/http_client.h"
#include "net/http_server.h"
#include "sched/policy.h"
#include "server/server.h"

namespace gpufleet::cli {
namespace {

namespace fs = std::filesystem;

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;
// Without real GPUs the dev cluster simulates one common node.
constexpr const char* kDefaultSimGpus = "8xH100-80GB";

std::string ReadFirstLine(const fs::path& path) {
  std::ifstream file(path);
  std::string line;
  std::getline(file, line);
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back())))
    line.pop_back();
  return line;
}

// Whether the server accepts `token` with this role: a token kept from an earlier run is reused
// only when it still works (the data dir may have been wiped meanwhile).
bool TokenWorks(const std::string& server_url, const std::string& token, std::string_view role) {
  if (token.empty()) return false;
  net::HttpCallOptions options;
  options.headers.emplace_back("Authorization", "Bearer " + token);
  net::HttpResult result = net::HttpCall("GET", server_url + "/api/v1/whoami", options);
  if (!result.ok() || result.response->status != 200) return false;
  auto body = nlohmann::json::parse(result.response->body, nullptr, false);
  return body.is_object() && body.value("role", "") == role;
}

std::optional<std::string> EnsureToken(server::Server& server, const std::string& kept,
                                       const std::string& user, const std::string& team,
                                       api::Role role, std::string& error) {
  if (TokenWorks(server.url(), kept, api::RoleName(role))) return kept;
  auto created = server.CreateToken(user, team, role, "gpufleet dev");
  if (!created.token) {
    error = created.error;
    return std::nullopt;
  }
  return created.token->secret;
}

// How to run this binary from the current directory, for the hints.
std::string SelfCommand() {
  std::error_code error;
  const fs::path self = fs::read_symlink("/proc/self/exe", error);
  if (error) return "gpufleet";
  const fs::path relative = fs::relative(self, fs::current_path(error), error);
  if (error || relative.empty() || relative.native().rfind("..", 0) == 0) return self.string();
  return relative.has_parent_path() ? relative.string() : "./" + relative.string();
}

// The reference model server next to this build (build/gpufleet -> examples/model-server), or
// nothing when the binary was installed without the source tree.
std::optional<fs::path> ReferenceServerScript() {
  std::error_code error;
  const fs::path self = fs::read_symlink("/proc/self/exe", error);
  if (error) return std::nullopt;
  for (fs::path dir = self.parent_path(); !dir.empty() && dir != dir.root_path();
       dir = dir.parent_path()) {
    const fs::path script = dir / "examples" / "model-server" / "gpufleet_reference_server.py";
    if (fs::exists(script, error)) return script;
  }
  return std::nullopt;
}

// A deployment of the reference server for the banner's hints, with its absolute path (a
// replica runs in a fresh directory). Debian's python3 is named: it has python3-torch.
std::optional<fs::path> WriteExampleDeployment(const fs::path& dir) {
  auto script = ReferenceServerScript();
  if (!script) return std::nullopt;
  const fs::path file = dir / "examples" / "tiny-llm.yaml";
  std::error_code error;
  fs::create_directories(file.parent_path(), error);
  std::ofstream out(file);
  out << "# The reference model server (a tiny random transformer on CPU: docs/"
         "reference-model-server.md)\n"
         "# behind the gateway, scaled from zero by the autoscaler (docs/serving.md).\n"
         "name: tiny-llm\n"
         "command: [/usr/bin/python3, "
      << script->string()
      << "]\n"
         "gpus: 0.25\n"
         "min_replicas: 0\n"
         "max_replicas: 3\n"
         "readiness_path: /health\n"
         "routing: endpoint_picker\n"
         "autoscaling:\n"
         "  target: 4\n";
  if (!out) return std::nullopt;
  return file;
}

}  // namespace

CLI::App* AddDevCommand(CLI::App& app, DevArgs& args) {
  CLI::App* dev = app.add_subcommand(
      "dev", "Run a one-machine cluster: control plane and node agent in one process");
  dev->add_option("--dir", args.dir, "Where the cluster keeps its state, logs and tokens")
      ->capture_default_str();
  dev->add_option("--listen", args.listen, "The API's address (port 0: any free port)")
      ->capture_default_str();
  dev->add_option("--agent-listen", args.agent_listen, "The node agent's API address")
      ->capture_default_str();
  dev->add_option("--gateway-listen", args.gateway_listen,
                  "The inference gateway's address (deployments' OpenAI API; port 0: any)")
      ->capture_default_str();
  dev->add_option("--sim-gpus", args.sim_gpus,
                  "Simulate these GPUs (COUNTxMODEL, e.g. 4xA100-80GB) instead of using NVML");
  dev->add_flag(
      "--require-nvml", args.require_nvml,
      "Fail when NVML finds no GPU instead of simulating " + std::string(kDefaultSimGpus));
  AddSchedulerOptions(*dev, args.scheduler);
  dev->add_option("--node-timeout", args.node_timeout,
                  "A node silent this long is lost and its jobs requeued")
      ->capture_default_str();
  return dev;
}

int RunDev(const DevArgs& args) {
  std::string error;
  auto listen = agent::ParseListenAddress(args.listen, error);
  auto agent_listen = listen ? agent::ParseListenAddress(args.agent_listen, error) : std::nullopt;
  auto gateway_listen =
      agent_listen ? agent::ParseListenAddress(args.gateway_listen, error) : std::nullopt;
  if (!listen || !agent_listen || !gateway_listen) {
    fmt::print(stderr, "error: {}\n", error);
    return kExitUsage;
  }
  auto scheduler = SchedulerConfigFrom(args.scheduler);
  auto idle_timeout = scheduler ? IdleGpuTimeoutMs(args.scheduler) : std::nullopt;
  auto node_timeout = PositiveDuration("--node-timeout", args.node_timeout);
  if (!scheduler || !idle_timeout || !node_timeout) return kExitUsage;
  if (args.require_nvml && !args.sim_gpus.empty()) {
    fmt::print(stderr, "error: --require-nvml and --sim-gpus contradict each other: pick one\n");
    return kExitUsage;
  }
  const sigset_t stop_signals = BlockStopSignals();
  const fs::path dir = fs::absolute(args.dir);

  auto log_to = [](std::string source) {
    return [source = std::move(source)](const std::string& line) {
      fmt::print(stderr, "{}: {}\n", source, line);
    };
  };

  // The node first: which GPUs it has decides what the banner says, and NVML is tried before
  // anything listens.
  agent::AgentOptions agent_options;
  agent_options.data_dir = (dir / "agent").string();
  agent_options.sim_gpus = args.sim_gpus;
  // The caller's own machine and jobs, run as the caller (like `agent run`): the node's /tmp and
  // devices stay theirs to share. A production agent (root) gives each workload its own.
  agent_options.workload_isolation = agent::WorkloadIsolationMode::kNone;
  // The dev cluster's GPUs are its own: their CDI spec stays in its directory.
  agent_options.cdi_dir = (dir / "agent" / "cdi").string();
  agent_options.log = log_to("agent");
  std::string simulated_because;
  auto opened = agent::AgentCore::Open(agent_options);
  if (!opened.ok() && args.sim_gpus.empty() && !args.require_nvml) {
    simulated_because = opened.error().message;
    // The agent's advice to pass --sim-gpus is what dev just did for the user.
    if (size_t advice = simulated_because.find(" To run without GPUs"); advice != std::string::npos)
      simulated_because.resize(advice);
    agent_options.sim_gpus = kDefaultSimGpus;
    opened = agent::AgentCore::Open(agent_options);
  }
  if (!opened.ok()) {
    fmt::print(stderr, "error: {}\n", opened.error().message);
    return kExitFailure;
  }
  std::unique_ptr<agent::AgentCore> core = std::move(opened).value();

  server::ServerOptions server_options;
  server_options.data_dir = (dir / "server").string();
  server_options.host = listen->host;
  server_options.port = listen->port;
  server_options.node_timeout_ms = *node_timeout;
  server_options.scheduler = std::move(*scheduler);
  server_options.idle_gpu_timeout_ms = *idle_timeout;
  server_options.log = log_to("server");
  auto started = server::Server::Open(server_options);
  if (!started.server) {
    fmt::print(stderr, "error: {}\n", started.error);
    return kExitFailure;
  }
  std::unique_ptr<server::Server> server = std::move(started.server);

  // The CLI finds the server and the admin token in <dir>/client.json; the agent keeps its own
  // token. Both are reused across restarts while the server still accepts them.
  const fs::path client_file = dir / "client.json";
  std::string kept_admin;
  {
    std::ifstream file(client_file);
    auto kept = nlohmann::json::parse(file, nullptr, false);
    if (kept.is_object()) kept_admin = kept.value("token", "");
  }
  auto admin_token = EnsureToken(*server, kept_admin, "admin", "admin", api::Role::kAdmin, error);
  const fs::path agent_token_file = dir / "agent-token";
  auto agent_token =
      admin_token ? EnsureToken(*server, ReadFirstLine(agent_token_file),
                                "agent-" + core->hostname(), "system", api::Role::kAgent, error)
                  : std::nullopt;
  const fs::path gateway_token_file = dir / "gateway-token";
  auto gateway_token = agent_token ? EnsureToken(*server, ReadFirstLine(gateway_token_file),
                                                 "gateway-dev", "", api::Role::kGateway, error)
                                   : std::nullopt;
  if (!admin_token || !agent_token || !gateway_token) {
    fmt::print(stderr, "error: creating the dev cluster's tokens: {}\n", error);
    return kExitFailure;
  }
  nlohmann::json client = {{"server", server->url()}, {"token", *admin_token}};
  for (auto [path, contents] : {std::pair{client_file, client.dump(2) + "\n"},
                                std::pair{agent_token_file, *agent_token + "\n"},
                                std::pair{gateway_token_file, *gateway_token + "\n"}}) {
    if (std::string write_error = server::WritePrivateFile(path.string(), contents);
        !write_error.empty()) {
      fmt::print(stderr, "error: {}\n", write_error);
      return kExitFailure;
    }
  }

  agent::ControlLoopOptions loop_options;
  loop_options.server_url = server->url();
  loop_options.token = *agent_token;
  loop_options.address = agent_listen->host;
  loop_options.log = log_to("agent");
  // The agent's API wants its key even on loopback: other local users must not start work.
  loop_options.api_key = agent::NewApiKey();
  if (auto key_error =
          agent::WriteApiKeyFile(core->data_dir() + "/api-key", loop_options.api_key)) {
    fmt::print(stderr, "error: {}\n", *key_error);
    return kExitFailure;
  }
  auto loop = std::make_unique<agent::ControlLoop>(*core, loop_options);
  agent::AgentApiOptions api_options;
  api_options.standalone = false;
  api_options.control_loop = loop.get();
  api_options.api_key = loop_options.api_key;
  api_options.http_counters = std::make_shared<net::HttpServerCounters>();
  net::Router router = agent::MakeAgentRouter(*core, api_options);
  net::HttpServerOptions agent_http;
  agent_http.host = agent_listen->host;
  agent_http.port = agent_listen->port;
  agent_http.io_threads = 2;
  agent_http.counters = api_options.http_counters;
  auto agent_started = net::HttpServer::Start(
      agent_http, [&router](const net::HttpRequest& request) { return router.Handle(request); });
  if (!agent_started.server) {
    fmt::print(stderr, "error: the agent's API: {}\n", agent_started.error);
    return kExitFailure;
  }
  std::unique_ptr<net::HttpServer> agent_server = std::move(agent_started.server);
  loop->set_agent_url("http://" + agent_server->address());
  if (auto loop_error = loop->Start()) {
    fmt::print(stderr, "error: {}\n", *loop_error);
    return kExitFailure;
  }

  // The inference front door, fed by the control plane like any gateway.
  gateway::GatewayOptions gateway_options;
  gateway_options.host = gateway_listen->host;
  gateway_options.port = gateway_listen->port;
  gateway_options.verify_token = gateway::ServerTokenVerifier(server->url(), "");
  auto gateway_started = gateway::Gateway::Start(gateway_options);
  if (!gateway_started.gateway) {
    fmt::print(stderr, "error: the gateway: {}\n", gateway_started.error);
    return kExitFailure;
  }
  std::unique_ptr<gateway::Gateway> inference = std::move(gateway_started.gateway);
  gateway::ControlPlaneOptions link_options;
  link_options.server_url = server->url();
  link_options.token = *gateway_token;
  link_options.gateway_id = "dev-" + core->hostname();
  link_options.log = log_to("gateway");
  auto link = std::make_unique<gateway::ControlPlaneLink>(*inference, link_options);
  if (auto link_error = link->Start()) {
    fmt::print(stderr, "error: {}\n", *link_error);
    return kExitFailure;
  }

  const std::string self = SelfCommand();
  std::string serving_hint;
  if (auto example = WriteExampleDeployment(dir))
    serving_hint = fmt::format(
        "  {} deploy -f {}\n"
        "  curl -H 'Authorization: Bearer {}' {}/v1/completions \\\n"
        "       -d '{{\"model\": \"tiny-llm\", \"prompt\": \"Hello\", \"max_tokens\": 16}}'\n",
        self, fs::relative(*example).string(), *admin_token, inference->url());
  std::string gpus = core->DescribeGpus();
  if (core->simulated())
    gpus = fmt::format("SIMULATED {} (no real GPU: {}; --require-nvml to insist)", gpus,
                       simulated_because.empty() ? "--sim-gpus asked for it" : simulated_because);
  else
    gpus = fmt::format("{} via NVML, driver {}", gpus, core->driver_version());
  gpus += fmt::format("; GPU shares {}", agent::GpuSharingModeName(core->gpu_sharing()));
  fmt::print(
      "gpufleet dev {}: a one-machine cluster is up\n"
      "  dashboard   {}/  (log in with the admin token below)\n"
      "  API         {}/api/v1\n"
      "  gateway     {} (deployments' OpenAI API: /v1/completions, /d/NAME/...; /metrics with "
      "the admin token)\n"
      "  metrics     {}/metrics (scheduler, API)  http://{}/metrics (GPUs, dcgm-exporter names)\n"
      "  GPUs        {}\n"
      "  containers  {}\n"
      "  scheduler   {}\n"
      "  state       {} ({}), logs under {}\n"
      "  admin token {}  (saved in {}, which the CLI reads)\n"
      "\n"
      "Try:\n"
      "  {} submit --gpus 1 -- sh -c 'echo hello from GPU $CUDA_VISIBLE_DEVICES; sleep 5'\n"
      "  {} jobs\n"
      "  {} logs -f 1\n"
      "  {} top\n"
      "{}"
      "Ctrl-C stops the cluster; its jobs and nodes are kept in {} for the next start.\n",
      kVersion, server->url(), server->url(), inference->url(), server->url(),
      agent_server->address(), gpus, core->DescribeContainers(),
      DescribeScheduler(server_options.scheduler), dir.string(), server->store_description(),
      (dir / "agent").string(), *admin_token, client_file.string(), self, self, self, self,
      serving_hint, dir.string());
  for (const std::string& note : core->startup_notes())
    fmt::print("  note: {}\n", note);
  std::fflush(stdout);

  // Until Ctrl-C, or until the store fails (crash-only: the next start reloads what is durable).
  std::atomic<int> exit_code{0};
  std::atomic<bool> stopping{false};
  std::thread fatal_watch([&] {
    while (!stopping) {
      if (auto fatal = server->WaitForFatal(std::chrono::milliseconds(500))) {
        fmt::print(stderr, "gpufleet dev: stopping: {}\n", *fatal);
        exit_code = kExitFailure;
        ::kill(::getpid(), SIGTERM);
        return;
      }
    }
  });
  int signal_number = 0;
  while (::sigwait(&stop_signals, &signal_number) != 0) {
  }
  fmt::print(stderr, "gpufleet dev: stopping\n");
  stopping = true;
  fatal_watch.join();
  link->Stop();
  inference->Stop();
  loop->Stop();
  agent_server->Stop();
  server->Stop();
  return exit_code;
}

}  // namespace gpufleet::cli
