//! The exported C ABI: a drop-in `libibverbs.so.1` for rdma-core 44 consumers.
//!
//! The top layer: it converts C structs, WR chains and errnos and calls the
//! NIC's objects in [`crate::driver`]; nothing below imports it. Files:
//! `ctx.rs` (the `ibv_context` object), `context.rs` (device list, open,
//! device queries, async events), `port.rs` (port, GID and P_Key queries), `cmdfile.rs` (command files, for `ibv_import_*`),
//! `mr.rs`, `cq.rs`, `srq.rs`, `qp.rs`, `qp_ex.rs` (the `ibv_wr_*` builders), `misc.rs`, `stubs.rs` and `counters.rs` (softroce's own
//! `softroce_counters_get`).
//!
//! Contract:
//! * every `#[no_mangle] extern "C"` function runs its body inside
//!   [`ffi_guard!`], so a panic never unwinds into C; it becomes the error value
//!   of the function (NULL, -1, an errno value) with `errno = EIO`;
//! * objects handed to the application (`ibv_context`, `ibv_pd`, `ibv_mr`,
//!   `ibv_cq`, `ibv_qp`, ...) are the first field of a `#[repr(C)]` Rust struct
//!   allocated with `Box`; the C pointer is cast back to that struct, and the
//!   matching destroy verb frees it exactly once;
//! * verbs we do not implement fail with `EOPNOTSUPP` (or `ENOSYS` for the
//!   provider-private `ibv_cmd_*` family), returning NULL / -1 / the errno value
//!   exactly as rdma-core's own function does on that error, never a fake success.
//!
//! Verbs that rdma-core implements as `static inline` wrappers (`ibv_poll_cq`,
//! `ibv_post_send`, `ibv_query_port`, ...) reach us through the function
//! pointers we store in `ibv_context.ops` and in the enclosing `verbs_context`.

pub mod cmdfile;
pub mod context;
pub mod counters;
pub mod cq;
pub mod ctx;
pub mod misc;
pub mod mr;
pub mod port;
pub mod qp;
pub mod qp_ex;
pub mod srq;
pub mod stubs;

#[cfg(test)]
mod layout_tests;

/// Runs `$body` and turns a panic into `$on_panic` (with `errno = EIO`).
macro_rules! ffi_guard {
    ($on_panic:expr, $body:block) => {{
        match ::std::panic::catch_unwind(::std::panic::AssertUnwindSafe(|| $body)) {
            Ok(v) => v,
            Err(_) => {
                $crate::verbs::set_errno(::libc::EIO);
                $on_panic
            }
        }
    }};
}
pub(crate) use ffi_guard;

/// Sets the calling thread's `errno`.
pub fn set_errno(e: i32) {
    // SAFETY: __errno_location always returns a valid pointer to this thread's errno.
    unsafe { *libc::__errno_location() = e };
}

/// Reads the calling thread's `errno`.
pub fn errno() -> i32 {
    // SAFETY: as in set_errno.
    unsafe { *libc::__errno_location() }
}

/// Sets errno and returns NULL (the "pointer-returning verb failed" convention).
pub fn null_err<T>(e: i32) -> *mut T {
    set_errno(e);
    std::ptr::null_mut()
}

/// Sets errno and returns `e` (the "int-returning verb returns an errno value" convention).
pub fn int_err(e: i32) -> i32 {
    set_errno(e);
    e
}

/// Sets errno and returns -1 (for verbs documented as "-1 on error, errno set").
pub fn minus_one(e: i32) -> i32 {
    set_errno(e);
    -1
}
