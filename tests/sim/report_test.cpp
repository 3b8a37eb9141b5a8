#include "sim/report.h"

#include <algorithm>
#include <array>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace gpufleet::sim {
namespace {

constexpr TimeMs kSec = kMsPerSecond;

TEST(Percentile, LinearInterpolationLikeNumpy) {
  const std::vector<double> values = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(Percentile(values, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile(values, 50), 2.5);
  EXPECT_DOUBLE_EQ(Percentile(values, 95), 3.85);
  EXPECT_DOUBLE_EQ(Percentile(values, 100), 4);
  EXPECT_DOUBLE_EQ(Percentile({7}, 99), 7);
  EXPECT_DOUBLE_EQ(Percentile({}, 50), 0);
}

RunDescription Description() {
  RunDescription run;
  run.trace = "traces/a&b.csv";
  run.trace_format = "itp";
  run.cluster = "1 nodes x 4 H100-80GB GPUs (uniform, 16 nodes per rack)";
  run.nodes = 1;
  run.policy = "sjf";
  run.backfill = "firstfit";
  run.placement = "binpack";
  run.estimates = "oracle";
  run.las_queue_limits_gpu_s = {3200};
  run.restart_cost_s = 30;
  return run;
}

// Five finished jobs with JCTs 10, 20, 30, 40, 100 s and waits 0, 5, 0, 10, 60 s; one unfinished.
SimResult FiveJobs() {
  SimResult result;
  result.usable_gpus = 4;
  result.jobs_total = 6;
  const std::vector<std::array<TimeMs, 3>> jobs = {
      {0, 0, 10}, {5, 10, 25}, {10, 10, 40}, {20, 30, 60}, {30, 90, 130}};
  for (const auto& [submit, start, finish] : jobs) {
    result.jobs.push_back(JobOutcome{.submit_time = submit * kSec,
                                     .first_start = start * kSec,
                                     .finish = finish * kSec,
                                     .preemptions = 0});
  }
  result.jobs.push_back(JobOutcome{.submit_time = 40 * kSec});  // never finished
  result.first_submit = 0;
  result.last_finish = 130 * kSec;
  // 3 GPUs busy on average over the 130 s.
  result.allocated_gpu_milli_ms = 3.0 * kMilliPerGpu * 130 * kSec;
  result.preemptions = 2;
  result.scheduling_cycles = 9;
  result.time_series = {{0, 1, 2}, {60 * kSec, 3, 4}, {130 * kSec, 0, 0}};
  return result;
}

TEST(MakeReport, StatisticsFromOutcomes) {
  const SimReport report = MakeReport(FiveJobs(), Description());
  EXPECT_EQ(report.jobs_total, 6);
  EXPECT_EQ(report.jobs_completed, 5);
  EXPECT_DOUBLE_EQ(report.jct_mean_s, 40);
  EXPECT_DOUBLE_EQ(report.jct_median_s, 30);
  EXPECT_DOUBLE_EQ(report.jct_p95_s, 88);    // 40 + 0.8 x 60
  EXPECT_DOUBLE_EQ(report.jct_p99_s, 97.6);  // 40 + 0.96 x 60
  EXPECT_DOUBLE_EQ(report.queueing_mean_s, 15);
  EXPECT_DOUBLE_EQ(report.queueing_p99_s, 58);  // waits sorted 0,0,5,10,60: 10 + 0.96 x 50
  EXPECT_DOUBLE_EQ(report.makespan_s, 130);
  EXPECT_DOUBLE_EQ(report.mean_gpu_allocation, 0.75);
  EXPECT_EQ(report.preemptions, 2);
  EXPECT_EQ(report.scheduling_cycles, 9);
  ASSERT_EQ(report.time_series.size(), 3u);
}

TEST(MakeReport, TimesAreRelativeToTheFirstSubmit) {
  SimResult result = FiveJobs();
  const TimeMs offset = 1'000'000 * kSec;
  for (JobOutcome& job : result.jobs) {
    job.submit_time += offset;
    if (job.finish >= 0) {
      job.first_start += offset;
      job.finish += offset;
    }
  }
  result.first_submit += offset;
  result.last_finish += offset;
  for (TimeSeriesPoint& point : result.time_series)
    point.time += offset;
  const SimReport report = MakeReport(result, Description());
  EXPECT_DOUBLE_EQ(report.makespan_s, 130);
  EXPECT_EQ(report.time_series.front().time, 0);
  EXPECT_EQ(report.time_series.back().time, 130 * kSec);
}

// Two queues over 130 s in 100 s windows: a holds 2 GPUs throughout, b 1 GPU in the first window
// only. The second window covers 30 s of the run, and its averages are over those 30 s.
TEST(MakeReport, QueueGpusOverTime) {
  SimResult result = FiveJobs();
  result.queue_names = {"a", "b"};
  for (JobOutcome& job : result.jobs)
    job.queue = 0;
  result.jobs[1].queue = 1;
  result.queue_gpu_milli_ms = {2.0 * kMilliPerGpu * 130 * kSec, 1.0 * kMilliPerGpu * 100 * kSec};
  result.queue_bucket_ms = 100 * kSec;
  result.queue_bucket_gpu_milli_ms = {
      {2.0 * kMilliPerGpu * 100 * kSec, 1.0 * kMilliPerGpu * 100 * kSec},
      {2.0 * kMilliPerGpu * 30 * kSec, 0}};
  RunDescription run = Description();
  run.policy = "fairshare";
  run.fair_share_half_life_s = 7 * 86400;
  const SimReport report = MakeReport(result, run);
  EXPECT_DOUBLE_EQ(report.queue_window_s, 100);
  ASSERT_EQ(report.queue_gpus.size(), 2u);
  EXPECT_DOUBLE_EQ(report.queue_gpus[0][0], 2);
  EXPECT_DOUBLE_EQ(report.queue_gpus[0][1], 1);
  EXPECT_DOUBLE_EQ(report.queue_gpus[1][0], 2);
  EXPECT_DOUBLE_EQ(report.queue_gpus[1][1], 0);
  const std::string text = FormatReport(report);
  EXPECT_NE(text.find("usage half-life 168.00 h"), std::string::npos) << text;
  EXPECT_NE(text.find("GPUs held by each queue over time"), std::string::npos) << text;
  // a holds 2 of 4 GPUs, b 1 then 0: 25 % then 50 % idle.
  EXPECT_NE(text.find("0.0 s    50.0 %  25.0 %  25.0 %"), std::string::npos) << text;
  EXPECT_NE(text.find("100.0 s  50.0 %   0.0 %  50.0 %"), std::string::npos) << text;
  const nlohmann::json json = ToJson(report);
  EXPECT_EQ(json["policy"]["fair_share_half_life_s"], 7 * 86400);
  EXPECT_EQ(json["queues"]["gpus_over_time"]["window_s"], 100.0);
  EXPECT_EQ(json["queues"]["gpus_over_time"]["mean_gpus"]["b"], nlohmann::json::array({1.0, 0.0}));
}

TEST(Format, DurationsAndThousands) {
  EXPECT_EQ(FormatDuration(45), "45.0 s");
  EXPECT_EQ(FormatDuration(750), "12.5 min");
  EXPECT_EQ(FormatDuration(11520), "3.20 h");
  EXPECT_EQ(GroupThousands(0), "0");
  EXPECT_EQ(GroupThousands(999), "999");
  EXPECT_EQ(GroupThousands(1000), "1,000");
  EXPECT_EQ(GroupThousands(1234567), "1,234,567");
  EXPECT_EQ(GroupThousands(-1234), "-1,234");
}

TEST(Format, ReportTableNamesClusterPolicyAndUnits) {
  SimReport report = MakeReport(FiveJobs(), Description());
  report.wall_time_s = 0.25;
  const std::string table = FormatReport(report);
  EXPECT_NE(table.find("traces/a&b.csv (itp, 6 jobs)"), std::string::npos) << table;
  EXPECT_NE(table.find("1 nodes x 4 H100-80GB GPUs"), std::string::npos) << table;
  EXPECT_NE(table.find("sjf, backfill firstfit, placement binpack"), std::string::npos) << table;
  EXPECT_NE(table.find("5 of 6"), std::string::npos) << table;
  EXPECT_NE(table.find("40.0 s"), std::string::npos) << table;   // average JCT
  EXPECT_NE(table.find("2.2 min"), std::string::npos) << table;  // makespan 130 s
  EXPECT_NE(table.find("75.0 %"), std::string::npos) << table;
  EXPECT_NE(table.find("0.25 s"), std::string::npos) << table;
  // Values line up in one column.
  std::istringstream lines(table);
  std::string line;
  size_t column = std::string::npos;
  while (std::getline(lines, line)) {
    if (line.rfind("average JCT", 0) == 0 || line.rfind("p99 queueing delay", 0) == 0) {
      const size_t value = line.find_first_not_of(' ', line.find("  "));
      if (column == std::string::npos) column = value;
      EXPECT_EQ(value, column) << line;
    }
  }
  EXPECT_NE(column, std::string::npos);
}

TEST(Format, ComparisonHasOneRowPerPolicy) {
  std::vector<SimReport> reports;
  for (const char* policy : {"fifo", "sjf", "las"}) {
    RunDescription run = Description();
    run.policy = policy;
    reports.push_back(MakeReport(FiveJobs(), run));
  }
  reports[2].jct_mean_s = 7200;  // forces the JCT columns into hours
  const std::string table = FormatComparison(reports);
  EXPECT_NE(table.find("avg JCT (h)"), std::string::npos) << table;
  int rows = 0;
  std::istringstream lines(table);
  std::string line;
  while (std::getline(lines, line)) {
    for (const char* policy : {"fifo ", "sjf ", "las "})
      rows += line.rfind(policy, 0) == 0;
  }
  EXPECT_EQ(rows, 3) << table;
  EXPECT_NE(table.find("2.00"), std::string::npos) << table;  // 7200 s in hours
}

TEST(Json, StableFieldsWithValues) {
  SimReport report = MakeReport(FiveJobs(), Description());
  report.wall_time_s = 1.5;
  const nlohmann::json json = nlohmann::json::parse(ToJson(report).dump());
  EXPECT_EQ(json.at("mode"), "replay");
  EXPECT_EQ(json.at("trace").at("source"), "traces/a&b.csv");
  EXPECT_EQ(json.at("trace").at("jobs"), 6);
  EXPECT_EQ(json.at("cluster").at("usable_gpus"), 4);
  EXPECT_EQ(json.at("policy").at("order"), "sjf");
  EXPECT_EQ(json.at("policy").at("estimates"), "oracle");
  EXPECT_EQ(json.at("policy").at("las_queue_limits_gpu_s"), nlohmann::json::array({3200}));
  EXPECT_EQ(json.at("jobs_completed"), 5);
  EXPECT_DOUBLE_EQ(json.at("jct_s").at("mean").get<double>(), 40);
  EXPECT_DOUBLE_EQ(json.at("jct_s").at("median").get<double>(), 30);
  EXPECT_DOUBLE_EQ(json.at("jct_s").at("p95").get<double>(), 88);
  EXPECT_DOUBLE_EQ(json.at("jct_s").at("p99").get<double>(), 97.6);
  EXPECT_DOUBLE_EQ(json.at("queueing_delay_s").at("mean").get<double>(), 15);
  EXPECT_DOUBLE_EQ(json.at("queueing_delay_s").at("p99").get<double>(), 58);
  EXPECT_DOUBLE_EQ(json.at("makespan_s").get<double>(), 130);
  EXPECT_DOUBLE_EQ(json.at("mean_gpu_allocation").get<double>(), 0.75);
  EXPECT_EQ(json.at("preemptions"), 2);
  EXPECT_EQ(json.at("scheduling_cycles"), 9);
  EXPECT_DOUBLE_EQ(json.at("wall_time_s").get<double>(), 1.5);
  EXPECT_TRUE(json.at("load").is_null());
  EXPECT_EQ(json.at("time_series").at("time_s"), nlohmann::json::array({0.0, 60.0, 130.0}));
  EXPECT_EQ(json.at("time_series").at("allocated_gpus"), nlohmann::json::array({2.0, 4.0, 0.0}));
  EXPECT_FALSE(json.contains("fill"));
}

TEST(Json, LoadScaling) {
  RunDescription run = Description();
  run.offered_load = 0.5;
  run.target_load = 1.0;
  run.arrival_scale = 0.5;
  const nlohmann::json json = ToJson(MakeReport(FiveJobs(), run));
  EXPECT_DOUBLE_EQ(json.at("load").at("offered").get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(json.at("load").at("target").get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(json.at("load").at("arrival_scale").get<double>(), 0.5);
}

TEST(Json, FillFields) {
  SimResult result;
  result.mode = SimMode::kFill;
  result.usable_gpus = 10;
  result.jobs_total = 3;
  result.fill = FillResult{.pods_placed = 7,
                           .gpu_pods_placed = 6,
                           .cpu_only_pods_failed = 1,
                           .passes = 3,
                           .allocated_gpu_milli = 8500,
                           .usable_gpus = 10,
                           .stop = FillStop{.trace_id = "pod-9",
                                            .line = 11,
                                            .tasks = 1,
                                            .gpu_milli_per_task = 2000,
                                            .reason = sched::WaitReason::kInsufficientGpus}};
  const SimReport report = MakeReport(result, Description());
  const nlohmann::json json = ToJson(report);
  EXPECT_EQ(json.at("mode"), "fill");
  const nlohmann::json& fill = json.at("fill");
  EXPECT_EQ(fill.at("pods_placed"), 7);
  EXPECT_EQ(fill.at("gpu_pods_placed"), 6);
  EXPECT_EQ(fill.at("cpu_only_pods_failed"), 1);
  EXPECT_EQ(fill.at("passes"), 3);
  EXPECT_DOUBLE_EQ(fill.at("allocated_gpus").get<double>(), 8.5);
  EXPECT_DOUBLE_EQ(fill.at("unallocated_gpus").get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(fill.at("unallocated_fraction").get<double>(), 0.15);
  EXPECT_EQ(fill.at("stopped_at").at("trace_id"), "pod-9");
  EXPECT_EQ(fill.at("stopped_at").at("line"), 11);
  EXPECT_DOUBLE_EQ(fill.at("stopped_at").at("gpus_per_task").get<double>(), 2);
  EXPECT_EQ(fill.at("stopped_at").at("reason"),
            sched::WaitReasonCode(sched::WaitReason::kInsufficientGpus));
  EXPECT_FALSE(json.contains("jct_s"));

  const std::string table = FormatReport(report);
  EXPECT_NE(table.find("1.50 (15.00 %)"), std::string::npos) << table;
  EXPECT_NE(table.find("pod-9 (line 11)"), std::string::npos) << table;
}

// Tags open and close in order; self-closing tags stand alone.
bool TagsBalanced(const std::string& xml) {
  std::vector<std::string> open;
  for (size_t pos = xml.find('<'); pos != std::string::npos; pos = xml.find('<', pos + 1)) {
    const size_t end = xml.find('>', pos);
    if (end == std::string::npos) return false;
    const std::string tag = xml.substr(pos + 1, end - pos - 1);
    if (tag.empty()) return false;
    if (tag.back() == '/') continue;
    const bool closing = tag.front() == '/';
    const std::string name =
        tag.substr(closing ? 1 : 0, tag.find_first_of(" \n") - (closing ? 1 : 0));
    if (!closing) {
      open.push_back(name);
    } else {
      if (open.empty() || open.back() != name) return false;
      open.pop_back();
    }
  }
  return open.empty();
}

TEST(Svg, WellFormedWithBothPanels) {
  std::vector<SimReport> reports = {MakeReport(FiveJobs(), Description())};
  const std::string svg = RenderSvg(reports, "a&b.csv on 4 GPUs: sjf");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_TRUE(svg.ends_with("</svg>\n"));
  EXPECT_TRUE(TagsBalanced(svg)) << svg;
  EXPECT_NE(svg.find("a&amp;b.csv on 4 GPUs: sjf"), std::string::npos);
  EXPECT_EQ(svg.find("a&b"), std::string::npos);  // every & escaped
  EXPECT_NE(svg.find("allocated GPUs"), std::string::npos);
  EXPECT_NE(svg.find("pending jobs"), std::string::npos);
  EXPECT_NE(svg.find("time (hours)"), std::string::npos);
  EXPECT_NE(svg.find("capacity 4 GPUs"), std::string::npos);
  // One line per panel; a step series of 3 points has 5 vertices.
  size_t polylines = 0;
  for (size_t pos = svg.find("<polyline"); pos != std::string::npos;
       pos = svg.find("<polyline", pos + 1)) {
    ++polylines;
    const size_t begin = svg.find("points=\"", pos) + 8;
    const std::string points = svg.substr(begin, svg.find('"', begin) - begin);
    EXPECT_EQ(std::count(points.begin(), points.end(), ','), 5) << points;
  }
  EXPECT_EQ(polylines, 2u);
}

TEST(Svg, ComparisonAndEmptySeries) {
  std::vector<SimReport> reports;
  for (const char* policy : {"fifo", "las"}) {
    RunDescription run = Description();
    run.policy = policy;
    reports.push_back(MakeReport(FiveJobs(), run));
  }
  reports.push_back(MakeReport(SimResult{}, Description()));
  const std::string svg = RenderSvg(reports, "compare");
  EXPECT_TRUE(TagsBalanced(svg));
  EXPECT_NE(svg.find(">fifo (backfill"), std::string::npos);
  EXPECT_NE(svg.find(">las (backfill"), std::string::npos);
}

}  // namespace
}  // namespace gpufleet::sim
