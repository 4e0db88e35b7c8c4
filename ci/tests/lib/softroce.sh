# Shared by the ci/tests/20-softroce-*.sh scripts (sourced, not run): the repository root,
# the softroce library, a scratch directory and process list cleaned up on exit, the result
# bookkeeping of lib/checks.sh (ok, ko, need, finish), and the helpers free_port, wait_port,
# wait_dev and pair.
#
# Loopback ranges: every script and every softroce-using test binds its own 127.0.N.x, so two
# of them never collide, whatever runs at once. One owner per N (check:
#   grep -rhoE '127\.0\.[0-9]+\.' ci tests softroce/tests doctor | sort | uniq -c);
# a new user takes a free N and adds its line here. TCP ports are always taken free (port 0 or
# free_port) and netns/veth names carry $$.
#   127.0.10  10-plugin-abi.sh              127.0.40  40-datapath.sh (.41 too; its IB pass: 127.0.48)
#                                           127.0.43  41-close-loss.sh
#   127.0.15  15-packages.sh
#   127.0.14  tests/rogue_peer_softroce.rs (one last octet per case)
#   127.0.20  20-softroce-pingpong.sh       127.0.41  tests/transport_softroce.rs (run by 40, 23)
#   127.0.21  softroce/tests/verbs_*.rs     127.0.42  tests/observability_softroce.rs
#             (one last octet per file)     127.0.44  tests/events_softroce.rs (two per child)
#   127.0.22  20-softroce-faults.sh (.1-.15, .250), 22-softroce-ib.sh (.101-.120)
#                                           127.0.45  tests/concurrency_softroce.rs
#                                           127.0.46  tests/recovery_softroce.rs (1-2 per child)
#                                           127.0.47  tests/foreign_peer_softroce.rs (one per case)
#   127.0.23  20-softroce-devinfo.sh        127.0.50-51  ci/bench.sh
#   127.0.24  20-softroce-tshark.sh         127.0.53  52-bench-compare.sh
#   127.0.25  20-softroce-perftest.sh       127.0.54  55-memory.sh
#   127.0.26  20-softroce-config.sh, softroce/tests/config_stop.rs
#   127.0.38  tests/ib_config_softroce.rs (one or two per case)
#   127.0.29  ci/bench-softroce.sh          127.0.55-59  50-harness.sh
#   127.0.36-37  tests/gid_softroce.rs, tests/wr_latency_softroce.rs (.4x)
#   127.0.61  doctor (its own tests)        127.0.65  65-doctor.sh
#   127.0.66-67  66-stats.sh                127.0.77  60-gpu-scripts.sh (test data)
#   127.0.68-69  67-counters.sh          127.0.72  72-soak.sh, ci/soak.sh
#   127.0.70  70-resilience.sh
#   127.0.78  ci/pyverbs.sh (21-pyverbs.sh)
#   127.0.81  80-sanitizers.sh              127.0.82  80-sanitizers.sh (ThreadSanitizer)
#   127.0.87  tests/setup_stress_softroce.rs (85-setup-stress.sh, ci/setup-stress.sh; .rank+1)
# (20-softroce-netns.sh uses its own namespaces; 127.0.0.1 only for free ports and NCCL's
# bootstrap.)
# shellcheck shell=bash
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
LIB=$ROOT/target/release/softroce
if [ ! -e "$LIB/libibverbs.so.1" ]; then
    echo "missing $LIB/libibverbs.so.1 (run softroce/build.sh)"
    echo "0 passed, 1 failed"
    exit 1
fi
T=${SOFTROCE_TEST_TIMEOUT:-60}
D=$(mktemp -d /tmp/softroce-test.XXXXXX)
# shellcheck source=ci/tests/lib/checks.sh
. ci/tests/lib/checks.sh
PIDS=""
cleanup() {
    for p in $PIDS; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$D"
}
trap cleanup EXIT
trap 'exit 130' INT TERM


# free_port: a TCP port nothing listens on now, chosen by the kernel (bind to port 0), so two
# runs of these tests on one host never collide on a fixed port.
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'
}

# wait_dev ADDR [SECONDS]: until the softroce device on ADDR answers softroce-ctl (default 5 s;
# SOFTROCE_CTL_DIR as the process's).
wait_dev() {
    for _ in $(seq $((${2:-5} * 20))); do
        "$LIB/softroce-ctl" "$1" status >/dev/null 2>&1 && return 0
        sleep 0.05
    done
    return 1
}

# wait_port PORT [NETNS]: until a TCP listener is on PORT (5 s).
wait_port() {
    for _ in $(seq 100); do
        if [ -n "${2:-}" ]; then
            ip netns exec "$2" ss -ltnH "sport = :$1" | grep -q . && return 0
        else
            ss -ltnH "sport = :$1" | grep -q . && return 0
        fi
        sleep 0.05
    done
    return 1
}

# pair NAME "SERVER_ENV" "CLIENT_ENV" SERVER_IP REGEX TOOL ARGS...
# Runs TOOL as server (no host argument) and client (connecting to SERVER_IP) on a free TCP
# port, both bounded by $T seconds; passes when both exit 0 and the client output matches
# REGEX.
pair() {
    local name=$1 senv=$2 cenv=$3 sip=$4 re=$5 port
    shift 5
    port=$(free_port)
    echo "== $name"
    echo "   server: $senv $* -p $port"
    echo "   client: $cenv $* -p $port $sip"
    # shellcheck disable=SC2086
    env LD_LIBRARY_PATH="$LIB" $senv timeout "$T" "$@" -p "$port" >"$D/$name.server" 2>&1 &
    local spid=$!
    PIDS="$PIDS $spid"
    if ! wait_port "$port"; then
        kill "$spid" 2>/dev/null
        wait "$spid" 2>/dev/null
        ko "$name (server did not listen)" "$D/$name.server"
        return
    fi
    # shellcheck disable=SC2086
    env LD_LIBRARY_PATH="$LIB" $cenv timeout "$T" "$@" -p "$port" "$sip" >"$D/$name.client" 2>&1
    local crc=$?
    wait "$spid"
    local src=$?
    if [ $crc -eq 0 ] && [ $src -eq 0 ] && grep -Eq "$re" "$D/$name.client"; then
        grep -E "$re" "$D/$name.client" | tail -n 1 | sed 's/^/   > /'
        ok "$name"
    else
        ko "$name (client rc=$crc, server rc=$src)" "$D/$name.server" "$D/$name.client"
    fi
}


