#!/bin/sh
# The layering check of both crates (ci/layers.py: forbidden imports, file import cycles,
# constants defined twice, functions over 100 lines, `unsafe fn` without `# Safety`). It first
# checks itself on fixture trees, one per rule, then prints every finding as path:line; last,
# the logger's unit tests with the `trace` feature (log_trace! lines exist only with it).
set -u
cd "$(dirname "$0")/../.." || exit 1
if ! command -v python3 >/dev/null 2>&1; then
    echo "python3 is missing (ci/install-deps.sh installs it)"
    exit 1
fi
timeout 120 python3 ci/layers.py --self-test || exit 1
status=0
timeout 120 python3 ci/layers.py . || status=1
# log_trace! is compiled out by default (the plain `cargo test` checks that); with the `trace`
# feature its lines reach the logger.
echo "--- log_trace! with --features trace"
timeout 900 cargo test --release -q -p ferroce --features trace --lib log::tests || status=1
exit "$status"
