//! Each port as libibverbs reports it: its state, link layer, MTU against its netdev's, its GID
//! table and the entry the plugin's own GID selection picks, and why.

use crate::check::{Check, Status};
use crate::sysinfo::{self, IfAddr};
use ferroce::config::{AddrFamily, Config};
use ferroce::device::{self, LinkLayer};
use ferroce::ibv::{Context, PortInfo};
use serde_json::{json, Value};
use std::net::{IpAddr, Ipv6Addr};

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
    /// The first entries of the P_Key table (`None`: unreadable).
    pub pkeys: Vec<Option<u16>>,
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
            "lid": self.info.lid,
            "active_mtu": device::mtu_bytes(self.info.active_mtu),
            "netdev_mtu": self.netdev_mtu,
            "gid": picked.map(|g| Ipv6Addr::from(g.gid).to_string()),
            "gid_family": picked.map(|g| device::gid_family(&g.gid).to_string()),
            "roce_version": picked.and_then(|g| g.roce),
            "prefix_len": self.netdev.as_ref().map(|n| n.prefix_len),
        })
    }
}

pub(super) fn port_facts(ctx: &Context, port: u8, cfg: &Config, ifaddrs: &[IfAddr]) -> Result<PortFacts, String> {
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
    let pkeys = (0..info.pkey_tbl_len).map(|i| ctx.query_pkey(port, i).ok()).collect();
    Ok(PortFacts {
        device: ctx.info.name.clone(),
        port,
        info,
        link_layer,
        gids,
        pick,
        netdev,
        netdev_mtu,
        pkeys,
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

pub(super) fn port_checks(p: &PortFacts, cfg: &Config) -> Vec<Check> {
    let wanted = cfg.hca.accepts(&p.device, u32::from(p.port));
    let used = p.info.state == device::PORT_ACTIVE && wanted;
    let mut out = port_findings(p, cfg);
    if !used {
        // The plugin will not use this port: its problems cannot fail a job, except the one
        // that keeps a port NCCL_IB_HCA asks for out of use (no subnet manager).
        let why_unused = format!("{} subnet manager", p.label());
        for c in out
            .iter_mut()
            .filter(|c| c.status == Status::Fail && !(wanted && c.name == why_unused))
        {
            c.status = Status::Warn;
            c.value.push_str(" (port not used by the plugin)");
        }
    }
    out
}

fn port_findings(p: &PortFacts, cfg: &Config) -> Vec<Check> {
    let l = p.label();
    let mut out = Vec::new();
    let ib = p.link_layer == Some(LinkLayer::InfiniBand);
    out.push(state_check(p));
    let speed = device::speed_mbps(p.info.active_speed, p.info.active_width);
    out.push(match p.link_layer {
        Some(LinkLayer::Ethernet) => {
            Check::ok(format!("{l} link"), format!("Ethernet (RoCE), {} Gbit/s", speed / 1000))
        }
        Some(LinkLayer::InfiniBand) => Check::ok(
            format!("{l} link"),
            format!(
                "InfiniBand, {} Gbit/s, LID {:#x}, SM LID {:#x}",
                speed / 1000,
                p.info.lid,
                p.info.sm_lid
            ),
        ),
        None => Check::warn(
            format!("{l} link"),
            format!("link layer {}: not usable", p.info.link_layer),
            "",
        ),
    });
    if ib {
        out.push(super::ib::link_width_check(&l, &p.info));
        out.push(subnet_manager_check(p));
    }
    out.push(mtu_check(p));
    out.push(super::ib::pkey_check(&l, &p.info, &p.pkeys, cfg));
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

/// ACTIVE, or why the plugin skips the port (on InfiniBand INIT: no subnet manager yet).
fn state_check(p: &PortFacts) -> Check {
    let l = p.label();
    let ib = p.link_layer == Some(LinkLayer::InfiniBand);
    let state = device::port_state_name(p.info.state);
    if p.info.state == device::PORT_ACTIVE {
        Check::ok(format!("{l} state"), state)
    } else if ib && p.info.state == device::PORT_INIT {
        Check::warn(
            format!("{l} state"),
            format!("{state}: the plugin skips this port"),
            "an InfiniBand port stays INIT until a subnet manager configures it: see the subnet manager line",
        )
    } else {
        Check::warn(
            format!("{l} state"),
            format!("{state}: the plugin skips this port"),
            "check the cable and the switch port (`ibv_devinfo`, `ip link`); exclude it with NCCL_IB_HCA=^ if unused",
        )
    }
}

/// An InfiniBand port works only once a subnet manager gave it a LID and brought it to ACTIVE
/// (ARMED is on its way there); INIT with LID 0 and SM LID 0 is a fabric without one.
fn subnet_manager_check(p: &PortFacts) -> Check {
    let name = format!("{} subnet manager", p.label());
    let (state, lid, sm) = (p.info.state, p.info.lid, p.info.sm_lid);
    let found = format!("port {}, LID {lid:#x}, SM LID {sm:#x}", device::port_state_name(state));
    if lid != 0 && sm != 0 && state >= device::PORT_ACTIVE - 1 {
        return Check::ok(name, format!("{found}: configured by the subnet manager"));
    }
    if state == device::PORT_DOWN {
        return Check::warn(
            name,
            format!("{found}: the link is down, so no subnet manager can reach the port"),
            "check the cable and the switch port (`ibstat`)",
        );
    }
    Check::fail(
        name,
        format!("{found}: no subnet manager has configured this port"),
        "start a subnet manager (`opensm` on one host of the fabric) or check the fabric's (`sminfo`, `ibstat`: SM lid 0 means none answered)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
                pkey_tbl_len: 1,
                lid: 0,
                sm_lid: 0,
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
            pkeys: vec![Some(0xffff)],
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

    /// An InfiniBand port as softroce's IB mode shows it (LID from its address, SM at 0xbfff).
    fn ib_port() -> PortFacts {
        let mut p = roce_port();
        p.info.link_layer = device::LINK_LAYER_INFINIBAND;
        p.info.lid = 0x1665;
        p.info.sm_lid = 0xbfff;
        p.link_layer = Some(LinkLayer::InfiniBand);
        p.gids.truncate(1);
        p.gids[0].roce = None;
        p.pick = Ok(0);
        p.netdev = None;
        p.netdev_mtu = None;
        p
    }

    fn value<'a>(checks: &'a [Check], suffix: &str) -> &'a str {
        &checks.iter().find(|c| c.name.ends_with(suffix)).unwrap().value
    }

    #[test]
    fn an_ib_port_with_its_subnet_manager_is_all_ok() {
        let c = port_checks(&ib_port(), &Config::default());
        assert!(c.iter().all(|c| c.status == Status::Ok), "{c:?}");
        assert!(value(&c, " link").ends_with("LID 0x1665, SM LID 0xbfff"), "{c:?}");
        assert!(
            value(&c, " subnet manager").starts_with("port ACTIVE, LID 0x1665"),
            "{c:?}"
        );
    }

    #[test]
    fn an_ib_port_without_a_subnet_manager_fails_and_says_what_to_check() {
        let mut p = ib_port();
        (p.info.state, p.info.lid, p.info.sm_lid) = (device::PORT_INIT, 0, 0);
        let c = port_checks(&p, &Config::default());
        assert_eq!(status(&c, " subnet manager"), Status::Fail, "{c:?}");
        let sm = c.iter().find(|c| c.name.ends_with(" subnet manager")).unwrap();
        assert!(sm.value.starts_with("port INIT, LID 0x0, SM LID 0x0"), "{sm:?}");
        assert!(sm.hint.contains("opensm") && sm.hint.contains("sminfo"), "{sm:?}");
        assert_eq!(status(&c, " state"), Status::Warn);
        // A port NCCL_IB_HCA leaves out is only a warning.
        let cfg = Config {
            hca: ferroce::config::DeviceFilter::parse("mlx5_1").unwrap(),
            ..Config::default()
        };
        assert_eq!(status(&port_checks(&p, &cfg), " subnet manager"), Status::Warn);
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
