//! Each RDMA device and libibverbs itself: where libibverbs was loaded from, the device's
//! firmware and GUID, its PCI function and PCIe ACS on the way to it.

use crate::check::Check;
use crate::sysinfo;
use ferroce::config::Config;
use ferroce::device;
use ferroce::ibv::{Context, Verbs};

/// Where libibverbs was loaded from and its version (from the file name rdma-core installs).
pub(super) fn libibverbs_check(verbs: &Verbs) -> Check {
    // SAFETY: Dl_info is plain pointers, for which all zeroes (NULL) is valid.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: the address is a function of the loaded library; info is a valid out-pointer.
    let found = unsafe { libc::dladdr(verbs.ibv_get_device_list as *const libc::c_void, &mut info) } != 0;
    let file = if found && !info.dli_fname.is_null() {
        // SAFETY: dladdr set dli_fname to a NUL-terminated path that lives as long as the library.
        unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }
            .to_string_lossy()
            .into_owned()
    } else {
        verbs.path.clone()
    };
    let real = std::fs::canonicalize(&file)
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or(file.clone());
    let version = real
        .rsplit('/')
        .next()
        .and_then(|n| n.strip_prefix("libibverbs.so."))
        .filter(|v| v.split('.').count() == 4)
        .map(|v| format!("{v} (rdma-core {})", v.split('.').nth(2).unwrap_or("?")));
    let version = version.unwrap_or_else(|| {
        if real.contains("softroce") {
            "softroce (ferroce's userspace RoCE NIC, rdma-core 44 ABI)".into()
        } else {
            "version not in the file name".into()
        }
    });
    let mut missing = Vec::new();
    if verbs.ibv_reg_dmabuf_mr.is_none() {
        missing.push("ibv_reg_dmabuf_mr (DMA-BUF, rdma-core ≥ 34)");
    }
    if verbs._ibv_query_gid_ex.is_none() {
        missing.push("ibv_query_gid_ex (rdma-core ≥ 32)");
    }
    let value = format!("{real}: {version}");
    if missing.is_empty() {
        Check::ok("libibverbs", value)
    } else {
        Check::warn(
            "libibverbs",
            format!("{value}; lacks {}", missing.join(", ")),
            "a newer rdma-core (Debian 12 has 44)",
        )
    }
}

fn pci_function(ctx: &Context) -> Option<String> {
    std::fs::canonicalize(format!("{}/device", ctx.info.ibdev_path))
        .ok()
        .map(|p| p.to_string_lossy().into_owned())
        .filter(|p| p.contains("/pci"))
}

/// `ibv_devinfo`'s spelling of a GUID: `0002:c903:00a1:b2c3`.
pub fn format_guid(guid: u64) -> String {
    let h = format!("{guid:016x}");
    format!("{}:{}:{}:{}", &h[0..4], &h[4..8], &h[8..12], &h[12..16])
}

pub(super) fn device_checks(ctx: &Context, cfg: &Config) -> Vec<Check> {
    let name = &ctx.info.name;
    let mut out = vec![Check::ok(
        format!("{name} device"),
        format!(
            "vendor {:#x} part {:#x}, {} port(s), sys_image_guid {} (NCCL guid {:#x})",
            ctx.info.vendor_id,
            ctx.info.vendor_part_id,
            ctx.info.phys_port_cnt,
            format_guid(ctx.info.sys_image_guid),
            device::nccl_guid(ctx.info.sys_image_guid)
        ),
    )];
    let Some(pci) = pci_function(ctx) else {
        out.push(Check::ok(
            format!("{name} pci"),
            "no PCI function (a virtual NIC): NUMA and ACS do not apply; NCCL attaches it to the CPU",
        ));
        return out;
    };
    let numa = std::fs::read_to_string(format!("{pci}/numa_node")).map(|s| s.trim().to_string());
    out.push(Check::ok(
        format!("{name} numa"),
        match numa.as_deref() {
            Ok("-1") => format!(
                "{} (no NUMA affinity reported)",
                device::merged_pci_path(&pci, cfg.merge_vfs)
            ),
            Ok(n) => format!("NUMA node {n} ({pci}): run each rank on the node of its NIC and GPU"),
            Err(e) => format!("numa_node unreadable: {e}"),
        },
    ));
    out.push(acs_check(name, &pci));
    out
}

fn acs_check(name: &str, pci: &str) -> Check {
    let check = format!("{name} pcie acs");
    let bridges = sysinfo::upstream_bridges(pci);
    if bridges.is_empty() {
        return Check::ok(check, "no PCIe bridge above the NIC");
    }
    let mut redirecting = Vec::new();
    let mut unreadable = Vec::new();
    for b in &bridges {
        match std::fs::read(format!("/sys/bus/pci/devices/{b}/config"))
            .map_err(|e| e.to_string())
            .and_then(|c| sysinfo::acs_control(&c))
        {
            Ok(Some(ctl)) if ctl & sysinfo::ACS_P2P_REDIRECT != 0 => {
                redirecting.push(format!("{b} (ACSCtl {ctl:#06x})"))
            }
            Ok(_) => {}
            Err(e) => unreadable.push(format!("{b}: {e}")),
        }
    }
    if !redirecting.is_empty() {
        Check::warn(
            check,
            format!(
                "P2P redirect on {}: GPUDirect RDMA traffic goes through the root complex",
                redirecting.join(", ")
            ),
            "disable ACS on those bridges (BIOS, or `setpci -s <bridge> ECAP_ACS+6.w=0000` at boot)",
        )
    } else if !unreadable.is_empty() {
        Check::ok(
            check,
            format!(
                "not readable on {} bridge(s) ({}); run as root to check",
                unreadable.len(),
                unreadable.join("; ")
            ),
        )
    } else {
        Check::ok(
            check,
            format!("no P2P redirect on {} bridge(s) above the NIC", bridges.len()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guids_print_as_ibv_devinfo_does() {
        assert_eq!(format_guid(0x0002_c903_00a1_b2c3), "0002:c903:00a1:b2c3");
    }
}
