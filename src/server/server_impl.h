#pragma once

// Server's insides, shared by server.cpp (state, store, threads) and server_api.cpp (the HTTP
// routes). Not a public header.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "api/types.h"
#include "core/cluster.h"
#include "net/http.h"
#include "net/http_server.h"
#include "sched/fair_share.h"
#include "sched/queues.h"
#include "sched/scheduler.h"
#include "sched/types.h"
#include "server/metrics.h"
#include "server/running_view.h"
#include "server/server.h"
#include "serving/autoscaler.h"
#include "store/group_commit.h"
#include "store/store.h"

namespace gpufleet::server {

using SteadyTime = std::chrono::steady_clock::time_point;

// Store keys (docs/server.md): ids zero-padded to 20 digits so key order is numeric order.
std::string JobKey(JobId id);
std::string NodeKey(const std::string& name);
std::string TokenKey(const std::string& id);
std::string AuditKey(uint64_t seq);
std::string DeploymentKey(const std::string& name);
inline constexpr std::string_view kDeploymentPrefix = "deployments/";
inline constexpr std::string_view kJobPrefix = "jobs/";
inline constexpr std::string_view kNodePrefix = "nodes/";
inline constexpr std::string_view kTokenPrefix = "tokens/";
inline constexpr std::string_view kAuditPrefix = "audit/";

TimeMs WallMs();

// A few threads for work that waits on the network (the logs proxy), so io threads never do.
class WorkerPool {
 public:
  explicit WorkerPool(int threads);
  ~WorkerPool();  // Stop()
  void Post(std::function<void()> work);
  void Stop();  // runs what is queued, then joins

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

// Who is calling: the token's identity.
struct Caller {
  api::TokenInfo info;
  bool admin() const { return info.role == api::Role::kAdmin; }
};

// An API route: the roles that may call it and its handler (server_api.cpp registers them).
using RouteHandler = void (*)(Server::Impl&, const net::HttpRequest&, const Caller&,
                              net::HttpResponder);
struct ApiRoute {
  std::string method;
  std::string pattern;
  std::vector<api::Role> roles;
  RouteHandler handler;
};
std::vector<ApiRoute> DeploymentRoutes();  // deployments.cpp

struct Server::Impl {
  // A sync held until the node's desired state changes or its deadline passes.
  struct Parked {
    uint64_t known_version = 0;
    SteadyTime deadline;
    net::HttpResponder respond;
  };
  struct NodeEntry {
    api::NodeRecord record;
    uint64_t version = 0;  // of the node's desired state
    // The CommitLocked batch (counting from 1) that makes that state durable: a sync is answered
    // at once when it has settled (RespondDesiredLocked).
    uint64_t desired_commit = 0;
    SteadyTime last_seen;  // liveness on the steady clock; record.last_seen_ms is for people
    std::vector<Parked> parked;
    // What the agent's API wants of the server (from its syncs; memory only, never shown).
    std::string agent_key;
  };
  struct TokenEntry {
    api::TokenInfo info;
    std::string sha256;
  };
  // The scheduler's input, taken under the lock and used outside it.
  struct Snapshot {
    std::shared_ptr<const ClusterView> view;
    const Cluster& cluster() const { return view->cluster; }
    // running_view's entries: unchanged until the scheduler thread's next snapshot.
    std::span<const sched::RunningJob> running;
    // pending_jobs' entries, kept alive while the cycle runs by retired_pending.
    std::vector<const sched::PendingJob*> pending;
    bool any_ready = false;
    uint64_t generation = 0;
    // Fair share only: each queue's decayed GPU-seconds at the snapshot's time.
    std::map<std::string, double, std::less<>> fair_share_usage;
  };
  using CommitDone = std::function<void(const std::string& error)>;  // empty: durable

  // A deployment (deployments.cpp, docs/serving.md): its record as stored, the replica jobs not
  // yet seen ended, and the autoscaler, which lives in memory only.
  struct DeploymentEntry {
    api::DeploymentRecord record;
    std::set<JobId> replicas;
    std::optional<serving::KpaAutoscaler> autoscaler;
    SteadyTime autoscaler_since;  // its decisions to scale down count once it has a window
    // Gateways' load since the last autoscaler tick: in-flight request-milliseconds and arrivals.
    double load_area_ms = 0;
    double load_arrivals = 0;
    int64_t buffered = 0;  // the latest reports' sum: requests waiting for a first replica
  };
  // What each gateway last said (POST /api/v1/gateways/report).
  struct GatewayEntry {
    SteadyTime last_seen;
    TimeMs last_report_ms = 0;                                        // wall clock
    std::map<std::string, std::map<std::string, int64_t>> in_flight;  // deployment -> replica -> n
  };
  struct EndpointWatch {
    SteadyTime deadline;
    net::HttpResponder respond;
    std::optional<Caller> caller;
  };

