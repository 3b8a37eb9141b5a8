#include "server/server.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <future>
#include <utility>

#include <fcntl.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include "api/json.h"
#include "net/secrets.h"
#include "sched/scheduler.h"
#include "server/lifecycle.h"
#include "server/server_impl.h"
#include "store/sqlite_store.h"

namespace gpufleet::server {

using api::JobRecord;
using api::JobState;
using api::NodeState;
using nlohmann::json;
using store::Mutation;

// ---- Keys, clocks, worker pool ----------------------------------------------------------------

std::string JobKey(JobId id) {
  return fmt::format("{}{:020}", kJobPrefix, id);
}
std::string NodeKey(const std::string& name) {
  return std::string(kNodePrefix) + name;
}
std::string TokenKey(const std::string& id) {
  return std::string(kTokenPrefix) + id;
}
std::string AuditKey(uint64_t seq) {
  return fmt::format("{}{:020}", kAuditPrefix, seq);
}

TimeMs WallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

WorkerPool::WorkerPool(int threads) {
  for (int i = 0; i < threads; ++i) {
    threads_.emplace_back([this] {
      std::unique_lock lock(mu_);
      while (true) {
        cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        std::function<void()> work = std::move(queue_.front());
        queue_.pop_front();
        lock.unlock();
        work();
        lock.lock();
      }
    });
  }
}

WorkerPool::~WorkerPool() {
  Stop();
}

void WorkerPool::Post(std::function<void()> work) {
  {
    std::lock_guard lock(mu_);
    if (!stopping_) {
      queue_.push_back(std::move(work));
      cv_.notify_one();
      return;
    }
  }
  work();  // stopped: nobody else will run it
}

void WorkerPool::Stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& thread : threads_)
    if (thread.joinable()) thread.join();
}

namespace {

std::string Describe(std::exception_ptr error) {
  try {
    std::rethrow_exception(std::move(error));
  } catch (const std::exception& exception) {
    return exception.what();
  } catch (...) {
    return "unknown error";
  }
}

std::string FormatMs(TimeMs ms) {
  return ms % 1000 == 0 ? fmt::format("{}s", ms / 1000) : fmt::format("{}ms", ms);
}

std::string JoinIndices(const std::vector<int32_t>& indices) {
  return fmt::format("{}", fmt::join(indices, ","));
}

// The scheduler's view of a node as its agent reported it: GPUs in index order, a duplicate
// index from a confused agent kept once, the rack defaulting to the node's name.
Node SchedNodeOf(const std::string& name, const api::NodeReport& report) {
  Node node;
  node.name = name;
  node.rack = report.rack.empty() ? name : report.rack;
  node.spine = report.spine;
  node.cpu_milli = report.cpu_milli;
  node.memory_mib = report.memory_mib;
  std::vector<api::GpuStatus> gpus = report.gpus;
  std::sort(gpus.begin(), gpus.end(),
            [](const auto& a, const auto& b) { return a.index < b.index; });
  for (const api::GpuStatus& status : gpus)
    if (node.gpus.empty() || node.gpus.back().index != status.index)
      node.gpus.push_back(Gpu{status.uuid, status.model, status.memory_mib, status.index,
                              status.nvlink_island, status.healthy});
  return node;
}

std::string DescribePreemption(const sched::Preemption& preemption) {
  return fmt::format("{} (job {})", sched::DescribePreemption(preemption.reason),
                     preemption.for_job);
}

bool ValidUserName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
           c == '@';
  });
}

// Every job record in the store. Reading is quick; parsing JSON is what takes time (tens of us a
// record), so the records are parsed on every core.
std::vector<JobRecord> LoadJobs(const store::Store& store) {
  std::vector<std::pair<std::string, std::string>> raw;
  store.Scan(kJobPrefix,
             [&](std::string_view key, std::string_view value) { raw.emplace_back(key, value); });
  std::vector<JobRecord> records(raw.size());
  const size_t workers =
      std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 1 + raw.size() / 1000);
  std::vector<std::string> errors(workers);
  std::vector<std::thread> threads;
  for (size_t w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      for (size_t i = w; i < raw.size(); i += workers) {
        try {
          records[i] = json::parse(raw[i].second).get<JobRecord>();
        } catch (const std::exception& error) {
          errors[w] = fmt::format("entry '{}': {}", raw[i].first, error.what());
          return;
        }
      }
    });
  }
  for (std::thread& thread : threads)
    thread.join();
  for (const std::string& error : errors)
    if (!error.empty()) throw std::runtime_error(error);
  return records;
}

}  // namespace

// ---- Impl: opening, loading, stopping -----------------------------------------------------------

Server::Impl::Impl(ServerOptions server_options) : options(std::move(server_options)) {}

Server::Impl::~Impl() {
  Stop();
}

void Server::Impl::Log(const std::string& line) const {
  if (options.log) options.log(line);
}

