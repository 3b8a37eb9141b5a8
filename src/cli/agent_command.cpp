#include "cli/agent_command.h"

#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string_view>

#include <fcntl.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <poll.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/agent_api.h"
#include "agent/control_loop.h"
#include "agent/fleet.h"
#include "agent/shim.h"
#include "cli/stop_signals.h"
#include "core/version.h"
#include "net/http_client.h"
#include "net/http_server.h"
#include "net/server_urls.h"

namespace gpufleet::cli {
namespace {

using agent::AgentCore;
using agent::AgentErrorKind;

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;
constexpr int kExitCannotRun = 127;  // as a shell reports a command it could not start

void AddBackendOptions(CLI::App& command, AgentArgs& args) {
  command
      .add_option("--data-dir", args.data_dir,
                  "Agent state: workloads, their logs, the executor lock")
      ->capture_default_str();
  command.add_option("--sim-gpus", args.sim_gpus,
                     "Simulate GPUs instead of NVML: COUNTxMODEL[@ISLAND] (8xH100-80GB) or a "
                     "node profile .yaml");
  command.add_option("--sim-profile", args.sim_profile, "Simulate the GPUs of a YAML node profile");
  command.add_option("--nvml-library", args.nvml_library, "NVML library to load")
      ->capture_default_str();
  command.add_option("--hostname", args.hostname,
                     "Node name: the Hostname label, and the seed of simulated UUIDs "
                     "(default: this machine's)");
  command
      .add_option("--cgroups", args.cgroups,
                  "CPU/memory limits through cgroups: auto, v2, v1, none")
      ->capture_default_str();
  command
      .add_option("--gpu-sharing", args.gpu_sharing,
                  "How fractional GPU shares are held to their part: mps (CUDA MPS enforces "
                  "compute and memory limits), advisory (the job is told its share), auto (mps "
                  "when the MPS control program is found; recorded on simulated GPUs)")
      ->capture_default_str();
  command
      .add_option("--workload-user", args.workload_user,
                  "Whom workloads run as: per-job (a uid of their own per job, so jobs cannot "
                  "read each other's files), mapped (the Unix account named like the job's "
                  "platform user; never root), a user name, agent (the agent's own user: root "
                  "when it is root), auto (per-job for a root agent, else agent)")
      ->capture_default_str();
  command
      .add_option("--workload-isolation", args.workload_isolation,
                  "A mount namespace per workload: namespace (other GPUs' /dev/nvidia* hidden, "
                  "private /tmp, /var/tmp and /dev/shm; needs root), none, auto (namespace for a "
                  "root agent)")
      ->capture_default_str();
  command
      .add_option("--oci-runtime", args.oci_runtime,
                  "OCI runtime for jobs that name an image: auto (crun, or runc where crun "
                  "cannot run), runc, crun or a path")
      ->capture_default_str();
  command
      .add_option("--container-init", args.container_init,
                  "Bound into each container as PID 1 to pass signals on and reap (tini); none: "
                  "the command is PID 1")
      ->capture_default_str();
  command.add_option("--image-cache-dir", args.image_cache_dir,
                     "Unpacked images, shared by the node's containers (default: "
                     "<data-dir>/images)");
  command
      .add_option("--image-cache-size", args.image_cache_size,
                  "Unused images are removed, least recently used first, above this size")
      ->capture_default_str();
  command
      .add_option("--cdi-dir", args.cdi_dir,
                  "Where the agent writes its GPUs' CDI spec (read after /etc/cdi)")
      ->capture_default_str();
  command.add_option("--sim-device-dir", args.sim_device_dir,
                     "With --sim-gpus: give each simulated GPU a device file DIR/nvidiaN (needs "
                     "root), so device isolation can be tried without GPUs");
  command
      .add_option("--mps-control", args.mps_control,
                  "The CUDA MPS control program (looked up in PATH without a '/')")
      ->capture_default_str();
}

// One line on stderr for the CLI's own messages, so stdout carries only what was asked for.
template <typename... Args>
void Note(fmt::format_string<Args...> format, Args&&... values) {
  fmt::print(stderr, "gpufleet: {}\n", fmt::format(format, std::forward<Args>(values)...));
}

int ExitCodeOf(AgentErrorKind kind) {
  return kind == AgentErrorKind::kBadRequest ? kExitUsage : kExitFailure;
}

// Options shared by the daemon and `agent run`; nullopt (after printing why) when invalid.
std::optional<agent::AgentOptions> CoreOptions(const AgentArgs& args) {
  agent::AgentOptions options;
  options.data_dir = args.data_dir;
  options.sim_gpus = args.sim_gpus;
  options.sim_profile = args.sim_profile;
  options.nvml_library = args.nvml_library;
  options.hostname = args.hostname;
  auto interval = agent::ParseDurationMs(args.interval);
  if (!interval || *interval <= 0) {
    fmt::print(stderr, "error: --interval '{}': expected a positive duration such as 1s or 500ms\n",
               args.interval);
    return std::nullopt;
  }
  options.sample_interval_ms = *interval;
  auto mode = agent::ParseCgroupMode(args.cgroups);
  if (!mode) {
    fmt::print(stderr, "error: --cgroups '{}': expected auto, v2, v1 or none\n", args.cgroups);
    return std::nullopt;
  }
  options.cgroup_mode = *mode;
  auto sharing = agent::ParseGpuSharingMode(args.gpu_sharing);
  if (!sharing || *sharing == agent::GpuSharingMode::kRecorded) {
    fmt::print(stderr, "error: --gpu-sharing '{}': expected auto, mps or advisory\n",
               args.gpu_sharing);
    return std::nullopt;
  }
  options.gpu_sharing = *sharing;
  options.mps_control = args.mps_control;
  options.workload_user =
      args.workload_user == "auto" ? (::geteuid() == 0 ? "per-job" : "agent") : args.workload_user;
  auto isolation = agent::ParseWorkloadIsolationMode(args.workload_isolation);
  if (!isolation) {
    fmt::print(stderr, "error: --workload-isolation '{}': expected auto, namespace or none\n",
               args.workload_isolation);
    return std::nullopt;
  }
  options.workload_isolation = *isolation;
  options.oci_runtime = args.oci_runtime;
  options.container_init = args.container_init;
  options.image_cache_dir = args.image_cache_dir;
  auto cache_mib = agent::ParseMemoryMib(args.image_cache_size);
  if (!cache_mib || *cache_mib <= 0) {
    fmt::print(stderr, "error: --image-cache-size '{}': expected a size such as 20Gi\n",
               args.image_cache_size);
    return std::nullopt;
  }
  options.image_cache_max_bytes = *cache_mib * 1024 * 1024;
  options.cdi_dir = args.cdi_dir;
  options.sim_device_dir = args.sim_device_dir;
  return options;
}

std::string BackendDescription(const AgentCore& core) {
  if (core.simulated()) return "sim (SIMULATED GPUs, not real hardware)";
  return fmt::format("{} (driver {})", core.backend_name(), core.driver_version());
}

std::string FormatInterval(TimeMs ms) {
  return ms % 1000 == 0 ? fmt::format("{}s", ms / 1000) : fmt::format("{}ms", ms);
}

bool IsWildcard(std::string_view host) {
  return host.empty() || host == "0.0.0.0" || host == "::";
}

bool IsLoopback(std::string_view host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// The token for --server: --token, else the first line of --token-file, else $GPUFLEET_TOKEN.
std::optional<std::string> ResolveToken(const AgentArgs& args, std::string& error) {
  if (!args.token.empty()) return args.token;
  if (!args.token_file.empty()) {
    std::ifstream file(args.token_file);
    if (!file) {
      error = fmt::format("--token-file '{}': {}", args.token_file, std::strerror(errno));
      return std::nullopt;
    }
    std::string token;
    std::getline(file, token);
    while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back())))
      token.pop_back();
    if (token.empty()) {
      error = fmt::format("--token-file '{}' is empty", args.token_file);
      return std::nullopt;
    }
    return token;
  }
  if (const char* env = std::getenv("GPUFLEET_TOKEN"); env && *env) return std::string(env);
  error = "--server needs the agent's token: --token, --token-file or $GPUFLEET_TOKEN";
  return std::nullopt;
}

