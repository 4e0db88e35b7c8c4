//! A rogue peer that gets nowhere, over softroce: a peer that completes the
//! handshake correctly (`rogue_peer`) and then lies. For each lie the real plugin code must
//! detect it, fail only that comm with a WARN naming the peer and what it did (or, for sizes,
//! report no more than was posted), write nothing outside registered buffers (guard bytes
//! around the receive buffers; the rogue's writes past ferroce's rings are refused), and an
//! honest comm in the same process must move bytes before and after.
//!
//! Each case runs in a child process (its own configuration, FERROCE_CONNECT_TIMEOUT_SEC=2,
//! and its stderr, where the plugin WARNs without NCCL's logger). Runs with
//! FERROCE_TEST_SOFTROCE=1 after `make build` (`make test` sets it); addresses 127.0.14.x.

mod rogue_peer;
mod softroce_common;

use nccl_net_ferroce::api::{self, CommContext, RecvHandle, SendHandle};
use nccl_net_ferroce::device::NetDevice;
use nccl_net_ferroce::transport::proto::eager::{self, Imm};
use nccl_net_ferroce::transport::proto::fifo::{CtsEntry, ENTRY_BYTES, RING_BYTES, SIZES_IN_ENTRY};
use nccl_net_ferroce::transport::proto::handshake::{
    DevRepr, EndpointRepr, HandleRepr, LinkLayer, LinkOffer, ListenAddr, Message, QpRepr, Route,
};
use nccl_net_ferroce::transport::proto::plan::Remote;
use rogue_peer::{
    read_msg, rogue_accept, rogue_listen, rogue_listen_as, rogue_receiver, rogue_receiver_answering, rogue_sender,
    rogue_sender_offering, send_msg, Rogue, BLOCK,
};
use softroce_common::{child, pair, reg, run_child, transfer};
use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `ibv_wc_status` IBV_WC_REM_ACCESS_ERR.
const REM_ACCESS_ERR: u32 = nccl_net_ferroce::ibv::sys::ibv_wc_status::IBV_WC_REM_ACCESS_ERR;
/// Guard bytes on each side of a receive buffer, and their pattern.
const GUARD: usize = 4096;
const GUARD_BYTE: u8 = 0xa5;

/// The rogue cases' environment on top of [`run_child`]'s: a short setup timeout (some cases
/// wait it out), no hang report.
const ENV: &[(&str, &str)] = &[("FERROCE_CONNECT_TIMEOUT_SEC", "2"), ("FERROCE_HANG_WARN_SEC", "0")];

/// The WARN lines of a child's output.
fn warns(text: &str) -> Vec<&str> {
    text.lines().filter(|l| l.starts_with("NET/ferroce")).collect()
}

/// Run `name` as a child (the parent) or its body (in the child).
fn case(name: &str, addr: &str, body: fn(&CommContext), want_warn: &[&str]) {
    case_env(name, addr, &[], body, want_warn);
}

/// [`case`] with `env` set in the child. Returns the child's WARN lines (none in the child).
fn case_env(name: &str, addr: &str, env: &[(&str, &str)], body: fn(&CommContext), want_warn: &[&str]) -> Vec<String> {
    if child(name, || body(&api::init(None, -1, false).expect("init over softroce"))) {
        return Vec::new();
    }
    let text = run_child(name, addr, &[ENV, env].concat());
    let w = warns(&text);
    for want in want_warn {
        assert!(
            w.iter().any(|l| l.contains(want)),
            "{name}: no WARN containing {want:?}; WARNs: {w:#?}\n{text}"
        );
    }
    w.into_iter().map(str::to_string).collect()
}

/// The honest comm of a case, with a checked transfer (`what` says when).
struct Honest {
    s: Box<SendHandle>,
    r: Box<RecvHandle>,
}

impl Honest {
    fn new(ctx: &CommContext) -> Honest {
        let (s, r) = pair(ctx, 0);
        let h = Honest { s, r };
        h.check("before the rogue");
        h
    }

    fn check(&self, what: &str) {
        for (i, size) in [1usize, 4096, 1 << 20].into_iter().enumerate() {
            transfer(
                &self.s,
                &self.r,
                size,
                i as u8 + 1,
                (std::ptr::null_mut(), std::ptr::null_mut()),
                Duration::from_secs(20),
            )
            .unwrap_or_else(|e| panic!("the honest comm {what}: {e}"));
        }
    }

    fn members(&self) -> Vec<Arc<NetDevice>> {
        // SAFETY: a live RecvHandle.
        unsafe { api::comm_device(&*self.r as *const RecvHandle as *mut c_void) }
            .members
            .clone()
    }
}

/// Wait for request `q` until it is done (Ok(size)) or fails (Err(message)).
fn wait(q: *mut nccl_net_ferroce::transport::Request) -> Result<i32, String> {
    let end = Instant::now() + Duration::from_secs(20);
    let mut sz = [-1i32];
    loop {
        // SAFETY: q is in flight until test says done or fails.
        match unsafe { api::test(q, sz.as_mut_ptr()) } {
            Ok(true) => return Ok(sz[0]),
            Ok(false) => {}
            Err(e) => return Err(e.message),
        }
        assert!(Instant::now() < end, "no completion and no error within 20 s (a hang)");
    }
}

