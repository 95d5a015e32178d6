"""The main job's restart onto huge-page malloc: when it applies, what it sets, and that the restart keeps the
process (PID, command line) and applies once."""

import os
import platform
import subprocess
import sys

import pytest

from coevo_jax import hugepage_malloc


def test_tunables_keep_what_was_set():
    assert hugepage_malloc.tunables_with_hugetlb(None) == "glibc.malloc.hugetlb=1"
    assert hugepage_malloc.tunables_with_hugetlb("") == "glibc.malloc.hugetlb=1"
    assert (
        hugepage_malloc.tunables_with_hugetlb("glibc.malloc.arena_max=2")
        == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    )


@pytest.mark.parametrize(
    "environ, system, libc, available, expected",
    [
        ({}, "Linux", "glibc", True, True),
        ({"COEVO_JAX_HUGEPAGE_MALLOC": "0"}, "Linux", "glibc", True, False),
        ({"COEVO_JAX_HUGEPAGE_MALLOC": "1"}, "Linux", "glibc", True, True),
        ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, "Linux", "glibc", True, False),  # the user's choice
        ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}, "Linux", "glibc", True, False),  # already restarted
        ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "Linux", "glibc", True, True),
        ({}, "Darwin", "", True, False),
        ({}, "Linux", "musl", True, False),
        ({}, "Linux", "glibc", False, False),
    ],
)
def test_needs_reexec(environ, system, libc, available, expected):
    assert (
        hugepage_malloc.needs_reexec(environ, system=system, libc=libc, hugepages_available=available)
        is expected
    )


def test_transparent_hugepages_setting(tmp_path):
    setting = tmp_path / "enabled"
    for text, available in [
        ("always [madvise] never\n", True),
        ("[always] madvise never\n", True),
        ("always madvise [never]\n", False),
    ]:
        setting.write_text(text)
        assert hugepage_malloc.transparent_hugepages_available(str(setting)) is available
    assert not hugepage_malloc.transparent_hugepages_available(str(tmp_path / "missing"))


def _run(environ):
    code = (
        "import os, sys; print('pid', os.getpid(), sys.argv[1:], flush=True)\n"
        "from coevo_jax import hugepage_malloc\n"
        "hugepage_malloc.reexec_with_hugepage_malloc()\n"
        "print('tunables', os.getpid(), os.environ.get('GLIBC_TUNABLES', ''))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, "an-argument"],
        env=environ,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.splitlines()


@pytest.mark.skipif(
    platform.system() != "Linux"
    or platform.libc_ver()[0] != "glibc"
    or not hugepage_malloc.transparent_hugepages_available(),
    reason="needs Linux with glibc and transparent huge pages",
)
def test_restart_keeps_the_process_and_happens_once():
    environ = {
        k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "COEVO_JAX_HUGEPAGE_MALLOC")
    }
    lines = _run(environ)
    assert len(lines) == 3, lines  # started, restarted once, went on
    pids = {line.split()[1] for line in lines}
    assert len(pids) == 1  # execve: the same process for launchers and kill-and-resume
    assert lines[0] == lines[1] and lines[0].endswith("['an-argument']")  # the same command line
    assert lines[2].split()[2] == "glibc.malloc.hugetlb=1"

    lines = _run({**environ, "COEVO_JAX_HUGEPAGE_MALLOC": "0"})
    assert len(lines) == 2 and lines[1].split()[2:] == []  # turned off: no restart, nothing set
