"""gpuguard.devices(): enumeration through the run-time-loaded driver, with CUDA_VISIBLE_DEVICES honoured
exactly as the real driver does (the fake driver reproduces its parsing)."""

from __future__ import annotations

import json

import pytest

from gg_testing.env import no_driver_env
from gg_testing.procs import run_cli, run_json, run_python

pytestmark = pytest.mark.version_independent  # CI runs this file on the oldest corner only (pyproject's markers)

ENUMERATE = """
import json, gpuguard
print(json.dumps([d.uuid for d in gpuguard.devices()]))
"""


def uuids_of(fake_gpus, topology: str, *indices: int) -> list[str]:
    gpus = fake_gpus.topology(topology)["gpus"]
    return [gpus[i]["uuid"] for i in indices]


def test_without_a_driver_devices_is_empty_and_the_reason_is_given():
    got = run_json("""
        import json, gpuguard
        st = gpuguard.cuda_status()
        print(json.dumps({"devices": gpuguard.devices(), "loaded": st.library_loaded, "reason": st.reason}))
    """, no_driver_env())
    assert got["devices"] == []
    assert got["loaded"] is False
    assert "no NVIDIA driver" in got["reason"]
    assert "/nonexistent/libcuda.so.1" in got["reason"]


def test_import_does_not_initialise_cuda(fake_gpus, tmp_path):
    log = tmp_path / "calls.log"
    got = run_json("""
        import json, pathlib, os, torch, gpuguard, gpuguard._core
        log = pathlib.Path(os.environ["GPUGUARD_FAKE_CALL_LOG"])
        after_import = log.read_text() if log.exists() else ""
        state = {"torch_initialised": torch.cuda.is_initialized(),
                 "gpuguard_initialised": gpuguard._core.driver_initialized(),
                 "calls_after_import": after_import}
        gpuguard.devices()
        state["calls_after_devices"] = log.read_text()
        print(json.dumps(state))
    """, fake_gpus.env(visible="0", GPUGUARD_FAKE_CALL_LOG=str(log)))
    assert got["torch_initialised"] is False
    assert got["gpuguard_initialised"] is False
    assert got["calls_after_import"] == ""
    assert got["calls_after_devices"] == "cuInit CUDA_VISIBLE_DEVICES=0\n"


def test_all_devices_when_visibility_is_unset(fake_gpus):
    assert run_json(ENUMERATE, fake_gpus.env()) == uuids_of(fake_gpus, "h100x8", *range(8))


def test_visible_indices_give_those_devices_in_that_order(fake_gpus):
    assert run_json(ENUMERATE, fake_gpus.env(visible="3,5")) == uuids_of(fake_gpus, "h100x8", 3, 5)
    assert run_json(ENUMERATE, fake_gpus.env(visible="5,3")) == uuids_of(fake_gpus, "h100x8", 5, 3)


def test_device_fields(fake_gpus):
    got = run_json("""
        import json, gpuguard
        print(json.dumps([d.as_dict() for d in gpuguard.devices()]))
    """, fake_gpus.env(visible="3,5"))
    gpu5 = fake_gpus.topology("h100x8")["gpus"][5]
    assert got[1] == {
        "index": 1,
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": gpu5["uuid"],
        "pci_bus_id": gpu5["pci_bus_id"],
        "total_memory": 81559 * 2**20,
        "compute_capability": [9, 0],
        "multiprocessors": 132,
    }


def test_uuid_prefix_with_gpu_dash(fake_gpus):
    uuid6 = uuids_of(fake_gpus, "h100x8", 6)[0]
    assert run_json(ENUMERATE, fake_gpus.env(visible=uuid6[:12])) == [uuid6]  # "GPU-" + 8 hex digits


def test_uuid_prefix_without_gpu_dash_and_full_uuid(fake_gpus):
    uuid2, uuid6 = uuids_of(fake_gpus, "h100x8", 2, 6)
    assert run_json(ENUMERATE, fake_gpus.env(visible=f"{uuid6[4:14]},{uuid2}")) == [uuid6, uuid2]


