"""The libraries a shared object needs and where it asks the dynamic loader to look (DT_NEEDED, DT_RPATH,
DT_RUNPATH), read from its ELF dynamic section without loading it, and the file the loader would pick for one.

Reads only the headers, the dynamic section and the few strings it names: torch's libtorch_cuda.so is 900 MB,
its dynamic string table alone 11 MB. 64-bit little-endian objects only (x86_64, aarch64: what gpuguard builds
for); anything else reads as None and the caller falls back.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import BinaryIO, Optional

_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_NEEDED, _DT_STRTAB, _DT_RPATH, _DT_RUNPATH = 0, 1, 5, 15, 29


@dataclass(frozen=True)
class DynamicSection:
    path: str
    needed: tuple[str, ...]   # DT_NEEDED, in order
    rpath: Optional[str]      # DT_RPATH, as written ("$ORIGIN/../../nvidia/nccl/lib:...")
    runpath: Optional[str]    # DT_RUNPATH

    def search_path(self, ld_library_path: Optional[str]) -> list[tuple[str, str]]:
        """The folders the loader searches for this object's DT_NEEDED entries, before its cache and default
        folders, each with the entry that named it: DT_RPATH (only without DT_RUNPATH), LD_LIBRARY_PATH, DT_RUNPATH
        (ld.so(8), "Rpath token expansion"). $ORIGIN is this object's folder."""
        origin = os.path.dirname(os.path.abspath(self.path))

        def expand(entries: Optional[str], name: str) -> list[tuple[str, str]]:
            out = []
            for entry in (entries or "").split(":"):
                if entry:
                    folder = entry.replace("${ORIGIN}", origin).replace("$ORIGIN", origin)
                    out.append((os.path.normpath(folder), f"{name} entry {entry}"))
            return out

        folders = expand(self.rpath, "DT_RPATH") if self.runpath is None else []
        folders += expand(ld_library_path, "LD_LIBRARY_PATH")
        folders += expand(self.runpath, "DT_RUNPATH")
        return folders

    def resolve(self, needed: str, ld_library_path: Optional[str]) -> Optional[tuple[str, str]]:
        """The file the loader would open for `needed` from this object's own search path, with the entry that
        found it; None when the loader would go on to its cache and default folders."""
        for folder, entry in self.search_path(ld_library_path):
            candidate = os.path.join(folder, needed)
            if os.path.isfile(candidate):
                return candidate, entry
        return None


def _string_at(f: BinaryIO, offset: int) -> str:
    f.seek(offset)
    out = b""
    while b"\0" not in out:
        chunk = f.read(256)
        if not chunk:
            break
        out += chunk
    return out.split(b"\0", 1)[0].decode("utf-8", "replace")


def read_dynamic_section(path: str) -> Optional[DynamicSection]:
    """The object's DT_NEEDED, DT_RPATH and DT_RUNPATH; None for a file that is missing, not a 64-bit
    little-endian ELF object, or has no dynamic section."""
    try:
        with open(path, "rb") as f:
            header = f.read(64)
            if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
                return None
            (phoff,) = struct.unpack_from("<Q", header, 0x20)
            phentsize, phnum = struct.unpack_from("<HH", header, 0x36)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
            loads: list[tuple[int, int, int]] = []
            dynamic: Optional[tuple[int, int]] = None
            for i in range(phnum):
                p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", table, i * phentsize)
                if p_type == _PT_LOAD:
                    loads.append((p_vaddr, p_offset, p_filesz))
                elif p_type == _PT_DYNAMIC:
                    dynamic = (p_offset, p_filesz)
            if dynamic is None:
                return None
            f.seek(dynamic[0])
            data = f.read(dynamic[1])
            entries: list[tuple[int, int]] = []
            for at in range(0, len(data) - 15, 16):
                tag, value = struct.unpack_from("<qQ", data, at)
                if tag == _DT_NULL:
                    break
                entries.append((tag, value))
            strtab = next((v for t, v in entries if t == _DT_STRTAB), None)
            # DT_STRTAB is an address; the strings are read at its offset in the file (they differ in torch's)
            base = next((off + strtab - vaddr for vaddr, off, size in loads
                         if strtab is not None and vaddr <= strtab < vaddr + size), None)
            if base is None:
                return None
            needed = tuple(_string_at(f, base + v) for t, v in entries if t == _DT_NEEDED)
            rpath = next((_string_at(f, base + v) for t, v in entries if t == _DT_RPATH), None)
            runpath = next((_string_at(f, base + v) for t, v in entries if t == _DT_RUNPATH), None)
            return DynamicSection(path, needed, rpath, runpath)
    except (OSError, struct.error):
        return None
