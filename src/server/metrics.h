#pragma once

// The few Prometheus instruments the server needs (docs/api.md, "Health and metrics"), rendered in
// the text exposition format. Thread-safe.

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace gpufleet::server {

class Histogram {
 public:
  // Upper bounds in seconds, ascending; +Inf is implied.
  explicit Histogram(std::vector<double> bounds);
  void Observe(double seconds);
  // The _bucket, _sum and _count lines of `name` (HELP and TYPE included).
  std::string Render(const std::string& name, const std::string& help) const;

 private:
  const std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; the last one is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// 0.1 ms to 10 s: a scheduling cycle over a handful of jobs up to one over 100,000.
std::vector<double> CycleLatencyBuckets();
// 1 ms to 10 s: API calls, long polls (up to the heartbeat) included.
std::vector<double> RequestLatencyBuckets();

// Requests by method and status code.
class RequestCounter {
 public:
  void Count(const std::string& method, int status);
  std::string Render(const std::string& name, const std::string& help) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> counts_;
};

// Escapes a label value for the text format.
std::string PromLabel(const std::string& value);

}  // namespace gpufleet::server
