//! How the `NCCL_IB_*` variables resolve on this host, with the known pitfalls flagged: a prefix
//! that matches more devices than meant (`mlx5_1` also matches `mlx5_10`), a filter that
//! matches nothing, values out of range or in conflict, names NCCL or ferroce do not know (with
//! the declared name they are closest to). Names, accepted values and defaults all come from
//! the plugin's declaration table (`ferroce::config::tunables`).
//! Pure: the environment and the ports come in as arguments.

use crate::check::Check;
use ferroce::config::{self, var, Config, ConfigWarning, DeviceFilter, Tunable, NCCL_ONLY, NCCL_ONLY_PREFIX};
use std::collections::BTreeMap;

/// A device port as discovery sees it, whatever its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortName {
    pub device: String,
    pub port: u32,
}

impl PortName {
    fn label(&self) -> String {
        format!("{}:{}", self.device, self.port)
    }
}

/// The variables of `vars` that configure RDMA networking (shown and compared between hosts).
pub fn network_variables(vars: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let known = config::variables();
    vars.iter()
        .filter(|(k, _)| {
            k.starts_with("NCCL_IB")
                || k.starts_with("NCCL_SOCKET")
                || k.starts_with("FERROCE_")
                || *k == "NCCL_NET_PLUGIN"
                || known.contains(&k.as_str())
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Every check about the variables.
pub fn checks(
    vars: &BTreeMap<String, String>,
    ports: &[PortName],
    cfg: &Config,
    warnings: &[ConfigWarning],
) -> Vec<Check> {
    let mut out = vec![hca_check(vars.get(var::hca).map(String::as_str), ports)];
    out.extend(hca_pitfalls(&cfg.hca, ports));
    let declared = config::tunables();
    for w in warnings {
        out.push(bad_value(w, declared.iter().find(|t| t.name == w.variable)));
    }
    out.extend(conflicts(vars, cfg));
    out.extend(unknown_names(vars));
    out.push(plugin_check(vars.get("NCCL_NET_PLUGIN").map(String::as_str)));
    out
}

/// A value the plugin ignores, with what the table accepts.
fn bad_value(w: &ConfigWarning, declared: Option<&Tunable>) -> Check {
    let hint = match declared {
        Some(t) => format!("{}: {} (default {}), or unset it", t.name, t.accepts, t.default),
        None => format!("fix or unset {}", w.variable),
    };
    Check::warn(format!("env {}", w.variable), w.to_string(), hint)
}

fn hca_check(value: Option<&str>, ports: &[PortName]) -> Check {
    let name = var::hca;
    let all: Vec<String> = ports.iter().map(PortName::label).collect();
    let Some(text) = value.filter(|v| !v.trim().is_empty()) else {
        return Check::ok(name, format!("(all): every ACTIVE port ({})", list_or_none(&all)));
    };
    let filter = DeviceFilter::parse_lenient(text).0;
    let kept: Vec<String> = ports
        .iter()
        .filter(|p| filter.accepts(&p.device, p.port))
        .map(PortName::label)
        .collect();
    if kept.is_empty() {
        let what = if filter.exclude {
            "excludes every port"
        } else {
            "matches no port"
        };
        return Check::fail(
            name,
            format!("{text} {what} (ports here: {})", list_or_none(&all)),
            "name devices `ibv_devices` lists (prefix `mlx5`, exact `=mlx5_0:1`, exclude `^mlx5_2`), or unset NCCL_IB_HCA",
        );
    }
    Check::ok(name, format!("{text} selects {}", kept.join(", ")))
}

/// Entries that match by prefix more than their own name, and entries that match nothing.
fn hca_pitfalls(filter: &DeviceFilter, ports: &[PortName]) -> Vec<Check> {
    let mut devices: Vec<&str> = ports.iter().map(|p| p.device.as_str()).collect();
    devices.dedup();
    let mut out = Vec::new();
    for e in &filter.entries {
        let matched: Vec<&str> = devices
            .iter()
            .copied()
            .filter(|d| {
                if filter.exact {
                    *d == e.name
                } else {
                    d.starts_with(&e.name)
                }
            })
            .collect();
        let port_exists = |d: &str| {
            e.port
                .is_none_or(|p| ports.iter().any(|x| x.device == d && x.port == p))
        };
        if matched.is_empty() {
            out.push(Check::warn(
                format!("{} {}", var::hca, e.name),
                format!("entry '{}' matches no device", e.name),
                "check the spelling against `ibv_devices`",
            ));
        } else if !filter.exact && matched.contains(&e.name.as_str()) && matched.len() > 1 {
            let others: Vec<&str> = matched.iter().copied().filter(|d| *d != e.name).collect();
            out.push(Check::warn(
                format!("{} {}", var::hca, e.name),
                format!(
                    "'{}' is a prefix: it also {} {}",
                    e.name,
                    if filter.exclude { "excludes" } else { "selects" },
                    others.join(", ")
                ),
                format!(
                    "write {}={} to match that name only",
                    if filter.exclude { "^" } else { "" },
                    filter
                        .entries
                        .iter()
                        .map(|x| x.name.as_str())
                        .collect::<Vec<_>>()
                        .join(",")
                ),
            ));
        } else if !matched.iter().any(|d| port_exists(d)) {
            out.push(Check::warn(
                format!("{} {}", var::hca, e.name),
                format!(
                    "entry '{}' names port {} that {} does not have",
                    e.name,
                    e.port.unwrap_or(0),
                    matched.join(", ")
                ),
                "ports are numbered from 1 (`ibv_devinfo`)",
            ));
        }
    }
    out
}

/// Settings that cancel or contradict each other.
fn conflicts(vars: &BTreeMap<String, String>, cfg: &Config) -> Vec<Check> {
    let set = |n: &str| vars.get(n).is_some_and(|v| !v.trim().is_empty());
    let mut out = Vec::new();
    if cfg.gid_index >= 0 {
        let ignored: Vec<&str> = [var::addr_family, var::addr_range, var::roce_version]
            .into_iter()
            .filter(|n| set(n))
            .collect();
        if !ignored.is_empty() {
            out.push(Check::warn(
                var::gid_index,
                format!("{} is fixed, so {} have no effect", cfg.gid_index, ignored.join(", ")),
                "set either NCCL_IB_GID_INDEX or the selection variables, not both",
            ));
        }
    }
    if cfg.split_data_on_qps && cfg.qps_per_connection == 1 && set(var::split_data_on_qps) {
        out.push(Check::warn(
            var::split_data_on_qps,
            "1 with NCCL_IB_QPS_PER_CONNECTION=1: nothing to split over",
            "raise NCCL_IB_QPS_PER_CONNECTION or unset NCCL_IB_SPLIT_DATA_ON_QPS",
        ));
    }
    if cfg.fifo_tc >= 0 && cfg.tc < 0 && set(var::fifo_tc) {
        out.push(Check::warn(
            var::fifo_tc,
            format!(
                "{} while NCCL_IB_TC is unset: data and control traffic use different classes",
                cfg.fifo_tc
            ),
            "set NCCL_IB_TC as well if that is not intended",
        ));
    }
    out
}

/// `NCCL_IB*` and `FERROCE_*` names the table does not declare: NCCL's own, or misspelt.
fn unknown_names(vars: &BTreeMap<String, String>) -> Vec<Check> {
    let known = config::variables();
    vars.keys()
        .filter(|k| (k.starts_with("NCCL_IB") || k.starts_with("FERROCE_")) && !known.contains(&k.as_str()))
        .map(|k| {
            let seen = format!("{k}={}", vars[k]);
            let who = if k.starts_with("FERROCE_") {
                "the plugin does not read this variable"
            } else {
                "neither NCCL nor ferroce reads this variable"
            };
            if NCCL_ONLY.contains(&k.as_str()) || k.starts_with(NCCL_ONLY_PREFIX) {
                Check::warn(
                    format!("env {k}"),
                    format!("{seen}: read by NCCL's own IB transport, not by ferroce"),
                    "",
                )
            } else if let Some(near) = closest(k, &known) {
                Check::warn(
                    format!("env {k}"),
                    format!("{seen}: {who}; did you mean {near}?"),
                    format!("rename it to {near} (docs/configuration.md)"),
                )
            } else {
                Check::warn(
                    format!("env {k}"),
                    format!("{seen}: {who}"),
                    "check the spelling (docs/configuration.md)",
                )
            }
        })
        .collect()
}

/// The declared name `name` is most likely a misspelling of: within 3 edits, or one it is the
/// start of (a suffix such as `_SEC` left off). The first of equally close names wins.
fn closest<'a>(name: &str, known: &[&'a str]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (edit_distance(name, k), *k))
        .filter(|(d, k)| *d <= 3 || k.starts_with(name))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance over bytes (the names are ASCII).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != cb)).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

