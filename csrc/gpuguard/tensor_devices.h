// Device consistency over at::Tensor: do a model's parameters, buffers and inputs share one device, and if
// not, which tensors sit where, grouped by device, with the likely cause and the fix.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gpuguard {

// Where a tensor came from: the report names each kind differently.
enum class TensorRole : std::uint8_t { kParameter, kBuffer, kInput };

// Decides, tensor by tensor, whether a set of tensors agrees on one device. Header-only and
// allocation-free because the per-forward check runs it over every parameter of a model; the names are
// only gathered (describe_mismatch) once it says no.
//
// PyTorch lets a 0-dim CPU tensor take part in an op with tensors on any device (a scalar), so such a
// tensor never disagrees; it only decides the device ("cpu") when nothing else is seen.
class DeviceAgreement {
 public:
  DeviceAgreement() = default;
  // With `expected`, every tensor must be on that device.
  explicit DeviceAgreement(std::optional<c10::Device> expected) : device_(expected) {}

  void add(const at::TensorBase& t) {
    if (!t.defined()) return;
    const c10::Device d = t.device();
    if (device_ && *device_ == d) [[likely]] return;
    if (d.is_cpu() && t.dim() == 0) {
      cpu_scalar_ = true;
      return;
    }
    if (!device_) {
      device_ = d;
      return;
    }
    agree_ = false;
  }

  bool agree() const { return agree_; }
  // Whether every tensor so far agrees and one of them (not only CPU scalars) put the device at `d`: then any
  // further tensor on `d` changes nothing.
  bool settled_on(c10::Device d) const { return agree_ && device_ && *device_ == d; }
  // The one device every tensor is on (meaningful only while agree()); nullopt when no tensor was seen.
  std::optional<c10::Device> device() const {
    if (device_) return device_;
    if (cpu_scalar_) return c10::Device(c10::kCPU);
    return std::nullopt;
  }

 private:
  std::optional<c10::Device> device_;
  bool cpu_scalar_ = false;
  bool agree_ = true;
};

// One tensor taking part in a check, with the name the report gives it: a qualified parameter or buffer
// name ("layers.0.weight"), or an input's place in the call ("x", "args[1]['mask']").
struct TensorEntry {
  TensorRole role = TensorRole::kInput;
  std::string name;
  at::Tensor tensor;
};

struct InputInfo {
  std::string name;
  std::vector<std::int64_t> shape;
  std::string dtype;  // "float32"
};

// The tensors found on one device.
struct DeviceGroup {
  c10::Device device{c10::kCPU};
  std::vector<std::string> parameters;  // qualified names, in the module's order
  std::vector<std::string> buffers;
  std::vector<InputInfo> inputs;
  std::vector<std::string> summary;  // parameters and buffers with runs compressed ("layers.0-15.*")
};

// What the check was about, for the wording of the report.
struct CheckContext {
  std::optional<c10::Device> expected;
  std::string module;      // the module's class name ("Net"); empty when no module took part
  std::string layer;       // guard(deep=True): the qualified name of the layer being entered ("layers.2")
  std::string layer_type;  // its class name ("Linear")

  // guard(deep=True) only: the whole model around the layer, so that the fix is right for a model placed
  // across devices (a framework's device map, pipeline stages) as well as for a one-device model.
  std::vector<c10::Device> model_devices;  // every device of the model's parameters and buffers, the first
                                           // parameter's first; empty: not known
  std::string first_parameter;             // the model's first parameter (its first buffer if it has none),
                                           // the one next(model.parameters()) gives: "embed.weight"
  std::size_t others_on_layer_device = 0;  // the model's tensors on the layer's device that are not the layer's
  // the input on another device is one the model's caller passed as it is (or the layer was called directly),
  // not an activation made inside the model
  bool input_from_caller = true;
};

struct DeviceReport {
  bool consistent = true;
  std::optional<c10::Device> device;  // the common device when consistent (nullopt: no tensors)
  std::vector<DeviceGroup> groups;    // when inconsistent: the expected / the module's device first
  std::string message;                // when inconsistent: what is where, the likely cause, the fix
  std::string cause;                  // when inconsistent: the message's "Likely cause: ..." line(s)
  std::string fix;                    // when inconsistent: the message's last line, "Fix: ...", word for word
};

// The full, name-rich check. Applies the same rules as DeviceAgreement.
DeviceReport check_devices(const std::vector<TensorEntry>& entries, const CheckContext& context);

// Compresses qualified names for a report. A whole subtree present in `names` becomes "prefix.*" when
// `universe` (every parameter and buffer name of the module) has nothing else under that prefix, and runs
// of consecutive indices become ranges: layers.0.weight … layers.15.bias -> "layers.0-15.*".
std::vector<std::string> compress_names(const std::vector<std::string>& names,
                                        const std::vector<std::string>& universe);

// "cuda:1", "cpu", "meta".
std::string device_name(c10::Device device);

}  // namespace gpuguard
