"""Start the main job with glibc's malloc on transparent huge pages, without changing a number it computes.

XLA's CPU runtime allocates and frees its buffers (activations, logits, KV caches) on every step through
glibc's malloc, which hands memory back to the kernel and takes it again page by page, so that much of a job's
CPU time goes to minor page faults. With the tunable `glibc.malloc.hugetlb=1` malloc asks for transparent huge
pages (2 MiB) instead: far fewer faults and a shorter job, with the same results to the last bit
(`bench/README.md`, "Huge-page malloc for the main job"). glibc reads tunables only when a process starts,
hence the re-exec.

`COEVO_JAX_HUGEPAGE_MALLOC=0` turns it off; it is skipped where it cannot apply (not Linux with glibc, the
kernel's transparent huge pages set to `never`) and where the tunable is already set.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping

TUNABLE = "glibc.malloc.hugetlb"
SWITCH = "COEVO_JAX_HUGEPAGE_MALLOC"
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def transparent_hugepages_available(setting_path: str = THP_SETTING) -> bool:
    """Whether the kernel hands out transparent huge pages to a process that asks (`always` or `madvise`)."""
    try:
        with open(setting_path) as f:
            setting = f.read()
    except OSError:
        return False
    return "[never]" not in setting


def tunables_with_hugetlb(tunables: str | None) -> str:
    """GLIBC_TUNABLES with `glibc.malloc.hugetlb=1` added to whatever it already sets (colon-separated)."""
    entries = [entry for entry in (tunables or "").split(":") if entry]
    return ":".join([*entries, f"{TUNABLE}=1"])


def needs_reexec(environ: Mapping[str, str], *, system: str, libc: str, hugepages_available: bool) -> bool:
    """Whether the process should start again with the tunable: not yet set, not turned off, and able to work."""
    if environ.get(SWITCH, "1") == "0":
        return False
    if TUNABLE in environ.get("GLIBC_TUNABLES", ""):
        return False
    return system == "Linux" and libc == "glibc" and hugepages_available


def reexec_with_hugepage_malloc() -> None:
    """Replace this process (same PID, same command line) by one whose malloc uses huge pages; returns only
    when there is nothing to do. Call it first thing, before JAX or any thread starts."""
    if not needs_reexec(
        os.environ,
        system=platform.system(),
        libc=platform.libc_ver()[0],
        hugepages_available=transparent_hugepages_available(),
    ):
        return
    environ = dict(os.environ)
    environ["GLIBC_TUNABLES"] = tunables_with_hugetlb(environ.get("GLIBC_TUNABLES"))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environ)
