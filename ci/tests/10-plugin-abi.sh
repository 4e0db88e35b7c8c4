#!/bin/sh
# The plugin from the C side: ABI layouts, exported tables, no hard dependencies, the no-device
# path (one WARN, an error, no thread), and - over softroce - devices, properties per version,
# fusion and the init/finalize/dlclose/dlopen cycle.
set -u
cd "$(dirname "$0")/../.."
R=target/release
PLUGIN=$PWD/$R/libnccl-net-ferroce.so
pass=0
fail=0
run() {
    name=$1
    shift
    echo "--- $name"
    case $1 in no_hard_deps) to="" ;; *) to="timeout 120" ;; esac
    if $to "$@"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAILED: $name"; fi
}

run "C layout asserts" $R/c_shim/abi_layout_test
run "exported tables and no foreign symbols" $R/c_shim/conformance "$PLUGIN" symbols

no_hard_deps() {
    needed=$(readelf -d "$PLUGIN" | grep NEEDED)
    echo "$needed"
    if echo "$needed" | grep -Eiq 'ibverbs|rdmacm|mlx5|libcuda|libcudart|libnccl'; then
        echo "the plugin must not link libibverbs, librdmacm, libmlx5 or CUDA"
        return 1
    fi
}
run "readelf: no DT_NEEDED on verbs or CUDA" no_hard_deps

# The system libibverbs on a host without RDMA fails with ENOSYS; a missing library is another path.
run "no device (system libibverbs, no RDMA driver)" $R/c_shim/conformance "$PLUGIN" no-device
run "no device (libibverbs missing)" env NCCL_IBVERBS_LIB=/nonexistent/libibverbs.so.1 $R/c_shim/conformance "$PLUGIN" no-device
run "no device under ASan+UBSan" env ASAN_OPTIONS=detect_leaks=0 $R/c_shim/conformance-asan "$PLUGIN" no-device

if [ -f $R/softroce/libibverbs.so.1 ]; then
    # FERROCE_VERSION: the release the init INFO line must name (the package's, in Cargo.toml).
    version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
    sr="env LD_LIBRARY_PATH=$PWD/$R/softroce SOFTROCE_ADDR=127.0.10.1 FERROCE_VERSION=$version"
    run "devices over softroce (1 device)" $sr $R/c_shim/conformance "$PLUGIN" devices
    run "devices over softroce (2 devices, fusion)" $sr SOFTROCE_DEVICES=2 $R/c_shim/conformance "$PLUGIN" devices
    run "unknown NCCL_IB_HCA device: one clear WARN" $sr NCCL_IB_HCA==mlx5_7 $R/c_shim/conformance "$PLUGIN" no-device
    run "devices over softroce under valgrind" $sr valgrind -q --error-exitcode=9 --leak-check=no $R/c_shim/conformance "$PLUGIN" devices
else
    echo "FAILED: $R/softroce/libibverbs.so.1 was not built (make build builds it)"
    fail=$((fail + 1))
fi
echo "plugin ABI: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
