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

from .explainer import CONTEXT_CHARS, CONTEXT_LINES, LogExplainer, explain, explain_file, format_diagnoses, kinds_in
from .lines import MAX_LINE_CHARS, iter_lines
from .model import MAX_DEVICES, MAX_EVIDENCE, MAX_RANKS, Diagnosis, Evidence
from .recogniser import Recogniser
from .recognisers.duplicate_gpu import nccl_device_to_pci_bus_id
from .registry import HELP, KEYWORDS, KINDS, RECOGNISERS

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
