#!/bin/bash
# softroce: rdma-core's own pyverbs test suite (Debian's python3-pyverbs), unmodified, over
# softroce's libibverbs: ci/pyverbs.sh, which fails on any failed or erroring test and on fewer
# passes than the whole suite gives today (docs/softroce-pyverbs.md). About a second.
set -u
cd "$(dirname "$0")/../.." || exit 1
# shellcheck source-path=SCRIPTDIR source=lib/checks.sh
. ci/tests/lib/checks.sh
need target/release/softroce/libibverbs.so.1
out=$(mktemp /tmp/pyverbs-stage.XXXXXX)
trap 'rm -f "$out"' EXIT
echo "== pyverbs: ci/pyverbs.sh"
if ci/pyverbs.sh >"$out" 2>&1; then
    grep '^pyverbs: [0-9]' "$out" | sed 's/^/   /'
    ok "pyverbs suite: no failure, no error"
else
    grep -E '^(ERROR|FAIL):' "$out" | sed 's/^/   /'
    ko "pyverbs suite" "$out"
fi
finish
