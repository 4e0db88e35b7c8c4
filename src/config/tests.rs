//! The parser, the generated tables and the list syntax, fed tables of inputs.

use super::*;
use std::collections::HashMap;
use std::net::Ipv4Addr;

fn parse(vars: &[(&str, &str)]) -> (Config, Vec<ConfigWarning>) {
    let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    Config::from_lookup(&move |k| map.get(k).cloned())
}

#[test]
fn empty_environment_gives_nccl_defaults() {
    let (cfg, warnings) = parse(&[]);
    assert_eq!(cfg, Config::default());
    assert!(warnings.is_empty());
    assert_eq!(cfg.timeout, 20);
    assert_eq!(cfg.retry_cnt, 7);
    assert_eq!(cfg.gid_index, -1);
    assert_eq!(cfg.socket_magic, 0x564ab9f2fc4b9d6c);
}

#[test]
fn good_values_are_taken() {
    let (cfg, warnings) = parse(&[
        ("NCCL_IB_TIMEOUT", "14"),
        ("NCCL_IB_RETRY_CNT", "3"),
        ("NCCL_IB_GID_INDEX", "3"),
        ("NCCL_IB_QPS_PER_CONNECTION", "4"),
        ("NCCL_IB_SPLIT_DATA_ON_QPS", "1"),
        ("NCCL_IB_TC", "0x68"),
        ("NCCL_IB_SL", "010"),
        ("NCCL_IB_ADDR_FAMILY", "AF_INET6"),
        ("NCCL_IB_ADDR_RANGE", "fd00::/64"),
        ("NCCL_DMABUF_ENABLE", "0"),
        ("NCCL_GDR_FLUSH_DISABLE", "1"),
        ("NCCL_SOCKET_IFNAME", "=eth0"),
    ]);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(cfg.timeout, 14);
    assert_eq!(cfg.retry_cnt, 3);
    assert_eq!(cfg.gid_index, 3);
    assert_eq!(cfg.qps_per_connection, 4);
    assert!(cfg.split_data_on_qps);
    assert_eq!(cfg.tc, 0x68);
    assert_eq!(cfg.sl, 8, "leading zero is octal, as strtoll(.., 0)");
    assert_eq!(cfg.addr_family, AddrFamily::Inet6);
    assert_eq!(cfg.addr_range, AddrRange::parse("fd00::/64"));
    assert!(!cfg.dmabuf_enable);
    assert!(cfg.gdr_flush_disable);
    let ifname = cfg.socket_ifname.expect("parsed");
    assert!(ifname.exact && ifname.accepts("eth0", 0) && !ifname.accepts("eth01", 0));
}

#[test]
fn bad_values_warn_with_name_and_value_and_keep_defaults() {
    let table: &[(&str, &str)] = &[
        ("NCCL_IB_TIMEOUT", "fast"),
        ("NCCL_IB_TIMEOUT", "40"),
        ("NCCL_IB_RETRY_CNT", "9"),
        ("NCCL_IB_QPS_PER_CONNECTION", "0"),
        ("NCCL_IB_QPS_PER_CONNECTION", "129"),
        ("NCCL_IB_GID_INDEX", "3x"),
        ("NCCL_IB_ADDR_FAMILY", "AF_UNIX"),
        ("NCCL_IB_ADDR_RANGE", "10.0.0.0/33"),
        ("NCCL_IB_ADDR_RANGE", "nonsense"),
        ("NCCL_IB_SL", "16"),
        ("NCCL_IB_ROCE_VERSION_NUM", "3"),
    ];
    for (name, value) in table {
        let (cfg, warnings) = parse(&[(name, value)]);
        assert_eq!(warnings.len(), 1, "{name}={value}: {warnings:?}");
        assert_eq!(warnings[0].variable, *name);
        assert_eq!(warnings[0].value, *value);
        let text = warnings[0].to_string();
        assert!(text.contains(name) && text.contains(value), "{text}");
        assert_eq!(cfg, Config::default(), "{name}={value} must leave the default");
    }
}

#[test]
fn range_of_the_other_family_is_ignored_with_a_warning() {
    let (cfg, warnings) = parse(&[("NCCL_IB_ADDR_RANGE", "fd00::/64")]);
    assert_eq!(cfg.addr_range, None);
    assert_eq!(warnings.len(), 1);
}

