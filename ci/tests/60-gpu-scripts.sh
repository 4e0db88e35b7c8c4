#!/bin/bash
# shellcheck disable=SC2015,SC2030,SC2031  # "[ test ] && ok || ko" is the idiom here; subshells scope the env on purpose
# CPU-side checks of the GPU-host scripts (nccl-tests-harness/gpu/): everything that needs no GPU.
#   syntax (bash -n, shellcheck, py_compile, pyflakes, g++ syntax check of nccl_direct.cu's host
#   code against stub headers), torch_allreduce.py's pure functions and --dry-run, the proof-of-use
#   log checks on sample NCCL logs (testdata/), the table parsing, RDMA-NIC detection, the transport
#   environments, per-rank environments, argument parsing, the nvcc build script (fake nvcc), and
#   end-to-end runs of run_nccl_direct.sh, run_torch.sh and gpu_check.sh with test doubles of the
#   GPU programs (testdata/fake_*.sh), and the real plugin + softroce through the CPU harness in
#   the environment the GPU scripts export.
# Prints "N passed, M failed"; exit status 0 when nothing failed.
set -u
SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$(dirname "$0")/../.." || exit 1
G=$PWD/nccl-tests-harness/gpu
TD=$G/testdata
PASS=0
FAIL=0
D=$(mktemp -d /tmp/gpu-scripts-test.XXXXXX)
trap 'rm -rf "$D"' EXIT
trap 'exit 130' INT TERM

ok() { PASS=$((PASS + 1)); echo "   PASS $1"; }
ko() {
    FAIL=$((FAIL + 1))
    echo "   FAIL $1"
    [ -n "${2:-}" ] && [ -e "$2" ] && tail -n 20 "$2" | sed 's/^/   | /'
}
# expect NAME WANT_RC CMD...: run CMD (output to $D/out), pass when its status is WANT_RC.
expect() {
    local name=$1 want=$2 rc
    shift 2
    "$@" >"$D/out" 2>&1
    rc=$?
    if [ "$rc" -eq "$want" ]; then ok "$name"; else ko "$name (rc=$rc, want $want)" "$D/out"; fi
}
# has NAME REGEX FILE: pass when FILE matches the extended REGEX.
has() {
    if grep -Eq -- "$2" "$3"; then ok "$1"; else ko "$1 (no /$2/)" "$3"; fi
}
hasnt() {
    if grep -Eq -- "$2" "$3"; then ko "$1 (unexpected /$2/)" "$3"; else ok "$1"; fi
}

# A fake library directory (the scripts only check that the files exist) and fake NCCL install.
LIBD=$D/lib
mkdir -p "$LIBD/softroce" "$D/nccl/include" "$D/nccl/lib"
touch "$LIBD/libnccl-net-ferroce.so" "$LIBD/softroce/libibverbs.so.1" "$D/nccl/lib/libnccl.so.2"
cp "$G/nccl_min/nccl.h" "$D/nccl/include/"
sed -i 's/^#define NCCL_MIN_HEADER 1$//; s/^#define NCCL_MINOR 18$/#define NCCL_MINOR 21/; s/^#define NCCL_PATCH 0$/#define NCCL_PATCH 5/' "$D/nccl/include/nccl.h"
export FERROCE_LIB_DIR=$LIBD
export PYTHONDONTWRITEBYTECODE=1  # keep the tree clean (torch_allreduce is imported)

