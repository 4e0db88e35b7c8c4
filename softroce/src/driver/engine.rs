//! The progress engine: one background thread per device instance.
//!
//! It owns the receive side of the device's UDP socket, verifies and strips
//! the ICRC, demultiplexes on BTH.DestQP, feeds [`QpCore::handle_packet`],
//! runs the core timers and drains every touched QP: packets to the socket
//! (ICRC appended), completions to the CQs (waking completion channels),
//! async events to the owning context. Posting threads drain their own QP
//! directly after `post_send` (lowest latency) — except small messages on a
//! QP with packets outstanding, which are left to this thread's next batch
//! or to the posting thread's next empty CQ poll (`SOFTROCE_DEFER`) — and wake this thread only when they armed a timer
//! earlier than the one it sleeps on. While packets arrive, the thread polls
//! its socket for `SOFTROCE_SPIN_US` before blocking. An application thread
//! whose CQ poll finds nothing receives the next batch itself when this
//! thread is not receiving ([`receive_inline`], `SOFTROCE_INLINE_RX`): on a
//! host with few cores the thread that would spin does the NIC's work.
//!
//! All signals are blocked in the engine thread (perftest uses SIGALRM).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::activity;
use super::addr::gid_to_ipv4;
use super::clock::{earliest, now};
use super::cq::Wc;
use super::device::Device;
use super::engine_state::{Rx, RX_BATCH};
use super::event::ibv_event_of;
use super::inject::Fate;
use super::link::LinkLayer;
use super::link_io::{self, checked_body, RxConfig};
use super::mem::PdMemory;
use super::qp::QpShared;
use super::tx::Tx;
use super::udp::{Ip, RecvMeta};
use crate::config;
use crate::proto::{self, Errno, Instant, ModifyAttrs, QpCore, QpState, RecvWr, SendWr};
use crate::wire::{icrc, BthPacket, OpCode};

/// Starts the engine thread of `dev`, with every signal blocked.
pub fn start(dev: Arc<Device>) -> std::io::Result<()> {
    // Block every signal while spawning so the thread starts with all blocked.
    // SAFETY: sigset manipulation on local, initialised sets.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid sigset pointers.
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
    }
    let r = std::thread::Builder::new()
        .name(format!("softroce{}", dev.index))
        .spawn(move || supervise(dev));
    // SAFETY: restores the caller's mask.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    r.map(|_| ())
}

/// The memory the core of `qp` reaches: its PD's MRs and its SRQ.
fn memory_of<'a>(dev: &'a Device, qp: &'a QpShared) -> PdMemory<'a> {
    PdMemory {
        mrs: &dev.mrs,
        pd: qp.pd,
        srq: qp.srq.as_deref(),
    }
}

/// Drains one QP: queues every due packet on `tx` (the caller flushes),
/// delivers completions and events. Called with the QP's core locked.
pub fn drain_locked(dev: &Device, qp: &QpShared, core: &mut QpCore, now: Instant, tx: &mut Tx) {
    let mut mem = memory_of(dev, qp);
    loop {
        let mut scratch = std::mem::take(&mut tx.scratch);
        // The time each packet leaves, not `now` (when the caller began): the core counts its
        // probe from the packet that asks for the ACK, and a long burst, or a thread
        // descheduled halfway through one, takes milliseconds.
        let meta = core.poll_transmit(super::clock::now(), &mut mem, &mut scratch);
        tx.scratch = scratch;
        let Some(meta) = meta else { break };
        let len = meta.len.min(tx.scratch.len());
        if dev.link == LinkLayer::Infiniband {
            link_io::transmit_ib(dev, qp, &meta, len, tx);
            continue;
        }
        let Some(dst) = gid_to_ipv4(&meta.dgid) else {
            continue; // IPv6 GIDs are not routable by this device
        };
        let ip = Ip {
            ttl: meta.hop_limit,
            tos: meta.traffic_class,
        };
        qp.counters.packet_sent(len + icrc::ICRC_LEN, meta.is_response);
        tx.push(&dev.sock, len, dst, ip);
    }
    qp.counters.retransmits_now(core.stats().retransmits);
    // Packets (ACKs above all) leave before the application can see the
    // completions: a peer that exits right after its last completion must
    // not take our final ACK with it.
    tx.flush(&dev.sock);
    deliver_completions(qp, core, now);
    while let Some(ev) = core.poll_event() {
        // 0: the QP is being destroyed (ibv_destroy_qp clears it under this same core lock), so
        // no event may name it any more.
        let element = qp.ibv_ptr.load(Ordering::Acquire);
        if element != 0 {
            qp.async_q.push(ibv_event_of(ev), element);
        }
    }
}

