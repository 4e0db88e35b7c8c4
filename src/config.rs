//! Every environment variable ferroce honours, parsed in one place with NCCL's defaults.
//!
//! Values are read once per process (as NCCL caches its `NCCL_PARAM`s). A value that does not
//! parse gives one WARN naming the variable and the value, and the default is used. The parse
//! functions are pure (they take a lookup closure) so tests feed them tables of inputs.

use once_cell::sync::OnceCell;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The list syntax of `NCCL_IB_HCA` and `NCCL_SOCKET_IFNAME` (docs/nccl-net-abi.md#list-syntax):
/// `[^][=]name[:port[:rail[:plane]]],...`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceFilter {
    /// `^`: the entries name devices to leave out.
    pub exclude: bool,
    /// `=`: names match exactly; otherwise an entry is a prefix.
    pub exact: bool,
    pub entries: Vec<FilterEntry>,
}

/// One `name[:port[:rail[:plane]]]` entry; absent fields are `None`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FilterEntry {
    pub name: String,
    pub port: Option<u32>,
    pub rail: Option<i16>,
    pub plane: Option<i16>,
}

/// NCCL keeps at most this many `NCCL_IB_HCA` entries.
pub const MAX_FILTER_ENTRIES: usize = 32;

impl DeviceFilter {
    /// Parses the list syntax; an error names the first bad field.
    pub fn parse(text: &str) -> Result<DeviceFilter, String> {
        match Self::parse_lenient(text) {
            (filter, None) => Ok(filter),
            (_, Some(problem)) => Err(problem),
        }
    }

    /// Parses the list syntax, keeping what is valid: a field that is not a number is treated
    /// as unset, as NCCL does. Also returns the first problem, so the caller can warn.
    pub fn parse_lenient(text: &str) -> (DeviceFilter, Option<String>) {
        let mut filter = DeviceFilter::default();
        let mut rest = text.trim();
        if let Some(r) = rest.strip_prefix('^') {
            filter.exclude = true;
            rest = r;
        }
        if let Some(r) = rest.strip_prefix('=') {
            filter.exact = true;
            rest = r;
        }
        let mut problem = None;
        for item in rest.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if filter.entries.len() == MAX_FILTER_ENTRIES {
                problem = Some(format!("more than {MAX_FILTER_ENTRIES} entries; the rest are ignored"));
                break;
            }
            let mut fields = item.split(':');
            let name = fields.next().unwrap_or_default().to_string();
            let mut number = |what: &str| -> Option<i64> {
                let field = fields.next()?.trim();
                if field.is_empty() {
                    return None;
                }
                match parse_c_integer(field) {
                    Some(v) => Some(v),
                    None => {
                        problem = Some(format!("{what} '{field}' of entry '{item}' is not a number"));
                        None
                    }
                }
            };
            let port = number("port").and_then(|p| u32::try_from(p).ok());
            let rail = number("rail").and_then(|r| i16::try_from(r).ok());
            let plane = number("plane").and_then(|p| i16::try_from(p).ok());
            filter.entries.push(FilterEntry {
                name,
                port,
                rail,
                plane,
            });
        }
        (filter, problem)
    }

    /// The entry that matches `name` (and `port` when the entry names one), if any.
    pub fn matching_entry(&self, name: &str, port: u32) -> Option<&FilterEntry> {
        self.entries.iter().find(|e| {
            let name_ok = if self.exact {
                e.name == name
            } else {
                name.starts_with(&e.name)
            };
            name_ok && e.port.is_none_or(|p| p == port)
        })
    }

    /// Whether a device port passes the filter. An empty list matches everything.
    pub fn accepts(&self, name: &str, port: u32) -> bool {
        if self.entries.is_empty() {
            return true;
        }
        self.matching_entry(name, port).is_some() != self.exclude
    }
}

/// An address prefix such as `10.1.0.0/16` or `fd00::/64` (`NCCL_IB_ADDR_RANGE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddrRange {
    pub addr: IpAddr,
    pub prefix_len: u8,
}

