# Sourced by the install scripts: `apt_install WHO WHAT PACKAGE...` installs Debian packages with apt-get
# (through sudo when not root), or exits non-zero saying why it cannot (WHO: the script, WHAT: what is missing).
apt_install() {
  local who=$1 what=$2 sudo=""
  shift 2
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "${who}: ${what} is missing and apt-get is not available; install it by hand" >&2
    exit 1
  fi
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
      echo "${who}: ${what} is missing and installing it needs root (no sudo found)" >&2
      exit 1
    fi
  fi
  echo "${who}: installing $* with apt-get"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "$@"
}
