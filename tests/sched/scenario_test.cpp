// Runs every scenario file under tests/sched/scenarios through sched::Schedule and checks the
// decisions exactly: placements (in order, with nodes and GPUs), preemptions (in order) and the
// wait reason of every pending job not placed (in the order the scheduler considered them).
//
// Scenario file format (YAML; docs/scheduling.md, "Scenario files", has the same text):
//
//   description: what the scenario shows            # free text, optional
//   cluster:                                        # `shape` or `nodes`, not both
//     shape: {nodes: 2, gpus_per_node: 8}           # sched::UniformClusterShape; keys as its
//                                                   # fields, each optional (its defaults)
//     nodes:                                        # explicit nodes, in order
//       - name: a                                   # required, unique
//         rack: rack-000                            # default rack-000
//         spine: spine-00                           # default spine-00
//         cpu_milli: 128000                         # default 128000
//         memory_mib: 1048576                       # default 1048576
//         gpus: 8                                   # a count (the next three keys apply) ...
//         gpu_model: H100-80GB                      #   default H100-80GB
//         gpu_memory_mib: 81559                     #   default 81559
//         gpus_per_nvlink_island: 8                 #   default: all GPUs in one island
//         # ... or a list of groups, in GPU index order:
//         # gpus: [{count: 2, model: V100, memory_mib: 16384, nvlink_island: 0}, ...]
//     unschedulable: [node-0001]                    # drained nodes, by name
//     unhealthy_gpus: {node-0000: [3]}              # faulty GPUs, by node name and index
//   config:                                         # sched::SchedulerConfig
//     order: fifo                                   # fifo | sjf | las (default fifo)
//     backfill: none                                # none | easy | firstfit
//                                                   # (default: DefaultBackfill(order))
//     placement: binpack                            # binpack | spread (default binpack)
//     preempt: false
//     las_queue_limits_gpu_s: [3200]
//     las_starvation_factor: 0
//     queues:                                       # team queues (docs/quotas.md); default none
//       - {name: a, cohort: c, guaranteed_gpus: 8, borrowing_limit_gpus: 4, weight: 1}
//       - {name: b, cohort: c, guaranteed_gpus: {A100-40GB: 4, H100-80GB: 2}}
//   now_ms: 0                                       # the cycle's `now`
//   running:                                        # sched::RunningJob, a job spec plus:
//     - id: 1
//       start_ms: 0
//       attained_gpu_s: 0                           # GPU-seconds of service so far
//       allocation:                                 # one entry per task, in rank order
//         - {node: node-0000, gpus: [0, 1]}         # whole GPUs by index;
//         - {node: node-0001, gpus: ["2@300"]}      # "gpu@milli" for a share of a GPU
//   pending:                                        # sched::PendingJob, a job spec plus:
//     - id: 2
//       attained_gpu_s: 0
//       last_run_end_ms: -1
//       preemptions: 0
//   expect:                                         # a missing list means "none"
//     placements:
//       - {job: 2, allocation: [{node: node-0000, gpus: [2, 3]}]}
//     preemptions:
//       - {job: 1, for: 2, reason: higher_priority} # higher_priority | las_demotion | reclaim
//     waiting:
//       - {job: 3, reason: blocked_by_queue_head}   # sched::WaitReasonCode
//
// Job spec keys (running and pending): id (required), name, queue, priority (default 0), tasks
// (default 1), gpus_per_task (default 1; whole GPUs, or a share below 1 such as 0.3), cpu_milli,
// memory_mib (per task, default 0), gpu_models (list), min_gpu_memory_mib, submit_ms (default 0),
// estimate_ms (runtime estimate; absent means none), preemptible (default true).
//
// Unknown keys are errors, so that a misspelt key cannot silently turn into a default.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include "core/cluster.h"
#include "sched/allocator.h"
#include "sched/fair_share.h"
#include "sched/scheduler.h"
#include "sim/queues.h"

