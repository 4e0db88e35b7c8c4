# shellcheck shell=bash
# Shared helpers of the GPU-host scripts. Sourced, never run.
#
#   setup_transport ferroce|socket   export the NCCL/softroce environment of one mode
#   check_nccl_log ferroce|socket F  proof of use: did the NCCL INFO log in F use that transport?
#   extract_rows F                   nccl-tests-style result rows of F as "op type bytes busbw wrong"
#   compare_tables FA FB NA NB       markdown table of busbw of FA against FB, per op/type/size
#   have_rdma_nic                    0 when a real (kernel) RDMA device exists
#
# Variables read (all optional):
#   FERROCE_LIB_DIR          where libnccl-net-ferroce.so and softroce/ are (default <repo>/target/release)
#   FERROCE_USE_SOFTROCE     1: always softroce; 0: never; unset: softroce when ibv_devices shows no device
#   FERROCE_GPU_SOFTROCE_NET first three octets of the per-rank softroce addresses (default 127.0.77:
#                            rank r binds 127.0.77.<r+1>)
#   NCCL_SOCKET_IFNAME       kept if set; default lo (bootstrap, ferroce's side channel and NET/Socket
#                            all stay on this host)

GPU_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$GPU_DIR/../.." && pwd)
FERROCE_LIB_DIR=${FERROCE_LIB_DIR:-$ROOT/target/release}
# The caller's environment, saved once so that two modes run back to back start from the same place.
: "${GPU_ORIG_LD_LIBRARY_PATH=${LD_LIBRARY_PATH-}}"
: "${GPU_ORIG_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME-}}"
export GPU_ORIG_LD_LIBRARY_PATH GPU_ORIG_SOCKET_IFNAME

gpu_say() { echo "[$(basename "$0")] $*"; }

# find_nccl: sets NCCL_INCLUDE and NCCL_LIB (directories) and NCCL_LINK (the -l argument) for the
# NCCL to build against: $NCCL_HOME/{include,lib}; else the Python package nvidia.nccl ($PYTHON,
# default python3: the NCCL PyTorch uses); else libnccl.so[.2] in the system library directories
# with /usr/include/nccl.h. A library found without its nccl.h gets nccl_min/nccl.h (minimal,
# ABI-accurate declarations). Returns 1 when there is no NCCL.
find_nccl() {
    NCCL_INCLUDE="" NCCL_LIB="" NCCL_LINK=""
    local cand d l
    if [ -n "${NCCL_HOME:-}" ]; then
        cand="$NCCL_HOME"
    else
        cand=$("${PYTHON:-python3}" - 2>/dev/null <<'EOF'
import importlib.util, os
spec = importlib.util.find_spec("nvidia.nccl")
for p in (list(spec.submodule_search_locations or []) if spec else []):
    print(p)
EOF
        )
    fi
    for d in $cand; do
        for l in lib lib64; do
            if [ -e "$d/$l/libnccl.so" ] || [ -e "$d/$l/libnccl.so.2" ]; then NCCL_LIB=$d/$l; break; fi
        done
        if [ -n "$NCCL_LIB" ]; then
            [ -e "$d/include/nccl.h" ] && NCCL_INCLUDE=$d/include
            break
        fi
    done
    if [ -z "$NCCL_LIB" ]; then
        for d in /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib /usr/local/cuda/lib64; do
            if [ -e "$d/libnccl.so" ] || [ -e "$d/libnccl.so.2" ]; then NCCL_LIB=$d; break; fi
        done
        [ -n "$NCCL_LIB" ] && [ -e /usr/include/nccl.h ] && NCCL_INCLUDE=/usr/include
    fi
    [ -n "$NCCL_LIB" ] || return 1
    if [ -z "$NCCL_INCLUDE" ]; then
        NCCL_INCLUDE=$GPU_DIR/nccl_min
        gpu_say "no nccl.h next to $NCCL_LIB: using the minimal declarations in $NCCL_INCLUDE/nccl.h"
    fi
    # shellcheck disable=SC2034  # read by the build scripts that source this file
    if [ -e "$NCCL_LIB/libnccl.so" ]; then NCCL_LINK=-lnccl; else NCCL_LINK=-l:libnccl.so.2; fi
    return 0
}