impl AddrRange {
    pub fn parse(text: &str) -> Option<AddrRange> {
        let (addr, len) = text.trim().split_once('/')?;
        let addr: IpAddr = addr.parse().ok()?;
        let prefix_len: u8 = len.parse().ok()?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        (prefix_len <= max).then_some(AddrRange { addr, prefix_len })
    }

    pub fn contains_v4(&self, a: Ipv4Addr) -> bool {
        match self.addr {
            IpAddr::V4(net) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix_len)).unwrap_or(0);
                (u32::from(net) & mask) == (u32::from(a) & mask)
            }
            IpAddr::V6(_) => false,
        }
    }

    pub fn contains_v6(&self, a: Ipv6Addr) -> bool {
        match self.addr {
            IpAddr::V6(net) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix_len)).unwrap_or(0);
                (u128::from(net) & mask) == (u128::from(a) & mask)
            }
            IpAddr::V4(_) => false,
        }
    }
}

/// Address family wanted for RoCE GID auto-selection (`NCCL_IB_ADDR_FAMILY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddrFamily {
    Inet,
    Inet6,
}

/// The resolved configuration. Field docs name the variable and NCCL's default.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// NCCL_IB_HCA: which devices and ports to use (default: all active ports).
    pub hca: DeviceFilter,
    /// NCCL_IB_GID_INDEX: fixed RoCE GID index; -1 selects automatically (default -1).
    pub gid_index: i32,
    /// NCCL_IB_ADDR_FAMILY: AF_INET (default) or AF_INET6.
    pub addr_family: AddrFamily,
    /// NCCL_IB_ADDR_RANGE: only GIDs in this prefix (default: any).
    pub addr_range: Option<AddrRange>,
    /// NCCL_IB_ROCE_VERSION_NUM: wanted RoCE version (default 2).
    pub roce_version: i32,
    /// NCCL_IB_ROUTABLE_FLID_GID_INDEX: IB GID index used when its FLID is set (default 1).
    pub routable_flid_gid_index: i32,
    /// NCCL_IB_TIMEOUT: ACK timeout exponent, 4.096 µs × 2^value (default 20).
    pub timeout: u8,
    /// NCCL_IB_RETRY_CNT: transport retries (default 7).
    pub retry_cnt: u8,
    /// NCCL_IB_PKEY: P_Key index (default 0).
    pub pkey_index: u16,
    /// NCCL_IB_SL: service level; -1 = communicator traffic class, else 0 (default -1).
    pub sl: i32,
    /// NCCL_IB_TC: RoCE traffic class; -1 = communicator traffic class, else 0 (default -1).
    pub tc: i32,
    /// NCCL_IB_FIFO_TC: traffic class of the receiver's (CTS) QPs; -1 = data tc (default -1).
    pub fifo_tc: i32,
    /// NCCL_IB_USE_INLINE: post CTS writes inline (default 0).
    pub use_inline: bool,
    /// NCCL_IB_QPS_PER_CONNECTION: QPs per device pair per connection, 1..=128 (default 1).
    pub qps_per_connection: u32,
    /// NCCL_IB_SPLIT_DATA_ON_QPS: split each message over all QPs (default 0: round-robin).
    pub split_data_on_qps: bool,
    /// NCCL_IB_AR_THRESHOLD: size above which the completion travels separately (default 8192).
    pub ar_threshold: usize,
    /// NCCL_IB_ADAPTIVE_ROUTING: -2 = auto (IB on, RoCE off), 0 off, 1 on (default -2).
    pub adaptive_routing: i32,
    /// NCCL_IB_PCI_RELAXED_ORDERING: 0 off, 1/2 use when supported (default 2).
    pub pci_relaxed_ordering: i32,
    /// NCCL_IB_ECE_ENABLE: exchange enhanced connection establishment data (default 1).
    pub ece_enable: bool,
    /// NCCL_IB_MERGE_VFS: treat VFs of one PF as one PCI device (default 1).
    pub merge_vfs: bool,
    /// NCCL_IB_MERGE_NICS: allow makeVDevice fusion (default 1).
    pub merge_nics: bool,
    /// NCCL_IB_DEVICE_PCI_ORDER: sort devices by PCI path (default 1).
    pub device_pci_order: bool,
    /// NCCL_IB_RETURN_ASYNC_EVENTS: fatal async events fail later calls (default 1).
    pub return_async_events: bool,
    /// NCCL_IB_WARN_RAIL_LOCAL: INFO when fused device lists differ between peers (default 0).
    pub warn_rail_local: bool,
    /// NCCL_IB_MQP_RETRY_ALL: retry ibv_modify_qp on any error, not only ETIMEDOUT (default 0).
    pub mqp_retry_all: bool,
    /// NCCL_IB_MQP_RETRY_CNT: ibv_modify_qp retries (default 34).
    pub mqp_retry_cnt: u32,
    /// NCCL_IB_MQP_RETRY_SLEEP_MSEC: sleep × attempt between retries (default 100).
    pub mqp_retry_sleep_ms: u64,
    /// NCCL_IB_QUERY_PORT_SPEED: use ibv_query_port_speed when present (default 1).
    pub query_port_speed: bool,
    /// NCCL_IBVERBS_LIB: explicit libibverbs path (default: libibverbs.so, libibverbs.so.1).
    pub ibverbs_lib: Option<String>,
    /// NCCL_GDR_FLUSH_DISABLE: never flush GPU receives (default 0).
    pub gdr_flush_disable: bool,
    /// NCCL_DMABUF_ENABLE: allow DMA-BUF registration (default 1).
    pub dmabuf_enable: bool,
    /// NCCL_SOCKET_IFNAME: interface for the connection side channel (default: auto).
    pub socket_ifname: Option<DeviceFilter>,
    /// NCCL_SOCKET_FAMILY: AF_INET or AF_INET6 for the side channel (default: any).
    pub socket_family: Option<AddrFamily>,
    /// NCCL_SOCKET_MAGIC: handshake magic for the side channel (default 0x564ab9f2fc4b9d6c).
    pub socket_magic: u64,
    /// FERROCE_CONNECT_TIMEOUT_SEC: give up connection setup after this long (default 60,
    /// like NCCL's socket retry budget).
    pub connect_timeout_sec: u64,
    /// FERROCE_HANG_WARN_SEC: WARN when a comm with work in flight made no progress for this
    /// long, and again at most once per interval (default 30; 0 = never).
    pub hang_warn_sec: u64,
    /// FERROCE_RECOVERY_TIMEOUT_SEC: how long a connection whose QPs failed (link down,
    /// retries exceeded) keeps trying to recover over new QPs before the comm fails (default
    /// 120: a link flap, an optic reseat or a leaf-switch reload, and well inside PyTorch's
    /// 10-minute collective watchdog, so the job still gets ferroce's error first; 0 = off).
    pub recovery_timeout_sec: u64,
    /// NCCL_IB_RESILIENCY_PORT_RECOVERY: 0 turns recovery off (default 1 here; NCCL's own IB
    /// transport defaults it to 0 and covers fused NICs only).
    pub port_recovery: bool,
    /// NCCL_IB_RESILIENCY_PORT_FAILOVER: a fused device's recovery moves the QPs of a member
    /// whose port is down onto the members whose ports are up, and back once it is up again.
    pub port_failover: bool,
    /// FERROCE_EAGER_MAX: the largest message (bytes) sent eagerly, without waiting for the
    /// receiver's CTS, into a landing ring the receiver keeps per connection (16 slots of
    /// 32 + this many bytes, rounded up to 64); 0 = off. Default 224: a slot of 256 bytes, so
    /// the ring is one 4 KiB page, and header and payload fit one inline write on NICs that
    /// take 256 inline bytes (softroce, mlx5). At most 4064 (a slot of one page).
    pub eager_max: usize,
    /// FERROCE_WIRE_VERSION: the newest wire version this process speaks (default 0: the
    /// newest this build knows; peers run the newest both speak). Lower it to run as an older
    /// build would, e.g. to check that a job mixing builds works.
    pub wire_version: u16,
    /// FERROCE_ACTIVE_STANDBY: a fused device's connections put all their QPs on the first
    /// member that is up (the primary) and keep one probed QP on each other member (the
    /// standbys), instead of striping over every member; a failover then moves them to the
    /// first standby that answers. Both ends must set it alike. Needs port failover.
    pub active_standby: bool,
    /// NCCL_IB_RESILIENCY_PORT_RECOVERY_START_DELAY (ms): the wait after a failed attempt
    /// before the next, doubling up to 5 s (default 100; the first attempt is at once).
    pub recovery_start_delay_ms: u64,
    /// NCCL_IB_RESILIENCY_PORT_RECOVERY_ATTEMPTS_MAX: attempts of one recovery before the comm
    /// fails (default 0: only FERROCE_RECOVERY_TIMEOUT_SEC bounds it, so a port being replaced
    /// is waited for).
    pub recovery_attempts_max: u32,
    /// FERROCE_STATS: directory for the per-process statistics file
    /// (`ferroce-<host>-<pid>.json`); unset = no statistics kept unless NCCL_DEBUG asks for INFO.
    pub stats_dir: Option<String>,
    /// FERROCE_STATS_INTERVAL_SEC: also rewrite the statistics file this often (default 10;
    /// 0 = only at finalize and exit).
    pub stats_interval_sec: u64,
    /// FERROCE_CALL_TRACE: an INFO line for every call NCCL makes into the plugin, with its
    /// arguments and result; the data path calls (isend, irecv, test, iflush) only the first
    /// this many (default 0 = off).
    pub call_trace: u64,
    /// NCCL_DEBUG is INFO or TRACE: comms keep statistics and log a summary when they close.
    pub debug_info: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            hca: DeviceFilter::default(),
            gid_index: -1,
            addr_family: AddrFamily::Inet,
            addr_range: None,
            roce_version: 2,
            routable_flid_gid_index: 1,
            timeout: 20,
            retry_cnt: 7,
            pkey_index: 0,
            sl: -1,
            tc: -1,
            fifo_tc: -1,
            use_inline: false,
            qps_per_connection: 1,
            split_data_on_qps: false,
            ar_threshold: 8192,
            adaptive_routing: -2,
            pci_relaxed_ordering: 2,
            ece_enable: true,
            merge_vfs: true,
            merge_nics: true,
            device_pci_order: true,
            return_async_events: true,
            warn_rail_local: false,
            mqp_retry_all: false,
            mqp_retry_cnt: 34,
            mqp_retry_sleep_ms: 100,
            query_port_speed: true,
            ibverbs_lib: None,
            gdr_flush_disable: false,
            dmabuf_enable: true,
            socket_ifname: None,
            socket_family: None,
            socket_magic: 0x564a_b9f2_fc4b_9d6c,
            connect_timeout_sec: 60,
            hang_warn_sec: 30,
            recovery_timeout_sec: 120,
            port_recovery: true,
            port_failover: true,
            active_standby: false,
            wire_version: 0,
            eager_max: 224,
            recovery_start_delay_ms: 100,
            recovery_attempts_max: 0,
            stats_dir: None,
            stats_interval_sec: 10,
            call_trace: 0,
            debug_info: false,
        }
    }
}

