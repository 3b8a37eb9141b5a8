#pragma once

// The wire types of gpufleet's HTTP API (/api/v1): what users submit, what the server answers,
// and what agents and the server exchange. The server, the agent and the CLI share them, so a
// field means the same on both ends. JSON conversions are in api/json.h. See docs/api.md.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/container.h"
#include "core/types.h"

namespace gpufleet::api {

// ---- Jobs -------------------------------------------------------------------------------------

enum class JobState {
  kPending,    // waiting for room (or requeued after preemption or a lost node)
  kScheduled,  // placed by the scheduler; its tasks are assigned to nodes
  kStarting,   // an agent has started at least one task; not all run yet
  kRunning,    // every task runs
  kSucceeded,  // every task exited 0
  kFailed,     // a task failed (non-zero exit, failed to start, node lost and not restartable)
  kCancelled,  // a user cancelled it
};

std::string_view JobStateName(JobState state);  // "pending", ...
std::optional<JobState> ParseJobState(std::string_view name);
bool IsTerminal(JobState state);

// What a user asks to run: POST /api/v1/jobs, or a YAML job file through `gpufleet submit -f`.
// A job is a gang of `tasks` identical tasks, one per node, started together.
struct JobSubmission {
  std::string name;  // empty: the command's first word
  std::string queue = "default";
  int32_t priority = 0;  // higher first, within a queue
  int32_t tasks = 1;
  // Exactly this many tasks on each node it uses (JobSpec::tasks_per_node); 0: tasks share nodes
  // where they fit. JSON "nodes": N (the CLI's --nodes) asks for N distinct nodes, tasks_per_node
  // (default 1) on each.
  int32_t tasks_per_node = 0;
  MilliGpu gpu_milli_per_task = kMilliPerGpu;  // JSON "gpus": 0.5, 1, 8 (per task)
  MilliCpu cpu_milli_per_task = 0;             // JSON "cpu": "4", "500m", 4
  MiB memory_mib_per_task = 0;                 // JSON "memory": "16Gi", 1024
  std::vector<std::string> gpu_models;         // JSON "gpu_model": "H100-80GB" or a list
  MiB min_gpu_memory_mib = 0;                  // JSON "min_gpu_memory": "40Gi"
  std::vector<std::string> command;            // argv; required
  std::map<std::string, std::string> env;
  std::string workdir;        // absolute on the node (in the container with an image)
  ContainerSpec container;    // JSON "image", "mounts", "user"; no image: a plain process
  bool restartable = true;    // requeue (true) or fail (false) when its node is lost
  bool preemptible = true;    // whether higher-priority work may stop it
  TimeMs max_runtime_ms = 0;  // JSON "max_runtime": "2h"; 0 = unlimited
  std::optional<TimeMs> runtime_estimate_ms;  // JSON "runtime_estimate": "30m", for SJF
  // JSON "grace_period": "2m". On cancel or preemption: SIGTERM, this long to checkpoint and
  // exit, then SIGKILL.
  TimeMs grace_period_ms = 30000;
};

// One event in a job's history: a state change with its reason and time.
struct JobEvent {
  TimeMs time_ms = 0;  // wall clock, ms since the Unix epoch
  std::string from;    // state names; "" for the first event
  std::string to;
  std::string reason;
};

// Where one task of a job runs, and what its agent last said about it.
struct TaskStatus {
  int32_t rank = 0;
  std::string node;
  std::vector<int32_t> gpu_indices;  // on the node
  std::vector<std::string> gpu_uuids;
  MilliGpu gpu_milli = 0;   // share of each GPU
  std::string workload_id;  // "j42-r0-a1": job, rank, attempt; the agent's workload id
  // A deployment's replica: the port the server gave it (its PORT), and whether the agent's
  // readiness probe on it last succeeded.
  int32_t port = 0;
  bool ready = false;
  std::string state;  // "", or the agent's workload state: starting, running, exited, ...
  std::optional<int32_t> exit_code;
  std::optional<int32_t> signal;
  std::string error;
};

// Set on the jobs that are a deployment's replicas (docs/serving.md); empty for batch jobs.
struct ReplicaOf {
  std::string deployment;
  int64_t generation = 0;      // of the deployment's spec it runs
  std::string readiness_path;  // probed by the agent on the replica's port
  // Drained: no longer an endpoint; it is stopped once no gateway has a request in flight on it.
  TimeMs draining_since_ms = 0;
  bool draining() const { return draining_since_ms > 0; }
};

struct JobRecord {
  JobId id = 0;
  std::string user;  // who submitted it (the token's user)
  std::string team;  // the submitter's team: who may see and change it
  JobSubmission spec;
  JobState state = JobState::kPending;
  // Pending: why it waits (the scheduler's sentence); failed/cancelled: why it ended.
  std::string reason;
  std::string reason_code;  // pending: the scheduler's code ("insufficient_gpus", ...)
  TimeMs created_ms = 0;
  TimeMs started_ms = 0;          // the current attempt's start (all tasks running); 0 if not yet
  TimeMs finished_ms = 0;         // 0 while not terminal
  int32_t attempt = 0;            // 0 for the first run; +1 for each requeue
  std::vector<TaskStatus> tasks;  // empty while pending
  std::vector<JobEvent> events;
  std::optional<int32_t> exit_code;  // of the first task that failed, or 0 on success
  // Running, and every GPU of it has shown (next to) no utilisation since then for the server's
  // --idle-gpu-timeout (docs/quotas.md); unset when it is not idle.
  std::optional<TimeMs> idle_since_ms;
  std::optional<ReplicaOf> replica;
};

// ---- Nodes, queues, tokens ---------------------------------------------------------------------

struct GpuStatus {
  int32_t index = 0;
  std::string uuid;
  std::string model;
  MiB memory_mib = 0;
  int32_t nvlink_island = 0;
  bool healthy = true;
  std::string health_reason;  // why not healthy
  double utilization_pct = 0;
  MiB memory_used_mib = 0;
  double temperature_c = 0;
  double power_w = 0;
};

// What an agent says of its node in every sync; the server keeps the latest.
struct NodeReport {
  std::string name;
  std::string address;    // the IP other tasks reach this node at (MASTER_ADDR)
  std::string agent_url;  // the agent's own API ("http://10.0.0.5:9400"), for logs
  std::string backend;    // "nvml" or "sim"
  std::string rack;       // leaf switch; empty: one per node
  std::string spine;
  std::string agent_version;
  MilliCpu cpu_milli = 0;
  MiB memory_mib = 0;
  std::vector<GpuStatus> gpus;
};

enum class NodeState { kReady, kDraining, kLost };
std::string_view NodeStateName(NodeState state);

struct NodeRecord {
  NodeReport report;
  NodeState state = NodeState::kReady;
  bool drained = false;  // an admin drained it: nothing new is placed there
  TimeMs registered_ms = 0;
  TimeMs last_seen_ms = 0;
  // Which job holds each GPU: index -> job ids (several for shared GPUs).
  std::map<int32_t, std::vector<JobId>> gpu_jobs;
};

struct QueueStatus {
  std::string name;
  int64_t pending = 0;
  int64_t running = 0;  // scheduled, starting or running
  MilliGpu gpu_milli_pending = 0;
  MilliGpu gpu_milli_running = 0;
  // Set when the server has a queues file (docs/quotas.md); otherwise queues exist by use.
  bool configured = false;
  std::string cohort;
  MilliGpu gpu_milli_guaranteed = 0;  // over all models (the sum, for per-model guarantees)
  std::optional<MilliGpu> gpu_milli_borrowing_limit;
  // Fair share (docs/quotas.md): the queue's weight, its GPU-hours decayed by the half-life, and
  // its factor 2^(-usage part / weight part), which orders queues under the fairshare policy.
  double weight = 1.0;
  double fair_share_usage_gpu_hours = 0;
  double fair_share_factor = 1.0;
  // Who may submit to it (its queues-file `teams`); empty: every team.
  std::vector<std::string> teams;
};

// A gateway's token may read deployments' endpoints and report their load, nothing else.
enum class Role { kAdmin, kUser, kAgent, kGateway };
std::string_view RoleName(Role role);
std::optional<Role> ParseRole(std::string_view name);

// A token as the server shows it: never the secret, which only its creation returns.
struct TokenInfo {
  std::string id;  // "tok-" and 8 hex digits: names the token in lists and the audit log
  std::string user;
  std::string team;
  Role role = Role::kUser;
  // What a person's token may do within its role: "read" (GET only), "submit" (the role's
  // every route but the admin-only ones), "admin" (everything; admin role only). Agent and
  // gateway tokens have the scope of their role ("agent", "gateway").
  std::string scope;
  TimeMs created_ms = 0;
  std::string created_by;
  TimeMs expires_ms = 0;   // 0: never; from then on the token is refused (401)
  std::string rotated_to;  // the token that replaced this one (token rotate), if any
};

// The scope a token of `role` gets when none is asked for: admin for admins, submit for users.
std::string DefaultScope(Role role);
// Whether a token of `role` may have `scope`; the reason when not.
std::optional<std::string> ScopeError(Role role, std::string_view scope);

struct AuditEntry {
  uint64_t seq = 0;
  TimeMs time_ms = 0;
  std::string user;
  std::string token_id;
  std::string action;  // "job.submit", "job.cancel", "node.drain", "token.create", ...
  std::string target;  // "job/42", "node/gpu-07", ...
  std::string detail;
};

// ---- Agent <-> server: POST /api/v1/agents/sync ---------------------------------------------
//
// Level-triggered: every sync carries everything the agent knows (its node and every workload
// the server gave it), and every answer carries everything the node should run. An agent that
// restarts, or a server that restarts, converges on the next sync.

struct WorkloadReport {
  std::string workload_id;
  JobId job_id = 0;
  int32_t rank = 0;
  int32_t attempt = 0;
  std::string state;  // the executor's: starting, running, exited, failed_to_start, lost
  std::optional<int32_t> exit_code;
  std::optional<int32_t> signal;
  std::string error;
  TimeMs started_ms = 0;
  TimeMs finished_ms = 0;
  bool ready = false;  // a replica's readiness probe last succeeded
};

struct SyncRequest {
  NodeReport node;
  std::vector<WorkloadReport> workloads;
  // The version of the desired state the agent has applied; the server answers at once when
  // its own is newer, else waits up to wait_ms for a change (a long poll).
  uint64_t known_version = 0;
  int32_t wait_ms = 0;
  // The credential the server must present to the agent's own API (logs): the agent makes it,
  // the server keeps it in memory only and never shows it (docs/security.md).
  std::string agent_key;
};

// One task the node should be running.
struct TaskLaunch {
  std::string workload_id;
  JobId job_id = 0;
  int32_t rank = 0;
  int32_t attempt = 0;
  // The platform user who submitted the job: `agent --workload-user mapped` runs the task as
  // the node's Unix account of that name.
  std::string user;
  std::vector<std::string> argv;
  // The job's env plus the gang's: MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK,
  // NODE_RANK, LOCAL_WORLD_SIZE (torchrun's names), GPUFLEET_JOB_ID, ...
  std::map<std::string, std::string> env;
  std::string workdir;
  ContainerSpec container;  // no image: a plain process
  std::vector<int32_t> gpu_indices;
  MilliGpu gpu_milli = kMilliPerGpu;  // of each GPU; less: a share of it (fractional jobs)
  MilliCpu cpu_milli = 0;
  MiB memory_mib = 0;
  TimeMs max_runtime_ms = 0;
  TimeMs grace_period_ms = 0;  // 0: the agent's default
  // GPUFLEET_CHECKPOINT_DIR: the same for every attempt of the job. Empty: the agent's own
  // <data-dir>/checkpoints/job-<id> (survives a requeue onto the same node only).
  std::string checkpoint_dir;
  // A deployment's replica listens on this port (its PORT) of the node; the agent probes
  // GET http://127.0.0.1:<port><readiness_path> and reports `ready`.
  int32_t port = 0;
  std::string readiness_path;
};

struct SyncResponse {
  uint64_t version = 0;
  std::vector<TaskLaunch> desired;  // run exactly these; stop any other job workload
  int32_t heartbeat_ms = 5000;      // sync at least this often, or the node is marked lost
};

// ---- Deployments (docs/serving.md) -----------------------------------------------------------

// When a deployment's replicas come and go: Knative's KPA (serving/autoscaler.h).
struct AutoscalingSpec {
  std::string metric = "concurrency";  // or "rps"
  double target = 1.0;                 // per replica: requests in flight, or requests/s
  double target_utilization = 0.7;
  TimeMs stable_window_ms = 60000;
  TimeMs panic_window_ms = 6000;
  double panic_threshold = 2.0;
  TimeMs scale_to_zero_grace_ms = 30000;
  double max_scale_up_rate = 1000.0;
  double max_scale_down_rate = 2.0;
};

// What a user deploys: POST /api/v1/deployments, or `gpufleet deploy -f model.yaml`.
struct DeploymentSpec {
  std::string name;  // a DNS label: routes by Host, /d/NAME/ and the OpenAI `model` field
  std::string queue = "default";
  int32_t priority = 0;  // among the queue's replicas; replicas always rank above batch jobs
  std::vector<std::string> command;
  std::map<std::string, std::string> env;
  std::string workdir;
  ContainerSpec container;  // JSON "image", "mounts", "user"
  MilliGpu gpu_milli_per_replica = kMilliPerGpu;
  MilliCpu cpu_milli_per_replica = 0;
  MiB memory_mib_per_replica = 0;
  std::vector<std::string> gpu_models;
  MiB min_gpu_memory_mib = 0;
  int32_t min_replicas = 0;
  int32_t max_replicas = 1;
  std::string readiness_path = "/health";
  // Names the OpenAI `model` field may use besides the deployment's name (served model names,
  // LoRA adapters).
  std::vector<std::string> models;
  std::string routing = "least_outstanding";  // round_robin, least_outstanding, endpoint_picker
  AutoscalingSpec autoscaling;
  TimeMs grace_period_ms = 30000;    // SIGTERM to SIGKILL for a replica being stopped
  TimeMs drain_timeout_ms = 300000;  // a draining replica is stopped after this at the latest
};

// One replica as `deployment show` lists it: derived from its job.
struct ReplicaStatus {
  JobId job_id = 0;
  int64_t generation = 0;
  std::string state;  // pending, starting, ready, draining
  std::string node;
  std::string host;  // the node's address
  int32_t port = 0;
  TimeMs created_ms = 0;
};

struct DeploymentRecord {
  std::string name;
  std::string user;  // who created it
  std::string team;  // who may see, change and call it
  DeploymentSpec spec;
  int64_t generation = 1;  // +1 on every spec change: replicas of older ones are rolled
  int32_t desired_replicas = 0;
  std::string desired_reason;             // the autoscaler's sentence, or who scaled it
  std::optional<int32_t> fixed_replicas;  // `gpufleet scale NAME N`: the autoscaler is off
  TimeMs created_ms = 0;
  TimeMs updated_ms = 0;
  // Replicas that failed in a row, none becoming ready since: new ones start after a back-off
  // (a crash loop does not churn the scheduler), from the last failure's time.
  int32_t failures_in_a_row = 0;
  TimeMs last_failure_ms = 0;
  // Shown, never stored: from the replicas' jobs.
  std::vector<ReplicaStatus> replicas;
  int32_t ready_replicas = 0;
};

// GET /api/v1/endpoints: what gateways route to, the whole set each time (level-triggered).
struct EndpointInfo {
  std::string id;  // the replica: "j42"
  std::string host;
  int32_t port = 0;
};
struct DeploymentEndpoints {
  std::string name;
  std::string team;
  std::vector<std::string> models;
  std::string routing;
  std::vector<EndpointInfo> endpoints;  // ready and not draining
};
struct EndpointSet {
  uint64_t version = 0;
  std::vector<DeploymentEndpoints> deployments;
};

// POST /api/v1/gateways/report: what one gateway saw of each deployment since its last report.
struct DeploymentLoadReport {
  std::string name;
  double concurrency = 0;  // time-averaged requests in flight, buffered ones included
  double arrivals = 0;     // requests that arrived
  int64_t buffered = 0;    // waiting now for a replica
  std::map<std::string, int64_t> in_flight;  // replica id -> requests in flight now
};
struct GatewayReport {
  std::string gateway;  // the gateway's own id, stable across its reports
  TimeMs interval_ms = 0;
  std::vector<DeploymentLoadReport> deployments;
};

}  // namespace gpufleet::api
