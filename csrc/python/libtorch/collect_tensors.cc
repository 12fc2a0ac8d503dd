// Walks nn.Module trees and nested call arguments for tensors with the CPython C API (see collect_tensors.h).
#include "collect_tensors.h"

#include <pybind11/pybind11.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <functional>
#include <memory>
#include <unordered_map>

namespace gpuguard::python {

namespace py = pybind11;

namespace {

// Interned once: dict lookups with these keys hit the cached hash and compare by identity.
struct Names {
  PyObject* parameters = PyUnicode_InternFromString("_parameters");
  PyObject* buffers = PyUnicode_InternFromString("_buffers");
  PyObject* modules = PyUnicode_InternFromString("_modules");
  PyObject* dataclass_fields = PyUnicode_InternFromString("__dataclass_fields__");
  PyObject* fields = PyUnicode_InternFromString("_fields");
};

const Names& names() {
  static const Names* n = new Names();  // never freed: interned strings live as long as the interpreter
  return *n;
}

// The module's _parameters, _buffers and _modules dicts, read from its instance __dict__ (not through
// getattr, which nn.Module overrides). Any of them may be null for an object that is not an nn.Module.
struct ModuleDicts {
  PyObject* instance = nullptr;    // the module's __dict__, borrowed
  PyObject* parameters = nullptr;  // borrowed
  PyObject* buffers = nullptr;
  PyObject* modules = nullptr;
};

ModuleDicts module_dicts(PyObject* module) {
  ModuleDicts out;
  PyObject* dict = PyObject_GenericGetDict(module, nullptr);  // new reference
  if (!dict) {
    PyErr_Clear();  // no __dict__: not a module; nothing to walk
    return out;
  }
  auto get = [&](PyObject* key) -> PyObject* {
    PyObject* v = PyDict_GetItemWithError(dict, key);
    if (!v && PyErr_Occurred()) throw py::error_already_set();
    return (v && PyDict_Check(v)) ? v : nullptr;
  };
  out.parameters = get(names().parameters);
  out.buffers = get(names().buffers);
  out.modules = get(names().modules);
  out.instance = dict;
  Py_DECREF(dict);  // the module still owns its __dict__, which owns the three dicts
  return out;
}

bool is_tensor(PyObject* obj) {
  return obj != Py_None && THPVariable_Check(obj);
}

const at::Tensor& unpack(PyObject* obj) { return THPVariable_Unpack(obj); }

// Where a TensorImpl keeps the two things its device() reads, as byte offsets, for ModuleSnapshot's scan over
// every parameter. c10 keeps both protected, so a TensorImpl built for the purpose, of a derived class, finds
// them: device_opt_ (a std::optional<c10::Device>: type, index, then whether it holds one) by its address, and
// the device_policy_ bit (set when device() asks the virtual device_custom() instead, as tensor subclasses with
// a device of their own do) by setting it and seeing which bit changed. A layout other than this one expects
// leaves `usable` false, and every tensor is then read through device() itself.
struct DeviceLayout {
  std::ptrdiff_t device = 0;
  std::ptrdiff_t policy = 0;
  unsigned char policy_mask = 0;
  bool usable = false;
};

struct TensorImplProbe : c10::TensorImpl {
  TensorImplProbe() : TensorImpl(c10::DispatchKey::CPU, caffe2::TypeMeta::Make<float>(), c10::Device(c10::kCPU)) {}