# nccl_header_version DIR: NCCL's version from DIR/nccl.h ("?" when it has none).
nccl_header_version() {
    awk '/^#define NCCL_MAJOR /{a=$3} /^#define NCCL_MINOR /{b=$3} /^#define NCCL_PATCH /{c=$3}
         END {if (a != "") print a "." b "." c; else print "?"}' "$1/nccl.h"
}

# find_nvcc: sets NVCC_BIN from $NVCC, PATH, $CUDA_HOME/bin or /usr/local/cuda/bin; 1 when none.
find_nvcc() {
    NVCC_BIN=${NVCC:-}
    local c
    if [ -z "$NVCC_BIN" ]; then
        for c in nvcc "${CUDA_HOME:-/nonexistent}/bin/nvcc" /usr/local/cuda/bin/nvcc; do
            if command -v "$c" >/dev/null 2>&1; then NVCC_BIN=$(command -v "$c"); break; fi
        done
    fi
    [ -n "$NVCC_BIN" ]
}

# gpu_arch_flags: sets GPU_ARCH (e.g. 90, from $NVCC_ARCH=sm_90 or the compute capability
# nvidia-smi reports; empty: nvcc's default) and ARCH_FLAGS (nvcc's -gencode arguments for it).
gpu_arch_flags() {
    local arch=${NVCC_ARCH:-} cc
    if [ -z "$arch" ] && command -v nvidia-smi >/dev/null 2>&1; then
        cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
        case $cc in [0-9][0-9] | [0-9][0-9][0-9]) arch=sm_$cc ;; esac
    fi
    GPU_ARCH=${arch#sm_}
    # shellcheck disable=SC2034  # read by the build scripts that source this file
    ARCH_FLAGS=()
    # shellcheck disable=SC2034
    [ -n "$GPU_ARCH" ] && ARCH_FLAGS=(-gencode "arch=compute_$GPU_ARCH,code=[sm_$GPU_ARCH,compute_$GPU_ARCH]")
    return 0
}

# Number of (non-softroce) devices `ibv_devices` prints on stdin.
count_ibv_devices() {
    awk '/^[[:space:]]*-+[[:space:]]+-+[[:space:]]*$/ {h = 1; next}
         h && NF && $1 !~ /^softroce/ {n++}
         END {print n + 0}'
}

