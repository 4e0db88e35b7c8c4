//! Two hosts: `--serve` waits for `--peer`; they trade their findings (one JSON object per
//! line over TCP), flag what differs, then measure through the plugin ([`crate::measure`]).
//! Every wait is bounded by the timeout, so an unreachable or silent peer is a clear error.

use crate::check::{Check, Status};
use crate::measure::{self, Link};
use crate::sysinfo;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The longest line a peer may send (its findings are a few KiB).
const MAX_LINE: u64 = 1 << 20;

/// What this host tells the other: versions, the device the test will use, the variables.
pub fn findings(host: &crate::host::HostFacts, checks: &[Check], vars: &crate::Vars, qps: u32) -> Value {
    let device = host
        .plugin_devices
        .first()
        .and_then(|label| host.ports.iter().find(|p| &p.label() == label))
        .map(|p| p.to_json());
    json!({
        "tool": "ferroce-doctor",
        "version": ferroce::VERSION,
        "host": sysinfo::hostname(),
        "device": device,
        "qps_per_connection": qps,
        "env": crate::env::network_variables(vars),
        "failed": checks.iter().filter(|c| c.status == Status::Fail).map(|c| c.name.clone()).collect::<Vec<_>>(),
    })
}

/// Both sides run the same ferroce version.
fn version_check(mine: &Value, theirs: &Value, peer: &str) -> Check {
    let (v1, v2) = (&mine["version"], &theirs["version"]);
    if v1 == v2 {
        Check::ok("pair ferroce version", format!("{} on both", text(v1)))
    } else {
        Check::warn(
            "pair ferroce version",
            format!("{} here, {} on {peer}", text(v1), text(v2)),
            "run the same ferroce build on every host",
        )
    }
}

/// A WARN naming the peer's own failing checks, if it has any.
fn peer_failures(theirs: &Value, peer: &str) -> Option<Check> {
    let failed = theirs["failed"].as_array().cloned().unwrap_or_default();
    if failed.is_empty() {
        return None;
    }
    let names: Vec<String> = failed.iter().map(text).collect();
    Some(Check::warn(
        "pair peer checks",
        format!("{peer} has {} failing check(s): {}", names.len(), names.join(", ")),
        format!("run ferroce-doctor on {peer} and fix those first"),
    ))
}

/// What differs between the two sides' findings (`mine` is this host's).
pub fn compare(mine: &Value, theirs: &Value) -> Vec<Check> {
    let mut out = Vec::new();
    let peer = theirs["host"].as_str().unwrap_or("the peer");
    out.push(version_check(mine, theirs, peer));
    out.extend(peer_failures(theirs, peer));
    let (d1, d2) = (&mine["device"], &theirs["device"]);
    if d1.is_null() || d2.is_null() {
        out.push(Check::fail(
            "pair devices",
            format!("no usable device {}", if d1.is_null() { "here" } else { "on the peer" }),
            "see the plugin devices check",
        ));
        return out;
    }
    out.push(Check::ok(
        "pair devices",
        format!("{} here, {} on {peer}", text(&d1["port"]), text(&d2["port"])),
    ));
    let same = |k: &str| d1[k] == d2[k];
    if !same("link_layer") {
        out.push(Check::fail(
            "pair link layer",
            format!(
                "{} here, {} on {peer}",
                link_layer_text(&d1["link_layer"]),
                link_layer_text(&d2["link_layer"])
            ),
            "InfiniBand and RoCE ports cannot talk: select matching ports with NCCL_IB_HCA",
        ));
        return out;
    }
    out.push(mtu_check(d1, d2, peer));
    if d1["link_layer"] == "Ethernet" {
        out.push(if same("roce_version") {
            Check::ok(
                "pair roce version",
                format!("RoCE v{} on both", text(&d1["roce_version"])),
            )
        } else {
            Check::fail(
                "pair roce version",
                format!(
                    "RoCE v{} here, v{} on {peer}",
                    text(&d1["roce_version"]),
                    text(&d2["roce_version"])
                ),
                "set NCCL_IB_ROCE_VERSION_NUM (or NCCL_IB_GID_INDEX) to the same on both",
            )
        });
        out.push(gid_check(d1, d2, peer));
    } else {
        out.push(crate::host::ib_subnet_check(d1, d2, peer));
    }
    let (q1, q2) = (&mine["qps_per_connection"], &theirs["qps_per_connection"]);
    out.push(if q1 == q2 {
        Check::ok("pair NCCL_IB_QPS_PER_CONNECTION", format!("{} on both", text(q1)))
    } else {
        Check::fail(
            "pair NCCL_IB_QPS_PER_CONNECTION",
            format!(
                "{} here, {} on {peer}: the plugin rejects the connection",
                text(q1),
                text(q2)
            ),
            "set the same NCCL_IB_QPS_PER_CONNECTION on every host",
        )
    });
    out.extend(env_differences(&mine["env"], &theirs["env"], peer));
    out
}

