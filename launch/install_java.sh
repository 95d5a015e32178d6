#!/usr/bin/env bash
# Makes sure a Java runtime >= 11 is on PATH (ScienceWorld's simulator is a JVM program).
# Does nothing when one is there; otherwise installs Debian/Ubuntu's default-jre-headless with apt-get
# (through sudo when not root). Exits non-zero, saying why, when it cannot.
set -euo pipefail

java_major() {
  # `java -version` prints e.g. 'openjdk version "17.0.15" ...' or 'java version "1.8.0_401"' on stderr.
  local version
  version=$(java -version 2>&1 | awk -F '"' '/version/ {print $2; exit}')
  version=${version#1.}
  echo "${version%%[.+-]*}"
}

if command -v java >/dev/null 2>&1 && [ "$(java_major)" -ge 11 ] 2>/dev/null; then
  echo "install_java: $(java -version 2>&1 | head -n 1) is already installed"
  exit 0
fi

here=${BASH_SOURCE[0]%/*}
[ "${here}" = "${BASH_SOURCE[0]}" ] && here=.
source "${here}/apt_install.sh"
apt_install install_java "Java >= 11" default-jre-headless
if [ "$(java_major)" -lt 11 ]; then
  echo "install_java: the installed Java is older than 11: $(java -version 2>&1 | head -n 1)" >&2
  exit 1
fi
echo "install_java: $(java -version 2>&1 | head -n 1) installed"
