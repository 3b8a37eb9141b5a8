// RotatingLogFile on its own: line-preserving cuts, over-long lines, keep_files bounds; and
// ReadLogRange, which reads it by offsets over everything written, across rotations, also while
// a writer rotates under it.

#include "agent/log_rotation.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "executor_test_util.h"

namespace gpufleet::agent {
namespace {

namespace fs = std::filesystem;
using executor_testing::ReadText;

class RotatingLogFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = executor_testing::FreshTestDir("logs");
    path_ = (dir_ / "out.log").string();
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
  std::string path_;
};

TEST_F(RotatingLogFileTest, CutsBetweenLinesWhereTheyFit) {
  RotatingLogFile log(path_, {10, 5});
  ASSERT_EQ(log.Open(), std::nullopt);
  ASSERT_EQ(log.Write("aaaa\nbbbb\ncccc\n"), std::nullopt);
  EXPECT_EQ(ReadText(path_ + ".1"), "aaaa\nbbbb\n");
  EXPECT_EQ(ReadText(path_), "cccc\n");
  ASSERT_EQ(log.Write("dddd\n"), std::nullopt);
  EXPECT_EQ(ReadText(path_), "cccc\ndddd\n");
  ASSERT_EQ(log.Write("e"), std::nullopt);  // would exceed: rotate first
  EXPECT_EQ(ReadText(path_ + ".2"), "aaaa\nbbbb\n");
  EXPECT_EQ(ReadText(path_ + ".1"), "cccc\ndddd\n");
  EXPECT_EQ(ReadText(path_), "e");
  EXPECT_EQ(log.bytes_written(), 21);
}

TEST_F(RotatingLogFileTest, SplitsLinesLongerThanAFile) {
  RotatingLogFile log(path_, {4, 10});
  ASSERT_EQ(log.Write("0123456789\n"), std::nullopt);
  EXPECT_EQ(ReadText(path_ + ".2"), "0123");
  EXPECT_EQ(ReadText(path_ + ".1"), "4567");
  EXPECT_EQ(ReadText(path_), "89\n");
}

// A line past max_line_bytes is broken with a newline, however it arrives in writes; shorter
// lines and the bytes of the broken one are kept as they were.
TEST_F(RotatingLogFileTest, BreaksLinesLongerThanTheLineLimit) {
  RotatingLogFile log(path_, {0, 0, 4});
  ASSERT_EQ(log.Write("abcd\nefghij"), std::nullopt);
  ASSERT_EQ(log.Write("kl"), std::nullopt);
  ASSERT_EQ(log.Write("mn\nop\n0123456789"), std::nullopt);
  EXPECT_EQ(ReadText(path_), "abcd\nefgh\nijkl\nmn\nop\n0123\n4567\n89");
  EXPECT_EQ(log.lines_broken(), 4);
  EXPECT_EQ(log.bytes_written(), 33);  // offsets count the added newlines: what readers see

  RotatingLogFile unlimited((dir_ / "whole.log").string(), {0, 0, 0});
  ASSERT_EQ(unlimited.Write(std::string(100000, 'x')), std::nullopt);
  EXPECT_EQ(ReadText((dir_ / "whole.log").string()).size(), 100000u);
  EXPECT_EQ(unlimited.lines_broken(), 0);
}

TEST_F(RotatingLogFileTest, KeepZeroDiscardsRotatedOutput) {
  RotatingLogFile log(path_, {5, 0});
  ASSERT_EQ(log.Write("1234\nabcd\n"), std::nullopt);
  EXPECT_FALSE(fs::exists(path_ + ".1"));
  EXPECT_EQ(ReadText(path_), "abcd\n");
}

TEST_F(RotatingLogFileTest, NoLimitNeverRotatesAndReopenAppends) {
  {
    RotatingLogFile log(path_, {0, 3});
    ASSERT_EQ(log.Write(std::string(10000, 'x')), std::nullopt);
  }
  RotatingLogFile again(path_, {10001, 3});
  ASSERT_EQ(again.Open(), std::nullopt);
  ASSERT_EQ(again.Write("yy"), std::nullopt);  // 10002 > 10001: rotates first
  EXPECT_EQ(fs::file_size(path_ + ".1"), 10000u);
  EXPECT_EQ(ReadText(path_), "yy");
}

TEST_F(RotatingLogFileTest, ReportsAnUnwritablePath) {
  RotatingLogFile log((dir_ / "missing/out.log").string(), {});
  auto error = log.Open();
  ASSERT_TRUE(error.has_value());
  EXPECT_NE(error->find("No such file or directory"), std::string::npos) << *error;
  EXPECT_TRUE(log.Write("lost").has_value());
  EXPECT_EQ(log.bytes_dropped(), 4);
}

// Every range of the log read at `offset`, checked against `all` (everything written).
void ExpectEveryRange(const std::string& path, int32_t keep, const std::string& all) {
  const int64_t size = static_cast<int64_t>(all.size());
  const LogRange whole = ReadLogRange(path, keep, 0, int64_t{1} << 20);
  EXPECT_EQ(whole.end, size);
  EXPECT_EQ(whole.offset, whole.skipped);
  EXPECT_EQ(whole.data, all.substr(static_cast<size_t>(whole.offset)));
  EXPECT_EQ(whole.next_offset, size);
  for (int64_t offset = 0; offset <= size + 1; ++offset) {
    const LogRange part = ReadLogRange(path, keep, offset, 3);
    const int64_t start = std::max(offset, whole.offset);
    EXPECT_EQ(part.offset, start) << offset;
    EXPECT_EQ(part.skipped, start - offset) << offset;
    EXPECT_EQ(part.data, start < size ? all.substr(static_cast<size_t>(start), 3) : "") << offset;
    EXPECT_EQ(part.next_offset, start + static_cast<int64_t>(part.data.size())) << offset;
    EXPECT_EQ(part.end, size);
  }
}

TEST_F(RotatingLogFileTest, OffsetsCountEveryByteAcrossRotations) {
  RotatingLogFile log(path_, {10, 2});  // two 4-byte lines per file, two rotated files kept
  std::string all;
  for (int line = 0; line < 20; ++line) {
    const std::string text = fmt::format("l{:02}\n", line);
    ASSERT_EQ(log.Write(text), std::nullopt);
    all += text;
    ExpectEveryRange(path_, 2, all);
  }
  // 20 lines = 10 files: 7 deleted (56 bytes), then .2, .1 and the live file.
  const LogRange whole = ReadLogRange(path_, 2, 0, 1000);
  EXPECT_EQ(whole.skipped, 56);
  EXPECT_EQ(whole.data, "l14\nl15\nl16\nl17\nl18\nl19\n");
}

TEST_F(RotatingLogFileTest, OffsetsWithoutRotatedFilesAndAcrossAReopen) {
  EXPECT_EQ(ReadLogRange(path_, 4, 0, 100).data, "");  // no log yet: empty
  std::string all;
  {
    RotatingLogFile log(path_, {0, 0});  // KeepZero below: every rotation deletes
    ASSERT_EQ(log.Write("never rotated\n"), std::nullopt);
    all += "never rotated\n";
    EXPECT_FALSE(fs::exists(RotatingLogFile::OffsetRecordPath(path_)));
    ExpectEveryRange(path_, 0, all);
  }
  {
    RotatingLogFile log(path_, {16, 0});
    ASSERT_EQ(log.Open(), std::nullopt);
    ASSERT_EQ(log.Write("abc\n"), std::nullopt);  // 18 > 16: the first file is deleted
    all += "abc\n";
    ExpectEveryRange(path_, 0, all);
    EXPECT_EQ(ReadLogRange(path_, 0, 0, 100).skipped, 14);
  }
  // A writer that opens the log again counts on from where the last one stopped.
  RotatingLogFile again(path_, {16, 3});
  ASSERT_EQ(again.Open(), std::nullopt);
  for (const char* text : {"0123456789\n", "more\n", "and more\n"}) {
    ASSERT_EQ(again.Write(text), std::nullopt);
    all += text;
    ExpectEveryRange(path_, 3, all);
  }
}

TEST_F(RotatingLogFileTest, AReaderFollowingAWriterThatRotatesSeesExactlyWhatWasWritten) {
  // A writer rotates hundreds of times while a reader follows it by offsets. Whatever the reader
  // gets must be the written bytes at those offsets, and where it skips, the skip must be said.
  constexpr int kLines = 10000;
  auto line = [](int index) { return fmt::format("{:07}\n", index); };
  std::atomic<bool> done{false};
  std::thread writer([&] {
    RotatingLogFile log(path_, {256, 8});
    for (int index = 0; index < kLines; ++index)
      EXPECT_EQ(log.Write(line(index)), std::nullopt);
    done = true;
  });
  struct Chunk {
    int64_t offset;
    int64_t skipped;
    std::string data;
  };
  std::vector<Chunk> chunks;
  int64_t offset = 0;
  for (;;) {
    const bool finished = done;
    LogRange range = ReadLogRange(path_, 8, offset, 100);
    EXPECT_EQ(range.offset, offset + range.skipped);  // not ASSERT: the writer must be joined
    offset = range.next_offset;
    chunks.push_back({range.offset, range.skipped, std::move(range.data)});
    if (finished && offset >= range.end) break;
  }
  writer.join();
  std::string all;
  for (int index = 0; index < kLines; ++index)
    all += line(index);
  EXPECT_EQ(offset, static_cast<int64_t>(all.size()));
  int64_t read = 0;
  for (const Chunk& chunk : chunks) {
    ASSERT_EQ(chunk.data, all.substr(static_cast<size_t>(chunk.offset), chunk.data.size()))
        << "at offset " << chunk.offset;
    read += static_cast<int64_t>(chunk.data.size()) + chunk.skipped;
  }
  EXPECT_EQ(read, static_cast<int64_t>(all.size()));  // every byte read or said to be skipped
}

TEST(LogLimitsTest, Validation) {
  EXPECT_EQ(ValidateLogLimits({}), std::nullopt);
  EXPECT_TRUE(ValidateLogLimits({-1, 1}).has_value());
  EXPECT_TRUE(ValidateLogLimits({1, -1}).has_value());
  EXPECT_TRUE(ValidateLogLimits({1, 100000}).has_value());
  EXPECT_TRUE(ValidateLogLimits({1, 1, -1}).has_value());
}

}  // namespace
}  // namespace gpufleet::agent
