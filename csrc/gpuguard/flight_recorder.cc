// Reading torch's flight recorder dump (JSON) into the progress the watchdog decides stalls by.
#include "gpuguard/flight_recorder.h"

#include <algorithm>
#include <cctype>

#include "gpuguard/json_value.h"

namespace gpuguard {
namespace {

std::string dtype_name(std::string_view torch_name) {
  static const std::map<std::string_view, std::string_view> names = {
      {"Float", "float32"}, {"Double", "float64"}, {"Half", "float16"}, {"BFloat16", "bfloat16"},
      {"Long", "int64"},    {"Int", "int32"},      {"Short", "int16"},  {"Char", "int8"},
      {"Byte", "uint8"},    {"Bool", "bool"},      {"ComplexFloat", "complex64"},
      {"ComplexDouble", "complex128"}, {"Float8_e4m3fn", "float8_e4m3fn"}, {"Float8_e5m2", "float8_e5m2"}};
  auto it = names.find(torch_name);
  return std::string(it == names.end() ? torch_name : it->second);
}

std::string operation(std::string_view profiling_name) {
  auto colon = profiling_name.find(':');
  std::string op(colon == std::string_view::npos ? profiling_name : profiling_name.substr(colon + 1));
  for (char& c : op) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return op;
}

std::string text_of(const JsonValue* v) {
  if (v == nullptr) return {};
  if (auto s = v->as_string()) return std::string(*s);
  if (v->kind == JsonValue::Kind::Number) return v->text;
  return {};
}

Error malformed(const std::string& what) {
  return gpuguard_error("flight recorder dump", "not a dump torch writes: " + what);
}

}  // namespace

std::string describe_recorded_sizes(const std::vector<std::vector<std::int64_t>>& sizes,
                                    const std::vector<std::string>& dtypes) {
  if (sizes.empty()) return {};
  auto one = [&](std::size_t i) -> std::string {
    std::int64_t numel = 1;
    for (auto d : sizes[i])
      if (__builtin_mul_overflow(numel, d, &numel)) return std::string("?[too large]");
    std::string dtype = i < dtypes.size() ? dtype_name(dtypes[i]) : std::string("?");
    return dtype + "[" + std::to_string(numel) + "]";
  };
  if (sizes.size() == 1) return one(0);
  return "list[" + std::to_string(sizes.size()) + "] of " + one(0);
}

Result<FlightRecorderDump> parse_flight_recorder_dump(std::string_view json) {
  auto parsed = parse_json(json);
  if (!parsed) return parsed.error();
  const JsonValue& root = parsed.value();
  if (root.kind != JsonValue::Kind::Object) return malformed("the top level is not an object");
  FlightRecorderDump dump;
  dump.version = text_of(root.find("version"));
  const JsonValue* status = root.find("pg_status");
  if (status == nullptr || status->kind != JsonValue::Kind::Object)
    return malformed("it has no pg_status (torch before the flight recorder kept each group's status)");
  for (const auto& [name, fields] : status->members) {
    RecordedGroupStatus g;
    g.name = name;
    auto enqueued = fields.find("last_enqueued_collective");
    auto completed = fields.find("last_completed_collective");
    if (enqueued == nullptr || completed == nullptr || !enqueued->as_int() || !completed->as_int())
      return malformed("pg_status of group '" + name + "' lacks last_enqueued_collective/last_completed_collective");
    g.enqueued = *enqueued->as_int();
    g.completed = *completed->as_int();
    if (auto started = fields.find("last_started_collective"); started && started->as_int())
      g.started = *started->as_int();
    dump.groups.push_back(std::move(g));
  }
  const JsonValue* entries = root.find("entries");
  if (entries == nullptr) return dump;
  if (entries->kind != JsonValue::Kind::Array) return malformed("entries is not a list");
  for (const auto& e : entries->items) {
    RecordedCollective c;
    const JsonValue* pg = e.find("process_group");
    if (pg == nullptr || pg->kind != JsonValue::Kind::Array || pg->items.size() != 2)
      return malformed("an entry without process_group [name, description]");
    c.group = text_of(&pg->items[0]);
    c.desc = text_of(&pg->items[1]);
    auto seq = e.find("collective_seq_id");
    if (seq == nullptr || !seq->as_int()) return malformed("an entry without collective_seq_id");
    c.seq = *seq->as_int();
    c.op = operation(text_of(e.find("profiling_name")));
    c.state = text_of(e.find("state"));
    if (auto r = e.find("retired"); r && r->kind == JsonValue::Kind::Bool) c.retired = r->boolean;
    if (auto p = e.find("is_p2p"); p && p->kind == JsonValue::Kind::Bool) c.p2p = p->boolean;
    if (auto t = e.find("time_created_ns"); t && t->as_int()) c.created_ns = *t->as_int();
    c.thread_id = text_of(e.find("thread_id"));
    c.thread_name = text_of(e.find("thread_name"));
    std::vector<std::vector<std::int64_t>> sizes;
    std::vector<std::string> dtypes;
    if (auto s = e.find("input_sizes"); s && s->kind == JsonValue::Kind::Array) {
      for (const auto& shape : s->items) {
        std::vector<std::int64_t> dims;
        for (const auto& d : shape.items)
          if (auto n = d.as_int()) dims.push_back(*n);
        sizes.push_back(std::move(dims));
      }
    }
    if (auto d = e.find("input_dtypes"); d && d->kind == JsonValue::Kind::Array)
      for (const auto& t : d->items) dtypes.push_back(text_of(&t));
    c.sizes = describe_recorded_sizes(sizes, dtypes);
    dump.collectives.push_back(std::move(c));
  }
  return dump;
}

FlightRecorderRead flight_recorder_read(const gpuguard_flight_recorder_reader* reader) {
  return [reader](const std::string& source, bool include_collectives) -> Result<std::string> {
    std::string out;
    auto sink = [](void* context, const char* data, size_t size) {
      static_cast<std::string*>(context)->append(data, size);
    };
    int rc = reader->read(source.c_str(), include_collectives ? 1 : 0, sink, &out);
    if (rc != 0) return gpuguard_error("flight recorder (" + source + ")", out);
    return out;
  };
}

}  // namespace gpuguard
