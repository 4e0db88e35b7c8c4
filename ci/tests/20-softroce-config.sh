#!/bin/bash
# shellcheck disable=SC2016 # backquotes in the patterns are softroce's own text
# softroce's variables (docs/softroce-variables.md): a value that does not parse stops softroce
# with one line on stderr naming the variable, the value and what is expected;
# ibv_get_device_list fails with EINVAL, so ibv_devices/ibv_devinfo list no device and nothing
# binds an address other than the one asked for; the plugin's init WARN carries the same line.
# The parsers themselves are unit-tested per variable (cargo test -p softroce config).
# Addresses 127.0.26.x.
set -u
# shellcheck source-path=SCRIPTDIR source=lib/softroce.sh
. "$(dirname "$0")/lib/softroce.sh"
R=$ROOT/target/release
PLUGIN=$R/libnccl-net-ferroce.so
need "$LIB/softroce-ctl" "$PLUGIN" "$R/c_shim/conformance"
for tool in ibv_devices ibv_devinfo; do
    command -v $tool >/dev/null || { ko "$tool missing (ci/install-deps.sh)"; finish; }
done

# bad NAME VAR=VALUE LINE-START -- CMD...: CMD (under VAR=VALUE and softroce) fails, prints
# exactly one softroce line, which starts with LINE-START and ends with the stop, says
# "Failed to get IB devices list: Invalid argument" and lists no softroce device.
bad() {
    local name=$1 setting=$2 start=$3
    shift 4
    echo "== $name: $setting $*"
    env LD_LIBRARY_PATH="$LIB" "$setting" timeout "$T" "$@" >"$D/$name.out" 2>"$D/$name.err"
    local rc=$?
    local lines
    lines=$(grep -c '^softroce: ' "$D/$name.err")
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$lines" -eq 1 ] &&
        grep -qF -- "$start" "$D/$name.err" &&
        grep -q '^softroce: .*; no device is offered until it is fixed$' "$D/$name.err" &&
        grep -q '^Failed to get IB devices list: Invalid argument$' "$D/$name.err" &&
        ! grep -q 'softroce[0-9]' "$D/$name.out"; then
        ok "$name: $(grep '^softroce: ' "$D/$name.err")"
    else
        ko "$name (rc=$rc, $lines softroce lines)" "$D/$name.out" "$D/$name.err"
    fi
}

bad addr SOFTROCE_ADDR=127.0.263.1 \
    'softroce: SOFTROCE_ADDR="127.0.263.1" is not valid: expected IPv4 addresses, comma-separated, entry i for device i (not 0.0.0.0) (`127.0.263.1` is not one)' \
    -- ibv_devices
bad addr-second-entry SOFTROCE_ADDR=127.0.26.1,127.0.26.300 '(`127.0.26.300` is not one)' -- ibv_devinfo
bad mtu SOFTROCE_MTU=1500 'softroce: SOFTROCE_MTU="1500" is not valid: expected an IB MTU: 256, 512, 1024, 2048 or 4096 bytes' -- ibv_devinfo
bad loss SOFTROCE_LOSS=1.5 'softroce: SOFTROCE_LOSS="1.5" is not valid: expected a number in [0, 1]' -- ibv_devinfo
bad devices SOFTROCE_DEVICES=0 'softroce: SOFTROCE_DEVICES="0" is not valid: expected an integer from 1 to 64' -- ibv_devinfo
bad debug SOFTROCE_DEBUG=yes 'softroce: SOFTROCE_DEBUG="yes" is not valid: expected 0 or 1' -- ibv_devinfo
bad faults SOFTROCE_FAULTS=port-down 'softroce: SOFTROCE_FAULTS="port-down" is not valid: expected COMMAND@SECONDS' -- ibv_devinfo
bad faults-command SOFTROCE_FAULTS=explode@1 'softroce: SOFTROCE_FAULTS="explode@1" is not valid: expected COMMAND@SECONDS, comma-separated (softroce-ctl'"'"'s commands) (unknown command `explode`' -- ibv_devinfo

# The same address list made valid: the device is there and softroce says nothing.
echo "== good: SOFTROCE_ADDR=127.0.26.1 ibv_devices"
env LD_LIBRARY_PATH="$LIB" SOFTROCE_ADDR=127.0.26.1 timeout "$T" ibv_devices >"$D/good.out" 2>"$D/good.err"
rc=$?
if [ $rc -eq 0 ] && grep -q 'softroce0' "$D/good.out" && ! grep -q '^softroce: ' "$D/good.err"; then
    ok "good: softroce0 listed, no softroce line"
else
    ko "good (rc=$rc)" "$D/good.out" "$D/good.err"
fi

# The plugin: conformance no-device dlopens it as NCCL does; its init calls ibv_get_device_list.
# (That no socket is bound then is softroce/tests/config_stop.rs.)
echo "== plugin: SOFTROCE_ADDR=127.0.263.1 conformance no-device"
env LD_LIBRARY_PATH="$LIB" NCCL_SOCKET_IFNAME=lo SOFTROCE_ADDR=127.0.263.1 \
    timeout "$T" "$R/c_shim/conformance" "$PLUGIN" no-device >"$D/plugin.out" 2>&1
rc=$?
if [ $rc -eq 0 ] &&
    grep -q '^v12 no-device: rc=2 WARN: NET/ferroce init: no RDMA device: ibv_get_device_list failed: Invalid argument (os error 22): softroce: SOFTROCE_ADDR="127.0.263.1" is not valid: .* — see docs/softroce-variables.md$' "$D/plugin.out"; then
    ok "plugin: one WARN with softroce's line, init fails with ncclSystemError"
else
    ko "plugin (rc=$rc)" "$D/plugin.out"
fi

finish
