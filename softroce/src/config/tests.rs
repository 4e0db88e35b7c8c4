//! The variables' parsing: every variable's good value and its bad ones with their messages.

use super::*;

/// `Config::from_lookup` over `vars` alone (the process's environment is not read).
fn parse(vars: &[(&str, &str)]) -> Result<Config, BadValue> {
    Config::from_lookup(&|name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| Ok(v.to_string())))
}

fn line_for(name: &str, value: &str) -> String {
    match parse(&[(name, value)]) {
        Ok(_) => panic!("{name}={value:?} was accepted"),
        Err(bad) => {
            assert_eq!(bad.name, name);
            bad.line()
        }
    }
}

/// A variable, a value it accepts, and values it rejects with a part of the line each gives.
type Case = (&'static str, &'static str, &'static [(&'static str, &'static str)]);

const CASES: &[Case] = &[
    ("SOFTROCE_DEVICES", "64", &[("0", "expected an integer from 1 to 64;"), ("65", "1 to 64"), ("two", "1 to 64")]),
    (
        "SOFTROCE_ADDR",
        "127.0.0.1, 127.0.0.2",
        &[
            ("127.0.263.1", "expected IPv4 addresses, comma-separated, entry i for device i (not 0.0.0.0) (`127.0.263.1` is not one);"),
            ("127.0.0.1,,127.0.0.2", "(`` is not one)"),
            ("0.0.0.0", "(`0.0.0.0` is not one)"),
            ("eth0", "(`eth0` is not one)"),
        ],
    ),
    ("SOFTROCE_MTU", "1024", &[("1500", "expected an IB MTU: 256, 512, 1024, 2048 or 4096 bytes, or the ibv_mtu enum 1 to 5;"), ("0", "IB MTU"), ("6", "IB MTU"), ("4k", "IB MTU")]),
    ("SOFTROCE_ICRC_CHECK", "0", &[("no", "expected 0 or 1;"), ("2", "0 or 1")]),
    ("SOFTROCE_PORT_STATE", "down", &[("UP", "expected ACTIVE or DOWN;")]),
    ("SOFTROCE_LINK_LAYER", "ib, roce", &[("IB", "expected roce or ib, or a comma-separated list"), ("ib,eth", "(`eth` is not one);")]),
    ("SOFTROCE_SM", "off", &[("0", "expected off or on;")]),
    ("SOFTROCE_GID_HOLES", "10", &[("11", "expected an integer from 0 to 10;"), ("-1", "0 to 10")]),
    ("SOFTROCE_IB_ROUTER", "on", &[("1", "expected off or on;")]),
    ("SOFTROCE_PKEYS", "0xffff, 0x8001", &[("0", "(`0` is not one)"), ("0x1ffff", "(`0x1ffff` is not one)"), ("1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17", "at most 16 (17 entries)")]),
    ("SOFTROCE_CTL_DIR", "/tmp/x", &[]),
    ("SOFTROCE_FAULTS", "port-down@1.5s", &[("port-down", "expected COMMAND@SECONDS, comma-separated (softroce-ctl's commands) (`port-down`: want COMMAND@SECONDS);"), ("port-up@soon", "is not a time in seconds")]),
    ("SOFTROCE_LOSS", "1", &[("1.5", "expected a number in [0, 1];"), ("-0.1", "[0, 1]"), ("NaN", "[0, 1]"), ("1%", "[0, 1]")]),
    ("SOFTROCE_REORDER", "0.05", &[("2", "expected a number in [0, 1];")]),
    ("SOFTROCE_DUP", "0", &[("inf", "expected a number in [0, 1];")]),
    ("SOFTROCE_SEED", "18446744073709551615", &[("18446744073709551616", "expected an integer from 0 to 18446744073709551615;"), ("-1", "from 0 to")]),
    ("SOFTROCE_FAULT_COUNTS", "/tmp/counts", &[]),
    ("SOFTROCE_GSO", "1", &[("true", "expected 0 or 1;")]),
    ("SOFTROCE_SPIN_US", "10000", &[("10001", "expected an integer from 0 to 10000 µs;"), ("50us", "0 to 10000 µs")]),
    ("SOFTROCE_DEFER", "0", &[("off", "expected 0 or 1;")]),
    ("SOFTROCE_INLINE_RX", "0", &[("yes", "expected 0 or 1;")]),
    ("SOFTROCE_INLINE_RX_AFTER_US", "30", &[("1000001", "expected an integer from 0 to 1000000 (µs);"), ("1.5", "(µs)")]),
    ("SOFTROCE_ENGINE_RX", "0", &[("01", "expected 0 or 1;")]),
    ("SOFTROCE_POLL_SLEEP_AFTER_US", "0", &[("-5", "expected an integer from 0 to 1000000 (µs);")]),
    ("SOFTROCE_POLL_YIELD", "1000000", &[("1000001", "expected an integer from 0 to 1000000;")]),
    ("SOFTROCE_PROBE_FLOOR_US", "0", &[("10000001", "expected an integer from 0 to 10000000 (µs);"), ("2ms", "(µs)")]),
    ("SOFTROCE_DEBUG", "1", &[("verbose", "expected 0 or 1;")]),
];

#[test]
fn every_variable_has_a_case() {
    let declared: Vec<&str> = variables().iter().map(|v| v.name).collect();
    let tested: Vec<&str> = CASES.iter().map(|c| c.0).collect();
    assert_eq!(declared, tested);
}

#[test]
fn each_variable_accepts_a_good_value_and_rejects_bad_ones_with_one_line() {
    for (name, good, bads) in CASES {
        assert!(parse(&[(name, good)]).is_ok(), "{name}={good:?} was rejected");
        for (bad, expected) in *bads {
            let line = line_for(name, bad);
            let head = format!("softroce: {name}={bad:?} is not valid: expected ");
            assert!(line.starts_with(&head), "{line}");
            assert!(line.contains(expected), "{name}={bad:?}: {line} lacks {expected:?}");
            assert!(line.ends_with("; no device is offered until it is fixed"), "{line}");
            assert!(!line.contains('\n'), "{line}");
        }
    }
}

#[test]
fn the_bad_address_of_the_report_stops_with_its_line() {
    assert_eq!(
        line_for("SOFTROCE_ADDR", "127.0.263.1"),
        "softroce: SOFTROCE_ADDR=\"127.0.263.1\" is not valid: expected IPv4 addresses, comma-separated, \
         entry i for device i (not 0.0.0.0) (`127.0.263.1` is not one); no device is offered until it is fixed"
    );
}

#[test]
fn unset_and_blank_take_the_defaults_and_values_are_trimmed() {
    let c = parse(&[("SOFTROCE_ADDR", "  "), ("SOFTROCE_MTU", "")]).unwrap();
    assert!(c.addr_list.is_none() && c.mtu_override.is_none());
    let c = parse(&[
        ("SOFTROCE_ADDR", " 127.0.1.1 ,127.0.1.2"),
        ("SOFTROCE_MTU", " 4096 "),
        ("SOFTROCE_LOSS", "0.25"),
        ("SOFTROCE_INLINE_RX_AFTER_US", "30"),
        ("SOFTROCE_PORT_STATE", "Down"),
    ])
    .unwrap();
    assert_eq!(
        c.addr_list,
        Some(vec![Ipv4Addr::new(127, 0, 1, 1), Ipv4Addr::new(127, 0, 1, 2)])
    );
    assert_eq!(c.mtu_override, Some(5));
    assert_eq!(c.loss, Some(0.25));
    assert_eq!(c.inline_rx_after, Some(Duration::from_micros(30)));
    assert_eq!(c.port_down, Some(true));
    assert_eq!(parse(&[("SOFTROCE_MTU", "3")]).unwrap().mtu_override, Some(3));
}

#[test]
fn a_value_that_is_not_utf8_is_rejected() {
    let bad = Config::from_lookup(&|name| (name == "SOFTROCE_DEBUG").then(|| Err("\u{fffd}1".to_string())))
        .err()
        .unwrap();
    assert_eq!(bad.name, "SOFTROCE_DEBUG");
    assert!(bad.line().contains("(the value is not UTF-8)"), "{}", bad.line());
}

#[test]
fn the_first_bad_variable_in_table_order_is_reported() {
    let bad = parse(&[("SOFTROCE_DEBUG", "x"), ("SOFTROCE_DEVICES", "0")])
        .err()
        .unwrap();
    assert_eq!(bad.name, "SOFTROCE_DEVICES");
}

/// `docs/softroce-variables.md` is the table generated from the declarations.
#[test]
fn the_docs_table_matches_the_declarations() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/softroce-variables.md");
    let on_disk = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        on_disk == markdown_table(),
        "{path} differs from the declarations in softroce/src/config.rs; regenerate it: \
         cargo run --release -p softroce --bin softroce-ctl -- --print-variables > docs/softroce-variables.md"
    );
}
