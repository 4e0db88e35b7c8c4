//! Verbs work counters: what the application asks of the NIC (post calls, work requests,
//! signaled and inline ones, CQ polls) and what the NIC sends for it (packets, bytes,
//! retransmissions), per process and per QP. On real hardware the same work costs doorbells,
//! WQE fetches and CQE writes, so these are the figures that carry over from softroce.
//!
//! Every counter is a relaxed atomic, bumped by a one-line hook in `verbs` (posts, polls) or in
//! the engine (packets); nothing waits on them. They are never reset: a reader takes a snapshot
//! before and after what it measures. Readers: `softroce_counters_get` (in-process, the C struct
//! in `softroce/include/softroce_counters.h`) and `softroce-ctl ADDR counters` (process totals
//! and one line per live QP of the device).
//!
//! Retransmissions are the core's own count ([`crate::proto::QpStats::retransmits`]), carried
//! over after each drain of the QP.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::proto::{SendWr, WrOpcode};

/// Version of [`CountersRepr`]; bumped when a field is added (fields are only ever appended).
pub const COUNTERS_VERSION: u32 = 1;

/// The counters one QP (or the whole process) keeps.
#[derive(Default)]
pub struct Counters {
    post_send_calls: AtomicU64,
    send_wrs: AtomicU64,
    signaled_wrs: AtomicU64,
    inline_wrs: AtomicU64,
    inline_bytes: AtomicU64,
    /// Send WRs by opcode class: RDMA WRITE, WRITE with immediate, SEND (with or without
    /// immediate), READ, atomics.
    write_wrs: AtomicU64,
    write_imm_wrs: AtomicU64,
    send_op_wrs: AtomicU64,
    read_wrs: AtomicU64,
    atomic_wrs: AtomicU64,
    post_recv_calls: AtomicU64,
    recv_wrs: AtomicU64,
    /// `ibv_poll_cq` calls (and `ibv_start_poll`), those that found nothing, CQEs handed out.
    poll_cq_calls: AtomicU64,
    poll_cq_empty: AtomicU64,
    cqes: AtomicU64,
    /// Every packet sent (requests and responses), their bytes (BTH to ICRC), the responses
    /// among them (ACK, NAK, READ response, atomic ACK), request packets sent again.
    tx_packets: AtomicU64,
    tx_bytes: AtomicU64,
    tx_responses: AtomicU64,
    retransmits: AtomicU64,
}

/// The process's totals (every device, every QP ever created).
static PROCESS: Counters = Counters {
    post_send_calls: AtomicU64::new(0),
    send_wrs: AtomicU64::new(0),
    signaled_wrs: AtomicU64::new(0),
    inline_wrs: AtomicU64::new(0),
    inline_bytes: AtomicU64::new(0),
    write_wrs: AtomicU64::new(0),
    write_imm_wrs: AtomicU64::new(0),
    send_op_wrs: AtomicU64::new(0),
    read_wrs: AtomicU64::new(0),
    atomic_wrs: AtomicU64::new(0),
    post_recv_calls: AtomicU64::new(0),
    recv_wrs: AtomicU64::new(0),
    poll_cq_calls: AtomicU64::new(0),
    poll_cq_empty: AtomicU64::new(0),
    cqes: AtomicU64::new(0),
    tx_packets: AtomicU64::new(0),
    tx_bytes: AtomicU64::new(0),
    tx_responses: AtomicU64::new(0),
    retransmits: AtomicU64::new(0),
};

fn add(c: &AtomicU64, v: u64) {
    c.fetch_add(v, Ordering::Relaxed);
}

/// A copy of the counters, in the layout of `struct softroce_counters` (version 1).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CountersRepr {
    pub version: u32,
    /// Bytes of the struct the library filled (a caller's older, shorter struct gets its part).
    pub size: u32,
    pub post_send_calls: u64,
    pub send_wrs: u64,
    pub signaled_wrs: u64,
    pub inline_wrs: u64,
    pub inline_bytes: u64,
    pub write_wrs: u64,
    pub write_imm_wrs: u64,
    pub send_op_wrs: u64,
    pub read_wrs: u64,
    pub atomic_wrs: u64,
    pub post_recv_calls: u64,
    pub recv_wrs: u64,
    pub poll_cq_calls: u64,
    pub poll_cq_empty: u64,
    pub cqes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub tx_responses: u64,
    pub retransmits: u64,
}

