// Our own client of PyTorch's c10d TCPStore: the wire protocol of torch's TCPStore.cpp over POSIX sockets.
//
// The protocol (torch/csrc/distributed/c10d: TCPStore.cpp for the client, store/TCPStoreBackend.hpp for the
// codes, TCPStoreLibUvBackend.cpp and TCPStoreBackend.cpp for the two servers; Utils.hpp for the encoding):
// a request is one query byte followed by its arguments; a string or byte vector is a uint64 length and the
// bytes; numbers are in the host's byte order (torch sends them so; both ends are the same architecture in
// practice). A connection's first query must be VALIDATE with the magic number (no answer); torch's client then
// PINGs (a uint32 nonce, echoed). SET has no answer. GET of a missing key answers an empty value on the libuv
// server but makes the legacy server drop the connection, which is why a get waits for its key first (WAIT,
// then GET), as torch's client does. WAIT answers STOP_WAITING once every key exists; CANCEL_WAIT answers
// WAIT_CANCELED (after a STOP_WAITING that crossed it, if the keys came meanwhile).
#include "gpuguard/tcp_store_client.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <utility>

namespace gpuguard {
namespace {

constexpr const char* kLibrary = "c10d TCPStore";

// store/TCPStoreBackend.hpp: c10d::detail::QueryType (the order is the protocol), and the answers.
enum class Query : std::uint8_t {
  VALIDATE = 0,
  SET = 1,
  COMPARE_SET = 2,
  GET = 3,
  ADD = 4,
  CHECK = 5,
  WAIT = 6,
  GETNUMKEYS = 7,
  DELETE_KEY = 8,
  APPEND = 9,
  MULTI_GET = 10,
  MULTI_SET = 11,
  CANCEL_WAIT = 12,
  PING = 13,
};
constexpr std::uint8_t kCheckReady = 0, kCheckNotReady = 1;   // CheckResponseType
constexpr std::uint8_t kStopWaiting = 0, kWaitCanceled = 1;   // WaitResponseType
constexpr std::uint32_t kValidationMagicNumber = 0x3C85F7CE;  // validationMagicNumber

// torch's client puts every key under "/" (TCPStore::keyPrefix_); so do we, so that both see the same keys.
constexpr std::string_view kKeyPrefix = "/";
// TCPStoreLibUvBackend.cpp: MAX_STRING_LEN and MAX_PAYLOAD_LEN; over them the server drops the connection.
constexpr std::size_t kMaxKeyBytes = 8 * 1024;
constexpr std::size_t kMaxValueBytes = 8 * 1024 * 1024;
constexpr std::size_t kMaxKeyCount = 128 * 1024;  // MAX_KEY_COUNT: keys in one CHECK, WAIT or MULTI_GET
// Longest value we accept in an answer: anything longer is not a TCPStore talking.
constexpr std::uint64_t kMaxAnswerBytes = 64ull * 1024 * 1024;
// How long the server gets to confirm a CANCEL_WAIT once a wait has timed out (torch's client waits forever).
constexpr TcpStoreClient::Duration kCancelGrace{5000};

// The errno's own name (ECONNREFUSED). strerrorname_np came in glibc 2.32; a build for an older glibc (the wheels:
// manylinux_2_28, scripts/build_wheels.sh) names the errors a socket, poll or getaddrinfo call can give from this
// table instead.
std::string errno_name(int err) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
  if (const char* name = strerrorname_np(err)) return name;
#else
  static constexpr struct {
    int value;
    const char* name;
  } kSocketErrors[] = {
      {EACCES, "EACCES"},         {EADDRINUSE, "EADDRINUSE"},     {EADDRNOTAVAIL, "EADDRNOTAVAIL"},
      {EAFNOSUPPORT, "EAFNOSUPPORT"}, {EAGAIN, "EAGAIN"},         {EALREADY, "EALREADY"},
      {EBADF, "EBADF"},           {ECONNABORTED, "ECONNABORTED"}, {ECONNREFUSED, "ECONNREFUSED"},
      {ECONNRESET, "ECONNRESET"}, {EHOSTDOWN, "EHOSTDOWN"},       {EHOSTUNREACH, "EHOSTUNREACH"},
      {EINPROGRESS, "EINPROGRESS"}, {EINTR, "EINTR"},             {EINVAL, "EINVAL"},
      {EIO, "EIO"},               {EISCONN, "EISCONN"},           {EMFILE, "EMFILE"},
      {ENETDOWN, "ENETDOWN"},     {ENETRESET, "ENETRESET"},       {ENETUNREACH, "ENETUNREACH"},
      {ENFILE, "ENFILE"},         {ENOBUFS, "ENOBUFS"},           {ENOMEM, "ENOMEM"},
      {ENOTCONN, "ENOTCONN"},     {ENOTSOCK, "ENOTSOCK"},         {EPERM, "EPERM"},
      {EPIPE, "EPIPE"},           {EPROTO, "EPROTO"},             {ETIMEDOUT, "ETIMEDOUT"},
  };
  for (const auto& known : kSocketErrors) {
    if (known.value == err) return known.name;
  }
#endif
  return "errno";
}

// Not named `quoted`: with a std::string argument, argument-dependent lookup also finds std::quoted (<iomanip>,
// which GCC 13's headers include on the way), an exact match that would win over this string_view overload.
std::string escaped_in_quotes(std::string_view s) {
  constexpr std::size_t kShown = 120;
  std::string out = "'";
  for (std::size_t i = 0; i < s.size() && i < kShown; ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (s.size() > kShown) out += "...(" + std::to_string(s.size()) + " bytes)";
  return out + "'";
}

std::string quoted_keys(const std::vector<std::string>& keys) {
  constexpr std::size_t kShown = 4;
  std::string out = keys.size() == 1 ? "key " : "keys ";
  for (std::size_t i = 0; i < keys.size() && i < kShown; ++i) out += (i ? ", " : "") + escaped_in_quotes(keys[i]);
  if (keys.size() > kShown) out += " and " + std::to_string(keys.size() - kShown) + " more";
  return out;
}

std::string ms_text(TcpStoreClient::Duration d) { return std::to_string(d.count()) + " ms"; }

// One request, built whole before it is sent (see the class comment: the legacy server reads blocking).
class Request {
 public:
  explicit Request(Query q) { bytes_.push_back(static_cast<char>(q)); }
  template <typename T>
  Request& value(T v) {
    char raw[sizeof(T)];
    std::memcpy(raw, &v, sizeof(T));
    bytes_.append(raw, sizeof(T));
    return *this;
  }
  Request& bytes(std::string_view s) {
    value<std::uint64_t>(s.size());
    bytes_.append(s);
    return *this;
  }
  Request& key(std::string_view k) {
    value<std::uint64_t>(kKeyPrefix.size() + k.size());
    bytes_.append(kKeyPrefix);
    bytes_.append(k);
    return *this;
  }
  Request& keys(const std::vector<std::string>& ks) {
    value<std::uint64_t>(ks.size());
    for (const auto& k : ks) key(k);
    return *this;
  }
  Request& then(const Request& next) {
    bytes_ += next.bytes_;
    return *this;
  }
  const std::string& data() const { return bytes_; }

 private:
  std::string bytes_;
};

std::string bracketed(const std::string& host) { return host.find(':') != std::string::npos ? "[" + host + "]" : host; }

}  // namespace

struct TcpStoreClient::Deadline {
  std::chrono::steady_clock::time_point at;
  Duration length;
  explicit Deadline(Duration d) : at(std::chrono::steady_clock::now() + d), length(d) {}
  // Milliseconds left for poll(), rounded up so that a wait never ends before its deadline; 0 once passed.
  int poll_ms() const {
    auto left = at - std::chrono::steady_clock::now();
    if (left <= left.zero()) return 0;
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
    return static_cast<int>(std::min<long long>(ms, INT_MAX));
  }
};

TcpStoreClient::TcpStoreClient(int fd, std::string address, Duration timeout)
    : fd_(fd), address_(std::move(address)), timeout_(timeout) {}

TcpStoreClient::~TcpStoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

Error TcpStoreClient::fail(Error error) {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (broken_by_.empty()) broken_by_ = error.message();
  return error;
}

Error TcpStoreClient::protocol_error(const std::string& op, const std::string& detail, const std::string& where) {
  return fail(call_error(
      kLibrary, op, 0, "",
      "the store at " + address_ + " " + detail + ": not a TCPStore answer; the connection is closed", where));
}

Status TcpStoreClient::usable(const std::string& op) const {
  if (fd_ >= 0) return ok_status();
  return call_error(kLibrary, op, 0, "",
                    "the connection to the store at " + address_ + " was closed after an earlier failure (" +
                        broken_by_ + "); connect again",
                    GPUGUARD_WHERE);
}

Status TcpStoreClient::check_sizes(const std::string& op, const std::vector<std::string>& keys) const {
  if (keys.size() > kMaxKeyCount)
    return call_error(kLibrary, op, 0, "",
                      std::to_string(keys.size()) + " keys in one call to the store at " + address_ +
                          ": a TCPStore server (libuv) accepts up to " + std::to_string(kMaxKeyCount),
                      GPUGUARD_WHERE);
  for (const auto& k : keys) GPUGUARD_TRY(check_sizes(op, k, {}));
  return ok_status();
}

Status TcpStoreClient::check_sizes(const std::string& op, std::string_view key, std::string_view value) const {
  if (kKeyPrefix.size() + key.size() > kMaxKeyBytes)
    return call_error(kLibrary, op, 0, "",
                      "key of " + std::to_string(key.size()) + " bytes for the store at " + address_ +
                          ": a TCPStore server (libuv) accepts keys up to " + std::to_string(kMaxKeyBytes) + " bytes",
                      GPUGUARD_WHERE);
  if (value.size() > kMaxValueBytes)
    return call_error(kLibrary, op, 0, "",
                      "value of " + std::to_string(value.size()) + " bytes for " + escaped_in_quotes(key) +
                          " at the store at " + address_ + ": a TCPStore server (libuv) accepts values up to 8 MiB",
                      GPUGUARD_WHERE);
  return ok_status();
}

Result<bool> TcpStoreClient::poll_until(const std::string& op, short events, const Deadline& deadline) {
  while (true) {
    pollfd p{fd_, events, 0};
    int ready = ::poll(&p, 1, deadline.poll_ms());
    if (ready > 0) return true;
    if (ready == 0) return false;
    if (errno == EINTR) continue;
    int err = errno;
    return fail(call_error(kLibrary, op, err, errno_name(err),
                           "poll on the connection to the store at " + address_ + ": " + std::strerror(err),
                           GPUGUARD_WHERE));
  }
}

Status TcpStoreClient::send_all(const std::string& op, const std::string& bytes, const Deadline& deadline) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    auto ready = poll_until(op, POLLOUT, deadline);
    if (!ready.ok()) return ready.error();
    if (!ready.value())
      return fail(call_error(kLibrary, op, ETIMEDOUT, "ETIMEDOUT",
                             "the store at " + address_ + " took no request bytes for " + ms_text(deadline.length) +
                                 " (the server is stuck or the network is down)",
                             GPUGUARD_WHERE));
    auto n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n < 0) {
      int err = errno;
      return fail(call_error(kLibrary, op, err, errno_name(err),
                             "sending to the store at " + address_ + ": " + std::strerror(err) +
                                 (err == EPIPE || err == ECONNRESET ? " (the server closed the connection)" : ""),
                             GPUGUARD_WHERE));
    }
    done += static_cast<std::size_t>(n);
  }
  return ok_status();
}

