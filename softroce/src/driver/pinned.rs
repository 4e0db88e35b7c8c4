//! Locked-memory accounting, as the kernel does for `ibv_reg_mr` of user memory: every
//! registration pins its pages, the process's pinned bytes (over all its contexts) may not
//! pass `RLIMIT_MEMLOCK` unless it has `CAP_IPC_LOCK`, and past it the registration fails with
//! ENOMEM. DMA-BUF registrations pin no user pages and are not counted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Bytes pinned by the process's registrations (page-rounded).
static PINNED: AtomicU64 = AtomicU64::new(0);

/// `CAP_IPC_LOCK` (bit 14 of the effective capability set).
const CAP_IPC_LOCK: u32 = 14;

/// Whether the process may lock memory without limit (read once from /proc/self/status).
fn unlimited_by_capability() -> bool {
    static CAP: OnceLock<bool> = OnceLock::new();
    *CAP.get_or_init(|| {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
    })
}

/// The soft RLIMIT_MEMLOCK in bytes (`None`: unlimited).
fn memlock_limit() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) };
    (rc == 0 && r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

/// The bytes of whole pages `[addr, addr + len)` touches.
pub fn page_bytes(addr: usize, len: usize) -> u64 {
    if len == 0 {
        return 0;
    }
    let page = 4096u64;
    let start = addr as u64 / page;
    let end = (addr as u64).saturating_add(len as u64).div_ceil(page);
    (end - start) * page
}

/// Pin `bytes` more, or ENOMEM past RLIMIT_MEMLOCK (without CAP_IPC_LOCK).
pub fn pin(bytes: u64) -> Result<(), i32> {
    if bytes == 0 {
        return Ok(());
    }
    let limit = if unlimited_by_capability() {
        None
    } else {
        memlock_limit()
    };
    let mut cur = PINNED.load(Ordering::Relaxed);
    loop {
        let next = cur.saturating_add(bytes);
        if limit.is_some_and(|l| next > l) {
            return Err(libc::ENOMEM);
        }
        match PINNED.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return Ok(()),
            Err(now) => cur = now,
        }
    }
}

/// Give `bytes` back (a deregistration).
pub fn unpin(bytes: u64) {
    let _ = PINNED.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| Some(c.saturating_sub(bytes)));
}

/// Bytes pinned now.
pub fn pinned() -> u64 {
    PINNED.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registrations_count_whole_pages() {
        assert_eq!(page_bytes(0, 0), 0);
        assert_eq!(page_bytes(0, 1), 4096);
        assert_eq!(page_bytes(4095, 2), 8192);
        assert_eq!(page_bytes(4096, 4096), 4096);
    }
}
