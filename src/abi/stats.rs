//! `ferroce_stats_totals_get`: the plugin's own statistics summed over every comm the process
//! had, for a caller in the same process (the harness's `--stats`, which finds it with `dlsym`
//! on the plugin and takes snapshots around its timed iterations). The figures are those of
//! [`crate::transport::stats`], kept only when statistics are on (`FERROCE_STATS=DIR`, or
//! `NCCL_DEBUG=INFO`); otherwise `enabled` is 0 and every count 0.

use crate::transport::stats;

/// Version of [`FerroceStatsTotals`]; fields are only ever appended.
pub const FERROCE_STATS_TOTALS_VERSION: u32 = 2;

/// Totals of the plugin's per-comm counters, by side. `post_calls` and `wrs` count every post
/// (data writes, receives, CTS writes); `completions` every successful completion polled.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FerroceStatsTotals {
    /// `FERROCE_STATS_TOTALS_VERSION` of the plugin that filled it.
    pub version: u32,
    /// Bytes it filled.
    pub size: u32,
    /// 1 when comms keep statistics; 0: every count below is 0.
    pub enabled: u32,
    pub reserved: u32,
    pub send_comms: u64,
    /// isend requests completed (tested done).
    pub send_messages: u64,
    pub send_post_calls: u64,
    pub send_wrs: u64,
    pub send_completions: u64,
    pub recv_comms: u64,
    /// irecv requests completed (a grouped receive is one).
    pub recv_messages: u64,
    pub recv_post_calls: u64,
    pub recv_wrs: u64,
    pub recv_completions: u64,
    /// CTS writes the receivers posted (RDMA WRITEs into the senders' FIFOs).
    pub cts_writes: u64,
    /// Messages the senders sent eagerly (without waiting for a CTS).
    pub eager_sent: u64,
    /// Eager messages the receivers copied into their buffers.
    pub eager_delivered: u64,
    /// Version 2: `ibv_poll_cq` calls (empty ones too) on the send comms' and the receive comms'
    /// CQs. A caller's version-1 struct (120 bytes) gets the fields before these.
    pub send_cq_polls: u64,
    pub recv_cq_polls: u64,
}

/// Fills `*out` (`size` = the caller's `sizeof`, at least 8) with the totals now: as much of
/// the struct as fits, `size` saying how much. Returns 0 (ncclSuccess), or 3
/// (ncclInternalError) for a NULL `out` or a `size` below 8.
///
/// # Safety
/// `out` must be NULL or valid for writing `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn ferroce_stats_totals_get(out: *mut FerroceStatsTotals, size: usize) -> i32 {
    super::ffi::call("ferroce_stats_totals_get", || {
        let out = super::ffi::non_null(out, "ferroce_stats_totals_get: out")?;
        if size < 8 {
            return Err(crate::error::Error::internal(format!(
                "ferroce_stats_totals_get: size {size} cannot hold the version and size fields (pass sizeof the struct)"
            )));
        }
        let t = stats::side_totals();
        let mut v = FerroceStatsTotals {
            version: FERROCE_STATS_TOTALS_VERSION,
            size: 0,
            enabled: u32::from(stats::enabled()),
            reserved: 0,
            send_comms: t.send.comms,
            send_messages: t.send.messages,
            send_post_calls: t.send.post_calls,
            send_wrs: t.send.wrs,
            send_completions: t.send.completions,
            recv_comms: t.recv.comms,
            recv_messages: t.recv.messages,
            recv_post_calls: t.recv.post_calls,
            recv_wrs: t.recv.wrs,
            recv_completions: t.recv.completions,
            cts_writes: t.recv.cts_writes,
            eager_sent: t.send.eager,
            eager_delivered: t.recv.eager,
            send_cq_polls: t.send.cq_polls,
            recv_cq_polls: t.recv.cq_polls,
        };
        let n = size.min(std::mem::size_of::<FerroceStatsTotals>());
        v.size = n as u32;
        // SAFETY: `out` is valid for `size` >= n bytes per the contract; `v` is a plain repr(C)
        // value on our stack of at least n bytes.
        unsafe { std::ptr::copy_nonoverlapping(&v as *const FerroceStatsTotals as *const u8, out as *mut u8, n) };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_is_the_headers_and_bad_calls_fail() {
        assert_eq!(std::mem::size_of::<FerroceStatsTotals>(), 136);
        assert_eq!(std::mem::offset_of!(FerroceStatsTotals, send_comms), 16);
        assert_eq!(std::mem::offset_of!(FerroceStatsTotals, cts_writes), 96);
        assert_eq!(std::mem::offset_of!(FerroceStatsTotals, eager_delivered), 112);
        assert_eq!(std::mem::offset_of!(FerroceStatsTotals, recv_cq_polls), 128);
        let mut t = FerroceStatsTotals::default();
        // SAFETY: a valid struct of its own size.
        let rc = unsafe { ferroce_stats_totals_get(&mut t, std::mem::size_of::<FerroceStatsTotals>()) };
        assert_eq!(rc, 0);
        assert_eq!(
            (t.version, t.size as usize),
            (FERROCE_STATS_TOTALS_VERSION, std::mem::size_of::<FerroceStatsTotals>())
        );
        // A version-1 caller's struct (120 bytes) gets the fields before the CQ polls.
        let mut v1 = FerroceStatsTotals::default();
        // SAFETY: `v1` is valid for its 136 bytes; 120 are asked for.
        assert_eq!(unsafe { ferroce_stats_totals_get(&mut v1, 120) }, 0);
        assert_eq!((v1.size, v1.send_cq_polls, v1.recv_cq_polls), (120, 0, 0));
        // SAFETY: NULL and a short size are refused before any write.
        assert_ne!(unsafe { ferroce_stats_totals_get(std::ptr::null_mut(), 104) }, 0);
        // SAFETY: as above.
        assert_ne!(unsafe { ferroce_stats_totals_get(&mut t, 4) }, 0);
    }
}
