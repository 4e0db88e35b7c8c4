//! The FFI boundary: panics never cross it, NULLs are checked, outputs are written only on
//! success, and every error is logged once and mapped to `ncclResult_t` in one place.

use crate::error::{code, Error, Result};

/// Runs `body` for the exported function `name`: `Ok` → ncclSuccess; `Err` → one WARN (unless the
/// error was already reported) and its code; a panic → one WARN and ncclInternalError.
pub(crate) fn call(name: &str, body: impl FnOnce() -> Result<()>) -> i32 {
    call_traced(name, body, Default::default)
}

/// [`call`], and then the call's line for `FERROCE_CALL_TRACE` ([`super::call_trace`]):
/// `describe` gives the arguments and outputs, and runs only when that line is logged.
pub(crate) fn call_traced(
    name: &str,
    body: impl FnOnce() -> Result<()>,
    describe: impl FnOnce() -> super::call_trace::Line,
) -> i32 {
    let rc = result_code(name, body);
    super::call_trace::record(name, rc, describe);
    rc
}

/// Runs an adapter that converts its arguments and then hands them to a [`call_traced`] slot
/// (or answers an error with [`call`]) for the exported function `name`: a panic in the
/// conversion becomes one WARN, one traced call and ncclInternalError, like a panic in a body.
pub(crate) fn guard(name: &str, adapter: impl FnOnce() -> i32) -> i32 {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(adapter)).unwrap_or_else(|panic| {
        let rc = panic_code(name, &*panic);
        super::call_trace::record(name, rc, Default::default);
        rc
    })
}

fn result_code(name: &str, body: impl FnOnce() -> Result<()>) -> i32 {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(())) => code::SUCCESS,
        Ok(Err(e)) => {
            if !e.logged {
                crate::log_warn!("{name}: {e}");
            }
            e.result_code()
        }
        Err(panic) => panic_code(name, &*panic),
    }
}

/// One WARN naming the panic; ncclInternalError.
fn panic_code(name: &str, panic: &(dyn std::any::Any + Send)) -> i32 {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    crate::log_warn!("{name}: internal error (panic: {what}); please report this to the ferroce developers");
    code::INTERNAL_ERROR
}

/// A non-NULL pointer or an internal error naming the argument.
pub(crate) fn non_null<T>(p: *mut T, what: &str) -> Result<*mut T> {
    if p.is_null() {
        Err(Error::internal(format!("{what} is NULL")))
    } else {
        Ok(p)
    }
}

/// A size NCCL passed as `int`, which must not be negative.
pub(crate) fn int_size(size: i32, what: &str) -> Result<usize> {
    usize::try_from(size).map_err(|_| Error::internal(format!("{what} is negative ({size})")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn success_error_and_panic_map_to_nccl_codes() {
        assert_eq!(call("t", || Ok(())), code::SUCCESS);
        assert_eq!(call("t", || Err(Error::remote("peer gone"))), code::REMOTE_ERROR);
        assert_eq!(call("t", || Err(Error::usage("bad env"))), code::INVALID_USAGE);
        assert_eq!(call("t", || panic!("boom")), code::INTERNAL_ERROR);
        assert_eq!(guard("t", || code::REMOTE_ERROR), code::REMOTE_ERROR);
        assert_eq!(guard("t", || panic!("boom")), code::INTERNAL_ERROR);
    }

    #[test]
    fn null_and_negative_arguments_are_internal_errors() {
        assert_eq!(
            non_null(std::ptr::null_mut::<u8>(), "x").unwrap_err().result_code(),
            code::INTERNAL_ERROR
        );
        assert_eq!(int_size(-1, "size").unwrap_err().result_code(), code::INTERNAL_ERROR);
        assert_eq!(int_size(7, "size").unwrap(), 7);
    }
}