Status TcpStoreClient::recv_all(const std::string& op, void* out, std::size_t size, const Deadline& deadline) {
  auto* to = static_cast<char*>(out);
  std::size_t done = 0;
  while (done < size) {
    auto ready = poll_until(op, POLLIN, deadline);
    if (!ready.ok()) return ready.error();
    if (!ready.value())
      return fail(call_error(
          kLibrary, op, ETIMEDOUT, "ETIMEDOUT",
          "no answer from the store at " + address_ + " within " + ms_text(deadline.length) +
              (done ? " (" + std::to_string(done) + " of " + std::to_string(size) + " bytes came)" : std::string()),
          GPUGUARD_WHERE));
    auto n = ::recv(fd_, to + done, size - done, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n < 0) {
      int err = errno;
      return fail(call_error(kLibrary, op, err, errno_name(err),
                             "reading from the store at " + address_ + ": " + std::strerror(err) +
                                 (err == ECONNRESET ? " (the server closed the connection)" : ""),
                             GPUGUARD_WHERE));
    }
    if (n == 0)
      return fail(call_error(kLibrary, op, 0, "",
                             "the store at " + address_ + " closed the connection" +
                                 (done ? " in the middle of an answer (" + std::to_string(done) + " of " +
                                             std::to_string(size) + " bytes came)"
                                       : " instead of answering") +
                                 " (the server is gone, or it refused the request)",
                             GPUGUARD_WHERE));
    done += static_cast<std::size_t>(n);
  }
  return ok_status();
}

