// Executor tests with real processes: environment and exit codes, log capture, cancel and its
// grace period, max runtime, agent restarts, start failures, and cgroup limits where this machine
// lets us write cgroups.

#include "agent/executor.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "agent/executor_util.h"
#include "executor_test_util.h"

namespace gpufleet::agent {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using executor_testing::ProcessGone;
using executor_testing::ReadText;
using executor_testing::WaitFinished;
using executor_testing::WaitForText;
using executor_testing::WaitUntil;
using executor_testing::WriteText;

class ExecutorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); }

  void SetUp() override {
    root_ = executor_testing::FreshTestDir("executor");
    fs::create_directories(root_ / "work");
  }

  void TearDown() override {
    // Leave nothing running: cancel what a failed test left behind.
    if (executor_) {
      for (const WorkloadStatus& status : executor_->List())
        if (!status.Finished()) executor_->Cancel(status.id, 0);
      for (const WorkloadStatus& status : executor_->List())
        WaitFinished(*executor_, status.id, 3s);
    }
    executor_.reset();
    executor_testing::ReapExitedChildren();
    fs::remove_all(root_);
  }

  ExecutorConfig Config(CgroupMode mode = CgroupMode::kNone) {
    ExecutorConfig config;
    config.data_dir = (root_ / "data").string();
    config.shim_command = {GPUFLEET_TEST_SHIM};
    config.cgroup_mode = mode;
    config.cgroup_parent = "gpufleet-test-" + std::to_string(::getpid());
    return config;
  }

  Executor& Open(ExecutorConfig config) {
    auto opened = Executor::Open(std::move(config));
    EXPECT_TRUE(opened.ok()) << opened.error();
    if (!opened.ok()) std::abort();
    executor_ = std::move(opened.value());
    return *executor_;
  }
  Executor& Open(CgroupMode mode = CgroupMode::kNone) { return Open(Config(mode)); }

  WorkloadSpec Shell(const std::string& id, const std::string& script) {
    WorkloadSpec spec;
    spec.id = id;
    spec.argv = {"/bin/sh", "-c", script};
    spec.workdir = (root_ / "work").string();
    spec.grace_period = 2000;
    return spec;
  }

  WorkloadStatus LaunchOk(const WorkloadSpec& spec) {
    auto launched = executor_->Launch(spec);
    EXPECT_TRUE(launched.ok()) << launched.error();
    if (!launched.ok()) return {};
    return launched.value();
  }

  fs::path root_;
  std::unique_ptr<Executor> executor_;
};

