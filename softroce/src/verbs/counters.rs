//! `softroce_counters_get`: the process's verbs work counters ([`crate::driver::counters`]) for
//! an application in the same process (the harness's `--stats`), found with
//! `dlsym(dlopen("libibverbs.so.1", RTLD_NOLOAD), "softroce_counters_get")` — absent from a real
//! libibverbs, which is how a caller knows no softroce is there. The struct is declared in
//! `softroce/include/softroce_counters.h`.
//!
//! `softroce_qp_transport_get`: one QP's transport events (ACK timeouts, retransmissions, RNR and
//! sequence NAKs received), what a real NIC keeps only per port (mlx5's `hw_counters`), for an
//! application that wants to tell apart a silent peer from one whose receiver is not ready
//! (ferroce's hang report, docs/observability.md#hang-reports).

use std::ffi::c_int;

use super::ffi_guard;
use crate::driver::counters::{self, CountersRepr};

/// Fills `*out` (of `size` bytes: the caller's `sizeof(struct softroce_counters)`) with the
/// process's counters: as much of this library's struct as fits, `version` and `size` saying
/// what was filled (an older caller's shorter struct gets its own fields, a newer caller's
/// longer one keeps its extra fields untouched). 0 on success, `EINVAL` when `out` is NULL or
/// `size` cannot hold the version and size fields.
///
/// # Safety
/// `out` must be NULL or valid for writing `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn softroce_counters_get(out: *mut CountersRepr, size: usize) -> c_int {
    ffi_guard!(libc::EIO, {
        if out.is_null() || size < 8 {
            return libc::EINVAL;
        }
        let mut c = counters::process();
        let n = size.min(std::mem::size_of::<CountersRepr>());
        c.size = n as u32;
        // SAFETY: `out` is valid for `size` >= n bytes per the contract, `c` is a plain
        // repr(C) struct of n or more bytes, and the two do not overlap (`c` is on our stack).
        unsafe { std::ptr::copy_nonoverlapping(&c as *const CountersRepr as *const u8, out as *mut u8, n) };
        0
    })
}

/// Version of [`QpTransportRepr`] (fields are only ever appended).
pub const QP_TRANSPORT_VERSION: u32 = 1;

/// `struct softroce_qp_transport` (`softroce/include/softroce_counters.h`): one QP's transport
/// events since it was created, from its core's statistics.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct QpTransportRepr {
    pub version: u32,
    /// Bytes of the struct the library filled.
    pub size: u32,
    /// Local ACK timeouts (each consumes one `retry_cnt`): the responder did not answer.
    pub timeouts: u64,
    /// Request packets sent again (timeouts, NAKs, probes).
    pub retransmits: u64,
    /// RNR NAKs received: the responder's receive queue was empty.
    pub rnr_naks_received: u64,
    /// PSN sequence error NAKs received.
    pub seq_naks_received: u64,
}

/// Fills `*out` (of `size` bytes) with the transport events of `qp`, as much of this library's
/// struct as fits (`version` and `size` say what was filled). 0 on success, `EINVAL` when `qp` or
/// `out` is NULL or `size` cannot hold the version and size fields.
///
/// # Safety
/// `qp` must be NULL or a live QP of this library; `out` NULL or valid for writing `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn softroce_qp_transport_get(
    qp: *mut rdma_sys::ibv_qp,
    out: *mut QpTransportRepr,
    size: usize,
) -> c_int {
    ffi_guard!(libc::EIO, {
        // SAFETY: NULL or a live QP of ours, per the contract.
        let Some(q) = (unsafe { super::qp::Qp::from_ibv(qp) }) else {
            return libc::EINVAL;
        };
        if out.is_null() || size < 8 {
            return libc::EINVAL;
        }
        let st = q.shared.lock_core().stats();
        let n = size.min(std::mem::size_of::<QpTransportRepr>());
        let c = QpTransportRepr {
            version: QP_TRANSPORT_VERSION,
            size: n as u32,
            timeouts: st.timeouts,
            retransmits: st.retransmits,
            rnr_naks_received: st.rnr_naks_received,
            seq_naks_received: st.seq_naks_received,
        };
        // SAFETY: `out` is valid for `size` >= n bytes per the contract; `c` is on our stack.
        unsafe { std::ptr::copy_nonoverlapping(&c as *const QpTransportRepr as *const u8, out as *mut u8, n) };
        0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_struct_gets_its_part_and_a_bad_call_einval() {
        let mut whole = CountersRepr::default();
        // SAFETY: a valid struct of its own size.
        let rc = unsafe { softroce_counters_get(&mut whole, std::mem::size_of::<CountersRepr>()) };
        assert_eq!(rc, 0);
        assert_eq!(whole.version, counters::COUNTERS_VERSION);
        assert_eq!(whole.size as usize, std::mem::size_of::<CountersRepr>());
        let mut short = [0xffu8; 16];
        // SAFETY: 16 writable bytes.
        let rc = unsafe { softroce_counters_get(short.as_mut_ptr() as *mut CountersRepr, 16) };
        assert_eq!(rc, 0);
        assert_eq!(u32::from_ne_bytes(short[4..8].try_into().unwrap()), 16);
        // SAFETY: NULL and a too-short size are refused before any write.
        let rc = unsafe { softroce_counters_get(std::ptr::null_mut(), 200) };
        assert_eq!(rc, libc::EINVAL);
        // SAFETY: as above.
        let rc = unsafe { softroce_counters_get(short.as_mut_ptr() as *mut CountersRepr, 4) };
        assert_eq!(rc, libc::EINVAL);
    }

    #[test]
    fn qp_transport_layout_and_a_bad_call_einval() {
        use std::mem::{offset_of, size_of};
        assert_eq!(size_of::<QpTransportRepr>(), 40);
        assert_eq!(offset_of!(QpTransportRepr, timeouts), 8);
        assert_eq!(offset_of!(QpTransportRepr, seq_naks_received), 32);
        let mut out = QpTransportRepr::default();
        // SAFETY: a NULL QP is refused before anything is read or written.
        let rc = unsafe { softroce_qp_transport_get(std::ptr::null_mut(), &mut out, size_of::<QpTransportRepr>()) };
        assert_eq!(rc, libc::EINVAL);
        assert_eq!(out, QpTransportRepr::default());
    }
}
