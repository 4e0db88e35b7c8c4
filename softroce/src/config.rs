//! Every environment tunable of softroce, declared once in the [`variables!`] table below: name,
//! type, default, accepted values and meaning. The table gives the getters (one per variable,
//! read once per process), the parser of each value, the one-line error for a value that does not
//! parse, and the Markdown table of `docs/softroce-variables.md` ([`markdown_table`],
//! `softroce-ctl --print-variables`; a test fails when the checked-in file differs).
//!
//! Contract:
//! * an unset or blank variable takes its default;
//! * a set variable whose value does not parse stops softroce: `driver::instances::check_config`
//!   says so in one line on stderr (variable, value, what is expected; [`BadValue::line`]),
//!   `ibv_get_device_list` then returns NULL with errno EINVAL and no device is created, so
//!   nothing binds another address or runs with another setting than the one asked for;
//! * the getters never panic: once a variable has failed they are not reached by the device
//!   paths (which check first), and they return the defaults.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use crate::wire;

mod ib;
pub use ib::{LinkLayers, Pkeys};

/// How the text of one kind of variable becomes its value, and how the docs name that kind.
pub trait Kind {
    type Value: Clone;
    /// The type column of the docs table.
    fn type_name(&self) -> &'static str;
    /// The accepted values (the range column, and the end of the error line).
    fn expected(&self) -> String;
    /// The value of `text` (trimmed, not blank), or the reason it is not one (`None`: it is not
    /// one of [`Kind::expected`], nothing more to say).
    fn parse(&self, text: &str) -> Result<Self::Value, Option<String>>;
}

/// `0` or `1`.
pub struct Flag;

impl Kind for Flag {
    type Value = bool;
    fn type_name(&self) -> &'static str {
        "boolean"
    }
    fn expected(&self) -> String {
        "0 or 1".into()
    }
    fn parse(&self, text: &str) -> Result<bool, Option<String>> {
        match text {
            "0" => Ok(false),
            "1" => Ok(true),
            _ => Err(None),
        }
    }
}

/// A decimal integer in `min..=max`.
pub struct Int<T> {
    pub min: T,
    pub max: T,
    /// The unit shown in the docs and the error (`""`, `"µs"`).
    pub unit: &'static str,
}

impl<T> Kind for Int<T>
where
    T: Copy + PartialOrd + std::str::FromStr + std::fmt::Display,
{
    type Value = T;
    fn type_name(&self) -> &'static str {
        if self.unit.is_empty() {
            "integer"
        } else {
            "integer, µs"
        }
    }
    fn expected(&self) -> String {
        format!("an integer from {} to {}{}", self.min, self.max, self.unit_suffix())
    }
    fn parse(&self, text: &str) -> Result<T, Option<String>> {
        let v: T = text.parse().map_err(|_| None)?;
        if v < self.min || v > self.max {
            return Err(None);
        }
        Ok(v)
    }
}

impl<T> Int<T> {
    fn unit_suffix(&self) -> String {
        if self.unit.is_empty() {
            String::new()
        } else {
            format!(" {}", self.unit)
        }
    }
}

/// Microseconds, an [`Int`] in `0..=max` read as a [`Duration`].
pub struct Micros {
    pub max: u64,
}

impl Kind for Micros {
    type Value = Duration;
    fn type_name(&self) -> &'static str {
        "integer, µs"
    }
    fn expected(&self) -> String {
        format!("an integer from 0 to {} (µs)", self.max)
    }
    fn parse(&self, text: &str) -> Result<Duration, Option<String>> {
        let v: u64 = text.parse().map_err(|_| None)?;
        if v > self.max {
            return Err(None);
        }
        Ok(Duration::from_micros(v))
    }
}

/// A probability: a decimal number in [0, 1].
pub struct Probability;

