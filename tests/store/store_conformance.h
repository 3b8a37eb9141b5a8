#pragma once

// The conformance suite of store::Store: every backend passes it. It is a type-parameterised
// GoogleTest suite over a factory type, so a backend instantiates it in its own test file:
//
//   struct SqliteFactory {
//     static std::unique_ptr<Store> Open(const std::filesystem::path& dir) {
//       return OpenSqliteStore(dir);
//     }
//   };
//   namespace gpufleet::store::testing {  // the suite's namespace, as the macro needs
//   INSTANTIATE_TYPED_TEST_SUITE_P(Sqlite, StoreConformance, SqliteFactory);
//   }
//
// `Factory::Open(dir)` is given an empty directory that belongs to this one test. Opening the same
// directory again, after the previous store was destroyed, must give back the same data: that is
// how the suite checks durability. A backend that keeps its data elsewhere (etcd) derives its
// location from the directory, say a key namespace named after it. This header may be included by
// several test files of one program (the suite is a template).

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "store/store.h"

namespace gpufleet::store::testing {

using KeyValues = std::vector<std::pair<std::string, std::string>>;

// A fresh directory under the system temp dir, removed with everything in it at the end.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "gpufleet-store-test-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void Put(Store& store, std::string key, std::string value) {
  const Mutation mutation = Mutation::Put(std::move(key), std::move(value));
  store.Commit(std::span(&mutation, 1));
}

inline void Delete(Store& store, std::string key) {
  const Mutation mutation = Mutation::Delete(std::move(key));
  store.Commit(std::span(&mutation, 1));
}

inline KeyValues ScanAll(const Store& store, std::string_view prefix) {
  KeyValues pairs;
  store.Scan(prefix, [&pairs](std::string_view key, std::string_view value) {
    pairs.emplace_back(key, value);
  });
  return pairs;
}

// What List(prefix) must return for the pairs in `model` (std::string orders bytes as unsigned,
// like memcmp, which is the order the store promises).
inline KeyValues Expected(const std::map<std::string, std::string>& model,
                          std::string_view prefix) {
  KeyValues pairs;
  for (const auto& [key, value] : model) {
    if (std::string_view(key).starts_with(prefix)) pairs.emplace_back(key, value);
  }
  return pairs;
}

// Printable form of a key for failure messages: bytes outside ASCII as \xNN.
inline std::string Printable(std::string_view bytes) {
  std::string out;
  for (const char c : bytes) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f) {
      out += c;
    } else {
      out += fmt::format("\\x{:02x}", byte);
    }
  }
  return out;
}

template <typename Factory>
class StoreConformance : public ::testing::Test {
 protected:
  void SetUp() override { store_ = Factory::Open(dir_.path()); }
  void TearDown() override { store_.reset(); }

  Store& store() { return *store_; }
  // Closes the store and opens the same location again.
  void Reopen() {
    store_.reset();
    store_ = Factory::Open(dir_.path());
  }

  ScratchDir dir_;
  std::unique_ptr<Store> store_;
};

TYPED_TEST_SUITE_P(StoreConformance);

TYPED_TEST_P(StoreConformance, DescribesItself) {
  EXPECT_FALSE(this->store().backend().empty());
  EXPECT_FALSE(this->store().location().empty());
}

TYPED_TEST_P(StoreConformance, PutGetOverwriteDelete) {
  Store& store = this->store();
  EXPECT_EQ(store.Get("jobs/1"), std::nullopt);
  Put(store, "jobs/1", "first");
  EXPECT_EQ(store.Get("jobs/1"), "first");
  EXPECT_EQ(store.Get("jobs/2"), std::nullopt);
  EXPECT_EQ(store.Get("jobs/"), std::nullopt);
  EXPECT_EQ(store.Get("jobs/10"), std::nullopt);
  Put(store, "jobs/1", "second");
  EXPECT_EQ(store.Get("jobs/1"), "second");
  Put(store, "jobs/2", "other");
  Delete(store, "jobs/1");
  EXPECT_EQ(store.Get("jobs/1"), std::nullopt);
  EXPECT_EQ(store.Get("jobs/2"), "other");
  Delete(store, "jobs/1");  // deleting a missing key is no error
  Delete(store, "never-there");
  EXPECT_EQ(store.List(""), (KeyValues{{"jobs/2", "other"}}));
}

