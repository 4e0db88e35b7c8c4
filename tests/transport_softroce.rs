//! The transport's real verbs path over softroce, through the internal API, in one process.
//!
//! Every test is ignored unless asked for (`--include-ignored`); then it needs
//! `FERROCE_TEST_SOFTROCE=1` and softroce built (`make build`), and fails without them
//! (tests/softroce_common). Each test binary
//! is one process, so the environment (softroce address, side-channel interface, library
//! path) is set once before the plugin reads its configuration.

mod softroce_common;

use nccl_net_ferroce::api::{self, CommContext, ListenHandle, RecvHandle, SendHandle};
use nccl_net_ferroce::transport::{MemHandle, Request};
use softroce_common::{child, require_softroce, run_child, softroce_lib};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

static SETUP: Once = Once::new();
/// One softroce test at a time. A test that panics poisons it; the others still run (a
/// poisoned guard protects nothing here).
static LOCK: Mutex<()> = Mutex::new(());

/// The API context over softroce (the environment set once per process). Fails the test when
/// softroce is not there ([`require_softroce`]).
fn setup() -> Box<CommContext> {
    require_softroce();
    SETUP.call_once(|| {
        std::env::set_var("NCCL_IBVERBS_LIB", softroce_lib());
        if std::env::var("SOFTROCE_ADDR").is_err() {
            std::env::set_var("SOFTROCE_ADDR", "127.0.41.1");
        }
        if std::env::var("NCCL_SOCKET_IFNAME").is_err() {
            std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
        }
        if std::env::var("FERROCE_CONNECT_TIMEOUT_SEC").is_err() {
            std::env::set_var("FERROCE_CONNECT_TIMEOUT_SEC", "5");
        }
    });
    api::init(None, -1, false).expect("init over softroce")
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(30)
}

/// Connect a send/recv pair on device 0, driving connect and accept alternately on one thread
/// (as NCCL's bootstrap does; any blocking would deadlock here).
fn pair(ctx: &CommContext) -> (Box<SendHandle>, Box<RecvHandle>) {
    let mut handle = [0u8; 128];
    let mut l = api::listen(ctx, 0, &mut handle).expect("listen");
    connect_accept(ctx, &mut handle, &mut l)
}

/// Connect to `handle` and accept on its listen comm `l`, alternately on one thread.
fn connect_accept(
    ctx: &CommContext,
    handle: &mut [u8; 128],
    l: &mut ListenHandle,
) -> (Box<SendHandle>, Box<RecvHandle>) {
    let (mut s, mut r) = (None, None);
    let end = deadline();
    while s.is_none() || r.is_none() {
        if s.is_none() {
            s = api::connect(ctx, 0, handle).expect("connect");
        }
        if r.is_none() {
            r = api::accept(l).expect("accept");
        }
        assert!(Instant::now() < end, "connection setup did not finish");
    }
    let (s, r) = (s.unwrap(), r.unwrap());
    softroce_common::assert_link_layer(&device_of(&*s));
    (s, r)
}

fn device_of<T>(h: &T) -> Arc<nccl_net_ferroce::device::VirtualDevice> {
    // SAFETY: h is a live SendHandle/RecvHandle.
    unsafe { api::comm_device(h as *const T as *mut std::ffi::c_void) }.clone()
}

fn reg<T>(h: &T, buf: &[u8]) -> Box<MemHandle> {
    api::reg_mr(
        &device_of(h),
        buf.as_ptr() as usize,
        buf.len(),
        api::MemKind::Host,
        None,
    )
    .expect("regMr")
}

fn wait(req: *mut Request, sizes: &mut [i32]) {
    let end = deadline();
    loop {
        // SAFETY: req is live until reported done.
        if unsafe { api::test(req, sizes.as_mut_ptr()) }.expect("test") {
            return;
        }
        assert!(Instant::now() < end, "request did not complete");
    }
}

fn fill(buf: &mut [u8], seed: u64) {
    let mut x = seed | 1;
    for b in buf.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}

/// `slot`, a receive buffer filled with 0xee before the receive, holds `want` at its start and
/// nothing past it.
fn assert_received(slot: &[u8], want: &[u8], what: std::fmt::Arguments) {
    assert!(slot[..want.len()] == *want, "{what} payload");
    assert!(slot[want.len()..].iter().all(|&b| b == 0xee), "{what} overrun");
}

/// Deregister `mhs`, close both comms and finalize the context.
fn close_all(
    ctx: Box<CommContext>,
    s: Box<SendHandle>,
    r: Box<RecvHandle>,
    mhs: impl IntoIterator<Item = Box<MemHandle>>,
) {
    for mh in mhs {
        api::dereg_mr(mh).unwrap();
    }
    drop(s);
    drop(r);
    api::finalize(ctx).unwrap();
}

/// Send `size` bytes from s to r (receive buffer `cap` ≥ size) and verify every byte.
fn transfer(s: &SendHandle, r: &RecvHandle, size: usize, cap: usize, seed: u64) {
    let mut src = vec![0u8; size.max(1)];
    fill(&mut src, seed);
    let mut dst = vec![0xeeu8; cap.max(1)];
    let (smh, rmh) = (reg(s, &src), reg(r, &dst));
    // SAFETY: handles live; buffers registered and alive until completion.
    let rreq = loop {
        if let Some(q) = unsafe { api::irecv(r, &[dst.as_mut_ptr() as usize], &[cap], &[7], &[&rmh], false) }.unwrap() {
            break q;
        }
    };
    let end = deadline();
    let sreq = loop {
        // SAFETY: as above.
        if let Some(q) = unsafe { api::isend(s, src.as_ptr() as usize, size, 7, &smh) }.unwrap() {
            break q;
        }
        assert!(Instant::now() < end, "isend never matched");
    };
    let mut ss = [-1i32];
    let mut rs = [-1i32];
    wait(sreq, &mut ss);
    wait(rreq, &mut rs);
    assert_eq!(ss[0] as usize, size);
    assert_eq!(rs[0] as usize, size, "receiver reports the real size");
    assert_received(&dst[..cap], &src[..size], format_args!("message of {size} bytes"));
    api::dereg_mr(smh).unwrap();
    api::dereg_mr(rmh).unwrap();
}

#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn connect_and_transfer_sizes() {
    let ctx = setup();
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let (s, r) = pair(&ctx);
    for (i, &size) in [0usize, 1, 127, 128, 129, 4095, 4096, 65_537, 1 << 20, (4 << 20) + 3]
        .iter()
        .enumerate()
    {
        transfer(&s, &r, size, size + 4096, i as u64 + 1);
    }
    drop(s);
    drop(r);
    api::finalize(ctx).unwrap();
}

/// CTS entries the FIFO ring holds (`fifo::RING`): grouped receives beyond it wait.
const RING: usize = nccl_net_ferroce::transport::proto::fifo::RING;

fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// Post `isend`s until one is accepted (the receiver's CTS may still be landing).
fn isend_retry(s: &SendHandle, p: usize, size: usize, tag: i32, mh: &MemHandle) -> *mut Request {
    let end = deadline();
    loop {
        // SAFETY: live handle; the caller keeps the buffer registered and alive.
        if let Some(q) = unsafe { api::isend(s, p, size, tag, mh) }.unwrap() {
            return q;
        }
        assert!(Instant::now() < end, "isend never matched");
    }
}

