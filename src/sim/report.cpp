#include "sim/report.h"

#include <algorithm>
#include <array>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace gpufleet::sim {
namespace {

constexpr double kSecondsPerHour = 3600.0;

double Mean(const std::vector<double>& values) {
  if (values.empty()) return 0;
  double sum = 0;
  for (double v : values)
    sum += v;
  return sum / static_cast<double>(values.size());
}

double Seconds(TimeMs ms) {
  return static_cast<double>(ms) / kMsPerSecond;
}

std::string Percent(double fraction) {
  return fmt::format("{:.1f} %", fraction * 100);
}

// 5727.97 -> "5,727.97".
std::string GroupedDecimal(double value, int decimals) {
  const std::string text = fmt::format("{:.{}f}", value, decimals);
  const size_t point = text.find('.');
  const std::string integer = text.substr(0, point);
  const bool negative = !integer.empty() && integer.front() == '-';
  std::string grouped = GroupThousands(std::stoll(negative ? integer.substr(1) : integer));
  if (negative) grouped = "-" + grouped;
  return point == std::string::npos ? grouped : grouped + text.substr(point);
}

std::string PolicyLine(const RunDescription& run) {
  std::string line =
      fmt::format("{}, backfill {}, placement {}", run.policy, run.backfill, run.placement);
  if (run.policy == "las") {
    line += fmt::format(", queue limits {} GPU-s", fmt::join(run.las_queue_limits_gpu_s, "/"));
  }
  if (run.policy == "las") {
    line += ", preemptive";  // LAS preempts by design, with or without --preempt
  } else {
    line += run.preempt ? ", preemption on" : ", preemption off";
  }
  line += fmt::format(", estimates {}, restart cost {:g} s", run.estimates, run.restart_cost_s);
  if (run.grace_period_s > 0) line += fmt::format(", grace period {:g} s", run.grace_period_s);
  if (run.policy == "fairshare")
    line += fmt::format(", usage half-life {}",
                        FormatDuration(static_cast<double>(run.fair_share_half_life_s)));
  return line;
}

// Key/value lines with the keys padded to one width.
class Lines {
 public:
  void Add(std::string key, std::string value) {
    rows_.emplace_back(std::move(key), std::move(value));
  }
  void Blank() { rows_.emplace_back("", ""); }
  std::string Render() const {
    size_t width = 0;
    for (const auto& [key, value] : rows_)
      width = std::max(width, key.size());
    std::string out;
    for (const auto& [key, value] : rows_) {
      if (key.empty() && value.empty()) {
        out += '\n';
        continue;
      }
      out += fmt::format("{:<{}}  {}\n", key, width, value);
    }
    return out;
  }

 private:
  std::vector<std::pair<std::string, std::string>> rows_;
};

// `comparison`: the runs differ in queue order, backfill and estimates, which the rows show.
void AddHeader(Lines& lines, const SimReport& report, bool comparison) {
  const RunDescription& run = report.run;
  const char* unit = report.mode == SimMode::kFill ? "pod" : "job";
  std::string trace =
      fmt::format("{} ({}, {} {}{})", run.trace, run.trace_format,
                  GroupThousands(report.jobs_total), unit, report.jobs_total == 1 ? "" : "s");
  lines.Add("trace", trace);
  if (report.jobs_skipped > 0) {
    lines.Add("skipped", fmt::format("{} invalid row(s), {} job(s) that can never fit",
                                     GroupThousands(run.skipped_invalid),
                                     GroupThousands(run.skipped_infeasible)));
  }
  lines.Add("cluster",
            fmt::format("{}, {} usable GPUs", run.cluster, GroupThousands(report.usable_gpus)));
  if (comparison && report.mode == SimMode::kFill) {
    lines.Add("policy", fmt::format("{}; placement per row", run.policy));
  } else if (comparison) {
    lines.Add("policy", fmt::format("placement {}, {}, restart cost {:g} s; queue order, backfill "
                                    "and estimates per row",
                                    run.placement,
                                    run.preempt ? "preemption on" : "preemption off (las preempts)",
                                    run.restart_cost_s));
  } else {
    lines.Add("policy", PolicyLine(run));
  }
  lines.Add("mode", Name(report.mode));
  if (run.target_load) {
    lines.Add("load",
              fmt::format("offered {:.3f}, target {:.3f}: inter-arrival times x {:.4f}",
                          run.offered_load.value_or(0), *run.target_load, run.arrival_scale));
  }
}

// A column of durations in one unit, so that rows compare at a glance.
struct DurationUnit {
  const char* name;
  double seconds;
};

DurationUnit UnitFor(double max_seconds) {
  if (max_seconds < 120) return {"s", 1};
  if (max_seconds < 2 * kSecondsPerHour) return {"min", 60};
  return {"h", kSecondsPerHour};
}

}  // namespace