fn plugin_check(value: Option<&str>) -> Check {
    let name = "NCCL_NET_PLUGIN";
    match value {
        Some(v) if v == "ferroce" || v.contains("nccl-net-ferroce") => Check::ok(name, v.to_string()),
        Some(v) => Check::warn(
            name,
            format!("{v}: NCCL will load that plugin, not ferroce"),
            "NCCL_NET_PLUGIN=ferroce",
        ),
        None => Check::warn(
            name,
            "unset: NCCL looks for libnccl-net.so, not ferroce",
            "NCCL_NET_PLUGIN=ferroce and libnccl-net-ferroce.so on LD_LIBRARY_PATH",
        ),
    }
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".into()
    } else {
        items.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::Status;

    fn ports(names: &[&str]) -> Vec<PortName> {
        names
            .iter()
            .map(|n| PortName {
                device: n.to_string(),
                port: 1,
            })
            .collect()
    }

    fn run(vars: &[(&str, &str)], names: &[&str]) -> Vec<Check> {
        let map: BTreeMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let lookup = |k: &str| map.get(k).cloned();
        let (cfg, warnings) = Config::from_lookup(&lookup);
        checks(&map, &ports(names), &cfg, &warnings)
    }

    fn find<'a>(checks: &'a [Check], name: &str) -> &'a Check {
        checks
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no {name} in {checks:?}"))
    }

    #[test]
    fn unset_hca_selects_every_port() {
        let c = run(&[("NCCL_NET_PLUGIN", "ferroce")], &["mlx5_0", "mlx5_1"]);
        assert!(c.iter().all(|c| c.status == Status::Ok), "{c:?}");
        assert_eq!(
            find(&c, "NCCL_IB_HCA").value,
            "(all): every ACTIVE port (mlx5_0:1, mlx5_1:1)"
        );
    }

    #[test]
    fn a_filter_matching_nothing_fails() {
        let c = run(&[("NCCL_IB_HCA", "=mlx5_9")], &["mlx5_0"]);
        let hca = find(&c, "NCCL_IB_HCA");
        assert_eq!(hca.status, Status::Fail);
        assert!(
            hca.value.contains("matches no port (ports here: mlx5_0:1)"),
            "{}",
            hca.value
        );
        assert_eq!(find(&c, "NCCL_IB_HCA mlx5_9").status, Status::Warn);
        let c = run(&[("NCCL_IB_HCA", "^mlx5")], &["mlx5_0", "mlx5_1"]);
        assert!(find(&c, "NCCL_IB_HCA").value.contains("excludes every port"));
    }

    #[test]
    fn a_prefix_that_also_matches_mlx5_10_is_flagged() {
        let c = run(
            &[("NCCL_IB_HCA", "mlx5_1")],
            &["mlx5_0", "mlx5_1", "mlx5_10", "mlx5_11"],
        );
        assert_eq!(
            find(&c, "NCCL_IB_HCA").value,
            "mlx5_1 selects mlx5_1:1, mlx5_10:1, mlx5_11:1"
        );
        let pit = find(&c, "NCCL_IB_HCA mlx5_1");
        assert_eq!(pit.status, Status::Warn);
        assert!(pit.value.contains("also selects mlx5_10, mlx5_11"), "{}", pit.value);
        assert!(pit.hint.contains("=mlx5_1"), "{}", pit.hint);
        // Exact matching, or a prefix meant as one ("mlx5" names no device itself): no warning.
        for hca in ["=mlx5_1", "mlx5"] {
            let c = run(&[("NCCL_IB_HCA", hca)], &["mlx5_1", "mlx5_10"]);
            assert!(
                !c.iter()
                    .any(|c| c.name == "NCCL_IB_HCA mlx5_1" || c.name == "NCCL_IB_HCA mlx5"),
                "{hca}: {c:?}"
            );
        }
    }

    #[test]
    fn a_port_the_device_lacks_is_flagged() {
        let c = run(&[("NCCL_IB_HCA", "=mlx5_0:2,mlx5_1")], &["mlx5_0", "mlx5_1"]);
        assert!(find(&c, "NCCL_IB_HCA mlx5_0").value.contains("port 2"));
    }

    #[test]
    fn out_of_range_and_conflicting_values_warn() {
        let c = run(&[("NCCL_IB_TIMEOUT", "40")], &["d"]);
        let w = find(&c, "env NCCL_IB_TIMEOUT");
        assert_eq!(w.status, Status::Warn);
        assert!(w.value.contains("out of range 0..=31"), "{}", w.value);
        assert_eq!(w.hint, "NCCL_IB_TIMEOUT: 0..=31 (default 20), or unset it");
        let c = run(&[("NCCL_IB_ADDR_FAMILY", "inet4")], &["d"]);
        let w = find(&c, "env NCCL_IB_ADDR_FAMILY");
        assert!(w.value.contains("expected AF_INET or AF_INET6"), "{}", w.value);
        assert!(w.hint.contains("`AF_INET`, `AF_INET6` (default AF_INET)"), "{}", w.hint);
        let c = run(
            &[("NCCL_IB_GID_INDEX", "3"), ("NCCL_IB_ADDR_FAMILY", "AF_INET6")],
            &["d"],
        );
        assert!(find(&c, "NCCL_IB_GID_INDEX")
            .value
            .contains("NCCL_IB_ADDR_FAMILY have no effect"));
        let c = run(&[("NCCL_IB_SPLIT_DATA_ON_QPS", "1")], &["d"]);
        assert_eq!(find(&c, "NCCL_IB_SPLIT_DATA_ON_QPS").status, Status::Warn);
    }

    #[test]
    fn unknown_and_nccl_only_names() {
        let c = run(
            &[
                ("NCCL_IB_GID_IDX", "3"),
                ("NCCL_IB_OOO_RQ", "1"),
                ("NCCL_IB_RESILIENCY_PORT_RECOVERY", "0"),
                ("NCCL_IB_TIMEOUT", "14"),
                ("FERROCE_HANG_WARN", "5"),
                ("FERROCE_EAGRE_MAX", "0"),
                ("FERROCE_NONSENSE", "1"),
                ("NCCL_IB_NO_SUCH_THING", "1"),
            ],
            &["d"],
        );
        let typo = find(&c, "env NCCL_IB_GID_IDX");
        assert_eq!(
            typo.value,
            "NCCL_IB_GID_IDX=3: neither NCCL nor ferroce reads this variable; did you mean NCCL_IB_GID_INDEX?"
        );
        assert!(typo.hint.contains("rename it to NCCL_IB_GID_INDEX"), "{}", typo.hint);
        assert!(find(&c, "env FERROCE_HANG_WARN")
            .value
            .ends_with("the plugin does not read this variable; did you mean FERROCE_HANG_WARN_SEC?"));
        assert!(find(&c, "env FERROCE_EAGRE_MAX")
            .value
            .ends_with("did you mean FERROCE_EAGER_MAX?"));
        for far in ["env FERROCE_NONSENSE", "env NCCL_IB_NO_SUCH_THING"] {
            let w = find(&c, far);
            assert!(w.status == Status::Warn && !w.value.contains("did you mean"), "{w:?}");
        }
        assert!(find(&c, "env NCCL_IB_OOO_RQ").value.contains("NCCL's own IB transport"));
        // Declared names, even under NCCL's own prefix, are not flagged.
        for declared in ["env NCCL_IB_RESILIENCY_PORT_RECOVERY", "env NCCL_IB_TIMEOUT"] {
            assert!(!c.iter().any(|c| c.name == declared), "{declared}: {c:?}");
        }
    }

    #[test]
    fn edit_distances() {
        for (a, b, d) in [
            ("", "", 0),
            ("abc", "abc", 0),
            ("abc", "abd", 1),
            ("ab", "abc", 1),
            ("IDX", "INDEX", 2),
        ] {
            assert_eq!(edit_distance(a, b), d, "{a} {b}");
            assert_eq!(edit_distance(b, a), d, "{b} {a}");
        }
    }

    #[test]
    fn plugin_variable() {
        assert_eq!(plugin_check(Some("ferroce")).status, Status::Ok);
        assert_eq!(plugin_check(Some("/opt/x/libnccl-net-ferroce.so")).status, Status::Ok);
        assert_eq!(plugin_check(Some("aws-ofi")).status, Status::Warn);
        assert_eq!(plugin_check(None).status, Status::Warn);
    }
}