/// A link layer as the port lines name it: "Ethernet (RoCE)" or "InfiniBand".
fn link_layer_text(v: &Value) -> String {
    match v.as_str() {
        Some("Ethernet") => "Ethernet (RoCE)".to_string(),
        _ => text(v),
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "(unknown)".into(),
        other => other.to_string(),
    }
}

fn mtu_check(d1: &Value, d2: &Value, peer: &str) -> Check {
    let shown = |d: &Value| format!("{} (netdev {})", text(&d["active_mtu"]), text(&d["netdev_mtu"]));
    let value = format!("{} here, {} on {peer}", shown(d1), shown(d2));
    if d1["active_mtu"] != d2["active_mtu"] {
        let smaller = d1["active_mtu"].as_u64().min(d2["active_mtu"].as_u64()).unwrap_or(0);
        Check::warn(
            "pair mtu",
            format!("{value}: the connection runs at {smaller}"),
            "give both ports (and netdevs, and the switch) the same MTU",
        )
    } else if d1["netdev_mtu"] != d2["netdev_mtu"] && !d1["netdev_mtu"].is_null() && !d2["netdev_mtu"].is_null() {
        Check::warn(
            "pair mtu",
            format!("{value}: the netdev MTUs differ"),
            "set the same netdev MTU on both hosts",
        )
    } else {
        Check::ok("pair mtu", value)
    }
}

fn gid_check(d1: &Value, d2: &Value, peer: &str) -> Check {
    let value = format!("{} here, {} on {peer}", text(&d1["gid"]), text(&d2["gid"]));
    if d1["gid_family"] != d2["gid_family"] {
        return Check::fail(
            "pair gid",
            format!(
                "{value}: {} against {}",
                text(&d1["gid_family"]),
                text(&d2["gid_family"])
            ),
            "set the same NCCL_IB_ADDR_FAMILY on both",
        );
    }
    let ip = |d: &Value| {
        d["gid"]
            .as_str()
            .and_then(|g| g.parse::<std::net::Ipv6Addr>().ok())
            .map(|g| crate::host::gid_ip(&g.octets()))
    };
    let (Some(a), Some(b), Some(len)) = (ip(d1), ip(d2), d1["prefix_len"].as_u64()) else {
        return Check::ok("pair gid", format!("{value} (subnet unknown)"));
    };
    if sysinfo::same_subnet(a, b, len as u8) {
        Check::ok("pair gid", format!("{value}: same /{len} subnet"))
    } else {
        Check::warn(
            "pair gid",
            format!("{value}: different subnets (/{len}), so the traffic is routed"),
            "RoCE v2 with routes (and matching PFC/ECN) between the subnets, or GIDs of one subnet (NCCL_IB_ADDR_RANGE)",
        )
    }
}