/// Grouped receives (n = 1..8) with tags in shuffled order, buffers larger than the messages,
/// 32 groups kept in flight as far as the FIFO ring holds them; every byte verified. Groups
/// are posted while the ring has room (irecv must accept them then, even with no send going
/// on) and must be refused ("retry later") exactly when it has none; the sends of every posted
/// group are in flight together.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn grouped_shuffled_and_32_in_flight() {
    let ctx = setup();
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let (s, r) = pair(&ctx);
    const GROUPS: usize = 32;
    let mut next = xorshift(0x1234_5678);
    // One big source and one big destination arena, registered once each.
    let slot = 256 * 1024;
    let mut src = vec![0u8; GROUPS * 8 * slot];
    fill(&mut src, 99);
    let mut dst = vec![0xeeu8; GROUPS * 8 * slot];
    let (smh, rmh) = (reg(&*s, &src), reg(&*r, &dst));
    struct G {
        n: usize,
        tags: Vec<i32>,
        sizes: Vec<usize>,
        order: Vec<usize>,
        rreq: *mut Request,
        sreqs: Vec<*mut Request>,
    }
    let mut groups: Vec<G> = (0..GROUPS)
        .map(|g| {
            let n = (next() % 8 + 1) as usize;
            let mut order: Vec<usize> = (0..n).collect();
            for i in (1..n).rev() {
                order.swap(i, (next() % (i as u64 + 1)) as usize);
            }
            G {
                n,
                tags: (0..n).map(|i| (i as i32) * 3 + (g as i32 % 5)).collect(),
                sizes: (0..n).map(|_| (next() % (slot as u64 - 1024)) as usize).collect(),
                order,
                rreq: std::ptr::null_mut(),
                sreqs: vec![],
            }
        })
        .collect();
    let (mut posted, mut sent, mut done) = (0, 0, 0);
    let (mut refused, mut peak) = (0, 0);
    while done < GROUPS {
        // Post while the ring has room; the first group that does not fit is refused.
        while posted < GROUPS {
            let gr = &groups[posted];
            let in_ring: usize = groups[done..posted].iter().map(|g| g.n).sum();
            let room = in_ring + gr.n <= RING && posted - done < 32;
            let data: Vec<usize> = (0..gr.n)
                .map(|i| dst.as_mut_ptr() as usize + (posted * 8 + i) * slot)
                .collect();
            let caps = vec![slot; gr.n];
            let mhs: Vec<&MemHandle> = (0..gr.n).map(|_| &*rmh).collect();
            let end = deadline();
            // SAFETY: live handles; the arena outlives the requests.
            let q = loop {
                let q = unsafe { api::irecv(&r, &data, &caps, &gr.tags, &mhs, false) }.unwrap();
                if q.is_some() || !room {
                    break q;
                }
                // Room in the ring: only CTS credits can refuse, and they come back by
                // themselves.
                assert!(Instant::now() < end, "group {posted} refused with room in the ring");
            };
            match q {
                Some(q) => {
                    assert!(
                        room,
                        "group {posted} ({} entries) accepted past the ring ({in_ring} in use)",
                        gr.n
                    );
                    groups[posted].rreq = q;
                    posted += 1;
                    peak = peak.max(in_ring + groups[posted - 1].n);
                }
                None => {
                    refused += 1;
                    break;
                }
            }
        }
        // Send every posted group, each group's isends in shuffled tag order, all in flight.
        while sent < posted {
            let gr = &mut groups[sent];
            for k in 0..gr.n {
                let i = gr.order[k];
                let p = src.as_ptr() as usize + (sent * 8 + i) * slot;
                gr.sreqs.push(isend_retry(&s, p, gr.sizes[i], gr.tags[i], &smh));
            }
            sent += 1;
        }
        // Complete the oldest group: its sends, its receive; check sizes and bytes.
        let gr = &groups[done];
        for (k, &q) in gr.sreqs.iter().enumerate() {
            let mut ss = [-1i32];
            wait(q, &mut ss);
            assert_eq!(ss[0] as usize, gr.sizes[gr.order[k]]);
        }
        let mut rs = [-1i32; 8];
        wait(gr.rreq, &mut rs);
        for i in 0..gr.n {
            assert_eq!(rs[i] as usize, gr.sizes[i], "group {done} buffer {i} size");
            let off = (done * 8 + i) * slot;
            assert_received(
                &dst[off..off + slot],
                &src[off..off + gr.sizes[i]],
                format_args!("group {done} buffer {i}"),
            );
        }
        done += 1;
    }
    assert!(refused > 0, "the ring filled up at least once");
    assert!(
        peak > RING - 8,
        "the ring was used up to its last group ({peak} entries)"
    );
    close_all(ctx, s, r, [smh, rmh]);
}

/// A posted grouped receive.
struct Posted {
    n: usize,
    rreq: *mut Request,
}

/// 32 single-buffer receives in flight (NCCL_NET_MAX_REQUESTS): irecv accepts all of them with
/// no send going on and refuses a 33rd; then the sends, every byte checked. Twice; the second
/// round wraps around the end of the FIFO ring.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn thirty_two_single_receives_in_flight() {
    let ctx = setup();
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let (s, r) = pair(&ctx);
    let size = 40_000;
    let mut src = vec![0u8; 32 * size];
    fill(&mut src, 7);
    let mut dst = vec![0u8; 32 * size];
    let (smh, rmh) = (reg(&*s, &src), reg(&*r, &dst));
    for round in 0..2 {
        if round == 1 {
            // One more receive first: the second round's 32 entries straddle the ring's end.
            transfer(&s, &r, 10, 10, 5);
        }
        dst.fill(0xee);
        let mut rreqs = vec![];
        for k in 0..32 {
            let p = dst.as_mut_ptr() as usize + k * size;
            let end = deadline();
            let q = loop {
                // SAFETY: live handles; the arena outlives the requests.
                if let Some(q) = unsafe { api::irecv(&r, &[p], &[size], &[k as i32], &[&rmh], false) }.unwrap() {
                    break q;
                }
                // A fresh comm has credit for 32 CTS writes; later rounds wait for the CTS
                // writes of the last round to be acknowledged, with no send or test.
                assert!(round > 0, "receive {k} of 32 refused");
                assert!(Instant::now() < end, "receive {k} of 32 refused (round {round})");
            };
            rreqs.push(q);
        }
        let p = dst.as_mut_ptr() as usize;
        // SAFETY: as above.
        let extra = unsafe { api::irecv(&r, &[p], &[size], &[99], &[&rmh], false) }.unwrap();
        assert!(extra.is_none(), "a 33rd receive must wait");
        let sreqs: Vec<_> = (0..32)
            .map(|k| {
                let len = size - 100 * k - round;
                isend_retry(&s, src.as_ptr() as usize + k * size, len, k as i32, &smh)
            })
            .collect();
        for (k, (&sq, &rq)) in sreqs.iter().zip(&rreqs).enumerate() {
            let len = size - 100 * k - round;
            let (mut ss, mut rs) = ([-1i32], [-1i32]);
            wait(sq, &mut ss);
            wait(rq, &mut rs);
            assert_eq!((ss[0] as usize, rs[0] as usize), (len, len));
            let off = k * size;
            assert_received(&dst[off..off + size], &src[off..off + len], format_args!("receive {k}"));
        }
    }
    close_all(ctx, s, r, [smh, rmh]);
}

