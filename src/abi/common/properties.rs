//! `getProperties` of every layout from the newest form, and `makeVDevice`.

use crate::abi::call_trace::{read, shown, Line};
use crate::abi::ffi::{self, non_null};
use crate::abi::types::*;
use crate::api;
use crate::error::Error;
use std::ffi::c_int;

/// Fills any version's properties struct from the newest form.
pub(crate) fn get_properties<P>(
    name: &str,
    dev: c_int,
    props: *mut P,
    convert: impl FnOnce(&api::Properties) -> P,
) -> NcclResult {
    ffi::call_traced(
        name,
        || {
            let out = non_null(props, "props")?;
            let p = api::properties(dev)?;
            // SAFETY: NCCL passes a (possibly uninitialized) struct of this version's layout; we
            // write it whole without reading it.
            unsafe { out.write(convert(&p)) };
            Ok(())
        },
        || Line::of(format!("dev {dev}, props {props:p}")),
    )
}

/// `ptrSupport` of a device.
pub(crate) fn ptr_support(p: &api::Properties) -> c_int {
    let mut bits = NCCL_PTR_HOST;
    if p.memory.cuda {
        bits |= NCCL_PTR_CUDA;
    }
    if p.memory.dmabuf {
        bits |= NCCL_PTR_DMABUF;
    }
    bits
}

/// The member list of a device in a fixed-size vProps array.
pub(crate) fn vprops<const N: usize>(p: &api::Properties) -> (c_int, [c_int; N]) {
    let mut devs = [0; N];
    for (d, s) in devs.iter_mut().zip(&p.vdevs) {
        *d = *s;
    }
    (p.vdevs.len().min(N) as c_int, devs)
}

/// `makeVDevice` for a vProps type with `N` member slots.
pub(crate) fn make_vdevice(d: *mut c_int, ndevs: c_int, devs: &[c_int], max: usize) -> NcclResult {
    ffi::call_traced(
        "makeVDevice",
        || {
            let out = non_null(d, "d")?;
            let n = ffi::int_size(ndevs, "vProps.ndevs")?;
            if n > devs.len() {
                return Err(Error::internal(format!("makeVDevice with ndevs={n} (at most {max})")));
            }
            let idx = api::make_vdevice(&devs[..n], max)?;
            // SAFETY: non-NULL out-pointer.
            unsafe { *out = idx };
            Ok(())
        },
        || {
            let members = &devs[..usize::try_from(ndevs).unwrap_or(0).min(devs.len())];
            // SAFETY: NCCL's out-pointer, NULL or writable.
            Line::of(format!("devs {members:?}, d -> {}", shown(unsafe { read(d) })))
        },
    )
}

/// # Safety
/// `d` is NULL (an error) or writable; `props` is NULL (an error) or a valid v9 vProps.
pub(crate) unsafe extern "C" fn make_vdevice_v9(d: *mut c_int, props: *mut NcclNetVDevicePropsV9) -> NcclResult {
    // SAFETY: NCCL passes NULL or a valid vProps struct.
    unsafe { make_vdevice_from(d, props, NCCL_NET_MAX_DEVS_PER_NIC_V9, |p| (p.ndevs, &p.devs[..])) }
}

/// `makeVDevice` for the vProps layout `P`: `members` reads its member count and slots, of which
/// at most `max` are allowed.
///
/// # Safety
/// `props` is NULL (an error) or a valid `P` for the call.
pub(crate) unsafe fn make_vdevice_from<P>(
    d: *mut c_int,
    props: *mut P,
    max: usize,
    members: impl FnOnce(&P) -> (c_int, &[c_int]),
) -> NcclResult {
    ffi::guard("makeVDevice", || match non_null(props, "vProps") {
        Ok(p) => {
            // SAFETY: non-NULL; valid per the contract.
            let (ndevs, devs) = members(unsafe { &*p });
            make_vdevice(d, ndevs, devs, max)
        }
        Err(e) => ffi::call("makeVDevice", || Err(e)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::code;

    const MAX: usize = NCCL_NET_MAX_DEVS_PER_NIC_V9;

    /// A panic while the shim reads NCCL's vProps, before the traced call, is ncclInternalError
    /// and leaves `d` as it was.
    #[test]
    fn a_panic_reading_vprops_is_an_internal_error() {
        let mut props = NcclNetVDevicePropsV9 {
            ndevs: 1,
            devs: [0; MAX],
        };
        let mut d = -7;
        // SAFETY: both pointers are valid for the call.
        let rc = unsafe { make_vdevice_from(&mut d, &mut props, MAX, |_| panic!("reading vProps")) };
        assert_eq!(rc, code::INTERNAL_ERROR);
        assert_eq!(d, -7);
    }

    #[test]
    fn null_vprops_is_an_internal_error() {
        let mut d = -7;
        // SAFETY: d is writable; props is NULL, which the contract allows.
        let rc = unsafe { make_vdevice_v9(&mut d, std::ptr::null_mut()) };
        assert_eq!(rc, code::INTERNAL_ERROR);
        assert_eq!(d, -7);
    }
}
