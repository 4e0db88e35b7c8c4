//! `getProperties` of every layout from the newest form, and `makeVDevice`.

use crate::abi::call_trace::{read, shown, Line};
use crate::abi::ffi::{self, non_null};
use crate::abi::types::*;
use crate::api;
use crate::error::Error;
use std::ffi::c_int;

/// Fills any version's properties struct from the newest form.
pub fn get_properties<P>(
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
pub fn ptr_support(p: &api::Properties) -> c_int {
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
pub fn vprops<const N: usize>(p: &api::Properties) -> (c_int, [c_int; N]) {
    let mut devs = [0; N];
    for (d, s) in devs.iter_mut().zip(&p.vdevs) {
        *d = *s;
    }
    (p.vdevs.len().min(N) as c_int, devs)
}

/// `makeVDevice` for a vProps type with `N` member slots.
pub fn make_vdevice(d: *mut c_int, ndevs: c_int, devs: &[c_int], max: usize) -> NcclResult {
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
pub unsafe extern "C" fn make_vdevice_v9(d: *mut c_int, props: *mut NcclNetVDevicePropsV9) -> NcclResult {
    match non_null(props, "vProps") {
        // SAFETY: NCCL passes a valid vProps struct.
        Ok(p) => unsafe { make_vdevice(d, (*p).ndevs, &(*p).devs, NCCL_NET_MAX_DEVS_PER_NIC_V9) },
        Err(e) => ffi::call("makeVDevice", || Err(e)),
    }
}
