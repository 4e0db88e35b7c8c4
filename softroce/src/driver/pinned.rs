//! Pinning user memory, as the kernel does for `ibv_reg_mr`:
//!
//! * Every page of the range must be mapped and readable, and writable when the access flags
//!   let the NIC write it; else the registration fails with EFAULT (the kernel's
//!   `get_user_pages`), not later with a fault in the engine thread. A GPU pointer without a
//!   peer-memory module is such a range: CUDA reserves its addresses without access.
//! * Every registration pins its pages, the process's pinned bytes (over all its contexts) may
//!   not pass `RLIMIT_MEMLOCK` unless it has `CAP_IPC_LOCK`, and past it the registration fails
//!   with ENOMEM. DMA-BUF registrations pin no user pages and are not counted.

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

/// Whether `[addr, addr + len)` lies in mappings of `maps` (the text of `/proc/self/maps`) that
/// are readable, and writable when `writable`, without a gap.
fn mapped_in(maps: &str, addr: usize, len: usize, writable: bool) -> bool {
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    let mut at = addr;
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16)) else {
            continue;
        };
        if hi <= at {
            continue;
        }
        let perms = perms.as_bytes();
        let allowed = perms.first() == Some(&b'r') && (!writable || perms.get(1) == Some(&b'w'));
        if lo > at || !allowed {
            return false;
        }
        at = hi;
        if at >= end {
            return true;
        }
    }
    false
}

/// EFAULT unless every page of `[addr, addr + len)` is mapped, readable, and writable when
/// `writable` (the kernel's check when it pins the pages). An empty range is always fine.
pub fn check_mapped(addr: usize, len: usize, writable: bool) -> Result<(), i32> {
    if len == 0 {
        return Ok(());
    }
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(|_| libc::EFAULT)?;
    if mapped_in(&maps, addr, len, writable) {
        Ok(())
    } else {
        Err(libc::EFAULT)
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

    const MAPS: &str = "\
1000-3000 rw-p 00000000 00:00 0                          [heap]
3000-4000 r--p 00000000 08:01 42                         /usr/lib/x.so
4000-5000 ---p 00000000 00:00 0
6000-8000 rw-s 00000000 00:05 7                          /memfd:buf (deleted)
";

    #[test]
    fn a_range_must_be_mapped_without_gaps_and_with_the_access_it_needs() {
        assert!(mapped_in(MAPS, 0x1000, 0x2000, true));
        assert!(mapped_in(MAPS, 0x2fff, 2, false), "across two readable mappings");
        assert!(!mapped_in(MAPS, 0x2fff, 2, true), "the second one is read-only");
        assert!(!mapped_in(MAPS, 0x4000, 1, false), "no access (a reserved range)");
        assert!(!mapped_in(MAPS, 0x5000, 1, false), "not mapped");
        assert!(!mapped_in(MAPS, 0x7000, 0x1001, false), "runs past the last mapping");
        assert!(
            !mapped_in(MAPS, 0x800, 0x1000, false),
            "starts before the first mapping"
        );
        assert!(mapped_in(MAPS, 0x6000, 0x2000, true));
        assert!(!mapped_in(MAPS, usize::MAX, 2, false));
    }

    #[test]
    fn this_process_s_own_memory_is_mapped_and_a_reserved_or_unmapped_range_is_not() {
        let v = vec![7u8; 3 * 4096];
        assert_eq!(check_mapped(v.as_ptr() as usize, v.len(), true), Ok(()));
        // SAFETY: a fresh anonymous mapping, unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        assert_eq!(check_mapped(p as usize, 4096, false), Err(libc::EFAULT));
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(p, 4096) };
        // The page just unmapped is not checked: another test thread may map it again at once.
        // The first page of the address space is never mapped (vm.mmap_min_addr).
        assert_eq!(check_mapped(0, 4096, false), Err(libc::EFAULT));
        assert_eq!(check_mapped(0, 0, false), Ok(()));
    }

    #[test]
    fn registrations_count_whole_pages() {
        assert_eq!(page_bytes(0, 0), 0);
        assert_eq!(page_bytes(0, 1), 4096);
        assert_eq!(page_bytes(4095, 2), 8192);
        assert_eq!(page_bytes(4096, 4096), 4096);
    }
}