  DeviceLayout layout() {
    DeviceLayout out;
    const auto* bytes = reinterpret_cast<const unsigned char*>(static_cast<const c10::TensorImpl*>(this));
    out.device = reinterpret_cast<const unsigned char*>(&device_opt_) - bytes;
    std::array<unsigned char, sizeof(c10::TensorImpl)> before;
    std::copy_n(bytes, before.size(), before.begin());
    device_policy_ = true;
    int changed = 0;
    for (std::size_t i = 0; i < before.size(); ++i) {
      if (const unsigned char bits = before[i] ^ bytes[i]) {
        ++changed;
        out.policy = static_cast<std::ptrdiff_t>(i);
        out.policy_mask = bits;
      }
    }
    device_policy_ = false;
    const std::optional<c10::Device> none;
    const std::optional<c10::Device> cpu = c10::Device(c10::kCPU);
    out.usable = sizeof(device_opt_) == 3 && out.device + 4 <= static_cast<std::ptrdiff_t>(sizeof(c10::TensorImpl)) &&
                 changed == 1 && std::popcount(out.policy_mask) == 1 &&
                 reinterpret_cast<const unsigned char*>(&none)[2] == 0 &&
                 reinterpret_cast<const unsigned char*>(&cpu)[2] == 1 && bytes[out.device + 2] == 1;
    return out;
  }
};

const DeviceLayout& device_layout() {
  static const DeviceLayout layout = TensorImplProbe().layout();
  return layout;
}

// The walks recurse once per level of nesting. A level costs a few hundred bytes of C stack, so a structure
// nested tens of thousands deep (a list in a list in a list ..., a submodule chain) would overflow it and kill
// the process; past this depth the walk stops with a ValueError instead. CPython itself stops Python code at
// 1000 levels by default (sys.getrecursionlimit()), and torch walks module trees in Python (named_modules(),
// .to()), so no model torch can use nests deeper.
constexpr int kMaxNesting = 1000;

[[noreturn]] void raise_too_deep(const char* what, const char* advice) {
  PyErr_Format(PyExc_ValueError,
               "gpuguard stopped checking devices at %d levels of nesting: %s nests deeper than that. It stops "
               "there instead of overflowing the C stack, so nothing past it was checked. %s",
               kMaxNesting, what, advice);
  throw py::error_already_set();
}

// Generic module walk. The visitor sees each watched dict, each tensor (with its role and key), and
// enters/leaves submodules, so that one traversal serves the fast check, the snapshot and the named report.
template <typename Visitor>
void walk_module(PyObject* module, bool recurse, Visitor& visitor, AddressSet& seen, int depth = 0) {
  if (recurse && !seen.insert(module)) return;  // a module reachable twice, or a cycle
  if (depth > kMaxNesting) {
    raise_too_deep("the module tree (submodules inside submodules)",
                   "Check a part of it (assert_same_device(model.sub), guard(model.sub)), or flatten the chain "
                   "into an nn.Sequential or nn.ModuleList.");
  }
  const ModuleDicts d = module_dicts(module);
  // the module's own __dict__ first: replacing _parameters wholesale changes it, and a snapshot compares
  // dicts in this order, stopping at the first change, so it never reads a dict that is gone
  if (d.instance) visitor.on_dict(d.instance);
  auto visit_tensors = [&](PyObject* dict, TensorRole role) {
    if (!dict) return;
    visitor.on_dict(dict);
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(dict, &pos, &key, &value)) {
      if (is_tensor(value)) visitor.on_tensor(value, role, key);
    }
  };
  visit_tensors(d.parameters, TensorRole::kParameter);
  visit_tensors(d.buffers, TensorRole::kBuffer);
  if (!d.modules) return;
  visitor.on_dict(d.modules);
  if (!recurse) return;
  Py_ssize_t pos = 0;
  PyObject *key, *child;
  while (PyDict_Next(d.modules, &pos, &key, &child)) {
    if (child == Py_None) continue;
    visitor.enter(key);
    walk_module(child, recurse, visitor, seen, depth + 1);
    visitor.leave();
  }
}

struct AgreementVisitor {
  DeviceAgreement& agreement;
  void on_dict(PyObject*) {}
  void on_tensor(PyObject* t, TensorRole, PyObject*) { agreement.add(unpack(t)); }
  void enter(PyObject*) {}
  void leave() {}
};

std::string to_string(PyObject* obj) {
  if (PyUnicode_Check(obj)) {
    const char* s = PyUnicode_AsUTF8(obj);
    if (!s) throw py::error_already_set();
    return s;
  }
  return py::str(py::handle(obj));
}

std::string key_repr(PyObject* key) {
  return PyUnicode_Check(key) ? "'" + to_string(key) + "'" : std::string(py::repr(py::handle(key)));
}

struct NamingVisitor {
  std::vector<TensorEntry>& out;
  AddressSet tensors_seen;
  std::vector<std::string> prefix;  // qualified name of the module being walked, one entry per level

