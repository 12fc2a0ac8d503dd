"""`gpuguard explain` on gpuguard's own DeviceMismatchError: raised eagerly, at torch.compile time, and inside each of
the errors Dynamo wraps it in, on the real text this torch prints (each script below runs here and dies of it)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gg_testing.env import no_driver_env
from gg_testing.procs import CPU_BOUND_TEST_TIMEOUT_S, CPU_BOUND_TIMEOUT_S
from gpuguard.logs import explain, kinds_in

KIND = "gpuguard_device_mismatch"

# Each form raises a DeviceMismatchError and lets it end the script; before that it saves the error's own fix and
# cause (from find_device_mismatch or the raised error) for the test to compare with what explain reads.
SCRIPT = """
import json, sys, torch, gpuguard
from torch import nn
form, facts = sys.argv[1], sys.argv[2]
model = nn.Linear(4, 4)
meta = torch.zeros(2, 4, device="meta")

def save(error):
    with open(facts, "w") as f:
        json.dump({"fix": error.fix, "cause": error.cause, "message": str(error)}, f)

if form in ("eager", "compiled"):
    gpuguard.guard(model, deep=True)
    save(gpuguard.find_device_mismatch(model, meta))  # the report the hook raises names the input 'input'
    step = model if form == "eager" else torch.compile(model, fullgraph=True, backend="eager")
    try:
        step(meta)
    except gpuguard.DeviceMismatchError as error:
        save(error)
        raise
elif form == "observed":  # a DeviceMismatchError raised inside code Dynamo traces
    error = gpuguard.find_device_mismatch(model, meta)
    save(error)
    message, fix = str(error), error.fix

    @torch.compile(fullgraph=True, backend="eager")
    def step(x):
        raise gpuguard.DeviceMismatchError(message, fix=fix)
    step(meta)
elif form == "fake_tensor":  # a custom op whose fake implementation checks its inputs
    @torch.library.custom_op("gpuguard_test::scale", mutates_args=())
    def scale(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x * w

    @scale.register_fake
    def _(x, w):
        error = gpuguard.find_device_mismatch(x, w)
        if error is not None:
            save(error)
        gpuguard.assert_same_device(x, w)
        return torch.empty_like(x)

    @torch.compile(fullgraph=True, backend="eager")
    def step(x, w):
        return scale(x, w)
    step(meta, torch.ones(4))
elif form == "internal":  # raised by a function Dynamo runs while it traces
    save(gpuguard.find_device_mismatch(model, expected="meta"))

    @torch.compiler.assume_constant_result
    def check():
        gpuguard.assert_same_device(model, expected="meta")
        return 1

    @torch.compile(fullgraph=True, backend="eager")
    def step(x):
        return x * check()
    step(meta)
"""


def died_of(form: str, tmp_path: Path) -> tuple[str, dict]:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(SCRIPT))
    facts = tmp_path / "facts.json"
    proc = subprocess.run([sys.executable, str(script), form, str(facts)], env=no_driver_env(), capture_output=True,
                          text=True, timeout=CPU_BOUND_TIMEOUT_S)  # Dynamo compiling: CPU-bound
    assert proc.returncode != 0, proc.stdout
    return proc.stderr, json.loads(facts.read_text())


@pytest.mark.timeout(CPU_BOUND_TEST_TIMEOUT_S)
@pytest.mark.parametrize("form", ["eager", "compiled", "observed", "fake_tensor", "internal"])
def test_explain_reads_the_report_in_the_text_this_torch_prints(form, tmp_path):
    stderr, facts = died_of(form, tmp_path)
    assert facts["message"].splitlines()[0] in stderr
    assert kinds_in(stderr) == [KIND]
    (found,) = explain(stderr, match_local=False)
    assert found.occurrences == 1  # printed more than once (a chained exception, Dynamo's wrapper): one error
    assert set(found.devices) == {"cpu", "meta"}
    assert found.fix == facts["fix"]
    if facts["cause"]:
        assert found.cause.startswith(facts["cause"])
    at_compile = "while torch.compile traced the model (at compile time: no compiled step ran)"
    assert (at_compile in found.summary) == (form != "eager"), found.summary
    wrapped = "Dynamo reported gpuguard's error inside its own"
    assert (wrapped in found.cause) == (form in ("observed", "fake_tensor", "internal")), found.cause
    if form in ("eager", "compiled"):
        assert "layer '<root>' (Linear) is about to run on tensors from 2 devices (cpu, meta)" in found.summary


@pytest.mark.timeout(CPU_BOUND_TEST_TIMEOUT_S)
def test_every_rank_of_a_job_is_named(tmp_path):
    stderr, facts = died_of("compiled", tmp_path)
    # torch.distributed's excepthook prefixes each line of a rank's traceback with "[rank<r>]: "
    log = "".join(f"[rank{r}]: {line}\n" for r in (0, 1) for line in stderr.splitlines())
    (found,) = explain(log, match_local=False)
    assert found.ranks == (0, 1) and found.occurrences == 2
    assert found.fix == facts["fix"] and " on ranks 0, 1 while torch.compile traced" in found.summary


def test_a_likely_cause_line_of_someone_else_is_left_alone():
    assert kinds_in("Likely cause: the disk is full\nFix: delete something\n") == []