have_rdma_nic() {
    case "${FERROCE_USE_SOFTROCE:-auto}" in
        1 | yes | true) return 1 ;;
        0 | no | false) return 0 ;;
    esac
    if command -v ibv_devices >/dev/null 2>&1; then
        local n
        n=$(LD_LIBRARY_PATH=$GPU_ORIG_LD_LIBRARY_PATH ibv_devices 2>/dev/null | count_ibv_devices)
        [ "$n" -gt 0 ]
        return
    fi
    local d
    for d in /sys/class/infiniband/*; do
        [ -e "$d" ] && return 0
    done
    return 1
}

# Number of visible GPUs (1 when it cannot be told).
gpu_count() {
    local n=0
    if command -v nvidia-smi >/dev/null 2>&1; then
        n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
    fi
    [ "$n" -gt 0 ] 2>/dev/null || n=1
    echo "$n"
}

# setup_transport MODE: export the environment of one mode. Per-rank variables (NCCL_HOSTID,
# SOFTROCE_ADDR) are set by each launcher per process, from FERROCE_GPU_SOFTROCE_NET.
#   ferroce: NCCL_NET_PLUGIN=ferroce, the plugin's directory on LD_LIBRARY_PATH, and softroce's
#            libibverbs.so.1 first when the host has no RDMA NIC. NCCL_NET stays unset on purpose, so
#            that a silent fallback to NCCL's own transports is possible and check_nccl_log catches it.
#   socket:  NCCL's internal socket transport: NCCL_NET=Socket, NCCL_NET_PLUGIN=none, no ferroce
#            directory on LD_LIBRARY_PATH.
setup_transport() {
    local mode=$1
    unset NCCL_NET NCCL_NET_PLUGIN SOFTROCE_ADDR FERROCE_GPU_SOFTROCE_NET_ACTIVE
    export NCCL_DEBUG=INFO
    export NCCL_DEBUG_SUBSYS=INIT,NET
    export NCCL_SOCKET_IFNAME=${GPU_ORIG_SOCKET_IFNAME:-lo}
    LD_LIBRARY_PATH=$GPU_ORIG_LD_LIBRARY_PATH
    FERROCE_GPU_FABRIC=tcp
    case $mode in
        ferroce)
            if [ ! -e "$FERROCE_LIB_DIR/libnccl-net-ferroce.so" ]; then
                gpu_say "missing $FERROCE_LIB_DIR/libnccl-net-ferroce.so (build it with 'make build' on an x86-64 host with Rust and copy target/release here, or set FERROCE_LIB_DIR)"
                return 1
            fi
            export NCCL_NET_PLUGIN=ferroce
            LD_LIBRARY_PATH=$FERROCE_LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
            if have_rdma_nic; then
                FERROCE_GPU_FABRIC=rdma
            else
                if [ ! -e "$FERROCE_LIB_DIR/softroce/libibverbs.so.1" ]; then
                    gpu_say "no RDMA NIC and no $FERROCE_LIB_DIR/softroce/libibverbs.so.1 (softroce)"
                    return 1
                fi
                LD_LIBRARY_PATH=$FERROCE_LIB_DIR/softroce:$LD_LIBRARY_PATH
                FERROCE_GPU_FABRIC=softroce
                export FERROCE_GPU_SOFTROCE_NET_ACTIVE=${FERROCE_GPU_SOFTROCE_NET:-127.0.77}
            fi
            ;;
        socket)
            export NCCL_NET=Socket
            export NCCL_NET_PLUGIN=none
            ;;
        *)
            gpu_say "unknown transport '$mode' (ferroce or socket)"
            return 1
            ;;
    esac
    if [ -n "$LD_LIBRARY_PATH" ]; then export LD_LIBRARY_PATH; else unset LD_LIBRARY_PATH; fi
    export FERROCE_GPU_FABRIC
}

# rank_env R: print the per-rank assignments (NAME=VALUE lines) for rank R of the current mode.
rank_env() {
    local r=$1
    echo "NCCL_HOSTID=${FERROCE_GPU_HOSTID_PREFIX:-ferroce-gpu-rank}$r"
    if [ -n "${FERROCE_GPU_SOFTROCE_NET_ACTIVE:-}" ]; then
        echo "SOFTROCE_ADDR=$FERROCE_GPU_SOFTROCE_NET_ACTIVE.$((r + 1))"
    fi
}

# The transport environment, for the head of every log ("#env " lines; show_tables drops them).
describe_env() {
    echo "# transport environment (fabric: ${FERROCE_GPU_FABRIC:-?}):"
    env | grep -E '^(NCCL_|SOFTROCE_|FERROCE_GPU_|LD_LIBRARY_PATH=)' | sort | sed 's/^/#env /'
}

# count_list: "a a b" lines on stdin -> "a x2, b x1".
count_list() {
    sort | uniq -c | awk '{printf "%s%s x%s", (NR > 1 ? ", " : ""), $2, $1}'
}

# check_nccl_log MODE FILE: proof of use, from NCCL's INFO log (NCCL_DEBUG=INFO,
# NCCL_DEBUG_SUBSYS=INIT,NET) of every rank, concatenated in FILE.
#   ferroce: needs "NET/Plugin: Loaded net plugin ferroce (vN)" and channel lines
#            "[send] via NET/ferroce" and "[receive] via NET/ferroce"; fails on any channel over
#            another NET (Socket, IB, ...), over P2P or SHM, on "Using network <not ferroce>", and
#            on "Failed to initialize NET plugin ferroce" / "... any NET plugin".
#   socket:  needs "[send]/[receive] via NET/Socket"; fails if ferroce was loaded or carried a
#            channel, on any other NET, P2P or SHM channel, and on "Using network <not Socket>".
# Prints one line per check and "proof: PASS|FAIL ..."; sets PROOF_LINE (one-line summary).
check_nccl_log() {
    local mode=$1 f=$2 net bad=0 n_send n_recv other p2p using loaded ver failed
    PROOF_LINE=""
    case $mode in
        ferroce) net=ferroce ;;
        socket) net=Socket ;;
        *)
            echo "  check: unknown mode '$mode'"
            PROOF_LINE="unknown mode $mode"
            return 2
            ;;
    esac
    if [ ! -s "$f" ]; then
        echo "  FAIL: log $f is missing or empty"
        PROOF_LINE="no log"
        return 1
    fi
    # Lines are matched anywhere in the line (NCCL prefixes "host:pid:tid [dev] NCCL INFO ").
    loaded=$(grep -aEo 'Loaded net plugin ferroce \(v[0-9]+\)' "$f" | head -n 1)
    ver=$(printf '%s' "$loaded" | grep -Eo 'v[0-9]+')
    n_send=$(grep -aEc "Channel .*\[send\] via NET/$net(/|[[:space:]]|$)" "$f")
    n_recv=$(grep -aEc "Channel .*\[receive\] via NET/$net(/|[[:space:]]|$)" "$f")
    other=$(grep -aE 'Channel .* via NET/' "$f" | grep -aEv "via NET/$net(/|[[:space:]]|$)" | grep -aEo 'NET/[A-Za-z0-9_.-]+' | count_list)
    p2p=$(grep -aE 'Channel .* via (P2P|SHM)' "$f" | grep -aEo '(P2P|SHM)[A-Za-z0-9/_-]*' | count_list)
    using=$(grep -aEo 'Using network [A-Za-z0-9_.-]+' "$f" | awk '{print $3}' | sort -u | tr '\n' ' ')
    failed=$(grep -aiE "Failed to initialize (any NET plugin|NET plugin $net([^A-Za-z0-9_]|$))" "$f" | head -n 1)

    if [ "$mode" = ferroce ]; then
        if [ -n "$loaded" ]; then
            echo "  ok:   NCCL loaded the plugin: $loaded"
        else
            echo "  FAIL: no 'Loaded net plugin ferroce (vN)' line (plugin not found, or not loaded)"
            grep -aE 'NET/Plugin' "$f" | head -n 3 | sed 's/^/        | /'
            bad=1
        fi
    else
        if [ -n "$loaded" ]; then
            echo "  FAIL: ferroce was loaded in the socket baseline: $loaded"
            bad=1
        else
            echo "  ok:   ferroce not loaded (baseline)"
        fi
        if grep -aEq 'Channel .* via NET/ferroce' "$f"; then
            echo "  FAIL: channels via NET/ferroce in the socket baseline"
            bad=1
        fi
    fi
    if [ "$n_send" -gt 0 ] && [ "$n_recv" -gt 0 ]; then
        echo "  ok:   channels via NET/$net: $n_send send, $n_recv receive"
    else
        echo "  FAIL: channels via NET/$net: $n_send send, $n_recv receive (need both > 0)"
        bad=1
    fi
    if [ -n "$other" ]; then
        echo "  FAIL: channels over another network: $other"
        bad=1
    fi
    if [ -n "$p2p" ]; then
        echo "  FAIL: channels over P2P/SHM (ranks on one NCCL host: is NCCL_HOSTID distinct per rank?): $p2p"
        bad=1
    fi
    if [ -n "$using" ]; then
        local u
        for u in $using; do
            if [ "$(printf '%s' "$u" | tr '[:upper:]' '[:lower:]')" != "$(printf '%s' "$net" | tr '[:upper:]' '[:lower:]')" ]; then
                echo "  FAIL: NCCL says 'Using network $u'"
                bad=1
            fi
        done
        [ "$bad" -eq 0 ] && echo "  ok:   Using network $using"
    fi
    if [ -n "$failed" ]; then
        echo "  FAIL: $failed"
        bad=1
    fi
    if [ "$bad" -eq 0 ]; then
        if [ "$mode" = ferroce ]; then
            PROOF_LINE="ferroce $ver loaded; $n_send send + $n_recv receive channel lines via NET/ferroce; no other transport"
        else
            PROOF_LINE="NET/Socket only: $n_send send + $n_recv receive channel lines; ferroce not loaded"
        fi
        echo "  proof: PASS ($PROOF_LINE)"
        return 0
    fi
    PROOF_LINE="proof FAILED (${loaded:-plugin not loaded}; NET/$net lines $n_send/$n_recv; other: ${other:-none}; p2p/shm: ${p2p:-none})"
    echo "  proof: FAIL"
    return 1
}

# extract_rows FILE: every nccl-tests-style result row as "op type bytes busbw wrong" (first,
# out-of-place group where there are two). The op comes from the last "# op: NAME" line
# (printed by these scripts and programs before each table).
extract_rows() {
    awk '
        /^# op: / { op = $3; next }
        $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ && $3 ~ /^[a-z][a-z0-9_]*$/ {
            if (NF == 9 || NF == 13) { b = $8; w = $9 }        # with the root column
            else if (NF == 8 || NF == 12) { b = $7; w = $8 }   # older nccl-tests, no root column
            else next
            if (b !~ /^[0-9.]+$/) next
            print (op == "" ? "?" : op), $3, $1, b, w
        }' "$1"
}

# compare_tables FILE_A FILE_B NAME_A NAME_B: markdown table of bus bandwidth per op/type/size.
compare_tables() {
    local a=$1 b=$2 na=$3 nb=$4
    {
        extract_rows "$a" | sed 's/^/A /'
        extract_rows "$b" | sed 's/^/B /'
    } | awk -v na="$na" -v nb="$nb" '
        { k = $2 " " $3 " " $4; if (!(k in seen)) { seen[k] = 1; order[++n] = k }
          if ($1 == "A") a[k] = $5; else bb[k] = $5 }
        END {
            printf "| op | type | size (B) | %s busbw (GB/s) | %s busbw (GB/s) | %s / %s |\n", na, nb, na, nb
            print "|---|---|---:|---:|---:|---:|"
            for (i = 1; i <= n; i++) {
                k = order[i]; split(k, p, " ")
                x = (k in a) ? a[k] : "-"; y = (k in bb) ? bb[k] : "-"
                r = (x != "-" && y != "-" && y + 0 > 0) ? sprintf("%.2f", x / y) : "-"
                printf "| %s | %s | %s | %s | %s | %s |\n", p[1], p[2], p[3], x, y, r
            }
        }'
}

# compare_latency A B NAME_A NAME_B: the embedding aggregation latency rows of two
# torch_allreduce.py logs ("# embed-latency" lines) as one markdown table, B / A ratios last.
compare_latency() {
    local a=$1 b=$2 na=$3 nb=$4
    {
        grep -a '^# embed-latency  *[0-9]' "$a" 2>/dev/null | sed 's/^# embed-latency/A/'
        grep -a '^# embed-latency  *[0-9]' "$b" 2>/dev/null | sed 's/^# embed-latency/B/'
    } | awk -v na="$na" -v nb="$nb" '
        { q = $2; if (!(q in seen)) { seen[q] = 1; order[++n] = q; rows[q] = $3; bytes[q] = $4 }
          if ($1 == "A") { a50[q] = $5; a99[q] = $6 } else { b50[q] = $5; b99[q] = $6 } }
        END {
            printf "| queries per rank | rows gathered | bytes | %s P50 (us) | %s P99 (us) | %s P50 (us) | %s P99 (us) | %s / %s P50 | %s / %s P99 |\n", na, na, nb, nb, nb, na, nb, na
            print "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
            for (i = 1; i <= n; i++) {
                q = order[i]
                x50 = (q in a50) ? a50[q] : "-"; x99 = (q in a99) ? a99[q] : "-"
                y50 = (q in b50) ? b50[q] : "-"; y99 = (q in b99) ? b99[q] : "-"
                r50 = (x50 != "-" && y50 != "-" && x50 + 0 > 0) ? sprintf("%.2f", y50 / x50) : "-"
                r99 = (x99 != "-" && y99 != "-" && x99 + 0 > 0) ? sprintf("%.2f", y99 / x99) : "-"
                printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", q, rows[q], bytes[q], x50, x99, y50, y99, r50, r99
            }
        }'
}

# busbw_at FILE OP TYPE BYTES: the busbw of that row, or "-".
busbw_at() {
    extract_rows "$1" | awk -v o="$2" -v t="$3" -v s="$4" '$1 == o && $2 == t && $3 == s {v = $4} END {print (v == "" ? "-" : v)}'
}

# wrong_total FILE: sum of the #wrong column of every row (non-numeric counts as 1).
wrong_total() {
    extract_rows "$1" | awk '{ if ($5 ~ /^[0-9]+$/) s += $5; else if ($5 != "N/A") s += 1 } END {print s + 0}'
}

# show_tables FILE: the result tables and "#" comment lines of a log, without NCCL's INFO lines
# and without describe_env's lines.
show_tables() {
    grep -aE '^(#|[[:space:]]*[0-9]+[[:space:]])' "$1" | grep -av '^# transport environment\|^#env '
}

# print_header_help: the leading comment block of the running script (its --help).
print_header_help() {
    awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"
}
