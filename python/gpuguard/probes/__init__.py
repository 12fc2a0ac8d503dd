"""GPU probes that may hang on a broken machine (a peer copy, an NCCL all-reduce), run in child processes
under a deadline: ``run`` is the parent side (deadlines, what the children printed), ``child`` the child side
(``python -m gpuguard.probes.child``)."""