std::string Server::Impl::Load() {
  try {
    store = options.open_store ? options.open_store(options.data_dir)
                               : store::OpenSqliteStore(options.data_dir);
    if (!store) return "no store was opened";
  } catch (const std::exception& error) {
    return error.what();
  }
  const TimeMs now = WallMs();
  const SteadyTime steady_now = std::chrono::steady_clock::now();
  last_version = static_cast<uint64_t>(now) * 1000;
  std::string key_in_hand;
  try {
    std::lock_guard lock(mu);
    for (JobRecord& job : LoadJobs(*store)) {
      next_job_id = std::max(next_job_id, job.id + 1);
      const JobId id = job.id;
      IndexJobLocked(job);
      jobs.insert_or_assign(id, std::move(job));
    }
    store->Scan(kNodePrefix, [&](std::string_view key, std::string_view value) {
      key_in_hand = key;
      NodeEntry entry;
      entry.record = json::parse(value).get<api::NodeRecord>();
      // A restarted server gives every node a full timeout to come back (docs/api.md).
      entry.record.last_seen_ms = now;
      entry.last_seen = steady_now;
      entry.version = ++last_version;
      const std::string name = entry.record.report.name;
      nodes.insert_or_assign(name, std::move(entry));
    });
    store->Scan(kDeploymentPrefix, [&](std::string_view key, std::string_view value) {
      key_in_hand = key;
      DeploymentEntry entry;
      entry.record = json::parse(value).get<api::DeploymentRecord>();
      ResetAutoscalerLocked(entry);
      const std::string name = entry.record.name;
      deployments.insert_or_assign(name, std::move(entry));
    });
    for (const auto& [id, job] : jobs)
      if (job.replica && !api::IsTerminal(job.state))
        if (auto it = deployments.find(job.replica->deployment); it != deployments.end())
          it->second.replicas.insert(id);
    store->Scan(kTokenPrefix, [&](std::string_view key, std::string_view value) {
      key_in_hand = key;
      const json stored = json::parse(value);
      TokenEntry entry;
      entry.info = stored.get<api::TokenInfo>();
      entry.sha256 = stored.at("sha256").get<std::string>();
      token_by_sha256[entry.sha256] = entry.info.id;
      tokens.insert_or_assign(entry.info.id, std::move(entry));
    });
    // Only the keys: the next sequence number and the count for /metrics.
    store->Scan(kAuditPrefix, [&](std::string_view key, std::string_view) {
      key_in_hand = key;
      const uint64_t seq = std::stoull(std::string(key.substr(kAuditPrefix.size())));
      next_audit_seq = std::max(next_audit_seq, seq + 1);
      ++audit_entries;
    });
  } catch (const std::exception& error) {
    return fmt::format("cannot load the state in {}: {}{}", store->location(),
                       key_in_hand.empty() ? "" : fmt::format("entry '{}': ", key_in_hand),
                       error.what());
  }
  return {};
}

std::string Server::Impl::Start() {
  // Memory runs ahead of the store: once a commit fails, nothing queued after it (a placement of
  // the job whose submission failed, say) may become durable.
  committer = std::make_unique<store::GroupCommitter>(
      *store, store::GroupCommitter::AfterFailure::kFailAll);
  AddRoutes();
  scheduler_wake = true;  // a first cycle at once, for the jobs just loaded
  std::promise<void> running;
  std::future<void> scheduler_started = running.get_future();
  scheduler_thread = std::thread([this, &running] {
    {
      std::lock_guard lock(mu);
      scheduler_running = true;  // ready (/readyz) from the moment Open() returns
    }
    running.set_value();
    SchedulerLoop();
  });
  scheduler_started.wait();
  maintenance_thread = std::thread([this] { MaintenanceLoop(); });
  net::HttpServerOptions http_options;
  http_options.host = options.host;
  http_options.port = options.port;
  http_options.io_threads = std::max(1, options.io_threads);
  http_options.tls_cert_file = options.tls_cert_file;
  http_options.tls_key_file = options.tls_key_file;
  http_options.counters = http_counters;
  http_options.max_connections_per_client = options.max_connections_per_client;
  http_options.max_connections = options.max_connections;
  auto started = net::HttpServer::Start(
      http_options, [this](net::HttpRequest request, net::HttpResponder respond) {
        Dispatch(std::move(request), std::move(respond));
      });
  if (!started.server) return started.error;
  http = std::move(started.server);
  return {};
}

void Server::Impl::Stop() {
  {
    std::lock_guard lock(mu);
    if (stopping) return;
    stopping = true;
    // Parked long polls are answered now, with what the node should run; new ones are not held.
    for (auto& [name, node] : nodes)
      AnswerParkedLocked(name);
    for (EndpointWatch& watch : endpoint_watches)
      watch.respond(net::HttpResponse::Json(200, json(EndpointsLocked(watch.caller)).dump()));
    endpoint_watches.clear();
  }
  scheduler_cv.notify_all();
  maintenance_cv.notify_all();
  {
    // Answers still on their way (a commit, a logs proxy call) go out before HTTP stops.
    std::unique_lock lock(in_flight_mu);
    in_flight_cv.wait_for(lock, std::chrono::seconds(10), [this] { return in_flight == 0; });
  }
  if (http) http->Stop();
  if (scheduler_thread.joinable()) scheduler_thread.join();
  if (maintenance_thread.joinable()) maintenance_thread.join();
  proxy_pool.Stop();
  committer.reset();  // commits what is queued
  http.reset();
  store.reset();  // releases the data dir's lock
}

// ---- Mutations ------------------------------------------------------------------------------

void Server::Impl::CommitLocked(std::vector<Mutation> batch, CommitDone done,
                                std::vector<std::string> wake) {
  ++commits_queued;
  committer->CommitAsync(std::move(batch), [this, done = std::move(done),
                                            wake = std::move(wake)](std::exception_ptr error) {
    std::string message;
    if (error) {
      message = Describe(error);
      // Before it counts as settled: a failure is never durable.
      OnStoreFailure("store commit failed: " + message);
    }
    ++commits_settled;
    if (!error && !wake.empty()) {
      // After durability: an agent never starts a task for a placement the store lacks.
      std::lock_guard lock(mu);
      for (const std::string& node : wake)
        AnswerParkedLocked(node);
    }
    if (done) done(message);
  });
}

void Server::Impl::OnStoreFailure(const std::string& error) {
  {
    std::lock_guard lock(fatal_mu);
    if (!fatal.empty()) return;
    fatal = error;
    failed_ = true;
  }
  Log(fmt::format("FATAL: {}; acknowledging no more changes; restart to reload what is durable",
                  FatalMessage()));
  fatal_cv.notify_all();
}

std::string Server::Impl::FatalMessage() const {
  std::lock_guard lock(fatal_mu);
  return fatal;
}

