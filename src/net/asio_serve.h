#pragma once

// The two steps every Asio server of gpufleet takes at start (net::HttpServer, the gateway):
// listen on host:port, then run the io_context on its threads. Includes Asio: for the few .cpp
// files that already do, never for a public header.

#include <algorithm>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <fmt/format.h>
#include <sys/resource.h>

namespace gpufleet::net {

// Opens, binds (SO_REUSEADDR) and listens; the bound endpoint (with the real port), or why not:
// "invalid listen address ...", "listen on 127.0.0.1:8080: Address already in use".
inline std::optional<boost::asio::ip::tcp::endpoint> Listen(
    boost::asio::ip::tcp::acceptor& acceptor, const std::string& host, uint16_t port,
    std::string& error) {
  namespace asio = boost::asio;
  boost::system::error_code code;
  const asio::ip::address address = asio::ip::make_address(host, code);
  if (code) {
    error =
        fmt::format("invalid listen address '{}': expected an IP address such as 127.0.0.1", host);
    return std::nullopt;
  }
  const asio::ip::tcp::endpoint wanted(address, port);
  const std::string where =
      address.is_v6() ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
  auto fail = [&](const char* step) {
    error = fmt::format("{} {}: {}", step, where, code.message());
    return std::nullopt;
  };
  if (acceptor.open(wanted.protocol(), code); code) return fail("open a socket for");
  if (acceptor.set_option(asio::socket_base::reuse_address(true), code); code)
    return fail("set SO_REUSEADDR on");
  if (acceptor.bind(wanted, code); code) return fail("listen on");
  if (acceptor.listen(asio::socket_base::max_listen_connections, code); code)
    return fail("listen on");
  auto bound = acceptor.local_endpoint(code);
  if (code) return fail("read the bound address of");
  return bound;
}

// How many connections a server holds open at most by default: half the process's open-file
// limit (the rest is for the store, logs, upstreams and workloads), from 16 to 10000.
inline size_t DefaultMaxConnections() {
  rlimit files{};
  const size_t limit = ::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY
                           ? static_cast<size_t>(files.rlim_cur)
                           : 20000;
  return std::clamp<size_t>(limit / 2, 16, 10000);
}

// A connection over a server's limits gets a plain 503 with `body`, written without waiting (the
// socket's buffer takes it; if not, the client is only told by the close), and is closed. A TLS
// listener (`plain` false) only closes: the client has not finished its handshake.
inline void RefuseConnection(boost::asio::ip::tcp::socket socket, std::string_view content_type,
                             std::string_view body, bool plain = true) {
  boost::system::error_code ignored;
  if (plain) {
    const std::string raw = fmt::format(
        "HTTP/1.1 503 Service Unavailable\r\nServer: gpufleet\r\nContent-Type: {}\r\n"
        "Content-Length: {}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n{}",
        content_type, body.size(), body);
    socket.non_blocking(true, ignored);
    socket.write_some(boost::asio::buffer(raw), ignored);
  }
  socket.shutdown(boost::asio::ip::tcp::socket::shutdown_both, ignored);
  socket.close(ignored);
}

// Runs `ioc` on `count` (at least 1) new threads; on failure stops and joins those started and
// says why ("start <what>'s threads: ...").
inline std::optional<std::string> RunIoThreads(boost::asio::io_context& ioc, int count,
                                               std::vector<std::thread>& threads,
                                               const char* what) {
  try {
    for (int i = 0; i < std::max(1, count); ++i)
      threads.emplace_back([&ioc] { ioc.run(); });
  } catch (const std::system_error& thread_error) {
    ioc.stop();
    for (std::thread& thread : threads)
      thread.join();
    threads.clear();
    return fmt::format("start {}'s threads: {}", what, thread_error.what());
  }
  return std::nullopt;
}

}  // namespace gpufleet::net
