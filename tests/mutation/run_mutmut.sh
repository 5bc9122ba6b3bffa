#!/usr/bin/env bash
# `make mutation`: mutmut over the functions in tests/mutation/scope.txt, run in a copy of the tree
# (mutmut writes mutants/ beside the code; others edit and test the worktree meanwhile).
# Usage: tests/mutation/run_mutmut.sh [WORKDIR]   (default: a fresh /tmp/rmqtrace-mutmut.XXXX)
# MUTMUT: the mutmut to run (default: the venv's); SCOPE: a scope file (default: scope.txt)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=${1:-$(mktemp -d /tmp/rmqtrace-mutmut.XXXX)}
mkdir -p "$work"
rm -rf "$work/tracer" "$work/tests" "$work/mutants"
cp -r "$root/tracer" "$root/tests" "$work/"
find "$work" -name __pycache__ -prune -exec rm -rf {} + ; rm -rf "$work/tests/.hypothesis"
cp "$root/pyproject.toml" "$work/"
cd "$work"
mutmut=${MUTMUT:-$root/.venv/bin/mutmut}
globs=$(grep -v '^#' "${SCOPE:-$root/tests/mutation/scope.txt}")
# RMQTRACE_SEEDED: no shrinking, no example database — only killed/survived counts
RMQTRACE_SEEDED=1 PYTHONDONTWRITEBYTECODE=1 nice "$mutmut" run --max-children 2 $globs || true
"$mutmut" results --all true > results.txt || "$mutmut" results > results.txt
echo "mutmut work dir: $work (results.txt; \`mutmut show NAME\` there)"
