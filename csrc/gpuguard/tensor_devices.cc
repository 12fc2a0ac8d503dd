// The name-rich side of the device check: groups tensors by device and writes the report (which
// parameters, buffers and inputs are where, the likely cause, the fix). Runs only once a check has failed.
#include "gpuguard/tensor_devices.h"

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <unordered_map>
#include <unordered_set>

namespace gpuguard {

namespace {

std::vector<std::string> split_dots(const std::string& name) {
  std::vector<std::string> out;
  std::string::size_type start = 0;
  while (true) {
    auto dot = name.find('.', start);
    out.push_back(name.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return out;
}

std::string join_dots(const std::vector<std::string>& parts) {
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i) out += '.';
    out += parts[i];
  }
  return out;
}

// A submodule index as nn.Sequential / nn.ModuleList print it: digits, no leading zero. Anything else
// ("01", "layer3") is a name, not an index, and is never merged into a range.
bool as_index(const std::string& token, long long* value) {
  if (token.empty() || token.size() > 15) return false;
  if (token.size() > 1 && token[0] == '0') return false;
  long long v = 0;
  for (char c : token) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
    v = v * 10 + (c - '0');
  }
  *value = v;
  return true;
}

// How many names lie under each dotted prefix ("layers", "layers.0", ...), the name itself excluded.
std::unordered_map<std::string, std::size_t> count_under_prefixes(const std::vector<std::string>& names) {
  std::unordered_map<std::string, std::size_t> counts;
  for (const auto& name : names) {
    for (std::string::size_type i = name.find('.'); i != std::string::npos; i = name.find('.', i + 1)) {
      ++counts[name.substr(0, i)];
    }
  }
  return counts;
}

struct Run {
  std::vector<std::string> tokens;  // the first item of the run
  int position = -1;                // which token counts up; -1 while the run holds one item
  long long first = 0;
  long long last = 0;
};

// Extends `run` with `tokens` when they continue it: equal everywhere but one index token, one higher.
bool extend_run(Run& run, const std::vector<std::string>& tokens) {
  if (run.tokens.size() != tokens.size()) return false;
  if (run.position >= 0) {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      if (static_cast<int>(i) == run.position) continue;
      if (tokens[i] != run.tokens[i]) return false;
    }
    long long v = 0;
    if (!as_index(tokens[run.position], &v) || v != run.last + 1) return false;
    run.last = v;
    return true;
  }
  int differs = -1;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] == run.tokens[i]) continue;
    if (differs >= 0) return false;
    differs = static_cast<int>(i);
  }
  long long a = 0, b = 0;
  if (differs < 0 || !as_index(run.tokens[differs], &a) || !as_index(tokens[differs], &b) || b != a + 1) {
    return false;
  }
  run.position = differs;
  run.first = a;
  run.last = b;
  return true;
}

