//! Live counters and latency histograms per comm and per QP, the per-process statistics file
//! and the summary a comm logs when it closes.
//!
//! Kept only when asked for (`FERROCE_STATS=DIR`, or `NCCL_DEBUG=INFO`/`TRACE`): otherwise a
//! comm holds `None` and the data path pays one branch per message and allocates nothing. When
//! on, counters are relaxed atomics (the file writer reads them from another thread) and each
//! request's start time sits in a fixed array of the comm.
//!
//! The file `DIR/ferroce-<host>-<pid>.json` is written (atomically: a temporary file renamed)
//! at every `finalize`, at process exit, and every `FERROCE_STATS_INTERVAL_SEC`. It holds one
//! object per comm (live, and the last [`KEEP_CLOSED`] closed ones) and the totals of every
//! comm the process ever had.

use super::proto::time::Time;
use once_cell::sync::Lazy;
use parking_lot::{Condvar, Mutex};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Buckets of a latency histogram: bucket `i` counts durations in [2^i, 2^(i+1)) ns (bucket 0
/// also holds 0); the last one everything from 2^39 ns (9 minutes) on.
pub const BUCKETS: usize = 40;
/// Closed comms kept one by one in the file; older ones only count in the totals.
pub const KEEP_CLOSED: usize = 256;

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

    pub fn cts_waited(&self, ns: u64) {
        Self::add(&self.cts_wait_ns, ns);
    }

    fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    /// One line for the INFO log at close.
    pub fn summary(&self) -> String {
        let h = self.latency.counts();
        format!(
            "{} comm with {} on {}: {} messages, {} bytes, {} WRs in {} posts, {} completions, {} errors{}; latency p50 < {} us, p99 < {} us",
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
        )
    }

    fn json(&self, out: &mut String) {
        let h = self.latency.counts();
        let _ = write!(
            out,
            "{{\"kind\":\"{}\",\"peer\":\"{}\",\"devices\":\"{}\",\"closed\":{},\"bytes\":{},\"messages\":{},\"post_calls\":{},\"wrs\":{},\"completions\":{},\"errors\":{},\"cts_writes\":{},\"cts_wait_ns\":{},\"eager\":{},\"latency_log2_ns\":{:?},\"qps\":[",
            self.kind,
            json_escape(&self.peer),
            json_escape(&self.devices),
            self.closed.load(Ordering::Relaxed),
            Self::get(&self.bytes),
            Self::get(&self.messages),
            Self::get(&self.post_calls),
            Self::get(&self.wrs),
            Self::get(&self.completions),
            Self::get(&self.errors),
            Self::get(&self.cts_writes),
            Self::get(&self.cts_wait_ns),
            Self::get(&self.eager),
            h,
        );
        for (i, q) in self.qps.iter().enumerate() {
            let _ = write!(
                out,
                "{}{{\"qpn\":{},\"wrs\":{},\"bytes\":{},\"completions\":{},\"errors\":{}}}",
                if i > 0 { "," } else { "" },
                q.qpn.load(Ordering::Relaxed),
                Self::get(&q.wrs),
                Self::get(&q.bytes),
                Self::get(&q.completions),
                Self::get(&q.errors),
            );
        }
        out.push_str("]}");
    }
}

fn json_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| match c {
            '"' | '\\' => vec!['\\', c],
            c if (c as u32) < 0x20 => format!("\\u{:04x}", c as u32).chars().collect(),
            c => vec![c],
        })
        .collect()
}

