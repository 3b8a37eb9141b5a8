#pragma once

// Group commit in front of a Store: many threads commit small batches at once, one writer thread
// applies every batch queued so far in a single Store::Commit (one fsync) and then wakes all
// their callers. There is no artificial delay: the next group forms while the current one is
// being fsync'd. See docs/store.md.

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "store/store.h"

namespace gpufleet::store {

class GroupCommitter {
 public:
  // Called once on the writer thread when the batch is durable (nullptr) or has failed (the
  // exception Store::Commit threw, shared by the whole group). Callbacks run in the order their
  // batches were queued. A callback must not throw (std::terminate) and must not wait for a later
  // commit through this committer (deadlock); it should hand longer work to another thread.
  using Done = std::function<void(std::exception_ptr error)>;

  struct Stats {
    uint64_t groups_committed = 0;   // successful Store::Commit calls
    uint64_t batches_committed = 0;  // batches in them
    uint64_t mutations_committed = 0;
    uint64_t largest_group = 0;  // most batches in one successful group
    uint64_t groups_failed = 0;
    uint64_t batches_failed = 0;
    uint64_t batches_queued = 0;  // waiting for the next group right now
  };

  // What later batches meet once a group has failed.
  enum class AfterFailure {
    kContinue,  // they are committed as usual
    // They fail with the first error, never reaching the store: for a caller whose memory runs
    // ahead of the store (the server), where a later change may build on the lost one.
    kFailAll,
  };

  // `store` must outlive the committer. Starts the writer thread.
  explicit GroupCommitter(Store& store, AfterFailure after_failure = AfterFailure::kContinue);
  // Commits what is queued (callbacks included), then stops the writer thread.
  ~GroupCommitter();
  GroupCommitter(const GroupCommitter&) = delete;
  GroupCommitter& operator=(const GroupCommitter&) = delete;

  // Blocks until `batch` is durable, atomically with the rest of its group. Rethrows the group's
  // error (a StoreError) when the group failed; then nothing of this batch was applied. Batches
  // from one thread are applied in the order that thread committed them. An empty batch waits
  // for everything queued before it.
  void Commit(std::vector<Mutation> batch);

  // Queues `batch` and returns at once; `done` runs on the writer thread once the batch is durable
  // or has failed. Throws std::invalid_argument for an invalid key (nothing queued).
  void CommitAsync(std::vector<Mutation> batch, Done done);

  Stats stats() const;
  Store& store() const { return store_; }

 private:
  void Run();

  Store& store_;
  const AfterFailure after_failure_;
  std::exception_ptr first_error_;  // the writer thread's own
  mutable std::mutex mu_;
  std::condition_variable wake_;
  // The next group: the mutations of every batch queued since the writer took the last group,
  // in arrival order, and one callback per batch.
  std::vector<Mutation> queued_mutations_;
  std::vector<Done> queued_done_;
  bool stopping_ = false;
  Stats stats_;
  std::thread writer_;  // last: starts after everything it uses exists
};

}  // namespace gpufleet::store
