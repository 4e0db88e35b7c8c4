//! Seeded loss, reordering, duplication and bit flips: everything still
//! completes, in order, with the right bytes.
#![allow(clippy::needless_range_loop)]

mod sim_common;
use sim_common::*;
use softroce::proto::*;

/// Post a mixed workload on both sides; returns the expected (side, wr_id) order.
fn workload(p: &mut Pair, n: u64) -> [Vec<u64>; 2] {
    let mut expect = [Vec::new(), Vec::new()];
    for side in 0..2 {
        let peer = 1 - side;
        for k in 0..n {
            let len = ((k * 2654435761) % 9000) as u32;
            let off = k * 9216;
            let op = match k % 7 {
                0 | 4 => WrOpcode::Send,
                1 => WrOpcode::RdmaWrite,
                2 => WrOpcode::RdmaRead,
                3 => WrOpcode::RdmaWriteWithImm,
                5 => WrOpcode::AtomicFetchAdd,
                _ => WrOpcode::SendWithImm,
            };
            if matches!(op, WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm) {
                let dl = p.ep[peer].dst_lkey;
                p.ep[peer]
                    .qp
                    .post_recv(RecvWr {
                        wr_id: k,
                        sges: sge(DST + off, 9216, dl),
                    })
                    .unwrap();
            }
            let mut wr = SendWr::new(k, op);
            match op {
                WrOpcode::RdmaRead => {
                    wr.sges = sge(DST + off, len, p.ep[side].dst_lkey);
                    wr.remote_addr = SRC + off;
                    wr.rkey = p.ep[peer].src_rkey;
                }
                WrOpcode::AtomicFetchAdd => {
                    wr.sges = sge(ATOM + 8 + 8 * (k % 500), 8, p.ep[side].atom_lkey);
                    wr.remote_addr = ATOM;
                    wr.rkey = p.ep[peer].atom_rkey;
                    wr.compare_add = 1;
                }
                _ => {
                    wr.sges = sge(SRC + off, len, p.ep[side].src_lkey);
                    wr.remote_addr = DST + off;
                    wr.rkey = p.ep[peer].dst_rkey;
                    wr.imm_data = k as u32;
                }
            }
            expect[side].push(k);
            let now = p.now;
            p.ep[side].qp.post_send(now, wr).unwrap();
        }
    }
    expect
}

fn check(p: &Pair, n: u64, expect: &[Vec<u64>; 2]) {
    for side in 0..2 {
        let peer = 1 - side;
        let cq = &p.ep[side].send_cq;
        let ids: Vec<u64> = cq.iter().map(|c| c.wr_id).collect();
        assert_eq!(&ids, &expect[side], "side {side} completion order");
        for c in cq {
            assert_eq!(c.status, wc_status::IBV_WC_SUCCESS, "side {side} wr {}", c.wr_id);
        }
        let mut fetch_adds = 0u64;
        let mut recvs = Vec::new();
        for k in 0..n {
            let len = ((k * 2654435761) % 9000) as usize;
            let off = k * 9216;
            match k % 7 {
                2 => assert_eq!(
                    p.ep[side].peek(DST + off, len),
                    p.ep[peer].peek(SRC + off, len),
                    "read {k}"
                ),
                5 => fetch_adds += 1,
                _ => assert_eq!(
                    p.ep[peer].peek(DST + off, len),
                    p.ep[side].peek(SRC + off, len),
                    "side {side} wr {k}"
                ),
            }
            if matches!(k % 7, 0 | 3 | 4 | 6) {
                recvs.push(k);
            }
        }
        // Atomics executed exactly once each, despite duplicates/retries.
        let word = u64::from_ne_bytes(p.ep[peer].peek(ATOM, 8).try_into().unwrap());
        assert_eq!(word, fetch_adds, "side {side}: atomics executed once");
        let rids: Vec<u64> = p.ep[peer].recv_cq.iter().map(|c| c.wr_id).collect();
        assert_eq!(rids, recvs, "side {peer} receive completions");
        assert!(p.ep[peer].recv_cq.iter().all(|c| c.status == wc_status::IBV_WC_SUCCESS));
    }
}

fn run_with(faults: Faults, seed: u64, n: u64, mtu: u8) -> Pair {
    let mut p = Pair::new(
        &Setup {
            mtu,
            ..Setup::default()
        },
        seed,
    );
    p.faults = faults;
    let expect = workload(&mut p, n);
    p.run();
    if std::env::var("SIM_DEBUG").is_ok() {
        eprintln!("A {:?}\nB {:?}", p.ep[0].qp.stats(), p.ep[1].qp.stats());
        for c in p.ep[0].send_cq.iter().chain(p.ep[1].send_cq.iter()) {
            if c.status != 0 {
                eprintln!("{c:?}");
            }
        }
    }
    check(&p, n, &expect);
    p
}

#[test]
fn loss_1_percent() {
    for seed in 0..4 {
        run_with(
            Faults {
                loss: 0.01,
                ..Faults::default()
            },
            seed,
            60,
            MTU_1024,
        );
    }
}

#[test]
fn loss_10_percent() {
    for seed in 10..14 {
        let p = run_with(
            Faults {
                loss: 0.10,
                ..Faults::default()
            },
            seed,
            60,
            MTU_1024,
        );
        assert!(p.ep[0].qp.stats().retransmits > 0);
    }
}

#[test]
fn reordering() {
    for seed in 20..24 {
        run_with(
            Faults {
                reorder: 0.2,
                ..Faults::default()
            },
            seed,
            60,
            MTU_1024,
        );
    }
}

#[test]
fn duplication() {
    for seed in 30..34 {
        let p = run_with(
            Faults {
                dup: 0.2,
                ..Faults::default()
            },
            seed,
            60,
            MTU_1024,
        );
        assert!(p.ep[1].qp.stats().rx_duplicates + p.ep[0].qp.stats().rx_duplicates > 0);
    }
}

#[test]
fn bit_flips_dropped_by_icrc() {
    for seed in 40..44 {
        let p = run_with(
            Faults {
                bitflip: 0.05,
                ..Faults::default()
            },
            seed,
            60,
            MTU_1024,
        );
        assert!(p.icrc_drops > 0);
    }
}

#[test]
fn everything_at_once_mtu_4096() {
    for seed in 50..54 {
        run_with(
            Faults {
                loss: 0.05,
                dup: 0.05,
                reorder: 0.1,
                bitflip: 0.02,
            },
            seed,
            80,
            MTU_4096,
        );
    }
}

#[test]
fn everything_at_once_small_mtu() {
    for seed in 60..63 {
        run_with(
            Faults {
                loss: 0.03,
                dup: 0.05,
                reorder: 0.1,
                bitflip: 0.01,
            },
            seed,
            50,
            1,
        );
    }
}

/// `SIM_SEEDS=n cargo test -p softroce --release --test sim_faults many_seeds` for a soak.
#[test]
fn many_seeds() {
    let n: u64 = std::env::var("SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6);
    let start: u64 = std::env::var("SIM_START")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    for seed in start..start + n {
        let mut r = Rng(seed);
        let f = Faults {
            loss: (r.below(15) as f64) / 100.0,
            dup: (r.below(10) as f64) / 100.0,
            reorder: (r.below(30) as f64) / 100.0,
            bitflip: (r.below(5) as f64) / 100.0,
        };
        let mtu = 1 + r.below(5) as u8;
        let p = std::panic::catch_unwind(|| run_with(f, seed, 40, mtu));
        assert!(p.is_ok(), "seed {seed} faults {f:?} mtu {mtu}");
    }
}
