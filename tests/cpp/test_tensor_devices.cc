// The device check over at::Tensor: agreement rules, name compression, and the grouped report's wording.
// cpu and meta are two real, different devices, so none of this needs a GPU.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <functional>
#include <sstream>

#include "gpuguard/tensor_devices.h"

namespace {

using gpuguard::CheckContext;
using gpuguard::DeviceAgreement;
using gpuguard::TensorEntry;
using gpuguard::TensorRole;

at::Tensor on_cpu(std::vector<int64_t> shape = {2, 4}) { return at::zeros(shape); }
at::Tensor on_meta(std::vector<int64_t> shape = {2, 4}) { return at::empty(shape, at::device(at::kMeta)); }

std::vector<TensorEntry> layers(int n, const std::function<at::Tensor(int)>& make) {
  std::vector<TensorEntry> out;
  for (int i = 0; i < n; ++i) {
    out.push_back({TensorRole::kParameter, "layers." + std::to_string(i) + ".weight", make(i)});
    out.push_back({TensorRole::kParameter, "layers." + std::to_string(i) + ".bias", make(i)});
  }
  return out;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

TEST(DeviceAgreement, OneDeviceAgreesAndIsReturned) {
  DeviceAgreement a;
  a.add(on_meta());
  a.add(on_meta({3}));
  EXPECT_TRUE(a.agree());
  EXPECT_EQ(a.device(), c10::Device(c10::kMeta));
}

TEST(DeviceAgreement, TwoDevicesDisagree) {
  DeviceAgreement a;
  a.add(on_cpu());
  a.add(on_meta());
  EXPECT_FALSE(a.agree());
}

TEST(DeviceAgreement, ACpuScalarGoesWithAnyDeviceAsInPyTorch) {
  DeviceAgreement a;
  a.add(at::scalar_tensor(2.0));
  a.add(on_meta());
  EXPECT_TRUE(a.agree());
  EXPECT_EQ(a.device(), c10::Device(c10::kMeta));

  DeviceAgreement only_scalar;
  only_scalar.add(at::scalar_tensor(2.0));
  EXPECT_EQ(only_scalar.device(), c10::Device(c10::kCPU));

  DeviceAgreement one_element;  // shape [1] is not a scalar
  one_element.add(on_meta());
  one_element.add(on_cpu({1}));
  EXPECT_FALSE(one_element.agree());
}

TEST(DeviceAgreement, ExpectedDeviceMustHoldEveryTensor) {
  DeviceAgreement a(c10::Device(c10::kMeta));
  EXPECT_EQ(a.device(), c10::Device(c10::kMeta));  // nothing seen yet: the expected device
  a.add(on_cpu());
  EXPECT_FALSE(a.agree());
}

// settled_on(d): a further tensor on d changes nothing (guard()'s scan stops after the first tensor then)
TEST(DeviceAgreement, SettledOnlyOnceATensorThatIsNoScalarPlacedIt) {
  DeviceAgreement scalar_first;
  scalar_first.add(at::scalar_tensor(2.0));
  EXPECT_FALSE(scalar_first.settled_on(c10::Device(c10::kCPU)));  // a CPU tensor of shape [2, 4] may still disagree
  scalar_first.add(on_cpu());
  EXPECT_TRUE(scalar_first.settled_on(c10::Device(c10::kCPU)));
  EXPECT_FALSE(scalar_first.settled_on(c10::Device(c10::kMeta)));

  DeviceAgreement expected_meta(c10::Device(c10::kMeta));
  expected_meta.add(on_cpu());
  EXPECT_FALSE(expected_meta.settled_on(c10::Device(c10::kCPU)));  // disagrees already
  EXPECT_FALSE(expected_meta.settled_on(c10::Device(c10::kMeta)));
}

TEST(DeviceAgreement, NothingSeenHasNoDeviceAndUndefinedTensorsAreSkipped) {
  DeviceAgreement a;
  a.add(at::Tensor());
  EXPECT_TRUE(a.agree());
  EXPECT_FALSE(a.device().has_value());
}

TEST(CompressNames, WholeSubtreesAndIndexRuns) {
  std::vector<std::string> names;
  for (int i = 0; i < 16; ++i) {
    names.push_back("layers." + std::to_string(i) + ".weight");
    names.push_back("layers." + std::to_string(i) + ".bias");
  }
  auto universe = names;
  universe.push_back("head.weight");
  EXPECT_EQ(gpuguard::compress_names(names, universe), std::vector<std::string>{"layers.*"});
  std::vector<std::string> first_half(names.begin(), names.begin() + 16);
  EXPECT_EQ(gpuguard::compress_names(first_half, universe), std::vector<std::string>{"layers.0-7.*"});
  EXPECT_EQ(gpuguard::compress_names({"layers.3.weight", "layers.4.weight", "layers.9.weight"}, universe),
            (std::vector<std::string>{"layers.3-4.weight", "layers.9.weight"}));
  // a lone tensor stays named; "01" is a name, not an index
  EXPECT_EQ(gpuguard::compress_names({"head.weight"}, universe), std::vector<std::string>{"head.weight"});
  EXPECT_EQ(gpuguard::compress_names({"b.01.w", "b.02.w"}, {"b.01.w", "b.02.w", "b.01.x"}),
            (std::vector<std::string>{"b.01.w", "b.02.w"}));
}

TEST(CheckDevices, ConsistentTensorsGiveTheDeviceAndNoReport) {
  auto entries = layers(3, [](int) { return on_meta(); });
  auto report = gpuguard::check_devices(entries, {});
  EXPECT_TRUE(report.consistent);
  EXPECT_EQ(report.device, c10::Device(c10::kMeta));
  EXPECT_TRUE(report.message.empty());
  EXPECT_TRUE(report.groups.empty());
}

TEST(CheckDevices, InputsElsewhereAreNamedWithShapeAndTheFixMovesThem) {
  auto entries = layers(16, [](int) { return on_meta(); });
  entries.push_back({TensorRole::kBuffer, "norm.running_mean", on_meta({4})});
  entries.push_back({TensorRole::kInput, "x", on_cpu({8, 4})});
  CheckContext ctx;
  ctx.module = "Net";
  auto report = gpuguard::check_devices(entries, ctx);
  ASSERT_FALSE(report.consistent);
  ASSERT_EQ(report.groups.size(), 2u);
  EXPECT_EQ(report.groups[0].device, c10::Device(c10::kMeta));
  EXPECT_EQ(report.groups[0].parameters.size(), 32u);
  EXPECT_EQ(report.groups[0].summary, (std::vector<std::string>{"layers.*", "norm.running_mean"}));
  EXPECT_EQ(report.groups[1].inputs[0].shape, (std::vector<int64_t>{8, 4}));
  EXPECT_EQ(report.groups[1].inputs[0].dtype, "float32");
  auto l = lines(report.message);
  ASSERT_EQ(l.size(), 5u);
  EXPECT_EQ(l[0], "gpuguard: tensors that must share one device are on 2 devices: meta, cpu.");
  EXPECT_EQ(l[1], "  meta: 32 parameters, 1 buffer of Net: layers.*, norm.running_mean");
  EXPECT_EQ(l[2], "  cpu: 1 input: x (shape [8, 4], float32)");
  EXPECT_EQ(l[3].rfind("Likely cause: the inputs were put on a different device than the model", 0), 0u);
  EXPECT_EQ(l[4], "Fix: move the inputs to the model's device: x = x.to(\"meta\"), or take the device from the "
                  "model: x.to(next(model.parameters()).device).");
  EXPECT_EQ(report.fix, l[4]);
  EXPECT_EQ(report.cause, l[3]);
}

TEST(CheckDevices, ASplitModelIsSaidToBeSplitAndIsNeverMovedToOneDevice) {
  auto entries = layers(16, [](int i) { return i < 12 ? on_cpu({4}) : on_meta({4}); });
  entries.push_back({TensorRole::kInput, "ids", on_meta({2, 4})});  // inputs moved by hand to the last device
  CheckContext ctx;
  ctx.module = "Net";
  auto report = gpuguard::check_devices(entries, ctx);
  auto l = lines(report.message);
  EXPECT_EQ(l[0], "gpuguard: the model (Net) is split: its parameters and buffers are on 2 devices (cpu, meta), so "
                  "no one device holds it and its inputs.");
  EXPECT_EQ(l[1], "  cpu: 24 parameters of Net: layers.0-11.*");
  EXPECT_EQ(l[2], "  meta: 8 parameters of Net: layers.12-15.*");
  EXPECT_EQ(l[3], "  meta: 1 input: ids (shape [2, 4], float32)");
  EXPECT_EQ(report.fix.find("model.to("), std::string::npos);
  EXPECT_EQ(report.fix.rfind("Fix: if the split is deliberate, leave placement to the framework: put the inputs "
                             "where its first parameter (layers.0.weight) is: ids = ids.to(\"cpu\") "
                             "(next(model.parameters()).device); never move the whole model to one device", 0),
            0u);
  EXPECT_NE(report.fix.find("CUDA_VISIBLE_DEVICES=0"), std::string::npos);
}

TEST(CheckDevices, AFewStrayPartsAreMovedOneByOneToTheRest) {
  std::vector<TensorEntry> entries = {{TensorRole::kParameter, "embed.weight", on_meta()},
                                      {TensorRole::kParameter, "blocks.0.weight", on_meta()},
                                      {TensorRole::kParameter, "blocks.1.weight", on_meta()},
                                      {TensorRole::kParameter, "head.weight", on_cpu()},
                                      {TensorRole::kParameter, "head.bias", on_cpu({4})}};
  auto report = gpuguard::check_devices(entries, {});
  EXPECT_NE(report.fix.find("If the split is a mistake, move the stray part to the rest: "
                            "model.get_submodule(\"head\").to(\"meta\")."),
            std::string::npos);
}

// guard(deep=True): a layer's report with the rest of the model described (device lists as a GPU job has
// them; the layer's own tensors and inputs on cpu and meta, the two devices there are without a GPU).
CheckContext layer_context(std::vector<c10::Device> model, bool from_caller, std::size_t others = 1) {
  CheckContext ctx;
  ctx.module = "Linear";
  ctx.layer = "blocks.1.proj";
  ctx.layer_type = "Linear";
  ctx.model_devices = std::move(model);
  ctx.first_parameter = "embed.weight";
  ctx.input_from_caller = from_caller;
  ctx.others_on_layer_device = others;
  return ctx;
}

std::vector<TensorEntry> layer_on(at::Tensor weight, at::Tensor input) {
  return {{TensorRole::kParameter, "weight", std::move(weight)}, {TensorRole::kInput, "x", std::move(input)}};
}

TEST(CheckDevices, DeepOneDeviceModelWithTheCallersInputsElsewhereMovesTheInputs) {
  auto report = gpuguard::check_devices(layer_on(on_meta(), on_cpu()), layer_context({c10::kMeta}, true));
  EXPECT_EQ(report.fix, "Fix: move the inputs to the model's device before calling it: x = x.to(\"meta\"), or "
                        "x.to(next(model.parameters()).device).");
}

TEST(CheckDevices, DeepSplitModelWithTheCallersInputsPutsThemWhereTheFirstParameterIs) {
  const std::vector<c10::Device> model = {c10::kMeta, c10::Device(c10::kCUDA, 1), c10::kCPU};
  auto report = gpuguard::check_devices(layer_on(on_meta(), on_cpu()), layer_context(model, true));
  EXPECT_EQ(report.cause, "Likely cause: the model is placed across 3 devices (meta, cuda:1, cpu), its first parameter "
                          "(embed.weight) on meta, but the inputs were put on cpu by hand.");
  EXPECT_EQ(report.fix.rfind("Fix: leave placement to whatever split the model and put the inputs where its first "
                             "parameter is: x = x.to(\"meta\")", 0), 0u);
  EXPECT_EQ(report.fix.find("model.to("), std::string::npos);
  // the layer is not on the first parameter's device: the forward must hand the caller's input over
  auto later = gpuguard::check_devices(layer_on(on_cpu(), on_meta()), layer_context(model, true));
  EXPECT_EQ(later.fix.rfind("Fix: move it in the parent's forward before calling this layer: x = x.to(\"cpu\")", 0),
            0u);
}

TEST(CheckDevices, DeepActivationMovedElsewhereInAModelCollapsedToOneDeviceBlamesTheMove) {
  // every parameter on cpu (a model.to("cpu") after a framework placed it), the activation moved to meta
  auto report = gpuguard::check_devices(layer_on(on_cpu(), on_meta()), layer_context({c10::kCPU}, false));
  EXPECT_EQ(report.cause.rfind("Likely cause: the model moves this activation to meta itself", 0), 0u);
  EXPECT_NE(report.cause.find("all of its parameters and buffers are on cpu: the whole model was moved to one device"),
            std::string::npos);
  EXPECT_EQ(report.fix.rfind("Fix: leave placement to the framework: do not move a model it placed", 0), 0u);
  EXPECT_EQ(report.fix.find("get_submodule"), std::string::npos);
  // the activation on the CPU of a model on an accelerator: made in forward without device=
  auto made = gpuguard::check_devices(layer_on(on_meta(), on_cpu()), layer_context({c10::kMeta}, false));
  EXPECT_EQ(made.cause.rfind("Likely cause: this input was made inside the model's forward on the CPU", 0), 0u);
  EXPECT_NE(made.fix.find("device=x.device"), std::string::npos);
}

TEST(CheckDevices, DeepSplitModelTellsALayerAloneFromAStageMissingItsHandOver) {
  const std::vector<c10::Device> model = {c10::kCPU, c10::kMeta};
  auto alone = gpuguard::check_devices(layer_on(on_meta(), on_cpu()), layer_context(model, false, 0));
  EXPECT_EQ(alone.fix, "Fix: put the layer with the layers before it: "
                       "model.get_submodule(\"blocks.1.proj\").to(\"cpu\").");
  auto stage = gpuguard::check_devices(layer_on(on_meta(), on_cpu()), layer_context(model, false, 6));
  EXPECT_EQ(stage.cause, "Likely cause: the model is split across devices and the part on meta starts at "
                         "'blocks.1.proj', but nothing moves the activation from cpu to meta before it.");
  EXPECT_EQ(stage.fix.find("get_submodule"), std::string::npos);
  // an activation on a device none of the model is on was made there inside the forward
  auto nowhere = gpuguard::check_devices(layer_on(on_meta(), on_cpu()),
                                         layer_context({c10::kMeta, c10::Device(c10::kCUDA, 0)}, false));
  EXPECT_EQ(nowhere.cause.rfind("Likely cause: this input was made inside the model's forward on cpu, where none "
                                "of the model is", 0), 0u);
}

TEST(CheckDevices, ExpectedDeviceCountsWhatIsElsewhere) {
  std::vector<TensorEntry> entries = {{TensorRole::kParameter, "w", on_cpu()},
                                      {TensorRole::kInput, "tensors[0]", on_cpu({3})}};
  CheckContext ctx;
  ctx.expected = c10::Device(c10::kMeta);
  auto report = gpuguard::check_devices(entries, ctx);
  auto l = lines(report.message);
  EXPECT_EQ(l[0], "gpuguard: expected every tensor on meta, but 2 tensors are elsewhere (cpu).");
  EXPECT_EQ(l.back(), "Fix: move them to meta: model.to(\"meta\"); x = x.to(\"meta\").");
}

TEST(CheckDevices, DeepLayerReportNamesTheLayerAndHowToMoveIt) {
  std::vector<TensorEntry> entries = {{TensorRole::kParameter, "weight", on_meta({4, 4})},
                                      {TensorRole::kParameter, "bias", on_meta({4})},
                                      {TensorRole::kInput, "input", on_cpu({2, 4})}};
  CheckContext ctx;
  ctx.module = "Linear";
  ctx.layer = "layers.2";
  ctx.layer_type = "Linear";
  auto report = gpuguard::check_devices(entries, ctx);
  auto l = lines(report.message);
  EXPECT_EQ(l[0], "gpuguard: layer 'layers.2' (Linear) is about to run on tensors from 2 devices (meta, cpu); "
                  "PyTorch would stop inside this layer with \"Expected all tensors to be on the same device\".");
  EXPECT_EQ(l[1], "  meta: 2 parameters of 'layers.2': weight, bias");
  EXPECT_EQ(l[2], "  cpu: 1 input: input (shape [2, 4], float32)");
  EXPECT_NE(l.back().find("model.get_submodule(\"layers.2\").to(\"cpu\")"), std::string::npos);
}

TEST(CheckDevices, CpuScalarsAreNeverListed) {
  std::vector<TensorEntry> entries = {{TensorRole::kParameter, "w", on_meta()},
                                      {TensorRole::kBuffer, "steps", at::scalar_tensor(1)},
                                      {TensorRole::kInput, "x", on_cpu()}};
  auto report = gpuguard::check_devices(entries, {});
  ASSERT_EQ(report.groups.size(), 2u);
  EXPECT_TRUE(report.groups[1].buffers.empty());
  EXPECT_EQ(report.message.find("steps"), std::string::npos);
}

}  // namespace
