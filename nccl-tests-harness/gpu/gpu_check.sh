#!/bin/bash
# ONE call on a GPU host (no Rust needed there): proves with real NCCL and PyTorch that ferroce is
# loaded, carries the traffic and gives correct results, and measures it against NCCL's own socket
# transport. Uses the libraries already built on an x86-64 host with Rust:
#   target/release/libnccl-net-ferroce.so and target/release/softroce/libibverbs.so.1
# (or FERROCE_LIB_DIR). Steps, each bounded by `timeout`, each run even when an earlier one failed:
#   1 torch-ferroce   run_torch.sh --transport ferroce   (all_reduce f32/bf16 4K..256M + embedding all_gather)
#   2 torch-socket    run_torch.sh --transport socket    (NCCL_NET=Socket, no plugin)
#   3 direct-build    build_nccl_direct.sh               (nvcc against the NCCL PyTorch uses)
#   4 direct-ferroce  run_nccl_direct.sh --transport ferroce
#   5 direct-socket   run_nccl_direct.sh --transport socket
#   6 nccl-tests-build build_nccl_tests.sh $NCCL_TESTS_SRC (only when NCCL_TESTS_SRC is set: an
#                     nccl-tests source checkout, built with MPI against the NCCL PyTorch uses)
#   7 nccl-tests      run_nccl_tests.sh --baseline socket (when NCCL_TESTS_DIR or NCCL_TESTS_SRC is set)
# Output, in $OUT when set (the device tool's folder), else ./gpu-results: summary.md, steps.log and
# one log per run (at most 8 files: what the device tool brings back). The summary is printed last.
#
#   gpu_check.sh [--budget SEC (default 450: the whole check)] [--only STEP,...] [--summarize DIR]
#
# --only runs just the named steps (e.g. --only direct-build,direct-ferroce for a short rerun).
# Environment: OUT, FERROCE_LIB_DIR, NCCL_TESTS_DIR or NCCL_TESTS_SRC (steps 6-7), GPU_CHECK_BUDGET,
# GPU_CHECK_BUILD_DIR (default nccl-tests-harness/gpu/build), GPU_CHECK_TORCH_ARGS and
# GPU_CHECK_DIRECT_ARGS (default "-n 10 -w 2 --cap 512M"), PYTHON, NVCC, NCCL_HOME.
#
# --summarize DIR rebuilds DIR/summary.md from the logs already in DIR (no GPU needed).
# Exit status 0 only when every step passed.
set -u
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

BUDGET=${GPU_CHECK_BUDGET:-450}
OUTD=${OUT:-$PWD/gpu-results}
BUILD_DIR=${GPU_CHECK_BUILD_DIR:-$GPU_DIR/build}
SUMMARIZE_ONLY=0
ONLY=""
while [ $# -gt 0 ]; do
    case $1 in
        --budget) [ $# -ge 2 ] || { echo "--budget needs seconds"; exit 2; }; BUDGET=$2; shift 2 ;;
        --only) [ $# -ge 2 ] || { echo "--only needs step names"; exit 2; }; ONLY=",$2,"; shift 2 ;;
        --summarize) [ $# -ge 2 ] || { echo "--summarize needs a directory"; exit 2; }; OUTD=$2; SUMMARIZE_ONLY=1; shift 2 ;;
        -h | --help) print_header_help; exit 0 ;;
        *) echo "unknown option '$1'"; exit 2 ;;
    esac
done
case $BUDGET in '' | *[!0-9]*) echo "--budget needs seconds"; exit 2 ;; esac
for n in ${ONLY//,/ }; do
    case $n in
        torch-ferroce | torch-socket | direct-build | direct-ferroce | direct-socket | nccl-tests-build | nccl-tests) ;;
        *) echo "--only: unknown step '$n' (torch-ferroce torch-socket direct-build direct-ferroce direct-socket nccl-tests-build nccl-tests)"; exit 2 ;;
    esac
