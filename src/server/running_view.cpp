#include "server/running_view.h"

#include <algorithm>

#include "server/lifecycle.h"

namespace gpufleet::server {

namespace {

// SpanGpuMs of the ongoing attempt, as ServiceOf counts it (none before its start: a clock
// stepped back), from the GPUs an entry holds: the loop over every entry has no record at hand.
int64_t OngoingGpuMs(TimeMs start, TimeMs now, int64_t gpu_milli) {
  return (std::max(start, now) - start) * gpu_milli / kMilliPerGpu;
}

}  // namespace

std::span<const sched::RunningJob> RunningView::Refresh(
    const std::shared_ptr<const ClusterView>& view, const std::set<JobId>& active,
    const std::map<JobId, api::JobRecord>& jobs, TimeMs now) {
  if (view != view_) {
    // Positions refer to the old view's nodes: start over.
    view_ = view;
    entries_.clear();
    held_.clear();
    slot_.clear();
    changed_.clear();
    entries_.reserve(active.size());
    held_.reserve(active.size());
    for (JobId id : active)
      Add(*view_, jobs.at(id), now);
  } else {
    for (JobId id : changed_) {
      Remove(id);
      if (!active.count(id)) continue;
      if (auto job = jobs.find(id); job != jobs.end()) Add(*view_, job->second, now);
    }
    changed_.clear();
  }
  for (size_t i = 0; i < entries_.size(); ++i) {
    sched::RunningJob& entry = entries_[i];
    entry.attained_gpu_ms =
        held_[i].earlier_gpu_ms + OngoingGpuMs(entry.start_time, now, held_[i].gpu_milli);
  }
  return entries_;
}

void RunningView::Add(const ClusterView& view, const api::JobRecord& job, TimeMs now) {
  if (job.tasks.empty()) return;
  sched::Allocation allocation;
  allocation.reserve(job.tasks.size());
  for (const api::TaskStatus& task : job.tasks) {
    auto node = view.position.find(task.node);
    if (node == view.position.end()) return;  // on a lost node: requeued by maintenance shortly
    sched::TaskPlacement placement;
    placement.node = node->second;
    const auto& slots = view.gpu_slots[static_cast<size_t>(node->second)];
    placement.gpus.reserve(task.gpu_indices.size());
    for (int32_t index : task.gpu_indices) {
      auto slot = slots.find(index);
      if (slot == slots.end()) return;
      placement.gpus.push_back(sched::GpuShare{slot->second, task.gpu_milli});
    }
    allocation.push_back(std::move(placement));
  }
  const Service service = ServiceOf(job, now);
  // What ServiceOf counted beyond the ongoing attempt is the earlier ones.
  const int64_t ongoing = SpanGpuMs(job, service.run_start, std::max(service.run_start, now));
  slot_[job.id] = entries_.size();
  entries_.push_back(sched::RunningJob{ToJobSpec(job), std::move(allocation), service.run_start,
                                       service.attained_gpu_ms});
  held_.push_back(Held{service.attained_gpu_ms - ongoing, GpuMilliOf(job)});
}

void RunningView::Remove(JobId id) {
  auto it = slot_.find(id);
  if (it == slot_.end()) return;
  const size_t slot = it->second;
  slot_.erase(it);
  if (slot + 1 != entries_.size()) {
    // The scheduler does not depend on the entries' order (its ties are broken by job id).
    entries_[slot] = std::move(entries_.back());
    held_[slot] = held_.back();
    slot_[entries_[slot].spec.id] = slot;
  }
  entries_.pop_back();
  held_.pop_back();
}

}  // namespace gpufleet::server
