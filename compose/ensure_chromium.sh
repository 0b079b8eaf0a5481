#!/usr/bin/env bash
# Make Debian's chromium available for the report's headless-browser test
# (tests/streams/tools/test_report.py). Prints the browser's path; exits 1 if there is none and it
# cannot be installed (not root, or no apt-get), in which case that test skips and says so.
set -euo pipefail
find_browser() { command -v chromium || command -v chromium-browser || command -v google-chrome || true; }
browser=$(find_browser)
if [ -z "$browser" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "ensure_chromium: installing Debian's chromium (apt-get)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2 && apt-get install -y -qq chromium >&2 || true
  browser=$(find_browser)
fi
if [ -z "$browser" ]; then
  echo "ensure_chromium: no chromium, and it cannot be installed here" >&2
  exit 1
fi
echo "$browser"
