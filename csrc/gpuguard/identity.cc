// Identity records: host fingerprint as NCCL computes it, the versioned binary encoding, the strict decoder.
#include "gpuguard/identity.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>

namespace gpuguard {

namespace {

constexpr char kMagic[4] = {'G', 'G', 'I', 'D'};

enum Flags : std::uint16_t {
  kFlagVisibleDevicesSet = 1u << 0,
  kFlagMultiRankGpu = 1u << 1,
  kFlagFailure = 1u << 2,
  kFlagGpuFraction = 1u << 3,
};
constexpr std::uint16_t kKnownFlags = kFlagVisibleDevicesSet | kFlagMultiRankGpu | kFlagFailure | kFlagGpuFraction;

Error record_error(const std::string& detail) { return gpuguard_error("identity record", detail); }

// Well-formed UTF-8 (no overlong forms, no surrogates, nothing above U+10FFFF). Peers' text ends up in
// exception messages and logs, so it must be valid text.
bool valid_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t n = 0;
    std::uint32_t cp = 0;
    if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;  // the sequence runs past the end
    for (std::size_t k = 1; k <= n; ++k) {
      auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000)) return false;
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

// Text fields: bounded, valid UTF-8, no control characters (multi-line only where allowed).
std::string check_text(const char* field, std::string_view s, std::size_t max, bool multiline = false) {
  if (s.size() > max) {
    return std::string(field) + " is " + std::to_string(s.size()) + " bytes; at most " + std::to_string(max) +
           " are allowed";
  }
  if (!valid_utf8(s)) return std::string(field) + " is not valid UTF-8";
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    bool allowed_ws = multiline && (c == '\n' || c == '\t');
    if ((c < 0x20 && !allowed_ws) || c == 0x7F) {
      return std::string(field) + " contains control character 0x" + "0123456789abcdef"[c >> 4] +
             "0123456789abcdef"[c & 15];
    }
  }
  return {};
}

bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

std::string check_uuid(std::string_view u) {
  if (u.empty()) return {};
  if (u.size() > IdentityLimits::kMaxUuid) return "gpu_uuid is longer than " + std::to_string(IdentityLimits::kMaxUuid) + " bytes";
  if (u.substr(0, 4) != "GPU-" && u.substr(0, 4) != "MIG-") return "gpu_uuid must start with GPU- or MIG-";
  std::size_t hex = 0;
  for (char c : u.substr(4)) {
    if (is_hex(c)) {
      ++hex;
    } else if (c != '-' && c != '/' && !(c >= 'A' && c <= 'Z') && !(c >= 'a' && c <= 'z')) {
      return "gpu_uuid contains a character other than hex digits, letters, '-' and '/'";
    }
  }
  if (hex < 8) return "gpu_uuid has too few hex digits";
  return {};
}

// Normalised form only ("0000:18:00.0", 4 to 8 hex digits of domain), as normalize_pci_bus_id() writes it.
std::string check_pci(std::string_view p) {
  if (p.empty()) return {};
  const std::string bad = "pci_bus_id '" + std::string(p.substr(0, 32)) + "' is not of the form 0000:18:00.0";
  std::size_t colon = p.find(':');
  if (colon == std::string_view::npos || colon < 4 || colon > 8 || p.size() != colon + 8) return bad;
  for (std::size_t i = 0; i < colon; ++i) if (!is_hex(p[i])) return bad;
  if (!is_hex(p[colon + 1]) || !is_hex(p[colon + 2]) || p[colon + 3] != ':' || !is_hex(p[colon + 4]) ||
      !is_hex(p[colon + 5]) || p[colon + 6] != '.' || p[colon + 7] < '0' || p[colon + 7] > '7') {
    return bad;
  }
  return {};
}

std::string check_failure_kind(std::string_view k) {
  if (k.empty() || k.size() > IdentityLimits::kMaxFailureKind) {
    return "failure_kind must be 1 to " + std::to_string(IdentityLimits::kMaxFailureKind) + " characters";
  }
  for (char c : k) {
    if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.')) {
      return "failure_kind must be an identifier (letters, digits, '_', '.')";
    }
  }
  return {};
}

