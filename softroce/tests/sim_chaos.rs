//! Random operation sequences (posts with good and bad keys, random
//! modify_qp calls, faults, timeouts): nothing panics, no WR completes
//! twice, and forcing ERR leaves both queues empty and no timer armed.
#![allow(clippy::needless_range_loop)]

mod sim_common;
use sim_common::*;
use softroce::proto::*;
use std::collections::HashMap;

fn random_wr(p: &Pair, side: usize, r: &mut Rng, id: u64) -> SendWr {
    let peer = 1 - side;
    let op = match r.below(7) {
        0 => WrOpcode::Send,
        1 => WrOpcode::SendWithImm,
        2 => WrOpcode::RdmaWrite,
        3 => WrOpcode::RdmaWriteWithImm,
        4 => WrOpcode::RdmaRead,
        5 => WrOpcode::AtomicCmpSwp,
        _ => WrOpcode::AtomicFetchAdd,
    };
    let mut wr = SendWr::new(id, op);
    wr.signaled = r.below(3) != 0;
    wr.fence = r.below(10) == 0;
    let len = r.below(6000) as u32;
    let bad = r.below(20) == 0;
    match op {
        WrOpcode::RdmaRead => {
            wr.sges = sge(DST + r.below(1000), len, p.ep[side].dst_lkey);
            wr.remote_addr = SRC + r.below(1000);
            wr.rkey = p.ep[peer].src_rkey;
        }
        WrOpcode::AtomicCmpSwp | WrOpcode::AtomicFetchAdd => {
            wr.sges = sge(ATOM + 64, 8, p.ep[side].atom_lkey);
            wr.remote_addr = ATOM + 8 * r.below(8);
            wr.rkey = p.ep[peer].atom_rkey;
        }
        _ => {
            wr.sges = sge(SRC + r.below(1000), len, p.ep[side].src_lkey);
            wr.remote_addr = DST + r.below(1000);
            wr.rkey = p.ep[peer].dst_rkey;
        }
    }
    if bad {
        match r.below(3) {
            0 => wr.rkey ^= 0x55,
            1 => wr.sges[0].lkey ^= 0x55,
            _ => wr.remote_addr = wr.remote_addr.wrapping_add(REGION as u64),
        }
    }
    wr
}

#[test]
fn chaos() {
    let seeds: u64 = std::env::var("SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    for seed in 0..seeds {
        let mut r = Rng(seed * 7919 + 1);
        let mut p = Pair::new(
            &Setup {
                retry_cnt: 3,
                rnr_retry: 3,
                timeout: 6,
                ..Setup::default()
            },
            seed,
        );
        p.faults = Faults {
            loss: r.below(10) as f64 / 100.0,
            dup: r.below(5) as f64 / 100.0,
            reorder: r.below(20) as f64 / 100.0,
            bitflip: r.below(3) as f64 / 100.0,
        };
        // wr_id -> completions seen, per side.
        let mut posted: [HashMap<u64, u32>; 2] = [HashMap::new(), HashMap::new()];
        let mut next_id = 0u64;
        for _step in 0..300 {
            let side = r.below(2) as usize;
            match r.below(20) {
                0..=9 => {
                    next_id += 1;
                    let wr = random_wr(&p, side, &mut r, next_id);
                    let now = p.now;
                    if p.ep[side].qp.post_send(now, wr).is_ok() {
                        posted[side].insert(next_id, 0);
                    }
                }
                10..=14 => {
                    next_id += 1;
                    let dl = p.ep[side].dst_lkey;
                    let wr = RecvWr {
                        wr_id: next_id,
                        sges: sge(DST + 500_000, r.below(8000) as u32, dl),
                    };
                    let _ = p.ep[side].qp.post_recv(wr);
                }
                15 => {
                    // Random modify with a random mask: must never panic; mostly EINVAL.
                    let a = ModifyAttrs {
                        mask: (r.next() as u32) & 0x1F_FFFF,
                        qp_state: QpState::from_ibv(r.below(7) as u32).unwrap_or_default(),
                        path_mtu: r.below(7) as u8,
                        timeout: r.below(40) as u8,
                        retry_cnt: r.below(9) as u8,
                        rnr_retry: r.below(9) as u8,
                        port_num: 1,
                        ah: AddressVector {
                            is_global: true,
                            dgid: gid(p.ep[1 - side].ip),
                            ..Default::default()
                        },
                        ..Default::default()
                    };
                    let _ = p.ep[side].qp.modify(&a);
                    if p.ep[side].qp.state() == QpState::Reset {
                        posted[side].clear();
                    }
                }
                _ => {
                    let d = Duration::from_micros(r.below(3000));
                    p.run_for(d);
                }
            }
            for s in 0..2 {
                for c in p.ep[s].send_cq.drain(..) {
                    if let Some(n) = posted[s].get_mut(&c.wr_id) {
                        *n += 1;
                        assert_eq!(*n, 1, "seed {seed}: wr {} completed twice", c.wr_id);
                    }
                }
                p.ep[s].recv_cq.clear();
            }
        }
        // Force both QPs to ERR: everything outstanding is flushed.
        for s in 0..2 {
            let _ = p.ep[s].qp.modify(&ModifyAttrs {
                mask: attr_mask::STATE,
                qp_state: QpState::Err,
                ..Default::default()
            });
        }
        p.run();
        for s in 0..2 {
            for c in p.ep[s].send_cq.drain(..) {
                if let Some(n) = posted[s].get_mut(&c.wr_id) {
                    *n += 1;
                    assert_eq!(*n, 1, "seed {seed}: wr {} completed twice", c.wr_id);
                }
            }
            assert_eq!(p.ep[s].qp.send_queue_len(), 0);
            assert_eq!(p.ep[s].qp.recv_queue_len(), 0);
            assert_eq!(p.ep[s].qp.poll_timeout(), None);
        }
    }
}