/// A ferroce sender connected to a rogue receiver (which posts receives for its writes).
fn sender_to_rogue(ctx: &CommContext, h: &Honest) -> (Box<SendHandle>, Rogue) {
    sender_to_rogue_posting(ctx, h, 32)
}

/// A ferroce sender connected to a rogue receiver that posts `recvs_per_qp` receives per QP.
fn sender_to_rogue_posting(ctx: &CommContext, h: &Honest, recvs_per_qp: u64) -> (Box<SendHandle>, Rogue) {
    let (mut handle, l) = rogue_listen(1);
    let mut s = None;
    let mut pump = || {
        if s.is_none() {
            s = api::connect(ctx, 0, &mut handle).expect("ferroce connect to the rogue");
        }
    };
    let rogue = rogue_receiver(&h.members(), &l, recvs_per_qp, &mut pump);
    let end = Instant::now() + Duration::from_secs(20);
    while s.is_none() {
        s = api::connect(ctx, 0, &mut handle).expect("ferroce connect to the rogue");
        assert!(Instant::now() < end, "connect to the rogue never finished");
    }
    (s.expect("connected"), rogue)
}

/// A rogue sender connected to a ferroce receiver.
fn rogue_to_receiver(ctx: &CommContext, h: &Honest) -> (Rogue, Box<RecvHandle>) {
    let mut handle = [0u8; 128];
    let mut l = api::listen(ctx, 0, &mut handle).expect("listen");
    let mut r = None;
    let mut pump = || {
        if r.is_none() {
            r = api::accept(&mut l).expect("ferroce accept of the rogue");
        }
    };
    let rogue = rogue_sender(&h.members(), &handle, &mut pump);
    let end = Instant::now() + Duration::from_secs(20);
    while r.is_none() {
        r = api::accept(&mut l).expect("ferroce accept of the rogue");
        assert!(Instant::now() < end, "accept of the rogue never finished");
    }
    (rogue, r.expect("accepted"))
}

/// isend of `buf` with tag 1 on `s`, retried while "not yet" for at most 20 s; the error if
/// the comm failed meanwhile.
fn isend(
    s: &SendHandle,
    buf: &[u8],
    mh: &nccl_net_ferroce::transport::MemHandle,
) -> Result<*mut nccl_net_ferroce::transport::Request, String> {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        // SAFETY: live handle; buf registered and alive until the request is done or failed.
        match unsafe { api::isend(s, buf.as_ptr() as usize, buf.len(), 1, mh) } {
            Ok(Some(q)) => return Ok(q),
            Ok(None) => {}
            Err(e) => return Err(e.message),
        }
        assert!(
            Instant::now() < end,
            "isend neither matched nor failed within 20 s (a hang)"
        );
    }
}

/// The rogue as receiver advertises, for ferroce's first send, a CTS entry of its buffer at
/// `addr` with `rkey`: the send's data write must fail with an error naming the refused access.
fn bad_cts_target(ctx: &CommContext, addr_off: u64, rkey_xor: u32) {
    let h = Honest::new(ctx);
    let (s, rogue) = sender_to_rogue(ctx, &h);
    let buf_off = RING_BYTES as u64;
    let before = rogue.bytes().to_vec();
    let e = CtsEntry::new(
        rogue.block.addr() as u64 + buf_off + addr_off,
        4096,
        [rogue.rkey() ^ rkey_xor; 8],
        1,
        1,
        0,
    );
    rogue.write_cts(0, &e).expect("the rogue's CTS write");
    let src = vec![0x3cu8; 4096];
    let mh = reg(&*s, &src);
    let err = isend(&s, &src, &mh)
        .and_then(wait)
        .expect_err("a send to a refused buffer must fail");
    assert!(
        err.contains("refused the RDMA access") && err.contains("advertised"),
        "{err}"
    );
    // Nothing of the rogue's memory changed (the NIC refused the write).
    assert!(rogue.bytes()[RING_BYTES..2 * RING_BYTES] == before[RING_BYTES..2 * RING_BYTES]);
    api::dereg_mr(mh).expect("deregMr");
    drop(s);
    h.check("after the rogue's comm failed");
}

#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn wrong_rkey_in_a_cts_entry_fails_only_that_comm() {
    case(
        "wrong_rkey_in_a_cts_entry_fails_only_that_comm",
        "127.0.14.1",
        |ctx| bad_cts_target(ctx, 0, 0x5a5a_0000),
        &["remote access", "refused the RDMA access", "127.0.0.1"],
    );
}

#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn an_address_outside_the_advertised_buffer_fails_only_that_comm() {
    case(
        "an_address_outside_the_advertised_buffer_fails_only_that_comm",
        "127.0.14.2",
        |ctx| bad_cts_target(ctx, BLOCK as u64, 0),
        &["refused the RDMA access", "127.0.0.1"],
    );
}

