// The etcd backend against real etcd processes (Debian's etcd-server): the conformance suite every
// backend passes, then what is etcd's own: its URL, base64, and failing over between members, with
// a quorum lost and found again.

#include "store/etcd_store.h"

#include <memory>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "etcd_process.h"
#include "store_conformance.h"

namespace gpufleet::store::testing {
namespace {

// One single-member etcd for the conformance tests of this process (ctest runs each test in a
// process of its own).
EtcdCluster* shared_etcd = nullptr;
ScratchDir* shared_etcd_dir = nullptr;

class SharedEtcd : public ::testing::Environment {
 public:
  void TearDown() override {
    delete shared_etcd;
    delete shared_etcd_dir;
    shared_etcd = nullptr;
    shared_etcd_dir = nullptr;
  }
};

EtcdCluster& Etcd() {
  if (!shared_etcd) {
    shared_etcd_dir = new ScratchDir();
    shared_etcd = new EtcdCluster(shared_etcd_dir->path(), 1);
  }
  return *shared_etcd;
}

const auto* const environment = ::testing::AddGlobalTestEnvironment(new SharedEtcd);

}  // namespace

struct EtcdFactory {
  // The test's own key namespace, named after its directory, so that reopening finds its data.
  static std::unique_ptr<Store> Open(const std::filesystem::path& dir) {
    EtcdOptions options;
    options.endpoints = Etcd().ClientUrls();
    options.key_prefix = "test/" + dir.filename().string() + "/";
    return OpenEtcdStore(options);
  }
};

INSTANTIATE_TYPED_TEST_SUITE_P(Etcd, StoreConformance, EtcdFactory);

namespace {

TEST(EtcdUrl, HostsAndPrefix) {
  std::string error;
  auto options = ParseEtcdUrl("etcd://10.0.0.1:2379,10.0.0.2:2379/prod", error);
  ASSERT_TRUE(options) << error;
  EXPECT_EQ(options->endpoints,
            (std::vector<std::string>{"http://10.0.0.1:2379", "http://10.0.0.2:2379"}));
  EXPECT_EQ(options->key_prefix, "prod/");
  options = ParseEtcdUrl("etcd://127.0.0.1:2379", error);
  ASSERT_TRUE(options) << error;
  EXPECT_EQ(options->key_prefix, "gpufleet/");
  for (const char* bad : {"http://127.0.0.1:2379", "etcd://", "etcd://host", "etcd://host:x",
                          "etcd://:2379", "etcd://a:1,/p", "etcd://a:1/"}) {
    error.clear();
    EXPECT_FALSE(ParseEtcdUrl(bad, error)) << bad;
    EXPECT_NE(error.find(bad), std::string::npos) << error;
  }
}

TEST(EtcdBase64, RoundTripsEveryByteAndKnownVectors) {
  EXPECT_EQ(Base64Encode(""), "");
  EXPECT_EQ(Base64Encode("f"), "Zg==");
  EXPECT_EQ(Base64Encode("fo"), "Zm8=");
  EXPECT_EQ(Base64Encode("foobar"), "Zm9vYmFy");
  std::string all;
  for (int byte = 0; byte < 256; ++byte)
    all += static_cast<char>(byte);
  for (size_t length = 0; length <= all.size(); length += 7)
    EXPECT_EQ(Base64Decode(Base64Encode(all.substr(0, length))), all.substr(0, length));
  for (const char* bad : {"Zg=", "Z===", "Zg==Zg==", "Zm9v!mFy", "=Zg="})
    EXPECT_FALSE(Base64Decode(bad)) << bad;
}

TEST(EtcdStore, NoMemberReachableIsAStoreErrorNamingEach) {
  EtcdOptions options;
  options.endpoints = {fmt::format("http://127.0.0.1:{}", FreeLoopbackPort())};
  try {
    OpenEtcdStore(options);
    FAIL() << "opened a store with no etcd";
  } catch (const StoreError& error) {
    EXPECT_NE(std::string(error.what()).find("cannot reach etcd: " + options.endpoints[0]),
              std::string::npos)
        << error.what();
  }
}

// One writer per prefix: a second store is refused naming the first; once the first is closed
// (its lease revoked) the second opens. A store whose lock was taken over writes nothing more.
TEST(EtcdStore, OneWriterPerPrefixAndALockTakenOverFencesTheOldOne) {
  EtcdOptions options;
  options.endpoints = Etcd().ClientUrls();
  options.key_prefix = "lock-test/";
  options.holder = "first";
  options.url = "http://10.0.0.1:8080";
  auto first = OpenEtcdStore(options);
  Put(*first, "a", "1");
  options.holder = "second";
  options.url = "http://10.0.0.2:8080";
  try {
    OpenEtcdStore(options);
    FAIL() << "two stores on one prefix";
  } catch (const EtcdLockHeld& error) {
    EXPECT_NE(std::string(error.what())
                  .find("in use by another gpufleet server (first, serving http://10.0.0.1:8080)"),
              std::string::npos)
        << error.what();
    // What a standby redirects clients to.
    EXPECT_EQ(error.holder(), "first");
    EXPECT_EQ(error.url(), "http://10.0.0.1:8080");
  }
  first.reset();
  auto second = OpenEtcdStore(options);
  EXPECT_EQ(second->Get("a"), "1");
  // The lock is not one of the store's keys.
  EXPECT_EQ(second->List(""), (KeyValues{{"a", "1"}}));

  // Someone deletes the lock behind the second store's back and a third takes it: the second's
  // next commit is refused by etcd itself and leaves nothing.
  const net::HttpResult deleted =
      net::HttpPost(Etcd().ClientUrl(0) + "/v3/kv/deleterange",
                    fmt::format(R"({{"key": "{}"}})", Base64Encode("lock-test.lock")));
  ASSERT_TRUE(deleted.ok() && deleted.response->status == 200);
  options.holder = "third";
  auto third = OpenEtcdStore(options);
  try {
    Put(*second, "b", "2");
    FAIL() << "a fenced store committed";
  } catch (const StoreError& error) {
    EXPECT_NE(std::string(error.what()).find("no longer holds the lock"), std::string::npos)
        << error.what();
  }
  EXPECT_EQ(third->Get("b"), std::nullopt);
  Put(*third, "b", "3");
  EXPECT_EQ(third->Get("b"), "3");
}

// A holder killed without closing: its lock frees itself when the lease runs out.
TEST(EtcdStore, AKilledHoldersLockFreesAfterItsLease) {
  EtcdOptions options;
  options.endpoints = Etcd().ClientUrls();
  options.key_prefix = "killed/";
  options.lease_ttl_s = 2;
  const pid_t child = ::fork();
  if (child == 0) {
    try {
      auto store = OpenEtcdStore(options);
      Put(*store, "from-the-child", "1");
      ::raise(SIGKILL);  // with the store open: the lease is not revoked
    } catch (...) {
    }
    ::_exit(1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the child failed to open the store";
  EXPECT_THROW(OpenEtcdStore(options), EtcdLockHeld);
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<Store> store;
  while (!store && std::chrono::steady_clock::now() - start < std::chrono::seconds(10)) {
    try {
      store = OpenEtcdStore(options);
    } catch (const EtcdLockHeld&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  ASSERT_TRUE(store);
  EXPECT_EQ(store->Get("from-the-child"), "1");
}

EtcdOptions OptionsFor(const EtcdCluster& cluster, std::string key_prefix) {
  EtcdOptions options;
  options.endpoints = cluster.ClientUrls();
  options.key_prefix = std::move(key_prefix);
  return options;
}

// Polls `done` every 20 ms until it holds or `timeout` has passed; says whether it held.
template <typename Done>
bool WaitUntil(Done done, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// A store whose lease cannot be renewed says it is lost within a TTL (its server then stops
// serving: another may lead), and refuses commits at once; it is found again once renewed. A
// lease etcd says has expired stays lost.
TEST(EtcdStore, SaysItIsLostOnceItsLeaseMayHaveRunOut) {
  ScratchDir dir;
  EtcdCluster cluster(dir.path(), 1);
  EtcdOptions options = OptionsFor(cluster, "lost/");
  options.lease_ttl_s = 2;
  auto store = OpenEtcdStore(options);
  Put(*store, "a", "1");
  EXPECT_EQ(store->Lost(), std::nullopt);

  cluster.Kill(0);
  const auto killed = std::chrono::steady_clock::now();
  ASSERT_TRUE(WaitUntil([&] { return store->Lost().has_value(); }, std::chrono::seconds(10)));
  // By the clock, not by a call timing out: a TTL after the last renewal (margin for a busy box).
  EXPECT_LE(std::chrono::steady_clock::now() - killed, std::chrono::seconds(5));
  EXPECT_NE(store->Lost()->find("was not renewed for 2 s"), std::string::npos) << *store->Lost();
  const auto put = std::chrono::steady_clock::now();
  EXPECT_THROW(Put(*store, "b", "2"), StoreError);
  EXPECT_LT(std::chrono::steady_clock::now() - put, std::chrono::seconds(2));  // no call made

  cluster.Restart(0);  // etcd keeps its leases over a restart and gives them a fresh TTL
  ASSERT_TRUE(WaitUntil([&] { return !store->Lost(); }, std::chrono::seconds(20)));
  Put(*store, "b", "2");

  // The lease revoked behind the store's back: the next renewal hears it is gone.
  const net::HttpResult lock =
      net::HttpPost(cluster.ClientUrl(0) + "/v3/kv/range",
                    fmt::format(R"({{"key": "{}"}})", Base64Encode("lost.lock")));
  ASSERT_TRUE(lock.ok() && lock.response->status == 200);
  const std::string lease =
      nlohmann::json::parse(lock.response->body).at("kvs").at(0).at("lease").get<std::string>();
  const net::HttpResult revoked = net::HttpPost(cluster.ClientUrl(0) + "/v3/lease/revoke",
                                                fmt::format(R"({{"ID": "{}"}})", lease));
  ASSERT_TRUE(revoked.ok() && revoked.response->status == 200);
  ASSERT_TRUE(WaitUntil([&] { return store->Lost().has_value(); }, std::chrono::seconds(10)));
  EXPECT_NE(store->Lost()->find("expired"), std::string::npos) << *store->Lost();
}

// Three members: with one killed every call goes to the others; with two killed (no quorum) a
// commit fails with each member's reason and nothing is lost; with one back, all is as it was.
TEST(EtcdStore, FailsOverBetweenMembersAndWaitsOutALostQuorum) {
  ScratchDir dir;
  EtcdCluster cluster(dir.path(), 3);
  auto store = OpenEtcdStore(OptionsFor(cluster, "failover/"));
  Put(*store, "a", "1");
  cluster.Kill(0);  // the member the store asks first
  Put(*store, "b", "2");
  EXPECT_EQ(store->Get("a"), "1");
  EXPECT_EQ(store->List("").size(), 2u);
  cluster.Kill(1);
  try {
    Put(*store, "c", "3");
    FAIL() << "committed without a quorum";
  } catch (const StoreError& error) {
    // Each member's reason, or, once the calls have outlasted the lease (no quorum renews it
    // either), that the lease is lost.
    const std::string what = error.what();
    EXPECT_TRUE(what.find(cluster.ClientUrl(0)) != std::string::npos ||
                what.find("was not renewed") != std::string::npos)
        << what;
  }
  cluster.Restart(1);
  // The restarted member rejoins; a commit may need a moment while it catches up.
  bool committed = false;
  for (int attempt = 0; attempt < 100 && !committed; ++attempt) {
    try {
      Put(*store, "c", "3");
      committed = true;
    } catch (const StoreError&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  ASSERT_TRUE(committed);
  EXPECT_EQ(store->List(""), (KeyValues{{"a", "1"}, {"b", "2"}, {"c", "3"}}));
}

}  // namespace
}  // namespace gpufleet::store::testing
