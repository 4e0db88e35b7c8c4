//! The single-host checks: every RDMA device and port as libibverbs reports it, the GID that
//! the plugin's own selection picks and why, what the plugin's discovery keeps, the limits,
//! permissions, GPUDirect, PCIe ACS, NUMA, the CPU governor and libibverbs itself.

use crate::check::{Check, Status};
use crate::env::PortName;
use crate::limits::{self, JobSize};
use crate::sysinfo::{self, IfAddr};
use ferroce::config::{AddrFamily, Config};
use ferroce::device::{self, LinkLayer};
use ferroce::error::Limit;
use ferroce::ibv::{Context, PortInfo, Verbs};
use serde_json::{json, Value};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;

/// One GID table entry.
#[derive(Debug, Clone)]
pub struct GidEntry {
    pub index: i32,
    pub gid: [u8; 16],
    /// RoCE version (1, 2), `None` when unknown or on InfiniBand.
    pub roce: Option<u8>,
}

/// A port and what was found on it.
#[derive(Debug, Clone)]
pub struct PortFacts {
    pub device: String,
    pub port: u8,
    pub info: PortInfo,
    pub link_layer: Option<LinkLayer>,
    pub gids: Vec<GidEntry>,
    /// The index the plugin's selection picks, or why it cannot.
    pub pick: Result<i32, String>,
    pub netdev: Option<IfAddr>,
    pub netdev_mtu: Option<u32>,
}

impl PortFacts {
    pub fn label(&self) -> String {
        format!("{}:{}", self.device, self.port)
    }

    fn picked(&self) -> Option<&GidEntry> {
        let i = *self.pick.as_ref().ok()?;
        self.gids.iter().find(|g| g.index == i)
    }

    /// What the other host compares (pair mode).
    pub fn to_json(&self) -> Value {
        let picked = self.picked();
        json!({
            "port": self.label(),
            "active": self.info.state == device::PORT_ACTIVE,
            "link_layer": match self.link_layer {
                Some(LinkLayer::Ethernet) => "Ethernet",
                Some(LinkLayer::InfiniBand) => "InfiniBand",
                None => "unknown",
            },
            "speed_mbps": device::speed_mbps(self.info.active_speed, self.info.active_width),
            "active_mtu": device::mtu_bytes(self.info.active_mtu),
            "netdev_mtu": self.netdev_mtu,
            "gid": picked.map(|g| Ipv6Addr::from(g.gid).to_string()),
            "gid_family": picked.map(|g| device::gid_family(&g.gid).to_string()),
            "roce_version": picked.and_then(|g| g.roce),
            "prefix_len": self.netdev.as_ref().map(|n| n.prefix_len),
        })
    }
}

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
            common_checks(cfg, vars, job, &facts, checks);
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
            common_checks(cfg, vars, job, &facts, checks);
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
    common_checks(cfg, vars, job, &facts, checks);
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

