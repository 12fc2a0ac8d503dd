// A client of PyTorch's c10d TCPStore wire protocol (both server backends), POSIX sockets only: no torch needed.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gpuguard/error.h"

namespace gpuguard {

// One connection to the job's TCPStore, speaking the protocol of torch's own client (TCPStore.cpp) so that the
// two see the same keys: every key goes on the wire as "/" + key, as torch's client sends it, and a value set
// here is what torch's store.get() returns, and the reverse. Values are bytes; std::string only carries them.
//
// Deadlines: every operation ends within its timeout (the per-operation timeout given to connect(), 30 s by
// default like torch's). Reads and writes wait in poll() for the time left, never longer. A wait (wait(), and
// get()/multi_get(), which wait for their keys first, as torch's client does) that times out is cancelled on the
// server (CANCEL_WAIT, like torch) and the client stays usable; when the server does not confirm the cancel in
// time, or on any other failure in mid-exchange (a timeout, a closed connection, a short read, an answer that is
// not the protocol's), the client closes the connection, because the byte stream is no longer in step: every
// later call fails at once with that first error (broken() is true). Make a new client to try again.
//
// Errors name the store (host:port) and the operation; library "c10d TCPStore".
//
// Not thread-safe: one client is used by one thread at a time (the watchdog's thread). Requests are sent whole,
// in one write each, so that the legacy server (one thread for every client, blocking reads) never waits on us
// in mid-request and keeps serving the job's other clients.
class TcpStoreClient {
 public:
  using Duration = std::chrono::milliseconds;
  static constexpr Duration kDefaultTimeout{30000};  // torch's Store::kDefaultTimeout

  // host: a name or an IPv4/IPv6 literal ("[::1]" is accepted too). Tries every address getaddrinfo gives, each
  // connect bounded by what is left of `timeout`; a refused connection is not retried (unlike torch's client,
  // which retries until its timeout), so that a wrong address fails promptly. Then the handshake torch's client
  // does: VALIDATE with the magic number, and a PING whose echo proves the peer speaks the protocol.
  // The name lookup itself (getaddrinfo) has no timeout of ours; literals never wait on it.
  static Result<std::unique_ptr<TcpStoreClient>> connect(std::string host, int port,
                                                         Duration timeout = kDefaultTimeout);

  ~TcpStoreClient();
  TcpStoreClient(const TcpStoreClient&) = delete;
  TcpStoreClient& operator=(const TcpStoreClient&) = delete;

  // Sets key to value. The server sends no answer (as for torch's set), so a failure can surface only at the
  // next call. libuv's server accepts keys up to 8 KiB and values up to 8 MiB and drops a client that sends
  // more: both are refused here before sending, with either server.
  Status set(std::string_view key, std::string_view value);
  // The value of key, waiting (up to `timeout`, default the client's) until some client sets it.
  Result<std::string> get(std::string_view key);
  Result<std::string> get(std::string_view key, Duration timeout);
  // Adds delta to the decimal integer stored at key (missing: 0) and returns the sum; add(key, 0) reads it.
  Result<std::int64_t> add(std::string_view key, std::int64_t delta);
  // Whether every key exists (no waiting). An empty list is true without asking the server.
  Result<bool> check(const std::vector<std::string>& keys);
  // torch's compareSet: when key holds `expected`, or is missing and `expected` is empty, sets it to `desired`.
  // Returns the key's value afterwards: `desired` on success, else the current value (and, for a missing key
  // with a non-empty `expected`, `expected` itself: the server's quirk, kept).
  Result<std::string> compare_set(std::string_view key, std::string_view expected, std::string_view desired);
  // Waits until every key exists, up to `timeout` (default the client's). On timeout the wait is cancelled on
  // the server and the client stays usable.
  Status wait(const std::vector<std::string>& keys);
  Status wait(const std::vector<std::string>& keys, Duration timeout);
  // The values of keys, in order, after waiting (up to the client's timeout) for all of them, as torch does.
  Result<std::vector<std::string>> multi_get(const std::vector<std::string>& keys);

  const std::string& address() const { return address_; }  // "host:port", as errors name it
  Duration timeout() const { return timeout_; }
  // Changes the per-operation timeout for later calls (at least 1 ms), e.g. a short one once connected.
  void set_timeout(Duration timeout) { timeout_ = std::max(timeout, Duration(1)); }
  bool broken() const { return fd_ < 0; }

 private:
  struct Deadline;
  TcpStoreClient(int fd, std::string address, Duration timeout);

  Error fail(Error error);  // closes the connection and remembers why
  Error protocol_error(const std::string& op, const std::string& detail, const std::string& where);
  Status usable(const std::string& op) const;
  // Waits in poll() until the connection is ready for `events`: true, or false once the deadline passed (EINTR
  // retried). A failing poll closes the connection and is returned; what a timeout means is the caller's.
  Result<bool> poll_until(const std::string& op, short events, const Deadline& deadline);
  Status send_all(const std::string& op, const std::string& bytes, const Deadline& deadline);
  Status recv_all(const std::string& op, void* out, std::size_t size, const Deadline& deadline);
  Result<std::string> recv_bytes(const std::string& op, const Deadline& deadline);
  Result<std::uint8_t> recv_byte(const std::string& op, const Deadline& deadline);
  Status do_wait(const std::string& op, const std::vector<std::string>& wire_keys, Duration timeout);
  Status check_sizes(const std::string& op, std::string_view key, std::string_view value) const;
  Status check_sizes(const std::string& op, const std::vector<std::string>& keys) const;

  int fd_ = -1;
  std::string address_;
  Duration timeout_;
  std::string broken_by_;  // the error that closed the connection, repeated by every later call
};

}  // namespace gpuguard
