"""launch/debian_packages.py: which packages a private MySQL root gets from a Debian package index."""

import importlib.util
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "debian_packages", Path(__file__).parents[1] / "launch" / "debian_packages.py"
)
debian_packages = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(debian_packages)

INDEX = """Package: mysql-server-core
Version: 9.7.4-2
Depends: libc6 (>= 2.38), libssl3t64 (>= 3.0.0) | libssl-other, perl:any, libgcc-s1
Filename: pool/main/m/mysql-9.7/mysql-server-core_9.7.4-2_amd64.deb
SHA256: aa

Package: libc6
Version: 2.43-7
Depends: libgcc-s1
Description: GNU C Library
 continued description line: Depends: libnot-a-dependency
Filename: pool/main/g/glibc/libc6_2.43-7_amd64.deb
SHA256: bb

Package: libgcc-s1
Version: 16.2.0-4
Pre-Depends: gcc-16-base (= 16.2.0-4)
Filename: pool/main/g/gcc-16/libgcc-s1_16.2.0-4_amd64.deb
SHA256: cc

Package: gcc-16-base
Version: 16.2.0-4
Filename: pool/main/g/gcc-16/gcc-16-base_16.2.0-4_amd64.deb
SHA256: dd

Package: libssl3t64
Version: 3.6.5-1
Provides: libssl3 (= 3.6.5-1)
Filename: pool/main/o/openssl/libssl3t64_3.6.5-1_amd64.deb
SHA256: ee

Package: libssl3t64
Version: 3.0.0-1
Filename: pool/main/o/openssl/libssl3t64_3.0.0-1_amd64.deb
SHA256: ff

Package: perl
Version: 5.40
Filename: pool/main/p/perl/perl_5.40_amd64.deb
SHA256: 00

Package: mysql-client-core
Version: 9.7.4-2
Depends: libssl3
Filename: pool/main/m/mysql-9.7/mysql-client-core_9.7.4-2_amd64.deb
SHA256: 11
"""


def test_the_closure_takes_every_library_once_and_nothing_else():
    packages = debian_packages.parse_index(INDEX)
    found = debian_packages.closure(packages, ["mysql-server-core", "mysql-client-core"])
    names = [(fields["Package"], fields["Version"]) for fields in found]
    assert names == [
        ("mysql-server-core", "9.7.4-2"),
        ("mysql-client-core", "9.7.4-2"),
        ("libc6", "2.43-7"),
        ("libssl3t64", "3.6.5-1"),  # the first stanza of a name; `libssl3` found through Provides
        ("libgcc-s1", "16.2.0-4"),
        ("gcc-16-base", "16.2.0-4"),  # a Pre-Depends
    ]  # perl is a program, not a library; the description line is no dependency


def test_a_package_the_index_lacks_is_named():
    packages = debian_packages.parse_index(INDEX)
    with pytest.raises(SystemExit, match="'mysql-server-core-8.0' is not in the index"):
        debian_packages.closure(packages, ["mysql-server-core-8.0"])
