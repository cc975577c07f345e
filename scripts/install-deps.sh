#!/usr/bin/env bash
# Installs what the build and the tests need and is missing; a no-op when everything is there.
# Debian packages through apt-get. Never run on the GPU image (make test-gpu does not call it).
set -euo pipefail

need_apt=()
have() { command -v "$1" >/dev/null 2>&1; }
have cmake || need_apt+=(cmake)
have g++ || need_apt+=(g++)
have ninja || need_apt+=(ninja-build)
have python3 || need_apt+=(python3)
[ -f /usr/include/gtest/gtest.h ] || [ -f /usr/src/googletest/CMakeLists.txt ] || need_apt+=(libgtest-dev)

if [ ${#need_apt[@]} -gt 0 ]; then
  echo "install-deps: apt-get install ${need_apt[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && have sudo && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi
