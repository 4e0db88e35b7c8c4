//! Live counters and latency histograms per comm and per QP, the process's list of them (live
//! comms and the last [`KEEP_CLOSED`] closed ones, with the totals of every comm it had), and
//! the summary a comm logs when it closes.
//!
//! Kept only when asked for (`FERROCE_STATS=DIR`, or `NCCL_DEBUG=INFO`/`TRACE`): otherwise a
//! comm holds `None` and the data path pays one branch per message and allocates nothing. When
//! on, counters are relaxed atomics (the file writer reads them from another thread) and each
//! request's start time sits in a fixed array of the comm.
//!
//! The statistics file, its writer thread and its exit hook are `crate::stats_file`'s; it reads
//! the comms through [`snapshot`].

use super::proto::time::Time;
use once_cell::sync::Lazy;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// Buckets of a latency histogram: bucket `i` counts durations in [2^i, 2^(i+1)) ns (bucket 0
/// also holds 0); the last one everything from 2^39 ns (9 minutes) on.
pub(crate) const BUCKETS: usize = 40;
/// Closed comms kept one by one in the file; older ones only count in the totals.
pub(crate) const KEEP_CLOSED: usize = 256;

/// A log2 histogram of durations.
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS],
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Histogram {
    /// The bucket of a duration of `ns` nanoseconds.
    pub fn bucket(ns: u64) -> usize {
        (63 - ns.max(1).leading_zeros() as usize).min(BUCKETS - 1)
    }

    pub fn record(&self, ns: u64) {
        self.buckets[Self::bucket(ns)].fetch_add(1, Ordering::Relaxed);
    }

    pub fn counts(&self) -> [u64; BUCKETS] {
        std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed))
    }

    /// The upper bound (ns) of the bucket holding quantile `q` (0..=1), 0 when empty.
    pub fn quantile_bound(counts: &[u64; BUCKETS], q: f64) -> u64 {
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let want = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, &c) in counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                return 1u64 << (i + 1);
            }
        }
        1u64 << BUCKETS
    }
}

/// Counters of one QP of a comm.
#[derive(Default)]
pub struct QpStats {
    /// The QP's number now (a recovery gives the connection new QPs: [`CommStats::renumber`]).
    pub qpn: AtomicU32,
    pub wrs: AtomicU64,
    pub bytes: AtomicU64,
    pub completions: AtomicU64,
    pub errors: AtomicU64,
    /// Post-to-completion times of signaled send work requests (the latency monitor, when on).
    pub wr_latency: Histogram,
    /// Of those, past `NCCL_IB_WQE_LATENCY_THRESHOLD_NS`, and stalls reported.
    pub slow_wrs: AtomicU64,
    pub stalled_wrs: AtomicU64,
}

/// The quantiles the latency monitor reports: p50, p90, p99, p99.9.
pub(crate) const WR_QUANTILES: [f64; 4] = [0.5, 0.9, 0.99, 0.999];

/// The four [`WR_QUANTILES`] bounds (ns) of `counts`.
pub(crate) fn wr_quantiles(counts: &[u64; BUCKETS]) -> [u64; 4] {
    WR_QUANTILES.map(|q| Histogram::quantile_bound(counts, q))
}

/// Counters of one comm.
pub struct CommStats {
    /// "send" or "recv".
    pub kind: &'static str,
    pub peer: String,
    pub devices: String,
    /// Message payload bytes (sent, or received as reported by test).
    pub bytes: AtomicU64,
    pub messages: AtomicU64,
    pub post_calls: AtomicU64,
    pub wrs: AtomicU64,
    pub completions: AtomicU64,
    pub errors: AtomicU64,
    /// Receiver: CTS writes posted.
    pub cts_writes: AtomicU64,
    /// Sender: time spent with an isend refused because no CTS had arrived.
    pub cts_wait_ns: AtomicU64,
    /// Sender: messages sent eagerly; receiver: eager messages copied into their buffers.
    pub eager: AtomicU64,
    /// `ibv_poll_cq` calls on the comm's CQs (empty ones too).
    pub cq_polls: AtomicU64,
    /// isend → test done, or irecv → test done.
    pub latency: Histogram,
    pub qps: Box<[QpStats]>,
    pub closed: AtomicBool,
}

impl CommStats {
    fn add(c: &AtomicU64, v: u64) {
        c.fetch_add(v, Ordering::Relaxed);
    }

    /// A chain of `wrs` work requests carrying `bytes` posted on QP `qp` in one call.
    pub fn posted(&self, qp: usize, wrs: usize, bytes: u64) {
        Self::add(&self.post_calls, 1);
        Self::add(&self.wrs, wrs as u64);
        if let Some(q) = self.qps.get(qp) {
            Self::add(&q.wrs, wrs as u64);
            Self::add(&q.bytes, bytes);
        }
    }

    /// A completion on the connection's QP `qp` (`None`: of a QP a recovery replaced; `ok`:
    /// success). By index, not number: a fused device's members can each have a QP of the
    /// same number.
    pub fn completed(&self, qp: Option<usize>, ok: bool) {
        Self::add(if ok { &self.completions } else { &self.errors }, 1);
        if let Some(q) = qp.and_then(|i| self.qps.get(i)) {
            Self::add(if ok { &q.completions } else { &q.errors }, 1);
        }
    }

    /// A recovery replaced the connection's QPs: their numbers now, in QP order (the counts
    /// go on per QP index).
    pub fn renumber(&self, qpns: &[u32]) {
        for (q, &n) in self.qps.iter().zip(qpns) {
            q.qpn.store(n, Ordering::Relaxed);
        }
    }

    /// A message of `bytes` done after `ns`.
    pub fn message_done(&self, bytes: u64, ns: u64) {
        Self::add(&self.messages, 1);
        Self::add(&self.bytes, bytes);
        self.latency.record(ns);
    }

    pub fn cts_written(&self) {
        Self::add(&self.cts_writes, 1);
    }

    /// A message sent eagerly.
    pub fn eager_sent(&self) {
        Self::add(&self.eager, 1);
    }

    /// An eager message of `bytes` copied into its receive buffer.
    pub fn eager_delivered(&self, _bytes: u64) {
        Self::add(&self.eager, 1);
    }

    /// `n` CQ polls (one sweep of the comm's CQs).
    pub fn cq_polled(&self, n: u64) {
        Self::add(&self.cq_polls, n);
    }

    pub fn cts_waited(&self, ns: u64) {
        Self::add(&self.cts_wait_ns, ns);
    }

    /// A counter's value now.
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    /// The latency monitor's part of the close summary: every QP's histogram together, empty
    /// when it measured nothing.
    fn wr_summary(&self) -> String {
        let mut sum = [0u64; BUCKETS];
        for q in self.qps.iter() {
            for (s, c) in sum.iter_mut().zip(q.wr_latency.counts()) {
                *s += c;
            }
        }
        let n: u64 = sum.iter().sum();
        if n == 0 {
            return String::new();
        }
        let [p50, p90, p99, p999] = wr_quantiles(&sum).map(|ns| ns as f64 / 1000.0);
        let total = |f: fn(&QpStats) -> &AtomicU64| self.qps.iter().map(|q| Self::get(f(q))).sum::<u64>();
        format!(
            "; work requests post to completion p50/p90/p99/p99.9 < {p50}/{p90}/{p99}/{p999} us over {n}, {} slow, {} stalled",
            total(|q| &q.slow_wrs),
            total(|q| &q.stalled_wrs)
        )
    }

    /// One line for the INFO log at close.
    pub fn summary(&self) -> String {
        let h = self.latency.counts();
        format!(
            "{} comm with {} on {}: {} messages, {} bytes, {} WRs in {} posts, {} completions, {} errors{}; latency p50 < {} us, p99 < {} us{}",
            self.kind,
            self.peer,
            self.devices,
            Self::get(&self.messages),
            Self::get(&self.bytes),
            Self::get(&self.wrs),
            Self::get(&self.post_calls),
            Self::get(&self.completions),
            Self::get(&self.errors),
            if self.kind == "send" {
                format!(
                    ", {} sent eagerly, {} ms waiting for the receiver's CTS",
                    Self::get(&self.eager),
                    Self::get(&self.cts_wait_ns) / 1_000_000
                )
            } else {
                format!(
                    ", {} CTS writes, {} eager messages delivered",
                    Self::get(&self.cts_writes),
                    Self::get(&self.eager)
                )
            },
            Histogram::quantile_bound(&h, 0.5) / 1000,
            Histogram::quantile_bound(&h, 0.99) / 1000,
            self.wr_summary(),
        )
    }
}

/// Totals over every comm the process had (closed ones included).
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Totals {
    pub comms: u64,
    pub send_bytes: u64,
    pub send_messages: u64,
    pub recv_bytes: u64,
    pub recv_messages: u64,
    pub errors: u64,
}

