//! The per-process statistics file (FERROCE_STATS=DIR): the comms' counters
//! ([`transport::stats`](crate::transport::stats)) as JSON, written by a thread of its own and at process exit.
//!
//! The file `DIR/ferroce-<host>-<pid>.json` is written (atomically: a temporary file renamed)
//! at every `finalize`, at process exit, and every `FERROCE_STATS_INTERVAL_SEC`. It holds one
//! object per comm (live, and the last [`KEEP_CLOSED`](crate::transport::stats::KEEP_CLOSED) closed
//! ones) and the totals of every comm the process ever had. Keys and their meaning are a
//! contract with the tools that read the file (ci/tests/66-stats.sh,
//! tests/observability_softroce.rs): add keys, never rename or drop one.
//!
//! The writer starts with the first comm that keeps statistics ([`comm_opened`], called by
//! `api` for every new comm) and stops at the last `finalize` or before an unload ([`finish`]).
//! A failure to write is one WARN: statistics never fail the job.

use crate::transport::stats::{self, CommStats, Snapshot, BUCKETS};
use parking_lot::{Condvar, Mutex};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The whole file.
#[derive(Serialize)]
struct File<'a> {
    ferroce: &'static str,
    pid: u32,
    host: String,
    totals: Totals,
    comms: Vec<Comm<'a>>,
}

/// The file's `totals` (of [`stats::Totals`]).
#[derive(Serialize)]
struct Totals {
    comms: u64,
    send_bytes: u64,
    send_messages: u64,
    recv_bytes: u64,
    recv_messages: u64,
    errors: u64,
}

/// One comm's object.
#[derive(Serialize)]
struct Comm<'a> {
    kind: &'static str,
    peer: &'a str,
    devices: &'a str,
    closed: bool,
    bytes: u64,
    messages: u64,
    post_calls: u64,
    wrs: u64,
    completions: u64,
    errors: u64,
    cts_writes: u64,
    cts_wait_ns: u64,
    eager: u64,
    /// Bucket `i` counts latencies in [2^i, 2^(i+1)) ns ([`stats::Histogram`]).
    latency_log2_ns: Vec<u64>,
    qps: Vec<Qp>,
}

/// One QP's object in its comm's `qps`.
#[derive(Serialize)]
struct Qp {
    qpn: u32,
    wrs: u64,
    bytes: u64,
    completions: u64,
    errors: u64,
    /// The latency monitor's figures (NCCL_IB_WQE_LATENCY_*), when it measured any.
    #[serde(skip_serializing_if = "Option::is_none")]
    wr_latency: Option<WrLatency>,
}

/// A QP's post-to-completion times of signaled send work requests: quantile bounds (the
/// histogram's bucket edges) and counts.
#[derive(Serialize)]
struct WrLatency {
    count: u64,
    p50_ns: u64,
    p90_ns: u64,
    p99_ns: u64,
    p999_ns: u64,
    slow: u64,
    stalled: u64,
    /// Bucket `i` counts latencies in [2^i, 2^(i+1)) ns.
    log2_ns: Vec<u64>,
}

impl WrLatency {
    fn of(q: &stats::QpStats) -> Option<WrLatency> {
        let counts = q.wr_latency.counts();
        let count: u64 = counts.iter().sum();
        let [p50_ns, p90_ns, p99_ns, p999_ns] = stats::wr_quantiles(&counts);
        (count > 0).then(|| WrLatency {
            count,
            p50_ns,
            p90_ns,
            p99_ns,
            p999_ns,
            slow: CommStats::get(&q.slow_wrs),
            stalled: CommStats::get(&q.stalled_wrs),
            log2_ns: counts.to_vec(),
        })
    }
}