impl Kind for Probability {
    type Value = f64;
    fn type_name(&self) -> &'static str {
        "probability"
    }
    fn expected(&self) -> String {
        "a number in [0, 1]".into()
    }
    fn parse(&self, text: &str) -> Result<f64, Option<String>> {
        let p: f64 = text.parse().map_err(|_| None)?;
        if !(0.0..=1.0).contains(&p) {
            return Err(None);
        }
        Ok(p)
    }
}

/// An IB MTU, in bytes or as the `ibv_mtu` enum; the value is the enum (1..=5).
pub struct Mtu;

impl Kind for Mtu {
    type Value = u32;
    fn type_name(&self) -> &'static str {
        "IB MTU"
    }
    fn expected(&self) -> String {
        "an IB MTU: 256, 512, 1024, 2048 or 4096 bytes, or the ibv_mtu enum 1 to 5".into()
    }
    fn parse(&self, text: &str) -> Result<u32, Option<String>> {
        let v: u32 = text.parse().map_err(|_| None)?;
        (1..=5u8)
            .find(|&e| u32::from(e) == v || wire::mtu_bytes(e) == Some(v))
            .map(u32::from)
            .ok_or(None)
    }
}

/// IPv4 addresses, comma-separated, none of them 0.0.0.0.
pub struct Addrs;

impl Kind for Addrs {
    type Value = Vec<Ipv4Addr>;
    fn type_name(&self) -> &'static str {
        "IPv4 list"
    }
    fn expected(&self) -> String {
        "IPv4 addresses, comma-separated, entry i for device i (not 0.0.0.0)".into()
    }
    fn parse(&self, text: &str) -> Result<Vec<Ipv4Addr>, Option<String>> {
        text.split(',')
            .map(|x| match x.trim().parse::<Ipv4Addr>() {
                Ok(a) if !a.is_unspecified() => Ok(a),
                _ => Err(Some(format!("`{}` is not one", x.trim()))),
            })
            .collect()
    }
}

/// A path (any text).
pub struct Path;

impl Kind for Path {
    type Value = PathBuf;
    fn type_name(&self) -> &'static str {
        "path"
    }
    fn expected(&self) -> String {
        "a directory".into()
    }
    fn parse(&self, text: &str) -> Result<PathBuf, Option<String>> {
        Ok(PathBuf::from(text))
    }
}

/// `ACTIVE` or `DOWN` (any case); the value is whether the port is down.
pub struct PortState;

impl Kind for PortState {
    type Value = bool;
    fn type_name(&self) -> &'static str {
        "port state"
    }
    fn expected(&self) -> String {
        "ACTIVE or DOWN".into()
    }
    fn parse(&self, text: &str) -> Result<bool, Option<String>> {
        if text.eq_ignore_ascii_case("DOWN") {
            Ok(true)
        } else if text.eq_ignore_ascii_case("ACTIVE") {
            Ok(false)
        } else {
            Err(None)
        }
    }
}

/// One of two words (exactly, lower case); the value is whether it is the second.
pub struct Words {
    pub no: &'static str,
    pub yes: &'static str,
}

impl Kind for Words {
    type Value = bool;
    fn type_name(&self) -> &'static str {
        "word"
    }
    fn expected(&self) -> String {
        format!("{} or {}", self.no, self.yes)
    }
    fn parse(&self, text: &str) -> Result<bool, Option<String>> {
        if text == self.yes {
            Ok(true)
        } else if text == self.no {
            Ok(false)
        } else {
            Err(None)
        }
    }
}

/// A fault schedule: `COMMAND@SECONDS`, comma-separated; the value is the text. The times are
/// checked here ([`schedule_times`]); the commands are the driver's to know, so
/// `driver::faults::configured_schedule` checks them (and `driver::instances::check_config`
/// stops on them as on any variable here).
pub struct Faults;

impl Kind for Faults {
    type Value = String;
    fn type_name(&self) -> &'static str {
        "fault schedule"
    }
    fn expected(&self) -> String {
        "COMMAND@SECONDS, comma-separated (softroce-ctl's commands)".into()
    }
    fn parse(&self, text: &str) -> Result<String, Option<String>> {
        schedule_times(text).map(|_| text.to_string()).map_err(Some)
    }
}

