//! Faults a test injects into a device, as a real NIC or network fails: the port goes down and
//! comes back, the GID table changes, a peer becomes unreachable without any event (a broken
//! path) and is healed. Commands come from `softroce-ctl` over the device's control socket
//! ([`super::ctl`]) or from the `SOFTROCE_FAULTS` schedule.
//!
//! * `port-down`: `IBV_EVENT_PORT_ERR` to every context of the device; `ibv_query_port` says
//!   DOWN; nothing is sent or received, so work requests in flight retry and complete with
//!   `IBV_WC_RETRY_EXC_ERR`, moving their QP to the error state, as on hardware.
//! * `port-up`: traffic flows again; `IBV_EVENT_PORT_ACTIVE`.
//! * `gid-change`: the IPv4-mapped GIDs (indices 2 and 3) disappear, as when the interface loses
//!   its address, or come back on the next one — every other time two entries higher (4 and 5),
//!   as when the address is added again while other entries took its old slots, so a GID index
//!   picked before no longer holds it; `IBV_EVENT_GID_CHANGE` each time.
//! * `blackhole PEER`: packets to and from that IPv4 address vanish, with no event; `heal`
//!   ends every blackhole.
//! * `device-fatal`: the NIC dies (a firmware or PCIe failure): `IBV_EVENT_DEVICE_FATAL` to every
//!   context of the device, every QP to ERR with its work requests flushed
//!   (`IBV_WC_WR_FLUSH_ERR`), and from then on posts fail with EIO and nothing is sent or
//!   received, as rdma-core with mlx5 behaves in the fatal state. Only a new process (on
//!   hardware: a device reset) brings it back.
//! * `qp-fatal QPN` / `qp-access-err QPN`: that QP enters ERR as if the NIC had found a local
//!   or transport error (`IBV_EVENT_QP_FATAL`) or a remote access violation
//!   (`IBV_EVENT_QP_ACCESS_ERR`) on it; its work requests flush; the other QPs go on.
//! * `cq-overrun QPN`: the CQs of that QP overrun, exactly as when more completions than the
//!   CQ's size are left unpolled (which the device detects by itself): `IBV_EVENT_CQ_ERR`
//!   once per CQ.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::config::{BadValue, Kind};

/// A fault command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    PortDown,
    PortUp,
    GidChange,
    Blackhole(Ipv4Addr),
    Heal,
    Status,
    DeviceFatal,
    QpFatal(u32),
    QpAccessErr(u32),
    CqOverrun(u32),
}

/// A QP number as `ibv_devinfo` and the logs print it: decimal or `0x` hex, 24 bits.
fn parse_qpn(word: &str, arg: Option<&str>) -> Result<u32, String> {
    let want = || format!("{word} needs a QP number (decimal or 0x hex)");
    let a = arg.ok_or_else(want)?;
    let n = match a.strip_prefix("0x").or_else(|| a.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => a.parse(),
    }
    .map_err(|_| want())?;
    if n > crate::wire::MASK_24 {
        return Err(format!("{word}: {a} is not a 24-bit QP number"));
    }
    Ok(n)
}

impl Command {
    /// `port-down`, `port-up`, `gid-change`, `blackhole A.B.C.D` (or `blackhole=A.B.C.D`),
    /// `heal`, `status`, `device-fatal`, `qp-fatal QPN`, `qp-access-err QPN`, `cq-overrun QPN`.
    pub fn parse(text: &str) -> Result<Command, String> {
        let t = text.trim();
        let (word, arg) = match t.split_once([' ', '=']) {
            Some((w, a)) => (w, Some(a.trim())),
            None => (t, None),
        };
        let no_arg = |c: Command| match arg {
            None => Ok(c),
            Some(a) => Err(format!("`{word}` takes no argument (got `{a}`)")),
        };
        match word {
            "port-down" => no_arg(Command::PortDown),
            "port-up" => no_arg(Command::PortUp),
            "gid-change" => no_arg(Command::GidChange),
            "heal" => no_arg(Command::Heal),
            "status" => no_arg(Command::Status),
            "device-fatal" => no_arg(Command::DeviceFatal),
            "qp-fatal" => parse_qpn(word, arg).map(Command::QpFatal),
            "qp-access-err" => parse_qpn(word, arg).map(Command::QpAccessErr),
            "cq-overrun" => parse_qpn(word, arg).map(Command::CqOverrun),
            "blackhole" => match arg.map(str::parse::<Ipv4Addr>) {
                Some(Ok(ip)) => Ok(Command::Blackhole(ip)),
                Some(Err(_)) | None => Err("blackhole needs the peer's IPv4 address".into()),
            },
            _ => Err(format!(
                "unknown command `{word}` (port-down, port-up, gid-change, blackhole PEER_ADDR, heal, status, device-fatal, qp-fatal QPN, qp-access-err QPN, cq-overrun QPN)"
            )),
        }
    }
}