int RunDaemon(const AgentArgs& args) {
  auto options = CoreOptions(args);
  if (!options) return kExitUsage;
  std::string error;
  auto listen = agent::ParseListenAddress(args.listen, error);
  if (!listen) {
    fmt::print(stderr, "error: {}\n", error);
    return kExitUsage;
  }
  const bool managed = !args.server.empty();
  if (managed && args.standalone) {
    fmt::print(stderr, "error: --standalone and --server contradict each other: pick one\n");
    return kExitUsage;
  }
  if (!managed && !IsLoopback(listen->host)) {
    fmt::print(stderr,
               "error: a standalone agent's API has no authentication, so it listens on loopback "
               "only (--listen 127.0.0.1:PORT), not on {}; to serve other machines, run it under "
               "a control plane (--server URL)\n",
               listen->host);
    return kExitUsage;
  }
  if (args.tls_cert.empty() != args.tls_key.empty()) {
    fmt::print(stderr, "error: --tls-cert and --tls-key go together: give both, or neither\n");
    return kExitUsage;
  }
  std::string token;
  if (managed) {
    auto resolved = ResolveToken(args, error);
    if (!resolved) {
      fmt::print(stderr, "error: {}\n", error);
      return kExitUsage;
    }
    token = std::move(*resolved);
    if (!net::ServerUrls::Parse(args.server, error)) {
      fmt::print(stderr, "error: --server: {}\n", error);
      return kExitUsage;
    }
  }
  const sigset_t stop_signals = BlockStopSignals();

  auto opened = AgentCore::Open(*options);
  if (!opened.ok()) {
    fmt::print(stderr, "error: {}\n", opened.error().message);
    return ExitCodeOf(opened.error().kind);
  }
  std::unique_ptr<AgentCore> core = std::move(opened).value();

  net::HttpServerOptions server_options;
  server_options.host = listen->host;
  server_options.port = listen->port;
  // Launches wait for the shim (tens of ms): extra threads keep scrapes from waiting behind them.
  server_options.io_threads = 4;
  server_options.tls_cert_file = args.tls_cert;
  server_options.tls_key_file = args.tls_key;
  // The loop exists before the router (which shows its state in /healthz); it starts once the
  // port is known.
  std::unique_ptr<agent::ControlLoop> loop;
  agent::AgentApiOptions api_options;
  api_options.standalone = !managed;
  agent::ControlLoopOptions loop_options;
  if (managed) {
    loop_options.server_url = args.server;
    loop_options.token = token;
    loop_options.ca_file = args.ca_file;
    loop_options.node_name = args.hostname;
    // The address other nodes reach this one at: --address, else the listen address when it is
    // a specific one.
    loop_options.address = !args.address.empty()       ? args.address
                           : !IsWildcard(listen->host) ? listen->host
                                                       : std::string("127.0.0.1");
    loop_options.rack = args.rack;
    loop_options.spine = args.spine;
    // A new key each start: the server learns it from the next sync, and root on the node reads
    // it from the data dir (agent status|inject).
    api_options.api_key = loop_options.api_key = agent::NewApiKey();
    if (auto key_error =
            agent::WriteApiKeyFile(core->data_dir() + "/api-key", api_options.api_key)) {
      fmt::print(stderr, "error: {}\n", *key_error);
      return kExitFailure;
    }
    loop = std::make_unique<agent::ControlLoop>(*core, loop_options);
    api_options.control_loop = loop.get();
  }
  api_options.http_counters = std::make_shared<net::HttpServerCounters>();
  net::Router router = agent::MakeAgentRouter(*core, api_options);
  server_options.counters = api_options.http_counters;
  auto started = net::HttpServer::Start(server_options, [&router](const net::HttpRequest& request) {
    return router.Handle(request);
  });
  if (!started.server) {
    fmt::print(stderr, "error: {}\n", started.error);
    return kExitFailure;
  }
  std::unique_ptr<net::HttpServer> server = std::move(started.server);

  std::string mode = "standalone (no control plane; API unauthenticated, loopback only)";
  if (loop) {
    // The server reads logs through this URL, which names the port only now known.
    loop->set_agent_url(fmt::format("{}://{}:{}", args.tls_cert.empty() ? "http" : "https",
                                    IsWildcard(listen->host) ? loop_options.address : listen->host,
                                    server->port()));
    if (auto loop_error = loop->Start()) {
      fmt::print(stderr, "error: {}\n", *loop_error);
      return kExitUsage;
    }
    mode =
        fmt::format("syncing with {} as node {} (address {}, agent URL {}, API key in {}/api-key)",
                    args.server, args.hostname.empty() ? core->hostname() : args.hostname,
                    loop_options.address, loop->options().agent_url, core->data_dir());
  }

  // One line that says what this agent is; scripts read the address from it.
  fmt::print(
      "gpufleet agent {}: backend {}, {}, listening on {}://{}, data dir {}, sampling "
      "every {}, {}, GPU shares {}, workloads run as {}, workload isolation {}, containers {}\n",
      kVersion, BackendDescription(*core), core->DescribeGpus(),
      args.tls_cert.empty() ? "http" : "https", server->address(), core->data_dir(),
      FormatInterval(core->sample_interval_ms()), mode,
      agent::GpuSharingModeName(core->gpu_sharing()), core->DescribeWorkloadUser(),
      core->DescribeWorkloadIsolation(), core->DescribeContainers());
  for (const std::string& note : core->startup_notes())
    fmt::print("  {}\n", note);
  if (loop && IsLoopback(loop_options.address)) {
    std::string server_error;
    auto server_url = net::ParseHttpUrl(args.server.substr(0, args.server.find(',')), server_error);
    if (server_url && !IsLoopback(server_url->host))
      fmt::print(
          "  warning: this node advertises address {}, which other nodes cannot reach "
          "(multi-node jobs get it as MASTER_ADDR); pass --address\n",
          loop_options.address);
  }
  std::fflush(stdout);

  int signal_number = 0;
  while (::sigwait(&stop_signals, &signal_number) != 0) {
  }
  size_t running = 0;
  for (const agent::WorkloadView& view : core->List())
    if (!view.status.Finished() && view.status.state != agent::WorkloadState::kLost) ++running;
  fmt::print(stderr,
             "gpufleet agent: {} received, stopping; {} workload(s) keep running under their "
             "shims (an agent started over {} re-adopts them)\n",
             agent::SignalName(signal_number), running, core->data_dir());
  if (loop) loop->Stop();
  server->Stop();
  server.reset();
  loop.reset();
  core.reset();
  return 0;
}