namespace gpufleet::sched {
namespace {

namespace fs = std::filesystem;

struct Scenario {
  std::string description;
  Cluster cluster;
  SchedulerConfig config;
  TimeMs now = 0;
  std::vector<RunningJob> running;
  std::vector<PendingJob> pending;
  Decisions expected;
};

[[noreturn]] void Fail(const YAML::Node& node, const std::string& message) {
  throw std::runtime_error(
      fmt::format("line {}: {}", node.Mark().line >= 0 ? node.Mark().line + 1 : 0, message));
}

void CheckKeys(const YAML::Node& map, std::initializer_list<std::string_view> allowed) {
  if (!map.IsMap()) Fail(map, "expected a mapping");
  for (const auto& entry : map) {
    const std::string key = entry.first.as<std::string>();
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end())
      Fail(entry.first, fmt::format("unknown key '{}'", key));
  }
}

template <typename T>
T Get(const YAML::Node& map, const char* key, T fallback) {
  const YAML::Node value = map[key];
  return value ? value.as<T>() : fallback;
}

std::vector<YAML::Node> ListOf(const YAML::Node& map, const char* key) {
  std::vector<YAML::Node> items;
  const YAML::Node list = map[key];
  if (!list || list.IsNull()) return items;
  if (!list.IsSequence()) Fail(list, fmt::format("'{}' must be a list", key));
  for (const YAML::Node& item : list)
    items.push_back(item);
  return items;
}

Node MakeNode(const YAML::Node& yaml) {
  CheckKeys(yaml, {"name", "rack", "spine", "cpu_milli", "memory_mib", "gpus", "gpu_model",
                   "gpu_memory_mib", "gpus_per_nvlink_island"});
  Node node;
  if (!yaml["name"]) Fail(yaml, "a node needs a name");
  node.name = yaml["name"].as<std::string>();
  node.rack = Get<std::string>(yaml, "rack", "rack-000");
  node.spine = Get<std::string>(yaml, "spine", "spine-00");
  node.cpu_milli = Get<MilliCpu>(yaml, "cpu_milli", 128'000);
  node.memory_mib = Get<MiB>(yaml, "memory_mib", 1'048'576);
  const YAML::Node gpus = yaml["gpus"];
  auto add_gpu = [&](const std::string& model, MiB memory, int32_t island) {
    const auto index = static_cast<int32_t>(node.gpus.size());
    node.gpus.push_back(Gpu{.uuid = fmt::format("{}-gpu{}", node.name, index),
                            .model = model,
                            .memory_mib = memory,
                            .index = index,
                            .nvlink_island = island,
                            .healthy = true});
  };
  if (gpus && gpus.IsSequence()) {
    for (const YAML::Node& group : gpus) {
      CheckKeys(group, {"count", "model", "memory_mib", "nvlink_island"});
      const auto count = Get<int32_t>(group, "count", 1);
      for (int32_t i = 0; i < count; ++i)
        add_gpu(Get<std::string>(group, "model", "H100-80GB"),
                Get<MiB>(group, "memory_mib", 81'559), Get<int32_t>(group, "nvlink_island", 0));
    }
  } else {
    const auto count = Get<int32_t>(yaml, "gpus", 0);
    const auto per_island = std::max(1, Get<int32_t>(yaml, "gpus_per_nvlink_island", count));
    for (int32_t g = 0; g < count; ++g)
      add_gpu(Get<std::string>(yaml, "gpu_model", "H100-80GB"),
              Get<MiB>(yaml, "gpu_memory_mib", 81'559), g / per_island);
  }
  return node;
}

Cluster MakeScenarioCluster(const YAML::Node& yaml) {
  CheckKeys(yaml, {"shape", "nodes", "unschedulable", "unhealthy_gpus"});
  Cluster cluster;
  if (yaml["shape"] && yaml["nodes"]) Fail(yaml, "give either 'shape' or 'nodes'");
  if (const YAML::Node shape_yaml = yaml["shape"]) {
    CheckKeys(shape_yaml, {"nodes", "gpus_per_node", "nodes_per_rack", "racks_per_spine",
                           "gpus_per_nvlink_island", "gpu_model", "gpu_memory_mib",
                           "cpu_milli_per_node", "memory_mib_per_node"});
    UniformClusterShape shape;
    shape.nodes = Get(shape_yaml, "nodes", shape.nodes);
    shape.gpus_per_node = Get(shape_yaml, "gpus_per_node", shape.gpus_per_node);
    shape.nodes_per_rack = Get(shape_yaml, "nodes_per_rack", shape.nodes_per_rack);
    shape.racks_per_spine = Get(shape_yaml, "racks_per_spine", shape.racks_per_spine);
    shape.gpus_per_nvlink_island =
        Get(shape_yaml, "gpus_per_nvlink_island", shape.gpus_per_nvlink_island);
    shape.gpu_model = Get(shape_yaml, "gpu_model", shape.gpu_model);
    shape.gpu_memory_mib = Get(shape_yaml, "gpu_memory_mib", shape.gpu_memory_mib);
    shape.cpu_milli_per_node = Get(shape_yaml, "cpu_milli_per_node", shape.cpu_milli_per_node);
    shape.memory_mib_per_node = Get(shape_yaml, "memory_mib_per_node", shape.memory_mib_per_node);
    cluster = MakeUniformCluster(shape);
  } else {
    for (const YAML::Node& node : ListOf(yaml, "nodes"))
      cluster.nodes.push_back(MakeNode(node));
  }
  auto find_node = [&](const YAML::Node& name) -> Node& {
    const auto text = name.as<std::string>();
    for (Node& node : cluster.nodes)
      if (node.name == text) return node;
    Fail(name, fmt::format("no node named '{}'", text));
  };
  for (const YAML::Node& name : ListOf(yaml, "unschedulable"))
    find_node(name).schedulable = false;
  if (const YAML::Node faulty = yaml["unhealthy_gpus"]) {
    for (const auto& entry : faulty) {
      Node& node = find_node(entry.first);
      for (const YAML::Node& index : entry.second) {
        const auto g = index.as<size_t>();
        if (g >= node.gpus.size()) Fail(index, "no such GPU");
        node.gpus[g].healthy = false;
      }
    }
  }
  if (const auto error = ValidateCluster(cluster)) Fail(yaml, *error);
  return cluster;
}

SchedulerConfig MakeConfig(const YAML::Node& yaml) {
  SchedulerConfig config;
  if (!yaml) return config;
  CheckKeys(yaml, {"order", "backfill", "placement", "preempt", "las_queue_limits_gpu_s",
                   "las_starvation_factor", "queues", "fair_share_usage_gpu_s"});
  if (const YAML::Node order = yaml["order"]) {
    const auto parsed = ParseQueueOrder(order.as<std::string>());
    if (!parsed) Fail(order, "unknown order");
    config.order = *parsed;
  }
  config.backfill = DefaultBackfill(config.order);
  if (const YAML::Node backfill = yaml["backfill"]) {
    const auto parsed = ParseBackfill(backfill.as<std::string>());
    if (!parsed) Fail(backfill, "unknown backfill");
    config.backfill = *parsed;
  }
  if (const YAML::Node placement = yaml["placement"]) {
    const auto parsed = ParsePlacementPolicy(placement.as<std::string>());
    if (!parsed) Fail(placement, "unknown placement");
    config.placement = *parsed;
  }
  config.preempt = Get(yaml, "preempt", config.preempt);
  config.las_queue_limits_gpu_s =
      Get(yaml, "las_queue_limits_gpu_s", config.las_queue_limits_gpu_s);
  config.las_starvation_factor = Get(yaml, "las_starvation_factor", config.las_starvation_factor);
  if (const YAML::Node queues = yaml["queues"]) {
    try {
      for (sim::QueueEntry& entry : sim::ParseQueues(queues, false))
        config.queues.push_back(std::move(entry.config));
    } catch (const sim::QueuesError& error) {
      Fail(queues, error.what());
    }
  }
  // Decayed usage per queue, turned into factors the way the server and the simulator do.
  if (const YAML::Node usage = yaml["fair_share_usage_gpu_s"]) {
    std::map<std::string, double, std::less<>> used;
    for (const auto& entry : usage)
      used.emplace(entry.first.as<std::string>(), entry.second.as<double>());
    config.fair_share_factor = FairShareFactors(used, config.queues);
  }
  return config;
}

MilliGpu ParseGpusPerTask(const YAML::Node& yaml) {
  const double gpus = yaml.as<double>();
  const double milli = gpus * kMilliPerGpu;
  if (gpus < 0 || std::abs(milli - std::round(milli)) > 1e-6)
    Fail(yaml, "gpus_per_task must be a whole number of milli-GPUs");
  return static_cast<MilliGpu>(std::lround(milli));
}

const std::initializer_list<std::string_view> kSpecKeys = {"id",          "name",
                                                           "queue",       "priority",
                                                           "tasks",       "gpus_per_task",
                                                           "cpu_milli",   "memory_mib",
                                                           "gpu_models",  "min_gpu_memory_mib",
                                                           "submit_ms",   "estimate_ms",
                                                           "preemptible", "tasks_per_node"};

JobSpec MakeSpec(const YAML::Node& yaml) {
  JobSpec spec;
  if (!yaml["id"]) Fail(yaml, "a job needs an id");
  spec.id = yaml["id"].as<JobId>();
  spec.name = Get<std::string>(yaml, "name", fmt::format("job-{}", spec.id));
  spec.queue = Get(yaml, "queue", spec.queue);
  spec.priority = Get(yaml, "priority", spec.priority);
  spec.tasks = Get(yaml, "tasks", spec.tasks);
  spec.tasks_per_node = Get(yaml, "tasks_per_node", spec.tasks_per_node);
  if (const YAML::Node gpus = yaml["gpus_per_task"])
    spec.gpu_milli_per_task = ParseGpusPerTask(gpus);
  spec.cpu_milli_per_task = Get<MilliCpu>(yaml, "cpu_milli", 0);
  spec.memory_mib_per_task = Get<MiB>(yaml, "memory_mib", 0);
  spec.gpu_models = Get(yaml, "gpu_models", spec.gpu_models);
  spec.min_gpu_memory_mib = Get<MiB>(yaml, "min_gpu_memory_mib", 0);
  spec.submit_time = Get<TimeMs>(yaml, "submit_ms", 0);
  if (const YAML::Node estimate = yaml["estimate_ms"])
    spec.runtime_estimate = estimate.as<TimeMs>();
  spec.preemptible = Get(yaml, "preemptible", spec.preemptible);
  if (const auto error = ValidateJobSpec(spec)) Fail(yaml, *error);
  return spec;
}

void CheckJobKeys(const YAML::Node& yaml, std::initializer_list<std::string_view> extra) {
  std::vector<std::string_view> keys(kSpecKeys);
  keys.insert(keys.end(), extra);
  if (!yaml.IsMap()) Fail(yaml, "expected a mapping");
  for (const auto& entry : yaml) {
    const std::string key = entry.first.as<std::string>();
    if (std::find(keys.begin(), keys.end(), key) == keys.end())
      Fail(entry.first, fmt::format("unknown key '{}'", key));
  }
}

int32_t NodeIndex(const Cluster& cluster, const YAML::Node& name) {
  const auto text = name.as<std::string>();
  for (size_t n = 0; n < cluster.nodes.size(); ++n)
    if (cluster.nodes[n].name == text) return static_cast<int32_t>(n);
  Fail(name, fmt::format("no node named '{}'", text));
}

Allocation MakeAllocation(const Cluster& cluster, const YAML::Node& yaml) {
  Allocation allocation;
  if (!yaml || !yaml.IsSequence()) Fail(yaml, "an allocation is a list of tasks");
  for (const YAML::Node& task_yaml : yaml) {
    CheckKeys(task_yaml, {"node", "gpus"});
    TaskPlacement task{.node = NodeIndex(cluster, task_yaml["node"]), .gpus = {}};
    for (const YAML::Node& gpu : ListOf(task_yaml, "gpus")) {
      const auto text = gpu.as<std::string>();
      const size_t at = text.find('@');
      try {
        if (at == std::string::npos) {
          task.gpus.push_back({.gpu = std::stoi(text), .milli = kMilliPerGpu});
        } else {
          task.gpus.push_back(
              {.gpu = std::stoi(text.substr(0, at)), .milli = std::stoi(text.substr(at + 1))});
        }
      } catch (const std::logic_error&) {
        Fail(gpu, fmt::format("bad GPU '{}': an index, or index@milli", text));
      }
    }
    allocation.push_back(std::move(task));
  }
  return allocation;
}

std::optional<WaitReason> ParseWaitReason(std::string_view code) {
  for (const WaitReason reason :
       {WaitReason::kInsufficientGpus, WaitReason::kInsufficientCpuOrMemory,
        WaitReason::kBlockedByQueueHead, WaitReason::kReservedForEarlierJob,
        WaitReason::kInfeasibleGpuCount, WaitReason::kInfeasibleTaskShape,
        WaitReason::kInfeasibleGpuModel, WaitReason::kInfeasibleNodeCount, WaitReason::kOverQuota,
        WaitReason::kCohortExhausted, WaitReason::kUnknownQueue, WaitReason::kInfeasibleQuota})
    if (code == WaitReasonCode(reason)) return reason;
  return std::nullopt;
}

std::optional<PreemptReason> ParsePreemptReason(std::string_view code) {
  for (const PreemptReason reason :
       {PreemptReason::kHigherPriority, PreemptReason::kLasDemotion, PreemptReason::kReclaim})
    if (code == PreemptReasonCode(reason)) return reason;
  return std::nullopt;
}

Scenario LoadScenario(const fs::path& path) {
  const YAML::Node root = YAML::LoadFile(path.string());
  CheckKeys(root, {"description", "cluster", "config", "now_ms", "running", "pending", "expect"});
  Scenario scenario;
  scenario.description = Get<std::string>(root, "description", "");
  if (!root["cluster"]) Fail(root, "a scenario needs a cluster");
  scenario.cluster = MakeScenarioCluster(root["cluster"]);
  scenario.config = MakeConfig(root["config"]);
  scenario.now = Get<TimeMs>(root, "now_ms", 0);
  for (const YAML::Node& yaml : ListOf(root, "running")) {
    CheckJobKeys(yaml, {"start_ms", "attained_gpu_s", "allocation"});
    RunningJob job;
    job.spec = MakeSpec(yaml);
    job.start_time = Get<TimeMs>(yaml, "start_ms", 0);
    job.attained_gpu_ms = Get<int64_t>(yaml, "attained_gpu_s", 0) * kMsPerSecond;
    job.allocation = MakeAllocation(scenario.cluster, yaml["allocation"]);
    scenario.running.push_back(std::move(job));
  }
  for (const YAML::Node& yaml : ListOf(root, "pending")) {
    CheckJobKeys(yaml, {"attained_gpu_s", "last_run_end_ms", "preemptions"});
    PendingJob job;
    job.spec = MakeSpec(yaml);
    job.attained_gpu_ms = Get<int64_t>(yaml, "attained_gpu_s", 0) * kMsPerSecond;
    job.last_run_end = Get<TimeMs>(yaml, "last_run_end_ms", -1);
    job.preemptions = Get<int32_t>(yaml, "preemptions", 0);
    scenario.pending.push_back(std::move(job));
  }
  const YAML::Node expect = root["expect"];
  if (!expect) Fail(root, "a scenario needs 'expect'");
  CheckKeys(expect, {"placements", "preemptions", "waiting"});
  for (const YAML::Node& yaml : ListOf(expect, "placements")) {
    CheckKeys(yaml, {"job", "allocation"});
    scenario.expected.placements.push_back(
        {yaml["job"].as<JobId>(), MakeAllocation(scenario.cluster, yaml["allocation"])});
  }
  for (const YAML::Node& yaml : ListOf(expect, "preemptions")) {
    CheckKeys(yaml, {"job", "for", "reason"});
    const auto reason = ParsePreemptReason(Get<std::string>(yaml, "reason", "higher_priority"));
    if (!reason) Fail(yaml, "unknown reason");
    scenario.expected.preemptions.push_back(
        {yaml["job"].as<JobId>(), yaml["for"].as<JobId>(), *reason});
  }
  for (const YAML::Node& yaml : ListOf(expect, "waiting")) {
    CheckKeys(yaml, {"job", "reason"});
    const auto reason = ParseWaitReason(yaml["reason"].as<std::string>());
    if (!reason) Fail(yaml["reason"], "unknown wait reason code");
    scenario.expected.waiting.push_back({yaml["job"].as<JobId>(), *reason, std::nullopt});
  }
  return scenario;
}

// Decisions in the scenario file's own notation, one decision a line, so that a mismatch shows
// as a line diff and the actual text can be pasted into a scenario.
std::string Render(const Cluster& cluster, const Decisions& decisions) {
  auto node_name = [&](int32_t node) {
    return node >= 0 && node < static_cast<int32_t>(cluster.nodes.size())
               ? cluster.nodes[static_cast<size_t>(node)].name
               : fmt::format("<node {}>", node);
  };
  std::string text = "placements:\n";
  for (const Placement& placement : decisions.placements) {
    std::vector<std::string> tasks;
    for (const TaskPlacement& task : placement.allocation) {
      std::vector<std::string> gpus;
      for (const GpuShare& share : task.gpus)
        gpus.push_back(share.milli == kMilliPerGpu
                           ? fmt::format("{}", share.gpu)
                           : fmt::format("\"{}@{}\"", share.gpu, share.milli));
      tasks.push_back(
          fmt::format("{{node: {}, gpus: [{}]}}", node_name(task.node), fmt::join(gpus, ", ")));
    }
    text +=
        fmt::format("  - {{job: {}, allocation: [{}]}}\n", placement.job, fmt::join(tasks, ", "));
  }
  text += "preemptions:\n";
  for (const Preemption& preemption : decisions.preemptions)
    text += fmt::format("  - {{job: {}, for: {}, reason: {}}}\n", preemption.job,
                        preemption.for_job, PreemptReasonCode(preemption.reason));
  text += "waiting:\n";
  for (const Waiting& waiting : decisions.waiting)
    text +=
        fmt::format("  - {{job: {}, reason: {}}}\n", waiting.job, WaitReasonCode(waiting.reason));
  return text;
}

std::vector<fs::path> ScenarioFiles() {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(GPUFLEET_SCENARIO_DIR))
    if (entry.is_regular_file() && entry.path().extension() == ".yaml")
      files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

class ScenarioTest : public testing::TestWithParam<fs::path> {};

TEST_P(ScenarioTest, DecisionsMatchExactly) {
  Scenario scenario;
  try {
    scenario = LoadScenario(GetParam());
  } catch (const std::exception& error) {
    FAIL() << GetParam().filename().string() << ": " << error.what();
  }
  SCOPED_TRACE(GetParam().filename().string() + ": " + scenario.description);
  const Decisions actual =
      Schedule(scenario.cluster, scenario.running, scenario.pending, scenario.now, scenario.config);
  EXPECT_EQ(Render(scenario.cluster, actual), Render(scenario.cluster, scenario.expected));

  // The scenario's own expectation must be realisable: the running jobs that stay plus the
  // placements fit the cluster without double allocation.
  Allocator check(scenario.cluster);
  for (const RunningJob& job : scenario.running) {
    const bool preempted =
        std::any_of(actual.preemptions.begin(), actual.preemptions.end(),
                    [&](const Preemption& preemption) { return preemption.job == job.spec.id; });
    if (!preempted) check.Commit(job.spec, job.allocation);
  }
  for (const Placement& placement : actual.placements) {
    const auto job = std::find_if(scenario.pending.begin(), scenario.pending.end(),
                                  [&](const PendingJob& p) { return p.spec.id == placement.job; });
    ASSERT_NE(job, scenario.pending.end()) << "placed job " << placement.job << " is not pending";
    EXPECT_NO_THROW(check.Commit(job->spec, placement.allocation)) << "job " << placement.job;
  }
}

std::string TestName(const testing::TestParamInfo<fs::path>& info) {
  std::string name = info.param.stem().string();
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return name;
}

INSTANTIATE_TEST_SUITE_P(Files, ScenarioTest, testing::ValuesIn(ScenarioFiles()), TestName);

TEST(ScenarioFiles, DirectoryHoldsTheScenarios) {
  // Guards against a wrong GPUFLEET_SCENARIO_DIR turning the suite into zero tests, and against
  // running a stale list of tests after a scenario was added.
  EXPECT_GE(ScenarioFiles().size(), 15u) << GPUFLEET_SCENARIO_DIR;
  EXPECT_EQ(ScenarioFiles().size(), size_t{GPUFLEET_SCENARIO_COUNT})
      << "scenario files were added or removed since the build: rebuild to run them all";
}

TEST(ScenarioFiles, LoaderRejectsUnknownKeys) {
  const fs::path path = fs::path(testing::TempDir()) / "gpufleet_bad_scenario.yaml";
  {
    std::ofstream out(path);
    out << "cluster: {shape: {nodes: 1}}\npending:\n  - {id: 1, gpu_per_task: 2}\nexpect: {}\n";
  }
  EXPECT_THROW(LoadScenario(path), std::runtime_error);
  fs::remove(path);
}

}  // namespace
}  // namespace gpufleet::sched