fn env_differences(mine: &Value, theirs: &Value, peer: &str) -> Vec<Check> {
    let keys: BTreeSet<&String> = [mine, theirs]
        .iter()
        .filter_map(|v| v.as_object())
        .flat_map(|o| o.keys())
        .filter(|k| k.starts_with("NCCL_IB") && k.as_str() != ferroce::config::var::qps_per_connection)
        .collect();
    let shown = |v: &Value| if v.is_null() { "(unset)".to_string() } else { text(v) };
    keys.into_iter()
        .filter(|k| mine[k.as_str()] != theirs[k.as_str()])
        .map(|k| {
            Check::warn(
                format!("pair env {k}"),
                format!(
                    "{} here, {} on {peer}",
                    shown(&mine[k.as_str()]),
                    shown(&theirs[k.as_str()])
                ),
                "NCCL_IB_* settings should be the same on every host",
            )
        })
        .collect()
}

/// One JSON object per line over TCP, each read bounded by the deadline.
struct Wire {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    peer: SocketAddr,
    deadline: Instant,
    timeout: Duration,
}

impl Wire {
    fn new(stream: TcpStream, timeout: Duration) -> Result<Wire, String> {
        let peer = stream.peer_addr().map_err(|e| format!("getpeername: {e}"))?;
        let writer = stream.try_clone().map_err(|e| format!("dup: {e}"))?;
        Ok(Wire {
            reader: BufReader::new(stream),
            writer,
            peer,
            deadline: Instant::now() + timeout,
            timeout,
        })
    }

    /// The next exchange may take a full timeout again.
    fn renew(&mut self) {
        self.deadline = Instant::now() + self.timeout;
    }

    fn send(&mut self, v: &Value) -> Result<(), String> {
        let mut line = v.to_string();
        line.push('\n');
        self.writer
            .write_all(line.as_bytes())
            .map_err(|e| format!("sending to {}: {e}", self.peer))
    }

    fn recv(&mut self, what: &str) -> Result<Value, String> {
        let left = self
            .deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        self.reader
            .get_ref()
            .set_read_timeout(Some(left))
            .map_err(|e| e.to_string())?;
        let mut line = String::new();
        let silent = || {
            format!(
                "{} sent no {what} within {:?}: is it a ferroce-doctor --serve/--peer, and still running?",
                self.peer, self.timeout
            )
        };
        match (&mut self.reader).take(MAX_LINE).read_line(&mut line) {
            Ok(0) => Err(format!("{} closed the connection before sending its {what}", self.peer)),
            Ok(_) => serde_json::from_str(line.trim()).map_err(|e| {
                format!(
                    "{} sent something that is not a ferroce-doctor message ({e})",
                    self.peer
                )
            }),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                Err(silent())
            }
            Err(e) => Err(format!("reading from {}: {e}", self.peer)),
        }
    }
}

/// Options of the pair test.
pub struct PairOptions {
    pub timeout: Duration,
    pub seconds: f64,
    pub dev: i32,
}

/// `--serve`: binds, prints the line for the other host through `announce`, waits for the
/// peer, compares, then runs the receiving side of the data test.
pub fn serve(bind: SocketAddr, opts: &PairOptions, mine: &Value, announce: &dyn Fn(&str), out: &mut Vec<Check>) {
    let listener = match TcpListener::bind(bind) {
        Ok(l) => l,
        Err(e) => {
            out.push(Check::fail(
                "pair serve",
                format!("cannot listen on {bind}: {e}"),
                "pick another --port or address",
            ));
            return;
        }
    };
    let local = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| bind.to_string());
    announce(&format!("on the other host run: ferroce-doctor --peer {local}"));
    let stream = match accept_until(&listener, Instant::now() + opts.timeout) {
        Ok(s) => s,
        Err(e) => {
            out.push(Check::fail(
                "pair serve",
                e,
                "start `ferroce-doctor --peer ...` on the other host within the timeout (--timeout)",
            ));
            return;
        }
    };
    if let Err(e) = serve_session(stream, opts, mine, out) {
        out.push(Check::fail("pair", e, ""));
    }
}