/// Groups of 8 posted back to back until irecv says "retry later": exactly the ring's 64
/// entries are accepted. Then every send (shuffled tags), every receive completed and checked.
/// Done twice: from ring position 0, and from position 1, so that the last group straddles the
/// end of the ring (its CTS goes out in two writes).
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn groups_of_8_until_the_ring_is_full() {
    let ctx = setup();
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let (s, r) = pair(&ctx);
    let mut next = xorshift(0xfeed_beef);
    let size = 8192;
    let mut src = vec![0u8; RING * size];
    fill(&mut src, 3);
    let mut dst = vec![0u8; RING * size];
    let (smh, rmh) = (reg(&*s, &src), reg(&*r, &dst));
    for round in 0..2 {
        if round == 1 {
            // One single receive moves the ring's start to position 1 (an 8-aligned group
            // never straddles the end).
            transfer(&s, &r, 100, 100, 77);
        }
        dst.fill(0xee);
        let mut groups = vec![];
        loop {
            let g = groups.len();
            // (The refused ninth group names the first group's buffers.)
            let data: Vec<usize> = (0..8)
                .map(|i| dst.as_mut_ptr() as usize + ((g % (RING / 8)) * 8 + i) * size)
                .collect();
            let tags: Vec<i32> = (0..8).map(|i| i % 3).collect();
            if g == RING / 8 {
                // SAFETY: live handles; the arena outlives the requests.
                let q = unsafe { api::irecv(&r, &data[..1], &[size], &tags[..1], &[&rmh], false) }.unwrap();
                assert!(q.is_none(), "the ring is full: retry later");
                break;
            }
            // SAFETY: as above.
            let q = unsafe { api::irecv(&r, &data, &[size; 8], &tags, &[&*rmh; 8], false) }.unwrap();
            let q = q.unwrap_or_else(|| panic!("group {g} of 8 refused with room in the ring (round {round})"));
            groups.push(Posted { n: 8, rreq: q });
        }
        assert_eq!(groups.len(), RING / 8);
        // Sends in shuffled order. Tags repeat inside a group (0,1,2,0,1,2,0,1): the k-th send
        // with tag t lands in the group's k-th buffer with tag t.
        let mut sreqs = vec![];
        let mut expect = vec![(0usize, 0usize); RING]; // per destination buffer: (source offset, len)
        for g in 0..groups.len() {
            let mut order: Vec<usize> = (0..8).collect();
            for i in (1..8).rev() {
                order.swap(i, (next() % (i as u64 + 1)) as usize);
            }
            let mut seen = [0usize; 3];
            for &i in &order {
                let tag = i % 3;
                let dest = tag + 3 * seen[tag];
                seen[tag] += 1;
                let len = size - 8 * (g * 8 + i) - round;
                let off = (g * 8 + i) * size;
                expect[g * 8 + dest] = (off, len);
                sreqs.push((isend_retry(&s, src.as_ptr() as usize + off, len, tag as i32, &smh), len));
            }
        }
        for (q, len) in sreqs {
            let mut ss = [-1i32];
            wait(q, &mut ss);
            assert_eq!(ss[0] as usize, len);
        }
        for (g, gr) in groups.iter().enumerate() {
            let mut rs = [-1i32; 8];
            wait(gr.rreq, &mut rs);
            for d in 0..gr.n {
                let (off, len) = expect[g * 8 + d];
                assert_eq!(rs[d] as usize, len, "round {round} group {g} buffer {d} size");
                let at = (g * 8 + d) * size;
                assert_received(
                    &dst[at..at + size],
                    &src[off..off + len],
                    format_args!("round {round} group {g} buffer {d}"),
                );
            }
        }
    }
    close_all(ctx, s, r, [smh, rmh]);
}

/// iflush: NULL for all-empty receives, a request that reads and completes otherwise (softroce
/// supports DMA-BUF, so flushing is on: a NULL there would mean nothing was flushed).
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn flush_reads_back() {
    let ctx = setup();
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let (s, r) = pair(&ctx);
    transfer(&s, &r, 1000, 4096, 5);
    let buf = vec![1u8; 4096];
    let mh = reg(&*r, &buf);
    let p = buf.as_ptr() as usize;
    // SAFETY: live handles.
    let none = unsafe { api::iflush(&r, &[p], &[0], &[&mh]) }.unwrap();
    assert!(none.is_none(), "nothing to flush for empty receives");
    assert_eq!(rcomm(&r).flushes_in_flight(), 0, "an empty flush reads nothing");
    // SAFETY: as above.
    let q = unsafe { api::iflush(&r, &[p, p], &[100, 0], &[&mh, &mh]) }
        .unwrap()
        .expect("flushing is on over softroce (DMA-BUF): a non-empty flush is a request");
    assert_eq!(rcomm(&r).flushes_in_flight(), 1, "the flush read is in flight");
    assert_eq!(rcomm(&r).flush_qps(), device_of(&*r).members.len());
    wait(q, &mut []);
    assert_eq!(rcomm(&r).flushes_in_flight(), 0, "the flush read completed");
    close_all(ctx, s, r, [mh]);
}

/// Garbage and a foreign peer on the listen port are rejected; the real peer still connects.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn garbage_on_listen_port_then_real_peer() {
    use std::io::Write;
    let ctx = setup();
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut handle = [0u8; 128];
    let mut l = api::listen(&ctx, 0, &mut handle).expect("listen");
    let port = u16::from_be_bytes([handle[12], handle[13]]);
    let ip = std::net::Ipv4Addr::new(handle[16], handle[17], handle[18], handle[19]);
    // HTTP, NCCL's own socket magic, and a silent connection.
    let mut junk = std::net::TcpStream::connect((ip, port)).unwrap();
    junk.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut nccl = std::net::TcpStream::connect((ip, port)).unwrap();
    nccl.write_all(&0x564ab9f2fc4b9d6cu64.to_le_bytes()).unwrap();
    nccl.write_all(&[4, 0, 0, 0, 0, 0, 0, 0]).unwrap();
    let _silent = std::net::TcpStream::connect((ip, port)).unwrap();
    for _ in 0..100 {
        assert!(api::accept(&mut l)
            .expect("garbage must not fail the listener")
            .is_none());
    }
    let (s, r) = connect_accept(&ctx, &mut handle, &mut l);
    transfer(&s, &r, 5000, 8192, 3);
    drop(l);
    drop(s);
    drop(r);
    api::finalize(ctx).unwrap();
}

/// The listen comms of a process share its one listener: every handle names the same address,
/// a handle whose listen comm closed is refused at once by nonce (not left to time out) while
/// another listen comm keeps the listener open, and that one still accepts.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn listen_comms_share_one_listener_and_a_stale_handle_is_refused() {
    let ctx = setup();
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let (mut stale, mut live) = ([0u8; 128], [0u8; 128]);
    let l1 = api::listen(&ctx, 0, &mut stale).expect("listen");
    let mut l2 = api::listen(&ctx, 0, &mut live).expect("listen");
    // Bytes 12..20 of a handle: the listener's port and IPv4 address.
    assert_eq!(
        stale[12..20],
        live[12..20],
        "both handles name the process's one listener"
    );
    assert_ne!(stale, live, "each listen comm has its own nonce");
    drop(l1);
    let err = loop {
        match api::connect(&ctx, 0, &mut stale) {
            Ok(None) => {
                // The refusal comes from the listener's round, which an accept drives.
                assert!(api::accept(&mut l2).expect("accept").is_none());
            }
            Ok(Some(_)) => panic!("connected through a closed listen comm's handle"),
            Err(e) => break e,
        }
    };
    assert!(
        err.message.contains("rejected the connection") && err.message.contains("nonce mismatch"),
        "{}",
        err.message
    );
    let (s, r) = connect_accept(&ctx, &mut live, &mut l2);
    transfer(&s, &r, 3000, 4096, 5);
    drop((l2, s, r));
    api::finalize(ctx).unwrap();
}

/// A handle nobody listens on: connect gives up with a clear error after the timeout.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn connect_to_nobody_times_out() {
    let ctx = setup();
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut handle = [0u8; 128];
    let l = api::listen(&ctx, 0, &mut handle).expect("listen");
    drop(l); // the port is closed now
    let t0 = Instant::now();
    let err = loop {
        match api::connect(&ctx, 0, &mut handle) {
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Ok(Some(_)) => panic!("connected to a closed listener"),
            Err(e) => break e,
        }
    };
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_secs(4) && took < Duration::from_secs(15),
        "gave up after {took:?}"
    );
    assert!(err.message.contains("cannot connect"), "{}", err.message);
    api::finalize(ctx).unwrap();
}

fn live_objects() -> (usize, usize, usize) {
    use nccl_net_ferroce::ibv::{cq, mr, qp};
    use std::sync::atomic::Ordering::Relaxed;
    (
        qp::LIVE_QPS.load(Relaxed),
        cq::LIVE_CQS.load(Relaxed),
        mr::LIVE_MRS.load(Relaxed),
    )
}

/// What each open file descriptor of this process names (`/proc/self/fd`), sorted.
fn open_fds() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| {
            let target = std::fs::read_link(e.path()).map_or_else(|_| "?".into(), |t| t.display().to_string());
            format!("{} -> {target}", e.file_name().to_string_lossy())
        })
        .collect();
    v.sort();
    v
}