TEST_F(ExecutorTest, RunsWithItsGpusAndEnvironmentAndReportsTheExitCode) {
  Executor& executor = Open();
  ::setenv("GPUFLEET_TEST_AGENT_ONLY", "leaked", 1);
  WorkloadSpec spec = Shell("env-task", R"sh(
    echo "CUDA=$CUDA_VISIBLE_DEVICES"
    echo "NVIDIA=$NVIDIA_VISIBLE_DEVICES"
    echo "ORDER=$CUDA_DEVICE_ORDER"
    echo "UUIDS=$GPUFLEET_GPU_UUIDS"
    echo "JOB=$GPUFLEET_JOB_ID TASK=$GPUFLEET_TASK_INDEX"
    echo "MINE=$MY_SETTING AGENT=$GPUFLEET_TEST_AGENT_ONLY"
    echo "PWD=$(pwd)"
    echo "this goes to stderr" >&2
    exit 3)sh");
  spec.job_id = 42;
  spec.task_index = 1;
  spec.gpu_indices = {2, 5};  // 2 of a node's 8 GPUs
  spec.gpu_uuids = {"GPU-aaaa", "GPU-bbbb"};
  spec.env = {{"MY_SETTING", "hello world"}, {"CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7"}};

  WorkloadStatus launched = LaunchOk(spec);
  EXPECT_TRUE(launched.state == WorkloadState::kRunning || launched.state == WorkloadState::kExited)
      << WorkloadStateName(launched.state) << " " << launched.error;
  EXPECT_GT(launched.pid, 0);
  EXPECT_EQ(launched.pgid, launched.pid);

  WorkloadStatus status = WaitFinished(executor, "env-task");
  ASSERT_EQ(status.state, WorkloadState::kExited) << status.error;
  EXPECT_EQ(status.exit_code, 3);
  EXPECT_FALSE(status.signal.has_value());
  EXPECT_FALSE(status.cancelled);
  EXPECT_GT(status.finished_at_ms, 0);
  EXPECT_GE(status.finished_at_ms, status.started_at_ms);

  std::string out = ReadText(status.stdout_log);
  EXPECT_NE(out.find("CUDA=2,5\n"), std::string::npos) << out;  // the user's value lost
  EXPECT_NE(out.find("NVIDIA=2,5\n"), std::string::npos) << out;
  EXPECT_NE(out.find("ORDER=PCI_BUS_ID\n"), std::string::npos) << out;
  EXPECT_NE(out.find("UUIDS=GPU-aaaa,GPU-bbbb\n"), std::string::npos) << out;
  EXPECT_NE(out.find("JOB=42 TASK=1\n"), std::string::npos) << out;
  EXPECT_NE(out.find("MINE=hello world AGENT=\n"), std::string::npos) << out;
  EXPECT_NE(out.find("PWD=" + (root_ / "work").string() + "\n"), std::string::npos) << out;
  EXPECT_EQ(ReadText(status.stderr_log), "this goes to stderr\n");
  ::unsetenv("GPUFLEET_TEST_AGENT_ONLY");
}

TEST_F(ExecutorTest, DefaultWorkdirAndNoGpus) {
  Executor& executor = Open();
  WorkloadSpec spec =
      Shell("cpu-only",
            R"sh(echo "CUDA=[$CUDA_VISIBLE_DEVICES] NV=$NVIDIA_VISIBLE_DEVICES PWD=$(pwd)")sh");
  spec.workdir.clear();
  LaunchOk(spec);
  WorkloadStatus status = WaitFinished(executor, "cpu-only");
  ASSERT_EQ(status.exit_code, 0) << status.error;
  EXPECT_EQ(ReadText(status.stdout_log),
            "CUDA=[] NV=none PWD=" + (root_ / "data/workloads/cpu-only/work").string() + "\n");
}

TEST_F(ExecutorTest, MeasuresLaunchLatencyAndShimFootprint) {
  Executor& executor = Open();
  auto start = std::chrono::steady_clock::now();
  WorkloadStatus status = LaunchOk(Shell("latency", "exec sleep 100"));
  auto latency = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::steady_clock::now() - start);
  ASSERT_EQ(status.state, WorkloadState::kRunning) << status.error;
  std::string shim_status = ReadText("/proc/" + std::to_string(status.shim_pid) + "/status");
  auto rss_at = shim_status.find("VmRSS:");
  ASSERT_NE(rss_at, std::string::npos);
  std::string rss = shim_status.substr(rss_at, shim_status.find('\n', rss_at) - rss_at);
  std::cout << "[ measure  ] launch-to-running " << latency.count() << " us; shim " << rss << "\n";
  RecordProperty("launch_to_running_us", std::to_string(latency.count()));
  EXPECT_LT(latency, 2s);
  // The shim runs in a session of its own (not the agent's), the workload in its own group.
  EXPECT_NE(::getsid(status.shim_pid), ::getsid(0));
  EXPECT_EQ(::getpgid(status.pid), status.pid);
  EXPECT_NE(::getpgid(status.pid), ::getpgid(0));
  executor.Cancel("latency", 0);
  EXPECT_EQ(WaitFinished(executor, "latency").signal, SIGKILL);
}

