//! `ferroce-doctor`: runs the RDMA checklist on this host the way the ferroce NCCL plugin will
//! use it (its own discovery, configuration and data path), and between two hosts.
//!
//! One line per check (`ok` / `warn` / `fail`, the value seen, the fix), or `--json`. Exit
//! status 0 when nothing fails, 1 otherwise, 2 for a bad command line.

#![deny(clippy::undocumented_unsafe_blocks)]

mod check;
mod env;
mod host;
mod limits;
mod measure;
mod pair;
mod sysinfo;

use check::Printer;
use ferroce::config::Config;
use limits::JobSize;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

/// The environment, by name.
pub type Vars = BTreeMap<String, String>;

const USAGE: &str = "\
usage: ferroce-doctor [--json] [job size] [--serve [--port P] [--serve-addr IP] | --peer HOST:PORT]
                      [--timeout SEC] [--seconds SEC] [--dev N]

  one host: every RDMA device and port, the GID ferroce picks and why, NCCL_IB_* resolution,
  limits against the job size, /dev/infiniband, GPUDirect, PCIe ACS, NUMA, CPU governor,
  libibverbs. Two hosts: `--serve` on one prints the command to run on the other
  (`--peer HOST:PORT`); both compare their findings, then measure 4 MiB bandwidth and 8-byte
  latency through the plugin.

  --json             one JSON array of {name, status, value, hint}
  --conns N          connections (send + receive comms) per process of the job
  --ranks P          ranks of the job (default 2): N = 2 x (P-1) x channels, all-to-all
  --channels C       channels per peer (default 2, NCCL_NCHANNELS_PER_NET_PEER)
  --reg-mib M        host memory registered per connection, MiB (default: NCCL_BUFFSIZE,
                     4 MiB, without GPUDirect; 0 with nvidia_peermem)
  --serve            wait for a peer (bounded by --timeout)
  --port P           TCP port of --serve (default: any free one)
  --serve-addr IP    address of --serve (default: the interface the plugin's side channel
                     picks, NCCL_SOCKET_IFNAME rules)
  --peer HOST:PORT   the address --serve printed
  --timeout SEC      bound on every wait for the peer (default FERROCE_CONNECT_TIMEOUT_SEC, 60)
  --seconds SEC      length of the measurement (default 3)
  --dev N            plugin device to measure on (default 0)
  --version          print the version (`ferroce-doctor X.Y.Z`) and exit
";

#[derive(Debug)]
struct Options {
    json: bool,
    conns: Option<u64>,
    ranks: u64,
    channels: u64,
    reg_mib: Option<u64>,
    serve: bool,
    port: u16,
    serve_addr: Option<IpAddr>,
    peer: Option<String>,
    timeout: Option<u64>,
    seconds: f64,
    dev: i32,
}

