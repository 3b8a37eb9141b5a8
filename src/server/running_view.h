#pragma once

// The scheduler's set of running jobs, kept up to date job by job instead of rebuilt on every
// cycle: at 10,000 nodes with 30,000 jobs running, copying each one's spec and allocation per
// cycle under the state lock was most of a cycle's cost and delayed every sync (docs/scale.md).

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "api/types.h"
#include "core/cluster.h"
#include "sched/types.h"

namespace gpufleet::server {

// The nodes as the scheduler sees them (every node not lost, in name order, drained ones not
// schedulable), rebuilt only when a node registers, is lost or back, changes shape, or is drained
// or undrained: snapshots taken meanwhile share it instead of copying 10,000 nodes.
struct ClusterView {
  Cluster cluster;
  std::unordered_map<std::string, int32_t> position;            // node name -> cluster position
  std::vector<std::unordered_map<int32_t, int32_t>> gpu_slots;  // per node: GPU index -> slot
  bool any_ready = false;
};

// One writer and reader, the scheduler thread: Refresh (under the server's lock) brings the
// entries up to date, and the span it returns stays valid and unchanged, outside the lock too,
// until the next Refresh. Others only call Changed, under the lock.
class RunningView {
 public:
  // The job's record changed (state, tasks, spec): its entry is re-read at the next Refresh.
  void Changed(JobId id) { changed_.insert(id); }

  // The running jobs for `view`: every active job whose tasks are all on nodes of the view
  // (one on a lost node is left out until maintenance requeues it), with its service at `now`.
  // `active` and `jobs` are the server's; a view other than the last one rebuilds every entry.
  std::span<const sched::RunningJob> Refresh(const std::shared_ptr<const ClusterView>& view,
                                             const std::set<JobId>& active,
                                             const std::map<JobId, api::JobRecord>& jobs,
                                             TimeMs now);

 private:
  // What an entry's attained service grows from: GPU-ms of the attempts before the current one,
  // and the GPUs it holds now.
  struct Held {
    int64_t earlier_gpu_ms = 0;
    int64_t gpu_milli = 0;
  };
  void Add(const ClusterView& view, const api::JobRecord& job, TimeMs now);
  void Remove(JobId id);

  std::shared_ptr<const ClusterView> view_;  // what the entries' positions refer to
  std::vector<sched::RunningJob> entries_;
  std::vector<Held> held_;  // parallel to entries_
  std::unordered_map<JobId, size_t> slot_;
  std::unordered_set<JobId> changed_;
};

}  // namespace gpufleet::server
