//! The plugin's sans-IO transport core (`ferroce::transport::proto`: a `SendCore` and a
//! `RecvCore`) fed arbitrary event sequences: the two-endpoint run of `tests/sim_net/run.rs`
//! over its simulated NIC, with every choice taken from the input — the connection's shape
//! (member devices each side, QPs, split mode, adaptive routing, inline CTS, the devices'
//! `max_msg_sz`), the groups, their sizes and tags (truncating sends included), torn writes
//! and late completions, and the order of every irecv, isend, NIC step, poll, test and flush.
//! When the input runs out the choices continue from splitmix64, so every input is a whole run.
//!
//! Invariants, beyond "no panic" (the run's oracle): every receive reports min(sent, posted)
//! bytes per buffer, each of those bytes equals the sender's and was written exactly once,
//! nothing past a message is written, every send reports the bytes it sent, no WR exceeds the
//! send queue or `max_msg_sz`, nothing hangs (no progress for 20,000 turns panics), and at the
//! end nothing is in flight or left posted.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/sim_net/mod.rs"]
mod sim_net;

use nccl_net_ferroce::transport::proto::{limits, split};
use sim_net::run::{case_from, Run};
use sim_net::Rng;

/// Groups per run, and the largest buffer: small enough for thousands of runs a second, still
/// past one ring lap (64 entries) and past 7 pieces per buffer (WRs of 1/8 the case's size).
const MAX_GROUPS: usize = 16;
const MAX_BYTES: usize = 8 << 10;

fuzz_target!(|data: &[u8]| {
    let mut rng = Rng::steered(data);
    let mut case = case_from(0, &mut rng);
    case.groups.truncate(MAX_GROUPS);
    if case.wr_bytes < limits::MAX_WR_BYTES {
        case.wr_bytes /= 8;
    }
    let max = MAX_BYTES.min(split::max_buffer_bytes(case.wr_bytes));
    for m in case.groups.iter_mut().flatten() {
        m.posted = m.posted.min(max);
        m.sent = m.sent.min(max + 100);
    }
    Run::with_rng(case, rng).run();
});