std::string XmlEscape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// A round step (1, 2 or 5 times a power of ten) giving about `target` intervals over [0, max].
double NiceStep(double max, int target) {
  if (max <= 0) return 1;
  const double raw = max / target;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double normalized = raw / magnitude;
  double step = 10;
  if (normalized < 1.5) {
    step = 1;
  } else if (normalized < 3) {
    step = 2;
  } else if (normalized < 7) {
    step = 5;
  }
  return step * magnitude;
}

std::string TickLabel(double value) {
  if (std::abs(value) >= 1e6) return fmt::format("{:.3g}", value);
  return fmt::format("{:g}", value);
}

namespace {

constexpr std::array<const char*, 6> kPalette = {"#1f77b4", "#d62728", "#2ca02c",
                                                 "#9467bd", "#ff7f0e", "#8c564b"};

struct Panel {
  double top = 0;
  double height = 0;
  double y_max = 1;
  double y_step = 1;
};

}  // namespace

const char* SvgColor(size_t index) {
  return kPalette[index % kPalette.size()];
}

double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(sorted.size() - 1);
  const auto below = static_cast<size_t>(std::floor(rank));
  const size_t above = std::min(below + 1, sorted.size() - 1);
  const double weight = rank - static_cast<double>(below);
  return sorted[below] + (sorted[above] - sorted[below]) * weight;
}

std::string FormatDuration(double seconds) {
  if (seconds < 120) return fmt::format("{:.1f} s", seconds);
  if (seconds < 2 * kSecondsPerHour) return fmt::format("{:.1f} min", seconds / 60);
  return GroupedDecimal(seconds / kSecondsPerHour, 2) + " h";
}

std::string GroupThousands(int64_t value) {
  std::string digits = std::to_string(value < 0 ? -value : value);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return value < 0 ? "-" + out : out;
}

double JainIndex(std::span<const double> values) {
  double sum = 0;
  double squares = 0;
  for (double value : values) {
    sum += value;
    squares += value * value;
  }
  if (values.empty() || squares <= 0) return 0;
  return sum * sum / (static_cast<double>(values.size()) * squares);
}

namespace {

// Columns padded to their widest cell: the first left-aligned, the others right-aligned.
std::string RenderTable(const std::vector<std::vector<std::string>>& table) {
  std::vector<size_t> widths(table.front().size(), 0);
  for (const auto& row : table)
    for (size_t c = 0; c < row.size(); ++c)
      widths[c] = std::max(widths[c], row[c].size());
  std::string out;
  for (const auto& row : table) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      if (c > 0) line += "  ";
      line += c == 0 ? fmt::format("{:<{}}", row[c], widths[c])
                     : fmt::format("{:>{}}", row[c], widths[c]);
    }
    out += line + '\n';
  }
  return out;
}

