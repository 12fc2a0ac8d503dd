// The watchdog's per-node tier: the shared page its node leader writes and the other ranks of the node read.
#include "gpuguard/node_relay.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>

namespace gpuguard {

namespace {

constexpr std::uint64_t kMagic = 0x67707567'72656c31ull;  // "gpugrel1": the layout below, version 1
constexpr std::size_t kPageBytes = 4096;

std::uint64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);  // one clock for every process of the host
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

Error system_error(const std::string& call, const std::string& path) {
  return gpuguard_error(call, path + ": " + std::strerror(errno));
}

}  // namespace

struct NodeRelay::Page {
  std::atomic<std::uint64_t> magic;
  std::atomic<std::uint64_t> sequence;  // odd while the leader writes
  std::atomic<std::uint64_t> answer;    // epoch << 1 | alarm
  std::atomic<std::uint64_t> asked_ns;  // CLOCK_MONOTONIC when the leader asked the store
  std::atomic<std::uint64_t> created_ns;  // CLOCK_MONOTONIC when the leader created the page
  std::atomic<std::uint64_t> tick_ns;     // how often the leader answers
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "the page is shared by processes: no locks inside");
static_assert(sizeof(std::atomic<std::uint64_t>) == 8, "the page's layout is fixed");

Result<NodeRelay> NodeRelay::create(const std::string& path, double tick_s) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return system_error("open", path);
  if (::ftruncate(fd, kPageBytes) != 0) {
    auto error = system_error("ftruncate", path);
    ::close(fd);
    return error;
  }
  void* memory = ::mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  auto mapped_error = memory == MAP_FAILED ? std::optional<Error>(system_error("mmap", path)) : std::nullopt;
  ::close(fd);
  if (mapped_error) return *mapped_error;
  auto* page = static_cast<Page*>(memory);
  // A page a crashed run left is taken over: marked as being written until the first answer.
  page->sequence.store(1, std::memory_order_relaxed);
  page->answer.store(0, std::memory_order_relaxed);
  page->asked_ns.store(0, std::memory_order_relaxed);
  page->created_ns.store(monotonic_ns(), std::memory_order_relaxed);
  page->tick_ns.store(static_cast<std::uint64_t>(tick_s * 1e9), std::memory_order_relaxed);
  page->magic.store(kMagic, std::memory_order_release);
  return NodeRelay(path, page, true);
}

int NodeRelay::remove_abandoned(const std::string& directory, const std::string& name_prefix, double idle_s) {
  DIR* dir = ::opendir(directory.c_str());
  if (dir == nullptr) return 0;
  int removed = 0;
  auto now = monotonic_ns();
  while (dirent* entry = ::readdir(dir)) {
    std::string name = entry->d_name;
    if (name.compare(0, name_prefix.size(), name_prefix) != 0) continue;
    std::string path = directory + "/" + name;
    auto page = open(path);
    if (!page.ok() || page.value().page_->magic.load(std::memory_order_acquire) != kMagic) continue;
    const Page& p = *page.value().page_;
    auto last = std::max(p.asked_ns.load(std::memory_order_relaxed), p.created_ns.load(std::memory_order_relaxed));
    auto idle = std::max(idle_s, 10 * static_cast<double>(p.tick_ns.load(std::memory_order_relaxed)) / 1e9);
    if (last < now && static_cast<double>(now - last) / 1e9 > idle && ::unlink(path.c_str()) == 0) ++removed;
  }
  ::closedir(dir);
  return removed;
}

Result<NodeRelay> NodeRelay::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return system_error("open", path);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(kPageBytes)) {
    ::close(fd);
    return gpuguard_error("open", path + ": not a gpuguard relay page (" + std::to_string(st.st_size) + " bytes)");
  }
  void* memory = ::mmap(nullptr, kPageBytes, PROT_READ, MAP_SHARED, fd, 0);
  auto mapped_error = memory == MAP_FAILED ? std::optional<Error>(system_error("mmap", path)) : std::nullopt;
  ::close(fd);
  if (mapped_error) return *mapped_error;
  return NodeRelay(path, static_cast<Page*>(memory), false);
}

NodeRelay::NodeRelay(NodeRelay&& other) noexcept
    : path_(std::move(other.path_)), page_(other.page_), owner_(other.owner_) {
  other.page_ = nullptr;
  other.owner_ = false;
}

NodeRelay& NodeRelay::operator=(NodeRelay&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    page_ = other.page_;
    owner_ = other.owner_;
    other.page_ = nullptr;
    other.owner_ = false;
  }
  return *this;
}

NodeRelay::~NodeRelay() { release(); }

void NodeRelay::release() {
  if (page_ == nullptr) return;
  if (owner_) {
    page_->sequence.store(1, std::memory_order_release);  // readers that keep the mapping see no answer
    ::unlink(path_.c_str());
  }
  ::munmap(page_, kPageBytes);
  page_ = nullptr;
}

void NodeRelay::publish(std::uint64_t epoch, bool alarm) {
  auto sequence = page_->sequence.load(std::memory_order_relaxed);
  auto writing = sequence | 1;  // odd: being written (the page starts odd until the first answer)
  page_->sequence.store(writing, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  page_->answer.store(epoch << 1 | (alarm ? 1 : 0), std::memory_order_relaxed);
  page_->asked_ns.store(monotonic_ns(), std::memory_order_relaxed);
  page_->sequence.store(writing + 1, std::memory_order_release);
}

std::optional<RelayReading> NodeRelay::read() const {
  if (page_ == nullptr || page_->magic.load(std::memory_order_acquire) != kMagic) return std::nullopt;
  auto before = page_->sequence.load(std::memory_order_acquire);
  if (before & 1) return std::nullopt;
  auto answer = page_->answer.load(std::memory_order_relaxed);
  auto asked = page_->asked_ns.load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (page_->sequence.load(std::memory_order_relaxed) != before || asked == 0) return std::nullopt;
  auto now = monotonic_ns();
  RelayReading reading;
  reading.epoch = answer >> 1;
  reading.alarm = (answer & 1) != 0;
  reading.age_s = now > asked ? static_cast<double>(now - asked) / 1e9 : 0.0;
  return reading;
}

}  // namespace gpuguard
