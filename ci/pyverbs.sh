#!/bin/bash
# Runs rdma-core's own pyverbs test suite, unmodified, against softroce's libibverbs
# (docs/softroce-pyverbs.md). The suite is Debian's: python3-pyverbs ships the tests of the
# rdma-core source tree it was built from (tests/ of rdma-core 44 on Debian 12) in
# /usr/share/doc/rdma-core/tests, some of them gzipped. They are copied to a scratch directory,
# unpacked and run with softroce's library first on LD_LIBRARY_PATH, on softroce0 bound to its
# own loopback address.
#
#   ci/pyverbs.sh [TEST NAME...]   e.g. tests.test_mr or tests.test_mr.MRTest.test_mr_rereg_pd
#                                  (the names -v prints; default: every test)
#
# Prints one line per test (unittest -v), the skip reasons with their counts, and
#   pyverbs: RUN run, P passed, F failed, E errors, S skipped
# Exit status 0 only with no failure, no error and at least PYVERBS_MIN_PASS tests passed
# (default 56, the whole suite on 2026-12-05 with python3-pyverbs 44.0-2; with test names given,
# 1): a library that broke device opening must not turn into a green run of skips.
#
#   SOFTROCE_LIB      directory holding softroce's libibverbs.so.1 (default target/release/softroce)
#   PYVERBS_ADDR      address softroce0 binds (default 127.0.78.1; ci/tests/lib/softroce.sh)
#   PYVERBS_TIMEOUT   seconds for the whole run (default 300)
#   PYVERBS_TESTS     directory of the tests to use instead of Debian's (a checkout's tests/)
set -u
cd "$(dirname "$0")/.." || exit 1
LIB=${SOFTROCE_LIB:-$PWD/target/release/softroce}
ADDR=${PYVERBS_ADDR:-127.0.78.1}
# Debian's pyverbs is built for Debian's python3: another python3 first on PATH (pyenv, a venv)
# does not see /usr/lib/python3/dist-packages.
PY=/usr/bin/python3
if [ ! -e "$LIB/libibverbs.so.1" ]; then
    echo "pyverbs: missing $LIB/libibverbs.so.1 (run make build or softroce/build.sh)"
    exit 1
fi
if ! "$PY" -c 'import pyverbs.device' 2>/dev/null; then
    echo "pyverbs: $PY cannot import pyverbs (install python3-pyverbs: ci/install-deps.sh)"
    exit 1
fi
D=$(mktemp -d /tmp/pyverbs.XXXXXX)
trap 'rm -rf "$D"' EXIT
trap 'exit 130' INT TERM
src=${PYVERBS_TESTS:-/usr/share/doc/rdma-core/tests}
if [ ! -e "$src/run_tests.py" ] && [ -z "${PYVERBS_TESTS:-}" ]; then
    # An image whose dpkg excludes /usr/share/doc: take the files from the installed package's
    # own .deb.
    ver=$(dpkg-query -W -f='${Version}' python3-pyverbs)
    echo "pyverbs: $src is missing; unpacking python3-pyverbs $ver"
    if ! (cd "$D" && apt-get download -qq "python3-pyverbs=$ver" && dpkg-deb -x python3-pyverbs_*.deb deb); then
        echo "pyverbs: cannot fetch python3-pyverbs $ver"
        exit 1
    fi
    src=$D/deb/usr/share/doc/rdma-core/tests
fi
if [ ! -e "$src/run_tests.py" ]; then
    echo "pyverbs: no rdma-core tests in $src"
    exit 1
fi
cp -r "$src" "$D/tests"
find "$D/tests" -name '*.py.gz' -exec gunzip -f {} +
min=${PYVERBS_MIN_PASS:-56}
[ $# -gt 0 ] && min=${PYVERBS_MIN_PASS:-1}
echo "pyverbs: python3-pyverbs $(dpkg-query -W -f='${Version}' python3-pyverbs 2>/dev/null), tests from $src"
echo "pyverbs: LD_LIBRARY_PATH=$LIB SOFTROCE_ADDR=$ADDR, device softroce0"
cd "$D/tests" || exit 1
# What run_tests.py does (the suite's own loader: tests/__init__.py), with the counts printed.
LD_LIBRARY_PATH="$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" SOFTROCE_ADDR=$ADDR PYVERBS_MIN=$min \
    timeout "${PYVERBS_TIMEOUT:-300}" "$PY" - --dev softroce0 "$@" <<'EOF'
import collections
import os
import sys
import unittest
from importlib.machinery import SourceFileLoader

sys.path.insert(0, os.getcwd())
from args_parser import parser  # noqa: E402  (rdma-core's: --dev, --port, --gid, ...)

parser.parse_args()
names = sys.argv[1:]
tests = SourceFileLoader('tests', os.path.join(os.getcwd(), '__init__.py')).load_module()
loader = unittest.defaultTestLoader
suite = loader.loadTestsFromNames(names) if names else loader.loadTestsFromModule(tests)
r = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
reasons = collections.Counter(reason for _, reason in r.skipped)
if reasons:
    print('pyverbs: skip reasons:')
    for reason, n in reasons.most_common():
        print(f'  {n:4} {reason}')
bad = len(r.failures) + len(r.errors) + len(r.unexpectedSuccesses)
passed = r.testsRun - bad - len(r.skipped) - len(r.expectedFailures)
print(f'pyverbs: {r.testsRun} run, {passed} passed, {len(r.failures)} failed, '
      f'{len(r.errors)} errors, {len(r.skipped)} skipped')
if passed < int(os.environ['PYVERBS_MIN']):
    print(f'pyverbs: only {passed} passed, expected at least {os.environ["PYVERBS_MIN"]}')
    sys.exit(1)
sys.exit(1 if bad else 0)
EOF
