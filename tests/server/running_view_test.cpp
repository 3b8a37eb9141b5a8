// The scheduler's running set kept job by job: what Refresh returns must equal what a snapshot
// built from scratch would hold, as jobs are placed, requeued and end, and as nodes come and go.

#include "server/running_view.h"

#include <algorithm>
#include <memory>

#include <gtest/gtest.h>

#include "server/lifecycle.h"

namespace gpufleet::server {
namespace {

using api::JobRecord;
using api::JobState;

std::shared_ptr<const ClusterView> ViewOf(std::vector<std::string> node_names) {
  auto view = std::make_shared<ClusterView>();
  for (const std::string& name : node_names) {
    Node node;
    node.name = name;
    std::unordered_map<int32_t, int32_t> slots;
    for (int32_t index = 0; index < 8; ++index) {
      node.gpus.push_back(Gpu{});
      slots[7 - index] = index;  // slots differ from indices, as after a GPU is left out
    }
    view->position[name] = static_cast<int32_t>(view->cluster.nodes.size());
    view->gpu_slots.push_back(std::move(slots));
    view->cluster.nodes.push_back(std::move(node));
  }
  view->any_ready = true;
  return view;
}

class RunningViewTest : public ::testing::Test {
 protected:
  JobRecord& Submit(JobId id, int32_t gpus, TimeMs now) {
    JobRecord& job = jobs[id];
    job.id = id;
    job.spec.name = "job" + std::to_string(id);
    job.spec.gpu_milli_per_task = gpus * kMilliPerGpu;
    job.created_ms = now;
    SetState(job, JobState::kPending, "submitted", now);
    return job;
  }
  void Place(JobRecord& job, const std::string& node, std::vector<int32_t> indices, TimeMs now) {
    api::TaskStatus task;
    task.node = node;
    task.gpu_indices = std::move(indices);
    task.gpu_milli = kMilliPerGpu;
    task.workload_id = WorkloadId(job.id, 0, job.attempt);
    PlaceJob(job, {task}, "placed", now);
    active.insert(job.id);
    view.Changed(job.id);
  }
  void Requeue(JobRecord& job, TimeMs now) {
    RequeueJob(job, "preempted", now);
    active.erase(job.id);
    view.Changed(job.id);
  }
  // By job id, as the scheduler may take them in any order.
  std::vector<sched::RunningJob> Sorted(std::span<const sched::RunningJob> running) {
    std::vector<sched::RunningJob> sorted(running.begin(), running.end());
    std::sort(sorted.begin(), sorted.end(),
              [](const auto& a, const auto& b) { return a.spec.id < b.spec.id; });
    return sorted;
  }