/// Garbage (random bytes) over the head entry, then a well-sealed entry with a counter ferroce
/// does not expect (a stale stamp), each on its own comm: both fail within the bound, with the
/// peer and what it wrote in the WARN.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn garbage_or_a_stale_stamp_in_the_cts_fifo_fails_only_that_comm() {
    case(
        "garbage_or_a_stale_stamp_in_the_cts_fifo_fails_only_that_comm",
        "127.0.14.3",
        |ctx| {
            let h = Honest::new(ctx);
            // Random bytes at the head; the rogue's write past the ring is refused by the NIC.
            let (s, rogue) = sender_to_rogue(ctx, &h);
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            let junk: Vec<u8> = (0..ENTRY_BYTES)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            rogue.write_fifo_bytes(0, &junk).expect("garbage into the FIFO");
            let src = vec![1u8; 64];
            let mh = reg(&*s, &src);
            let t0 = Instant::now();
            let err = isend(&s, &src, &mh).expect_err("garbage must fail the comm");
            assert!(err.contains("stale, replayed or garbage"), "{err}");
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "failed only after {:?}",
                t0.elapsed()
            );
            api::dereg_mr(mh).expect("deregMr");
            drop(s);
            h.check("after the garbage");

            // One honest CTS (counter 0), one real send; then counter 0's entry again at entry 1,
            // where counter 1 is owed.
            let (s, rogue) = sender_to_rogue(ctx, &h);
            let buf = (rogue.block.addr() + RING_BYTES) as u64;
            rogue
                .write_cts(0, &CtsEntry::new(buf, 64, [rogue.rkey(); 8], 1, 1, 0))
                .expect("CTS");
            let mh = reg(&*s, &src);
            assert_eq!(isend(&s, &src, &mh).and_then(wait), Ok(64), "the honest first send");
            assert!(rogue.bytes()[RING_BYTES..RING_BYTES + 64].iter().all(|&b| b == 1));
            rogue
                .write_cts(1, &CtsEntry::new(buf, 64, [rogue.rkey(); 8], 1, 1, 0))
                .expect("CTS");
            let err = isend(&s, &src, &mh).expect_err("a stale stamp must fail the comm");
            assert!(
                err.contains("posting counter 0") && err.contains("owes group 1"),
                "{err}"
            );
            api::dereg_mr(mh).expect("deregMr");
            drop(s);
            h.check("after the stale stamp");
        },
        &["stale, replayed or garbage", "posting counter 0", "127.0.0.1"],
    );
}

/// A stamp that matches with a seal that never verifies: "still landing" for at most the
/// bound (FERROCE_CONNECT_TIMEOUT_SEC), then the comm fails with a clear WARN.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn a_cts_entry_whose_seal_never_verifies_fails_only_that_comm() {
    case(
        "a_cts_entry_whose_seal_never_verifies_fails_only_that_comm",
        "127.0.14.4",
        |ctx| {
            let h = Honest::new(ctx);
            let (s, rogue) = sender_to_rogue(ctx, &h);
            let mut e = CtsEntry::new((rogue.block.addr() + RING_BYTES) as u64, 64, [rogue.rkey(); 8], 1, 1, 0);
            e.seal ^= 0x40;
            rogue.write_cts(0, &e).expect("CTS");
            let src = vec![1u8; 64];
            let mh = reg(&*s, &src);
            let t0 = Instant::now();
            let err = isend(&s, &src, &mh).expect_err("a seal that never verifies must fail");
            assert!(err.contains("never became consistent"), "{err}");
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "failed only after {:?}",
                t0.elapsed()
            );
            assert!(
                rogue.bytes()[RING_BYTES..RING_BYTES + 64].iter().all(|&b| b == 0),
                "nothing sent"
            );
            api::dereg_mr(mh).expect("deregMr");
            drop(s);
            h.check("after the bad seal");
        },
        &["never became consistent", "127.0.0.1"],
    );
}

/// A receive buffer of whole pages with a guard page on each side (registrations cover whole
/// pages, as on a real NIC, so a guard inside a registered page would prove nothing).
struct Guarded {
    mem: Vec<u8>,
    start: usize,
    cap: usize,
}

impl Guarded {
    fn new(pages: usize) -> Guarded {
        let cap = pages * GUARD;
        let mem = vec![GUARD_BYTE; cap + 3 * GUARD];
        let start = GUARD + (GUARD - mem.as_ptr() as usize % GUARD) % GUARD;
        Guarded { mem, start, cap }
    }
    fn addr(&mut self) -> usize {
        self.mem[self.start..].as_mut_ptr() as usize
    }
    fn inner(&self) -> &[u8] {
        &self.mem[self.start..self.start + self.cap]
    }
    fn guards_intact(&self) -> bool {
        let (before, after) = (
            &self.mem[self.start - GUARD..self.start],
            &self.mem[self.start + self.cap..][..GUARD],
        );
        before.iter().chain(after).all(|&b| b == GUARD_BYTE)
    }
}