TYPED_TEST_P(StoreConformance, EmptyBatchIsANoOp) {
  Store& store = this->store();
  store.Commit({});
  EXPECT_TRUE(store.List("").empty());
  Put(store, "a", "1");
  store.Commit(std::vector<Mutation>{});
  EXPECT_EQ(store.List(""), (KeyValues{{"a", "1"}}));
}

TYPED_TEST_P(StoreConformance, BatchAppliesInOrderAndALaterMutationWins) {
  Store& store = this->store();
  Put(store, "d", "old");
  Put(store, "e", "old");
  store.Commit(std::vector<Mutation>{
      Mutation::Put("a", "1"),
      Mutation::Put("a", "2"),  // overwrites the 1 of the same batch
      Mutation::Put("b", "1"),
      Mutation::Delete("b"),  // deletes what the same batch wrote
      Mutation::Delete("c"),
      Mutation::Put("c", "3"),  // writes after a delete of a missing key
      Mutation::Delete("d"),    // deletes what was there before
      Mutation::Put("e", "new"),
      Mutation::Delete("e"),
      Mutation::Put("e", "newest"),
  });
  EXPECT_EQ(store.List(""), (KeyValues{{"a", "2"}, {"c", "3"}, {"e", "newest"}}));
  this->Reopen();
  EXPECT_EQ(this->store().List(""), (KeyValues{{"a", "2"}, {"c", "3"}, {"e", "newest"}}));
}

TYPED_TEST_P(StoreConformance, InvalidKeyRefusesTheWholeBatch) {
  Store& store = this->store();
  Put(store, "kept", "1");
  const std::vector<Mutation> with_nul = {Mutation::Put("a", "1"),
                                          Mutation::Put(std::string("b\0c", 3), "2"),
                                          Mutation::Delete("kept")};
  EXPECT_THROW(store.Commit(with_nul), std::invalid_argument);
  const std::vector<Mutation> with_empty = {Mutation::Put("a", "1"), Mutation::Delete("kept"),
                                            Mutation::Put("", "2")};
  EXPECT_THROW(store.Commit(with_empty), std::invalid_argument);
  EXPECT_EQ(store.List(""), (KeyValues{{"kept", "1"}}));
  Put(store, "a", "after");  // still usable
  EXPECT_EQ(store.List(""), (KeyValues{{"a", "after"}, {"kept", "1"}}));
}

// Prefixes are bytes: '%' and '_' are no wildcards, 0xff has no successor byte, and order is
// unsigned byte order ("\x7f" < "\x80" < "\xff").
TYPED_TEST_P(StoreConformance, ListAndScanMatchPrefixesByteForByte) {
  Store& store = this->store();
  const std::vector<std::string> keys = {
      "jobs/1",
      "jobs/10",
      "jobs/2",
      "jobs",
      "jobs0",
      "jobr",
      "job",
      "jobs/%",
      "jobs/_",
      "jobs/x",
      "nodes/a",
      "a%b",
      "a_b",
      "a%",
      "a_",
      "ab",
      "axb",
      "a\\b",
      "a",
      "\x7f",
      "\x80",
      "\xff",
      "\xff\xff",
      "\xff\xff\x01",
      "\xff\x01",
      "a\xff",
      "a\xff\xff",
      "a\xff\x01",
      "b",
      "B",
      "\x01",
      "a\x01",
      "jobs/\xff",
      "jobs0\xff",
      "\xc3\xa9t\xc3\xa9",
      " space",
  };
  std::map<std::string, std::string> model;
  std::vector<Mutation> batch;
  for (size_t i = 0; i < keys.size(); ++i) {
    model[keys[i]] = "value " + std::to_string(i);
    batch.push_back(Mutation::Put(keys[i], model[keys[i]]));
  }
  store.Commit(batch);

  std::vector<std::string> prefixes = {
      "",   "jobs/", "jobs",  "job",  "jobs/1",       "jobs/%", "jobs/_", "a%",
      "a_", "a",     "a\xff", "\xff", "\xff\xff",     "\x80",   "\x7f",   "nope",
      "z",  "\xc3",  "jobs0", "B",    "\xff\xff\xff", "a\\"};
  for (const std::string& key : keys)
    prefixes.push_back(key);  // every whole key is a prefix too
  for (const std::string& prefix : prefixes) {
    SCOPED_TRACE("prefix \"" + Printable(prefix) + "\"");
    const KeyValues expected = Expected(model, prefix);
    EXPECT_EQ(store.List(prefix), expected);
    EXPECT_EQ(ScanAll(store, prefix), expected);
  }

  // Spot checks that do not rely on the model.
  EXPECT_EQ(store.List("a%"), (KeyValues{{"a%", model["a%"]}, {"a%b", model["a%b"]}}));
  EXPECT_EQ(store.List("a_"), (KeyValues{{"a_", model["a_"]}, {"a_b", model["a_b"]}}));
  EXPECT_EQ(store.List("jobs/1"),
            (KeyValues{{"jobs/1", model["jobs/1"]}, {"jobs/10", model["jobs/10"]}}));
  EXPECT_EQ(store.List("\xff\xff"),
            (KeyValues{{"\xff\xff", model["\xff\xff"]}, {"\xff\xff\x01", model["\xff\xff\x01"]}}));
  EXPECT_EQ(store.List("").size(), keys.size());
  EXPECT_EQ(store.List("").front().first, "\x01");
  EXPECT_EQ(store.List("").back().first, "\xff\xff\x01");
  EXPECT_TRUE(store.List("jobs/3").empty());
}

