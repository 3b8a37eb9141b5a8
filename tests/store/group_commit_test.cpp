// GroupCommitter: every batch durable and visible when Commit returns, batches of concurrent
// callers merged into one Store::Commit, errors delivered to every caller of a failed group.
#include "store/group_commit.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "store/sqlite_store.h"
#include "store_conformance.h"

namespace gpufleet::store {
namespace {

using namespace std::chrono_literals;
using testing::ScratchDir;

// Wraps a real store: counts Store::Commit calls, can make each one slow, can hold commits at a
// gate until released, and fails a commit whose batch holds the key "poison" (before the inner
// store sees any of it).
class InstrumentedStore : public Store {
 public:
  explicit InstrumentedStore(Store& inner) : inner_(inner) {}

  std::string_view backend() const override { return inner_.backend(); }
  std::string location() const override { return inner_.location(); }
  std::optional<std::string> Get(std::string_view key) const override { return inner_.Get(key); }
  std::vector<std::pair<std::string, std::string>> List(std::string_view prefix) const override {
    return inner_.List(prefix);
  }
  void Scan(std::string_view prefix,
            const std::function<void(std::string_view, std::string_view)>& visit) const override {
    inner_.Scan(prefix, visit);
  }

  void Commit(std::span<const Mutation> batch) override {
    {
      std::unique_lock lock(mu_);
      ++commits_;
      largest_batch_ = std::max(largest_batch_, batch.size());
      cv_.notify_all();
      cv_.wait(lock, [this] { return !held_; });
    }
    if (delay_ > 0ms) std::this_thread::sleep_for(delay_);
    for (const Mutation& mutation : batch) {
      if (mutation.key == "poison") throw StoreError("poisoned batch (test)");
    }
    inner_.Commit(batch);
  }

  void set_delay(std::chrono::milliseconds delay) { delay_ = delay; }
  void Hold() {
    std::lock_guard lock(mu_);
    held_ = true;
  }
  void Release() {
    std::lock_guard lock(mu_);
    held_ = false;
    cv_.notify_all();
  }
  // Waits until `n` commits have begun.
  void WaitForCommits(int n) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return commits_ >= n; });
  }
  int commits() const {
    std::lock_guard lock(mu_);
    return commits_;
  }
  size_t largest_batch() const {
    std::lock_guard lock(mu_);
    return largest_batch_;
  }

 private:
  Store& inner_;
  std::chrono::milliseconds delay_{0};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool held_ = false;
  int commits_ = 0;
  size_t largest_batch_ = 0;
};

// Polls `condition` for up to 30 s (no timing is asserted, this only bounds a hang).
template <typename Fn>
bool Eventually(Fn&& condition) {
  const auto give_up = std::chrono::steady_clock::now() + 30s;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

TEST(GroupCommit, ManyThreadsManyBatchesAreAllDurableAndVisible) {
  constexpr int kThreads = 16;
  constexpr int kBatches = 50;
  ScratchDir scratch;
  {
    auto store = OpenSqliteStore(scratch.path());  // synchronous=FULL
    GroupCommitter committer(*store);
    std::vector<std::thread> threads;
    std::atomic<int> invisible{0};
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < kBatches; ++i) {
          const std::string key = fmt::format("jobs/{:02}/{:04}", t, i);
          committer.Commit({Mutation::Put(key, std::to_string(i)),
                            Mutation::Put(fmt::format("last/{:02}", t), std::to_string(i))});
          if (store->Get(key) != std::to_string(i)) ++invisible;  // visible once Commit returns
        }
      });
    }
    for (std::thread& thread : threads)
      thread.join();
    EXPECT_EQ(invisible.load(), 0);
    const GroupCommitter::Stats stats = committer.stats();
    EXPECT_EQ(stats.batches_committed, uint64_t{kThreads * kBatches});
    EXPECT_EQ(stats.mutations_committed, uint64_t{2 * kThreads * kBatches});
    EXPECT_GE(stats.groups_committed, 1u);
    EXPECT_LE(stats.groups_committed, stats.batches_committed);
    EXPECT_GE(stats.largest_group, 1u);
    EXPECT_EQ(stats.groups_failed, 0u);
    EXPECT_EQ(stats.batches_failed, 0u);
    EXPECT_EQ(stats.batches_queued, 0u);
  }
  auto reopened = OpenSqliteStore(scratch.path());
  EXPECT_EQ(reopened->List("jobs/").size(), size_t{kThreads * kBatches});
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(reopened->Get(fmt::format("last/{:02}", t)), std::to_string(kBatches - 1));
    for (int i = 0; i < kBatches; ++i) {
      EXPECT_EQ(reopened->Get(fmt::format("jobs/{:02}/{:04}", t, i)), std::to_string(i));
    }
  }
}