std::string first_problem(const IdentityRecord& r) {
  using L = IdentityLimits;
  std::string p;
  if (r.group.empty()) return "group is empty";
  if (!(p = check_text("group", r.group, L::kMaxGroup)).empty()) return p;
  if (r.world_size < 1 || r.world_size > L::kMaxWorldSize) {
    return "world_size " + std::to_string(r.world_size) + " is outside 1.." + std::to_string(L::kMaxWorldSize);
  }
  if (r.rank < 0 || r.rank >= r.world_size) {
    return "rank " + std::to_string(r.rank) + " is outside 0.." + std::to_string(r.world_size - 1) +
           " (world_size " + std::to_string(r.world_size) + ")";
  }
  if (r.local_world_size < -1 || r.local_world_size == 0 || r.local_world_size > r.world_size) {
    return "local_world_size " + std::to_string(r.local_world_size) + " must be -1 (unknown) or 1..world_size";
  }
  if (r.local_rank < -1 || r.local_rank >= r.world_size ||
      (r.local_world_size > 0 && r.local_rank >= r.local_world_size)) {
    return "local_rank " + std::to_string(r.local_rank) + " must be -1 (unknown) or below local_world_size " +
           std::to_string(r.local_world_size) + " and world_size " + std::to_string(r.world_size);
  }
  if (!(p = check_text("hostname", r.hostname, L::kMaxHostname)).empty()) return p;
  if (!(p = check_uuid(r.gpu_uuid)).empty()) return p;
  if (!(p = check_pci(r.pci_bus_id)).empty()) return p;
  if (r.gpu_uuid.empty() != (r.gpu_index == -1)) {
    return "gpu_index " + std::to_string(r.gpu_index) + " and gpu_uuid '" + r.gpu_uuid +
           "' disagree: a rank has both (bound to a GPU) or neither";
  }
  if (r.gpu_index < -1 || r.gpu_index >= L::kMaxDeviceCount) return "gpu_index " + std::to_string(r.gpu_index) + " is out of range";
  if (r.visible_device_count < -1 || r.visible_device_count > L::kMaxDeviceCount) {
    return "visible_device_count " + std::to_string(r.visible_device_count) + " is out of range";
  }
  if (r.cuda_visible_devices &&
      !(p = check_text("cuda_visible_devices", *r.cuda_visible_devices, L::kMaxVisibleDevices)).empty()) {
    return p;
  }
  if (!(p = check_text("launcher", r.launcher, L::kMaxLauncher)).empty()) return p;
  if (r.failure_kind) {
    if (!(p = check_failure_kind(*r.failure_kind)).empty()) return p;
    if (!(p = check_text("failure_text", r.failure_text, L::kMaxFailureText, true)).empty()) return p;
  } else if (!r.failure_text.empty()) {
    return "failure_text is set without failure_kind";
  }
  if (r.gpu_fraction && !(std::isfinite(*r.gpu_fraction) && *r.gpu_fraction > 0 &&
                          *r.gpu_fraction <= L::kMaxGpuFraction)) {
    return "gpu_fraction must be a finite number in (0, " + std::to_string(static_cast<int>(L::kMaxGpuFraction)) + "]";
  }
  if (!(p = check_text("ray_gpu_ids", r.ray_gpu_ids, L::kMaxRayGpuIds)).empty()) return p;
  return {};
}

