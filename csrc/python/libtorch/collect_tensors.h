// Finds the tensors of Python objects with the CPython C API: an nn.Module's parameters, buffers and
// submodules (read from its _parameters/_buffers/_modules dicts) and nested call arguments. Binding glue for
// the device check; the device logic itself is gpuguard/tensor_devices.
#pragma once

#include <Python.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gpuguard/tensor_devices.h"

namespace gpuguard::python {

// The set of objects already visited in one walk (modules reachable twice, containers in a reference
// cycle). Open addressing over addresses: a walk of a 10,000-parameter model inserts thousands of them, and
// std::unordered_set's node allocations would cost more than the rest of the walk. Allocates on first use.
class AddressSet {
 public:
  // false when `p` was already present
  bool insert(const void* p);

 private:
  std::vector<const void*> slots_;
  std::size_t size_ = 0;
};

// Fast, name-free walks: every tensor's device goes into `agreement`.
// recurse=false: only the module's own parameters and buffers (a layer under guard(deep=True)).
void module_devices(PyObject* module, bool recurse, DeviceAgreement& agreement);
// Tensors inside list / tuple (namedtuple) / dict / dataclass nesting; None and other leaves are skipped.
void input_devices(PyObject* obj, DeviceAgreement& agreement, AddressSet& seen);

// Whether this torch's TensorImpl keeps a tensor's device where ModuleSnapshot's one-scan check reads it. When
// not, each tensor's device() is called instead: the same answers, more slowly.
bool device_scan_usable();

// The TensorImpls of the tensors inside `obj` (same nesting rules), at most `limit` in all in `out`.
void input_tensor_impls(PyObject* obj, std::vector<const c10::TensorImpl*>& out, std::size_t limit, AddressSet& seen);

// Name-rich walks for the report. Each tensor object is named once (tied weights keep their first name, as
// named_parameters() does).
void named_module_tensors(PyObject* module, bool recurse, std::vector<TensorEntry>& out);
void named_input_tensors(PyObject* obj, const std::string& path, std::vector<TensorEntry>& out, AddressSet& seen);

// The parameter and buffer objects of a module tree, remembered between forwards so that guard() does not
// walk the tree on every call, together with what tells that the tree changed since.
//
// Staleness: the cached list holds the tensor *objects*; each tensor's device is read afresh on every call,
// so `param.data = ...`, the default model.to() (which does exactly that) and torch.utils.swap_tensors (which
// swaps the tensor under the same object) are seen at once. Every other change replaces or adds an object
// in one of the module's _parameters, _buffers or _modules dicts (re-assignment, register_*, new submodules,
// load_state_dict(assign=True), and the __future__ overwrite path, which writes _parameters[k] directly,
// bypassing every registration hook); those dicts are watched, and any change there rebuilds the list on
// the next call.
//   Python 3.12+: a dict watcher on every one of them; checking costs nothing per call.
//   Each module's own __dict__ is watched too: assigning module._parameters = {} wholesale changes it.
//   Python < 3.12: the version tag (PEP 509) of every non-empty dict, compared on each call. An empty dict
//   (most layers have no buffers and no children) is not compared, which keeps the per-forward cost down to
//   the dicts that hold something; a tensor or submodule can only arrive in it through register_parameter /
//   register_buffer / register_module or attribute assignment, and PyTorch's global registration hooks,
//   installed once, count those. (A key written into an empty dict by hand, bypassing all of these, is the
//   one change this does not see until the next structural change; assert_same_device sees it the same way.)
class ModuleSnapshot {
 public:
  ModuleSnapshot() = default;
  ModuleSnapshot(const ModuleSnapshot&) = delete;
  ModuleSnapshot& operator=(const ModuleSnapshot&) = delete;
  ~ModuleSnapshot();  // the GIL must be held (it drops a weak reference)

  // Whether the remembered tensors are still exactly `module`'s.
  bool valid_for(PyObject* module) const;
  // Re-reads `module`'s tree. Throws pybind11::error_already_set on a Python error.
  void rebuild(PyObject* module);

  const std::vector<PyObject*>& tensors() const { return tensors_; }
  // Every remembered tensor's current device into `agreement`: the per-forward loop.
  void add_devices(DeviceAgreement& agreement) const;

 private:
  void clear();
  // The device of every remembered tensor when they share one and none has a device of its own making
  // (device_custom()); nullopt otherwise, and then each is read through device().
  std::optional<c10::Device> shared_device() const;

  PyObject* root_ref_ = nullptr;  // a weak reference to the module: the snapshot must not keep it alive
  // Borrowed, in walk order (a module's __dict__, then its dicts, then its children's). No strong
  // references: they would keep a model whose submodules point back at it alive for ever (the garbage
  // collector cannot see references held here) and keep removed submodules' tensors in memory. A dict can
  // only go away after a dict before it in this order changed (its owner's __dict__ or its parent's
  // _modules), and the comparison stops there; with dict watchers, its death is itself an event.
  std::vector<PyObject*> dicts_;
#if PY_VERSION_HEX < 0x030C0000
  std::vector<std::uint64_t> versions_;
  std::uint64_t registration_epoch_ = 0;
#else
  std::uint64_t epoch_ = 0;
#endif
  std::vector<PyObject*> tensors_;  // borrowed: the watched dicts own them while they are unchanged
};

// The snapshot of `module` for assert_same_device and @same_device, kept between calls while the module
// lives (a weak reference's callback drops it when the module is freed) and rebuilt whenever it is stale.
// nullptr for an object that cannot be weakly referenced: the caller walks it instead.
const ModuleSnapshot* cached_snapshot(PyObject* module);

}  // namespace gpuguard::python