void AddQueueReports(const SimResult& result, SimReport& report) {
  const size_t n = result.queue_names.size();
  if (n == 0) return;
  report.queues.resize(n);
  std::vector<double> jct_sum(n, 0), wait_sum(n, 0);
  for (size_t q = 0; q < n; ++q)
    report.queues[q].name = result.queue_names[q];
  for (const JobOutcome& job : result.jobs) {
    if (job.queue < 0) continue;
    const size_t q = static_cast<size_t>(job.queue);
    QueueReport& queue = report.queues[q];
    ++queue.jobs;
    queue.preemptions += job.preemptions;
    if (job.finish < 0) continue;
    ++queue.completed;
    jct_sum[q] += Seconds(job.finish - job.submit_time);
    wait_sum[q] += Seconds(job.first_start - job.submit_time);
  }
  double total = 0;
  for (double milli_ms : result.queue_gpu_milli_ms)
    total += milli_ms;
  std::vector<double> shares;
  for (size_t q = 0; q < n; ++q) {
    QueueReport& queue = report.queues[q];
    if (queue.completed > 0) {
      queue.jct_mean_s = jct_sum[q] / static_cast<double>(queue.completed);
      queue.queueing_mean_s = wait_sum[q] / static_cast<double>(queue.completed);
    }
    queue.gpu_share = total > 0 ? result.queue_gpu_milli_ms[q] / total : 0;
    shares.push_back(queue.gpu_share);
  }
  report.queue_fairness = JainIndex(shares);
  report.queue_window_s = Seconds(result.queue_bucket_ms);
  for (size_t w = 0; w < result.queue_bucket_gpu_milli_ms.size(); ++w) {
    // The last window is cut short by the run's end: average over the time it covers.
    const TimeMs start = result.first_submit + static_cast<TimeMs>(w) * result.queue_bucket_ms;
    const TimeMs covered =
        std::min(result.queue_bucket_ms, std::max<TimeMs>(0, result.last_finish - start));
    const double covered_milli_ms = static_cast<double>(covered) * kMilliPerGpu;
    std::vector<double>& gpus = report.queue_gpus.emplace_back();
    for (double milli_ms : result.queue_bucket_gpu_milli_ms[w])
      gpus.push_back(covered_milli_ms > 0 ? milli_ms / covered_milli_ms : 0);
  }
}

// The queues' share of the usable GPUs over time, in at most `max_rows` windows (neighbouring
// windows averaged), as a text table: one row per window, one column per queue.
std::string FormatQueueShares(const SimReport& report, size_t max_rows) {
  const size_t windows = report.queue_gpus.size();
  if (windows == 0 || report.usable_gpus <= 0) return "";
  const size_t per_row = (windows + max_rows - 1) / max_rows;
  std::vector<std::vector<std::string>> table;
  std::vector<std::string> header = {"from"};
  for (const QueueReport& q : report.queues)
    header.push_back(q.name);
  header.push_back("idle");
  table.push_back(std::move(header));
  for (size_t first = 0; first < windows; first += per_row) {
    const size_t last = std::min(windows, first + per_row);
    std::vector<std::string> row = {
        FormatDuration(report.queue_window_s * static_cast<double>(first))};
    double held = 0;
    for (size_t q = 0; q < report.queues.size(); ++q) {
      double gpus = 0;
      for (size_t w = first; w < last; ++w)
        gpus += report.queue_gpus[w][q];
      gpus /= static_cast<double>(last - first);
      held += gpus;
      row.push_back(Percent(gpus / static_cast<double>(report.usable_gpus)));
    }
    row.push_back(Percent(std::max(0.0, 1.0 - held / static_cast<double>(report.usable_gpus))));
    table.push_back(std::move(row));
  }
  return "GPUs held by each queue over time (share of the usable GPUs):\n" + RenderTable(table);
}

}  // namespace