  void on_dict(PyObject*) {}
  void on_tensor(PyObject* t, TensorRole role, PyObject* key) {
    if (!tensors_seen.insert(t)) return;
    std::string name;
    for (const auto& p : prefix) name += p + ".";
    out.push_back(TensorEntry{role, name + to_string(key), unpack(t)});
  }
  void enter(PyObject* key) { prefix.push_back(to_string(key)); }
  void leave() { prefix.pop_back(); }
};

struct SnapshotVisitor {
  std::vector<PyObject*>& dicts;
  std::vector<PyObject*>& tensors;
  void on_dict(PyObject* d) {
#if PY_VERSION_HEX < 0x030C0000
    if (PyDict_GET_SIZE(d) == 0) return;  // filled only through registration, which the epoch counts
#endif
    dicts.push_back(d);
  }
  void on_tensor(PyObject* t, TensorRole, PyObject*) { tensors.push_back(t); }
  void enter(PyObject*) {}
  void leave() {}
};

// Types whose instances can hold no tensor: skipped before the (costlier) dataclass lookup.
bool is_plain_leaf(PyObject* obj) {
  return obj == Py_None || PyLong_CheckExact(obj) || PyFloat_CheckExact(obj) || PyUnicode_CheckExact(obj) ||
         PyBool_Check(obj) || PyBytes_CheckExact(obj) || PyComplex_CheckExact(obj);
}

// A dataclass instance (not the class): its type carries __dataclass_fields__.
PyObject* dataclass_fields(PyObject* obj) {
  if (PyType_Check(obj)) return nullptr;
  PyObject* fields = _PyType_Lookup(Py_TYPE(obj), names().dataclass_fields);  // borrowed, no exception
  return (fields && PyDict_Check(fields)) ? fields : nullptr;
}

// Calls on_tensor(tensor, path) for every tensor inside `obj`. `path` is built only when names are wanted.
template <bool kNamed, typename OnTensor>
void walk_input(PyObject* obj, const std::string& path, AddressSet& seen, OnTensor& on_tensor, int depth = 0) {
  if (is_plain_leaf(obj)) return;
  if (THPVariable_CheckExact(obj)) {
    on_tensor(obj, path);
    return;
  }
  if (depth > kMaxNesting) {
    raise_too_deep("an argument (lists, tuples, dicts or dataclasses inside each other)",
                   "Pass the tensors themselves, or a flatter structure holding them.");
  }
  const bool is_tuple = PyTuple_Check(obj);
  if (is_tuple || PyList_Check(obj)) {
    if (!seen.insert(obj)) return;  // a reference cycle, or a container seen before
    // namedtuple: fields by name
    PyObject* fields = nullptr;
    if constexpr (kNamed) {
      if (is_tuple && !PyTuple_CheckExact(obj)) {
        fields = _PyType_Lookup(Py_TYPE(obj), names().fields);
        if (fields && !PyTuple_Check(fields)) fields = nullptr;
      }
    }
    // PySequence_Fast_ITEMS would be a borrowed view, but a list may change while a tensor's device is read
    // (a subclass's __torch_dispatch__ can run Python), so index it each time.
    const Py_ssize_t n = is_tuple ? PyTuple_GET_SIZE(obj) : PyList_GET_SIZE(obj);
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (!is_tuple && i >= PyList_GET_SIZE(obj)) break;
      PyObject* item = is_tuple ? PyTuple_GET_ITEM(obj, i) : PyList_GET_ITEM(obj, i);
      Py_INCREF(item);
      std::string sub;
      if constexpr (kNamed) {
        if (fields && i < PyTuple_GET_SIZE(fields)) {
          sub = path + "." + to_string(PyTuple_GET_ITEM(fields, i));
        } else {
          sub = path + "[" + std::to_string(i) + "]";
        }
      }
      try {
        walk_input<kNamed>(item, sub, seen, on_tensor, depth + 1);
      } catch (...) {
        Py_DECREF(item);
        throw;
      }
      Py_DECREF(item);
    }
    return;
  }
  if (PyDict_Check(obj)) {
    if (!seen.insert(obj)) return;
    // iterate a copy of the items: a dict must not change size while PyDict_Next runs over it
    py::list items = py::reinterpret_steal<py::list>(PyDict_Items(obj));
    if (!items) throw py::error_already_set();
    for (py::handle kv : items) {
      PyObject* key = PyTuple_GET_ITEM(kv.ptr(), 0);
      PyObject* value = PyTuple_GET_ITEM(kv.ptr(), 1);
      std::string sub;
      if constexpr (kNamed) sub = path + "[" + key_repr(key) + "]";
      walk_input<kNamed>(value, sub, seen, on_tensor, depth + 1);
    }
    return;
  }
  if (THPVariable_Check(obj)) {  // tensor subclasses
    on_tensor(obj, path);
    return;
  }
  if (PyObject* fields = dataclass_fields(obj)) {
    if (!seen.insert(obj)) return;
    py::list keys = py::reinterpret_steal<py::list>(PyDict_Keys(fields));
    if (!keys) throw py::error_already_set();
    for (py::handle key : keys) {
      PyObject* value = PyObject_GetAttr(obj, key.ptr());
      if (!value) {  // a field without a value (init=False, never set): nothing to check
        PyErr_Clear();
        continue;
      }
      py::object hold = py::reinterpret_steal<py::object>(value);
      std::string sub;
      if constexpr (kNamed) sub = path + "." + to_string(key.ptr());
      walk_input<kNamed>(value, sub, seen, on_tensor, depth + 1);
    }
  }
}

}  // namespace