TYPED_TEST_P(StoreConformance, ScanStopsOnAnExceptionAndTheStoreStaysUsable) {
  Store& store = this->store();
  store.Commit(std::vector<Mutation>{Mutation::Put("k/1", "1"), Mutation::Put("k/2", "2"),
                                     Mutation::Put("k/3", "3")});
  int visited = 0;
  EXPECT_THROW(store.Scan("k/",
                          [&visited](std::string_view, std::string_view) {
                            if (++visited == 2) throw std::runtime_error("stop");
                          }),
               std::runtime_error);
  EXPECT_EQ(visited, 2);
  Put(store, "k/4", "4");
  EXPECT_EQ(store.List("k/").size(), 4u);
  EXPECT_EQ(ScanAll(store, "k/").size(), 4u);
}

TYPED_TEST_P(StoreConformance, ValuesAreBinarySafe) {
  std::string all_bytes;
  for (int byte = 0; byte < 256; ++byte)
    all_bytes += static_cast<char>(byte);
  const std::map<std::string, std::string> model = {
      {"nul", std::string("a\0b\0\0c", 6)},
      {"only-nul", std::string(3, '\0')},
      {"all-bytes", all_bytes + all_bytes},
      {"empty", ""},
      {"large", std::string(1 << 20, 'x') + std::string("\0end", 4)},
      {"json", R"({"id":42,"name":"train \"big\" model"})"},
  };
  std::vector<Mutation> batch;
  for (const auto& [key, value] : model)
    batch.push_back(Mutation::Put(key, value));
  this->store().Commit(batch);
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round == 0 ? "before reopening" : "after reopening");
    for (const auto& [key, value] : model) {
      const std::optional<std::string> got = this->store().Get(key);
      ASSERT_TRUE(got.has_value()) << key;
      EXPECT_EQ(got->size(), value.size()) << key;
      EXPECT_TRUE(*got == value) << key;
    }
    EXPECT_TRUE(this->store().List("") == Expected(model, ""));
    EXPECT_TRUE(ScanAll(this->store(), "") == Expected(model, ""));
    this->Reopen();
  }
}

TYPED_TEST_P(StoreConformance, CommittedDataSurvivesReopening) {
  std::map<std::string, std::string> model;
  for (int i = 0; i < 20; ++i) {
    const std::string key = fmt::format("jobs/{:016}", i);
    model[key] = fmt::format(R"({{"id":{}}})", i);
    Put(this->store(), key, model[key]);
  }
  Put(this->store(), "jobs/0000000000000003", "rewritten");
  model["jobs/0000000000000003"] = "rewritten";
  this->store().Commit(
      std::vector<Mutation>{Mutation::Delete("jobs/0000000000000004"), Mutation::Put("x", "y")});
  model.erase("jobs/0000000000000004");
  model["x"] = "y";
  this->Reopen();
  EXPECT_EQ(this->store().List(""), Expected(model, ""));
  EXPECT_EQ(this->store().Get("jobs/0000000000000004"), std::nullopt);
  // And it goes on working after reopening.
  Put(this->store(), "jobs/0000000000000004", "back");
  model["jobs/0000000000000004"] = "back";
  this->Reopen();
  EXPECT_EQ(this->store().List(""), Expected(model, ""));
}

