#!/usr/bin/env bash
# Make Debian's libfaketime available for the skewed-clock test (tests/integration/
# test_fleet_faults.py: one worker's wall clock 30 s ahead, one 30 s behind). Prints the
# library's path; exits 1 if there is none and it cannot be installed (not root, or no apt-get),
# in which case that test skips and says so.
set -euo pipefail
find_lib() { ls /usr/lib/*/faketime/libfaketime.so.1 2>/dev/null | head -1 || true; }
lib=$(find_lib)
if [ -z "$lib" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "ensure_faketime: installing Debian's faketime (apt-get)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq faketime >&2 || { apt-get update -qq >&2 && apt-get install -y -qq faketime >&2; } || true
  lib=$(find_lib)
fi
if [ -z "$lib" ]; then
  echo "ensure_faketime: no libfaketime, and it cannot be installed here" >&2
  exit 1
fi
echo "$lib"
