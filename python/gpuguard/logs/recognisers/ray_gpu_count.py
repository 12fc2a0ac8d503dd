"""Ray's "Attempting to start raylet with N GPU, but CUDA_VISIBLE_DEVICES contains [...]"."""

from __future__ import annotations

import re

from ..model import Diagnosis, Group
from ..recogniser import Example, Groups, Host, Line, Recogniser

# Ray, python/ray/_private/resource_and_label_spec.py (_resolve_accelerator_resources):
#   f"Attempting to start raylet with {num_accelerators} {accelerator_resource_name}, "
#   f"but {env_var} contains {visible_accelerator_ids}."
# Ray before 2.10 (ray/_private/services.py / parameter.py): "Attempting to start raylet with {} GPUs, but
# CUDA_VISIBLE_DEVICES contains {}."
_RAY_GPUS = re.compile(
    r"Attempting to start raylet with (?P<n>[\d.]{1,32}) (?P<res>\w{1,64}?)s?, but (?P<env>\w{1,128}) contains "
    r"(?P<ids>\[[^\]]{0,4096}\])")
_QUOTED = re.compile(r"'([^']*)'")


def _ids(text: str) -> tuple[str, ...]:
    """The entries of the list Ray printed; a list that holds something but no quoted entry is not read."""
    ids = tuple(_QUOTED.findall(text))
    if not ids and text.strip("[] "):
        raise ValueError(text)
    return ids


class RayGpuCount(Recogniser):
    """Ray asked for more GPUs than the visible-devices variable lets the process see."""

    kinds = ("ray_gpu_count",)
    keywords = ("Attempting to start raylet",)
    patterns = (_RAY_GPUS,)
    help = "Ray 'Attempting to start raylet with N GPU'"
    examples = (
        # resource_and_label_spec.py's ValueError, as ray.init(num_gpus=4) with CUDA_VISIBLE_DEVICES=2,3 raises it
        Example("ValueError: Attempting to start raylet with 4 GPU, but CUDA_VISIBLE_DEVICES contains ['2', '3'].\n",
                "ray_gpu_count", (), ("asked for 4 GPU", "see 2 (2, 3)")),
    )

    def read(self, line: Line, groups: Groups) -> bool:
        m = _RAY_GPUS.search(line.body)
        if not m:
            return False
        group = groups("ray_gpu_count")
        requested, ids = line.value(m, "n"), line.value(m, "ids", _ids)
        if requested is None:
            group.unreadable("the number of GPUs asked for")
        if ids is None:
            group.unreadable(f"the entries of {m.group('env')}")
        group.add(line.number, line.body, devices=[f"{m.group('env')} entry {i!r}" for i in ids or ()])
        group.facts.update(requested=requested or "an unreadable number of", resource=m.group("res"),
                           env=m.group("env"), ids=list(ids) if ids is not None else None)
        return True

    def build(self, kind: str, group: Group, host: Host) -> Diagnosis:
        f = group.facts
        ids = f.get("ids")
        seen = f"{len(ids)} ({', '.join(ids) or 'none'})" if ids is not None else "fewer (how many is unreadable)"
        summary = (f"Ray refused to start: asked for {f.get('requested')} {f.get('resource')}, but {f.get('env')} "
                   f"lets this process see {seen}.")
        cause = (f"Ray counts only the GPUs {f.get('env')} exposes. A num_gpus given to ray.init() or `ray start "
                 f"--num-gpus` (or RAY_OVERRIDE_RESOURCES) larger than that count is refused. It also happens when "
                 f"code already inside a Ray worker, whose {f.get('env')} Ray narrowed, starts a new local Ray "
                 f"instead of connecting to the running cluster.")
        most = f"at most {len(ids)} GPU(s)" if ids is not None else f"no more GPUs than {f.get('env')} lists"
        fix = (f"Ask for {most}, or widen/unset {f.get('env')} before starting Ray; inside an "
               f"existing cluster connect with ray.init(address='auto') instead of starting a new one.")
        return Diagnosis(kind, summary, (), tuple(group.devices), cause, fix, group.sorted_evidence(),
                         group.occurrences)
