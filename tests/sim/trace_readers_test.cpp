#include "sim/trace_readers.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "sim/csv.h"

namespace gpufleet::sim {
namespace {

std::string DataPath(std::string_view name) {
  return std::string(GPUFLEET_TEST_DATA_DIR) + "/" + std::string(name);
}

// The message of the TraceError that `read` throws, or "" when it throws none.
template <typename Read>
std::string TraceErrorOf(Read&& read) {
  try {
    read();
  } catch (const TraceError& error) {
    return error.what();
  }
  return "";
}

// A file in the test's temporary directory, for cases too small to deserve a fixture.
std::string WriteTempFile(std::string_view name, std::string_view text) {
  const std::string path = (std::filesystem::path(testing::TempDir()) / name).string();
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::vector<std::string> TraceIds(const Trace& trace) {
  std::vector<std::string> ids;
  for (const TraceJob& job : trace.jobs)
    ids.push_back(job.trace_id);
  return ids;
}

// The fields of the first record, copied: the views die with the reader.
std::vector<std::string> Fields(std::string_view text) {
  CsvReader reader(text);
  CsvRecord record;
  if (!reader.Next(record)) return {};
  return {record.fields.begin(), record.fields.end()};
}

TEST(CsvReaderTest, SplitsFieldsAndTrimsUnquotedSpaces) {
  EXPECT_EQ(Fields("a, b ,c"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(Fields("a,,"), (std::vector<std::string>{"a", "", ""}));
  EXPECT_EQ(Fields("\xEF\xBB\xBFx,y\r\n"), (std::vector<std::string>{"x", "y"}));
}

TEST(CsvReaderTest, UnquotesRfc4180Fields) {
  EXPECT_EQ(Fields(R"("a,b","say ""hi""", " c ")"),
            (std::vector<std::string>{"a,b", "say \"hi\"", " c "}));
}

TEST(CsvReaderTest, CountsLinesAcrossBlankLinesCrlfAndQuotedNewlines) {
  CsvReader reader("h1,h2\r\n\r\n\"multi\nline\",x\r\n  \nlast,y\n\n");
  CsvRecord record;
  ASSERT_TRUE(reader.Next(record));
  EXPECT_EQ(record.line, 1);
  ASSERT_TRUE(reader.Next(record));
  EXPECT_EQ(record.line, 3);
  EXPECT_EQ(record.fields, (std::vector<std::string_view>{"multi\nline", "x"}));
  ASSERT_TRUE(reader.Next(record));
  EXPECT_EQ(record.line, 6);
  EXPECT_EQ(record.fields, (std::vector<std::string_view>{"last", "y"}));
  EXPECT_FALSE(reader.Next(record));
}

TEST(CsvReaderTest, ReportsMalformedQuotesAndGoesOnWithTheNextLine) {
  CsvReader reader("\"a\"b,c\nok\n\"open");
  CsvRecord record;
  ASSERT_TRUE(reader.Next(record));
  EXPECT_EQ(record.error, "text after the closing quote of a field");
  ASSERT_TRUE(reader.Next(record));
  EXPECT_EQ(record.line, 2);
  EXPECT_TRUE(record.error.empty());
  EXPECT_EQ(record.fields, (std::vector<std::string_view>{"ok"}));
  ASSERT_TRUE(reader.Next(record));
  EXPECT_EQ(record.error, "unterminated quoted field");
  EXPECT_FALSE(reader.Next(record));
}

TEST(CsvFieldTest, ParsesNumbersStrictly) {
  EXPECT_EQ(ParseInt(" 42 "), 42);
  EXPECT_EQ(ParseInt("-7"), -7);
  EXPECT_EQ(ParseInt(""), std::nullopt);
  EXPECT_EQ(ParseInt("4x"), std::nullopt);
  EXPECT_EQ(ParseInt("99999999999999999999"), std::nullopt);
  EXPECT_EQ(ParseDouble("1.5e3"), 1500.0);
  EXPECT_EQ(ParseDouble("abc"), std::nullopt);
  EXPECT_EQ(ParseDouble("inf"), std::nullopt);
  EXPECT_EQ(ParseDouble("nan"), std::nullopt);
  EXPECT_EQ(ParseDouble("1e400"), std::nullopt);
}

TEST(CsvFieldTest, ParsesUtcTimestamps) {
  EXPECT_EQ(ParseUtcTimestamp("1970-01-01 00:00:00"), 0);
  EXPECT_EQ(ParseUtcTimestamp("2017-10-09 07:01:55"), 1507532515);
  EXPECT_EQ(ParseUtcTimestamp("2000-02-29T23:59:59"), 951868799);
  EXPECT_EQ(ParseUtcTimestamp("2017-02-29 00:00:00"), std::nullopt);
  EXPECT_EQ(ParseUtcTimestamp("2017-13-01 00:00:00"), std::nullopt);
  EXPECT_EQ(ParseUtcTimestamp("2017-10-09 24:00:00"), std::nullopt);
  EXPECT_EQ(ParseUtcTimestamp("2017-10-09 7:01:55"), std::nullopt);
  EXPECT_EQ(ParseUtcTimestamp("2017-1O-09 07:01:55"), std::nullopt);
}

TEST(TraceFormatTest, NamesRoundTrip) {
  const std::vector<std::string_view> names = TraceFormatNames();
  EXPECT_EQ(names, (std::vector<std::string_view>{"itp", "philly", "alibaba-pods", "generic"}));
  for (const std::string_view name : names) {
    const auto format = ParseTraceFormat(name);
    ASSERT_TRUE(format.has_value()) << name;
    EXPECT_EQ(TraceFormatName(*format), name);
  }
  EXPECT_EQ(ParseTraceFormat("Philly"), std::nullopt);
}

TEST(TraceFormatTest, DetectsFormatFromHeader) {
  EXPECT_EQ(DetectTraceFormat(DataPath("itp_small.csv")), TraceFormat::kItp);
  EXPECT_EQ(DetectTraceFormat(DataPath("philly_small.csv")), TraceFormat::kPhilly);
  EXPECT_EQ(DetectTraceFormat(DataPath("alibaba_pods_small.csv")), TraceFormat::kAlibabaPods);
  EXPECT_EQ(DetectTraceFormat(DataPath("alibaba_pods_no_times.csv")), TraceFormat::kAlibabaPods);
  EXPECT_EQ(DetectTraceFormat(DataPath("generic_small.csv")), TraceFormat::kGeneric);
}

TEST(TraceFormatTest, RejectsNodeListsAndUnknownHeaders) {
  const std::string nodes = DataPath("alibaba_nodes_small.csv");
  EXPECT_EQ(TraceErrorOf([&] { DetectTraceFormat(nodes); }),
            nodes +
                ":1: this is an Alibaba node list, a cluster description rather than a job "
                "trace");
  const std::string unknown = WriteTempFile("unknown.csv", "when,how_long\n1,2\n");
  const std::string message = TraceErrorOf([&] { ReadTrace(unknown); });
  EXPECT_TRUE(message.starts_with(unknown + ":1: unknown trace format, columns 'when,how_long'"))
      << message;
}

TEST(ItpReaderTest, ReadsSortsAndNormalises) {
  const Trace trace = ReadTrace(DataPath("itp_small.csv"), TraceFormat::kItp);
  EXPECT_EQ(trace.source, DataPath("itp_small.csv"));
  EXPECT_EQ(trace.skipped, 0);
  // Ties at 1000 s keep file order.
  ASSERT_EQ(TraceIds(trace), (std::vector<std::string>{"job-a", "job-c", "job-d", "job-b"}));
  struct Expected {
    TimeMs submit, duration;
    int32_t tasks;
    MilliGpu milli_per_task;
    int64_t line;
  };
  const std::vector<Expected> expected = {
      {0, 600'000, 1, 1000, 2},
      {0, 30'000, 2, 6000, 4},     // 12 GPUs on 8-GPU nodes: 2 x 6
      {5'000, 2'002, 1, 2000, 5},  // 2.0016 s rounds to the nearest ms
      {10'000, 1'200'500, 2, 8000, 3},
  };
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(i);
    const TraceJob& job = trace.jobs[i];
    EXPECT_EQ(job.spec.id, i);
    EXPECT_EQ(job.spec.submit_time, expected[i].submit);
    EXPECT_EQ(job.duration, expected[i].duration);
    EXPECT_EQ(job.spec.tasks, expected[i].tasks);
    EXPECT_EQ(job.spec.gpu_milli_per_task, expected[i].milli_per_task);
    EXPECT_EQ(job.line, expected[i].line);
    EXPECT_EQ(job.spec.queue, "default");
  }
}

TEST(ItpReaderTest, GangShapeFollowsGpusPerNode) {
  const Trace trace = ReadTrace(DataPath("itp_small.csv"), {.gpus_per_node = 4});
  EXPECT_EQ(trace.jobs[1].spec.tasks, 3);  // 12 GPUs: 3 x 4
  EXPECT_EQ(trace.jobs[1].spec.gpu_milli_per_task, 4000);
  EXPECT_EQ(trace.jobs[3].spec.tasks, 4);  // 16 GPUs: 4 x 4
}

TEST(ItpReaderTest, LimitKeepsTheEarliestJobs) {
  const Trace trace = ReadTrace(DataPath("itp_small.csv"), {.limit = 2});
  EXPECT_EQ(TraceIds(trace), (std::vector<std::string>{"job-a", "job-c"}));
}

TEST(ItpReaderTest, RejectsOptionsOutOfRange) {
  EXPECT_THROW(ReadTrace(DataPath("itp_small.csv"), {.gpus_per_node = 0}), std::invalid_argument);
  EXPECT_THROW(ReadTrace(DataPath("itp_small.csv"), {.limit = -1}), std::invalid_argument);
}

TEST(PhillyReaderTest, ParsesTimestampsAsUtcAcrossAYearBoundary) {
  // The fixture has CRLF line endings and a trailing empty line.
  const Trace trace = ReadTrace(DataPath("philly_small.csv"));
  ASSERT_EQ(trace.jobs.size(), 4u);
  struct Expected {
    TimeMs submit, duration;
    int32_t tasks;
    MilliGpu milli_per_task;
    std::string queue;
    int64_t line;
  };
  const std::vector<Expected> expected = {
      {0, 10'400, 1, 8000, "6214e9", 3},
      {0, 5'500, 3, 8000, "b436b2", 5},
      {1'000, 66'000, 1, 1000, "11cb48", 2},
      {3'000, 2'951'000, 4, 8000, "11cb48", 4},
  };
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(i);
    const TraceJob& job = trace.jobs[i];
    EXPECT_EQ(job.spec.id, i);
    EXPECT_EQ(job.spec.submit_time, expected[i].submit);
    EXPECT_EQ(job.duration, expected[i].duration);
    EXPECT_EQ(job.spec.tasks, expected[i].tasks);
    EXPECT_EQ(job.spec.gpu_milli_per_task, expected[i].milli_per_task);
    EXPECT_EQ(job.spec.queue, expected[i].queue);
    EXPECT_EQ(job.line, expected[i].line);
    EXPECT_EQ(job.trace_id, "");
  }
}

TEST(PhillyReaderTest, ReportsBadTimestampsGpuCountsAndFieldCounts) {
  const std::string path = DataPath("philly_bad_rows.csv");
  const Trace trace = ReadTrace(path, {.skip_invalid = true});
  ASSERT_EQ(trace.jobs.size(), 1u);
  EXPECT_EQ(trace.jobs[0].line, 5);
  EXPECT_EQ(trace.jobs[0].spec.queue, "a");
  EXPECT_EQ(trace.skipped, 3);
  EXPECT_EQ(trace.skip_examples,
            (std::vector<std::string>{
                path + ":2: timestamp '2017-02-29 10:00:00' is not a date and time like "
                       "'2017-10-09 07:01:55'",
                path + ":3: num_gpus '-1' must be at least 1",
                path + ":4: expected 5 fields, got 6",
            }));
}

TEST(AlibabaPodReaderTest, ReadsSharesCpuOnlyPodsAndModels) {
  const Trace trace = ReadTrace(DataPath("alibaba_pods_small.csv"), TraceFormat::kAlibabaPods);
  ASSERT_EQ(TraceIds(trace), (std::vector<std::string>{"pod-1", "pod-0", "pod-2", "pod-3"}));
  const TraceJob& share = trace.jobs[0];
  EXPECT_EQ(share.spec.submit_time, 0);
  EXPECT_EQ(share.duration, 30'000);
  EXPECT_EQ(share.spec.gpu_milli_per_task, 460);
  EXPECT_TRUE(share.spec.Fractional());
  EXPECT_EQ(share.spec.cpu_milli_per_task, 6000);
  EXPECT_EQ(share.spec.memory_mib_per_task, 12288);

  const TraceJob& whole = trace.jobs[1];
  EXPECT_EQ(whole.spec.submit_time, 50'000);
  EXPECT_EQ(whole.duration, 1'000'000);
  EXPECT_EQ(whole.spec.gpu_milli_per_task, 1000);

  const TraceJob& cpu_only = trace.jobs[2];  // Pending: still demand
  EXPECT_EQ(cpu_only.spec.submit_time, 50'000);
  EXPECT_EQ(cpu_only.duration, 0);
  EXPECT_EQ(cpu_only.spec.gpu_milli_per_task, 0);
  EXPECT_EQ(cpu_only.spec.cpu_milli_per_task, 4000);
  EXPECT_EQ(cpu_only.spec.memory_mib_per_task, 8192);

  const TraceJob& multi = trace.jobs[3];
  EXPECT_EQ(multi.spec.submit_time, 150'000);
  EXPECT_EQ(multi.duration, 60'000);
  EXPECT_EQ(multi.spec.tasks, 1);  // a pod runs on one node
  EXPECT_EQ(multi.spec.gpu_milli_per_task, 8000);
  EXPECT_EQ(multi.spec.gpu_models, (std::vector<std::string>{"V100M16", "V100M32"}));
  EXPECT_EQ(multi.line, 5);
}

TEST(AlibabaPodReaderTest, ListsWithoutTimesKeepFileOrderAtTimeZero) {
  const Trace trace = ReadTrace(DataPath("alibaba_pods_no_times.csv"));
  ASSERT_EQ(TraceIds(trace), (std::vector<std::string>{"pod-0", "pod-1", "pod-2"}));
  const std::vector<MilliGpu> milli = {1000, 460, 4000};
  for (size_t i = 0; i < milli.size(); ++i) {
    EXPECT_EQ(trace.jobs[i].spec.submit_time, 0);
    EXPECT_EQ(trace.jobs[i].duration, 0);
    EXPECT_EQ(trace.jobs[i].spec.tasks, 1);
    EXPECT_EQ(trace.jobs[i].spec.gpu_milli_per_task, milli[i]);
  }
}

TEST(AlibabaPodReaderTest, RejectsInconsistentGpuFields) {
  const std::string path =
      WriteTempFile("pods_bad.csv",
                    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time\n"
                    "a,1000,1024,2,500,0,10\n"
                    "b,1000,1024,0,300,0,10\n"
                    "c,1000,1024,1,1500,0,10\n"
                    "d,1000,1024,1,1000,10,5\n"
                    "e,1000,1024,1,1000,0,10\n");
  const Trace trace = ReadTrace(path, {.skip_invalid = true});
  EXPECT_EQ(TraceIds(trace), (std::vector<std::string>{"e"}));
  EXPECT_EQ(trace.skip_examples,
            (std::vector<std::string>{
                path + ":2: gpu_milli 500 is a share of one GPU but num_gpu is 2",
                path + ":3: num_gpu 0 with gpu_milli 300: a CPU-only pod has no GPU share",
                path + ":4: gpu_milli 1500 with num_gpu 1: expected 1 to 1000",
                path + ":5: deletion_time '5' is before creation_time '10'",
            }));
}

TEST(GenericReaderTest, ReadsColumnsByNameWithQuotes) {
  const Trace trace = ReadTrace(DataPath("generic_small.csv"));
  ASSERT_EQ(TraceIds(trace),
            (std::vector<std::string>{"gang", "pertask", "frac \"half\"", "cpu-only"}));

  const JobSpec& gang = trace.jobs[0].spec;
  EXPECT_EQ(gang.submit_time, 0);
  EXPECT_EQ(trace.jobs[0].duration, 3'600'000);
  EXPECT_EQ(gang.tasks, 2);
  EXPECT_EQ(gang.gpu_milli_per_task, 8000);
  EXPECT_EQ(gang.queue, "default");
  EXPECT_EQ(gang.priority, 0);
  EXPECT_EQ(gang.runtime_estimate, std::nullopt);
  EXPECT_TRUE(gang.preemptible);

  const JobSpec& per_task = trace.jobs[1].spec;  // with a tasks column, gpus is per task
  EXPECT_EQ(per_task.tasks, 2);
  EXPECT_EQ(per_task.gpu_milli_per_task, 4000);
  EXPECT_EQ(per_task.cpu_milli_per_task, 250);
  EXPECT_EQ(per_task.queue, "research");
  EXPECT_EQ(per_task.priority, -1);
  EXPECT_TRUE(per_task.preemptible);

  const TraceJob& fraction = trace.jobs[2];
  EXPECT_EQ(fraction.spec.submit_time, 5'500);
  EXPECT_EQ(fraction.duration, 60'000);
  EXPECT_EQ(fraction.spec.tasks, 1);
  EXPECT_EQ(fraction.spec.gpu_milli_per_task, 500);
  EXPECT_EQ(fraction.spec.queue, "team, a");
  EXPECT_EQ(fraction.spec.cpu_milli_per_task, 2500);
  EXPECT_EQ(fraction.spec.memory_mib_per_task, 4096);
  EXPECT_EQ(fraction.spec.gpu_models, (std::vector<std::string>{"A100", "H100"}));
  EXPECT_EQ(fraction.spec.min_gpu_memory_mib, 40000);
  EXPECT_EQ(fraction.spec.priority, 3);
  EXPECT_EQ(fraction.spec.runtime_estimate, 90'000);
  EXPECT_FALSE(fraction.spec.preemptible);
  EXPECT_EQ(fraction.line, 2);

  const JobSpec& cpu_only = trace.jobs[3].spec;
  EXPECT_EQ(cpu_only.submit_time, 15'000);
  EXPECT_EQ(cpu_only.gpu_milli_per_task, 0);
  EXPECT_EQ(cpu_only.cpu_milli_per_task, 4000);
  EXPECT_EQ(cpu_only.memory_mib_per_task, 1024);
  EXPECT_TRUE(cpu_only.preemptible);
}

TEST(GenericReaderTest, NamesUnknownColumns) {
  const std::string path = DataPath("generic_unknown_column.csv");
  const std::string message = TraceErrorOf([&] { ReadTrace(path); });
  EXPECT_TRUE(message.starts_with(path + ":1: unknown columns 'gpu_modle', 'prio' (known: "))
      << message;
}

TEST(GenericReaderTest, SkipsBadRowsKeepingTheFirstFiveMessages) {
  const std::string path = DataPath("generic_bad_rows.csv");
  const Trace trace = ReadTrace(path, {.skip_invalid = true});
  ASSERT_EQ(trace.jobs.size(), 1u);
  EXPECT_EQ(trace.jobs[0].spec.queue, "ok");
  EXPECT_EQ(trace.jobs[0].spec.submit_time, 0);
  EXPECT_EQ(trace.jobs[0].line, 2);
  EXPECT_EQ(trace.skipped, 6);
  EXPECT_EQ(trace.skip_examples, (std::vector<std::string>{
                                     path + ":3: gpus '1.5': above one GPU the count must be whole",
                                     path + ":4: gpus '-1' is negative",
                                     path + ":5: the job asks for no GPU, CPU or memory",
                                     path + ":6: preemptible 'maybe' is not true, false, 1 or 0",
                                     path + ":7: text after the closing quote of a field",
                                 }));
  EXPECT_EQ(TraceErrorOf([&] { ReadTrace(path); }),
            path + ":3: gpus '1.5': above one GPU the count must be whole");
}

TEST(GenericReaderTest, RejectsAFileWhoseRowsAreAllInvalid) {
  const std::string path = WriteTempFile("generic_all_bad.csv",
                                         "submit_time,duration,gpus\n"
                                         "0,-1,1\n"
                                         "0,1,x\n");
  EXPECT_EQ(TraceErrorOf([&] { ReadTrace(path, {.skip_invalid = true}); }),
            path + ":2: duration '-1' is negative (and all 2 rows are invalid)");
}

TEST(ValidationTest, StopsAtTheFirstBadRowWithFileAndLine) {
  const std::string path = DataPath("itp_bad_rows.csv");
  EXPECT_EQ(TraceErrorOf([&] { ReadTrace(path); }), path + ":3: duration '-5' is negative");
}

TEST(ValidationTest, SkipsAndCountsBadRows) {
  const std::string path = DataPath("itp_bad_rows.csv");
  const Trace trace = ReadTrace(path, {.skip_invalid = true});
  EXPECT_EQ(TraceIds(trace), (std::vector<std::string>{"ok-1", "ok-2", "ok-3"}));
  EXPECT_EQ(trace.jobs[1].line, 7);
  EXPECT_EQ(trace.jobs[2].spec.submit_time, 8'000);
  EXPECT_EQ(trace.skipped, 6);
  EXPECT_EQ(trace.skip_examples, (std::vector<std::string>{
                                     path + ":3: duration '-5' is negative",
                                     path + ":4: duration 'abc' is not a number",
                                     path + ":5: expected 4 fields, got 3",
                                     path + ":6: num_gpu '0' must be at least 1",
                                     path + ":8: num_gpu '1.5' is not a whole number",
                                 }));
}

TEST(ValidationTest, ReportsMissingColumnsOnLineOne) {
  const std::string path = DataPath("itp_missing_column.csv");
  EXPECT_EQ(TraceErrorOf([&] { ReadTrace(path, TraceFormat::kItp); }),
            path + ":1: missing column 'duration'");
  EXPECT_EQ(TraceErrorOf([&] { ReadTrace(path, TraceFormat::kGeneric); }),
            path + ":1: missing column 'submit_time'");
}

TEST(ValidationTest, RejectsEmptyAndHeaderOnlyFiles) {
  const std::string empty = DataPath("empty.csv");
  EXPECT_EQ(TraceErrorOf([&] { ReadTrace(empty); }),
            empty + ":1: empty file: expected a header line");
  const std::string header_only = DataPath("header_only.csv");
  EXPECT_EQ(TraceErrorOf([&] { ReadTrace(header_only); }),
            header_only + ":1: no jobs: the file has a header but no rows");
}

TEST(ValidationTest, ReportsMissingFiles) {
  const std::string path = DataPath("no_such_file.csv");
  EXPECT_EQ(TraceErrorOf([&] { ReadTrace(path); }),
            path + ":0: cannot open: No such file or directory");
}

TEST(ValidationTest, RejectsDuplicateColumns) {
  const std::string path = WriteTempFile("duplicate.csv", "submit_time,duration,gpus,gpus\n");
  EXPECT_EQ(TraceErrorOf([&] { ReadTrace(path); }), path + ":1: duplicate column 'gpus'");
}

TEST(AlibabaNodeReaderTest, BuildsNodesRacksAndGpus) {
  const Cluster cluster = ReadAlibabaNodes(DataPath("alibaba_nodes_small.csv"), 2, 2);
  EXPECT_EQ(ValidateCluster(cluster), std::nullopt);
  ASSERT_EQ(cluster.nodes.size(), 5u);
  EXPECT_EQ(cluster.TotalGpus(), 15);

  const Node& first = cluster.nodes[0];
  EXPECT_EQ(first.name, "node-a");
  EXPECT_EQ(first.cpu_milli, 96000);
  EXPECT_EQ(first.memory_mib, 786432);
  ASSERT_EQ(first.gpus.size(), 8u);
  EXPECT_EQ(first.gpus[7].uuid, "GPU-node-a-7");
  EXPECT_EQ(first.gpus[7].index, 7);
  EXPECT_EQ(first.gpus[7].model, "V100M32");
  EXPECT_EQ(first.gpus[7].memory_mib, 32 * 1024);
  EXPECT_EQ(first.gpus[7].nvlink_island, 0);

  EXPECT_TRUE(cluster.nodes[1].gpus.empty());
  EXPECT_EQ(cluster.nodes[2].gpus[1].memory_mib, 0);  // G2: memory unknown
  EXPECT_EQ(cluster.nodes[3].gpus[0].memory_mib, 16 * 1024);
  EXPECT_EQ(cluster.nodes[4].gpus[0].memory_mib, 24 * 1024);

  const std::vector<std::pair<std::string, std::string>> placement = {{"rack-000", "spine-00"},
                                                                      {"rack-000", "spine-00"},
                                                                      {"rack-001", "spine-00"},
                                                                      {"rack-001", "spine-00"},
                                                                      {"rack-002", "spine-01"}};
  for (size_t i = 0; i < placement.size(); ++i) {
    EXPECT_EQ(cluster.nodes[i].rack, placement[i].first) << i;
    EXPECT_EQ(cluster.nodes[i].spine, placement[i].second) << i;
  }
}

TEST(AlibabaNodeReaderTest, RejectsBadRows) {
  const std::string path = DataPath("alibaba_nodes_bad.csv");
  EXPECT_EQ(TraceErrorOf([&] { ReadAlibabaNodes(path, 16, 8); }), path + ":3: 2 GPUs but no model");
  const std::string duplicate = WriteTempFile(
      "nodes_duplicate.csv", "sn,cpu_milli,memory_mib,gpu,model\nn,1,1,0,\nn,1,1,0,\n");
  EXPECT_EQ(TraceErrorOf([&] { ReadAlibabaNodes(duplicate, 16, 8); }),
            duplicate + ":3: duplicate node 'n', first on line 2");
  EXPECT_THROW(ReadAlibabaNodes(path, 0, 8), std::invalid_argument);
}

TEST(AlibabaNodeReaderTest, KnowsGpuMemoryOfTheTraceModels) {
  EXPECT_EQ(AlibabaGpuMemoryMib("P100"), 16384);
  EXPECT_EQ(AlibabaGpuMemoryMib("T4"), 16384);
  EXPECT_EQ(AlibabaGpuMemoryMib("V100M16"), 16384);
  EXPECT_EQ(AlibabaGpuMemoryMib("V100M32"), 32768);
  EXPECT_EQ(AlibabaGpuMemoryMib("A10"), 24576);
  EXPECT_EQ(AlibabaGpuMemoryMib("G2"), 0);
  EXPECT_EQ(AlibabaGpuMemoryMib("G3"), 0);
}

// The published traces, when the shared folder is present.
class SharedTracesTest : public testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::is_directory(kTracesDir))
      GTEST_SKIP() << "no shared traces at " << kTracesDir;
  }
  static std::string TracePath(std::string_view name) {
    return kTracesDir + "/" + std::string(name);
  }

  static inline const std::string kTracesDir = GPUFLEET_TRACES_DIR;
};

// Sorted by submit time, ties in file order, numbered, starting at 0, with no row skipped.
void ExpectSortedFromZero(const Trace& trace) {
  ASSERT_FALSE(trace.jobs.empty());
  EXPECT_EQ(trace.skipped, 0);
  EXPECT_EQ(trace.jobs.front().spec.submit_time, 0);
  for (size_t i = 0; i < trace.jobs.size(); ++i) {
    ASSERT_EQ(trace.jobs[i].spec.id, i);
    if (i == 0) continue;
    const TraceJob& previous = trace.jobs[i - 1];
    ASSERT_LE(previous.spec.submit_time, trace.jobs[i].spec.submit_time);
    if (previous.spec.submit_time == trace.jobs[i].spec.submit_time) {
      ASSERT_LT(previous.line, trace.jobs[i].line) << "ties keep file order";
    }
  }
}

TEST_F(SharedTracesTest, Philly) {
  const Trace trace = ReadTrace(TracePath("philly/philly.csv"));
  ASSERT_EQ(trace.jobs.size(), 82'247u);
  ExpectSortedFromZero(trace);
  // The earliest job, 2017-09-04 10:30:41, is on line 31568; the last is 2017-12-22 08:02:11.
  EXPECT_EQ(trace.jobs.front().line, 31'568);
  EXPECT_EQ(trace.jobs.front().duration, 2'240'194'000);
  EXPECT_EQ(trace.jobs.front().spec.queue, "7f04ca");
  EXPECT_EQ(trace.jobs.back().spec.submit_time, 9'408'690'000);

  int64_t total_gpus = 0;
  int64_t gangs = 0;
  MilliGpu largest = 0;
  std::set<std::string> queues;
  for (const TraceJob& job : trace.jobs) {
    total_gpus += job.spec.TotalGpuMilli() / kMilliPerGpu;
    gangs += job.spec.tasks > 1 ? 1 : 0;
    largest = std::max(largest, job.spec.TotalGpuMilli());
    queues.insert(job.spec.queue);
    EXPECT_LE(job.spec.gpu_milli_per_task, 8000);
  }
  EXPECT_EQ(total_gpus, 107'235);
  EXPECT_EQ(largest, 128'000);  // 3 jobs of 128 GPUs, as 16 tasks of 8
  EXPECT_EQ(gangs, 289);        // 12, 16, 24, 32, 64 and 128 GPUs
  EXPECT_EQ(queues.size(), 15u);
}

TEST_F(SharedTracesTest, ItpClusters) {
  // The ITP files have no final newline, so `wc -l` counts one job less.
  const Trace cluster01 = ReadTrace(TracePath("itp/cluster01.csv"));
  ASSERT_EQ(cluster01.jobs.size(), 1'595u);
  ExpectSortedFromZero(cluster01);
  EXPECT_EQ(cluster01.jobs.front().trace_id, "965d744f-0445-c1a8-12af-97e4c536c66e");
  EXPECT_EQ(cluster01.jobs.front().spec.tasks, 8);  // 64 GPUs
  EXPECT_EQ(cluster01.jobs.front().duration, 2'429'000);

  const std::map<std::string, size_t> sizes = {
      {"cluster02", 5'778},  {"cluster03", 3'011},  {"cluster05", 3'629}, {"cluster06", 2'396},
      {"cluster08", 13'047}, {"cluster09", 11'134}, {"cluster10", 260}};
  for (const auto& [name, jobs] : sizes) {
    const Trace trace = ReadTrace(TracePath("itp/" + name + ".csv"), TraceFormat::kItp);
    EXPECT_EQ(trace.jobs.size(), jobs) << name;
    ExpectSortedFromZero(trace);
  }
}

TEST_F(SharedTracesTest, AlibabaNodes) {
  const Cluster gpu_nodes =
      ReadAlibabaNodes(TracePath("alibaba-gpu-v2023/openb_node_list_gpu_node.csv"), 16, 8);
  EXPECT_EQ(gpu_nodes.nodes.size(), 1'213u);
  EXPECT_EQ(gpu_nodes.TotalGpus(), 6'212);
  EXPECT_EQ(ValidateCluster(gpu_nodes), std::nullopt);
  std::map<std::string, int64_t> gpus_by_model;
  for (const Node& node : gpu_nodes.nodes) {
    for (const Gpu& gpu : node.gpus)
      ++gpus_by_model[gpu.model];
  }
  EXPECT_EQ(gpus_by_model.size(), 7u);                 // P100, T4, V100M16, V100M32, A10, G2, G3
  EXPECT_EQ(gpu_nodes.nodes.back().rack, "rack-075");  // 1,213 nodes in racks of 16

  const Cluster all_nodes =
      ReadAlibabaNodes(TracePath("alibaba-gpu-v2023/openb_node_list_all_node.csv"), 16, 8);
  EXPECT_EQ(all_nodes.nodes.size(), 1'523u);
  EXPECT_EQ(all_nodes.TotalGpus(), 6'212);
}

TEST_F(SharedTracesTest, AlibabaDefaultPods) {
  const Trace trace = ReadTrace(TracePath("alibaba-gpu-v2023/openb_pod_list_default.csv"));
  ASSERT_EQ(trace.jobs.size(), 8'152u);
  ExpectSortedFromZero(trace);
  int64_t fractional = 0;
  int64_t cpu_only = 0;
  int64_t whole = 0;
  int64_t total_milli = 0;
  for (const TraceJob& job : trace.jobs) {
    EXPECT_EQ(job.spec.tasks, 1);
    if (job.spec.Fractional()) {
      ++fractional;
    } else if (job.spec.gpu_milli_per_task == 0) {
      ++cpu_only;
    } else {
      ++whole;
    }
    total_milli += job.spec.TotalGpuMilli();
  }
  EXPECT_EQ(fractional, 3'078);
  EXPECT_EQ(cpu_only, 1'088);
  EXPECT_EQ(whole, 3'986);
  EXPECT_EQ(total_milli, 6'086'800);
  EXPECT_EQ(trace.jobs.back().spec.submit_time, 12'901'761'000);
}

TEST_F(SharedTracesTest, EveryAlibabaPodListReads) {
  const std::map<std::string, size_t> sizes = {
      {"gpushare20", 8'152}, {"gpushare40", 8'152},  {"gpushare60", 8'152},
      {"gpushare80", 8'152}, {"gpushare100", 8'152}, {"multigpu20", 8'324},
      {"multigpu30", 8'508}, {"multigpu40", 8'746},  {"multigpu50", 9'061}};
  for (const auto& [name, pods] : sizes) {
    const Trace trace = ReadTrace(TracePath("alibaba-gpu-v2023/openb_pod_list_" + name + ".csv"));
    EXPECT_EQ(trace.jobs.size(), pods) << name;
    ExpectSortedFromZero(trace);
  }
  // Without times, every pod submits at 0 in file order.
  const Trace multigpu = ReadTrace(TracePath("alibaba-gpu-v2023/openb_pod_list_multigpu50.csv"));
  EXPECT_EQ(multigpu.jobs.back().spec.submit_time, 0);
  EXPECT_EQ(multigpu.jobs.back().trace_id, "openb-pod-9060");
  EXPECT_EQ(multigpu.jobs.back().line, 9'062);
}

}  // namespace
}  // namespace gpufleet::sim
