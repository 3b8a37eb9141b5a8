// Replays every scenario file under tests/serving/scenarios through an autoscaler and checks its
// decisions tick by tick.
//
// Scenario file format (YAML; docs/autoscaling.md, "Scenario files", has the same text):
//
//   description: what the scenario shows        # free text, optional
//   policy: kpa                                 # kpa | target-tracking (default kpa)
//   config:                                     # AutoscalerConfig (kpa) or TargetTrackingConfig
//     metric: concurrency                       # field names as in serving/autoscaler.h, each
//     target: 1                                 # optional (the struct's default)
//     max_replicas: 10
//   tick_ms: 2000                               # sample interval and tick (default 2000)
//   initial_ready: 0                            # ready replicas before the first step
//   steps:                                      # in time order
//     - at_ms: 2000                             # first tick of the step
//       until_ms: 10000                         # last tick (default at_ms); one tick per tick_ms
//       concurrency: 3                          # the sample recorded at each tick, covering
//       arrivals: 3                             #   (t - tick_ms, t] (defaults 0)
//       ready: 2                                # ready replicas passed to Decide; absent: the
//                                               #   previous decision's desired (instant replicas)
//       expect: {desired: 3, panicking: false}  # checked at every tick of the step; keys:
//                                               #   desired, desired_at_least, desired_at_most,
//                                               #   panicking
//       expect_last: {desired: 3}               # checked at the step's last tick only
//
// Unknown keys are errors, so that a misspelt key cannot silently turn into a default.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include "serving/autoscaler.h"

namespace gpufleet::serving {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void Fail(const YAML::Node& node, const std::string& message) {
  throw std::runtime_error(
      fmt::format("line {}: {}", node.Mark().line >= 0 ? node.Mark().line + 1 : 0, message));
}

void CheckKeys(const YAML::Node& map, std::initializer_list<std::string_view> allowed) {
  if (!map.IsMap()) Fail(map, "expected a mapping");
  for (const auto& entry : map) {
    const auto key = entry.first.as<std::string>();
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end())
      Fail(entry.first, fmt::format("unknown key '{}'", key));
  }
}

template <typename T>
void Read(const YAML::Node& map, const char* key, T& field) {
  if (const YAML::Node value = map[key]) field = value.as<T>();
}

ScaleMetric ReadMetric(const YAML::Node& map) {
  const YAML::Node value = map["metric"];
  if (!value) return ScaleMetric::kConcurrency;
  const auto metric = ParseScaleMetric(value.as<std::string>());
  if (!metric) Fail(value, "metric must be concurrency or rps");
  return *metric;
}

AutoscalerConfig ReadKpaConfig(const YAML::Node& yaml) {
  CheckKeys(yaml, {"metric", "target", "target_utilization", "min_replicas", "max_replicas",
                   "stable_window_ms", "panic_window_ms", "panic_threshold", "max_scale_up_rate",
                   "max_scale_down_rate", "scale_to_zero_grace_ms", "scale_down_delay_ms"});
  AutoscalerConfig config;
  config.metric = ReadMetric(yaml);
  Read(yaml, "target", config.target);
  Read(yaml, "target_utilization", config.target_utilization);
  Read(yaml, "min_replicas", config.min_replicas);
  Read(yaml, "max_replicas", config.max_replicas);
  Read(yaml, "stable_window_ms", config.stable_window_ms);
  Read(yaml, "panic_window_ms", config.panic_window_ms);
  Read(yaml, "panic_threshold", config.panic_threshold);
  Read(yaml, "max_scale_up_rate", config.max_scale_up_rate);
  Read(yaml, "max_scale_down_rate", config.max_scale_down_rate);
  Read(yaml, "scale_to_zero_grace_ms", config.scale_to_zero_grace_ms);
  Read(yaml, "scale_down_delay_ms", config.scale_down_delay_ms);
  if (auto why = ValidateAutoscalerConfig(config)) Fail(yaml, *why);
  return config;
}

