#include "store/group_commit.h"

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

namespace gpufleet::store {

GroupCommitter::GroupCommitter(Store& store, AfterFailure after_failure)
    : store_(store), after_failure_(after_failure), writer_([this] { Run(); }) {}

GroupCommitter::~GroupCommitter() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_one();
  writer_.join();
}

void GroupCommitter::Commit(std::vector<Mutation> batch) {
  // Shared with the callback, so that the writer never touches a waiter that has returned.
  struct Waiter {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::exception_ptr error;
  };
  auto waiter = std::make_shared<Waiter>();
  CommitAsync(std::move(batch), [waiter](std::exception_ptr error) {
    std::lock_guard lock(waiter->mu);
    waiter->error = std::move(error);
    waiter->done = true;
    waiter->cv.notify_one();
  });
  std::unique_lock lock(waiter->mu);
  waiter->cv.wait(lock, [&] { return waiter->done; });
  if (waiter->error) std::rethrow_exception(waiter->error);
}

void GroupCommitter::CommitAsync(std::vector<Mutation> batch, Done done) {
  // Refused here rather than by the store, where it would fail everybody else's batches too.
  CheckKeys(batch);
  {
    std::lock_guard lock(mu_);
    if (stopping_) throw std::logic_error("GroupCommitter: commit after shutdown began");
    if (queued_mutations_.empty()) {
      queued_mutations_ = std::move(batch);
    } else {
      queued_mutations_.insert(queued_mutations_.end(), std::make_move_iterator(batch.begin()),
                               std::make_move_iterator(batch.end()));
    }
    queued_done_.push_back(std::move(done));
    ++stats_.batches_queued;
  }
  wake_.notify_one();
}

GroupCommitter::Stats GroupCommitter::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void GroupCommitter::Run() {
  std::vector<Mutation> mutations;
  std::vector<Done> done;
  while (true) {
    mutations.clear();
    done.clear();
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [this] { return stopping_ || !queued_done_.empty(); });
      if (queued_done_.empty()) return;  // stopping, and everything queued is committed
      mutations.swap(queued_mutations_);
      done.swap(queued_done_);
      stats_.batches_queued = 0;
    }
    std::exception_ptr error;
    if (first_error_ && after_failure_ == AfterFailure::kFailAll) {
      error = first_error_;
    } else {
      try {
        if (!mutations.empty()) store_.Commit(mutations);  // a group of empty batches is a no-op
      } catch (...) {
        error = std::current_exception();
        if (!first_error_) first_error_ = error;
      }
    }
    {
      std::lock_guard lock(mu_);
      if (error) {
        ++stats_.groups_failed;
        stats_.batches_failed += done.size();
      } else {
        ++stats_.groups_committed;
        stats_.batches_committed += done.size();
        stats_.mutations_committed += mutations.size();
        stats_.largest_group = std::max<uint64_t>(stats_.largest_group, done.size());
      }
    }
    for (Done& callback : done) {
      // A callback that throws has no one to report to: noexcept turns it into std::terminate.
      [&]() noexcept {
        if (callback) callback(error);
      }();
    }
  }
}

}  // namespace gpufleet::store
