// The SQLite backend: the conformance suite, then what only SQLite has: the data dir lock, the
// file format (WAL, schema version), corrupt files, a batch failing halfway and kill -9.
#include "store/sqlite_store.h"

#include <chrono>
#include <cstdint>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include "store_conformance.h"

namespace gpufleet::store {
namespace {

namespace fs = std::filesystem;
using testing::KeyValues;
using testing::ScratchDir;

struct SqliteFactory {
  static std::unique_ptr<Store> Open(const fs::path& dir) { return OpenSqliteStore(dir); }
};

}  // namespace

namespace testing {
INSTANTIATE_TYPED_TEST_SUITE_P(Sqlite, StoreConformance, SqliteFactory);
}  // namespace testing

namespace {

// A connection of our own to the database file, to look at and tamper with it behind the store.
class RawDb {
 public:
  explicit RawDb(const fs::path& path) {
    if (sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
      ADD_FAILURE() << "cannot open " << path << ": " << sqlite3_errmsg(db_);
    }
  }
  ~RawDb() { sqlite3_close_v2(db_); }
  RawDb(const RawDb&) = delete;
  RawDb& operator=(const RawDb&) = delete;

  void Exec(const std::string& sql) {
    char* error = nullptr;
    if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &error) != SQLITE_OK) {
      ADD_FAILURE() << sql << ": " << (error ? error : "?");
    }
    sqlite3_free(error);
  }
  // A column of the first row, or "" when there is none.
  std::string Query(const std::string& sql, int column = 0) {
    sqlite3_stmt* stmt = nullptr;
    std::string result;
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt, nullptr) != SQLITE_OK) {
      ADD_FAILURE() << sql << ": " << sqlite3_errmsg(db_);
      return result;
    }
    if (sqlite3_step(stmt) == SQLITE_ROW) {
      const unsigned char* text = sqlite3_column_text(stmt, column);
      if (text) result = reinterpret_cast<const char*>(text);
    }
    sqlite3_finalize(stmt);
    return result;
  }

 private:
  sqlite3* db_ = nullptr;
};

// The message of the StoreError that `open` throws; fails the test when it throws none.
template <typename Fn>
std::string StoreErrorOf(Fn&& open) {
  try {
    open();
  } catch (const StoreError& error) {
    return error.what();
  }
  ADD_FAILURE() << "no StoreError";
  return "";
}