Mutation Server::Impl::PutJobLocked(const JobRecord& job) const {
  return Mutation::Put(JobKey(job.id), json(job).dump());
}

Mutation Server::Impl::PutNodeLocked(const NodeEntry& node) const {
  api::NodeRecord record = node.record;
  record.gpu_jobs.clear();  // derived from the jobs whenever shown
  return Mutation::Put(NodeKey(record.report.name), json(record).dump());
}

Mutation Server::Impl::AuditLocked(const Caller& caller, std::string action, std::string target,
                                   std::string detail, TimeMs now) {
  api::AuditEntry entry;
  entry.seq = next_audit_seq++;
  entry.time_ms = now;
  entry.user = caller.info.user;
  entry.token_id = caller.info.id;
  entry.action = std::move(action);
  entry.target = std::move(target);
  entry.detail = std::move(detail);
  ++audit_entries;
  return Mutation::Put(AuditKey(entry.seq), json(entry).dump());
}

void Server::Impl::IndexJobLocked(const JobRecord& job) {
  queue_names.insert(job.spec.queue);
  const std::vector<std::pair<TimeMs, TimeMs>> ended = EndedHeldSpans(job);
  size_t& counted = ended_spans_counted[job.id];
  const double gpus =
      static_cast<double>(job.spec.gpu_milli_per_task) * job.spec.tasks / kMilliPerGpu;
  for (; counted < ended.size(); ++counted) {
    const auto [start, end] = ended[counted];
    fair_share.AddSpan(job.spec.queue, gpus, start, end);
    const int64_t gpu_ms = SpanGpuMs(job, start, end);
    ended_gpu_ms_by_team[job.team] += gpu_ms;
    ended_gpu_ms_by_user[{job.team, job.user}] += gpu_ms;
  }
  if (auto pending = pending_jobs.find(job.id); pending != pending_jobs.end()) {
    // The scheduler may be reading it outside the lock: kept until that cycle is over.
    if (snapshot_out) retired_pending.push_back(std::move(pending->second));
    pending_jobs.erase(pending);
  }
  active_jobs.erase(job.id);
  running_view.Changed(job.id);
  // The desired state of each node the job leaves or joins is durable with the next commit: a
  // change is committed in the same hold of the lock that made it.
  const auto changed_on = [this](const std::string& node) {
    if (auto it = nodes.find(node); it != nodes.end())
      it->second.desired_commit = commits_queued + 1;
  };
  if (auto indexed = indexed_nodes.find(job.id); indexed != indexed_nodes.end()) {
    for (const std::string& node : indexed->second) {
      changed_on(node);
      auto on = active_on_node.find(node);
      on->second.erase(job.id);
      if (on->second.empty()) active_on_node.erase(on);
    }
    indexed_nodes.erase(indexed);
  }
  if (job.state == JobState::kPending) {
    const Service service = ServiceOf(job, 0);  // a pending job's service does not grow
    pending_jobs.emplace(job.id, std::make_shared<const sched::PendingJob>(
                                     sched::PendingJob{ToJobSpec(job), service.attained_gpu_ms,
                                                       service.last_run_end, service.preemptions}));
  } else if (IsActive(job.state)) {
    active_jobs.insert(job.id);
    std::vector<std::string> on = NodesOf(job);
    for (const std::string& node : on) {
      changed_on(node);
      active_on_node[node].insert(job.id);
    }
    indexed_nodes.emplace(job.id, std::move(on));
  }
}

std::map<std::string, double, std::less<>> Server::Impl::FairShareUsageLocked(TimeMs now) const {
  std::vector<sched::OpenSpan> open;
  open.reserve(active_jobs.size());
  for (JobId id : active_jobs) {
    const JobRecord& job = jobs.at(id);
    const TimeMs start = ServiceOf(job, now).run_start;
    open.push_back(
        {.queue = job.spec.queue,
         .gpus = static_cast<double>(job.spec.gpu_milli_per_task) * job.spec.tasks / kMilliPerGpu,
         .start = start});
  }
  return fair_share.UsageAt(now, open);
}

namespace {

// At most this busy, a GPU counts as idle: dcgm's GPU_UTIL of a process that only holds memory
// or waits on a dataloader between rare kernels.
constexpr double kIdleUtilizationPct = 1.0;

std::string FormatMinutes(TimeMs ms) {
  return ms % 60000 == 0 ? fmt::format("{} min", ms / 60000) : fmt::format("{} s", ms / 1000);
}

}  // namespace

void Server::Impl::TrackIdleLocked(const std::string& name, TimeMs now) {
  const NodeEntry& node = nodes.at(name);
  std::map<int32_t, double> utilization;
  for (const api::GpuStatus& gpu : node.record.report.gpus)
    utilization[gpu.index] = gpu.utilization_pct;
  auto on = active_on_node.find(name);
  if (on == active_on_node.end()) return;
  for (JobId id : on->second) {
    const JobRecord& job = jobs.at(id);
    if (job.state != JobState::kRunning) continue;
    bool here = false, idle = true;
    for (const api::TaskStatus& task : job.tasks) {
      if (task.node != name) continue;
      here = true;
      for (int32_t index : task.gpu_indices) {
        auto it = utilization.find(index);
        idle = idle && it != utilization.end() && it->second <= kIdleUtilizationPct;
      }
    }
    if (!here) continue;
    auto& since = idle_on_node[id];
    if (idle)
      since.try_emplace(name, now);
    else
      since.erase(name);
  }
}

bool Server::Impl::YieldsLocked(JobId id) const {
  const auto it = yields_to.find(id);
  return it != yields_to.end() &&
         std::any_of(it->second.begin(), it->second.end(),
                     [&](JobId other) { return pending_jobs.contains(other); });
}

