//! Unit tests of device discovery: GID selection, port filters, properties.

use super::*;
use crate::config::AddrRange;

/// The IPv4-mapped GID of `a.b.c.d` (also for `subnet`'s tests).
pub(super) fn v4(a: u8, b: u8, c: u8, d: u8) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&[a, b, c, d]);
    g
}
/// The GID of an IPv6 address written out.
pub(super) fn v6(s: &str) -> [u8; 16] {
    s.parse::<Ipv6Addr>().expect("an IPv6 address").octets()
}
fn link_local() -> [u8; 16] {
    v6("fe80::1234:56ff:fe78:9abc")
}

/// A GID table row: the GID and its RoCE type (None = unreadable / EINVAL).
type Row = (Option<[u8; 16]>, Option<u8>);

fn select(rows: &[Row], cfg: &Config) -> std::result::Result<i32, String> {
    let gid = |i: i32| rows.get(i as usize).and_then(|r| r.0);
    let ty = |i: i32| Ok(rows.get(i as usize).and_then(|r| r.1));
    select_roce_gid(rows.len() as i32, &gid, &ty, cfg)
}

/// The table a RoCE NIC (and softroce) exposes: link-local v1/v2, then IPv4-mapped v1/v2.
fn usual_table() -> Vec<Row> {
    vec![
        (Some(link_local()), Some(1)),
        (Some(link_local()), Some(2)),
        (Some(v4(10, 1, 2, 3)), Some(1)),
        (Some(v4(10, 1, 2, 3)), Some(2)),
    ]
}

