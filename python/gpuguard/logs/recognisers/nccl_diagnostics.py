"""NCCL 2.31's RAS diagnostics (NCCL_RUN_RAS_DIAGNOSTICS=1 or `ncclras -D`): checks that disagree across ranks."""

from __future__ import annotations

import re

from ..model import Diagnosis, Group
from ..recogniser import Example, Groups, Host, Line, Recogniser

# The NCCL User Guide, Troubleshooting > RAS > RAS Diagnostics (docs/troubleshooting/ras.rst, NCCL 2.31):
#   node042:12345 NCCL DIAG [OK]   GPU inventory: 8x NVIDIA H100 per node consistent across 8 ranks in comm 0x1234
#   node042:12345 NCCL DIAG [INFO] NCCL environment: mismatch across 8 ranks in comm 0x1234 for NCCL_DEBUG
#   node042:12345 NCCL DIAG [INFO] NCCL environment: NCCL_DEBUG=INFO on rank(s) {0,1,2,3}
# "[INFO] identifies a condition that may require review"; [OK] lines are not findings.
_DIAG_INFO = re.compile(r"NCCL DIAG \[INFO\]\s{1,8}(?P<check>[A-Za-z][\w ]{0,63}): (?P<what>.{1,1024})")
_RANKS = re.compile(r"on rank\(s\) \{(?P<ranks>[\d,]{1,4096})")

KIND = "nccl_ras_diagnostics"


class NcclDiagnostics(Recogniser):
    """A readiness check NCCL ran across the ranks of a communicator that found them inconsistent."""

    kinds = (KIND,)
    keywords = ("NCCL DIAG [INFO]",)
    patterns = (_DIAG_INFO,)
    help = "NCCL RAS diagnostics findings (NCCL_RUN_RAS_DIAGNOSTICS)"
    examples = (
        # the NCCL User Guide, Troubleshooting > RAS > RAS Diagnostics (NCCL 2.31)
        Example("node042:12345 NCCL DIAG [OK]   GPU inventory: 8x NVIDIA H100 per node consistent across 8 ranks in "
                "comm 0x1234\n"
                "node042:12345 NCCL DIAG [INFO] NCCL environment: NCCL_DEBUG=WARN on rank(s) {4,5,6,7}\n",
                KIND, (4, 5, 6, 7), ("NCCL environment: NCCL_DEBUG=WARN on rank(s) {4,5,6,7}",)),
    )

    def read(self, line: Line, groups: Groups) -> bool:
        m = _DIAG_INFO.search(line.body)
        if not m:
            return False
        group = groups(KIND)
        r = _RANKS.search(line.body, m.start("what"))
        ranks = line.value(r, "ranks", lambda t: tuple(int(x) for x in t.split(",") if x)) if r else ()
        if ranks is None:
            group.unreadable("the ranks")
        group.add(line.number, line.body.strip(), ranks=ranks or ())
        what = m.group("what")
        if ranks is None and r is not None:  # the finding quoted without the ranks it cannot tell
            what = line.body[m.start("what"):r.start("ranks")] + "(unreadable)" + line.body[r.end("ranks"):m.end("what")]
        elif line.value(m, "what") is None or line.value(m, "check") is None:  # quoted across a line break that
            # may or may not be a space
            group.unreadable("the finding's exact words (a line break runs through them)")
        findings: dict[str, None] = group.facts.setdefault("findings", {})
        if len(findings) < 32:
            findings.setdefault(f"{m.group('check')}: {what.strip()}", None)
        return True

    def build(self, kind: str, group: Group, host: Host) -> Diagnosis:
        findings = tuple(group.facts.get("findings", {}))
        summary = "NCCL's RAS diagnostics found the ranks of a communicator inconsistent: " + "; ".join(findings[:4]) + \
            ("; ..." if len(findings) > 4 else "") + "."
        cause = ("NCCL compares what every rank reports (GPU count and model, CUDA driver version, ECC errors, "
                 "NVLink state, NCCL_* variables). Ranks that differ run the same collectives on different "
                 "settings or hardware, which can hang or slow a job (a different NCCL_P2P_*/NCCL_IB_* setting, a "
                 "GPU with uncorrected ECC errors, a down NVLink).")
        fix = ("Make the named ranks agree: export the same NCCL_* variables to every rank (the launcher's "
               "environment, not a per-node shell profile), move the job off a node whose GPU reports ECC errors "
               "or inactive NVLinks, and run the same driver on every node. [INFO] lines are for review; a "
               "difference made on purpose (NCCL_DEBUG on some ranks) is harmless.")
        return Diagnosis(kind, summary, tuple(sorted(group.ranks)), (), cause, fix, group.sorted_evidence(),
                         group.occurrences)