bool Server::Impl::CheckIdleLocked(TimeMs now, std::vector<Mutation>& batch,
                                   std::vector<std::string>& wake) {
  constexpr size_t kMaxYieldedTo = 64;
  std::erase_if(yields_to, [&](const auto& entry) { return !YieldsLocked(entry.first); });
  // Jobs waiting for GPUs, oldest first; those that yield themselves do not count.
  std::vector<JobId> waiting;
  for (const auto& [id, pending] : pending_jobs) {
    if (waiting.size() == kMaxYieldedTo) break;
    if (pending->spec.gpu_milli_per_task > 0 && !yields_to.contains(id)) waiting.push_back(id);
  }
  const bool gpus_wanted = !waiting.empty();
  bool changed = false;
  for (auto it = idle_on_node.begin(); it != idle_on_node.end();) {
    auto job_it = jobs.find(it->first);
    if (job_it == jobs.end() || job_it->second.state != JobState::kRunning) {
      it = idle_on_node.erase(it);
      continue;
    }
    JobRecord& job = job_it->second;
    const std::vector<std::string> on = NodesOf(job);
    // Idle when every node it runs on says so; since the last of them began to.
    std::optional<TimeMs> since;
    if (!on.empty() && std::all_of(on.begin(), on.end(), [&](const std::string& node) {
          return it->second.contains(node);
        })) {
      since = 0;
      for (const std::string& node : on)
        since = std::max(*since, it->second.at(node));
    }
    ++it;
    const bool idle = since && now - *since >= options.idle_gpu_timeout_ms;
    const sched::QueueConfig* queue = FindQueue(options, job.spec.queue);
    const bool reclaim =
        idle && gpus_wanted && job.spec.preemptible && queue && queue->reclaim_idle;
    if (idle == job.idle_since_ms.has_value() && !reclaim) continue;
    if (idle && !job.idle_since_ms) {
      SetIdle(job, since,
              fmt::format("idle: its GPUs have been at most {:g} % utilized for {}",
                          kIdleUtilizationPct, FormatMinutes(options.idle_gpu_timeout_ms)),
              now);
      Log(fmt::format("job {} (queue {}) is idle: its GPUs have been unused for {}", job.id,
                      job.spec.queue, FormatMinutes(now - *since)));
    } else if (!idle) {
      SetIdle(job, std::nullopt, "busy again: its GPUs are in use", now);
    }
    if (reclaim) {
      for (const std::string& node : on) {
        BumpLocked(node);
        wake.push_back(node);
      }
      RequeueJob(job,
                 fmt::format("preempted: its GPUs were idle for {} while other jobs waited, and "
                             "queue '{}' reclaims idle GPUs",
                             FormatMinutes(now - *since), job.spec.queue),
                 now);
      ++idle_reclaims;
      yields_to[job.id] = waiting;
      Log(fmt::format("job {} requeued: its GPUs were idle", job.id));
    }
    IndexJobLocked(job);
    batch.push_back(PutJobLocked(job));
    changed = true;
  }
  return changed;
}

void Server::Impl::BumpLocked(const std::string& node) {
  if (auto it = nodes.find(node); it != nodes.end()) it->second.version = ++last_version;
}

std::vector<std::string> Server::Impl::NodesOf(const JobRecord& job) const {
  std::vector<std::string> names;
  for (const api::TaskStatus& task : job.tasks)
    if (std::find(names.begin(), names.end(), task.node) == names.end()) names.push_back(task.node);
  return names;
}

void Server::Impl::WakeSchedulerLocked() {
  scheduler_wake = true;
  scheduler_cv.notify_one();
}

void Server::Impl::ChangedLocked() {
  ++generation;
  WakeSchedulerLocked();
}

void Server::Impl::CapacityChangedLocked() {
  ++capacity_generation;
  ChangedLocked();
}

const std::shared_ptr<const ClusterView>& Server::Impl::ClusterViewLocked() {
  if (cluster_view && cluster_view_generation == capacity_generation) return cluster_view;
  auto view = std::make_shared<ClusterView>();
  for (const auto& [name, entry] : nodes) {
    if (entry.record.state == NodeState::kLost) continue;
    Node node = SchedNodeOf(name, entry.record.report);
    node.schedulable = !entry.record.drained;
    std::unordered_map<int32_t, int32_t> slots;
    for (size_t slot = 0; slot < node.gpus.size(); ++slot)
      slots[node.gpus[slot].index] = static_cast<int32_t>(slot);
    view->any_ready = view->any_ready || node.schedulable;
    view->position[name] = static_cast<int32_t>(view->cluster.nodes.size());
    view->gpu_slots.push_back(std::move(slots));
    view->cluster.nodes.push_back(std::move(node));
  }
  cluster_view = std::move(view);
  cluster_view_generation = capacity_generation;
  return cluster_view;
}

CreatedToken Server::Impl::CreateTokenLocked(const std::string& user, const std::string& team,
                                             api::Role role, const Caller& actor, TimeMs now,
                                             std::vector<Mutation>& batch, std::string scope,
                                             TimeMs expires_ms) {
  CreatedToken created;
  created.secret = net::NewTokenSecret();
  do {
    created.info.id = net::NewTokenId();
  } while (tokens.count(created.info.id));
  created.info.user = user;
  created.info.team = team;
  created.info.role = role;
  created.info.scope = scope.empty() ? api::DefaultScope(role) : std::move(scope);
  created.info.created_ms = now;
  created.info.created_by = actor.info.user;
  created.info.expires_ms = expires_ms;
  TokenEntry entry{created.info, net::Sha256Hex(created.secret)};
  batch.push_back(PutTokenLocked(entry));
  batch.push_back(AuditLocked(
      actor, "token.create", "token/" + entry.info.id,
      fmt::format("user {} team {} role {} scope {}{}", user, team.empty() ? "-" : team,
                  api::RoleName(role), entry.info.scope,
                  expires_ms ? fmt::format(" expires_ms {}", expires_ms) : std::string()),
      now));
  token_by_sha256[entry.sha256] = entry.info.id;
  tokens.insert_or_assign(entry.info.id, std::move(entry));
  return created;
}

