#!/usr/bin/env bash
# Install the legacy (remoting protocol, rocketmq-client-cpp based) Python client into a Python
# environment, with a working native library:
#
#   services/rocketmq/install_legacy_client.sh /path/to/venv/bin/python
#
# 1. pip install rocketmq-client-python==2.0.0 (pure Python ctypes binding; its PyPI package has no
#    librocketmq.so and expects rocketmq-client-cpp installed system-wide, which Debian does not ship)
# 2. take rocketmq/librocketmq.so (self-contained build of rocketmq-client-cpp 2.1.0; links only libc,
#    libstdc++, libm, libgcc_s, libz, libpthread) out of the PyPI sdist rocketmq-python-cvs==2.1.0.3,
#    check its sha256, cache it in <repo>/.cache/rocketmq/legacy/
# 3. copy it next to the installed rocketmq/__init__.py (ffi.py prefers a packaged librocketmq.so)
# 4. import check
#
# The legacy client's import name is `rocketmq`, the same as rocketmq-python-client (gRPC, 5.x):
# the two cannot live in one environment. This script refuses an environment that has the other.
set -euo pipefail

PY="${1:?usage: install_legacy_client.sh PYTHON (e.g. /tmp/rmql/bin/python)}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
CACHE="${RMQ_LEGACY_CACHE:-$REPO/.cache/rocketmq/legacy}"
SO_SHA256=ed3fce39f2b926637637a2b8b9122799f207b0cdf98dbd9110505bf43170fa30
LEGACY_VERSION=2.0.0
CVS_VERSION=2.1.0.3

log() { echo "install_legacy_client: $*" >&2; }

if "$PY" -m pip show rocketmq-python-client >/dev/null 2>&1; then
    log "ERROR: $PY has rocketmq-python-client (gRPC client, same import name 'rocketmq'); use another venv"
    exit 1
fi

"$PY" -m pip install -q --disable-pip-version-check "rocketmq-client-python==$LEGACY_VERSION"

so="$CACHE/librocketmq.so"
if [[ ! -f "$so" ]] || ! echo "$SO_SHA256  $so" | sha256sum -c --status; then
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    log "downloading rocketmq-python-cvs==$CVS_VERSION (sdist) for its librocketmq.so"
    "$PY" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
        "rocketmq-python-cvs==$CVS_VERSION" -d "$tmp"
    sdist="$(ls "$tmp"/rocketmq*python*cvs*"$CVS_VERSION".tar.gz)"
    "$PY" - "$sdist" "$tmp/librocketmq.so" <<'EOF'
import sys, tarfile, shutil
src, dst = sys.argv[1], sys.argv[2]
with tarfile.open(src) as tf:
    member = next(m for m in tf.getmembers() if m.name.endswith("/rocketmq/librocketmq.so"))
    with tf.extractfile(member) as f, open(dst, "wb") as out:
        shutil.copyfileobj(f, out)
EOF
    echo "$SO_SHA256  $tmp/librocketmq.so" | sha256sum -c --status \
        || { log "ERROR: librocketmq.so sha256 mismatch"; exit 1; }
    mkdir -p "$CACHE"
    cp "$tmp/librocketmq.so" "$so.tmp.$$" && mv "$so.tmp.$$" "$so"
fi

# find the package dir without importing it (importing fails while the library is missing)
pkgdir="$("$PY" -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("rocketmq").origin))')"
[[ -f "$pkgdir/client.py" && -f "$pkgdir/ffi.py" ]] || { log "ERROR: $pkgdir is not rocketmq-client-python"; exit 1; }
install -m 0755 "$so" "$pkgdir/librocketmq.so"
"$PY" -c 'import rocketmq.client as c, rocketmq.ffi as f; assert f._DYLIB_PATH.endswith("rocketmq/librocketmq.so"), f._DYLIB_PATH; print("legacy rocketmq client ok:", f._DYLIB_PATH)'