/// Parses an integer as C's `strtoll(s, NULL, 0)` accepts it: decimal, `0x` hex, leading-0
/// octal, optional sign. Trailing garbage is an error (NCCL would silently stop there).
pub fn parse_c_integer(text: &str) -> Option<i64> {
    let t = text.trim();
    let (negative, digits) = match t.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let value = if let Some(hex) = digits.strip_prefix("0x").or_else(|| digits.strip_prefix("0X")) {
        i64::from_str_radix(hex, 16).ok()?
    } else if digits.len() > 1 && digits.starts_with('0') {
        i64::from_str_radix(&digits[1..], 8).ok()?
    } else {
        digits.parse::<i64>().ok()?
    };
    Some(if negative { -value } else { value })
}

/// A problem found while reading the environment: it becomes one WARN line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigWarning {
    pub variable: &'static str,
    pub value: String,
    pub reason: String,
}

impl std::fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ignoring {}={:?}: {}; using the default",
            self.variable, self.value, self.reason
        )
    }
}

struct Reader<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
    warnings: Vec<ConfigWarning>,
}

impl Reader<'_> {
    fn raw(&self, name: &str) -> Option<String> {
        (self.lookup)(name).filter(|v| !v.trim().is_empty())
    }

    fn warn(&mut self, variable: &'static str, value: &str, reason: impl Into<String>) {
        self.warnings.push(ConfigWarning {
            variable,
            value: value.to_string(),
            reason: reason.into(),
        });
    }

    /// An integer in `min..=max`, else the default with a warning.
    fn int(&mut self, name: &'static str, default: i64, min: i64, max: i64) -> i64 {
        let Some(value) = self.raw(name) else {
            return default;
        };
        match parse_c_integer(&value) {
            Some(v) if (min..=max).contains(&v) => v,
            Some(_) => {
                self.warn(name, &value, format!("out of range {min}..={max}"));
                default
            }
            None => {
                self.warn(name, &value, "not an integer");
                default
            }
        }
    }

    fn flag(&mut self, name: &'static str, default: bool) -> bool {
        self.int(name, i64::from(default), i64::MIN, i64::MAX) != 0
    }

    fn family(&mut self, name: &'static str) -> Option<AddrFamily> {
        let value = self.raw(name)?;
        match value.trim() {
            "AF_INET" | "inet" | "ipv4" | "4" => Some(AddrFamily::Inet),
            "AF_INET6" | "inet6" | "ipv6" | "6" => Some(AddrFamily::Inet6),
            _ => {
                self.warn(name, &value, "expected AF_INET or AF_INET6");
                None
            }
        }
    }

    fn filter(&mut self, name: &'static str) -> Option<DeviceFilter> {
        let value = self.raw(name)?;
        let (filter, problem) = DeviceFilter::parse_lenient(&value);
        if let Some(reason) = problem {
            self.warn(name, &value, reason);
        }
        Some(filter)
    }
}

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
        let d = Config::default();
        let mut r = Reader {
            lookup,
            warnings: Vec::new(),
        };
        let hca = r.filter("NCCL_IB_HCA").unwrap_or_default();
        let addr_range = match r.raw("NCCL_IB_ADDR_RANGE") {
            None => None,
            Some(v) => {
                let parsed = AddrRange::parse(&v);
                if parsed.is_none() {
                    r.warn("NCCL_IB_ADDR_RANGE", &v, "expected a CIDR prefix such as 10.1.0.0/16");
                }
                parsed
            }
        };
        let addr_family = r.family("NCCL_IB_ADDR_FAMILY").unwrap_or(d.addr_family);
        let addr_range = addr_range.filter(|range| {
            let matches = matches!(
                (range.addr, addr_family),
                (IpAddr::V4(_), AddrFamily::Inet) | (IpAddr::V6(_), AddrFamily::Inet6)
            );
            matches || {
                r.warnings.push(ConfigWarning {
                    variable: "NCCL_IB_ADDR_RANGE",
                    value: format!("{}/{}", range.addr, range.prefix_len),
                    reason: "its family differs from NCCL_IB_ADDR_FAMILY".into(),
                });
                false
            }
        });
        let timeout = r.int("NCCL_IB_TIMEOUT", 20, 0, 31) as u8;
        let cfg = Config {
            hca,
            gid_index: r.int("NCCL_IB_GID_INDEX", -1, -1, 65535) as i32,
            addr_family,
            addr_range,
            roce_version: r.int("NCCL_IB_ROCE_VERSION_NUM", 2, 1, 2) as i32,
            routable_flid_gid_index: r.int("NCCL_IB_ROUTABLE_FLID_GID_INDEX", 1, 0, 65535) as i32,
            timeout,
            retry_cnt: r.int("NCCL_IB_RETRY_CNT", 7, 0, 7) as u8,
            pkey_index: r.int("NCCL_IB_PKEY", 0, 0, 65535) as u16,
            sl: r.int("NCCL_IB_SL", -1, -1, 15) as i32,
            tc: r.int("NCCL_IB_TC", -1, -1, 255) as i32,
            fifo_tc: r.int("NCCL_IB_FIFO_TC", -1, -1, 255) as i32,
            use_inline: r.flag("NCCL_IB_USE_INLINE", false),
            qps_per_connection: r.int("NCCL_IB_QPS_PER_CONNECTION", 1, 1, 128) as u32,
            split_data_on_qps: r.flag("NCCL_IB_SPLIT_DATA_ON_QPS", false),
            ar_threshold: r.int("NCCL_IB_AR_THRESHOLD", 8192, 0, i64::MAX) as usize,
            adaptive_routing: r.int("NCCL_IB_ADAPTIVE_ROUTING", -2, -2, 1) as i32,
            pci_relaxed_ordering: r.int("NCCL_IB_PCI_RELAXED_ORDERING", 2, 0, 2) as i32,
            ece_enable: r.flag("NCCL_IB_ECE_ENABLE", true),
            merge_vfs: r.flag("NCCL_IB_MERGE_VFS", true),
            merge_nics: r.flag("NCCL_IB_MERGE_NICS", true),
            device_pci_order: r.flag("NCCL_IB_DEVICE_PCI_ORDER", true),
            return_async_events: r.flag("NCCL_IB_RETURN_ASYNC_EVENTS", true),
            warn_rail_local: r.flag("NCCL_IB_WARN_RAIL_LOCAL", false),
            mqp_retry_all: r.flag("NCCL_IB_MQP_RETRY_ALL", false),
            mqp_retry_cnt: r.int("NCCL_IB_MQP_RETRY_CNT", 34, 0, 1_000_000) as u32,
            mqp_retry_sleep_ms: r.int("NCCL_IB_MQP_RETRY_SLEEP_MSEC", 100, 0, 3_600_000) as u64,
            query_port_speed: r.flag("NCCL_IB_QUERY_PORT_SPEED", true),
            ibverbs_lib: r.raw("NCCL_IBVERBS_LIB"),
            gdr_flush_disable: r.flag("NCCL_GDR_FLUSH_DISABLE", false),
            dmabuf_enable: r.flag("NCCL_DMABUF_ENABLE", true),
            socket_ifname: r.filter("NCCL_SOCKET_IFNAME"),
            socket_family: r.family("NCCL_SOCKET_FAMILY"),
            socket_magic: r.int("NCCL_SOCKET_MAGIC", d.socket_magic as i64, i64::MIN, i64::MAX) as u64,
            connect_timeout_sec: r.int("FERROCE_CONNECT_TIMEOUT_SEC", 60, 1, 86_400) as u64,
            hang_warn_sec: r.int("FERROCE_HANG_WARN_SEC", 30, 0, 86_400) as u64,
            recovery_timeout_sec: r.int("FERROCE_RECOVERY_TIMEOUT_SEC", 120, 0, 86_400) as u64,
            port_recovery: r.flag("NCCL_IB_RESILIENCY_PORT_RECOVERY", true),
            port_failover: r.flag("NCCL_IB_RESILIENCY_PORT_FAILOVER", true),
            active_standby: r.flag("FERROCE_ACTIVE_STANDBY", false),
            wire_version: r.int("FERROCE_WIRE_VERSION", 0, 0, i64::from(u16::MAX)) as u16,
            eager_max: r.int("FERROCE_EAGER_MAX", 224, 0, 4064) as usize,
            recovery_start_delay_ms: r.int("NCCL_IB_RESILIENCY_PORT_RECOVERY_START_DELAY", 100, 0, 5_000) as u64,
            recovery_attempts_max: r.int("NCCL_IB_RESILIENCY_PORT_RECOVERY_ATTEMPTS_MAX", 0, 0, 1_000_000) as u32,
            stats_dir: r.raw("FERROCE_STATS").filter(|d| !d.is_empty()),
            stats_interval_sec: r.int("FERROCE_STATS_INTERVAL_SEC", 10, 0, 86_400) as u64,
            call_trace: r.int("FERROCE_CALL_TRACE", 0, 0, i64::MAX) as u64,
            debug_info: r
                .raw("NCCL_DEBUG")
                .is_some_and(|v| v.eq_ignore_ascii_case("INFO") || v.eq_ignore_ascii_case("TRACE")),
        };
        (cfg, r.warnings)
    }

    /// Every variable with its resolved value as a user would write it, in declaration order.
    pub fn settings(&self) -> Vec<Setting> {
        let flag = |b: bool| if b { "1" } else { "0" }.to_string();
        let auto = |v: i32| if v < 0 { "(auto)".to_string() } else { v.to_string() };
        let newest = |v: u16| if v == 0 { "(newest)".to_string() } else { v.to_string() };
        let rows: [(&'static str, String); 48] = [
            ("NCCL_IB_HCA", self.hca.to_string()),
            ("NCCL_IB_GID_INDEX", auto(self.gid_index)),
            ("NCCL_IB_ADDR_FAMILY", self.addr_family.to_string()),
            (
                "NCCL_IB_ADDR_RANGE",
                self.addr_range
                    .map_or("(any)".into(), |r| format!("{}/{}", r.addr, r.prefix_len)),
            ),
            ("NCCL_IB_ROCE_VERSION_NUM", self.roce_version.to_string()),
            (
                "NCCL_IB_ROUTABLE_FLID_GID_INDEX",
                self.routable_flid_gid_index.to_string(),
            ),
            ("NCCL_IB_TIMEOUT", self.timeout.to_string()),
            ("NCCL_IB_RETRY_CNT", self.retry_cnt.to_string()),
            ("NCCL_IB_PKEY", self.pkey_index.to_string()),
            ("NCCL_IB_SL", auto(self.sl)),
            ("NCCL_IB_TC", auto(self.tc)),
            ("NCCL_IB_FIFO_TC", auto(self.fifo_tc)),
            ("NCCL_IB_USE_INLINE", flag(self.use_inline)),
            ("NCCL_IB_QPS_PER_CONNECTION", self.qps_per_connection.to_string()),
            ("NCCL_IB_SPLIT_DATA_ON_QPS", flag(self.split_data_on_qps)),
            ("NCCL_IB_AR_THRESHOLD", self.ar_threshold.to_string()),
            (
                "NCCL_IB_ADAPTIVE_ROUTING",
                if self.adaptive_routing == -2 {
                    "(auto)".into()
                } else {
                    self.adaptive_routing.to_string()
                },
            ),
            ("NCCL_IB_PCI_RELAXED_ORDERING", self.pci_relaxed_ordering.to_string()),
            ("NCCL_IB_ECE_ENABLE", flag(self.ece_enable)),
            ("NCCL_IB_MERGE_VFS", flag(self.merge_vfs)),
            ("NCCL_IB_MERGE_NICS", flag(self.merge_nics)),
            ("NCCL_IB_DEVICE_PCI_ORDER", flag(self.device_pci_order)),
            ("NCCL_IB_RETURN_ASYNC_EVENTS", flag(self.return_async_events)),
            ("NCCL_IB_WARN_RAIL_LOCAL", flag(self.warn_rail_local)),
            ("NCCL_IB_MQP_RETRY_ALL", flag(self.mqp_retry_all)),
            ("NCCL_IB_MQP_RETRY_CNT", self.mqp_retry_cnt.to_string()),
            ("NCCL_IB_MQP_RETRY_SLEEP_MSEC", self.mqp_retry_sleep_ms.to_string()),
            ("NCCL_IB_QUERY_PORT_SPEED", flag(self.query_port_speed)),
            (
                "NCCL_IBVERBS_LIB",
                self.ibverbs_lib.clone().unwrap_or_else(|| "(default)".into()),
            ),
            ("NCCL_GDR_FLUSH_DISABLE", flag(self.gdr_flush_disable)),
            ("NCCL_DMABUF_ENABLE", flag(self.dmabuf_enable)),
            (
                "NCCL_SOCKET_IFNAME",
                self.socket_ifname.as_ref().map_or("(auto)".into(), |f| f.to_string()),
            ),
            (
                "NCCL_SOCKET_FAMILY",
                self.socket_family.map_or("(any)".into(), |f| f.to_string()),
            ),
            ("NCCL_SOCKET_MAGIC", format!("{:#x}", self.socket_magic)),
            ("FERROCE_CONNECT_TIMEOUT_SEC", self.connect_timeout_sec.to_string()),
            ("FERROCE_HANG_WARN_SEC", self.hang_warn_sec.to_string()),
            ("FERROCE_RECOVERY_TIMEOUT_SEC", self.recovery_timeout_sec.to_string()),
            ("NCCL_IB_RESILIENCY_PORT_RECOVERY", flag(self.port_recovery)),
            ("NCCL_IB_RESILIENCY_PORT_FAILOVER", flag(self.port_failover)),
            ("FERROCE_ACTIVE_STANDBY", flag(self.active_standby)),
            ("FERROCE_EAGER_MAX", self.eager_max.to_string()),
            ("FERROCE_WIRE_VERSION", newest(self.wire_version)),
            (
                "NCCL_IB_RESILIENCY_PORT_RECOVERY_START_DELAY",
                format!("{} ms", self.recovery_start_delay_ms),
            ),
            (
                "NCCL_IB_RESILIENCY_PORT_RECOVERY_ATTEMPTS_MAX",
                self.recovery_attempts_max.to_string(),
            ),
            (
                "FERROCE_STATS",
                self.stats_dir.clone().unwrap_or_else(|| "(off)".into()),
            ),
            ("FERROCE_STATS_INTERVAL_SEC", self.stats_interval_sec.to_string()),
            ("FERROCE_CALL_TRACE", self.call_trace.to_string()),
            // Read for one thing only: at INFO, comms keep statistics and log them at close.
            (
                "NCCL_DEBUG",
                if self.debug_info { "INFO" } else { "(below INFO)" }.to_string(),
            ),
        ];
        rows.into_iter()
            .map(|(name, value)| Setting {
                name,
                value,
                decides: DECISIVE.contains(&name),
            })
            .collect()
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

/// One variable and its resolved value, written as a user would set it (`(all)`, `(auto)`,
/// `(default)` stand for "unset, NCCL's automatic choice").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    pub name: &'static str,
    pub value: String,
    /// Shown at INFO even when unset: it decides devices, GIDs or QPs.
    pub decides: bool,
}

/// Every variable ferroce reads, in the order the table shows them.
pub fn variables() -> Vec<&'static str> {
    Config::default().settings().into_iter().map(|s| s.name).collect()
}

