#pragma once

// Real etcd members for tests: Debian's etcd-server binary (`make deps` installs it), started on
// free loopback ports with data dirs of their own, stopped (SIGKILL) at the end. A test that needs
// etcd fails, naming the package, when the binary is missing.

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "net/http_client.h"

namespace gpufleet::store::testing {

inline constexpr const char* kEtcdBinary = "/usr/bin/etcd";

// A port nothing listens on now (the kernel's pick for a socket bound to port 0).
inline int FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0)
    throw std::runtime_error("cannot find a free port");
  ::close(fd);
  return ntohs(address.sin_port);
}

// A cluster of `members` etcd processes on 127.0.0.1.
class EtcdCluster {
 public:
  EtcdCluster(const std::filesystem::path& dir, int members) {
    if (::access(kEtcdBinary, X_OK) != 0)
      throw std::runtime_error(fmt::format(
          "{} is missing: install Debian's etcd-server (`make deps` does)", kEtcdBinary));
    for (int i = 0; i < members; ++i)
      members_.push_back({fmt::format("m{}", i), FreeLoopbackPort(), FreeLoopbackPort(), -1});
    for (const Member& member : members_)
      initial_cluster_ +=
          fmt::format("{}{}=http://127.0.0.1:{}", initial_cluster_.empty() ? "" : ",", member.name,
                      member.peer_port);
    for (size_t i = 0; i < members_.size(); ++i) {
      data_dirs_.push_back(dir / members_[i].name);
      Start(i);
    }
    for (size_t i = 0; i < members_.size(); ++i)
      if (!WaitHealthy(i))
        throw std::runtime_error(fmt::format("etcd member {} did not become healthy", i));
  }
  ~EtcdCluster() {
    for (size_t i = 0; i < members_.size(); ++i)
      Kill(i);
  }
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  std::string ClientUrl(size_t i) const {
    return fmt::format("http://127.0.0.1:{}", members_[i].client_port);
  }
  std::vector<std::string> ClientUrls() const {
    std::vector<std::string> urls;
    for (size_t i = 0; i < members_.size(); ++i)
      urls.push_back(ClientUrl(i));
    return urls;
  }
  // "127.0.0.1:P1,127.0.0.1:P2" for an etcd:// URL.
  std::string HostPorts() const {
    std::string hosts;
    for (const Member& member : members_)
      hosts += fmt::format("{}127.0.0.1:{}", hosts.empty() ? "" : ",", member.client_port);
    return hosts;
  }

  void Kill(size_t i) {
    Member& member = members_[i];
    if (member.pid <= 0) return;
    ::kill(member.pid, SIGKILL);
    ::waitpid(member.pid, nullptr, 0);
    member.pid = -1;
  }
  // Starts member i again on its data dir (after Kill).
  void Restart(size_t i) {
    Start(i);
    if (!WaitHealthy(i)) throw std::runtime_error(fmt::format("etcd member {} did not restart", i));
  }

 private:
  struct Member {
    std::string name;
    int client_port;
    int peer_port;
    pid_t pid;
  };

  void Start(size_t i) {
    Member& member = members_[i];
    const std::vector<std::string> args = {
        kEtcdBinary, "--name", member.name, "--data-dir", data_dirs_[i].string(),
        "--listen-client-urls", ClientUrl(i), "--advertise-client-urls", ClientUrl(i),
        "--listen-peer-urls", fmt::format("http://127.0.0.1:{}", member.peer_port),
        "--initial-advertise-peer-urls", fmt::format("http://127.0.0.1:{}", member.peer_port),
        "--initial-cluster", initial_cluster_, "--initial-cluster-token",
        fmt::format("gpufleet-test-{}", ::getpid()),
        // The server's batches (docs/store.md): more operations and bytes than the defaults.
        "--max-txn-ops", "20000", "--max-request-bytes", "67108864", "--logger", "zap",
        "--log-level", "error", "--heartbeat-interval", "50", "--election-timeout", "500"};
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a test that crashed
      std::vector<char*> argv;
      for (const std::string& arg : args)
        argv.push_back(const_cast<char*>(arg.c_str()));
      argv.push_back(nullptr);
      ::execv(kEtcdBinary, argv.data());
      ::_exit(127);
    }
    member.pid = pid;
  }

  bool WaitHealthy(size_t i) const {
    for (int attempt = 0; attempt < 200; ++attempt) {
      const net::HttpResult result =
          net::HttpGet(ClientUrl(i) + "/health", std::chrono::milliseconds(500));
      if (result.ok() && result.response->status == 200 &&
          result.response->body.find("\"true\"") != std::string::npos)
        return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  std::vector<Member> members_;
  std::vector<std::filesystem::path> data_dirs_;
  std::string initial_cluster_;
};

}  // namespace gpufleet::store::testing
