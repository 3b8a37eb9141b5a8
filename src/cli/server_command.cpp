#include "cli/server_command.h"

#include <csignal>
#include <ctime>
#include <filesystem>
#include <mutex>
#include <optional>

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include "agent/agent_api.h"
#include "api/json.h"
#include "cli/stop_signals.h"
#include "core/quantity.h"
#include "core/version.h"
#include "net/http_client.h"
#include "net/http_server.h"
#include "net/server_urls.h"
#include "sched/policy.h"
#include "server/server.h"
#include "sim/queues.h"
#include "store/etcd_store.h"

namespace gpufleet::cli {
namespace {

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

std::string FormatMs(TimeMs ms) {
  return ms % 1000 == 0 ? fmt::format("{}s", ms / 1000) : fmt::format("{}ms", ms);
}

// Builds the options from the flags; nothing (after printing why) when a flag is invalid.
std::optional<server::ServerOptions> Options(const ServerArgs& args) {
  server::ServerOptions options;
  options.data_dir = args.data_dir;
  std::string error;
  auto listen = agent::ParseListenAddress(args.listen, error);
  if (!listen) {
    fmt::print(stderr, "error: {}\n", error);
    return std::nullopt;
  }
  options.host = listen->host;
  options.port = listen->port;
  auto timeout = PositiveDuration("--node-timeout", args.node_timeout);
  auto heartbeat = PositiveDuration("--heartbeat", args.heartbeat);
  auto interval = PositiveDuration("--schedule-interval", args.schedule_interval);
  if (!timeout || !heartbeat || !interval) return std::nullopt;
  if (*heartbeat >= *timeout) {
    fmt::print(stderr,
               "error: --heartbeat {} must be shorter than --node-timeout {}, or every node "
               "would be lost between two syncs\n",
               args.heartbeat, args.node_timeout);
    return std::nullopt;
  }
  options.node_timeout_ms = *timeout;
  options.heartbeat_ms = *heartbeat;
  options.schedule_interval_ms = *interval;
  auto scheduler = SchedulerConfigFrom(args.scheduler);
  auto idle_timeout = scheduler ? IdleGpuTimeoutMs(args.scheduler) : std::nullopt;
  if (!scheduler || !idle_timeout) return std::nullopt;
  options.scheduler = std::move(*scheduler);
  options.idle_gpu_timeout_ms = *idle_timeout;
  if (args.tls_cert.empty() != args.tls_key.empty()) {
    fmt::print(stderr,
               "error: --tls-cert and --tls-key go together: give both for HTTPS, or "
               "neither for plain HTTP\n");
    return std::nullopt;
  }
  options.tls_cert_file = args.tls_cert;
  options.tls_key_file = args.tls_key;
  options.agent_ca_file = args.agent_ca_file;
  if (args.token_rate_limit < 0) {
    fmt::print(stderr, "error: --token-rate-limit must be 0 (none) or more requests/s\n");
    return std::nullopt;
  }
  options.token_rate_limit = args.token_rate_limit;
  options.max_connections_per_client = args.max_connections_per_client;
  options.max_connections = args.max_connections;
  if (!args.checkpoint_root.empty() && args.checkpoint_root.front() != '/') {
    fmt::print(stderr,
               "error: --checkpoint-root '{}' must be an absolute path (agents resolve it on "
               "their own machines)\n",
               args.checkpoint_root);
    return std::nullopt;
  }
  options.checkpoint_root = args.checkpoint_root;
  options.log = [](const std::string& line) {
    const std::time_t now = std::time(nullptr);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", std::localtime(&now));
    fmt::print(stderr, "{} gpufleet server: {}\n", stamp, line);
  };
  return options;
}

// The first start of a data dir mints an admin token and says where it is; later starts say
// where it was written.
int EnsureAdminToken(server::Server& server, const std::string& data_dir) {
  const std::string path = (std::filesystem::path(data_dir) / "admin-token").string();
  if (server.HasAdminToken()) {
    if (std::filesystem::exists(path))
      fmt::print("  admin token: in {}\n", path);
    else
      fmt::print("  admin token: none on file ({} is gone); ask an admin for a token\n", path);
    return 0;
  }
  auto created = server.CreateToken("admin", "", api::Role::kAdmin, "gpufleet server");
  if (!created.token) {
    fmt::print(stderr, "error: cannot create the first admin token: {}\n", created.error);
    return kExitFailure;
  }
  if (std::string error = server::WritePrivateFile(path, created.token->secret + "\n");
      !error.empty()) {
    fmt::print(stderr, "error: cannot write the first admin token: {}\n", error);
    return kExitFailure;
  }
  fmt::print("  admin token: created {} and wrote it to {} (mode 0600, shown nowhere else)\n",
             created.token->info.id, path);
  return 0;
}

}  // namespace

std::optional<std::vector<sched::QueueConfig>> LoadServerQueues(const std::string& path) {
  std::vector<sim::QueueEntry> entries;
  try {
    entries = sim::LoadQueuesFile(path);
  } catch (const sim::QueuesError& error) {
    fmt::print(stderr, "error: --queues {}\n", error.what());
    return std::nullopt;
  }
  std::vector<sched::QueueConfig> queues;
  for (sim::QueueEntry& entry : entries) {
    if (!entry.members.empty()) {
      fmt::print(stderr,
                 "error: --queues {}: queue '{}' has 'members', which maps trace jobs in the "
                 "simulator; jobs on a cluster name their queue\n",
                 path, entry.config.name);
      return std::nullopt;
    }
    queues.push_back(std::move(entry.config));
  }
  return queues;
}

std::string DescribeQueues(const std::vector<sched::QueueConfig>& queues) {
  std::vector<std::string> parts;
  for (const sched::QueueConfig& queue : queues) {
    std::string guarantee;
    if (queue.PerModel()) {
      std::vector<std::string> models;
      for (const auto& [model, milli] : queue.guaranteed_milli_by_model)
        models.push_back(fmt::format("{} {}", api::FormatGpus(milli), model));
      guarantee = fmt::format("{}", fmt::join(models, " + "));
    } else {
      guarantee = fmt::format("{} GPUs", api::FormatGpus(queue.guaranteed_milli));
    }
    parts.push_back(fmt::format(
        "{} (guarantee {}{}{})", queue.name, guarantee,
        queue.cohort.empty() ? "" : ", cohort " + queue.cohort,
        queue.borrowing_limit_milli
            ? fmt::format(", borrows up to {}", api::FormatGpus(*queue.borrowing_limit_milli))
            : ""));
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

std::optional<TimeMs> PositiveDuration(const std::string& flag, const std::string& text) {
  auto ms = ParseDurationMs(text);
  if (!ms || *ms <= 0) {
    fmt::print(stderr, "error: {} '{}': expected a positive duration such as 30s or 500ms\n", flag,
               text);
    return std::nullopt;
  }
  return ms;
}

std::string DescribeScheduler(const sched::SchedulerConfig& config) {
  std::string text = fmt::format("{} (backfill {}, placement {}", sched::Name(config.order),
                                 sched::Name(config.backfill), sched::Name(config.placement));
  if (config.preempt) text += ", preemption";
  if (config.order == sched::QueueOrder::kFairShare) {
    const int64_t half_life = config.fair_share_half_life_s;
    text += half_life % 86400 == 0  ? fmt::format(", usage half-life {}d", half_life / 86400)
            : half_life % 3600 == 0 ? fmt::format(", usage half-life {}h", half_life / 3600)
                                    : fmt::format(", usage half-life {}s", half_life);
  }
  return text + ")";
}

void AddSchedulerOptions(CLI::App& command, SchedulerArgs& args) {
  command
      .add_option("--policy", args.policy,
                  fmt::format("Queue order: {}", fmt::join(sched::QueueOrderNames(), ", ")))
      ->capture_default_str();
  command.add_option(
      "--backfill", args.backfill,
      fmt::format("Backfill: {} (default: the policy's)", fmt::join(sched::BackfillNames(), ", ")));
  command
      .add_option("--placement", args.placement,
                  fmt::format("Placement: {}", fmt::join(sched::PlacementPolicyNames(), ", ")))
      ->capture_default_str();
  command.add_flag("--preempt", args.preempt,
                   "Let pending jobs preempt lower-ranked running jobs (las always preempts)");
  command
      .add_option("--fair-share-half-life", args.fair_share_half_life,
                  "fairshare: half-life of past GPU usage, such as 7d or 12h (Slurm's "
                  "PriorityDecayHalfLife)")
      ->capture_default_str();
  command
      .add_option("--idle-gpu-timeout", args.idle_gpu_timeout,
                  "Flag a running job whose GPUs stay at most 1 % utilized this long (0 or off: "
                  "never); queues with reclaim_idle preempt it while others wait")
      ->capture_default_str();
  command.add_option("--queues", args.queues_file,
                     "Team queues with guaranteed GPU quotas, cohorts, borrowing limits and "
                     "fair-share weights (YAML, docs/quotas.md); jobs must name one of them");
}

std::optional<TimeMs> IdleGpuTimeoutMs(const SchedulerArgs& args) {
  if (args.idle_gpu_timeout == "off") return 0;
  auto ms = ParseDurationMs(args.idle_gpu_timeout);
  if (!ms || *ms < 0) {
    fmt::print(stderr,
               "error: --idle-gpu-timeout '{}': expected a duration such as 30m or 2h, or off\n",
               args.idle_gpu_timeout);
    return std::nullopt;
  }
  return ms;
}

std::optional<sched::SchedulerConfig> SchedulerConfigFrom(const SchedulerArgs& args) {
  sched::SchedulerConfig config;
  auto order = sched::ParseQueueOrder(args.policy);
  if (!order) {
    fmt::print(stderr, "error: --policy '{}': expected one of {}\n", args.policy,
               fmt::join(sched::QueueOrderNames(), ", "));
    return std::nullopt;
  }
  config.order = *order;
  config.backfill = sched::DefaultBackfill(*order);
  if (!args.backfill.empty()) {
    auto backfill = sched::ParseBackfill(args.backfill);
    if (!backfill) {
      fmt::print(stderr, "error: --backfill '{}': expected one of {}\n", args.backfill,
                 fmt::join(sched::BackfillNames(), ", "));
      return std::nullopt;
    }
    config.backfill = *backfill;
  }
  auto placement = sched::ParsePlacementPolicy(args.placement);
  if (!placement) {
    fmt::print(stderr, "error: --placement '{}': expected one of {}\n", args.placement,
               fmt::join(sched::PlacementPolicyNames(), ", "));
    return std::nullopt;
  }
  config.placement = *placement;
  config.preempt = args.preempt;
  auto half_life = ParseDurationMs(args.fair_share_half_life);
  if (!half_life || *half_life < kMsPerSecond) {
    fmt::print(stderr,
               "error: --fair-share-half-life '{}': expected a duration of at least 1s, such as "
               "7d or 12h\n",
               args.fair_share_half_life);
    return std::nullopt;
  }
  config.fair_share_half_life_s = *half_life / kMsPerSecond;
  if (!args.queues_file.empty()) {
    auto queues = LoadServerQueues(args.queues_file);
    if (!queues) return std::nullopt;
    config.queues = std::move(*queues);
  }
  return config;
}

CLI::App* AddServerCommand(CLI::App& app, ServerArgs& args) {
  CLI::App* command = app.add_subcommand(
      "server", "Run the control plane: the HTTP API, the scheduler and the state store");
  command->add_option("--data-dir", args.data_dir, "State: the store, the first admin token")
      ->capture_default_str();
  command
      ->add_option("--store", args.store,
                   "sqlite (DATA_DIR/state.db), or etcd://HOST:PORT,...[/PREFIX] for servers "
                   "that share one state: one leads, the others wait as standbys")
      ->capture_default_str();
  command->add_option("--advertise-url", args.advertise_url,
                      "With etcd: the URL clients reach this server at, which standbys "
                      "redirect them to while it leads (default: from --listen)");
  command
      ->add_option("--etcd-lease", args.etcd_lease,
                   "With etcd: how long the lock of a server that died outlives it, so how "
                   "soon a standby takes over")
      ->capture_default_str();
  command->add_option("--listen", args.listen, "Address to serve the API on (HOST:PORT)")
      ->capture_default_str();
  command
      ->add_option("--node-timeout", args.node_timeout,
                   "A node that has not synced for this long is lost; its jobs are requeued")
      ->capture_default_str();
  command->add_option("--heartbeat", args.heartbeat, "How often agents must sync")
      ->capture_default_str();
  command
      ->add_option("--schedule-interval", args.schedule_interval,
                   "A scheduling cycle at least this often (and on every change)")
      ->capture_default_str();
  AddSchedulerOptions(*command, args.scheduler);
  command->add_option("--tls-cert", args.tls_cert,
                      "Serve HTTPS with this PEM certificate (chain); needs --tls-key");
  command->add_option("--tls-key", args.tls_key, "The PEM private key of --tls-cert");
  command
      ->add_option("--token-rate-limit", args.token_rate_limit,
                   "Requests/s each user token may make (bursts of twice that); beyond it "
                   "429 with Retry-After; admin tokens are not limited; 0: no limit")
      ->capture_default_str();
  command
      ->add_option("--max-connections-per-client", args.max_connections_per_client,
                   "Connections one client address may hold open at once; more are answered "
                   "503 (raise it for many users behind one NAT or proxy); 0: no limit")
      ->capture_default_str();
  command->add_option("--max-connections", args.max_connections,
                      "Connections open at once in all (each agent holds one); more are "
                      "answered 503 (default 0: half the open-file limit, at most 10000)");
  command->add_option("--agent-ca-file", args.agent_ca_file,
                      "PEM CA that signed the certificates of agents serving HTTPS "
                      "(agent --tls-cert); default: the system's CAs");
  command->add_option("--checkpoint-root", args.checkpoint_root,
                      "Shared storage every node mounts here: jobs checkpoint to "
                      "<root>/job-<id> (default: each agent's data dir)");
  return command;
}

namespace {

// Where clients reach this server: --advertise-url, or the --listen address (this host's name
// when it listens on every address). Empty when the port is left to the kernel (0).
std::string AdvertisedUrl(const ServerArgs& args, const server::ServerOptions& options) {
  if (!args.advertise_url.empty()) return args.advertise_url;
  if (options.port == 0) return "";
  std::string host = options.host;
  if (host == "0.0.0.0" || host == "::" || host.empty()) {
    char name[256] = {};
    ::gethostname(name, sizeof name - 1);
    host = name;
  } else if (host.find(':') != std::string::npos) {
    host = "[" + host + "]";
  }
  return fmt::format("{}://{}:{}", options.tls_cert_file.empty() ? "http" : "https", host,
                     options.port);
}

// What a standby answers while it waits, on the address it will serve from once it leads:
// every request is redirected (307, method and body kept) to the leader the lock names, or,
// before one is known, refused with 503; /healthz and /readyz say "standby". Every answer has
// the Gpufleet-Role: standby header, by which clients move on (net::ServerUrls).
class StandbyResponder {
 public:
  void SetLeader(const store::EtcdLockHeld& held) {
    std::lock_guard lock(mutex_);
    holder_ = held.holder();
    url_ = held.url();
  }

  net::HttpResponse Answer(const net::HttpRequest& request) const {
    std::string holder, url;
    {
      std::lock_guard lock(mutex_);
      holder = holder_;
      url = url_;
    }
    net::HttpResponse response;
    if (request.path == "/healthz" || request.path == "/readyz") {
      response = net::HttpResponse::Json(
          503, nlohmann::json{{"role", "standby"}, {"leader", holder}, {"leader_url", url}}.dump());
    } else if (!url.empty()) {
      response = net::HttpResponse::Error(
          307,
          fmt::format("this gpufleet server is a standby; the leader ({}) is at {}", holder, url));
      response.headers.emplace_back("Location", url + request.target);
    } else {
      response = net::HttpResponse::Error(
          503, fmt::format("this gpufleet server is a standby; the leader ({}) gave no URL to "
                           "redirect to (gpufleet server --advertise-url)",
                           holder.empty() ? "unknown" : holder));
      response.headers.emplace_back("Retry-After", "1");
    }
    response.headers.emplace_back(std::string(net::kServerRoleHeader), "standby");
    return response;
  }

 private:
  mutable std::mutex mutex_;
  std::string holder_, url_;
};

// With an etcd store: the store, once this server holds its lock. A standby waits here, saying
// so once and answering clients with redirects to the leader (`standby_http`), until the
// leader's lock is gone (it stopped, or its lease ran out) or a stop signal comes (then
// nothing, and `stopped`). Throws StoreError for anything but a held lock.
std::unique_ptr<store::Store> WaitForEtcdLock(const store::EtcdOptions& etcd,
                                              const net::HttpServerOptions& standby_http,
                                              const sigset_t& stop_signals, bool& stopped) {
  bool said = false;
  auto responder = std::make_shared<StandbyResponder>();
  std::unique_ptr<net::HttpServer> standby;
  while (true) {
    try {
      auto opened = store::OpenEtcdStore(etcd);
      if (standby) standby->Stop();  // frees the address for the leader's own listener
      return opened;
    } catch (const store::EtcdLockHeld& held) {
      responder->SetLeader(held);
      if (!said) {
        fmt::print("gpufleet server {}: standby: {}; taking over when it is free\n", kVersion,
                   held.what());
        auto started = net::HttpServer::Start(
            standby_http,
            [responder](const net::HttpRequest& request) { return responder->Answer(request); });
        if (started.server) {
          standby = std::move(started.server);
          fmt::print("  standby on {}: clients are redirected to the leader\n", standby->address());
        } else {
          fmt::print(
              "  standby: not answering clients ({}); they find the leader in their "
              "server list\n",
              started.error);
        }
        std::fflush(stdout);
        said = true;
      }
    }
    const timespec pause{0, 250'000'000};
    siginfo_t info{};
    if (::sigtimedwait(&stop_signals, &info, &pause) > 0) {
      stopped = true;
      return nullptr;
    }
  }
}

}  // namespace

int RunServer(const ServerArgs& args) {
  auto options = Options(args);
  if (!options) return kExitUsage;
  std::optional<store::EtcdOptions> etcd;
  if (args.store != "sqlite") {
    std::string error;
    etcd = store::ParseEtcdUrl(args.store, error);
    auto lease_ms = etcd ? PositiveDuration("--etcd-lease", args.etcd_lease) : std::nullopt;
    if (!etcd) fmt::print(stderr, "error: --store {}\n", error);
    if (!etcd || !lease_ms) return kExitUsage;
    etcd->lease_ttl_s = static_cast<int>(std::max<TimeMs>(2, (*lease_ms + 999) / 1000));
    etcd->url = AdvertisedUrl(args, *options);
    if (!etcd->url.empty() && !net::ParseHttpUrl(etcd->url, error)) {
      fmt::print(stderr, "error: --advertise-url {}: {}\n", etcd->url, error);
      return kExitUsage;
    }
    // The store is elsewhere, but the first admin token is written here.
    std::error_code dir_error;
    std::filesystem::create_directories(args.data_dir, dir_error);
    if (dir_error) {
      fmt::print(stderr, "error: --data-dir {}: {}\n", args.data_dir, dir_error.message());
      return kExitFailure;
    }
  }
  // Blocked before any thread starts, so every thread inherits the mask and the signals are
  // read here, synchronously.
  const sigset_t stop_signals = BlockStopSignals();
  net::RaiseOpenFileLimit();  // a connection per node
  if (etcd) {
    bool stopped = false;
    auto held = std::make_shared<std::unique_ptr<store::Store>>();
    try {
      net::HttpServerOptions standby_http;
      standby_http.host = options->host;
      standby_http.port = options->port;
      standby_http.tls_cert_file = options->tls_cert_file;
      standby_http.tls_key_file = options->tls_key_file;
      // The leader's body limit, not less: an agent's sync (its report) that a standby refused
      // with 413 would be an answer, and the agent would never go on to the leader.
      standby_http.max_body_bytes = net::HttpServerOptions{}.max_body_bytes;
      standby_http.stop_timeout = std::chrono::milliseconds(200);
      *held = WaitForEtcdLock(*etcd, standby_http, stop_signals, stopped);
    } catch (const store::StoreError& error) {
      fmt::print(stderr, "error: {}\n", error.what());
      return kExitFailure;
    }
    if (stopped) return 0;
    // The server opens its store through this, once: the one whose lock this process holds.
    options->open_store = [held](const std::string&) {
      if (!*held) throw store::StoreError("the etcd store was handed over already");
      return std::move(*held);
    };
  }

  const sched::SchedulerConfig scheduler = options->scheduler;
  auto opened = server::Server::Open(*options);
  if (!opened.server) {
    fmt::print(stderr, "error: {}\n", opened.error);
    return kExitFailure;
  }
  std::unique_ptr<server::Server> server = std::move(opened.server);
  fmt::print("gpufleet server {}: listening on {}\n", kVersion, server->url());
  fmt::print("  store: {}\n", server->store_description());
  fmt::print("  scheduler: {}, node timeout {}, heartbeat {}\n", DescribeScheduler(scheduler),
             FormatMs(options->node_timeout_ms), FormatMs(options->heartbeat_ms));
  if (!scheduler.queues.empty()) fmt::print("  queues: {}\n", DescribeQueues(scheduler.queues));
  if (int status = EnsureAdminToken(*server, args.data_dir); status != 0) {
    server->Stop();
    return status;
  }
  std::fflush(stdout);

  // Wakes for a stop signal, and at least every 200 ms to notice a store failure.
  const timespec tick{0, 200'000'000};
  int status = 0;
  while (true) {
    siginfo_t info{};
    const int signal_number = ::sigtimedwait(&stop_signals, &info, &tick);
    if (signal_number > 0) {
      fmt::print(stderr, "gpufleet server: {} received, stopping\n",
                 signal_number == SIGINT ? "SIGINT" : "SIGTERM");
      break;
    }
    if (server->fatal_error()) {
      status = kExitFailure;
      break;
    }
  }
  server->Stop();
  if (auto fatal = server->fatal_error()) {
    fmt::print(stderr, "error: {}; exiting so that a restart reloads the state that is durable\n",
               *fatal);
    status = kExitFailure;
  }
  return status;
}

}  // namespace gpufleet::cli