/// The variables the INFO line always shows.
const DECISIVE: &[&str] = &[
    "NCCL_IB_HCA",
    "NCCL_IB_GID_INDEX",
    "NCCL_IB_ADDR_FAMILY",
    "NCCL_IB_ROCE_VERSION_NUM",
    "NCCL_IB_QPS_PER_CONNECTION",
    "NCCL_IBVERBS_LIB",
    "NCCL_SOCKET_IFNAME",
];

impl std::fmt::Display for DeviceFilter {
    /// The list syntax back: `^=mlx5_0:1,mlx5_1`, or `(all)` for the empty list.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.entries.is_empty() {
            return f.write_str("(all)");
        }
        let entries: Vec<String> = self
            .entries
            .iter()
            .map(|e| {
                let fields = [e.port.map(i64::from), e.rail.map(i64::from), e.plane.map(i64::from)];
                let used = fields.iter().rposition(Option::is_some).map_or(0, |i| i + 1);
                let mut text = e.name.clone();
                for field in &fields[..used] {
                    text.push(':');
                    if let Some(v) = field {
                        text.push_str(&v.to_string());
                    }
                }
                text
            })
            .collect();
        write!(
            f,
            "{}{}{}",
            if self.exclude { "^" } else { "" },
            if self.exact { "=" } else { "" },
            entries.join(",")
        )
    }
}

impl std::fmt::Display for AddrFamily {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AddrFamily::Inet => "AF_INET",
            AddrFamily::Inet6 => "AF_INET6",
        })
    }
}

/// Whether `NCCL_DEBUG_SUBSYS` names ENV (or ALL) itself. NCCL's default mask already contains
/// ENV, so the whole table is printed only when the user asked for it by name.
pub fn env_subsys_requested(value: Option<&str>) -> bool {
    let Some(value) = value else {
        return false;
    };
    let (negated, list) = match value.trim().strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, value.trim()),
    };
    let names_env = list
        .split(',')
        .any(|item| matches!(item.trim().to_ascii_uppercase().as_str(), "ENV" | "ALL"));
    names_env != negated && !(negated && list.trim().is_empty())
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
        if env_subsys_requested(std::env::var("NCCL_DEBUG_SUBSYS").ok().as_deref()) {
            for line in cfg.env_table(&is_set) {
                crate::log_info!(crate::log::subsys::ENV, "{line}");
            }
        }
        cfg
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

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
}