bool AddressSet::insert(const void* p) {
  if ((size_ + 1) * 2 > slots_.size()) {  // keep the load under one half
    std::vector<const void*> old(slots_.empty() ? 64 : slots_.size() * 2, nullptr);
    old.swap(slots_);
    size_ = 0;
    for (const void* q : old) {
      if (q) insert(q);
    }
  }
  const std::size_t mask = slots_.size() - 1;
  // objects are 16-byte aligned: drop the zero bits, then mix
  std::size_t h = (reinterpret_cast<std::uintptr_t>(p) >> 4) * 0x9E3779B97F4A7C15ull;
  for (std::size_t i = (h >> 20) & mask;; i = (i + 1) & mask) {
    if (slots_[i] == p) return false;
    if (!slots_[i]) {
      slots_[i] = p;
      ++size_;
      return true;
    }
  }
}

void module_devices(PyObject* module, bool recurse, DeviceAgreement& agreement) {
  AgreementVisitor visitor{agreement};
  AddressSet seen;
  walk_module(module, recurse, visitor, seen);
}

void input_devices(PyObject* obj, DeviceAgreement& agreement, AddressSet& seen) {
  auto add = [&](PyObject* t, const std::string&) { agreement.add(unpack(t)); };
  static const std::string kNoPath;
  walk_input<false>(obj, kNoPath, seen, add);
}

void input_tensor_impls(PyObject* obj, std::vector<const c10::TensorImpl*>& out, std::size_t limit,
                        AddressSet& seen) {
  auto add = [&](PyObject* t, const std::string&) {
    if (out.size() < limit && unpack(t).defined()) out.push_back(unpack(t).unsafeGetTensorImpl());
  };
  static const std::string kNoPath;
  walk_input<false>(obj, kNoPath, seen, add);
}

void named_module_tensors(PyObject* module, bool recurse, std::vector<TensorEntry>& out) {
  NamingVisitor visitor{out, {}, {}};
  AddressSet seen;
  walk_module(module, recurse, visitor, seen);
}

void named_input_tensors(PyObject* obj, const std::string& path, std::vector<TensorEntry>& out,
                         AddressSet& seen) {
  auto add = [&](PyObject* t, const std::string& name) {
    out.push_back(TensorEntry{TensorRole::kInput, name, unpack(t)});
  };
  walk_input<true>(obj, path, seen, add);
}

bool device_scan_usable() { return device_layout().usable; }

// ---- ModuleSnapshot -----------------------------------------------------------------------------------