/// Totals over every comm the process had (closed ones included).
#[derive(Default, Clone, Copy)]
struct Totals {
    comms: u64,
    send_bytes: u64,
    send_messages: u64,
    recv_bytes: u64,
    recv_messages: u64,
    errors: u64,
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
    writer_started: bool,
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
pub fn enabled() -> bool {
    let c = crate::config::get();
    c.stats_dir.is_some() || c.debug_info
}

/// New statistics for a comm (`None` when statistics are off), registered for the file.
pub fn for_comm(kind: &'static str, peer: String, devices: String, qpns: &[u32]) -> Option<Arc<CommStats>> {
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
    let start_writer = {
        let mut r = REGISTRY.lock();
        r.live.push(s.clone());
        let first = !r.writer_started;
        r.writer_started = true;
        first
    };
    // (At most one atexit registration per writer start; a restarted writer after a
    // finalize registers again, which only writes the same file twice at exit.)
    if start_writer {
        start_file_writer();
    }
    Some(s)
}

/// The comm closed: its summary at INFO, and it moves to the closed list.
pub fn close(s: &Arc<CommStats>) {
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
pub struct SideTotals {
    pub comms: u64,
    pub messages: u64,
    pub post_calls: u64,
    pub wrs: u64,
    pub completions: u64,
    pub cts_writes: u64,
    /// Sender: messages sent eagerly; receiver: eager messages delivered.
    pub eager: u64,
}

/// Send and receive sides' sums over every comm the process had, for
/// `ferroce_stats_totals_get`.
#[derive(Default, Clone, Copy, Debug)]
pub struct BySide {
    pub send: SideTotals,
    pub recv: SideTotals,
}

pub fn side_totals() -> BySide {
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
}

/// The whole file's text.
pub fn render() -> String {
    let r = REGISTRY.lock();
    let mut totals = r.dropped;
    let mut comms = String::new();
    for (i, s) in r.live.iter().chain(r.closed.iter()).enumerate() {
        add_totals(&mut totals, s);
        if i > 0 {
            comms.push(',');
        }
        s.json(&mut comms);
    }
    format!(
        "{{\"ferroce\":\"{}\",\"pid\":{},\"host\":\"{}\",\"totals\":{{\"comms\":{},\"send_bytes\":{},\"send_messages\":{},\"recv_bytes\":{},\"recv_messages\":{},\"errors\":{}}},\"comms\":[{}]}}\n",
        crate::VERSION,
        std::process::id(),
        json_escape(&hostname()),
        totals.comms,
        totals.send_bytes,
        totals.send_messages,
        totals.recv_bytes,
        totals.recv_messages,
        totals.errors,
        comms
    )
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Write the statistics file now, if FERROCE_STATS names a directory and any comm kept
/// statistics. A failure is one WARN (statistics never fail the job).
pub fn write_file() {
    let Some(dir) = crate::config::get().stats_dir.as_deref() else {
        return;
    };
    {
        let r = REGISTRY.lock();
        if r.live.is_empty() && r.closed.is_empty() && r.dropped.comms == 0 {
            return;
        }
    }
    let name = format!("ferroce-{}-{}.json", hostname(), std::process::id());
    let path = std::path::Path::new(dir).join(&name);
    let tmp = std::path::Path::new(dir).join(format!(".{name}.tmp"));
    let text = render();
    let result = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&tmp, text))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = result {
        static WARNED: AtomicBool = AtomicBool::new(false);
        if !WARNED.swap(true, Ordering::Relaxed) {
            crate::log_warn!(
                "cannot write the statistics file {} (FERROCE_STATS): {e} — check that the directory exists and is writable",
                path.display()
            );
        }
    }
}

/// Stops the interval writer (set at finalize of the last context and before an unload).
static WRITER_STOP: Mutex<bool> = Mutex::new(false);
static WRITER_WAKE: Condvar = Condvar::new();
/// The interval writer thread, joined by [`finish`] (library code must not run after an
/// unload).
static WRITER: Mutex<Option<std::thread::JoinHandle<()>>> = Mutex::new(None);

extern "C" fn write_at_exit() {
    write_file();
}

/// The writer: at exit (atexit), and every FERROCE_STATS_INTERVAL_SEC on a thread of its own.
fn start_file_writer() {
    let cfg = crate::config::get();
    if cfg.stats_dir.is_none() {
        return;
    }
    // SAFETY: registers a function with C linkage and no arguments, which stays in the
    // library for as long as the process lives (the plugin is not unloaded while NCCL runs;
    // a dlclose before exit runs `stop_writer` first through the library's fini hook).
    unsafe { libc::atexit(write_at_exit) };
    let every = cfg.stats_interval_sec;
    if every == 0 {
        return;
    }
    *WRITER_STOP.lock() = false;
    let spawned = std::thread::Builder::new()
        .name("ferroce-stats".into())
        .spawn(move || loop {
            let mut stop = WRITER_STOP.lock();
            if !*stop {
                WRITER_WAKE.wait_for(&mut stop, Duration::from_secs(every));
            }
            if *stop {
                return;
            }
            drop(stop);
            write_file();
        });
    match spawned {
        Ok(h) => *WRITER.lock() = Some(h),
        Err(e) => crate::log_warn!(
            "cannot start the statistics writer thread: {e}; the file is written at finalize and exit only"
        ),
    }
}

/// Write the file and stop the interval writer (the last `finalize`, and before an unload
/// without one). A later comm starts a new writer.
pub fn finish() {
    write_file();
    *WRITER_STOP.lock() = true;
    WRITER_WAKE.notify_all();
    if let Some(h) = WRITER.lock().take() {
        let _ = h.join();
    }
    REGISTRY.lock().writer_started = false;
}

/// Nanoseconds between two of the core's times.
pub fn since(start: Time, now: Time) -> u64 {
    u64::try_from(now.saturating_since(start).as_nanos()).unwrap_or(u64::MAX)
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
    fn json_of_a_comm_names_every_counter() {
        let s = CommStats {
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
            latency: Histogram::default(),
            qps: vec![QpStats {
                qpn: AtomicU32::new(16),
                ..QpStats::default()
            }]
            .into_boxed_slice(),
            closed: AtomicBool::new(false),
        };
        s.posted(0, 2, 10);
        s.completed(Some(0), true);
        s.completed(None, false);
        s.renumber(&[17]);
        let mut out = String::new();
        s.json(&mut out);
        assert!(out.contains("\"peer\":\"127.0.0.1:5\\\"x\""), "{out}");
        assert!(out.contains("\"wrs\":5"), "{out}");
        assert!(
            out.contains("{\"qpn\":17,\"wrs\":2,\"bytes\":10,\"completions\":1,\"errors\":0}"),
            "{out}"
        );
        assert!(out.contains("\"errors\":1"), "{out}");
        assert!(s.summary().contains("2 messages, 10 bytes"), "{}", s.summary());
    }
}