TEST_F(ExecutorTest, RotatesLogsAndAccountsForEveryByte) {
  Executor& executor = Open();
  // 2000 numbered lines of 19 bytes, rotated every 1000 bytes: 52 whole lines (988 bytes) fit
  // in a file, so 38 rotated files of 52 lines and 24 lines in the live one.
  WorkloadSpec spec = Shell(
      "rotate", R"(i=0; while [ $i -lt 2000 ]; do printf 'line %013d\n' $i; i=$((i+1)); done)");
  spec.logs.rotate_bytes = 1000;
  spec.logs.keep_files = 100;
  LaunchOk(spec);
  WorkloadStatus status = WaitFinished(executor, "rotate");
  ASSERT_EQ(status.exit_code, 0) << status.error;

  std::string expected;
  for (int i = 0; i < 2000; ++i)
    expected += fmt::format("line {:013d}\n", i);
  std::string joined;
  int rotated = 0;
  while (fs::exists(status.stdout_log + "." + std::to_string(rotated + 1)))
    ++rotated;
  EXPECT_EQ(rotated, 38);
  for (int index = rotated; index >= 1; --index) {
    std::string path = status.stdout_log + "." + std::to_string(index);
    EXPECT_LE(fs::file_size(path), 1000u) << path;
    joined += ReadText(path);
  }
  joined += ReadText(status.stdout_log);
  EXPECT_EQ(joined.size(), expected.size());
  EXPECT_TRUE(joined == expected);
  EXPECT_EQ(status.log_bytes_dropped, 0);
}

TEST_F(ExecutorTest, RotationKeepsOnlyTheNewestFiles) {
  Executor& executor = Open();
  WorkloadSpec spec =
      Shell("keep", R"(i=0; while [ $i -lt 500 ]; do printf 'line %013d\n' $i; i=$((i+1)); done)");
  spec.logs.rotate_bytes = 1000;
  spec.logs.keep_files = 2;
  LaunchOk(spec);
  WorkloadStatus status = WaitFinished(executor, "keep");
  ASSERT_EQ(status.exit_code, 0) << status.error;
  EXPECT_TRUE(fs::exists(status.stdout_log + ".2"));
  EXPECT_FALSE(fs::exists(status.stdout_log + ".3"));
  // 500 lines: 9 files of 52 lines rotated, 32 lines live; the live file and the two newest
  // rotated ones hold the last 32 + 2 * 52 lines, from line 364 on.
  std::string tail = ReadText(status.stdout_log + ".2") + ReadText(status.stdout_log + ".1") +
                     ReadText(status.stdout_log);
  std::string expected;
  for (int i = 364; i < 500; ++i)
    expected += fmt::format("line {:013d}\n", i);
  EXPECT_EQ(tail, expected);
}

TEST_F(ExecutorTest, CancelTerminatesTheWholeProcessGroup) {
  Executor& executor = Open();
  // A grandchild in the background, the main process waiting on it.
  WorkloadStatus launched =
      LaunchOk(Shell("cancel-group", "sleep 100 & echo $! > grandchild.pid; echo ready; wait"));
  ASSERT_TRUE(WaitForText(launched.stdout_log, "ready"));
  pid_t grandchild = std::stoi(ReadText(root_ / "work/grandchild.pid"));
  ASSERT_FALSE(ProcessGone(grandchild));

  auto cancelled = executor.Cancel("cancel-group");
  ASSERT_TRUE(cancelled.ok()) << cancelled.error();
  EXPECT_TRUE(cancelled.value().cancelled);
  WorkloadStatus status = WaitFinished(executor, "cancel-group");
  ASSERT_EQ(status.state, WorkloadState::kExited) << status.error;
  EXPECT_EQ(status.signal, SIGTERM);
  EXPECT_FALSE(status.exit_code.has_value());
  EXPECT_TRUE(status.cancelled);
  EXPECT_FALSE(status.killed_after_grace);
  EXPECT_TRUE(WaitUntil([&] { return ProcessGone(grandchild); }, 2s));
  EXPECT_TRUE(ProcessGone(status.pid));
  // Cancelling again changes nothing.
  auto again = executor.Cancel("cancel-group");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again.value().signal, SIGTERM);
}