void WriteFile(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(SqliteStore, CreatesTheDataDirWithAWalDatabaseAndALock) {
  ScratchDir scratch;
  const fs::path dir = scratch.path() / "nested" / "data";
  auto store = OpenSqliteStore(dir);
  EXPECT_EQ(store->backend(), "sqlite");
  EXPECT_EQ(store->location(), (dir / "state.db").string());
  EXPECT_TRUE(fs::is_regular_file(dir / "state.db"));
  EXPECT_EQ(ReadFile(dir / "state.lock"), fmt::format("{}\n", ::getpid()));
  testing::Put(*store, "jobs/0000000000000001", "{}");
  EXPECT_TRUE(fs::exists(dir / "state.db-wal"));

  RawDb raw(dir / "state.db");
  EXPECT_EQ(raw.Query("PRAGMA journal_mode"), "wal");
  EXPECT_EQ(raw.Query("SELECT value FROM meta WHERE key = 'schema_version'"),
            std::to_string(kSqliteSchemaVersion));
  EXPECT_NE(raw.Query("SELECT sql FROM sqlite_master WHERE name = 'kv'").find("WITHOUT ROWID"),
            std::string::npos);
  EXPECT_EQ(raw.Query("SELECT value FROM kv WHERE key = 'jobs/0000000000000001'"), "{}");
  // Prefix listing is a range over the primary key, not a scan.
  const std::string plan = raw.Query(
      "EXPLAIN QUERY PLAN SELECT key, value FROM kv WHERE key >= 'a' AND key < 'b' "
      "ORDER BY key",
      3);  // the "detail" column
  EXPECT_NE(plan.find("SEARCH kv USING PRIMARY KEY (key>? AND key<?)"), std::string::npos) << plan;
}

TEST(SqliteStore, ASecondOpenOfTheSameDirIsRefusedWithThePid) {
  ScratchDir scratch;
  auto first = OpenSqliteStore(scratch.path());
  testing::Put(*first, "a", "1");
  const std::string message = StoreErrorOf([&] { OpenSqliteStore(scratch.path()); });
  EXPECT_EQ(message, fmt::format("data dir {} is in use by another gpufleet process (pid {})",
                                 scratch.path().string(), ::getpid()));
  // The failed open did not disturb the first store.
  EXPECT_EQ(first->Get("a"), "1");
  testing::Put(*first, "b", "2");
  first.reset();
  auto second = OpenSqliteStore(scratch.path());
  EXPECT_EQ(second->List(""), (KeyValues{{"a", "1"}, {"b", "2"}}));
}

TEST(SqliteStore, ADirHeldByAnotherProcessNamesItsPid) {
  ScratchDir scratch;
  int ready[2], release[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(release), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(ready[0]);
    ::close(release[1]);
    int code = 0;
    try {
      auto store = OpenSqliteStore(scratch.path());
      (void)!::write(ready[1], "r", 1);
      char byte;
      (void)!::read(release[0], &byte, 1);  // until the parent closes its end
    } catch (...) {
      code = 1;
    }
    ::_exit(code);
  }
  ::close(ready[1]);
  ::close(release[0]);
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  const std::string message = StoreErrorOf([&] { OpenSqliteStore(scratch.path()); });
  EXPECT_NE(message.find(fmt::format("is in use by another gpufleet process (pid {})", child)),
            std::string::npos)
      << message;
  ::close(release[1]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ::close(ready[0]);
  EXPECT_NO_THROW(OpenSqliteStore(scratch.path()));
}

TEST(SqliteStore, AFileOfGarbageIsAStoreErrorNamingIt) {
  ScratchDir scratch;
  std::string garbage;
  std::mt19937 random(7);
  for (int i = 0; i < 8192; ++i)
    garbage += static_cast<char>(random());
  WriteFile(scratch.path() / "state.db", garbage);
  const std::string message = StoreErrorOf([&] { OpenSqliteStore(scratch.path()); });
  EXPECT_NE(message.find((scratch.path() / "state.db").string()), std::string::npos) << message;
  EXPECT_NE(message.find("not a database"), std::string::npos) << message;
  EXPECT_EQ(ReadFile(scratch.path() / "state.db"), garbage);  // left as it was
  // The failed open let go of the lock.
  fs::remove(scratch.path() / "state.db");
  EXPECT_NO_THROW(OpenSqliteStore(scratch.path()));
}

TEST(SqliteStore, CorruptPagesAreAStoreErrorNotACrash) {
  ScratchDir scratch;
  {
    auto store = OpenSqliteStore(scratch.path());
    std::vector<Mutation> batch;
    for (int i = 0; i < 2000; ++i) {
      batch.push_back(Mutation::Put(fmt::format("jobs/{:016}", i), std::string(100, 'v')));
    }
    store->Commit(batch);
  }
  // Closing checkpointed the WAL into the database file; now overwrite all but its first page.
  const fs::path db = scratch.path() / "state.db";
  ASSERT_FALSE(fs::exists(scratch.path() / "state.db-wal"));
  std::string bytes = ReadFile(db);
  ASSERT_GT(bytes.size(), 8192u);
  for (size_t i = 4096; i < bytes.size(); ++i)
    bytes[i] = static_cast<char>(0xa5 ^ (i & 0x3f));
  WriteFile(db, bytes);
  const std::string message = StoreErrorOf([&] {
    auto store = OpenSqliteStore(scratch.path());
    store->List("jobs/");
    store->Get("jobs/0000000000000042");
  });
  EXPECT_NE(message.find(db.string()), std::string::npos) << message;
}

TEST(SqliteStore, ANewerSchemaVersionIsRefused) {
  ScratchDir scratch;
  OpenSqliteStore(scratch.path());
  {
    RawDb raw(scratch.path() / "state.db");
    raw.Exec("UPDATE meta SET value = '99' WHERE key = 'schema_version'");
  }
  const std::string message = StoreErrorOf([&] { OpenSqliteStore(scratch.path()); });
  EXPECT_NE(message.find((scratch.path() / "state.db").string()), std::string::npos) << message;
  EXPECT_NE(message.find(fmt::format("schema version 99, newer than this gpufleet supports ({})",
                                     kSqliteSchemaVersion)),
            std::string::npos)
      << message;
  RawDb raw(scratch.path() / "state.db");
  EXPECT_EQ(raw.Query("SELECT value FROM meta WHERE key = 'schema_version'"), "99");
}

TEST(SqliteStore, AnotherProgramsDatabaseIsRefused) {
  ScratchDir scratch;
  WriteFile(scratch.path() / "state.db", "");
  {
    RawDb raw(scratch.path() / "state.db");
    raw.Exec("CREATE TABLE photos(id INTEGER PRIMARY KEY)");
  }
  const std::string message = StoreErrorOf([&] { OpenSqliteStore(scratch.path()); });
  EXPECT_NE(message.find("not a gpufleet state store"), std::string::npos) << message;
}

TEST(SqliteStore, ADataDirThatIsAFileIsRefused) {
  ScratchDir scratch;
  WriteFile(scratch.path() / "file", "x");
  const std::string message = StoreErrorOf([&] { OpenSqliteStore(scratch.path() / "file"); });
  EXPECT_NE(message.find((scratch.path() / "file").string()), std::string::npos) << message;
  const std::string below = StoreErrorOf([&] { OpenSqliteStore(scratch.path() / "file" / "d"); });
  EXPECT_NE(below.find("cannot create data dir"), std::string::npos) << below;
}

TEST(SqliteStore, AnUnwritableDataDirIsAStoreError) {
  if (::geteuid() == 0) GTEST_SKIP() << "root may write anywhere";
  ScratchDir scratch;
  const fs::path dir = scratch.path() / "ro";
  fs::create_directory(dir);
  fs::permissions(dir, fs::perms::owner_read | fs::perms::owner_exec);
  const std::string message = StoreErrorOf([&] { OpenSqliteStore(dir); });
  EXPECT_NE(message.find(dir.string()), std::string::npos) << message;
  fs::permissions(dir, fs::perms::owner_all);
}

// A trigger planted in the file makes the fourth mutation of a batch fail inside SQLite, after the
// first three were written in the open transaction: none of them may remain.
TEST(SqliteStore, ABatchThatFailsHalfwayLeavesNothingApplied) {
  ScratchDir scratch;
  const KeyValues before = {{"a", "old"}, {"z", "old"}};
  {
    auto store = OpenSqliteStore(scratch.path());
    store->Commit(std::vector<Mutation>{Mutation::Put("a", "old"), Mutation::Put("z", "old")});
  }
  {
    RawDb raw(scratch.path() / "state.db");
    raw.Exec(
        "CREATE TRIGGER refuse_poison BEFORE INSERT ON kv WHEN NEW.key = 'poison' "
        "BEGIN SELECT RAISE(ABORT, 'forced failure for the test'); END");
  }
  auto store = OpenSqliteStore(scratch.path());
  const std::vector<Mutation> batch = {Mutation::Put("a", "new"), Mutation::Delete("z"),
                                       Mutation::Put("b", "1"), Mutation::Put("poison", "x"),
                                       Mutation::Put("c", "1")};
  const std::string message = StoreErrorOf([&] { store->Commit(batch); });
  EXPECT_NE(message.find("forced failure for the test"), std::string::npos) << message;
  EXPECT_NE(message.find((scratch.path() / "state.db").string()), std::string::npos) << message;
  EXPECT_EQ(store->List(""), before);

  // The store goes on working, and the failed batch never reaches the file.
  testing::Put(*store, "b", "2");
  store.reset();
  store = OpenSqliteStore(scratch.path());
  EXPECT_EQ(store->List(""), (KeyValues{{"a", "old"}, {"b", "2"}, {"z", "old"}}));
}

// A child process commits batches and reports each one through a pipe once Commit has returned;
// it is killed with SIGKILL at a random moment. Every batch it reported must be in the file, and
// the one it was committing when it died must be there whole or not at all.
TEST(SqliteStore, AKilledWriterLosesNoAcknowledgedBatch) {
  ScratchDir scratch;
  const unsigned seed = std::random_device()();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937 random(seed);
  int64_t next = 0;  // the first batch number of the next round
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(fmt::format("round {}", round));
    int acks[2];
    ASSERT_EQ(::pipe(acks), 0);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::close(acks[0]);
      try {
        auto store = OpenSqliteStore(scratch.path());
        for (int64_t i = next;; ++i) {
          const std::string id = fmt::format("{:08}", i);
          store->Commit(std::vector<Mutation>{Mutation::Put("ack/" + id + "/a", id),
                                              Mutation::Put("ack/" + id + "/b", id),
                                              Mutation::Put("last", id)});
          if (::write(acks[1], &i, sizeof i) != sizeof i) ::_exit(3);
        }
      } catch (...) {
        ::_exit(2);
      }
    }
    ::close(acks[1]);
    // Let it commit for a random while, but at least a few batches.
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(std::uniform_int_distribution(20, 300)(random));
    std::vector<int64_t> acknowledged;
    auto read_acks = [&](int timeout_ms) {
      pollfd readable{acks[0], POLLIN, 0};
      if (::poll(&readable, 1, timeout_ms) <= 0) return false;
      int64_t i;
      const ssize_t n = ::read(acks[0], &i, sizeof i);
      if (n == sizeof i) acknowledged.push_back(i);
      return n > 0;
    };
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while ((std::chrono::steady_clock::now() < deadline || acknowledged.size() < 3) &&
           std::chrono::steady_clock::now() < give_up) {
      if (!read_acks(5) && acknowledged.size() < 3) {
        int status;
        ASSERT_EQ(::waitpid(child, &status, WNOHANG), 0) << "the writer died on its own";
      }
    }
    ASSERT_EQ(::kill(child, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    while (read_acks(0)) {  // what it acknowledged before it died is still in the pipe
    }
    ::close(acks[0]);
    ASSERT_GE(acknowledged.size(), 3u);
    for (size_t k = 0; k < acknowledged.size(); ++k) {
      ASSERT_EQ(acknowledged[k], next + static_cast<int64_t>(k));
    }
    const int64_t last_acked = acknowledged.back();

    auto store = OpenSqliteStore(scratch.path());
    for (const int64_t i : acknowledged) {
      const std::string id = fmt::format("{:08}", i);
      ASSERT_EQ(store->Get("ack/" + id + "/a"), id) << "acknowledged batch " << i << " was lost";
      ASSERT_EQ(store->Get("ack/" + id + "/b"), id) << "acknowledged batch " << i << " was lost";
    }
    // The batch in flight when it died: whole or absent, and nothing after it.
    const std::string in_flight = fmt::format("{:08}", last_acked + 1);
    const bool has_a = store->Get("ack/" + in_flight + "/a").has_value();
    EXPECT_EQ(has_a, store->Get("ack/" + in_flight + "/b").has_value());
    EXPECT_EQ(store->Get("last"), has_a ? in_flight : fmt::format("{:08}", last_acked));
    const size_t expected = 2 * static_cast<size_t>(last_acked + 1 + (has_a ? 1 : 0));
    EXPECT_EQ(store->List("ack/").size(), expected);
    next = last_acked + (has_a ? 2 : 1);
  }
}

}  // namespace
}  // namespace gpufleet::store