// `agent --fleet N`: simulated nodes only (no GPUs of this machine, no workloads, no API); one
// line of figures every 10 s, so a load test reads the fleet's side from its output.
int RunFleet(const AgentArgs& args) {
  std::string error;
  if (args.server.empty()) {
    fmt::print(stderr, "error: --fleet needs --server: the simulated nodes sync with it\n");
    return kExitUsage;
  }
  if (args.fleet < 0) {
    fmt::print(stderr, "error: --fleet {}: the number of simulated nodes, at least 1\n",
               args.fleet);
    return kExitUsage;
  }
  auto token = ResolveToken(args, error);
  if (!token) {
    fmt::print(stderr, "error: {}\n", error);
    return kExitUsage;
  }
  auto spread = agent::ParseDurationMs(args.fleet_spread);
  if (!spread || *spread < 0) {
    fmt::print(stderr, "error: --fleet-spread '{}': expected a duration such as 5s\n",
               args.fleet_spread);
    return kExitUsage;
  }
  if (args.fleet_threads < 1 || args.fleet_threads > 64) {
    fmt::print(stderr, "error: --fleet-threads {}: from 1 to 64\n", args.fleet_threads);
    return kExitUsage;
  }
  agent::FleetOptions options;
  options.server_url = args.server;
  options.token = std::move(*token);
  options.nodes = args.fleet;
  options.gpus_per_node = args.fleet_gpus;
  options.gpu_model = args.fleet_model;
  options.name_prefix = args.fleet_prefix;
  options.start_spread_ms = *spread;
  options.threads = args.fleet_threads;
  const sigset_t stop_signals = BlockStopSignals();
  const size_t file_limit = net::RaiseOpenFileLimit();
  if (file_limit < static_cast<size_t>(args.fleet) * 2 + 64)
    fmt::print(stderr,
               "warning: the open-file limit is {}; {} nodes hold up to {} connections (raise "
               "it with ulimit -n)\n",
               file_limit, args.fleet, args.fleet * 2);
  agent::Fleet fleet(options);
  if (auto start_error = fleet.Start()) {
    fmt::print(stderr, "error: {}\n", *start_error);
    return kExitUsage;
  }
  fmt::print(
      "gpufleet agent {}: backend fleet (simulated: {} nodes {}..{} x {} GPU(s) {}, tasks run "
      "as timed sleeps; docs/scale.md), syncing with {} from {}..{}\n",
      kVersion, args.fleet, fleet.NodeName(0), fleet.NodeName(args.fleet - 1), args.fleet_gpus,
      args.fleet_model, args.server, fleet.NodeAddress(0), fleet.NodeAddress(args.fleet - 1));
  std::fflush(stdout);
  const timespec tick{10, 0};
  for (;;) {
    siginfo_t info{};
    const int signal_number = ::sigtimedwait(&stop_signals, &info, &tick);
    const agent::FleetStats stats = fleet.Stats();
    fmt::print(
        "fleet: {}/{} nodes synced, {} syncs, {} sync errors, {} tasks running, {} launched, "
        "{} finished, {} cancelled, {} refused\n",
        stats.nodes_synced, args.fleet, stats.syncs, stats.sync_errors, stats.tasks_running,
        stats.launches, stats.finished, stats.cancelled, stats.refused);
    std::fflush(stdout);
    if (signal_number > 0) {
      fmt::print(stderr, "gpufleet agent --fleet: {} received, stopping\n",
                 agent::SignalName(signal_number));
      break;
    }
  }
  fleet.Stop();
  return 0;
}