Result<std::string> TcpStoreClient::recv_bytes(const std::string& op, const Deadline& deadline) {
  std::uint64_t size = 0;
  GPUGUARD_TRY(recv_all(op, &size, sizeof size, deadline));
  if (size > kMaxAnswerBytes)
    return protocol_error(op,
                          "announced a value of " + std::to_string(size) + " bytes, more than the " +
                              std::to_string(kMaxAnswerBytes >> 20) + " MiB this client accepts",
                          GPUGUARD_WHERE);
  std::string value(static_cast<std::size_t>(size), '\0');
  GPUGUARD_TRY(recv_all(op, value.data(), value.size(), deadline));
  return value;
}

Result<std::uint8_t> TcpStoreClient::recv_byte(const std::string& op, const Deadline& deadline) {
  std::uint8_t b = 0;
  GPUGUARD_TRY(recv_all(op, &b, 1, deadline));
  return b;
}

Result<std::unique_ptr<TcpStoreClient>> TcpStoreClient::connect(std::string host, int port, Duration timeout) {
  const std::string op = "connect";
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  std::string address = bracketed(host) + ":" + std::to_string(port);
  if (host.empty() || port <= 0 || port > 65535)
    return call_error(kLibrary, op, 0, "", "no store at " + address + ": give a host and a port in 1..65535",
                      GPUGUARD_WHERE);
  if (timeout <= Duration::zero())
    return call_error(kLibrary, op, 0, "",
                      "timeout " + ms_text(timeout) + " for the store at " + address + ": give a positive timeout",
                      GPUGUARD_WHERE);
  Deadline deadline(timeout);

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_protocol = IPPROTO_TCP;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) {
    std::string why = rc == EAI_SYSTEM ? std::strerror(errno) : ::gai_strerror(rc);
    return call_error(kLibrary, op, 0, "", "cannot resolve the host of the store at " + address + ": " + why,
                      GPUGUARD_WHERE);
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> addresses(found, &::freeaddrinfo);

  int fd = -1;
  int last_err = 0;
  std::string tried;
  for (addrinfo* ai = found; ai != nullptr && fd < 0; ai = ai->ai_next) {
    char name[NI_MAXHOST] = "?";
    ::getnameinfo(ai->ai_addr, ai->ai_addrlen, name, sizeof name, nullptr, 0, NI_NUMERICHOST);
    int s = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    int err = 0;
    if (s < 0) {
      err = errno;
    } else if (::connect(s, ai->ai_addr, ai->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS || err == EINTR) {
        // Non-blocking connect: wait for it to finish, within what is left of the timeout.
        pollfd p{s, POLLOUT, 0};
        int ready;
        do ready = ::poll(&p, 1, deadline.poll_ms());
        while (ready < 0 && errno == EINTR);
        if (ready < 0) {
          err = errno;
        } else if (ready == 0) {
          err = ETIMEDOUT;
        } else {
          socklen_t len = sizeof err;
          if (::getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        }
      }
    }
    if (err == 0) {
      fd = s;
      break;
    }
    if (s >= 0) ::close(s);
    last_err = err;
    tried += std::string(tried.empty() ? "" : "; ") + name + ": " + std::strerror(err);
    if (deadline.poll_ms() == 0) break;
  }
  if (fd < 0)
    return call_error(kLibrary, op, last_err, last_err ? errno_name(last_err) : "",
                      "cannot connect to the store at " + address + " (" +
                          (tried.empty() ? std::string("no address") : tried) + ")" +
                          (last_err == ECONNREFUSED ? ": no server listens there" : ""),
                      GPUGUARD_WHERE);

  // Requests are small and each is one write: without TCP_NODELAY, Nagle would hold the next one for an ACK.
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);

  std::unique_ptr<TcpStoreClient> client(new TcpStoreClient(fd, address, timeout));
  // The handshake of torch's client: VALIDATE (no answer), then a PING whose nonce comes back.
  static std::atomic<std::uint32_t> counter{0};
  std::uint32_t nonce = static_cast<std::uint32_t>(::getpid()) * 2654435761u + counter.fetch_add(1) + 1;
  Request hello(Query::VALIDATE);
  hello.value(kValidationMagicNumber).then(Request(Query::PING).value(nonce));
  GPUGUARD_TRY(client->send_all(op, hello.data(), deadline));
  std::uint32_t echoed = 0;
  GPUGUARD_TRY(client->recv_all(op, &echoed, sizeof echoed, deadline));
  if (echoed != nonce)
    return client->protocol_error(
        op, "answered the PING with " + std::to_string(echoed) + " instead of " + std::to_string(nonce),
        GPUGUARD_WHERE);
  return client;
}