  explicit Impl(ServerOptions server_options);
  ~Impl();

  // ---- server.cpp -------------------------------------------------------------------------
  std::string Load();  // error message, empty on success
  std::string Start();
  void Stop();
  void Log(const std::string& line) const;

  // Mutations. Called with mu held: queues `batch` so that the store sees commits in the order
  // memory changed; `done` runs on the store's writer thread once the batch is durable or failed.
  // Nodes in `wake` have their parked syncs answered once the batch is durable.
  void CommitLocked(std::vector<store::Mutation> batch, CommitDone done,
                    std::vector<std::string> wake = {});
  void OnStoreFailure(const std::string& error);
  bool failed() const { return failed_.load(); }
  std::string FatalMessage() const;

  store::Mutation PutJobLocked(const api::JobRecord& job) const;
  store::Mutation PutNodeLocked(const NodeEntry& node) const;
  store::Mutation AuditLocked(const Caller& caller, std::string action, std::string target,
                              std::string detail, TimeMs now);
  void IndexJobLocked(const api::JobRecord& job);  // after any state change
  // Idle GPUs: TrackIdleLocked reads a node's report (in every sync); CheckIdleLocked flags,
  // unflags and reclaims (maintenance loop) and says whether anything changed.
  void TrackIdleLocked(const std::string& node, TimeMs now);
  bool CheckIdleLocked(TimeMs now, std::vector<store::Mutation>& batch,
                       std::vector<std::string>& wake);
  // Each queue's decayed GPU-seconds at `now`, running jobs included.
  std::map<std::string, double, std::less<>> FairShareUsageLocked(TimeMs now) const;
  // Gives the node a new desired version (its parked syncs are answered by the caller's commit).
  void BumpLocked(const std::string& node);
  // Nodes that run tasks of `job`.
  std::vector<std::string> NodesOf(const api::JobRecord& job) const;
  void WakeSchedulerLocked();
  void ChangedLocked();  // something a scheduling decision may depend on changed
  // A node's capacity changed (registered, lost, back, shape, drain): also the cluster view.
  void CapacityChangedLocked();
  const std::shared_ptr<const ClusterView>& ClusterViewLocked();

  // Syncs.
  api::SyncResponse DesiredLocked(const std::string& node) const;
  // Answers syncs of `node` with its desired state once every change that state reflects is
  // durable: memory runs ahead of the store, and an agent must never start a placement that a
  // failed or fenced commit loses (a new leader would place that job again, at the same attempt).
  void RespondDesiredLocked(const std::string& node, std::vector<net::HttpResponder> responders);
  void AnswerParkedLocked(const std::string& node);
  void FinishSyncLocked(const std::string& node, uint64_t known_version, int32_t wait_ms,
                        net::HttpResponder respond);

  // Scheduling.
  void SchedulerLoop();
  // Returns how long the cycle took, which spaces out the next one (SchedulerLoop).
  std::chrono::steady_clock::duration RunCycle();
  Snapshot SnapshotLocked(TimeMs now);
  void ApplyLocked(const Snapshot& snapshot, const sched::Decisions& decisions, TimeMs now);
  // The cluster a new job is checked against (422): every node not lost, drained ones included
  // (a drain is temporary); nothing while no node is ready.
  sched::FeasibilityChecker* FeasibilityLocked();

  // Lost nodes and long-poll deadlines.
  void MaintenanceLoop();
  void MarkLostLocked(NodeEntry& node, TimeMs now, std::vector<store::Mutation>& batch,
                      std::vector<std::string>& wake);

  // ---- deployments.cpp --------------------------------------------------------------------
  // Converges every deployment's replicas to what it wants (scale, roll, drain, restart) and
  // runs the autoscalers when `tick` says their interval has passed.
  void ReconcileDeploymentsLocked(TimeMs now, bool tick, std::vector<store::Mutation>& batch,
                                  std::vector<std::string>& wake);
  bool ReconcileDeploymentLocked(DeploymentEntry& entry, TimeMs now,
                                 std::vector<store::Mutation>& batch,
                                 std::vector<std::string>& wake);
  // Records `sample` in the deployment's autoscaler and applies its decision to the wanted count.
  void AutoscaleLocked(DeploymentEntry& entry, const serving::LoadSample& sample,
                       std::vector<store::Mutation>& batch);
  store::Mutation PutDeploymentLocked(const DeploymentEntry& entry) const;
  api::DeploymentRecord ShowDeploymentLocked(const DeploymentEntry& entry) const;
  void ResetAutoscalerLocked(DeploymentEntry& entry);
  // A port of the replica range that no replica on `node` holds, for attempt `attempt` of `job`.
  int32_t FreeReplicaPortLocked(const std::string& node, JobId job, int32_t attempt) const;
  api::EndpointSet EndpointsLocked(const std::optional<Caller>& caller) const;
  // Recomputes the endpoint set; a change gets a new version and answers the parked watches.
  void RefreshEndpointsLocked();
  void ExpireEndpointWatchesLocked(SteadyTime now, SteadyTime& next);

