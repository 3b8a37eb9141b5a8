#include "cli/sim_command.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/cluster.h"
#include "core/quantity.h"
#include "sched/policy.h"
#include "serving/autoscaler.h"
#include "sim/queues.h"
#include "sim/report.h"
#include "sim/request_traces.h"
#include "sim/serving_sim.h"
#include "sim/simulator.h"
#include "sim/trace_readers.h"

namespace gpufleet::cli {
namespace {

constexpr int kExitFailure = 1;
constexpr int kExitBadInput = 2;

// Bad flags or input: reported as "error: ..." with exit status 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <typename T, typename Parse>
T ParseChoice(const std::string& what, const std::string& value, Parse parse,
              const std::vector<std::string>& valid) {
  if (std::optional<T> parsed = parse(value)) return *parsed;
  throw UsageError(fmt::format("unknown {} '{}' (valid: {})", what, value, fmt::join(valid, ", ")));
}

// The reader's names plus "alibaba", the short name the docs use for the pod lists.
std::vector<std::string> FormatChoices() {
  std::vector<std::string> names;
  for (std::string_view name : sim::TraceFormatNames())
    names.emplace_back(name);
  names.emplace_back("alibaba");
  return names;
}

std::optional<sim::TraceFormat> ParseFormat(const std::string& name) {
  if (name == "alibaba") return sim::TraceFormat::kAlibabaPods;
  return sim::ParseTraceFormat(name);
}

struct ClusterChoice {
  Cluster cluster;
  std::string description;
  int32_t max_gpus_per_node = 0;
};

ClusterChoice BuildCluster(const SimArgs& args) {
  if (args.nodes_per_rack < 1 || args.racks_per_spine < 1)
    throw UsageError("--nodes-per-rack and --racks-per-spine must be at least 1");
  ClusterChoice choice;
  if (!args.alibaba_nodes.empty()) {
    if (!std::filesystem::is_regular_file(args.alibaba_nodes))
      throw UsageError(fmt::format("cannot read node list '{}': no such file", args.alibaba_nodes));
    try {
      choice.cluster =
          sim::ReadAlibabaNodes(args.alibaba_nodes, args.nodes_per_rack, args.racks_per_spine);
    } catch (const std::invalid_argument& error) {
      throw UsageError(error.what());
    }
    std::map<std::string, int64_t> gpus_by_model;
    for (const Node& node : choice.cluster.nodes) {
      choice.max_gpus_per_node =
          std::max(choice.max_gpus_per_node, static_cast<int32_t>(node.gpus.size()));
      for (const Gpu& gpu : node.gpus)
        ++gpus_by_model[gpu.model];
    }
    std::vector<std::string> models;
    for (const auto& [model, count] : gpus_by_model)
      models.push_back(fmt::format("{} {}", sim::GroupThousands(count), model));
    const auto node_count = static_cast<int64_t>(choice.cluster.nodes.size());
    choice.description = fmt::format(
        "{} node{} from {} ({})", sim::GroupThousands(node_count), node_count == 1 ? "" : "s",
        std::filesystem::path(args.alibaba_nodes).filename().string(),
        models.empty() ? "no GPUs" : fmt::format("{}", fmt::join(models, ", ")));
  } else {
    if (args.nodes < 1 || args.gpus_per_node < 0 || args.gpus_per_island < 1)
      throw UsageError(
          "--nodes and --gpus-per-island must be at least 1, --gpus-per-node at least 0");
    UniformClusterShape shape;
    shape.nodes = args.nodes;
    shape.gpus_per_node = args.gpus_per_node;
    shape.nodes_per_rack = args.nodes_per_rack;
    shape.racks_per_spine = args.racks_per_spine;
    shape.gpus_per_nvlink_island = args.gpus_per_island;
    shape.gpu_model = args.gpu_model;
    choice.cluster = MakeUniformCluster(shape);
    choice.max_gpus_per_node = args.gpus_per_node;
    choice.description = fmt::format("{} node{} x {} {} GPUs (uniform, {} nodes per rack)",
                                     sim::GroupThousands(args.nodes), args.nodes == 1 ? "" : "s",
                                     args.gpus_per_node, args.gpu_model, args.nodes_per_rack);
  }
  if (std::optional<std::string> problem = ValidateCluster(choice.cluster))
    throw UsageError(fmt::format("invalid cluster: {}", *problem));
  return choice;
}

// One simulation to run: the scheduler configuration and how it is described.
struct RunPlan {
  sched::SchedulerConfig config;
  sim::SimOptions options;
  sim::RunDescription description;
};

int64_t FairShareHalfLifeS(const std::string& text) {
  const auto half_life = ParseDurationMs(text);
  if (!half_life || *half_life < kMsPerSecond)
    throw UsageError(fmt::format(
        "--fair-share-half-life '{}': expected a duration of at least 1s, such as 7d or 12h",
        text));
  return *half_life / kMsPerSecond;
}

RunPlan PlanRun(const SimArgs& args, sched::QueueOrder order, const std::string& placement,
                const sim::RunDescription& base, const std::vector<sim::QueueEntry>& queues) {
  RunPlan plan;
  plan.config.order = order;
  plan.config.backfill = args.backfill.empty() ? sched::DefaultBackfill(order)
                                               : ParseChoice<sched::Backfill>(
                                                     "backfill mode", args.backfill,
                                                     sched::ParseBackfill, sched::BackfillNames());
  plan.config.placement = ParseChoice<sched::PlacementPolicy>(
      "placement policy", placement, sched::ParsePlacementPolicy, sched::PlacementPolicyNames());
  plan.config.preempt = args.preempt;
  plan.config.fair_share_half_life_s = FairShareHalfLifeS(args.fair_share_half_life);
  if (!args.las_limits_gpu_s.empty()) plan.config.las_queue_limits_gpu_s = args.las_limits_gpu_s;
  for (const sim::QueueEntry& entry : queues)
    plan.config.queues.push_back(entry.config);

  plan.options.restart_cost_ms = std::llround(args.restart_cost_s * kMsPerSecond);
  plan.options.grace_period_ms = std::llround(args.grace_period_s * kMsPerSecond);
  plan.options.mode =
      ParseChoice<sim::SimMode>("mode", args.mode, sim::ParseSimMode, sim::SimModeNames());
  plan.options.fill_arrived = args.fill_arrived;
  plan.options.fill_shuffle_seed = args.fill_shuffle_seed;
  plan.options.fgd_weight = ParseChoice<sched::WorkloadWeight>(
      "FGD weight", args.fgd_weight, sched::ParseWorkloadWeight, sched::WorkloadWeightNames());
  if (args.estimates.empty()) {
    // SJF and EASY backfill rank and reserve by run time; without an estimate they degrade to
    // FIFO order, so they get the oracle unless told otherwise.
    const bool needs_estimates =
        order == sched::QueueOrder::kSjf || plan.config.backfill == sched::Backfill::kEasy;
    plan.options.estimates = needs_estimates ? sim::Estimates::kOracle : sim::Estimates::kNone;
  } else {
    plan.options.estimates = ParseChoice<sim::Estimates>(
        "estimates source", args.estimates, sim::ParseEstimates, sim::EstimatesNames());
  }

  plan.description = base;
  plan.description.policy = sched::Name(order);
  plan.description.backfill = sched::Name(plan.config.backfill);
  plan.description.placement = sched::Name(plan.config.placement);
  plan.description.preempt = plan.config.preempt;
  plan.description.estimates = sim::Name(plan.options.estimates);
  plan.description.las_queue_limits_gpu_s = plan.config.las_queue_limits_gpu_s;
  plan.description.restart_cost_s = args.restart_cost_s;
  plan.description.grace_period_s = args.grace_period_s;
  plan.description.fair_share_half_life_s = plan.config.fair_share_half_life_s;
  return plan;
}

void CheckNumbers(const SimArgs& args) {
  if (args.restart_cost_s < 0 || !std::isfinite(args.restart_cost_s))
    throw UsageError("--restart-cost must be a non-negative number of seconds");
  if (args.grace_period_s < 0 || !std::isfinite(args.grace_period_s))
    throw UsageError("--grace-period must be a non-negative number of seconds");
  if (args.load && !(*args.load > 0 && std::isfinite(*args.load)))
    throw UsageError("--load must be a positive factor");
  if (args.limit < 0) throw UsageError("--limit must not be negative");
  if (args.fill_arrived < 0 || !std::isfinite(args.fill_arrived))
    throw UsageError("--arrived must be a non-negative fraction of the usable GPUs");
  int64_t previous = 0;
  for (int64_t limit : args.las_limits_gpu_s) {
    if (limit <= previous)
      throw UsageError("--las-limits must be positive GPU-seconds in increasing order");
    previous = limit;
  }
}

std::string PlotTitle(const sim::SimReport& first, size_t runs, const std::string& policies) {
  const std::string trace = std::filesystem::path(first.run.trace).filename().string();
  return fmt::format("{} on {} GPUs: {}{}", trace, sim::GroupThousands(first.usable_gpus), policies,
                     runs == 1 ? fmt::format(" (backfill {})", first.run.backfill) : "");
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (out) out << text;
  if (!out) throw std::runtime_error(fmt::format("cannot write '{}'", path));
}

TimeMs DurationFlag(const char* flag, const std::string& text) {
  const auto ms = ParseDurationMs(text);
  if (!ms || *ms < 0)
    throw UsageError(
        fmt::format("{} '{}': expected a duration such as 30s, 500ms or 2m", flag, text));
  return *ms;
}

// Flags that only mean something for one of the two replays.
void CheckServingFlagsUnused(const CLI::App& command) {
  for (const char* flag : {"--requests",
                           "--request-format",
                           "--target",
                           "--metric",
                           "--target-utilization",
                           "--min-replicas",
                           "--max-replicas",
                           "--stable-window",
                           "--panic-window",
                           "--panic-threshold",
                           "--max-scale-up-rate",
                           "--max-scale-down-rate",
                           "--scale-to-zero-grace",
                           "--scale-down-delay",
                           "--scale-in-cooldown",
                           "--tick",
                           "--cold-start",
                           "--replica-concurrency",
                           "--gpus-per-replica",
                           "--slo",
                           "--prefill-ms-per-1k-tokens",
                           "--decode-ms-per-token"}) {
    if (command.count(flag) > 0)
      throw UsageError(fmt::format("{} applies to --serving only", flag));
  }
}

// The job replay's flags mean nothing to the serving replay: refused rather than ignored.
void CheckJobFlagsUnused(const CLI::App& command) {
  for (const char* flag :
       {"--format",          "--nodes",          "--gpus-per-node",   "--gpu-model",
        "--gpus-per-island", "--nodes-per-rack", "--racks-per-spine", "--alibaba-nodes",
        "--policy",          "--backfill",       "--placement",       "--preempt",
        "--las-limits",      "--restart-cost",   "--grace-period",    "--fair-share-half-life",
        "--estimates",       "--mode",           "--arrived",         "--shuffle",
        "--fgd-weight",      "--load",           "--queues",          "--queue-by",
        "--limit",           "--compare"}) {
    if (command.count(flag) > 0)
      throw UsageError(fmt::format("{} applies to job traces, not to --serving", flag));
  }
}

sim::ServingOptions ServingOptionsFrom(const SimArgs& args) {
  sim::ServingOptions options;
  serving::AutoscalerConfig& a = options.autoscaler;
  a.metric = ParseChoice<serving::ScaleMetric>("metric", args.metric, serving::ParseScaleMetric,
                                               serving::ScaleMetricNames());
  if (args.replica_concurrency < 1) throw UsageError("--replica-concurrency must be at least 1");
  if (args.gpus_per_replica < 1) throw UsageError("--gpus-per-replica must be at least 1");
  a.target = args.target ? *args.target : static_cast<double>(args.replica_concurrency);
  a.target_utilization = args.target_utilization;
  a.min_replicas = args.min_replicas;
  a.max_replicas = args.max_replicas;
  a.stable_window_ms = DurationFlag("--stable-window", args.stable_window);
  a.panic_window_ms = DurationFlag("--panic-window", args.panic_window);
  a.panic_threshold = args.panic_threshold;
  a.max_scale_up_rate = args.max_scale_up_rate;
  a.max_scale_down_rate = args.max_scale_down_rate;
  a.scale_to_zero_grace_ms = DurationFlag("--scale-to-zero-grace", args.scale_to_zero_grace);
  a.scale_down_delay_ms = DurationFlag("--scale-down-delay", args.scale_down_delay);
  options.scale_in_cooldown_ms = DurationFlag("--scale-in-cooldown", args.scale_in_cooldown);
  options.tick_ms = DurationFlag("--tick", args.tick);
  options.cold_start_ms = DurationFlag("--cold-start", args.cold_start);
  options.replica_concurrency = args.replica_concurrency;
  options.gpus_per_replica = args.gpus_per_replica;
  options.slo_ms = DurationFlag("--slo", args.slo);
  if (auto why = sim::ValidateServingOptions(options)) throw UsageError(*why);
  return options;
}

int RunServing(const SimArgs& args) {
  const sim::ServingOptions options = ServingOptionsFrom(args);
  const sim::RequestFormat format = ParseChoice<sim::RequestFormat>(
      "request format", args.request_format, sim::ParseRequestFormat, sim::RequestFormatNames());
  if (args.requests.empty()) throw UsageError("--serving needs --requests PATH");
  if (!std::filesystem::is_regular_file(args.requests))
    throw UsageError(fmt::format("cannot read request trace '{}': no such file", args.requests));
  const sim::LlmServiceModel llm{.prefill_ms_per_1k_tokens = args.prefill_ms_per_1k_tokens,
                                 .decode_ms_per_token = args.decode_ms_per_token};
  if (!(llm.prefill_ms_per_1k_tokens >= 0) || !(llm.decode_ms_per_token >= 0) ||
      !std::isfinite(llm.prefill_ms_per_1k_tokens) || !std::isfinite(llm.decode_ms_per_token))
    throw UsageError("--prefill-ms-per-1k-tokens and --decode-ms-per-token must be non-negative");
  if (!args.plot.empty()) {
    std::ofstream probe(args.plot, std::ios::app);
    if (!probe) throw UsageError(fmt::format("cannot write the plot to '{}'", args.plot));
  }
  const sim::RequestTrace trace =
      sim::ReadRequestTrace(args.requests, format, llm, args.skip_invalid);
  if (trace.requests.empty()) throw UsageError("the request trace has no requests to replay");
  for (const std::string& example : trace.skip_examples)
    fmt::print(stderr, "skipped: {}\n", example);

  sim::ServingReport report;
  report.trace = args.requests;
  report.format = std::string(sim::RequestFormatName(format));
  report.requests = static_cast<int64_t>(trace.requests.size());
  report.deployments = static_cast<int64_t>(trace.deployments.size());
  report.failed_replayed = trace.failed_replayed;
  report.unfinished_skipped = trace.unfinished_skipped;
  report.skipped_invalid = trace.skipped_invalid;
  report.span_ms = trace.requests.back().arrival_ms;
  report.llm = llm;
  report.options = options;
  for (sim::ServingPolicy policy : sim::AllServingPolicies()) {
    const auto started = std::chrono::steady_clock::now();
    sim::ServingPolicyResult result = sim::SimulateServing(trace, policy, options);
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - started;
    result.wall_time_s = took.count();
    report.policies.push_back(std::move(result));
  }
  if (args.json) {
    fmt::print("{}\n", sim::ToJson(report).dump(2));
  } else {
    fmt::print("{}", sim::FormatServingReport(report));
  }
  if (!args.plot.empty()) {
    const std::string name = std::filesystem::path(args.requests).filename().string();
    WriteFile(args.plot,
              sim::RenderServingSvg(report, fmt::format("{}: replicas, kpa vs target-tracking vs "
                                                        "fixed-at-peak",
                                                        name)));
    if (!args.json) fmt::print("plot written to {}\n", args.plot);
  }
  return 0;
}

int Run(const SimArgs& args) {
  if (args.serving) {
    if (!args.trace.empty()) throw UsageError("--serving replays --requests, not --trace");
    if (args.command != nullptr) CheckJobFlagsUnused(*args.command);
    return RunServing(args);
  }
  if (args.command != nullptr) CheckServingFlagsUnused(*args.command);
  if (args.trace.empty()) throw UsageError("--trace is required (or --serving --requests PATH)");
  CheckNumbers(args);
  // Parse every choice before the (slow) trace read so that typos fail fast.
  const sched::QueueOrder order = ParseChoice<sched::QueueOrder>(
      "policy", args.policy, sched::ParseQueueOrder, sched::QueueOrderNames());
  std::optional<sim::TraceFormat> format;
  if (args.format != "detect") {
    format =
        ParseChoice<sim::TraceFormat>("trace format", args.format, ParseFormat, FormatChoices());
  }
  (void)PlanRun(args, order, args.placement, {}, {});  // validates backfill, placement, estimates
  const sim::SimMode mode =
      ParseChoice<sim::SimMode>("mode", args.mode, sim::ParseSimMode, sim::SimModeNames());
  if (!args.plot.empty() && mode == sim::SimMode::kFill)
    throw UsageError("--plot draws a replay over time; fill mode has no time axis");

  if (!args.plot.empty()) {
    // Fail before a long run rather than after it. Appending creates the file without
    // truncating one that exists; the real write replaces it.
    const std::filesystem::path parent = std::filesystem::path(args.plot).parent_path();
    std::error_code ignored;  // the open below reports what matters
    if (!parent.empty()) std::filesystem::create_directories(parent, ignored);
    std::ofstream probe(args.plot, std::ios::app);
    if (!probe) throw UsageError(fmt::format("cannot write the plot to '{}'", args.plot));
  }

  ClusterChoice cluster = BuildCluster(args);
  if (!std::filesystem::is_regular_file(args.trace))
    throw UsageError(fmt::format("cannot read trace '{}': no such file", args.trace));
  sim::ReadOptions read_options;
  read_options.skip_invalid = args.skip_invalid;
  read_options.gpus_per_node = std::max(1, cluster.max_gpus_per_node);
  read_options.limit = args.limit;
  const sim::TraceFormat used_format = format ? *format : sim::DetectTraceFormat(args.trace);
  sim::Trace trace;
  try {
    trace = sim::ReadTrace(args.trace, used_format, read_options);
  } catch (const std::invalid_argument& error) {  // options out of range
    throw UsageError(error.what());
  }

  // Team queues: every job goes to one, before anything else looks at the jobs.
  std::vector<sim::QueueEntry> queues;
  if (!args.queues.empty()) {
    if (mode == sim::SimMode::kFill) throw UsageError("--queues applies to replay mode only");
    const auto queue_by = sim::ParseQueueBy(args.queue_by);
    if (!queue_by)
      throw UsageError(
          fmt::format("unknown --queue-by '{}': vc, user, round-robin", args.queue_by));
    try {
      queues = sim::LoadQueuesFile(args.queues);
      sim::AssignQueues(trace, queues, *queue_by);
    } catch (const sim::QueuesError& error) {
      throw UsageError(error.what());
    }
  }

  sim::RunDescription base;
  base.queues_file = args.queues;
  base.queue_by = args.queues.empty() ? "" : args.queue_by;
  base.trace = trace.source.empty() ? args.trace : trace.source;
  base.trace_format = std::string(sim::TraceFormatName(used_format));
  base.cluster = cluster.description;
  base.nodes = static_cast<int64_t>(cluster.cluster.nodes.size());
  base.skipped_invalid = trace.skipped;
  try {
    base.skipped_infeasible = sim::RemoveInfeasibleJobs(cluster.cluster, trace, args.skip_invalid);
  } catch (const sim::TraceError& error) {
    throw sim::TraceError(fmt::format("{} (--skip-invalid skips such jobs)", error.what()));
  }
  // On stderr, so that --json output stays clean.
  for (const std::string& example : trace.skip_examples)
    fmt::print(stderr, "skipped: {}\n", example);

  if (args.load) {
    const double offered = sim::OfferedLoad(trace, cluster.cluster.UsableGpus());
    if (offered <= 0)
      throw UsageError(
          "--load needs a trace whose jobs arrive over a time span on a cluster with GPUs");
    base.offered_load = offered;
    base.target_load = *args.load;
    base.arrival_scale = offered / *args.load;
    sim::ScaleSubmitTimes(trace, base.arrival_scale);
  }

  // What --compare varies: the queue order in a replay; in fill mode, where pods arrive one at a
  // time and the order cannot matter, the placement policy (the point of the FGD experiment).
  std::vector<std::pair<sched::QueueOrder, std::string>> variants = {{order, args.placement}};
  if (args.compare) {
    variants.clear();
    if (mode == sim::SimMode::kFill) {
      for (const std::string& placement : sched::PlacementPolicyNames())
        variants.emplace_back(order, placement);
    } else {
      for (const std::string& name : sched::QueueOrderNames())
        variants.emplace_back(*sched::ParseQueueOrder(name), args.placement);
    }
  }
  std::vector<sim::SimReport> reports;
  for (const auto& [run_order, placement] : variants) {
    RunPlan plan = PlanRun(args, run_order, placement, base, queues);
    const auto started = std::chrono::steady_clock::now();
    sim::SimResult result = sim::Simulate(cluster.cluster, trace, plan.config, plan.options);
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - started;
    sim::SimReport report = sim::MakeReport(result, std::move(plan.description));
    report.wall_time_s = took.count();
    reports.push_back(std::move(report));
  }

  if (args.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const sim::SimReport& report : reports)
      out.push_back(sim::ToJson(report));
    fmt::print("{}\n", (args.compare ? out : out.front()).dump(2));
  } else {
    fmt::print("{}",
               args.compare ? sim::FormatComparison(reports) : sim::FormatReport(reports.front()));
  }
  if (!args.plot.empty()) {
    std::vector<std::string> names;
    for (const sim::SimReport& report : reports)
      names.push_back(report.run.policy);
    WriteFile(args.plot,
              sim::RenderSvg(reports, PlotTitle(reports.front(), reports.size(),
                                                fmt::format("{}", fmt::join(names, " vs ")))));
    if (!args.json) fmt::print("plot written to {}\n", args.plot);
  }
  return 0;
}

}  // namespace

