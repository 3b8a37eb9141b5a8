#pragma once

// Readiness probes of a deployment's replicas (docs/serving.md): a thread that asks each
// replica's readiness path on its port, as a kubelet's HTTP readiness probe does, so that the
// server publishes an endpoint only once the model server answers. A replica is ready after one
// answer in 200-399 and stops being ready after kFailuresToUnready failures in a row.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>

namespace gpufleet::agent {

struct ReadinessTarget {
  std::string host;  // the node's address: where gateways reach the replica
  int32_t port = 0;
  std::string path;  // "/health"
  friend bool operator==(const ReadinessTarget&, const ReadinessTarget&) = default;
};

class ReadinessProber {
 public:
  explicit ReadinessProber(std::chrono::milliseconds interval = std::chrono::milliseconds(500));
  ~ReadinessProber();  // Stop()
  ReadinessProber(const ReadinessProber&) = delete;
  ReadinessProber& operator=(const ReadinessProber&) = delete;

  // What to probe now, by workload id: new ones start not ready, dropped ones are forgotten.
  void SetTargets(const std::map<std::string, ReadinessTarget>& targets);
  bool Ready(const std::string& workload_id) const;
  // Whether any workload's readiness changed since the last call (which clears it).
  bool TakeChanged();
  void Stop();

  static constexpr int kFailuresToUnready = 3;

 private:
  void Run();

  const std::chrono::milliseconds interval_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  struct Probe {
    ReadinessTarget target;
    bool ready = false;
    int failures = 0;
  };
  std::map<std::string, Probe> probes_;
  bool changed_ = false;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace gpufleet::agent
