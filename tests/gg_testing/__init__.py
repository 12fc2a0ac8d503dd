"""The test suite's own support package (tests/gg_testing): the one place that launches jobs, chooses ports, builds
environments and ends processes, for tests/python and tests/cluster alike.

pyproject's ``pythonpath = ["tests"]`` makes it importable in every test file (``from gg_testing.env import
scrubbed``); the launcher puts tests/ on the path of the processes it starts, so rank scripts import
``gg_testing.rank`` (stdlib only) to write their results. No test file imports another test file.

    paths    ROOT, TOPOLOGIES, the tests folder
    env      FakeGpus, scrubbed, auto_env, no_driver_env, the launcher variable sets of the launcher tests
    ports    free_port: below the ephemeral range, disjoint per pytest-xdist worker, never handed out twice
    procs    run_python / run_json / run_cli / run_logged, and ending a process group (kill_group)
    launch   Job (a command in its own session, output in files, killed whole) and torchrun's command lines
    rank     write_result: what a rank script calls to leave its result in its own file, atomically
    ray_head RayHead: a Ray cluster of the test's own, always stopped
    ray_start one Ray cluster starting at a time among the test processes (a lock every pytest process shares)
    schedule the order in which pytest-xdist hands out a parallel step's files: the costliest first (a plugin)
    framework_jobs  the Lightning, HF Trainer and DeepSpeed programs the framework tests and docs/frameworks.md run
"""