done
mkdir -p "$OUTD" || exit 1
STEPS_LOG=$OUTD/steps.log
START=$(date +%s)
remaining() { echo $((BUDGET - ($(date +%s) - START))); }

# Step results: name|rc|seconds, in the order run. Kept outside $OUTD (the device tool brings back
# at most 8 files); --summarize rebuilds it from the logs.
RESULTS=$(mktemp "${TMPDIR:-/tmp}/gpu-check-steps.XXXXXX")
trap 'rm -f "$RESULTS"' EXIT

# selected NAME: 0 unless --only was given without NAME.
selected() {
    [ -z "$ONLY" ] || [ "${ONLY#*,"$1",}" != "$ONLY" ]
}

# step NAME WANT_SEC CMD...: run CMD bounded by min(WANT_SEC, time left - 15 s); output to steps.log.
# The command gets that limit less 25 s in $STEP_LIMIT (the run scripts' own --timeout per run, so
# that they end, check their logs and report before the outer bound).
step() {
    local name=$1 want=$2 left t rc t0
    shift 2
    selected "$name" || return 0
    left=$(($(remaining) - 15))
    t=$want
    [ "$left" -lt "$t" ] && t=$left
    if [ "$t" -lt 45 ]; then
        echo "== [$name] SKIPPED: only ${left}s of the ${BUDGET}s budget left" | tee -a "$STEPS_LOG"
        echo "$name|skip|0" >>"$RESULTS"
        return 1
    fi
    echo "== [$name] (limit ${t}s): $*" | tee -a "$STEPS_LOG"
    t0=$(date +%s)
    STEP_LIMIT=$((t - 25)) timeout -k 10 "$t" "$@" >>"$STEPS_LOG" 2>&1
    rc=$?
    echo "== [$name] rc=$rc after $(($(date +%s) - t0))s" | tee -a "$STEPS_LOG"
    echo "$name|$rc|$(($(date +%s) - t0))" >>"$RESULTS"
    return "$rc"
}

# Trim a log to at most ~15 MiB (the device tool brings back files of 16 MiB at most).
trim_log() {
    local f=$1 max=$((15 * 1024 * 1024))
    [ -f "$f" ] || return 0
    if [ "$(stat -c %s "$f")" -gt "$max" ]; then
        { head -c $((max / 2)) "$f"; echo; echo "# ... trimmed by gpu_check.sh ..."; tail -c $((max / 2)) "$f"; } >"$f.trim"
        mv "$f.trim" "$f"
    fi
}

env_report() {
    echo "- date: $(date -u '+%F %T') UTC; host $(uname -n); kernel $(uname -r); $(ldd --version 2>/dev/null | head -n 1)"
    if command -v nvidia-smi >/dev/null 2>&1; then
        echo "- GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>/dev/null | head -n 4 | tr '\n' ';')"
    else
        echo "- GPU: nvidia-smi not found"
    fi
    local nv
    nv=$( { command -v "${NVCC:-nvcc}" >/dev/null 2>&1 && "${NVCC:-nvcc}" --version; } || { [ -x /usr/local/cuda/bin/nvcc ] && /usr/local/cuda/bin/nvcc --version; } )
    echo "- nvcc: $(printf '%s\n' "$nv" | grep -i 'release' | head -n 1)"
    echo "- python/torch/NCCL: $(timeout 60 "${PYTHON:-python3}" -c '
import sys
try:
    import torch
    v = torch.cuda.nccl.version() if torch.cuda.is_available() else "?"
    v = ".".join(map(str, v)) if isinstance(v, tuple) else v
    print("python %s, torch %s (CUDA %s), NCCL %s, %d GPU(s)" % (sys.version.split()[0], torch.__version__, torch.version.cuda, v, torch.cuda.device_count()))
except Exception as e:
    print("python %s, torch not usable: %s" % (sys.version.split()[0], e))
' 2>&1 | tail -n 1)"
    local f miss
    for f in "$FERROCE_LIB_DIR/libnccl-net-ferroce.so" "$FERROCE_LIB_DIR/softroce/libibverbs.so.1"; do
        if [ ! -e "$f" ]; then
            echo "- $f: MISSING (carry target/release from the build host)"
            continue
        fi
        miss=$(ldd "$f" 2>&1 | grep -E 'not found|version .* not found' | tr -s ' \t' ' ' | tr '\n' ';')
        echo "- $(basename "$f"): $(stat -c %s "$f") bytes, needs $(objdump -T "$f" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n 1)${miss:+; ldd: $miss}"
    done
    if command -v ibv_devices >/dev/null 2>&1; then
        echo "- RDMA devices (ibv_devices): $(ibv_devices 2>/dev/null | count_ibv_devices)"
    else
        echo "- RDMA devices: ibv_devices not installed; /sys/class/infiniband: $(find /sys/class/infiniband -mindepth 1 -maxdepth 1 -printf '%f ' 2>/dev/null)"
    fi
}

