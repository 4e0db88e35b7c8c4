#!/bin/bash
# softroce: unmodified perftest 4.5 tools between two processes on loopback (distinct 127.0.25.x addresses).
set -u
# shellcheck source-path=SCRIPTDIR source=lib/softroce.sh
. "$(dirname "$0")/lib/softroce.sh"
S="SOFTROCE_ADDR=127.0.25.3"
C="SOFTROCE_ADDR=127.0.25.4"
# A result row: "#bytes #iterations <numbers...>"
RE='^ *[0-9]+ +[0-9]+ +[0-9]+\.[0-9]+'
run() {
    local name=$1
    shift
    pair "$name" "$S" "$C" 127.0.25.3 "$RE" "$@"
}
run write_bw ib_write_bw -d softroce0 -n 2000
run read_bw ib_read_bw -d softroce0 -n 1000
run send_bw ib_send_bw -d softroce0 -n 1000
run write_lat ib_write_lat -d softroce0 -n 1000
run read_lat ib_read_lat -d softroce0 -n 1000
run send_lat ib_send_lat -d softroce0 -n 1000
run atomic_bw ib_atomic_bw -d softroce0 -n 1000
run atomic_bw_fetch_add ib_atomic_bw -d softroce0 -n 1000 -A FETCH_AND_ADD
run write_bw_small_x3 ib_write_bw -d softroce0 -x 3 -s 64 -n 5000
run write_bw_post_list ib_write_bw -d softroce0 -s 4096 -n 2000 --post_list 8
run send_bw_events ib_send_bw -d softroce0 -e -n 500
run write_bw_tclass ib_write_bw -d softroce0 -n 1000 --tclass=96
run write_bw_4qp ib_write_bw -d softroce0 -q 4 -n 1000
run read_bw_4qp ib_read_bw -d softroce0 -q 4 -n 500
run send_bw_bidir ib_send_bw -d softroce0 -b -n 1000
run write_bw_all_sizes ib_write_bw -d softroce0 -a -n 100
run send_bw_srq ib_send_bw -d softroce0 --use-srq -q 4 -n 1000
run send_lat_srq ib_send_lat -d softroce0 --use-srq -n 1000

# The second device of a two-device process (its own address).
pair write_bw_device1 "SOFTROCE_DEVICES=2 SOFTROCE_ADDR=127.0.25.5,127.0.25.6" \
    "SOFTROCE_DEVICES=2 SOFTROCE_ADDR=127.0.25.7,127.0.25.8" 127.0.25.3 "$RE" \
    ib_write_bw -d softroce1 -n 1000

# GSO on one side only (the receiver's GRO keeps segment IP IDs known).
pair write_bw_mixed_gso "$S SOFTROCE_GSO=0" "$C SOFTROCE_GSO=1" 127.0.25.3 "$RE" ib_write_bw -d softroce0 -n 1000

# Again with 1% of received packets dropped on both sides.
S="$S SOFTROCE_LOSS=0.01 SOFTROCE_SEED=7"
C="$C SOFTROCE_LOSS=0.01 SOFTROCE_SEED=8"
run write_bw_loss ib_write_bw -d softroce0 -n 1000
run read_bw_loss ib_read_bw -d softroce0 -n 500
finish