#if PY_VERSION_HEX < 0x030C0000
namespace {
// Moved by PyTorch's global parameter / buffer / module registration hooks: a tensor or submodule arrived
// through the registration API, possibly into a dict the snapshots do not compare (an empty one).
std::uint64_t g_registration_epoch = 1;

PyObject* count_registration(PyObject*, PyObject*) {
  ++g_registration_epoch;
  Py_RETURN_NONE;  // None: the registered value is kept as it is
}

PyMethodDef g_count_def = {"_gpuguard_count_registration", count_registration, METH_VARARGS, nullptr};

void install_registration_hooks() {
  static bool installed = false;
  if (installed) return;
  py::object hook = py::reinterpret_steal<py::object>(PyCFunction_New(&g_count_def, nullptr));
  if (!hook) throw py::error_already_set();
  py::module_ m = py::module_::import("torch.nn.modules.module");
  for (const char* name : {"register_module_parameter_registration_hook", "register_module_buffer_registration_hook",
                           "register_module_module_registration_hook"}) {
    m.attr(name)(hook).inc_ref();  // the handle is kept for the life of the process
  }
  installed = true;
}
}  // namespace
#else
namespace {
// One dict watcher for the process: any change to any watched dict moves the epoch, and every snapshot
// taken before it is rebuilt on its next use. Changes to a model's dicts are rare; reading them is free.
std::uint64_t g_dict_epoch = 1;
int g_watcher_id = -1;

int on_dict_event(PyDict_WatchEvent, PyObject*, PyObject*, PyObject*) {
  ++g_dict_epoch;
  return 0;
}

void watch(PyObject* dict) {
  if (g_watcher_id < 0) {
    g_watcher_id = PyDict_AddWatcher(on_dict_event);
    if (g_watcher_id < 0) throw py::error_already_set();
  }
  if (PyDict_Watch(g_watcher_id, dict) < 0) throw py::error_already_set();
}
}  // namespace
#endif

ModuleSnapshot::~ModuleSnapshot() { clear(); }

void ModuleSnapshot::clear() {
  dicts_.clear();
  tensors_.clear();
#if PY_VERSION_HEX < 0x030C0000
  versions_.clear();
#endif
  Py_CLEAR(root_ref_);
}

bool ModuleSnapshot::valid_for(PyObject* module) const {
  if (!root_ref_ || PyWeakref_GET_OBJECT(root_ref_) != module) return false;
#if PY_VERSION_HEX < 0x030C0000
  if (registration_epoch_ != g_registration_epoch) return false;
  // one load of each dict's tag, in order, stopping at the first change: a dict after it may be gone
  for (std::size_t i = 0; i < dicts_.size(); ++i) {
    if (reinterpret_cast<const PyDictObject*>(dicts_[i])->ma_version_tag != versions_[i]) return false;
  }
  return true;
#else
  return epoch_ == g_dict_epoch;
#endif
}

void ModuleSnapshot::rebuild(PyObject* module) {
  clear();
#if PY_VERSION_HEX < 0x030C0000
  install_registration_hooks();
  registration_epoch_ = g_registration_epoch;
#endif
  PyObject* ref = PyWeakref_NewRef(module, nullptr);
  if (!ref) throw py::error_already_set();
  root_ref_ = ref;
  SnapshotVisitor visitor{dicts_, tensors_};
  AddressSet seen;
  walk_module(module, /*recurse=*/true, visitor, seen);
#if PY_VERSION_HEX < 0x030C0000
  versions_.reserve(dicts_.size());
  for (PyObject* d : dicts_) versions_.push_back(reinterpret_cast<PyDictObject*>(d)->ma_version_tag);
#else
  for (PyObject* d : dicts_) watch(d);
  epoch_ = g_dict_epoch;
#endif
}