  std::map<JobId, JobRecord> jobs;
  std::set<JobId> active;
  RunningView view;
};

TEST_F(RunningViewTest, EntriesFollowPlacementsRequeuesAndTheClock) {
  const auto cluster = ViewOf({"a", "b"});
  Place(Submit(1, 2, 0), "b", {6, 7}, 1000);
  Place(Submit(2, 1, 0), "a", {0}, 2000);
  auto running = Sorted(view.Refresh(cluster, active, jobs, 3000));
  ASSERT_EQ(running.size(), 2u);
  EXPECT_EQ(running[0].spec.id, 1u);
  EXPECT_EQ(running[0].spec.name, "job1");
  ASSERT_EQ(running[0].allocation.size(), 1u);
  EXPECT_EQ(running[0].allocation[0].node, 1);
  EXPECT_EQ(running[0].allocation[0].gpus,
            (std::vector<sched::GpuShare>{{1, kMilliPerGpu}, {0, kMilliPerGpu}}));
  EXPECT_EQ(running[0].start_time, 1000);
  EXPECT_EQ(running[0].attained_gpu_ms, 2 * 2000);
  EXPECT_EQ(running[1].attained_gpu_ms, 1000);

  // Nothing changed: the service still grows with the time.
  running = Sorted(view.Refresh(cluster, active, jobs, 5000));
  EXPECT_EQ(running[0].attained_gpu_ms, 2 * 4000);

  // Requeued after 5 s on 2 GPUs, placed again: it keeps its earlier service.
  Requeue(jobs.at(1), 6000);
  running = Sorted(view.Refresh(cluster, active, jobs, 6500));
  ASSERT_EQ(running.size(), 1u);
  EXPECT_EQ(running[0].spec.id, 2u);
  Place(jobs.at(1), "a", {3, 4}, 7000);
  running = Sorted(view.Refresh(cluster, active, jobs, 8000));
  ASSERT_EQ(running.size(), 2u);
  EXPECT_EQ(running[0].start_time, 7000);
  EXPECT_EQ(running[0].allocation[0].node, 0);
  EXPECT_EQ(running[0].attained_gpu_ms, 2 * 5000 + 2 * 1000);
  EXPECT_EQ(running[0].attained_gpu_ms, ServiceOf(jobs.at(1), 8000).attained_gpu_ms);

  // A clock stepped back counts no ongoing service, as ServiceOf does.
  running = Sorted(view.Refresh(cluster, active, jobs, 6000));
  EXPECT_EQ(running[0].attained_gpu_ms, ServiceOf(jobs.at(1), 6000).attained_gpu_ms);
}

TEST_F(RunningViewTest, ANewViewRebuildsAndLeavesOutJobsOnNodesItLacks) {
  Place(Submit(1, 1, 0), "a", {0}, 1000);
  Place(Submit(2, 1, 0), "b", {0}, 1000);
  Place(Submit(3, 1, 0), "c", {5}, 1000);
  auto running = Sorted(view.Refresh(ViewOf({"a", "b", "c"}), active, jobs, 2000));
  ASSERT_EQ(running.size(), 3u);
  EXPECT_EQ(running[2].allocation[0].node, 2);

  // b is lost: its job is left out, and c's position moves up.
  running = Sorted(view.Refresh(ViewOf({"a", "c"}), active, jobs, 3000));
  ASSERT_EQ(running.size(), 2u);
  EXPECT_EQ(running[0].spec.id, 1u);
  EXPECT_EQ(running[1].spec.id, 3u);
  EXPECT_EQ(running[1].allocation[0].node, 1);
  EXPECT_EQ(running[1].allocation[0].gpus[0].gpu, 2);
}

TEST_F(RunningViewTest, ManyChangesBetweenRefreshesEndAsARebuildWould) {
  const auto cluster = ViewOf({"a", "b", "c", "d"});
  TimeMs now = 1000;
  for (JobId id = 1; id <= 32; ++id)
    Place(Submit(id, 1, now), std::string(1, static_cast<char>('a' + id % 4)),
          {static_cast<int32_t>(id / 4 % 8)}, now);
  view.Refresh(cluster, active, jobs, now);
  // Requeue every third, and place some of those again, between two refreshes.
  for (JobId id = 3; id <= 32; id += 3) {
    now += 10;
    Requeue(jobs.at(id), now);
    if (id % 2 == 0) Place(jobs.at(id), "d", {static_cast<int32_t>(id % 8)}, now);
  }
  const auto kept = Sorted(view.Refresh(cluster, active, jobs, now + 100));
  RunningView fresh;
  const auto rebuilt = Sorted(fresh.Refresh(cluster, active, jobs, now + 100));
  ASSERT_EQ(kept.size(), rebuilt.size());
  for (size_t i = 0; i < kept.size(); ++i) {
    EXPECT_EQ(kept[i].spec.id, rebuilt[i].spec.id);
    EXPECT_EQ(kept[i].allocation, rebuilt[i].allocation);
    EXPECT_EQ(kept[i].start_time, rebuilt[i].start_time);
    EXPECT_EQ(kept[i].attained_gpu_ms, rebuilt[i].attained_gpu_ms);
  }
}

}  // namespace
}  // namespace gpufleet::server
