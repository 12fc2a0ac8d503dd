"""The tensor checks: assert_same_device, @same_device, guard() (tensor_devices.py), their Python port
(_python_checks.py) and which of the two runs (implementation.py), and their halves under torch.compile
(traced_checks.py, compile_time.py). Imports nothing, so that importing one of its modules loads only what that
module needs."""