TargetTrackingConfig ReadTargetTrackingConfig(const YAML::Node& yaml) {
  CheckKeys(yaml, {"metric", "target", "min_replicas", "max_replicas", "window_ms",
                   "scale_in_cooldown_ms"});
  TargetTrackingConfig config;
  config.metric = ReadMetric(yaml);
  Read(yaml, "target", config.target);
  Read(yaml, "min_replicas", config.min_replicas);
  Read(yaml, "max_replicas", config.max_replicas);
  Read(yaml, "window_ms", config.window_ms);
  Read(yaml, "scale_in_cooldown_ms", config.scale_in_cooldown_ms);
  if (auto why = ValidateTargetTrackingConfig(config)) Fail(yaml, *why);
  return config;
}

struct Expectation {
  std::optional<int32_t> desired, at_least, at_most;
  std::optional<bool> panicking;
};

Expectation ReadExpectation(const YAML::Node& yaml) {
  CheckKeys(yaml, {"desired", "desired_at_least", "desired_at_most", "panicking"});
  Expectation expectation;
  if (yaml["desired"]) expectation.desired = yaml["desired"].as<int32_t>();
  if (yaml["desired_at_least"]) expectation.at_least = yaml["desired_at_least"].as<int32_t>();
  if (yaml["desired_at_most"]) expectation.at_most = yaml["desired_at_most"].as<int32_t>();
  if (yaml["panicking"]) expectation.panicking = yaml["panicking"].as<bool>();
  return expectation;
}

struct Step {
  TimeMs at_ms = 0, until_ms = 0;
  double concurrency = 0, arrivals = 0;
  std::optional<int32_t> ready;
  std::optional<Expectation> expect, expect_last;
};

struct Scenario {
  std::string description;
  std::variant<AutoscalerConfig, TargetTrackingConfig> config;
  TimeMs tick_ms = 2000;
  int32_t initial_ready = 0;
  std::vector<Step> steps;
};

Scenario LoadScenario(const fs::path& path) {
  const YAML::Node root = YAML::LoadFile(path.string());
  CheckKeys(root, {"description", "policy", "config", "tick_ms", "initial_ready", "steps"});
  Scenario scenario;
  Read(root, "description", scenario.description);
  Read(root, "tick_ms", scenario.tick_ms);
  Read(root, "initial_ready", scenario.initial_ready);
  if (scenario.tick_ms <= 0) Fail(root["tick_ms"], "tick_ms must be above 0");
  std::string policy = "kpa";
  Read(root, "policy", policy);
  const YAML::Node config = root["config"] ? root["config"] : YAML::Node(YAML::NodeType::Map);
  if (policy == "kpa")
    scenario.config = ReadKpaConfig(config);
  else if (policy == "target-tracking")
    scenario.config = ReadTargetTrackingConfig(config);
  else
    Fail(root["policy"], "policy must be kpa or target-tracking");
  if (!root["steps"] || !root["steps"].IsSequence()) Fail(root, "'steps' must be a list");
  TimeMs previous = -1;
  for (const YAML::Node& yaml : root["steps"]) {
    CheckKeys(yaml,
              {"at_ms", "until_ms", "concurrency", "arrivals", "ready", "expect", "expect_last"});
    Step step;
    if (!yaml["at_ms"]) Fail(yaml, "a step needs at_ms");
    step.at_ms = yaml["at_ms"].as<TimeMs>();
    step.until_ms = step.at_ms;
    Read(yaml, "until_ms", step.until_ms);
    if (step.at_ms <= previous || step.until_ms < step.at_ms)
      Fail(yaml, "steps must go forward in time");
    previous = step.until_ms;
    Read(yaml, "concurrency", step.concurrency);
    Read(yaml, "arrivals", step.arrivals);
    if (yaml["ready"]) step.ready = yaml["ready"].as<int32_t>();
    if (yaml["expect"]) step.expect = ReadExpectation(yaml["expect"]);
    if (yaml["expect_last"]) step.expect_last = ReadExpectation(yaml["expect_last"]);
    scenario.steps.push_back(step);
  }
  return scenario;
}