#[test]
fn c_integers() {
    let table: &[(&str, Option<i64>)] = &[
        ("0", Some(0)),
        ("42", Some(42)),
        ("-1", Some(-1)),
        ("+7", Some(7)),
        ("0x1F", Some(31)),
        ("0X10", Some(16)),
        ("017", Some(15)),
        (" 5 ", Some(5)),
        ("", None),
        ("abc", None),
        ("09", None),
        ("1.5", None),
    ];
    for (text, want) in table {
        assert_eq!(parse_c_integer(text), *want, "{text:?}");
    }
}

#[test]
fn hca_syntax() {
    let f = DeviceFilter::parse("mlx5").unwrap();
    assert!(!f.exclude && !f.exact);
    assert!(f.accepts("mlx5_0", 1) && f.accepts("mlx5_10", 2) && !f.accepts("rxe0", 1));

    let f = DeviceFilter::parse("=mlx5_0:1,mlx5_1:1").unwrap();
    assert!(f.exact);
    assert!(f.accepts("mlx5_0", 1) && !f.accepts("mlx5_0", 2) && f.accepts("mlx5_1", 1));
    assert!(!f.accepts("mlx5_10", 1), "exact mode compares the whole name");

    let f = DeviceFilter::parse("^=mlx5_1,mlx5_4").unwrap();
    assert!(f.exclude && f.exact);
    assert!(f.accepts("mlx5_0", 1) && !f.accepts("mlx5_1", 1) && !f.accepts("mlx5_4", 2));
    assert!(f.accepts("mlx5_10", 1));

    let f = DeviceFilter::parse("^mlx5_1").unwrap();
    assert!(!f.accepts("mlx5_1", 1) && !f.accepts("mlx5_10", 1) && f.accepts("mlx5_2", 1));

    let f = DeviceFilter::parse("mlx5_1").unwrap();
    assert!(f.accepts("mlx5_1", 1) && f.accepts("mlx5_12", 1), "prefix match");

    let f = DeviceFilter::parse("=mlx5_0:1:0:0,mlx5_1:1:0:1,mlx5_2::3").unwrap();
    assert_eq!(
        f.entries[0],
        FilterEntry {
            name: "mlx5_0".into(),
            port: Some(1),
            rail: Some(0),
            plane: Some(0)
        }
    );
    assert_eq!(f.entries[1].plane, Some(1));
    assert_eq!(
        f.entries[2],
        FilterEntry {
            name: "mlx5_2".into(),
            port: None,
            rail: Some(3),
            plane: None
        }
    );
    assert!(f.accepts("mlx5_2", 7), "empty port matches any port");

    let f = DeviceFilter::parse("").unwrap();
    assert!(f.accepts("anything", 1), "empty list matches everything");
}

#[test]
fn hca_keeps_at_most_32_entries() {
    let many: Vec<String> = (0..40).map(|i| format!("dev{i}")).collect();
    let (cfg, warnings) = parse(&[("NCCL_IB_HCA", &many.join(","))]);
    assert_eq!(cfg.hca.entries.len(), MAX_FILTER_ENTRIES);
    assert_eq!(warnings.len(), 1);
}

#[test]
fn hca_with_a_bad_port_warns_and_keeps_the_name() {
    let (cfg, warnings) = parse(&[("NCCL_IB_HCA", "mlx5_0:x")]);
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].to_string().contains("NCCL_IB_HCA"));
    assert_eq!(cfg.hca.entries[0].name, "mlx5_0");
    assert_eq!(cfg.hca.entries[0].port, None);
}

#[test]
fn addr_ranges() {
    let r = AddrRange::parse("10.1.0.0/16").unwrap();
    assert!(r.contains_v4(Ipv4Addr::new(10, 1, 200, 3)));
    assert!(!r.contains_v4(Ipv4Addr::new(10, 2, 0, 1)));
    let all = AddrRange::parse("0.0.0.0/0").unwrap();
    assert!(all.contains_v4(Ipv4Addr::new(192, 168, 1, 1)));
    let r6 = AddrRange::parse("fd00::/64").unwrap();
    assert!(r6.contains_v6("fd00::1234".parse().unwrap()));
    assert!(!r6.contains_v6("fd01::1".parse().unwrap()));
    assert!(AddrRange::parse("fd00::/129").is_none());
    assert!(AddrRange::parse("10.0.0.0").is_none());
}

