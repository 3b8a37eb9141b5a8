#include "agent/readiness.h"

#include <utility>
#include <vector>

#include <fmt/format.h>

#include "net/http_client.h"

namespace gpufleet::agent {
namespace {

// Short: a probe that hangs must not hold up the others for long.
constexpr std::chrono::milliseconds kProbeTimeout{1000};

bool Answers(const ReadinessTarget& target) {
  const std::string host =
      target.host.find(':') != std::string::npos ? "[" + target.host + "]" : target.host;
  net::HttpResult result =
      net::HttpGet(fmt::format("http://{}:{}{}", host, target.port, target.path), kProbeTimeout);
  return result.ok() && result.response->status >= 200 && result.response->status < 400;
}

}  // namespace

ReadinessProber::ReadinessProber(std::chrono::milliseconds interval)
    : interval_(interval), thread_([this] { Run(); }) {}

ReadinessProber::~ReadinessProber() {
  Stop();
}

void ReadinessProber::SetTargets(const std::map<std::string, ReadinessTarget>& targets) {
  std::lock_guard lock(mu_);
  bool added = false;
  for (auto it = probes_.begin(); it != probes_.end();) {
    auto wanted = targets.find(it->first);
    if (wanted == targets.end() || !(wanted->second == it->second.target))
      it = probes_.erase(it);
    else
      ++it;
  }
  for (const auto& [id, target] : targets)
    added = probes_.try_emplace(id, Probe{target, false, 0}).second || added;
  if (added) cv_.notify_all();  // probe a new replica now rather than after a full interval
}

bool ReadinessProber::Ready(const std::string& workload_id) const {
  std::lock_guard lock(mu_);
  auto it = probes_.find(workload_id);
  return it != probes_.end() && it->second.ready;
}

bool ReadinessProber::TakeChanged() {
  std::lock_guard lock(mu_);
  return std::exchange(changed_, false);
}

void ReadinessProber::Stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void ReadinessProber::Run() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    std::vector<std::pair<std::string, ReadinessTarget>> round;
    for (const auto& [id, probe] : probes_)
      round.emplace_back(id, probe.target);
    lock.unlock();
    std::vector<bool> answers;
    answers.reserve(round.size());
    for (const auto& [id, target] : round)
      answers.push_back(Answers(target));
    lock.lock();
    for (size_t i = 0; i < round.size(); ++i) {
      auto it = probes_.find(round[i].first);
      if (it == probes_.end() || !(it->second.target == round[i].second)) continue;
      Probe& probe = it->second;
      probe.failures = answers[i] ? 0 : probe.failures + 1;
      const bool ready = answers[i] || (probe.ready && probe.failures < kFailuresToUnready);
      if (ready != probe.ready) {
        probe.ready = ready;
        changed_ = true;
      }
    }
    // Replicas not yet ready are asked more often: their first answer decides a cold start.
    bool waiting = false;
    for (const auto& [id, probe] : probes_)
      waiting = waiting || !probe.ready;
    cv_.wait_for(lock, waiting ? interval_ / 5 : interval_);
  }
}

}  // namespace gpufleet::agent