// Copies what a workload writes to one of its log files to `out_fd`, following rotation: when
// the path names a new file, the old one (kept by our open descriptor) is read to its end first.
class LogFollower {
 public:
  LogFollower(std::string path, int out_fd) : path_(std::move(path)), out_fd_(out_fd) {}
  ~LogFollower() {
    if (fd_ >= 0) ::close(fd_);
  }
  LogFollower(const LogFollower&) = delete;
  LogFollower& operator=(const LogFollower&) = delete;

  void Pump() {
    if (fd_ < 0 && !OpenLive()) return;
    Drain();
    struct stat current {};
    if (::stat(path_.c_str(), &current) == 0 && current.st_ino != inode_) {
      Drain();
      ::close(fd_);
      fd_ = -1;
      if (OpenLive()) Drain();
    }
  }

 private:
  bool OpenLive() {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) return false;
    struct stat info {};
    ::fstat(fd_, &info);
    inode_ = info.st_ino;
    return true;
  }
  void Drain() {
    char buffer[65536];
    for (;;) {
      ssize_t got = ::read(fd_, buffer, sizeof buffer);
      if (got <= 0) return;
      for (ssize_t written = 0; written < got;) {
        ssize_t put = ::write(out_fd_, buffer + written, static_cast<size_t>(got - written));
        if (put <= 0) return;  // our own output is gone (closed pipe): nothing to do about it
        written += put;
      }
    }
  }

  std::string path_;
  int out_fd_;
  int fd_ = -1;
  ino_t inode_ = 0;
};