Status TcpStoreClient::set(std::string_view key, std::string_view value) {
  const std::string op = "set";
  GPUGUARD_TRY(usable(op));
  GPUGUARD_TRY(check_sizes(op, key, value));
  Request r(Query::SET);
  r.key(key).bytes(value);
  return send_all(op, r.data(), Deadline(timeout_));
}

Result<std::string> TcpStoreClient::get(std::string_view key) { return get(key, timeout_); }

Result<std::string> TcpStoreClient::get(std::string_view key, Duration timeout) {
  const std::string op = "get";
  GPUGUARD_TRY(usable(op));
  GPUGUARD_TRY(check_sizes(op, key, {}));
  GPUGUARD_TRY(do_wait(op, {std::string(key)}, timeout));
  Deadline deadline(timeout_);
  Request r(Query::GET);
  r.key(key);
  GPUGUARD_TRY(send_all(op, r.data(), deadline));
  return recv_bytes(op, deadline);
}

Result<std::int64_t> TcpStoreClient::add(std::string_view key, std::int64_t delta) {
  const std::string op = "add";
  GPUGUARD_TRY(usable(op));
  GPUGUARD_TRY(check_sizes(op, key, {}));
  Deadline deadline(timeout_);
  Request r(Query::ADD);
  r.key(key).value<std::int64_t>(delta);
  GPUGUARD_TRY(send_all(op, r.data(), deadline));
  std::int64_t sum = 0;
  GPUGUARD_TRY(recv_all(op, &sum, sizeof sum, deadline));
  return sum;
}

