"""The records that cross C++/Python (gpuguard._core classes): constructor, ==, repr, as_dict, pickling, and the stub."""

from __future__ import annotations

import ast
import json
import pickle
from pathlib import Path

import pytest

import gpuguard
from gpuguard import _core
from gpuguard.placement import RankIdentity

pytestmark = pytest.mark.version_independent  # CI runs this file on the oldest corner only (pyproject's markers)

STUB = Path(gpuguard.__file__).with_name("_core.pyi")
RECORDS = ["ErrorInfo", "Device", "CudaStatus", "VisibleEntry", "VisibilityProblem", "VisibleDevices",
           "IdentityRecord", "SharedDevice", "PlacementReport", "NcclStatus", "NcclProbeOutcome",
           "DriverInitRecord", "HostFingerprint", "PeerCopyResult", "GpuProcess", "GpuUsage", "NvmlStatus"]


def _stub_classes() -> dict[str, tuple[set[str], set[str]]]:
    """Class -> (annotated attributes, properties) as _core.pyi declares them."""
    out = {}
    for node in ast.parse(STUB.read_text()).body:
        if isinstance(node, ast.ClassDef):
            attrs = {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
            props = {n.name for n in node.body if isinstance(n, ast.FunctionDef)
                     and any(isinstance(d, ast.Name) and d.id == "property" for d in n.decorator_list)}
            out[node.name] = (attrs - {"_fields"}, props)
    return out


@pytest.mark.parametrize("name", RECORDS)
def test_the_stub_types_every_field_of_each_record_and_nothing_else(name):
    attrs, props = _stub_classes()[name]
    fields = set(getattr(_core, name)._fields)
    assert attrs <= fields, f"_core.pyi declares {sorted(attrs - fields)} that {name} lacks"
    assert fields <= attrs | props, f"{name} fields {sorted(fields - attrs - props)} are not typed in _core.pyi"


def test_identity_record_is_built_by_keyword_compared_pickled_and_dumped():
    me = RankIdentity(rank=3, world_size=8, group="g", cuda_visible_devices="3", gpu_fraction=0.5, ray_gpu_ids="3")
    assert me.rank == 3 and me.local_rank == -1 and me.failure_kind is None  # C++ defaults for the rest
    assert me == RankIdentity(rank=3, world_size=8, group="g", cuda_visible_devices="3", gpu_fraction=0.5,
                              ray_gpu_ids="3")
    assert me != RankIdentity(rank=4, world_size=8)
    assert pickle.loads(pickle.dumps(me)) == me
    assert RankIdentity(3, 8, "g") == RankIdentity(rank=3, world_size=8, group="g")  # the old dataclass order
    data = me.as_dict()
    assert list(data) == list(RankIdentity._fields) and data["cuda_visible_devices"] == "3"
    assert json.loads(json.dumps(data)) == data
    assert repr(me).startswith("IdentityRecord(rank=3, world_size=8, group='g',")
    with pytest.raises(TypeError, match="unexpected keyword argument 'rnk'"):
        RankIdentity(rnk=1)
    with pytest.raises(TypeError, match="IdentityRecord.rank cannot be 'x'"):
        RankIdentity(rank="x")
    with pytest.raises(TypeError, match="multiple values for argument 'rank'"):
        RankIdentity(1, rank=2)


def test_device_and_cuda_status_keep_their_attributes_and_json():
    d = gpuguard.Device(0, "NVIDIA H100", "GPU-1", "0000:18:00.0", 3 << 30, (9, 0))
    assert d.total_memory_gib == 3.0 and d.compute_capability == (9, 0) and d.multiprocessors == 0
    assert d.as_dict() == {"index": 0, "name": "NVIDIA H100", "uuid": "GPU-1", "pci_bus_id": "0000:18:00.0",
                           "total_memory": 3 << 30, "compute_capability": [9, 0], "multiprocessors": 0}
    assert pickle.loads(pickle.dumps(d)) == d
    st = gpuguard.CudaStatus(driver_version=12040, visible_devices_at_init="0,1")
    assert st.driver_version_string == "12.4" and gpuguard.CudaStatus().driver_version_string == "unknown"
    assert st.as_dict()["visible_devices_at_init"] == "0,1" and gpuguard.CudaStatus().visible_devices_at_init is None


def test_visible_devices_nest_their_entries_and_problem():
    v = _core.parse_visible_devices("0,GPU-abc,0")
    assert [e.kind for e in v.entries] == ["index", "uuid_prefix"]
    assert (v.entries[0].index, v.entries[0].uuid, v.entries[1].index, v.entries[1].uuid) == (0, None, None, "abc")
    assert (v.problem.kind, v.problem.position, v.problem.same_as) == ("duplicate", 2, 0)
    assert v.describe() == "CUDA_VISIBLE_DEVICES='0,GPU-abc,0'"
    data = json.loads(json.dumps(v.as_dict()))
    assert data["entries"][1] == {"kind": "uuid_prefix", "text": "GPU-abc", "index": None, "uuid": "abc"}
    assert data["problem"]["kind"] == "duplicate"
    unset = _core.parse_visible_devices(None)
    assert unset.raw is None and unset.problem is None and unset.describe() == "CUDA_VISIBLE_DEVICES unset"
    assert pickle.loads(pickle.dumps(v)) == v
    with pytest.raises(ValueError, match="unknown entry kind 'nonsense'"):
        _core.VisibleEntry(kind="nonsense")


def test_placement_report_rows_carry_records_ranks_and_hosts():
    uuid = "GPU-5a6b0000-0000-4000-8000-000000000000"
    records = [RankIdentity(rank=r, world_size=2, local_rank=r, hostname="n1", gpu_uuid=uuid, gpu_index=0,
                            pci_bus_id="0000:18:00.0", pid=100 + r).encode() for r in range(2)]
    report = _core.analyze_placement(records)
    assert report.severity == "error" and report.shared_devices_total == 1
    row = report.shared[0]
    assert (row.ranks, row.hosts, row.gpu_uuid) == ([0, 1], ["n1", "n1"], uuid)
    assert [r.pid for r in row.records] == [100, 101]
    assert json.loads(json.dumps(report.as_dict()))["shared"][0]["records"][1]["rank"] == 1


def test_nccl_outcome_has_no_error_when_ok():
    ok = _core.NcclProbeOutcome(verdict="ok", error=_core.ErrorInfo(detail="ignored"))
    assert ok.ok and ok.error is None and ok.as_dict()["error"] is None
    failed = _core.NcclProbeOutcome(verdict="timed out", stage="init", error=_core.ErrorInfo(library="NCCL", detail="late"))
    assert not failed.ok and failed.error.detail == "late" and failed.as_dict()["error"]["message"]
    assert pickle.loads(pickle.dumps(failed)) == failed


def test_driver_init_record_host_fingerprint_and_peer_copy_are_records_too():
    frozen = _core.DriverInitRecord(attempted=True, succeeded=True, visible_devices_at_init="")
    assert frozen.visible_devices_at_init == "" and _core.DriverInitRecord().visible_devices_at_init is None
    assert pickle.loads(pickle.dumps(frozen)) == frozen
    fp = _core.host_fingerprint()
    assert RankIdentity(host_hash=fp.hash).host_hash == fp.hash  # all 64 bits cross the boundary
    assert fp.from_nccl_hostid or fp.hostname in fp.hashed
    copy = _core.PeerCopyResult(src=0, dst=1, bytes=64, verified=True, first_mismatch=7)
    assert copy.first_mismatch is None  # meaningful only when bytes differ
    bad = _core.PeerCopyResult(src=0, dst=1, bytes=64, mismatched_bytes=3, first_mismatch=7)
    assert bad.as_dict()["first_mismatch"] == 7 and json.loads(json.dumps(bad.as_dict())) == bad.as_dict()