/// The rogue as sender claims more than was posted: in the immediate of a single receive and
/// in the completion record of a grouped one (after writing garbage over the record, and a
/// huge size over the staged entry's posted size, which is in the same remotely writable
/// block). ferroce reports the posted sizes, never more, and WARNs once for the comm, naming
/// the peer; nothing outside the registered buffers changes.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn sizes_larger_than_posted_are_clamped() {
    let w = case_env(
        "sizes_larger_than_posted_are_clamped",
        "127.0.14.5",
        &[],
        |ctx| {
            let h = Honest::new(ctx);
            let (rogue, r) = rogue_to_receiver(ctx, &h);
            let mut g = Guarded::new(1);
            let mh = reg(&*r, g.inner());
            let a = g.addr();
            // Single receive of 100 bytes; the rogue writes 100 and claims 1,000,000.
            // SAFETY: live handle; buffer registered and alive until the request is done.
            let q = unsafe { api::irecv(&r, &[a], &[100], &[1], &[&mh], false) }
                .expect("irecv")
                .expect("slot");
            let cts = rogue.wait_cts(0, 0);
            assert_eq!((cts.addr, cts.posted_size()), (a as u64, 100));
            rogue.bytes()[RING_BYTES..RING_BYTES + 100].fill(0x77);
            let remote = Remote {
                addr: cts.addr,
                rkey: cts.rkeys[0],
            };
            rogue
                .write(
                    RING_BYTES,
                    100,
                    remote,
                    Some(
                        Imm::Single {
                            pos: 0,
                            size: 1_000_000,
                        }
                        .to_u32(),
                    ),
                )
                .expect("the rogue's write");
            assert_eq!(wait(q), Ok(100), "the posted size, not the claimed 1,000,000");
            // Grouped receive of 100 + 50 (entries 1, 2); the rogue scribbles over the record
            // (random bytes), then writes the record [10^6, 2^32-1] with its immediate.
            let (a1, a2) = (a + 100, a + 200);
            // SAFETY: as above.
            let q = unsafe { api::irecv(&r, &[a1, a2], &[100, 50], &[1, 2], &[&mh, &mh], false) }
                .expect("irecv")
                .expect("slot");
            let (c1, c2) = (rogue.wait_cts(1, 1), rogue.wait_cts(2, 1));
            assert_eq!((c1.addr, c2.addr), (a1 as u64, a2 as u64));
            let records = Remote {
                addr: rogue.peer.addr + ENTRY_BYTES as u64,
                rkey: rogue.peer.devs[0].rkey,
            };
            rogue.bytes()[RING_BYTES..RING_BYTES + 32].fill(0xfe);
            rogue
                .write(RING_BYTES, 32, records, None)
                .expect("garbage over the record");
            // The staged entry 1's posted size (bytes 8..16; the record is 16 bytes into it).
            let posted_size = Remote {
                addr: records.addr - (SIZES_IN_ENTRY - 8) as u64,
                ..records
            };
            rogue.bytes()[RING_BYTES..RING_BYTES + 8].copy_from_slice(&u64::MAX.to_le_bytes());
            rogue
                .write(RING_BYTES, 8, posted_size, None)
                .expect("a huge size over the staged entry");
            let sizes: Vec<u8> = [1_000_000u32, u32::MAX].iter().flat_map(|s| s.to_le_bytes()).collect();
            rogue.bytes()[RING_BYTES..RING_BYTES + 8].copy_from_slice(&sizes);
            rogue
                .write(RING_BYTES, 8, records, Some(Imm::Record { pos: 1 }.to_u32()))
                .expect("the lying record");
            let mut sz = [-1i32; 2];
            let end = Instant::now() + Duration::from_secs(20);
            // SAFETY: q is in flight until test says done.
            while !unsafe { api::test(q, sz.as_mut_ptr()) }.expect("grouped test") {
                assert!(Instant::now() < end, "the grouped receive never completed");
            }
            assert_eq!(sz, [100, 50], "the posted sizes, never more");
            assert!(g.guards_intact(), "bytes outside the registered buffer changed");
            assert!(g.inner()[..100].iter().all(|&b| b == 0x77));
            api::dereg_mr(mh).expect("deregMr");
            drop(r);
            drop(rogue);
            h.check("after the rogue sender");
        },
        &[
            "the sender 127.0.0.1",
            "claimed 1000000 bytes for buffer 0 of a receive of 1 buffer(s), posted with 100 bytes",
        ],
    );
    let claims = w.iter().filter(|l| l.contains("no honest sender claims more")).count();
    assert!(claims <= 1, "one WARN per comm, not {claims}: {w:#?}");
}

/// The rogue as sender completes one grouped receive honestly (its record, then its immediate,
/// which names the record at ring position 0) and then replays that completion (the same
/// immediate) after writing the next group's record (position 2): the second receive fails,
/// with a WARN naming the peer and what it claimed, instead of completing with another group's
/// sizes.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn a_replayed_grouped_completion_fails_only_that_comm() {
    case(
        "a_replayed_grouped_completion_fails_only_that_comm",
        "127.0.14.11",
        |ctx| {
            let h = Honest::new(ctx);
            let (rogue, r) = rogue_to_receiver(ctx, &h);
            let mut g = Guarded::new(1);
            let mh = reg(&*r, g.inner());
            let a = g.addr();
            let records = Remote {
                addr: rogue.peer.addr,
                rkey: rogue.peer.devs[0].rkey,
            };
            let sizes: Vec<u8> = [10u32, 20].iter().flat_map(|s| s.to_le_bytes()).collect();
            rogue.bytes()[RING_BYTES..RING_BYTES + 8].copy_from_slice(&sizes);
            let mut posted = Vec::new();
            for (group, first_entry) in [(0u64, 0usize), (1, 2)] {
                // SAFETY: live handle; buffer registered and alive until the request ends.
                let q = unsafe { api::irecv(&r, &[a, a + 100], &[100, 50], &[1, 2], &[&mh, &mh], false) }
                    .expect("irecv")
                    .expect("slot");
                // A receive posted behind another waits for the comm's next test to write its
                // CTS (receives posted back to back share one write): look at it, as NCCL does.
                let mut sz = [0i32; 2];
                // SAFETY: q is in flight; room for its two sizes.
                assert!(
                    !unsafe { api::test(q, sz.as_mut_ptr()) }.expect("test"),
                    "nothing sent yet"
                );
                rogue.wait_cts(first_entry, group);
                posted.push(q);
            }
            let group_0 = Imm::Record { pos: 0 }.to_u32();
            rogue
                .write(RING_BYTES, 8, records, Some(group_0))
                .expect("group 0's completion");
            let mut sz = [-1i32; 2];
            let end = Instant::now() + Duration::from_secs(20);
            // SAFETY: in flight until test says done.
            while !unsafe { api::test(posted[0], sz.as_mut_ptr()) }.expect("group 0") {
                assert!(Instant::now() < end, "group 0 never completed");
            }
            assert_eq!(sz, [10, 20], "the honest completion");
            let replay = Remote {
                addr: records.addr + 2 * ENTRY_BYTES as u64,
                ..records
            };
            rogue
                .write(RING_BYTES, 8, replay, Some(group_0))
                .expect("the replayed completion");
            let err = wait(posted[1]).expect_err("a replayed completion must fail the receive");
            assert!(
                err.contains("names no receive waiting there")
                    && err.contains(&format!("{group_0}"))
                    && err.contains("127.0.0.1"),
                "{err}"
            );
            assert!(g.guards_intact(), "bytes outside the registered buffer changed");
            api::dereg_mr(mh).expect("deregMr");
            drop((r, rogue));
            h.check("after the replayed completion");
        },
        &["replayed or forged completion", "127.0.0.1"],
    );
}

