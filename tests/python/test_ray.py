"""gpuguard under real Ray on the CPU: ray_placement, the Ray-native rendezvous, and bind() inside actors.

One Ray cluster for the module (starting one costs seconds): ``ray.init(num_gpus=8)`` makes Ray hand out GPU
ids and set CUDA_VISIBLE_DEVICES per actor as on a GPU node, and the fake driver, given to every worker through
the job's runtime_env, maps visible index N to GPU N of the 8-GPU topology, as the real driver would.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from typing import Any

import pytest

from gg_testing.ray_start import init_in_this_process, starting_alone

pytestmark = [pytest.mark.slow, pytest.mark.ray_cluster(shared=True)]  # the module's one cluster
ray = pytest.importorskip("ray")

import gpuguard  # noqa: E402
from gpuguard.ray.store import RayStore  # noqa: E402

CALL_TIMEOUT = 120  # seconds for a store call or a bind(): actors import torch, on two shared cores
GET_TIMEOUT = 240   # seconds for ray.get of a bind(): actor start-up plus bind()'s own deadline


@pytest.fixture(scope="module")
def cluster(fake_gpus):
    env = fake_gpus.env("h100x8")
    env_vars = {k: env[k] for k in ("GPUGUARD_LIBCUDA", "GPUGUARD_LIBNCCL", "GPUGUARD_FAKE_TOPOLOGY", "PYTHONPATH")
                if k in env}
    with starting_alone():  # no other test's cluster starting beside it (gg_testing.ray_start)
        init_in_this_process(ray, num_gpus=8, num_cpus=16, include_dashboard=False, object_store_memory=100 * 2**20,
                             log_to_driver=False, runtime_env={"env_vars": env_vars})
    try:
        yield fake_gpus.topology("h100x8")
    finally:
        ray.shutdown()


def get(refs: Any, timeout: float = GET_TIMEOUT) -> Any:
    return ray.get(refs, timeout=timeout)


# ---- the rendezvous actor: torch.distributed.Store semantics ----

def test_the_tests_ray_workers_run_at_the_priority_of_the_test(cluster):
    # gg_testing.ray_start: by default Ray starts its workers 15 nice levels lower, where beside busy tests an
    # actor importing torch starved past Ray's own deadlines
    @ray.remote(num_cpus=0)
    def niceness() -> int:
        return os.nice(0)

    assert get(niceness.remote()) == os.nice(0)


def test_rendezvous_store_has_c10d_semantics_and_waiters_do_not_block_writers(cluster):
    store = RayStore("store-semantics", timeout=2)
    # shipped by value, the store's process never imports gpuguard nor torch: it starts fast and stays small
    assert store.ping(timeout=CALL_TIMEOUT)["imports_torch"] is False
    store.set("a", b"1")
    store.set("s", "text")  # str values are stored as UTF-8, as TCPStore does
    assert store.get("a") == b"1" and store.get("s") == b"text"
    assert store.add("n", 5) == 5 and store.add("n", -2) == 3 and store.get("n") == b"3"
    assert store.check(["a", "n"]) and not store.check(["a", "absent"])
    # compare_set follows TCPStore, quirk included: a missing key is created only for an empty expectation
    assert store.compare_set("cas", b"x", b"y") == b"x" and not store.check(["cas"])
    assert store.compare_set("cas", b"", b"y") == b"y"
    assert store.compare_set("cas", b"wrong", b"z") == b"y"
    assert store.compare_set("cas", b"y", b"z") == b"z"
    store.set("text", b"abc")
    with pytest.raises(gpuguard.RayRendezvousError,
                       match=r"store.add\(\) on group 'store-semantics': key 'text' holds b'abc', not an integer"
                       ) as err:
        store.add("text", 1)
    store.set("k1", b"")
    with pytest.raises(gpuguard.RendezvousTimeoutError, match=r"timed out after 0.5 s; keys still missing: k2$"):
        store.wait(["k1", "k2"], datetime.timedelta(seconds=0.5))
    with pytest.raises(gpuguard.RendezvousTimeoutError, match=r"store.get\(\).*timed out after 2 s.*missing: nope"):
        store.get("nope")
    assert err.value.details["group"] == "store-semantics"

    # A reader blocked in get() must not stop the writer that wakes it (the actor is async): a second client
    # writes while the first waits, and the first returns that value long before its own deadline.
    reader = RayStore("store-semantics", timeout=CALL_TIMEOUT)
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(value=reader.get("late")))
    thread.start()
    deadline = time.monotonic() + CALL_TIMEOUT
    while store.waited_keys() != ["late"]:  # answered while the reader is blocked in the actor
        assert time.monotonic() < deadline, "the reader's get() never reached the rendezvous actor"
    assert not store.check(["late"])
    store.set("late", b"woken")
    thread.join(CALL_TIMEOUT)
    assert result == {"value": b"woken"}


def test_rendezvous_refuses_oversized_values_and_reports_a_missing_group(cluster):
    store = RayStore("store-limits")
    with pytest.raises(gpuguard.RayRendezvousError, match="exceeds gpuguard's limit of 1048576 bytes"):
        store.set("big", b"x" * (2**20 + 1))
    with pytest.raises(gpuguard.RayRendezvousError,
                       match="no gpuguard rendezvous actor exists for group 'never-made'"):
        RayStore("never-made", create=False)


# ---- ray_placement: arguments, cluster size, options ----

@pytest.mark.parametrize("bad", [0, -1, 1.5, 2.0, True, "2", None])
def test_max_colocate_must_be_a_positive_integer(cluster, bad):
    with pytest.raises(gpuguard.RayPlacementError,
                       match=rf"max_colocate must be a positive integer, got {bad!r} \({type(bad).__name__}\)\. "
                             r"It is how many groups \(roles\) may share each GPU; each actor then gets "
                             r"num_gpus=1/max_colocate"):
        gpuguard.ray_placement(bad, num_workers=2)


def test_placements_the_cluster_can_never_hold_are_refused_before_they_hang(cluster):
    with pytest.raises(gpuguard.RayPlacementError) as err:
        gpuguard.ray_placement(2, num_workers=9)
    msg = str(err.value)
    assert "ray_placement(num_workers=9) needs 9 GPUs, one per rank, but the Ray cluster has 8" in msg
    assert "waits forever" in msg and "Use num_workers <= 8" in msg
    assert "never puts two ranks of one group on one GPU" in msg
    assert err.value.details["cluster_gpus"] == 8
    # one node here: 8 bundles on 8 separate nodes cannot be
    with pytest.raises(gpuguard.RayPlacementError,
                       match=r"needs 2 bundles of \{'GPU': 1.0, 'CPU': 1.0\} on separate nodes, but this cluster "
                             r"can hold 1"):
        gpuguard.ray_placement(num_workers=2, strategy="STRICT_SPREAD")
    # 8 bundles of 3 CPUs each do not fit 16 CPUs, whatever the GPUs say
    with pytest.raises(gpuguard.RayPlacementError, match=r"this cluster can hold 5 .*smaller num_cpus_per_worker"):
        gpuguard.ray_placement(3, num_workers=8, num_cpus_per_worker=1)
    with pytest.raises(gpuguard.RayPlacementError, match="strategy must be one of PACK, SPREAD, STRICT_PACK, "
                                                         "STRICT_SPREAD, got 'pack'"):
        gpuguard.ray_placement(num_workers=2, strategy="pack")
    with pytest.raises(gpuguard.RayPlacementError, match=r"num_workers must be a positive integer, got 0"):
        gpuguard.ray_placement(num_workers=0)


def test_without_ray_init_the_error_says_to_call_it(cluster, monkeypatch):
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    with pytest.raises(gpuguard.RayPlacementError, match=r"needs a running Ray: call ray.init\(\)"):
        gpuguard.ray_placement(num_workers=1)


def test_options_place_rank_r_on_bundle_r_and_merge_the_users_runtime_env(cluster):
    with gpuguard.ray_placement(2, num_workers=4, name="opts", num_cpus_per_worker=0.5) as placement:
        placement.ready(timeout=CALL_TIMEOUT)  # removing a group Ray is still placing can leave a GPU held
        assert placement.bundle == {"GPU": 1.0, "CPU": 1.0}
        user_env = {"pip": [], "env_vars": {"MY_FLAG": "1", "WORLD_SIZE": "4"}}
        opts = placement.options(3, group="actor", runtime_env=user_env, max_restarts=2, name="actor-3")
        assert opts["num_gpus"] == 0.5 and opts["num_cpus"] == 0.5
        assert opts["max_restarts"] == 2 and opts["name"] == "actor-3"
        strategy = opts["scheduling_strategy"]
        assert strategy.placement_group is placement.placement_group
        assert strategy.placement_group_bundle_index == 3
        assert opts["runtime_env"] == {"pip": [], "env_vars": {
            "MY_FLAG": "1", "WORLD_SIZE": "4", "RANK": "3", "GPUGUARD_GROUP": "actor"}}
        assert user_env == {"pip": [], "env_vars": {"MY_FLAG": "1", "WORLD_SIZE": "4"}}  # the caller's is untouched
        assert placement.options(0)["runtime_env"]["env_vars"]["GPUGUARD_GROUP"] == "opts"  # the default group
        assert placement.groups == ("actor", "opts")

        with pytest.raises(gpuguard.RayPlacementError) as err:
            placement.options(1, group="rollout")
        assert str(err.value) == (
            "placement has max_colocate=2: each GPU holds 2 actor(s) of num_gpus=1/2, and group(s) 'actor', 'opts' "
            "already use them, so an actor of a further group 'rollout' would wait forever for a GPU share. Raise "
            "max_colocate to 3 or give 'rollout' its own placement.")
        with pytest.raises(gpuguard.RayPlacementError,
                           match=r"your runtime_env sets RANK='0', but this actor is RANK='2' of the placement"):
            placement.options(2, group="actor", runtime_env={"env_vars": {"RANK": 0}})
        with pytest.raises(gpuguard.RayPlacementError, match=r"rank must be an integer in \[0, 4\) for this "
                                                             r"placement of 4 workers, got 4"):
            placement.options(4)
        with pytest.raises(gpuguard.RayPlacementError, match=r"num_gpus=1\): this placement gives each actor "
                                                             r"num_gpus=1/2 \(max_colocate=2\)"):
            placement.options(0, num_gpus=1)
        with pytest.raises(gpuguard.RayPlacementError, match="gpuguard sets scheduling_strategy itself"):
            placement.options(0, scheduling_strategy="SPREAD")
        with pytest.raises(gpuguard.RayPlacementError, match=r"num_cpus=2\): each bundle reserves "
                                                             r"num_cpus_per_worker=0.5 CPU per actor"):
            placement.options(0, num_cpus=2)
    with pytest.raises(gpuguard.RayPlacementError, match="this placement was removed"):
        placement.options(0)


def test_ready_times_out_with_what_is_free_when_other_placements_hold_the_gpus(cluster):
    with gpuguard.ray_placement(num_workers=8, num_cpus_per_worker=0) as everything:
        everything.ready(timeout=CALL_TIMEOUT)
        with gpuguard.ray_placement(num_workers=1, num_cpus_per_worker=0) as late:
            with pytest.raises(gpuguard.RayPlacementError,
                               match=r"the placement group of 1 bundles \{'GPU': 1.0\} \(strategy 'PACK'\) was not "
                                     r"placed within 0.5 s; free now: \{'CPU': 16.0\}.*ray status"):
                late.ready(timeout=0.5)


def test_report_tabulates_well_formed_rows_only_and_names_shared_gpus_and_absent_ranks(cluster):
    """The rows come from the actors, so the driver checks them: malformed or misfiled rows are not shown."""
    import json

    from gpuguard.ray.report import BINDING_PREFIX

    with gpuguard.ray_placement(num_workers=4, name="rows", num_cpus_per_worker=0) as placement:
        placement.ready(timeout=CALL_TIMEOUT)
        placement.options(0)  # the group exists once an actor of it is placed
        store = RayStore("rows")
        row = {"group": "rows", "rank": 0, "node_ip": "10.0.0.7", "ray_gpu_ids": ["3"], "gpu_fraction": 1.0,
               "device": "cuda:0", "uuid": "GPU-aaaa", "pci_bus_id": "0000:18:00.0", "pid": 11}
        store.set(f"{BINDING_PREFIX}0", json.dumps(row))
        store.set(f"{BINDING_PREFIX}1", json.dumps({**row, "rank": 1, "ray_gpu_ids": ["3"], "pid": 12}))
        store.set(f"{BINDING_PREFIX}2", b"\xff not json")
        store.set(f"{BINDING_PREFIX}3", json.dumps({**row, "rank": 9}))  # filed under another rank's key
        report = placement.report()
    assert [r["rank"] for r in report.rows] == [0, 1]
    assert report.missing == {"rows": [2, 3]}
    assert report.shared_gpus() == [{"group": "rows", "uuid": "GPU-aaaa", "ranks": [0, 1]}]
    assert report.summary() == [
        "Ray gave the actors of group 'rows' 1 GPU each",
        "group 'rows': ranks 0, 1 share GPU GPU-aaaa: NCCL refuses that; use max_colocate=1",
        "group 'rows': ranks 2-3 have not called gpuguard.bind() yet"]
    lines = str(report).splitlines()
    assert lines[1].split() == ["rows", "0", "10.0.0.7", "3", "1", "cuda:0", "GPU-aaaa", "0000:18:00.0", "11"]
    with pytest.raises(gpuguard.RayPlacementError, match="this placement was removed"):
        placement.report()


# ---- bind() inside actors: placement proven in every rank ----

def worker_class() -> Any:
    """The actor class, made here so that Ray ships it by value (workers cannot import this test module)."""

    class Worker:
        def ready(self) -> bool:
            """Pays what comes before bind()'s deadline starts (imports: seconds of CPU each on a loaded machine)."""
            import gpuguard  # noqa: F401
            import torch  # noqa: F401
            return True

        def bind(self, timeout: float = CALL_TIMEOUT) -> dict[str, Any]:
            import os

            import gpuguard

            facts: dict[str, Any] = {
                "rank": int(os.environ["RANK"]), "group": os.environ.get("GPUGUARD_GROUP"),
                "ray_gpu_ids": ray.get_runtime_context().get_accelerator_ids()["GPU"],
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
            started = time.monotonic()
            try:
                binding = gpuguard.bind(timeout=timeout)
            except gpuguard.GpuGuardError as exc:
                return {**facts, "ok": False, "error": type(exc).__name__, "message": str(exc),
                        "seconds": time.monotonic() - started}
            return {**facts, "ok": True, "uuid": binding.uuid, "device": str(binding.device),
                    "launcher": binding.launcher, "share": binding.extra.get("ray_gpu_share"),
                    "summary": str(binding), "seconds": time.monotonic() - started}

    return ray.remote(Worker)


def bind_all(actors: list[Any], **kw: Any) -> list[dict[str, Any]]:
    """Every actor's bind(), started together once all have started and imported: the ranks' deadlines (5 s in
    some tests) then measure gpuguard's check, not how far apart Ray started the actors on a loaded machine."""
    try:
        get([a.ready.remote() for a in actors])
        return get([a.bind.remote(**kw) for a in actors])
    finally:
        for a in actors:
            ray.kill(a)


def failures(results: list[dict[str, Any]]) -> str:
    return "\n".join(f"rank {r['rank']} ({r['group']}, {r['seconds']:.1f} s): {r['error']}: {r['message']}"
                     for r in results if not r["ok"])


def test_eight_ranks_with_max_colocate_1_get_eight_distinct_gpus_and_every_bind_passes(cluster):
    Worker = worker_class()
    with gpuguard.ray_placement(num_workers=8, name="solo", num_cpus_per_worker=0.5) as placement:
        placement.ready(timeout=CALL_TIMEOUT)  # a GPU still held elsewhere fails here, clearly
        results = bind_all([Worker.options(**placement.options(r)).remote() for r in range(8)])
        assert all(r["ok"] for r in results), failures(results)
        report = placement.report()
    topology_uuids = [g["uuid"] for g in cluster["gpus"]]
    assert sorted(r["uuid"] for r in results) == sorted(topology_uuids)
    for r in results:
        # Ray's id N is physical GPU N: the actor sees only it, as cuda:0
        assert r["launcher"] == "ray" and r["device"] == "cuda:0" and r["share"] == 1.0
        assert r["cuda_visible_devices"] == r["ray_gpu_ids"][0]
        assert r["uuid"] == topology_uuids[int(r["ray_gpu_ids"][0])]
        assert f"rank {r['rank']}/8" in r["summary"] and "group solo" in r["summary"]

    assert [row["rank"] for row in report.rows] == list(range(8)) and report.missing == {}
    assert report.shared_gpus() == []
    assert report.summary() == ["Ray gave the actors of group 'solo' 1 GPU each"]
    table = str(report).splitlines()
    assert table[0].split() == ["group", "rank", "node", "Ray", "GPU", "ids", "share", "device", "GPU", "UUID",
                                "PCI", "bus", "id", "pid"]
    for row, line in zip(report.rows, table[1:9]):
        assert line.split()[:7] == ["solo", str(row["rank"]), row["node_ip"], row["ray_gpu_ids"][0], "1", "cuda:0",
                                    row["uuid"]]
    data = report.as_dict()
    assert {row["uuid"] for row in data["rows"]} == set(topology_uuids) and data["shared_gpus"] == []


def test_two_colocated_groups_of_four_share_gpus_with_max_colocate_2_and_pass(cluster):
    """verl's layout: an 'actor' and a 'rollout' rank on every GPU, half a GPU each; no group has a duplicate.
    Four GPUs of the eight, 8 actors: 16 (each importing torch) were CI's slowest test, and show nothing more."""
    Worker = worker_class()
    with gpuguard.ray_placement(2, num_workers=4, name="verl", num_cpus_per_worker=0.5) as placement:
        placement.ready(timeout=CALL_TIMEOUT)  # a GPU still held elsewhere fails here, clearly
        actors = [Worker.options(**placement.options(r, group=role)).remote()
                  for role in ("actor", "rollout") for r in range(4)]
        results = bind_all(actors)
        assert all(r["ok"] for r in results), failures(results)
        report = placement.report()
    by_gpu: dict[str, list[tuple[str, int]]] = {}
    for r in results:
        assert r["share"] == 0.5
        by_gpu.setdefault(r["uuid"], []).append((r["group"], r["rank"]))
    assert len(by_gpu) == 4
    for members in by_gpu.values():  # rank r of each role on bundle r: one actor and one rollout rank per GPU
        assert sorted(members) == [("actor", members[0][1]), ("rollout", members[0][1])]

    assert len(report.rows) == 8 and report.missing == {} and report.shared_gpus() == []
    assert report.summary() == ["Ray gave the actors of group 'actor' 1/2 GPU each",
                                "Ray gave the actors of group 'rollout' 1/2 GPU each"]
    assert {(row["group"], row["rank"], row["uuid"]) for row in report.rows} == {
        (r["group"], r["rank"], r["uuid"]) for r in results}


def test_six_ranks_packed_by_fractional_gpus_all_stop_naming_the_ranks_per_gpu(cluster):
    """No gpuguard placement: num_gpus=1/3 lets Ray pack three ranks of one group on each GPU."""
    Worker = worker_class()
    env = {"WORLD_SIZE": "6", "GPUGUARD_GROUP": "packed"}
    actors = [Worker.options(num_gpus=1 / 3, num_cpus=0,
                             runtime_env={"env_vars": {**env, "RANK": str(r)}}).remote() for r in range(6)]
    results = bind_all(actors)
    assert [r["error"] if not r["ok"] else "passed" for r in results] == ["DuplicateDeviceError"] * 6, \
        failures(results)
    messages = {r["message"] for r in results}
    assert len(messages) == 1, "every rank must reach the same verdict"
    message = messages.pop()
    ranks_by_gpu: dict[str, list[int]] = {}
    for r in results:
        ranks_by_gpu.setdefault(r["ray_gpu_ids"][0], []).append(r["rank"])
    assert sorted(len(v) for v in ranks_by_gpu.values()) == [3, 3]  # where Ray put them
    for gpu_id, ranks in ranks_by_gpu.items():
        gpu = cluster["gpus"][int(gpu_id)]
        a, b, c = sorted(ranks)
        assert f"GPU {gpu['uuid']} (PCI {gpu['pci_bus_id']}) is shared by ranks {a}, {b} and {c}:" in message
    assert message.startswith("6 ranks of group 'packed' share 2 GPUs."), message
    assert "Likely cause: Ray gave these actors 1/3 of a GPU each (num_gpus=1/3) and the same GPU (Ray GPU ids " \
           in message and "so 3 ranks of group 'packed' share it" in message, message
    assert "Fix: give every rank of a group a whole GPU: gpuguard.ray_placement(max_colocate=1)" in message


def test_a_rank_that_never_arrives_is_named_by_the_others_through_the_ray_rendezvous(cluster):
    Worker = worker_class()
    env = {"WORLD_SIZE": "3", "GPUGUARD_GROUP": "short"}
    actors = [Worker.options(num_gpus=1, num_cpus=0, runtime_env={"env_vars": {**env, "RANK": str(r)}}).remote()
              for r in (0, 2)]  # rank 1 is never started
    # the deadline is what the test waits for rank 1: long enough that rank 2 arrives within it on a loaded CI
    # machine, where Ray runs its workers at a lower priority than the driver (Ray's worker_niceness) and CI once saw
    # rank 2 take longer than 5 s to reach the check after both binds were called at once
    results = bind_all(actors, timeout=30)
    assert [r["error"] for r in results] == ["RendezvousTimeoutError"] * 2, failures(results)
    for r in results:
        assert r["message"].startswith("rank 1 of group 'short' did not reach gpuguard's placement check within "
                                       "30 s (2 of 3 arrived)."), r["message"]