// While one Store::Commit takes 5 ms, the other 15 threads queue up: their batches go into the
// next Store::Commit together.
TEST(GroupCommit, ConcurrentBatchesMergeIntoFewStoreCommits) {
  constexpr int kThreads = 16;
  constexpr int kBatches = 50;
  ScratchDir scratch;
  auto sqlite = OpenSqliteStore(scratch.path(), {.synchronous_full = false});
  InstrumentedStore store(*sqlite);
  store.set_delay(5ms);
  GroupCommitter committer(store);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kBatches; ++i) {
        committer.Commit({Mutation::Put(fmt::format("t/{:02}", t), std::to_string(i)),
                          Mutation::Put(fmt::format("seq/{:02}/{:04}", t, i), "")});
      }
    });
  }
  for (std::thread& thread : threads)
    thread.join();
  const GroupCommitter::Stats stats = committer.stats();
  std::cout << fmt::format("{} batches in {} store commits, largest group {} batches\n",
                           stats.batches_committed, store.commits(), stats.largest_group);
  EXPECT_EQ(stats.batches_committed, uint64_t{kThreads * kBatches});
  EXPECT_EQ(stats.groups_committed, static_cast<uint64_t>(store.commits()));
  // One commit per batch would be 800; with 16 callers waiting it is closer to 800 / 15.
  EXPECT_LE(store.commits(), kThreads * kBatches / 4);
  EXPECT_GT(stats.largest_group, 1u);
  EXPECT_GT(store.largest_batch(), 2u);  // several batches' mutations in one Store::Commit
  for (int t = 0; t < kThreads; ++t) {
    // Each thread's batches were applied in its order, so its last value won.
    EXPECT_EQ(sqlite->Get(fmt::format("t/{:02}", t)), std::to_string(kBatches - 1));
    EXPECT_EQ(sqlite->List(fmt::format("seq/{:02}/", t)).size(), size_t{kBatches});
  }
}