Result<bool> TcpStoreClient::check(const std::vector<std::string>& keys) {
  const std::string op = "check";
  GPUGUARD_TRY(usable(op));
  if (keys.empty()) return true;  // vacuous; and the libuv server would read keys[0] of an empty list
  GPUGUARD_TRY(check_sizes(op, keys));
  Deadline deadline(timeout_);
  Request r(Query::CHECK);
  r.keys(keys);
  GPUGUARD_TRY(send_all(op, r.data(), deadline));
  auto answer = recv_byte(op, deadline);
  if (!answer.ok()) return answer.error();
  if (answer.value() == kCheckReady) return true;
  if (answer.value() == kCheckNotReady) return false;
  return protocol_error(op, "answered CHECK with byte " + std::to_string(answer.value()) + " (READY is 0, NOT_READY 1)",
                        GPUGUARD_WHERE);
}

Result<std::string> TcpStoreClient::compare_set(std::string_view key, std::string_view expected,
                                                std::string_view desired) {
  const std::string op = "compare_set";
  GPUGUARD_TRY(usable(op));
  GPUGUARD_TRY(check_sizes(op, key, expected));
  GPUGUARD_TRY(check_sizes(op, key, desired));
  Deadline deadline(timeout_);
  Request r(Query::COMPARE_SET);
  r.key(key).bytes(expected).bytes(desired);
  GPUGUARD_TRY(send_all(op, r.data(), deadline));
  return recv_bytes(op, deadline);
}