SimReport MakeReport(const SimResult& result, RunDescription run) {
  SimReport report;
  report.run = std::move(run);
  report.mode = result.mode;
  report.usable_gpus = result.usable_gpus;
  report.jobs_total = result.jobs_total;
  report.jobs_skipped = report.run.skipped_invalid + report.run.skipped_infeasible;
  report.preemptions = result.preemptions;
  report.scheduling_cycles = result.scheduling_cycles;

  if (result.mode == SimMode::kFill) {
    report.fill = result.fill;
    report.jobs_completed = result.fill.pods_placed;
    report.allocated_gpus = static_cast<double>(result.fill.allocated_gpu_milli) / kMilliPerGpu;
    report.unallocated_gpus = static_cast<double>(result.fill.usable_gpus) - report.allocated_gpus;
    report.unallocated_fraction =
        result.fill.usable_gpus > 0
            ? report.unallocated_gpus / static_cast<double>(result.fill.usable_gpus)
            : 0;
    return report;
  }

  std::vector<double> jct;
  std::vector<double> queueing;
  jct.reserve(result.jobs.size());
  queueing.reserve(result.jobs.size());
  for (const JobOutcome& job : result.jobs) {
    if (job.finish < 0) continue;
    jct.push_back(Seconds(job.finish - job.submit_time));
    queueing.push_back(Seconds(job.first_start - job.submit_time));
  }
  report.jobs_completed = static_cast<int64_t>(jct.size());
  report.jct_mean_s = Mean(jct);
  report.queueing_mean_s = Mean(queueing);
  std::sort(jct.begin(), jct.end());
  std::sort(queueing.begin(), queueing.end());
  report.jct_median_s = Percentile(jct, 50);
  report.jct_p95_s = Percentile(jct, 95);
  report.jct_p99_s = Percentile(jct, 99);
  report.queueing_p99_s = Percentile(queueing, 99);

  const TimeMs makespan = result.last_finish - result.first_submit;
  report.makespan_s = Seconds(std::max<TimeMs>(0, makespan));
  if (makespan > 0 && result.usable_gpus > 0) {
    report.mean_gpu_allocation =
        result.allocated_gpu_milli_ms /
        (static_cast<double>(kMilliPerGpu) * static_cast<double>(result.usable_gpus) *
         static_cast<double>(makespan));
  }
  report.time_series = result.time_series;
  for (TimeSeriesPoint& point : report.time_series)
    point.time -= result.first_submit;
  AddQueueReports(result, report);
  return report;
}

std::string FormatReport(const SimReport& report) {
  Lines lines;
  AddHeader(lines, report, false);
  lines.Blank();
  if (report.mode == SimMode::kFill) {
    const FillResult& fill = report.fill;
    lines.Add("pods placed",
              fmt::format("{} ({} asking for GPUs), {} pass(es) over the list",
                          GroupThousands(fill.pods_placed), GroupThousands(fill.gpu_pods_placed),
                          GroupThousands(fill.passes)));
    lines.Add("CPU-only pods failed", GroupThousands(fill.cpu_only_pods_failed));
    if (fill.arrived_target > 0) {
      const double arrived = static_cast<double>(fill.arrived_gpu_milli) / kMilliPerGpu;
      lines.Add(
          "arrived GPU requests",
          fmt::format("{} ({:.2f} x the usable GPUs; run until {:g} x)", GroupedDecimal(arrived, 2),
                      fill.usable_gpus > 0 ? arrived / static_cast<double>(fill.usable_gpus) : 0.0,
                      fill.arrived_target));
      lines.Add("GPU pods failed", GroupThousands(fill.gpu_pods_failed));
    }
    lines.Add("allocated GPUs", fmt::format("{} of {}", GroupedDecimal(report.allocated_gpus, 2),
                                            GroupThousands(fill.usable_gpus)));
    lines.Add("unallocated GPUs",
              fmt::format("{} ({:.2f} %)", GroupedDecimal(report.unallocated_gpus, 2),
                          report.unallocated_fraction * 100));
    lines.Add("fragmented GPUs",
              fmt::format("{} (FGD's measure under the trace's task distribution)",
                          GroupedDecimal(fill.fragmented_gpu_milli / kMilliPerGpu, 2)));
    if (fill.stop) {
      const FillStop& stop = *fill.stop;
      lines.Add(fill.arrived_target > 0 ? "first GPU pod failed" : "stopped at",
                fmt::format("{} (line {}): {} task(s) x {:g} GPU, {}",
                            stop.trace_id.empty() ? "pod" : stop.trace_id, stop.line, stop.tasks,
                            static_cast<double>(stop.gpu_milli_per_task) / kMilliPerGpu,
                            sched::WaitReasonCode(stop.reason)));
    } else if (fill.arrived_target > 0) {
      lines.Add("first GPU pod failed", "none");
    } else {
      lines.Add("stopped at", "end of list (no pod asks for a GPU)");
    }
    lines.Add("scheduling cycles", GroupThousands(report.scheduling_cycles));
    lines.Add("wall time", fmt::format("{:.2f} s", report.wall_time_s));
    return lines.Render();
  }
  lines.Add("jobs completed", fmt::format("{} of {}", GroupThousands(report.jobs_completed),
                                          GroupThousands(report.jobs_total)));
  lines.Add("average JCT", FormatDuration(report.jct_mean_s));
  lines.Add("median JCT", FormatDuration(report.jct_median_s));
  lines.Add("p95 JCT", FormatDuration(report.jct_p95_s));
  lines.Add("p99 JCT", FormatDuration(report.jct_p99_s));
  lines.Add("average queueing delay", FormatDuration(report.queueing_mean_s));
  lines.Add("p99 queueing delay", FormatDuration(report.queueing_p99_s));
  lines.Add("makespan", FormatDuration(report.makespan_s));
  lines.Add("mean GPU allocation", Percent(report.mean_gpu_allocation));
  lines.Add("preemptions", GroupThousands(report.preemptions));
  lines.Add("scheduling cycles", GroupThousands(report.scheduling_cycles));
  lines.Add("wall time", fmt::format("{:.2f} s", report.wall_time_s));
  if (report.queues.empty()) return lines.Render();
  lines.Add("queue fairness (Jain)", fmt::format("{:.3f} over GPU shares", report.queue_fairness));
  std::string out = lines.Render();
  out += '\n';
  std::vector<std::vector<std::string>> table = {
      {"queue", "jobs", "completed", "avg JCT", "avg wait", "preemptions", "GPU share"}};
  for (const QueueReport& q : report.queues)
    table.push_back({q.name, GroupThousands(q.jobs), GroupThousands(q.completed),
                     FormatDuration(q.jct_mean_s), FormatDuration(q.queueing_mean_s),
                     GroupThousands(q.preemptions), Percent(q.gpu_share)});
  out += RenderTable(table);
  if (!report.queue_gpus.empty()) out += '\n' + FormatQueueShares(report, 8);
  return out;
}

