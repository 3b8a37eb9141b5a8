#include "store/sqlite_store.h"

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <mutex>
#include <string>
#include <system_error>
#include <utility>

#include <fcntl.h>
#include <fmt/format.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <unistd.h>

namespace gpufleet::store {
namespace {

namespace fs = std::filesystem;

constexpr int kBusyTimeoutMs = 5000;
// The WAL is truncated back to this size after a checkpoint that follows a large batch.
constexpr int64_t kJournalSizeLimitBytes = 64 << 20;

std::string ErrnoMessage(int err) {
  return std::generic_category().message(err);
}

// An exclusive flock on data_dir/state.lock, held for the store's lifetime, with our pid written
// into the file so that the error a second process gets names the first one.
class LockFile {
 public:
  explicit LockFile(const fs::path& data_dir) {
    const fs::path path = data_dir / "state.lock";
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      throw StoreError(
          fmt::format("cannot open lock file {}: {}", path.string(), ErrnoMessage(errno)));
    }
    int rc;
    do {
      rc = ::flock(fd_, LOCK_EX | LOCK_NB);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      const int err = errno;
      const std::string holder = err == EWOULDBLOCK ? ReadPid() : std::string();
      Close();
      if (err == EWOULDBLOCK) {
        throw StoreError(fmt::format("data dir {} is in use by another gpufleet process (pid {})",
                                     data_dir.string(), holder));
      }
      throw StoreError(fmt::format("cannot lock {}: {}", path.string(), ErrnoMessage(err)));
    }
    const std::string pid = fmt::format("{}\n", ::getpid());
    if (::ftruncate(fd_, 0) != 0 ||
        ::pwrite(fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
      const int err = errno;
      Close();
      throw StoreError(
          fmt::format("cannot write lock file {}: {}", path.string(), ErrnoMessage(err)));
    }
  }
  ~LockFile() { Close(); }
  LockFile(const LockFile&) = delete;
  LockFile& operator=(const LockFile&) = delete;

 private:
  // The pid the holder wrote, or "unknown" when it has not written it yet.
  std::string ReadPid() const {
    char buffer[32];
    const ssize_t n = ::pread(fd_, buffer, sizeof buffer, 0);
    long pid = 0;
    if (n <= 0) return "unknown";
    const auto [end, ec] = std::from_chars(buffer, buffer + n, pid);
    if (ec != std::errc() || end == buffer || pid <= 0) return "unknown";
    return std::to_string(pid);
  }
  void Close() {
    if (fd_ >= 0) ::close(fd_);  // releases the flock
    fd_ = -1;
  }

  int fd_ = -1;
};

// fsync on a directory makes the names of the files just created in it durable.
void SyncDirectory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    throw StoreError(fmt::format("cannot open {}: {}", dir.string(), ErrnoMessage(errno)));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0)
    throw StoreError(fmt::format("cannot fsync {}: {}", dir.string(), ErrnoMessage(err)));
}

struct DbCloser {
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};
struct StmtFinalizer {
  void operator()(sqlite3_stmt* stmt) const { sqlite3_finalize(stmt); }
};
using Db = std::unique_ptr<sqlite3, DbCloser>;
using Stmt = std::unique_ptr<sqlite3_stmt, StmtFinalizer>;

// Resets a reused prepared statement however the code using it exits, so that it never keeps a
// read transaction open or points at bound memory that is gone.
class ResetOnExit {
 public:
  explicit ResetOnExit(sqlite3_stmt* stmt) : stmt_(stmt) {}
  ~ResetOnExit() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  ResetOnExit(const ResetOnExit&) = delete;
  ResetOnExit& operator=(const ResetOnExit&) = delete;

 private:
  sqlite3_stmt* stmt_;
};

std::string_view ColumnBytes(sqlite3_stmt* stmt, int column) {
  const void* data = sqlite3_column_blob(stmt, column);
  const int size = sqlite3_column_bytes(stmt, column);
  if (data == nullptr || size <= 0) return {};
  return {static_cast<const char*>(data), static_cast<size_t>(size)};
}

class SqliteStore final : public Store {
 public:
  SqliteStore(const fs::path& data_dir, SqliteOptions options)
      : db_path_(data_dir / "state.db"), lock_(PrepareDataDir(data_dir)) {
    Open(options);
    // The database and its WAL exist now; make their directory entries durable too.
    SyncDirectory(data_dir);
    begin_ = Prepare("BEGIN IMMEDIATE");
    commit_ = Prepare("COMMIT");
    put_ = Prepare(
        "INSERT INTO kv(key, value) VALUES(?1, ?2) "
        "ON CONFLICT(key) DO UPDATE SET value = excluded.value");
    delete_ = Prepare("DELETE FROM kv WHERE key = ?1");
    get_ = Prepare("SELECT value FROM kv WHERE key = ?1");
    // Prefix listing by key range over the primary key, never LIKE: '%' and '_' are plain bytes.
    scan_range_ = Prepare("SELECT key, value FROM kv WHERE key >= ?1 AND key < ?2 ORDER BY key");
    scan_from_ = Prepare("SELECT key, value FROM kv WHERE key >= ?1 ORDER BY key");
  }

