"""Who sits where in a Ray job: each actor publishes its binding to its group's rendezvous; the driver tabulates.

The rows are published by ``bind()`` right after this rank's device is resolved and before the cross-rank
check, so the report also shows placements the check then refused. A row is plain data (bind() builds it),
so this module knows nothing of ``Binding``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Iterable, Optional

from .store import RayStore, in_ray_worker

BINDING_PREFIX = "gpuguard/ray/binding/"
_MAX_ROW_BYTES = 16 << 10  # a row is a few hundred bytes; anything bigger is not ours


def gpu_share_text(fraction: Optional[float]) -> str:
    """1/3 for 0.3333, 1 for 1.0, 2 for 2.0; Ray reports shares rounded to 4 decimals."""
    if fraction is None:
        return "?"
    if fraction <= 0:
        return "0"
    if fraction < 1:
        share = Fraction(fraction).limit_denominator(64)
        if abs(float(share) - fraction) < 1e-3:
            return f"{share.numerator}/{share.denominator}"
    return f"{fraction:g}"


def _ray_facts() -> dict[str, Any]:
    """Where Ray runs this worker: node, job, actor, placement group. {} outside Ray."""
    if not in_ray_worker():
        return {}
    import ray

    ctx = ray.get_runtime_context()
    return {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(), "job_id": ctx.get_job_id(),
            "actor_id": ctx.get_actor_id(), "placement_group_id": ctx.get_placement_group_id()}


def publish_row(store: RayStore, row: dict[str, Any]) -> None:
    """Puts this rank's row (``group``, ``rank``, where it runs) where ``RayPlacement.report()`` reads it: the
    group's rendezvous actor. Ray's own facts (node, job, actor, placement group) are added here."""
    store.set(f"{BINDING_PREFIX}{row['rank']}", json.dumps({**row, **_ray_facts()}, sort_keys=True))


@dataclass(frozen=True)
class PlacementReport:
    """Rank → node, Ray GPU ids, GPU share, UUID for every group of a placement. ``str()`` is the table."""

    rows: list[dict[str, Any]]
    missing: dict[str, list[int]] = field(default_factory=dict)  # group → ranks that have not bound yet

    def as_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "missing": self.missing, "shared_gpus": self.shared_gpus(),
                "summary": self.summary()}

    def shared_gpus(self) -> list[dict[str, Any]]:
        """Within one group, GPUs (by UUID) that more than one rank reported: what bind() refuses."""
        by_device: dict[tuple[str, str], list[int]] = {}
        for row in self.rows:
            if row.get("uuid"):
                by_device.setdefault((row["group"], row["uuid"]), []).append(int(row["rank"]))
        return [{"group": g, "uuid": u, "ranks": sorted(r)} for (g, u), r in sorted(by_device.items())
                if len(r) > 1]

    def summary(self) -> list[str]:
        lines = []
        for group in sorted({r["group"] for r in self.rows}):
            shares = sorted({gpu_share_text(r.get("gpu_fraction")) for r in self.rows if r["group"] == group})
            if len(shares) == 1:
                lines.append(f"Ray gave the actors of group {group!r} {shares[0]} GPU each")
            else:
                lines.append(f"Ray gave the actors of group {group!r} GPU shares of {', '.join(shares)}")
        for shared in self.shared_gpus():
            lines.append(f"group {shared['group']!r}: ranks {', '.join(map(str, shared['ranks']))} share GPU "
                         f"{shared['uuid']}: NCCL refuses that; use max_colocate=1")
        for group, ranks in sorted(self.missing.items()):
            lines.append(f"group {group!r}: ranks {_ranges(ranks)} have not called gpuguard.bind() yet")
        return lines

    def __str__(self) -> str:
        header = ["group", "rank", "node", "Ray GPU ids", "share", "device", "GPU UUID", "PCI bus id", "pid"]
        table = [header] + [[
            str(r["group"]), str(r["rank"]), str(r.get("node_ip") or r.get("hostname") or "?"),
            ",".join(r.get("ray_gpu_ids") or []) or "-", gpu_share_text(r.get("gpu_fraction")),
            str(r.get("device") or "?"), str(r.get("uuid") or "?"), str(r.get("pci_bus_id") or "?"),
            str(r.get("pid") or "?"),
        ] for r in self.rows]
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
        return "\n".join(lines + self.summary())


def _ranges(ranks: Iterable[int]) -> str:
    """0, 2-5, 9: consecutive ranks folded, so a report of 1,000 missing ranks stays one line."""
    parts: list[list[int]] = []
    for r in sorted(ranks):
        if parts and parts[-1][1] == r - 1:
            parts[-1][1] = r
        else:
            parts.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)


def read_report(groups: dict[str, int], *, job_id: Optional[str] = None) -> PlacementReport:
    """Reads what the ranks of ``groups`` (name → world size) published. Rows are checked, not trusted."""
    rows: list[dict[str, Any]] = []
    missing: dict[str, list[int]] = {}
    for group, world_size in groups.items():
        store = RayStore(group, job_id=job_id, create=False)
        seen: set[int] = set()
        for key, value in store.scan(BINDING_PREFIX).items():
            row = _parse_row(value)
            if row is None or row.get("group") != group or f"{BINDING_PREFIX}{row.get('rank')}" != key:
                continue
            rows.append(row)
            seen.add(int(row["rank"]))
        absent = [r for r in range(world_size) if r not in seen]
        if absent:
            missing[group] = absent
    rows.sort(key=lambda r: (r["group"], r["rank"]))
    return PlacementReport(rows=rows, missing=missing)


def _parse_row(value: bytes) -> Optional[dict[str, Any]]:
    if len(value) > _MAX_ROW_BYTES:
        return None
    try:
        row = json.loads(value.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(row, dict) or not isinstance(row.get("rank"), int) or not isinstance(row.get("group"), str):
        return None
    return row