/// Writes past ferroce's own FIFO ring, past its CTS staging block (the receiver's completion
/// records) and past a registered receive buffer are refused by the NIC (the rogue's write
/// fails with a remote access error), and the guard page after the receive buffer is
/// untouched. (The FIFO registration is exactly its 4 KiB and the receiver's exactly its 4 KiB
/// of staging and its landing ring, whatever the page size: conn::RegBuf.)
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn writes_past_registered_memory_are_refused() {
    case(
        "writes_past_registered_memory_are_refused",
        "127.0.14.7",
        |ctx| {
            let h = Honest::new(ctx);
            let (s, rogue) = sender_to_rogue(ctx, &h);
            assert_eq!(
                rogue.write_fifo_bytes(RING_BYTES, &[0xee; 64]),
                Err(REM_ACCESS_ERR),
                "past the FIFO"
            );
            drop(s);
            let (rogue, r) = rogue_to_receiver(ctx, &h);
            let mut g = Guarded::new(1);
            let mh = reg(&*r, g.inner());
            let a = g.addr();
            // SAFETY: live handle; buffer registered and alive until the request is done.
            let q = unsafe { api::irecv(&r, &[a], &[100], &[1], &[&mh], false) }
                .expect("irecv")
                .expect("slot");
            let cts = rogue.wait_cts(0, 0);
            let past = Remote {
                addr: cts.addr + g.cap as u64,
                rkey: cts.rkeys[0],
            };
            assert_eq!(
                rogue.write(RING_BYTES, 64, past, Some(Imm::Single { pos: 0, size: 64 }.to_u32())),
                Err(REM_ACCESS_ERR),
                "past the buffer"
            );
            assert!(
                wait(q).is_err(),
                "the receive after the refused write must fail, not hang"
            );
            assert!(g.guards_intact(), "bytes outside the registered buffer changed");
            api::dereg_mr(mh).expect("deregMr");
            drop((r, rogue));
            // Just past the receiver's block: the CTS staging (its completion records start
            // SIZES_IN_ENTRY in), then the eager landing ring (SLOTS slots).
            let (rogue, r) = rogue_to_receiver(ctx, &h);
            let landing = rogue.peer.eager;
            assert!(landing.offered(), "a version-5 receiver offers its landing ring");
            assert_eq!(
                landing.landing,
                rogue.peer.addr - SIZES_IN_ENTRY as u64 + RING_BYTES as u64,
                "the landing ring follows the staging ring"
            );
            let past = Remote {
                addr: landing.landing + (eager::SLOTS * landing.slot_bytes as usize) as u64,
                rkey: rogue.peer.devs[0].rkey,
            };
            assert_eq!(
                rogue.write(RING_BYTES, 8, past, None),
                Err(REM_ACCESS_ERR),
                "past the receiver's block"
            );
            drop((r, rogue));
            h.check("after the refused writes");
        },
        &[],
    );
}

/// A peer record that claims 8 devices and 128 QPs (of `dev`'s GID, so it parses as ours).
fn greedy_endpoint(dev: &NetDevice, nonce: u64) -> EndpointRepr {
    let mut fake = DevRepr {
        gid: dev.gid,
        lid: 0,
        port: 1,
        link_layer: LinkLayer::Ethernet,
        mtu: 5,
        gid_index: 3,
        rkey: 0x1234,
        name: [0; 20],
    };
    fake.set_name("rogue");
    EndpointRepr {
        nonce,
        tc: 0,
        sl: 0,
        flags: 0,
        addr: 0x1000,
        devs: vec![fake; 8],
        qps: (0..128)
            .map(|i| QpRepr {
                qpn: 0x100 + i,
                dev: (i % 8) as u8,
            })
            .collect(),
        eager: Default::default(),
        link: Default::default(),
    }
}