  std::string_view backend() const override { return "sqlite"; }
  std::string location() const override { return db_path_.string(); }

  void Commit(std::span<const Mutation> batch) override {
    if (batch.empty()) return;
    CheckKeys(batch);
    std::lock_guard lock(mu_);
    Step(begin_.get(), "cannot begin a transaction in");
    try {
      for (const Mutation& mutation : batch) {
        if (mutation.kind == Mutation::Kind::kPut) {
          ResetOnExit reset(put_.get());
          BindText(put_.get(), 1, mutation.key);
          BindBlob(put_.get(), 2, mutation.value);
          Step(put_.get(), "cannot write to");
        } else {
          ResetOnExit reset(delete_.get());
          BindText(delete_.get(), 1, mutation.key);
          Step(delete_.get(), "cannot delete from");
        }
      }
      // With synchronous=FULL in WAL mode, COMMIT returns once the WAL is fsync'd.
      Step(commit_.get(), "cannot commit to");
    } catch (...) {
      RollbackIfOpen();
      throw;
    }
  }

  std::optional<std::string> Get(std::string_view key) const override {
    std::lock_guard lock(mu_);
    ResetOnExit reset(get_.get());
    BindText(get_.get(), 1, key);
    const int rc = sqlite3_step(get_.get());
    if (rc == SQLITE_DONE) return std::nullopt;
    if (rc != SQLITE_ROW) Fail("cannot read from", rc);
    return std::string(ColumnBytes(get_.get(), 0));
  }

  std::vector<std::pair<std::string, std::string>> List(std::string_view prefix) const override {
    std::vector<std::pair<std::string, std::string>> result;
    Scan(prefix, [&result](std::string_view key, std::string_view value) {
      result.emplace_back(key, value);
    });
    return result;
  }

  void Scan(std::string_view prefix,
            const std::function<void(std::string_view, std::string_view)>& visit) const override {
    const std::optional<std::string> end = PrefixEnd(prefix);
    std::lock_guard lock(mu_);
    sqlite3_stmt* stmt = end ? scan_range_.get() : scan_from_.get();
    ResetOnExit reset(stmt);
    BindText(stmt, 1, prefix);
    if (end) BindText(stmt, 2, *end);
    while (true) {
      const int rc = sqlite3_step(stmt);
      if (rc == SQLITE_DONE) return;
      if (rc != SQLITE_ROW) Fail("cannot read from", rc);
      visit(ColumnBytes(stmt, 0), ColumnBytes(stmt, 1));
    }
  }

 private:
  // Runs before the lock is taken (member initialiser order): creates the data dir.
  static const fs::path& PrepareDataDir(const fs::path& data_dir) {
    std::error_code ec;
    const bool created = fs::create_directories(data_dir, ec);
    if (ec) {
      throw StoreError(
          fmt::format("cannot create data dir {}: {}", data_dir.string(), ec.message()));
    }
    if (!fs::is_directory(data_dir, ec)) {
      throw StoreError(fmt::format("data dir {} is not a directory", data_dir.string()));
    }
    if (created) {
      const fs::path parent = fs::absolute(data_dir, ec).parent_path();
      if (!ec && !parent.empty()) SyncDirectory(parent);
    }
    return data_dir;
  }

  void Open(SqliteOptions options) {
    sqlite3* raw = nullptr;
    const int rc = sqlite3_open_v2(
        db_path_.c_str(), &raw, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
        nullptr);
    db_.reset(raw);
    if (rc != SQLITE_OK) Fail("cannot open", rc);
    sqlite3_extended_result_codes(db_.get(), 1);
    sqlite3_busy_timeout(db_.get(), kBusyTimeoutMs);
    // The first statement that reads the file: "file is not a database" shows up here.
    const std::string mode = QueryText("PRAGMA journal_mode=WAL", "cannot open");
    if (mode != "wal") {
      throw StoreError(fmt::format("cannot open {}: cannot switch to WAL journal mode (got {})",
                                   db_path_.string(), mode.empty() ? "nothing" : mode));
    }
    Exec(options.synchronous_full ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL",
         "cannot configure");
    Exec(fmt::format("PRAGMA journal_size_limit={}", kJournalSizeLimitBytes).c_str(),
         "cannot configure");
    InitSchema();
  }

