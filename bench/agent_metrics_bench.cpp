// Cost of the agent's /metrics: rendering Prometheus text for a node of 8 simulated H100s (every
// field supported, two jobs per GPU), and one sampling cycle of the simulator, which the sampling
// thread runs every second. Build with -DCMAKE_BUILD_TYPE=Release.
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "agent/gpu_health.h"
#include "agent/gpu_metrics.h"
#include "agent/sim_gpu_backend.h"

namespace gpufleet::agent {
namespace {

constexpr TimeMs kSecond = 1000;

SimGpuLoad Load(double utilization, MiB memory_used_mib = 0,
                std::vector<int32_t> process_ids = {}) {
  SimGpuLoad load;
  load.utilization = utilization;
  load.memory_used_mib = memory_used_mib;
  load.process_ids = std::move(process_ids);
  return load;
}

NodeMetricsSnapshot EightGpuSnapshot(SimGpuBackend& backend) {
  const GpuInventory inventory = backend.Discover();
  GpuHealthTracker tracker;
  NodeMetricsSnapshot snapshot;
  snapshot.hostname = "gpu-node-0042.cluster.example.com";
  snapshot.backend = std::string(backend.Name());
  snapshot.driver_version = backend.DriverVersion();
  for (const GpuInfo& info : inventory.gpus) {
    backend.SetLoad(info.index, Load(0.9, 60'000, {1000 + info.index}));
    GpuMetricsEntry entry;
    entry.info = info;
    entry.sample = backend.Sample(info.index, 60 * kSecond);
    entry.health = tracker.Evaluate(info, entry.sample, {});
    entry.job_ids = {std::to_string(100000 + info.index), std::to_string(200000 + info.index)};
    snapshot.gpus.push_back(std::move(entry));
  }
  return snapshot;
}

void BM_RenderMetrics8Gpus(benchmark::State& state) {
  SimGpuBackend backend(ParseSimGpuSpec("8xH100-80GB"));
  const NodeMetricsSnapshot snapshot = EightGpuSnapshot(backend);
  size_t bytes = 0;
  for (auto _ : state) {
    std::string text = RenderPrometheus(snapshot);
    bytes = text.size();
    benchmark::DoNotOptimize(text);
  }
  state.counters["bytes"] = static_cast<double>(bytes);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}
BENCHMARK(BM_RenderMetrics8Gpus);

void BM_AppendMetrics8GpusReusedBuffer(benchmark::State& state) {
  SimGpuBackend backend(ParseSimGpuSpec("8xH100-80GB"));
  const NodeMetricsSnapshot snapshot = EightGpuSnapshot(backend);
  std::string buffer;
  for (auto _ : state) {
    buffer.clear();
    AppendPrometheus(snapshot, buffer);
    benchmark::DoNotOptimize(buffer);
  }
}
BENCHMARK(BM_AppendMetrics8GpusReusedBuffer);

// One sampling cycle: poll events, sample and evaluate 8 GPUs.
void BM_SimSampleCycle8Gpus(benchmark::State& state) {
  SimGpuBackend backend(ParseSimGpuSpec("8xH100-80GB"));
  const GpuInventory inventory = backend.Discover();
  GpuHealthTracker tracker;
  TimeMs now = 0;
  for (auto _ : state) {
    now += kSecond;
    const std::vector<XidEvent> events = backend.PollEvents(now);
    for (const GpuInfo& info : inventory.gpus) {
      const GpuSample sample = backend.Sample(info.index, now);
      benchmark::DoNotOptimize(tracker.Evaluate(info, sample, events));
    }
  }
}
BENCHMARK(BM_SimSampleCycle8Gpus);

}  // namespace
}  // namespace gpufleet::agent

BENCHMARK_MAIN();
