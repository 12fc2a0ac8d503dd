"""explain's reader (gpuguard._core.Scanner) and start-up: the C++ line scan agrees with a plain Python reading of the same
bytes however they are chunked; logs of pathological shapes are read in linear time; `gpuguard explain` starts
without importing torch or the torch-linked core."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import time

import pytest

from gg_testing.paths import ROOT
from gg_testing.procs import SNIPPET_TIMEOUT_S

from gpuguard import _core
from gpuguard.logs import explain

pytestmark = pytest.mark.version_independent  # CI runs this file on the oldest corner only (pyproject's markers)

ENV = dict(os.environ, PYTHONPATH=str(ROOT / "python"))


def reference(data: bytes, keywords, max_line: int, context: int, context_bytes: int, lines_after: int = 1,
              groups=None, heads=(), head_groups=()):
    """What the scanner must hand out, written the obvious way: every line, every keyword test, in Python."""
    groups = groups if groups is not None else list(range(len(keywords)))
    lines = re.split(rb"\r\n|\r|\n", data)
    if lines and lines[-1] == b"":
        lines.pop()
    out, emitted, after = [], 0, 0
    for i, line in enumerate(lines, 1):
        cut = line[:max_line]
        end = cut.rstrip(b" \t\r") if len(cut) < max_line else b""   # a cut line's end is not seen
        head_mask = sum(1 << g for h, g in zip(heads, head_groups) if end.endswith(h))
        if head_mask or any(k in cut for k in keywords):
            for j in range(max(1, i - context), i):
                if j > emitted:
                    out.append((j, False, lines[j - 1][:min(context_bytes, max_line)], 0))
            mask = head_mask
            for k, g in zip(keywords, groups):
                if k in cut:
                    mask |= 1 << g
            out.append((i, True, cut, mask))
            emitted, after = i, lines_after
        elif after:
            out.append((i, False, cut, 0))
            emitted, after = i, after - 1
    return out, len(lines)


def scan(data: bytes, keywords, max_line: int, context: int, context_bytes: int, cuts, lines_after: int = 1,
         groups=None, heads=None, head_groups=None):
    scanner = _core.Scanner(keywords, max_line, context, context_bytes, groups, lines_after, heads, head_groups)
    out, pos = [], 0
    for cut in cuts:
        out += scanner.feed(data[pos:pos + cut])
        pos += cut
    out += scanner.feed(memoryview(data)[pos:])
    out += scanner.finish()
    return out, scanner.lines


def test_the_scan_hands_out_exactly_what_a_line_by_line_reading_would_however_the_bytes_arrive():
    rnd = random.Random(20261123)
    keywords = [b"KEYWORD", b"needle!", b"abcd"]
    pieces = [b"a", b"b", b"c", b"d", b"\n", b"\r", b"\r\n", b"KEYWORD", b"needle!", b"x" * 50, b" ", b"KEY",
              b"\x00", b"\x1b[31m", b"\xff"]
    for case in range(2000):
        data = b"".join(rnd.choice(pieces) for _ in range(rnd.randint(0, 200)))
        max_line, context, context_bytes = rnd.choice([4, 7, 10, 50, 1000]), rnd.choice([0, 1, 2, 5, 64]), \
            rnd.choice([1, 3, 1000])
        cuts = [rnd.randint(0, 40) for _ in range(rnd.randint(0, 6))]
        assert scan(data, keywords, max_line, context, context_bytes, cuts) == \
            reference(data, keywords, max_line, context, context_bytes), (case, data, max_line, context, cuts)


def test_groups_lines_after_and_line_end_heads_hand_out_what_a_line_by_line_reading_would():
    rnd = random.Random(20270105)
    keywords, groups = [b"KEYWORD", b"needle!", b"abcd"], [2, 0, 2]
    heads, head_groups = [b"KEY", b"need", b"ab\tcd"], [1, 0, 3]
    pieces = [b"a", b"b", b"c", b"d", b"\n", b"\r", b"\r\n", b"KEYWORD", b"needle!", b"x" * 50, b" ", b"KEY",
              b"need", b"\t", b"\x00", b"\xff", b"ab\tcd"]
    for case in range(2000):
        data = b"".join(rnd.choice(pieces) for _ in range(rnd.randint(0, 200)))
        max_line, context, context_bytes = rnd.choice([4, 7, 10, 50, 1000]), rnd.choice([0, 1, 5, 64]), \
            rnd.choice([1, 3, 1000])
        lines_after = rnd.choice([0, 1, 2, 5])
        cuts = [rnd.randint(0, 40) for _ in range(rnd.randint(0, 6))]
        assert scan(data, keywords, max_line, context, context_bytes, cuts, lines_after, groups, heads,
                    head_groups) == reference(data, keywords, max_line, context, context_bytes, lines_after, groups,
                                              heads, head_groups), (case, data, max_line, context, lines_after, cuts)


def test_the_scanner_refuses_heads_and_groups_it_cannot_use():
    with pytest.raises(ValueError, match="line-end head 'ab'"):
        _core.Scanner([b"word"], line_end_heads=[b"ab"], line_end_groups=[0])
    with pytest.raises(ValueError, match="ends in a blank"):
        _core.Scanner([b"word"], line_end_heads=[b"abc "], line_end_groups=[0])
    with pytest.raises(ValueError, match="out of range"):
        _core.Scanner([b"word"], groups=[64])
    with pytest.raises(ValueError, match="one group per"):
        _core.Scanner([b"word", b"more"], groups=[0])


def test_a_keyword_past_the_line_cut_does_not_count_and_the_rest_of_the_line_is_never_kept():
    scanner = _core.Scanner([b"invalid device ordinal"], 32, 4, 8)
    assert scanner.feed(b"x" * 20 + b"invalid device ordinal\nok\n") == []
    out = scanner.feed(b"invalid device ordinal" + b"y" * 10_000_000 + b"\n")
    assert out == [(1, False, b"xxxxxxxx", 0), (2, False, b"ok", 0), (3, True, b"invalid device ordinalyyyyyyyyyy", 1)]
    assert scanner.lines == 3 and scanner.hits == 1


def test_the_scanner_refuses_what_would_make_it_slow_or_wrong():
    with pytest.raises(ValueError, match="shorter than 4 bytes"):
        _core.Scanner([b"ab"])
    with pytest.raises(ValueError, match="line end"):
        _core.Scanner([b"two\nlines"])
    with pytest.raises(TypeError, match="bytes"):
        _core.Scanner(["text"])
    with pytest.raises(ValueError, match="positive"):
        _core.Scanner([b"word"], 0)


# The inputs that took minutes before the reader moved to C++ and every pattern was bounded (issue 15): 30 lines
# of 16 KB, each a recognised opening followed by 16,000 letters, took 4 min 52 s; lines of 16,000 letters
# followed by " invalid device ordinal" did not finish in 15 minutes at 4,000 lines. Linear now: milliseconds
# each, so the limit below is a generous bound for a loaded machine, not a benchmark.
PATHOLOGICAL = {
    "duplicate": "Duplicate GPU detected ",
    "watchdog": "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE",
    "mismatch": "Expected all tensors to be on the same device, but found at least two devices, ",
    "heartbeat": "[PG ID 0 PG GUID 0(default_pg) Rank 0] ProcessGroupNCCL's watchdog got stuck for ",
    "ncclras": "Warning: missing ",
}


@pytest.mark.parametrize("name", sorted(PATHOLOGICAL))
def test_long_lines_opening_like_a_known_message_are_read_in_linear_time(name):
    text = "".join(PATHOLOGICAL[name] + "a" * 16_000 + "\n" for _ in range(30))
    start = time.perf_counter()
    explain(text, match_local=False)
    assert time.perf_counter() - start < 20


def test_lines_of_letters_ending_in_a_known_message_are_read_in_linear_time():
    text = "".join("a" * 16_000 + " invalid device ordinal\n" for _ in range(1000))
    start = time.perf_counter()
    found = explain(text, match_local=False)
    assert time.perf_counter() - start < 60
    assert [d.kind for d in found] == ["invalid_device_ordinal"] and found[0].occurrences == 1000


# ---- start-up without torch -------------------------------------------------------------------------------------

NO_TORCH = r"""
import io, sys
from gpuguard.cli import main
sys.stdin = io.TextIOWrapper(io.BytesIO(sys.argv[1].encode()))
code = main(["explain"] + sys.argv[2:])
heavy = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.") or m == "gpuguard._libtorch")
print("HEAVY", heavy, "CODE", code)
"""


@pytest.mark.parametrize("text, args, code", [
    ("", [], 1),
    ("all good\n", [], 1),
    ("[rank7]: Duplicate GPU detected : rank 7 and rank 3 both on CUDA device 10000\n", ["--no-local"], 0),
    ("[rank1]: RuntimeError: CUDA error: invalid device ordinal\n", [], 0),
])
def test_gpuguard_explain_never_imports_torch_or_the_core(text, args, code):
    proc = subprocess.run([sys.executable, "-c", NO_TORCH, text, *args], capture_output=True, text=True,
                          timeout=120, env=ENV)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == f"HEAVY [] CODE {code}"


def test_gpuguard_explain_on_empty_input_starts_small():
    # the command as users run it; its peak memory is the interpreter's plus explain's, never torch's
    script = ("import resource, subprocess, sys; subprocess.run([sys.executable, '-m', 'gpuguard', 'explain'], "
              "stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL); "
              "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=ENV)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.strip()) < 100 * 1024  # KiB; importing torch alone takes several hundred MB


def test_the_core_loads_without_torch_and_the_tensor_checks_load_it():
    script = ("import sys, gpuguard; assert 'torch' not in sys.modules; import gpuguard._core; "
              "import gpuguard.system.devices, gpuguard.logs.explainer; "
              "light = 'torch' in sys.modules; from gpuguard._libtorch_loader import libtorch; libtorch(); "
              "print(light, 'torch' in sys.modules, callable(gpuguard.devices), callable(gpuguard.explain), "
              "gpuguard.TORCH_VERSION_BUILT_FOR is not None, sorted(set(gpuguard.__all__) - set(dir(gpuguard))))")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=SNIPPET_TIMEOUT_S,
                          env=ENV)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True", "True", "True", "True", "[]"]
