"""What this machine shows: its GPUs (devices.py), who holds memory on them (processes.py), this process's CUDA
contexts (contexts.py, context_monitor.py), and the installed torch and NCCL (installed_torch.py, nccl_library.py,
elf_dynamic.py). Imports nothing, so that importing one of its modules loads only what that module needs."""
