//! Logging through the logger NCCL hands to `init` (docs/nccl-net-abi.md#logging).
//!
//! NCCL's logger is a C variadic function; we always call it with the format `"%s"` and one
//! pre-formatted, NUL-terminated string, so no user text is ever interpreted as a format.
//! Before `init` (or when NCCL passed NULL) warnings go to stderr so they are never lost.

use std::ffi::{c_char, c_int, c_ulong, CString};
use std::sync::atomic::{AtomicUsize, Ordering};

/// `ncclDebugLogger_t` (nullable): level, subsystem flags, file, line, printf format, arguments.
pub type NcclLogger = Option<
    unsafe extern "C" fn(level: c_int, flags: c_ulong, file: *const c_char, line: c_int, fmt: *const c_char, ...),
>;

/// `ncclDebugLogLevel` values.
///
/// cbindgen:ignore
pub mod level {
    pub const WARN: i32 = 2;
    pub const INFO: i32 = 3;
    pub const TRACE: i32 = 5;
}

/// `ncclDebugLogSubSys` bits a net plugin uses.
///
/// cbindgen:ignore
pub mod subsys {
    pub const INIT: u64 = 0x1;
    pub const NET: u64 = 0x10;
    pub const ENV: u64 = 0x80;
    pub const ALL: u64 = !0;
}

/// Every line we log starts with this, so users can grep for it.
pub const PREFIX: &str = "NET/ferroce";

// (`NcclLogger` is declared here, by its one caller; the ABI tables re-export it, and
// cbindgen reads this file for the C header.)

/// Whether [`log_trace!`](crate::log_trace) lines exist: only in builds with the `trace`
/// feature (evaluated here, in this crate, wherever the macro expands).
pub const TRACE: bool = cfg!(feature = "trace");

#[cfg(test)]
thread_local! {
    /// Every line [`emit`] was given on this thread (unit tests read it).
    static EMITTED: std::cell::RefCell<Vec<(i32, String)>> = const { std::cell::RefCell::new(Vec::new()) };
}

static LOGGER: AtomicUsize = AtomicUsize::new(0);

/// Stores NCCL's logger; `None` keeps the previous one.
pub fn set_logger(logger: NcclLogger) {
    if let Some(f) = logger {
        LOGGER.store(f as usize, Ordering::Release);
    }
}

fn logger() -> NcclLogger {
    let raw = LOGGER.load(Ordering::Acquire);
    // SAFETY: the only values stored are 0 and function pointers of this type (set_logger);
    // Option<fn> has the null-pointer niche, so 0 is None.
    unsafe { std::mem::transmute::<usize, NcclLogger>(raw) }
}

/// Sends one line to NCCL's logger. `file` is printed by NCCL for WARN lines.
pub fn emit(level: i32, flags: u64, file: &'static str, line: u32, message: &str) {
    let text = format!("{PREFIX} {message}");
    #[cfg(test)]
    EMITTED.with(|e| e.borrow_mut().push((level, text.clone())));
    match logger() {
        Some(log) => {
            let text = CString::new(text.replace('\0', " ")).unwrap_or_default();
            let file = CString::new(file).unwrap_or_default();
            // SAFETY: NCCL's logger is thread-safe (docs/nccl-net-abi.md#logging); the format "%s"
            // consumes exactly
            // the one NUL-terminated string argument we pass; all pointers outlive the call.
            unsafe {
                log(
                    level,
                    flags as c_ulong,
                    file.as_ptr(),
                    line as c_int,
                    c"%s".as_ptr(),
                    text.as_ptr(),
                )
            };
        }
        None if level == level::WARN => eprintln!("{text}"),
        None => {}
    }
}

/// WARN: shown to users and stored by NCCL as the communicator's last error.
#[macro_export]
macro_rules! log_warn {
    ($($arg:tt)*) => {
        $crate::log::emit($crate::log::level::WARN, $crate::log::subsys::ALL, file!(), line!(), &format!($($arg)*))
    };
}

/// INFO with a subsystem mask, e.g. `log_info!(subsys::INIT | subsys::NET, "...")`.
#[macro_export]
macro_rules! log_info {
    ($flags:expr, $($arg:tt)*) => {
        $crate::log::emit($crate::log::level::INFO, $flags, module_path!(), line!(), &format!($($arg)*))
    };
}

/// TRACE: compiled out unless the `trace` feature is on (the arguments are type-checked, never
/// evaluated).
#[macro_export]
macro_rules! log_trace {
    ($($arg:tt)*) => {
        if $crate::log::TRACE {
            $crate::log::emit($crate::log::level::TRACE, $crate::log::subsys::NET, module_path!(), line!(), &format!($($arg)*))
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take_emitted() -> Vec<(i32, String)> {
        EMITTED.with(|e| e.take())
    }

    #[test]
    fn trace_lines_exist_only_with_the_trace_feature() {
        take_emitted();
        let mut evaluated = false;
        crate::log_trace!("step {}", {
            evaluated = true;
            7
        });
        let lines = take_emitted();
        if cfg!(feature = "trace") {
            assert_eq!(lines, vec![(level::TRACE, format!("{PREFIX} step 7"))]);
            assert!(evaluated);
        } else {
            assert!(lines.is_empty(), "{lines:?}");
            assert!(!evaluated, "compiled out: the arguments are never evaluated");
        }
    }

    #[test]
    fn warn_and_info_carry_the_prefix() {
        take_emitted();
        crate::log_info!(subsys::NET, "ready");
        assert_eq!(take_emitted(), vec![(level::INFO, format!("{PREFIX} ready"))]);
    }
}