/// The open fds are back to at most `before`'s count (waiting up to 2 s: a descriptor another
/// thread holds for a moment, as a sanitizer's runtime may, closes by then; a leaked one never
/// does); else fails with both lists, saying `what`. Fewer is no leak: one that was open in
/// `before` (an earlier test's, or a runtime's) may have closed since.
fn assert_fds_back(before: &[String], what: &str) {
    let end = Instant::now() + Duration::from_secs(2);
    loop {
        let now = open_fds();
        if now.len() <= before.len() {
            return;
        }
        if Instant::now() > end {
            panic!(
                "{what}: {} fds open, {} before\nbefore: {before:#?}\nnow: {now:#?}",
                now.len(),
                before.len()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Many comms at once, each moving data; closing them frees every QP, CQ and MR (also with
/// requests in flight) and every fd.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn many_comms_and_no_fd_leak() {
    let ctx = setup();
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    // Warm up (first comm may open long-lived fds such as the async-event fd).
    {
        let (s, r) = pair(&ctx);
        transfer(&s, &r, 10, 10, 1);
    }
    let before = open_fds();
    let objects = live_objects();
    for round in 0..3 {
        let pairs: Vec<_> = (0..16).map(|_| pair(&ctx)).collect();
        assert!(live_objects().0 >= objects.0 + 32, "QPs exist while the comms are open");
        for (i, (s, r)) in pairs.iter().enumerate() {
            transfer(s, r, 1000 * i + round, 70_000, (i + round * 100) as u64);
        }
        // Leave receives in flight on some comms before closing them.
        let mut spare = vec![0u8; 4096];
        let mhs: Vec<_> = pairs.iter().map(|(_, r)| reg(&**r, &spare)).collect();
        for ((_, r), mh) in pairs.iter().zip(&mhs).step_by(3) {
            // SAFETY: live handles; `spare` outlives the comms.
            unsafe { api::irecv(r, &[spare.as_mut_ptr() as usize], &[4096], &[1], &[&**mh], false) }.unwrap();
        }
        drop(pairs);
        for mh in mhs {
            api::dereg_mr(mh).unwrap();
        }
    }
    assert_eq!(
        live_objects(),
        objects,
        "(QPs, CQs, MRs) leaked by connect/accept/close"
    );
    assert_fds_back(&before, "file descriptors leaked by connect/accept/close");
    api::finalize(ctx).unwrap();
}

/// Closing comms with requests still in flight is safe (no hang, no crash).
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn close_with_requests_in_flight() {
    let ctx = setup();
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let (s, r) = pair(&ctx);
    let mut dst = vec![0u8; 1 << 16];
    let rmh = reg(&*r, &dst);
    for _ in 0..8 {
        // SAFETY: live handles; the buffer outlives the comm.
        let q = unsafe { api::irecv(&r, &[dst.as_mut_ptr() as usize], &[1 << 16], &[1], &[&rmh], false) }.unwrap();
        assert!(q.is_some());
    }
    let t0 = Instant::now();
    drop(s);
    drop(r);
    assert!(t0.elapsed() < Duration::from_secs(2));
    api::dereg_mr(rmh).unwrap();
    api::finalize(ctx).unwrap();
}

// ---------------------------------------------------------------------------------------------
// GPU flush: the loopback QP is made by the first iflush that reads (docs/nccl-net-abi.md#flush).

/// The receive comm behind a handle, to read its counters (this thread drives its data path).
fn rcomm(r: &RecvHandle) -> &nccl_net_ferroce::transport::RecvComm {
    // SAFETY: only this test thread uses the comm's data path, and not during its close; the
    // reference is used for reads before the next data-path call.
    unsafe { r.data_path() }
}

/// A flush of `len` bytes at `p` (registered in `mh`); the request (softroce advertises
/// DMA-BUF, so flushing is on unless NCCL_GDR_FLUSH_DISABLE=1).
fn flush(r: &RecvHandle, p: usize, len: i32, mh: &MemHandle) -> *mut Request {
    // SAFETY: live handle; the caller keeps the buffer registered until the flush completes.
    unsafe { api::iflush(r, &[p], &[len], &[mh]) }
        .expect("iflush")
        .expect("flushing is on over softroce (DMA-BUF)")
}

/// A comm that never flushes has no flush QP (nor its CQ): receiving does not make one. The
/// first iflush makes one per device (one QP and one CQ more) and its read completes; later
/// flushes reuse it; closing frees it.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn flush_qp_only_after_the_first_flush() {
    let ctx = setup();
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let before = live_objects();
    let (s, r) = pair(&ctx);
    for i in 0..4 {
        transfer(&s, &r, 1000 * i + 1, 8192, i as u64);
    }
    assert!(rcomm(&r).flush_enabled(), "softroce advertises DMA-BUF: flushing is on");
    assert_eq!(rcomm(&r).flush_qps(), 0, "no flush QP before the first flush");
    let open = live_objects();
    // Connection setup made two QPs (one each end) and two CQs, and nothing for flushing.
    assert_eq!(
        (open.0 - before.0, open.1 - before.1),
        (2, 2),
        "(QPs, CQs) of a connection"
    );
    let buf = vec![3u8; 4096];
    let mh = reg(&*r, &buf);
    let with_mr = live_objects();
    let q = flush(&r, buf.as_ptr() as usize, 4096, &mh);
    let ndevs = device_of(&*r).members.len();
    assert_eq!(
        rcomm(&r).flush_qps(),
        ndevs,
        "one flush QP per device after the first flush"
    );
    let after = live_objects();
    assert_eq!(
        (after.0 - with_mr.0, after.1 - with_mr.1),
        (ndevs, ndevs),
        "the first flush makes one QP and one CQ per device"
    );
    assert_eq!(rcomm(&r).flushes_in_flight(), 1);
    wait(q, &mut []);
    assert_eq!(rcomm(&r).flushes_in_flight(), 0);
    for k in 0..10 {
        let q = flush(&r, buf.as_ptr() as usize + k, 1, &mh);
        wait(q, &mut []);
    }
    assert_eq!(live_objects().0, after.0, "later flushes reuse the QP");
    assert_eq!(rcomm(&r).flush_qps(), ndevs);
    transfer(&s, &r, 5000, 8192, 11);
    api::dereg_mr(mh).unwrap();
    drop(s);
    drop(r);
    assert_eq!(
        live_objects(),
        before,
        "(QPs, CQs, MRs) left after closing a comm that flushed"
    );
    api::finalize(ctx).unwrap();
}

/// Receives and flushes interleaved: each round posts 16 receives into one half of the arena,
/// sends them, and flushes every received buffer as it completes (in shuffled order), testing
/// older flushes now and then; the flushes of the previous round stay in flight meanwhile (up
/// to 32 flushes, the bound, with 16 receives). Every byte checked.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn flushes_interleaved_with_receives() {
    let ctx = setup();
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let (s, r) = pair(&ctx);
    const N: usize = 16;
    let size = 8192;
    let mut next = xorshift(0xf1a5_0001);
    let mut src = vec![0u8; N * size];
    let dst = vec![0xeeu8; 2 * N * size];
    let (smh, rmh) = (reg(&*s, &src), reg(&*r, &dst));
    // Flushes in flight: (request, arena half it reads).
    let mut flushes: Vec<(*mut Request, usize)> = vec![];
    let (mut peak, mut total) = (0, 0);
    for round in 0..24 {
        let half = round % 2;
        // The flushes of two rounds ago read this half: finish them before it is received into.
        flushes.retain(|&(q, h)| {
            if h == half {
                wait(q, &mut []);
                false
            } else {
                true
            }
        });
        fill(&mut src, 1000 + round as u64);
        let base = dst.as_ptr() as usize + half * N * size;
        let lens: Vec<usize> = (0..N).map(|_| 1 + (next() % size as u64) as usize).collect();
        let rreqs: Vec<_> = (0..N)
            .map(|k| {
                let end = deadline();
                loop {
                    // SAFETY: live handles; the arena outlives the requests.
                    let q = unsafe { api::irecv(&r, &[base + k * size], &[size], &[k as i32], &[&rmh], false) };
                    if let Some(q) = q.unwrap() {
                        break q;
                    }
                    assert!(Instant::now() < end, "receive {k} refused (round {round})");
                }
            })
            .collect();
        let sreqs: Vec<_> = (0..N)
            .map(|k| isend_retry(&s, src.as_ptr() as usize + k * size, lens[k], k as i32, &smh))
            .collect();
        let mut order: Vec<usize> = (0..N).collect();
        for i in (1..N).rev() {
            order.swap(i, (next() % (i as u64 + 1)) as usize);
        }
        for &k in &order {
            let mut rs = [-1i32];
            wait(rreqs[k], &mut rs);
            assert_eq!(rs[0] as usize, lens[k], "round {round} receive {k} size");
            let got = &dst[half * N * size + k * size..][..lens[k]];
            assert!(got == &src[k * size..][..lens[k]], "round {round} receive {k} payload");
            flushes.push((flush(&r, base + k * size, lens[k] as i32, &rmh), half));
            total += 1;
            peak = peak.max(rcomm(&r).flushes_in_flight());
            assert_eq!(rcomm(&r).flushes_in_flight(), flushes.len());
            // Now and then test an older flush once (not waiting).
            if next().is_multiple_of(3) {
                let i = (next() % flushes.len() as u64) as usize;
                // SAFETY: a flush request not reported done yet.
                if unsafe { api::test(flushes[i].0, std::ptr::null_mut()) }.expect("test flush") {
                    flushes.swap_remove(i);
                }
            }
        }
        for q in sreqs {
            wait(q, &mut [-1]);
        }
    }
    for (q, _) in flushes.drain(..) {
        wait(q, &mut []);
    }
    assert_eq!(rcomm(&r).flushes_in_flight(), 0);
    assert!(peak > N, "flushes of two rounds were in flight together (peak {peak})");
    assert_eq!(total, 24 * N);
    assert_eq!(rcomm(&r).flush_qps(), device_of(&*r).members.len());
    close_all(ctx, s, r, [smh, rmh]);
}

/// 32 flushes in flight (FLUSHES_IN_FLIGHT, NCCL's 32 requests per comm) with 32 receives
/// posted besides; a 33rd flush is an error that leaves the comm working: the 32 complete,
/// the receives complete, later flushes work.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn thirty_two_flushes_in_flight_then_an_error() {
    let ctx = setup();
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let (s, r) = pair(&ctx);
    let size = 4096;
    let mut src = vec![0u8; 32 * size];
    fill(&mut src, 321);
    let dst = vec![0xeeu8; 32 * size];
    let (smh, rmh) = (reg(&*s, &src), reg(&*r, &dst));
    let p = dst.as_ptr() as usize;
    let rreqs: Vec<_> = (0..32)
        .map(|k| {
            // SAFETY: live handles; the arena outlives the requests.
            unsafe { api::irecv(&r, &[p + k * size], &[size], &[k as i32], &[&rmh], false) }
                .unwrap()
                .expect("a fresh comm takes 32 receives")
        })
        .collect();
    let fl: Vec<_> = (0..32).map(|k| flush(&r, p + k * size, 1, &rmh)).collect();
    assert_eq!(rcomm(&r).flushes_in_flight(), 32);
    // SAFETY: as above.
    let err = unsafe { api::iflush(&r, &[p], &[1], &[&rmh]) }.expect_err("a 33rd flush in flight");
    assert!(err.message.contains("already in flight"), "{}", err.message);
    assert_eq!(rcomm(&r).flushes_in_flight(), 32, "the refused flush took nothing");
    for q in fl {
        wait(q, &mut []);
    }
    let sreqs: Vec<_> = (0..32)
        .map(|k| isend_retry(&s, src.as_ptr() as usize + k * size, size - k, k as i32, &smh))
        .collect();
    for (k, (sq, rq)) in sreqs.into_iter().zip(rreqs).enumerate() {
        let mut rs = [-1i32];
        wait(sq, &mut [-1]);
        wait(rq, &mut rs);
        assert_eq!(rs[0] as usize, size - k);
        assert!(
            dst[k * size..][..size - k] == src[k * size..][..size - k],
            "receive {k} payload"
        );
    }
    let q = flush(&r, p, 1, &rmh);
    wait(q, &mut []);
    close_all(ctx, s, r, [smh, rmh]);
}

/// Closing comms with flushes (and receives) in flight: no hang, and every QP, CQ and MR is
/// freed (the flush QPs before their CQs, both before the device's PD and scratch). Also a comm
/// that never flushed, next to them.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn close_with_flushes_in_flight() {
    let ctx = setup();
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let before = live_objects();
    let buf = vec![9u8; 1 << 16];
    for round in 0..3 {
        let (s, r) = pair(&ctx);
        let (s2, r2) = pair(&ctx);
        transfer(&s2, &r2, 100, 100, 2);
        let mh = reg(&*r, &buf);
        transfer(&s, &r, 1000, 1000, 1);
        for k in 0..(1 + 10 * round) {
            flush(&r, buf.as_ptr() as usize + k, 1 + k as i32, &mh);
        }
        // SAFETY: live handles; `buf` outlives the comm.
        let q = unsafe { api::irecv(&r, &[buf.as_ptr() as usize], &[1 << 16], &[1], &[&mh], false) }.unwrap();
        assert!(q.is_some());
        assert!(rcomm(&r).flushes_in_flight() > 0);
        assert_eq!(rcomm(&r2).flush_qps(), 0);
        let t0 = Instant::now();
        drop(r);
        drop(s);
        drop(r2);
        drop(s2);
        assert!(t0.elapsed() < Duration::from_secs(2), "close took {:?}", t0.elapsed());
        api::dereg_mr(mh).unwrap();
    }
    assert_eq!(
        live_objects(),
        before,
        "(QPs, CQs, MRs) left after closing with flushes in flight"
    );
    api::finalize(ctx).unwrap();
}