Mutation Server::Impl::PutTokenLocked(const TokenEntry& token) const {
  json stored = token.info;
  stored["sha256"] = token.sha256;
  return Mutation::Put(TokenKey(token.info.id), stored.dump());
}

// ---- Agents' syncs ----------------------------------------------------------------------------

api::SyncResponse Server::Impl::DesiredLocked(const std::string& node) const {
  api::SyncResponse response;
  response.heartbeat_ms = static_cast<int32_t>(options.heartbeat_ms);
  if (auto it = nodes.find(node); it != nodes.end()) response.version = it->second.version;
  auto on = active_on_node.find(node);
  if (on == active_on_node.end()) return response;
  for (JobId id : on->second) {
    const JobRecord& job = jobs.at(id);
    std::string master_addr;
    for (const api::TaskStatus& task : job.tasks) {
      if (task.node != node) continue;
      if (master_addr.empty()) {
        const std::string& master = job.tasks.front().node;
        auto it = nodes.find(master);
        master_addr = it != nodes.end() && !it->second.record.report.address.empty()
                          ? it->second.record.report.address
                          : master;
      }
      response.desired.push_back(
          MakeTaskLaunch(job, task.rank, master_addr, options.checkpoint_root));
    }
  }
  return response;
}

void Server::Impl::RespondDesiredLocked(const std::string& node,
                                        std::vector<net::HttpResponder> responders) {
  if (responders.empty()) return;
  if (failed()) {
    for (net::HttpResponder& respond : responders)
      respond(StoreFailed(FatalMessage()));
    return;
  }
  std::string body = json(DesiredLocked(node)).dump();
  auto entry = nodes.find(node);
  const uint64_t needed = entry != nodes.end() ? entry->second.desired_commit : commits_queued;
  if (commits_settled.load() >= needed) {
    for (net::HttpResponder& respond : responders)
      respond(net::HttpResponse::Json(200, body));
    return;
  }
  // An empty batch settles after every batch queued before it, so after all `body` reflects.
  auto answer = std::make_shared<std::vector<net::HttpResponder>>(std::move(responders));
  try {
    committer->CommitAsync({}, [body = std::move(body), answer](std::exception_ptr error) {
      for (net::HttpResponder& respond : *answer)
        respond(error ? StoreFailed(Describe(error)) : net::HttpResponse::Json(200, body));
    });
  } catch (const std::logic_error&) {  // the committer is shutting down: this server is stopping
    for (net::HttpResponder& respond : *answer)
      respond(Stopping("the server is stopping"));
  }
}

void Server::Impl::AnswerParkedLocked(const std::string& node) {
  auto it = nodes.find(node);
  if (it == nodes.end() || it->second.parked.empty()) return;
  std::vector<net::HttpResponder> responders;
  for (Parked& waiting : it->second.parked)
    responders.push_back(std::move(waiting.respond));
  it->second.parked.clear();
  RespondDesiredLocked(node, std::move(responders));
}

void Server::Impl::FinishSyncLocked(const std::string& node, uint64_t known_version,
                                    int32_t wait_ms, net::HttpResponder respond) {
  auto it = nodes.find(node);
  // Not equal rather than older: versions of a restarted server may be smaller or larger.
  if (stopping || it == nodes.end() || it->second.version != known_version || wait_ms <= 0) {
    std::vector<net::HttpResponder> responders;
    responders.push_back(std::move(respond));
    RespondDesiredLocked(node, std::move(responders));
    return;
  }
  const TimeMs wait = std::min<TimeMs>(wait_ms, options.heartbeat_ms);
  const SteadyTime deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait);
  it->second.parked.push_back(Parked{known_version, deadline, std::move(respond)});
  parked_deadlines.emplace(deadline, node);
  if (deadline < maintenance_next) maintenance_cv.notify_one();
}

// ---- Maintenance: long-poll deadlines, lost nodes
// ------------------------------------------------

void Server::Impl::MarkLostLocked(NodeEntry& node, TimeMs now, std::vector<Mutation>& batch,
                                  std::vector<std::string>& wake) {
  const std::string& name = node.record.report.name;
  node.record.state = NodeState::kLost;
  ++capacity_generation;
  batch.push_back(PutNodeLocked(node));
  const std::string reason =
      fmt::format("node {} lost: no sync for {}", name, FormatMs(options.node_timeout_ms));
  int requeued = 0;
  int failed_jobs = 0;
  // A copy: requeuing a job takes it out of the index.
  std::vector<JobId> here;
  if (auto on_node = active_on_node.find(name); on_node != active_on_node.end())
    here.assign(on_node->second.begin(), on_node->second.end());
  for (JobId id : here) {
    JobRecord& job = jobs.at(id);
    const std::vector<std::string> on = NodesOf(job);
    if (job.spec.restartable) {
      RequeueJob(job, reason, now);
      ++requeued;
    } else {
      FailJob(job, reason, std::nullopt, now);
      job.reason_code = "node_lost";
      ++failed_jobs;
    }
    IndexJobLocked(job);
    batch.push_back(PutJobLocked(job));
    // The gang's other tasks leave their nodes' desired state: those agents stop them.
    for (const std::string& other : on) {
      BumpLocked(other);
      wake.push_back(other);
    }
  }
  Log(fmt::format("node {} lost (no sync for {}): {} job(s) requeued, {} failed", name,
                  FormatMs(options.node_timeout_ms), requeued, failed_jobs));
}