std::string FormatComparison(std::span<const SimReport> reports) {
  if (reports.empty()) return "";
  Lines header;
  AddHeader(header, reports.front(), true);
  std::string out = header.Render();
  out += '\n';

  std::vector<std::vector<std::string>> table;
  size_t text_columns = 3;  // left-aligned; numbers to their right
  if (reports.front().mode == SimMode::kFill) {
    text_columns = 2;
    table.push_back({"policy", "placement", "pods placed", "allocated GPUs", "unallocated GPUs",
                     "unallocated", "fragmented GPUs", "wall"});
    for (const SimReport& r : reports) {
      table.push_back({r.run.policy, r.run.placement, GroupThousands(r.fill.pods_placed),
                       GroupedDecimal(r.allocated_gpus, 2), GroupedDecimal(r.unallocated_gpus, 2),
                       fmt::format("{:.2f} %", r.unallocated_fraction * 100),
                       GroupedDecimal(r.fill.fragmented_gpu_milli / kMilliPerGpu, 2),
                       fmt::format("{:.2f} s", r.wall_time_s)});
    }
  } else {
    auto max_of = [&](double SimReport::*field) {
      double max = 0;
      for (const SimReport& r : reports)
        max = std::max(max, r.*field);
      return max;
    };
    const DurationUnit jct = UnitFor(max_of(&SimReport::jct_mean_s));
    const DurationUnit tail = UnitFor(max_of(&SimReport::jct_p99_s));
    const DurationUnit wait = UnitFor(max_of(&SimReport::queueing_p99_s));
    const DurationUnit span = UnitFor(max_of(&SimReport::makespan_s));
    table.push_back(
        {"policy", "backfill", "estimates", "completed", fmt::format("avg JCT ({})", jct.name),
         fmt::format("median JCT ({})", jct.name), fmt::format("p95 JCT ({})", tail.name),
         fmt::format("p99 JCT ({})", tail.name), fmt::format("avg wait ({})", wait.name),
         fmt::format("p99 wait ({})", wait.name), fmt::format("makespan ({})", span.name),
         "GPU alloc", "preemptions", "cycles", "wall (s)"});
    auto in = [](double seconds, const DurationUnit& unit) {
      return GroupedDecimal(seconds / unit.seconds, 2);
    };
    for (const SimReport& r : reports) {
      table.push_back(
          {r.run.policy, r.run.backfill, r.run.estimates, GroupThousands(r.jobs_completed),
           in(r.jct_mean_s, jct), in(r.jct_median_s, jct), in(r.jct_p95_s, tail),
           in(r.jct_p99_s, tail), in(r.queueing_mean_s, wait), in(r.queueing_p99_s, wait),
           in(r.makespan_s, span), Percent(r.mean_gpu_allocation), GroupThousands(r.preemptions),
           GroupThousands(r.scheduling_cycles), fmt::format("{:.2f}", r.wall_time_s)});
    }
  }
  std::vector<size_t> widths(table.front().size(), 0);
  for (const auto& row : table) {
    for (size_t c = 0; c < row.size(); ++c)
      widths[c] = std::max(widths[c], row[c].size());
  }
  for (const auto& row : table) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      if (c > 0) line += "  ";
      line += c < text_columns ? fmt::format("{:<{}}", row[c], widths[c])
                               : fmt::format("{:>{}}", row[c], widths[c]);
    }
    while (!line.empty() && line.back() == ' ')
      line.pop_back();
    out += line + '\n';
  }
  return out;
}

