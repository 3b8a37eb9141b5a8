#pragma once

// The control plane's durable state store: a small key-value interface with atomic multi-key
// batches. Keys are strings chosen by the server ("jobs/0000000000000042"), values are opaque
// bytes. SQLite is the default backend (sqlite_store.h); any other backend (etcd) implements the
// same interface and passes the same conformance suite (tests/store/store_conformance.h).
// See docs/store.md.

#include <functional>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gpufleet::store {

// One change in a batch. A key is one or more bytes, any but NUL (Commit refuses an empty key or
// one with a NUL byte with std::invalid_argument); a value is any bytes, NUL included, or none.
struct Mutation {
  enum class Kind { kPut, kDelete };
  Kind kind = Kind::kPut;
  std::string key;
  std::string value;  // kPut only

  static Mutation Put(std::string key, std::string value) {
    return Mutation{Kind::kPut, std::move(key), std::move(value)};
  }
  static Mutation Delete(std::string key) { return Mutation{Kind::kDelete, std::move(key), {}}; }

  bool operator==(const Mutation&) const = default;
};

// Thrown when the backend cannot do what was asked (disk full, corrupt file, I/O error, data dir
// in use); the message names the file and the backend's error.
class StoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Every method is safe to call from several threads at once.
class Store {
 public:
  virtual ~Store() = default;

  // "sqlite", "etcd": for logs and metrics.
  virtual std::string_view backend() const = 0;
  // Where the data lives (the database file path), for logs.
  virtual std::string location() const = 0;

  // Applies every mutation atomically, in order (a later one on the same key wins), and returns
  // once the change is durable (fsync'd). An empty batch is a no-op. Throws StoreError; then
  // nothing was applied. Throws std::invalid_argument (nothing applied) for an invalid key.
  virtual void Commit(std::span<const Mutation> batch) = 0;

  virtual std::optional<std::string> Get(std::string_view key) const = 0;

  // Every (key, value) whose key starts with `prefix`, in byte-wise (unsigned) key order. An empty
  // prefix lists everything.
  virtual std::vector<std::pair<std::string, std::string>> List(std::string_view prefix) const = 0;

  // Calls `visit` for each pair under `prefix` in key order without holding them all in memory.
  // The views are valid only during the call. `visit` must not call back into this store; an
  // exception it throws ends the scan and propagates to the caller.
  virtual void Scan(
      std::string_view prefix,
      const std::function<void(std::string_view key, std::string_view value)>& visit) const = 0;

  // Why this store can take no more commits although nothing has failed yet, or nothing: a store
  // shared by several servers says so once this one's claim on it may have run out (etcd: the
  // lock's lease was not renewed for a whole TTL), so that its server stops serving at once
  // instead of at its next commit.
  virtual std::optional<std::string> Lost() const { return std::nullopt; }
};

// The smallest key greater than every key that starts with `prefix`, or nullopt when there is
// none (the prefix is empty or all 0xff bytes). Keys under `prefix` are exactly those in
// [prefix, PrefixEnd(prefix)). For backends that list by range.
inline std::optional<std::string> PrefixEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty() && static_cast<unsigned char>(end.back()) == 0xff)
    end.pop_back();
  if (end.empty()) return std::nullopt;
  end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
  return end;
}

// True when `key` may be stored: not empty, no NUL byte (etcd refuses empty keys; SQLite text
// with NUL bytes is not reliable).
inline bool IsValidKey(std::string_view key) {
  return !key.empty() && key.find('\0') == std::string_view::npos;
}

// Throws std::invalid_argument unless every key in `batch` is valid.
inline void CheckKeys(std::span<const Mutation> batch) {
  for (const Mutation& mutation : batch) {
    if (!IsValidKey(mutation.key)) {
      throw std::invalid_argument(mutation.key.empty()
                                      ? "store key is empty"
                                      : "store key of " + std::to_string(mutation.key.size()) +
                                            " bytes contains a NUL byte");
    }
  }
}

}  // namespace gpufleet::store