/// The items of a fault schedule `spec` (comma-separated `COMMAND@TIME`, TIME in seconds, an
/// optional `s` after it), each with its time and its command text, in the order given.
pub fn schedule_times(spec: &str) -> Result<Vec<(Duration, &str)>, String> {
    let mut out = Vec::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (cmd, at) = item
            .rsplit_once('@')
            .ok_or_else(|| format!("`{item}`: want COMMAND@SECONDS"))?;
        let secs: f64 = at
            .trim()
            .trim_end_matches('s')
            .parse()
            .map_err(|_| format!("`{item}`: `{at}` is not a time in seconds"))?;
        if !(secs.is_finite() && secs >= 0.0) {
            return Err(format!("`{item}`: the time must be ≥ 0"));
        }
        out.push((Duration::from_secs_f64(secs), cmd));
    }
    Ok(out)
}

/// A variable whose value does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadValue {
    pub name: &'static str,
    /// The value as set (lossy for non-UTF-8 text).
    pub value: String,
    /// What was expected, with the parser's reason when it has one.
    pub expected: String,
}

impl BadValue {
    /// The line softroce prints: `softroce: SOFTROCE_ADDR="127.0.263.1" is not valid: expected
    /// IPv4 addresses, … (`127.0.263.1` is not one); no device is offered until it is fixed`.
    /// The value is quoted and escaped, so the line stays one line whatever was set.
    pub fn line(&self) -> String {
        format!(
            "softroce: {}={:?} is not valid: expected {}; no device is offered until it is fixed",
            self.name, self.value, self.expected
        )
    }
}

impl std::fmt::Display for BadValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.line())
    }
}

/// One row of the docs table.
#[derive(Debug, Clone)]
pub struct Variable {
    pub name: &'static str,
    pub type_name: &'static str,
    pub default: &'static str,
    /// The accepted values ([`Kind::expected`]).
    pub range: String,
    /// The doc comment of the declaration, its lines joined.
    pub meaning: String,
}

/// Parses `name` from `lookup` with `kind`: `Ok(None)` when unset or blank.
fn read<K: Kind>(
    name: &'static str,
    kind: &K,
    lookup: &dyn Fn(&str) -> Option<Result<String, String>>,
) -> Result<Option<K::Value>, BadValue> {
    let bad = |value: String, why: Option<String>| BadValue {
        name,
        value,
        expected: match why {
            Some(why) => format!("{} ({why})", kind.expected()),
            None => kind.expected(),
        },
    };
    match lookup(name) {
        None => Ok(None),
        Some(Ok(text)) if text.trim().is_empty() => Ok(None),
        Some(Ok(text)) => kind.parse(text.trim()).map(Some).map_err(|why| bad(text, why)),
        Some(Err(lossy)) => Err(bad(lossy, Some("the value is not UTF-8".into()))),
    }
}

