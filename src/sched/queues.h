#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace gpufleet::sched {

// A team queue with a guaranteed GPU quota (Kueue's ClusterQueue with its nominalQuota). Queues of
// the same cohort lend each other the part of their guarantee they do not use (docs/quotas.md).
struct QueueConfig {
  std::string name;
  std::string cohort;  // empty: the queue neither borrows nor lends
  // The guarantee over GPUs of every model, in milli-GPUs; ignored when per-model guarantees are
  // given, which then bind each model separately (a model not listed has a guarantee of 0).
  int64_t guaranteed_milli = 0;
  std::map<std::string, int64_t> guaranteed_milli_by_model;
  // How far above its guarantee the queue may go on borrowed quota; nothing: as far as the
  // cohort's unused guarantee allows.
  std::optional<int64_t> borrowing_limit_milli;
  // Its part of the cluster under the fairshare policy (sched/fair_share.h), against the other
  // queues' weights; admission and quotas do not use it.
  double weight = 1.0;
  // The server preempts (requeues, with the checkpoint signal first) this queue's jobs whose GPUs
  // sat idle for its --idle-gpu-timeout while other jobs wait for GPUs. Not simulated.
  bool reclaim_idle = false;
  // A deployment's replicas in this queue may be preempted (by reclaim of borrowed quota, or by
  // higher-priority replicas); by default they never are (docs/serving.md). Server only.
  bool preemptible_replicas = false;
  // The teams whose people may submit jobs and deployments to this queue (Kueue's
  // namespaceSelector); empty: every team. Admins may use any queue. Server only.
  std::vector<std::string> teams;

  bool PerModel() const { return !guaranteed_milli_by_model.empty(); }
  friend bool operator==(const QueueConfig&, const QueueConfig&) = default;
};

// Why a queue list cannot be used (duplicate or empty names, negative quotas, a weight not above
// zero), or nothing.
std::optional<std::string> ValidateQueues(std::span<const QueueConfig> queues);

}  // namespace gpufleet::sched
