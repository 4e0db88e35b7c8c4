//! The packets the core emits decode as RoCEv2 in a standard protocol
//! analyser: a mixed transfer is written as a pcap (Ethernet/IPv4/UDP 4791,
//! ICRC appended as the driver does) and read back with `tshark`. Ignored unless asked for
//! (`--include-ignored`, as `make test` does); then a missing tshark fails it.

mod sim_common;
use sim_common::*;
use softroce::proto::*;
use softroce::wire::icrc::{icrc_ipv4, Ipv4Fields};

fn ipv4_checksum(h: &[u8]) -> u16 {
    let mut sum = 0u32;
    for c in h.chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

fn frame(src: [u8; 4], dst: [u8; 4], transport: &[u8]) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x08, 0x00];
    let udp_len = (8 + transport.len() + 4) as u16;
    let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0];
    ip[2..4].copy_from_slice(&(udp_len + 20).to_be_bytes());
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&dst);
    let c = ipv4_checksum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&0xC001u16.to_be_bytes());
    f.extend_from_slice(&4791u16.to_be_bytes());
    f.extend_from_slice(&udp_len.to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(transport);
    let icrc = icrc_ipv4(&Ipv4Fields::new(src, dst, 0), 0xC001, 4791, transport);
    f.extend_from_slice(&icrc.to_le_bytes());
    f
}

#[test]
#[ignore = "needs tshark (ci/install-deps.sh installs it): run with --include-ignored (make test)"]
fn tshark_decodes_every_packet_as_rocev2() {
    let out = std::process::Command::new("tshark")
        .arg("--version")
        .output()
        .expect("tshark is not installed: ci/install-deps.sh installs it");
    assert!(out.status.success(), "tshark --version failed: {out:?}");
    // Drive a pair by hand so every packet can be captured.
    let s = Setup::default();
    let mut ep = [
        Endpoint::new(0x11, [127, 0, 0, 1], s.caps),
        Endpoint::new(0x22, [127, 0, 0, 2], s.caps),
    ];
    let (g0, g1) = (gid(ep[0].ip), gid(ep[1].ip));
    connect_qp(&mut ep[0].qp, &s, 0x22, g1, 100, 200);
    connect_qp(&mut ep[1].qp, &s, 0x11, g0, 200, 100);
    let dl = ep[1].dst_lkey;
    ep[1]
        .qp
        .post_recv(RecvWr {
            wr_id: 1,
            sges: sge(DST, 8192, dl),
        })
        .unwrap();
    ep[1]
        .qp
        .post_recv(RecvWr {
            wr_id: 2,
            sges: sge(DST, 8192, dl),
        })
        .unwrap();
    let now = Instant::from_micros(1);
    let mut wrs = Vec::new();
    for (k, op) in [
        WrOpcode::Send,
        WrOpcode::SendWithImm,
        WrOpcode::RdmaWrite,
        WrOpcode::RdmaWriteWithImm,
        WrOpcode::RdmaRead,
        WrOpcode::AtomicCmpSwp,
        WrOpcode::AtomicFetchAdd,
        // single-packet variants
        WrOpcode::Send,
        WrOpcode::SendWithImm,
        WrOpcode::RdmaWrite,
        WrOpcode::RdmaWriteWithImm,
        WrOpcode::RdmaRead,
    ]
    .into_iter()
    .enumerate()
    {
        let mut wr = SendWr::new(k as u64, op);
        let len = if k < 7 { 2500 + k as u32 } else { 10 };
        let (local, remote) = match op {
            WrOpcode::AtomicCmpSwp | WrOpcode::AtomicFetchAdd => {
                (sge(ATOM, 8, ep[0].atom_lkey), (ATOM, ep[1].atom_rkey))
            }
            WrOpcode::RdmaRead => (sge(DST, len, ep[0].dst_lkey), (SRC, ep[1].src_rkey)),
            _ => (sge(SRC, len, ep[0].src_lkey), (DST, ep[1].dst_rkey)),
        };
        wr.sges = local;
        (wr.remote_addr, wr.rkey) = remote;
        wr.imm_data = 0x1234_5678;
        wrs.push(wr);
    }
    for id in 3..7 {
        ep[1]
            .qp
            .post_recv(RecvWr {
                wr_id: id,
                sges: sge(DST + 65536, 4096, dl),
            })
            .unwrap();
    }
    for wr in wrs {
        ep[0].qp.post_send(now, wr).unwrap();
    }
    let mut frames: Vec<Vec<u8>> = Vec::new();
    let mut opcodes: Vec<u8> = Vec::new();
    let mut buf = Vec::new();
    for _round in 0..50 {
        let mut any = false;
        for i in 0..2 {
            let mut out = Vec::new();
            {
                let e = &mut ep[i];
                while e.qp.poll_transmit(now, &mut e.mem, &mut buf).is_some() {
                    out.push(buf.clone());
                }
            }
            for pkt in out {
                any = true;
                opcodes.push(pkt[0]);
                frames.push(frame(ep[i].ip, ep[1 - i].ip, &pkt));
                let e = &mut ep[1 - i];
                e.qp.handle_packet(now, &pkt, &mut e.mem);
            }
        }
        if !any {
            break;
        }
    }
    for e in &mut ep {
        while let Some(c) = e.qp.poll_completion() {
            assert_eq!(c.status, 0, "{c:?}");
        }
    }
    // pcap
    let mut pcap = Vec::new();
    pcap.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    pcap.extend_from_slice(&2u16.to_le_bytes());
    pcap.extend_from_slice(&4u16.to_le_bytes());
    pcap.extend_from_slice(&[0; 8]);
    pcap.extend_from_slice(&65535u32.to_le_bytes());
    pcap.extend_from_slice(&1u32.to_le_bytes());
    for (i, f) in frames.iter().enumerate() {
        pcap.extend_from_slice(&(i as u32).to_le_bytes());
        pcap.extend_from_slice(&0u32.to_le_bytes());
        pcap.extend_from_slice(&(f.len() as u32).to_le_bytes());
        pcap.extend_from_slice(&(f.len() as u32).to_le_bytes());
        pcap.extend_from_slice(f);
    }
    let path = std::env::temp_dir().join(format!("softroce-sim-{}.pcap", std::process::id()));
    std::fs::write(&path, &pcap).unwrap();
    let out = std::process::Command::new("tshark")
        // Payload heuristics (RPC-over-RDMA, …) would parse our random payloads.
        .args(["--disable-protocol", "rpcordma", "-r"])
        .arg(&path)
        .args([
            "-T",
            "fields",
            "-E",
            "separator=;",
            "-e",
            "infiniband.bth.opcode",
            "-e",
            "infiniband.bth.destqp",
            "-e",
            "infiniband.bth.psn",
            "-e",
            "_ws.malformed",
            "-e",
            "_ws.expert.severity",
        ])
        .output()
        .expect("tshark runs");
    let _ = std::fs::remove_file(&path);
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.len(),
        frames.len(),
        "tshark output:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (line, op) in lines.iter().zip(&opcodes) {
        let cols: Vec<&str> = line.split(';').collect();
        assert_eq!(cols[0], op.to_string(), "opcode decoded: {line}");
        assert!(cols[3].is_empty(), "malformed: {line}");
        assert!(cols.get(4).is_none_or(|s| s.is_empty()), "expert info: {line}");
    }
    // Every RC opcode 0x00..=0x14 was emitted (and decoded).
    for want in 0x00u8..=0x14 {
        assert!(opcodes.contains(&want), "opcode {want:#x} not emitted: {opcodes:x?}");
    }
}
