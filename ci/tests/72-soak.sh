#!/bin/sh
# The soak under faults for one minute (ci/soak.sh; docs/reliability.md): 4 ranks over softroce
# with loss, reordering and duplication, kills and aborts, closes in flight, registrations from a
# second thread; fails on a wrong byte, a request without progress, an unexpected error or WARN,
# or heap/descriptors/RSS that do not stay flat. Then the WARN scan itself: it counts every WARN
# line of the run, and fails on each kind of unexpected WARN put into the logs (and only on those).
set -u
cd "$(dirname "$0")/../.." || exit 1
SOAK=target/release/harness/soak
T=$(mktemp -d /tmp/ferroce-72-soak.XXXXXX) || exit 1
fail() { echo "72-soak: FAIL: $*"; echo "72-soak: files kept in $T"; exit 1; }

SOAK_LOGDIR=$T/logs ci/soak.sh --minutes 1 >"$T/out" 2>&1
rc=$?
cat "$T/out"
[ "$rc" -eq 0 ] || fail "the soak failed"

# every complete WARN line of the run (a killed rank may leave its last line unfinished) is counted
total=$(python3 - "$T/logs" <<'EOF'
import glob, sys
n = 0
for p in glob.glob(sys.argv[1] + "/rank-*.log"):
    lines = open(p, "rb").read().split(b"\n")[:-1]  # the part after the last newline is unfinished
    n += sum(b"NCCL WARN" in l for l in lines)
print(n)
EOF
)
counted=$(sed -n 's/^soak: plugin WARNs in [0-9]* rank logs: \([0-9]*\) expected (.*), 0 unexpected$/\1/p' "$T/out")
[ -n "$counted" ] || fail "no 'plugin WARNs ... 0 unexpected' line in the soak's output"
[ "$counted" -eq "$total" ] || fail "the scan counted $counted expected WARNs, the logs have $total"
grep -q "^\[rank -1\]" "$T"/logs/rank-*.log && fail "a log line is not named by its rank ([rank -1])"
echo "72-soak: the scan counted all $total WARN lines of the run"

# scan(NAME, WANT_RC, LINES...): the run's logs plus one injected rank-1 log; the scan must exit
# WANT_RC, and then name the injected line (1) or count it as expected (0)
scan() {
    name=$1 want=$2
    shift 2
    rm -rf "$T/inj" && cp -r "$T/logs" "$T/inj" || exit 1
    printf '%s\n' "$@" >"$T/inj/rank-1.999999.log"
    "$SOAK" --scan-logs "$T/inj" >"$T/scan.out" 2>&1
    got=$?
    [ "$got" -eq "$want" ] || { cat "$T/scan.out"; fail "scan of '$name': exit status $got, expected $want"; }
    if [ "$want" -ne 0 ]; then
        grep -q "an unexpected WARN.*injected" "$T/scan.out" || { cat "$T/scan.out"; fail "scan of '$name' did not name the injected WARN"; }
    else
        n=$((total + $(printf '%s\n' "$@" | grep -c "NCCL WARN")))
        grep -q "^soak: plugin WARNs in [0-9]* rank logs: $n expected (.*), 0 unexpected$" "$T/scan.out" ||
            { cat "$T/scan.out"; fail "scan of '$name' did not count $n expected WARNs"; }
    fi
    echo "72-soak: scan with $name: exit status $got (expected)"
}
begin_clean="[rank 1] soak: cycle 900000 begins: fault none, victim 0"
begin_kill="[rank 1] soak: cycle 900000 begins: fault kill, victim 2"
closing="[rank 1] soak: cycle 900000 closes with requests in flight"
done_line="[rank 1] soak: cycle 900000 done: injected"
lav="[rank 1] NCCL WARN NET/ferroce device softroce0: fatal async event 'local access violation work queue error' on QP 7 (injected)"
gone="[rank 1] NCCL WARN NET/ferroce the peer 127.0.0.1:1 closed the connection while a receive was in flight (injected)"
retry_to() { echo "[rank 1] NCCL WARN NET/ferroce completion error (injected): transport retry counter exceeded; peer GID ::ffff:127.0.72.$1, peer 127.0.0.1:1"; }
scan "a local access violation after a close in flight" 0 "$begin_clean" "$closing" "$lav" "$done_line"
scan "a local access violation in a clean close" 1 "$begin_clean" "$lav" "$done_line"
scan "a local access violation after the close" 1 "$begin_clean" "$closing" "$done_line" "$lav"
scan "a peer gone in a kill cycle" 0 "$begin_kill" "$gone" "$(retry_to 3)" "$done_line"
scan "a peer gone without a fault" 1 "$begin_clean" "$gone" "$done_line"
scan "a retry error naming a survivor" 1 "$begin_kill" "$(retry_to 4)" "$done_line"
scan "a WARN of an unknown kind" 1 "$begin_kill" "[rank 1] NCCL WARN NET/ferroce something else (injected)" "$done_line"
scan "a WARN named by another rank" 1 "$begin_kill" "[rank -1] NCCL WARN NET/ferroce the peer closed the connection (injected)" "$done_line"
rm -rf "$T"
echo "72-soak: PASS"