std::optional<c10::Device> ModuleSnapshot::shared_device() const {
  const DeviceLayout& layout = device_layout();
  if (!layout.usable || tensors_.empty()) return std::nullopt;
  auto bytes_of = [](PyObject* t) {
    return reinterpret_cast<const unsigned char*>(unpack(t).unsafeGetTensorImpl());
  };
  // Four bytes from device_opt_ on: its three, and one more that the mask drops.
  constexpr auto kDeviceBytes = std::bit_cast<std::uint32_t>(std::array<unsigned char, 4>{0xFF, 0xFF, 0xFF, 0});
  const unsigned char* first = bytes_of(tensors_[0]);
  std::uint32_t key;
  std::memcpy(&key, first + layout.device, sizeof key);
  // Branch-free, the loop is a handful of instructions per tensor: it is the per-forward cost of guard().
  std::uint32_t differ = 0;
  unsigned char policies = 0;
  for (PyObject* t : tensors_) {
    const unsigned char* impl = bytes_of(t);
    std::uint32_t word;
    std::memcpy(&word, impl + layout.device, sizeof word);
    differ |= word ^ key;
    policies |= impl[layout.policy];
  }
  // one device everywhere, none of their own making, and a device at all (an undefined tensor has none)
  if ((differ & kDeviceBytes) != 0 || (policies & layout.policy_mask) != 0 || first[layout.device + 2] == 0) {
    return std::nullopt;
  }
  return unpack(tensors_[0]).device();
}

void ModuleSnapshot::add_devices(DeviceAgreement& agreement) const {
  // The common case, every tensor on one device, takes one scan; the first tensor then decides for all of them,
  // unless it is a CPU scalar (which agrees with any device) or disagrees already: those are read one by one.
  if (const std::optional<c10::Device> device = shared_device()) {
    DeviceAgreement with_first = agreement;
    with_first.add(unpack(tensors_[0]));
    if (with_first.settled_on(*device)) {
      agreement = with_first;
      return;
    }
  }
  DeviceAgreement local = agreement;  // a local: stores through the reference might alias the list
  for (PyObject* t : tensors_) local.add(unpack(t));
  agreement = local;
}

// ---- the snapshot cache of assert_same_device ----------------------------------------------------------

namespace {

struct CachedSnapshot {
  std::unique_ptr<ModuleSnapshot> snapshot;
  PyObject* on_free = nullptr;  // a weak reference to the module whose callback drops this entry
};

std::unordered_map<PyObject*, CachedSnapshot>& snapshot_cache() {
  static auto* cache = new std::unordered_map<PyObject*, CachedSnapshot>();
  return *cache;
}
std::unordered_map<PyObject*, PyObject*>& module_of_weakref() {
  static auto* map = new std::unordered_map<PyObject*, PyObject*>();
  return *map;
}
// Weak references whose callback ran. A callback must not free its own weak reference (CPython still
// holds it, borrowed), so they are released on the next use of the cache.
std::vector<PyObject*>& retired_weakrefs() {
  static auto* v = new std::vector<PyObject*>();
  return *v;
}

PyObject* drop_cached_snapshot(PyObject*, PyObject* weakref) {
  auto found = module_of_weakref().find(weakref);
  if (found != module_of_weakref().end()) {
    auto entry = snapshot_cache().find(found->second);
    if (entry != snapshot_cache().end()) {
      entry->second.snapshot.reset();
      snapshot_cache().erase(entry);
    }
    module_of_weakref().erase(found);
    retired_weakrefs().push_back(weakref);
  }
  Py_RETURN_NONE;
}

PyMethodDef g_drop_def = {"_gpuguard_drop_snapshot", drop_cached_snapshot, METH_O, nullptr};

}  // namespace

const ModuleSnapshot* cached_snapshot(PyObject* module) {
  for (PyObject* ref : retired_weakrefs()) Py_DECREF(ref);
  retired_weakrefs().clear();

  auto& cache = snapshot_cache();
  auto it = cache.find(module);
  if (it == cache.end()) {
    static PyObject* callback = PyCFunction_New(&g_drop_def, nullptr);
    if (!callback) throw py::error_already_set();
    PyObject* ref = PyWeakref_NewRef(module, callback);
    if (!ref) {
      PyErr_Clear();  // not weakly referenceable: never cached
      return nullptr;
    }
    it = cache.emplace(module, CachedSnapshot{std::make_unique<ModuleSnapshot>(), ref}).first;
    module_of_weakref()[ref] = module;
  }
  ModuleSnapshot& snapshot = *it->second.snapshot;
  if (!snapshot.valid_for(module)) snapshot.rebuild(module);
  return &snapshot;
}

}  // namespace gpuguard::python
