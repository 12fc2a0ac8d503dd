// Parses CUDA_VISIBLE_DEVICES by the driver's rules and names the first entry the driver would stop at.
#include "gpuguard/visible_devices.h"

#include <cctype>

namespace gpuguard {

namespace {

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t");
  size_t b = s.find_last_not_of(" \t");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// A GPU UUID body is 8-4-4-4-12 hex digits; a prefix is any leading part of that shape.
bool uuid_shaped_prefix(const std::string& body) {
  if (body.empty() || body.size() > 36) return false;
  for (size_t i = 0; i < body.size(); ++i) {
    bool dash_here = i == 8 || i == 13 || i == 18 || i == 23;
    char c = body[i];
    if (dash_here ? c != '-' : !std::isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

bool mig_shaped(const std::string& body) {
  if (body.empty()) return false;
  for (char c : body) {
    if (!std::isxdigit(static_cast<unsigned char>(c)) && c != '-' && c != '/' && c != 'g' && c != 'p' &&
        c != 'u') {
      return false;
    }
  }
  return true;
}

// Not `quoted`: std::quoted would compete for a std::string argument through argument-dependent lookup.
std::string in_single_quotes(const std::string& s) { return "'" + s + "'"; }

std::string entry_label(int position, const std::string& text) {
  return "entry " + std::to_string(position + 1) + " (" + in_single_quotes(text) + ")";
}

// Whether two UUID entries would resolve to the same GPU: one is a prefix of the other.
bool same_uuid(const std::string& a, const std::string& b) {
  return a.compare(0, b.size(), b) == 0 || b.compare(0, a.size(), a) == 0;
}

VisibleDevicesProblem problem(VisibleDevicesProblem::Kind kind, int position, const std::string& entry,
                              std::string reason, int same_as = -1) {
  VisibleDevicesProblem p;
  p.kind = kind;
  p.position = position;
  p.entry = entry;
  p.same_as = same_as;
  p.reason = std::move(reason);
  return p;
}

// Reads one entry; returns the problem that makes the driver stop here, if any.
std::optional<VisibleDevicesProblem> read_entry(const std::string& text, int position,
                                                const std::vector<VisibleEntry>& earlier, VisibleEntry* out) {
  using P = VisibleDevicesProblem;
  const std::string label = entry_label(position, text);
  if (text.empty()) {
    return problem(P::Kind::kEmpty, position, text,
                   "entry " + std::to_string(position + 1) +
                       " is empty (two commas in a row, or a comma at the end)");
  }
  out->text = text;
  const std::string low = lower(text);
  if (all_digits(text)) {
    if (text.size() > 9) return problem(P::Kind::kMalformed, position, text, label + " is too large to be a device index");
    out->kind = VisibleEntry::Kind::kIndex;
    out->index = std::stoi(text);
  } else if (low.rfind("mig-", 0) == 0) {
    out->kind = VisibleEntry::Kind::kMig;
    out->uuid = low.substr(4);
    if (!mig_shaped(out->uuid)) {
      return problem(P::Kind::kMalformed, position, text, label + " is not a MIG device name (MIG-<uuid>)");
    }
  } else {
    bool prefixed = low.rfind("gpu-", 0) == 0;
    out->uuid = prefixed ? low.substr(4) : low;
    if (!uuid_shaped_prefix(out->uuid)) {
      std::string why = text[0] == '-'
                            ? " is not a device index: a negative number hides every GPU from here on"
                            : " is neither a device index, a GPU UUID or UUID prefix (GPU-xxxxxxxx-...), nor a "
                              "MIG device (MIG-...)";
      return problem(P::Kind::kMalformed, position, text, label + why);
    }
    out->kind = out->uuid.size() == 36 ? VisibleEntry::Kind::kUuid : VisibleEntry::Kind::kUuidPrefix;
  }
  for (size_t j = 0; j < earlier.size(); ++j) {
    const VisibleEntry& e = earlier[j];
    bool dup = false;
    if (e.kind == VisibleEntry::Kind::kIndex && out->kind == VisibleEntry::Kind::kIndex) {
      dup = e.index == out->index;
    } else if (e.kind == VisibleEntry::Kind::kMig || out->kind == VisibleEntry::Kind::kMig) {
      dup = e.kind == out->kind && e.uuid == out->uuid;
    } else if (e.kind != VisibleEntry::Kind::kIndex && out->kind != VisibleEntry::Kind::kIndex) {
      dup = same_uuid(e.uuid, out->uuid);
    }
    if (dup) {
      return problem(P::Kind::kDuplicate, position, text,
                     label + " names the same GPU as " + entry_label(static_cast<int>(j), e.text),
                     static_cast<int>(j));
    }
  }
  return std::nullopt;
}

}  // namespace

const char* VisibleDevices::kind_name(VisibleEntry::Kind kind) {
  switch (kind) {
    case VisibleEntry::Kind::kIndex: return "index";
    case VisibleEntry::Kind::kUuid: return "uuid";
    case VisibleEntry::Kind::kUuidPrefix: return "uuid_prefix";
    case VisibleEntry::Kind::kMig: return "mig";
  }
  return "unknown";
}

const char* VisibleDevices::kind_name(VisibleDevicesProblem::Kind kind) {
  switch (kind) {
    case VisibleDevicesProblem::Kind::kEmpty: return "empty";
    case VisibleDevicesProblem::Kind::kMalformed: return "malformed";
    case VisibleDevicesProblem::Kind::kDuplicate: return "duplicate";
    case VisibleDevicesProblem::Kind::kRejected: return "rejected";
  }
  return "unknown";
}

VisibleDevices parse_visible_devices(const char* raw) {
  VisibleDevices spec;
  if (raw == nullptr) return spec;
  spec.set = true;
  spec.raw = raw;
  const std::string whole = trim(spec.raw);
  if (whole.empty() || whole == "-1" || whole == "NoDevFiles") {
    spec.hides_all_on_purpose = true;
    return spec;
  }
  size_t start = 0;
  int position = 0;
  while (true) {
    size_t comma = spec.raw.find(',', start);
    std::string text = trim(spec.raw.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    VisibleEntry entry;
    auto bad = read_entry(text, position, spec.entries, &entry);
    if (bad) {
      spec.problem = std::move(bad);
      break;
    }
    spec.entries.push_back(std::move(entry));
    if (comma == std::string::npos) break;
    start = comma + 1;
    ++position;
  }
  return spec;
}

std::optional<VisibleDevicesProblem> find_rejected_entry(const VisibleDevices& spec,
                                                         const std::vector<std::string>& visible_uuids) {
  if (!spec.set || spec.problem || visible_uuids.size() >= spec.entries.size()) return std::nullopt;
  const int position = static_cast<int>(visible_uuids.size());
  const VisibleEntry& e = spec.entries[static_cast<size_t>(position)];
  const std::string label = entry_label(position, e.text);
  const std::string shown = "the driver shows " + std::to_string(position) + " device" + (position == 1 ? "" : "s") +
                            " and ignores everything from it on";
  using P = VisibleDevicesProblem;
  for (const auto& uuid : visible_uuids) {
    if (lower(uuid).rfind("mig-", 0) != 0) continue;
    // MIG user guide, "CUDA Device Enumeration": a CUDA process enumerates a single MIG device (the first one
    // available), and no non-MIG GPU once a MIG device is enumerated; the rest of the list is not an error
    // of the driver's but is never shown.
    return problem(P::Kind::kRejected, position, e.text,
                   label + " is not shown: CUDA enumerates a single MIG device per process (here " + uuid +
                       ") and no other GPU beside it, whatever CUDA_VISIBLE_DEVICES lists; " + shown);
  }
  switch (e.kind) {
    case VisibleEntry::Kind::kIndex:
      return problem(P::Kind::kRejected, position, e.text,
                     label + " was rejected by the driver: this host has no GPU " + std::to_string(e.index) +
                         ", or it is a GPU already listed under its UUID; " + shown);
    case VisibleEntry::Kind::kUuid:
    case VisibleEntry::Kind::kUuidPrefix:
      for (size_t j = 0; j < visible_uuids.size(); ++j) {
        std::string body = lower(visible_uuids[j]);
        if (body.rfind("gpu-", 0) == 0) body = body.substr(4);
        if (body.compare(0, e.uuid.size(), e.uuid) == 0) {
          return problem(P::Kind::kDuplicate, position, e.text,
                         label + " names the same GPU as " + entry_label(static_cast<int>(j), spec.entries[j].text) +
                             "; " + shown,
                         static_cast<int>(j));
        }
      }
      return problem(P::Kind::kRejected, position, e.text,
                     label + " was rejected by the driver: no GPU of this host has that UUID" +
                         std::string(e.kind == VisibleEntry::Kind::kUuidPrefix ? ", or the prefix matches several" : "") +
                         "; " + shown);
    case VisibleEntry::Kind::kMig:
      return problem(P::Kind::kRejected, position, e.text,
                     label + " was rejected by the driver: no such MIG device on this host; " + shown);
  }
  return std::nullopt;
}

}  // namespace gpuguard