  // Creates the tables in a new database, checks the schema version of an existing one.
  void InitSchema() {
    Exec("BEGIN IMMEDIATE", "cannot open");
    try {
      const bool has_meta = !QueryText(
                                 "SELECT name FROM sqlite_master "
                                 "WHERE type = 'table' AND name = 'meta'",
                                 "cannot read the schema of")
                                 .empty();
      if (has_meta) {
        const std::string text = QueryText("SELECT value FROM meta WHERE key = 'schema_version'",
                                           "cannot read the schema of");
        int version = 0;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), version);
        if (ec != std::errc() || end != text.data() + text.size() || version <= 0) {
          throw StoreError(
              fmt::format("{} has no valid schema version (meta.schema_version = '{}')",
                          db_path_.string(), text));
        }
        if (version > kSqliteSchemaVersion) {
          throw StoreError(
              fmt::format("{} has schema version {}, newer than this gpufleet supports ({}); "
                          "run a newer gpufleet or use another data dir",
                          db_path_.string(), version, kSqliteSchemaVersion));
        }
        // Older versions would be migrated here; version 1 is the first.
      } else {
        const std::string other =
            QueryText("SELECT name FROM sqlite_master LIMIT 1", "cannot read the schema of");
        if (!other.empty()) {
          throw StoreError(fmt::format(
              "{} is an SQLite database but not a gpufleet state store (it has '{}' and no meta)",
              db_path_.string(), other));
        }
        Exec("CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
             "cannot create the schema in");
        Exec(fmt::format("INSERT INTO meta(key, value) VALUES('schema_version', '{}')",
                         kSqliteSchemaVersion)
                 .c_str(),
             "cannot create the schema in");
        Exec("CREATE TABLE kv(key TEXT PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID",
             "cannot create the schema in");
      }
      Exec("COMMIT", "cannot open");
    } catch (...) {
      RollbackIfOpen();
      throw;
    }
  }

  [[noreturn]] void Fail(std::string_view what, int rc) const {
    const char* message = db_ ? sqlite3_errmsg(db_.get()) : sqlite3_errstr(rc);
    throw StoreError(fmt::format("{} {}: {} (sqlite error {})", what, db_path_.string(), message,
                                 db_ ? sqlite3_extended_errcode(db_.get()) : rc));
  }

  void Exec(const char* sql, std::string_view what) {
    const int rc = sqlite3_exec(db_.get(), sql, nullptr, nullptr, nullptr);
    if (rc != SQLITE_OK) Fail(what, rc);
  }

  // The first column of the first row as text; empty when there is no row.
  std::string QueryText(const char* sql, std::string_view what) {
    Stmt stmt = Prepare(sql, what);
    const int rc = sqlite3_step(stmt.get());
    if (rc == SQLITE_DONE) return {};
    if (rc != SQLITE_ROW) Fail(what, rc);
    return std::string(ColumnBytes(stmt.get(), 0));
  }

  Stmt Prepare(const char* sql, std::string_view what = "cannot prepare a statement for") {
    sqlite3_stmt* raw = nullptr;
    const int rc = sqlite3_prepare_v3(db_.get(), sql, -1, SQLITE_PREPARE_PERSISTENT, &raw, nullptr);
    Stmt stmt(raw);
    if (rc != SQLITE_OK) Fail(what, rc);
    return stmt;
  }

  // Runs a statement that returns no rows we need, and resets it.
  void Step(sqlite3_stmt* stmt, std::string_view what) const {
    ResetOnExit reset(stmt);
    const int rc = sqlite3_step(stmt);
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) Fail(what, rc);
  }

  void BindText(sqlite3_stmt* stmt, int index, std::string_view text) const {
    // A null pointer would bind NULL; an empty key is the empty string.
    const int rc = sqlite3_bind_text64(stmt, index, text.data() ? text.data() : "", text.size(),
                                       SQLITE_STATIC, SQLITE_UTF8);
    if (rc != SQLITE_OK) Fail("cannot bind a key for", rc);
  }

  void BindBlob(sqlite3_stmt* stmt, int index, std::string_view bytes) const {
    // A null pointer would bind NULL; an empty value is a zero-length blob.
    const int rc = sqlite3_bind_blob64(stmt, index, bytes.data() ? bytes.data() : "", bytes.size(),
                                       SQLITE_STATIC);
    if (rc != SQLITE_OK) Fail("cannot bind a value for", rc);
  }

  // After a failed statement SQLite may or may not have rolled back on its own.
  void RollbackIfOpen() noexcept {
    if (sqlite3_get_autocommit(db_.get()) == 0) {
      sqlite3_exec(db_.get(), "ROLLBACK", nullptr, nullptr, nullptr);
    }
  }

  const fs::path db_path_;
  // Declared before the connection: taken before the file is opened, released after it is closed.
  LockFile lock_;
  Db db_;
  // Guards the connection, the reused statements and the transaction they form.
  mutable std::mutex mu_;
  Stmt begin_, commit_, put_, delete_, get_, scan_range_, scan_from_;
};

}  // namespace

std::unique_ptr<Store> OpenSqliteStore(const std::filesystem::path& data_dir,
                                       SqliteOptions options) {
  return std::make_unique<SqliteStore>(data_dir, options);
}

}  // namespace gpufleet::store