/// Where libibverbs was loaded from and its version (from the file name rdma-core installs).
fn libibverbs_check(verbs: &Verbs) -> Check {
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

fn device_checks(ctx: &Context, cfg: &Config) -> Vec<Check> {
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

fn port_facts(ctx: &Context, port: u8, cfg: &Config, ifaddrs: &[IfAddr]) -> Result<PortFacts, String> {
    let info = ctx.query_port(port).map_err(|e| e.message)?;
    let link_layer = LinkLayer::from_port(info.link_layer);
    let gid_at = |i: i32| ctx.query_gid(port, i).ok();
    let len = info.gid_tbl_len.clamp(0, 1024);
    let mut gids = Vec::new();
    for index in 0..len {
        let Some(gid) = gid_at(index) else { continue };
        if gid.iter().all(|&b| b == 0) {
            continue;
        }
        let roce = match link_layer {
            Some(LinkLayer::Ethernet) => ctx.gid_roce_version(port, index).ok().flatten(),
            _ => None,
        };
        gids.push(GidEntry { index, gid, roce });
    }
    let pick = match link_layer {
        Some(LinkLayer::Ethernet) => {
            let roce_type = |i: i32| {
                ctx.gid_roce_version(port, i)
                    .map_err(|e| std::io::Error::other(e.message))
            };
            device::select_roce_gid(len, &gid_at, &roce_type, cfg)
        }
        Some(LinkLayer::InfiniBand) => Ok(device::select_ib_gid(len, &gid_at, cfg)),
        None => Err(format!(
            "link layer {} is neither InfiniBand nor Ethernet",
            info.link_layer
        )),
    };
    let netdev = pick.as_ref().ok().and_then(|&i| {
        let sysfs = std::fs::read_to_string(format!("{}/ports/{port}/gid_attrs/ndevs/{i}", ctx.info.ibdev_path))
            .ok()
            .map(|s| s.trim().to_string());
        let gid = gids.iter().find(|g| g.index == i)?.gid;
        let ip = gid_ip(&gid);
        match sysfs {
            Some(name) => Some(IfAddr {
                prefix_len: ifaddrs
                    .iter()
                    .find(|a| a.name == name && a.ip == ip)
                    .map_or(0, |a| a.prefix_len),
                name,
                ip,
            }),
            None => sysinfo::interface_of(ip, ifaddrs),
        }
    });
    let netdev_mtu = netdev.as_ref().and_then(|n| sysinfo::netdev_mtu(&n.name));
    Ok(PortFacts {
        device: ctx.info.name.clone(),
        port,
        info,
        link_layer,
        gids,
        pick,
        netdev,
        netdev_mtu,
    })
}

/// The address a GID stands for: IPv4 for IPv4-mapped GIDs.
pub fn gid_ip(gid: &[u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(*gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

fn roce_name(v: Option<u8>) -> &'static str {
    match v {
        Some(2) => "RoCE v2",
        Some(1) => "RoCE v1",
        _ => "type unknown",
    }
}

fn port_checks(p: &PortFacts, cfg: &Config) -> Vec<Check> {
    let used = p.info.state == device::PORT_ACTIVE && cfg.hca.accepts(&p.device, u32::from(p.port));
    let mut out = port_findings(p, cfg);
    if !used {
        // The plugin will not use this port: its problems cannot fail a job.
        for c in out.iter_mut().filter(|c| c.status == Status::Fail) {
            c.status = Status::Warn;
            c.value.push_str(" (port not used by the plugin)");
        }
    }
    out
}

fn port_findings(p: &PortFacts, cfg: &Config) -> Vec<Check> {
    let l = p.label();
    let mut out = Vec::new();
    let state = device::port_state_name(p.info.state);
    out.push(if p.info.state == device::PORT_ACTIVE {
        Check::ok(format!("{l} state"), state)
    } else {
        Check::warn(
            format!("{l} state"),
            format!("{state}: the plugin skips this port"),
            "check the cable and the switch port (`ibv_devinfo`, `ip link`); exclude it with NCCL_IB_HCA=^ if unused",
        )
    });
    let speed = device::speed_mbps(p.info.active_speed, p.info.active_width);
    out.push(match p.link_layer {
        Some(LinkLayer::Ethernet) => {
            Check::ok(format!("{l} link"), format!("Ethernet (RoCE), {} Gbit/s", speed / 1000))
        }
        Some(LinkLayer::InfiniBand) => Check::ok(
            format!("{l} link"),
            format!("InfiniBand, {} Gbit/s, LID {}", speed / 1000, p.info.lid),
        ),
        None => Check::warn(
            format!("{l} link"),
            format!("link layer {}: not usable", p.info.link_layer),
            "",
        ),
    });
    out.push(mtu_check(p));
    for g in &p.gids {
        let picked = p.pick.as_ref().ok() == Some(&g.index);
        let kind = if p.link_layer == Some(LinkLayer::Ethernet) {
            roce_name(g.roce)
        } else {
            "IB"
        };
        out.push(Check::ok(
            format!("{l} gid[{}]", g.index),
            format!(
                "{} {kind} {}{}{}",
                device::format_gid(&g.gid),
                device::gid_family(&g.gid),
                if device::gid_valid(&g.gid) { "" } else { " link-local" },
                if picked { "  <- ferroce's pick" } else { "" }
            ),
        ));
    }
    out.push(pick_check(p, cfg));
    if p.link_layer == Some(LinkLayer::Ethernet) {
        let v2 = p
            .gids
            .iter()
            .filter(|g| g.roce == Some(2) && device::gid_valid(&g.gid))
            .count();
        out.push(if v2 > 0 {
            Check::ok(format!("{l} roce v2"), format!("{v2} routable RoCE v2 GID(s)"))
        } else {
            Check::warn(
                format!("{l} roce v2"),
                "no routable RoCE v2 GID: RoCE v1 does not cross subnets",
                "give the netdev an IP address; enable RoCE v2 (`cma_roce_mode`, NIC firmware)",
            )
        });
    }
    out
}

fn mtu_check(p: &PortFacts) -> Check {
    let name = format!("{} mtu", p.label());
    let active = device::mtu_bytes(p.info.active_mtu);
    if p.link_layer != Some(LinkLayer::Ethernet) {
        return if active >= 4096 || p.link_layer.is_none() {
            Check::ok(name, format!("active {active}"))
        } else {
            Check::warn(
                name,
                format!("active {active}: InfiniBand links normally run 4096"),
                "check the subnet manager's MTU (opensm mtu)",
            )
        };
    }
    let (Some(dev), Some(netdev_mtu)) = (&p.netdev, p.netdev_mtu) else {
        return Check::ok(
            name,
            format!("active {active} (the netdev of the GID is not known here)"),
        );
    };
    let best = sysinfo::best_roce_mtu(netdev_mtu);
    let seen = format!("active {active}, netdev {} MTU {netdev_mtu} (fits {best})", dev.name);
    if active > best {
        Check::fail(
            name,
            format!("{seen}: RoCE packets larger than the netdev MTU are dropped"),
            format!(
                "raise the netdev MTU (`ip link set dev {} mtu 9000`, and the switch) or lower the port MTU",
                dev.name
            ),
        )
    } else if active < best {
        Check::warn(
            name,
            format!("{seen}: the port runs a smaller MTU than the netdev allows"),
            "check the NIC's RoCE MTU (mlxconfig / `SOFTROCE_MTU`); both hosts must agree, the connection uses the smaller",
        )
    } else {
        Check::ok(name, seen)
    }
}

fn pick_check(p: &PortFacts, cfg: &Config) -> Check {
    let name = format!("{} gid pick", p.label());
    let i = match &p.pick {
        Ok(i) => *i,
        Err(why) => {
            return Check::fail(
                name,
                why.clone(),
                "choose an index `ibv_devinfo -v` lists, or unset NCCL_IB_GID_INDEX",
            )
        }
    };
    if p.link_layer == Some(LinkLayer::InfiniBand) {
        return Check::ok(
            name,
            format!("GID[{i}] (InfiniBand: index {i} by NCCL_IB_ROUTABLE_FLID_GID_INDEX / FLID rules)"),
        );
    }
    let Some(g) = p.gids.iter().find(|g| g.index == i) else {
        return Check::fail(
            name,
            format!("GID[{i}] is empty: no routable RoCE address; the plugin skips this port"),
            "give the netdev an IP address, or set NCCL_IB_GID_INDEX to a filled entry",
        );
    };
    let what = format!(
        "GID[{i}] {} {} {}",
        device::format_gid(&g.gid),
        roce_name(g.roce),
        device::gid_family(&g.gid)
    );
    let why = if cfg.gid_index >= 0 {
        format!("NCCL_IB_GID_INDEX={i}")
    } else {
        format!(
            "the first valid {} GID{} with RoCE v{} (NCCL_IB_ADDR_FAMILY={}, NCCL_IB_ROCE_VERSION_NUM={})",
            cfg.addr_family,
            cfg.addr_range
                .map_or(String::new(), |r| format!(" in {}/{}", r.addr, r.prefix_len)),
            cfg.roce_version,
            cfg.addr_family,
            cfg.roce_version
        )
    };
    if !device::gid_valid(&g.gid) {
        return Check::fail(
            name,
            format!("{what}: link-local, not routable; the plugin skips this port"),
            match cfg.addr_family {
                AddrFamily::Inet => {
                    "give the netdev an IPv4 address, or set NCCL_IB_ADDR_FAMILY=AF_INET6 / NCCL_IB_GID_INDEX"
                }
                AddrFamily::Inet6 => {
                    "give the netdev a global IPv6 address, or set NCCL_IB_ADDR_FAMILY=AF_INET / NCCL_IB_GID_INDEX"
                }
            },
        );
    }
    if device::gid_family(&g.gid) != cfg.addr_family || g.roce != Some(cfg.roce_version as u8) {
        return Check::warn(
            name,
            format!("{what} ({why}): not the wanted family/version, none matched"),
            "both hosts must use the same RoCE version and family; check NCCL_IB_ADDR_FAMILY / NCCL_IB_ROCE_VERSION_NUM",
        );
    }
    Check::ok(name, format!("{what}: {why}"))
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

fn peermem_check(gpu: bool, peermem: bool, dmabuf_everywhere: bool) -> Check {
    let name = "gpudirect peermem";
    match (gpu, peermem) {
        (_, true) => Check::ok(name, "nvidia_peermem loaded: GPU buffers can be registered"),
        (false, false) => Check::ok(name, "no NVIDIA driver loaded: host memory only"),
        (true, false) if dmabuf_everywhere => Check::ok(name, "nvidia_peermem not loaded; DMA-BUF serves GPU buffers"),
        (true, false) => Check::warn(
            name,
            "NVIDIA driver loaded, nvidia_peermem not, no DMA-BUF: GPU buffers go through host memory",
            "`modprobe nvidia_peermem`",
        ),
    }
}

/// Checks that do not need a device.
fn common_checks(cfg: &Config, vars: &crate::Vars, job: &JobSize, facts: &HostFacts, checks: &mut Vec<Check>) {
    let (_, warnings) = Config::from_lookup(&|k| vars.get(k).cloned());
    let ports: Vec<PortName> = facts
        .ports
        .iter()
        .map(|p| PortName {
            device: p.device.clone(),
            port: u32::from(p.port),
        })
        .collect();
    checks.extend(crate::env::checks(vars, &ports, cfg, &warnings));
    checks.push(limits::check_memlock(
        Limit::current(libc::RLIMIT_MEMLOCK),
        limits::has_cap_ipc_lock(),
        job,
    ));
    checks.push(limits::check_nofile(Limit::current(libc::RLIMIT_NOFILE), job));
    checks.push(dev_infiniband_check(!facts.ports.is_empty()));
    checks.push(governor_check(&sysinfo::cpu_governors()));
}

fn dev_infiniband_check(devices_found: bool) -> Check {
    let name = "/dev/infiniband";
    let dir = std::path::Path::new("/dev/infiniband");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return if devices_found {
            Check::ok(name, "absent; this libibverbs needs no kernel device (a userspace NIC)")
        } else {
            Check::fail(
                name,
                "absent: no RDMA character devices",
                "`modprobe ib_uverbs` and the NIC's RDMA driver; containers: `--device /dev/infiniband`",
            )
        };
    };
    let mut names: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let denied: Vec<&String> = names
        .iter()
        .filter(|n| n.starts_with("uverbs") && !sysinfo::accessible(&dir.join(n)))
        .collect();
    if !denied.is_empty() {
        return Check::fail(
            name,
            format!(
                "no read/write access to {}",
                denied.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
            ),
            "a udev rule (MODE=\"0666\") or the owning group; containers: `--device /dev/infiniband`",
        );
    }
    if !names.iter().any(|n| n.starts_with("uverbs")) && !devices_found {
        return Check::fail(
            name,
            format!("no uverbs device ({})", names.join(", ")),
            "`modprobe ib_uverbs`",
        );
    }
    Check::ok(name, format!("{} readable and writable", names.join(", ")))
}

fn governor_check(governors: &[(String, usize)]) -> Check {
    let name = "cpu governor";
    if governors.is_empty() {
        return Check::ok(name, "no cpufreq interface (a VM or a fixed clock)");
    }
    let text = governors
        .iter()
        .map(|(g, n)| format!("{g} on {n} CPU(s)"))
        .collect::<Vec<_>>()
        .join(", ");
    if governors.iter().all(|(g, _)| g == "performance") {
        Check::ok(name, text)
    } else {
        Check::warn(
            name,
            format!("{text}: clock ramps add latency and jitter"),
            "`cpupower frequency-set -g performance`",
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

    #[test]
    fn governors() {
        assert_eq!(governor_check(&[]).status, Status::Ok);
        assert_eq!(governor_check(&[("performance".into(), 8)]).status, Status::Ok);
        let w = governor_check(&[("performance".into(), 4), ("powersave".into(), 4)]);
        assert_eq!(w.status, Status::Warn);
        assert!(w.value.starts_with("performance on 4 CPU(s), powersave on 4 CPU(s)"));
    }

    #[test]
    fn peermem_matters_only_with_a_gpu_and_no_dmabuf() {
        assert_eq!(peermem_check(false, false, false).status, Status::Ok);
        assert_eq!(peermem_check(true, false, true).status, Status::Ok);
        assert_eq!(peermem_check(true, false, false).status, Status::Warn);
        assert_eq!(peermem_check(true, true, false).status, Status::Ok);
    }

    fn v4_gid(last: u8) -> [u8; 16] {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&[10, 0, 0, last]);
        g
    }

    /// A RoCE port as softroce shows it, with its IPv4 GID at index 3 on a 9000-byte netdev.
    fn roce_port() -> PortFacts {
        let link_local: [u8; 16] = "fe80::1".parse::<Ipv6Addr>().unwrap().octets();
        PortFacts {
            device: "mlx5_0".into(),
            port: 1,
            info: PortInfo {
                state: device::PORT_ACTIVE,
                active_mtu: 5,
                max_msg_sz: 1 << 30,
                gid_tbl_len: 4,
                lid: 0,
                active_width: 2,
                active_speed: 32,
                link_layer: device::LINK_LAYER_ETHERNET,
            },
            link_layer: Some(LinkLayer::Ethernet),
            gids: vec![
                GidEntry {
                    index: 0,
                    gid: link_local,
                    roce: Some(1),
                },
                GidEntry {
                    index: 1,
                    gid: link_local,
                    roce: Some(2),
                },
                GidEntry {
                    index: 2,
                    gid: v4_gid(1),
                    roce: Some(1),
                },
                GidEntry {
                    index: 3,
                    gid: v4_gid(1),
                    roce: Some(2),
                },
            ],
            pick: Ok(3),
            netdev: Some(IfAddr {
                name: "eth2".into(),
                ip: "10.0.0.1".parse().unwrap(),
                prefix_len: 24,
            }),
            netdev_mtu: Some(9000),
        }
    }

    fn status(checks: &[Check], suffix: &str) -> Status {
        checks
            .iter()
            .find(|c| c.name.ends_with(suffix))
            .unwrap_or_else(|| panic!("{suffix}: {checks:?}"))
            .status
    }

    #[test]
    fn a_healthy_roce_port_is_all_ok() {
        let c = port_checks(&roce_port(), &Config::default());
        assert!(c.iter().all(|c| c.status == Status::Ok), "{c:?}");
        assert!(c
            .iter()
            .any(|c| c.name == "mlx5_0:1 gid[3]" && c.value.ends_with("<- ferroce's pick")));
    }

    #[test]
    fn a_down_port_warns_and_cannot_fail() {
        let mut p = roce_port();
        p.info.state = 1;
        p.pick = Ok(0); // link-local: would fail on a used port
        let c = port_checks(&p, &Config::default());
        assert_eq!(status(&c, " state"), Status::Warn);
        assert!(c
            .iter()
            .find(|c| c.name.ends_with(" state"))
            .unwrap()
            .value
            .starts_with("DOWN"));
        assert_eq!(status(&c, " gid pick"), Status::Warn);
        assert!(c.iter().all(|c| c.status != Status::Fail), "{c:?}");
    }

    #[test]
    fn mtu_against_the_netdev() {
        let mut p = roce_port();
        p.netdev_mtu = Some(1500);
        assert_eq!(mtu_check(&p).status, Status::Fail, "4096 does not fit 1500");
        p.info.active_mtu = 3;
        assert_eq!(mtu_check(&p).status, Status::Ok, "1024 is the best for 1500");
        p.netdev_mtu = Some(9000);
        let small = mtu_check(&p);
        assert_eq!(small.status, Status::Warn);
        assert!(
            small.value.starts_with("active 1024, netdev eth2 MTU 9000 (fits 4096)"),
            "{}",
            small.value
        );
    }

    #[test]
    fn gid_picks_and_their_reasons() {
        let cfg = Config::default();
        let ok = pick_check(&roce_port(), &cfg);
        assert_eq!(ok.status, Status::Ok);
        assert!(
            ok.value.contains("the first valid AF_INET GID with RoCE v2"),
            "{}",
            ok.value
        );
        let fixed = Config {
            gid_index: 3,
            ..Config::default()
        };
        assert!(pick_check(&roce_port(), &fixed).value.ends_with("NCCL_IB_GID_INDEX=3"));
        let mut p = roce_port();
        p.pick = Ok(1);
        assert_eq!(pick_check(&p, &cfg).status, Status::Fail, "link-local");
        p.pick = Ok(2);
        assert_eq!(pick_check(&p, &cfg).status, Status::Warn, "RoCE v1 while v2 is wanted");
        p.pick = Err("NCCL_IB_GID_INDEX=9 is outside the GID table (length 4)".into());
        assert_eq!(pick_check(&p, &cfg).status, Status::Fail);
        let mut v1_only = roce_port();
        v1_only.gids.retain(|g| g.roce == Some(1));
        assert_eq!(status(&port_checks(&v1_only, &cfg), " roce v2"), Status::Warn);
    }

    #[test]
    fn gids_map_to_their_addresses() {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&[127, 0, 61, 1]);
        assert_eq!(gid_ip(&g), "127.0.61.1".parse::<IpAddr>().unwrap());
        let v6: Ipv6Addr = "fd00::2".parse().unwrap();
        assert_eq!(gid_ip(&v6.octets()), IpAddr::V6(v6));
    }
}
