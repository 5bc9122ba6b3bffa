#!/usr/bin/env bash
# A virtualenv for one more Python version (CI runs the unit tests under each supported version):
#
#   .ci/pyvenv.sh 3.10        # create/refresh .cache/venvs/py3.10, print its python
#
# The interpreter: $PYTHON if set, else pythonX.Y on PATH, else pyenv's X.Y (installed with
# `pyenv install --skip-existing` when pyenv has none: a fresh machine builds it once, ~5 min).
# The venv holds rmqtrace's dependencies with the test, rocketmq and grpc extras, installed from a
# copy of this checkout's pyproject.toml (not editable: .cache is shared by every worktree of a
# clone, so the venv must not point at one of them); run the tests with PYTHONPATH=<checkout>, which
# wins over the installed copy. A stamp (sha256 of the interpreter's version and pyproject.toml)
# skips the work when nothing changed; the first run takes ~1-2 min (pip downloads).
set -euo pipefail

want_version="${1:?usage: pyvenv.sh X.Y}"
[[ "$want_version" =~ ^3\.[0-9]+$ ]] || { echo "pyvenv.sh: want a version like 3.10, got '$want_version'" >&2; exit 2; }
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RMQTRACE_VENVS:-$(realpath -m "$REPO/.cache")/venvs}/py$want_version"
PY="$VENV/bin/python"
STAMP="$VENV/.rmqtrace-stamp"

log() { echo "pyvenv: $*" >&2; }

find_python() {
    if [[ -n "${PYTHON:-}" ]]; then echo "$PYTHON"; return; fi
    if command -v "python$want_version" >/dev/null 2>&1 \
        && "python$want_version" -c 'import sys' >/dev/null 2>&1; then
        command -v "python$want_version"; return
    fi
    if command -v pyenv >/dev/null 2>&1; then
        if ! pyenv prefix "$want_version" >/dev/null 2>&1; then
            log "no Python $want_version under pyenv: pyenv install --skip-existing $want_version"
            pyenv install --skip-existing "$want_version" >&2
        fi
        echo "$(pyenv prefix "$want_version")/bin/python$want_version"; return
    fi
    log "no Python $want_version: install it (pyenv install $want_version, or apt-get install python$want_version)" \
        "or set PYTHON=/path/to/python$want_version"
    exit 1
}

base="$(find_python)"
got="$("$base" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
[[ "$got" == "$want_version" ]] || { log "$base is Python $got, not $want_version"; exit 1; }
want="$( { "$base" -VV; cat "$REPO/pyproject.toml"; } | sha256sum | cut -d' ' -f1)"
ready() { [[ -x "$PY" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; }
if ready; then echo "$PY"; exit 0; fi

mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9  # parallel worktrees build it once
if ready; then echo "$PY"; exit 0; fi
rm -rf "$VENV"
log "creating $VENV from $base"
"$base" -m venv "$VENV"
"$PY" -m pip install -q --upgrade pip >&2
# A copy holding only what an install reads: the checkout's own build dirs stay untouched.
src="$(mktemp -d)"
trap 'rm -rf "$src"' EXIT
cp -r "$REPO/pyproject.toml" "$REPO/README.md" "$REPO/LICENSE" "$REPO/MANIFEST.in" "$REPO/tracer" "$src/"
"$PY" -m pip install -q "$src[test,rocketmq,grpc]" >&2
echo "$want" >"$STAMP"
echo "$PY"
