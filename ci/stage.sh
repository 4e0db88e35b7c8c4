#!/bin/sh
# ci/stage.sh NAME -- COMMAND...: runs COMMAND, then prints "stage NAME: ok (N s)" or
# "stage NAME: FAILED (N s)" and exits with COMMAND's status. make test runs each of its stages
# through it, so a slow or failing stage shows in the log without timing it by hand.
set -u
if [ $# -lt 3 ] || [ "$2" != -- ]; then
    echo "usage: ci/stage.sh NAME -- COMMAND..." >&2
    exit 2
fi
name=$1
shift 2
start=$(date +%s)
"$@"
rc=$?
if [ $rc -eq 0 ]; then
    echo "stage $name: ok ($(($(date +%s) - start)) s)"
else
    echo "stage $name: FAILED ($(($(date +%s) - start)) s, exit $rc)"
fi
exit $rc