echo "== syntax"
for f in "$G"/*.sh "$TD"/fake_*.sh; do
    expect "bash -n $(basename "$f")" 0 bash -n "$f"
done
if command -v shellcheck >/dev/null 2>&1; then
    expect "shellcheck (gpu scripts, this test)" 0 shellcheck -x "$G"/*.sh "$TD"/fake_*.sh "$SELF"
else
    ko "shellcheck not installed (ci/install-deps.sh installs it)"
fi
expect "py_compile torch_allreduce.py" 0 python3 -c "import py_compile, sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2], doraise=True)" "$G/torch_allreduce.py" "$D/ta.pyc"
# pyflakes3 (Debian's command) rather than `python3 -m pyflakes`: python3 on PATH may be another
# interpreter than the one the package installed into.
if command -v pyflakes3 >/dev/null 2>&1; then
    expect "pyflakes torch_allreduce.py (undefined names, unused imports)" 0 pyflakes3 "$G/torch_allreduce.py"
else
    ko "pyflakes3 not installed (ci/install-deps.sh installs it)"
fi
if command -v g++ >/dev/null 2>&1; then
    sed -E 's/([A-Za-z_][A-Za-z0-9_]*)<<<([^>]*)>>>/(launch_config(\2), \1)/' "$G/nccl_direct.cu" >"$D/nccl_direct_host.cpp"
    expect "nccl_direct.cu host code compiles (g++ -fsyntax-only, stub CUDA/NCCL headers)" 0 \
        g++ -std=c++17 -fsyntax-only -Wall -Wextra -Werror -I "$TD/stub" -I "$G/nccl_min" -x c++ "$D/nccl_direct_host.cpp"
    expect "... and with a full header's macros (NCCL 2.21.5)" 0 \
        g++ -std=c++17 -fsyntax-only -Wall -Wextra -Werror -I "$TD/stub" -I "$D/nccl/include" -x c++ "$D/nccl_direct_host.cpp"
    # The whole program on the CPU with one rank: stub CUDA runtime (kernels as plain loops) and a
    # one-rank fake NCCL (testdata/stub/fake_nccl.cpp).
    if g++ -std=c++17 -O1 -Wall -Wextra -Werror -I "$TD/stub" -I "$G/nccl_min" -x c++ "$D/nccl_direct_host.cpp" \
        -x c++ "$TD/stub/fake_nccl.cpp" -o "$D/nccl_direct_cpu" >"$D/out" 2>&1; then
        ok "nccl_direct.cu builds for a CPU run (stub runtime, fake one-rank NCCL)"
        expect "nccl_direct CPU run, 1 rank: every element checked, none wrong" 0 \
            "$D/nccl_direct_cpu" --rank 0 --nranks 1 --id-file "$D/nccl-id" -b 4K -e 1M -f 4 -n 2 -w 1
        cp "$D/out" "$D/ndcpu.txt"
        nd_rows() { awk '/^# op: /{op=$3} $1 ~ /^[0-9]+$/ && NF == 9 {print op, $3, $1, $9}' "$1"; }
        n=$(nd_rows "$D/ndcpu.txt" | grep -c ' 0$')
        [ "$n" -eq 10 ] && ok "... 5 sizes x (all_reduce, sendrecv) in nccl-tests' columns, #wrong 0" || ko "nccl_direct CPU rows: $n" "$D/ndcpu.txt"
        has "... and the final OK line" '^# Out of bounds values : 0 OK$' "$D/ndcpu.txt"
        [ -e "$D/nccl-id" ] && ko "nccl_direct left its id file" || ok "... and rank 0 removed the id file"
        expect "nccl_direct catches corrupted results (exit 1)" 1 env FAKE_NCCL_CORRUPT=1 \
            "$D/nccl_direct_cpu" --rank 0 --nranks 1 --id-file "$D/nccl-id" -b 4K -e 16K -f 4 -n 2 -w 1
        has "... counting them" '^# Out of bounds values : 8 FAILED$' "$D/out"
        expect "nccl_direct: an NCCL error exits 2 with the message" 2 \
            "$D/nccl_direct_cpu" --rank 0 --nranks 2 --id-file "$D/nccl-id2" -b 4K -e 4K
        has "... naming the call" 'NCCL error 5: fake NCCL error' "$D/out"
        expect "nccl_direct: bad arguments exit 2" 2 "$D/nccl_direct_cpu" --rank 3 --nranks 2 --id-file x
        expect "nccl_direct: a missing id file times out (-T 1)" 2 "$D/nccl_direct_cpu" --rank 1 --nranks 2 --id-file "$D/none" -T 1
    else
        ko "nccl_direct.cu CPU build" "$D/out"
    fi
else
    ko "g++ not installed (ci/install-deps.sh installs it): nccl_direct.cu host code unchecked"
fi

echo "== torch_allreduce.py without torch"
cat >"$D/t.py" <<'EOF'
import struct, sys
sys.path.insert(0, sys.argv[1])
import torch_allreduce as t

assert t.parse_size("4K") == 4096 and t.parse_size("256M") == 256 << 20 and t.parse_size("1G") == 1 << 30
assert t.parse_size("4096") == 4096 and t.parse_size("1.5K") == 1536
for bad in ("x", "0", "-4K", "4Q"):
    try:
        t.parse_size(bad)
    except Exception:
        pass
    else:
        raise AssertionError("accepted bad size %r" % bad)
s = t.sizes(4096, 256 << 20, 2)
assert len(s) == 17 and s[0] == 4096 and s[-1] == 256 << 20, s
assert t.sizes(8, 8, 2) == [8] and t.sizes(8, 64, 1) == [8]
assert t.iters_for(4096, 20, 5, 1 << 30) == (20, 5)
assert t.iters_for(256 << 20, 20, 5, 1 << 30) == (4, 4)
assert t.iters_for(256 << 20, 10, 2, 512 << 20) == (2, 2)
assert t.iters_for(1 << 30, 20, 5, 512 << 20) == (1, 1)
assert t.busbw_factor("all_reduce", 2) == 1.0 and t.busbw_factor("all_reduce", 4) == 1.5
assert t.busbw_factor("all_gather", 2) == 0.5 and t.busbw_factor("sendrecv", 2) == 1.0
F32, BF16, F16 = 3.4028234663852886e38, 3.3895313892515355e38, 65504.0
mx = t.PATTERN * 2 + 1
assert t.expected_sum_scale(2, 25, mx, F32) == 2.0 ** 24
assert t.expected_sum_scale(2, 25, mx, BF16) == 2.0 ** 24
assert t.expected_sum_scale(2, 25, mx, F16) is None  # 27 * 2^24 overflows half
assert t.expected_sum_scale(3, 5, mx, F32) is None   # 3^k is not exact in bf16
assert t.expected_sum_scale(2, 1, mx, F16) == 1.0


def bf16_exact(x):
    """x (a float32 value) survives float32 -> bfloat16 (drop the low 16 bits) unchanged."""
    b = struct.unpack("<I", struct.pack("<f", x))[0]
    return b & 0xFFFF == 0


# Every input, every first sum, and every chained sum (x 2^k) is exact in bfloat16.
world = 2
for i in range(t.PATTERN):
    for r in range(world):
        assert bf16_exact(float(i + 1 + r))
    first = world * (i + 1) + world * (world - 1) // 2
    for k in range(0, 30):
        assert bf16_exact(float(first * 2 ** k)), (first, k)
env = {"FERROCE_GPU_SOFTROCE_NET_ACTIVE": "127.0.77"}
e0 = t.rank_environment(0, environ=dict(env))
e1 = t.rank_environment(1, environ=dict(env))
assert e0["NCCL_HOSTID"] != e1["NCCL_HOSTID"], (e0, e1)
assert e0["SOFTROCE_ADDR"] == "127.0.77.1" and e1["SOFTROCE_ADDR"] == "127.0.77.2"
assert "SOFTROCE_ADDR" not in t.rank_environment(1, environ={})
assert "NCCL_HOSTID" not in t.rank_environment(1, no_hostid=True, environ={})
assert t.nccl_version_string(type("T", (), {"cuda": type("C", (), {"nccl": type("N", (), {"version": staticmethod(lambda: (2, 21, 5))})})})) == "2.21.5"
# The embedding aggregation latency: nearest-rank percentiles, query counts, its rows.
assert t.percentile([5, 1, 3, 2, 4], 50) == 3 and t.percentile([7], 99) == 7
assert t.percentile(list(range(1, 101)), 99) == 99 and t.percentile(list(range(1, 201)), 99) == 198
assert t.parse_counts("1,8,64") == [1, 8, 64] and t.parse_counts("") == []
for bad in ("0", "x", "-1"):
    try:
        t.parse_counts(bad)
    except Exception:
        pass
    else:
        raise AssertionError("accepted bad query count %r" % bad)
lat = t.latency_row(8, 2, 1536, [float(v) for v in range(1, 201)], [900.0, 1100.0], 0).split()
assert lat[:2] == ["#", "embed-latency"] and lat[2:7] == ["8", "16", "24576", "100.0", "198.0"], lat
# Rows in nccl-tests' layout, for the shell parser.
print("# op: all_reduce")
print(t.header("x", "all_reduce"))
print(t.row(67108864, 16777216, "float", "sum", 41233.0, 1.63, 1.63, 0))
print(t.row(4096, 2048, "bfloat16", "sum", 61.0, 0.07, 0.07, 3))
print("# op: all_gather")
print(t.row(8388608, 2097152, "float", "none", 5710.3, 1.47, 0.73, 0))
EOF
expect "pure functions (sizes, iterations, busbw, exactness in bf16, per-rank env)" 0 python3 "$D/t.py" "$G"
cp "$D/out" "$D/rows.txt"
expect "--dry-run needs no torch" 0 python3 "$G/torch_allreduce.py" --dry-run
cp "$D/out" "$D/dry.txt"
n=$(grep -cE '^ +[0-9]+ +[0-9]+ +(float|bfloat16) +sum' "$D/dry.txt")
if [ "$n" -eq 34 ]; then ok "--dry-run plans 17 sizes x 2 dtypes (4K..256M)"; else ko "--dry-run plans $n rows, want 34" "$D/dry.txt"; fi
has "--dry-run: distinct NCCL_HOSTID per rank" 'rank 1 env: NCCL_HOSTID=ferroce-gpu-rank1' "$D/dry.txt"
# The whole script with one rank on a pure-Python stand-in for torch (testdata/fake_torch).
FT=(env PYTHONPATH="$TD/fake_torch" RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 python3 "$G/torch_allreduce.py"
    -e 16K --embed-vocab 100 --embed-dim 8 --embed-batch 16 -n 3 -w 1 --embed-queries '')
expect "whole flow with 1 rank on a fake torch: every element checked, none wrong" 0 "${FT[@]}"
cp "$D/out" "$D/ft.txt"
has "... NCCL_HOSTID set before init_process_group" '^# rank 0/1: cuda:0 \(fake GPU\), NCCL_HOSTID=ferroce-gpu-rank0$' "$D/ft.txt"
[ "$(grep -cE '^ +[0-9]+ +[0-9]+ +(float|bfloat16) +(sum|none) +-1 .* 0$' "$D/ft.txt")" = 8 ] &&
    ok "... 3 sizes x 2 dtypes all_reduce + 2 all_gather rows, #wrong 0" || ko "fake torch rows" "$D/ft.txt"
has "... final OK line" '^# Out of bounds values : 0 OK$' "$D/ft.txt"
expect "fake torch: damaged results are caught (exit 1)" 1 env FAKE_TORCH_CORRUPT=1 "${FT[@]}"
has "... in all_reduce (chain and fresh check) and all_gather" '^# Out of bounds values : 14 FAILED$' "$D/out"
expect "-b larger than -e is refused" 2 python3 "$G/torch_allreduce.py" --dry-run -b 1M -e 4K
expect "unknown dtype is refused" 2 python3 "$G/torch_allreduce.py" --dry-run --dtypes int8
expect "bad size is refused" 2 python3 "$G/torch_allreduce.py" --dry-run -e 4Q

# shellcheck source=nccl-tests-harness/gpu/lib.sh
. "$G/lib.sh"

echo "== proof-of-use checks on sample NCCL logs"
# file mode expected-result what
while read -r f m want what; do
    [ -z "$f" ] && continue
    check_nccl_log "$m" "$TD/$f" >"$D/chk" 2>&1
    rc=$?
    if { [ "$want" = pass ] && [ "$rc" -eq 0 ]; } || { [ "$want" = fail ] && [ "$rc" -eq 1 ]; }; then
        ok "$f as $m: $want ($what)"
    else
        ko "$f as $m: rc=$rc, want $want ($what)" "$D/chk"
    fi
done <<'EOF'
torch-ferroce-good.log ferroce pass good torch log (NCCL 2.21, v8)
nccl-tests-ferroce-good.log ferroce pass good nccl-tests log (NCCL 2.27, v10, /Shared p2p)
ferroce-old-format.log ferroce pass NCCL 2.18 format (busId, no Using network)
nccl-tests-old-columns.log ferroce pass old nccl-tests columns
direct-wrong.log ferroce pass transport proven (results are checked separately)
ferroce-fallback-socket.log ferroce fail ferroce loaded but NCCL fell back to NET/Socket
ferroce-not-found.log ferroce fail no Loaded net plugin ferroce line
ferroce-no-loaded-line.log ferroce fail channels via NET/ferroce without the Loaded line
ferroce-p2p-shm.log ferroce fail P2P/SHM between the ranks
ferroce-ib-fallback.log ferroce fail NCCL internal IB
ferroce-one-socket-channel.log ferroce fail one channel over NET/Socket
ferroce-init-failed.log ferroce fail Failed to initialize NET plugin ferroce
torch-socket-good.log ferroce fail a socket log is no proof of ferroce
torch-socket-good.log socket pass good socket baseline
ferroce-not-found.log socket pass socket transport with the plugin absent
torch-ferroce-good.log socket fail ferroce in the baseline
ferroce-fallback-socket.log socket fail ferroce loaded in the baseline
ferroce-p2p-shm.log socket fail P2P/SHM in the baseline
EOF
check_nccl_log ferroce "$TD/ferroce-fallback-socket.log" >"$D/chk"
has "fallback: names the other network" 'FAIL: channels over another network: NET/Socket x8' "$D/chk"
has "fallback: names Using network Socket" "FAIL: NCCL says 'Using network Socket'" "$D/chk"
check_nccl_log ferroce "$TD/ferroce-not-found.log" >"$D/chk"
has "not found: says the plugin was not loaded" "FAIL: no 'Loaded net plugin ferroce" "$D/chk"
check_nccl_log ferroce "$TD/ferroce-p2p-shm.log" >"$D/chk"
has "p2p/shm: hints at NCCL_HOSTID" 'P2P/CUMEM/read x4, SHM/direct/direct x2.*|NCCL_HOSTID' "$D/chk"
check_nccl_log ferroce "$TD/torch-ferroce-good.log" >/dev/null
if [ "$PROOF_LINE" = "ferroce v8 loaded; 4 send + 4 receive channel lines via NET/ferroce; no other transport" ]; then
    ok "PROOF_LINE names the ABI version and the channel counts"
else
    ko "PROOF_LINE is '$PROOF_LINE'"
fi
expect "a missing log fails" 1 check_nccl_log ferroce "$D/nonexistent.log"
expect "an unknown mode is an error" 2 check_nccl_log tcp "$TD/torch-ferroce-good.log"

echo "== tables"
extract_rows "$TD/nccl-tests-ferroce-good.log" >"$D/rows"
if [ "$(wc -l <"$D/rows")" -eq 5 ] && grep -qx 'all_reduce float 268435456 1.58 0' "$D/rows" && grep -qx 'sendrecv float 268435456 2.74 0' "$D/rows"; then
    ok "extract_rows: nccl-tests rows (13 columns), op from '# op:' lines"
else
    ko "extract_rows on nccl-tests-ferroce-good.log" "$D/rows"
fi
extract_rows "$TD/nccl-tests-old-columns.log" >"$D/rows"
if grep -qx 'all_reduce float 67108864 1.60 3' "$D/rows" && [ "$(wc -l <"$D/rows")" -eq 2 ]; then
    ok "extract_rows: old 12-column rows (no root)"
else
    ko "extract_rows on nccl-tests-old-columns.log" "$D/rows"
fi
extract_rows "$D/rows.txt" >"$D/rows"
if grep -qx 'all_reduce float 67108864 1.63 0' "$D/rows" && grep -qx 'all_reduce bfloat16 4096 0.07 3' "$D/rows" && grep -qx 'all_gather float 8388608 0.73 0' "$D/rows"; then
    ok "extract_rows parses torch_allreduce.py's own rows"
else
    ko "extract_rows on torch_allreduce.py rows" "$D/rows"
fi
[ "$(wrong_total "$TD/direct-wrong.log")" = 12 ] && ok "wrong_total counts #wrong (12)" || ko "wrong_total direct-wrong.log = $(wrong_total "$TD/direct-wrong.log")"
[ "$(wrong_total "$TD/torch-ferroce-good.log")" = 0 ] && ok "wrong_total of a good log is 0" || ko "wrong_total torch-ferroce-good.log"
[ "$(busbw_at "$TD/torch-ferroce-good.log" all_reduce bfloat16 67108864)" = 1.64 ] && ok "busbw_at" || ko "busbw_at"
compare_tables "$TD/torch-ferroce-good.log" "$TD/torch-socket-good.log" ferroce socket >"$D/cmp"
has "compare_tables: markdown header" '^\| op \| type \| size \(B\) \| ferroce busbw' "$D/cmp"
has "compare_tables: ratio per size" '^\| all_reduce \| float \| 67108864 \| 1\.63 \| 2\.51 \| 0\.65 \|$' "$D/cmp"
printf '%s\n' '# embed-latency  queries rows bytes p50(us) p99(us) mean(us) encode(us) #wrong' \
    '# embed-latency        1      2      3072      20.0      30.0      21.0       900.0      0' >"$D/lat-a.log"
printf '%s\n' '# embed-latency        1      2      3072      50.0      90.0      55.0       900.0      0' >"$D/lat-b.log"
compare_latency "$D/lat-a.log" "$D/lat-b.log" ferroce socket >"$D/cmp"
has "compare_latency: P50 and P99 of both, and their ratios" '^\| 1 \| 2 \| 3072 \| 20\.0 \| 30\.0 \| 50\.0 \| 90\.0 \| 2\.50 \| 3\.00 \|$' "$D/cmp"
compare_tables "$TD/torch-ferroce-good.log" "$D/nonexistent.log" ferroce socket >"$D/cmp" 2>/dev/null
has "compare_tables: a missing side shows '-'" '^\| all_reduce \| float \| 4096 \| 0\.07 \| - \| - \|$' "$D/cmp"
show_tables "$TD/torch-ferroce-good.log" >"$D/show"
hasnt "show_tables drops NCCL INFO and #env lines" 'NCCL INFO|^#env ' "$D/show"
has "show_tables keeps the rows" '^ +67108864 +16777216 +float' "$D/show"

echo "== RDMA NIC detection and transport environments"
[ "$(count_ibv_devices <"$TD/ibv_devices-mlx5.txt")" = 2 ] && ok "ibv_devices: two mlx5 devices" || ko "count mlx5"
[ "$(count_ibv_devices <"$TD/ibv_devices-none.txt")" = 0 ] && ok "ibv_devices: none" || ko "count none"
[ "$(count_ibv_devices <"$TD/ibv_devices-softroce.txt")" = 0 ] && ok "ibv_devices: softroce is not an RDMA NIC" || ko "count softroce"
mkdir -p "$D/bin"
for k in mlx5 none softroce; do
    printf '#!/bin/sh\ncat %s\n' "$TD/ibv_devices-$k.txt" >"$D/bin/ibv_devices"
    chmod +x "$D/bin/ibv_devices"
    PATH=$D/bin:$PATH FERROCE_USE_SOFTROCE="" have_rdma_nic
    got=$?
    want=1
    [ "$k" = mlx5 ] && want=0
    [ "$got" = "$want" ] && ok "have_rdma_nic with ibv_devices listing $k: $got" || ko "have_rdma_nic ($k): $got, want $want"
done
FERROCE_USE_SOFTROCE=1 have_rdma_nic && ko "FERROCE_USE_SOFTROCE=1 forces softroce" || ok "FERROCE_USE_SOFTROCE=1 forces softroce"
FERROCE_USE_SOFTROCE=0 have_rdma_nic && ok "FERROCE_USE_SOFTROCE=0 forces the RDMA NIC" || ko "FERROCE_USE_SOFTROCE=0"
(
    export FERROCE_USE_SOFTROCE=1 NCCL_NET=IB
    setup_transport ferroce && describe_env
) >"$D/env" 2>&1
has "ferroce: NCCL_NET_PLUGIN=ferroce" '^#env NCCL_NET_PLUGIN=ferroce$' "$D/env"
has "ferroce: softroce first on LD_LIBRARY_PATH, then the plugin" "^#env LD_LIBRARY_PATH=$LIBD/softroce:$LIBD(:|$)" "$D/env"
hasnt "ferroce: NCCL_NET unset (a fallback stays visible)" '^#env NCCL_NET=' "$D/env"
has "ferroce: NCCL_DEBUG=INFO, SUBSYS=INIT,NET" '^#env NCCL_DEBUG_SUBSYS=INIT,NET$' "$D/env"
has "ferroce: per-rank softroce net" '^#env FERROCE_GPU_SOFTROCE_NET_ACTIVE=127\.0\.77$' "$D/env"
(
    export FERROCE_USE_SOFTROCE=0
    setup_transport ferroce && describe_env
) >"$D/env" 2>&1
has "ferroce over an RDMA NIC: no softroce" "^#env LD_LIBRARY_PATH=$LIBD(:|$)" "$D/env"
hasnt "ferroce over an RDMA NIC: no SOFTROCE address" 'SOFTROCE' "$D/env"
(
    export FERROCE_USE_SOFTROCE=1
    setup_transport socket && describe_env
) >"$D/env" 2>&1
has "socket: NCCL_NET=Socket" '^#env NCCL_NET=Socket$' "$D/env"
has "socket: NCCL_NET_PLUGIN=none" '^#env NCCL_NET_PLUGIN=none$' "$D/env"
hasnt "socket: no ferroce directory on LD_LIBRARY_PATH" "LD_LIBRARY_PATH=.*$LIBD" "$D/env"
(FERROCE_LIB_DIR=$D/none setup_transport ferroce) >"$D/env" 2>&1 && ko "a missing plugin is an error" "$D/env" || ok "a missing plugin is an error"
(
    export FERROCE_USE_SOFTROCE=1
    setup_transport ferroce
    OMPI_COMM_WORLD_RANK=0 "$G/rank_exec.sh" env
    PMI_RANK=1 "$G/rank_exec.sh" env
) >"$D/env" 2>&1
has "rank_exec.sh: rank 0 host id and softroce address" '^SOFTROCE_ADDR=127\.0\.77\.1$' "$D/env"
has "rank_exec.sh: rank 1 (PMI_RANK) host id" '^NCCL_HOSTID=ferroce-gpu-rank1$' "$D/env"
[ "$(grep -c '^NCCL_HOSTID=' "$D/env")" = 2 ] && [ "$(grep '^NCCL_HOSTID=' "$D/env" | sort -u | wc -l)" = 2 ] && ok "rank_exec.sh: distinct NCCL_HOSTID" || ko "rank_exec.sh: NCCL_HOSTID" "$D/env"
expect "rank_exec.sh without a rank fails" 2 env -u OMPI_COMM_WORLD_RANK -u PMI_RANK -u PMIX_RANK -u SLURM_PROCID "$G/rank_exec.sh" true
FERROCE_GPU_DEVICE_MOD=1 OMPI_COMM_WORLD_RANK=1 "$G/rank_exec.sh" env >"$D/env" 2>&1
has "rank_exec.sh: NCCL_TESTS_DEVICE = rank % GPUs" '^NCCL_TESTS_DEVICE=0$' "$D/env"

echo "== argument parsing"
for s in run_torch.sh run_nccl_direct.sh run_nccl_tests.sh gpu_check.sh build_nccl_direct.sh build_nccl_tests.sh; do
    expect "$s --help" 0 "$G/$s" --help
    expect "$s rejects an unknown option" 2 "$G/$s" --bogus
done
for s in run_torch.sh run_nccl_direct.sh; do
    expect "$s --transport tcp is refused" 2 "$G/$s" --transport tcp --dry-run
    expect "$s --baseline ib is refused" 2 "$G/$s" --baseline ib --dry-run
    expect "$s --dry-run --baseline socket" 0 "$G/$s" --dry-run --baseline socket --log-dir "$D/dry"
done
"$G/run_torch.sh" --dry-run --baseline socket --log-dir "$D/dry" -- -e 64M >"$D/out" 2>&1
has "run_torch.sh: torchrun with 2 processes, arguments passed on" 'torch\.distributed\.run --standalone --nproc_per_node=2 .*torch_allreduce\.py -e 64M' "$D/out"
expect "run_torch.sh --nproc x is refused" 2 "$G/run_torch.sh" --nproc x --dry-run
expect "gpu_check.sh --budget x is refused" 2 "$G/gpu_check.sh" --budget x
expect "run_nccl_tests.sh without a directory" 2 env -u NCCL_TESTS_DIR "$G/run_nccl_tests.sh"
expect "run_nccl_tests.sh --np 1 is refused" 2 "$G/run_nccl_tests.sh" "$D" --np 1
mkdir -p "$D/nt/build"
printf '#!/bin/sh\nexit 0\n' >"$D/nt/build/all_reduce_perf"
cp "$D/nt/build/all_reduce_perf" "$D/nt/build/sendrecv_perf"
chmod +x "$D/nt/build/"*
expect "run_nccl_tests.sh refuses a build without MPI" 2 "$G/run_nccl_tests.sh" "$D/nt" --log-dir "$D/nt-logs"
has "... and says why (one process, one NCCL_HOSTID)" 'built without MPI.*' "$D/out"
expect "run_nccl_tests.sh missing binaries" 2 "$G/run_nccl_tests.sh" "$D/empty-dir"
expect "run_nccl_tests.sh --dry-run" 0 "$G/run_nccl_tests.sh" "$D/nt" --dry-run --baseline socket --log-dir "$D/nt-logs"
has "run_nccl_tests.sh: 2 MPI ranks, per-rank wrapper, -g 1" 'mpirun -np 2 .*rank_exec\.sh .*/all_reduce_perf -b 4K -e 256M -f 2 -g 1' "$D/out"
has "run_nccl_tests.sh: sendrecv_perf too" 'rank_exec\.sh .*/sendrecv_perf' "$D/out"