/// Moves the core's completions to the QP's CQs, 16 at a time per CQ.
fn deliver_completions(qp: &QpShared, core: &mut QpCore, now: Instant) {
    let mut send = [Wc::default(); 16];
    let mut recv = [Wc::default(); 16];
    let (mut ns, mut nr) = (0, 0);
    while let Some(c) = core.poll_completion() {
        let wc = Wc {
            wr_id: c.wr_id,
            status: c.status,
            opcode: c.opcode,
            vendor_err: 0,
            byte_len: c.byte_len,
            imm_data: c.imm_data.unwrap_or(0),
            qp_num: c.qp_num,
            src_qp: c.src_qp,
            wc_flags: c.wc_flags,
            solicited: c.solicited,
            ts: now.as_nanos(),
        };
        match c.queue {
            proto::WcQueue::Send => {
                send[ns] = wc;
                ns += 1;
                if ns == send.len() {
                    qp.send_cq.push_many(&send[..ns]);
                    ns = 0;
                }
            }
            proto::WcQueue::Recv => {
                recv[nr] = wc;
                nr += 1;
                if nr == recv.len() {
                    qp.recv_cq.push_many(&recv[..nr]);
                    nr = 0;
                }
            }
        }
    }
    qp.send_cq.push_many(&send[..ns]);
    qp.recv_cq.push_many(&recv[..nr]);
}

/// Runs `f` with this thread's transmit state and flushes it afterwards
/// (for verbs called by application threads).
pub fn with_tx<R>(dev: &Device, f: impl FnOnce(&mut Tx) -> R) -> R {
    thread_local! {
        static TX: std::cell::RefCell<Tx> = std::cell::RefCell::new(Tx::new());
    }
    TX.with(|t| match t.try_borrow_mut() {
        Ok(mut tx) => {
            let r = f(&mut tx);
            tx.flush(&dev.sock);
            r
        }
        Err(_) => {
            let mut tx = Tx::new();
            let r = f(&mut tx);
            tx.flush(&dev.sock);
            r
        }
    })
}

/// Drains `qp` from an application thread (its own transmit state) and
/// tells the engine about the timer the core now waits for.
fn drain_and_note(dev: &Device, qp: &QpShared, mut core: std::sync::MutexGuard<'_, QpCore>, t: Instant) {
    with_tx(dev, |tx| drain_locked(dev, qp, &mut core, t, tx));
    let deadline = core.poll_timeout();
    drop(core);
    dev.engine.note_deadline(deadline);
}

/// `ibv_modify_qp` on the core; transmits what became due. `on_state` gets
/// the new state under the core lock (which serialises modify calls).
pub fn modify_qp(
    dev: &Device,
    qp: &QpShared,
    attrs: &ModifyAttrs,
    on_state: impl FnOnce(QpState),
) -> Result<(), Errno> {
    let t = now();
    let mut core = qp.lock_core();
    core.modify(attrs)?;
    if core.state() == QpState::Reset {
        // Completions reach the CQs only under this core lock, so none of the old
        // incarnation can follow this clean.
        qp.send_cq.clean_qp(qp.qpn);
        qp.recv_cq.clean_qp(qp.qpn);
    }
    on_state(core.state());
    drain_and_note(dev, qp, core, t);
    Ok(())
}

/// The NIC found an error on `qp` (a fault command): the QP enters ERR raising `event` (none
/// when the whole device died), and its flushed work requests complete at once.
pub fn fail_qp(dev: &Device, qp: &QpShared, event: Option<proto::AsyncEvent>) {
    let mut core = qp.lock_core();
    core.enter_error(event);
    drain_and_note(dev, qp, core, now());
}

/// Messages up to this size may be left to the engine when the QP is busy.
const DEFER_MAX_LEN: u64 = 4096;