CLI::App* AddSimCommand(CLI::App& app, SimArgs& args) {
  CLI::App* sim = app.add_subcommand(
      "sim", "Replay a job trace on a simulated cluster and report JCT, queueing and utilisation");
  sim->add_option("--trace", args.trace, "Trace file (CSV); required unless --serving");
  sim->add_option("--format", args.format,
                  fmt::format("Trace format: detect, {}", fmt::join(FormatChoices(), ", ")))
      ->capture_default_str();

  sim->add_option("--nodes", args.nodes, "Uniform cluster: number of nodes")->capture_default_str();
  sim->add_option("--gpus-per-node", args.gpus_per_node, "Uniform cluster: GPUs per node")
      ->capture_default_str();
  sim->add_option("--gpu-model", args.gpu_model, "Uniform cluster: GPU model")
      ->capture_default_str();
  sim->add_option("--gpus-per-island", args.gpus_per_island,
                  "Uniform cluster: GPUs per NVLink island")
      ->capture_default_str();
  sim->add_option("--nodes-per-rack", args.nodes_per_rack, "Nodes per rack (leaf switch)")
      ->capture_default_str();
  sim->add_option("--racks-per-spine", args.racks_per_spine, "Racks per spine switch")
      ->capture_default_str();
  CLI::Option* alibaba_nodes = sim->add_option(
      "--alibaba-nodes", args.alibaba_nodes,
      "Cluster from an Alibaba v2023 node list (sn,cpu_milli,memory_mib,gpu,model) instead of a "
      "uniform shape");
  for (const char* uniform_only :
       {"--nodes", "--gpus-per-node", "--gpu-model", "--gpus-per-island"})
    alibaba_nodes->excludes(uniform_only);

  sim->add_option("--policy", args.policy,
                  fmt::format("Queue order: {}", fmt::join(sched::QueueOrderNames(), ", ")))
      ->capture_default_str();
  std::vector<std::string> backfill_defaults;
  for (const std::string& name : sched::QueueOrderNames()) {
    backfill_defaults.push_back(fmt::format(
        "{} for {}", sched::Name(sched::DefaultBackfill(*sched::ParseQueueOrder(name))), name));
  }
  sim->add_option("--backfill", args.backfill,
                  fmt::format("Backfill: {} (default: {})", fmt::join(sched::BackfillNames(), ", "),
                              fmt::join(backfill_defaults, ", ")));
  sim->add_option("--placement", args.placement,
                  fmt::format("Placement: {}", fmt::join(sched::PlacementPolicyNames(), ", ")))
      ->capture_default_str();
  sim->add_flag("--preempt", args.preempt,
                "Let pending jobs preempt lower-ranked running jobs (las always preempts)");
  sim->add_option("--las-limits", args.las_limits_gpu_s,
                  "LAS queue limits in GPU-seconds, comma separated (default 3200)")
      ->delimiter(',');
  sim->add_option("--restart-cost", args.restart_cost_s,
                  "Seconds added to a job's remaining run time at each preemption")
      ->capture_default_str();
  sim->add_option("--grace-period", args.grace_period_s,
                  "Seconds a preempted job keeps its GPUs to checkpoint: a job placed on them "
                  "starts that much later")
      ->capture_default_str();
  sim->add_option("--fair-share-half-life", args.fair_share_half_life,
                  "fairshare: half-life of past GPU usage, such as 7d or 12h (Slurm's "
                  "PriorityDecayHalfLife)")
      ->capture_default_str();
  sim->add_option("--estimates", args.estimates,
                  "Runtime estimates: none, oracle (default: oracle for sjf and easy backfill)");
  sim->add_option("--mode", args.mode,
                  "replay: arrivals and completions; fill: place pods until a GPU pod fails (FGD)")
      ->capture_default_str();
  sim->add_option("--arrived", args.fill_arrived,
                  "Fill mode, the FGD paper's measure: skip pods that do not fit and stop once the "
                  "arrived pods asked for this many times the usable GPUs (1 = 100 %); 0 stops at "
                  "the first GPU pod that does not fit")
      ->capture_default_str();
  sim->add_option("--shuffle", args.fill_shuffle_seed,
                  "Fill mode: shuffle the pod list with this seed on every pass (0: file order)")
      ->capture_default_str();
  sim->add_option("--fgd-weight", args.fgd_weight,
                  "How FGD weighs the trace's task shapes into its target workload: tasks (the "
                  "paper's popularity), gpus (a task of k whole GPUs counts k times)")
      ->capture_default_str();
  sim->add_option_function<double>(
      "--load", [&args](double load) { args.load = load; },
      "Scale inter-arrival times so that the offered load becomes this factor");
  sim->add_option(
      "--queues", args.queues,
      "Team queues with guaranteed GPU quotas (YAML list; docs/sim.md, docs/quotas.md)");
  sim->add_option("--queue-by", args.queue_by,
                  "How trace jobs map to queues: vc (the trace's virtual cluster; user is the "
                  "same column), round-robin")
      ->capture_default_str();
  sim->add_flag("--skip-invalid", args.skip_invalid,
                "Skip malformed rows and jobs that can never fit the cluster, and count them");
  sim->add_option("--limit", args.limit, "Read at most this many jobs");
  sim->add_flag("--json", args.json, "Print the report as JSON");
  sim->add_option("--plot", args.plot, "Write an SVG plot of allocated GPUs and queue length");
  sim->add_flag("--compare", args.compare,
                "Run every queue order (fill mode: every placement) on the same input and print "
                "one row each");

  const char* kServing = "Serving replay (--serving)";
  sim->add_flag("--serving", args.serving,
                "Replay an inference request trace (--requests) under kpa, target-tracking and "
                "fixed-at-peak autoscaling (docs/autoscaling.md)")
      ->group(kServing);
  sim->add_option("--requests", args.requests, "Request trace file (CSV)")->group(kServing);
  sim->add_option("--request-format", args.request_format,
                  "genai (Alibaba GenAI lora_request_trace.csv), azure (Azure LLM 2023)")
      ->capture_default_str()
      ->group(kServing);
  sim->add_option_function<double>(
         "--target", [&args](double target) { args.target = target; },
         "Autoscaling target per replica (in-flight requests, or requests/s); default: "
         "--replica-concurrency")
      ->group(kServing);
  sim->add_option("--metric", args.metric, "Autoscaling metric: concurrency, rps")
      ->capture_default_str()
      ->group(kServing);
  sim->add_option("--target-utilization", args.target_utilization,
                  "Fraction of the target to aim for (Knative's target percentage)")
      ->capture_default_str()
      ->group(kServing);
  sim->add_option("--min-replicas", args.min_replicas, "Per deployment")
      ->capture_default_str()
      ->group(kServing);
  sim->add_option("--max-replicas", args.max_replicas, "Per deployment")
      ->capture_default_str()
      ->group(kServing);
  sim->add_option("--stable-window", args.stable_window, "KPA stable window")
      ->capture_default_str()
      ->group(kServing);
  sim->add_option("--panic-window", args.panic_window, "KPA panic window")
      ->capture_default_str()
      ->group(kServing);
  sim->add_option("--panic-threshold", args.panic_threshold,
                  "Panic when the panic window wants this many times the ready replicas")
      ->capture_default_str()
      ->group(kServing);
  sim->add_option("--max-scale-up-rate", args.max_scale_up_rate, "At most this x ready per tick")
      ->capture_default_str()
      ->group(kServing);
  sim->add_option("--max-scale-down-rate", args.max_scale_down_rate,
                  "At least ready / this per tick")
      ->capture_default_str()
      ->group(kServing);
  sim->add_option("--scale-to-zero-grace", args.scale_to_zero_grace,
                  "KPA: the last replica stays this long once nothing is wanted")
      ->capture_default_str()
      ->group(kServing);
  sim->add_option("--scale-down-delay", args.scale_down_delay,
                  "KPA: scale down to the highest desire of this past window")
      ->capture_default_str()
      ->group(kServing);
  sim->add_option("--scale-in-cooldown", args.scale_in_cooldown,
                  "target-tracking: no scale-in sooner than this after a change")
      ->capture_default_str()
      ->group(kServing);
  sim->add_option("--tick", args.tick, "Autoscaler tick")->capture_default_str()->group(kServing);
  sim->add_option("--cold-start", args.cold_start,
                  "Time from starting a replica to serving (image, server, model weights); GPUs "
                  "are held from the start")
      ->capture_default_str()
      ->group(kServing);
  sim->add_option("--replica-concurrency", args.replica_concurrency,
                  "Requests a replica serves at once; more wait at the gateway")
      ->capture_default_str()
      ->group(kServing);
  sim->add_option("--gpus-per-replica", args.gpus_per_replica, "GPUs each replica holds")
      ->capture_default_str()
      ->group(kServing);
  sim->add_option("--slo", args.slo, "Latency objective: requests slower than this are counted")
      ->capture_default_str()
      ->group(kServing);
  sim->add_option("--prefill-ms-per-1k-tokens", args.prefill_ms_per_1k_tokens,
                  "azure: service time per 1,000 context tokens")
      ->capture_default_str()
      ->group(kServing);
  sim->add_option("--decode-ms-per-token", args.decode_ms_per_token,
                  "azure: service time per generated token")
      ->capture_default_str()
      ->group(kServing);
  args.command = sim;
  return sim;
}

int RunSim(const SimArgs& args) {
  try {
    return Run(args);
  } catch (const UsageError& error) {
    fmt::print(stderr, "error: {}\n", error.what());
    return kExitBadInput;
  } catch (const sim::TraceError& error) {
    fmt::print(stderr, "error: {}\n", error.what());
    return kExitBadInput;
  } catch (const sim::SimError& error) {
    fmt::print(stderr, "error: simulation failed: {}\n", error.what());
    return kExitFailure;
  } catch (const std::exception& error) {
    fmt::print(stderr, "error: {}\n", error.what());
    return kExitFailure;
  }
}

}  // namespace gpufleet::cli
