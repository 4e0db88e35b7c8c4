//! Core-only throughput: 64 KiB RDMA WRITEs at MTU 4096 between two QPs,
//! no ICRC, no network. `cargo test -p softroce --release --test sim_bench -- --ignored --nocapture`.
//! They print figures and assert nothing, so they are ignored and named `bench_*`: `make test`
//! runs every ignored test but these (`--include-ignored --skip bench_`).

use softroce::proto::*;
use std::time::Instant as WallClock;

mod sim_common;
use sim_common::*;

#[test]
#[ignore = "a benchmark: prints figures, asserts nothing"]
fn bench_write_64k_core_throughput() {
    let s = Setup {
        mtu: MTU_4096,
        ..Setup::default()
    };
    let mut a = Endpoint::new(0x11, [127, 0, 0, 1], s.caps);
    let mut b = Endpoint::new(0x22, [127, 0, 0, 2], s.caps);
    connect_qp(&mut a.qp, &s, 0x22, gid(b.ip), 0, 0);
    connect_qp(&mut b.qp, &s, 0x11, gid(a.ip), 0, 0);
    let rkey = b.dst_rkey;
    let lkey = a.src_lkey;
    let now = Instant::from_micros(1);
    let mut buf = Vec::with_capacity(8192);
    let total: u64 = 40_000;
    let mut posted = 0u64;
    let mut done = 0u64;
    let mut pkts = 0u64;
    let t0 = WallClock::now();
    while done < total {
        while posted < total && a.qp.send_queue_len() < 64 {
            let mut wr = SendWr::new(posted, WrOpcode::RdmaWrite);
            wr.sges = vec![Sge {
                addr: SRC + (posted % 8) * 65536,
                length: 65536,
                lkey,
            }];
            wr.remote_addr = DST + (posted % 8) * 65536;
            wr.rkey = rkey;
            wr.signaled = posted % 16 == 15 || posted == total - 1;
            a.qp.post_send(now, wr).unwrap();
            posted += 1;
        }
        while a.qp.poll_transmit(now, &mut a.mem, &mut buf).is_some() {
            pkts += 1;
            b.qp.handle_packet(now, &buf, &mut b.mem);
        }
        while b.qp.poll_transmit(now, &mut b.mem, &mut buf).is_some() {
            a.qp.handle_packet(now, &buf, &mut a.mem);
        }
        while let Some(c) = a.qp.poll_completion() {
            assert_eq!(c.status, 0);
            done = c.wr_id + 1;
        }
    }
    let dt = t0.elapsed().as_secs_f64();
    let bytes = total * 65536;
    eprintln!(
        "{} packets, {:.2} GB/s ({:.1} Mpps) core-only incl. 2 memcpy per byte",
        pkts,
        bytes as f64 / dt / 1e9,
        pkts as f64 / dt / 1e6
    );
}

#[test]
#[ignore = "a benchmark: prints figures, asserts nothing"]
fn bench_icrc_throughput() {
    use softroce::wire::icrc::{icrc_ipv4, Ipv4Fields};
    let pkt: Vec<u8> = (0..4124u32).map(|i| i as u8).collect();
    let ip = Ipv4Fields::new([127, 0, 0, 1], [127, 0, 0, 2], 0);
    let n = 200_000u64;
    let t0 = WallClock::now();
    let mut acc = 0u32;
    for i in 0..n {
        acc ^= icrc_ipv4(&ip, 4791, 4791 ^ (i as u16 & 1), &pkt);
    }
    let dt = t0.elapsed().as_secs_f64();
    eprintln!("ICRC {:.2} GB/s ({acc:x})", (n * pkt.len() as u64) as f64 / dt / 1e9);
}
