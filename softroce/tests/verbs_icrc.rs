//! End to end through the engine's socket: a RoCEv2 packet with a wrong ICRC
//! is dropped (nothing written), the same packet with the right ICRC is
//! executed. (`SOFTROCE_ICRC_CHECK` is left at its default, on.)

mod verbs_util;

use std::net::{Ipv4Addr, UdpSocket};
use std::os::fd::AsRawFd;

use softroce::wire::icrc::{icrc_ipv4, Ipv4Fields};
use verbs_util::*;

const DEV: Ipv4Addr = Ipv4Addr::new(127, 0, 21, 5);
const PEER: Ipv4Addr = Ipv4Addr::new(127, 0, 21, 6);

fn write_only(dest_qp: u32, psn: u32, va: u64, rkey: u32, payload: &[u8]) -> Vec<u8> {
    let mut p = vec![0x0A, 0x00, 0xff, 0xff, 0x00];
    p.extend_from_slice(&dest_qp.to_be_bytes()[1..]);
    p.push(0x80); // AckReq
    p.extend_from_slice(&psn.to_be_bytes()[1..]);
    p.extend_from_slice(&va.to_be_bytes());
    p.extend_from_slice(&rkey.to_be_bytes());
    p.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    p.extend_from_slice(payload);
    p
}

#[test]
fn bad_icrc_dropped_good_icrc_executed() {
    let c = open(&DEV.to_string());
    let (_a, b) = pair(&c);
    let dst = Buf::new(&c, 64, ACCESS_ALL);
    let sock = UdpSocket::bind((PEER, 0)).expect("bind peer socket");
    // DF and IP ID 0, as softroce sends (the ICRC covers both).
    let v: libc::c_int = libc::IP_PMTUDISC_DO;
    // SAFETY: setsockopt on a live socket with a pointer to a live c_int.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            &v as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0);
    let sport = sock.local_addr().unwrap().port();
    // SAFETY: test code: b.qp is a live QP.
    let qpn = unsafe { (*b.qp).qp_num };
    let payload = *b"0123456789abcdef";
    let pkt = write_only(qpn, 0x100, dst.addr() + 8, dst.rkey(), &payload);
    let crc = icrc_ipv4(&Ipv4Fields::new(PEER.octets(), DEV.octets(), 0), sport, 4791, &pkt);

    let mut bad = pkt.clone();
    bad.extend_from_slice(&(crc ^ 1).to_le_bytes());
    sock.send_to(&bad, (DEV, 4791)).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(
        dst.read().iter().all(|&x| x == 0),
        "a packet with a bad ICRC must be dropped"
    );

    let mut good = pkt;
    good.extend_from_slice(&crc.to_le_bytes());
    sock.send_to(&good, (DEV, 4791)).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while dst.read()[8..24] != payload {
        assert!(
            std::time::Instant::now() < deadline,
            "the packet with the right ICRC was not executed"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let d = dst.read();
    assert!(d[..8].iter().chain(d[24..].iter()).all(|&x| x == 0));
}
