//! The structured values: the device list syntax of `NCCL_IB_HCA` and `NCCL_SOCKET_IFNAME`,
//! address prefixes and address families, each with its parser and its printer (the value
//! written back as a user would set it). The declaration table (`table.rs`) names these
//! functions; nothing here knows a variable's name.

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

impl std::fmt::Display for AddrRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

impl AddrFamily {
    /// `AF_INET` / `AF_INET6`, also `inet`, `ipv4`, `4` and `inet6`, `ipv6`, `6`.
    pub fn parse(text: &str) -> Result<AddrFamily, String> {
        match text.trim() {
            "AF_INET" | "inet" | "ipv4" | "4" => Ok(AddrFamily::Inet),
            "AF_INET6" | "inet6" | "ipv6" | "6" => Ok(AddrFamily::Inet6),
            _ => Err("expected AF_INET or AF_INET6".into()),
        }
    }

    /// Whether `addr` is of this family.
    pub fn holds(self, addr: IpAddr) -> bool {
        matches!(
            (addr, self),
            (IpAddr::V4(_), AddrFamily::Inet) | (IpAddr::V6(_), AddrFamily::Inet6)
        )
    }
}

// The parsers and printers of the optional structured values, as the table names them: unset
// (`None`) means NCCL's automatic choice and prints as the word for it.

pub(super) fn parse_any_family(text: &str) -> Result<Option<AddrFamily>, String> {
    AddrFamily::parse(text).map(Some)
}

pub(super) fn show_any_family(v: &Option<AddrFamily>) -> String {
    v.map_or("(any)".into(), |f| f.to_string())
}

pub(super) fn parse_addr_range(text: &str) -> Result<Option<AddrRange>, String> {
    AddrRange::parse(text)
        .map(Some)
        .ok_or_else(|| "expected a CIDR prefix such as 10.1.0.0/16".into())
}

pub(super) fn show_addr_range(v: &Option<AddrRange>) -> String {
    v.map_or("(any)".into(), |r| r.to_string())
}

pub(super) fn parse_interfaces(text: &str) -> (Option<DeviceFilter>, Option<String>) {
    let (filter, problem) = DeviceFilter::parse_lenient(text);
    (Some(filter), problem)
}

pub(super) fn show_interfaces(v: &Option<DeviceFilter>) -> String {
    v.as_ref().map_or("(auto)".into(), |f| f.to_string())
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
