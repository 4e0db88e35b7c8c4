//! What InfiniBand adds to the checks: a port's link width and per-lane speed (as `ibstat`
//! names them), the P_Key table with the entry `NCCL_IB_PKEY_VALUE` or `NCCL_IB_PKEY` picks
//! (that check runs on every port: the plugin's QPs name that index on RoCE too), and, for the
//! pair checks, whether two InfiniBand ports share a subnet.

use crate::check::Check;
use ferroce::config::{var, Config};
use ferroce::device;
use ferroce::ibv::PortInfo;
use serde_json::Value;

/// How many P_Key table entries the doctor reads and shows.
pub const PKEYS_SHOWN: u16 = 4;

/// `active_width` (one bit set) → lanes, as `ibstat` prints it; `None` for an unknown code.
pub fn width_name(active_width: u8) -> Option<&'static str> {
    Some(match active_width {
        1 => "1X",
        2 => "4X",
        4 => "8X",
        8 => "12X",
        16 => "2X",
        _ => return None,
    })
}

/// `active_speed` (one bit set) → the per-lane rate and its IB name.
pub fn lane_speed_name(active_speed: u8) -> Option<&'static str> {
    Some(match active_speed {
        1 => "2.5 Gb/s (SDR)",
        2 => "5 Gb/s (DDR)",
        4 => "10 Gb/s (QDR)",
        8 => "10 Gb/s (FDR10)",
        16 => "14 Gb/s (FDR)",
        32 => "25 Gb/s (EDR)",
        64 => "50 Gb/s (HDR)",
        128 => "100 Gb/s (NDR)",
        _ => return None,
    })
}

/// The link's width and per-lane speed; a WARN for a 1X link (a 4X cable that trained at one
/// lane runs at a quarter of its rate) or codes this build does not know.
pub fn link_width_check(label: &str, info: &PortInfo) -> Check {
    let name = format!("{label} link width");
    let (w, s) = (info.active_width, info.active_speed);
    let total = device::speed_mbps(s, w) / 1000;
    match (width_name(w), lane_speed_name(s)) {
        (Some("1X"), Some(lane)) => Check::warn(
            name,
            format!("1X at {lane} per lane = {total} Gbit/s: one lane"),
            "a 4X link that trained at 1X is degraded: reseat or replace the cable (`ibstat`, `ibportstate`)",
        ),
        (Some(width), Some(lane)) => Check::ok(name, format!("{width} at {lane} per lane = {total} Gbit/s")),
        _ => Check::warn(
            name,
            format!("active_width {w}, active_speed {s}: codes this ferroce does not know ({total} Gbit/s assumed)"),
            "compare with `ibstat`; the plugin reports that speed to NCCL",
        ),
    }
}

/// The P_Key table (`pkeys`, the whole table, `None`: unreadable; the first [`PKEYS_SHOWN`]
/// entries shown) and the entry the plugin's QPs will use: the one `NCCL_IB_PKEY_VALUE` names
/// when set, else the one at `NCCL_IB_PKEY`, which must exist and not be empty (else the plugin
/// skips the port, `device::port_pkey`).
pub fn pkey_check(label: &str, info: &PortInfo, pkeys: &[Option<u16>], cfg: &Config) -> Check {
    let name = format!("{label} P_Key");
    let shown: Vec<String> = pkeys
        .iter()
        .take(usize::from(PKEYS_SHOWN))
        .enumerate()
        .map(|(i, k)| match k {
            Some(k) => format!("[{i}] {k:#06x}{}", if k & 0x8000 != 0 { " full" } else { " limited" }),
            None => format!("[{i}] unreadable"),
        })
        .collect();
    let more = if info.pkey_tbl_len > PKEYS_SHOWN { ", …" } else { "" };
    let n = info.pkey_tbl_len;
    let table = format!(
        "{n} entr{}: {}{more}",
        if n == 1 { "y" } else { "ies" },
        shown.join(", ")
    );
    let idx = cfg.pkey_index;
    let value = u16::try_from(cfg.pkey_value).ok();
    let entry = |i: u16| match pkeys.get(usize::from(i)) {
        Some(Some(k)) => Ok(*k),
        Some(None) => Err(format!("P_Key[{i}] cannot be read")),
        None => Err(format!("P_Key[{i}] was not read")),
    };
    match (device::port_pkey(idx, value, info.pkey_tbl_len, &entry), value) {
        (Ok((_, k)), None) => Check::ok(name, format!("{table}; {}={idx} → {k:#06x}", var::pkey_index)),
        (Ok((i, k)), Some(v)) => Check::ok(name, format!("{table}; {}={v:#06x} → [{i}] {k:#06x}", var::pkey_value)),
        (Err(why), None) => Check::fail(
            name,
            format!("{table}; {why}"),
            format!("set {} to an index of a filled entry (usually 0), or ask the fabric's subnet manager for the partition", var::pkey_index),
        ),
        (Err(why), Some(_)) => Check::fail(
            name,
            format!("{table}; {why}"),
            format!("set {} to a P_Key of the table, or unset it, or ask the fabric's subnet manager for the partition", var::pkey_value),
        ),
    }
}

