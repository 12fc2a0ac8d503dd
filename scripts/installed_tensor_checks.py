"""Proves that an installed gpuguard runs its tensor checks in C++: run by scripts/check_source_install.sh, and
called (main) by scripts/check_wheel_install.sh where the wheel has the installed torch's variant, in their fresh
venvs, after the install, away from the clone.
  python installed_tensor_checks.py LABEL [DOCTOR_JSON]
LABEL prefixes each line; DOCTOR_JSON is `gpuguard doctor --json`'s output, whose "tensor checks" must say C++.
The checks: gpuguard._libtorch serves them, one passes and one mismatch is reported, and the Python fallback's warning
(had the compiled checks not loaded) is an error.
"""

from __future__ import annotations

import json
import sys
import warnings

import torch

import gpuguard
from gpuguard.tensors.implementation import tensor_checks


def main(label: str, doctor_json: str | None = None) -> None:
    def fail(why: str) -> None:
        raise SystemExit(f"{label}: {why}")

    if doctor_json:
        said = json.load(open(doctor_json))["versions"]["tensor checks"]
        print(f"{label}: gpuguard doctor: tensor checks: {said}")
        if not said.startswith("C++"):
            fail(f"gpuguard doctor says the tensor checks run in {said}, not in C++")
    warnings.simplefilter("error", gpuguard.GpuGuardWarning)
    model = torch.nn.Linear(4, 2)
    print(f"{label}: assert_same_device ->", gpuguard.assert_same_device(model, torch.ones(3, 4)))
    try:
        gpuguard.assert_same_device(model, torch.ones(3, 4, device="meta"))
    except gpuguard.DeviceMismatchError as err:
        print(f"{label}: a mismatch is reported:", str(err).splitlines()[0])
    else:
        fail("an input on another device passed assert_same_device")
    module = tensor_checks()
    if module.__name__ != "gpuguard._libtorch":
        fail(f"the tensor checks came from {module.__name__}, not gpuguard._libtorch")
    print(f"{label}: gpuguard._libtorch from {module.__file__}, under torch {torch.__version__}")


if __name__ == "__main__":
    if not 2 <= len(sys.argv) <= 3:
        sys.exit("usage: python installed_tensor_checks.py LABEL [DOCTOR_JSON]")
    main(*sys.argv[1:])
