//! Fault control of a running device: it listens on the unix socket
//! `${SOFTROCE_CTL_DIR:-/tmp/softroce}/ADDR.sock` (ADDR = its IPv4 address; a stale file from a
//! dead process is replaced, the file is removed at exit), where `softroce-ctl ADDR COMMAND`
//! sends one command line and reads the answer (`ok: ...` or `error: ...`). `SOFTROCE_FAULTS`
//! schedules the same commands for every device of the process, at times counted from the
//! device's start. Both run on a thread of their own, never on the data path.

use super::device::Device;
use super::faults::{parse_schedule, Command};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Directory of the control sockets.
pub fn ctl_dir() -> PathBuf {
    std::env::var_os("SOFTROCE_CTL_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/softroce"))
}

/// The control socket of the device bound to `addr`.
pub fn socket_path(addr: std::net::Ipv4Addr) -> PathBuf {
    ctl_dir().join(format!("{addr}.sock"))
}

/// Socket files to remove at exit.
static SOCKETS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

extern "C" fn remove_sockets() {
    if let Ok(v) = SOCKETS.lock() {
        for p in v.iter() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Start the control socket and the `SOFTROCE_FAULTS` schedule of `dev`. A device whose socket
/// cannot be made still works; it says so once on stderr.
pub fn start(dev: &Arc<Device>) {
    if let Some(spec) = std::env::var("SOFTROCE_FAULTS").ok().filter(|s| !s.trim().is_empty()) {
        match parse_schedule(&spec) {
            Ok(plan) => spawn_schedule(dev.clone(), plan),
            Err(e) => eprintln!("softroce: SOFTROCE_FAULTS ignored: {e}"),
        }
    }
    let path = socket_path(dev.addr);
    match bind(&path) {
        Ok(listener) => {
            let first = SOCKETS.lock().is_ok_and(|mut v| {
                v.push(path.clone());
                v.len() == 1
            });
            if first {
                // SAFETY: a C-ABI function without arguments that lives as long as the process
                // (the library is linked -z nodelete).
                unsafe { libc::atexit(remove_sockets) };
            }
            let dev = dev.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("{}-ctl", dev.name))
                .spawn(move || serve(&dev, listener));
            if let Err(e) = spawned {
                eprintln!("softroce: no fault-control thread for {}: {e}", path.display());
            }
        }
        Err(e) => eprintln!("softroce: no fault-control socket {}: {e}", path.display()),
    }
}

/// Bind `path`, replacing a stale file (one nobody answers on).
fn bind(path: &PathBuf) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match UnixListener::bind(path) {
        Ok(l) => Ok(l),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            if UnixStream::connect(path).is_ok() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    "another live process has a device on this address",
                ));
            }
            std::fs::remove_file(path)?;
            UnixListener::bind(path)
        }
        Err(e) => Err(e),
    }
}

fn serve(dev: &Device, listener: UnixListener) {
    for conn in listener.incoming() {
        let Ok(stream) = conn else { continue };
        let _ = answer(dev, stream);
    }
}

/// One request: a command line in, `ok: ...` / `error: ...` out.
fn answer(dev: &Device, stream: UnixStream) -> std::io::Result<()> {
    stream.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line)?;
    if line.trim() == "counters" {
        let qps = dev.engine.all_qps();
        let counts = super::counters::report(qps.iter().map(|q| (q.qpn, &q.counters)));
        return (&stream).write_all(format!("ok: {counts}\n").as_bytes());
    }
    let reply = match Command::parse(&line) {
        Ok(cmd) => format!("ok: {}\n", dev.apply(cmd)),
        Err(e) => format!("error: {e}\n"),
    };
    (&stream).write_all(reply.as_bytes())
}

fn spawn_schedule(dev: Arc<Device>, plan: Vec<(std::time::Duration, Command)>) {
    let t0 = Instant::now();
    let spawned = std::thread::Builder::new()
        .name(format!("{}-faults", dev.name))
        .spawn(move || {
            for (at, cmd) in plan {
                if let Some(wait) = at.checked_sub(t0.elapsed()) {
                    std::thread::sleep(wait);
                }
                let said = dev.apply(cmd);
                if crate::config::debug() {
                    eprintln!(
                        "softroce: SOFTROCE_FAULTS at {:.3} s: {said}",
                        t0.elapsed().as_secs_f64()
                    );
                }
            }
        });
    if let Err(e) = spawned {
        eprintln!("softroce: SOFTROCE_FAULTS not run: {e}");
    }
}
