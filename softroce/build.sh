#!/bin/sh
# Builds target/release/softroce/libibverbs.so.1: the softroce staticlib linked
# into a shared object with rdma-core 44's version nodes
# (docs/softroce-internals.md#libibverbs-abi).
# -z nodelete: a dlclose() must never unmap the code the engine threads run.
#
#   SOFTROCE_PRIVATE_NODE  private version node of the targeted rdma-core
#                          (default IBVERBS_PRIVATE_34 = rdma-core 44, Debian 12)
#   CARGO, CC              tools to use (default cargo, cc)
#   SOFTROCE_SANITIZER     "thread": a ThreadSanitizer build (std too, -Zbuild-std) into
#                          target/tsan/softroce/ for ci/tests/80-sanitizers.sh, with
#                          -Zsanitizer=thread ahead of the caller's RUSTFLAGS; its __tsan_*
#                          symbols resolve against the runtime of the instrumented program
#                          that loads it, so it is linked without --no-undefined
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
node=${SOFTROCE_PRIVATE_NODE:-IBVERBS_PRIVATE_34}
case "${SOFTROCE_SANITIZER:-}" in
"")
    out=target/release/softroce
    built=target/release
    undefined=-Wl,--no-undefined
    "${CARGO:-cargo}" build --release -p softroce
    ;;
thread)
    triple=$(rustc -vV | sed -n 's/^host: //p')
    out=target/tsan/softroce
    built=target/tsan/$triple/release
    undefined=
    RUSTFLAGS="-Zsanitizer=thread${RUSTFLAGS:+ $RUSTFLAGS}" RUSTC_BOOTSTRAP=1 "${CARGO:-cargo}" build --release -p softroce \
        -Zbuild-std --target "$triple" --target-dir target/tsan
    ;;
*)
    echo "build.sh: SOFTROCE_SANITIZER=$SOFTROCE_SANITIZER: only \"thread\" is supported" >&2
    exit 1
    ;;
esac
mkdir -p "$out"
sed "s/IBVERBS_PRIVATE_34/$node/g" softroce/libibverbs.map > "$out/libibverbs.map"
"${CC:-cc}" -shared -o "$out/libibverbs.so.1.tmp" \
    -Wl,--whole-archive "$built/libsoftroce.a" -Wl,--no-whole-archive \
    -Wl,--version-script="$out/libibverbs.map" \
    -Wl,-soname,libibverbs.so.1 \
    -Wl,--gc-sections -Wl,-z,now ${undefined:+"$undefined"} \
    -Wl,-z,nodelete \
    -lpthread -ldl -lm -lgcc_s -lc
mv "$out/libibverbs.so.1.tmp" "$out/libibverbs.so.1"
# The fault-control tool (softroce-ctl ADDR COMMAND: port-down, device-fatal, qp-fatal QPN, ...).
cp -f "$built/softroce-ctl" "$out/softroce-ctl"
# Sanity: every symbol of the map must be exported with its version.
want=$(grep -cE '^\s+[A-Za-z_][A-Za-z0-9_]*;' "$out/libibverbs.map")
have=$(objdump -T "$out/libibverbs.so.1" | grep -cE ' (IBVERBS_[0-9.]+|SOFTROCE_[0-9]+|'"$node"')\s')
if [ "$have" -lt "$want" ]; then
    echo "build.sh: only $have of $want versioned exports in libibverbs.so.1" >&2
    exit 1
fi
echo "built $out/libibverbs.so.1 ($have versioned exports, private node $node)"