#[derive(Default)]
struct Registry {
    live: Vec<Arc<CommStats>>,
    /// The last [`KEEP_CLOSED`] closed comms, for the file (none without one).
    closed: std::collections::VecDeque<Arc<CommStats>>,
    /// Totals of closed comms no longer in `closed`.
    dropped: Totals,
    /// The same comms' counters by side (for [`side_totals`]).
    dropped_sides: BySide,
}

impl Registry {
    /// A closed comm counts from now on only in the totals.
    fn fold(&mut self, s: &CommStats) {
        add_totals(&mut self.dropped, s);
        add_side(&mut self.dropped_sides, s);
    }
}

static REGISTRY: Lazy<Mutex<Registry>> = Lazy::new(Mutex::default);

/// Whether comms keep statistics (FERROCE_STATS set, or NCCL_DEBUG=INFO/TRACE).
pub(crate) fn enabled() -> bool {
    let c = crate::config::get();
    c.stats_dir.is_some() || c.debug_info
}

/// New statistics for a comm (`None` when statistics are off), registered for the file.
pub(crate) fn for_comm(kind: &'static str, peer: String, devices: String, qpns: &[u32]) -> Option<Arc<CommStats>> {
    if !enabled() {
        return None;
    }
    let s = Arc::new(CommStats {
        kind,
        peer,
        devices,
        bytes: AtomicU64::new(0),
        messages: AtomicU64::new(0),
        post_calls: AtomicU64::new(0),
        wrs: AtomicU64::new(0),
        completions: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        cts_writes: AtomicU64::new(0),
        cts_wait_ns: AtomicU64::new(0),
        eager: AtomicU64::new(0),
        cq_polls: AtomicU64::new(0),
        latency: Histogram::default(),
        qps: qpns
            .iter()
            .map(|&qpn| QpStats {
                qpn: AtomicU32::new(qpn),
                ..QpStats::default()
            })
            .collect(),
        closed: AtomicBool::new(false),
    });
    REGISTRY.lock().live.push(s.clone());
    Some(s)
}

/// The comm closed: its summary at INFO, and it moves to the closed list.
pub(crate) fn close(s: &Arc<CommStats>) {
    s.closed.store(true, Ordering::Relaxed);
    crate::log_info!(crate::log::subsys::NET, "{}", s.summary());
    let mut r = REGISTRY.lock();
    r.live.retain(|x| !Arc::ptr_eq(x, s));
    // Only the file lists closed comms one by one: with statistics on for the INFO summaries
    // alone, a closed comm keeps nothing but its share of the totals.
    if crate::config::get().stats_dir.is_none() {
        return r.fold(s);
    }
    r.closed.push_back(s.clone());
    while r.closed.len() > KEEP_CLOSED {
        if let Some(old) = r.closed.pop_front() {
            r.fold(&old);
        }
    }
}

fn add_totals(t: &mut Totals, s: &CommStats) {
    t.comms += 1;
    let (b, m) = (CommStats::get(&s.bytes), CommStats::get(&s.messages));
    if s.kind == "send" {
        t.send_bytes += b;
        t.send_messages += m;
    } else {
        t.recv_bytes += b;
        t.recv_messages += m;
    }
    t.errors += CommStats::get(&s.errors);
}

/// Sums of one side's counters (see [`side_totals`]).
#[derive(Default, Clone, Copy, Debug)]
pub(crate) struct SideTotals {
    pub comms: u64,
    pub messages: u64,
    pub post_calls: u64,
    pub wrs: u64,
    pub completions: u64,
    pub cts_writes: u64,
    /// Sender: messages sent eagerly; receiver: eager messages delivered.
    pub eager: u64,
    pub cq_polls: u64,
}

/// Send and receive sides' sums over every comm the process had, for
/// `ferroce_stats_totals_get`.
#[derive(Default, Clone, Copy, Debug)]
pub(crate) struct BySide {
    pub send: SideTotals,
    pub recv: SideTotals,
}

pub(crate) fn side_totals() -> BySide {
    let r = REGISTRY.lock();
    let mut t = r.dropped_sides;
    for s in r.live.iter().chain(r.closed.iter()) {
        add_side(&mut t, s);
    }
    t
}

fn add_side(t: &mut BySide, s: &CommStats) {
    let side = if s.kind == "send" { &mut t.send } else { &mut t.recv };
    side.comms += 1;
    side.messages += CommStats::get(&s.messages);
    side.post_calls += CommStats::get(&s.post_calls);
    side.wrs += CommStats::get(&s.wrs);
    side.completions += CommStats::get(&s.completions);
    side.cts_writes += CommStats::get(&s.cts_writes);
    side.eager += CommStats::get(&s.eager);
    side.cq_polls += CommStats::get(&s.cq_polls);
}