/// Posts converted WRs in order, stopping at the first the core refuses;
/// transmits what became due (or leaves small messages on a busy QP to the
/// engine). Returns 0 or the errno and the index of the refused WR.
pub fn post_send(dev: &Device, qp: &Arc<QpShared>, wrs: impl IntoIterator<Item = Result<SendWr, i32>>) -> (i32, usize) {
    if dev.sock.faults.is_dead() {
        return (libc::EIO, 0); // as mlx5 in the fatal state
    }
    let t = now();
    let mut core = qp.lock_core();
    let busy = core.poll_timeout().is_some();
    let mut res = (0, 0);
    let mut small = true;
    for (i, w) in wrs.into_iter().enumerate() {
        if let Ok(sw) = &w {
            small &= sw.length() <= DEFER_MAX_LEN;
        }
        if let Err(e) = w.and_then(|sw| core.post_send(t, sw).map_err(|e| e.errno().0)) {
            res = (e, i);
            break;
        }
    }
    if busy && small && config::defer() {
        // Packets are outstanding, so an answer will wake the engine, which
        // then sends these together with whatever else is due (one GSO
        // datagram for a run of small packets instead of a syscall each).
        dev.engine.defer(qp);
        let deadline = core.poll_timeout();
        drop(core);
        dev.engine.note_deadline(deadline);
        // ... or, if that answer is a round trip away, this thread's next
        // empty CQ poll does (see `idle::note_deferred`).
        super::idle::note_deferred();
    } else {
        drain_and_note(dev, qp, core, t);
    }
    res
}

/// Posts receive WQEs in order, stopping at the first refused; delivers
/// what became due (in ERR they complete at once, flushed). Returns 0 or
/// the errno and the index of the refused WR.
pub fn post_recv(dev: &Device, qp: &QpShared, wrs: impl IntoIterator<Item = Result<RecvWr, i32>>) -> (i32, usize) {
    if dev.sock.faults.is_dead() {
        return (libc::EIO, 0);
    }
    let mut core = qp.lock_core();
    let mut res = (0, 0);
    for (i, w) in wrs.into_iter().enumerate() {
        if let Err(e) = w.and_then(|rw| core.post_recv(rw).map_err(|e| e.errno().0)) {
            res = (e, i);
            break;
        }
    }
    // Receives can unblock an RNR-waiting peer only via its retry; but in ERR
    // they complete at once (flush), so deliver completions now.
    drain_and_note(dev, qp, core, now());
    res
}

/// Runs the engine loop; a panic (a bug: nothing in it should panic on
/// packet data) is reported and the loop restarted, so the device keeps
/// working for its other QPs. Poisoned QP locks are taken over as they are.
fn supervise(dev: Arc<Device>) {
    loop {
        let d = dev.clone();
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(d))).is_ok() {
            return;
        }
        eprintln!("softroce: {} progress engine panicked; restarting it", dev.name);
    }
}

fn run(dev: Arc<Device>) {
    let mut tx = Tx::new();
    let spin = config::spin_us() * 1000;
    let engine_rx = config::engine_rx();
    // Earliest known timer (ns). It may be stale-early (a timer was disarmed
    // since), which only costs a scan; it is never late: every QP event that
    // can arm a timer is seen here (own draining) or noted (other threads).
    let mut next = u64::MAX;
    loop {
        next = run_timers(&dev, next, &mut tx);
        next = publish_deadline(&dev, next);
        wait_for_work(&dev, next, spin, engine_rx);
        // Step 3: receive everything queued, in batches.
        if engine_rx {
            if let Some(d) = engine_receive(&dev) {
                next = next.min(d.as_nanos());
            }
        }
    }
}

/// Step 1 of the loop, deferred work, then timers: scans every QP only when
/// the earliest known deadline (`next`, ns) passed or the QP set changed.
/// Returns the new earliest deadline.
fn run_timers(dev: &Device, mut next: u64, tx: &mut Tx) -> u64 {
    let eng = &dev.engine;
    let t = now();
    if let Some(d) = drain_deferred(dev, t, tx) {
        next = next.min(d.as_nanos());
    }
    next = next.min(eng.noted.swap(u64::MAX, Ordering::AcqRel));
    if eng.rescan.swap(false, Ordering::AcqRel) || t.as_nanos() >= next {
        next = u64::MAX;
        for qp in &eng.all_qps() {
            let mut core = qp.lock_core();
            let mut due = false;
            if let Some(d) = core.poll_timeout() {
                if d <= t {
                    core.handle_timeout(t);
                    due = true;
                }
            }
            if due {
                drain_locked(dev, qp, &mut core, t, tx);
            }
            if let Some(d) = core.poll_timeout() {
                next = next.min(d.as_nanos());
            }
        }
    }
    tx.flush(&dev.sock);
    next
}

