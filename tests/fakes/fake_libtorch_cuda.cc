// Stand-in for torch's lib/libtorch_cuda.so (test fixture): needs libnccl.so.2 through torch's own RPATH, so that
// tests can see which NCCL gpuguard picks for such a torch, and which copy the "torch" then binds to.
extern "C" int ncclGetVersion(int* version);

// The version of the NCCL this library bound to (each copy of the fake NCCL can answer its own: tests/fakes/README).
extern "C" __attribute__((visibility("default"))) int gpuguardFakeTorchNcclVersion() {
  int version = 0;
  return ncclGetVersion(&version) == 0 ? version : -1;
}