int RunLocal(const AgentArgs& args) {
  auto options = CoreOptions(args);
  if (!options) return kExitUsage;
  options->start_sampler = false;  // nothing here reads telemetry
  // One command run by hand, like `sudo cmd`: as the caller unless asked otherwise.
  if (args.workload_user == "auto") options->workload_user = "agent";
  if (args.workload_isolation == "auto")
    options->workload_isolation = agent::WorkloadIsolationMode::kNone;
  options->log = [](const std::string&) {};  // the workload's output is what is shown
  if (args.command.empty()) {
    fmt::print(stderr, "error: no command: gpufleet agent run [flags] -- COMMAND ARGS...\n");
    return kExitUsage;
  }
  agent::LaunchRequest request;
  request.argv = args.command;
  if (args.gpus < 0) {
    fmt::print(stderr, "error: --gpus must not be negative\n");
    return kExitUsage;
  }
  request.gpu_count = args.gpus;
  if (!args.cpu.empty()) {
    auto cpu = agent::ParseCpuMilli(args.cpu);
    if (!cpu) {
      fmt::print(stderr, "error: --cpu '{}': expected cores such as 0.5 or 500m\n", args.cpu);
      return kExitUsage;
    }
    request.cpu_milli = *cpu;
  }
  if (!args.memory.empty()) {
    auto memory = agent::ParseMemoryMib(args.memory);
    if (!memory) {
      fmt::print(stderr, "error: --memory '{}': expected a size such as 512Mi or 2Gi\n",
                 args.memory);
      return kExitUsage;
    }
    request.memory_mib = *memory;
  }
  auto grace = agent::ParseDurationMs(args.grace);
  if (!grace) {
    fmt::print(stderr, "error: --grace '{}': expected a duration such as 10s\n", args.grace);
    return kExitUsage;
  }
  request.grace_period_ms = *grace;
  if (!args.max_runtime.empty()) {
    auto max_runtime = agent::ParseDurationMs(args.max_runtime);
    if (!max_runtime) {
      fmt::print(stderr, "error: --max-runtime '{}': expected a duration such as 1h\n",
                 args.max_runtime);
      return kExitUsage;
    }
    request.max_runtime_ms = *max_runtime;
  }
  for (const std::string& entry : args.env) {
    size_t equals = entry.find('=');
    if (equals == std::string::npos || equals == 0) {
      fmt::print(stderr, "error: --env '{}': expected NAME=VALUE\n", entry);
      return kExitUsage;
    }
    request.env[entry.substr(0, equals)] = entry.substr(equals + 1);
  }
  request.container.image = args.image;
  request.container.user = args.user;
  for (const std::string& text : args.mounts) {
    std::string error;
    auto mount = ParseContainerMount(text, error);
    if (!mount) {
      fmt::print(stderr, "error: --mount {}\n", error);
      return kExitUsage;
    }
    request.container.mounts.push_back(std::move(*mount));
  }
  if (auto error = ValidateContainerSpec(request.container)) {
    fmt::print(stderr, "error: {}\n", *error);
    return kExitUsage;
  }
  if (!args.image.empty()) {
    // Inside the container: the image's paths, not ours.
    if (!args.workdir.empty() && args.workdir.front() != '/') {
      fmt::print(stderr, "error: --workdir '{}': with --image, give a path inside the container\n",
                 args.workdir);
      return kExitUsage;
    }
    request.workdir = args.workdir;
  } else {
    std::error_code fs_error;
    // Like a shell: the command runs where it was typed, unless told otherwise.
    request.workdir = std::filesystem::absolute(args.workdir.empty() ? "." : args.workdir, fs_error)
                          .lexically_normal()
                          .string();
    if (request.workdir.size() > 1 && request.workdir.back() == '/') request.workdir.pop_back();
  }

  const sigset_t stop_signals = BlockStopSignals();
  const int signal_fd = ::signalfd(-1, &stop_signals, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signal_fd < 0) {
    fmt::print(stderr, "error: signalfd: {}\n", std::strerror(errno));
    return kExitFailure;
  }

  auto opened = AgentCore::Open(*options);
  if (!opened.ok()) {
    fmt::print(stderr, "error: {}\n", opened.error().message);
    ::close(signal_fd);
    return ExitCodeOf(opened.error().kind);
  }
  std::unique_ptr<AgentCore> core = std::move(opened).value();
  auto launched = core->Launch(request);
  if (!launched.ok()) {
    fmt::print(stderr, "error: {}\n", launched.error().message);
    ::close(signal_fd);
    return ExitCodeOf(launched.error().kind);
  }
  const std::string id = launched.value().status.id;
  {
    const agent::WorkloadView& view = launched.value();
    std::string limits;
    if (request.cpu_milli > 0 || request.memory_mib > 0)
      limits = view.status.limits_applied
                   ? fmt::format(", cgroup {} limits cpu {}m memory {} MiB",
                                 agent::CgroupVersionName(view.status.cgroup_version),
                                 request.cpu_milli, request.memory_mib)
                   : fmt::format(", NO limits: {}", view.status.limits_warning);
    Note("workload {} on GPUs {} of {} [{}], pid {}{}", id,
         view.spec.gpu_indices.empty() ? std::string("none")
                                       : fmt::format("{}", fmt::join(view.spec.gpu_indices, ",")),
         core->DescribeGpus(), core->backend_name(), view.status.pid, limits);
  }

  LogFollower out(launched.value().status.stdout_log, STDOUT_FILENO);
  LogFollower err(launched.value().status.stderr_log, STDERR_FILENO);
  int interrupts = 0;
  agent::WorkloadStatus status = launched.value().status;
  while (!status.Finished() && status.state != agent::WorkloadState::kLost) {
    pollfd wait{signal_fd, POLLIN, 0};
    // The shim writes the logs; 50 ms keeps the echo prompt without busy-waiting.
    ::poll(&wait, 1, 50);
    signalfd_siginfo info{};
    while (::read(signal_fd, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
      ++interrupts;
      const TimeMs grace_ms = interrupts == 1 ? request.grace_period_ms : 0;
      if (auto cancelled = core->Cancel(id, grace_ms); !cancelled.ok())
        Note("cancel failed: {}", cancelled.error().message);
      else if (interrupts == 1)
        Note("{}: cancelling {} (SIGTERM, SIGKILL after {}; interrupt again to kill now)",
             agent::SignalName(static_cast<int32_t>(info.ssi_signo)), id,
             FormatInterval(request.grace_period_ms));
      else
        Note("killing {} now", id);
    }
    out.Pump();
    err.Pump();
    auto current = core->Get(id);
    if (!current.ok()) {
      Note("lost track of workload {}: {}", id, current.error().message);
      ::close(signal_fd);
      return kExitFailure;
    }
    status = current.value().status;
  }
  // The shim drained the workload's pipes before recording the end: the logs are complete.
  out.Pump();
  err.Pump();
  ::close(signal_fd);

  int exit_code = kExitFailure;
  const double seconds =
      status.finished_at_ms > status.started_at_ms && status.started_at_ms > 0
          ? static_cast<double>(status.finished_at_ms - status.started_at_ms) / 1000.0
          : 0.0;
  if (status.state == agent::WorkloadState::kFailedToStart) {
    Note("workload {} failed to start: {}", id, status.error);
    exit_code = kExitCannotRun;
  } else if (status.state == agent::WorkloadState::kLost) {
    Note("workload {} is lost: {}", id, status.error);
  } else if (status.signal) {
    Note("workload {} was killed by {}{}{} after {:.2f} s", id, agent::SignalName(*status.signal),
         status.cancelled ? " (cancelled)" : "", status.oom_killed ? " (OOM-killed)" : "", seconds);
    exit_code = 128 + *status.signal;
  } else {
    exit_code = status.exit_code.value_or(kExitFailure);
    Note("workload {} exited with code {}{} after {:.2f} s", id, exit_code,
         status.timed_out ? " (timed out)" : "", seconds);
  }
  if (!args.keep && status.state != agent::WorkloadState::kLost) {
    if (auto forgot = core->Forget(id))
      Note("could not remove workload {}: {}", id, forgot->message);
  } else {
    Note("kept {}/workloads/{}", core->data_dir(), id);
  }
  return exit_code;
}

std::string AgentUrl(const AgentArgs& args, std::string_view path) {
  std::string base = args.agent_url;
  while (!base.empty() && base.back() == '/')
    base.pop_back();
  return base + std::string(path);
}

// The agent's {"error": ...} message, or the body as it came.
std::string ErrorMessage(const net::HttpClientResponse& response) {
  auto body = nlohmann::json::parse(response.body, nullptr, false);
  if (body.is_object() && body.contains("error") && body["error"].is_string())
    return body["error"].get<std::string>();
  return fmt::format("HTTP {}: {}", response.status, response.body);
}

// How `agent status|inject` call the agent: with its key (--api-key-file, else the data dir's
// api-key when there is one: a managed agent wants it, a standalone one has none).
std::optional<net::HttpCallOptions> AgentCall(const AgentArgs& args) {
  net::HttpCallOptions call;
  call.ca_file = args.ca_file_for_agent;
  std::string path = args.api_key_file;
  if (path.empty()) {
    path = args.data_dir + "/api-key";
    if (::access(path.c_str(), F_OK) != 0) return call;
  }
  std::string error;
  auto key = agent::ReadApiKeyFile(path, error);
  if (!key) {
    fmt::print(stderr, "error: {}\n", error);
    return std::nullopt;
  }
  call.headers.emplace_back("Authorization", "Bearer " + *key);
  return call;
}

int RunInject(const AgentArgs& args) {
  nlohmann::ordered_json body = {{"gpu", args.gpu}, {"kind", args.kind}, {"code", args.code}};
  const std::string url = AgentUrl(args, "/v1/sim/faults");
  auto call = AgentCall(args);
  if (!call) return kExitUsage;
  call->body = body.dump();
  net::HttpResult result = net::HttpCall("POST", url, *call);
  if (!result.ok()) {
    fmt::print(stderr, "error: {}\n", result.error);
    return kExitFailure;
  }
  const net::HttpClientResponse& response = *result.response;
  if (response.status != 200) {
    fmt::print(stderr, "error: {}\n", ErrorMessage(response));
    return response.status == 400 ? kExitUsage : kExitFailure;
  }
  auto gpu = nlohmann::json::parse(response.body, nullptr, false);
  if (args.json || !gpu.is_object()) {
    fmt::print("{}", response.body);
    return 0;
  }
  std::string health = "healthy";
  if (!gpu.value("healthy", true)) {
    std::vector<std::string> reasons = gpu.value("health_reasons", std::vector<std::string>{});
    health = fmt::format("UNHEALTHY: {}", fmt::join(reasons, "; "));
  }
  fmt::print("injected {} (code {}) on GPU {} ({}): now {}\n", args.kind, args.code, args.gpu,
             gpu.value("uuid", ""), health);
  return 0;
}

std::string Cell(const nlohmann::json& value, std::string_view unit = "") {
  if (value.is_null()) return "-";
  if (value.is_number_float()) return fmt::format("{:.0f}{}", value.get<double>(), unit);
  if (value.is_number()) return fmt::format("{}{}", value.dump(), unit);
  if (value.is_string()) return value.get<std::string>();
  return value.dump();
}

int RunStatus(const AgentArgs& args) {
  std::vector<nlohmann::json> documents;
  auto call = AgentCall(args);
  if (!call) return kExitUsage;
  for (std::string_view path : {"/healthz", "/v1/gpus", "/v1/workloads"}) {
    net::HttpResult result = net::HttpCall("GET", AgentUrl(args, path), *call);
    if (!result.ok()) {
      fmt::print(stderr, "error: {}\n", result.error);
      return kExitFailure;
    }
    auto document = nlohmann::json::parse(result.response->body, nullptr, false);
    if (result.response->status == 401) {
      fmt::print(stderr, "error: {}{}: {}\n", args.agent_url, path, ErrorMessage(*result.response));
      return kExitFailure;
    }
    if (document.is_discarded() || !document.is_object()) {
      fmt::print(stderr, "error: {}{}: not a gpufleet agent answer (HTTP {})\n", args.agent_url,
                 path, result.response->status);
      return kExitFailure;
    }
    documents.push_back(std::move(document));
  }
  const nlohmann::json& health = documents[0];
  const nlohmann::json& gpus = documents[1];
  const nlohmann::json& workloads = documents[2];
  if (args.json) {
    nlohmann::ordered_json all = {{"health", health}, {"gpus", gpus}, {"workloads", workloads}};
    fmt::print("{}\n", all.dump(2));
    return 0;
  }
  fmt::print("agent {} on {}: {}, backend {} (driver {}), {} of {} GPUs healthy\n", args.agent_url,
             health.value("hostname", "?"), health.value("status", "?"),
             health.value("backend", "?"), health.value("driver_version", "?"),
             health.value("healthy_gpus", 0), health.value("gpus", 0));
  fmt::print("\n{:<4} {:<12} {:>5} {:>16} {:>5} {:>6}  {:<20} {}\n", "GPU", "MODEL", "UTIL",
             "MEMORY USED MiB", "TEMP", "POWER", "WORKLOADS", "HEALTH");
  for (const auto& gpu : gpus.value("gpus", nlohmann::json::array())) {
    const nlohmann::json& sample = gpu.value("sample", nlohmann::json::object());
    std::string health_text = "healthy";
    if (!gpu.value("healthy", true))
      health_text =
          fmt::format("UNHEALTHY: {}",
                      fmt::join(gpu.value("health_reasons", std::vector<std::string>{}), "; "));
    std::vector<std::string> holders = gpu.value("workloads", std::vector<std::string>{});
    fmt::print("{:<4} {:<12} {:>5} {:>16} {:>5} {:>6}  {:<20} {}\n", Cell(gpu["index"]),
               Cell(gpu["model"]), Cell(sample.value("utilization_percent", nlohmann::json()), "%"),
               fmt::format("{} / {}", Cell(sample.value("memory_used_mib", nlohmann::json())),
                           Cell(gpu["memory_total_mib"])),
               Cell(sample.value("temperature_c", nlohmann::json()), "C"),
               Cell(sample.value("power_w", nlohmann::json()), "W"),
               holders.empty() ? std::string("-") : fmt::format("{}", fmt::join(holders, ",")),
               health_text);
  }
  const auto& list = workloads.value("workloads", nlohmann::json::array());
  fmt::print("\n{:<16} {:<18} {:<8} {:>8}  {:<20} {}\n", "WORKLOAD", "STATE", "GPUS", "PID",
             "RESULT", "COMMAND");
  if (list.empty()) fmt::print("(none)\n");
  for (const auto& workload : list) {
    std::string result = "-";
    if (!workload.value("signal_name", nlohmann::json()).is_null())
      result = workload["signal_name"].get<std::string>();
    else if (!workload.value("exit_code", nlohmann::json()).is_null())
      result = fmt::format("exit {}", workload["exit_code"].get<int>());
    if (workload.value("cancelled", false)) result += " (cancelled)";
    std::vector<int> indices = workload.value("gpus", std::vector<int>{});
    std::vector<std::string> argv = workload.value("argv", std::vector<std::string>{});
    std::string state = workload.value("state", "?");
    if (workload.value("adopted", false) && (state == "running" || state == "starting"))
      state += " (adopted)";
    fmt::print("{:<16} {:<18} {:<8} {:>8}  {:<20} {}\n", workload.value("id", "?"), state,
               indices.empty() ? std::string("-") : fmt::format("{}", fmt::join(indices, ",")),
               workload.value("pid", 0), result, fmt::join(argv, " "));
  }
  return 0;
}

}  // namespace

