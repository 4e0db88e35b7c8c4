#!/bin/sh
# The soak under faults for one minute (ci/soak.sh; README: Reliability): 4 ranks over softroce
# with loss, reordering and duplication, kills and aborts, closes in flight, registrations from a
# second thread; fails on a wrong byte, a request without progress, an unexpected error or WARN,
# or heap/descriptors/RSS that do not stay flat.
cd "$(dirname "$0")/../.." || exit 1
exec ci/soak.sh --minutes 1
