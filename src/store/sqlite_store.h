#pragma once

// The SQLite backend of the state store: one database file `data_dir/state.db` in WAL mode, fsync'd
// on every commit, guarded by an exclusive lock on `data_dir/state.lock`. See docs/store.md.

#include <filesystem>
#include <memory>

#include "store/store.h"

namespace gpufleet::store {

struct SqliteOptions {
  // true: PRAGMA synchronous=FULL, a committed batch survives kill -9 and power loss.
  // false: synchronous=NORMAL (survives kill -9, may lose the last commits on power loss); only
  // for benchmarks that say so.
  bool synchronous_full = true;
};

// The version of the schema this build writes. A database with a newer one is refused.
inline constexpr int kSqliteSchemaVersion = 1;

// Opens (creating if missing) the store in `data_dir`: creates the directory, takes an exclusive
// flock on data_dir/state.lock (writing our pid into it) and opens data_dir/state.db. Throws
// StoreError when the directory cannot be created, another process holds the lock ("data dir X
// is in use by another gpufleet process (pid N)"), the file is not a database or is corrupt, or
// its schema version is newer than kSqliteSchemaVersion.
std::unique_ptr<Store> OpenSqliteStore(const std::filesystem::path& data_dir,
                                       SqliteOptions options = {});

}  // namespace gpufleet::store
