// A streaming backend for bench/gateway_measure.py --sse: answers every request with a
// text/event-stream of --events events, each its own chunk written by its own send, then the
// last chunk, on keep-alive connections. One thread, plain Asio: it must not be what limits a
// proxy benchmark (a Python SSE server is, at a few thousand streams/s).
//
//   sse_backend --port 9000 [--events 8] [--interval-us 0]

#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

// After <utility>: Boost 1.74's awaitable.hpp uses std::exchange without including it.
#include <boost/asio.hpp>

namespace asio = boost::asio;
using asio::awaitable;
using asio::use_awaitable;
using asio::ip::tcp;

namespace {

struct Options {
  uint16_t port = 0;
  int events = 8;
  std::chrono::microseconds interval{0};
};

constexpr std::string_view kHead =
    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    "Transfer-Encoding: chunked\r\n\r\n";

// The chunk of event `i`: its size in hex, the event, CRLF.
std::string EventChunk(int i) {
  const std::string event = "data: {\"token\": " + std::to_string(i) + "}\n\n";
  char size[16];
  const int length = std::snprintf(size, sizeof size, "%zx\r\n", event.size());
  return std::string(size, static_cast<size_t>(length)) + event + "\r\n";
}

awaitable<void> Serve(tcp::socket socket, const Options& options,
                      const std::vector<std::string>& chunks) {
  socket.set_option(tcp::no_delay(true));
  std::string buffer;
  asio::steady_timer timer(socket.get_executor());
  try {
    for (;;) {
      // One request: a header without a body (wrk sends GETs).
      size_t end;
      while ((end = buffer.find("\r\n\r\n")) == std::string::npos) {
        char data[4096];
        const size_t got = co_await socket.async_read_some(asio::buffer(data), use_awaitable);
        buffer.append(data, got);
      }
      buffer.erase(0, end + 4);
      // The header goes with the first event, as a model server's first token does; every later
      // event is a send of its own.
      std::string first = std::string(kHead) + chunks.front();
      co_await asio::async_write(socket, asio::buffer(first), use_awaitable);
      for (size_t i = 1; i < chunks.size(); ++i) {
        if (options.interval.count() > 0) {
          timer.expires_after(options.interval);
          co_await timer.async_wait(use_awaitable);
        }
        co_await asio::async_write(socket, asio::buffer(chunks[i]), use_awaitable);
      }
      co_await asio::async_write(socket, asio::buffer("0\r\n\r\n", 5), use_awaitable);
    }
  } catch (const std::exception&) {
    // The client closed its connection: nothing to do.
  }
}

awaitable<void> Listen(tcp::acceptor& acceptor, const Options& options,
                       const std::vector<std::string>& chunks) {
  for (;;) {
    tcp::socket socket = co_await acceptor.async_accept(use_awaitable);
    asio::co_spawn(acceptor.get_executor(), Serve(std::move(socket), options, chunks),
                   asio::detached);
  }
}

bool ParseInt(const char* text, long& value) {
  const char* end = text + std::strlen(text);
  auto [stop, error] = std::from_chars(text, end, value);
  return error == std::errc() && stop == end;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  for (int i = 1; i + 1 < argc; i += 2) {
    long value = 0;
    if (!ParseInt(argv[i + 1], value) || value < 0) {
      std::fprintf(stderr, "error: %s wants a non-negative number, not '%s'\n", argv[i],
                   argv[i + 1]);
      return 2;
    }
    if (std::strcmp(argv[i], "--port") == 0 && value <= 65535) {
      options.port = static_cast<uint16_t>(value);
    } else if (std::strcmp(argv[i], "--events") == 0 && value >= 1) {
      options.events = static_cast<int>(value);
    } else if (std::strcmp(argv[i], "--interval-us") == 0) {
      options.interval = std::chrono::microseconds(value);
    } else {
      std::fprintf(stderr, "usage: sse_backend --port N [--events N>=1] [--interval-us N]\n");
      return 2;
    }
  }
  if (argc % 2 == 0 || options.port == 0) {
    std::fprintf(stderr, "usage: sse_backend --port N [--events N>=1] [--interval-us N]\n");
    return 2;
  }
  std::vector<std::string> chunks;
  for (int i = 0; i < options.events; ++i)
    chunks.push_back(EventChunk(i));
  asio::io_context io(1);
  tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), options.port));
  asio::co_spawn(io, Listen(acceptor, options, chunks), asio::detached);
  asio::signal_set stop(io, SIGINT, SIGTERM);
  stop.async_wait([&](auto, int) { io.stop(); });
  io.run();
  return 0;
}