impl<'a> Comm<'a> {
    fn of(s: &'a CommStats) -> Comm<'a> {
        let get = CommStats::get;
        let latency: [u64; BUCKETS] = s.latency.counts();
        Comm {
            kind: s.kind,
            peer: &s.peer,
            devices: &s.devices,
            closed: s.closed.load(Ordering::Relaxed),
            bytes: get(&s.bytes),
            messages: get(&s.messages),
            post_calls: get(&s.post_calls),
            wrs: get(&s.wrs),
            completions: get(&s.completions),
            errors: get(&s.errors),
            cts_writes: get(&s.cts_writes),
            cts_wait_ns: get(&s.cts_wait_ns),
            eager: get(&s.eager),
            latency_log2_ns: latency.to_vec(),
            qps: s
                .qps
                .iter()
                .map(|q| Qp {
                    qpn: q.qpn.load(Ordering::Relaxed),
                    wrs: get(&q.wrs),
                    bytes: get(&q.bytes),
                    completions: get(&q.completions),
                    errors: get(&q.errors),
                    wr_latency: WrLatency::of(q),
                })
                .collect(),
        }
    }
}

/// The file's text for `snap`, one line.
fn render(snap: &Snapshot, host: String) -> String {
    let file = File {
        ferroce: crate::VERSION,
        pid: std::process::id(),
        host,
        totals: Totals {
            comms: snap.totals.comms,
            send_bytes: snap.totals.send_bytes,
            send_messages: snap.totals.send_messages,
            recv_bytes: snap.totals.recv_bytes,
            recv_messages: snap.totals.recv_messages,
            errors: snap.totals.errors,
        },
        comms: snap.comms.iter().map(|s| Comm::of(s)).collect(),
    };
    // Serializing plain structs of numbers and strings cannot fail.
    let mut text = serde_json::to_string(&file).unwrap_or_default();
    text.push('\n');
    text
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
pub(crate) fn write_file() {
    let Some(dir) = crate::config::get().stats_dir.as_deref() else {
        return;
    };
    let snap = stats::snapshot();
    if snap.totals.comms == 0 {
        return;
    }
    let name = format!("ferroce-{}-{}.json", hostname(), std::process::id());
    let path = std::path::Path::new(dir).join(&name);
    let tmp = std::path::Path::new(dir).join(format!(".{name}.tmp"));
    let text = render(&snap, hostname());
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

/// The writer runs (set by the first comm after a start or a [`finish`]).
static WRITER_STARTED: AtomicBool = AtomicBool::new(false);
/// Stops the interval writer (set at finalize of the last context and before an unload).
static WRITER_STOP: Mutex<bool> = Mutex::new(false);
static WRITER_WAKE: Condvar = Condvar::new();
/// The interval writer thread, joined by [`finish`] (library code must not run after an
/// unload).
static WRITER: Mutex<Option<std::thread::JoinHandle<()>>> = Mutex::new(None);

/// The exit hook. It runs inside `exit()`, called from C: a panic must not unwind into it.
extern "C" fn write_at_exit() {
    let _ = std::panic::catch_unwind(write_file);
}

/// A comm was made: the first one that keeps statistics starts the writer.
pub(crate) fn comm_opened() {
    if stats::enabled() && !WRITER_STARTED.swap(true, Ordering::AcqRel) {
        start_file_writer();
    }
}

/// The writer: at exit (atexit), and every FERROCE_STATS_INTERVAL_SEC on a thread of its own.
/// (At most one atexit registration per writer start; a restarted writer after a finalize
/// registers again, which only writes the same file twice at exit.)
fn start_file_writer() {
    let cfg = crate::config::get();
    if cfg.stats_dir.is_none() {
        return;
    }
    // SAFETY: registers a function with C linkage and no arguments, which stays in the
    // library for as long as the process lives (the plugin is not unloaded while NCCL runs;
    // a dlclose before exit runs `finish` first through the library's fini hook).
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
pub(crate) fn finish() {
    write_file();
    *WRITER_STOP.lock() = true;
    WRITER_WAKE.notify_all();
    if let Some(h) = WRITER.lock().take() {
        let _ = h.join();
    }
    WRITER_STARTED.store(false, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn comm() -> CommStats {
        CommStats::sample_send()
    }

    /// The file's text, key by key as the hand-written JSON before it had it (the tools that
    /// read the file rely on every key and on one line per file).
    #[test]
    fn the_file_names_every_counter_as_before() {
        let s = comm();
        s.posted(0, 2, 10);
        s.completed(Some(0), true);
        s.completed(None, false);
        s.renumber(&[17]);
        s.latency.record(100);
        let totals = stats::Totals {
            comms: 3,
            send_bytes: 10,
            send_messages: 2,
            recv_bytes: 0,
            recv_messages: 0,
            errors: 1,
        };
        let snap = Snapshot {
            comms: vec![Arc::new(s)],
            totals,
        };
        let text = render(&snap, "h\tost".into());
        let mut latency = [0u64; BUCKETS];
        latency[6] = 1;
        let latency = latency.map(|c| c.to_string()).join(",");
        let want = format!(
            concat!(
                "{{\"ferroce\":\"{}\",\"pid\":{},\"host\":\"h\\tost\",",
                "\"totals\":{{\"comms\":3,\"send_bytes\":10,\"send_messages\":2,\"recv_bytes\":0,\"recv_messages\":0,\"errors\":1}},",
                "\"comms\":[{{\"kind\":\"send\",\"peer\":\"127.0.0.1:5\\\"x\",\"devices\":\"rxe0\",\"closed\":false,",
                "\"bytes\":10,\"messages\":2,\"post_calls\":3,\"wrs\":5,\"completions\":3,\"errors\":1,",
                "\"cts_writes\":0,\"cts_wait_ns\":7,\"eager\":0,\"latency_log2_ns\":[{}],",
                "\"qps\":[{{\"qpn\":17,\"wrs\":2,\"bytes\":10,\"completions\":1,\"errors\":0}}]}}]}}\n"
            ),
            crate::VERSION,
            std::process::id(),
            latency,
        );
        assert_eq!(text, want);
        let parsed: serde_json::Value = serde_json::from_str(&text).expect("the file is JSON");
        assert_eq!(parsed["comms"][0]["peer"], "127.0.0.1:5\"x");
    }
}
