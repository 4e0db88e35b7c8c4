//! Every environment variable ferroce honours, declared once in `table.rs` with NCCL's
//! defaults, and read in one place.
//!
//! Values are read once per process (as NCCL caches its `NCCL_PARAM`s). A value that does not
//! parse gives one WARN naming the variable, the value and what was expected, and the default
//! is used. The parse functions are pure (they take a lookup closure) so tests feed them tables
//! of inputs. docs/configuration.md is generated from the table (`doc::markdown`).

#[cfg(any(test, feature = "testing"))]
pub mod doc;
mod kind;
mod list;
mod table;

pub use kind::{ConfigWarning, Setting};
pub use list::{
    env_subsys_requested, parse_c_integer, AddrFamily, AddrRange, DeviceFilter, FilterEntry, MAX_FILTER_ENTRIES,
};
pub use table::{tunables, var, Config, Group, Tunable, NCCL_ONLY, NCCL_ONLY_PREFIX};

use kind::Reader;
use once_cell::sync::OnceCell;

impl Config {
    /// Whether a fused device of `members` members runs active-standby (FERROCE_ACTIVE_STANDBY
    /// with port failover on; a single device has nothing to stand by).
    pub fn active_standby_for(&self, members: usize) -> bool {
        self.active_standby && self.port_failover && members > 1
    }

    /// The recovery bound in effect (zero: recovery off).
    pub fn recovery_timeout(&self) -> std::time::Duration {
        if self.port_recovery {
            std::time::Duration::from_secs(self.recovery_timeout_sec)
        } else {
            std::time::Duration::ZERO
        }
    }

    /// Reads every variable through `lookup`; pure, for tests.
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> (Config, Vec<ConfigWarning>) {
        let mut r = Reader::new(lookup);
        let mut cfg = Config::read(&mut r);
        // A range of the other family would select no GID at all.
        if let Some(range) = cfg.addr_range.filter(|range| !cfg.addr_family.holds(range.addr)) {
            r.warn(
                var::addr_range,
                &range.to_string(),
                format!("its family differs from {}", var::addr_family),
            );
            cfg.addr_range = None;
        }
        (cfg, r.warnings)
    }

    /// The INFO line: the variables the user set (`is_set`) plus the few that decide which
    /// devices, GIDs and QPs are used, each as `NAME=value`.
    pub fn info_line(&self, is_set: &dyn Fn(&str) -> bool) -> String {
        let shown: Vec<String> = self
            .settings()
            .iter()
            .filter(|s| s.decides || is_set(s.name))
            .map(|s| format!("{}={}", s.name, s.value))
            .collect();
        format!("config: {} (every variable: NCCL_DEBUG_SUBSYS=ENV)", shown.join(" "))
    }

    /// The whole table, one `NAME=value (set|default)` line per variable.
    pub fn env_table(&self, is_set: &dyn Fn(&str) -> bool) -> Vec<String> {
        self.settings()
            .iter()
            .map(|s| {
                let origin = if is_set(s.name) { "set" } else { "default" };
                format!("config: {}={} ({origin})", s.name, s.value)
            })
            .collect()
    }
}

/// Every variable ferroce reads, in the order the table shows them.
pub fn variables() -> Vec<&'static str> {
    tunables().into_iter().map(|t| t.name).collect()
}

static CONFIG: OnceCell<Config> = OnceCell::new();

/// The process configuration, read from the environment on first use. The first call logs
/// every warning and the resolved values.
pub fn get() -> &'static Config {
    CONFIG.get_or_init(|| {
        let (cfg, warnings) = Config::from_lookup(&|name| std::env::var(name).ok());
        for w in &warnings {
            crate::log_warn!("{w}");
        }
        let is_set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
        crate::log_info!(
            crate::log::subsys::INIT | crate::log::subsys::ENV,
            "{}",
            cfg.info_line(&is_set)
        );
        if cfg.debug_subsys_env {
            for line in cfg.env_table(&is_set) {
                crate::log_info!(crate::log::subsys::ENV, "{line}");
            }
        }
        cfg
    })
}

#[cfg(test)]
mod tests;