void Server::Impl::MaintenanceLoop() {
  std::unique_lock lock(mu);
  while (!stopping) {
    const SteadyTime steady_now = std::chrono::steady_clock::now();
    SteadyTime next = steady_now + std::chrono::seconds(1);
    std::vector<Mutation> batch;
    std::vector<std::string> wake;
    // A leader whose claim on a shared store ran out stops now, not at its next commit: another
    // server may be leading, and agents and clients should move on to it.
    if (auto lost = store->Lost()) OnStoreFailure(*lost);
    // Polls past their deadline are answered with the (unchanged) desired state.
    while (!parked_deadlines.empty() && parked_deadlines.begin()->first <= steady_now) {
      const std::string name = std::move(parked_deadlines.begin()->second);
      parked_deadlines.erase(parked_deadlines.begin());
      auto node = nodes.find(name);
      if (node == nodes.end()) continue;
      std::vector<Parked>& parked = node->second.parked;
      auto expired = std::stable_partition(
          parked.begin(), parked.end(), [&](const Parked& p) { return p.deadline > steady_now; });
      if (expired == parked.end()) continue;
      std::vector<net::HttpResponder> responders;
      for (auto it = expired; it != parked.end(); ++it)
        responders.push_back(std::move(it->respond));
      parked.erase(expired, parked.end());
      RespondDesiredLocked(name, std::move(responders));
    }
    if (!parked_deadlines.empty()) next = std::min(next, parked_deadlines.begin()->first);
    // Every node's liveness, only when one may have gone silent: syncs only move a node's
    // deadline later, so the earliest one seen in the last pass bounds the next.
    bool lost_any = false;
    if (steady_now >= next_lost_scan && !failed()) {
      SteadyTime earliest = steady_now + std::chrono::seconds(1);
      for (auto& [name, node] : nodes) {
        if (node.record.state == NodeState::kLost) continue;
        const SteadyTime lost_at =
            node.last_seen + std::chrono::milliseconds(options.node_timeout_ms);
        if (lost_at <= steady_now) {
          MarkLostLocked(node, WallMs(), batch, wake);
          lost_any = true;
        } else {
          earliest = std::min(earliest, lost_at);
        }
      }
      // At most 4 passes a second: when many nodes are late at once (an overloaded fleet), the
      // earliest deadline moves a few ms per pass, and a pass per node would cost O(nodes^2).
      next_lost_scan = std::max(earliest, steady_now + std::chrono::milliseconds(250));
    }
    if (!failed()) next = std::min(next, next_lost_scan);
    // Idle GPUs are judged over minutes: once a second is enough, however often the loop wakes.
    bool idle_changed = false;
    if (options.idle_gpu_timeout_ms > 0 && !failed() && steady_now >= next_idle_check) {
      idle_changed = CheckIdleLocked(WallMs(), batch, wake);
      next_idle_check = steady_now + std::chrono::seconds(1);
    }
    if (lost_any || idle_changed) ChangedLocked();
    if (!deployments.empty() && !failed()) {
      // Autoscalers every 2 s (Knative's tick); the replicas' convergence on every pass.
      const bool tick = steady_now - last_autoscale >= std::chrono::seconds(2);
      ReconcileDeploymentsLocked(WallMs(), tick, batch, wake);
      next = std::min(next, steady_now + std::chrono::milliseconds(500));
    }
    ExpireEndpointWatchesLocked(steady_now, next);
    if (!batch.empty()) CommitLocked(std::move(batch), nullptr, std::move(wake));
    maintenance_next = next;
    maintenance_cv.wait_until(lock, next);
  }
}

// ---- Scheduling ------------------------------------------------------------------------------

void Server::Impl::SchedulerLoop() {
  // Changes wake the loop at once, but a burst of them (thousands of submissions a second) is
  // coalesced: the next cycle starts no sooner than twice the last one's duration after it ends,
  // so cycles over a long queue take at most a third of a core and of the state lock, and
  // submissions are never starved. On an idle cluster a cycle takes well under a millisecond, so
  // this adds nothing to the time from submit to running.
  constexpr int kGapPerCycleTime = 2;
  std::unique_lock lock(mu);
  SteadyTime next_allowed = std::chrono::steady_clock::now();
  while (!stopping) {
    scheduler_cv.wait_for(lock, std::chrono::milliseconds(options.schedule_interval_ms),
                          [this] { return stopping || scheduler_wake; });
    if (stopping) break;
    if (scheduler_wake && std::chrono::steady_clock::now() < next_allowed)
      scheduler_cv.wait_until(lock, next_allowed, [this] { return stopping; });
    if (stopping) break;
    scheduler_wake = false;
    lock.unlock();
    const auto took = RunCycle();
    lock.lock();
    next_allowed = std::chrono::steady_clock::now() + kGapPerCycleTime * took;
  }
  scheduler_running = false;
}

Server::Impl::Snapshot Server::Impl::SnapshotLocked(TimeMs now) {
  Snapshot snapshot;
  snapshot.generation = generation;
  snapshot.view = ClusterViewLocked();
  snapshot.any_ready = snapshot.view->any_ready;
  snapshot.running = running_view.Refresh(snapshot.view, active_jobs, jobs, now);
  if (!snapshot.any_ready) return snapshot;  // nothing can be placed: the queue is not needed
  if (options.scheduler.order == sched::QueueOrder::kFairShare)
    snapshot.fair_share_usage = FairShareUsageLocked(now);
  snapshot.pending.reserve(pending_jobs.size());
  for (const auto& [id, pending] : pending_jobs)
    if (yields_to.empty() || !YieldsLocked(id)) snapshot.pending.push_back(pending.get());
  return snapshot;
}