fn info_line_of(vars: &[(&str, &str)]) -> String {
    let (cfg, _) = parse(vars);
    let set: Vec<String> = vars.iter().map(|(k, _)| k.to_string()).collect();
    cfg.info_line(&|name| set.iter().any(|s| s == name))
}

#[test]
fn info_line_names_variables_as_a_user_writes_them() {
    let line = info_line_of(&[]);
    assert_eq!(
        line,
        "config: NCCL_IB_HCA=(all) NCCL_IB_GID_INDEX=(auto) NCCL_IB_ADDR_FAMILY=AF_INET \
         NCCL_IB_ROCE_VERSION_NUM=2 NCCL_IB_QPS_PER_CONNECTION=1 NCCL_IBVERBS_LIB=(default) \
         NCCL_SOCKET_IFNAME=(auto) (every variable: NCCL_DEBUG_SUBSYS=ENV)"
    );
    assert!(!line.contains("Some(") && !line.contains("DeviceFilter") && !line.contains("-2"));
}

#[test]
fn info_line_adds_what_the_user_set_and_only_that() {
    let line = info_line_of(&[
        ("NCCL_IB_HCA", "^=mlx5_1:1,mlx5_4"),
        ("NCCL_IB_TIMEOUT", "14"),
        ("NCCL_IB_ADDR_RANGE", "10.1.0.0/16"),
        ("NCCL_IB_ADAPTIVE_ROUTING", "1"),
        ("NCCL_IBVERBS_LIB", "/opt/rdma/lib/libibverbs.so.1"),
        ("NCCL_SOCKET_FAMILY", "AF_INET6"),
    ]);
    for want in [
        "NCCL_IB_HCA=^=mlx5_1:1,mlx5_4 ",
        "NCCL_IB_TIMEOUT=14 ",
        "NCCL_IB_ADDR_RANGE=10.1.0.0/16 ",
        "NCCL_IB_ADAPTIVE_ROUTING=1 ",
        "NCCL_IBVERBS_LIB=/opt/rdma/lib/libibverbs.so.1 ",
        "NCCL_SOCKET_FAMILY=AF_INET6 ",
    ] {
        assert!(line.contains(want), "{want:?} missing from {line}");
    }
    assert!(!line.contains("NCCL_IB_RETRY_CNT"), "unset and not decisive: {line}");
}

#[test]
fn env_table_has_every_variable_once_with_its_origin() {
    let (cfg, _) = parse(&[("NCCL_IB_TIMEOUT", "14")]);
    let table = cfg.env_table(&|name| name == "NCCL_IB_TIMEOUT");
    assert_eq!(table.len(), variables().len());
    assert!(table.contains(&"config: NCCL_IB_TIMEOUT=14 (set)".to_string()));
    assert!(table.contains(&"config: NCCL_IB_ADAPTIVE_ROUTING=(auto) (default)".to_string()));
    assert!(table.contains(&"config: NCCL_IB_ADDR_RANGE=(any) (default)".to_string()));
    assert!(table.contains(&"config: NCCL_SOCKET_MAGIC=0x564ab9f2fc4b9d6c (default)".to_string()));
    assert!(table.contains(&"config: NCCL_IB_SPLIT_DATA_ON_QPS=0 (default)".to_string()));
}

#[test]
fn the_table_lists_exactly_the_variables_that_are_read() {
    let read = std::cell::RefCell::new(Vec::<String>::new());
    let _ = Config::from_lookup(&|name| {
        read.borrow_mut().push(name.to_string());
        None
    });
    let mut read = read.into_inner();
    read.sort();
    read.dedup();
    let mut listed: Vec<String> = variables().iter().map(|s| s.to_string()).collect();
    listed.sort();
    assert_eq!(read, listed);
}

#[test]
fn filters_print_back_in_their_own_syntax() {
    for text in [
        "mlx5",
        "=mlx5_0:1,mlx5_1:1",
        "^mlx5_2",
        "^=mlx5_1,mlx5_4",
        "=mlx5_0:1:0:1,mlx5_2::3",
    ] {
        assert_eq!(DeviceFilter::parse(text).unwrap().to_string(), text);
    }
    assert_eq!(DeviceFilter::default().to_string(), "(all)");
}