impl Counters {
    /// A post-send call (`ibv_post_send`, `ibv_wr_complete`) on this QP.
    pub fn post_send_called(&self, sq_sig_all: bool) -> PostSendHook<'_> {
        for c in [self, &PROCESS] {
            add(&c.post_send_calls, 1);
        }
        PostSendHook { qp: self, sq_sig_all }
    }

    /// A post-receive call on this QP with `wrs` work requests in its chain.
    pub fn post_recv_called(&self, wrs: u64) {
        for c in [self, &PROCESS] {
            add(&c.post_recv_calls, 1);
            add(&c.recv_wrs, wrs);
        }
    }

    /// A packet of `bytes` left this QP (`response`: ACK, NAK, READ or atomic response).
    pub fn packet_sent(&self, bytes: usize, response: bool) {
        for c in [self, &PROCESS] {
            add(&c.tx_packets, 1);
            add(&c.tx_bytes, bytes as u64);
            add(&c.tx_responses, u64::from(response));
        }
    }

    /// The core's retransmission count of this QP is now `total`.
    pub fn retransmits_now(&self, total: u64) {
        let before = self.retransmits.swap(total, Ordering::Relaxed);
        add(&PROCESS.retransmits, total.saturating_sub(before));
    }

    fn send_wr(&self, w: &SendWr, sq_sig_all: bool) {
        let class = match w.opcode {
            WrOpcode::RdmaWrite => &self.write_wrs,
            WrOpcode::RdmaWriteWithImm => &self.write_imm_wrs,
            WrOpcode::Send | WrOpcode::SendWithImm => &self.send_op_wrs,
            WrOpcode::RdmaRead => &self.read_wrs,
            WrOpcode::AtomicCmpSwp | WrOpcode::AtomicFetchAdd => &self.atomic_wrs,
        };
        add(&self.send_wrs, 1);
        add(class, 1);
        add(&self.signaled_wrs, u64::from(w.signaled || sq_sig_all));
        if let Some(d) = &w.inline_data {
            add(&self.inline_wrs, 1);
            add(&self.inline_bytes, d.len() as u64);
        }
    }

    pub fn snapshot(&self) -> CountersRepr {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CountersRepr {
            version: COUNTERS_VERSION,
            size: std::mem::size_of::<CountersRepr>() as u32,
            post_send_calls: g(&self.post_send_calls),
            send_wrs: g(&self.send_wrs),
            signaled_wrs: g(&self.signaled_wrs),
            inline_wrs: g(&self.inline_wrs),
            inline_bytes: g(&self.inline_bytes),
            write_wrs: g(&self.write_wrs),
            write_imm_wrs: g(&self.write_imm_wrs),
            send_op_wrs: g(&self.send_op_wrs),
            read_wrs: g(&self.read_wrs),
            atomic_wrs: g(&self.atomic_wrs),
            post_recv_calls: g(&self.post_recv_calls),
            recv_wrs: g(&self.recv_wrs),
            poll_cq_calls: g(&self.poll_cq_calls),
            poll_cq_empty: g(&self.poll_cq_empty),
            cqes: g(&self.cqes),
            tx_packets: g(&self.tx_packets),
            tx_bytes: g(&self.tx_bytes),
            tx_responses: g(&self.tx_responses),
            retransmits: g(&self.retransmits),
        }
    }
}

/// Counts the WRs of one post-send call as the verbs layer converts them.
pub struct PostSendHook<'a> {
    qp: &'a Counters,
    sq_sig_all: bool,
}

impl PostSendHook<'_> {
    /// One WR of the chain (a WR that failed to convert is not counted: it was never posted).
    pub fn wr(&self, w: &Result<SendWr, i32>) {
        if let Ok(w) = w {
            self.qp.send_wr(w, self.sq_sig_all);
            PROCESS.send_wr(w, self.sq_sig_all);
        }
    }
}

/// A post-receive call on a shared receive queue (process totals only: an SRQ has no QP).
pub fn srq_recv_posted(wrs: u64) {
    add(&PROCESS.post_recv_calls, 1);
    add(&PROCESS.recv_wrs, wrs);
}

/// A CQ poll that handed out `cqes` completions (0: an empty poll).
pub fn cq_polled(cqes: usize) {
    add(&PROCESS.poll_cq_calls, 1);
    add(&PROCESS.poll_cq_empty, u64::from(cqes == 0));
    add(&PROCESS.cqes, cqes as u64);
}

/// One more CQE handed out by `ibv_next_poll` (the poll itself was counted at `ibv_start_poll`).
pub fn cqe_read() {
    add(&PROCESS.cqes, 1);
}

/// The process's totals now.
pub fn process() -> CountersRepr {
    PROCESS.snapshot()
}