/// Declares the variables: for each, its getter, its field in [`Config`] (the parsed value,
/// `None` when unset), its row in [`variables`] and its parse in [`Config::from_lookup`].
///
/// `default(EXPR) "TEXT"`: the getter returns the value or `EXPR`; `unset "TEXT"`: the getter
/// returns the `Option`. TEXT is the default column of the docs.
macro_rules! variables {
    ($(
        $(#[doc = $doc:literal])+
        $name:literal => $getter:ident: $kind_ty:ty = $kind:expr, $how:ident $(($default:expr))? $default_text:literal;
    )+) => {
        /// The parsed values of every variable (`None`: unset).
        #[derive(Clone, Default)]
        pub struct Config {
            $(pub $getter: Option<<$kind_ty as Kind>::Value>,)+
        }

        impl Config {
            /// Parses every variable through `lookup` (`None`: unset; `Err(lossy)`: not UTF-8),
            /// stopping at the first that does not parse, in table order.
            pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<Result<String, String>>) -> Result<Config, BadValue> {
                Ok(Config {
                    $($getter: read::<$kind_ty>($name, &$kind, lookup)?,)+
                })
            }
        }

        /// Every variable, in declaration order.
        pub fn variables() -> Vec<Variable> {
            vec![$(
                Variable {
                    name: $name,
                    type_name: Kind::type_name(&$kind),
                    default: $default_text,
                    range: Kind::expected(&$kind),
                    meaning: [$($doc),+].iter().map(|l| l.trim()).collect::<Vec<_>>().join(" "),
                },
            )+]
        }

        $(
            variables!(@getter [$($doc)+] $getter, $kind_ty, $how $($default)?);
        )+
    };
    (@getter [$($doc:literal)+] $getter:ident, $kind_ty:ty, default $default:expr) => {
        $(#[doc = $doc])+
        pub fn $getter() -> <$kind_ty as Kind>::Value {
            get().$getter.clone().unwrap_or_else(|| $default)
        }
    };
    (@getter [$($doc:literal)+] $getter:ident, $kind_ty:ty, unset) => {
        $(#[doc = $doc])+
        pub fn $getter() -> Option<<$kind_ty as Kind>::Value> {
            get().$getter.clone()
        }
    };
}

const NO_UNIT: &str = "";

variables! {
    /// Number of devices `softroce0` … `softroce{N-1}`.
    "SOFTROCE_DEVICES" => num_devices: Int<usize> = Int { min: 1, max: 64, unit: NO_UNIT }, default(1) "1";
    /// IPv4 address(es) to bind UDP port 4791 on, entry *i* for device *i*. Unset (or a device
    /// past the list): the host's addresses in order, then the first free 127.0.0.x.
    "SOFTROCE_ADDR" => addr_list: Addrs = Addrs, unset "auto";
    /// Active and max port MTU. Unset: the largest IB MTU that fits the interface's MTU less
    /// 80 bytes of headers (4096 on `lo`).
    "SOFTROCE_MTU" => mtu_override: Mtu = Mtu, unset "from the interface";
    /// Verify the ICRC of received packets; 0 accepts peers that do not send IP ID 0 (kernel
    /// rxe, NICs).
    "SOFTROCE_ICRC_CHECK" => icrc_check: Flag = Flag, default(true) "1";
    /// `DOWN`: every port reports `IBV_PORT_DOWN` (physical state Disabled) to `ibv_query_port`,
    /// as a NIC whose link is down, for tests of what applications say about it; traffic is not
    /// affected.
    "SOFTROCE_PORT_STATE" => port_down: PortState = PortState, default(false) "ACTIVE";
    /// The link layer of the ports: `roce` (RoCEv2 over UDP) or `ib` (InfiniBand packets, LID
    /// addressing; their UDP carriage between softroce processes is an emulation,
    /// docs/softroce.md#infiniband-mode); a list gives each device its own (`ib,roce`).
    "SOFTROCE_LINK_LAYER" => link_ib: LinkLayers = LinkLayers, default(vec![false]) "roce";
    /// `off`: an InfiniBand port has no subnet manager, so it stays `PORT_INIT` with LID 0.
    "SOFTROCE_SM" => subnet_manager: Words = Words { no: "off", yes: "on" }, default(true) "on";
    /// Empty GID entries at the head of a RoCE port's table (as in a container that sees only its
    /// own netdev's GIDs): the link-local and IPv4-mapped pairs move up by this many indices.
    "SOFTROCE_GID_HOLES" => gid_holes: Int<usize> = Int { min: 0, max: 10, unit: NO_UNIT }, default(0) "0";
    /// `on`: a router serves the subnet, so GID 1 of an InfiniBand port is its routable GID: prefix
    /// fec0::/16 with the port's FLID (its LID) in bytes 4 and 5 (docs/softroce.md#infiniband-mode).
    "SOFTROCE_IB_ROUTER" => ib_router: Words = Words { no: "off", yes: "on" }, default(false) "off";
    /// The P_Key table of every port, entry i at index i (`ibv_query_pkey`); a QP's `pkey_index`
    /// must name an entry. Packets carry 0xFFFF whatever the entry: P_Keys are not enforced.
    "SOFTROCE_PKEYS" => pkeys: Pkeys = Pkeys, default(vec![wire::DEFAULT_PKEY]) "0xffff";
    /// Where each device's fault-control socket `ADDR.sock` lives (`softroce-ctl`).
    "SOFTROCE_CTL_DIR" => ctl_dir: Path = Path, default(PathBuf::from("/tmp/softroce")) "/tmp/softroce";
    /// Faults scheduled for every device of the process, in seconds from the device's start,
    /// e.g. `port-down@2s,port-up@3.5s`.
    "SOFTROCE_FAULTS" => faults: Faults = Faults, unset "unset";
    /// Probability that a received packet is dropped (fault injection).
    "SOFTROCE_LOSS" => loss: Probability = Probability, default(0.0) "0";
    /// Probability that a received packet is held back and handled after the next one (one held
    /// at a time; never past the end of a receive batch).
    "SOFTROCE_REORDER" => reorder: Probability = Probability, default(0.0) "0";
    /// Probability that a received packet is handled twice.
    "SOFTROCE_DUP" => dup: Probability = Probability, default(0.0) "0";
    /// Seed of the fault injector (loss, reordering, duplication).
    "SOFTROCE_SEED" => seed: Int<u64> = Int { min: 0, max: u64::MAX, unit: NO_UNIT }, default(time_seed()) "time ⊕ pid";
    /// Directory where the process keeps `softroce-faults-<pid>.txt` (`lost=N reordered=N
    /// duplicated=N`) up to date, at most twice a second, while it injects faults.
    "SOFTROCE_FAULT_COUNTS" => fault_counts_dir: Path = Path, unset "unset";
    /// Send runs of equal-size packets to one peer as one UDP GSO datagram (receiving always
    /// uses GRO). Segment *i* carries IP ID *i*, inside the ICRC; a capture on `lo` shows the
    /// unsegmented super-datagram, so use 0 to capture one packet per frame.
    "SOFTROCE_GSO" => gso: Flag = Flag, default(true) "1";
    /// While packets arrive, the engine polls its socket this long (yielding between polls)
    /// before it blocks; 0 always blocks at once.
    "SOFTROCE_SPIN_US" => spin_us: Int<u64> = Int { min: 0, max: 10_000, unit: "µs" }, default(50) "50";
    /// A message of at most 4 KiB posted while its QP has packets outstanding is sent by the
    /// engine with the next batch (one GSO datagram for many), or at the posting thread's next
    /// empty CQ poll if that comes first; 0: the posting thread always transmits at once.
    "SOFTROCE_DEFER" => defer: Flag = Flag, default(true) "1";
    /// An application thread whose CQ polls find nothing receives and handles the next batch of
    /// datagrams itself when no other thread is receiving; 0 leaves receiving to the engine.
    "SOFTROCE_INLINE_RX" => inline_rx: Flag = Flag, default(true) "1";
    /// How long a thread's CQ polls must all have been empty before it receives inline (0: from
    /// its first yield point); ~30 leaves short waits to the engine, which suits tools that spin
    /// on memory without yielding (`ib_write_lat`), at the cost of part of the throughput gain.
    "SOFTROCE_INLINE_RX_AFTER_US" => inline_rx_after: Micros = Micros { max: 1_000_000 }, default(Duration::ZERO) "0";
    /// 0: the engine thread never receives (timers and deferred sends only), so only polling
    /// application threads move packets; a diagnostic (`softroce/tests/verbs_inline_rx.rs`).
    "SOFTROCE_ENGINE_RX" => engine_rx: Flag = Flag, default(true) "1";
    /// An application thread whose CQ polls have all been empty this long waits (at most 100 µs)
    /// for the NIC's next event instead of only yielding (`driver::idle`); 0 never waits.
    "SOFTROCE_POLL_SLEEP_AFTER_US" => poll_sleep_after: Micros = Micros { max: 1_000_000 }, default(Duration::from_micros(200)) "200";
    /// An application thread polling an empty CQ gives its CPU away (`sched_yield`) every this
    /// many empty polls, so spinning applications do not starve the engine threads; 0 never
    /// yields.
    "SOFTROCE_POLL_YIELD" => poll_yield: Int<u32> = Int { min: 0, max: 1_000_000, unit: NO_UNIT }, default(64) "64";
    /// Shortest delay of the adaptive retransmission probe, which goes back N when an answer is
    /// overdue (max(4 × smoothed RTT + 100 µs, this), doubled per unanswered probe, never past
    /// the QP's local ACK timeout); 0 turns the probe off, leaving the ACK timeout alone (IBA).
    "SOFTROCE_PROBE_FLOOR_US" => probe_floor: Micros = Micros { max: 10_000_000 }, default(Duration::from_nanos(crate::proto::DEFAULT_ADAPTIVE_RETRANSMIT_FLOOR.as_nanos())) "2000";
    /// Log engine events to stderr: dropped packets (bad ICRC, send errors), each QP's counters
    /// at `ibv_destroy_qp`, injected faults.
    "SOFTROCE_DEBUG" => debug: Flag = Flag, default(false) "0";
}

/// `SOFTROCE_SEED`'s default: derived from the time and the pid, once per process.
fn time_seed() -> u64 {
    static V: OnceLock<u64> = OnceLock::new();
    *V.get_or_init(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        t ^ ((std::process::id() as u64) << 32)
    })
}

/// The process's environment, as [`Config::from_lookup`] reads it.
fn env_lookup(name: &str) -> Option<Result<String, String>> {
    let v = std::env::var_os(name)?;
    Some(v.into_string().map_err(|v| v.to_string_lossy().into_owned()))
}

/// The variables of this process, parsed once.
fn load() -> &'static Result<Config, BadValue> {
    static V: OnceLock<Result<Config, BadValue>> = OnceLock::new();
    V.get_or_init(|| Config::from_lookup(&env_lookup))
}