std::chrono::steady_clock::duration Server::Impl::RunCycle() {
  const SteadyTime started = std::chrono::steady_clock::now();
  // Schedule() runs outside the lock; its decisions are applied only if nothing they depend on
  // changed meanwhile (the generation). After two tries the cycle holds the lock throughout.
  for (int attempt = 0;; ++attempt) {
    const bool hold_lock = attempt >= 2;
    std::unique_lock lock(mu);
    if (stopping || failed()) return std::chrono::steady_clock::now() - started;
    const TimeMs now = WallMs();
    Snapshot snapshot = SnapshotLocked(now);
    retired_pending.clear();  // no cycle reads them any more
    snapshot_out = !hold_lock;
    if (!hold_lock) lock.unlock();
    sched::Decisions decisions;
    bool decided = false;
    if (snapshot.any_ready && !snapshot.pending.empty()) {
      // Explaining every waiting job costs as much as the cycle itself on a long queue; the
      // placements are the same either way.
      constexpr size_t kAlwaysExplainUpTo = 1000;
      const SteadyTime cycle_start = std::chrono::steady_clock::now();
      sched::CycleOptions cycle;
      cycle.explain_all_waiting =
          snapshot.pending.size() <= kAlwaysExplainUpTo ||
          cycle_start - last_explained >= std::chrono::milliseconds(options.schedule_interval_ms);
      const std::vector<const sched::PendingJob*>& pending = snapshot.pending;
      // What changes from cycle to cycle: fair-share factors, and the workload FGD placement
      // measures fragmentation against (the shapes of what runs and of the first waiting jobs).
      std::optional<sched::SchedulerConfig> cycle_config;
      if (options.scheduler.order == sched::QueueOrder::kFairShare) {
        cycle_config = options.scheduler;
        cycle_config->fair_share_factor =
            sched::FairShareFactors(snapshot.fair_share_usage, options.scheduler.queues);
      }
      if (options.scheduler.placement == sched::PlacementPolicy::kFgd) {
        constexpr size_t kWaitingShapes = 1000;
        if (!cycle_config) cycle_config = options.scheduler;
        std::vector<JobSpec> shapes;
        shapes.reserve(snapshot.running.size() + std::min(pending.size(), kWaitingShapes));
        for (const sched::RunningJob& job : snapshot.running)
          shapes.push_back(job.spec);
        for (size_t i = 0; i < pending.size() && i < kWaitingShapes; ++i)
          shapes.push_back(pending[i]->spec);
        cycle_config->target_workload =
            sched::TargetWorkloadOf(shapes, sched::WorkloadWeight::kGpus);
      }
      try {
        decisions = sched::Schedule(snapshot.cluster(), snapshot.running, pending, now,
                                    cycle_config ? *cycle_config : options.scheduler, cycle);
        decided = true;
        if (cycle.explain_all_waiting) last_explained = cycle_start;
      } catch (const std::exception& error) {
        Log(fmt::format("scheduling cycle skipped: {}", error.what()));
      }
    }
    if (!hold_lock) lock.lock();
    snapshot_out = false;
    if (stopping) return std::chrono::steady_clock::now() - started;
    if (generation != snapshot.generation) continue;
    if (decided || !snapshot.any_ready) ApplyLocked(snapshot, decisions, now);
    break;
  }
  ++cycles;
  const auto took = std::chrono::steady_clock::now() - started;
  cycle_latency.Observe(std::chrono::duration<double>(took).count());
  return took;
}

void Server::Impl::ApplyLocked(const Snapshot& snapshot, const sched::Decisions& decisions,
                               TimeMs now) {
  std::vector<Mutation> batch;
  std::vector<std::string> wake;
  for (const sched::Preemption& preemption : decisions.preemptions) {
    auto it = jobs.find(preemption.job);
    if (it == jobs.end() || !IsActive(it->second.state)) continue;
    JobRecord& job = it->second;
    for (const std::string& node : NodesOf(job)) {
      BumpLocked(node);
      wake.push_back(node);
    }
    RequeueJob(job, DescribePreemption(preemption), now);
    ++preemptions_by_reason[sched::PreemptReasonCode(preemption.reason)];
    IndexJobLocked(job);
    batch.push_back(PutJobLocked(job));
  }
  for (const sched::Placement& placement : decisions.placements) {
    auto it = jobs.find(placement.job);
    if (it == jobs.end() || it->second.state != JobState::kPending) continue;
    JobRecord& job = it->second;
    std::vector<api::TaskStatus> tasks;
    std::vector<std::string> where;
    for (size_t rank = 0; rank < placement.allocation.size(); ++rank) {
      const sched::TaskPlacement& task_placement = placement.allocation[rank];
      const Node& node = snapshot.cluster().nodes.at(static_cast<size_t>(task_placement.node));
      api::TaskStatus task;
      task.rank = static_cast<int32_t>(rank);
      task.node = node.name;
      for (const sched::GpuShare& share : task_placement.gpus) {
        const Gpu& gpu = node.gpus.at(static_cast<size_t>(share.gpu));
        task.gpu_indices.push_back(gpu.index);
        task.gpu_uuids.push_back(gpu.uuid);
        task.gpu_milli = share.milli;
      }
      task.workload_id = WorkloadId(job.id, task.rank, job.attempt);
      // Its PORT; with all 2768 taken (absurd on one node) it gets none and never becomes ready.
      if (job.replica) task.port = FreeReplicaPortLocked(node.name, job.id, job.attempt);
      where.push_back(task.gpu_indices.empty()
                          ? node.name
                          : fmt::format("{} (GPU {})", node.name, JoinIndices(task.gpu_indices)));
      if (std::find(wake.begin(), wake.end(), node.name) == wake.end()) wake.push_back(node.name);
      BumpLocked(node.name);
      tasks.push_back(std::move(task));
    }
    PlaceJob(job, std::move(tasks), fmt::format("placed on {}", fmt::join(where, ", ")), now);
    IndexJobLocked(job);
    batch.push_back(PutJobLocked(job));
  }
  // Why the others wait: recomputed every cycle, so kept in memory only (persisted with the
  // record's next real change).
  if (!snapshot.any_ready && !pending_marked_no_ready) {
    for (const auto& [id, pending] : pending_jobs) {
      JobRecord& job = jobs.at(id);
      job.reason = "no nodes are ready";
      job.reason_code = "no_ready_nodes";
    }
  }
  pending_marked_no_ready = !snapshot.any_ready;
  for (const sched::Waiting& waiting : decisions.waiting) {
    auto it = jobs.find(waiting.job);
    if (it == jobs.end() || it->second.state != JobState::kPending) continue;
    JobRecord& job = it->second;
    job.reason = sched::DescribeWait(waiting, ToJobSpec(job));
    job.reason_code = sched::WaitReasonCode(waiting.reason);
  }
  if (batch.empty()) return;
  ++generation;
  CommitLocked(std::move(batch), nullptr, std::move(wake));
}