TEST_F(ExecutorTest, CancelLetsATrapCleanUpAndExitZero) {
  Executor& executor = Open();
  WorkloadStatus launched = LaunchOk(
      Shell("cancel-trap",
            "trap 'echo cleaning up; exit 0' TERM; echo ready; while :; do sleep 0.05; done"));
  ASSERT_TRUE(WaitForText(launched.stdout_log, "ready"));
  ASSERT_TRUE(executor.Cancel("cancel-trap").ok());
  WorkloadStatus status = WaitFinished(executor, "cancel-trap");
  ASSERT_EQ(status.state, WorkloadState::kExited) << status.error;
  EXPECT_EQ(status.exit_code, 0);
  EXPECT_TRUE(status.cancelled);
  EXPECT_FALSE(status.killed_after_grace);
  EXPECT_NE(ReadText(status.stdout_log).find("cleaning up"), std::string::npos);
}

TEST_F(ExecutorTest, CancelKillsAfterTheGracePeriodWhenTermIsIgnored) {
  Executor& executor = Open();
  WorkloadSpec spec = Shell("cancel-stubborn",
                            "trap '' TERM; sleep 100 & echo $! > grandchild.pid; echo ready; "
                            "while :; do sleep 0.05; done");
  spec.grace_period = 30'000;  // overridden below
  WorkloadStatus launched = LaunchOk(spec);
  ASSERT_TRUE(WaitForText(launched.stdout_log, "ready"));
  pid_t grandchild = std::stoi(ReadText(root_ / "work/grandchild.pid"));

  auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(executor.Cancel("cancel-stubborn", 300).ok());
  WorkloadStatus status = WaitFinished(executor, "cancel-stubborn");
  auto took = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(status.state, WorkloadState::kExited) << status.error;
  EXPECT_EQ(status.signal, SIGKILL);
  EXPECT_TRUE(status.cancelled);
  EXPECT_TRUE(status.killed_after_grace);
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 5s);
  EXPECT_TRUE(WaitUntil([&] { return ProcessGone(grandchild); }, 2s));
}

TEST_F(ExecutorTest, MaxRuntimeTerminatesAndSaysSo) {
  Executor& executor = Open();
  WorkloadSpec spec = Shell("timeout", "exec sleep 100");
  spec.max_runtime = 200;
  spec.grace_period = 200;
  LaunchOk(spec);
  WorkloadStatus status = WaitFinished(executor, "timeout");
  ASSERT_EQ(status.state, WorkloadState::kExited) << status.error;
  EXPECT_EQ(status.signal, SIGTERM);
  EXPECT_TRUE(status.timed_out);
  EXPECT_FALSE(status.cancelled);
  EXPECT_GE(status.finished_at_ms - status.started_at_ms, 200);
}

TEST_F(ExecutorTest, ANewExecutorAdoptsRunningWorkloads) {
  Open();
  WorkloadStatus launched = LaunchOk(
      Shell("survivor", "while [ ! -f release ]; do sleep 0.02; done; echo released; exit 7"));
  ASSERT_EQ(launched.state, WorkloadState::kRunning) << launched.error;
  LaunchOk(Shell("to-cancel", "exec sleep 100"));
  executor_.reset();  // the agent goes away; its workloads must not

  EXPECT_FALSE(ProcessGone(launched.pid));
  Executor& executor = Open();
  ASSERT_EQ(executor.adopted().size(), 2u);
  EXPECT_EQ(executor.adopted()[0].id, "survivor");
  EXPECT_EQ(executor.adopted()[0].state, WorkloadState::kRunning);
  auto adopted = executor.Get("survivor");
  ASSERT_TRUE(adopted.ok()) << adopted.error();
  EXPECT_EQ(adopted.value().state, WorkloadState::kRunning);
  EXPECT_EQ(adopted.value().pid, launched.pid);
  EXPECT_EQ(adopted.value().shim_pid, launched.shim_pid);

  WriteText(root_ / "work/release", "");
  WorkloadStatus status = WaitFinished(executor, "survivor");
  ASSERT_EQ(status.state, WorkloadState::kExited) << status.error;
  EXPECT_EQ(status.exit_code, 7);
  EXPECT_EQ(ReadText(status.stdout_log), "released\n");

  // Cancel works the same on an adopted workload.
  ASSERT_TRUE(executor.Cancel("to-cancel", 1000).ok());
  WorkloadStatus cancelled = WaitFinished(executor, "to-cancel");
  EXPECT_EQ(cancelled.signal, SIGTERM);
  EXPECT_TRUE(cancelled.cancelled);
}

