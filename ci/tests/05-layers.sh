#!/bin/sh
# The design checks of the plugin, softroce and the doctor (ci/layers.py: rank order of the
# modules, the sans-IO folders, file import cycles, constants defined twice, function and file
# sizes, `unsafe fn` without `# Safety`, the unsafe-block lint, the panic guard of every
# `extern "C" fn`). It first shows each rule firing on a planted violation (ci/layers_test.py),
# then prints every finding as path:line; sizes are enforced here (LAYERS_ENFORCE_SIZE=1: a
# function over 80 lines or a file over 700 fails); last, the logger's unit tests with the `trace` feature (log_trace!
# lines exist only with it).
set -u
cd "$(dirname "$0")/../.." || exit 1
if ! command -v python3 >/dev/null 2>&1; then
    echo "python3 is missing (ci/install-deps.sh installs it)"
    exit 1
fi
timeout 120 python3 ci/layers_test.py || exit 1
status=0
LAYERS_ENFORCE_SIZE=1 timeout 120 python3 ci/layers.py . || status=1
# log_trace! is compiled out by default (the plain `cargo test` checks that); with the `trace`
# feature its lines reach the logger.
echo "--- log_trace! with --features trace"
timeout 900 cargo test --release -q -p ferroce --features trace --lib log::tests || status=1
exit "$status"