CLI::App* AddAgentCommand(CLI::App& app, AgentArgs& args) {
  CLI::App* agent = app.add_subcommand(
      "agent",
      "Run the node agent: GPU discovery, telemetry (/metrics), health and workload execution");
  agent->add_flag("--standalone", args.standalone,
                  "Run without a control plane (the default without --server)");
  agent->add_option("--server", args.server,
                    "The control plane's URL (http://HOST:PORT): sync with it and run its tasks; "
                    "a leader and its standbys comma-separated (docs/ha.md)");
  agent->add_option("--token", args.token,
                    "The agent token for --server (else --token-file or $GPUFLEET_TOKEN)");
  agent->add_option("--token-file", args.token_file, "A file whose first line is the token");
  agent->add_option("--ca-file", args.ca_file,
                    "PEM CA that signed an https:// --server's certificate (default: the "
                    "system's CAs)");
  agent->add_option("--address", args.address,
                    "The IP other nodes reach this one at (MASTER_ADDR; default: the --listen "
                    "host, or 127.0.0.1)");
  agent->add_option("--rack", args.rack, "This node's rack (leaf switch), for placement");
  agent->add_option("--spine", args.spine, "This node's spine switch, for placement");
  agent
      ->add_option("--listen", args.listen,
                   "HTTP API address (port 0: any free port); standalone: loopback only")
      ->capture_default_str();
  agent->add_option("--tls-cert", args.tls_cert,
                    "Serve the agent's API over HTTPS with this PEM certificate; needs --tls-key");
  agent->add_option("--tls-key", args.tls_key, "The PEM private key of --tls-cert");
  agent->add_option("--interval", args.interval, "GPU sampling interval")->capture_default_str();
  AddBackendOptions(*agent, args);
  agent->add_option("--fleet", args.fleet,
                    "Simulate N nodes in this process for load tests of the control plane: each "
                    "syncs with --server from its own loopback address and runs tasks as timed "
                    "sleeps (only `sleep SECONDS`; docs/scale.md)");
  agent->add_option("--fleet-gpus", args.fleet_gpus, "GPUs of each --fleet node")
      ->capture_default_str();
  agent->add_option("--fleet-model", args.fleet_model, "GPU model of the --fleet nodes")
      ->capture_default_str();
  agent
      ->add_option("--fleet-prefix", args.fleet_prefix,
                   "Names of the --fleet nodes: PREFIX00001...")
      ->capture_default_str();
  agent
      ->add_option("--fleet-spread", args.fleet_spread,
                   "The --fleet nodes start one after another over this long")
      ->capture_default_str();
  agent->add_option("--fleet-threads", args.fleet_threads, "Network threads of the --fleet")
      ->capture_default_str();

  args.run = agent->add_subcommand(
      "run", "Run one command on free GPUs of this machine, in-process (no daemon needed)");
  args.run->add_option("--gpus", args.gpus, "Number of GPUs (the agent picks free healthy ones)")
      ->capture_default_str();
  args.run->add_option("--cpu", args.cpu, "CPU limit in cores (0.5 or 500m)");
  args.run->add_option("--memory", args.memory, "Memory limit (512Mi, 2Gi)");
  args.run->add_option("--grace", args.grace, "On Ctrl-C: SIGTERM, then SIGKILL after this long")
      ->capture_default_str();
  args.run->add_option("--max-runtime", args.max_runtime, "Stop the command after this long");
  args.run->add_option("--env", args.env, "NAME=VALUE for the command's environment (repeatable)")
      ->allow_extra_args(false);  // one value per --env, so the command cannot be swallowed
  args.run->add_option("--workdir", args.workdir, "Directory to run in (default: the current one)");
  args.run->add_option("--image", args.image,
                       "Run it in a container from this image (a reference, or an image "
                       "archive's absolute path)");
  args.run->add_option("--mount", args.mounts, "SOURCE:TARGET[:ro|rw] with --image (repeatable)")
      ->allow_extra_args(false);
  args.run->add_option("--user", args.user, "UID[:GID] inside the container");
  args.run->add_flag("--keep", args.keep, "Keep the workload's directory and logs afterwards");
  AddBackendOptions(*args.run, args);
  args.run->add_option("command", args.command, "The command and its arguments, after --");

  args.inject = agent->add_subcommand(
      "inject", "Inject a simulated GPU fault into a running agent (only with --sim-gpus)");
  args.inject->add_option("--agent", args.agent_url, "The agent's URL")->capture_default_str();
  args.inject->add_option("--gpu", args.gpu, "GPU index")->required();
  args.inject->add_option("--kind", args.kind, "xid, ecc, row_remap, lost, temperature or clear")
      ->required();
  args.inject->add_option("--code", args.code,
                          "xid: the XID; ecc: errors to add; row_remap: 1 pending, 2 failure; "
                          "temperature: degrees C");
  args.inject->add_flag("--json", args.json, "Print the GPU as JSON");

  args.status =
      agent->add_subcommand("status", "Show a running agent's GPUs, health and workloads");
  args.status->add_option("--agent", args.agent_url, "The agent's URL")->capture_default_str();
  args.status->add_flag("--json", args.json, "Print the agent's answers as JSON");
  for (CLI::App* command : {args.inject, args.status}) {
    command->add_option("--api-key-file", args.api_key_file,
                        "The agent's API key (default: .gpufleet/agent/api-key when it exists)");
    command->add_option("--ca-file", args.ca_file_for_agent, "PEM CA of an https:// --agent");
  }
  return agent;
}

int RunAgent(const AgentArgs& args) {
  if (*args.run) return RunLocal(args);
  if (*args.inject) return RunInject(args);
  if (*args.status) return RunStatus(args);
  if (args.fleet != 0) return RunFleet(args);
  return RunDaemon(args);
}

int RunAgentShim(int argc, char** argv) {
  return agent::RunShim(argc, argv);
}

}  // namespace gpufleet::cli
