//! Logging through the logger NCCL hands to `init` (spec §1.2).
//!
//! NCCL's logger is a C variadic function; we always call it with the format `"%s"` and one
//! pre-formatted, NUL-terminated string, so no user text is ever interpreted as a format.
//! Before `init` (or when NCCL passed NULL) warnings go to stderr so they are never lost.

use std::ffi::{c_int, c_ulong, CString};
use std::sync::atomic::{AtomicUsize, Ordering};

/// `ncclDebugLogger_t`, declared with the ABI.
pub use crate::abi::types::NcclLogger;

/// `ncclDebugLogLevel` values.
pub mod level {
    pub const WARN: i32 = 2;
    pub const INFO: i32 = 3;
    pub const TRACE: i32 = 5;
}

/// `ncclDebugLogSubSys` bits a net plugin uses.
pub mod subsys {
    pub const INIT: u64 = 0x1;
    pub const NET: u64 = 0x10;
    pub const ENV: u64 = 0x80;
    pub const ALL: u64 = !0;
}

/// Every line we log starts with this, so users can grep for it.
pub const PREFIX: &str = "NET/ferroce";

static LOGGER: AtomicUsize = AtomicUsize::new(0);

/// Stores NCCL's logger; `None` keeps the previous one.
pub fn set_logger(logger: NcclLogger) {
    if let Some(f) = logger {
        LOGGER.store(f as usize, Ordering::Release);
    }
}

/// Forgets the logger (at the last finalize: the caller's code may be unloaded after it).
pub fn clear_logger() {
    LOGGER.store(0, Ordering::Release);
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
    match logger() {
        Some(log) => {
            let text = CString::new(text.replace('\0', " ")).unwrap_or_default();
            let file = CString::new(file).unwrap_or_default();
            // SAFETY: NCCL's logger is thread-safe (spec §1.2); the format "%s" consumes exactly
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

/// TRACE: compiled out unless the `trace` feature is on.
#[macro_export]
macro_rules! log_trace {
    ($($arg:tt)*) => {
        if cfg!(feature = "trace") {
            $crate::log::emit($crate::log::level::TRACE, $crate::log::subsys::NET, module_path!(), line!(), &format!($($arg)*))
        }
    };
}
