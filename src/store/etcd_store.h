#pragma once

// The etcd backend of store::Store (docs/store.md): every key lives under a namespace prefix in an
// etcd v3 cluster, reached through etcd's JSON gateway (HTTP/1.1, `/v3/kv/...`). A batch is one
// etcd transaction, so it is atomic, and etcd answers only once the transaction is committed by
// a quorum and in each member's fsync'd log: durable before acknowledged. Reads are
// linearizable.
//
// One writer at a time: opening takes the prefix's lock, a key (PREFIX without its last '/' +
// ".lock") held by a lease of this store's that a thread keeps alive. Every commit is a
// transaction that first compares the lock's revision with the one this store created: once the
// lease has expired (this process stalled or was cut off) or another server holds the lock, a
// commit fails and writes nothing (fencing), however late it arrives.

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "store/store.h"

namespace gpufleet::store {

struct EtcdOptions {
  // Client URLs of the members ("http://10.0.0.1:2379"); a request that cannot reach one, or that
  // one answers as not leading (no leader, leader changed), goes to the next.
  std::vector<std::string> endpoints;
  // Prepended to every key; lets several clusters (or tests) share one etcd. Not empty.
  std::string key_prefix = "gpufleet/";
  // Seconds the lock outlives this store when it stops renewing it (killed, cut off); another
  // server may take over after that.
  int lease_ttl_s = 5;
  // Written into the lock for whoever finds it taken ("host pid 1234"); empty: this host and pid.
  std::string holder;
  // Where the holder serves clients ("http://10.0.0.1:8080"), also in the lock: a standby
  // redirects clients there. Empty: not said.
  std::string url;
};

// Thrown by OpenEtcdStore when another store holds the prefix's lock.
class EtcdLockHeld : public StoreError {
 public:
  EtcdLockHeld(const std::string& message, std::string holder, std::string url)
      : StoreError(message), holder_(std::move(holder)), url_(std::move(url)) {}
  const std::string& holder() const { return holder_; }  // "host-a pid 4242"
  const std::string& url() const { return url_; }        // the holder's EtcdOptions::url, or ""

 private:
  std::string holder_;
  std::string url_;
};

// "etcd://host:2379,host2:2379/prefix/" -> endpoints and prefix (default "gpufleet/"), or nothing
// with `error` set.
std::optional<EtcdOptions> ParseEtcdUrl(std::string_view url, std::string& error);

// Connects (asks each member for its status until one answers) and takes the prefix's lock.
// Throws StoreError when no member answers, naming each and why, and EtcdLockHeld (naming the
// holder) when another store has the lock.
std::unique_ptr<Store> OpenEtcdStore(const EtcdOptions& options);

// RFC 4648 base64 with padding, as etcd's JSON gateway carries keys and values.
std::string Base64Encode(std::string_view bytes);
std::optional<std::string> Base64Decode(std::string_view text);

}  // namespace gpufleet::store