  // Scope empty: the role's default. expires_ms 0: never.
  CreatedToken CreateTokenLocked(const std::string& user, const std::string& team, api::Role role,
                                 const Caller& actor, TimeMs now,
                                 std::vector<store::Mutation>& batch, std::string scope = {},
                                 TimeMs expires_ms = 0);
  store::Mutation PutTokenLocked(const TokenEntry& token) const;

  // ---- server_api.cpp ---------------------------------------------------------------------
  void AddRoutes();
  void Dispatch(net::HttpRequest request, net::HttpResponder respond);
  // The caller of a valid, unexpired token; nothing otherwise, with why in `refusal`.
  std::optional<Caller> Authenticate(const net::HttpRequest& request, std::string& refusal) const;

  const ServerOptions options;
  std::unique_ptr<store::Store> store;
  std::unique_ptr<store::GroupCommitter> committer;
  // The HTTP layer's refusals and open connections, shown in /metrics.
  const std::shared_ptr<net::HttpServerCounters> http_counters =
      std::make_shared<net::HttpServerCounters>();
  std::unique_ptr<net::HttpServer> http;
  net::Router router;
  WorkerPool proxy_pool{4};

  // ---- State, guarded by mu -----------------------------------------------------------------
  mutable std::mutex mu;
  // Per-token request buckets (options.token_rate_limit), under their own lock: taken on every
  // call before the handler runs.
  struct RateBucket {
    double tokens = 0;
    SteadyTime refilled{};
  };
  std::mutex rate_mu;
  std::map<std::string, RateBucket> rate_buckets;  // by token id
  // Whether `token_id` may make one more request now; else how many seconds until it may.
  std::optional<double> RateLimitedFor(const std::string& token_id);
  std::map<JobId, api::JobRecord> jobs;
  // State pending, with what the scheduler needs of each (fixed while the job is pending).
  std::map<JobId, std::shared_ptr<const sched::PendingJob>> pending_jobs;
  // While a snapshot is read outside the lock (snapshot_out), the entries that leave
  // pending_jobs wait here: the snapshot holds plain pointers, as copying 100,000 shared_ptrs
  // under the lock on every cycle cost as much as the rest of the snapshot.
  bool snapshot_out = false;
  std::vector<std::shared_ptr<const sched::PendingJob>> retired_pending;
  std::set<JobId> active_jobs;  // scheduled, starting or running
  RunningView running_view;     // the active jobs as the scheduler takes them
  // The active jobs with a task on each node, and the nodes each is indexed under: a sync reads
  // its node's tasks without walking every active job (10,000 nodes, docs/scale.md).
  std::unordered_map<std::string, std::set<JobId>> active_on_node;
  std::unordered_map<JobId, std::vector<std::string>> indexed_nodes;
  std::set<std::string> queue_names;  // every queue a job (even a finished one) has named
  // The spans jobs held GPUs that have ended, each counted once by IndexJobLocked: the fair-share
  // ledger and the teams' GPU-time for /metrics grow with them instead of re-reading every job's
  // history on each cycle or scrape.
  sched::FairShareLedger fair_share{options.scheduler.fair_share_half_life_s};
  std::unordered_map<JobId, size_t> ended_spans_counted;
  std::map<std::string, int64_t> ended_gpu_ms_by_team;
  std::map<std::pair<std::string, std::string>, int64_t> ended_gpu_ms_by_user;  // (team, user)
  // Idle GPUs: for each running job, since when each node it runs on has reported every GPU of
  // the job there at most kIdleUtilizationPct busy. In memory only: a restarted server starts
  // the count again, which errs on the side of the job.
  std::unordered_map<JobId, std::map<std::string, TimeMs>> idle_on_node;
  uint64_t idle_reclaims = 0;
  // Preemptions the scheduler decided since the server started, by PreemptReasonCode (/metrics).
  std::map<std::string, uint64_t> preemptions_by_reason;
  // A job requeued for idle GPUs yields to the jobs that were waiting then (up to
  // kMaxYieldedTo): it is left out of the scheduler's queue while any of them still waits, so
  // its GPUs go to them rather than straight back to it.
  std::unordered_map<JobId, std::vector<JobId>> yields_to;
  bool YieldsLocked(JobId id) const;
  std::map<std::string, NodeEntry> nodes;
  // Parked syncs' deadlines, earliest first, so that the maintenance loop answers those due
  // without visiting every node (an entry whose poll was answered earlier is skipped).
  std::multimap<SteadyTime, std::string> parked_deadlines;
  SteadyTime maintenance_next{};  // when the maintenance loop wakes next
  SteadyTime next_lost_scan{};    // no node can be lost before then
  SteadyTime next_idle_check{};
  std::map<std::string, DeploymentEntry> deployments;
  std::map<std::string, GatewayEntry> gateways;
  std::vector<EndpointWatch> endpoint_watches;
  uint64_t endpoints_version = 0;
  std::string endpoints_digest;  // the last endpoint set, to tell whether it changed
  SteadyTime last_autoscale{};
  std::map<std::string, TokenEntry> tokens;                      // by id
  std::unordered_map<std::string, std::string> token_by_sha256;  // -> id
  JobId next_job_id = 1;
  uint64_t next_audit_seq = 1;
  uint64_t audit_entries = 0;
  // Desired versions come from one counter that starts at the wall clock in microseconds, so a
  // restarted server's versions differ from what agents saw before it restarted.
  uint64_t last_version = 0;
  uint64_t generation = 0;           // see ChangedLocked
  uint64_t capacity_generation = 0;  // see CapacityChangedLocked
  uint64_t cluster_view_generation = ~uint64_t{0};
  std::shared_ptr<const ClusterView> cluster_view;
  uint64_t feasibility_generation = ~uint64_t{0};
  std::unique_ptr<sched::FeasibilityChecker> feasibility;
  bool stopping = false;
  bool scheduler_wake = false;
  // Every pending job's reason says no node is ready: set once when that becomes true, not on
  // every cycle (submissions made meanwhile say so themselves).
  bool pending_marked_no_ready = false;
  // When the scheduler last said why every waiting job waits: a long queue is explained at most
  // once per schedule interval, not on every cycle a submission triggers.
  SteadyTime last_explained{};  // the scheduling thread's own
  bool scheduler_running = false;
  std::condition_variable scheduler_cv;
  std::condition_variable maintenance_cv;
  std::thread scheduler_thread;
  std::thread maintenance_thread;