/// `connect` to `handle` until it fails (its error), within 15 s; connecting is a failure.
fn connect_error(ctx: &CommContext, handle: &mut [u8; 128], what: &str) -> String {
    let t0 = Instant::now();
    loop {
        match api::connect(ctx, 0, handle) {
            Ok(None) => {}
            Ok(Some(_)) => panic!("connected to {what}"),
            Err(e) => return e.message,
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "connect hung on {what}");
    }
}

/// A handshake that claims 8 devices x 16 QPs = 128 QPs and then never sends Ready, and one
/// that sends half a header and stops: the listener drops each with a WARN once the setup
/// timeout passes and its accept returns an error (never a hang). The honest comm moves
/// bytes meanwhile.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn a_listener_drops_a_greedy_handshake_and_half_a_header() {
    case(
        "a_listener_drops_a_greedy_handshake_and_half_a_header",
        "127.0.14.6",
        |ctx| {
            let h = Honest::new(ctx);
            let mut handle = [0u8; 128];
            let mut l = api::listen(ctx, 0, &mut handle).expect("listen");
            let hr = HandleRepr::parse(&handle).expect("handle");
            let ListenAddr::V4 { ip, port } = hr.addr else {
                panic!("IPv4 on lo")
            };
            let dial = || std::net::TcpStream::connect((std::net::Ipv4Addr::from(ip), port)).expect("dial");
            let mut greedy = dial();
            send_msg(
                &mut greedy,
                &Message::ConnectReq(greedy_endpoint(&h.members()[0], hr.nonce)),
            );
            let mut half = dial();
            std::io::Write::write_all(&mut half, &[0x66; 7]).expect("half a header");
            let t0 = Instant::now();
            let err = loop {
                match api::accept(&mut l) {
                    Ok(None) => {}
                    Ok(Some(_)) => panic!("accepted a comm from a peer that never sent Ready"),
                    Err(e) => break e.message,
                }
                assert!(t0.elapsed() < Duration::from_secs(15), "accept hung on the rogue");
            };
            assert!(err.contains("no peer completed a connection"), "{err}");
            h.check("while the listener refused the rogues");
            drop((l, greedy, half));
            h.check("after the rogue handshakes");
        },
        &["did not finish the handshake", "sent no complete connection request"],
    );
}

/// A rogue listener that answers ferroce's connect with 8 devices and 128 QPs (against its 1):
/// the connect fails at once, naming the QP counts.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn a_connect_refuses_a_listener_that_claims_128_qps() {
    case(
        "a_connect_refuses_a_listener_that_claims_128_qps",
        "127.0.14.9",
        |ctx| {
            let h = Honest::new(ctx);
            let (mut handle, rl) = rogue_listen(1);
            let mut pump = || {
                let _ = api::connect(ctx, 0, &mut handle);
            };
            let mut chan = rogue_accept(&rl, &mut pump);
            let Message::ConnectReq(req) = read_msg(&mut chan, &mut pump) else {
                panic!("no ConnectReq")
            };
            send_msg(
                &mut chan,
                &Message::ConnectResp(greedy_endpoint(&h.members()[0], req.nonce)),
            );
            let err = connect_error(ctx, &mut handle, "a peer with 128 QPs against 1");
            assert!(err.contains("128 QPs"), "{err}");
            drop(chan);
            h.check("after the greedy listener");
        },
        &[],
    );
}

/// A rogue listener that takes ferroce's request and never answers: the connect fails once
/// the setup timeout passes (never a hang).
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn a_connect_to_a_listener_that_never_answers_times_out() {
    case(
        "a_connect_to_a_listener_that_never_answers_times_out",
        "127.0.14.10",
        |ctx| {
            let h = Honest::new(ctx);
            let (mut handle, rl) = rogue_listen(1);
            let mut pump = || {
                let _ = api::connect(ctx, 0, &mut handle);
            };
            let _silent = rogue_accept(&rl, &mut pump);
            let t0 = Instant::now();
            let err = connect_error(ctx, &mut handle, "a listener that never answered");
            assert!(!err.is_empty());
            assert!(
                t0.elapsed() >= Duration::from_secs(1),
                "failed after {:?}, before the 2 s setup timeout could pass",
                t0.elapsed()
            );
            h.check("after the silent listener");
        },
        &[],
    );
}