#[test]
fn gid_selection_table() {
    let d = Config::default();
    type Case = (&'static str, Vec<Row>, Config, std::result::Result<i32, String>);
    let cases: Vec<Case> = vec![
        ("usual host picks IPv4 RoCEv2", usual_table(), d.clone(), Ok(3)),
        (
            "explicit index wins",
            usual_table(),
            Config {
                gid_index: 1,
                ..d.clone()
            },
            Ok(1),
        ),
        (
            "explicit index outside table",
            usual_table(),
            Config {
                gid_index: 9,
                ..d.clone()
            },
            Err("NCCL_IB_GID_INDEX=9 is outside the GID table (length 4)".into()),
        ),
        (
            "RoCE v1 wanted",
            usual_table(),
            Config {
                roce_version: 1,
                ..d.clone()
            },
            Ok(2),
        ),
        (
            "IPv6 wanted",
            vec![
                (Some(link_local()), Some(1)),
                (Some(link_local()), Some(2)),
                (Some(v4(10, 1, 2, 3)), Some(2)),
                (Some(v6("fd00::5")), Some(1)),
                (Some(v6("fd00::5")), Some(2)),
            ],
            Config {
                addr_family: AddrFamily::Inet6,
                ..d.clone()
            },
            Ok(4),
        ),
        (
            "range selects the second address",
            vec![
                (Some(link_local()), Some(2)),
                (Some(v4(10, 1, 2, 3)), Some(2)),
                (Some(v4(192, 168, 7, 9)), Some(2)),
            ],
            Config {
                addr_range: AddrRange::parse("192.168.0.0/16"),
                ..d.clone()
            },
            Ok(2),
        ),
        (
            "container: types unreadable (EINVAL) except the mapped ones",
            vec![
                (Some(link_local()), None),
                (Some(link_local()), None),
                (Some(v4(10, 0, 0, 7)), None),
                (Some(v4(10, 0, 0, 7)), Some(2)),
            ],
            d.clone(),
            Ok(3),
        ),
        (
            "zero entries are skipped",
            vec![
                (Some([0; 16]), Some(1)),
                (Some([0; 16]), Some(2)),
                (Some(v4(10, 0, 0, 1)), Some(2)),
            ],
            d.clone(),
            Ok(2),
        ),
        (
            "unreadable GID entries are skipped",
            vec![
                (Some(link_local()), Some(2)),
                (None, None),
                (Some(v4(10, 0, 0, 1)), Some(2)),
            ],
            d.clone(),
            Ok(2),
        ),
        (
            "only link-local: stays at 0",
            vec![(Some(link_local()), Some(1)), (Some(link_local()), Some(2))],
            d.clone(),
            Ok(0),
        ),
    ];
    for (what, rows, cfg, want) in cases {
        assert_eq!(select(&rows, &cfg), want, "{what}");
    }
}

/// `select` over a sparse table: each row is a GID (None: unreadable) and its RoCE type; reading
/// the type of an all-zero or unreadable entry fails (ENOENT, as softroce's absent sysfs file and a
/// container's unmapped one do), so the selection must never ask.
fn select_sparse(rows: &[(Option<[u8; 16]>, u8)], cfg: &Config) -> std::result::Result<i32, String> {
    let gid = |i: i32| rows.get(i as usize).and_then(|r| r.0);
    let ty = |i: i32| match rows.get(i as usize) {
        Some((Some(g), t)) if g.iter().any(|&b| b != 0) => Ok(Some(*t)),
        _ => Err(std::io::Error::from_raw_os_error(libc::ENOENT)),
    };
    select_roce_gid(rows.len() as i32, &gid, &ty, cfg)
}

#[test]
fn sparse_gid_tables_skip_their_holes() {
    let hole = (Some([0u8; 16]), 0);
    let ipv6 = Config {
        addr_family: AddrFamily::Inet6,
        ..Config::default()
    };
    // A pod's table: four holes, then its netdev's link-local and IPv4-mapped pairs.
    let mut pod = vec![hole; 4];
    pod.extend([
        (Some(link_local()), 1),
        (Some(link_local()), 2),
        (Some(v4(10, 152, 0, 12)), 1),
    ]);
    pod.push((Some(v4(10, 152, 0, 12)), 2));
    assert_eq!(select_sparse(&pod, &Config::default()), Ok(7));
    // The IPv4 pair first, the link-local pair after it.
    let mut first = vec![hole; 6];
    first.extend([(Some(v4(11, 0, 4, 1)), 1), (Some(v4(11, 0, 4, 1)), 2)]);
    first.extend([(Some(link_local()), 1), (Some(link_local()), 2)]);
    assert_eq!(select_sparse(&first, &Config::default()), Ok(7));
    // IPv6 wanted: the holes are IPv6-family entries, so the first valid one is compared with a
    // hole, whose type is unknown without being read.
    let mut v6pod = vec![hole; 4];
    v6pod.extend([(Some(v6("fd00::5")), 1), (Some(v6("fd00::5")), 2)]);
    assert_eq!(select_sparse(&v6pod, &ipv6), Ok(5));
    // GID 0 unreadable, and a hole in the middle.
    let gap = [
        (None, 0),
        (Some(link_local()), 2),
        hole,
        (Some(v4(10, 0, 0, 1)), 1),
        (Some(v4(10, 0, 0, 1)), 2),
    ];
    assert_eq!(select_sparse(&gap, &Config::default()), Ok(4));
    // Nothing but holes: index 0, which the caller refuses as not routable.
    assert_eq!(select_sparse(&[hole, hole, (None, 0)], &Config::default()), Ok(0));
}

#[test]
fn gid_type_read_error_other_than_einval_is_an_error() {
    let rows = usual_table();
    let gid = |i: i32| rows.get(i as usize).and_then(|r| r.0);
    let ty = |_: i32| Err(std::io::Error::from_raw_os_error(libc::ENOENT));
    assert!(select_roce_gid(4, &gid, &ty, &Config::default()).is_err());
}

#[test]
fn ib_gid_uses_flid_index_only_when_flid_is_set() {
    let mut with_flid = [0u8; 16];
    with_flid[4] = 0x12;
    let table = [[0xfe; 16], with_flid];
    let gid = |i: i32| table.get(i as usize).copied();
    assert_eq!(select_ib_gid(2, &gid, &Config::default()), 1);
    let table2 = [[0xfe; 16], [0u8; 16]];
    let gid2 = |i: i32| table2.get(i as usize).copied();
    assert_eq!(select_ib_gid(2, &gid2, &Config::default()), 0);
    assert_eq!(select_ib_gid(1, &gid, &Config::default()), 0, "index outside the table");
}

#[test]
fn ib_route_by_lid_within_a_subnet_and_by_flid_across() {
    let gid = |prefix: [u8; 8], guid: u8| {
        let mut g = [0u8; 16];
        g[..8].copy_from_slice(&prefix);
        g[8..].copy_from_slice(&[0x02, 0x53, 0, 0, 0, 0, 0, guid]);
        g
    };
    let link_local = [0xfe, 0x80, 0, 0, 0, 0, 0, 0];
    // One subnet: the peer's LID, no GRH.
    assert_eq!(
        ib_route(&gid(link_local, 1), &gid(link_local, 2), 0x1665),
        IbRoute {
            global: false,
            dlid: 0x1665,
            flid_missing: false
        }
    );
    // Only the low 16 bits of the subnet prefix name the local subnet (the FLID bytes differ).
    let a = [0xfe, 0x80, 0, 0, 0x00, 0x11, 0x00, 0x07];
    let b = [0xfe, 0x80, 0, 0, 0x00, 0x22, 0x00, 0x07];
    assert!(!ib_route(&gid(a, 1), &gid(b, 2), 5).global);
    // Another subnet: a GRH, and the peer's FLID as DLID.
    let c = [0xfe, 0x80, 0, 0, 0x01, 0x23, 0x00, 0x08];
    assert_eq!(
        ib_route(&gid(a, 1), &gid(c, 2), 5),
        IbRoute {
            global: true,
            dlid: 0x0123,
            flid_missing: false
        }
    );
    // Another subnet with no FLID: the LID, and a WARN is due.
    let d = [0xfe, 0x80, 0, 0, 0, 0, 0x00, 0x08];
    assert_eq!(
        ib_route(&gid(a, 1), &gid(d, 2), 5),
        IbRoute {
            global: true,
            dlid: 5,
            flid_missing: true
        }
    );
}

#[test]
fn port_filter() {
    let active_eth = PortInfo {
        state: 4,
        active_mtu: 5,
        max_msg_sz: 1 << 31,
        gid_tbl_len: 4,
        pkey_tbl_len: 1,
        lid: 0,
        sm_lid: 0,
        active_width: 2,
        active_speed: 32,
        link_layer: 2,
    };
    assert_eq!(port_is_usable(&active_eth), Ok(LinkLayer::Ethernet));
    assert_eq!(
        port_is_usable(&PortInfo {
            link_layer: 1,
            ..active_eth
        }),
        Ok(LinkLayer::InfiniBand)
    );
    assert!(port_is_usable(&PortInfo { state: 1, ..active_eth })
        .unwrap_err()
        .contains("DOWN"));
    let no_sm = port_is_usable(&PortInfo {
        state: 2,
        link_layer: 1,
        ..active_eth
    })
    .unwrap_err();
    assert!(no_sm.contains("INIT") && no_sm.contains("subnet manager"), "{no_sm}");
    assert!(!port_is_usable(&PortInfo { state: 2, ..active_eth })
        .unwrap_err()
        .contains("subnet manager"));
    assert!(port_is_usable(&PortInfo {
        link_layer: 9,
        ..active_eth
    })
    .is_err());
}

#[test]
fn speeds() {
    assert_eq!(speed_mbps(1 << 5, 1 << 1), 100_000, "EDR 4x = 100 GbE");
    assert_eq!(speed_mbps(1 << 7, 1 << 1), 400_000, "NDR 4x");
    assert_eq!(speed_mbps(1 << 6, 1 << 4), 100_000, "HDR 2x");
    assert_eq!(speed_mbps(1, 1), 2500);
    assert_eq!(speed_mbps(0, 0), 10000, "unknown speed falls back to NCCL's default");
}

#[test]
fn pci_paths_merge_functions_and_vfs() {
    let p = "/sys/devices/pci0000:00/0000:00:02.0/0000:3b:00.1";
    assert_eq!(
        merged_pci_path(p, false),
        "/sys/devices/pci0000:00/0000:00:02.0/0000:3b:00.0"
    );
    let vf = "/sys/devices/pci0000:00/0000:00:02.0/0000:3b:05.3";
    assert_eq!(
        merged_pci_path(vf, true),
        "/sys/devices/pci0000:00/0000:00:02.0/0000:3b:00.0"
    );
    assert_eq!(
        merged_pci_path(vf, false),
        "/sys/devices/pci0000:00/0000:00:02.0/0000:3b:05.0"
    );
    assert_eq!(
        merged_pci_path("/sys/devices/virtual/net", true),
        "/sys/devices/virtual/net"
    );
}

#[test]
fn gid_families() {
    assert_eq!(gid_family(&v4(1, 2, 3, 4)), AddrFamily::Inet);
    let mut mcast = v4(224, 0, 0, 1);
    mcast[0] = 0xff;
    mcast[1] = 0x0e;
    assert_eq!(gid_family(&mcast), AddrFamily::Inet);
    assert_eq!(gid_family(&v6("fd00::1")), AddrFamily::Inet6);
    // IPv4-compatible (::a.b.c.d) and other multicast scopes are not IPv4-mapped.
    assert_eq!(gid_family(&v6("::1.2.3.4")), AddrFamily::Inet6);
    mcast[1] = 0x05;
    assert_eq!(gid_family(&mcast), AddrFamily::Inet6);
    assert_eq!(gid_ip(&v4(1, 2, 3, 4)), IpAddr::from([1, 2, 3, 4]));
    assert_eq!(gid_ip(&v6("fd00::1")), "fd00::1".parse::<IpAddr>().unwrap());
    assert!(!gid_valid(&link_local()) && !gid_valid(&[0; 16]) && gid_valid(&v4(10, 0, 0, 1)));
}

#[test]
fn guid_is_the_raw_big_endian_field_as_nccl_copies_it() {
    let value = 0x0002_c903_00a1_b2c3; // ibv_devinfo: 0002:c903:00a1:b2c3
    assert_eq!(
        nccl_guid(value).to_ne_bytes(),
        [0x00, 0x02, 0xc9, 0x03, 0x00, 0xa1, 0xb2, 0xc3]
    );
}

#[test]
fn mtus() {
    assert_eq!(mtu_bytes(1), 256);
    assert_eq!(mtu_bytes(5), 4096);
    assert_eq!(mtu_bytes(0), 0);
}

#[test]
fn ib_ignores_nccl_ib_gid_index_and_says_so_once() {
    // NCCL_IB_GID_INDEX does not move an InfiniBand port's GID.
    let mut link_local = [0u8; 16];
    link_local[..2].copy_from_slice(&[0xfe, 0x80]);
    link_local[15] = 1;
    let mut with_flid = link_local;
    with_flid[..2].copy_from_slice(&[0xfe, 0xc0]);
    with_flid[5] = 0x07;
    let table = [link_local, with_flid, link_local, link_local];
    let gid = |i: i32| table.get(i as usize).copied();
    let fixed = Config {
        gid_index: 3,
        ..Config::default()
    };
    assert_eq!(select_ib_gid(4, &gid, &fixed), 1);
    let no_flid = |i: i32| Some(if i == 0 { link_local } else { [0; 16] });
    assert_eq!(select_ib_gid(4, &no_flid, &fixed), 0);
    // Another routable index is honoured only when its GID carries a FLID.
    let at2 = Config {
        routable_flid_gid_index: 2,
        ..Config::default()
    };
    assert_eq!(select_ib_gid(4, &gid, &at2), 0, "GID 2 carries no FLID");
    let at1 = Config {
        routable_flid_gid_index: 1,
        ..Config::default()
    };
    assert_eq!(select_ib_gid(4, &gid, &at1), 1);
    let line = ib_gid_index_ignored(3, &["mlx5_0:1".into(), "mlx5_1:1".into()]).unwrap();
    assert_eq!(
        line,
        "NCCL_IB_GID_INDEX=3 ignored on InfiniBand port(s) mlx5_0:1, mlx5_1:1: their GID is NCCL_IB_ROUTABLE_FLID_GID_INDEX when it carries a FLID, else GID 0"
    );
    assert_eq!(ib_gid_index_ignored(-1, &["mlx5_0:1".into()]), None, "unset");
    assert_eq!(ib_gid_index_ignored(3, &[]), None, "RoCE only");
}

#[test]
fn pkey_index_against_the_port_table() {
    let table = [0xffffu16, 0x8001, 0];
    let pkey = |i: u16| table.get(usize::from(i)).copied().ok_or_else(|| "EINVAL".to_string());
    assert_eq!(pkey_index_check(0, 3, &pkey), Ok(0xffff));
    assert_eq!(pkey_index_check(1, 3, &pkey), Ok(0x8001));
    let past = pkey_index_check(3, 3, &pkey).unwrap_err();
    assert!(
        past.starts_with("NCCL_IB_PKEY=3 is outside the port's P_Key table (3 entries, indices 0 to 2)"),
        "{past}"
    );
    assert!(pkey_index_check(1, 1, &pkey)
        .unwrap_err()
        .contains("(1 entry, indices 0 to 0)"));
    assert!(pkey_index_check(2, 3, &pkey)
        .unwrap_err()
        .contains("empty P_Key table entry"));
    let unreadable = |_: u16| Err("ibv_query_pkey failed".to_string());
    assert_eq!(pkey_index_check(0, 1, &unreadable), Err("ibv_query_pkey failed".into()));
}

#[test]
fn a_fused_device_mixing_infiniband_and_roce_is_refused_in_one_line() {
    let m = |name: &str, l| (name.to_string(), l);
    let ib = [
        m("mlx5_0:1", LinkLayer::InfiniBand),
        m("mlx5_1:1", LinkLayer::InfiniBand),
    ];
    assert_eq!(fusable_link_layers(&ib), Ok(()));
    assert_eq!(fusable_link_layers(&[]), Ok(()));
    let mixed = [
        m("mlx5_0:1", LinkLayer::InfiniBand),
        m("mlx5_1:1", LinkLayer::InfiniBand),
        m("mlx5_2:1", LinkLayer::Ethernet),
    ];
    let e = fusable_link_layers(&mixed).unwrap_err();
    assert!(
        e.starts_with("cannot fuse mlx5_0:1 (InfiniBand) with mlx5_2:1 (RoCE): the members of a fused device must share one link layer"),
        "{e}"
    );
    assert!(!e.contains('\n'));
}

#[test]
fn pkey_value_looked_up_in_the_port_table() {
    let table = [0xffffu16, 0x0002, 0, 0x8002, 0x8003];
    let pkey = |i: u16| table.get(usize::from(i)).copied().ok_or_else(|| "EINVAL".to_string());
    let len = table.len() as u16;
    assert_eq!(pkey_value_index(0xffff, len, &pkey), Ok((0, 0xffff)));
    assert_eq!(
        pkey_value_index(0x8002, len, &pkey),
        Ok((3, 0x8002)),
        "the exact entry first"
    );
    assert_eq!(
        pkey_value_index(0x0003, len, &pkey),
        Ok((4, 0x8003)),
        "else the same partition"
    );
    assert_eq!(pkey_value_index(0x7fff, len, &pkey), Ok((0, 0xffff)));
    let absent = pkey_value_index(0x8004, len, &pkey).unwrap_err();
    assert!(
        absent.starts_with(
            "NCCL_IB_PKEY_VALUE=0x8004 is not in the port's P_Key table (its filled entries: 0xffff, 0x0002, 0x8002, 0x8003)"
        ),
        "{absent}"
    );
    assert!(pkey_value_index(0, len, &pkey).is_err(), "an empty entry is no P_Key");
    let unreadable = |_: u16| Err("ibv_query_pkey failed".to_string());
    assert_eq!(pkey_value_index(1, 1, &unreadable), Err("ibv_query_pkey failed".into()));
    // NCCL_IB_PKEY_VALUE, when set, decides; else NCCL_IB_PKEY's index.
    assert_eq!(port_pkey(0, Some(0x8003), len, &pkey), Ok((4, 0x8003)));
    assert_eq!(port_pkey(3, None, len, &pkey), Ok((3, 0x8002)));
}