/// The comms the process lists (live ones, then the last [`KEEP_CLOSED`] closed ones while
/// FERROCE_STATS names a directory) and the totals of every comm it had.
pub(crate) struct Snapshot {
    pub comms: Vec<Arc<CommStats>>,
    pub totals: Totals,
}

/// The comms and totals now, taken under the list's lock (the counters go on counting).
pub(crate) fn snapshot() -> Snapshot {
    let r = REGISTRY.lock();
    let mut totals = r.dropped;
    let comms: Vec<Arc<CommStats>> = r.live.iter().chain(r.closed.iter()).cloned().collect();
    for s in &comms {
        add_totals(&mut totals, s);
    }
    Snapshot { comms, totals }
}

/// Nanoseconds between two of the core's times.
pub(crate) fn since(start: Time, now: Time) -> u64 {
    u64::try_from(now.saturating_since(start).as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
impl CommStats {
    /// A send comm's statistics with a few counts and one QP (16), for tests here and in
    /// `stats_file`.
    pub(crate) fn sample_send() -> CommStats {
        use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
        CommStats {
            kind: "send",
            peer: "127.0.0.1:5\"x".into(),
            devices: "rxe0".into(),
            bytes: AtomicU64::new(10),
            messages: AtomicU64::new(2),
            post_calls: AtomicU64::new(2),
            wrs: AtomicU64::new(3),
            completions: AtomicU64::new(2),
            errors: AtomicU64::new(0),
            cts_writes: AtomicU64::new(0),
            cts_wait_ns: AtomicU64::new(7),
            eager: AtomicU64::new(0),
            cq_polls: AtomicU64::new(4),
            latency: Histogram::default(),
            qps: vec![QpStats {
                qpn: AtomicU32::new(16),
                ..QpStats::default()
            }]
            .into_boxed_slice(),
            closed: AtomicBool::new(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_log2_of_nanoseconds() {
        assert_eq!(Histogram::bucket(0), 0);
        assert_eq!(Histogram::bucket(1), 0);
        assert_eq!(Histogram::bucket(2), 1);
        assert_eq!(Histogram::bucket(1023), 9);
        assert_eq!(Histogram::bucket(1024), 10);
        assert_eq!(Histogram::bucket(u64::MAX), BUCKETS - 1);
        let h = Histogram::default();
        for ns in [100, 100, 100, 5000] {
            h.record(ns);
        }
        let c = h.counts();
        assert_eq!(c[6], 3);
        assert_eq!(c[12], 1);
        assert_eq!(Histogram::quantile_bound(&c, 0.5), 128);
        assert_eq!(Histogram::quantile_bound(&c, 0.99), 8192);
        assert_eq!(Histogram::quantile_bound(&[0; BUCKETS], 0.5), 0);
    }

    #[test]
    fn a_comm_counts_per_comm_and_per_qp() {
        let s = CommStats::sample_send();
        s.posted(0, 2, 10);
        s.completed(Some(0), true);
        s.completed(None, false);
        s.renumber(&[17]);
        assert_eq!(CommStats::get(&s.wrs), 5);
        assert_eq!(CommStats::get(&s.errors), 1);
        let q = &s.qps[0];
        let per_qp = [&q.wrs, &q.bytes, &q.completions, &q.errors].map(CommStats::get);
        assert_eq!((q.qpn.load(Ordering::Relaxed), per_qp), (17, [2, 10, 1, 0]));
        assert!(s.summary().contains("2 messages, 10 bytes"), "{}", s.summary());
    }

    #[test]
    fn the_close_summary_gives_the_monitors_quantiles_only_when_it_measured() {
        let s = CommStats::sample_send();
        assert!(!s.summary().contains("work requests"), "{}", s.summary());
        for ns in [1_000, 1_000, 1_000, 1_000, 1_000, 1_000, 1_000, 1_000, 1_000, 300_000] {
            s.qps[0].wr_latency.record(ns);
        }
        s.qps[0].slow_wrs.fetch_add(1, Ordering::Relaxed);
        assert_eq!(
            wr_quantiles(&s.qps[0].wr_latency.counts()),
            [1024, 1024, 524_288, 524_288]
        );
        let line = s.summary();
        assert!(
            line.ends_with("work requests post to completion p50/p90/p99/p99.9 < 1.024/1.024/524.288/524.288 us over 10, 1 slow, 0 stalled"),
            "{line}"
        );
    }
}