sched::FeasibilityChecker* Server::Impl::FeasibilityLocked() {
  if (feasibility_generation != capacity_generation) {
    feasibility_generation = capacity_generation;
    Cluster cluster;
    // Drained nodes count: a job that fits only there can still run once they are undrained.
    for (const auto& [name, entry] : nodes)
      if (entry.record.state != NodeState::kLost)
        cluster.nodes.push_back(SchedNodeOf(name, entry.record.report));
    feasibility.reset();
    if (!cluster.nodes.empty())
      feasibility = std::make_unique<sched::FeasibilityChecker>(std::move(cluster));
  }
  return feasibility.get();
}

// ---- Server -----------------------------------------------------------------------------------

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
  Stop();
}

Server::OpenResult Server::Open(ServerOptions options) {
  OpenResult result;
  if (options.node_timeout_ms <= 0 || options.heartbeat_ms <= 0 ||
      options.schedule_interval_ms <= 0) {
    result.error = "node timeout, heartbeat and schedule interval must be positive";
    return result;
  }
  auto impl = std::make_unique<Impl>(std::move(options));
  if (std::string error = impl->Load(); !error.empty()) {
    result.error = std::move(error);
    return result;
  }
  if (std::string error = impl->Start(); !error.empty()) {
    impl->Stop();
    result.error = std::move(error);
    return result;
  }
  result.server.reset(new Server(std::move(impl)));
  return result;
}

uint16_t Server::port() const {
  return impl_->http ? impl_->http->port() : 0;
}

std::string Server::address() const {
  return impl_->http ? impl_->http->address() : std::string();
}

std::string Server::url() const {
  return (impl_->http && impl_->http->tls() ? "https://" : "http://") + address();
}

std::string Server::store_description() const {
  if (!impl_->store) return "closed";
  return fmt::format("{} at {}", impl_->store->backend(), impl_->store->location());
}

void Server::Stop() {
  impl_->Stop();
}

Server::TokenResult Server::CreateToken(const std::string& user, const std::string& team,
                                        api::Role role, const std::string& created_by) {
  TokenResult result;
  if (!ValidUserName(user) || (!team.empty() && !ValidUserName(team)) ||
      (role == api::Role::kUser && team.empty())) {
    result.error = fmt::format(
        "user '{}' and team '{}' must be 1-64 letters, digits, '-', '_', '.' or '@' (a user "
        "token needs a team)",
        user, team);
    return result;
  }
  auto durable = std::make_shared<std::promise<std::string>>();
  std::future<std::string> outcome = durable->get_future();
  CreatedToken created;
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->stopping || impl_->failed()) {
      result.error = impl_->failed() ? impl_->FatalMessage() : "the server is stopping";
      return result;
    }
    Caller actor;
    actor.info.user = created_by;
    std::vector<Mutation> batch;
    created = impl_->CreateTokenLocked(user, team, role, actor, WallMs(), batch);
    impl_->CommitLocked(std::move(batch),
                        [durable](const std::string& error) { durable->set_value(error); });
  }
  if (std::string error = outcome.get(); !error.empty()) {
    result.error = "store failed: " + error;
    return result;
  }
  result.token = std::move(created);
  return result;
}

bool Server::HasAdminToken() const {
  std::lock_guard lock(impl_->mu);
  return std::any_of(impl_->tokens.begin(), impl_->tokens.end(),
                     [](const auto& entry) { return entry.second.info.role == api::Role::kAdmin; });
}

std::optional<std::string> Server::fatal_error() const {
  std::string message = impl_->FatalMessage();
  if (message.empty()) return std::nullopt;
  return message;
}

std::optional<std::string> Server::WaitForFatal(std::chrono::milliseconds timeout) const {
  std::unique_lock lock(impl_->fatal_mu);
  impl_->fatal_cv.wait_for(lock, timeout, [this] { return !impl_->fatal.empty(); });
  if (impl_->fatal.empty()) return std::nullopt;
  return impl_->fatal;
}

std::string WritePrivateFile(const std::string& path, const std::string& contents) {
  const std::string temporary = path + ".tmp";
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return fmt::format("cannot create {}: {}", temporary, std::strerror(errno));
  std::string error;
  // The mode of an existing file is kept by open(): set it explicitly.
  if (::fchmod(fd, 0600) != 0) error = fmt::format("chmod {}: {}", temporary, std::strerror(errno));
  size_t written = 0;
  while (error.empty() && written < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + written, contents.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) error = fmt::format("write {}: {}", temporary, std::strerror(errno));
    if (n > 0) written += static_cast<size_t>(n);
  }
  if (error.empty() && ::fsync(fd) != 0)
    error = fmt::format("fsync {}: {}", temporary, std::strerror(errno));
  ::close(fd);
  if (error.empty() && ::rename(temporary.c_str(), path.c_str()) != 0)
    error = fmt::format("rename {} to {}: {}", temporary, path, std::strerror(errno));
  if (!error.empty()) ::unlink(temporary.c_str());
  return error;
}

}  // namespace gpufleet::server