/// `SOFTROCE_FAULTS`: comma-separated `COMMAND@TIME` (TIME in seconds since the device came up,
/// e.g. `port-down@2s,port-up@3.5s,blackhole=127.0.0.2@1`), sorted by time.
pub fn parse_schedule(spec: &str) -> Result<Vec<(Duration, Command)>, String> {
    let mut out = Vec::new();
    for (at, cmd) in crate::config::schedule_times(spec)? {
        out.push((at, Command::parse(cmd)?));
    }
    out.sort_by_key(|(t, _)| *t);
    Ok(out)
}

/// The process's `SOFTROCE_FAULTS` schedule (empty when unset), or the variable's error when a
/// command in it is not one (its times are checked with the other variables, `config`).
pub fn configured_schedule() -> Result<Vec<(Duration, Command)>, BadValue> {
    schedule_of(crate::config::faults())
}

/// [`configured_schedule`] of the variable's text `text` (`None`: unset).
fn schedule_of(text: Option<String>) -> Result<Vec<(Duration, Command)>, BadValue> {
    let Some(text) = text else {
        return Ok(Vec::new());
    };
    parse_schedule(&text).map_err(|why| BadValue {
        name: "SOFTROCE_FAULTS",
        expected: format!("{} ({why})", Kind::expected(&crate::config::Faults)),
        value: text,
    })
}

/// The fault state of one device's port, read on every packet (two relaxed loads when healthy).
#[derive(Default)]
pub struct PortFaults {
    down: AtomicBool,
    /// `device-fatal` happened: the device is dead for the rest of the process.
    dead: AtomicBool,
    any_blackhole: AtomicBool,
    blackholed: Mutex<Vec<Ipv4Addr>>,
    /// Odd: the IPv4-mapped GIDs are gone.
    gid_generation: AtomicU32,
}

impl PortFaults {
    /// Whether a packet to or from `peer` is lost.
    pub fn drops(&self, peer: Ipv4Addr) -> bool {
        self.down.load(Ordering::Relaxed)
            || self.dead.load(Ordering::Relaxed)
            || (self.any_blackhole.load(Ordering::Relaxed)
                && self.blackholed.lock().map(|v| v.contains(&peer)).unwrap_or(false))
    }

    /// The port is down, by `port-down` or because the device died.
    pub fn is_down(&self) -> bool {
        self.down.load(Ordering::Relaxed) || self.is_dead()
    }

