// The HTTP routes of docs/api.md. Every mutation changes memory and queues its store batch under
// the state lock, and is answered from the commit's callback once the batch is durable, so no io
// thread ever waits for an fsync.

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <deque>
#include <initializer_list>
#include <limits>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "api/json.h"
#include "core/quantity.h"
#include "net/http_client.h"
#include "net/secrets.h"
#include "net/server_urls.h"
#include "sched/scheduler.h"
#include "server/lifecycle.h"
#include "server/server_impl.h"
#include "server/web_assets.h"

namespace gpufleet::server {

// ---- Route helpers, shared with deployments.cpp (server_impl.h) ---------------------------

net::HttpResponse JsonResponse(int status, const nlohmann::json& body) {
  return net::HttpResponse::Json(status, body.dump());
}

net::HttpResponse Stopping(const std::string& why) {
  net::HttpResponse response = net::HttpResponse::Error(503, why);
  response.headers.emplace_back(std::string(net::kServerRoleHeader), "stopping");
  return response;
}

net::HttpResponse StoreFailed(const std::string& error) {
  return Stopping("store failed: " + error);  // a failed commit is fatal: this server stops
}

Server::Impl::CommitDone AnswerWhenDurable(net::HttpResponder respond, net::HttpResponse response) {
  return [respond = std::move(respond), response = std::move(response)](const std::string& error) {
    respond(error.empty() ? response : StoreFailed(error));
  };
}

bool RefuseMutationLocked(Server::Impl& s, net::HttpResponder& respond) {
  if (s.failed()) {
    respond(Stopping(s.FatalMessage()));
    return true;
  }
  if (s.stopping) {
    respond(Stopping("the server is stopping"));
    return true;
  }
  return false;
}

const sched::QueueConfig* FindQueue(const ServerOptions& options, std::string_view name) {
  const auto& queues = options.scheduler.queues;
  const auto it = std::find_if(queues.begin(), queues.end(),
                               [&](const sched::QueueConfig& queue) { return queue.name == name; });
  return it == queues.end() ? nullptr : &*it;
}

std::optional<std::string> UnknownQueue(const ServerOptions& options, std::string_view name) {
  const auto& queues = options.scheduler.queues;
  if (queues.empty() || FindQueue(options, name)) return std::nullopt;
  std::vector<std::string> names;
  for (const sched::QueueConfig& queue : queues)
    names.push_back(queue.name);
  return fmt::format("queue '{}' does not exist; the queues are {}", name, fmt::join(names, ", "));
}

std::optional<uint64_t> ParseUnsigned(std::string_view text) {
  uint64_t value = 0;
  if (text.empty() || text.size() > 20) return std::nullopt;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// A query parameter that must be an integer in [min, max]; `fallback` when absent.
std::optional<int64_t> QueryInt(const net::HttpRequest& request, const std::string& name,
                                int64_t fallback, int64_t min, int64_t max, std::string& error) {
  auto text = request.Query(name);
  if (!text) return fallback;
  auto value = ParseUnsigned(*text);
  if (!value || static_cast<int64_t>(*value) < min || static_cast<int64_t>(*value) > max ||
      *value > static_cast<uint64_t>(max)) {
    error = fmt::format("'{}' must be an integer from {} to {}, not '{}'", name, min, max, *text);
    return std::nullopt;
  }
  return static_cast<int64_t>(*value);
}

std::optional<std::string> QueueClosedTo(const ServerOptions& options, std::string_view name,
                                         const Caller& caller) {
  const sched::QueueConfig* queue = FindQueue(options, name);
  if (!queue || queue->teams.empty() || caller.admin() ||
      std::find(queue->teams.begin(), queue->teams.end(), caller.info.team) != queue->teams.end())
    return std::nullopt;
  return fmt::format("queue '{}' is for team(s) {}; team '{}' may not submit to it", name,
                     fmt::join(queue->teams, ", "), caller.info.team);
}

namespace {

using api::JobRecord;
using api::JobState;
using api::NodeState;
using api::Role;
using net::HttpRequest;
using net::HttpResponder;
using net::HttpResponse;
using nlohmann::json;
using store::Mutation;
using Impl = Server::Impl;

constexpr TimeMs kNoEnd = std::numeric_limits<TimeMs>::max();

constexpr int64_t kDefaultListLimit = 100;
constexpr int64_t kMaxListLimit = 10000;
constexpr std::chrono::milliseconds kLogProxyTimeout{5000};
// Longest lifetime and rotation overlap a token may be given.
constexpr TimeMs kMaxTokenLifetimeMs = 10LL * 365 * 24 * 3600 * 1000;

// "2026-12-05T21:30:00Z"
std::string FormatUtc(TimeMs ms) {
  const std::time_t seconds = static_cast<std::time_t>(ms / 1000);
  std::tm utc{};
  ::gmtime_r(&seconds, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return stamp;
}

bool ValidNodeName(std::string_view name) {
  if (name.empty() || name.size() > 253) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

bool ValidUserName(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
           c == '@';
  });
}

// The job's name when none was given: the command's first word, as far as it is a valid name.
std::string DefaultName(const std::vector<std::string>& command) {
  std::string word = command.front();
  if (auto slash = word.rfind('/'); slash != std::string::npos) word = word.substr(slash + 1);
  std::string name;
  for (char c : word)
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')
      name.push_back(c);
  if (name.size() > 128) name.resize(128);
  return name;
}

// Parses a JSON body; a 400 with the reason when malformed or nested too deep.
std::optional<json> ParseBody(const HttpRequest& request, HttpResponder& respond) {
  std::string error;
  auto body = api::ParseRequestJson(request.body, error);
  if (!body) respond(HttpResponse::Error(400, error));
  return body;
}

// A duration field ("30d", "1h", or seconds as a number) of at most ten years; `fallback` when
// absent; nothing after a 400.
std::optional<TimeMs> DurationField(const json& body, const char* field, TimeMs fallback,
                                    HttpResponder& respond) {
  auto it = body.find(field);
  if (it == body.end()) return fallback;
  std::optional<TimeMs> ms;
  if (it->is_number() && it->get<double>() >= 0 && it->get<double>() <= 1e12)
    ms = static_cast<TimeMs>(it->get<double>() * 1000);
  else if (it->is_string())
    ms = ParseDurationMs(it->get<std::string>());
  if (!ms || *ms < 0 || *ms > kMaxTokenLifetimeMs) {
    respond(HttpResponse::Error(
        400, fmt::format("'{}' must be a duration of at most 10 years (\"30d\", \"12h\", or "
                         "seconds), not {}",
                         field, it->dump())));
    return std::nullopt;
  }
  return ms;
}

bool SchedulingShapeDiffers(const api::NodeReport& a, const api::NodeReport& b) {
  if (a.rack != b.rack || a.spine != b.spine || a.cpu_milli != b.cpu_milli ||
      a.memory_mib != b.memory_mib || a.gpus.size() != b.gpus.size())
    return true;
  for (size_t i = 0; i < a.gpus.size(); ++i) {
    const api::GpuStatus& x = a.gpus[i];
    const api::GpuStatus& y = b.gpus[i];
    if (x.index != y.index || x.uuid != y.uuid || x.model != y.model ||
        x.memory_mib != y.memory_mib || x.nvlink_island != y.nvlink_island ||
        x.healthy != y.healthy)
      return true;
  }
  return false;
}

bool IdentityDiffers(const api::NodeReport& a, const api::NodeReport& b) {
  return a.address != b.address || a.agent_url != b.agent_url || a.backend != b.backend ||
         a.agent_version != b.agent_version;
}

int64_t CountHealthyGpus(const api::NodeReport& report) {
  return std::count_if(report.gpus.begin(), report.gpus.end(),
                       [](const api::GpuStatus& gpu) { return gpu.healthy; });
}

// ---- Route helpers --------------------------------------------------------------------------

using Handler = RouteHandler;

// A job the caller may see, or an answer already given (400 bad id, 404 unknown or another
// team's). Called with the lock held.
JobRecord* FindJobLocked(Impl& s, const HttpRequest& request, const Caller& caller,
                         HttpResponder& respond) {
  const std::string text = request.PathParam("id");
  auto id = ParseUnsigned(text);
  if (!id) {
    respond(HttpResponse::Error(400, fmt::format("job id must be a number, not '{}'", text)));
    return nullptr;
  }
  auto it = s.jobs.find(*id);
  // Another team's job is answered exactly like a missing one: its existence is not revealed.
  if (it == s.jobs.end() || (!caller.admin() && it->second.team != caller.info.team)) {
    respond(HttpResponse::Error(404, fmt::format("no job {}", *id)));
    return nullptr;
  }
  return &it->second;
}

// ---- Jobs -------------------------------------------------------------------------------------

void SubmitJob(Impl& s, const HttpRequest& request, const Caller& caller, HttpResponder respond) {
  std::string error;
  auto spec = api::ParseJobSubmissionText(request.body, error);
  if (!spec) return respond(HttpResponse::Error(400, error));
  if (auto unknown = UnknownQueue(s.options, spec->queue))
    return respond(HttpResponse::Error(422, *unknown));
  if (auto closed = QueueClosedTo(s.options, spec->queue, caller))
    return respond(HttpResponse::Error(403, *closed));
  if (spec->name.empty()) spec->name = DefaultName(spec->command);
  std::lock_guard lock(s.mu);
  if (RefuseMutationLocked(s, respond)) return;
  const TimeMs now = WallMs();
  JobRecord job;
  job.user = caller.info.user;
  job.team = caller.info.team;
  job.spec = std::move(*spec);
  job.created_ms = now;
  sched::FeasibilityChecker* cluster = s.FeasibilityLocked();
  if (cluster) {
    const JobSpec request_spec = ToJobSpec(job);
    if (auto why = cluster->Check(request_spec))
      return respond(HttpResponse::Error(422, sched::DescribeWait(*why, request_spec)));
  }
  job.id = s.next_job_id++;
  SetState(job, JobState::kPending, fmt::format("submitted by {}", job.user), now);
  if (cluster) {
    job.reason = "waiting for the next scheduling cycle";
    job.reason_code = "queued";
  } else {
    job.reason = "no nodes are ready";
    job.reason_code = "no_ready_nodes";
  }
  std::vector<Mutation> batch;
  batch.push_back(s.PutJobLocked(job));
  batch.push_back(s.AuditLocked(
      caller, "job.submit", fmt::format("job/{}", job.id),
      fmt::format("{} in queue {}: {} task(s) x {} GPU(s)", job.spec.name, job.spec.queue,
                  job.spec.tasks, api::FormatGpus(job.spec.gpu_milli_per_task)),
      now));
  HttpResponse response = JsonResponse(201, job);
  s.IndexJobLocked(job);
  s.jobs.emplace(job.id, std::move(job));
  s.WakeSchedulerLocked();
  s.CommitLocked(std::move(batch), AnswerWhenDurable(std::move(respond), std::move(response)));
}

void ListJobs(Impl& s, const HttpRequest& request, const Caller& caller, HttpResponder respond) {
  std::string error;
  auto limit = QueryInt(request, "limit", kDefaultListLimit, 1, kMaxListLimit, error);
  if (!limit) return respond(HttpResponse::Error(400, error));
  std::optional<JobState> state;
  if (auto text = request.Query("state"); text && !text->empty()) {
    state = api::ParseJobState(*text);
    if (!state)
      return respond(HttpResponse::Error(
          400, fmt::format("unknown state '{}' (pending, scheduled, starting, running, "
                           "succeeded, failed, cancelled)",
                           *text)));
  }
  const std::string queue = request.Query("queue").value_or("");
  const std::string team = request.Query("team").value_or("");
  const std::string user = request.Query("user").value_or("");
  json list = json::array();
  {
    std::lock_guard lock(s.mu);
    for (auto it = s.jobs.rbegin(); it != s.jobs.rend(); ++it) {
      const JobRecord& job = it->second;
      if (!caller.admin() && job.team != caller.info.team) continue;
      if ((state && job.state != *state) || (!queue.empty() && job.spec.queue != queue) ||
          (!team.empty() && job.team != team) || (!user.empty() && job.user != user))
        continue;
      list.push_back(job);
      if (static_cast<int64_t>(list.size()) >= *limit) break;
    }
  }
  respond(JsonResponse(200, json{{"jobs", std::move(list)}}));
}

void GetJob(Impl& s, const HttpRequest& request, const Caller& caller, HttpResponder respond) {
  std::lock_guard lock(s.mu);
  if (JobRecord* job = FindJobLocked(s, request, caller, respond)) respond(JsonResponse(200, *job));
}

void CancelJobRoute(Impl& s, const HttpRequest& request, const Caller& caller,
                    HttpResponder respond) {
  std::lock_guard lock(s.mu);
  JobRecord* job = FindJobLocked(s, request, caller, respond);
  if (!job) return;
  if (api::IsTerminal(job->state))
    return respond(HttpResponse::Error(
        409, fmt::format("job {} has already ended ({})", job->id, api::JobStateName(job->state))));
  if (RefuseMutationLocked(s, respond)) return;
  const TimeMs now = WallMs();
  const std::vector<std::string> nodes = s.NodesOf(*job);
  const bool was_active = IsActive(job->state);
  CancelJob(*job, fmt::format("cancelled by {}", caller.info.user), now);
  s.IndexJobLocked(*job);
  std::vector<Mutation> batch;
  batch.push_back(s.PutJobLocked(*job));
  batch.push_back(
      s.AuditLocked(caller, "job.cancel", fmt::format("job/{}", job->id), job->spec.name, now));
  if (was_active)
    for (const std::string& node : nodes)
      s.BumpLocked(node);  // its tasks leave the desired state: the agents stop them
  s.ChangedLocked();
  s.CommitLocked(std::move(batch), AnswerWhenDurable(std::move(respond), JsonResponse(200, *job)),
                 was_active ? nodes : std::vector<std::string>{});
}

void JobLogs(Impl& s, const HttpRequest& request, const Caller& caller, HttpResponder respond) {
  std::string error;
  auto task = QueryInt(request, "task", 0, 0, 100'000, error);
  if (!task) return respond(HttpResponse::Error(400, error));
  auto offset_text = request.Query("offset").value_or("0");
  auto offset = ParseUnsigned(offset_text);
  if (!offset)
    return respond(HttpResponse::Error(
        400, fmt::format("'offset' must be a non-negative integer, not '{}'", offset_text)));
  const std::string stream = request.Query("stream").value_or("stdout");
  if (stream != "stdout" && stream != "stderr")
    return respond(HttpResponse::Error(
        400, fmt::format("'stream' must be stdout or stderr, not '{}'", stream)));
  std::string url;
  std::string node;
  std::string agent_key;
  {
    std::lock_guard lock(s.mu);
    JobRecord* job = FindJobLocked(s, request, caller, respond);
    if (!job) return;
    if (*task >= job->spec.tasks)
      return respond(
          HttpResponse::Error(400, fmt::format("job {} has {} task(s): 'task' must be from 0 to {}",
                                               job->id, job->spec.tasks, job->spec.tasks - 1)));
    if (job->tasks.empty()) {
      // Not placed (yet): nothing written so far.
      HttpResponse empty = HttpResponse::Text(200, "");
      empty.headers.emplace_back("X-Log-Next-Offset", std::to_string(*offset));
      empty.headers.emplace_back("X-Log-Finished", api::IsTerminal(job->state) ? "true" : "false");
      return respond(std::move(empty));
    }
    const api::TaskStatus& status = job->tasks.at(static_cast<size_t>(*task));
    node = status.node;
    auto it = s.nodes.find(node);
    std::string agent_url = it != s.nodes.end() ? it->second.record.report.agent_url : "";
    if (agent_url.empty())
      return respond(HttpResponse::Error(
          502, fmt::format("node {} has not told the server its agent's URL", node)));
    while (!agent_url.empty() && agent_url.back() == '/')
      agent_url.pop_back();
    url = fmt::format("{}/v1/workloads/{}/logs?stream={}&offset={}", agent_url, status.workload_id,
                      stream, *offset);
    agent_key = it->second.agent_key;
  }
  // The agent may be slow or gone: the call runs on the proxy pool, never on an io thread.
  s.proxy_pool.Post([url, node, agent_key, ca_file = s.options.agent_ca_file, task = *task,
                     respond = std::move(respond)] {
    net::HttpCallOptions call;
    call.timeout = kLogProxyTimeout;
    call.ca_file = ca_file;
    if (!agent_key.empty()) call.headers.emplace_back("Authorization", "Bearer " + agent_key);
    net::HttpResult result = net::HttpCall("GET", url, call);
    if (!result.ok())
      return respond(HttpResponse::Error(
          502, fmt::format("cannot reach the agent on node {}: {}", node, result.error)));
    const net::HttpClientResponse& answer = *result.response;
    if (answer.status == 200) {
      HttpResponse out = HttpResponse::Text(
          200, answer.body,
          answer.content_type.empty() ? "text/plain; charset=utf-8" : answer.content_type);
      for (const auto& [name, value] : answer.headers) {
        if (name.size() > 6 && std::equal(name.begin(), name.begin() + 6, "x-log-",
                                          [](char a, char b) { return std::tolower(a) == b; }))
          out.headers.emplace_back(name, value);
      }
      return respond(std::move(out));
    }
    std::string detail = answer.body;
    try {
      detail = json::parse(answer.body).at("error").get<std::string>();
    } catch (const std::exception&) {
    }
    if (answer.status == 404)
      return respond(HttpResponse::Error(
          404, fmt::format("the agent on node {} has no logs of task {}: {}", node, task, detail)));
    respond(HttpResponse::Error(
        502, fmt::format("the agent on node {} answered {}: {}", node, answer.status, detail)));
  });
}

// ---- Nodes and queues ------------------------------------------------------------------------

json NodeJsonLocked(const Impl& s, const Impl::NodeEntry& entry) {
  api::NodeRecord record = entry.record;
  record.gpu_jobs.clear();
  for (JobId id : s.active_jobs) {
    const JobRecord& job = s.jobs.at(id);
    for (const api::TaskStatus& task : job.tasks)
      if (task.node == record.report.name)
        for (int32_t index : task.gpu_indices)
          record.gpu_jobs[index].push_back(id);
  }
  return record;
}

void ListNodes(Impl& s, const HttpRequest&, const Caller&, HttpResponder respond) {
  json list = json::array();
  {
    std::lock_guard lock(s.mu);
    for (const auto& [name, entry] : s.nodes)
      list.push_back(NodeJsonLocked(s, entry));
  }
  respond(JsonResponse(200, json{{"nodes", std::move(list)}}));
}

void SetDrained(Impl& s, const HttpRequest& request, const Caller& caller, HttpResponder respond,
                bool drained) {
  const std::string name = request.PathParam("name");
  std::lock_guard lock(s.mu);
  auto it = s.nodes.find(name);
  if (it == s.nodes.end())
    return respond(HttpResponse::Error(404, fmt::format("no node {}", name)));
  if (RefuseMutationLocked(s, respond)) return;
  Impl::NodeEntry& node = it->second;
  node.record.drained = drained;
  if (node.record.state != NodeState::kLost)
    node.record.state = drained ? NodeState::kDraining : NodeState::kReady;
  const TimeMs now = WallMs();
  std::vector<Mutation> batch;
  batch.push_back(s.PutNodeLocked(node));
  batch.push_back(
      s.AuditLocked(caller, drained ? "node.drain" : "node.undrain", "node/" + name, "", now));
  s.CapacityChangedLocked();
  s.Log(fmt::format("node {} {} by {}", name, drained ? "drained" : "undrained", caller.info.user));
  s.CommitLocked(std::move(batch),
                 AnswerWhenDurable(std::move(respond), JsonResponse(200, NodeJsonLocked(s, node))));
}

void DrainNode(Impl& s, const HttpRequest& request, const Caller& caller, HttpResponder respond) {
  SetDrained(s, request, caller, std::move(respond), true);
}

void UndrainNode(Impl& s, const HttpRequest& request, const Caller& caller, HttpResponder respond) {
  SetDrained(s, request, caller, std::move(respond), false);
}

// Every queue with its jobs, quota and fair share, for GET /queues and /metrics; s.mu held.
// Queues exist by use: "default" always, and every queue a job (even a finished one) named, so
// an idle queue still shows with zeros.
std::map<std::string, api::QueueStatus> QueueStatusesLocked(Impl& s) {
  std::map<std::string, api::QueueStatus> queues;
  if (s.options.scheduler.queues.empty()) queues["default"].name = "default";
  for (const sched::QueueConfig& config : s.options.scheduler.queues) {
    api::QueueStatus& queue = queues[config.name];
    queue.name = config.name;
    queue.configured = true;
    queue.cohort = config.cohort;
    queue.gpu_milli_guaranteed = config.guaranteed_milli;
    if (config.PerModel()) {
      queue.gpu_milli_guaranteed = 0;
      for (const auto& [model, milli] : config.guaranteed_milli_by_model)
        queue.gpu_milli_guaranteed += milli;
    }
    queue.gpu_milli_borrowing_limit = config.borrowing_limit_milli;
    queue.weight = config.weight;
    queue.teams = config.teams;
  }
  // Only the pending and active jobs are visited: `top` asks every two seconds, and the job
  // history may hold hundreds of thousands.
  for (const std::string& name : s.queue_names)
    queues[name].name = name;
  for (const auto& [id, pending] : s.pending_jobs) {
    api::QueueStatus& queue = queues[pending->spec.queue];
    ++queue.pending;
    queue.gpu_milli_pending += pending->spec.TotalGpuMilli();
  }
  for (JobId id : s.active_jobs) {
    const JobRecord& job = s.jobs.at(id);
    api::QueueStatus& queue = queues[job.spec.queue];
    ++queue.running;
    queue.gpu_milli_running += job.spec.gpu_milli_per_task * job.spec.tasks;
  }
  const auto usage = s.FairShareUsageLocked(WallMs());
  const auto factors = sched::FairShareFactors(usage, s.options.scheduler.queues);
  for (auto& [name, queue] : queues) {
    if (auto used = usage.find(name); used != usage.end())
      queue.fair_share_usage_gpu_hours = used->second / 3600.0;
    if (auto factor = factors.find(name); factor != factors.end())
      queue.fair_share_factor = factor->second;
  }
  return queues;
}

void ListQueues(Impl& s, const HttpRequest&, const Caller&, HttpResponder respond) {
  std::map<std::string, api::QueueStatus> queues;
  {
    std::lock_guard lock(s.mu);
    queues = QueueStatusesLocked(s);
  }
  json list = json::array();
  for (const auto& [name, queue] : queues)
    list.push_back(queue);
  respond(JsonResponse(200, json{{"queues", std::move(list)}}));
}

// ---- Usage ----------------------------------------------------------------------------------

// GPU-hours per team (or per team and user) within [since_ms, until_ms): a user sees their own
// team's rows only.
void Usage(Impl& s, const HttpRequest& request, const Caller& caller, HttpResponder respond) {
  std::string error;
  const TimeMs now = WallMs();
  auto since = QueryInt(request, "since_ms", 0, 0, kNoEnd, error);
  auto until = since ? QueryInt(request, "until_ms", now, 0, kNoEnd, error) : std::nullopt;
  if (!since || !until) return respond(HttpResponse::Error(400, error));
  if (*until <= *since)
    return respond(HttpResponse::Error(
        400, fmt::format("until_ms {} must be after since_ms {}", *until, *since)));
  const std::string by = request.Query("by").value_or("team");
  if (by != "team" && by != "user")
    return respond(HttpResponse::Error(400, fmt::format("by '{}': expected team or user", by)));
  struct Row {
    int64_t gpu_ms = 0;
    int64_t jobs = 0;
  };
  std::map<std::pair<std::string, std::string>, Row> rows;
  {
    std::lock_guard lock(s.mu);
    for (const auto& [id, job] : s.jobs) {
      if (!caller.admin() && job.team != caller.info.team) continue;
      const int64_t gpu_ms = GpuMsBetween(job, *since, *until, now);
      if (gpu_ms == 0) continue;
      Row& row = rows[{job.team, by == "user" ? job.user : ""}];
      row.gpu_ms += gpu_ms;
      ++row.jobs;
    }
  }
  json list = json::array();
  for (const auto& [key, row] : rows) {
    json entry = {{"team", key.first},
                  {"gpu_hours", static_cast<double>(row.gpu_ms) / 3'600'000.0},
                  {"gpu_ms", row.gpu_ms},
                  {"jobs", row.jobs}};
    if (by == "user") entry["user"] = key.second;
    list.push_back(std::move(entry));
  }
  std::stable_sort(list.begin(), list.end(), [](const json& a, const json& b) {
    return a["gpu_ms"].get<int64_t>() > b["gpu_ms"].get<int64_t>();
  });
  respond(JsonResponse(
      200,
      json{{"since_ms", *since}, {"until_ms", *until}, {"by", by}, {"usage", std::move(list)}}));
}

// ---- Tokens, identity, audit -------------------------------------------------------------------

void Whoami(Impl&, const HttpRequest&, const Caller& caller, HttpResponder respond) {
  respond(JsonResponse(200, caller.info));
}

void CreateTokenRoute(Impl& s, const HttpRequest& request, const Caller& caller,
                      HttpResponder respond) {
  auto body = ParseBody(request, respond);
  if (!body) return;
  if (!body->is_object())
    return respond(HttpResponse::Error(400, "a token request must be a JSON object"));
  for (const auto& [key, value] : body->items())
    if (key != "user" && key != "team" && key != "role" && key != "scope" && key != "expires_in")
      return respond(HttpResponse::Error(
          400,
          fmt::format("unknown field '{}' (known: expires_in, role, scope, team, user)", key)));
  auto text = [&](const char* field, std::string fallback) -> std::optional<std::string> {
    auto it = body->find(field);
    if (it == body->end()) return fallback;
    if (!it->is_string()) {
      respond(HttpResponse::Error(400, fmt::format("'{}' must be a string", field)));
      return std::nullopt;
    }
    return it->get<std::string>();
  };
  auto user = text("user", "");
  if (!user) return;
  auto team = text("team", "");
  if (!team) return;
  auto role_name = text("role", "user");
  if (!role_name) return;
  auto role = api::ParseRole(*role_name);
  if (!role)
    return respond(HttpResponse::Error(
        400, fmt::format("'role' must be admin, user or agent, not '{}'", *role_name)));
  if (!ValidUserName(*user))
    return respond(HttpResponse::Error(
        400,
        fmt::format("'user' must be 1-64 letters, digits, '-', '_', '.' or '@', not '{}'", *user)));
  if (!team->empty() && !ValidUserName(*team))
    return respond(HttpResponse::Error(
        400,
        fmt::format("'team' must be 1-64 letters, digits, '-', '_', '.' or '@', not '{}'", *team)));
  if (*role == Role::kUser && team->empty())
    return respond(HttpResponse::Error(400, "'team' is required for a user token"));
  auto scope = text("scope", api::DefaultScope(*role));
  if (!scope) return;
  if (auto scope_error = api::ScopeError(*role, *scope))
    return respond(HttpResponse::Error(400, *scope_error));
  auto lifetime = DurationField(*body, "expires_in", 0, respond);
  if (!lifetime) return;
  const TimeMs now = WallMs();
  std::lock_guard lock(s.mu);
  if (RefuseMutationLocked(s, respond)) return;
  std::vector<Mutation> batch;
  CreatedToken created = s.CreateTokenLocked(*user, *team, *role, caller, now, batch, *scope,
                                             *lifetime ? now + *lifetime : 0);
  s.CommitLocked(std::move(batch),
                 AnswerWhenDurable(
                     std::move(respond),
                     JsonResponse(201, json{{"token", created.secret}, {"info", created.info}})));
}

// Replaces a token without downtime: a new secret with the same user, team, role, scope and
// lifetime, while the old one keeps working for `overlap` (default 1h; 0: refused at once).
void RotateToken(Impl& s, const HttpRequest& request, const Caller& caller, HttpResponder respond) {
  std::optional<json> body = json::object();
  if (request.body.find_first_not_of(" \t\r\n") != std::string::npos)
    body = ParseBody(request, respond);
  if (!body) return;
  if (!body->is_object())
    return respond(HttpResponse::Error(400, "a rotation request must be a JSON object"));
  for (const auto& [key, value] : body->items())
    if (key != "overlap")
      return respond(
          HttpResponse::Error(400, fmt::format("unknown field '{}' (known: overlap)", key)));
  auto overlap = DurationField(*body, "overlap", 3600 * 1000, respond);
  if (!overlap) return;
  const std::string id = request.PathParam("id");
  const TimeMs now = WallMs();
  std::lock_guard lock(s.mu);
  auto it = s.tokens.find(id);
  if (it == s.tokens.end())
    return respond(HttpResponse::Error(404, fmt::format("no token {}", id)));
  api::TokenInfo old = it->second.info;
  if (old.expires_ms != 0 && old.expires_ms <= now)
    return respond(HttpResponse::Error(409, fmt::format("token {} expired at {}: create a new one",
                                                        id, FormatUtc(old.expires_ms))));
  if (!old.rotated_to.empty())
    return respond(HttpResponse::Error(
        409, fmt::format("token {} was already rotated to {}", id, old.rotated_to)));
  if (RefuseMutationLocked(s, respond)) return;
  std::vector<Mutation> batch;
  const TimeMs lifetime = old.expires_ms ? old.expires_ms - old.created_ms : 0;
  CreatedToken created = s.CreateTokenLocked(old.user, old.team, old.role, caller, now, batch,
                                             old.scope, lifetime ? now + lifetime : 0);
  Impl::TokenEntry& entry = s.tokens.at(id);
  const TimeMs retire = now + *overlap;
  entry.info.expires_ms = entry.info.expires_ms ? std::min(entry.info.expires_ms, retire) : retire;
  entry.info.rotated_to = created.info.id;
  batch.push_back(s.PutTokenLocked(entry));
  batch.push_back(s.AuditLocked(caller, "token.rotate", "token/" + id,
                                fmt::format("to {}, the old one refused from {}", created.info.id,
                                            FormatUtc(entry.info.expires_ms)),
                                now));
  s.CommitLocked(
      std::move(batch),
      AnswerWhenDurable(std::move(respond), JsonResponse(201, json{{"token", created.secret},
                                                                   {"info", created.info},
                                                                   {"previous", entry.info}})));
}

void ListTokens(Impl& s, const HttpRequest&, const Caller&, HttpResponder respond) {
  json list = json::array();
  {
    std::lock_guard lock(s.mu);
    for (const auto& [id, entry] : s.tokens)
      list.push_back(entry.info);
  }
  respond(JsonResponse(200, json{{"tokens", std::move(list)}}));
}

void RevokeToken(Impl& s, const HttpRequest& request, const Caller& caller, HttpResponder respond) {
  const std::string id = request.PathParam("id");
  std::lock_guard lock(s.mu);
  auto it = s.tokens.find(id);
  if (it == s.tokens.end())
    return respond(HttpResponse::Error(404, fmt::format("no token {}", id)));
  if (RefuseMutationLocked(s, respond)) return;
  const api::TokenInfo info = it->second.info;
  s.token_by_sha256.erase(it->second.sha256);
  s.tokens.erase(it);
  std::vector<Mutation> batch;
  batch.push_back(Mutation::Delete(TokenKey(id)));
  batch.push_back(s.AuditLocked(caller, "token.revoke", "token/" + id,
                                fmt::format("user {} role {}", info.user, api::RoleName(info.role)),
                                WallMs()));
  s.CommitLocked(std::move(batch),
                 AnswerWhenDurable(std::move(respond), JsonResponse(200, json{{"revoked", info}})));
}

void ListAudit(Impl& s, const HttpRequest& request, const Caller&, HttpResponder respond) {
  std::string error;
  auto limit = QueryInt(request, "limit", kDefaultListLimit, 1, kMaxListLimit, error);
  if (!limit) return respond(HttpResponse::Error(400, error));
  // The store has no reverse scan: keep the last `limit` entries of a forward one.
  std::deque<std::string> last;
  try {
    s.store->Scan(kAuditPrefix, [&](std::string_view, std::string_view value) {
      last.emplace_back(value);
      if (static_cast<int64_t>(last.size()) > *limit) last.pop_front();
    });
  } catch (const std::exception& scan_error) {
    return respond(StoreFailed(scan_error.what()));
  }
  json list = json::array();
  for (auto it = last.rbegin(); it != last.rend(); ++it)
    list.push_back(json::parse(*it));
  respond(JsonResponse(200, json{{"entries", std::move(list)}}));
}

// ---- Agents -----------------------------------------------------------------------------------

void Sync(Impl& s, const HttpRequest& request, const Caller&, HttpResponder respond) {
  auto body = ParseBody(request, respond);
  if (!body) return;
  api::SyncRequest sync;
  try {
    sync = body->get<api::SyncRequest>();
  } catch (const std::exception& error) {
    return respond(HttpResponse::Error(400, fmt::format("bad sync request: {}", error.what())));
  }
  if (sync.agent_key.size() > 256)
    return respond(HttpResponse::Error(
        400, fmt::format("agent_key is {} bytes; at most 256", sync.agent_key.size())));
  const std::string name = sync.node.name;
  if (!ValidNodeName(name))
    return respond(HttpResponse::Error(
        400,
        fmt::format("node name must be 1-253 letters, digits, '-', '_' or '.', not '{}'", name)));
  ++s.agent_syncs;
  std::unique_lock lock(s.mu);
  if (s.failed()) return respond(Stopping(s.FatalMessage()));
  const TimeMs now = WallMs();
  auto [it, registered] = s.nodes.try_emplace(name);
  Impl::NodeEntry& node = it->second;
  bool persist = false;
  bool capacity_changed = false;
  if (registered) {
    node.record.registered_ms = now;
    node.record.state = NodeState::kReady;
    node.version = ++s.last_version;
    persist = capacity_changed = true;
    s.Log(fmt::format("node {} registered: {} GPU(s), backend {}, agent {}", name,
                      sync.node.gpus.size(), sync.node.backend, sync.node.agent_url));
  } else {
    if (node.record.state == NodeState::kLost) {
      node.record.state = node.record.drained ? NodeState::kDraining : NodeState::kReady;
      persist = capacity_changed = true;
      s.Log(fmt::format("node {} is back", name));
    }
    if (SchedulingShapeDiffers(node.record.report, sync.node)) {
      persist = capacity_changed = true;
      if (CountHealthyGpus(node.record.report) != CountHealthyGpus(sync.node))
        s.Log(fmt::format("node {}: {} healthy GPU(s), was {}", name, CountHealthyGpus(sync.node),
                          CountHealthyGpus(node.record.report)));
    }
    persist = persist || IdentityDiffers(node.record.report, sync.node);
  }
  node.record.report = std::move(sync.node);
  node.agent_key = std::move(sync.agent_key);
  node.record.last_seen_ms = now;
  node.last_seen = std::chrono::steady_clock::now();
  if (s.options.idle_gpu_timeout_ms > 0) s.TrackIdleLocked(name, now);
  std::vector<Mutation> batch;
  std::vector<std::string> wake;
  if (persist) batch.push_back(s.PutNodeLocked(node));
  if (capacity_changed) s.CapacityChangedLocked();
  bool endpoints_changed = false;
  for (const api::WorkloadReport& report : sync.workloads) {
    auto job = s.jobs.find(report.job_id);
    if (job == s.jobs.end()) continue;
    const std::vector<std::string> on = s.NodesOf(job->second);
    const ReportEffect effect = ApplyWorkloadReport(job->second, report, name, now);
    if (!effect.changed) continue;
    endpoints_changed = endpoints_changed || effect.readiness_changed ||
                        (effect.ended && job->second.replica.has_value());
    s.IndexJobLocked(job->second);
    batch.push_back(s.PutJobLocked(job->second));
    if (effect.ended) {
      // The gang's other tasks leave the desired state (a failed gang stops as a whole).
      for (const std::string& other : on) {
        s.BumpLocked(other);
        wake.push_back(other);
      }
      s.ChangedLocked();
    }
  }
  if (endpoints_changed) s.RefreshEndpointsLocked();
  if (batch.empty())
    return s.FinishSyncLocked(name, sync.known_version, sync.wait_ms, std::move(respond));
  Impl* impl = &s;
  s.CommitLocked(
      std::move(batch),
      [impl, name, known = sync.known_version, wait = sync.wait_ms,
       respond = std::move(respond)](const std::string& error) mutable {
        if (!error.empty()) return respond(StoreFailed(error));
        std::lock_guard relock(impl->mu);
        impl->FinishSyncLocked(name, known, wait, std::move(respond));
      },
      std::move(wake));
}

// ---- The dashboard ------------------------------------------------------------------------------

// The dashboard's own files hold no data, so they are served without a token, like any web app's
// code; everything they show comes through the API and its authorisation. The policy lets the page
// run only its own scripts and styles and talk only to this server; no framing, no referrer.
HttpResponse DashboardFile(std::string_view path) {
  const WebAsset* asset = FindWebAsset(path);
  if (!asset) return HttpResponse::Error(404, fmt::format("the dashboard has no file {}", path));
  HttpResponse response =
      HttpResponse::Text(200, std::string(asset->body), std::string(asset->content_type));
  response.headers = {
      {"Content-Security-Policy",
       "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"},
      {"X-Content-Type-Options", "nosniff"},
      {"X-Frame-Options", "DENY"},
      {"Referrer-Policy", "no-referrer"},
      {"Cache-Control", "no-cache"}};
  return response;
}

// ---- Health and metrics -----------------------------------------------------------------------

HttpResponse Healthz() {
  return HttpResponse::Json(200, R"({"status": "ok"})");
}

HttpResponse Readyz(Impl& s) {
  if (s.failed()) return Stopping(s.FatalMessage());
  std::lock_guard lock(s.mu);
  if (s.stopping) return Stopping("the server is stopping");
  if (!s.scheduler_running) return HttpResponse::Error(503, "the scheduling loop is not running");
  return HttpResponse::Json(200, R"({"status": "ready"})");
}

HttpResponse Metrics(Impl& s) {
  std::map<std::pair<std::string, std::string>, int64_t> jobs_by;
  std::map<std::string, int64_t> nodes_by = {{"ready", 0}, {"draining", 0}, {"lost", 0}};
  int64_t gpus_total = 0;
  MilliGpu allocated_milli = 0;
  uint64_t audit_entries = 0;
  size_t parked = 0;
  std::map<std::string, int64_t> gpu_ms_by_team;
  std::map<std::pair<std::string, std::string>, int64_t> gpu_ms_by_user;
  std::map<std::string, int64_t> idle_by_queue;
  uint64_t idle_reclaims = 0;
  std::map<std::string, uint64_t> preemptions_by_reason;
  std::map<std::string, api::QueueStatus> queues;
  std::vector<api::DeploymentRecord> deployments;
  {
    std::lock_guard lock(s.mu);
    queues = QueueStatusesLocked(s);
    for (const auto& [name, entry] : s.deployments)
      deployments.push_back(s.ShowDeploymentLocked(entry));
    preemptions_by_reason = s.preemptions_by_reason;
    const TimeMs now = WallMs();
    for (const auto& [id, job] : s.jobs)
      ++jobs_by[{job.spec.queue, std::string(api::JobStateName(job.state))}];
    // Ended spans are kept counted; only the running jobs' current spans are added up here.
    gpu_ms_by_team = s.ended_gpu_ms_by_team;
    gpu_ms_by_user = s.ended_gpu_ms_by_user;
    for (JobId id : s.active_jobs) {
      const JobRecord& job = s.jobs.at(id);
      const TimeMs start = ServiceOf(job, now).run_start;
      const int64_t gpu_ms = SpanGpuMs(job, start, std::max(start, now));
      gpu_ms_by_team[job.team] += gpu_ms;
      gpu_ms_by_user[{job.team, job.user}] += gpu_ms;
    }
    for (const auto& [name, entry] : s.nodes) {
      ++nodes_by[std::string(api::NodeStateName(entry.record.state))];
      parked += entry.parked.size();
      if (entry.record.state != NodeState::kLost)
        gpus_total += static_cast<int64_t>(entry.record.report.gpus.size());
    }
    for (JobId id : s.active_jobs) {
      const JobRecord& job = s.jobs.at(id);
      allocated_milli += job.spec.gpu_milli_per_task * job.spec.tasks;
    }
    audit_entries = s.audit_entries;
    idle_reclaims = s.idle_reclaims;
    for (JobId id : s.active_jobs)
      if (s.jobs.at(id).idle_since_ms) ++idle_by_queue[s.jobs.at(id).spec.queue];
  }
  std::string out;
  out += "# HELP gpufleet_jobs Jobs by queue and state.\n# TYPE gpufleet_jobs gauge\n";
  for (const auto& [key, count] : jobs_by)
    out += fmt::format("gpufleet_jobs{{queue=\"{}\",state=\"{}\"}} {}\n", PromLabel(key.first),
                       key.second, count);
  out +=
      "# HELP gpufleet_team_gpu_seconds_total GPU-seconds held by each team's jobs since the "
      "store began.\n# TYPE gpufleet_team_gpu_seconds_total counter\n";
  for (const auto& [team, gpu_ms] : gpu_ms_by_team)
    out += fmt::format("gpufleet_team_gpu_seconds_total{{team=\"{}\"}} {:.3f}\n", PromLabel(team),
                       static_cast<double>(gpu_ms) / 1000.0);
  out +=
      "# HELP gpufleet_user_gpu_seconds_total GPU-seconds held by each user's jobs since the "
      "store began.\n# TYPE gpufleet_user_gpu_seconds_total counter\n";
  for (const auto& [who, gpu_ms] : gpu_ms_by_user)
    out += fmt::format("gpufleet_user_gpu_seconds_total{{team=\"{}\",user=\"{}\"}} {:.3f}\n",
                       PromLabel(who.first), PromLabel(who.second),
                       static_cast<double>(gpu_ms) / 1000.0);
  // Per deployment: what the autoscaler (or a fixed scale) wants and what serves.
  out +=
      "# HELP gpufleet_deployment_desired_replicas Replicas a deployment wants (autoscaler or "
      "fixed scale).\n# TYPE gpufleet_deployment_desired_replicas gauge\n";
  for (const api::DeploymentRecord& deployment : deployments)
    out += fmt::format("gpufleet_deployment_desired_replicas{{deployment=\"{}\",team=\"{}\"}} {}\n",
                       PromLabel(deployment.name), PromLabel(deployment.team),
                       deployment.desired_replicas);
  out +=
      "# HELP gpufleet_deployment_replicas A deployment's replicas by state (pending, starting, "
      "ready, draining).\n# TYPE gpufleet_deployment_replicas gauge\n";
  for (const api::DeploymentRecord& deployment : deployments) {
    std::map<std::string, int64_t> by_state = {
        {"pending", 0}, {"starting", 0}, {"ready", 0}, {"draining", 0}};
    for (const api::ReplicaStatus& replica : deployment.replicas)
      ++by_state[replica.state];
    for (const auto& [state, count] : by_state)
      out += fmt::format("gpufleet_deployment_replicas{{deployment=\"{}\",state=\"{}\"}} {}\n",
                         PromLabel(deployment.name), state, count);
  }
  out +=
      "# HELP gpufleet_deployment_replica_failures A deployment's replicas that failed in a row "
      "(restarts back off).\n# TYPE gpufleet_deployment_replica_failures gauge\n";
  for (const api::DeploymentRecord& deployment : deployments)
    out += fmt::format("gpufleet_deployment_replica_failures{{deployment=\"{}\"}} {}\n",
                       PromLabel(deployment.name), deployment.failures_in_a_row);
  // Per queue, as GET /queues shows it (Kueue's cluster_queue_resource_usage and nominal_quota).
  const auto gpus = [](MilliGpu milli) { return static_cast<double>(milli) / kMilliPerGpu; };
  out +=
      "# HELP gpufleet_queue_gpus GPUs asked for by each queue's jobs: running (scheduled, "
      "starting or running) or pending.\n# TYPE gpufleet_queue_gpus gauge\n";
  for (const auto& [name, queue] : queues) {
    out += fmt::format("gpufleet_queue_gpus{{queue=\"{}\",state=\"running\"}} {}\n",
                       PromLabel(name), gpus(queue.gpu_milli_running));
    out += fmt::format("gpufleet_queue_gpus{{queue=\"{}\",state=\"pending\"}} {}\n",
                       PromLabel(name), gpus(queue.gpu_milli_pending));
  }
  out +=
      "# HELP gpufleet_queue_guaranteed_gpus GPUs guaranteed to each configured queue (all "
      "models).\n# TYPE gpufleet_queue_guaranteed_gpus gauge\n";
  for (const auto& [name, queue] : queues)
    if (queue.configured)
      out +=
          fmt::format("gpufleet_queue_guaranteed_gpus{{queue=\"{}\",cohort=\"{}\"}} {}\n",
                      PromLabel(name), PromLabel(queue.cohort), gpus(queue.gpu_milli_guaranteed));
  out +=
      "# HELP gpufleet_queue_borrowing_limit_gpus GPUs a queue may borrow beyond its guarantee, "
      "where limited.\n# TYPE gpufleet_queue_borrowing_limit_gpus gauge\n";
  for (const auto& [name, queue] : queues)
    if (queue.gpu_milli_borrowing_limit)
      out += fmt::format("gpufleet_queue_borrowing_limit_gpus{{queue=\"{}\"}} {}\n",
                         PromLabel(name), gpus(*queue.gpu_milli_borrowing_limit));
  out +=
      "# HELP gpufleet_queue_fair_share_usage_gpu_hours Each queue's GPU-hours decayed by the "
      "fair-share half-life.\n# TYPE gpufleet_queue_fair_share_usage_gpu_hours gauge\n";
  for (const auto& [name, queue] : queues)
    out += fmt::format("gpufleet_queue_fair_share_usage_gpu_hours{{queue=\"{}\"}} {:.6f}\n",
                       PromLabel(name), queue.fair_share_usage_gpu_hours);
  out +=
      "# HELP gpufleet_queue_fair_share_factor Each queue's fair-share factor 2^(-usage part / "
      "weight part): 0.5 at exactly its share.\n# TYPE gpufleet_queue_fair_share_factor gauge\n";
  for (const auto& [name, queue] : queues)
    out += fmt::format("gpufleet_queue_fair_share_factor{{queue=\"{}\"}} {:.6f}\n", PromLabel(name),
                       queue.fair_share_factor);
  out +=
      "# HELP gpufleet_preemptions_total Jobs preempted (and requeued) by the scheduler since "
      "the server started, by reason.\n# TYPE gpufleet_preemptions_total counter\n";
  for (const auto& [reason, count] : preemptions_by_reason)
    out += fmt::format("gpufleet_preemptions_total{{reason=\"{}\"}} {}\n", reason, count);
  out +=
      "# HELP gpufleet_idle_jobs Running jobs flagged idle: their GPUs unused for the idle GPU "
      "timeout.\n# TYPE gpufleet_idle_jobs gauge\n";
  for (const auto& [name, queue] : queues)  // every queue, so that a dashboard sees zeros too
    idle_by_queue.try_emplace(name, 0);
  for (const auto& [queue, count] : idle_by_queue)
    out += fmt::format("gpufleet_idle_jobs{{queue=\"{}\"}} {}\n", PromLabel(queue), count);
  out += fmt::format(
      "# HELP gpufleet_idle_reclaims_total Idle jobs preempted for waiting work (queues with "
      "reclaim_idle).\n# TYPE gpufleet_idle_reclaims_total counter\ngpufleet_idle_reclaims_total "
      "{}\n",
      idle_reclaims);
  out += "# HELP gpufleet_nodes Nodes by state.\n# TYPE gpufleet_nodes gauge\n";
  for (const auto& [state, count] : nodes_by)
    out += fmt::format("gpufleet_nodes{{state=\"{}\"}} {}\n", state, count);
  out += fmt::format(
      "# HELP gpufleet_gpus_total GPUs on nodes that are not lost.\n"
      "# TYPE gpufleet_gpus_total gauge\ngpufleet_gpus_total {}\n",
      gpus_total);
  out += fmt::format(
      "# HELP gpufleet_gpus_allocated GPUs held by scheduled, starting and running jobs.\n"
      "# TYPE gpufleet_gpus_allocated gauge\ngpufleet_gpus_allocated {}\n",
      static_cast<double>(allocated_milli) / kMilliPerGpu);
  out +=
      s.cycle_latency.Render("gpufleet_scheduler_cycle_seconds", "Duration of a scheduling cycle.");
  out += fmt::format(
      "# HELP gpufleet_scheduler_cycles_total Scheduling cycles run.\n"
      "# TYPE gpufleet_scheduler_cycles_total counter\ngpufleet_scheduler_cycles_total {}\n",
      s.cycles.load());
  out += s.requests.Render("gpufleet_api_requests_total", "HTTP requests by method and code.");
  out += s.request_latency.Render("gpufleet_api_request_seconds",
                                  "Time to answer an HTTP request (long polls included).");
  const store::GroupCommitter::Stats stats = s.committer->stats();
  out += fmt::format(
      "# HELP gpufleet_store_commit_groups_total Store commits (one fsync each).\n"
      "# TYPE gpufleet_store_commit_groups_total counter\n"
      "gpufleet_store_commit_groups_total {}\n"
      "# HELP gpufleet_store_commit_batches_total Batches committed in those groups.\n"
      "# TYPE gpufleet_store_commit_batches_total counter\n"
      "gpufleet_store_commit_batches_total {}\n"
      "# HELP gpufleet_store_commit_failures_total Store commits that failed.\n"
      "# TYPE gpufleet_store_commit_failures_total counter\n"
      "gpufleet_store_commit_failures_total {}\n"
      "# HELP gpufleet_audit_entries Entries in the audit log.\n"
      "# TYPE gpufleet_audit_entries gauge\ngpufleet_audit_entries {}\n"
      "# HELP gpufleet_up 1 while the server can acknowledge changes, 0 after a store failure.\n"
      "# TYPE gpufleet_up gauge\ngpufleet_up {}\n"
      "# HELP gpufleet_agent_syncs_parked Agents' syncs held open until there is news.\n"
      "# TYPE gpufleet_agent_syncs_parked gauge\ngpufleet_agent_syncs_parked {}\n"
      "# HELP gpufleet_agent_syncs_total Agents' syncs received (node reports, heartbeats).\n"
      "# TYPE gpufleet_agent_syncs_total counter\ngpufleet_agent_syncs_total {}\n",
      stats.groups_committed, stats.batches_committed, stats.groups_failed, audit_entries,
      s.failed() ? 0 : 1, parked, s.agent_syncs.load());
  out += net::HttpCountersMetricsText(*s.http_counters, "gpufleet");
  return HttpResponse::Text(200, std::move(out), "text/plain; version=0.0.4; charset=utf-8");
}

// Tracks one request until it is answered (or its responder dropped), for metrics and Stop().
class InFlight {
 public:
  InFlight(Impl& s, std::string method)
      : s_(s), method_(std::move(method)), started_(std::chrono::steady_clock::now()) {
    std::lock_guard lock(s_.in_flight_mu);
    ++s_.in_flight;
  }
  ~InFlight() { Finish(0); }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

  // Returns false when already finished (a second answer, which the server ignores too).
  bool Finish(int status) {
    if (finished_.exchange(true)) return false;
    if (status != 0) {
      s_.requests.Count(method_, status);
      s_.request_latency.Observe(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count());
    }
    std::lock_guard lock(s_.in_flight_mu);
    if (--s_.in_flight == 0) s_.in_flight_cv.notify_all();
    return true;
  }

 private:
  Impl& s_;
  const std::string method_;
  const std::chrono::steady_clock::time_point started_;
  std::atomic<bool> finished_{false};
};

// Runs `handler` for a caller whose token is valid and has one of `roles`; 401 or 403 otherwise.
void Authorized(Impl& s, const HttpRequest& request, const std::vector<Role>& roles,
                Handler handler, HttpResponder respond) {
  std::string why;
  auto caller = s.Authenticate(request, why);
  if (!caller) {
    HttpResponse refusal = HttpResponse::Error(401, why);
    refusal.headers.emplace_back("WWW-Authenticate", "Bearer");
    return respond(std::move(refusal));
  }
  if (caller->info.role == Role::kUser) {
    if (auto wait = s.RateLimitedFor(caller->info.id)) {
      HttpResponse refusal = HttpResponse::Error(
          429, fmt::format("token {} is over its rate limit of {:g} requests/s; retry in {:.1f} s",
                           caller->info.id, s.options.token_rate_limit, *wait));
      refusal.headers.emplace_back("Retry-After",
                                   std::to_string(static_cast<int>(std::ceil(*wait))));
      return respond(std::move(refusal));
    }
  }
  if (std::find(roles.begin(), roles.end(), caller->info.role) == roles.end())
    return respond(HttpResponse::Error(403, fmt::format("a token with role {} may not do this",
                                                        api::RoleName(caller->info.role))));
  // The scope narrows the role: read-only tokens change nothing, submit ones do no admin work.
  const std::string& scope = caller->info.scope;
  if (scope == "read" && request.method != "GET")
    return respond(
        HttpResponse::Error(403, fmt::format("token {} is read-only (scope read): it may not {} {}",
                                             caller->info.id, request.method, request.path)));
  // An admin's read-only token may read admin pages (an auditor's); a submit one may not.
  const bool admin_only = roles.size() == 1 && roles.front() == Role::kAdmin;
  if (admin_only && scope == "submit")
    return respond(HttpResponse::Error(
        403, fmt::format("token {} has scope {}: this needs scope admin", caller->info.id, scope)));
  handler(s, request, *caller, std::move(respond));
}

}  // namespace

std::optional<double> Server::Impl::RateLimitedFor(const std::string& token_id) {
  const double rate = options.token_rate_limit;
  if (rate <= 0) return std::nullopt;
  const double burst = 2 * rate;
  const SteadyTime now = std::chrono::steady_clock::now();
  std::lock_guard lock(rate_mu);
  auto [it, fresh] = rate_buckets.try_emplace(token_id);
  RateBucket& bucket = it->second;
  if (fresh) {
    bucket.tokens = burst;
  } else {
    const double elapsed = std::chrono::duration<double>(now - bucket.refilled).count();
    bucket.tokens = std::min(burst, bucket.tokens + elapsed * rate);
  }
  bucket.refilled = now;
  if (bucket.tokens >= 1) {
    bucket.tokens -= 1;
    return std::nullopt;
  }
  return (1 - bucket.tokens) / rate;
}

std::optional<Caller> Server::Impl::Authenticate(const HttpRequest& request,
                                                 std::string& refusal) const {
  refusal = "unknown or revoked token";
  const std::string authorization = request.Header("Authorization");
  if (authorization.empty()) {
    refusal = "no token: send 'Authorization: Bearer <token>'";
    return std::nullopt;
  }
  auto secret = net::BearerToken(authorization);
  if (!secret || !net::IsWellFormedSecret(*secret)) return std::nullopt;
  const std::string digest = net::Sha256Hex(*secret);
  std::lock_guard lock(mu);
  // Looked up by digest: timing can reveal at most something about a SHA-256 output, which does
  // not help guess a secret; the final comparison is constant-time all the same.
  auto id = token_by_sha256.find(digest);
  if (id == token_by_sha256.end()) return std::nullopt;
  auto token = tokens.find(id->second);
  if (token == tokens.end() || !net::ConstantTimeEquals(token->second.sha256, digest))
    return std::nullopt;
  const api::TokenInfo& info = token->second.info;
  if (info.expires_ms != 0 && WallMs() >= info.expires_ms) {
    refusal =
        fmt::format("token {} expired at {}{}", info.id, FormatUtc(info.expires_ms),
                    info.rotated_to.empty() ? std::string()
                                            : fmt::format(" (rotated: use {})", info.rotated_to));
    return std::nullopt;
  }
  return Caller{info};
}

void Server::Impl::Dispatch(HttpRequest request, HttpResponder respond) {
  auto tracker = std::make_shared<InFlight>(*this, request.method);
  router.Dispatch(std::move(request),
                  [tracker, respond = std::move(respond)](HttpResponse response) {
                    if (tracker->Finish(response.status)) respond(std::move(response));
                  });
}

void Server::Impl::AddRoutes() {
  router.Add("GET", "/healthz", [](const HttpRequest&) { return Healthz(); });
  router.Add("GET", "/readyz", [this](const HttpRequest&) { return Readyz(*this); });
  router.Add("GET", "/metrics", [this](const HttpRequest&) { return Metrics(*this); });
  router.Add("GET", "/", [](const HttpRequest&) { return DashboardFile("/index.html"); });
  router.Add("GET", "/ui/{file}", [](const HttpRequest& request) {
    return DashboardFile("/" + request.PathParam("file"));
  });

  auto api = [this](std::string method, std::string_view pattern,
                    std::initializer_list<Role> role_list, Handler handler) {
    std::vector<Role> roles(role_list);
    router.AddAsync(std::move(method), pattern,
                    [this, roles, handler](HttpRequest request, HttpResponder respond) {
                      // Memory may hold what the store lost, or another server may lead now:
                      // no answer from it, reads included, so that clients move on.
                      if (failed()) return respond(Stopping(FatalMessage()));
                      Authorized(*this, request, roles, handler, std::move(respond));
                    });
  };
  const auto people = {Role::kAdmin, Role::kUser};
  const auto admin = {Role::kAdmin};
  api("POST", "/api/v1/jobs", people, SubmitJob);
  api("GET", "/api/v1/jobs", people, ListJobs);
  api("GET", "/api/v1/jobs/{id}", people, GetJob);
  api("POST", "/api/v1/jobs/{id}/cancel", people, CancelJobRoute);
  api("GET", "/api/v1/jobs/{id}/logs", people, JobLogs);
  api("GET", "/api/v1/nodes", people, ListNodes);
  api("POST", "/api/v1/nodes/{name}/drain", admin, DrainNode);
  api("POST", "/api/v1/nodes/{name}/undrain", admin, UndrainNode);
  api("GET", "/api/v1/queues", people, ListQueues);
  api("GET", "/api/v1/usage", people, Usage);
  api("GET", "/api/v1/whoami", {Role::kAdmin, Role::kUser, Role::kAgent, Role::kGateway}, Whoami);
  api("POST", "/api/v1/tokens", admin, CreateTokenRoute);
  api("GET", "/api/v1/tokens", admin, ListTokens);
  api("DELETE", "/api/v1/tokens/{id}", admin, RevokeToken);
  api("POST", "/api/v1/tokens/{id}/rotate", admin, RotateToken);
  api("GET", "/api/v1/audit", admin, ListAudit);
  api("POST", "/api/v1/agents/sync", {Role::kAgent, Role::kAdmin}, Sync);
  for (ApiRoute& route : DeploymentRoutes()) {
    auto roles = route.roles;
    router.AddAsync(std::move(route.method), route.pattern,
                    [this, roles = std::move(roles), handler = route.handler](
                        HttpRequest request, HttpResponder respond) {
                      Authorized(*this, request, roles, handler, std::move(respond));
                    });
  }
}

}  // namespace gpufleet::server