// The store is held inside one commit while nine batches queue behind it, so those nine form the
// next group, in which one batch makes the store fail: all nine callers get the error, nothing of
// theirs is applied, and the groups after it commit normally.
TEST(GroupCommit, AStoreErrorReachesEveryCallerOfTheGroupAndLaterGroupsWork) {
  constexpr int kThreads = 8;
  ScratchDir scratch;
  auto sqlite = OpenSqliteStore(scratch.path(), {.synchronous_full = false});
  InstrumentedStore store(*sqlite);
  GroupCommitter committer(store);

  store.Hold();
  std::exception_ptr first_error = std::make_exception_ptr(std::runtime_error("not called"));
  committer.CommitAsync({Mutation::Put("first", "1")},
                        [&](std::exception_ptr error) { first_error = error; });
  store.WaitForCommits(1);

  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<Mutation> batch = {Mutation::Put(fmt::format("group/{}", t), "x")};
      if (t == 3) batch.push_back(Mutation::Put("poison", "x"));
      try {
        committer.Commit(std::move(batch));
        errors[t] = "no error";
      } catch (const StoreError& error) {
        errors[t] = error.what();
      } catch (...) {
        errors[t] = "not a StoreError";
      }
    });
  }
  std::exception_ptr async_error;
  ASSERT_TRUE(Eventually([&] { return committer.stats().batches_queued == kThreads; }));
  committer.CommitAsync({Mutation::Put("group/async", "x")},
                        [&](std::exception_ptr error) { async_error = error; });
  EXPECT_EQ(committer.stats().batches_queued, uint64_t{kThreads + 1});
  store.Release();
  for (std::thread& thread : threads)
    thread.join();

  EXPECT_EQ(first_error, nullptr);
  for (int t = 0; t < kThreads; ++t)
    EXPECT_EQ(errors[t], "poisoned batch (test)") << t;
  EXPECT_TRUE(sqlite->List("group/").empty());
  EXPECT_EQ(sqlite->Get("first"), "1");

  committer.Commit({Mutation::Put("after", "1")});
  EXPECT_EQ(sqlite->Get("after"), "1");
  // Callbacks run in queue order, so the async one has run by now.
  ASSERT_NE(async_error, nullptr);
  EXPECT_THROW(std::rethrow_exception(async_error), StoreError);
  const GroupCommitter::Stats stats = committer.stats();
  EXPECT_EQ(stats.groups_committed, 2u);
  EXPECT_EQ(stats.batches_committed, 2u);
  EXPECT_EQ(stats.groups_failed, 1u);
  EXPECT_EQ(stats.batches_failed, uint64_t{kThreads + 1});
  EXPECT_EQ(stats.largest_group, 1u);
}

// The server's mode: once a group fails, every later batch fails with the same error and the
// store never sees it, even once the store would accept it again.
TEST(GroupCommit, FailAllKeepsEveryBatchAfterAFailureOutOfTheStore) {
  ScratchDir scratch;
  auto sqlite = OpenSqliteStore(scratch.path(), {.synchronous_full = false});
  InstrumentedStore store(*sqlite);
  GroupCommitter committer(store, GroupCommitter::AfterFailure::kFailAll);
  committer.Commit({Mutation::Put("before", "1")});
  EXPECT_THROW(committer.Commit({Mutation::Put("poison", "x")}), StoreError);
  try {
    committer.Commit({Mutation::Put("after", "1")});
    ADD_FAILURE() << "a batch after the failure was accepted";
  } catch (const StoreError& error) {
    EXPECT_STREQ(error.what(), "poisoned batch (test)");
  }
  EXPECT_EQ(sqlite->Get("before"), "1");
  EXPECT_FALSE(sqlite->Get("after"));
  EXPECT_EQ(committer.stats().groups_failed, 2u);
}

TEST(GroupCommit, CallbacksRunInQueueOrderOnceTheirBatchIsDurable) {
  ScratchDir scratch;
  auto sqlite = OpenSqliteStore(scratch.path(), {.synchronous_full = false});
  InstrumentedStore store(*sqlite);
  GroupCommitter committer(store);
  store.Hold();
  committer.CommitAsync({Mutation::Put("k", "start")}, [](std::exception_ptr) {});
  store.WaitForCommits(1);
  std::vector<int> order;  // touched only by the writer thread until the final Commit returns
  std::vector<int> missing_when_called;
  for (int i = 0; i < 100; ++i) {
    committer.CommitAsync(
        {Mutation::Put("k", std::to_string(i)), Mutation::Put(fmt::format("k/{:03}", i), "")},
        [&, i](std::exception_ptr error) {
          EXPECT_EQ(error, nullptr);
          order.push_back(i);
          if (!sqlite->Get(fmt::format("k/{:03}", i))) missing_when_called.push_back(i);
        });
  }
  store.Release();
  committer.Commit({});  // an empty batch waits for everything queued before it
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i)
    EXPECT_EQ(order[i], i);
  EXPECT_TRUE(missing_when_called.empty());
  EXPECT_EQ(sqlite->Get("k"), "99");  // the batches of a group were applied in queue order
  EXPECT_EQ(store.commits(), 2);      // "start", then the other 100 together
  EXPECT_GE(committer.stats().largest_group, 100u);
}