/// The parsed variables, or every default when one does not parse (see the module contract).
fn get() -> &'static Config {
    static DEFAULTS: OnceLock<Config> = OnceLock::new();
    match load() {
        Ok(c) => c,
        Err(_) => DEFAULTS.get_or_init(Config::default),
    }
}

/// The first variable of the process that does not parse, if any. The device paths stop on it
/// (and on the commands of `SOFTROCE_FAULTS`) through `driver::instances::check_config`, which
/// prints its line.
pub fn error() -> Option<&'static BadValue> {
    load().as_ref().err()
}

/// The Markdown of `docs/softroce-variables.md`: a title, a paragraph and one table row per
/// variable (type, default, accepted values, meaning).
pub fn markdown_table() -> String {
    let cell = |s: &str| s.replace('|', "\\|");
    let mut out = String::from(
        "# softroce's environment variables\n\n\
         Generated from the declarations in `softroce/src/config.rs` by \
         `softroce-ctl --print-variables`; do not edit (a test of the \
         softroce crate fails when this file differs). Each variable is read once per process; \
         unset or blank means the default. A value that does not parse stops softroce with one \
         line on stderr naming the variable, the value and what is expected: \
         `ibv_get_device_list` then fails with EINVAL and no device is created.\n\n\
         | Variable | Type | Default | Accepted values | Meaning |\n\
         |---|---|---|---|---|\n",
    );
    for v in variables() {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            v.name,
            v.type_name,
            cell(v.default),
            cell(&v.range),
            cell(&v.meaning)
        ));
    }
    out.push_str(
        "\nAt build time, `SOFTROCE_PRIVATE_NODE` (default `IBVERBS_PRIVATE_34`) names the private \
         version node of the library (the rdma-core release it stands in for).\n",
    );
    out
}

#[cfg(test)]
mod tests;
