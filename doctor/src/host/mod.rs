//! The single-host checks: every RDMA device and port as libibverbs reports it
//! ([`devices`], [`ports`]: the GID that the plugin's own selection picks and why), what the
//! plugin's discovery keeps (here), and the checks that need no device ([`system`]: the limits,
//! permissions, GPUDirect, the CPU governor).

mod devices;
mod ib;
mod ports;

pub use ib::subnet_check as ib_subnet_check;
mod system;

pub use ports::{gid_ip, PortFacts};

use crate::check::{Check, Status};
use crate::limits::JobSize;
use crate::sysinfo;
use devices::{device_checks, libibverbs_check};
use ferroce::config::Config;
use ferroce::device;
use ferroce::ibv::{Context, Verbs};
use ports::{port_checks, port_facts};
use std::sync::Arc;
use system::{common_checks, peermem_check};

/// Everything the checks saw, kept for the pair exchange and the data test.
pub struct HostFacts {
    pub verbs: Option<Arc<Verbs>>,
    pub ports: Vec<PortFacts>,
    /// Labels of the ports the plugin's discovery keeps, in its device order.
    pub plugin_devices: Vec<String>,
}

/// Runs every single-host check.
pub fn run(cfg: &Config, vars: &crate::Vars, job: &JobSize, checks: &mut Vec<Check>) -> HostFacts {
    let mut facts = HostFacts {
        verbs: None,
        ports: Vec::new(),
        plugin_devices: Vec::new(),
    };
    let verbs = match Verbs::load(cfg.ibverbs_lib.as_deref()) {
        Ok(v) => Arc::new(v),
        Err(e) => {
            checks.push(Check::fail(
                "libibverbs",
                e.message,
                "install rdma-core (libibverbs1, ibverbs-providers) or set NCCL_IBVERBS_LIB",
            ));
            checks.push(Check::fail(
                "devices",
                "no RDMA device: libibverbs cannot be loaded",
                "see the libibverbs line",
            ));
            common_checks(cfg, vars, job, &facts.ports, checks);
            return facts;
        }
    };
    checks.push(libibverbs_check(&verbs));
    let contexts = match open_all(&verbs) {
        Ok(c) => c,
        Err(why) => {
            let hint = if ferroce::device::provider_config_error(&verbs).is_some() {
                "give that variable a value it accepts (docs/softroce-variables.md)"
            } else {
                "load the NIC's RDMA driver (mlx5_ib, irdma, bnxt_re, rdma_rxe…) and check `ibv_devices`; without RDMA hardware use softroce (docs/softroce.md)"
            };
            checks.push(Check::fail("devices", format!("no RDMA device: {why}"), hint));
            common_checks(cfg, vars, job, &facts.ports, checks);
            return facts;
        }
    };
    checks.push(Check::ok(
        "devices",
        format!(
            "{}: {}",
            contexts.len(),
            contexts
                .iter()
                .map(|c| c.info.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    ));
    let ifaddrs = sysinfo::interfaces();
    for ctx in &contexts {
        checks.extend(device_checks(ctx, cfg));
        for port in 1..=ctx.info.phys_port_cnt {
            match port_facts(ctx, port, cfg, &ifaddrs) {
                Ok(p) => {
                    checks.extend(port_checks(&p, cfg));
                    facts.ports.push(p);
                }
                Err(e) => checks.push(Check::fail(format!("{}:{port} state", ctx.info.name), e, "")),
            }
        }
    }
    checks.extend(plugin_checks(&verbs, cfg, &mut facts));
    facts.verbs = Some(verbs);
    common_checks(cfg, vars, job, &facts.ports, checks);
    facts
}

fn open_all(verbs: &Arc<Verbs>) -> Result<Vec<Arc<Context>>, String> {
    let mut count = 0;
    // SAFETY: count is a valid out-pointer; the list is freed below.
    let list = unsafe { (verbs.ibv_get_device_list)(&mut count) };
    if list.is_null() {
        return Err(ferroce::device::device_list_failed(
            verbs,
            &std::io::Error::last_os_error(),
        ));
    }
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for i in 0..count.max(0) as usize {
        // SAFETY: the list has `count` live entries until it is freed.
        match unsafe { Context::open(verbs.clone(), *list.add(i)) } {
            Ok(c) => out.push(c),
            Err(e) => errors.push(e.message),
        }
    }
    // SAFETY: list came from ibv_get_device_list; the opened contexts do not need it.
    unsafe { (verbs.ibv_free_device_list)(list) };
    if out.is_empty() {
        return Err(if count == 0 {
            "libibverbs lists 0 devices".into()
        } else {
            format!("{count} device(s), none could be opened: {}", errors.join("; "))
        });
    }
    Ok(out)
}

/// What the plugin's own discovery keeps (the devices NCCL will see).
fn plugin_checks(verbs: &Arc<Verbs>, cfg: &Config, facts: &mut HostFacts) -> Vec<Check> {
    match device::discover(verbs, cfg) {
        Ok(found) => {
            let mut out = Vec::new();
            let list: Vec<String> = found
                .devices
                .iter()
                .map(|d| {
                    format!(
                        "{} GID[{}] {} MTU {}",
                        d.label(),
                        d.gid_index,
                        device::format_gid(&d.gid),
                        device::mtu_bytes(d.active_mtu)
                    )
                })
                .collect();
            out.push(Check::ok(
                "plugin devices",
                format!("{}: {}", found.devices.len(), list.join("; ")),
            ));
            facts.plugin_devices = found.devices.iter().map(|d| d.label()).collect();
            let gpu = sysinfo::nvidia_driver_loaded();
            for d in &found.devices {
                out.push(if d.dmabuf {
                    Check::ok(
                        format!("{} dma-buf", d.label()),
                        "supported (the plugin's ibv_reg_dmabuf_mr probe)",
                    )
                } else if !cfg.dmabuf_enable {
                    Check::ok(format!("{} dma-buf", d.label()), "off (NCCL_DMABUF_ENABLE=0)")
                } else {
                    Check::new(
                        format!("{} dma-buf", d.label()),
                        if gpu { Status::Warn } else { Status::Ok },
                        "not supported by the driver or libibverbs (probe answered EOPNOTSUPP)",
                        if gpu {
                            "a kernel ≥ 5.12 and rdma-core ≥ 34, or nvidia_peermem for GPU buffers"
                        } else {
                            ""
                        },
                    )
                });
            }
            out.push(peermem_check(
                gpu,
                found.peer_memory,
                found.devices.iter().all(|d| d.dmabuf),
            ));
            out
        }
        Err(e) => vec![Check::fail(
            "plugin devices",
            e.message,
            "the port lines above say which check excludes each port",
        )],
    }
}