std::string plural(std::size_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

// The text as a Python string literal. Not named `quoted`: std::quoted would compete for a std::string argument
// through argument-dependent lookup.
std::string py_str(const std::string& s) { return "\"" + s + "\""; }

std::string join(const std::vector<std::string>& items, const std::string& sep, std::size_t limit) {
  std::string out;
  const std::size_t shown = items.size() > limit ? limit : items.size();
  for (std::size_t i = 0; i < shown; ++i) {
    if (i) out += sep;
    out += items[i];
  }
  if (shown < items.size()) out += sep + "… (" + std::to_string(items.size() - shown) + " more)";
  return out;
}

std::string describe_input(const InputInfo& in) {
  std::string shape = "[";
  for (std::size_t i = 0; i < in.shape.size(); ++i) {
    if (i) shape += ", ";
    shape += std::to_string(in.shape[i]);
  }
  shape += "]";
  return in.name + " (shape " + shape + ", " + in.dtype + ")";
}

bool is_identifier(const std::string& s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

bool is_cpu_scalar(const at::Tensor& t) { return t.device().is_cpu() && t.dim() == 0; }

std::string dtype_name(const at::Tensor& t) {
  return std::string(c10::getDtypeNames(t.scalar_type()).first);
}

struct Advice {
  std::string cause;  // "Likely cause: ..."
  std::string fix;    // "Fix: ..."
};

// The module owning a qualified tensor name ("layers.2.weight" -> "layers.2"; "" for the root's own).
std::string owner_of(const std::string& name) {
  const auto dot = name.rfind('.');
  return dot == std::string::npos ? std::string() : name.substr(0, dot);
}

const char* kOneGpu =
    "to run it on one GPU instead, make only that GPU visible before the process starts (CUDA_VISIBLE_DEVICES=0) "
    "and load it without a device map, so that every layer is placed there";

// The fix for the parts of a model that sit apart from the rest: one get_submodule(...).to() per part when
// they are few and named; else a sentence pointing at the list above.
std::string move_stray_parts(const std::vector<DeviceGroup>& groups, const c10::Device home) {
  std::vector<std::string> owners;
  bool root_owned = false;
  for (const auto& g : groups) {
    if (g.device == home) continue;
    for (const auto* names : {&g.parameters, &g.buffers}) {
      for (const auto& n : *names) {
        const std::string o = owner_of(n);
        if (o.empty()) root_owned = true;
        else if (std::find(owners.begin(), owners.end(), o) == owners.end()) owners.push_back(o);
      }
    }
  }
  // a part inside another listed part is moved with it
  std::vector<std::string> top;
  for (const auto& o : owners) {
    const bool inside = std::any_of(owners.begin(), owners.end(), [&](const std::string& p) {
      return p != o && o.size() > p.size() && o.compare(0, p.size(), p) == 0 && o[p.size()] == '.';
    });
    if (!inside) top.push_back(o);
  }
  const std::string to = ".to(" + py_str(device_name(home)) + ")";
  if (root_owned || top.empty() || top.size() > 3) {
    return "each part listed above on another device to " + device_name(home) + " (a submodule with "
           "model.get_submodule(name)" + to + ")";
  }
  std::string out;
  for (std::size_t i = 0; i < top.size(); ++i) out += (i ? "; " : "") + std::string("model.get_submodule(") +
                                                       py_str(top[i]) + ")" + to;
  return out;
}

// The likely cause and the fix, chosen from where the module's own tensors and the inputs are and, under
// guard(deep=True), from where the rest of the model is and where the disagreeing input came from. The rule
// every branch keeps: a model placed across devices is never told to move to one device; it is told where
// its inputs belong, or how to make a framework place it on one GPU.
Advice cause_and_fix(const std::vector<DeviceGroup>& groups, const CheckContext& ctx) {
  std::vector<c10::Device> module_devices;
  for (const auto& g : groups) {
    if (!g.parameters.empty() || !g.buffers.empty()) module_devices.push_back(g.device);
  }
  const bool has_module = !module_devices.empty();
  // groups are ordered with the module's (or the expected) device first
  const c10::Device home = ctx.expected ? *ctx.expected : groups.front().device;
  const std::string home_name = device_name(home);
  std::string first_input;
  std::optional<c10::Device> other;
  for (const auto& g : groups) {
    if (g.device == home) continue;
    if (!other) other = g.device;
    if (!g.inputs.empty() && first_input.empty()) first_input = g.inputs.front().name;
  }
  const std::string var = is_identifier(first_input) ? first_input : "x";
  const std::string other_name = other ? device_name(*other) : home_name;
  const std::string move_var = var + " = " + var + ".to(";
  const auto& model = ctx.model_devices;
  const bool model_split = model.size() > 1;
  const std::string first = model.empty() ? home_name : device_name(model.front());
  // where a framework that placed the model wants its inputs: its first parameter's device
  const std::string first_param = "its first parameter" +
      (ctx.first_parameter.empty() ? std::string() : " (" + ctx.first_parameter + ")");

  Advice a;
  // ---- one layer under guard(deep=True): its own weights against its inputs
  if (!ctx.layer.empty()) {
    const std::string layer = "model.get_submodule(" + py_str(ctx.layer) + ")";
    if (module_devices.size() > 1) {
      a.cause = "Likely cause: the layer's own parameters and buffers are split across devices (part of it was "
                "moved or loaded on its own).";
      // where its inputs are, when part of the layer is there already: the layers before it ran there
      std::string to = home_name;
      for (const auto& g : groups) {
        if (!g.inputs.empty() && (!g.parameters.empty() || !g.buffers.empty())) {
          to = device_name(g.device);
          break;
        }
      }
      a.fix = "Fix: keep the layer in one piece: " + layer + ".to(" + py_str(to) + ").";
      return a;
    }
    if (model.empty()) {  // the rest of the model is not known (it was freed, or a hook made on its own)
      a.cause = "Likely cause: its input was produced on " + other_name + " (by the layers before it, or by the "
                "caller) and nothing moves it to " + home_name + " before '" + ctx.layer + "'; or '" + ctx.layer +
                "' alone was placed on " + home_name + ".";
      a.fix = "Fix: if the model is split across devices on purpose, move the activation in the parent's forward "
              "before calling this layer: " + move_var + py_str(home_name) + "); otherwise put the layer with the "
              "rest: " + layer + ".to(" + py_str(other_name) + ").";
      return a;
    }
    const bool input_on_model = other && std::find(model.begin(), model.end(), *other) != model.end();
    if (ctx.input_from_caller) {
      if (!model_split) {
        a.cause = "Likely cause: the inputs were put on " + other_name + " by the caller, but the whole model is on " +
                  home_name + " (for example moved by hand to a GPU of your choosing while a framework placed the "
                  "model on another).";
        a.fix = "Fix: move the inputs to the model's device before calling it: " + move_var + py_str(home_name) +
                "), or " + var + ".to(next(model.parameters()).device).";
        return a;
      }
      if (home == model.front()) {
        a.cause = "Likely cause: the model is placed across " + std::to_string(model.size()) + " devices (" +
                  [&] { std::vector<std::string> n; for (auto d : model) n.push_back(device_name(d));
                        return join(n, ", ", 8); }() +
                  "), " + first_param + " on " + first + ", but the inputs were put on " + other_name + " by hand.";
        a.fix = "Fix: leave placement to whatever split the model and put the inputs where its first parameter "
                "is: " + move_var + py_str(first) + ") (next(model.parameters()).device); do not move the whole "
                "model to one device. If the split was not wanted: " + kOneGpu + ".";
        return a;
      }
      a.cause = "Likely cause: the model is placed across devices and its forward hands the input '" + var +
                "' from its caller to '" + ctx.layer + "' on " + home_name + " as it is, on " + other_name + ".";
      a.fix = "Fix: move it in the parent's forward before calling this layer: " + move_var + py_str(home_name) +
              ") (a framework's device map does this for the layers it places); do not move the whole model to "
              "one device.";
      return a;
    }
    // an activation made or moved inside the model
    if (!model_split) {
      if (other && other->is_cpu() && !home.is_cpu()) {
        a.cause = "Likely cause: this input was made inside the model's forward on the CPU (a tensor created "
                  "without device=, or a .cpu()), while the whole model is on " + home_name + ".";
        a.fix = "Fix: create it on the device of the tensors it meets, e.g. torch.arange(n, device=" + var +
                ".device), or " + move_var + py_str(home_name) + ") in the forward; keep constant tensors as "
                "buffers (register_buffer) so that they move with the model.";
        return a;
      }
      a.cause = "Likely cause: the model moves this activation to " + other_name + " itself (a .to(" +
                py_str(other_name) + ") in its forward, or a framework's hooks placing its layers by a device map), "
                "so it expects its layers spread over devices, but all of its parameters and buffers are on " +
                home_name + ": the whole model was moved to one device (model.to()) after it was placed.";
      a.fix = "Fix: leave placement to the framework: do not move a model it placed (load it again with its device "
              "map, without model.to()) and put the inputs where its first parameter is (next(model.parameters()).device); " + std::string(kOneGpu) +
              ", or remove the hard-coded .to() from the forward.";
      return a;
    }
    if (!input_on_model) {
      a.cause = "Likely cause: this input was made inside the model's forward on " + other_name + ", where none of "
                "the model is (a tensor created without device=, or moved by a hard-coded .to()).";
      a.fix = "Fix: create it on the device of the tensors it meets, e.g. torch.arange(n, device=" + var +
              ".device), or " + move_var + py_str(home_name) + ") in the forward; keep constant tensors as buffers "
              "(register_buffer) so that they move with the model.";
      return a;
    }
    if (ctx.others_on_layer_device == 0) {
      a.cause = "Likely cause: '" + ctx.layer + "' alone was placed on " + home_name + ": the layers before it ran on " +
                other_name + " and no other part of the model is on " + home_name + ".";
      a.fix = "Fix: put the layer with the layers before it: " + layer + ".to(" + py_str(other_name) + ").";
      return a;
    }
    a.cause = "Likely cause: the model is split across devices and the part on " + home_name + " starts at '" +
              ctx.layer + "', but nothing moves the activation from " + other_name + " to " + home_name +
              " before it.";
    a.fix = "Fix: move it in the parent's forward before calling this layer: " + move_var + py_str(home_name) +
            "), or let the framework that splits the model place it (its device map moves activations between "
            "devices); do not move the whole model or this layer.";
    return a;
  }

  // ---- a whole model (or loose tensors) at once
  if (has_module && module_devices.size() > 1) {
    bool inputs_on_first = true, any_input = false;
    for (const auto& g : groups) {
      if (g.inputs.empty()) continue;
      any_input = true;
      if (g.device != model.front()) inputs_on_first = false;
    }
    a.cause = "Likely cause: the model is placed across devices on purpose (a device map, pipeline stages, a "
              "framework putting layers on every visible GPU), or part of it was created, moved or loaded apart "
              "from the rest (a submodule replaced after model.to(), a .to() on one submodule, "
              "load_state_dict(assign=True) with tensors from another device).";
    std::string fix = "Fix: if the split is deliberate, leave placement to the framework: ";
    if (!any_input || !inputs_on_first) {
      fix += "put the inputs where " + first_param + " is: " + move_var + py_str(first) + ") "
             "(next(model.parameters()).device); ";
    } else {
      fix += "the inputs are already where " + first_param + " is, on " + first + "; ";
    }
    fix += "never move the whole model to one device, and check it layer by layer with gpuguard.guard(model, "
           "deep=True); " + std::string(kOneGpu) + ". If the split is a mistake, move the stray part to the rest: " +
           move_stray_parts(groups, home) + ".";
    a.fix = std::move(fix);
    return a;
  }
  if (ctx.expected) {
    a.cause = "Likely cause: these tensors were created, loaded or moved somewhere other than " + home_name + ".";
    std::string fix = "Fix: move them to " + home_name + ":";
    bool any = false;
    for (const auto& g : groups) {
      if (g.device == home) continue;
      if (!g.parameters.empty() || !g.buffers.empty()) {
        fix += " model.to(" + py_str(home_name) + ")";
        any = true;
        break;
      }
    }
    if (!first_input.empty()) fix += std::string(any ? ";" : "") + " " + move_var + py_str(home_name) + ")";
    a.fix = fix + ".";
    return a;
  }
  if (has_module) {
    a.cause = "Likely cause: the inputs were put on a different device than the model (for example moved by hand to "
              "a GPU of your choosing while a framework placed the model on another).";
    a.fix = "Fix: move the inputs to the model's device: " + move_var + py_str(home_name) + "), or take the device "
            "from the model: " + var + ".to(next(model.parameters()).device).";
    return a;
  }
  a.fix = "Fix: move the tensors to one device, e.g. " + move_var + py_str(home_name) + ").";
  return a;
}
}  // namespace

std::string device_name(c10::Device device) { return device.str(); }

std::vector<std::string> compress_names(const std::vector<std::string>& names,
                                        const std::vector<std::string>& universe) {
  const auto in_universe = count_under_prefixes(universe.empty() ? names : universe);
  const auto in_names = count_under_prefixes(names);

  // 1. whole subtrees: the shortest prefix whose every tensor is in `names` stands for all of them
  std::vector<std::string> items;
  std::unordered_set<std::string> emitted;
  for (const auto& name : names) {
    std::string item = name;
    for (std::string::size_type i = name.find('.'); i != std::string::npos; i = name.find('.', i + 1)) {
      const std::string prefix = name.substr(0, i);
      auto u = in_universe.find(prefix);
      auto n = in_names.find(prefix);
      if (u != in_universe.end() && n != in_names.end() && u->second == n->second && u->second >= 2) {
        item = prefix + ".*";
        break;
      }
    }
    if (emitted.insert(item).second) items.push_back(item);
  }

  // 2. runs of consecutive indices; only the few most recent runs are candidates, which keeps this linear
  std::vector<Run> runs;
  constexpr std::size_t kLookBack = 8;
  for (const auto& item : items) {
    auto tokens = split_dots(item);
    bool extended = false;
    for (std::size_t k = 0; k < runs.size() && k < kLookBack && !extended; ++k) {
      extended = extend_run(runs[runs.size() - 1 - k], tokens);
    }
    if (!extended) runs.push_back(Run{std::move(tokens)});
  }
  std::vector<std::string> out;
  out.reserve(runs.size());
  for (auto& run : runs) {
    if (run.position >= 0) run.tokens[run.position] = std::to_string(run.first) + "-" + std::to_string(run.last);
    out.push_back(join_dots(run.tokens));
  }
  return out;
}

DeviceReport check_devices(const std::vector<TensorEntry>& entries, const CheckContext& context) {
  DeviceReport report;
  DeviceAgreement agreement(context.expected);
  for (const auto& e : entries) agreement.add(e.tensor);
  if (agreement.agree()) {
    report.device = agreement.device();
    return report;
  }
  report.consistent = false;

  // every name a group can list: "layers.3.*" must not hide a tensor that is listed nowhere
  std::vector<std::string> universe;
  for (const auto& e : entries) {
    if (e.role != TensorRole::kInput && e.tensor.defined() && !is_cpu_scalar(e.tensor)) universe.push_back(e.name);
  }
  // group by device in order of first appearance; a 0-dim CPU tensor never disagrees, so is never listed
  std::vector<DeviceGroup> groups;
  for (const auto& e : entries) {
    if (!e.tensor.defined() || is_cpu_scalar(e.tensor)) continue;
    const c10::Device d = e.tensor.device();
    auto it = std::find_if(groups.begin(), groups.end(), [&](const DeviceGroup& g) { return g.device == d; });
    if (it == groups.end()) {
      groups.push_back(DeviceGroup{d, {}, {}, {}, {}});
      it = groups.end() - 1;
    }
    switch (e.role) {
      case TensorRole::kParameter: it->parameters.push_back(e.name); break;
      case TensorRole::kBuffer: it->buffers.push_back(e.name); break;
      case TensorRole::kInput: {
        InputInfo in{e.name, {}, dtype_name(e.tensor)};
        const auto sizes = e.tensor.sym_sizes();
        for (const auto& s : sizes) in.shape.push_back(s.guard_int(__FILE__, __LINE__));
        it->inputs.push_back(std::move(in));
        break;
      }
    }
  }
  // the expected device first, then the device holding most of the module (the module's device), then inputs
  std::stable_sort(groups.begin(), groups.end(), [&](const DeviceGroup& a, const DeviceGroup& b) {
    if (context.expected && (a.device == *context.expected) != (b.device == *context.expected)) {
      return a.device == *context.expected;
    }
    const auto ma = a.parameters.size() + a.buffers.size();
    const auto mb = b.parameters.size() + b.buffers.size();
    if (ma != mb) return ma > mb;
    if (ma > 0) return false;  // as much of the module on each: module order (the first parameter's first)
    return a.inputs.size() > b.inputs.size();
  });
  for (auto& g : groups) {
    std::vector<std::string> owned = g.parameters;
    owned.insert(owned.end(), g.buffers.begin(), g.buffers.end());
    g.summary = compress_names(owned, universe);
  }

  std::vector<std::string> device_list;
  for (const auto& g : groups) device_list.push_back(device_name(g.device));
  std::string msg = "gpuguard: ";
  if (!context.layer.empty()) {
    msg += "layer '" + context.layer + "'" + (context.layer_type.empty() ? "" : " (" + context.layer_type + ")") +
           " is about to run on tensors from " + std::to_string(groups.size()) + " devices (" +
           join(device_list, ", ", 8) +
           "); PyTorch would stop inside this layer with \"Expected all tensors to be on the same device\".\n";
  } else if (context.expected) {
    std::size_t elsewhere = 0;
    std::vector<std::string> other;
    for (const auto& g : groups) {
      if (g.device == *context.expected) continue;
      elsewhere += g.parameters.size() + g.buffers.size() + g.inputs.size();
      other.push_back(device_name(g.device));
    }
    msg += "expected every tensor on " + device_name(*context.expected) + ", but " +
           plural(elsewhere, "tensor is", "tensors are") + " elsewhere (" + join(other, ", ", 8) + ").\n";
  } else {
    std::vector<std::string> module_list;
    for (const auto& g : groups) {
      if (!g.parameters.empty() || !g.buffers.empty()) module_list.push_back(device_name(g.device));
    }
    if (module_list.size() > 1) {  // said first: a split model has no one device to compare its inputs with
      msg += "the model" + (context.module.empty() ? std::string() : " (" + context.module + ")") +
             " is split: its parameters and buffers are on " + std::to_string(module_list.size()) + " devices (" +
             join(module_list, ", ", 8) + "), so no one device holds it and its inputs.\n";
    } else {
      msg += "tensors that must share one device are on " + std::to_string(groups.size()) + " devices: " +
             join(device_list, ", ", 8) + ".\n";
    }
  }
  const std::string owner = !context.layer.empty() ? "'" + context.layer + "'" : context.module;
  for (const auto& g : groups) {
    const std::string label = "  " + device_name(g.device) + ": ";
    if (!g.parameters.empty() || !g.buffers.empty()) {
      std::string what;
      if (!g.parameters.empty()) what = plural(g.parameters.size(), "parameter", "parameters");
      if (!g.buffers.empty()) what += (what.empty() ? "" : ", ") + plural(g.buffers.size(), "buffer", "buffers");
      msg += label + what + (owner.empty() ? "" : " of " + owner) + ": " + join(g.summary, ", ", 12) + "\n";
    }
    if (!g.inputs.empty()) {
      std::vector<std::string> described;
      for (const auto& in : g.inputs) described.push_back(describe_input(in));
      msg += label + plural(g.inputs.size(), "input", "inputs") + ": " + join(described, ", ", 6) + "\n";
    }
  }
  CheckContext ctx = context;
  if (ctx.layer.empty()) {  // a whole model: where its parts are comes from the entries themselves
    ctx.model_devices.clear();
    bool first_seen = false;
    for (const auto& e : entries) {
      if (e.role == TensorRole::kInput || !e.tensor.defined() || is_cpu_scalar(e.tensor)) continue;
      const c10::Device d = e.tensor.device();
      if (std::find(ctx.model_devices.begin(), ctx.model_devices.end(), d) == ctx.model_devices.end()) {
        ctx.model_devices.push_back(d);
      }
      if (!first_seen && e.role == TensorRole::kParameter) {
        ctx.first_parameter = e.name;
        first_seen = true;
      }
    }
    if (!first_seen) {  // no parameter: the first buffer stands for it
      for (const auto& e : entries) {
        if (e.role == TensorRole::kBuffer && e.tensor.defined() && !is_cpu_scalar(e.tensor)) {
          ctx.first_parameter = e.name;
          break;
        }
      }
    }
    // the first parameter's device first: that is where a framework that placed the model wants its inputs
    for (const auto& e : entries) {
      if (e.name != ctx.first_parameter || e.role == TensorRole::kInput) continue;
      auto at = std::find(ctx.model_devices.begin(), ctx.model_devices.end(), e.tensor.device());
      if (at != ctx.model_devices.end()) std::rotate(ctx.model_devices.begin(), at, at + 1);
      break;
    }
  }
  Advice advice = cause_and_fix(groups, ctx);
  if (!advice.cause.empty()) msg += advice.cause + "\n";
  msg += advice.fix;
  report.cause = std::move(advice.cause);
  report.fix = std::move(advice.fix);
  report.groups = std::move(groups);
  report.message = std::move(msg);
  return report;
}

}  // namespace gpuguard
