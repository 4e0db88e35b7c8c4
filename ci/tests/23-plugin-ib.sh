#!/bin/sh
# The plugin's softroce-backed Rust tests of the data path and of recovery again, with every
# softroce port InfiniBand (SOFTROCE_LINK_LAYER=ib: LIDs from softroce's subnet-manager
# stand-in, docs/softroce.md#infiniband-mode), so that the plugin's InfiniBand path (LID
# addressing, no GRH within the subnet, adaptive routing on by default) runs:
#
#   * tests/transport_softroce.rs: transfers of every size class, grouped receives with shuffled
#     tags and 32 in flight, the CTS ring filled by groups of 8, 32 single receives, flush, a
#     send larger than its receive, closing with requests in flight on both sides;
#   * tests/recovery_softroce.rs: the port down for a second under traffic, nothing lost; a
#     port flap on an idle pair (both ends, the sender's, the receiver's) costs no later
#     message, a port down for good fails the next one;
#   * tests/events_softroce.rs: a port going down fails only the comms on that port (two devices).
#
# Each test's connected pair checks that its ports are InfiniBand with a LID
# (tests/softroce_common: assert_link_layer) and prints a "softroce link layer: InfiniBand" line;
# this script wants one from every test, so the pass cannot succeed on RoCE ports. The C-ABI
# data path's InfiniBand pass is at the end of 40-datapath.sh, a fused device's failover through
# port flaps on InfiniBand in 70-resilience.sh. Addresses: those of the tests (127.0.41, .44, .46).
set -u
cd "$(dirname "$0")/../.." || exit 1
if [ ! -e target/release/softroce/libibverbs.so.1 ]; then
    echo "FAILED: build first (make build: softroce)"
    echo "plugin-ib: 0 passed, 1 failed"
    exit 1
fi
TESTS="connect_and_transfer_sizes grouped_shuffled_and_32_in_flight groups_of_8_until_the_ring_is_full
thirty_two_single_receives_in_flight flush_reads_back send_larger_than_the_posted_receive_is_truncated
close_with_requests_in_flight_on_both_sides a_port_down_for_a_second_costs_no_message
a_port_flap_while_idle_costs_no_later_message a_senders_port_flap_while_idle_costs_no_message
a_receivers_port_flap_while_idle_costs_no_message a_port_down_while_idle_fails_the_next_message
a_port_down_fails_only_the_comms_on_that_port"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# shellcheck disable=SC2086 # $TESTS: one filter per word
SOFTROCE_LINK_LAYER=ib FERROCE_TEST_SOFTROCE=1 timeout 300 ${CARGO:-cargo} test --release --workspace --no-fail-fast \
    --test transport_softroce --test recovery_softroce --test events_softroce -- \
    --include-ignored --exact --nocapture --test-threads 1 $TESTS >"$out" 2>&1
rc=$?
pass=0
fail=0
for t in $TESTS; do
    # From the test's own line ("test NAME ... ") to its verdict: its link lines, all InfiniBand.
    if ports=$(awk -v t="$t" '
        index($0, "test " t " ... ") == 1 { mine = 1 }
        mine && match($0, /softroce link layer: InfiniBand, [^ ]+ LID 0x[0-9a-f]+/) {
            l = substr($0, RSTART + 33, RLENGTH - 33)
            if (!(l in seen)) { seen[l] = 1; ports = ports (ports == "" ? "" : "; ") l }
        }
        mine && /softroce link layer: Ethernet/ { eth = 1 }
        mine && /(^| )ok$/ { ok = 1; mine = 0 }
        mine && /FAILED$/ { mine = 0 }
        END { print ports; exit !(ok && ports != "" && !eth) }' "$out"); then
        pass=$((pass + 1))
        echo "    ok: $t on InfiniBand ($ports)"
    else
        fail=$((fail + 1))
        echo "    FAILED: $t (not run, failed, or not on an InfiniBand port)"
    fi
done
if [ $rc -ne 0 ] || [ $fail -ne 0 ]; then
    grep -aE "^test |panicked|softroce link layer|test result" "$out" | tail -40
    [ $rc -ne 0 ] && fail=$((fail + 1)) && echo "    FAILED: cargo test exited $rc"
fi
echo "plugin-ib: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
