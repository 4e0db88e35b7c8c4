#!/bin/sh
# The layering check of both crates (ci/layers.py: forbidden imports, file import cycles,
# constants defined twice, functions over 100 lines, `unsafe fn` without `# Safety`). It first
# checks itself on fixture trees, one per rule, then prints every finding as path:line.
set -u
cd "$(dirname "$0")/../.." || exit 1
if ! command -v python3 >/dev/null 2>&1; then
    echo "python3 is missing (ci/install-deps.sh installs it)"
    exit 1
fi
timeout 120 python3 ci/layers.py --self-test || exit 1
timeout 120 python3 ci/layers.py .
