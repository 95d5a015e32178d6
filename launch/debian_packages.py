"""Unpack Debian packages and the shared libraries they need into a private directory, installing nothing.

    python launch/debian_packages.py --suite sid --dest DIR mysql-server-core mysql-client-core

Reads the package indexes of the suites and components given (the first listed wins where two hold a package;
Ubuntu's archive has the same layout: `--mirror http://archive.ubuntu.com/ubuntu --suite noble-updates
--suite noble --component main --component universe`), follows the packages' Depends / Pre-Depends to every
library package (names starting with `lib`, `zlib1g`, `gcc-*-base`; the first alternative of each), downloads
each `.deb`, checks it against the index's SHA-256 and unpacks it under DIR with `dpkg-deb -x`. Programs from
DIR run with DIR's own dynamic loader and libraries (launch/mysql.sh), so a package built for a newer Debian
runs here without touching the system's. DIR/packages.txt lists what was unpacked, name and version.
"""

from __future__ import annotations

import argparse
import hashlib
import lzma
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

MIRROR = "http://deb.debian.org/debian"


def parse_index(text: str) -> dict[str, dict[str, str]]:
    """Package stanzas by name (the first stanza of a name wins); `Provides` names map to their provider."""
    packages: dict[str, dict[str, str]] = {}
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = None
        for line in stanza.splitlines():
            if line.startswith((" ", "\t")) and key:
                fields[key] += "\n" + line.strip()
            elif ":" in line:
                key, value = line.split(":", 1)
                fields[key] = value.strip()
        if "Package" in fields:
            packages.setdefault(fields["Package"], fields)
    for fields in list(packages.values()):
        for provided in fields.get("Provides", "").split(","):
            provided = provided.strip().split(" ")[0]
            if provided:
                packages.setdefault(provided, fields)
    return packages


def is_library(name: str) -> bool:
    return name.startswith("lib") or name == "zlib1g" or (name.startswith("gcc-") and name.endswith("-base"))


def closure(packages: dict[str, dict[str, str]], wanted: list[str]) -> list[dict[str, str]]:
    """`wanted` and every library package they need, each once, in the order found."""
    seen: set[str] = set()
    found = []
    queue = list(wanted)
    while queue:
        name = queue.pop(0).split(":")[0]
        if name not in packages:
            if name in wanted:
                raise SystemExit(f"debian_packages: {name!r} is not in the index")
            continue
        fields = packages[name]
        if fields["Package"] in seen:
            continue
        seen.add(fields["Package"])
        found.append(fields)
        for relation in ("Pre-Depends", "Depends"):
            for alternatives in fields.get(relation, "").split(","):
                first = alternatives.split("|")[0].strip().split(" ")[0].split(":")[0]
                if first and is_library(first):
                    queue.append(first)
    return found


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=120) as response:
        return response.read()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", action="append", help="repeatable; default sid")
    parser.add_argument("--component", action="append", help="repeatable; default main")
    parser.add_argument("--mirror", default=MIRROR)
    parser.add_argument("--dest", required=True)
    parser.add_argument("packages", nargs="+")
    args = parser.parse_args(argv)
    index_urls = [
        f"{args.mirror}/dists/{suite}/{component}/binary-amd64/Packages.xz"
        for suite in args.suite or ["sid"]
        for component in args.component or ["main"]
    ]
    packages = parse_index("\n\n".join(lzma.decompress(fetch(url)).decode() for url in index_urls))
    wanted = closure(packages, args.packages)
    dest = Path(args.dest)
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        for fields in wanted:
            data = fetch(f"{args.mirror}/{fields['Filename']}")
            if hashlib.sha256(data).hexdigest() != fields["SHA256"]:
                raise SystemExit(f"debian_packages: {fields['Filename']}: SHA-256 differs from its index")
            deb = Path(scratch) / Path(fields["Filename"]).name
            deb.write_bytes(data)
            subprocess.run(["dpkg-deb", "-x", str(deb), str(dest)], check=True)
    listing = "".join(f"{fields['Package']} {fields['Version']}\n" for fields in wanted)
    (dest / "packages.txt").write_text(listing)
    print(f"debian_packages: {len(wanted)} packages from {', '.join(index_urls)} unpacked under {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