void Check(const Expectation& expectation, const ScaleDecision& decision, TimeMs t) {
  SCOPED_TRACE(fmt::format("t = {} ms: desired {}, panicking {}, stable {:.3f}, panic {:.3f}: {}",
                           t, decision.desired, decision.panicking, decision.stable_value,
                           decision.panic_value, decision.reason));
  if (expectation.desired) {
    EXPECT_EQ(decision.desired, *expectation.desired);
  }
  if (expectation.at_least) {
    EXPECT_GE(decision.desired, *expectation.at_least);
  }
  if (expectation.at_most) {
    EXPECT_LE(decision.desired, *expectation.at_most);
  }
  if (expectation.panicking) {
    EXPECT_EQ(decision.panicking, *expectation.panicking);
  }
}

template <typename Autoscaler>
void Replay(const Scenario& scenario, Autoscaler autoscaler) {
  int32_t ready = scenario.initial_ready;
  for (const Step& step : scenario.steps) {
    for (TimeMs t = step.at_ms; t <= step.until_ms; t += scenario.tick_ms) {
      autoscaler.Record(LoadSample{.time_ms = t,
                                   .interval_ms = scenario.tick_ms,
                                   .concurrency = step.concurrency,
                                   .arrivals = step.arrivals});
      if (step.ready) ready = *step.ready;
      const ScaleDecision decision = autoscaler.Decide(t, ready);
      if (step.expect) Check(*step.expect, decision, t);
      if (step.expect_last && t + scenario.tick_ms > step.until_ms)
        Check(*step.expect_last, decision, t);
      ready = decision.desired;  // the next step's default: replicas follow at once
    }
  }
}

std::vector<fs::path> ScenarioFiles() {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(GPUFLEET_SCENARIO_DIR))
    if (entry.is_regular_file() && entry.path().extension() == ".yaml")
      files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

class AutoscalerScenario : public testing::TestWithParam<fs::path> {};

TEST_P(AutoscalerScenario, DecisionsMatch) {
  Scenario scenario;
  try {
    scenario = LoadScenario(GetParam());
  } catch (const std::exception& error) {
    FAIL() << GetParam().filename().string() << ": " << error.what();
  }
  SCOPED_TRACE(GetParam().filename().string() + ": " + scenario.description);
  if (const auto* kpa = std::get_if<AutoscalerConfig>(&scenario.config))
    Replay(scenario, KpaAutoscaler(*kpa));
  else
    Replay(scenario, TargetTrackingAutoscaler(std::get<TargetTrackingConfig>(scenario.config)));
}

std::string TestName(const testing::TestParamInfo<fs::path>& info) {
  std::string name = info.param.stem().string();
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return name;
}

INSTANTIATE_TEST_SUITE_P(Files, AutoscalerScenario, testing::ValuesIn(ScenarioFiles()), TestName);

TEST(AutoscalerScenarioFiles, DirectoryHoldsTheScenarios) {
  EXPECT_GE(ScenarioFiles().size(), 10u) << GPUFLEET_SCENARIO_DIR;
  EXPECT_EQ(ScenarioFiles().size(), size_t{GPUFLEET_SCENARIO_COUNT})
      << "scenario files were added or removed since the build: rebuild to run them all";
}

TEST(AutoscalerScenarioFiles, LoaderRejectsUnknownKeys) {
  const fs::path path = fs::path(testing::TempDir()) / "gpufleet_bad_autoscaler_scenario.yaml";
  {
    std::ofstream out(path);
    out << "config: {max_replica: 3}\nsteps:\n  - {at_ms: 2000}\n";
  }
  EXPECT_THROW(LoadScenario(path), std::runtime_error);
  fs::remove(path);
}

}  // namespace
}  // namespace gpufleet::serving