# step_field NAME COLUMN: the step's recorded exit status (2) or seconds (3); empty when not run.
step_field() {
    awk -F'|' -v n="$1" -v c="$2" '$1 == n {v = $c} END {print v}' "$RESULTS" 2>/dev/null
}

# build_row NAME TITLE: the summary row of a build step: PASS, FAIL (rc N) or NOT RUN.
build_row() {
    local rc
    rc=$(step_field "$1" 2)
    echo "| $2 | $([ "$rc" = 0 ] && echo PASS || echo "${rc:+FAIL (rc $rc)}${rc:-NOT RUN}") | - | - | - |"
}

# One summary row for a run step: result, time, #wrong, proof of use.
summary_row() {
    local name=$1 mode=$2 log=$3 title=$4 rc secs wrong proof verdict ok
    rc=$(step_field "$name" 2)
    secs=$(step_field "$name" 3)
    if [ -z "$rc" ] || [ "$rc" = skip ]; then
        echo "| $title | NOT RUN | - | - | ${rc:+no time left} |"
        return
    fi
    if [ -s "$log" ]; then
        wrong=$(wrong_total "$log")
        grep -aq 'Out of bounds values : 0 OK' "$log" || wrong="$wrong (no final OK line)"
        check_nccl_log "$mode" "$log" >/dev/null
        ok=$?
        proof="$([ $ok -eq 0 ] && echo PASS || echo FAIL): $PROOF_LINE"
    else
        wrong="-"
        proof="FAIL: no log"
    fi
    verdict=$([ "$rc" = 0 ] && echo PASS || echo "FAIL (rc $rc$([ "$rc" = 124 ] && echo ', timeout'))")
    echo "| $title | $verdict | $secs | $wrong | $proof |"
}

