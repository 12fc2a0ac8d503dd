"""Gives a fresh venv the torch of another venv, and nothing else: torch and what it requires (markers evaluated, with
the extras asked for), each one's files as its RECORD lists them, hard-linked (no download; the console scripts,
torchrun and the like, are left out). scripts/check_source_install.sh and scripts/check_wheel_install.sh make their
fresh venvs with it:
  OTHER_VENV/bin/python scripts/venv_with_torch.py FRESH_VENV_SITE_PACKAGES
"""

import importlib.metadata as metadata
import os
import re
import shutil
import sys
from pathlib import Path

from pip._vendor.packaging.requirements import Requirement

dest = Path(sys.argv[1])
wanted, seen, done = [("torch", frozenset())], {}, set()
while wanted:
    name, extras = wanted.pop()
    name = re.sub(r"[-_.]+", "-", name).lower()
    if name not in seen:
        seen[name] = metadata.distribution(name)
    for extra in {"", *extras} - {e for n, e in done if n == name}:
        done.add((name, extra))
        for line in seen[name].requires or []:
            req = Requirement(line)
            if req.marker.evaluate({"extra": extra}) if req.marker else extra == "":
                wanted.append((req.name, frozenset(req.extras)))
for present in metadata.distributions(path=[str(dest)]):  # the venv's own setuptools: replaced, as pip would
    if re.sub(r"[-_.]+", "-", present.metadata["Name"]).lower() in seen:
        paths = [Path(present.locate_file(file)) for file in present.files or []]
        for path in paths:
            path.unlink(missing_ok=True)
        for folder in sorted({path.parent for path in paths}, key=lambda f: len(f.parts), reverse=True):
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
site = Path(seen["torch"].locate_file("")).resolve()
count = 0
for dist in seen.values():
    for file in dist.files or []:
        source = Path(dist.locate_file(file)).resolve()
        if site not in source.parents or not source.is_file():
            continue  # console scripts (bin/torchrun, ...) name the other venv's interpreter
        target = dest / source.relative_to(site)
        if target.exists() and target.samefile(source):
            continue  # a file two distributions both list (the nvidia-* wheels' shared nvidia/__init__.py)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)
        try:
            os.link(source, target)
        except OSError:  # another file system
            shutil.copy2(source, target)
        count += 1
names = ", ".join(sorted(dist.metadata["Name"] + " " + dist.version for dist in seen.values()))
print(f"the fresh venv has {names} ({count} files)")
