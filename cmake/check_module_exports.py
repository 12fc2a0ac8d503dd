"""Fails the build of a Python extension module that exports more than its PyInit_ function, naming each symbol
and why it is dangerous in a process it shares with torch. Run by CMake after linking each module, beside
check_module_loads.py:
  python cmake/check_module_exports.py READELF PATH gpuguard._core
A module exporting symbols of the C++ standard library can break its host process: the dynamic loader merges GNU
unique symbols (the `id`s of the iostream facets) across the whole process, even under RTLD_LOCAL, so a module
that links libstdc++ statically (some toolchains' default) hands torch's shared libstdc++ its own facet numbering,
and torch's iostream code then calls the wrong facet (SIGSEGV; shared/notes/gpu-image.md). Ordinary exported
symbols can bind to, or be bound by, another library's copy. The cure is csrc/python/CMakeLists.txt's version
script (only PyInit_ global, `local: *`), with -Wl,--exclude-libs,ALL and hidden visibility.
"""

from __future__ import annotations

import os
import subprocess
import sys

SHOWN = 12  # symbols named per cause; the counts cover them all


def exported_symbols(readelf: str, path: str) -> list[tuple[str, str]]:
    """(name, binding) of each symbol the module defines in its dynamic symbol table."""
    out = subprocess.run([readelf, "--dyn-syms", "--wide", path], check=True, capture_output=True, text=True).stdout
    symbols = []
    for line in out.splitlines():
        # Num: Value Size Type Bind Vis Ndx Name
        fields = line.split()
        if len(fields) < 8 or not fields[0][:-1].isdigit() or fields[6] == "UND" or fields[4] == "LOCAL":
            continue
        symbols.append((fields[7].split("@")[0], fields[4]))
    return symbols


def corrupt_entries(readelf: str, path: str) -> list[str]:
    """The entries of the module's dynamic symbol table that readelf cannot read (its "<corrupt>" name): GNU ld 2.40
    wrote one where a reference bound to a symbol version by .symver met an unversioned definition of the same
    symbol in a library the module links (torch 2.14's libtorch_python exports exception_ptr's destructor)."""
    out = subprocess.run([readelf, "--dyn-syms", "--wide", path], check=True, capture_output=True, text=True).stdout
    return [" ".join(line.split()) for line in out.splitlines() if "<corrupt>" in line]


def demangled(names: list[str]) -> list[str]:
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return names
    lines = out.splitlines()
    return lines if len(lines) == len(names) else names


def cause(name: str, readable: str, binding: str) -> str:
    if binding == "UNIQUE":
        return ("GNU unique: the dynamic loader merges it across the whole process, even under RTLD_LOCAL, so other "
                "libraries use this module's copy; from a statically linked libstdc++ (the iostream facets' ids) "
                "torch's iostream code then calls the wrong facet")
    if "std::locale" in readable or "std::ios_base" in readable or "facet" in readable:
        return ("the iostream locale machinery of a libstdc++ inside the module: its facets can take the place of the "
                "process's shared libstdc++'s")
    # the entity's own qualified name: before its template arguments and parameters, after "vtable for " and
    # a return type
    entity = readable.split("(")[0].split("<")[0].split(" ")[-1]
    if entity.startswith(("std::", "__gnu_cxx::", "__cxxabiv1::", "__gnu_debug::")) \
            or name.startswith(("__cxa", "__gxx", "_Unwind", "__gcc", "_txnal_", "__dynamic_cast", "__once_",
                                "__emutls", "_ZdlPv", "_ZdaPv", "_Znwm", "_Znam")):
        return ("the C++ runtime (libstdc++/libgcc code or an instance of its templates): another library's copy can "
                "bind to it, or it to theirs")
    return "gpuguard's own code, or a library it links: visible to every library loaded after it"


def main(argv: list[str]) -> int:
    readelf, path, module = argv[0], argv[1], argv[2]
    allowed = "PyInit_" + module.rsplit(".", 1)[-1]
    corrupt = corrupt_entries(readelf, path)
    if corrupt:
        os.remove(path)
        print(f"gpuguard: the linker wrote {len(corrupt)} corrupt entr{'y' if len(corrupt) == 1 else 'ies'} into the "
              f"dynamic symbol table of the module just built, {path}: " + "; ".join(corrupt[:SHOWN])
              + ". It was removed: the dynamic loader would read a symbol of no name, binding and version. A "
              "reference versioned by .symver (cmake/libstdcxx_gcc8_compat.cc) beside a library that defines the "
              "same symbol unversioned did this with GNU ld 2.40.", file=sys.stderr)
        return 1
    symbols = exported_symbols(readelf, path)
    extra = [(n, b) for n, b in symbols if n != allowed]
    if any(n == allowed for n, _ in symbols) and not extra:
        return 0
    readable_names = demangled([n for n, _ in extra])
    by_cause: dict[str, list[str]] = {}
    for (name, binding), readable in zip(extra, readable_names):
        by_cause.setdefault(cause(name, readable, binding), []).append(f"{readable} ({binding.lower()})")
    lines = [f"gpuguard: the module just built, {path}, exports {len(extra)} symbol(s) besides {allowed}"
             + ("" if any(n == allowed for n, _ in symbols) else f", and not {allowed} itself") + ":"]
    order = ("GNU unique", "the iostream", "the C++ runtime")  # the most dangerous first
    for why, names in sorted(by_cause.items(), key=lambda item: next(
            (i for i, start in enumerate(order) if item[0].startswith(start)), len(order))):
        lines.append(f"  {len(names)} from {why}:")
        lines += [f"    exports {n}" for n in names[:SHOWN]]
        if len(names) > SHOWN:
            lines.append(f"    ... and {len(names) - SHOWN} more")
    unique = sum(1 for _, b in extra if b == "UNIQUE")
    locale = sum(1 for r in readable_names if "std::locale" in r)
    lines.append(f"  In all: {unique} GNU unique, {locale} naming std::locale.")
    lines.append("It was removed. Such a module can crash the process it is imported into. Link it with "
                 "csrc/python/CMakeLists.txt's version script (global: PyInit_*; local: *;), -Wl,--exclude-libs,ALL "
                 "and hidden visibility; a build that replaces the link options (LDFLAGS with its own "
                 "--version-script) loses them.")
    os.remove(path)
    print("\n".join(lines), file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
