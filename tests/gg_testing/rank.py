"""What a rank script started by gg_testing.launch calls to leave its result: one file per rank, written whole.

Stdlib only, so that any rank (torchrun's, srun's, Ray's, mpirun's) can import it before or without gpuguard.
The launcher sets GG_TEST_RESULTS to the job's result folder; a rank writes ``rank<RANK>.json`` there through a
temporary name and a rename, so a reader sees either nothing or the whole document, never a part of it, and no
rank's output is ever parsed out of a stream it shares with others.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

RESULTS_VARIABLE = "GG_TEST_RESULTS"
RANK_VARIABLES = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")


def own_rank() -> int:
    """This process's global rank, from the first launcher variable that holds one."""
    for name in RANK_VARIABLES:
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    raise RuntimeError(f"no rank variable set ({', '.join(RANK_VARIABLES)})")


def result_path(rank: Optional[int] = None, folder: Optional[str] = None) -> str:
    folder = folder or os.environ.get(RESULTS_VARIABLE)
    if not folder:
        raise RuntimeError(f"{RESULTS_VARIABLE} is not set: start this script with gg_testing.launch")
    return os.path.join(folder, f"rank{own_rank() if rank is None else rank}.json")


def write_result(doc: Any, rank: Optional[int] = None, folder: Optional[str] = None) -> str:
    """Writes ``doc`` as this rank's result (``folder``, default $GG_TEST_RESULTS); returns the file's path."""
    path = result_path(rank, folder)
    partial = f"{path}.{os.getpid()}.partial"
    with open(partial, "w") as f:
        json.dump(doc, f)
        f.write("\n")
    os.replace(partial, path)  # atomic: the reader never sees a half-written result
    return path