  // Requests dispatched but not answered yet: Stop() waits for them before stopping HTTP.
  std::mutex in_flight_mu;
  std::condition_variable in_flight_cv;
  int64_t in_flight = 0;

  std::atomic<bool> failed_{false};
  // Batches CommitLocked queued (under mu) and those whose outcome is known, in order.
  uint64_t commits_queued = 0;
  std::atomic<uint64_t> commits_settled{0};
  mutable std::mutex fatal_mu;
  mutable std::condition_variable fatal_cv;
  std::string fatal;
  bool stopped = false;  // Stop() finished

  Histogram cycle_latency{CycleLatencyBuckets()};
  Histogram request_latency{RequestLatencyBuckets()};
  RequestCounter requests;
  std::atomic<uint64_t> cycles{0};
  std::atomic<uint64_t> agent_syncs{0};
};

// ---- Route helpers (server_api.cpp) ----------------------------------------------------------
net::HttpResponse JsonResponse(int status, const nlohmann::json& body);
// 503 with the role header "stopping" (net/server_urls.h): clients ask another server.
net::HttpResponse Stopping(const std::string& why);
net::HttpResponse StoreFailed(const std::string& error);  // Stopping("store failed: ...")
// Answers `response` once the batch is durable, or 503 when the store failed.
Server::Impl::CommitDone AnswerWhenDurable(net::HttpResponder respond, net::HttpResponse response);
// 503 when the server cannot take changes now (failed store, stopping). Called with the lock held.
bool RefuseMutationLocked(Server::Impl& s, net::HttpResponder& respond);
// The configured queue of that name; nothing without a queues file or when there is none.
const sched::QueueConfig* FindQueue(const ServerOptions& options, std::string_view name);
// Why a job or deployment may not name this queue ("queue 'x' does not exist; the queues are
// ..."), or nothing: every name is good without a queues file.
std::optional<std::string> UnknownQueue(const ServerOptions& options, std::string_view name);
// A query parameter that must be an integer in [min, max]; `fallback` when absent; nothing with
// `error` set otherwise.
std::optional<int64_t> QueryInt(const net::HttpRequest& request, const std::string& name,
                                int64_t fallback, int64_t min, int64_t max, std::string& error);
// Why this caller's team may not use the queue (it lists other teams), or nothing.
std::optional<std::string> QueueClosedTo(const ServerOptions& options, std::string_view name,
                                         const Caller& caller);

}  // namespace gpufleet::server