/// When making the flush path fails (injected after its QP exists), iflush returns an error
/// that says what to check, the half-made QP and CQ are gone again, and the comm is intact: data
/// still moves, and the next iflush makes the path and completes.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn flush_setup_failure_leaves_the_comm_usable() {
    use nccl_net_ferroce::transport::recv::FAIL_NEXT_FLUSH_SETUP;
    let ctx = setup();
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let (s, r) = pair(&ctx);
    let buf = vec![5u8; 4096];
    let mh = reg(&*r, &buf);
    let objects = live_objects();
    FAIL_NEXT_FLUSH_SETUP.store(true, std::sync::atomic::Ordering::Relaxed);
    // SAFETY: live handles.
    let err = unsafe { api::iflush(&r, &[buf.as_ptr() as usize], &[10], &[&mh]) }.expect_err("injected failure");
    for want in ["GPU-flush loopback QP", "max_qp", "NCCL_GDR_FLUSH_DISABLE", "injected"] {
        assert!(err.message.contains(want), "missing {want:?} in {}", err.message);
    }
    let now = live_objects();
    assert_eq!(
        (now.0, now.1),
        (objects.0, objects.1),
        "the half-made QP and CQ are destroyed"
    );
    // (The device's flush scratch, one registration shared by every comm, may exist now.)
    assert!(now.2 <= objects.2 + 1, "MRs {} -> {}", objects.2, now.2);
    assert_eq!(rcomm(&r).flush_qps(), 0);
    assert_eq!(rcomm(&r).flushes_in_flight(), 0);
    assert_eq!(rcomm(&r).in_flight(), 0, "no request taken");
    transfer(&s, &r, 3000, 4096, 8);
    let q = flush(&r, buf.as_ptr() as usize, 10, &mh);
    wait(q, &mut []);
    assert_eq!(rcomm(&r).flush_qps(), device_of(&*r).members.len());
    close_all(ctx, s, r, [mh]);
}

/// A flush read that fails (its address lies outside the registration it names) fails the
/// comm through test() with a WARN that names the flush; closing the failed comm frees all.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn failed_flush_read_is_reported_by_test() {
    let ctx = setup();
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let before = live_objects();
    let (s, r) = pair(&ctx);
    let buf = vec![5u8; 4096];
    let other = vec![6u8; 1 << 20];
    let mh = reg(&*r, &buf);
    // The rkey of `buf`'s registration, the address of a buffer it does not cover.
    let q = flush(&r, other.as_ptr() as usize + (1 << 19), 1, &mh);
    let end = deadline();
    let err = loop {
        // SAFETY: a flush request not reported done.
        match unsafe { api::test(q, std::ptr::null_mut()) } {
            Ok(false) => assert!(Instant::now() < end, "the bad flush neither completed nor failed"),
            Ok(true) => panic!("a read outside the registration completed"),
            Err(e) => break e,
        }
    };
    assert!(err.message.contains("RDMA read (GPU flush)"), "{}", err.message);
    assert!(err.message.contains("loopback"), "{}", err.message);
    api::dereg_mr(mh).unwrap();
    drop(s);
    drop(r);
    assert_eq!(live_objects(), before);
    api::finalize(ctx).unwrap();
}

