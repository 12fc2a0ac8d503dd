"""The framework programs the tests run as users write them (a Lightning module, a tiny BERT for the HF Trainer, a
DeepSpeed model): one copy, for tests/python/test_framework_*.py and the setups of docs/frameworks.md's blocks."""

from __future__ import annotations

#: A LightningModule fitting a regression, and its data: `Regression`, `train_loader` (CPU).
LIGHTNING_MODULE = """
import torch
from torch import nn
import lightning as L


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def forward(self, x):
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


train_loader = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8)
"""

#: A Trainer with strategy DDP on 2 CPU processes, run as `python train.py`: BACKEND (gloo, nccl) and SPAWN
#: (ddp_spawn when set) from the environment.
LIGHTNING_TRAINER = LIGHTNING_MODULE + """
import os
from lightning.pytorch.strategies import DDPStrategy

if __name__ == "__main__":
    strategy = DDPStrategy(process_group_backend=os.environ.get("BACKEND", "gloo"),
                           start_method="spawn" if os.environ.get("SPAWN") else "popen")
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_epochs=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Regression(), train_loader)
    print(f"fit done on rank {trainer.global_rank}", flush=True)
"""

#: A tiny BERT built from a config (nothing downloaded), TrainingArguments on the CPU and a dataset: `model`,
#: `args`, `train_dataset`.
HF_PIECES = """
import torch
from transformers import BertConfig, BertForSequenceClassification, TrainingArguments


class Sentences(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return {"input_ids": torch.tensor([1, 2, 3, i % 30 + 1]), "attention_mask": torch.ones(4, dtype=torch.long),
                "labels": torch.tensor(i % 2)}


model = BertForSequenceClassification(BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1,
                                                 num_attention_heads=2, intermediate_size=32,
                                                 max_position_embeddings=16))
args = TrainingArguments(output_dir="out", use_cpu=True, per_device_train_batch_size=4, max_steps=2, report_to=[],
                         save_strategy="no", disable_tqdm=True)
train_dataset = Sentences()
"""

#: The HF Trainer with GpuGuardTrainerCallback, run by a launcher.
HF_TRAINER = HF_PIECES + """
from transformers import Trainer
from gpuguard.frameworks.transformers import GpuGuardTrainerCallback

if __name__ == "__main__":
    trainer = Trainer(model=model, args=args, train_dataset=train_dataset, callbacks=[GpuGuardTrainerCallback()])
    trainer.train()
    print(f"train done on rank {args.process_index}", flush=True)
"""

#: The same Trainer asking for the GPU (use_cpu=False): under `accelerate launch --use_deepspeed` it reaches
#: DeepSpeed's init_process_group(device_id=cuda:LOCAL_RANK) on a torch that sees no GPU.
HF_TRAINER_GPU = HF_TRAINER.replace("use_cpu=True", "use_cpu=False")

#: An accelerate config file as `accelerate config` writes it: 2 processes on GPUs 2 and 3 (`{port}`: its port).
ACCELERATE_CONFIG = """\
compute_environment: LOCAL_MACHINE
distributed_type: MULTI_GPU
gpu_ids: 2,3
machine_rank: 0
main_process_port: {port}
mixed_precision: 'no'
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
use_cpu: false
"""

#: A model and its DeepSpeed config: `model`, `config`.
DEEPSPEED_PIECES = """
from torch import nn

model = nn.Linear(4, 1)
config = {"train_batch_size": 8, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}
"""

#: deepspeed.initialize, protect(engine) and one step, run by DeepSpeed's launcher (which appends --local_rank=N).
DEEPSPEED_TRAIN = DEEPSPEED_PIECES + """
import argparse

import deepspeed
import torch

import gpuguard.frameworks.deepspeed

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1)
parser.parse_args()

engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
gpuguard.frameworks.deepspeed.protect(engine)
x, y = torch.randn(4, 4).to(engine.device), torch.randn(4, 1).to(engine.device)
engine.backward(nn.functional.mse_loss(engine(x), y))
engine.step()
print(f"step done on rank {engine.global_rank}", flush=True)
"""


def gpuguard_run(fake_gpus, folder, code: str, command, topology: str = "h100x4", **extra: str):
    """``gpuguard run --json-report`` of ``command`` (a launcher's argv, default this Python) followed by the
    script written from ``code``, on the fake GPUs of ``topology``, as the user's job would run under the
    installed gpuguard (its .pth and entry points); returns the Finished job and the report's document."""
    import json
    import sys

    from . import launch
    from .env import auto_env

    script = launch.write(folder, "train.py", code)
    report = folder / "report.json"
    env = auto_env(fake_gpus.env(topology), **extra)
    env.pop("GPUGUARD")  # `gpuguard run` sets it
    env["PATH"] = f"{sys.prefix}/bin:{env.get('PATH', '')}"  # `deepspeed`, `accelerate` and their `python`
    argv = [sys.executable, "-m", "gpuguard", "run", "--json-report", str(report), "--",
            *(command or [sys.executable]), str(script)]
    finished = launch.Job(argv, env, folder, cwd=str(folder)).wait()
    return finished, json.loads(report.read_text()) if report.exists() else {"ranks": []}


def report_rows(report) -> list[tuple]:
    """Each rank's (rank, world size, launcher, framework, verdict) in the report."""
    return [(r["rank"], r["world_size"], r["launcher"], r["framework"], r["verdict"]) for r in report["ranks"]]
