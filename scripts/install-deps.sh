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
# clang with its sanitizer and libFuzzer runtimes, for `make test-sanitize`.
have clang++ || need_apt+=(clang)
ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 || need_apt+=(libclang-rt-dev)

if [ ${#need_apt[@]} -gt 0 ]; then
  echo "install-deps: apt-get install ${need_apt[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && have sudo && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi

# Python: the package's build backend and binding generator, numpy and the test runner. `make
# test-python` builds the package without build isolation (nothing fetched at build time), so they
# must be installed here. torch is not: its tests skip without it.
PY="${PYTHON:-python3}"
need_pip=()
"$PY" -c "import nanobind" 2>/dev/null || need_pip+=("nanobind>=2.2")
"$PY" -c "import scikit_build_core" 2>/dev/null || need_pip+=("scikit-build-core>=0.8")
"$PY" -c "import numpy" 2>/dev/null || need_pip+=(numpy)
"$PY" -c "import pytest" 2>/dev/null || need_pip+=(pytest)
if [ ${#need_pip[@]} -gt 0 ]; then
  echo "install-deps: pip install ${need_pip[*]}"
  if ! "$PY" -m pip --version >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && have sudo && SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-pip
  fi
  export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
  # A Debian system Python refuses pip installs (PEP 668) unless told otherwise.
  "$PY" -m pip install -q "${need_pip[@]}" ||
    "$PY" -m pip install -q --break-system-packages "${need_pip[@]}"
fi
