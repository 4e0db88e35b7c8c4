//! Every environment tunable of softroce, each read once, with its default.

use std::net::Ipv4Addr;
use std::sync::OnceLock;

use crate::wire;

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|s| !s.trim().is_empty())
}

/// `SOFTROCE_DEVICES` (default 1): number of devices `softroce0..N-1`.
pub fn num_devices() -> usize {
    static V: OnceLock<usize> = OnceLock::new();
    *V.get_or_init(|| {
        env("SOFTROCE_DEVICES")
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(1usize)
            .clamp(1, 64)
    })
}

/// `SOFTROCE_ADDR` (default unset): IPv4 address(es) to bind port 4791 on,
/// comma-separated, entry *i* for device *i*. Unset: see `device` (auto rules).
pub fn addr_list() -> Option<Vec<Ipv4Addr>> {
    static V: OnceLock<Option<Vec<Ipv4Addr>>> = OnceLock::new();
    V.get_or_init(|| {
        env("SOFTROCE_ADDR").map(|s| {
            s.split(',')
                .filter_map(|x| x.trim().parse::<Ipv4Addr>().ok())
                .filter(|a| !a.is_unspecified())
                .collect()
        })
    })
    .clone()
}

/// `SOFTROCE_MTU` (default: derived from the interface MTU, 4096 on `lo`):
/// active/max port MTU, in bytes (256..4096) or as the ibv_mtu enum (1..5).
pub fn mtu_override() -> Option<u32> {
    static V: OnceLock<Option<u32>> = OnceLock::new();
    *V.get_or_init(|| {
        let v: u32 = env("SOFTROCE_MTU")?.trim().parse().ok()?;
        (1..=5u8)
            .find(|&e| u32::from(e) == v || wire::mtu_bytes(e) == Some(v))
            .map(u32::from)
    })
}

/// `SOFTROCE_ICRC_CHECK` (default 1): verify the ICRC of received packets
/// (0 to accept peers that do not use IP ID 0, e.g. kernel rxe or NICs).
pub fn icrc_check() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| env("SOFTROCE_ICRC_CHECK").map(|s| s.trim() != "0").unwrap_or(true))
}

/// `SOFTROCE_PORT_STATE` (default `ACTIVE`): `DOWN` makes every port of the process report
/// IBV_PORT_DOWN (physical state Disabled) from `ibv_query_port`, as a NIC whose link is down:
/// for tests of what applications and ferroce-doctor say about it. Traffic is not affected.
pub fn port_down() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| env("SOFTROCE_PORT_STATE").is_some_and(|s| s.trim().eq_ignore_ascii_case("DOWN")))
}

/// `SOFTROCE_LOSS` (default 0): probability in [0,1] that a received packet is dropped.
pub fn loss() -> f64 {
    static V: OnceLock<f64> = OnceLock::new();
    *V.get_or_init(|| probability("SOFTROCE_LOSS"))
}

/// A probability in [0,1] from `name` (default 0; out-of-range values are clamped).
fn probability(name: &str) -> f64 {
    env(name)
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|p| p.is_finite())
        .map(|p| p.clamp(0.0, 1.0))
        .unwrap_or(0.0)
}

/// `SOFTROCE_REORDER` (default 0): probability that a received packet is held back and
/// handled after the next one (the last packet of a receive batch is never held past it).
pub fn reorder() -> f64 {
    static V: OnceLock<f64> = OnceLock::new();
    *V.get_or_init(|| probability("SOFTROCE_REORDER"))
}

/// `SOFTROCE_DUP` (default 0): probability that a received packet is handled twice.
pub fn dup() -> f64 {
    static V: OnceLock<f64> = OnceLock::new();
    *V.get_or_init(|| probability("SOFTROCE_DUP"))
}

/// `SOFTROCE_FAULT_COUNTS` (default unset): directory where the process keeps
/// `softroce-faults-<pid>.txt`, the packets its fault injector dropped, reordered and
/// duplicated so far (rewritten at most twice a second while it injects).
pub fn fault_counts_dir() -> Option<std::path::PathBuf> {
    static V: OnceLock<Option<std::path::PathBuf>> = OnceLock::new();
    V.get_or_init(|| env("SOFTROCE_FAULT_COUNTS").map(std::path::PathBuf::from))
        .clone()
}

/// `SOFTROCE_SEED` (default: derived from pid and time): seed of the fault injector.
pub fn seed() -> u64 {
    static V: OnceLock<u64> = OnceLock::new();
    *V.get_or_init(|| {
        env("SOFTROCE_SEED")
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| {
                let t = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1);
                t ^ ((std::process::id() as u64) << 32)
            })
    })
}