nlohmann::json ToJson(const SimReport& report) {
  const RunDescription& run = report.run;
  nlohmann::json json;
  json["mode"] = Name(report.mode);
  json["trace"] = {{"source", run.trace},
                   {"format", run.trace_format},
                   {"jobs", report.jobs_total},
                   {"skipped_invalid", run.skipped_invalid},
                   {"skipped_infeasible", run.skipped_infeasible}};
  json["cluster"] = {
      {"description", run.cluster}, {"nodes", run.nodes}, {"usable_gpus", report.usable_gpus}};
  json["policy"] = {{"order", run.policy},
                    {"backfill", run.backfill},
                    {"placement", run.placement},
                    {"preempt", run.preempt},
                    {"estimates", run.estimates},
                    {"las_queue_limits_gpu_s", run.las_queue_limits_gpu_s},
                    {"restart_cost_s", run.restart_cost_s},
                    {"grace_period_s", run.grace_period_s}};
  if (run.policy == "fairshare")
    json["policy"]["fair_share_half_life_s"] = run.fair_share_half_life_s;
  if (run.target_load) {
    json["load"] = {{"offered", run.offered_load.value_or(0)},
                    {"target", *run.target_load},
                    {"arrival_scale", run.arrival_scale}};
  } else {
    json["load"] = nullptr;
  }
  json["scheduling_cycles"] = report.scheduling_cycles;
  json["wall_time_s"] = report.wall_time_s;
  if (report.mode == SimMode::kFill) {
    const FillResult& fill = report.fill;
    nlohmann::json stop = nullptr;
    if (fill.stop) {
      stop = {{"trace_id", fill.stop->trace_id},
              {"line", fill.stop->line},
              {"tasks", fill.stop->tasks},
              {"gpus_per_task", static_cast<double>(fill.stop->gpu_milli_per_task) / kMilliPerGpu},
              {"reason", sched::WaitReasonCode(fill.stop->reason)}};
    }
    json["fill"] = {{"pods_placed", fill.pods_placed},
                    {"gpu_pods_placed", fill.gpu_pods_placed},
                    {"cpu_only_pods_failed", fill.cpu_only_pods_failed},
                    {"passes", fill.passes},
                    {"usable_gpus", fill.usable_gpus},
                    {"allocated_gpus", report.allocated_gpus},
                    {"unallocated_gpus", report.unallocated_gpus},
                    {"unallocated_fraction", report.unallocated_fraction},
                    {"fragmented_gpus", fill.fragmented_gpu_milli / kMilliPerGpu},
                    {"arrived", fill.arrived_target},
                    {"arrived_gpus", static_cast<double>(fill.arrived_gpu_milli) / kMilliPerGpu},
                    {"gpu_pods_failed", fill.gpu_pods_failed},
                    {"stopped_at", stop}};
    return json;
  }
  json["jobs_completed"] = report.jobs_completed;
  json["jct_s"] = {{"mean", report.jct_mean_s},
                   {"median", report.jct_median_s},
                   {"p95", report.jct_p95_s},
                   {"p99", report.jct_p99_s}};
  json["queueing_delay_s"] = {{"mean", report.queueing_mean_s}, {"p99", report.queueing_p99_s}};
  json["makespan_s"] = report.makespan_s;
  json["mean_gpu_allocation"] = report.mean_gpu_allocation;
  json["preemptions"] = report.preemptions;
  if (!report.queues.empty()) {
    // Only with --queues, so that reports without queues stay as they were.
    nlohmann::json queues = nlohmann::json::array();
    for (const QueueReport& q : report.queues)
      queues.push_back({{"name", q.name},
                        {"jobs", q.jobs},
                        {"completed", q.completed},
                        {"jct_mean_s", q.jct_mean_s},
                        {"queueing_delay_mean_s", q.queueing_mean_s},
                        {"preemptions", q.preemptions},
                        {"gpu_share", q.gpu_share}});
    nlohmann::json gpus_over_time = nlohmann::json::object();
    for (size_t q = 0; q < report.queues.size(); ++q) {
      nlohmann::json series = nlohmann::json::array();
      for (const std::vector<double>& window : report.queue_gpus)
        series.push_back(window[q]);
      gpus_over_time[report.queues[q].name] = std::move(series);
    }
    json["queues"] = {
        {"file", report.run.queues_file},
        {"queue_by", report.run.queue_by},
        {"jain_fairness", report.queue_fairness},
        {"per_queue", queues},
        {"gpus_over_time",
         {{"window_s", report.queue_window_s}, {"mean_gpus", std::move(gpus_over_time)}}}};
  }
  std::vector<double> times;
  std::vector<double> queue;
  std::vector<double> allocated;
  for (const TimeSeriesPoint& point : report.time_series) {
    times.push_back(Seconds(point.time));
    queue.push_back(point.queue_length);
    allocated.push_back(point.allocated_gpus);
  }
  json["time_series"] = {{"time_s", times}, {"queue_length", queue}, {"allocated_gpus", allocated}};
  return json;
}

