"""Fuzzes explain's reading of pasted text: every recogniser's examples, copied through random stacks of what
copying a log does (tests/python/paste_corpus.py's transformations, with random parameters: a break at any
character, a terminal of any width, a runtime's split anywhere) must never give a value, a rank or a kind the
clean text does not (it may miss what a break hides; the corpus test holds the shapes it must read in full).
Run by scripts/fuzz.sh; on a failure it prints the shape and exits 1.

  PYTHONPATH=python:tests/python python3 tests/fuzz/fuzz_paste.py SECONDS [SEED [MAX_RUNS]]

A SEED and MAX_RUNS make a run the same on any machine (CI's); without a seed each run explores new shapes.
"""

from __future__ import annotations

import random
import sys
import time
from typing import Callable

import paste_corpus as pc
from gpuguard.logs import explain
from gpuguard.logs.wrapping import MIN_WRAPPED_CHARS


def _break_somewhere(rnd: random.Random) -> Callable[[str], str]:
    """One line broken at a random character (a space or not) at least MIN_WRAPPED_CHARS in (no viewer or
    terminal is narrower), the continuation maybe indented."""
    def f(text: str) -> str:
        lines = pc._lines(text)
        i = rnd.randrange(len(lines))
        line = lines[i]
        if len(line) <= MIN_WRAPPED_CHARS + 1:
            return text
        at = rnd.randrange(MIN_WRAPPED_CHARS, len(line))
        at_space = line[at] == " "
        # a break at a space drops it, keeps it at the line's end, or indents the rest; one inside a word keeps
        # every character (a terminal) or indents the rest (a viewer with a word too long for it)
        style = rnd.choice(["", "    ", " "] if at_space else ["", "    "])
        head, tail = (line[:at], line[at + 1:]) if at_space else (line[:at], line[at:])
        return "".join(x + "\n" for x in lines[:i] + [head + (" " if style == " " else ""),
                                                       ("    " if style == "    " else "") + tail] + lines[i + 1:])
    return f


def _cri_split(rnd: random.Random) -> Callable[[str], str]:
    def f(text: str) -> str:
        out = []
        for line in pc._lines(text):
            while len(line) > 1 and rnd.random() < 0.3:
                at = rnd.randrange(1, len(line))
                out.append(f"{pc.TIMESTAMP} stderr P {line[:at]}")
                line = line[at:]
            out.append(f"{pc.TIMESTAMP} stderr F {line}")
        return "".join(x + "\n" for x in out)
    return f


def random_shape(rnd: random.Random, text: str) -> tuple[str, str]:
    """A random stack of transformations, in the order they happen, and its name."""
    names = []

    def pick(table: dict, p: float) -> None:
        nonlocal text
        if rnd.random() < p:
            name = rnd.choice(sorted(table))
            names.append(name)
            text = table[name](text)

    pick(pc.PROGRAM, 0.4)
    if rnd.random() < 0.2:
        names.append("cri_split")
        text = _cri_split(rnd)(text)
    else:
        pick(pc.STORE, 0.5)
    if rnd.random() < 0.4:
        width = rnd.randint(40, 200)
        names.append(f"terminal_{width}")
        text = pc.terminal(width)(text)
    if rnd.random() < 0.6:  # one break: a second one in a piece of the first no single wrapper makes
        names.append("break")
        text = _break_somewhere(rnd)(text)
    pick({k: v for k, v in pc.SCREEN.items() if not k.startswith("terminal")}, 0.2)  # one terminal at most
    pick(pc.PASTE, 0.5)
    pick({"quote": pc.PASTE["quote"], "nested_quote": pc.PASTE["nested_quote"]}, 0.3)
    pick({"html_escape": pc.PASTE["html_escape"]}, 0.2)
    return "+".join(names), text


def main() -> int:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0
    seed = int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] else random.randrange(1 << 30)
    max_runs = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3] else None
    rnd = random.Random(seed)
    # torch's out-of-memory message (~800 characters, many pieces) is put back together by its own recogniser
    # (issue 23): random breaks inside its list of processes can still make it count a message twice or read it
    # short, so it is held to the corpus test (tests/python/test_explain_corpus.py) until that assembly uses the
    # readings of breaks like the rest
    examples = [e for e in pc.examples() if not e.kind.startswith("oom_")]
    clean = {e.text: explain(e.text, match_local=False) for e in examples}
    deadline = time.monotonic() + seconds
    runs = unreadable = missed = 0
    while time.monotonic() < deadline and (max_runs is None or runs < max_runs):
        ex = rnd.choice(examples)
        name, text = random_shape(rnd, ex.text)
        found = explain(text, match_local=False)
        runs += 1
        unreadable += any(d.unreadable for d in found)
        missed += pc.compare(clean[ex.text], found) is not None
        problem = pc.wrong(clean[ex.text], found)
        if problem:
            print(f"fuzz_paste.py: seed {seed}, run {runs}: {ex.kind} / {name}: {problem}\n{text}", file=sys.stderr)
            return 1
    print(f"fuzz_paste.py: {runs} pasted shapes (seed {seed}): {unreadable} with a value said to be unreadable, "
          f"{missed} read short of the clean text, none with a value it does not give")
    return 0


if __name__ == "__main__":
    sys.exit(main())
