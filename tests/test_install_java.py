"""launch/install_java.sh: no-op with Java >= 11, apt-get install of default-jre-headless otherwise.

Runs the script with stand-in `java`, `apt-get`, `sudo` and `id` programs on PATH (plus the real basic tools),
so the decision logic is exercised without touching the machine.
"""

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "launch" / "install_java.sh"


def _fake_bin(tmp_path: Path, java_version: str | None, *, root: bool, installs: str | None) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"

    def write(name, body):
        path = bin_dir / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o755)

    if java_version is not None:
        write("java", f"echo 'openjdk version \"{java_version}\" 2024-01-01' >&2\n")
    new_java = f"printf '#!/bin/sh\\necho openjdk version \\\"{installs}\\\" >&2\\n' > {bin_dir}/java; chmod +x {bin_dir}/java\n"
    write("apt-get", f'echo "apt-get $*" >> {log}\n' + (new_java if installs else ""))
    write("sudo", f'echo "sudo $1" >> {log}\n"$@"\n')
    write("id", f"echo {0 if root else 1000}\n")
    for tool in ("awk", "head", "bash", "env", "chmod", "sh"):
        found = subprocess.run(["which", tool], capture_output=True, text=True).stdout.strip()
        os.symlink(found, bin_dir / tool)
    return bin_dir


def _run(bin_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(bin_dir / "bash"), str(SCRIPT)], capture_output=True, text=True, env={"PATH": str(bin_dir)}
    )


def test_a_recent_java_is_left_alone(tmp_path):
    result = _run(_fake_bin(tmp_path, "17.0.15", root=True, installs=None))
    assert result.returncode == 0 and "already installed" in result.stdout
    assert not (tmp_path / "calls.log").exists()


@pytest.mark.parametrize("version", [None, "1.8.0_401"])
@pytest.mark.parametrize("root", [True, False])
def test_missing_or_old_java_is_installed_with_apt(tmp_path, version, root):
    result = _run(_fake_bin(tmp_path, version, root=root, installs="17.0.2"))
    assert result.returncode == 0, result.stderr
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert any("install -y -q --no-install-recommends default-jre-headless" in c for c in calls)
    assert any(c.startswith("sudo") for c in calls) == (not root)
    assert '"17.0.2" installed' in result.stdout