/// NCCL_GDR_FLUSH_DISABLE=1 (read once per process, so checked in a child process of this
/// test binary): iflush returns NULL (nothing to flush) and makes no QP.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn gdr_flush_disable_gives_null_flushes() {
    if child("gdr_flush_disable_gives_null_flushes", gdr_flush_disable_child) {
        return;
    }
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    run_child(
        "gdr_flush_disable_gives_null_flushes",
        "127.0.41.201",
        &[("NCCL_GDR_FLUSH_DISABLE", "1")],
    );
}

/// The child of [`gdr_flush_disable_gives_null_flushes`].
fn gdr_flush_disable_child() {
    let ctx = setup();
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(std::env::var("NCCL_GDR_FLUSH_DISABLE").as_deref(), Ok("1"));
    let before = live_objects();
    let (s, r) = pair(&ctx);
    transfer(&s, &r, 1000, 4096, 5);
    assert!(!rcomm(&r).flush_enabled());
    let buf = vec![1u8; 4096];
    let mh = reg(&*r, &buf);
    let with_mr = live_objects();
    for _ in 0..3 {
        // SAFETY: live handles.
        let q = unsafe { api::iflush(&r, &[buf.as_ptr() as usize], &[4096], &[&mh]) }.unwrap();
        assert!(q.is_none(), "flush disabled: NULL request");
    }
    assert_eq!(rcomm(&r).flush_qps(), 0);
    assert_eq!(live_objects(), with_mr, "no flush QP made");
    api::dereg_mr(mh).unwrap();
    drop(s);
    drop(r);
    assert_eq!(live_objects(), before);
    api::finalize(ctx).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Sizes that disagree, comms that failed, closes mid-flight, messages past 2 GiB.

/// A send larger than the posted receive (NCCL never does this; a peer that disagrees on sizes
/// might): the sender moves only the posted bytes and its test() reports the posted size, the
/// receiver's test() reports the posted size, and nothing past the posted buffer is written,
/// although one registration covers the bytes after it (so an overrun would land, not fault).
/// Single receives, and a group of three with one buffer overrun, one exact and one short.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn send_larger_than_the_posted_receive_is_truncated() {
    let ctx = setup();
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let (s, r) = pair(&ctx);
    let slot = 16384;
    let mut src = vec![0u8; 8 * slot];
    fill(&mut src, 0x7a5c);
    let mut dst = vec![0xeeu8; 8 * slot];
    let (smh, rmh) = (reg(&*s, &src), reg(&*r, &dst));
    // (posted, sent) for single receives.
    for (k, &(posted, sent)) in [(1000usize, 5000usize), (4096, 3 * 4096), (1, 2)].iter().enumerate() {
        let at = dst.as_mut_ptr() as usize + k * slot;
        // SAFETY: live handles; the arena outlives the request.
        let rq = unsafe { api::irecv(&r, &[at], &[posted], &[k as i32], &[&rmh], false) }
            .unwrap()
            .expect("a fresh comm takes a receive");
        let sq = isend_retry(&s, src.as_ptr() as usize + k * slot, sent, k as i32, &smh);
        let (mut ss, mut rs) = ([-1i32], [-1i32]);
        wait(sq, &mut ss);
        wait(rq, &mut rs);
        assert_eq!(
            ss[0] as usize, posted,
            "sender of {sent} bytes into {posted}: reports what it moved"
        );
        assert_eq!(
            rs[0] as usize, posted,
            "receiver of {posted} bytes sent {sent}: reports the posted size"
        );
        assert_received(
            &dst[k * slot..(k + 1) * slot],
            &src[k * slot..k * slot + posted],
            format_args!("receive {k} ({posted} posted, {sent} sent)"),
        );
    }
    // A group: tags 10, 11, 12; posted 100, 3000, 7000; sent 200, 3000, 6000.
    let base = 4;
    let posted = [100usize, 3000, 7000];
    let sent = [200usize, 3000, 6000];
    let tags = [10, 11, 12];
    let data: Vec<usize> = (0..3).map(|i| dst.as_mut_ptr() as usize + (base + i) * slot).collect();
    // SAFETY: as above.
    let rq = unsafe { api::irecv(&r, &data, &posted, &tags, &[&*rmh; 3], false) }
        .unwrap()
        .expect("room for a group of 3");
    let sqs: Vec<_> = (0..3)
        .rev()
        .map(|i| {
            (
                i,
                isend_retry(&s, src.as_ptr() as usize + (base + i) * slot, sent[i], tags[i], &smh),
            )
        })
        .collect();
    for (i, q) in sqs {
        let mut ss = [-1i32];
        wait(q, &mut ss);
        assert_eq!(ss[0] as usize, sent[i].min(posted[i]), "grouped send {i}");
    }
    let mut rs = [-1i32; 3];
    wait(rq, &mut rs);
    for i in 0..3 {
        let want = sent[i].min(posted[i]);
        assert_eq!(
            rs[i] as usize, want,
            "grouped receive {i}: posted {}, sent {}",
            posted[i], sent[i]
        );
        let off = (base + i) * slot;
        assert_received(
            &dst[off..off + slot],
            &src[off..off + want],
            format_args!("grouped receive {i}"),
        );
    }
    // The comm still works after the truncations.
    transfer(&s, &r, 5000, 8192, 77);
    close_all(ctx, s, r, [smh, rmh]);
}

/// Calls `step` until it returns an error (bounded by the test deadline).
fn first_error(
    what: &str,
    mut step: impl FnMut() -> Option<nccl_net_ferroce::error::Error>,
) -> nccl_net_ferroce::error::Error {
    let end = deadline();
    loop {
        if let Some(e) = step() {
            return e;
        }
        assert!(Instant::now() < end, "{what}: no error before the deadline");
    }
}

/// Receiver side: a comm that failed (a flush read outside its registration) answers every
/// later irecv, iflush and test with its error, the same one, and takes no request; a receive
/// that was in flight when it failed reports that error; closing it with that receive never
/// completed frees every QP, CQ and MR.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn every_call_on_a_failed_recv_comm_returns_its_error() {
    let ctx = setup();
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let before = live_objects();
    let (s, r) = pair(&ctx);
    let buf = vec![5u8; 4096];
    let other = vec![6u8; 1 << 20];
    let mh = reg(&*r, &buf);
    let p = buf.as_ptr() as usize;
    // SAFETY: live handles; `buf` outlives the comm.
    let pending = unsafe { api::irecv(&r, &[p], &[4096], &[1], &[&mh], false) }
        .unwrap()
        .expect("a fresh comm takes a receive");
    let bad = flush(&r, other.as_ptr() as usize + (1 << 19), 1, &mh);
    let failure = first_error("the bad flush", || {
        // SAFETY: a flush request not reported done.
        match unsafe { api::test(bad, std::ptr::null_mut()) } {
            Ok(false) => None,
            Ok(true) => panic!("a read outside the registration completed"),
            Err(e) => Some(e),
        }
    });
    let in_flight = rcomm(&r).in_flight();
    let mut sizes = [-1i32];
    // SAFETY: the receive posted before the failure, not reported done.
    let e = unsafe { api::test(pending, sizes.as_mut_ptr()) }.expect_err("test of a receive in flight at the failure");
    assert_eq!(e.message, failure.message, "test: the comm's error");
    assert_eq!(sizes[0], -1, "no size written on error");
    // SAFETY: live handles.
    let e = unsafe { api::irecv(&r, &[p], &[4096], &[2], &[&mh], false) }.expect_err("irecv on a failed comm");
    assert_eq!(e.message, failure.message, "irecv: the comm's error");
    // SAFETY: live handles.
    let e = unsafe { api::iflush(&r, &[p], &[10], &[&mh]) }.expect_err("iflush on a failed comm");
    assert_eq!(e.message, failure.message, "iflush: the comm's error");
    assert!(rcomm(&r).in_flight() <= in_flight, "a failed comm takes no request");
    api::dereg_mr(mh).unwrap();
    drop(r);
    drop(s);
    assert_eq!(
        live_objects(),
        before,
        "(QPs, CQs, MRs) left after closing a failed comm"
    );
    api::finalize(ctx).unwrap();
}