impl CountersRepr {
    /// `name=value` pairs, one space apart (the `softroce-ctl counters` line).
    pub fn describe(&self) -> String {
        let mut s = String::new();
        for (name, v) in [
            ("post_send_calls", self.post_send_calls),
            ("send_wrs", self.send_wrs),
            ("signaled_wrs", self.signaled_wrs),
            ("inline_wrs", self.inline_wrs),
            ("inline_bytes", self.inline_bytes),
            ("write_wrs", self.write_wrs),
            ("write_imm_wrs", self.write_imm_wrs),
            ("send_op_wrs", self.send_op_wrs),
            ("read_wrs", self.read_wrs),
            ("atomic_wrs", self.atomic_wrs),
            ("post_recv_calls", self.post_recv_calls),
            ("recv_wrs", self.recv_wrs),
            ("poll_cq_calls", self.poll_cq_calls),
            ("poll_cq_empty", self.poll_cq_empty),
            ("cqes", self.cqes),
            ("tx_packets", self.tx_packets),
            ("tx_bytes", self.tx_bytes),
            ("tx_responses", self.tx_responses),
            ("retransmits", self.retransmits),
        ] {
            let _ = write!(s, "{}{name}={v}", if s.is_empty() { "" } else { " " });
        }
        s
    }
}

/// `softroce-ctl ADDR counters`: the process totals, then `qp N: ...` for each live QP of the
/// device (`qps`: QP number and its counters), in QP-number order, one line each.
pub fn report<'a>(qps: impl IntoIterator<Item = (u32, &'a Counters)>) -> String {
    let mut per_qp: Vec<(u32, CountersRepr)> = qps.into_iter().map(|(n, c)| (n, c.snapshot())).collect();
    per_qp.sort_by_key(|(n, _)| *n);
    let mut s = format!("process: {}", process().describe());
    for (n, c) in per_qp {
        let _ = write!(s, "\nqp {n}: {}", c.describe());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wr(opcode: WrOpcode, signaled: bool, inline: Option<usize>) -> SendWr {
        SendWr {
            wr_id: 1,
            opcode,
            sges: Vec::new(),
            inline_data: inline.map(|n| vec![0u8; n]),
            remote_addr: 0,
            rkey: 0,
            imm_data: 0,
            compare_add: 0,
            swap: 0,
            signaled,
            solicited: false,
            fence: false,
        }
    }

    #[test]
    fn a_qp_counts_its_posts_by_opcode_signaled_and_inline() {
        let q = Counters::default();
        let hook = q.post_send_called(false);
        hook.wr(&Ok(wr(WrOpcode::RdmaWrite, false, None)));
        hook.wr(&Ok(wr(WrOpcode::RdmaWriteWithImm, true, Some(24))));
        hook.wr(&Err(libc::EINVAL));
        q.post_send_called(true).wr(&Ok(wr(WrOpcode::RdmaRead, false, None)));
        q.post_recv_called(3);
        q.packet_sent(100, false);
        q.packet_sent(20, true);
        q.retransmits_now(2);
        q.retransmits_now(5);
        let s = q.snapshot();
        assert_eq!((s.post_send_calls, s.send_wrs, s.signaled_wrs), (2, 3, 2));
        assert_eq!(
            (s.write_wrs, s.write_imm_wrs, s.read_wrs, s.send_op_wrs, s.atomic_wrs),
            (1, 1, 1, 0, 0)
        );
        assert_eq!((s.inline_wrs, s.inline_bytes), (1, 24));
        assert_eq!((s.post_recv_calls, s.recv_wrs), (1, 3));
        assert_eq!(
            (s.tx_packets, s.tx_bytes, s.tx_responses, s.retransmits),
            (2, 120, 1, 5)
        );
        assert_eq!(
            (s.version, s.size as usize),
            (COUNTERS_VERSION, std::mem::size_of::<CountersRepr>())
        );
    }

    #[test]
    fn the_process_totals_grow_with_every_qp() {
        // Other tests of this binary count too: compare growth, not values.
        let before = process();
        let (a, b) = (Counters::default(), Counters::default());
        a.post_send_called(false).wr(&Ok(wr(WrOpcode::Send, false, None)));
        b.post_send_called(false).wr(&Ok(wr(WrOpcode::Send, false, None)));
        b.retransmits_now(4);
        cq_polled(0);
        cq_polled(3);
        let after = process();
        assert!(after.post_send_calls - before.post_send_calls >= 2);
        assert!(after.send_op_wrs - before.send_op_wrs >= 2);
        assert!(after.retransmits - before.retransmits >= 4);
        assert!(after.poll_cq_calls - before.poll_cq_calls >= 2);
        assert!(after.poll_cq_empty - before.poll_cq_empty >= 1);
        assert!(after.cqes - before.cqes >= 3);
    }

    #[test]
    fn the_report_names_every_counter_and_orders_qps() {
        let (a, b) = (Counters::default(), Counters::default());
        a.packet_sent(10, false);
        let r = report([(0x20, &a), (0x11, &b)]);
        assert!(r.starts_with("process: post_send_calls="), "{r}");
        let (q11, q20) = (r.find("\nqp 17: ").unwrap(), r.find("\nqp 32: ").unwrap());
        assert!(q11 < q20, "{r}");
        assert!(r[q20..].contains("tx_packets=1 tx_bytes=10"), "{r}");
        assert_eq!(r.matches("retransmits=").count(), 3);
    }
}