Status TcpStoreClient::wait(const std::vector<std::string>& keys) { return wait(keys, timeout_); }

Status TcpStoreClient::wait(const std::vector<std::string>& keys, Duration timeout) {
  const std::string op = "wait";
  GPUGUARD_TRY(usable(op));
  GPUGUARD_TRY(check_sizes(op, keys));
  return do_wait(op, keys, timeout);
}

Status TcpStoreClient::do_wait(const std::string& op, const std::vector<std::string>& keys, Duration timeout) {
  if (keys.empty()) return ok_status();  // nothing to wait for (and see check())
  Request r(Query::WAIT);
  r.keys(keys);
  GPUGUARD_TRY(send_all(op, r.data(), Deadline(timeout_)));

  // The server answers STOP_WAITING once every key exists; until then, nothing.
  auto ready = poll_until(op, POLLIN, Deadline(std::max(timeout, Duration::zero())));
  if (!ready.ok()) return ready.error();
  if (ready.value()) {
    auto answer = recv_byte(op, Deadline(timeout_));
    if (!answer.ok()) return answer.error();
    if (answer.value() != kStopWaiting)
      return protocol_error(op, "answered WAIT with byte " + std::to_string(answer.value()) + " (STOP_WAITING is 0)",
                            GPUGUARD_WHERE);
    return ok_status();
  }

  // Timed out: cancel the wait on the server, as torch's client does, so that no STOP_WAITING comes later, in
  // answer to nothing. The server may have sent STOP_WAITING just before it read the cancel: then the keys are
  // there after all, and WAIT_CANCELED follows it.
  Deadline cancelling(std::min(timeout_, kCancelGrace));
  GPUGUARD_TRY(send_all(op, Request(Query::CANCEL_WAIT).data(), cancelling));
  auto answer = recv_byte(op, cancelling);
  if (!answer.ok()) return answer.error();
  bool arrived = false;
  if (answer.value() == kStopWaiting) {
    arrived = true;
    answer = recv_byte(op, cancelling);
    if (!answer.ok()) return answer.error();
  }
  if (answer.value() != kWaitCanceled)
    return protocol_error(op,
                          "answered CANCEL_WAIT with byte " + std::to_string(answer.value()) + " (WAIT_CANCELED is 1)",
                          GPUGUARD_WHERE);
  if (arrived) return ok_status();
  return call_error(kLibrary, op, ETIMEDOUT, "ETIMEDOUT",
                    quoted_keys(keys) + " not set at the store at " + address_ + " within " + ms_text(timeout) +
                        " (the wait is cancelled on the server; the connection stays usable)",
                    GPUGUARD_WHERE);
}

Result<std::vector<std::string>> TcpStoreClient::multi_get(const std::vector<std::string>& keys) {
  const std::string op = "multi_get";
  GPUGUARD_TRY(usable(op));
  if (keys.empty()) return std::vector<std::string>{};
  GPUGUARD_TRY(check_sizes(op, keys));
  // The legacy server drops the connection for a missing key: wait for all first, as torch's client does.
  GPUGUARD_TRY(do_wait(op, keys, timeout_));
  Deadline deadline(timeout_);
  Request r(Query::MULTI_GET);
  r.keys(keys);
  GPUGUARD_TRY(send_all(op, r.data(), deadline));
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto v = recv_bytes(op, deadline);
    if (!v.ok()) return v.error();
    values.push_back(std::move(v).value());
  }
  return values;
}

}  // namespace gpuguard
