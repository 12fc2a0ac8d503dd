"""Placement across ranks: who-is-where records, the store the ranks meet in, the exchange that gives every
rank the same verdict, and the optional NCCL check. Knows nothing of ``Binding``: bind() hands it a
:class:`RankIdentity` and a :class:`~gpuguard.deadline.Deadline`.

Modules, in the order bind() uses them: ``identity`` (the record), ``stores`` (protocol, checked wrapper,
discovery), ``exchange`` (the protocol), ``verdict`` (codec and the error it raises), ``foreign_processes``
(other programs' memory on each rank's GPU, after the verdict), ``nccl_check`` (imported only for
bind(verify_nccl=True): it loads the NCCL finder and a recogniser that nothing else in bind() needs).
"""

from .foreign_processes import check_gpu_processes
from .exchange import exchange, hold_until_read, namespace_for, run_namespace
from .identity import RankIdentity
from .stores import CheckedStore, Store, env_store_for_init, find_store
from .verdict import Verdict, raise_for

__all__ = ["CheckedStore", "RankIdentity", "Store", "Verdict", "check_gpu_processes", "env_store_for_init",
           "exchange", "find_store",
           "hold_until_read", "namespace_for", "raise_for", "run_namespace"]