/// A rogue receiver that posts no receive: ferroce's write with immediate meets
/// receiver-not-ready, which the NIC retries without end (rnr_retry 7, as NCCL sets it: an
/// honest peer posts its receives before its CTS, so RNR lasts only while a peer misbehaves).
/// The send neither completes nor fails; the hang WARN names RNR as the cause from the QP's RNR
/// NAK count (softroce counts them per QP), not a closed or a silent peer
/// (docs/observability.md#hang-reports); closing the comm with the send in flight works at once,
/// and the honest comm carries on.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn a_receiver_that_posts_no_receive_gets_the_rnr_hang_warn_and_closes() {
    let w = case_env(
        "a_receiver_that_posts_no_receive_gets_the_rnr_hang_warn_and_closes",
        "127.0.14.8",
        &[("FERROCE_HANG_WARN_SEC", "1")],
        |ctx| {
            let h = Honest::new(ctx);
            let (s, rogue) = sender_to_rogue_posting(ctx, &h, 0);
            let buf = (rogue.block.addr() + RING_BYTES) as u64;
            rogue
                .write_cts(0, &CtsEntry::new(buf, 64, [rogue.rkey(); 8], 1, 1, 0))
                .expect("CTS");
            let src = vec![7u8; 64];
            let mh = reg(&*s, &src);
            let q = isend(&s, &src, &mh).expect("the send starts");
            // Past the 1 s hang interval (the WARN comes within about 2 s).
            let end = Instant::now() + Duration::from_millis(2500);
            let mut sz = [-1i32];
            while Instant::now() < end {
                // SAFETY: q is in flight (never done here: the peer takes no receive).
                match unsafe { api::test(q, sz.as_mut_ptr()) } {
                    Ok(false) => {}
                    other => panic!("a send into a peer with no receive posted ended: {other:?}"),
                }
            }
            let t0 = Instant::now();
            drop(s);
            assert!(
                t0.elapsed() < Duration::from_secs(2),
                "closing the comm took {:?}",
                t0.elapsed()
            );
            api::dereg_mr(mh).expect("deregMr");
            drop(rogue);
            h.check("after closing the comm stuck on RNR");
        },
        &[
            "Cause: receiver-not-ready (RNR)",
            "RNR NAK(s) since the wait began",
            "127.0.0.1",
        ],
    );
    let hang: Vec<&String> = w.iter().filter(|l| l.contains("made no progress for")).collect();
    assert!(
        hang.iter()
            .all(|l| !l.contains("closed its comm") && !l.contains("does not answer")),
        "{hang:#?}"
    );
}

/// The rogue's process id in its handle (wire version 6): ferroce offers it a side-channel link.
const ROGUE_PROCESS: u64 = 0x0706_0504_0302_0100;

/// A ferroce sender connected to a rogue receiver in another "process" (its handle carries
/// [`ROGUE_PROCESS`]) that answers the link offer with `answer`; the connect's result.
fn sender_to_rogue_process(
    ctx: &CommContext,
    h: &Honest,
    answer: fn(&LinkOffer) -> LinkOffer,
) -> (Result<Box<SendHandle>, String>, Rogue) {
    let (mut handle, l) = rogue_listen_as(1, ROGUE_PROCESS);
    let mut s: Option<Result<Box<SendHandle>, String>> = None;
    let mut step = |s: &mut Option<Result<Box<SendHandle>, String>>| {
        if s.is_none() {
            *s = api::connect(ctx, 0, &mut handle).map_err(|e| e.message).transpose();
        }
    };
    let mut rogue = rogue_receiver_answering(&h.members(), &l, 32, &mut || step(&mut s), answer);
    let end = Instant::now() + Duration::from_secs(20);
    while s.is_none() {
        step(&mut s);
        assert!(Instant::now() < end, "connect to the rogue never finished");
    }
    if let Some(Ok(_)) = &s {
        let Message::Ready { .. } = read_msg(&mut rogue.stream, &mut || {}) else {
            panic!("ferroce did not send Ready")
        };
    }
    (s.expect("connect ended"), rogue)
}

/// A listener that answers ferroce's link offer with a link ferroce did not offer: the connect
/// fails at once, saying so; the honest comm moves bytes after.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn a_connect_refuses_a_link_answer_it_did_not_offer() {
    case(
        "a_connect_refuses_a_link_answer_it_did_not_offer",
        "127.0.14.12",
        |ctx| {
            let h = Honest::new(ctx);
            let (got, _rogue) = sender_to_rogue_process(ctx, &h, |asked| {
                assert!(
                    asked.found != 0 && asked.comm != 0,
                    "ferroce offers to found a link: {asked:?}"
                );
                LinkOffer {
                    process: ROGUE_PROCESS,
                    attach: 0xbad,
                    found: 0,
                    comm: asked.comm,
                }
            });
            let err = got.err().expect("a connect that took a link it never offered");
            assert!(err.contains("link offer with one that does not fit"), "{err}");
            h.check("after the rogue link answer");
        },
        &[],
    );
}

/// A peer whose comm founded a shared link and then sends on it a setup message, or closes the
/// comm (`CommClosed`): ferroce's comm fails with an error that says which, within the probe
/// interval (no hang); the honest comm is not touched.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn a_shared_link_that_carries_garbage_or_a_close_fails_its_comm_clearly() {
    case(
        "a_shared_link_that_carries_garbage_or_a_close_fails_its_comm_clearly",
        "127.0.14.13",
        |ctx| {
            let h = Honest::new(ctx);
            let founded = |asked: &LinkOffer| LinkOffer {
                process: ROGUE_PROCESS,
                attach: 0,
                found: asked.found,
                comm: asked.comm,
            };
            let buf = vec![7u8; 64];
            for (what, want) in [
                ("garbage", "malformed side-channel message"),
                ("close", "closed the connection"),
            ] {
                let (s, mut rogue) = sender_to_rogue_process(ctx, &h, founded);
                let s = s.expect("a comm on a link the rogue founded with it");
                let comm = rogue.peer.link.comm;
                let bye = match what {
                    "garbage" => Message::Ready { nonce: 1 },
                    _ => Message::CommClosed {
                        route: Route { comm, to_recv: false },
                    },
                };
                send_msg(&mut rogue.stream, &bye);
                let mh = reg(&*s, &buf);
                let err = isend(&s, &buf, &mh).expect_err("a send on a comm whose link failed or closed");
                assert!(err.contains(want), "{what}: {err}");
                drop(s);
            }
            h.check("after the rogue links");
        },
        &["malformed side-channel message", "closed the connection"],
    );
}

