"""Decodes NCCL, PyTorch and Ray failure text (one message or a whole multi-rank log) into plain diagnoses.

Each failure it knows is one recogniser (``recognisers/``, listed in ``registry.py``): the patterns it matches,
each written from the text the real library prints and citing its source, the keywords that let a line reach
it, the diagnosis it builds and its line in the help. The input is untrusted and may be huge: the C++ reader
(gpuguard._core.Scanner, no torch) splits it into lines cut at MAX_LINE_CHARS bytes and hands Python only the lines holding
a known keyword (with the line after and the lines before each), every pattern is bounded, and everything kept
per diagnosis (ranks, devices, evidence lines) is capped, so memory stays bounded whatever the size or content
of the log. Text that matches nothing known yields no diagnosis: gpuguard says it does not recognise it, never
guesses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .explainer import CONTEXT_CHARS, CONTEXT_LINES, LogExplainer, explain, explain_file, format_diagnoses, kinds_in
    from .lines import MAX_LINE_CHARS, iter_lines
    from .model import MAX_DEVICES, MAX_EVIDENCE, MAX_RANKS, Diagnosis, Evidence
    from .recogniser import Recogniser
    from .recognisers.duplicate_gpu import nccl_device_to_pci_bus_id
    from .registry import HELP, KEYWORDS, KINDS, RECOGNISERS

# Name -> module, each loaded on first use (PEP 562): a module that needs one recogniser (placement/nccl_check.py)
# imports it without this package loading the explainer and every recogniser.
_LAZY: dict[str, str] = {
    **dict.fromkeys(("CONTEXT_CHARS", "CONTEXT_LINES", "LogExplainer", "explain", "explain_file", "format_diagnoses",
                     "kinds_in"), ".explainer"),
    **dict.fromkeys(("MAX_LINE_CHARS", "iter_lines"), ".lines"),
    **dict.fromkeys(("MAX_DEVICES", "MAX_EVIDENCE", "MAX_RANKS", "Diagnosis", "Evidence"), ".model"),
    "Recogniser": ".recogniser",
    "nccl_device_to_pci_bus_id": ".recognisers.duplicate_gpu",
    **dict.fromkeys(("HELP", "KEYWORDS", "KINDS", "RECOGNISERS"), ".registry"),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "CONTEXT_CHARS",
    "CONTEXT_LINES",
    "HELP",
    "KEYWORDS",
    "KINDS",
    "MAX_DEVICES",
    "MAX_EVIDENCE",
    "MAX_LINE_CHARS",
    "MAX_RANKS",
    "RECOGNISERS",
    "Diagnosis",
    "Evidence",
    "LogExplainer",
    "Recogniser",
    "explain",
    "explain_file",
    "format_diagnoses",
    "iter_lines",
    "kinds_in",
    "nccl_device_to_pci_bus_id",
]
