//! Recomputes the ICRC of captured RoCEv2 packets with `softroce::wire::icrc`.
//!
//! Input (stdin), one packet per line, tab-separated, as printed by
//! `tshark -r CAP -Y 'udp.dstport==4791' -T fields -E separator=/t -e ip.src
//! -e ip.dst -e ip.id -e ip.flags -e ip.frag_offset -e udp.srcport -e udp.dstport -e udp.payload`.
//! Prints a summary and exits 1 if any packet's ICRC is wrong or none was read.
//!
//! A UDP GSO send shows up on `lo` as one super-datagram of equal-size
//! segments, segment *i* carrying IP ID *i* on the wire
//! (docs/softroce-internals.md#udp-segmentation-offload). When a
//! payload does not verify as one packet, the checker looks for a segment size
//! (transport headers + an IB MTU + ICRC) that splits it into packets that all
//! verify with IDs 0, 1, 2, … and counts each segment.
//!
//! `--ib [PCAP]` checks captures of softroce's InfiniBand link layer instead
//! (docs/softroce-internals.md#infiniband-link-layer): one UDP payload in hex per line
//! (`-T fields -e udp.payload`), each one or more IB packets cut by their LRH's PktLen; every
//! packet's VCRC and IB ICRC must be right. With PCAP, the packets are also written there as a
//! pcap file of link type InfiniBand (247), for tshark's InfiniBand dissector.

use std::io::BufRead;
use std::net::Ipv4Addr;

use softroce::wire::icrc::{verify_ipv4, Ipv4Fields};
use softroce::wire::mtu_bytes;

fn num(s: &str) -> Option<u32> {
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

fn hex(s: &str) -> Option<Vec<u8>> {
    let s: String = s.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok())
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--ib") {
        std::process::exit(check_ib(args.get(1).map(String::as_str)));
    }
    let (mut ok, mut bad, mut skipped, mut gso) = (0u64, 0u64, 0u64, 0u64);
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() < 8 {
            skipped += 1;
            continue;
        }
        let parsed = (|| {
            let src: Ipv4Addr = f[0].parse().ok()?;
            let dst: Ipv4Addr = f[1].parse().ok()?;
            let id = num(f[2])? as u16;
            // tshark prints the flags either as the 3-bit field (DF = 0x2) or
            // in place in the byte (DF = 0x40), depending on the version.
            let flags = num(f[3])? as u16;
            let flags = if flags <= 7 { flags << 13 } else { flags << 8 };
            let frag = num(f[4]).unwrap_or(0) as u16;
            let sport = num(f[5])? as u16;
            let dport = num(f[6])? as u16;
            let payload = hex(f[7])?;
            let mut ip = Ipv4Fields::new(src.octets(), dst.octets(), id);
            ip.flags_frag = flags | (frag / 8);
            Some((ip, sport, dport, payload))
        })();
        let Some((ip, sport, dport, payload)) = parsed else {
            skipped += 1;
            continue;
        };
        if verify_ipv4(&ip, sport, dport, &payload).is_some() {
            ok += 1;
        } else if let Some(n) = verify_gso(&ip, sport, dport, &payload) {
            ok += n;
            gso += 1;
        } else {
            bad += 1;
            eprintln!("bad ICRC: {line:.160}");
        }
    }
    println!(
        "{ok} packets with a correct ICRC ({gso} GSO datagrams split), {bad} with a wrong one, {skipped} lines skipped"
    );
    if bad > 0 || ok == 0 {
        std::process::exit(1);
    }
}

