#pragma once

// Helpers for the executor tests: temporary directories, file reads, waiting on workloads.

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/executor.h"
#include "agent/executor_util.h"

namespace gpufleet::agent::executor_testing {

// An empty directory of the running test's own: <tmp>/gpufleet-<kind>-<pid>-<test name>.
inline std::filesystem::path FreshTestDir(const std::string& kind) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      ("gpufleet-" + kind + "-" + std::to_string(::getpid()) + "-" + info->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline std::string ReadText(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream content;
  content << file.rdbuf();
  return content.str();
}

inline void WriteText(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// The tests make themselves a child subreaper, so shims and orphaned workloads are re-parented
// to the test process (this sandbox's init does not reap): reap whatever has exited.
inline void ReapExitedChildren() {
  while (::waitpid(-1, nullptr, WNOHANG) > 0) {
  }
}

// Gone or a zombie.
inline bool ProcessGone(pid_t pid) {
  ReapExitedChildren();
  auto stat = executor_internal::ReadProcStat(pid);
  return !stat || stat->state == 'Z';
}

template <typename Predicate>
bool WaitUntil(Predicate predicate, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (predicate()) return true;
    ReapExitedChildren();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return predicate();
}

// Polls until the workload finished (or the timeout), returning its last status.
inline WorkloadStatus WaitFinished(const Executor& executor, const std::string& id,
                                   std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  WorkloadStatus last;
  WaitUntil(
      [&] {
        auto status = executor.Get(id);
        if (!status.ok()) return false;
        last = status.value();
        return last.Finished();
      },
      timeout);
  return last;
}

inline bool WaitForText(const std::filesystem::path& path, const std::string& text,
                        std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  return WaitUntil([&] { return ReadText(path).find(text) != std::string::npos; }, timeout);
}

}  // namespace gpufleet::agent::executor_testing
