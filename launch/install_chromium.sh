#!/usr/bin/env bash
# Makes sure a headless Chromium and its WebDriver are installed (/usr/bin/chromium, /usr/bin/chromedriver):
# the HTML report's browser test (tests/test_reporting_html.py) opens a run's report in them.
# Does nothing when both are there; otherwise installs Debian's chromium and chromium-driver with apt-get
# (through sudo when not root). Exits non-zero, saying why, when it cannot.
set -euo pipefail

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  echo "install_chromium: $(chromium --version 2>/dev/null | head -n 1) and its driver are already installed"
  exit 0
fi

here=${BASH_SOURCE[0]%/*}
[ "${here}" = "${BASH_SOURCE[0]}" ] && here=.
source "${here}/apt_install.sh"
apt_install install_chromium "chromium or chromedriver" chromium chromium-driver
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  echo "install_chromium: apt-get finished but chromium or chromedriver is not on PATH" >&2
  exit 1
fi
echo "install_chromium: $(chromium --version 2>/dev/null | head -n 1) installed"