fn parse_args(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        json: false,
        conns: None,
        ranks: 2,
        channels: 2,
        reg_mib: None,
        serve: false,
        port: 0,
        serve_addr: None,
        peer: None,
        timeout: None,
        seconds: 3.0,
        dev: 0,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |what: &str| it.next().cloned().ok_or_else(|| format!("{arg} needs {what}"));
        fn number<T: std::str::FromStr>(arg: &str, text: String) -> Result<T, String> {
            text.parse()
                .map_err(|_| format!("{arg}: '{text}' is not a valid number"))
        }
        match arg.as_str() {
            "--json" => o.json = true,
            "--conns" => o.conns = Some(number(arg, value("a count")?)?),
            "--ranks" => o.ranks = number(arg, value("a count")?)?,
            "--channels" => o.channels = number(arg, value("a count")?)?,
            "--reg-mib" => o.reg_mib = Some(number(arg, value("MiB")?)?),
            "--serve" => o.serve = true,
            "--port" => o.port = number(arg, value("a port")?)?,
            "--serve-addr" => o.serve_addr = Some(number(arg, value("an IP address")?)?),
            "--peer" => o.peer = Some(value("HOST:PORT")?),
            "--timeout" => o.timeout = Some(number(arg, value("seconds")?)?),
            "--seconds" => o.seconds = number(arg, value("seconds")?)?,
            "--dev" => o.dev = number(arg, value("a device index")?)?,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument '{other}'")),
        }
    }
    if o.serve && o.peer.is_some() {
        return Err("--serve and --peer exclude each other".into());
    }
    if !(o.seconds > 0.0 && o.seconds <= 600.0) {
        return Err("--seconds must be in (0, 600]".into());
    }
    if o.timeout == Some(0) {
        return Err("--timeout must be at least 1".into());
    }
    Ok(o)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--version" || a == "-V") {
        println!("ferroce-doctor {}", env!("CARGO_PKG_VERSION"));
        return;
    }
    let opts = match parse_args(&args) {
        Ok(o) => o,
        Err(e) if e.is_empty() => {
            print!("{USAGE}");
            return;
        }
        Err(e) => {
            eprintln!("ferroce-doctor: {e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let vars: Vars = std::env::vars().collect();
    let (cfg, _) = Config::from_lookup(&|k| vars.get(k).cloned());
    let gpudirect = sysinfo::nvidia_driver_loaded() && ferroce::device::peer_memory_present();
    let buffsize = vars
        .get("NCCL_BUFFSIZE")
        .and_then(|v| ferroce::config::parse_c_integer(v))
        .and_then(|v| u64::try_from(v).ok())
        .unwrap_or(4 << 20);
    let job = JobSize {
        conns: opts
            .conns
            .unwrap_or_else(|| JobSize::conns_for(opts.ranks, opts.channels)),
        qps_per_connection: u64::from(cfg.qps_per_connection),
        registered_per_connection: opts.reg_mib.map_or(if gpudirect { 0 } else { buffsize }, |m| m << 20),
    };
    let mut printer = Printer::new(opts.json);
    let mut checks = Vec::new();
    let host = host::run(&cfg, &vars, &job, &mut checks);
    printer.print_all(&checks);
    if opts.serve || opts.peer.is_some() {
        let pair_opts = pair::PairOptions {
            timeout: Duration::from_secs(opts.timeout.unwrap_or(cfg.connect_timeout_sec)),
            seconds: opts.seconds,
            dev: opts.dev,
        };
        let mine = pair::findings(&host, &checks, &vars, cfg.qps_per_connection);
        let mut pair_checks = Vec::new();
        if let Some(addr) = &opts.peer {
            pair::peer(addr, &pair_opts, &mine, &mut pair_checks);
        } else {
            match pair::serve_address(opts.serve_addr, opts.port) {
                Ok(bind) => pair::serve(bind, &pair_opts, &mine, &|line| printer.note(line), &mut pair_checks),
                Err(e) => pair_checks.push(check::Check::fail(
                    "pair serve",
                    e,
                    "set NCCL_SOCKET_IFNAME or --serve-addr",
                )),
            }
        }
        printer.print_all(&pair_checks);
    }
    drop(host);
    std::process::exit(printer.finish());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(text: &str) -> Vec<String> {
        text.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn command_lines() {
        let o = parse_args(&args("--json --conns 1024 --peer 127.0.0.1:5000 --timeout 3")).unwrap();
        assert!(o.json && o.conns == Some(1024) && o.peer.as_deref() == Some("127.0.0.1:5000") && o.timeout == Some(3));
        assert!(parse_args(&args("--serve --peer x:1")).is_err());
        assert!(parse_args(&args("--conns lots"))
            .unwrap_err()
            .contains("not a valid number"));
        assert!(parse_args(&args("--port")).unwrap_err().contains("needs"));
        assert!(parse_args(&args("--bogus")).is_err());
        assert_eq!(parse_args(&args("--help")).err(), Some(String::new()));
    }
}
