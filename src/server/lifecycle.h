#pragma once

// The job lifecycle as pure functions over api::JobRecord: every transition the server makes
// (placement, agent reports, cancel, requeue, failure) goes through here, appends an event and
// keeps the record's fields consistent. No clock, no locks, no I/O: the server passes `now`, and
// the tests drive a record through every path without HTTP. See docs/api.md for the lifecycle.

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "api/types.h"
#include "core/job.h"

namespace gpufleet::server {

// "j42-r0-a1": the agent's workload id of rank 0 of job 42's attempt 1.
std::string WorkloadId(JobId job, int32_t rank, int32_t attempt);

// scheduled, starting or running: the job holds its GPUs and its tasks are desired on nodes.
bool IsActive(api::JobState state);

// Changes the state and appends the event (from, to, reason, now). A no-op when `to` is the
// current state.
void SetState(api::JobRecord& job, api::JobState to, std::string reason, TimeMs now);

// pending -> scheduled with one task per rank (node, GPUs, workload ids for the current attempt).
void PlaceJob(api::JobRecord& job, std::vector<api::TaskStatus> tasks, std::string reason,
              TimeMs now);

// Back to pending for another attempt (preempted, or a restartable job's node was lost): the
// tasks are dropped, so the agents stop them, and the attempt number goes up.
void RequeueJob(api::JobRecord& job, std::string reason, TimeMs now);

// Flags a running job idle since `since` (its GPUs unused), or clears the flag (nothing), with
// an event that keeps the state and says why. A no-op when the flag does not change.
void SetIdle(api::JobRecord& job, std::optional<TimeMs> since, std::string reason, TimeMs now);

// To failed, with the reason and the exit code (if any) of what failed.
void FailJob(api::JobRecord& job, std::string reason, std::optional<int32_t> exit_code, TimeMs now);

// To cancelled; false (nothing changed) when the job has already ended.
bool CancelJob(api::JobRecord& job, std::string reason, TimeMs now);

struct ReportEffect {
  bool changed = false;            // the record changed: persist it
  bool ended = false;              // the job became terminal: its other tasks must be stopped
  bool readiness_changed = false;  // a replica became ready or stopped being: endpoints change
};

// Applies what the agent on `node` says of one task. Reports of another attempt, another node, an
// unknown rank or workload id, or a job that is not active, are ignored (stale reports from before
// a requeue, or from an agent that has not heard of a change yet). Then advances the job:
// a failed task (failed_to_start, lost, non-zero exit, signal) fails the gang; every task exited 0
// succeeds it; a task started makes it starting; every task running makes it running.
ReportEffect ApplyWorkloadReport(api::JobRecord& job, const api::WorkloadReport& report,
                                 std::string_view node, TimeMs now);

// Added to a replica's priority for the scheduler: users' priorities are within +-1e6, so every
// replica ranks above every batch job of its queue (docs/serving.md).
inline constexpr int32_t kReplicaPriority = 10'000'000;

// The scheduler's view of a job's request (submit_time = created_ms).
JobSpec ToJobSpec(const api::JobRecord& job);

// Service a job has had, derived from its events (the GPUs are held from scheduled until it
// leaves scheduled/starting/running), for LAS and for the scheduler's running set.
struct Service {
  int64_t attained_gpu_ms = 0;  // GPUs x milliseconds held, over every attempt
  TimeMs run_start = 0;         // when the current attempt was placed; 0 when not active
  TimeMs last_run_end = -1;     // when it last stopped holding GPUs; -1 if never
  int32_t preemptions = 0;      // requeues
};
Service ServiceOf(const api::JobRecord& job, TimeMs now);

// The spans the job held GPUs that have ended (requeued or finished), oldest first: [start, end).
std::vector<std::pair<TimeMs, TimeMs>> EndedHeldSpans(const api::JobRecord& job);

// The GPUs the job holds while active, in thousandths, over all its tasks.
int64_t GpuMilliOf(const api::JobRecord& job);

// GPU-milliseconds of one span of the job: how GpuMsBetween counts it.
int64_t SpanGpuMs(const api::JobRecord& job, TimeMs start, TimeMs end);

// GPU-milliseconds the job held (scheduled, starting or running, GPUs x time) within
// [from, to), counting an attempt still active as held until `now`.
int64_t GpuMsBetween(const api::JobRecord& job, TimeMs from, TimeMs to, TimeMs now);

// What the node of task `rank` must run: the job's command and env plus the gang's variables
// (torchrun's MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, ...), which the job's env cannot
// override. `master_addr` is rank 0's node address. `checkpoint_root`, when set, is a directory
// every node sees (shared storage): the job's checkpoints go to <root>/job-<id>.
api::TaskLaunch MakeTaskLaunch(const api::JobRecord& job, int32_t rank,
                               const std::string& master_addr,
                               const std::string& checkpoint_root = "");

// Deterministic per job, in [20000, 30000): every rank computes the same one.
int32_t MasterPort(JobId job);

}  // namespace gpufleet::server