TEST(GroupCommit, TheDestructorCommitsWhatIsQueued) {
  ScratchDir scratch;
  auto sqlite = OpenSqliteStore(scratch.path(), {.synchronous_full = false});
  InstrumentedStore store(*sqlite);
  store.set_delay(2ms);
  std::atomic<int> succeeded{0};
  std::atomic<int> failed{0};
  {
    GroupCommitter committer(store);
    for (int i = 0; i < 200; ++i) {
      committer.CommitAsync({Mutation::Put(fmt::format("k/{:03}", i), "v")},
                            [&](std::exception_ptr error) { ++(error ? failed : succeeded); });
      if (i % 50 == 0) std::this_thread::sleep_for(1ms);  // several groups, some still queued
    }
  }
  EXPECT_EQ(succeeded.load(), 200);
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(sqlite->List("k/").size(), 200u);
}

TEST(GroupCommit, AnInvalidKeyIsRefusedWithoutFailingOthers) {
  ScratchDir scratch;
  auto sqlite = OpenSqliteStore(scratch.path(), {.synchronous_full = false});
  GroupCommitter committer(*sqlite);
  EXPECT_THROW(committer.Commit({Mutation::Put("a", "1"), Mutation::Put("", "2")}),
               std::invalid_argument);
  EXPECT_THROW(committer.CommitAsync({Mutation::Delete(std::string("a\0b", 3))}, nullptr),
               std::invalid_argument);
  EXPECT_EQ(committer.stats().batches_queued, 0u);
  committer.Commit({Mutation::Put("b", "1")});
  EXPECT_EQ(sqlite->List(""), (testing::KeyValues{{"b", "1"}}));
  EXPECT_EQ(committer.stats().groups_failed, 0u);
}

// Not a test: measures durable single-key commits per second on this machine's disk, straight
// through Store::Commit and through GroupCommitter. docs/store.md quotes its output. Run with
//   store_test --gtest_also_run_disabled_tests --gtest_filter='*DISABLED_Throughput*'
TEST(GroupCommit, DISABLED_Throughput) {
  const auto seconds = std::chrono::seconds(3);
  auto measure = [&](int threads, bool grouped) {
    ScratchDir scratch;
    auto store = OpenSqliteStore(scratch.path());  // synchronous=FULL
    GroupCommitter committer(*store);
    std::atomic<bool> stop{false};
    std::atomic<int64_t> commits{0};
    std::vector<std::thread> workers;
    const auto start = std::chrono::steady_clock::now();
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        for (int64_t i = 0; !stop; ++i) {
          Mutation put = Mutation::Put(fmt::format("jobs/{:03}/{:016}", t, i),
                                       R"({"gpus":8,"user":"alice","state":"pending"})");
          if (grouped) {
            committer.Commit({std::move(put)});
          } else {
            store->Commit(std::span(&put, 1));
          }
          ++commits;
        }
      });
    }
    std::this_thread::sleep_for(seconds);
    stop = true;
    for (std::thread& worker : workers)
      worker.join();
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const GroupCommitter::Stats stats = committer.stats();
    std::cout << fmt::format(
        "{:>2} threads, {:<22}: {:>7.0f} commits/s, {} fsync'd groups, largest {} batches\n",
        threads, grouped ? "GroupCommitter" : "Store::Commit directly", commits / elapsed,
        grouped ? stats.groups_committed : static_cast<uint64_t>(commits.load()),
        grouped ? stats.largest_group : 1);
  };
  measure(1, false);
  measure(1, true);
  measure(32, false);
  measure(32, true);
}

}  // namespace
}  // namespace gpufleet::store