/// Splits a GSO super-datagram into segments that all verify; returns their count.
fn verify_gso(ip: &Ipv4Fields, sport: u16, dport: u16, payload: &[u8]) -> Option<u64> {
    // Transport header lengths before the payload: BTH [+ RETH | ImmDt | AETH | RETH+ImmDt ...].
    const HDRS: [usize; 6] = [12, 16, 28, 32, 40, 44];
    // Full-MTU data segments, or (small datagrams) any multiple of 4: runs of
    // ACKs / atomic requests / atomic ACKs batch as equal-size segments too.
    let mtus = || (1..=5).filter_map(mtu_bytes).map(|m| m as usize);
    let full = HDRS.iter().flat_map(|h| mtus().map(move |m| h + m + 4));
    let small = (16..payload.len().min(1024)).step_by(4);
    for seg in full.chain(small) {
        {
            if seg >= payload.len() {
                continue;
            }
            let all = payload.chunks(seg).enumerate().all(|(i, p)| {
                let mut f = *ip;
                f.ident = ip.ident.wrapping_add(i as u16);
                verify_ipv4(&f, sport, dport, p).is_some()
            });
            if all {
                return Some(payload.len().div_ceil(seg) as u64);
            }
        }
    }
    None
}

/// `--ib`: checks every IB packet of every payload line; writes them to `pcap` when given.
/// Returns the exit status.
fn check_ib(pcap: Option<&str>) -> i32 {
    use softroce::wire::{icrc, lrh, vcrc, LrhPacket};
    let mut out: Vec<u8> = Vec::new();
    // pcap global header: magic, version 2.4, zone 0, sigfigs 0, snaplen 65535, link type 247.
    out.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&4u16.to_le_bytes());
    for w in [0u32, 0, 65535, 247] {
        out.extend_from_slice(&w.to_le_bytes());
    }
    let (mut ok, mut bad, mut skipped) = (0u64, 0u64, 0u64);
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let Some(payload) = hex(&line) else {
            skipped += 1;
            continue;
        };
        let mut rest = &payload[..];
        while !rest.is_empty() {
            let len = LrhPacket::new_checked(rest)
                .map(|l| usize::from(l.pkt_len()) * 4 + vcrc::VCRC_LEN)
                .unwrap_or(usize::MAX);
            if len > rest.len() || len < lrh::HEADER_LEN + icrc::ICRC_LEN + vcrc::VCRC_LEN {
                bad += 1;
                eprintln!("not an IB packet (LRH length): {line:.160}");
                break;
            }
            let (pkt, tail) = rest.split_at(len);
            rest = tail;
            if ib_packet_ok(pkt) {
                ok += 1;
            } else {
                bad += 1;
                eprintln!("bad VCRC or ICRC: {line:.160}");
            }
            // Record header: seconds, microseconds (the packet's index), captured and real length.
            for w in [0, (ok + bad) as u32, len as u32, len as u32] {
                out.extend_from_slice(&w.to_le_bytes());
            }
            out.extend_from_slice(pkt);
        }
    }
    println!("{ok} IB packets with a correct VCRC and ICRC, {bad} with a wrong one, {skipped} lines skipped");
    if let Some(path) = pcap {
        if let Err(e) = std::fs::write(path, &out) {
            eprintln!("cannot write {path}: {e}");
            return 1;
        }
    }
    i32::from(bad > 0 || ok == 0)
}

/// One whole IB packet (LRH .. VCRC): both CRCs right.
fn ib_packet_ok(pkt: &[u8]) -> bool {
    use softroce::wire::{grh, icrc, lrh, vcrc, Lnh, LrhPacket};
    let Some(body) = vcrc::verify(pkt) else { return false };
    let Ok(l) = LrhPacket::new_checked(body) else {
        return false;
    };
    let hlen = match l.lnh() {
        Lnh::IbaLocal => lrh::HEADER_LEN,
        Lnh::IbaGlobal => lrh::HEADER_LEN + grh::HEADER_LEN,
        _ => return false,
    };
    let Some(n) = body.len().checked_sub(icrc::ICRC_LEN).filter(|&n| n >= hlen) else {
        return false;
    };
    let mut lb = [0u8; lrh::HEADER_LEN];
    lb.copy_from_slice(&body[..lrh::HEADER_LEN]);
    let mut gb = [0u8; grh::HEADER_LEN];
    let global = (hlen > lrh::HEADER_LEN).then(|| {
        gb.copy_from_slice(&body[lrh::HEADER_LEN..hlen]);
        &gb
    });
    let c = &body[n..];
    icrc::icrc_ib_parts(&lb, global, &[&body[hlen..n]]) == u32::from_le_bytes([c[0], c[1], c[2], c[3]])
}
