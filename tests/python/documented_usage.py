"""The Python and shell blocks of README.md and docs/*.md as the tests run them: found, classified by the marker above
each, and run.

A block runs as written, in a fresh process, against the fake driver. The HTML comment line right above its
opening fence (invisible on GitHub) says otherwise:

    <!-- doc-test: setup NAME: what the setup provides -->   run after SETUPS[NAME] (names the block uses but
                                                              does not define, files, a Ray cluster to join)
    <!-- doc-test: gpu: why -->                               needs a real GPU: tests/python/gpu/test_gpu_readme.py
                                                              runs it there (skipped elsewhere)
    <!-- doc-test: skip: why -->                              never run by the tests; the reason says what covers it
    <!-- doc-test: install: why -->                           the source build's install lines (one block, in
                                                              docs/building-and-testing.md): run as written in a
                                                              fresh venv by scripts/check_source_install.sh, which
                                                              asks this file for them (--install-lines)

Blocks in other languages (a message, a table) are output, not run.
"""

from __future__ import annotations

import re
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
#: Every file whose blocks the tests run: the README and each page it links under docs/.
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]

PYTHON = ("python", "py")
SHELL = ("bash", "sh", "shell", "console")
MARKER = re.compile(r"^<!-- doc-test: (?P<kind>skip|gpu|install|setup (?P<setup>[a-z0-9-]+)): (?P<why>\S.*?) -->$")


@dataclass
class Block:
    """One fenced block of a document: where it starts, its language, its code and its marker, if any."""

    path: Path
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    kind: str = "run"  # run | setup | gpu | skip | install
    setup: Optional[str] = None
    why: str = ""
    problem: str = ""  # a marker that cannot be read

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}:{self.language}"

    @property
    def runnable_language(self) -> bool:
        return self.language in PYTHON + SHELL


def file_blocks(path: Path) -> list[Block]:
    """Every fenced block of one file, with the marker on the line before its opening fence."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = re.match(r"^```(\S*)\s*$", lines[i])
        if not opening:
            i += 1
            continue
        start = i
        i += 1
        body = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        block = Block(path=path, line=start + 1, language=opening.group(1).lower(), code="\n".join(body) + "\n")
        above = lines[start - 1].strip() if start > 0 else ""
        if above.startswith("<!-- doc-test"):
            marker = MARKER.match(above)
            if marker is None:
                block.problem = (f"line {start}: {above!r} is not a doc-test marker: write "
                                 f"'<!-- doc-test: skip: why -->', '<!-- doc-test: gpu: why -->', "
                                 f"'<!-- doc-test: install: why -->' or "
                                 f"'<!-- doc-test: setup NAME: what it provides -->'")
            else:
                block.kind = "setup" if marker.group("setup") else marker.group("kind")
                block.setup = marker.group("setup")
                block.why = marker.group("why")
        blocks.append(block)
        i += 1
    return blocks


def documented_blocks() -> list[Block]:
    """Every fenced block of README.md and docs/*.md, file by file."""
    return [block for path in DOCUMENTS for block in file_blocks(path)]


def install_block() -> Block:
    """The source build's install lines: the one block of README.md and docs/*.md marked install."""
    found = [block for block in documented_blocks() if block.kind == "install"]
    if len(found) != 1:
        raise LookupError(f"{len(found)} blocks of README.md and docs/*.md are marked "
                          f"'<!-- doc-test: install: ... -->' ({', '.join(b.id for b in found) or 'none'}); "
                          f"the source build's install lines need one")
    return found[0]


def install_lines() -> str:
    """The source build's install lines, as scripts/check_source_install.sh runs them."""
    return install_block().code


@dataclass
class Setup:
    """What a block needs around it to run: code before and after it, files beside it, a Ray cluster to join,
    an environment, and the text its output must show (what a reader of the README is told they will see)."""

    topology: str = "h100x8"
    before: str = ""
    after: str = ""
    files: dict[str, str] = field(default_factory=dict)
    ray_cluster: bool = False
    env: dict[str, str] = field(default_factory=dict)
    expect: tuple[str, ...] = ()

    def program(self, block: Block) -> str:
        return textwrap.dedent(self.before) + block.code + textwrap.dedent(self.after)


def write_program(block: Block, setup: Setup, folder: Path) -> list[str]:
    """Writes the block (with its setup) and its files into ``folder``; returns the command that runs it."""
    for name, text in setup.files.items():
        (folder / name).write_text(textwrap.dedent(text))
    if block.language in PYTHON:
        script = folder / "block.py"
        script.write_text(setup.program(block))
        return [sys.executable, str(script)]
    script = folder / "block.sh"
    script.write_text("set -euo pipefail\n" + setup.program(block))
    return ["bash", str(script)]


def command_shim(folder: Path) -> Path:
    """A folder holding ``gpuguard``, running this interpreter's ``-m gpuguard`` (the tree under test), and
    ``python``, this interpreter (the reader's venv's python, which a block's `python train.py` means)."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, command in (("gpuguard", f'"{sys.executable}" -m gpuguard'), ("python", f'"{sys.executable}"')):
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nexec {command} "$@"\n')
        shim.chmod(0o755)
    return bin_dir


#: What blocks marked gpu need around them on the GPU (tests/python/gpu/test_gpu_readme.py runs them), by
#: text the block holds; test_documented_usage fails on a gpu block that none describes.
GPU_SETUPS: list[tuple[str, Setup]] = [
    # one process as a launcher would start it: bind() then init_process_group("nccl") on the real GPU
    ('gpuguard.init_process_group("nccl")', Setup(
        env={"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"},
        after="import torch.distributed as dist\nprint('NCCL group of', dist.get_world_size(), 'on', binding.device)\n"
              "dist.destroy_process_group()\n",
        expect=("gpuguard: rank 0/1", "-> cuda:0 (GPU-", "NCCL group of 1 on cuda:0"))),
    # the model and its inputs on the GPU, as the block's comments say
    ("gpuguard.assert_same_device(model, x, mask)", Setup(
        before="""
            import torch, gpuguard
            from torch import nn
            model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)).to("cuda:0")
            x, mask, batch = (torch.ones(8, 4, device="cuda:0") for _ in range(3))
            """,
        after='print("checked on", gpuguard.assert_same_device(model, x, mask))\nhandle.remove()\n',
        expect=("checked on cuda:0",))),
]


def gpu_setup_for(block: Block) -> Setup:
    """The setup of a block marked gpu: the one GPU_SETUPS entry whose text the block holds."""
    found = [setup for text, setup in GPU_SETUPS if text in block.code]
    assert len(found) == 1, f"{block.id}: say in documented_usage.GPU_SETUPS what this gpu block needs to run"
    return found[0]


if __name__ == "__main__":
    if sys.argv[1:] != ["--install-lines"]:
        sys.exit("usage: python tests/python/documented_usage.py --install-lines   (prints the source build's install "
                 "block)")
    print(install_lines(), end="")