TYPED_TEST_P(StoreConformance, TenThousandKeysRoundTrip) {
  constexpr int kKeys = 10'000;
  std::map<std::string, std::string> model;
  std::vector<Mutation> batch;
  for (int i = 0; i < kKeys; ++i) {
    // Committed in an order unlike the key order, in batches of 1000.
    const int id = (i * 7919) % kKeys;
    const std::string key = fmt::format("jobs/{:016}", id);
    model[key] = fmt::format(R"({{"id":{},"gpus":{},"user":"u{}"}})", id, id % 8, id % 97);
    batch.push_back(Mutation::Put(key, model[key]));
    if (batch.size() == 1000) {
      this->store().Commit(batch);
      batch.clear();
    }
  }
  Put(this->store(), "nodes/a", "not a job");
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round == 0 ? "before reopening" : "after reopening");
    const Store& store = this->store();
    ASSERT_EQ(model.size(), static_cast<size_t>(kKeys));
    EXPECT_TRUE(store.List("jobs/") == Expected(model, "jobs/"));
    size_t scanned = 0;
    auto next = model.begin();
    bool in_order = true;
    store.Scan("jobs/", [&](std::string_view key, std::string_view value) {
      if (next == model.end() || key != next->first || value != next->second) in_order = false;
      if (next != model.end()) ++next;
      ++scanned;
    });
    EXPECT_EQ(scanned, model.size());
    EXPECT_TRUE(in_order);
    for (int id = 0; id < kKeys; id += 997) {
      const std::string key = fmt::format("jobs/{:016}", id);
      EXPECT_EQ(store.Get(key), model[key]);
    }
    EXPECT_EQ(store.List("").size(), model.size() + 1);
    this->Reopen();
  }
}

TYPED_TEST_P(StoreConformance, ConcurrentCommitsLoseNoWrite) {
  constexpr int kThreads = 8;
  constexpr int kCommitsPerThread = 40;
  Store& store = this->store();
  std::vector<std::thread> threads;
  std::vector<std::string> errors(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&store, &errors, t] {
      try {
        for (int i = 0; i < kCommitsPerThread; ++i) {
          const std::string key = fmt::format("t{}/{:04}", t, i);
          store.Commit(std::vector<Mutation>{Mutation::Put(key, std::to_string(i)),
                                             Mutation::Put(fmt::format("last/{}", t), key),
                                             Mutation::Put("shared", key)});
          // Readers run between the writers: each thread reads its own write back at once.
          if (store.Get(key) != std::to_string(i)) errors[t] = "lost " + key;
          if (i % 10 == 0) store.List(fmt::format("t{}/", t));
        }
      } catch (const std::exception& error) {
        errors[t] = error.what();
      }
    });
  }
  for (std::thread& thread : threads)
    thread.join();
  for (const std::string& error : errors)
    EXPECT_EQ(error, "");
  for (int round = 0; round < 2; ++round) {
    for (int t = 0; t < kThreads; ++t) {
      const KeyValues own = this->store().List(fmt::format("t{}/", t));
      ASSERT_EQ(own.size(), static_cast<size_t>(kCommitsPerThread)) << "thread " << t;
      for (int i = 0; i < kCommitsPerThread; ++i) {
        EXPECT_EQ(own[i].first, fmt::format("t{}/{:04}", t, i));
        EXPECT_EQ(own[i].second, std::to_string(i));
      }
      EXPECT_EQ(this->store().Get(fmt::format("last/{}", t)),
                fmt::format("t{}/{:04}", t, kCommitsPerThread - 1));
    }
    // The shared key holds the last write of one of the threads.
    const std::optional<std::string> shared = this->store().Get("shared");
    ASSERT_TRUE(shared.has_value());
    EXPECT_TRUE(shared->ends_with(fmt::format("/{:04}", kCommitsPerThread - 1))) << *shared;
    this->Reopen();
  }
}

REGISTER_TYPED_TEST_SUITE_P(StoreConformance, DescribesItself, PutGetOverwriteDelete,
                            EmptyBatchIsANoOp, BatchAppliesInOrderAndALaterMutationWins,
                            InvalidKeyRefusesTheWholeBatch, ListAndScanMatchPrefixesByteForByte,
                            ScanStopsOnAnExceptionAndTheStoreStaysUsable, ValuesAreBinarySafe,
                            CommittedDataSurvivesReopening, TenThousandKeysRoundTrip,
                            ConcurrentCommitsLoseNoWrite);

}  // namespace gpufleet::store::testing