/// A peer process that founded a link with ferroce's listener and then asks, on that link, for
/// a listen comm this process does not have (a stale handle): ferroce refuses it at once with a
/// `Reject` on the request's own route, and its comm on the link and the honest comm go on.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn a_request_on_a_link_for_an_unknown_listener_is_refused_on_its_route() {
    case(
        "a_request_on_a_link_for_an_unknown_listener_is_refused_on_its_route",
        "127.0.14.14",
        |ctx| {
            let h = Honest::new(ctx);
            let mut handle = [0u8; 128];
            let mut l = api::listen(ctx, 0, &mut handle).expect("listen");
            let mut r = None;
            let offer = LinkOffer {
                process: ROGUE_PROCESS,
                attach: 0,
                found: 0x5eed,
                comm: 1,
            };
            let mut rogue = rogue_sender_offering(
                &h.members(),
                &handle,
                &mut || {
                    if r.is_none() {
                        r = api::accept(&mut l).expect("accept of the rogue");
                    }
                },
                offer,
            );
            assert_eq!(
                rogue.peer.link.found, 0x5eed,
                "ferroce took the link: {:?}",
                rogue.peer.link
            );
            let end = Instant::now() + Duration::from_secs(20);
            while r.is_none() {
                r = api::accept(&mut l).expect("accept of the rogue");
                assert!(Instant::now() < end, "accept of the rogue never finished");
            }
            // On the link: a request for a listener nonce nobody here has.
            let route = Route {
                comm: 99,
                to_recv: true,
            };
            let mut stale = rogue.peer.clone();
            stale.nonce = 0xdead;
            stale.link = LinkOffer {
                process: ROGUE_PROCESS,
                attach: 0x5eed,
                found: 0,
                comm: 99,
            };
            send_msg(
                &mut rogue.stream,
                &Message::OnComm {
                    route,
                    message: Box::new(Message::ConnectReq(stale)),
                },
            );
            // Another listen comm's accept reads the process's links.
            let mut handle2 = [0u8; 128];
            let mut l2 = api::listen(ctx, 0, &mut handle2).expect("listen");
            let answer = read_msg(&mut rogue.stream, &mut || {
                assert!(api::accept(&mut l2).expect("accept").is_none());
            });
            let Message::OnComm { route: back, message } = answer else {
                panic!("not an answer on the link: {answer:?}")
            };
            assert_eq!(
                back,
                Route {
                    comm: 99,
                    to_recv: false
                }
            );
            match *message {
                Message::Reject { code, text } => {
                    assert_eq!(code, nccl_net_ferroce::transport::proto::setup::reject::NONCE_MISMATCH);
                    assert!(text.contains("stale or foreign handle"), "{text}");
                }
                m => panic!("not a Reject: {m:?}"),
            }
            h.check("after the stale request on the link");
            drop((r, l, l2, rogue));
        },
        &[],
    );
}

/// A send waiting for the ACK of its write (the path blackholed once the CTS landed) to a peer
/// whose process goes away without a close report (the rogue drops its QPs and its side
/// channel): the hang report names the closed peer, not receiver-not-ready or a silent peer
/// (docs/observability.md#hang-reports). (A comm that closes in order sends its close report
/// and the send fails at once instead.)
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn a_send_to_a_peer_that_went_away_names_the_close() {
    let w = case_env(
        "a_send_to_a_peer_that_went_away_names_the_close",
        "127.0.14.15",
        &[
            ("FERROCE_HANG_WARN_SEC", "1"),
            ("NCCL_IB_TIMEOUT", "16"),
            ("NCCL_IB_RETRY_CNT", "7"),
        ],
        |ctx| {
            let h = Honest::new(ctx);
            let (s, rogue) = sender_to_rogue(ctx, &h);
            let buf = (rogue.block.addr() + RING_BYTES) as u64;
            rogue
                .write_cts(0, &CtsEntry::new(buf, 64, [rogue.rkey(); 8], 1, 1, 0))
                .expect("CTS");
            std::thread::sleep(Duration::from_millis(200));
            softroce_common::ctl("127.0.14.15", &["blackhole", "127.0.14.15"]);
            let src = vec![1u8; 64];
            let mh = reg(&*s, &src);
            let q = isend(&s, &src, &mh).expect("the send matches the CTS");
            drop(rogue);
            let end = Instant::now() + Duration::from_millis(1700);
            let mut sz = [0i32];
            while Instant::now() < end {
                // SAFETY: q is in flight until test says done or fails.
                match unsafe { api::test(q, sz.as_mut_ptr()) } {
                    Ok(done) => assert!(!done, "no ACK can come through the blackhole"),
                    Err(_) => break,
                }
            }
            drop(s);
            api::dereg_mr(mh).expect("deregMr");
            softroce_common::ctl("127.0.14.15", &["heal"]);
        },
        &["made no progress for", "Cause: the peer closed its comm"],
    );
    let hang: Vec<&String> = w.iter().filter(|l| l.contains("made no progress for")).collect();
    assert!(
        hang.iter()
            .all(|l| !l.contains("RNR") && !l.contains("does not answer")),
        "{hang:#?}"
    );
}
