//! `softroce_counters_get`: the process's verbs work counters ([`crate::driver::counters`]) for
//! an application in the same process (the harness's `--stats`), found with
//! `dlsym(dlopen("libibverbs.so.1", RTLD_NOLOAD), "softroce_counters_get")` — absent from a real
//! libibverbs, which is how a caller knows no softroce is there. The struct is declared in
//! `softroce/include/softroce_counters.h`.

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
}