class Writer {
 public:
  void bytes(const void* p, std::size_t n) { out_.append(static_cast<const char*>(p), n); }
  template <typename T>
  void little(T v) {
    unsigned char buf[sizeof(T)];
    auto u = static_cast<std::uint64_t>(v);
    for (std::size_t i = 0; i < sizeof(T); ++i) buf[i] = static_cast<unsigned char>(u >> (8 * i));
    bytes(buf, sizeof(T));
  }
  void str(const std::string& s) {
    little<std::uint16_t>(static_cast<std::uint16_t>(s.size()));
    out_ += s;
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  bool failed() const { return !problem_.empty(); }
  const std::string& problem() const { return problem_; }

  template <typename T>
  T little(const char* field) {
    if (failed()) return T{};
    if (in_.size() - pos_ < sizeof(T)) {
      fail(std::string("truncated in ") + field);
      return T{};
    }
    std::uint64_t u = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) u |= std::uint64_t{static_cast<unsigned char>(in_[pos_ + i])} << (8 * i);
    pos_ += sizeof(T);
    return static_cast<T>(u);
  }
  std::string str(const char* field, std::size_t max) {
    auto n = little<std::uint16_t>(field);
    if (failed()) return {};
    if (n > max) {
      fail(std::string(field) + " claims " + std::to_string(n) + " bytes; at most " + std::to_string(max) + " are allowed");
      return {};
    }
    if (in_.size() - pos_ < n) {
      fail(std::string("truncated in ") + field + " (claims " + std::to_string(n) + " bytes, " +
           std::to_string(in_.size() - pos_) + " left)");
      return {};
    }
    std::string s(in_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  std::size_t remaining() const { return in_.size() - pos_; }
  std::size_t offset() const { return pos_; }
  void fail(const std::string& what) {
    if (problem_.empty()) problem_ = what + " at byte " + std::to_string(pos_);
  }

 private:
  std::string_view in_;
  std::size_t pos_ = 0;
  std::string problem_;
};

std::uint64_t double_bits(double d) {
  std::uint64_t u = 0;
  std::memcpy(&u, &d, sizeof(u));
  return u;
}
double bits_double(std::uint64_t u) {
  double d = 0;
  std::memcpy(&d, &u, sizeof(d));
  return d;
}

}  // namespace

std::uint64_t nccl_string_hash(std::string_view text) {
  std::uint64_t result = 5381;
  for (char c : text) result = ((result << 5) + result) ^ static_cast<std::uint64_t>(static_cast<std::int64_t>(c));
  return result;
}

HostFingerprint host_fingerprint_from(const std::string& hostname, const char* nccl_hostid, const std::string& boot_id) {
  HostFingerprint fp;
  fp.hostname = hostname;
  // NCCL copies into a 1024-byte buffer; the hashed string is therefore at most 1023 bytes.
  if (nccl_hostid != nullptr) {
    fp.hashed = std::string(nccl_hostid).substr(0, 1023);
    fp.from_nccl_hostid = true;
  } else {
    fp.hashed = (hostname + boot_id).substr(0, 1023);
  }
  fp.hash = nccl_string_hash(fp.hashed);
  return fp;
}

HostFingerprint host_fingerprint() {
  char name[1024] = {0};
  if (gethostname(name, sizeof(name) - 1) != 0) std::strcpy(name, "unknown");
  std::string boot_id;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  in >> boot_id;  // NCCL reads one whitespace-delimited token (fscanf "%ms")
  return host_fingerprint_from(name, std::getenv("NCCL_HOSTID"), boot_id);
}

Status validate_identity(const IdentityRecord& record) {
  std::string problem = first_problem(record);
  if (!problem.empty()) return record_error(problem);
  return ok_status();
}

Result<std::string> encode_identity(const IdentityRecord& input) {
  IdentityRecord r = input;
  if (r.failure_text.size() > IdentityLimits::kMaxFailureText) {
    // Cut on a UTF-8 boundary so the shortened text still validates.
    std::size_t cut = IdentityLimits::kMaxFailureText - 3;
    while (cut > 0 && (static_cast<unsigned char>(r.failure_text[cut]) & 0xC0) == 0x80) --cut;
    r.failure_text = r.failure_text.substr(0, cut) + "...";
  }
  Status valid = validate_identity(r);
  if (!valid) return gpuguard_error("encode identity record", valid.error().detail);
  std::uint16_t flags = 0;
  if (r.cuda_visible_devices) flags |= kFlagVisibleDevicesSet;
  if (r.multi_rank_gpu_enabled) flags |= kFlagMultiRankGpu;
  if (r.failure_kind) flags |= kFlagFailure;
  if (r.gpu_fraction) flags |= kFlagGpuFraction;
  Writer w;
  w.bytes(kMagic, sizeof(kMagic));
  w.little<std::uint8_t>(kIdentityFormatVersion);
  w.little<std::uint16_t>(flags);
  w.str(r.group);
  w.little<std::int32_t>(r.rank);
  w.little<std::int32_t>(r.local_rank);
  w.little<std::int32_t>(r.world_size);
  w.little<std::int32_t>(r.local_world_size);
  w.little<std::uint64_t>(r.host_hash);
  w.str(r.hostname);
  w.str(r.gpu_uuid);
  w.str(r.pci_bus_id);
  w.little<std::int32_t>(r.gpu_index);
  w.little<std::uint32_t>(r.pid);
  if (r.cuda_visible_devices) w.str(*r.cuda_visible_devices);
  w.little<std::int32_t>(r.visible_device_count);
  w.str(r.launcher);
  if (r.failure_kind) {
    w.str(*r.failure_kind);
    w.str(r.failure_text);
  }
  if (r.gpu_fraction) w.little<std::uint64_t>(double_bits(*r.gpu_fraction));
  w.str(r.ray_gpu_ids);
  std::string out = w.take();
  if (out.size() > IdentityLimits::kMaxRecordBytes) {
    return record_error("encoded record is " + std::to_string(out.size()) + " bytes; at most " +
                        std::to_string(IdentityLimits::kMaxRecordBytes) + " are allowed");
  }
  return out;
}

Result<IdentityRecord> decode_identity(std::string_view bytes) {
  using L = IdentityLimits;
  auto fail = [](const std::string& what) { return gpuguard_error("decode identity record", what); };
  if (bytes.size() > L::kMaxRecordBytes) {
    return fail("record is " + std::to_string(bytes.size()) + " bytes; at most " + std::to_string(L::kMaxRecordBytes) +
                " are allowed");
  }
  if (bytes.size() < sizeof(kMagic) + 1 || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return fail("not a gpuguard identity record (bad magic): another program, or a different gpuguard key layout, "
                "wrote this store key");
  }
  auto version = static_cast<std::uint8_t>(bytes[sizeof(kMagic)]);
  if (version != kIdentityFormatVersion) {
    return fail("record format version " + std::to_string(version) + " is not the version " +
                std::to_string(kIdentityFormatVersion) + " this gpuguard reads: run the same gpuguard version on every rank");
  }
  Reader in(bytes.substr(sizeof(kMagic) + 1));
  IdentityRecord r;
  auto flags = in.little<std::uint16_t>("flags");
  if (!in.failed() && (flags & ~kKnownFlags) != 0) in.fail("unknown flag bits 0x" + std::to_string(flags & ~kKnownFlags));
  r.group = in.str("group", L::kMaxGroup);
  r.rank = in.little<std::int32_t>("rank");
  r.local_rank = in.little<std::int32_t>("local_rank");
  r.world_size = in.little<std::int32_t>("world_size");
  r.local_world_size = in.little<std::int32_t>("local_world_size");
  r.host_hash = in.little<std::uint64_t>("host_hash");
  r.hostname = in.str("hostname", L::kMaxHostname);
  r.gpu_uuid = in.str("gpu_uuid", L::kMaxUuid);
  r.pci_bus_id = in.str("pci_bus_id", L::kMaxPciBusId);
  r.gpu_index = in.little<std::int32_t>("gpu_index");
  r.pid = in.little<std::uint32_t>("pid");
  if (flags & kFlagVisibleDevicesSet) r.cuda_visible_devices = in.str("cuda_visible_devices", L::kMaxVisibleDevices);
  r.visible_device_count = in.little<std::int32_t>("visible_device_count");
  r.launcher = in.str("launcher", L::kMaxLauncher);
  r.multi_rank_gpu_enabled = (flags & kFlagMultiRankGpu) != 0;
  if (flags & kFlagFailure) {
    r.failure_kind = in.str("failure_kind", L::kMaxFailureKind);
    r.failure_text = in.str("failure_text", L::kMaxFailureText);
  }
  if (flags & kFlagGpuFraction) r.gpu_fraction = bits_double(in.little<std::uint64_t>("gpu_fraction"));
  r.ray_gpu_ids = in.str("ray_gpu_ids", L::kMaxRayGpuIds);
  if (!in.failed() && in.remaining() != 0) in.fail(std::to_string(in.remaining()) + " trailing bytes after the record");
  if (in.failed()) return fail(in.problem());
  std::string problem = first_problem(r);
  if (!problem.empty()) return fail(problem);
  return r;
}

}  // namespace gpuguard