/// Sender side: the receiver closes while a 32 MiB send is in flight; the sender's comm fails
/// (its test, or a later isend, reports the error), and from then on every isend and test
/// returns that error; closing the failed comm frees everything. A posted send to a closed
/// receiver fails when its transport retries run out, so the child runs with short ones
/// (NCCL_IB_TIMEOUT=14, NCCL_IB_RETRY_CNT=3: about 0.3 s, instead of about 35 s by default).
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn every_call_on_a_failed_send_comm_returns_its_error() {
    if child(
        "every_call_on_a_failed_send_comm_returns_its_error",
        failed_send_comm_child,
    ) {
        return;
    }
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    run_child(
        "every_call_on_a_failed_send_comm_returns_its_error",
        "127.0.41.202",
        &[("NCCL_IB_TIMEOUT", "14"), ("NCCL_IB_RETRY_CNT", "3")],
    );
}

/// The child of [`every_call_on_a_failed_send_comm_returns_its_error`].
fn failed_send_comm_child() {
    let ctx = setup();
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let before = live_objects();
    let (s, r) = pair(&ctx);
    let size = 32 << 20;
    let src = vec![3u8; size];
    let dst = vec![0u8; size];
    let (smh, rmh) = (reg(&*s, &src), reg(&*r, &dst));
    // Two receives: the second one's CTS lets a second isend start after the first failed.
    for tag in [1, 2] {
        // SAFETY: live handles; `dst` outlives the comm.
        unsafe { api::irecv(&r, &[dst.as_ptr() as usize], &[size], &[tag], &[&rmh], false) }
            .unwrap()
            .expect("a fresh comm takes two receives");
    }
    let sq = isend_retry(&s, src.as_ptr() as usize, size, 1, &smh);
    drop(r);
    api::dereg_mr(rmh).unwrap();
    let mut done = false;
    let failure = first_error("the send to a closed receiver", || {
        if !done {
            // SAFETY: a send request not reported done.
            match unsafe { api::test(sq, std::ptr::null_mut()) } {
                Ok(false) => return None,
                Ok(true) => done = true, // it landed before the close: the next send fails
                Err(e) => return Some(e),
            }
        }
        // SAFETY: live handle; `src` is registered in `smh`.
        match unsafe { api::isend(&s, src.as_ptr() as usize, size, 2, &smh) } {
            Ok(None) => None,
            Ok(Some(q)) => {
                let mut e = None;
                let end = deadline();
                while e.is_none() {
                    // SAFETY: a send request not reported done.
                    match unsafe { api::test(q, std::ptr::null_mut()) } {
                        Ok(false) => assert!(Instant::now() < end, "the second send neither completed nor failed"),
                        Ok(true) => panic!("a send to a closed receiver completed"),
                        Err(x) => e = Some(x),
                    }
                }
                e
            }
            Err(e) => Some(e),
        }
    });
    // Retries exhausted (the data write) or the side channel closed: either names the peer.
    assert!(failure.message.contains("peer"), "{}", failure.message);
    for tag in [2, 3] {
        // SAFETY: as above.
        let e = unsafe { api::isend(&s, src.as_ptr() as usize, 100, tag, &smh) }.expect_err("isend on a failed comm");
        assert_eq!(e.message, failure.message, "isend: the comm's error");
    }
    api::dereg_mr(smh).unwrap();
    drop(s);
    assert_eq!(
        live_objects(),
        before,
        "(QPs, CQs, MRs) left after closing a failed send comm"
    );
    api::finalize(ctx).unwrap();
}

/// Both ends closed at once with requests in flight on each: 8 sends of 1 MiB matched to 8
/// receives, and 4 more receives no send matches, none ever tested. No hang, no crash, and
/// every QP, CQ, MR and fd is freed.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn close_with_requests_in_flight_on_both_sides() {
    let ctx = setup();
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    // Warm up (the first comm opens long-lived fds).
    {
        let (s, r) = pair(&ctx);
        transfer(&s, &r, 10, 10, 1);
    }
    let (before, fds_before) = (live_objects(), open_fds());
    for round in 0..3 {
        let (s, r) = pair(&ctx);
        let size = 1 << 20;
        let src = vec![round as u8; 12 * size];
        let dst = vec![0u8; 12 * size];
        let (smh, rmh) = (reg(&*s, &src), reg(&*r, &dst));
        for k in 0..12 {
            // SAFETY: live handles; `dst` outlives the comm.
            unsafe {
                api::irecv(
                    &r,
                    &[dst.as_ptr() as usize + k * size],
                    &[size],
                    &[k as i32],
                    &[&rmh],
                    false,
                )
            }
            .unwrap()
            .expect("a fresh comm takes 12 receives");
        }
        for k in 0..8 {
            isend_retry(&s, src.as_ptr() as usize + k * size, size, k as i32, &smh);
        }
        assert!(rcomm(&r).in_flight() == 12, "12 receives in flight at the close");
        if round % 2 == 0 {
            drop(s);
            drop(r);
        } else {
            drop(r);
            drop(s);
        }
        api::dereg_mr(smh).unwrap();
        api::dereg_mr(rmh).unwrap();
    }
    assert_eq!(
        live_objects(),
        before,
        "(QPs, CQs, MRs) left after closing both ends mid-flight"
    );
    assert_fds_back(&fds_before, "fds left after closing both ends mid-flight");
    api::finalize(ctx).unwrap();
}

/// `len` bytes of anonymous memory that reserve no swap (MAP_NORESERVE): pages are only made
/// when written, and read as zeros before.
struct Sparse {
    p: *mut u8,
    len: usize,
}

impl Sparse {
    fn new(len: usize) -> Sparse {
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "mmap of {len} bytes");
        Sparse { p: p.cast(), len }
    }
    fn addr(&self) -> usize {
        self.p as usize
    }
    fn byte(&self, off: usize) -> u8 {
        assert!(off < self.len);
        // SAFETY: inside the mapping.
        unsafe { self.p.add(off).read_volatile() }
    }
    fn set(&self, off: usize, v: u8) {
        assert!(off < self.len);
        // SAFETY: inside the mapping, which only this test uses.
        unsafe { self.p.add(off).write_volatile(v) }
    }
}

impl Drop for Sparse {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.p.cast(), self.len) };
    }
}

