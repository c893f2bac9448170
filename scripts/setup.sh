#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs everything kvsift needs on a fresh Debian bookworm machine.
# CMake 3.31 and Catch2 v3 come from bookworm-backports: the suite is added to the machine's
# existing Debian apt source entry (no host name is written anywhere).
set -euo pipefail

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

need_backports=1
if command -v cmake >/dev/null 2>&1; then
  v=$(cmake --version | head -n1 | awk '{print $3}')
  if [ "$(printf '%s\n3.31\n' "$v" | sort -V | head -n1)" = "3.31" ] && [ -f /usr/include/catch2/catch_all.hpp ]; then
    need_backports=0
  fi
fi

if [ "$need_backports" = 1 ]; then
  # Find the deb822 entry that carries the plain 'bookworm' suite and add bookworm-backports to it.
  src=""
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    if grep -Eq '^Suites:.*\bbookworm\b' "$f"; then src="$f"; break; fi
  done
  if [ -n "$src" ]; then
    if ! grep -Eq '^Suites:.*bookworm-backports' "$src"; then
      $SUDO sed -i -E '0,/^Suites:(.*\bbookworm\b.*)$/s//Suites:\1 bookworm-backports/' "$src"
    fi
  elif [ -f /etc/apt/sources.list ] && grep -Eq '^deb .* bookworm main' /etc/apt/sources.list; then
    # One-line format: reuse the URI of the existing bookworm line.
    if ! grep -q 'bookworm-backports' /etc/apt/sources.list; then
      line=$(grep -E '^deb .* bookworm main' /etc/apt/sources.list | head -n1)
      echo "${line/ bookworm / bookworm-backports }" | $SUDO tee -a /etc/apt/sources.list >/dev/null
    fi
  else
    echo "setup.sh: no Debian bookworm apt source entry found to extend" >&2
    exit 1
  fi
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
if [ "$need_backports" = 1 ]; then
  $SUDO apt-get install -y -qq -t bookworm-backports cmake libcatch2-dev
fi
$SUDO apt-get install -y -qq g++ make ninja-build libbenchmark-dev nlohmann-json3-dev libgomp1 \
  clang libclang-rt-14-dev >/dev/null
echo "setup.sh: $(cmake --version | head -n1), Catch2 $(dpkg-query -W -f='${Version}' libcatch2-dev)"
