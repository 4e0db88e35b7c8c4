//! softroce's InfiniBand link layer (`SOFTROCE_LINK_LAYER=ib`) end to end through the exported
//! ABI and the engine's socket: the port's attributes, RC transfers addressed by DLID (with and
//! without a GRH), the AV rules, a DLID nobody owns, and packets of the other link layer or for
//! another DLID dropped and counted.

mod verbs_util;

use std::net::{Ipv4Addr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

use rdma_sys::{ibv_port_attr, ibv_qp_attr, ibv_sge};
use softroce::driver::link::{ib_headers, ib_trailer, SM_LID};
use softroce::verbs::misc::{ibv_create_ah, ibv_destroy_ah};
use softroce::verbs::port::{ibv_query_gid, ibv_query_pkey};
use softroce::verbs::qp::ibv_modify_qp;
use softroce::wire::icrc::{icrc_ipv4, Ipv4Fields};
use verbs_util::*;

/// This file's device address (its LID is 0x1509); the peer address sends hand-made packets.
const DEV: Ipv4Addr = Ipv4Addr::new(127, 0, 21, 9);
const PEER: Ipv4Addr = Ipv4Addr::new(127, 0, 21, 10);
const LID: u16 = 0x1509;
/// The LID of 127.0.21.200, which no process binds.
const NOBODY: u16 = 0x15c8;

fn ib_open() -> Ctx {
    std::env::set_var("SOFTROCE_LINK_LAYER", "ib");
    open(&DEV.to_string())
}

/// RESET -> INIT -> RTR -> RTS towards `remote_qpn` at `dlid`, with a GRH to GID 0 when
/// `global`; returns the RTR call's result (the QP stays in INIT when it fails).
fn connect_ib(c: &Ctx, q: &Qp, remote_qpn: u32, dlid: u16, global: bool, timeout: u8, retry: u8) -> i32 {
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    unsafe {
        let mut a: ibv_qp_attr = std::mem::zeroed();
        a.qp_state = 1;
        a.port_num = 1;
        a.qp_access_flags = 2 | 4 | 8;
        assert_eq!(ibv_modify_qp(q.qp, &mut a, 0x1 | 0x10 | 0x20 | 0x8), 0, "INIT");
        let mut a: ibv_qp_attr = std::mem::zeroed();
        a.qp_state = 2;
        a.path_mtu = 3;
        a.dest_qp_num = remote_qpn;
        a.rq_psn = 0x100;
        a.max_dest_rd_atomic = 4;
        a.min_rnr_timer = 1;
        a.ah_attr.dlid = dlid;
        a.ah_attr.sl = 3;
        a.ah_attr.port_num = 1;
        if global {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid = gid(c, 0);
            a.ah_attr.grh.sgid_index = 0;
            a.ah_attr.grh.hop_limit = 1;
        }
        let r = ibv_modify_qp(q.qp, &mut a, 0x1 | 0x80 | 0x100 | 0x100000 | 0x1000 | 0x20000 | 0x8000);
        if r != 0 {
            return r;
        }
        let mut a: ibv_qp_attr = std::mem::zeroed();
        a.qp_state = 3;
        a.sq_psn = 0x100;
        a.timeout = timeout;
        a.retry_cnt = retry;
        a.rnr_retry = 7;
        a.max_rd_atomic = 4;
        assert_eq!(
            ibv_modify_qp(q.qp, &mut a, 0x1 | 0x10000 | 0x200 | 0x400 | 0x800 | 0x2000),
            0,
            "RTS"
        );
        0
    }
}

/// WRITEs 3000 bytes (three 1024-byte packets) from `a` into a fresh buffer through `b`'s MR.
fn write_through(c: &Ctx, a: &Qp) -> Vec<u8> {
    let mut src = Buf::new(c, 3000, ACCESS_ALL);
    src.fill(|i| (i * 7 + 1) as u8);
    let dst = Buf::new(c, 3000, ACCESS_ALL);
    let mut sge = src.sge(3000);
    let mut wr = rdma_wr(7, 0, &mut sge, SIGNALED, &dst);
    assert_eq!(post_send(a, &mut wr), 0);
    let s = poll_one(a.cq);
    assert_eq!((s.wr_id, s.status), (7, 0), "{s:?}");
    assert_eq!(dst.read(), src.read());
    dst.read()
}

#[test]
fn the_port_is_an_infiniband_port_with_a_lid() {
    let c = ib_open();
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    unsafe {
        let mut p: ibv_port_attr = std::mem::zeroed();
        assert_eq!(
            softroce::verbs::port::ibv_query_port(c.ctx, 1, &mut p as *mut _ as *mut _),
            0
        );
        assert_eq!(p.link_layer, 1, "IBV_LINK_LAYER_INFINIBAND");
        assert_eq!(p.state, rdma_sys::ibv_port_state::IBV_PORT_ACTIVE);
        assert_eq!((p.lid, p.sm_lid, p.lmc), (LID, SM_LID, 0));
        let g = gid(&c, 0);
        assert_eq!(
            g.raw,
            [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x53, 0x7f, 0xff, 0xfe, 0x00, 0x15, 0x09],
            "subnet prefix fe80::/64 + port GUID"
        );
        let mut g1 = gid(&c, 0);
        assert_eq!(ibv_query_gid(c.ctx, 1, 1, &mut g1), 0);
        assert_eq!(g1.raw, [0; 16], "an IB port has one GID");
        let mut pkey = 0u16;
        assert_eq!(ibv_query_pkey(c.ctx, 1, 0, &mut pkey), 0);
        assert_eq!(u16::from_be(pkey), 0xffff);
    }
}

#[test]
fn rc_transfers_by_dlid_with_and_without_grh() {
    let c = ib_open();
    for global in [false, true] {
        let a = create_qp(&c);
        let b = create_qp(&c);
        // SAFETY: test code: both QPs are live.
        let (qa, qb) = unsafe { ((*a.qp).qp_num, (*b.qp).qp_num) };
        assert_eq!(connect_ib(&c, &a, qb, LID, global, 14, 7), 0);
        assert_eq!(connect_ib(&c, &b, qa, LID, global, 14, 7), 0);
        write_through(&c, &a);
    }
}

#[test]
fn an_av_needs_a_unicast_dlid() {
    let c = ib_open();
    for dlid in [0, 0xC001] {
        let a = create_qp(&c);
        assert_eq!(
            connect_ib(&c, &a, 0x11, dlid, false, 14, 7),
            libc::EINVAL,
            "DLID {dlid:#x}"
        );
    }
}

#[test]
fn address_handles_take_a_dlid_and_a_grh_only_when_global() {
    let c = ib_open();
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    unsafe {
        let mut a: rdma_sys::ibv_ah_attr = std::mem::zeroed();
        a.dlid = NOBODY;
        a.sl = 2;
        a.port_num = 1;
        let ah = ibv_create_ah(c.pd, &mut a);
        assert!(!ah.is_null(), "an AH by DLID, no GRH");
        assert_eq!(ibv_destroy_ah(ah), 0);
        a.is_global = 1;
        a.grh.dgid = gid(&c, 0);
        let ah = ibv_create_ah(c.pd, &mut a);
        assert!(!ah.is_null(), "an AH with a GRH from GID 0");
        assert_eq!(ibv_destroy_ah(ah), 0);
        a.grh.sgid_index = 1; // an empty GID slot
        assert!(ibv_create_ah(c.pd, &mut a).is_null());
        a.is_global = 0;
        a.dlid = 0;
        assert!(ibv_create_ah(c.pd, &mut a).is_null(), "no GRH and no DLID");
    }
}

#[test]
fn a_dlid_nobody_owns_loses_its_packets() {
    let c = ib_open();
    let mut src = Buf::new(&c, 64, ACCESS_ALL);
    src.fill(|i| i as u8);
    let a = create_qp(&c);
    assert_eq!(connect_ib(&c, &a, 0x11, NOBODY, false, 8, 2), 0); // 1 ms, 2 retries
    let mut sge = ibv_sge {
        addr: src.addr(),
        length: 64,
        lkey: src.lkey(),
    };
    let mut wr = send_wr(1, 2, &mut sge, SIGNALED);
    assert_eq!(post_send(&a, &mut wr), 0);
    let s = poll_one(a.cq);
    assert_eq!((s.wr_id, s.status), (1, 12), "expected IBV_WC_RETRY_EXC_ERR: {s:?}");
}

/// A UDP socket on PEER that sends as softroce does (DF, IP ID 0).
fn peer_socket() -> UdpSocket {
    let sock = UdpSocket::bind((PEER, 0)).expect("bind peer socket");
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
    sock
}

/// A WRITE Only of 16 bytes to `dest_qp` at `va`/`rkey` (BTH, RETH, payload).
fn write_only(dest_qp: u32, va: u64, rkey: u32) -> Vec<u8> {
    let mut p = vec![0x0A, 0x00, 0xff, 0xff, 0x00];
    p.extend_from_slice(&dest_qp.to_be_bytes()[1..]);
    p.extend_from_slice(&[0x80, 0x00, 0x01, 0x00]); // AckReq, PSN 0x100
    p.extend_from_slice(&va.to_be_bytes());
    p.extend_from_slice(&rkey.to_be_bytes());
    p.extend_from_slice(&16u32.to_be_bytes());
    p.extend_from_slice(b"0123456789abcdef");
    p
}

fn wait_for(what: &str, f: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !f() {
        assert!(std::time::Instant::now() < deadline, "{what} within 5 s");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[test]
fn other_link_layer_and_other_dlids_are_dropped_and_counted() {
    let c = ib_open();
    let (_a, b) = {
        let a = create_qp(&c);
        let b = create_qp(&c);
        // SAFETY: test code: both QPs are live.
        let (qa, qb) = unsafe { ((*a.qp).qp_num, (*b.qp).qp_num) };
        assert_eq!(connect_ib(&c, &a, qb, LID, false, 14, 7), 0);
        assert_eq!(connect_ib(&c, &b, qa, LID, false, 14, 7), 0);
        (a, b)
    };
    let dev = softroce::driver::instances::instance(0).unwrap();
    let drops = &dev.link_drops;
    let dst = Buf::new(&c, 64, ACCESS_ALL);
    let sock = peer_socket();
    let sport = sock.local_addr().unwrap().port();
    // SAFETY: test code: b.qp is a live QP.
    let qpn = unsafe { (*b.qp).qp_num };
    let t = write_only(qpn, dst.addr(), dst.rkey());

    // A RoCEv2 packet with a right ICRC: the other link layer.
    let before = drops.other_link_layer.load(Ordering::Relaxed);
    let mut roce = t.clone();
    roce.extend_from_slice(&icrc_ipv4(&Ipv4Fields::new(PEER.octets(), DEV.octets(), 0), sport, 4791, &t).to_le_bytes());
    sock.send_to(&roce, (DEV, 4791)).unwrap();
    wait_for("the RoCE packet counted", || {
        drops.other_link_layer.load(Ordering::Relaxed) > before
    });

    // The same WRITE as an IB packet for another DLID: not ours.
    let before = drops.not_ours.load(Ordering::Relaxed);
    let h = ib_headers(0x150a, NOBODY, 0, None, 0, 0, 0, t.len());
    let mut other = h.bytes[..h.len].to_vec();
    other.extend_from_slice(&t);
    other.extend_from_slice(&ib_trailer(&h, &t));
    sock.send_to(&other, (DEV, 4791)).unwrap();
    wait_for("the packet for another DLID counted", || {
        drops.not_ours.load(Ordering::Relaxed) > before
    });
    assert!(dst.read().iter().all(|&x| x == 0), "nothing was written");

    // Addressed to our LID, it is executed.
    let h = ib_headers(0x150a, LID, 0, None, 0, 0, 0, t.len());
    let mut ours = h.bytes[..h.len].to_vec();
    ours.extend_from_slice(&t);
    ours.extend_from_slice(&ib_trailer(&h, &t));
    sock.send_to(&ours, (DEV, 4791)).unwrap();
    wait_for("the WRITE executed", || dst.read_range(0, 16) == b"0123456789abcdef");
}
