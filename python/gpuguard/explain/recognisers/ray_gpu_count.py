"""Ray's "Attempting to start raylet with N GPU, but CUDA_VISIBLE_DEVICES contains [...]"."""

from __future__ import annotations

import re

from ..model import Diagnosis, Group
from ..recogniser import Groups, Host, Line, Recogniser

# Ray, python/ray/_private/resource_and_label_spec.py (_resolve_accelerator_resources):
#   f"Attempting to start raylet with {num_accelerators} {accelerator_resource_name}, "
#   f"but {env_var} contains {visible_accelerator_ids}."
# Ray before 2.10 (ray/_private/services.py / parameter.py): "Attempting to start raylet with {} GPUs, but
# CUDA_VISIBLE_DEVICES contains {}."
_RAY_GPUS = re.compile(
    r"Attempting to start raylet with (?P<n>[\d.]{1,32}) (?P<res>\w{1,64}?)s?, but (?P<env>\w{1,128}) contains "
    r"(?P<ids>\[[^\]]{0,4096}\])")
_QUOTED = re.compile(r"'([^']*)'")


class RayGpuCount(Recogniser):
    """Ray asked for more GPUs than the visible-devices variable lets the process see."""

    kinds = ("ray_gpu_count",)
    keywords = ("Attempting to start raylet",)
    patterns = (_RAY_GPUS,)
    help = "Ray 'Attempting to start raylet with N GPU'"

    def read(self, line: Line, groups: Groups) -> bool:
        m = _RAY_GPUS.search(line.body)
        if not m:
            return False
        group = groups("ray_gpu_count")
        ids = _QUOTED.findall(m.group("ids"))
        group.add(line.number, line.body, devices=[f"{m.group('env')} entry {i!r}" for i in ids])
        group.facts.update(requested=m.group("n"), resource=m.group("res"), env=m.group("env"), ids=ids)
        return True

    def build(self, kind: str, group: Group, host: Host) -> Diagnosis:
        f = group.facts
        ids = f.get("ids", [])
        summary = (f"Ray refused to start: asked for {f.get('requested')} {f.get('resource')}, but {f.get('env')} "
                   f"lets this process see {len(ids)} ({', '.join(ids) or 'none'}).")
        cause = (f"Ray counts only the GPUs {f.get('env')} exposes. A num_gpus given to ray.init() or `ray start "
                 f"--num-gpus` (or RAY_OVERRIDE_RESOURCES) larger than that count is refused. It also happens when "
                 f"code already inside a Ray worker, whose {f.get('env')} Ray narrowed, starts a new local Ray "
                 f"instead of connecting to the running cluster.")
        fix = (f"Ask for at most {len(ids)} GPU(s), or widen/unset {f.get('env')} before starting Ray; inside an "
               f"existing cluster connect with ray.init(address='auto') instead of starting a new one.")
        return Diagnosis(kind, summary, (), tuple(group.devices), cause, fix, group.sorted_evidence(),
                         group.occurrences)
