//! `FERROCE_CALL_TRACE=N`: what NCCL asks of the plugin, call by call.
//!
//! Each call into the plugin becomes one INFO line (subsystem NET) with its sequence number, the
//! calling thread, its arguments and its result, so a run with real NCCL shows which table entries
//! it uses, in which order, from which threads, with which sizes, memory types and flushes.
//!
//! * Setup and teardown calls are all logged.
//! * The data path calls (isend, irecv, test, iflush, and setNetAttr, which NCCL 2.28 calls
//!   before each of them and before every connect and accept), which run millions of times, and
//!   the quiet calls (a connect or accept that is not done yet, a test of an unfinished request)
//!   only until N of them were logged.
//! * Every call is counted, and the counts go to one INFO line at `finalize`.
//!
//! Off (N = 0), a call costs one relaxed load.

use crate::log::subsys;
use std::sync::atomic::{AtomicU64, Ordering};

/// The entry points, by the names [`super::ffi::call`] is given.
const ENTRIES: [&str; 18] = [
    "init",
    "devices",
    "getProperties",
    "makeVDevice",
    "setNetAttr",
    "listen",
    "connect",
    "accept",
    "regMr",
    "deregMr",
    "isend",
    "irecv",
    "iflush",
    "test",
    "closeSend",
    "closeRecv",
    "closeListen",
    "finalize",
];

/// The calls on the data path: logged only until the limit. NCCL 2.28 calls setNetAttr before
/// every connect, accept, isend and irecv.
const DATA_PATH: [&str; 5] = ["isend", "irecv", "iflush", "test", "setNetAttr"];

/// 0: not decided yet (the config is read after `init` set NCCL's logger); 1: off; 2: on.
static STATE: AtomicU64 = AtomicU64::new(0);
static SEQUENCE: AtomicU64 = AtomicU64::new(0);
static DATA_PATH_LOGGED: AtomicU64 = AtomicU64::new(0);
static COUNTS: [AtomicU64; ENTRIES.len()] = [const { AtomicU64::new(0) }; ENTRIES.len()];

fn limit() -> u64 {
    crate::config::get().call_trace
}

/// Whether calls are traced. Decided at the end of the first call, `init`, which has set NCCL's
/// logger by then (the config logs its INFO line when first read).
fn enabled() -> bool {
    match STATE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let on = limit() > 0;
            STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            on
        }
    }
}

/// What a call's trace line says: its arguments and outputs, and whether it was a quiet one (a
/// retry that changed nothing).
#[derive(Default)]
pub(crate) struct Line {
    pub text: String,
    pub quiet: bool,
}

impl Line {
    pub(crate) fn of(text: String) -> Line {
        Line { text, quiet: false }
    }
}

/// Records one finished call; `describe` runs only when calls are traced.
pub(super) fn record(name: &str, rc: i32, describe: impl FnOnce() -> Line) {
    if !enabled() {
        return;
    }
    if let Some(i) = ENTRIES.iter().position(|e| *e == name) {
        COUNTS[i].fetch_add(1, Ordering::Relaxed);
    }
    let seq = SEQUENCE.fetch_add(1, Ordering::Relaxed) + 1;
    let data_path = DATA_PATH.contains(&name);
    if data_path && DATA_PATH_LOGGED.load(Ordering::Relaxed) >= limit() {
        // Past the limit: counted above, and not described (millions of calls).
        return;
    }
    let line = describe();
    if data_path || (line.quiet && rc == 0) {
        let logged = DATA_PATH_LOGGED.fetch_add(1, Ordering::Relaxed);
        if logged >= limit() {
            return;
        }
        if logged + 1 == limit() {
            crate::log_info!(
                subsys::NET,
                "call trace: {} data path and retry calls logged (FERROCE_CALL_TRACE), only counted from here on",
                limit()
            );
        }
    }
    crate::log_info!(
        subsys::NET,
        "call {seq} [{}] {name}({}) = {rc}",
        thread_tag(),
        line.text
    );
}

/// The counts so far as one line, e.g. `init 1, devices 1, ..., test 12345`; entries never called
/// are left out.
pub(super) fn counts() -> String {
    ENTRIES
        .iter()
        .zip(&COUNTS)
        .filter_map(|(name, n)| {
            let n = n.load(Ordering::Relaxed);
            (n > 0).then(|| format!("{name} {n}"))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Logs [`counts`] (at `finalize`, when tracing).
pub(super) fn log_counts() {
    if STATE.load(Ordering::Relaxed) == 2 {
        crate::log_info!(subsys::NET, "call trace: calls from NCCL so far: {}", counts());
    }
}

/// The calling thread as the kernel names it (NCCL names its threads, e.g. `NCCL Progress`),
/// with its id.
fn thread_tag() -> String {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let mut name = [0u8; 32];
    // SAFETY: the buffer is writable for its length; pthread_self is always valid.
    let rc = unsafe { libc::pthread_getname_np(libc::pthread_self(), name.as_mut_ptr().cast(), name.len()) };
    let len = name.iter().position(|&b| b == 0).unwrap_or(0);
    if rc == 0 && len > 0 {
        format!("{tid} {}", String::from_utf8_lossy(&name[..len]))
    } else {
        tid.to_string()
    }
}

/// The value an out-pointer holds after the call, if the pointer is not NULL.
///
/// # Safety
/// `p` is NULL or readable (the caller's out-pointer, written or left as NCCL passed it).
pub(super) unsafe fn read<T: Copy>(p: *const T) -> Option<T> {
    // SAFETY: per the contract.
    (!p.is_null()).then(|| unsafe { p.read() })
}

/// An out-pointer's value as the log shows it (`-` when the pointer itself is NULL).
///
/// # Safety
/// As [`read`].
pub(super) unsafe fn out_ptr<T>(p: *const *mut T) -> String {
    // SAFETY: per the contract.
    shown(unsafe { read(p) })
}

/// A value read back from an out-pointer (`-`: the out-pointer was NULL).
pub(super) fn shown(value: Option<impl std::fmt::Debug>) -> String {
    value.map_or_else(|| "-".into(), |v| format!("{v:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_name_of_the_abi_layer_is_counted() {
        // Every name the ABI layer gives ffi::call, ffi::call_traced, ffi::guard, get_properties
        // or close_comm is one of ENTRIES (a name missing there would be logged but never counted).
        let files = [
            "common/close.rs",
            "common/data.rs",
            "common/memory.rs",
            "common/properties.rs",
            "common/setup.rs",
            "v6.rs",
            "v7.rs",
            "v8.rs",
            "v9.rs",
            "v10.rs",
            "v11.rs",
            "v12.rs",
        ];
        let mut names = Vec::new();
        for file in files {
            let path = format!("{}/src/abi/{file}", env!("CARGO_MANIFEST_DIR"));
            let text = std::fs::read_to_string(path).unwrap();
            for opener in ["call(", "call_traced(", "guard(", "get_properties(", ">("] {
                for part in text.split(opener).skip(1) {
                    if let Some(quoted) = part.trim_start().strip_prefix('"') {
                        names.push(quoted.split('"').next().unwrap_or_default().to_string());
                    }
                }
            }
        }
        assert!(names.iter().filter(|n| *n == "setNetAttr").count() == 1, "{names:?}");
        let missing: Vec<&String> = names.iter().filter(|n| !ENTRIES.contains(&n.as_str())).collect();
        assert!(missing.is_empty(), "not in call_trace::ENTRIES: {missing:?}");
        for d in DATA_PATH {
            assert!(ENTRIES.contains(&d));
        }
    }
}