TEST_F(ExecutorTest, ADeadShimMeansLostAndCancelStillKillsTheGroup) {
  Executor& executor = Open();
  WorkloadSpec spec = Shell("orphan", "trap '' TERM; echo ready; while :; do sleep 0.05; done");
  WorkloadStatus launched = LaunchOk(spec);
  ASSERT_TRUE(WaitForText(launched.stdout_log, "ready"));
  ASSERT_EQ(::kill(launched.shim_pid, SIGKILL), 0);
  ASSERT_TRUE(WaitUntil([&] { return ProcessGone(launched.shim_pid); }, 2s));

  auto lost = executor.Get("orphan");
  ASSERT_TRUE(lost.ok());
  EXPECT_EQ(lost.value().state, WorkloadState::kLost);
  EXPECT_NE(lost.value().error.find("shim"), std::string::npos) << lost.value().error;
  EXPECT_NE(lost.value().error.find("still run"), std::string::npos) << lost.value().error;
  EXPECT_FALSE(ProcessGone(launched.pid));
  auto refused = executor.Forget("orphan");
  ASSERT_TRUE(refused.has_value());
  EXPECT_NE(refused->find("cancel it first"), std::string::npos) << *refused;

  // It ignores SIGTERM: the executor's own timer must SIGKILL it after the grace period.
  ASSERT_TRUE(executor.Cancel("orphan", 200).ok());
  EXPECT_TRUE(WaitUntil([&] { return ProcessGone(launched.pid); }, 3s));
  // Its children got the same SIGKILL and may take a moment longer to exit.
  EXPECT_TRUE(WaitUntil(
      [&] { return executor.Get("orphan").value().error.find("still run") == std::string::npos; },
      2s))
      << executor.Get("orphan").value().error;
  EXPECT_EQ(executor.Forget("orphan"), std::nullopt);
  EXPECT_FALSE(executor.Get("orphan").ok());
}

TEST_F(ExecutorTest, AMissingCommandFailsToStartWithTheErrno) {
  Open();
  WorkloadSpec absolute = Shell("no-such-path", "");
  absolute.argv = {"/nonexistent/gpufleet-command", "--flag"};
  WorkloadStatus status = LaunchOk(absolute);
  EXPECT_EQ(status.state, WorkloadState::kFailedToStart);
  EXPECT_NE(status.error.find("No such file or directory"), std::string::npos) << status.error;
  EXPECT_NE(status.error.find("/nonexistent/gpufleet-command"), std::string::npos) << status.error;

  WorkloadSpec in_path = Shell("no-such-command", "");
  in_path.argv = {"gpufleet-no-such-command"};
  status = LaunchOk(in_path);
  EXPECT_EQ(status.state, WorkloadState::kFailedToStart);
  EXPECT_NE(status.error.find("No such file or directory"), std::string::npos) << status.error;

  WriteText(root_ / "work/not-executable", "#!/bin/sh\n");
  WorkloadSpec denied = Shell("denied", "");
  denied.argv = {(root_ / "work/not-executable").string()};
  status = LaunchOk(denied);
  EXPECT_EQ(status.state, WorkloadState::kFailedToStart);
  EXPECT_NE(status.error.find("Permission denied"), std::string::npos) << status.error;

  WorkloadSpec no_workdir = Shell("no-workdir", "true");
  no_workdir.workdir = (root_ / "missing").string();
  status = LaunchOk(no_workdir);
  EXPECT_EQ(status.state, WorkloadState::kFailedToStart);
  EXPECT_NE(status.error.find("chdir to workdir"), std::string::npos) << status.error;
  EXPECT_NE(status.error.find("No such file or directory"), std::string::npos) << status.error;
  // The state survives an agent restart.
  executor_.reset();
  Executor& reopened = Open();
  EXPECT_EQ(reopened.Get("no-workdir").value().state, WorkloadState::kFailedToStart);
  EXPECT_EQ(reopened.Forget("no-workdir"), std::nullopt);
}

