"""explain's recognisers behind one interface: the registry decides kinds, reading order and help; every error's
``fix`` is its message's fix sentence(s); placement.nccl_check asks the duplicate-GPU recogniser, not a substring."""

from __future__ import annotations

import pickle
import re
from types import SimpleNamespace

import pytest

from gpuguard.binding.device_choice import check_visibility
from gpuguard.binding.visible_devices import parse_visible_devices
from gpuguard.cli import build_parser
from gpuguard.errors import DuplicateDeviceError, GpuGuardError, LaunchEnvironmentError
from gpuguard.logs import HELP, KINDS, RECOGNISERS, LogExplainer, Recogniser, format_diagnoses, kinds_in
from gpuguard.logs.registry import READING_ORDER, _reading_order
from gpuguard.placement import nccl_check
from gpuguard.placement.verdict import raise_for

pytestmark = pytest.mark.version_independent  # CI runs this file on the oldest corner only (pyproject's markers)

SAMPLES = {
    "duplicate_gpu": "[rank1]: Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 10000",
    "invalid_device_ordinal": "[rank9]: RuntimeError: CUDA error: invalid device ordinal",
    "device_mismatch": "RuntimeError: Expected all tensors to be on the same device, but found at least two "
                       "devices, cuda:3 and cuda:1!",
    "gpuguard_device_mismatch": "gpuguard.errors.DeviceMismatchError: gpuguard: tensors that must share one device "
                                "are on 2 devices: cuda:1, cuda:3.",
    # torch's out-of-memory message, one per pattern (the texts users posted: tests/python/test_explain_oom.py)
    "oom_stray_contexts": "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.10 GiB of "
                          "which 4.00 MiB is free. Process 11 has 414.00 MiB memory in use. Including non-PyTorch "
                          "memory, this process has 78.60 GiB memory in use. Of the allocated memory 78.00 GiB is "
                          "allocated by PyTorch",
    "oom_other_process": "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.10 GiB of "
                         "which 4.00 MiB is free. Process 11 has 40.00 GiB memory in use. Including non-PyTorch "
                         "memory, this process has 39.00 GiB memory in use. Of the allocated memory 38.00 GiB is "
                         "allocated by PyTorch",
    "oom_genuine": "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.10 GiB of which "
                   "4.00 MiB is free. Including non-PyTorch memory, this process has 79.00 GiB memory in use. Of the "
                   "allocated memory 78.00 GiB is allocated by PyTorch",
    "nccl_first_collective_hang": "[rank0]: [Rank 0] Timeout at NCCL work: 1, last enqueued NCCL work: 1, last "
                                  "completed NCCL work: -1.",
    "nccl_timeout": "[Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, "
                    "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600017 milliseconds before timing out.",
    "ray_gpu_count": "ValueError: Attempting to start raylet with 8 GPUs, but CUDA_VISIBLE_DEVICES contains ['0'].",
    "gpuguard_stall": '{"gpuguard_stall": {"kind": "rank_behind", "op": "ALL_REDUCE", "stuck_ranks": [2]}}',
    "nccl_watchdog_stuck": "[PG ID 0 PG GUID 0(default_pg) Rank 3] ProcessGroupNCCL's watchdog got stuck for 480 "
                           "seconds without making progress in monitoring enqueued collectives.",
    "flight_recorder_missing_ranks": "Not all ranks joining collective, sequence number: 4",
    "flight_recorder_dumped": "[Rank 0] ProcessGroupNCCL dumping nccl trace to /tmp/trace_0",
    "nccl_ras_missing": "  The missing rank: 21",
    "nccl_ras_behind": "  6 ranks have launched up to operation 6649",
    "nccl_ras_diagnostics": "node042:12345 NCCL DIAG [INFO] NCCL environment: NCCL_DEBUG=WARN on rank(s) {4,5,6,7}",
    "torchrun_failures": "  rank      : 5 (local_rank: 1)",
}


def test_kinds_and_help_come_from_the_registry_in_its_order():
    assert KINDS == ("duplicate_gpu", "invalid_device_ordinal", "device_mismatch", "gpuguard_device_mismatch",
                     "oom_stray_contexts", "oom_other_process", "oom_genuine", "nccl_first_collective_hang",
                     "nccl_timeout", "ray_gpu_count", "gpuguard_stall", "nccl_watchdog_stuck",
                     "flight_recorder_missing_ranks", "flight_recorder_dumped", "nccl_ras_missing", "nccl_ras_behind",
                     "nccl_ras_diagnostics", "torchrun_failures")
    assert KINDS == tuple(k for r in RECOGNISERS for k in r.kinds)
    assert HELP == ", ".join(r.help for r in RECOGNISERS)
    assert f"It explains: {HELP}. It does not guess" in format_diagnoses([], 3)
    explain_parser = build_parser()._subparsers._group_actions[0].choices["explain"]  # type: ignore[union-attr]
    assert HELP in " ".join(explain_parser.description.split())


