// Deployments (docs/serving.md): their API routes and the controller that converges each one's
// replicas to what it wants. A replica is a job of the serving kind, placed by the same scheduler
// as batch work; the controller only creates replica jobs, marks them draining and cancels them,
// so everything the job lifecycle already guarantees (durable placements, requeue on a lost node,
// level-triggered agents) holds for replicas too.

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "api/json.h"
#include "sched/scheduler.h"
#include "server/lifecycle.h"
#include "server/server_impl.h"

namespace gpufleet::server {
namespace {

using api::DeploymentRecord;
using api::JobRecord;
using api::JobState;
using api::Role;
using net::HttpRequest;
using net::HttpResponder;
using net::HttpResponse;
using nlohmann::json;
using store::Mutation;
using Impl = Server::Impl;

// Replicas listen on ports of this range, one per replica on a node; torchrun's MASTER_PORT
// uses [20000, 30000), so the two never meet.
constexpr int32_t kReplicaPortFirst = 30000;
constexpr int32_t kReplicaPortLast = 32767;
// How often the autoscalers decide: Knative's tick.
constexpr auto kAutoscaleInterval = std::chrono::seconds(2);
// A gateway that has not reported for this long no longer counts for drains.
constexpr auto kGatewayTimeout = std::chrono::seconds(15);
// A draining replica is stopped once every live gateway reported after this long past the drain
// began without a request in flight on it: by then each has seen the new endpoint set.
constexpr TimeMs kDrainSettleMs = 1000;
// Restarts of a replica that keeps failing back off: 1 s, 2 s, 4 s, ... up to 5 minutes.
constexpr TimeMs kFirstRestartBackoffMs = 1000;
constexpr TimeMs kMaxRestartBackoffMs = 5 * 60 * 1000;
constexpr TimeMs kMaxEndpointWaitMs = 60000;

serving::AutoscalerConfig AutoscalerConfigOf(const api::DeploymentSpec& spec) {
  serving::AutoscalerConfig config;
  config.metric = spec.autoscaling.metric == "rps" ? serving::ScaleMetric::kRps
                                                   : serving::ScaleMetric::kConcurrency;
  config.target = spec.autoscaling.target;
  config.target_utilization = spec.autoscaling.target_utilization;
  config.min_replicas = spec.min_replicas;
  config.max_replicas = spec.max_replicas;
  config.stable_window_ms = spec.autoscaling.stable_window_ms;
  config.panic_window_ms = spec.autoscaling.panic_window_ms;
  config.panic_threshold = spec.autoscaling.panic_threshold;
  config.max_scale_up_rate = spec.autoscaling.max_scale_up_rate;
  config.max_scale_down_rate = spec.autoscaling.max_scale_down_rate;
  config.scale_to_zero_grace_ms = spec.autoscaling.scale_to_zero_grace_ms;
  return config;
}

// The job a replica of `record`'s current spec runs as; `preemptible` when its queue says so.
JobRecord NewReplicaJob(const DeploymentRecord& record, TimeMs now, bool preemptible) {
  const api::DeploymentSpec& spec = record.spec;
  JobRecord job;
  job.user = record.user;
  job.team = record.team;
  job.created_ms = now;
  job.spec.name = spec.name;
  job.spec.queue = spec.queue;
  job.spec.priority = spec.priority;
  job.spec.tasks = 1;
  job.spec.gpu_milli_per_task = spec.gpu_milli_per_replica;
  job.spec.cpu_milli_per_task = spec.cpu_milli_per_replica;
  job.spec.memory_mib_per_task = spec.memory_mib_per_replica;
  job.spec.gpu_models = spec.gpu_models;
  job.spec.min_gpu_memory_mib = spec.min_gpu_memory_mib;
  job.spec.command = spec.command;
  job.spec.env = spec.env;
  job.spec.workdir = spec.workdir;
  job.spec.container = spec.container;
  // A replica on a lost node is placed again. Batch work never preempts it (it ranks above every
  // batch job of its queue); reclaim and higher-priority replicas only where the queue allows.
  job.spec.restartable = true;
  job.spec.preemptible = preemptible;
  job.spec.grace_period_ms = spec.grace_period_ms;
  job.replica = api::ReplicaOf{spec.name, record.generation, spec.readiness_path, 0};
  return job;
}

bool ReplicaReady(const JobRecord& job) {
  return job.state == JobState::kRunning && !job.tasks.empty() && job.tasks.front().ready &&
         job.replica && !job.replica->draining();
}

std::string ReplicaState(const JobRecord& job) {
  if (job.replica && job.replica->draining()) return "draining";
  if (ReplicaReady(job)) return "ready";
  if (job.state == JobState::kPending) return "pending";
  return "starting";
}

TimeMs RestartBackoffMs(int32_t failures) {
  TimeMs backoff = kFirstRestartBackoffMs;
  for (int32_t i = 1; i < failures && backoff < kMaxRestartBackoffMs; ++i)
    backoff *= 2;
  return std::min(backoff, kMaxRestartBackoffMs);
}

// Cancels a replica's job (SIGTERM, then its grace period) and wakes the nodes it ran on.
void StopReplicaLocked(Impl& s, JobRecord& job, std::string reason, TimeMs now,
                       std::vector<Mutation>& batch, std::vector<std::string>& wake) {
  const std::vector<std::string> nodes = s.NodesOf(job);
  const bool was_active = IsActive(job.state);
  CancelJob(job, std::move(reason), now);
  s.IndexJobLocked(job);
  batch.push_back(s.PutJobLocked(job));
  if (!was_active) return;
  for (const std::string& node : nodes) {
    s.BumpLocked(node);
    wake.push_back(node);
  }
}

// ---- Routes -----------------------------------------------------------------------------------

// The deployment the caller may see, or an answer already given (404 for another team's).
Impl::DeploymentEntry* FindDeploymentLocked(Impl& s, const HttpRequest& request,
                                            const Caller& caller, HttpResponder& respond) {
  const std::string name = request.PathParam("name");
  auto it = s.deployments.find(name);
  if (it == s.deployments.end() ||
      (!caller.admin() && it->second.record.team != caller.info.team)) {
    respond(HttpResponse::Error(404, fmt::format("no deployment '{}'", name)));
    return nullptr;
  }
  return &it->second;
}

bool SameSpec(const api::DeploymentSpec& a, const api::DeploymentSpec& b) {
  return json(a) == json(b);
}

// The parts of a spec that its replicas run: a change of any of these rolls them.
bool SameReplicaSpec(const api::DeploymentSpec& a, const api::DeploymentSpec& b) {
  return a.command == b.command && a.env == b.env && a.workdir == b.workdir &&
         a.container == b.container && a.queue == b.queue && a.priority == b.priority &&
         a.gpu_milli_per_replica == b.gpu_milli_per_replica &&
         a.cpu_milli_per_replica == b.cpu_milli_per_replica &&
         a.memory_mib_per_replica == b.memory_mib_per_replica && a.gpu_models == b.gpu_models &&
         a.min_gpu_memory_mib == b.min_gpu_memory_mib && a.readiness_path == b.readiness_path &&
         a.grace_period_ms == b.grace_period_ms;
}

void ApplyDeployment(Impl& s, const HttpRequest& request, const Caller& caller,
                     HttpResponder respond) {
  std::string error;
  auto spec = api::ParseDeploymentSpecText(request.body, error);
  if (!spec) return respond(HttpResponse::Error(400, error));
  if (auto why = serving::ValidateAutoscalerConfig(AutoscalerConfigOf(*spec)))
    return respond(HttpResponse::Error(400, "autoscaling: " + *why));
  if (auto unknown = UnknownQueue(s.options, spec->queue))
    return respond(HttpResponse::Error(422, *unknown));
  if (auto closed = QueueClosedTo(s.options, spec->queue, caller))
    return respond(HttpResponse::Error(403, *closed));
  std::lock_guard lock(s.mu);
  if (RefuseMutationLocked(s, respond)) return;
  const TimeMs now = WallMs();
  if (sched::FeasibilityChecker* cluster = s.FeasibilityLocked()) {
    DeploymentRecord shape_of;
    shape_of.spec = *spec;
    JobRecord probe = NewReplicaJob(shape_of, now, false);
    const JobSpec shape = ToJobSpec(probe);
    if (auto why = cluster->Check(shape))
      return respond(HttpResponse::Error(422, fmt::format("a replica could never be placed: {}",
                                                          sched::DescribeWait(*why, shape))));
  }
  auto [it, created] = s.deployments.try_emplace(spec->name);
  Impl::DeploymentEntry& entry = it->second;
  DeploymentRecord& record = entry.record;
  if (!created && record.team != caller.info.team && !caller.admin())
    return respond(HttpResponse::Error(
        409, fmt::format("the name '{}' is taken by another team's deployment", spec->name)));
  std::string action = "deployment.create";
  if (created) {
    record.name = spec->name;
    record.user = caller.info.user;
    record.team = caller.info.team;
    record.created_ms = now;
    record.spec = std::move(*spec);
    record.desired_replicas = record.spec.min_replicas;
    record.desired_reason = "created";
  } else {
    if (SameSpec(record.spec, *spec))
      return respond(JsonResponse(200, s.ShowDeploymentLocked(entry)));
    action = "deployment.update";
    if (!SameReplicaSpec(record.spec, *spec)) ++record.generation;
    record.spec = std::move(*spec);
    record.failures_in_a_row = 0;
  }
  record.updated_ms = now;
  s.ResetAutoscalerLocked(entry);
  std::vector<Mutation> batch;
  std::vector<std::string> wake;
  s.ReconcileDeploymentLocked(entry, now, batch, wake);
  batch.push_back(s.PutDeploymentLocked(entry));
  batch.push_back(
      s.AuditLocked(caller, action, "deployment/" + record.name,
                    fmt::format("generation {}: {} to {} replica(s) x {} GPU(s)", record.generation,
                                record.spec.min_replicas, record.spec.max_replicas,
                                api::FormatGpus(record.spec.gpu_milli_per_replica)),
                    now));
  s.RefreshEndpointsLocked();
  s.ChangedLocked();
  s.CommitLocked(std::move(batch),
                 AnswerWhenDurable(std::move(respond), JsonResponse(created ? 201 : 200,
                                                                    s.ShowDeploymentLocked(entry))),
                 std::move(wake));
}

void ListDeployments(Impl& s, const HttpRequest&, const Caller& caller, HttpResponder respond) {
  json list = json::array();
  {
    std::lock_guard lock(s.mu);
    for (const auto& [name, entry] : s.deployments)
      if (caller.admin() || entry.record.team == caller.info.team)
        list.push_back(s.ShowDeploymentLocked(entry));
  }
  respond(JsonResponse(200, json{{"deployments", std::move(list)}}));
}

void GetDeployment(Impl& s, const HttpRequest& request, const Caller& caller,
                   HttpResponder respond) {
  std::lock_guard lock(s.mu);
  if (auto* entry = FindDeploymentLocked(s, request, caller, respond))
    respond(JsonResponse(200, s.ShowDeploymentLocked(*entry)));
}

// {"replicas": N} fixes the count (the autoscaler stops); {"replicas": null} or {"auto": true}
// hands it back to the autoscaler; "min_replicas"/"max_replicas" change its bounds.
void ScaleDeployment(Impl& s, const HttpRequest& request, const Caller& caller,
                     HttpResponder respond) {
  std::string parse_error;
  auto parsed = api::ParseRequestJson(request.body, parse_error);
  if (!parsed) return respond(HttpResponse::Error(400, parse_error));
  json body = std::move(*parsed);
  if (!body.is_object()) return respond(HttpResponse::Error(400, "the body must be an object"));
  for (const auto& [key, value] : body.items())
    if (key != "replicas" && key != "auto" && key != "min_replicas" && key != "max_replicas")
      return respond(HttpResponse::Error(
          400, fmt::format("unknown field '{}' (known: replicas, auto, min_replicas, max_replicas)",
                           key)));
  auto integer = [&](const char* key, int64_t min) -> std::optional<int32_t> {
    auto it = body.find(key);
    if (it == body.end() || it->is_null()) return std::nullopt;
    if (!it->is_number_integer() || it->get<int64_t>() < min || it->get<int64_t>() > 1000)
      throw std::invalid_argument(
          fmt::format("'{}' must be an integer from {} to 1000, not {}", key, min, it->dump()));
    return static_cast<int32_t>(it->get<int64_t>());
  };
  std::optional<int32_t> replicas, min_replicas, max_replicas;
  try {
    replicas = integer("replicas", 0);
    min_replicas = integer("min_replicas", 0);
    max_replicas = integer("max_replicas", 1);
  } catch (const std::invalid_argument& error) {
    return respond(HttpResponse::Error(400, error.what()));
  }
  const bool to_auto = (body.contains("replicas") && body["replicas"].is_null()) ||
                       (body.contains("auto") && body["auto"] == true);
  if (replicas && to_auto)
    return respond(HttpResponse::Error(400, "give 'replicas' or 'auto', not both"));
  std::lock_guard lock(s.mu);
  Impl::DeploymentEntry* entry = FindDeploymentLocked(s, request, caller, respond);
  if (!entry) return;
  if (RefuseMutationLocked(s, respond)) return;
  DeploymentRecord& record = entry->record;
  api::DeploymentSpec spec = record.spec;
  if (min_replicas) spec.min_replicas = *min_replicas;
  if (max_replicas) spec.max_replicas = *max_replicas;
  if (spec.min_replicas > spec.max_replicas)
    return respond(HttpResponse::Error(
        422, fmt::format("min_replicas ({}) must not be above max_replicas ({})", spec.min_replicas,
                         spec.max_replicas)));
  const TimeMs now = WallMs();
  std::string detail;
  if (replicas) {
    record.fixed_replicas = *replicas;
    record.desired_replicas = *replicas;
    record.desired_reason = fmt::format("scaled to {} by {}", *replicas, caller.info.user);
    detail = fmt::format("{} replica(s), autoscaler off", *replicas);
  } else if (to_auto) {
    record.fixed_replicas.reset();
    record.desired_reason = fmt::format("autoscaling again ({})", caller.info.user);
    detail = "autoscaler on";
  }
  if (min_replicas || max_replicas) {
    record.spec = spec;
    detail += fmt::format("{}bounds {}-{}", detail.empty() ? "" : "; ", spec.min_replicas,
                          spec.max_replicas);
  }
  if (!record.fixed_replicas)
    record.desired_replicas =
        std::clamp(record.desired_replicas, record.spec.min_replicas, record.spec.max_replicas);
  record.updated_ms = now;
  s.ResetAutoscalerLocked(*entry);
  std::vector<Mutation> batch;
  std::vector<std::string> wake;
  s.ReconcileDeploymentLocked(*entry, now, batch, wake);
  batch.push_back(s.PutDeploymentLocked(*entry));
  batch.push_back(
      s.AuditLocked(caller, "deployment.scale", "deployment/" + record.name, detail, now));
  s.RefreshEndpointsLocked();
  s.ChangedLocked();
  s.CommitLocked(
      std::move(batch),
      AnswerWhenDurable(std::move(respond), JsonResponse(200, s.ShowDeploymentLocked(*entry))),
      std::move(wake));
}

// Deletes the record and stops every replica (SIGTERM and the grace period: a model server
// finishes what it is answering); the endpoints go at once.
void DeleteDeployment(Impl& s, const HttpRequest& request, const Caller& caller,
                      HttpResponder respond) {
  std::lock_guard lock(s.mu);
  Impl::DeploymentEntry* entry = FindDeploymentLocked(s, request, caller, respond);
  if (!entry) return;
  if (RefuseMutationLocked(s, respond)) return;
  const TimeMs now = WallMs();
  const std::string name = entry->record.name;
  std::vector<Mutation> batch;
  std::vector<std::string> wake;
  int stopped = 0;
  for (JobId id : entry->replicas) {
    auto job = s.jobs.find(id);
    if (job == s.jobs.end() || api::IsTerminal(job->second.state)) continue;
    StopReplicaLocked(s, job->second,
                      fmt::format("deployment {} deleted by {}", name, caller.info.user), now,
                      batch, wake);
    ++stopped;
  }
  json answer = s.ShowDeploymentLocked(*entry);
  batch.push_back(Mutation::Delete(DeploymentKey(name)));
  batch.push_back(s.AuditLocked(caller, "deployment.delete", "deployment/" + name,
                                fmt::format("{} replica(s) stopped", stopped), now));
  s.deployments.erase(name);
  s.RefreshEndpointsLocked();
  s.ChangedLocked();
  s.CommitLocked(std::move(batch), AnswerWhenDurable(std::move(respond), JsonResponse(200, answer)),
                 std::move(wake));
}

// A long poll: answered at once when the caller's version differs from the current one, else
// when the endpoint set changes or `wait_ms` passes.
void WatchEndpoints(Impl& s, const HttpRequest& request, const Caller& caller,
                    HttpResponder respond) {
  std::string error;
  const auto version =
      QueryInt(request, "version", 0, 0, std::numeric_limits<int64_t>::max(), error);
  const auto wait_ms =
      version ? QueryInt(request, "wait_ms", 0, 0, kMaxEndpointWaitMs, error) : std::nullopt;
  if (!version || !wait_ms) return respond(HttpResponse::Error(400, error));
  const auto known = static_cast<uint64_t>(*version);
  std::lock_guard lock(s.mu);
  // A gateway sees every team's deployments (it routes for all of them); people only their own.
  std::optional<Caller> scope;
  if (caller.info.role == Role::kUser) scope = caller;
  if (s.stopping || *wait_ms == 0 || known != s.endpoints_version)
    return respond(JsonResponse(200, s.EndpointsLocked(scope)));
  s.endpoint_watches.push_back(
      Impl::EndpointWatch{std::chrono::steady_clock::now() + std::chrono::milliseconds(*wait_ms),
                          std::move(respond), scope});
  s.maintenance_cv.notify_one();
}

void GatewayReportRoute(Impl& s, const HttpRequest& request, const Caller&, HttpResponder respond) {
  api::GatewayReport report;
  try {
    std::string parse_error;
    auto parsed = api::ParseRequestJson(request.body, parse_error);
    if (!parsed) return respond(HttpResponse::Error(400, parse_error));
    report = parsed->get<api::GatewayReport>();
  } catch (const std::exception& error) {
    return respond(HttpResponse::Error(400, fmt::format("bad gateway report: {}", error.what())));
  }
  if (report.gateway.empty() || report.gateway.size() > 128)
    return respond(HttpResponse::Error(400, "'gateway' must name the gateway (1-128 characters)"));
  if (report.interval_ms < 0 || report.interval_ms > 600'000)
    return respond(HttpResponse::Error(400, "'interval_ms' must be from 0 to 600000"));
  std::lock_guard lock(s.mu);
  const TimeMs now = WallMs();
  Impl::GatewayEntry& gateway = s.gateways[report.gateway];
  gateway.last_seen = std::chrono::steady_clock::now();
  gateway.last_report_ms = now;
  gateway.in_flight.clear();
  bool cold = false;  // requests wait for a deployment with no ready replica: act at once
  for (api::DeploymentLoadReport& load : report.deployments) {
    auto it = s.deployments.find(load.name);
    if (it == s.deployments.end()) continue;
    Impl::DeploymentEntry& entry = it->second;
    if (!std::isfinite(load.concurrency) || load.concurrency < 0 || !std::isfinite(load.arrivals) ||
        load.arrivals < 0)
      continue;
    entry.load_area_ms += load.concurrency * static_cast<double>(report.interval_ms);
    entry.load_arrivals += load.arrivals;
    entry.buffered = std::max<int64_t>(load.buffered, 0);
    if (entry.buffered > 0 && entry.record.desired_replicas == 0) cold = true;
    gateway.in_flight[load.name] = std::move(load.in_flight);
  }
  if (cold && !s.failed() && !s.stopping) {
    std::vector<Mutation> batch;
    std::vector<std::string> wake;
    for (auto& [name, entry] : s.deployments) {
      if (entry.buffered <= 0 || entry.record.desired_replicas > 0) continue;
      // An instant (the activator's poke): the load since the tick stays for the tick's sample.
      serving::LoadSample poke;
      poke.time_ms = now;
      poke.concurrency = static_cast<double>(entry.buffered);
      s.AutoscaleLocked(entry, poke, batch);
      s.ReconcileDeploymentLocked(entry, now, batch, wake);
    }
    if (!batch.empty()) {
      s.ChangedLocked();
      s.CommitLocked(std::move(batch), nullptr, std::move(wake));
    }
  }
  respond(JsonResponse(200, json{{"accepted", true}}));
}

}  // namespace

std::string DeploymentKey(const std::string& name) {
  return std::string(kDeploymentPrefix) + name;
}

std::vector<ApiRoute> DeploymentRoutes() {
  const std::vector<Role> people = {Role::kAdmin, Role::kUser};
  const std::vector<Role> gateways = {Role::kAdmin, Role::kGateway};
  return {
      {"POST", "/api/v1/deployments", people, ApplyDeployment},
      {"GET", "/api/v1/deployments", people, ListDeployments},
      {"GET", "/api/v1/deployments/{name}", people, GetDeployment},
      {"POST", "/api/v1/deployments/{name}/scale", people, ScaleDeployment},
      {"DELETE", "/api/v1/deployments/{name}", people, DeleteDeployment},
      {"GET", "/api/v1/endpoints", {Role::kAdmin, Role::kGateway, Role::kUser}, WatchEndpoints},
      {"POST", "/api/v1/gateways/report", gateways, GatewayReportRoute},
  };
}

// ---- The controller ---------------------------------------------------------------------------

Mutation Server::Impl::PutDeploymentLocked(const DeploymentEntry& entry) const {
  api::DeploymentRecord stored = entry.record;
  stored.replicas.clear();  // derived from the jobs whenever shown
  stored.ready_replicas = 0;
  return Mutation::Put(DeploymentKey(stored.name), json(stored).dump());
}

api::DeploymentRecord Server::Impl::ShowDeploymentLocked(const DeploymentEntry& entry) const {
  api::DeploymentRecord shown = entry.record;
  shown.replicas.clear();
  shown.ready_replicas = 0;
  for (JobId id : entry.replicas) {
    auto it = jobs.find(id);
    if (it == jobs.end() || api::IsTerminal(it->second.state)) continue;
    const JobRecord& job = it->second;
    api::ReplicaStatus replica;
    replica.job_id = job.id;
    replica.generation = job.replica ? job.replica->generation : 0;
    replica.state = ReplicaState(job);
    replica.created_ms = job.created_ms;
    if (!job.tasks.empty()) {
      replica.node = job.tasks.front().node;
      replica.port = job.tasks.front().port;
      if (auto node = nodes.find(replica.node); node != nodes.end())
        replica.host = node->second.record.report.address;
    }
    if (replica.state == "ready") ++shown.ready_replicas;
    shown.replicas.push_back(std::move(replica));
  }
  return shown;
}

void Server::Impl::ResetAutoscalerLocked(DeploymentEntry& entry) {
  serving::AutoscalerConfig config = AutoscalerConfigOf(entry.record.spec);
  entry.autoscaler.emplace(config);
  entry.autoscaler_since = std::chrono::steady_clock::now();
}

int32_t Server::Impl::FreeReplicaPortLocked(const std::string& node, JobId job,
                                            int32_t attempt) const {
  std::set<int32_t> taken;
  for (JobId id : active_jobs) {
    const JobRecord& other = jobs.at(id);
    for (const api::TaskStatus& task : other.tasks)
      if (task.node == node && task.port > 0) taken.insert(task.port);
  }
  // From a point that differs by job and attempt rather than the lowest free port: a port some
  // other program holds on the node (the agent refuses to launch onto it) is not picked again
  // by the replica that replaces the one that could not start.
  constexpr int32_t kRange = kReplicaPortLast - kReplicaPortFirst + 1;
  const uint64_t mixed = (job * 0x9E3779B97F4A7C15ULL) ^ (static_cast<uint64_t>(attempt) << 32);
  const auto start = static_cast<int32_t>((mixed >> 17) % kRange);
  for (int32_t i = 0; i < kRange; ++i) {
    const int32_t port = kReplicaPortFirst + (start + i) % kRange;
    if (!taken.count(port)) return port;
  }
  return 0;
}

void Server::Impl::AutoscaleLocked(DeploymentEntry& entry, const serving::LoadSample& sample,
                                   std::vector<Mutation>& batch) {
  if (!entry.autoscaler) ResetAutoscalerLocked(entry);
  const TimeMs now = sample.time_ms;
  entry.autoscaler->Record(sample);
  DeploymentRecord& record = entry.record;
  if (record.fixed_replicas) return;
  int32_t ready = 0;
  for (JobId id : entry.replicas)
    if (auto it = jobs.find(id); it != jobs.end() && ReplicaReady(it->second)) ++ready;
  const serving::ScaleDecision decision = entry.autoscaler->Decide(now, ready);
  int32_t desired =
      std::clamp(decision.desired, record.spec.min_replicas, record.spec.max_replicas);
  // A fresh autoscaler (a restarted server, a changed spec) has no history: it may scale up at
  // once but not down until it has seen a stable window.
  const bool has_window = std::chrono::steady_clock::now() - entry.autoscaler_since >=
                          std::chrono::milliseconds(record.spec.autoscaling.stable_window_ms);
  if (desired < record.desired_replicas && !has_window) return;
  if (desired == record.desired_replicas) return;
  Log(fmt::format("deployment {}: {} -> {} replica(s): {}", record.name, record.desired_replicas,
                  desired, decision.reason));
  record.desired_replicas = desired;
  record.desired_reason = decision.reason;
  record.updated_ms = now;
  batch.push_back(PutDeploymentLocked(entry));
}

bool Server::Impl::ReconcileDeploymentLocked(DeploymentEntry& entry, TimeMs now,
                                             std::vector<Mutation>& batch,
                                             std::vector<std::string>& wake) {
  DeploymentRecord& record = entry.record;
  bool record_changed = false;
  bool any_change = false;
  // Replicas that ended: a failure counts towards the restart back-off.
  for (auto it = entry.replicas.begin(); it != entry.replicas.end();) {
    auto job = jobs.find(*it);
    if (job != jobs.end() && !api::IsTerminal(job->second.state)) {
      ++it;
      continue;
    }
    if (job != jobs.end() && job->second.state == JobState::kFailed &&
        !(job->second.replica && job->second.replica->draining())) {
      ++record.failures_in_a_row;
      record.last_failure_ms = now;
      record_changed = true;
      Log(fmt::format("deployment {}: replica job {} failed: {}", record.name, job->second.id,
                      job->second.reason));
    }
    it = entry.replicas.erase(it);
  }
  std::vector<JobRecord*> current, old, draining;
  int32_t ready_current = 0;
  for (JobId id : entry.replicas) {
    JobRecord& job = jobs.at(id);
    if (job.replica->draining())
      draining.push_back(&job);
    else if (job.replica->generation == record.generation)
      current.push_back(&job);
    else
      old.push_back(&job);
    if (ReplicaReady(job) && job.replica->generation == record.generation) ++ready_current;
  }
  if (ready_current > 0 && record.failures_in_a_row > 0) {
    record.failures_in_a_row = 0;
    record_changed = true;
  }
  const int32_t desired = record.fixed_replicas ? *record.fixed_replicas : record.desired_replicas;

  auto drain = [&](JobRecord& job, const std::string& why) {
    job.replica->draining_since_ms = now;
    const std::string state(api::JobStateName(job.state));
    job.events.push_back(api::JobEvent{now, state, state, fmt::format("draining: {}", why)});
    batch.push_back(PutJobLocked(job));
    any_change = true;
  };
  // Least useful first: not placed yet, then not ready, then the newest.
  auto by_usefulness = [](const JobRecord* a, const JobRecord* b) {
    const bool a_ready = ReplicaReady(*a), b_ready = ReplicaReady(*b);
    if (a_ready != b_ready) return !a_ready;
    return a->id > b->id;
  };

  // Rolling update: old replicas leave one by one as new ones become ready, keeping at least
  // `desired` ready ones (surge 1); old ones that serve nothing leave at once.
  std::sort(old.begin(), old.end(), by_usefulness);
  size_t old_left = old.size();
  for (JobRecord* job : old) {
    const bool useless = !ReplicaReady(*job);
    if (useless || ready_current + static_cast<int32_t>(old_left) > desired) {
      drain(*job, useless ? "replaced by a new version" : "rolled to a new version");
      draining.push_back(job);
      --old_left;
    }
  }
  // Scale down among the current ones.
  if (static_cast<int32_t>(current.size()) > desired) {
    std::sort(current.begin(), current.end(), by_usefulness);
    size_t excess = current.size() - static_cast<size_t>(std::max(desired, 0));
    for (size_t i = 0; i < excess; ++i) {
      drain(*current[i], fmt::format("scaled down to {}", desired));
      draining.push_back(current[i]);
    }
    current.erase(current.begin(), current.begin() + static_cast<ptrdiff_t>(excess));
  }
  // Scale up (or replace), at most one above `desired` while old replicas still serve.
  const int32_t limit = old_left > 0 ? desired + 1 : desired;
  int32_t missing = std::min(desired - static_cast<int32_t>(current.size()),
                             limit - static_cast<int32_t>(current.size() + old_left));
  const bool backing_off =
      record.failures_in_a_row > 0 &&
      now < record.last_failure_ms + RestartBackoffMs(record.failures_in_a_row);
  if (backing_off) missing = 0;
  for (int32_t i = 0; i < missing; ++i) {
    const sched::QueueConfig* queue = FindQueue(options, record.spec.queue);
    JobRecord job = NewReplicaJob(record, now, queue && queue->preemptible_replicas);
    job.id = next_job_id++;
    SetState(
        job, JobState::kPending,
        fmt::format("replica of deployment {} (generation {})", record.name, record.generation),
        now);
    job.reason = "waiting for the next scheduling cycle";
    job.reason_code = "queued";
    batch.push_back(PutJobLocked(job));
    entry.replicas.insert(job.id);
    IndexJobLocked(job);
    jobs.emplace(job.id, std::move(job));
    any_change = true;
  }
  // Draining replicas stop once no gateway has a request in flight on them (or at the timeout).
  const SteadyTime steady_now = std::chrono::steady_clock::now();
  for (JobRecord* job : draining) {
    if (api::IsTerminal(job->state)) continue;
    const std::string id = fmt::format("j{}", job->id);
    bool busy = false;
    if (ReplicaReady(*job) || job->state == JobState::kRunning) {
      for (const auto& [gateway_id, gateway] : gateways) {
        if (steady_now - gateway.last_seen > kGatewayTimeout) continue;
        if (gateway.last_report_ms < job->replica->draining_since_ms + kDrainSettleMs) {
          busy = true;  // has not reported since it learnt of the drain
          break;
        }
        auto deployment = gateway.in_flight.find(record.name);
        if (deployment == gateway.in_flight.end()) continue;
        auto replica = deployment->second.find(id);
        if (replica != deployment->second.end() && replica->second > 0) {
          busy = true;
          break;
        }
      }
    }
    const bool timed_out = now - job->replica->draining_since_ms >= record.spec.drain_timeout_ms;
    if (busy && !timed_out) continue;
    StopReplicaLocked(*this, *job,
                      timed_out && busy
                          ? "drained: stopped at the drain timeout with requests in flight"
                          : "drained: no requests in flight",
                      now, batch, wake);
    any_change = true;
  }
  if (record_changed) batch.push_back(PutDeploymentLocked(entry));
  return any_change || record_changed;
}

void Server::Impl::ReconcileDeploymentsLocked(TimeMs now, bool tick, std::vector<Mutation>& batch,
                                              std::vector<std::string>& wake) {
  const SteadyTime steady_now = std::chrono::steady_clock::now();
  if (tick) {
    const double interval_ms =
        last_autoscale == SteadyTime{}
            ? std::chrono::duration<double, std::milli>(kAutoscaleInterval).count()
            : std::chrono::duration<double, std::milli>(steady_now - last_autoscale).count();
    last_autoscale = steady_now;
    for (auto& [name, entry] : deployments) {
      // The gateways' load since the last tick; requests waiting for a first replica count as
      // in flight: they are demand (the activator's).
      serving::LoadSample sample;
      sample.time_ms = now;
      sample.interval_ms = static_cast<TimeMs>(interval_ms);
      sample.concurrency =
          std::max(entry.load_area_ms / interval_ms, static_cast<double>(entry.buffered));
      sample.arrivals = entry.load_arrivals;
      entry.load_area_ms = 0;
      entry.load_arrivals = 0;
      AutoscaleLocked(entry, sample, batch);
    }
    std::erase_if(gateways, [&](const auto& gateway) {
      return steady_now - gateway.second.last_seen > 4 * kGatewayTimeout;
    });
  }
  bool changed = false;
  for (auto& [name, entry] : deployments)
    changed = ReconcileDeploymentLocked(entry, now, batch, wake) || changed;
  if (changed) ChangedLocked();
  // Level-triggered: whatever moved a replica (this pass, a lost node, a preemption), the set
  // gateways see is recomputed, and sent only when it differs.
  RefreshEndpointsLocked();
}

api::EndpointSet Server::Impl::EndpointsLocked(const std::optional<Caller>& caller) const {
  api::EndpointSet set;
  set.version = endpoints_version;
  for (const auto& [name, entry] : deployments) {
    if (caller && !caller->admin() && entry.record.team != caller->info.team) continue;
    api::DeploymentEndpoints deployment;
    deployment.name = name;
    deployment.team = entry.record.team;
    deployment.models = entry.record.spec.models;
    deployment.routing = entry.record.spec.routing;
    for (JobId id : entry.replicas) {
      auto it = jobs.find(id);
      if (it == jobs.end() || !ReplicaReady(it->second)) continue;
      const api::TaskStatus& task = it->second.tasks.front();
      auto node = nodes.find(task.node);
      if (node == nodes.end() || node->second.record.state == api::NodeState::kLost) continue;
      const std::string& address = node->second.record.report.address;
      deployment.endpoints.push_back(api::EndpointInfo{
          fmt::format("j{}", id), address.empty() ? task.node : address, task.port});
    }
    set.deployments.push_back(std::move(deployment));
  }
  return set;
}

void Server::Impl::RefreshEndpointsLocked() {
  api::EndpointSet set = EndpointsLocked(std::nullopt);
  set.version = 0;
  std::string digest = json(set).dump();
  if (digest == endpoints_digest && endpoints_version != 0) return;
  endpoints_digest = std::move(digest);
  // From the wall clock, like desired versions: a restarted server's differ from the old ones.
  endpoints_version = std::max(endpoints_version + 1, static_cast<uint64_t>(WallMs()) * 1000);
  std::vector<EndpointWatch> watches = std::move(endpoint_watches);
  endpoint_watches.clear();
  for (EndpointWatch& watch : watches)
    watch.respond(HttpResponse::Json(200, json(EndpointsLocked(watch.caller)).dump()));
}

void Server::Impl::ExpireEndpointWatchesLocked(SteadyTime now, SteadyTime& next) {
  auto expired = std::stable_partition(endpoint_watches.begin(), endpoint_watches.end(),
                                       [&](const EndpointWatch& w) { return w.deadline > now; });
  for (auto it = expired; it != endpoint_watches.end(); ++it)
    it->respond(HttpResponse::Json(200, json(EndpointsLocked(it->caller)).dump()));
  endpoint_watches.erase(expired, endpoint_watches.end());
  for (const EndpointWatch& watch : endpoint_watches)
    next = std::min(next, watch.deadline);
}

}  // namespace gpufleet::server