/// Two InfiniBand ports (`d1` here, `d2` on `peer`, as the pair exchange describes them): in one
/// subnet (the low 16 bits of the GIDs' subnet prefixes agree) the plugin addresses the peer by
/// its LID; across subnets through a router, by the FLID the peer's GID carries (a WARN without
/// one: its LID rarely routes), as `device::ib_route` does.
pub fn subnet_check(d1: &Value, d2: &Value, peer: &str) -> Check {
    let text = |v: &Value| v.as_str().map_or_else(|| "(unknown)".to_string(), str::to_string);
    let gid = |d: &Value| {
        d["gid"]
            .as_str()
            .and_then(|g| g.parse::<std::net::Ipv6Addr>().ok())
            .map(|g| g.octets())
    };
    let value = format!("GID {} here, {} on {peer}", text(&d1["gid"]), text(&d2["gid"]));
    let (Some(g1), Some(g2), Some(lid)) = (gid(d1), gid(d2), d2["lid"].as_u64()) else {
        return Check::ok("pair subnet", format!("{value} (subnet unknown)"));
    };
    let subnet = |g: &[u8; 16]| u16::from_be_bytes([g[6], g[7]]);
    let route = device::ib_route(&g1, &g2, lid as u16);
    if !route.global {
        let one = format!(
            "one subnet ({:#06x}), the peer by its LID {lid:#x}, no GRH",
            subnet(&g1)
        );
        return Check::ok("pair subnet", format!("{value}: {one}"));
    }
    let across = format!(
        "{value}: subnets {:#06x} here and {:#06x} on {peer}",
        subnet(&g1),
        subnet(&g2)
    );
    if route.flid_missing {
        Check::warn(
            "pair subnet",
            format!("{across}, and the peer's GID carries no FLID: the route falls back to its LID {lid:#x}"),
            "check the InfiniBand routers between the subnets and NCCL_IB_ROUTABLE_FLID_GID_INDEX on both hosts (the GID that carries the FLID), or use ports of one subnet (NCCL_IB_HCA)",
        )
    } else {
        let routed = format!("routed, with a GRH, to the peer's FLID {:#x}", route.dlid);
        Check::ok("pair subnet", format!("{across}: {routed}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::Status;
    use serde_json::json;

    /// A 4X EDR InfiniBand port as softroce's IB mode shows it.
    fn ib_info() -> PortInfo {
        PortInfo {
            state: device::PORT_ACTIVE,
            active_mtu: 5,
            max_msg_sz: 1 << 30,
            gid_tbl_len: 16,
            pkey_tbl_len: 1,
            lid: 0x1665,
            sm_lid: 0xbfff,
            active_width: 2,
            active_speed: 32,
            link_layer: device::LINK_LAYER_INFINIBAND,
        }
    }

    #[test]
    fn widths_and_lane_speeds_as_ibstat_names_them() {
        assert_eq!(width_name(2), Some("4X"));
        assert_eq!(width_name(3), None, "one bit only");
        assert_eq!(lane_speed_name(32), Some("25 Gb/s (EDR)"));
        assert_eq!(lane_speed_name(0), None);
    }

    #[test]
    fn the_link_width_check_warns_on_one_lane_and_unknown_codes() {
        let mut info = ib_info();
        let c = link_width_check("mlx5_0:1", &info);
        assert_eq!((c.name.as_str(), c.status), ("mlx5_0:1 link width", Status::Ok));
        assert_eq!(c.value, "4X at 25 Gb/s (EDR) per lane = 100 Gbit/s");
        info.active_width = 1;
        let c = link_width_check("mlx5_0:1", &info);
        assert_eq!(
            (c.status, c.value.as_str()),
            (Status::Warn, "1X at 25 Gb/s (EDR) per lane = 25 Gbit/s: one lane")
        );
        assert!(c.hint.contains("cable"));
        info.active_speed = 0;
        assert_eq!(link_width_check("mlx5_0:1", &info).status, Status::Warn);
    }

    #[test]
    fn the_p_key_check_shows_the_table_and_fails_an_index_past_it() {
        let mut info = ib_info();
        info.pkey_tbl_len = 2;
        let pkeys = [Some(0xffff), Some(0x0001)];
        let c = pkey_check("mlx5_0:1", &info, &pkeys, &Config::default());
        assert_eq!(c.status, Status::Ok);
        assert_eq!(
            c.value,
            "2 entries: [0] 0xffff full, [1] 0x0001 limited; NCCL_IB_PKEY=0 → 0xffff"
        );
        let past = Config {
            pkey_index: 2,
            ..Config::default()
        };
        let c = pkey_check("mlx5_0:1", &info, &pkeys, &past);
        assert_eq!(c.status, Status::Fail);
        assert!(
            c.value
                .contains("NCCL_IB_PKEY=2 is outside the port's P_Key table (2 entries"),
            "{}",
            c.value
        );
        assert!(
            c.hint.starts_with("set NCCL_IB_PKEY to an index of a filled entry"),
            "{}",
            c.hint
        );
        info.pkey_tbl_len = 6;
        let pkeys = [Some(0xffff), Some(0), Some(0x8001), None];
        let one = Config {
            pkey_index: 1,
            ..Config::default()
        };
        let c = pkey_check("mlx5_0:1", &info, &pkeys, &one);
        assert_eq!(c.status, Status::Fail, "an empty entry");
        assert!(
            c.value
                .starts_with("6 entries: [0] 0xffff full, [1] 0x0000 limited, [2] 0x8001 full, [3] unreadable, …"),
            "{}",
            c.value
        );
    }

    #[test]
    fn the_p_key_check_looks_nccl_ib_pkey_value_up_in_the_whole_table() {
        let mut info = ib_info();
        info.pkey_tbl_len = 6;
        let mut pkeys = [Some(0xffff), Some(0), Some(0x8001), Some(0), Some(0), Some(0x8005)];
        let by_value = |v: i32| Config {
            pkey_value: v,
            ..Config::default()
        };
        let c = pkey_check("mlx5_0:1", &info, &pkeys, &by_value(0x8005));
        assert_eq!(c.status, Status::Ok, "{}", c.value);
        assert!(
            c.value.ends_with(", …; NCCL_IB_PKEY_VALUE=0x8005 → [5] 0x8005"),
            "past the entries shown: {}",
            c.value
        );
        let c = pkey_check("mlx5_0:1", &info, &pkeys, &by_value(0x8002));
        assert_eq!(c.status, Status::Fail);
        assert!(
            c.value.contains("NCCL_IB_PKEY_VALUE=0x8002 is not in the port's P_Key table (its filled entries: 0xffff, 0x8001, 0x8005)"),
            "{}",
            c.value
        );
        assert!(
            c.hint.starts_with("set NCCL_IB_PKEY_VALUE to a P_Key of the table"),
            "{}",
            c.hint
        );
        pkeys[3] = None;
        let c = pkey_check("mlx5_0:1", &info, &pkeys, &by_value(0x8005));
        assert_eq!(c.status, Status::Fail, "an entry that cannot be read: {}", c.value);
        assert!(c.value.ends_with("P_Key[3] cannot be read"), "{}", c.value);
    }

    /// An InfiniBand port of the pair exchange: GID `prefix` + a GUID ending in `guid`, LID `lid`.
    fn ib_side(prefix: &str, guid: u8, lid: u64) -> Value {
        json!({"port": "mlx5_0:1", "link_layer": "InfiniBand", "gid": format!("{prefix}:253:7fff:fe00:{guid:x}"), "lid": lid})
    }

    #[test]
    fn two_ib_ports_share_a_subnet_or_are_routed_to_the_flid() {
        let (a, b) = (ib_side("fe80:0:0:0", 1, 0x1665), ib_side("fe80:0:0:0", 2, 0x1666));
        let c = subnet_check(&a, &b, "h");
        assert_eq!(c.status, Status::Ok);
        assert!(
            c.value
                .ends_with("one subnet (0x0000), the peer by its LID 0x1666, no GRH"),
            "{}",
            c.value
        );
        let mine = ib_side("fec0:0:1111:8", 1, 0x1665);
        let c = subnet_check(&mine, &ib_side("fec0:0:1234:7", 2, 0x1666), "h");
        assert_eq!(c.status, Status::Ok);
        assert!(
            c.value
                .ends_with("subnets 0x0008 here and 0x0007 on h: routed, with a GRH, to the peer's FLID 0x1234"),
            "{}",
            c.value
        );
        let c = subnet_check(&mine, &ib_side("fec0:0:0:7", 2, 0x1666), "h");
        assert_eq!(c.status, Status::Warn);
        assert!(
            c.value
                .ends_with("carries no FLID: the route falls back to its LID 0x1666"),
            "{}",
            c.value
        );
        assert!(c.hint.contains("NCCL_IB_ROUTABLE_FLID_GID_INDEX"), "{}", c.hint);
        assert_eq!(
            subnet_check(&mine, &json!({}), "h").value,
            "GID fec0:0:1111:8:253:7fff:fe00:1 here, (unknown) on h (subnet unknown)"
        );
    }
}