/// Publishes the deadline the engine will sleep on, then looks at `noted`
/// again: a posting thread stores `noted` before it reads `sleep_until`, so
/// (SeqCst on both sides) either it kicks us or we see its deadline.
fn publish_deadline(dev: &Device, mut next: u64) -> u64 {
    let eng = &dev.engine;
    eng.sleep_until.store(next, Ordering::SeqCst);
    let late = eng.noted.load(Ordering::SeqCst);
    if late < next {
        next = late;
        eng.sleep_until.store(next, Ordering::SeqCst);
    }
    next
}

/// Step 2 of the loop: waits for packets, a kick, or the deadline `next`
/// (ns; at most 10 ms, as a safety net).
fn wait_for_work(dev: &Device, next: u64, spin: u64, engine_rx: bool) {
    let eng = &dev.engine;
    let timeout_ms: i32 = if next == u64::MAX {
        10
    } else {
        let now_ns = now().as_nanos();
        if next <= now_ns {
            0
        } else {
            (next - now_ns).div_ceil(1_000_000).min(10) as i32
        }
    };
    let mut fds = [
        libc::pollfd {
            // poll(2) skips a negative fd: without engine receiving, the
            // socket is left to the polling application threads.
            fd: if engine_rx { dev.sock.fd() } else { -1 },
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: eng.wake_fd,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // While traffic is flowing, poll without sleeping for up to `spin`
    // (yielding between polls) before blocking: a blocked thread's wake-up
    // costs tens of microseconds on a busy host.
    let mut ready = 0;
    if spin != 0 && now().as_nanos().saturating_sub(eng.last_rx.load(Ordering::Relaxed)) < spin * 4 {
        let until = now().as_nanos() + spin;
        while now().as_nanos() < until && !eng.has_dirty.load(Ordering::Acquire) {
            // SAFETY: fds is a live array of two pollfds.
            ready = unsafe { libc::poll(fds.as_mut_ptr(), 2, 0) };
            if ready != 0 {
                break;
            }
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
        }
    }
    if ready == 0 {
        // SAFETY: fds is a live array of two pollfds.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
    }
    eng.sleep_until.store(0, Ordering::Release);
    if fds[1].revents != 0 {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64.
        unsafe { libc::read(eng.wake_fd, &mut v as *mut u64 as *mut libc::c_void, 8) };
    }
}

/// The engine's receiving: everything queued, unless an application thread
/// is receiving right now (`receive_inline`, one batch at most): then it
/// does not sleep on the lock (a futex wake-up costs more than the batch)
/// and looks at the socket again. Returns the earliest timer armed.
fn engine_receive(dev: &Device) -> Option<Instant> {
    let rx = match dev.engine.rx.try_lock() {
        Ok(rx) => Some(rx),
        Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    };
    match rx {
        Some(mut rx) => receive(dev, &mut rx, usize::MAX, true).1,
        None => {
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
            None
        }
    }
}

/// Receives and handles queued datagrams, at most `max_batches` batches
/// (stops early when the socket has no more); returns how many datagrams it
/// handled and the earliest timer the handled QPs armed. Only the engine's own
/// receiving (`by_engine`) counts as traffic for its spin before blocking: when
/// pollers take the datagrams, the engine has nothing to spin for.
fn receive(dev: &Device, rx: &mut Rx, max_batches: usize, by_engine: bool) -> (usize, Option<Instant>) {
    let eng = &dev.engine;
    let cfg = RxConfig {
        check: config::icrc_check(),
        debug: config::debug(),
    };
    let mut next: Option<Instant> = None;
    let mut handled = 0;
    for _ in 0..max_batches {
        let n = dev.sock.recv_batch(&mut rx.bufs, &mut rx.meta).unwrap_or_default();
        if n == 0 {
            break;
        }
        handled += n;
        let t = now();
        if by_engine {
            eng.last_rx.store(t.as_nanos(), Ordering::Relaxed);
        }
        let mut landed_write = false;
        for i in 0..n {
            landed_write |= handle_datagram(dev, rx, i, t, &cfg);
        }
        if let Some(held) = rx.inject.take_held() {
            landed_write |= deliver(dev, &mut rx.touched, t, &held);
        }
        // Drain after each batch: ACKs coalesce across the batch.
        let t = now();
        let Rx { touched, tx, .. } = &mut *rx;
        for qp in touched.drain(..) {
            let mut core = qp.lock_core();
            drain_locked(dev, &qp, &mut core, t, tx);
            if let Some(d) = core.poll_timeout() {
                next = earliest(next, Some(d));
            }
        }
        tx.flush(&dev.sock);
        if landed_write {
            activity::ring();
        }
        if n < RX_BATCH {
            break;
        }
    }
    if handled > 0 {
        rx.inject.report_if_due(now().as_nanos());
    }
    (handled, next)
}

/// Handles the packets of datagram `i` of the batch in `rx` (several when
/// GRO coalesced them); returns whether one of them ended an inbound RDMA
/// WRITE (memory an application may be watching changed; completions ring
/// on their own).
fn handle_datagram(dev: &Device, rx: &mut Rx, i: usize, t: Instant, cfg: &RxConfig) -> bool {
    let Rx {
        bufs,
        meta,
        inject,
        touched,
        bad_icrc,
        ..
    } = rx;
    let m: RecvMeta = meta[i];
    if m.src.ip().is_unspecified() || m.seg == 0 {
        return false;
    }
    let coalesced = m.len > m.seg;
    let mut landed_write = false;
    for (j, pkt) in bufs[i][..m.len].chunks(m.seg).enumerate() {
        if inject.lose() {
            continue;
        }
        if pkt.len() < crate::wire::bth::HEADER_LEN + icrc::ICRC_LEN {
            continue;
        }
        let Some(body) = checked_body(dev, pkt, j, coalesced, m.src, cfg, bad_icrc) else {
            continue;
        };
        match inject.fate() {
            Fate::Hold => {
                inject.hold(body);
                continue;
            }
            Fate::Twice => {
                landed_write |= deliver(dev, touched, t, body);
                landed_write |= deliver(dev, touched, t, body);
            }
            Fate::Deliver => landed_write |= deliver(dev, touched, t, body),
        }
        if let Some(held) = inject.take_held() {
            landed_write |= deliver(dev, touched, t, &held);
        }
    }
    landed_write
}

/// Hands one checked packet (ICRC stripped) to its QP, which joins `touched`;
/// returns whether it ended an inbound RDMA WRITE.
fn deliver(dev: &Device, touched: &mut Vec<Arc<QpShared>>, t: Instant, body: &[u8]) -> bool {
    let Ok(bth) = BthPacket::new_checked(body) else {
        return false;
    };
    let qpn = bth.dest_qp();
    let Some(qp) = dev.engine.qp(qpn) else { return false };
    qp.lock_core().handle_packet(t, body, &mut memory_of(dev, &qp));
    if !touched.iter().any(|q| q.qpn == qpn) {
        touched.push(qp);
    }
    matches!(bth.opcode(), OpCode::WriteLast | OpCode::WriteOnly)
}

/// Sends what posting threads left for the engine (deferred small messages);
/// returns the earliest timer those QPs armed.
fn drain_deferred(dev: &Device, t: Instant, tx: &mut Tx) -> Option<Instant> {
    let eng = &dev.engine;
    if !eng.has_dirty.load(Ordering::Acquire) || !eng.has_dirty.swap(false, Ordering::AcqRel) {
        return None;
    }
    let dirty = std::mem::take(&mut *eng.dirty.lock().unwrap_or_else(|e| e.into_inner()));
    let mut next: Option<Instant> = None;
    for qp in &dirty {
        let mut core = qp.lock_core();
        qp.dirty.store(false, Ordering::Release);
        drain_locked(dev, qp, &mut core, t, tx);
        if let Some(d) = core.poll_timeout() {
            next = earliest(next, Some(d));
        }
    }
    next
}

/// For an application thread whose CQ poll found nothing: if no other thread
/// is receiving, receive and handle one batch of queued datagrams here (the
/// NIC's work done by a thread that would otherwise spin, instead of by the
/// engine thread competing with it for a CPU). Returns whether it did.
pub fn receive_inline(dev: &Device) -> bool {
    let Ok(mut rx) = dev.engine.rx.try_lock() else {
        return false;
    };
    let (handled, next) = receive(dev, &mut rx, 1, false);
    // Deferred sends wait for "the next answer"; when this thread took that
    // answer off the socket, the engine may not look soon: send them here.
    let next = earliest(next, drain_deferred(dev, now(), &mut rx.tx));
    drop(rx);
    // Timers armed here must reach the engine, which sleeps on its own list.
    dev.engine.note_deadline(next);
    handled > 0
}