    /// Whether `device-fatal` happened.
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Relaxed)
    }

    /// The device dies; true the first time.
    pub fn kill(&self) -> bool {
        !self.dead.swap(true, Ordering::Relaxed)
    }

    /// Set the port down or up; true when that changed it.
    pub fn set_down(&self, down: bool) -> bool {
        self.down.swap(down, Ordering::Relaxed) != down
    }

    pub fn blackhole(&self, peer: Ipv4Addr) {
        if let Ok(mut v) = self.blackholed.lock() {
            if !v.contains(&peer) {
                v.push(peer);
            }
            self.any_blackhole.store(true, Ordering::Relaxed);
        }
    }

    pub fn heal(&self) {
        if let Ok(mut v) = self.blackholed.lock() {
            v.clear();
            self.any_blackhole.store(false, Ordering::Relaxed);
        }
    }

    /// Change the GID table (the IPv4-mapped entries go, or come back).
    pub fn change_gids(&self) {
        self.gid_generation.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether the IPv4-mapped GIDs are absent now.
    pub fn ipv4_gids_gone(&self) -> bool {
        self.ipv4_gid_slot().is_none()
    }

    /// The index of the IPv4-mapped RoCE v1 GID (v2 is the next one), None while absent: 2 at
    /// first, 4 after the first restore, 2 after the next, and so on.
    pub fn ipv4_gid_slot(&self) -> Option<usize> {
        match self.gid_generation.load(Ordering::Relaxed) % 4 {
            0 => Some(2),
            2 => Some(4),
            _ => None,
        }
    }

    /// One line for `softroce-ctl status`.
    pub fn describe(&self) -> String {
        let holes = self.blackholed.lock().map(|v| v.clone()).unwrap_or_default();
        format!(
            "{}port {}; IPv4 GIDs {}; blackholed peers: {}",
            if self.is_dead() {
                "device DEAD (device-fatal); "
            } else {
                ""
            },
            if self.is_down() { "DOWN" } else { "ACTIVE" },
            match self.ipv4_gid_slot() {
                Some(i) => format!("at {i} and {}", i + 1),
                None => "absent".to_string(),
            },
            if holes.is_empty() {
                "none".to_string()
            } else {
                holes.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(" ")
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_parse_and_bad_ones_say_why() {
        assert_eq!(Command::parse("port-down"), Ok(Command::PortDown));
        assert_eq!(Command::parse(" port-up\n"), Ok(Command::PortUp));
        assert_eq!(
            Command::parse("blackhole 127.0.0.2"),
            Ok(Command::Blackhole(Ipv4Addr::new(127, 0, 0, 2)))
        );
        assert_eq!(
            Command::parse("blackhole=10.1.2.3"),
            Ok(Command::Blackhole(Ipv4Addr::new(10, 1, 2, 3)))
        );
        assert!(Command::parse("blackhole").unwrap_err().contains("IPv4"));
        assert!(Command::parse("port-down now").unwrap_err().contains("no argument"));
        assert!(Command::parse("reboot").unwrap_err().contains("unknown command"));
        assert_eq!(Command::parse("device-fatal"), Ok(Command::DeviceFatal));
        assert_eq!(Command::parse("qp-fatal 0x11"), Ok(Command::QpFatal(0x11)));
        assert_eq!(Command::parse("qp-access-err 18"), Ok(Command::QpAccessErr(18)));
        assert_eq!(Command::parse("cq-overrun=0x1A"), Ok(Command::CqOverrun(0x1a)));
        assert!(Command::parse("qp-fatal").unwrap_err().contains("QP number"));
        assert!(Command::parse("qp-fatal 0xzz").unwrap_err().contains("QP number"));
        assert!(Command::parse("qp-fatal 0x1000000").unwrap_err().contains("24-bit"));
        assert!(Command::parse("device-fatal now").unwrap_err().contains("no argument"));
    }

    #[test]
    fn schedules_are_sorted_and_checked() {
        let s = parse_schedule("port-up@3.5s, port-down@2s,blackhole=127.0.0.9@0").unwrap();
        assert_eq!(s[0], (Duration::ZERO, Command::Blackhole(Ipv4Addr::new(127, 0, 0, 9))));
        assert_eq!(s[1], (Duration::from_secs(2), Command::PortDown));
        assert_eq!(s[2], (Duration::from_millis(3500), Command::PortUp));
        assert!(parse_schedule("port-down").is_err());
        assert!(parse_schedule("port-down@soon").is_err());
        assert!(parse_schedule("port-down@-1").is_err());
    }

    #[test]
    fn an_unknown_command_in_softroce_faults_is_the_variable_s_error() {
        assert_eq!(schedule_of(None), Ok(Vec::new()));
        assert_eq!(
            schedule_of(Some("port-down@1".into())),
            Ok(vec![(Duration::from_secs(1), Command::PortDown)])
        );
        let bad = schedule_of(Some("port-down@1,explode@2".into())).unwrap_err();
        assert_eq!(
            bad.line(),
            "softroce: SOFTROCE_FAULTS=\"port-down@1,explode@2\" is not valid: expected COMMAND@SECONDS, \
             comma-separated (softroce-ctl's commands) (unknown command `explode` (port-down, port-up, gid-change, \
             blackhole PEER_ADDR, heal, status, device-fatal, qp-fatal QPN, qp-access-err QPN, cq-overrun QPN)); \
             no device is offered until it is fixed"
        );
    }

    #[test]
    fn a_port_down_drops_everything_a_blackhole_one_peer() {
        let f = PortFaults::default();
        let (a, b) = (Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2));
        assert!(!f.drops(a));
        f.blackhole(b);
        assert!(!f.drops(a) && f.drops(b));
        f.heal();
        assert!(!f.drops(b));
        assert!(f.set_down(true) && !f.set_down(true));
        assert!(f.drops(a) && f.drops(b));
        assert!(f.set_down(false));
        f.change_gids();
        assert!(f.ipv4_gids_gone());
        f.change_gids();
        assert_eq!(f.ipv4_gid_slot(), Some(4));
        f.change_gids();
        f.change_gids();
        assert_eq!(f.ipv4_gid_slot(), Some(2));
        assert!(f.kill() && !f.kill());
        assert!(f.is_dead() && f.is_down() && f.drops(a));
        assert!(f.describe().contains("DEAD"));
    }
}
