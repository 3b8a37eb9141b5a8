#include "server/lifecycle.h"

#include <cstring>
#include <utility>

#include <fmt/format.h>

namespace gpufleet::server {
namespace {

using api::JobRecord;
using api::JobState;
using api::TaskStatus;

bool TaskFailed(const TaskStatus& task) {
  if (task.state == "failed_to_start" || task.state == "lost") return true;
  if (task.state != "exited") return false;
  return task.signal.has_value() || !task.exit_code.has_value() || *task.exit_code != 0;
}

bool TaskSucceeded(const TaskStatus& task) {
  return task.state == "exited" && !task.signal && task.exit_code && *task.exit_code == 0;
}

bool TaskStarted(const TaskStatus& task) {
  return task.state == "starting" || task.state == "running" || task.state == "exited";
}

std::string SignalName(int32_t signal) {
  const char* abbrev = ::sigabbrev_np(signal);
  return abbrev ? fmt::format("signal {} (SIG{})", signal, abbrev)
                : fmt::format("signal {}", signal);
}

// "task 1 on node n2 exited with code 3": the sentence users read in the job's reason.
std::string DescribeFailure(const TaskStatus& task) {
  const std::string who = fmt::format("task {} on node {}", task.rank, task.node);
  const std::string detail = task.error.empty() ? "" : ": " + task.error;
  if (task.state == "failed_to_start") return fmt::format("{} failed to start{}", who, detail);
  if (task.state == "lost") return fmt::format("{} was lost{}", who, detail);
  if (task.signal)
    return fmt::format("{} was killed by {}{}", who, SignalName(*task.signal), detail);
  if (task.exit_code) return fmt::format("{} exited with code {}", who, *task.exit_code);
  return fmt::format("{} exited without an exit status{}", who, detail);
}

std::optional<int32_t> FailureExitCode(const TaskStatus& task) {
  if (task.signal) return 128 + *task.signal;  // as shells report a killed command
  return task.exit_code;
}

// Moves the job along after one of its tasks changed; returns true when it became terminal.
bool Advance(JobRecord& job, const TaskStatus& changed, TimeMs now) {
  for (const TaskStatus& task : job.tasks) {
    if (TaskFailed(task)) {
      FailJob(job, DescribeFailure(task), FailureExitCode(task), now);
      return true;
    }
  }
  bool all_succeeded = true;
  bool all_running = true;  // running, or already done with it
  for (const TaskStatus& task : job.tasks) {
    all_succeeded = all_succeeded && TaskSucceeded(task);
    all_running = all_running && (task.state == "running" || TaskSucceeded(task));
  }
  if (job.state == JobState::kScheduled && TaskStarted(changed))
    SetState(job, JobState::kStarting,
             fmt::format("task {} started on node {}", changed.rank, changed.node), now);
  // What a starting task waits for, as its agent says (an image being pulled or unpacked).
  if (job.state == JobState::kStarting && changed.state == "starting" && !changed.error.empty())
    job.reason = fmt::format("task {} on node {}: {}", changed.rank, changed.node, changed.error);
  if (job.state == JobState::kStarting && all_running) {
    job.started_ms = now;
    SetState(job, JobState::kRunning,
             job.tasks.size() == 1 ? std::string("the task is running")
                                   : fmt::format("all {} tasks are running", job.tasks.size()),
             now);
  }
  if (job.state == JobState::kRunning && all_succeeded) {
    job.exit_code = 0;
    job.finished_ms = now;
    job.reason.clear();
    job.reason_code.clear();
    SetState(job, JobState::kSucceeded, "every task exited with code 0", now);
    return true;
  }
  return false;
}

}  // namespace

std::string WorkloadId(JobId job, int32_t rank, int32_t attempt) {
  return fmt::format("j{}-r{}-a{}", job, rank, attempt);
}

bool IsActive(JobState state) {
  return state == JobState::kScheduled || state == JobState::kStarting ||
         state == JobState::kRunning;
}

void SetState(JobRecord& job, JobState to, std::string reason, TimeMs now) {
  if (job.state == to && !job.events.empty()) return;
  job.idle_since_ms.reset();  // idleness is of one run
  api::JobEvent event;
  event.time_ms = now;
  event.from = job.events.empty() ? "" : std::string(api::JobStateName(job.state));
  event.to = std::string(api::JobStateName(to));
  event.reason = std::move(reason);
  job.events.push_back(std::move(event));
  job.state = to;
}

void PlaceJob(JobRecord& job, std::vector<TaskStatus> tasks, std::string reason, TimeMs now) {
  job.tasks = std::move(tasks);
  job.reason.clear();
  job.reason_code.clear();
  job.started_ms = 0;
  job.exit_code.reset();
  SetState(job, JobState::kScheduled, std::move(reason), now);
}

void SetIdle(JobRecord& job, std::optional<TimeMs> since, std::string reason, TimeMs now) {
  if (job.idle_since_ms.has_value() == since.has_value()) return;
  job.idle_since_ms = since;
  const std::string state(api::JobStateName(job.state));
  job.events.push_back(api::JobEvent{now, state, state, std::move(reason)});
}

void RequeueJob(JobRecord& job, std::string reason, TimeMs now) {
  job.tasks.clear();
  job.attempt += 1;
  job.started_ms = 0;
  job.exit_code.reset();
  job.reason = reason;  // until the next scheduling cycle says why it waits
  job.reason_code = "requeued";
  SetState(job, JobState::kPending, std::move(reason), now);
}

void FailJob(JobRecord& job, std::string reason, std::optional<int32_t> exit_code, TimeMs now) {
  job.reason = reason;
  job.reason_code = "failed";
  job.exit_code = exit_code;
  job.finished_ms = now;
  SetState(job, JobState::kFailed, std::move(reason), now);
}

bool CancelJob(JobRecord& job, std::string reason, TimeMs now) {
  if (api::IsTerminal(job.state)) return false;
  job.reason = reason;
  job.reason_code = "cancelled";
  job.finished_ms = now;
  SetState(job, JobState::kCancelled, std::move(reason), now);
  return true;
}

ReportEffect ApplyWorkloadReport(JobRecord& job, const api::WorkloadReport& report,
                                 std::string_view node, TimeMs now) {
  ReportEffect effect;
  if (!IsActive(job.state) || report.job_id != job.id || report.attempt != job.attempt)
    return effect;
  if (report.rank < 0 || static_cast<size_t>(report.rank) >= job.tasks.size()) return effect;
  TaskStatus& task = job.tasks[static_cast<size_t>(report.rank)];
  if (task.node != node) return effect;
  if (!report.workload_id.empty() && report.workload_id != task.workload_id) return effect;
  // Only a replica that runs can be ready: a report of an ended one clears it.
  const bool ready = job.replica && task.port > 0 && report.ready && report.state == "running";
  if (task.ready != ready) {
    task.ready = ready;
    effect.changed = effect.readiness_changed = true;
  }
  if (task.state == report.state && task.exit_code == report.exit_code &&
      task.signal == report.signal && task.error == report.error)
    return effect;
  task.state = report.state;
  task.exit_code = report.exit_code;
  task.signal = report.signal;
  task.error = report.error;
  effect.changed = true;
  effect.ended = Advance(job, task, now);
  return effect;
}

JobSpec ToJobSpec(const JobRecord& job) {
  JobSpec spec;
  spec.id = job.id;
  spec.name = job.spec.name;
  spec.queue = job.spec.queue;
  // A deployment's replicas come before the batch jobs of their queue, whatever the priorities.
  spec.priority = job.replica ? kReplicaPriority + job.spec.priority : job.spec.priority;
  spec.tasks = job.spec.tasks;
  spec.tasks_per_node = job.spec.tasks_per_node;
  spec.gpu_milli_per_task = job.spec.gpu_milli_per_task;
  spec.cpu_milli_per_task = job.spec.cpu_milli_per_task;
  spec.memory_mib_per_task = job.spec.memory_mib_per_task;
  spec.gpu_models = job.spec.gpu_models;
  spec.min_gpu_memory_mib = job.spec.min_gpu_memory_mib;
  spec.submit_time = job.created_ms;
  spec.runtime_estimate = job.spec.runtime_estimate_ms;
  spec.preemptible = job.spec.preemptible;
  return spec;
}

namespace {

enum class SpanEnd { kRequeued, kEnded, kOngoing };

// Calls visit(start, end, how) for each span the job held GPUs (scheduled, starting or running):
// spans that ended back in pending (requeued) or otherwise, and the ongoing one up to `now`.
template <typename Visit>
void ForEachHeldSpan(const JobRecord& job, TimeMs now, Visit visit) {
  TimeMs since = -1;
  for (const api::JobEvent& event : job.events) {
    const auto from = api::ParseJobState(event.from);
    const auto to = api::ParseJobState(event.to);
    const bool was_active = from && IsActive(*from);
    const bool is_active = to && IsActive(*to);
    if (!was_active && is_active) since = event.time_ms;
    if (was_active && !is_active && since >= 0) {
      visit(since, event.time_ms, to == JobState::kPending ? SpanEnd::kRequeued : SpanEnd::kEnded);
      since = -1;
    }
  }
  if (since >= 0 && IsActive(job.state)) visit(since, std::max(since, now), SpanEnd::kOngoing);
}

}  // namespace

int64_t GpuMilliOf(const JobRecord& job) {
  return static_cast<int64_t>(job.spec.gpu_milli_per_task) * job.spec.tasks;
}

Service ServiceOf(const JobRecord& job, TimeMs now) {
  Service service;
  const int64_t gpu_milli = GpuMilliOf(job);
  ForEachHeldSpan(job, now, [&](TimeMs start, TimeMs end, SpanEnd how) {
    service.attained_gpu_ms += (end - start) * gpu_milli / kMilliPerGpu;
    if (how == SpanEnd::kOngoing) {
      service.run_start = start;
      return;
    }
    service.last_run_end = end;
    if (how == SpanEnd::kRequeued) ++service.preemptions;
  });
  return service;
}

std::vector<std::pair<TimeMs, TimeMs>> EndedHeldSpans(const JobRecord& job) {
  std::vector<std::pair<TimeMs, TimeMs>> spans;
  ForEachHeldSpan(job, 0, [&](TimeMs start, TimeMs end, SpanEnd how) {
    if (how != SpanEnd::kOngoing) spans.emplace_back(start, end);
  });
  return spans;
}

int64_t SpanGpuMs(const JobRecord& job, TimeMs start, TimeMs end) {
  return (end - start) * GpuMilliOf(job) / kMilliPerGpu;
}

int64_t GpuMsBetween(const JobRecord& job, TimeMs from, TimeMs to, TimeMs now) {
  const int64_t gpu_milli = GpuMilliOf(job);
  int64_t gpu_ms = 0;
  ForEachHeldSpan(job, now, [&](TimeMs start, TimeMs end, SpanEnd) {
    const TimeMs clipped = std::min(end, to) - std::max(start, from);
    if (clipped > 0) gpu_ms += clipped * gpu_milli / kMilliPerGpu;
  });
  return gpu_ms;
}

int32_t MasterPort(JobId job) {
  return static_cast<int32_t>(20000 + job % 10000);
}

api::TaskLaunch MakeTaskLaunch(const JobRecord& job, int32_t rank, const std::string& master_addr,
                               const std::string& checkpoint_root) {
  const TaskStatus& task = job.tasks.at(static_cast<size_t>(rank));
  api::TaskLaunch launch;
  launch.workload_id = task.workload_id;
  launch.job_id = job.id;
  launch.rank = rank;
  launch.attempt = job.attempt;
  launch.user = job.user;
  launch.argv = job.spec.command;
  launch.workdir = job.spec.workdir;
  launch.container = job.spec.container;
  launch.gpu_indices = task.gpu_indices;
  if (!task.gpu_indices.empty() && task.gpu_milli > 0) launch.gpu_milli = task.gpu_milli;
  launch.cpu_milli = job.spec.cpu_milli_per_task;
  launch.memory_mib = job.spec.memory_mib_per_task;
  launch.max_runtime_ms = job.spec.max_runtime_ms;
  launch.grace_period_ms = job.spec.grace_period_ms;
  if (!checkpoint_root.empty())
    launch.checkpoint_dir = fmt::format("{}/job-{}", checkpoint_root, job.id);
  launch.env = job.spec.env;
  // Assigned after the job's env: a job cannot break its own gang's rendezvous.
  const std::string world = std::to_string(job.tasks.size());
  launch.env["MASTER_ADDR"] = master_addr;
  launch.env["MASTER_PORT"] = std::to_string(MasterPort(job.id));
  launch.env["WORLD_SIZE"] = world;
  launch.env["RANK"] = std::to_string(rank);
  // With tasks_per_node, a node's tasks are consecutive ranks (the scheduler places them so).
  const int32_t per_node = std::max(job.spec.tasks_per_node, 1);
  launch.env["NODE_RANK"] = std::to_string(rank / per_node);
  launch.env["LOCAL_RANK"] = std::to_string(rank % per_node);
  launch.env["LOCAL_WORLD_SIZE"] = std::to_string(per_node);
  launch.env["GPUFLEET_JOB_ID"] = std::to_string(job.id);
  launch.env["GPUFLEET_TASK_INDEX"] = std::to_string(rank);
  launch.env["GPUFLEET_NNODES"] = std::to_string(job.tasks.size() / static_cast<size_t>(per_node));
  launch.env["GPUFLEET_ATTEMPT"] = std::to_string(job.attempt);
  // How many times the job was started before (preempted, its node lost): a job resumes from
  // its checkpoint (GPUFLEET_CHECKPOINT_DIR, set by the agent) when this is above 0.
  launch.env["GPUFLEET_RESTART_COUNT"] = std::to_string(job.attempt);
  if (job.replica && task.port > 0) {
    launch.port = task.port;
    launch.readiness_path = job.replica->readiness_path;
    launch.env["PORT"] = std::to_string(task.port);
    // The node's address, where gateways reach it and the agent probes it: a model server
    // binds there (vLLM's --host, the reference server's default).
    launch.env["HOST"] = master_addr;
    launch.env["GPUFLEET_DEPLOYMENT"] = job.replica->deployment;
    launch.env["GPUFLEET_REPLICA"] = fmt::format("j{}", job.id);
  }
  return launch;
}

}  // namespace gpufleet::server