write_summary() {
    local s=$OUTD/summary.md name
    {
        echo "# ferroce on a GPU host: gpu_check.sh"
        echo
        printf '%s\n' "$ENV_REPORT"
        [ -e "$BUILD_DIR/nccl.env" ] && sed 's/^/- nccl_direct build: /' "$BUILD_DIR/nccl.env"
        echo "- fabric for ferroce: $(grep -ah '^#env FERROCE_GPU_FABRIC=' "$OUTD"/torch-ferroce.log "$OUTD"/direct-ferroce.log 2>/dev/null | head -n 1 | cut -d= -f2)"
        echo "- GPUDirect RDMA (ferroce runs): $(grep -ahoE 'GPU Direct RDMA (Enabled|Disabled)[^|]*' "$OUTD"/torch-ferroce.log "$OUTD"/direct-ferroce.log 2>/dev/null | sort | uniq -c | head -n 3 | tr -s ' ' | tr '\n' ';') channel lines with /GDRDMA: $(cat "$OUTD"/torch-ferroce.log "$OUTD"/direct-ferroce.log 2>/dev/null | grep -ac 'via NET/ferroce/[0-9]*/GDRDMA')"
        echo "- NCCL (from the logs): $(grep -ahoE 'NCCL version [0-9][^ ]*' "$OUTD"/*.log 2>/dev/null | sort -u | tr '\n' ' ')"
        echo "- command: \`bash nccl-tests-harness/gpu/gpu_check.sh\` (budget ${BUDGET}s)"
        echo
        echo "| step | result | time (s) | #wrong | proof of use (NCCL INFO log) |"
        echo "|---|---|---:|---|---|"
        summary_row torch-ferroce ferroce "$OUTD/torch-ferroce.log" "torch all_reduce + all_gather, ferroce"
        summary_row torch-socket socket "$OUTD/torch-socket.log" "torch all_reduce + all_gather, NCCL socket"
        build_row direct-build "nccl_direct build (nvcc)"
        summary_row direct-ferroce ferroce "$OUTD/direct-ferroce.log" "nccl_direct all_reduce + send/recv, ferroce"
        summary_row direct-socket socket "$OUTD/direct-socket.log" "nccl_direct all_reduce + send/recv, NCCL socket"
        if grep -q '^nccl-tests-build|' "$RESULTS" 2>/dev/null; then
            build_row nccl-tests-build "nccl-tests build (MPI, PyTorch's NCCL)"
        fi
        if grep -q '^nccl-tests|' "$RESULTS" 2>/dev/null; then
            summary_row nccl-tests ferroce "$OUTD/nccl-tests-ferroce.log" "nccl-tests, ferroce"
            summary_row nccl-tests socket "$OUTD/nccl-tests-socket.log" "nccl-tests, NCCL socket"
        fi
        echo
        if [ -s "$OUTD/torch-ferroce.log" ] || [ -s "$OUTD/torch-socket.log" ]; then
            echo "## torch: bus bandwidth, ferroce vs NCCL socket"
            echo
            compare_tables "$OUTD/torch-ferroce.log" "$OUTD/torch-socket.log" ferroce socket
            echo
        fi
        if grep -aqs '^# embed-latency  *[0-9]' "$OUTD/torch-ferroce.log" "$OUTD/torch-socket.log"; then
            echo "## torch: embedding aggregation latency (BERT-style encoder, all_gather), ferroce vs NCCL socket"
            echo
            grep -ah -m 1 '^# embedding aggregation latency' "$OUTD/torch-ferroce.log" "$OUTD/torch-socket.log" | head -n 1 | sed 's/^# /- /'
            echo
            compare_latency "$OUTD/torch-ferroce.log" "$OUTD/torch-socket.log" ferroce socket
            echo
        fi
        if [ -s "$OUTD/direct-ferroce.log" ] || [ -s "$OUTD/direct-socket.log" ]; then
            echo "## nccl_direct: bus bandwidth, ferroce vs NCCL socket"
            echo
            compare_tables "$OUTD/direct-ferroce.log" "$OUTD/direct-socket.log" ferroce socket
            echo
        fi
        if [ -s "$OUTD/nccl-tests-ferroce.log" ]; then
            echo "## nccl-tests: bus bandwidth, ferroce vs NCCL socket"
            echo
            compare_tables "$OUTD/nccl-tests-ferroce.log" "$OUTD/nccl-tests-socket.log" ferroce socket
            echo
        fi
    } >"$s"
}

if [ "$SUMMARIZE_ONLY" = 1 ]; then
    # Rebuild the step table from the logs alone (rc 0 when a log has its final OK line).
    for n in torch-ferroce torch-socket direct-ferroce direct-socket; do
        [ -s "$OUTD/$n.log" ] || continue
        if grep -aq 'Out of bounds values : 0 OK' "$OUTD/$n.log"; then r=0; else r=1; fi
        echo "$n|$r|-" >>"$RESULTS"
    done
    [ -s "$OUTD/direct-ferroce.log" ] && echo "direct-build|0|-" >>"$RESULTS"
    ENV_REPORT="- (summary rebuilt from the logs in $OUTD on $(uname -n), $(date -u '+%F %T') UTC)"
    write_summary
    cat "$OUTD/summary.md"
    exit 0
fi

