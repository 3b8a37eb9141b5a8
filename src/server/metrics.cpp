#include "server/metrics.h"

#include <algorithm>

#include <fmt/format.h>

namespace gpufleet::server {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double seconds) {
  const size_t bucket = static_cast<size_t>(
      std::lower_bound(bounds_.begin(), bounds_.end(), seconds) - bounds_.begin());
  std::lock_guard lock(mu_);
  ++counts_[bucket];
  sum_ += seconds;
  ++count_;
}

std::string Histogram::Render(const std::string& name, const std::string& help) const {
  std::lock_guard lock(mu_);
  std::string out = fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cumulative);
  }
  cumulative += counts_.back();
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, cumulative);
  out += fmt::format("{}_sum {}\n{}_count {}\n", name, sum_, name, count_);
  return out;
}

std::vector<double> CycleLatencyBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
          0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,    10};
}

std::vector<double> RequestLatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
}

void RequestCounter::Count(const std::string& method, int status) {
  std::lock_guard lock(mu_);
  ++counts_[{method, status}];
}

std::string RequestCounter::Render(const std::string& name, const std::string& help) const {
  std::lock_guard lock(mu_);
  std::string out = fmt::format("# HELP {} {}\n# TYPE {} counter\n", name, help, name);
  for (const auto& [key, count] : counts_)
    out += fmt::format("{}{{method=\"{}\",code=\"{}\"}} {}\n", name, PromLabel(key.first),
                       key.second, count);
  return out;
}

std::string PromLabel(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\' || c == '"') {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace gpufleet::server
