// RotatingLogFile on its own: line-preserving cuts, over-long lines, keep_files bounds.

#include "agent/log_rotation.h"

#include <filesystem>
#include <string>

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
    dir_ = fs::temp_directory_path() /
           ("gpufleet-logs-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
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

TEST(LogLimitsTest, Validation) {
  EXPECT_EQ(ValidateLogLimits({}), std::nullopt);
  EXPECT_TRUE(ValidateLogLimits({-1, 1}).has_value());
  EXPECT_TRUE(ValidateLogLimits({1, -1}).has_value());
  EXPECT_TRUE(ValidateLogLimits({1, 100000}).has_value());
}

}  // namespace
}  // namespace gpufleet::agent