std::string RenderSvg(std::span<const SimReport> reports, const std::string& title) {
  constexpr double kWidth = 1000;
  // The legend sits between the title and the first panel, one row per run.
  const double legend_height = 18 * static_cast<double>(reports.size());
  const double height = 620 + legend_height;
  constexpr double kLeft = 80;
  constexpr double kRight = 30;
  constexpr double kPlotWidth = kWidth - kLeft - kRight;

  double end_hours = 0;
  double max_gpus = 0;
  double max_queue = 0;
  for (const SimReport& r : reports) {
    max_gpus = std::max(max_gpus, static_cast<double>(r.usable_gpus));
    for (const TimeSeriesPoint& p : r.time_series) {
      end_hours = std::max(end_hours, Seconds(p.time) / kSecondsPerHour);
      max_gpus = std::max(max_gpus, p.allocated_gpus);
      max_queue = std::max(max_queue, p.queue_length);
    }
  }
  const double x_step = NiceStep(end_hours, 10);
  const double x_max = std::max(x_step, std::ceil(end_hours / x_step) * x_step);
  Panel gpus{.top = 56 + legend_height, .height = 250, .y_max = 1, .y_step = NiceStep(max_gpus, 5)};
  gpus.y_max = std::max(gpus.y_step, std::ceil(max_gpus * 1.05 / gpus.y_step) * gpus.y_step);
  Panel queue{.top = gpus.top + gpus.height + 60,
              .height = 200,
              .y_max = 1,
              .y_step = NiceStep(max_queue, 5)};
  queue.y_max = std::max(queue.y_step, std::ceil(max_queue / queue.y_step) * queue.y_step);

  auto x_of = [&](double hours) { return kLeft + hours / x_max * kPlotWidth; };
  auto y_of = [](const Panel& panel, double value) {
    return panel.top + panel.height - value / panel.y_max * panel.height;
  };

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"28\" text-anchor=\"middle\" font-size=\"16\" "
      "font-weight=\"bold\">{3}</text>\n",
      kWidth, height, kWidth / 2, XmlEscape(title));

  auto draw_axes = [&](const Panel& panel, const std::string& y_label) {
    const double bottom = panel.top + panel.height;
    svg += fmt::format(
        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n",
        kLeft, panel.top, kPlotWidth, panel.height);
    for (double v = 0; v <= panel.y_max + panel.y_step / 2; v += panel.y_step) {
      const double y = y_of(panel, v);
      svg += fmt::format(
          "<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#ddd\"/>\n"
          "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}</text>\n",
          kLeft, y, kLeft + kPlotWidth, kLeft - 6, y + 4, TickLabel(v));
    }
    for (double h = 0; h <= x_max + x_step / 2; h += x_step) {
      const double x = x_of(h);
      svg += fmt::format(
          "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#333\"/>\n"
          "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>\n",
          x, bottom, bottom + 5, bottom + 18, TickLabel(h));
    }
    svg += fmt::format(
        "<text x=\"20\" y=\"{0:.1f}\" text-anchor=\"middle\" "
        "transform=\"rotate(-90 20 {0:.1f})\">{1}</text>\n",
        panel.top + panel.height / 2, XmlEscape(y_label));
    svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">time (hours)</text>\n",
                       kLeft + kPlotWidth / 2, bottom + 34);
  };
  draw_axes(gpus, "allocated GPUs");
  draw_axes(queue, "pending jobs");

  // Capacity: the usable GPUs of the (shared) cluster.
  const double capacity = reports.empty() ? 0 : static_cast<double>(reports.front().usable_gpus);
  svg += fmt::format(
      "<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#555\" "
      "stroke-dasharray=\"6 4\"/>\n"
      "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\" fill=\"#555\">capacity {5:g} "
      "GPUs</text>\n",
      kLeft, y_of(gpus, capacity), kLeft + kPlotWidth, kLeft + kPlotWidth - 4,
      y_of(gpus, capacity) - 4, capacity);

  auto polyline = [&](const SimReport& r, const Panel& panel, const char* color, double width,
                      double TimeSeriesPoint::*field) {
    std::string points;
    double previous_y = 0;
    for (size_t i = 0; i < r.time_series.size(); ++i) {
      const TimeSeriesPoint& p = r.time_series[i];
      const double x = x_of(Seconds(p.time) / kSecondsPerHour);
      const double y = y_of(panel, p.*field);
      // A step function: hold the previous value until this change.
      if (i > 0) points += fmt::format("{:.1f},{:.1f} ", x, previous_y);
      points += fmt::format("{:.1f},{:.1f} ", x, y);
      previous_y = y;
    }
    if (!points.empty()) points.pop_back();
    svg += fmt::format(
        "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"{:.1f}\" points=\"{}\"/>\n", color,
        width, points);
  };
  for (size_t i = 0; i < reports.size(); ++i) {
    const char* color = kPalette[i % kPalette.size()];
    // Earlier runs draw wider, so that identical curves stay visible under later ones.
    const double width = 1.2 + 1.2 * static_cast<double>(reports.size() - 1 - i);
    polyline(reports[i], gpus, color, width, &TimeSeriesPoint::allocated_gpus);
    polyline(reports[i], queue, color, width, &TimeSeriesPoint::queue_length);
  }
  // Legend: one entry per run, named by what differs between runs (the policy).
  for (size_t i = 0; i < reports.size(); ++i) {
    const double y = 54 + 18 * static_cast<double>(i);
    const double x = kLeft + 12;
    const RunDescription& run = reports[i].run;
    svg += fmt::format(
        "<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"{3}\" "
        "stroke-width=\"3\"/>\n<text x=\"{4}\" y=\"{5:.1f}\">{6}</text>\n",
        x, y - 4, x + 20, kPalette[i % kPalette.size()], x + 26, y,
        XmlEscape(fmt::format("{} (backfill {}, {}{}), mean allocation {}", run.policy,
                              run.backfill, run.placement, run.preempt ? ", preempt" : "",
                              Percent(reports[i].mean_gpu_allocation))));
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace gpufleet::sim