/// `SOFTROCE_GSO` (default 1): send runs of equal-size packets to one peer
/// as one UDP GSO datagram (receiving always uses UDP GRO). Segment *i* of a GSO
/// send carries IP ID *i*, which the ICRC covers; a capture on `lo` shows the
/// unsegmented super-datagram, so packet-by-packet ICRC checks of a capture
/// need `SOFTROCE_GSO=0`.
pub fn gso() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| env("SOFTROCE_GSO").map(|s| s.trim() != "0").unwrap_or(true))
}

/// `SOFTROCE_SPIN_US` (default 50): while packets are arriving, the engine
/// polls its socket this long (yielding the CPU between polls) before it
/// blocks, trading CPU for latency; 0 always blocks at once.
pub fn spin_us() -> u64 {
    static V: OnceLock<u64> = OnceLock::new();
    *V.get_or_init(|| {
        env("SOFTROCE_SPIN_US")
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(50)
            .min(10_000)
    })
}

/// `SOFTROCE_DEFER` (default 1): a posted message of at most 4 KiB on a QP
/// that already has packets outstanding is left to the engine, which sends
/// it when the next answer arrives, batched with the other due packets (one
/// GSO datagram instead of a syscall per message), or the posting thread's
/// next empty CQ poll sends it when that comes first (a round trip may be long). 0: the posting thread
/// always transmits at once.
pub fn defer() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| env("SOFTROCE_DEFER").map(|s| s.trim() != "0").unwrap_or(true))
}

/// `SOFTROCE_INLINE_RX` (default 1): an application thread whose CQ poll
/// finds nothing receives and handles the next batch of datagrams itself
/// when no other thread is doing so, instead of leaving all of it to the
/// engine thread; 0 leaves receiving to the engine.
pub fn inline_rx() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| env("SOFTROCE_INLINE_RX").map(|s| s.trim() != "0").unwrap_or(true))
}

/// `SOFTROCE_INLINE_RX_AFTER_US` (default 0: from the first yield point): how
/// long a thread's CQ polls must all have been empty before it receives
/// inline. Raising it to ~30 leaves short waits (a latency test's ACK) to the
/// engine, which suits tools that then spin on memory without yielding
/// (`ib_write_lat`: 19-28 us with inline receiving off or at 30, 30-35 us at
/// 0, on 2 busy CPUs) but gives up part of the throughput gain (a 64 MiB
/// all_reduce through the plugin: 2.3-2.8 GB/s at 0, 2.0-2.8 at 30).
pub fn inline_rx_after() -> std::time::Duration {
    static V: OnceLock<u64> = OnceLock::new();
    std::time::Duration::from_micros(*V.get_or_init(|| {
        env("SOFTROCE_INLINE_RX_AFTER_US")
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }))
}

/// `SOFTROCE_ENGINE_RX` (default 1): 0 leaves receiving entirely to polling
/// application threads (`SOFTROCE_INLINE_RX`); the engine thread then only
/// runs timers and deferred sends. A diagnostic, and how the tests prove the
/// inline path alone moves traffic.
pub fn engine_rx() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| env("SOFTROCE_ENGINE_RX").map(|s| s.trim() != "0").unwrap_or(true))
}

/// `SOFTROCE_POLL_SLEEP_AFTER_US` (default 200): an application thread whose
/// CQ polls have all been empty for this long waits for the NIC's next event
/// (`activity`, at most 100 µs) instead of only yielding (see
/// `driver::idle::idle_poll`); 0 never waits.
pub fn poll_sleep_after() -> std::time::Duration {
    static V: OnceLock<u64> = OnceLock::new();
    std::time::Duration::from_micros(*V.get_or_init(|| {
        env("SOFTROCE_POLL_SLEEP_AFTER_US")
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(200)
    }))
}

/// `SOFTROCE_POLL_YIELD` (default 64): an application thread polling an
/// empty CQ gives its CPU away (`sched_yield`) every this many empty polls,
/// so spinning applications do not starve the engine threads; 0 never yields.
pub fn poll_yield() -> u32 {
    static V: OnceLock<u32> = OnceLock::new();
    *V.get_or_init(|| {
        env("SOFTROCE_POLL_YIELD")
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(64)
    })
}

/// `SOFTROCE_DEBUG` (default 0): log engine events to stderr.
pub fn debug() -> bool {
    static V: OnceLock<bool> = OnceLock::new();
    *V.get_or_init(|| env("SOFTROCE_DEBUG").map(|s| s.trim() != "0").unwrap_or(false))
}