echo "== build_nccl_direct.sh (fake NCCL, fake nvcc)"
expect "--print-nccl finds NCCL_HOME" 0 env NCCL_HOME="$D/nccl" "$G/build_nccl_direct.sh" --print-nccl
has "... and reads its version" 'NCCL 2\.21\.5: headers .*/nccl/include, library .*/nccl/lib \(-l:libnccl\.so\.2\)' "$D/out"
mkdir -p "$D/nccl-noinc/lib"
touch "$D/nccl-noinc/lib/libnccl.so.2"
expect "a library without nccl.h falls back to nccl_min/nccl.h" 0 env NCCL_HOME="$D/nccl-noinc" "$G/build_nccl_direct.sh" --print-nccl
has "... and says so" "using the minimal declarations in $G/nccl_min/nccl.h" "$D/out"
expect "NCCL not found is an error" 1 env NCCL_HOME="$D/none" PYTHON=false PATH=/usr/bin:/bin "$G/build_nccl_direct.sh" --print-nccl
expect "build with nvcc (fake)" 0 env NCCL_HOME="$D/nccl" NVCC="$TD/fake_nvcc.sh" NVCC_ARCH=sm_90 FAKE_NVCC_ARGS="$D/nvcc.args" "$G/build_nccl_direct.sh" --out "$D/build"
has "nvcc: -gencode for sm_90" 'arch=compute_90,code=\[sm_90,compute_90\]' "$D/nvcc.args"
has "nvcc: NCCL include, library and RPATH" "-I$D/nccl/include .*nccl_direct\.cu -L$D/nccl/lib -l:libnccl\.so\.2 -Xlinker -rpath -Xlinker $D/nccl/lib" "$D/nvcc.args"
has "nccl.env written" '^NCCL_VERSION=2\.21\.5$' "$D/build/nccl.env"
expect "nvcc missing is an error" 1 env NCCL_HOME="$D/nccl" NVCC="" CUDA_HOME="$D/none" PATH=/usr/bin:/bin "$G/build_nccl_direct.sh" --out "$D/build2"

