#!/usr/bin/env bash
# A separate virtualenv for the LEGACY RocketMQ client (rocketmq-client-python 2.0.0 + librocketmq.so):
#
#   services/rocketmq/legacy_venv.sh            # create/refresh .cache/legacy-venv, print its python
#   LEGACY_VENV=/tmp/lv services/rocketmq/legacy_venv.sh
#
# Why a separate venv: the legacy client and the official 5.x client (rocketmq-python-client) both
# install a top-level package named `rocketmq` into the same site-packages directory. Installing the
# legacy one over the 5.x one overwrites rocketmq/__init__.py (5.x imports then fail:
# `from rocketmq import Producer` finds the legacy package, which has no such name at top level);
# installing 5.x over the legacy one breaks `rocketmq.client`. One import name, one environment.
#
# Steps: python -m venv, pip install -e <repo> (rmqtrace WITHOUT the [rocketmq] extra, so no 5.x
# client), then install_legacy_client.sh (which refuses an environment holding the 5.x client).
# Idempotent: a stamp (sha256 of the checkout path, pyproject.toml and install_legacy_client.sh) skips the work when
# nothing changed (~0.05 s); the first run takes ~30-60 s (pip downloads).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
VENV="${LEGACY_VENV:-$REPO/.cache/legacy-venv}"
PYTHON="${PYTHON:-python3}"
PY="$VENV/bin/python"
STAMP="$VENV/.rmqtrace-legacy-stamp"

log() { echo "legacy_venv: $*" >&2; }

# The checkout's path is part of the stamp: the venv installs it editable, so a venv made from
# another checkout (a worktree, a moved clone) would run that checkout's code.
want="$( { echo "$REPO"; cat "$REPO/pyproject.toml" "$HERE/install_legacy_client.sh"; } | sha256sum | cut -d' ' -f1)"
ready() {
    [[ -x "$PY" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]] \
        && "$PY" -c 'import rocketmq.client, tracer' >/dev/null 2>&1
}
if ready; then
    echo "$PY"
    exit 0
fi

mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9  # concurrent callers (parallel test sessions) build it once
if ready; then
    echo "$PY"
    exit 0
fi
if [[ ! -x "$PY" ]]; then
    log "creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
"$PY" -m pip install -q --disable-pip-version-check --upgrade pip >&2
if "$PY" -m pip show rocketmq-python-client >/dev/null 2>&1; then
    log "removing rocketmq-python-client (5.x) from $VENV: it shares the import name 'rocketmq'"
    "$PY" -m pip uninstall -q -y rocketmq-python-client >&2
fi
log "pip install -e $REPO (no [rocketmq] extra)"
"$PY" -m pip install -q --disable-pip-version-check -e "$REPO" >&2
bash "$HERE/install_legacy_client.sh" "$PY" >&2
echo "$want" >"$STAMP"
echo "$PY"