TEST_F(ExecutorTest, RejectsBadSpecsAndDuplicateIdsWithoutStartingAnything) {
  Executor& executor = Open();
  auto expect_error = [&](WorkloadSpec spec, const std::string& fragment) {
    auto launched = executor.Launch(spec);
    ASSERT_FALSE(launched.ok()) << spec.id;
    EXPECT_NE(launched.error().find(fragment), std::string::npos) << launched.error();
  };
  expect_error(Shell("../escape", "true"), "may only use");
  expect_error(Shell("", "true"), "1 to 128");
  WorkloadSpec no_argv = Shell("no-argv", "");
  no_argv.argv.clear();
  expect_error(no_argv, "argv is empty");
  WorkloadSpec uuids = Shell("uuids", "true");
  uuids.gpu_indices = {0, 1};
  uuids.gpu_uuids = {"GPU-a"};
  expect_error(uuids, "1 GPU UUIDs for 2 GPU indices");
  WorkloadSpec twice = Shell("twice", "true");
  twice.gpu_indices = {3, 3};
  expect_error(twice, "listed twice");
  WorkloadSpec relative = Shell("relative", "true");
  relative.workdir = "work";
  expect_error(relative, "absolute");
  WorkloadSpec bad_env = Shell("bad-env", "true");
  bad_env.env = {{"A=B", "c"}};
  expect_error(bad_env, "environment name");
  EXPECT_TRUE(executor.List().empty());

  LaunchOk(Shell("dup", "exit 0"));
  expect_error(Shell("dup", "exit 0"), "already exists");
  EXPECT_EQ(executor.List().size(), 1u);
  EXPECT_FALSE(executor.Cancel("nobody").ok());
  EXPECT_TRUE(executor.Forget("nobody").has_value());
}

TEST_F(ExecutorTest, OneExecutorPerDataDir) {
  Open();
  auto second = Executor::Open(Config());
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.error().find("in use"), std::string::npos) << second.error();
  ExecutorConfig bad_shim = Config();
  bad_shim.data_dir = (root_ / "other").string();
  bad_shim.shim_command = {"/nonexistent/gpufleet"};
  auto no_shim = Executor::Open(bad_shim);
  ASSERT_FALSE(no_shim.ok());
  EXPECT_NE(no_shim.error().find("No such file or directory"), std::string::npos);
}

TEST_F(ExecutorTest, ForgetRemovesAFinishedWorkloadOnly) {
  Executor& executor = Open();
  LaunchOk(Shell("running", "exec sleep 100"));
  auto refused = executor.Forget("running");
  ASSERT_TRUE(refused.has_value());
  EXPECT_NE(refused->find("is running"), std::string::npos) << *refused;
  executor.Cancel("running", 0);
  WaitFinished(executor, "running");
  EXPECT_EQ(executor.Forget("running"), std::nullopt);
  EXPECT_FALSE(fs::exists(root_ / "data/workloads/running"));
  EXPECT_TRUE(executor.List().empty());
  // The id is free again.
  EXPECT_EQ(LaunchOk(Shell("running", "exit 0")).id, "running");
}

// cgroups: exercised for real wherever this machine lets us write them (v2 or v1).
class CgroupExecutorTest : public ExecutorTest {
 protected:
  void TearDown() override {
    ExecutorTest::TearDown();
    for (const std::string& parent : parents_)
      ::rmdir(parent.c_str());
  }
  void RememberParents(const WorkloadStatus& status) {
    for (const std::string& dir : status.cgroup_paths)
      parents_.push_back(fs::path(dir).parent_path().string());
  }
  std::vector<std::string> parents_;
};