def test_every_recogniser_fills_in_the_interface():
    for r in RECOGNISERS:
        assert isinstance(r, Recogniser)
        assert r.kinds and r.keywords and r.patterns and r.help
        assert all(isinstance(p, re.Pattern) for p in r.patterns)
        assert set(r.yields_to) <= set(KINDS)


@pytest.mark.parametrize("kind", list(SAMPLES))
def test_each_sample_is_read_by_its_own_recogniser_and_its_keyword_is_in_every_match(kind):
    assert kinds_in(SAMPLES[kind]) == [kind]
    owner = next(r for r in RECOGNISERS if kind in r.kinds)
    matches = [m.group(0) for p in owner.patterns for m in [p.search(SAMPLES[kind])] if m]
    assert matches and all(any(k in m for k in owner.keywords) for m in matches)


def test_all_kinds_in_one_log_come_out_in_report_order():
    explainer = LogExplainer(match_local=False)
    for kind in reversed(list(SAMPLES)):
        explainer.feed(SAMPLES[kind] + "\n")
    assert [d.kind for d in explainer.diagnoses()] == list(KINDS) == explainer.kinds()


def test_a_line_two_recognisers_match_goes_to_the_one_read_first():
    line = SAMPLES["device_mismatch"] + " (CUDA error: invalid device ordinal)"
    assert kinds_in(line) == ["device_mismatch"]
    names = [type(r).__name__ for r in READING_ORDER]
    assert names.index("DeviceMismatch") < names.index("InvalidDeviceOrdinal")


def test_reading_order_moves_a_recogniser_behind_those_it_yields_to():
    def fake(name, kinds, yields_to=()):
        return SimpleNamespace(name=name, kinds=kinds, yields_to=yields_to)
    a, b, c, d = fake("a", ("a",)), fake("b", ("b",), ("c",)), fake("c", ("c",)), fake("d", ("d",))
    assert [r.name for r in _reading_order((a, b, c, d))] == ["a", "c", "b", "d"]
    assert [r.name for r in _reading_order((a, c, b, d))] == ["a", "c", "b", "d"]


def test_kinds_in_never_builds_diagnoses_or_touches_cuda(monkeypatch):
    for r in RECOGNISERS:
        monkeypatch.setattr(type(r), "build", lambda *a, **k: pytest.fail("built"))
    assert kinds_in(SAMPLES["duplicate_gpu"]) == ["duplicate_gpu"]
    assert kinds_in("all good\n") == []


# ---- fix on GpuGuardError -------------------------------------------------------------------------------

def test_fix_is_the_end_of_the_message_and_survives_pickling():
    with pytest.raises(LaunchEnvironmentError) as err:
        check_visibility(parse_visible_devices("2,2,3"), [], driver_loaded=False)
    exc = err.value
    assert exc.fix.startswith("List each GPU once, by index or UUID")
    assert str(exc).endswith(" " + exc.fix)
    assert exc.without_fix() == str(exc)[: -len(exc.fix)].rstrip()
    assert exc.details["variable"] == "CUDA_VISIBLE_DEVICES" and "fix" not in exc.details
    again = pickle.loads(pickle.dumps(exc))
    assert again.fix == exc.fix and again.variable == "CUDA_VISIBLE_DEVICES"


def test_an_error_without_a_fix_has_an_empty_one():
    exc = GpuGuardError("something broke", where="here")
    assert exc.fix == "" and exc.without_fix() == "something broke" and exc.where == "here"


def test_nccl_duplicate_verdict_is_decided_by_explain_and_raises_with_its_fix():
    me = SimpleNamespace(group="default", world_size=2, rank=1)
    failure = {"rank": 1, "host": "n1", "verdict": "failed", "stage": "init", "message": "ncclInvalidUsage",
               "last_error": SAMPLES["duplicate_gpu"]}
    verdict = nccl_check._verdict_from([failure], 1, me, 10.0)
    assert verdict.kind == "duplicate"
    with pytest.raises(DuplicateDeviceError) as err:
        raise_for(verdict, me)
    assert err.value.fix == nccl_check.DUPLICATE_FIX
    assert str(err.value).endswith("\nFix: " + nccl_check.DUPLICATE_FIX)
    # NCCL's words quoted in a grep are not NCCL saying it
    failure["last_error"] = "grep 'Duplicate GPU detected' log.txt"
    assert nccl_check._verdict_from([failure], 1, me, 10.0).kind == "error"