def test_enumeration_stops_at_the_first_invalid_entry(fake_gpus):
    assert run_json(ENUMERATE, fake_gpus.env(visible="1,99,2")) == uuids_of(fake_gpus, "h100x8", 1)
    assert run_json(ENUMERATE, fake_gpus.env(visible="1,bogus,2")) == uuids_of(fake_gpus, "h100x8", 1)


def test_ambiguous_prefix_and_repeated_entry_stop_enumeration(fake_gpus):
    # every fake UUID starts with 5a6b: the prefix names no single GPU
    assert run_json(ENUMERATE, fake_gpus.env(visible="4,GPU-5a6b")) == uuids_of(fake_gpus, "h100x8", 4)
    assert run_json(ENUMERATE, fake_gpus.env(visible="2,2,3")) == uuids_of(fake_gpus, "h100x8", 2)


def test_empty_visibility_means_no_devices_and_says_so(fake_gpus):
    got = run_json("""
        import json, gpuguard
        print(json.dumps({"devices": gpuguard.devices(), "reason": gpuguard.cuda_status().reason}))
    """, fake_gpus.env(visible=""))
    assert got == {"devices": [], "reason": "no CUDA device is visible (CUDA_VISIBLE_DEVICES='')"}


def test_cli_devices_table(fake_gpus):
    proc = run_cli(["devices"], fake_gpus.env(visible="3,5"))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["index", "name", "uuid", "pci", "bus", "id", "memory", "cc"]
    assert uuids_of(fake_gpus, "h100x8", 3)[0] in lines[1] and lines[1].startswith("0 ")
    assert "79.6 GiB" in lines[2] and "9.0" in lines[2]
    assert lines[-1] == "driver 13.0, CUDA_VISIBLE_DEVICES=3,5"


def test_cli_devices_json(fake_gpus):
    proc = run_cli(["devices", "--json"], fake_gpus.env(visible="7"))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert [d["uuid"] for d in data["devices"]] == uuids_of(fake_gpus, "h100x8", 7)
    assert data["cuda"]["driver_version"] == 13000


def test_cli_devices_without_a_gpu_says_so_in_one_line_and_exits_0():
    proc = run_cli(["devices"], no_driver_env())
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 1
    assert proc.stdout.startswith("No CUDA devices visible: no NVIDIA driver")


@pytest.mark.parametrize("entry", ["console_script", "module"])
def test_cli_entry_points_agree(entry, fake_gpus):
    env = fake_gpus.env(visible="0")
    if entry == "module":
        proc = run_cli(["devices", "--json"], env)
    else:
        proc = run_python("from gpuguard.cli import main; raise SystemExit(main(['devices', '--json']))", env)
    assert json.loads(proc.stdout)["devices"][0]["uuid"] == uuids_of(fake_gpus, "h100x8", 0)[0]


def test_a_different_torch_moves_only_the_tensor_checks_to_python_naming_both_versions():
    proc = run_python("""
        import torch, warnings
        built = torch.__version__
        torch.__version__ = "1.13.1"
        import gpuguard
        print(gpuguard.devices(), gpuguard.bind().device_text)  # the torch-free core works as ever
        warnings.simplefilter("always")
        gpuguard.assert_same_device(torch.ones(1))  # the first tensor check names both versions, then runs in Python
        gpuguard.assert_same_device(torch.ones(1), torch.zeros(2))  # and warns once
        print("checked")
    """, no_driver_env(), timeout=280, check=False)  # the Python checks import torch's compile machinery: slow on loaded cores
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["[]", "cpu", "checked"]
    assert proc.stderr.count("gpuguard was built for PyTorch 2.") == 1, proc.stderr  # once, for every check
    assert "but PyTorch 1.13.1 is installed" in proc.stderr
    assert "pip install --no-build-isolation --force-reinstall --no-deps . (run in the gpuguard clone" in proc.stderr
    assert "run in Python: the same checks and reports, but slower" in proc.stderr