fn accept_until(listener: &TcpListener, deadline: Instant) -> Result<TcpStream, String> {
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).map_err(|e| e.to_string())?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(format!("accept: {e}")),
        }
        if Instant::now() > deadline {
            return Err("no peer connected before the timeout".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn serve_session(stream: TcpStream, opts: &PairOptions, mine: &Value, out: &mut Vec<Check>) -> Result<(), String> {
    let mut wire = Wire::new(stream, opts.timeout)?;
    let hello = wire.recv("findings")?;
    if hello["tool"] != "ferroce-doctor" {
        return Err(format!(
            "{} is not a ferroce-doctor (no findings in its first message)",
            wire.peer
        ));
    }
    wire.send(mine)?;
    out.extend(compare(mine, &hello));
    let link = open_link(&mut wire, opts)?;
    loop {
        wire.renew();
        let msg = wire.recv("next step")?;
        link.progressed();
        match msg["phase"].as_str() {
            Some("bw") => {
                let count = msg["count"]
                    .as_u64()
                    .filter(|&c| c > 0 && c <= 1_000_000)
                    .ok_or("the peer asked for a bad message count")? as usize;
                let bytes = link.recv_messages(count)?;
                wire.send(&json!({"received": bytes}))?;
            }
            Some("lat") => {
                let echoed = link.echo()?;
                wire.send(&json!({"echoed": echoed}))?;
            }
            Some("result") => {
                out.extend(result_checks(&msg, "from the peer's side"));
                return Ok(());
            }
            _ => return Err(format!("{} sent an unknown step", wire.peer)),
        }
    }
}

fn open_link(wire: &mut Wire, opts: &PairOptions) -> Result<Link, String> {
    wire.renew();
    let mut exchange = |mine: [u8; 128]| -> Result<[u8; 128], String> {
        wire.send(&json!({"handle": hex(&mine)}))?;
        let theirs = wire.recv("connection handle")?;
        theirs["handle"]
            .as_str()
            .and_then(unhex)
            .ok_or_else(|| "the peer's connection handle is malformed".to_string())
    };
    Link::open(opts.dev, opts.timeout, &mut exchange)
}

/// `--peer ADDR`: connects (retrying until the timeout), trades findings, compares, then
/// drives the data test and reports it.
pub fn peer(addr: &str, opts: &PairOptions, mine: &Value, out: &mut Vec<Check>) {
    let stream = match connect_until(addr, opts.timeout) {
        Ok(s) => s,
        Err(e) => {
            out.push(Check::fail(
                "pair connect",
                e,
                "start `ferroce-doctor --serve` on the other host first and give its address; check routes and firewalls",
            ));
            return;
        }
    };
    if let Err(e) = peer_session(stream, opts, mine, out) {
        out.push(Check::fail("pair", e, ""));
    }
}

fn connect_until(addr: &str, timeout: Duration) -> Result<TcpStream, String> {
    let start = Instant::now();
    let deadline = start + timeout;
    let targets: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| format!("{addr}: not an address (HOST:PORT): {e}"))?
        .collect();
    let mut last = String::from("no address");
    loop {
        for t in &targets {
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(10));
            match TcpStream::connect_timeout(t, left.min(Duration::from_secs(2))) {
                Ok(s) => return Ok(s),
                Err(e) => last = e.to_string(),
            }
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "cannot reach {addr} within {:.1} s (last error: {last}): is `ferroce-doctor --serve` running there?",
                start.elapsed().as_secs_f64()
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn peer_session(stream: TcpStream, opts: &PairOptions, mine: &Value, out: &mut Vec<Check>) -> Result<(), String> {
    let mut wire = Wire::new(stream, opts.timeout)?;
    wire.send(mine)?;
    let theirs = wire.recv("findings")?;
    if theirs["tool"] != "ferroce-doctor" {
        return Err(format!("{} is not a ferroce-doctor --serve", wire.peer));
    }
    out.extend(compare(mine, &theirs));
    let link = open_link(&mut wire, opts)?;
    // Calibrate on a short batch, then send about two thirds of the time's worth.
    let calibration = 2 * measure::DEPTH;
    let per_message = bw_phase(&mut wire, &link, calibration)?.0 / calibration as f64;
    let bw_seconds = opts.seconds * 2.0 / 3.0;
    let count = ((bw_seconds / per_message.max(1e-6)) as usize).clamp(calibration, 1_000_000);
    let (seconds, received) = bw_phase(&mut wire, &link, count)?;
    let bytes = (count * measure::BW_BYTES) as u64;
    if received != bytes {
        return Err(format!("the receiver got {received} bytes of the {bytes} sent"));
    }
    wire.renew();
    wire.send(&json!({"phase": "lat"}))?;
    link.progressed();
    let rtts = link.ping(Duration::from_secs_f64(opts.seconds / 3.0))?;
    wire.recv("end of the latency test")?;
    let speeds = [&mine["device"]["speed_mbps"], &theirs["device"]["speed_mbps"]];
    let link_mbps = speeds.iter().filter_map(|v| v.as_u64()).min().unwrap_or(0);
    let result = json!({
        "phase": "result",
        "bw_bytes_per_s": bytes as f64 / seconds,
        "bw_messages": count,
        "bw_seconds": seconds,
        "lat_half_rtt_us": median(&rtts) / 2.0 * 1e6,
        "lat_samples": rtts.len(),
        "link_mbps": link_mbps,
    });
    wire.send(&result)?;
    out.extend(result_checks(&result, "measured here"));
    Ok(())
}

fn bw_phase(wire: &mut Wire, link: &Link, count: usize) -> Result<(f64, u64), String> {
    wire.renew();
    wire.send(&json!({"phase": "bw", "count": count}))?;
    link.progressed();
    let seconds = link.send_messages(count)?;
    let ack = wire.recv("bandwidth result")?;
    Ok((seconds, ack["received"].as_u64().unwrap_or(0)))
}

fn median(samples: &[f64]) -> f64 {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(0.0)
}

/// The measurement as two checks, next to the link speed.
pub fn result_checks(r: &Value, whose: &str) -> Vec<Check> {
    let bw = r["bw_bytes_per_s"].as_f64().unwrap_or(0.0);
    let link_mbps = r["link_mbps"].as_f64().unwrap_or(0.0);
    let gbit = bw * 8.0 / 1e9;
    let share = if link_mbps > 0.0 {
        format!(", {:.0} % of", gbit * 1e3 / link_mbps * 100.0)
    } else {
        String::from(" of")
    };
    vec![
        Check::ok(
            "pair bandwidth 4 MiB",
            format!(
                "{:.2} GB/s ({gbit:.1} Gbit/s{share} the {:.0} Gbit/s link), {} messages in {:.2} s, {whose}",
                bw / 1e9,
                link_mbps / 1e3,
                r["bw_messages"],
                r["bw_seconds"].as_f64().unwrap_or(0.0)
            ),
        ),
        Check::ok(
            "pair latency 8 B",
            format!(
                "{:.1} us half round trip (median of {}), {whose}",
                r["lat_half_rtt_us"].as_f64().unwrap_or(0.0),
                r["lat_samples"]
            ),
        ),
    ]
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<[u8; 128]> {
    if text.len() != 256 {
        return None;
    }
    let mut out = [0u8; 128];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Where `--serve` listens: `--serve-addr`, else the side-channel interface the plugin picks
/// (NCCL_SOCKET_IFNAME rules), port `--port`.
pub fn serve_address(explicit: Option<IpAddr>, port: u16) -> Result<SocketAddr, String> {
    let ip = match explicit {
        Some(ip) => ip,
        None => {
            ferroce::transport::sidechannel::side_channel_interface()
                .map_err(|e| e.message)?
                .ip
        }
    };
    Ok(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(mtu: u64, netdev: u64, roce: u64, gid: &str, qps: u64, env: Value) -> Value {
        json!({
            "tool": "ferroce-doctor", "version": "0.1.0", "host": "h", "failed": [],
            "qps_per_connection": qps, "env": env,
            "device": {"port": "softroce0:1", "link_layer": "Ethernet", "active_mtu": mtu, "netdev_mtu": netdev,
                       "roce_version": roce, "gid": gid, "gid_family": "AF_INET", "prefix_len": 8, "speed_mbps": 100000},
        })
    }

    fn status_of(checks: &[Check], name: &str) -> Status {
        checks
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no {name}: {checks:?}"))
            .status
    }

    #[test]
    fn identical_sides_are_all_ok() {
        let a = side(4096, 65536, 2, "::ffff:127.0.61.1", 1, json!({}));
        let b = side(4096, 65536, 2, "::ffff:127.0.61.2", 1, json!({}));
        let c = compare(&a, &b);
        assert!(c.iter().all(|c| c.status == Status::Ok), "{c:?}");
    }

    #[test]
    fn mismatches_are_flagged() {
        let a = side(4096, 9000, 2, "::ffff:10.0.0.1", 1, json!({"NCCL_IB_TC": "106"}));
        let b = side(1024, 1500, 1, "::ffff:11.0.0.2", 4, json!({}));
        let c = compare(&a, &b);
        assert_eq!(status_of(&c, "pair mtu"), Status::Warn);
        assert!(c
            .iter()
            .any(|c| c.name == "pair mtu" && c.value.contains("runs at 1024")));
        assert_eq!(status_of(&c, "pair roce version"), Status::Fail);
        assert_eq!(status_of(&c, "pair gid"), Status::Warn, "different /8 subnets");
        assert_eq!(status_of(&c, "pair NCCL_IB_QPS_PER_CONNECTION"), Status::Fail);
        let env = c
            .iter()
            .find(|c| c.name == "pair env NCCL_IB_TC")
            .expect("env difference");
        assert_eq!(env.value, "106 here, (unset) on h");
        let mut v6 = b.clone();
        v6["device"]["gid_family"] = json!("AF_INET6");
        assert_eq!(status_of(&compare(&a, &v6), "pair gid"), Status::Fail);
        let mut old = b;
        old["version"] = json!("0.0.9");
        assert_eq!(status_of(&compare(&a, &old), "pair ferroce version"), Status::Warn);
    }

    #[test]
    fn infiniband_pairs_check_their_subnet_and_link_layers() {
        let mut a = side(4096, 0, 0, "", 1, json!({}));
        a["device"] = json!({"port": "mlx5_0:1", "link_layer": "InfiniBand", "active_mtu": 4096,
                             "gid": "fe80::253:7fff:fe00:1", "lid": 0x1665});
        let mut b = a.clone();
        b["device"]["gid"] = json!("fe80::253:7fff:fe00:2");
        let c = compare(&a, &b);
        assert!(c.iter().all(|c| c.status == Status::Ok), "{c:?}");
        assert!(c.iter().any(|c| c.name == "pair subnet"), "{c:?}");
        // InfiniBand against RoCE: a failure naming both, and nothing compared after it.
        let c = compare(&a, &side(4096, 65536, 2, "::ffff:10.0.0.2", 1, json!({})));
        let ll = c.iter().find(|c| c.name == "pair link layer").expect("pair link layer");
        assert_eq!(
            (ll.status, ll.value.as_str()),
            (Status::Fail, "InfiniBand here, Ethernet (RoCE) on h")
        );
        assert!(!c.iter().any(|c| c.name == "pair subnet" || c.name == "pair mtu"));
    }

    #[test]
    fn netdev_mtu_alone_differing_is_a_warning() {
        let a = side(4096, 9000, 2, "::ffff:10.0.0.1", 1, json!({}));
        let b = side(4096, 9216, 2, "::ffff:10.0.0.2", 1, json!({}));
        assert_eq!(status_of(&compare(&a, &b), "pair mtu"), Status::Warn);
    }

    #[test]
    fn a_side_without_device_fails() {
        let a = side(4096, 9000, 2, "::ffff:10.0.0.1", 1, json!({}));
        let mut b = a.clone();
        b["device"] = Value::Null;
        assert_eq!(status_of(&compare(&a, &b), "pair devices"), Status::Fail);
    }

    #[test]
    fn handles_round_trip_through_hex() {
        let mut h = [0u8; 128];
        h[0] = 0xab;
        h[127] = 0x01;
        assert_eq!(unhex(&hex(&h)), Some(h));
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex(&"zz".repeat(128)), None);
    }
}