/// Messages past 2 GiB and past 4 GiB (2.5 GiB and 4.5 GiB, one at a time, sparse memory: only
/// the probe bytes of the source are ever written; softroce copies every byte, so the receive
/// buffer is made for real, 4.5 GiB at most). Both lie within the maxP2pBytes the properties
/// report (7 pieces of the port's max_msg_sz, at most 1 GiB each: 7 GiB) and past one WR's
/// max_msg_sz (softroce's is 2 GiB, as mlx5's), so they go in pieces: irecv and isend accept
/// them, every probe byte (one per MiB, plus the last byte) lands, and each end's test()
/// reports the size saturated to i32::MAX (an int cannot hold it), never a negative or wrapped
/// one (it failed before: one WR past max_msg_sz, irecv capped at 4 GiB).
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn messages_of_2_5_and_4_5_gib() {
    let ctx = setup();
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut failures = vec![];
    for size in [(5usize << 30) / 2, (9usize << 30) / 2] {
        // A comm of its own per size: a failure of one does not hide the other's.
        let (s, r) = pair(&ctx);
        let src = Sparse::new(size);
        let dst = Sparse::new(size);
        let probes: Vec<usize> = (0..size).step_by(1 << 20).chain([size - 1]).collect();
        for (i, &off) in probes.iter().enumerate() {
            src.set(off, (i as u8) | 1);
        }
        let smh =
            api::reg_mr(&device_of(&*s), src.addr(), size, api::MemKind::Host, None).expect("regMr of the source");
        let rmh =
            api::reg_mr(&device_of(&*r), dst.addr(), size, api::MemKind::Host, None).expect("regMr of the destination");
        // SAFETY: live handles; the mappings outlive the requests.
        let rq = match unsafe { api::irecv(&r, &[dst.addr()], &[size], &[9], &[&rmh], false) } {
            Ok(Some(q)) => q,
            Ok(None) => panic!("a fresh comm refused a receive"),
            Err(e) => {
                failures.push(format!("irecv of {size} bytes: {}", e.message));
                api::dereg_mr(smh).unwrap();
                api::dereg_mr(rmh).unwrap();
                continue;
            }
        };
        let sq = isend_retry(&s, src.addr(), size, 9, &smh);
        let (mut ss, mut rs) = ([-1i32], [-1i32]);
        // Bounded by softroce's copy rate, not a fixed number of polls.
        let end = Instant::now() + Duration::from_secs(300);
        let mut failed = false;
        for (q, out, end_name) in [(sq, &mut ss, "sender"), (rq, &mut rs, "receiver")] {
            // SAFETY: requests not reported done; `out` has room for one size.
            loop {
                match unsafe { api::test(q, out.as_mut_ptr()) } {
                    Ok(true) => break,
                    Ok(false) => assert!(Instant::now() < end, "{size}-byte message did not complete"),
                    Err(e) => {
                        failures.push(format!("{end_name} of {size} bytes: test() failed: {}", e.message));
                        failed = true;
                        break;
                    }
                }
            }
            if failed {
                break;
            }
        }
        if failed {
            api::dereg_mr(smh).unwrap();
            api::dereg_mr(rmh).unwrap();
            continue;
        }
        let want = size.min(i32::MAX as usize) as i32;
        if ss[0] != want {
            failures.push(format!("sender of {size} bytes reports {} (want {want})", ss[0]));
        }
        if rs[0] != want {
            failures.push(format!("receiver of {size} bytes reports {} (want {want})", rs[0]));
        }
        let wrong = probes
            .iter()
            .enumerate()
            .filter(|&(i, &off)| dst.byte(off) != (i as u8) | 1)
            .count();
        if wrong > 0 {
            failures.push(format!(
                "{wrong} of {} probe bytes of the {size}-byte message wrong",
                probes.len()
            ));
        }
        api::dereg_mr(smh).unwrap();
        api::dereg_mr(rmh).unwrap();
    }
    api::finalize(ctx).unwrap();
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Memory the NIC cannot pin (here a reserved range, as a GPU buffer is to a NIC without a GPU
/// path: CUDA reserves its addresses without access) fails regMr at once with a system error
/// that says what to check, for host and CUDA registrations alike, and so does a DMA-BUF it
/// cannot import; the comm goes on working.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn a_buffer_the_nic_cannot_reach_fails_registration_with_a_hint() {
    let ctx = setup();
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let (s, r) = pair(&ctx);
    let len = 8192;
    // SAFETY: a fresh anonymous mapping with no access, unmapped below.
    let reserved = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(reserved, libc::MAP_FAILED);
    for kind in [api::MemKind::Host, api::MemKind::Cuda] {
        let Err(err) = api::reg_mr(&device_of(&*s), reserved as usize, len, kind, None) else {
            panic!("regMr of a reserved range ({kind:?}) succeeded");
        };
        assert_eq!(err.result_code(), nccl_net_ferroce::error::code::SYSTEM_ERROR, "{err}");
        assert!(err.message.contains("Bad address"), "{err}");
        assert!(
            err.message.contains("nvidia_peermem") && err.message.contains("NCCL_NET_GDR_LEVEL"),
            "{err}"
        );
    }
    // A DMA-BUF the NIC cannot import (here an eventfd, which softroce cannot map, as it cannot
    // map a GPU's dma-buf): the error names the way out.
    // SAFETY: a fresh eventfd, closed below.
    let efd = unsafe { libc::eventfd(0, 0) };
    assert!(efd >= 0);
    let Err(err) = api::reg_mr(
        &device_of(&*s),
        reserved as usize,
        len,
        api::MemKind::Cuda,
        Some((efd, 0)),
    ) else {
        panic!("regMrDmaBuf of an eventfd succeeded");
    };
    // SAFETY: the eventfd made above.
    unsafe { libc::close(efd) };
    assert_eq!(err.result_code(), nccl_net_ferroce::error::code::SYSTEM_ERROR, "{err}");
    assert!(
        err.message.contains("ibv_reg_dmabuf_mr")
            && err.message.contains("cannot import this DMA-BUF")
            && err.message.contains("NCCL_DMABUF_ENABLE=0"),
        "{err}"
    );
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(reserved, len) };
    let buf = vec![1u8; 4096];
    let mh = reg(&*r, &buf);
    api::dereg_mr(mh).unwrap();
    drop((s, r));
}

/// A request NCCL tests again after it was reported done is an error naming that (its slot is
/// free, perhaps already reused), never a completion of whatever holds the slot now.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn a_request_tested_again_after_done_is_an_error() {
    let ctx = setup();
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let (s, r) = pair(&ctx);
    let src = vec![5u8; 64];
    let mut dst = vec![0u8; 64];
    let (smh, rmh) = (reg(&*s, &src), reg(&*r, &dst));
    // SAFETY: handles live; buffers registered and alive until completion.
    let rreq = unsafe { api::irecv(&r, &[dst.as_mut_ptr() as usize], &[64], &[3], &[&rmh], false) }
        .unwrap()
        .expect("a receive slot");
    let end = deadline();
    let sreq = loop {
        // SAFETY: as above.
        if let Some(q) = unsafe { api::isend(&s, src.as_ptr() as usize, 64, 3, &smh) }.unwrap() {
            break q;
        }
        assert!(Instant::now() < end, "isend never matched");
    };
    let mut sizes = [-1i32];
    wait(sreq, &mut sizes);
    wait(rreq, &mut sizes);
    for (req, what) in [(sreq, "send"), (rreq, "receive")] {
        // SAFETY: the request points into its comm's request table, alive with the comm.
        let again = unsafe { api::test(req, sizes.as_mut_ptr()) };
        let e = again.expect_err(what);
        assert!(e.message.contains("not in flight"), "{what}: {}", e.message);
    }
    close_all(ctx, s, r, [smh, rmh]);
}

/// The send comm behind a handle, to read its counters (this thread drives its data path).
fn scomm(s: &SendHandle) -> &nccl_net_ferroce::transport::SendComm {
    // SAFETY: as rcomm's.
    unsafe { s.data_path() }
}

/// An isend that finds no CTS returns no request without polling the CQ, as NCCL's isend
/// (issue 28): the receiver's CTS lands in the FIFO ring's memory, which the next isend reads.
/// Counted with the comm's CQ polls, so no timing is involved: a thousand isends before the
/// receive is posted, then the isends until its CTS is found, poll nothing.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn isend_without_a_cts_does_not_poll_the_cq() {
    let ctx = setup();
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let (s, r) = pair(&ctx);
    // Past the eager path's largest message: only its CTS lets it go.
    let size = 64 << 10;
    let mut src = vec![0u8; size];
    fill(&mut src, 28);
    let mut dst = vec![0xeeu8; size];
    let (smh, rmh) = (reg(&*s, &src), reg(&*r, &dst));
    let before = scomm(&s).cq_polls();
    for _ in 0..1000 {
        // SAFETY: live handle; the buffer stays registered and alive.
        let q = unsafe { api::isend(&s, src.as_ptr() as usize, size, 28, &smh) }.unwrap();
        assert!(q.is_none(), "no receive posted, yet the send started");
    }
    assert_eq!(scomm(&s).cq_polls() - before, 0, "CQ polls by isends that found no CTS");
    // SAFETY: handles live; buffers registered and alive until completion.
    let rreq = unsafe { api::irecv(&r, &[dst.as_mut_ptr() as usize], &[size], &[28], &[&rmh], false) }
        .unwrap()
        .expect("a receive slot");
    let sreq = isend_retry(&s, src.as_ptr() as usize, size, 28, &smh);
    assert_eq!(
        scomm(&s).cq_polls() - before,
        0,
        "CQ polls by the isends until the CTS was there"
    );
    let (mut ss, mut rs) = ([-1i32], [-1i32]);
    wait(sreq, &mut ss);
    wait(rreq, &mut rs);
    assert_eq!((ss[0] as usize, rs[0] as usize), (size, size));
    assert_received(&dst, &src, format_args!("message of {size} bytes"));
    close_all(ctx, s, r, [smh, rmh]);
}