TEST_F(CgroupExecutorTest, AppliesCpuAndMemoryLimitsAndRemovesTheCgroup) {
  Executor& executor = Open(CgroupMode::kAuto);
  if (executor.cgroup_version() == CgroupVersion::kNone)
    GTEST_SKIP() << "no writable cgroups here: " << executor.cgroup_warning();
  std::cout << "[ cgroups  ] using cgroup " << CgroupVersionName(executor.cgroup_version()) << "\n";
  WorkloadSpec spec = Shell("limited", "echo ready; exec sleep 100");
  spec.memory_mib = 64;
  spec.cpu_milli = 500;
  WorkloadStatus status = LaunchOk(spec);
  RememberParents(status);
  ASSERT_EQ(status.state, WorkloadState::kRunning) << status.error;
  EXPECT_TRUE(status.limits_applied) << status.limits_warning;
  EXPECT_EQ(status.cgroup_version, executor.cgroup_version());
  ASSERT_FALSE(status.cgroup_paths.empty());
  ASSERT_TRUE(WaitForText(status.stdout_log, "ready"));

  auto trimmed = [](std::string text) {
    while (!text.empty() && text.back() == '\n')
      text.pop_back();
    return text;
  };
  if (status.cgroup_version == CgroupVersion::kV2) {
    const fs::path dir = status.cgroup_paths[0];
    EXPECT_EQ(trimmed(ReadText(dir / "cpu.max")), "50000 100000");
    EXPECT_EQ(trimmed(ReadText(dir / "memory.max")), "67108864");
  } else {
    ASSERT_EQ(status.cgroup_paths.size(), 2u);
    const fs::path cpu = status.cgroup_paths[0];
    const fs::path memory = status.cgroup_paths[1];
    EXPECT_EQ(trimmed(ReadText(cpu / "cpu.cfs_quota_us")), "50000");
    EXPECT_EQ(trimmed(ReadText(cpu / "cpu.cfs_period_us")), "100000");
    EXPECT_EQ(trimmed(ReadText(memory / "memory.limit_in_bytes")), "67108864");
  }
  for (const std::string& dir : status.cgroup_paths) {
    std::string procs = ReadText(fs::path(dir) / "cgroup.procs");
    EXPECT_NE(procs.find(std::to_string(status.pid) + "\n"), std::string::npos)
        << dir << ": " << procs;
  }

  executor.Cancel("limited", 500);
  WorkloadStatus finished = WaitFinished(executor, "limited");
  EXPECT_EQ(finished.signal, SIGTERM);
  for (const std::string& dir : status.cgroup_paths)
    EXPECT_FALSE(fs::exists(dir)) << dir;
}

TEST_F(CgroupExecutorTest, TwoAgentsRunningTheSameWorkloadIdKeepTheirOwnCgroups) {
  Executor& first = Open(CgroupMode::kAuto);
  if (first.cgroup_version() == CgroupVersion::kNone)
    GTEST_SKIP() << "no writable cgroups here: " << first.cgroup_warning();
  ExecutorConfig other_config = Config(CgroupMode::kAuto);
  other_config.data_dir = (root_ / "other-agent").string();
  auto opened = Executor::Open(std::move(other_config));
  ASSERT_TRUE(opened.ok()) << opened.error();
  std::unique_ptr<Executor> second = std::move(opened.value());

  // Both run "j1-r0-a0" with limits at once, each in a cgroup of its own: one agent's workload
  // ending (its shim empties and removes its cgroup) must never touch the other's.
  WorkloadSpec spec = Shell("j1-r0-a0", "echo ready; exec sleep 100");
  spec.memory_mib = 64;
  auto launched = second->Launch(spec);
  ASSERT_TRUE(launched.ok()) << launched.error();
  const WorkloadStatus theirs = launched.value();
  RememberParents(theirs);
  const WorkloadStatus ours = LaunchOk(spec);
  RememberParents(ours);
  EXPECT_TRUE(theirs.limits_applied) << theirs.limits_warning;
  EXPECT_TRUE(ours.limits_applied) << ours.limits_warning;
  EXPECT_NE(ours.cgroup_paths, theirs.cgroup_paths);
  ASSERT_TRUE(WaitForText(ours.stdout_log, "ready"));
  first.Cancel("j1-r0-a0", 500);
  EXPECT_EQ(WaitFinished(first, "j1-r0-a0").signal, SIGTERM);
  auto still = second->Get("j1-r0-a0");
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(still.value().state, WorkloadState::kRunning);
  second->Cancel("j1-r0-a0", 500);
  EXPECT_EQ(WaitFinished(*second, "j1-r0-a0").signal, SIGTERM);
  second.reset();
}