: >"$STEPS_LOG"
: >"$RESULTS"
echo "gpu_check: budget ${BUDGET}s, results in $OUTD, libraries from $FERROCE_LIB_DIR"
ENV_REPORT=$(env_report)
printf '%s\n' "$ENV_REPORT" | tee -a "$STEPS_LOG"

# Budget split (seconds; each step is also capped by what is left): torch ferroce 140, socket 80,
# build 50, nccl_direct ferroce 90, socket 50 (+ nccl-tests build 90, run 120 when asked). Iterations are capped
# (-n 10 -w 2, at most 512 MiB moved per size) so that a slow fabric still finishes every size.
TORCH_ARGS=${GPU_CHECK_TORCH_ARGS:--n 10 -w 2 --cap 512M}
DIRECT_ARGS=${GPU_CHECK_DIRECT_ARGS:--n 10 -w 2 --cap 512M}
export TORCH_ARGS DIRECT_ARGS
# shellcheck disable=SC2016  # expanded by the inner bash
step torch-ferroce 140 bash -c '"$0"/run_torch.sh --transport ferroce --log-dir "$1" --timeout "$STEP_LIMIT" -- $TORCH_ARGS' "$GPU_DIR" "$OUTD"
# shellcheck disable=SC2016
step torch-socket 80 bash -c '"$0"/run_torch.sh --transport socket --log-dir "$1" --timeout "$STEP_LIMIT" -- $TORCH_ARGS' "$GPU_DIR" "$OUTD"
selected direct-build && rm -f "$BUILD_DIR/nccl_direct" "$BUILD_DIR/nccl.env"
step direct-build 50 "$GPU_DIR/build_nccl_direct.sh" --out "$BUILD_DIR"
export BUILD_DIR
if [ -x "$BUILD_DIR/nccl_direct" ]; then
    # shellcheck disable=SC2016
    step direct-ferroce 90 bash -c '"$0"/run_nccl_direct.sh --transport ferroce --bin "$BUILD_DIR"/nccl_direct --log-dir "$1" --timeout "$STEP_LIMIT" -- $DIRECT_ARGS' "$GPU_DIR" "$OUTD"
    # shellcheck disable=SC2016
    step direct-socket 50 bash -c '"$0"/run_nccl_direct.sh --transport socket --bin "$BUILD_DIR"/nccl_direct --log-dir "$1" --timeout "$STEP_LIMIT" -- $DIRECT_ARGS' "$GPU_DIR" "$OUTD"
else
    echo "== nccl_direct not built: direct-ferroce and direct-socket skipped" | tee -a "$STEPS_LOG"
fi
if [ -n "${NCCL_TESTS_SRC:-}" ] && [ -z "${NCCL_TESTS_DIR:-}" ]; then
    step nccl-tests-build 90 "$GPU_DIR/build_nccl_tests.sh" "$NCCL_TESTS_SRC"
    NCCL_TESTS_DIR=$NCCL_TESTS_SRC
fi
if [ -n "${NCCL_TESTS_DIR:-}" ]; then
    # shellcheck disable=SC2016
    step nccl-tests 120 bash -c '"$0"/run_nccl_tests.sh "$1" --baseline socket --log-dir "$2" --timeout $((STEP_LIMIT / 4)) -- -b 4K -e 64M -f 4 -g 1 -n 10 -w 2 -c 1' "$GPU_DIR" "$NCCL_TESTS_DIR" "$OUTD"
fi

for f in "$OUTD"/*.log; do trim_log "$f"; done
write_summary
echo
echo "================ summary ($OUTD/summary.md) ================"
cat "$OUTD/summary.md"
if [ -s "$RESULTS" ] && awk -F'|' '$2 != "0" {bad = 1} END {exit bad}' "$RESULTS"; then
    echo "gpu_check: ALL PASSED in $(($(date +%s) - START))s"
    exit 0
fi
echo "gpu_check: SOME STEPS FAILED (see the table; logs in $OUTD) after $(($(date +%s) - START))s"
exit 1