#[test]
fn env_subsys_is_requested_only_by_name() {
    let table: &[(Option<&str>, bool)] = &[
        (None, false),
        (Some("INIT,NET"), false),
        (Some("ENV"), true),
        (Some("init,env"), true),
        (Some("ALL"), true),
        (Some("^ENV"), false),
        (Some("^INIT"), true),
        (Some(""), false),
    ];
    for (value, want) in table {
        assert_eq!(env_subsys_requested(*value), *want, "{value:?}");
    }
}

#[test]
fn info_line_lists_every_variable_once_when_all_are_set() {
    let line = Config::default().info_line(&|_| true);
    let shown: Vec<&str> = line
        .trim_start_matches("config: ")
        .trim_end_matches(" (every variable: NCCL_DEBUG_SUBSYS=ENV)")
        .split(' ')
        .filter_map(|item| item.split_once('=').map(|(name, _)| name))
        .filter(|name| {
            name.chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        })
        .collect();
    assert_eq!(shown, variables());
}

#[test]
fn env_table_follows_the_declaration_order() {
    let table = Config::default().env_table(&|_| false);
    let declared = tunables();
    assert_eq!(table.len(), declared.len());
    for (line, t) in table.iter().zip(&declared) {
        assert!(
            line.starts_with(&format!("config: {}=", t.name)) && line.ends_with(" (default)"),
            "{line} for {}",
            t.name
        );
    }
}

/// A value each type of the table rejects, or `None` for free text.
fn bad_value_for(ty: &str) -> Option<&'static str> {
    match ty {
        "integer" | "integer (ms)" => Some("12abc"),
        "flag" => Some("yes"),
        "address family" => Some("AF_UNIX"),
        "CIDR prefix" => Some("10.0.0.0/33"),
        "device list" | "interface list" => Some("mlx5_0:x"),
        "path" | "directory" | "log level" | "subsystem list" => None,
        other => panic!("no bad value for the type {other:?}: add one here"),
    }
}

#[test]
fn a_bad_value_of_each_declared_variable_warns_once_with_what_is_expected() {
    for t in tunables() {
        let Some(bad) = bad_value_for(t.ty) else {
            continue;
        };
        let (cfg, warnings) = parse(&[(t.name, bad)]);
        assert_eq!(warnings.len(), 1, "{}={bad}: {warnings:?}", t.name);
        let text = warnings[0].to_string();
        assert!(
            text.starts_with(&format!("ignoring {}={bad:?}: ", t.name)) && text.ends_with("; using the default"),
            "{text}"
        );
        assert!(text.contains("expected") || text.contains("not a number"), "{text}");
        if t.ty.ends_with("list") {
            // The lists keep what is valid, as NCCL does.
            assert!(
                cfg.env_table(&|_| false).iter().any(|l| l.contains("mlx5_0")),
                "{}",
                t.name
            );
        } else {
            assert_eq!(cfg, Config::default(), "{}={bad} must leave the default", t.name);
        }
    }
}

#[test]
fn an_integer_past_either_end_of_its_range_warns() {
    let mut checked = 0;
    for t in tunables().iter().filter(|t| t.ty.starts_with("integer")) {
        let Some((min, max)) = t.accepts.split_once("..=") else {
            continue;
        };
        let (min, max): (i64, i64) = (min.parse().unwrap(), max.parse().unwrap());
        for (value, ok) in [(min, true), (max, true), (min - 1, false), (max + 1, false)] {
            let text = value.to_string();
            let (_, warnings) = parse(&[(t.name, &text)]);
            assert_eq!(warnings.is_empty(), ok, "{}={text}: {warnings:?}", t.name);
            if !ok {
                assert_eq!(warnings[0].reason, format!("out of range {}", t.accepts));
            }
        }
        checked += 1;
    }
    assert!(checked > 20, "{checked} ranges checked");
}

#[test]
fn defaults_in_the_docs_are_the_values_the_parser_starts_from() {
    let settings = Config::default().settings();
    for (t, s) in tunables().iter().zip(&settings) {
        assert_eq!(t.name, s.name);
        // The docs write what a user would set, then what it stands for: "-1 (auto)".
        let doc = t.default.as_str();
        assert!(
            doc == s.value || doc.ends_with(&format!(" {}", s.value)) || s.value == format!("{doc} ms"),
            "{}: docs say {doc}, the parser starts from {}",
            t.name,
            s.value
        );
    }
}