echo "== build_nccl_tests.sh (fake nccl-tests source, fake NCCL, MPI and nvcc)"
mkdir -p "$D/nts/src" "$D/mpi/include"
touch "$D/mpi/include/mpi.h"
# A stand-in for nccl-tests' top-level Makefile: records its variables, makes the two binaries.
cat >"$D/nts/Makefile" <<'EOF'
default:
	@mkdir -p $(BUILDDIR)
	@echo "MPI=$(MPI) MPI_HOME=$(MPI_HOME) NCCL_HOME=$(NCCL_HOME) NVCC=$(NVCC) NVCC_GENCODE=$(NVCC_GENCODE)" >$(BUILDDIR)/make.args
	@test -e $(NCCL_HOME)/include/nccl.h && test -e $(NCCL_HOME)/lib/libnccl.so
	@printf '#!/bin/sh\n' >$(BUILDDIR)/all_reduce_perf; cp $(BUILDDIR)/all_reduce_perf $(BUILDDIR)/sendrecv_perf; chmod +x $(BUILDDIR)/*_perf
EOF
cp "$D/nts/Makefile" "$D/nts/src/Makefile"
NTB=(env NCCL_HOME="$D/nccl" MPI_HOME="$D/mpi" NVCC="$TD/fake_nvcc.sh" NVCC_ARCH=sm_90 "$G/build_nccl_tests.sh" "$D/nts" --jobs 2)
expect "build with MPI against the NCCL found (fake make, nvcc)" 0 "${NTB[@]}"
has "make: MPI=1, MPI_HOME, an NCCL_HOME of links, sm_90" "^MPI=1 MPI_HOME=$D/mpi NCCL_HOME=$D/nts/build/nccl-home NVCC=$TD/fake_nvcc.sh NVCC_GENCODE=-gencode=arch=compute_90,code=sm_90\$" "$D/nts/build/make.args"
[ "$(readlink "$D/nts/build/nccl-home/lib/libnccl.so")" = "$D/nccl/lib/libnccl.so.2" ] &&
    ok "... libnccl.so links to the package's libnccl.so.2" || ko "nccl-home/lib/libnccl.so: $(readlink "$D/nts/build/nccl-home/lib/libnccl.so")"
has "nccl.env names the NCCL library" "^NCCL_LIB=$D/nccl/lib\$" "$D/nts/build/nccl.env"
expect "run_nccl_tests.sh runs that build with its NCCL first on LD_LIBRARY_PATH" 0 "$G/run_nccl_tests.sh" "$D/nts" --dry-run --log-dir "$D/nts-logs"
has "... (the environment it logs)" "^#env LD_LIBRARY_PATH=.*$D/nccl/lib" "$D/out"
expect "MPI missing is an error" 1 env NCCL_HOME="$D/nccl" MPI_HOME="$D/none" NVCC="$TD/fake_nvcc.sh" "$G/build_nccl_tests.sh" "$D/nts"
has "... that says what to install" 'MPI not found .*install Open MPI' "$D/out"
expect "a directory without nccl-tests' Makefile is refused" 2 "$G/build_nccl_tests.sh" "$D/none"

echo "== run_nccl_direct.sh end to end (fake nccl_direct)"
FAKE=$TD/fake_nccl_direct.sh
export FERROCE_USE_SOFTROCE=1
expect "ferroce + socket baseline pass" 0 "$G/run_nccl_direct.sh" --bin "$FAKE" --baseline socket --log-dir "$D/rd"
has "comparison table printed" '^\| sendrecv \| float \| 1048576 \| 1\.50 \| 2\.50 \| 0\.60 \|$' "$D/out"
has "rank 0 got its own NCCL_HOSTID and softroce address" 'NCCL_HOSTID=ferroce-gpu-rank0 SOFTROCE_ADDR=127\.0\.77\.1' "$D/rd/direct-ferroce.log"
has "rank 1 got its own NCCL_HOSTID and softroce address" 'NCCL_HOSTID=ferroce-gpu-rank1 SOFTROCE_ADDR=127\.0\.77\.2' "$D/rd/direct-ferroce.log"
hasnt "socket baseline binds no softroce address" 'SOFTROCE_ADDR=127' "$D/rd/direct-socket.log"
expect "a fallback to NET/Socket fails the run" 1 env FAKE_DIRECT=fallback "$G/run_nccl_direct.sh" --bin "$FAKE" --log-dir "$D/rd"
has "... with the reason" 'FAIL: channels over another network: NET/Socket' "$D/out"
expect "wrong elements fail the run" 1 env FAKE_DIRECT=wrong "$G/run_nccl_direct.sh" --bin "$FAKE" --log-dir "$D/rd"
t0=$(date +%s)
expect "a failing rank fails the run" 1 env FAKE_DIRECT=fail-rank1 "$G/run_nccl_direct.sh" --bin "$FAKE" --log-dir "$D/rd" --timeout 60
el=$(($(date +%s) - t0))
[ "$el" -lt 20 ] && ok "... and the other rank is stopped at once (${el}s)" || ko "failing rank: took ${el}s"
has "... the log says which rank failed" 'rank 1 exited with status 3' "$D/rd/direct-ferroce.log"

echo "== run_torch.sh end to end (fake python)"
expect "ferroce + socket baseline pass" 0 env PYTHON="$TD/fake_python.sh" "$G/run_torch.sh" --baseline socket --log-dir "$D/rt"
has "torch: comparison table" '^\| all_reduce \| bfloat16 \| 67108864 \| 1\.64 \| 2\.51 \| 0\.65 \|$' "$D/out"
expect "torch: a fallback fails the run" 1 env PYTHON="$TD/fake_python.sh" FAKE_TORCH=fallback "$G/run_torch.sh" --log-dir "$D/rt"

echo "== gpu_check.sh end to end (fake python, nvcc, nccl_direct)"
expect "gpu_check.sh passes with the doubles" 0 env OUT="$D/gc" PYTHON="$TD/fake_python.sh" NVCC="$TD/fake_nvcc.sh" \
    NCCL_HOME="$D/nccl" GPU_CHECK_BUILD_DIR="$D/gc-build" "$G/gpu_check.sh" --budget 300
has "summary: every step PASS" '^\| nccl_direct all_reduce \+ send/recv, NCCL socket \| PASS \|' "$D/gc/summary.md"
has "summary: torch proof line" '^\| torch all_reduce \+ all_gather, ferroce \| PASS \| [0-9]+ \| 0 \| PASS: ferroce v8 loaded' "$D/gc/summary.md"
has "summary: comparison tables" '^## nccl_direct: bus bandwidth, ferroce vs NCCL socket' "$D/gc/summary.md"
n=$(find "$D/gc" -type f | wc -l)
[ "$n" -le 8 ] && ok "gpu_check.sh leaves $n files in OUT (the device tool brings back 8)" || ko "gpu_check.sh leaves $n files in OUT"
expect "gpu_check.sh reports a failing step" 1 env OUT="$D/gc2" PYTHON="$TD/fake_python.sh" NVCC="$TD/fake_nvcc.sh" FAKE_TORCH=fallback \
    NCCL_HOME="$D/nccl" GPU_CHECK_BUILD_DIR="$D/gc-build" "$G/gpu_check.sh" --budget 300
has "... and still runs the later steps" '^\| nccl_direct all_reduce \+ send/recv, ferroce \| PASS' "$D/gc2/summary.md"
has "... marking the failed one" '^\| torch all_reduce \+ all_gather, ferroce \| FAIL \(rc 1\)' "$D/gc2/summary.md"
expect "gpu_check.sh skips steps when the budget is spent" 1 env OUT="$D/gc3" PYTHON="$TD/fake_python.sh" NVCC="$TD/fake_nvcc.sh" \
    NCCL_HOME="$D/nccl" GPU_CHECK_BUILD_DIR="$D/gc-build3" "$G/gpu_check.sh" --budget 40
has "... saying so" 'SKIPPED: only' "$D/out"
expect "gpu_check.sh --only reruns just the named steps" 0 env OUT="$D/gc4" PYTHON="$TD/fake_python.sh" NVCC="$TD/fake_nvcc.sh" \
    NCCL_HOME="$D/nccl" GPU_CHECK_BUILD_DIR="$D/gc-build" "$G/gpu_check.sh" --only direct-ferroce,direct-socket
hasnt "... (no torch step)" '== \[torch' "$D/out"
has "... using the binary built before" '^\| nccl_direct all_reduce \+ send/recv, ferroce \| PASS' "$D/gc4/summary.md"
expect "gpu_check.sh --only with an unknown step" 2 "$G/gpu_check.sh" --only torch
mkdir -p "$D/sum"
cp "$TD/torch-ferroce-good.log" "$D/sum/torch-ferroce.log"
cp "$TD/torch-socket-good.log" "$D/sum/torch-socket.log"
expect "gpu_check.sh --summarize on existing logs" 0 "$G/gpu_check.sh" --summarize "$D/sum"
has "--summarize: table from logs" '^\| torch all_reduce \+ all_gather, NCCL socket \| PASS \| - \| 0 \| PASS: NET/Socket only' "$D/sum/summary.md"

echo "== the real plugin and softroce in the environment the GPU scripts export (CPU harness)"
R=$PWD/target/release
if [ -x "$R/harness/all_reduce_perf" ] && [ -e "$R/libnccl-net-ferroce.so" ] && [ -e "$R/softroce/libibverbs.so.1" ] &&
    "$R/harness/all_reduce_perf" --help 2>&1 | grep -q -- '--addr-base'; then
    (
        export FERROCE_LIB_DIR=$R FERROCE_USE_SOFTROCE=1
        setup_transport ferroce || exit 3
        # The harness gives rank r SOFTROCE_ADDR=<addr-base>.<r+1>, as rank_env does.
        timeout 120 "$R/harness/all_reduce_perf" -b 4K -e 1M -f 16 -n 3 -w 1 -g 2 \
            --addr-base "$FERROCE_GPU_SOFTROCE_NET_ACTIVE" --timeout 100
    ) >"$D/out" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ] && grep -q 'Out of bounds values : 0 OK' "$D/out" && grep -q 'side channel on lo' "$D/out"; then
        ok "2-rank all_reduce over softroce (127.0.77.x, side channel on lo, plugin from LD_LIBRARY_PATH)"
    else
        ko "CPU harness in the GPU scripts' environment (rc=$rc)" "$D/out"
    fi
else
    ko "target/release harness or libraries missing (run make build)"
fi

echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