TEST_F(CgroupExecutorTest, ReportsAnOomKill) {
  Executor& executor = Open(CgroupMode::kAuto);
  if (executor.cgroup_version() == CgroupVersion::kNone)
    GTEST_SKIP() << "no writable cgroups here: " << executor.cgroup_warning();
  // The shell keeps 100 MB of command output in memory: over a 32 MiB limit.
  WorkloadSpec spec = Shell("hog", "x=$(head -c 100000000 /dev/zero | tr '\\0' a); echo survived");
  spec.memory_mib = 32;
  WorkloadStatus launched = LaunchOk(spec);
  RememberParents(launched);
  WorkloadStatus status = WaitFinished(executor, "hog", 20s);
  ASSERT_EQ(status.state, WorkloadState::kExited) << status.error;
  EXPECT_TRUE(status.oom_killed);
  EXPECT_EQ(status.signal, SIGKILL);
  EXPECT_EQ(ReadText(status.stdout_log).find("survived"), std::string::npos);
}

TEST_F(CgroupExecutorTest, WarnsAndRunsWithoutLimitsWhereNoCgroupIsWritable) {
  // A machine whose cgroup v2 mount has no controllers and whose v1 hierarchies are missing.
  fs::create_directories(root_ / "fake-v2");
  WriteText(root_ / "fake-v2/cgroup.controllers", "io pids\n");
  WriteText(root_ / "mountinfo",
            fmt::format("30 20 0:28 / {} rw,relatime - cgroup2 cgroup2 rw\n"
                        "31 20 0:29 / /nonexistent-gpufleet/cpu rw - cgroup cgroup rw,cpu\n"
                        "32 20 0:30 / /nonexistent-gpufleet/memory rw - cgroup cgroup rw,memory\n",
                        (root_ / "fake-v2").string()));
  ExecutorConfig config = Config(CgroupMode::kAuto);
  config.cgroup_mountinfo_path = (root_ / "mountinfo").string();
  Executor& executor = Open(config);
  EXPECT_EQ(executor.cgroup_version(), CgroupVersion::kNone);
  EXPECT_NE(executor.cgroup_warning().find("no usable cgroups"), std::string::npos)
      << executor.cgroup_warning();
  EXPECT_NE(executor.cgroup_warning().find("cpu and memory controllers are not available"),
            std::string::npos)
      << executor.cgroup_warning();
  EXPECT_NE(executor.cgroup_warning().find("/nonexistent-gpufleet/cpu"), std::string::npos)
      << executor.cgroup_warning();

  WorkloadSpec spec = Shell("unlimited", "echo ran");
  spec.memory_mib = 64;
  spec.cpu_milli = 500;
  WorkloadStatus launched = LaunchOk(spec);
  EXPECT_FALSE(launched.limits_applied);
  EXPECT_EQ(launched.limits_warning, executor.cgroup_warning());
  EXPECT_TRUE(launched.cgroup_paths.empty());
  WorkloadStatus status = WaitFinished(executor, "unlimited");
  EXPECT_EQ(status.exit_code, 0) << status.error;
  EXPECT_EQ(ReadText(status.stdout_log), "ran\n");
}

}  // namespace
}  // namespace gpufleet::agent
