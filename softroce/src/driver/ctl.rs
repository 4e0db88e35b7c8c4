//! Fault control of a running device: it listens on the unix socket
//! `${SOFTROCE_CTL_DIR:-/tmp/softroce}/ADDR.sock` (ADDR = its IPv4 address; a stale file from a
//! dead process is replaced, the file is removed at exit), where `softroce-ctl ADDR COMMAND`
//! sends one command line and reads the answer (`ok: ...` or `error: ...`). `SOFTROCE_FAULTS`
//! schedules the same commands for every device of the process, at times counted from the
//! device's start. Both run on a thread of their own, never on the data path.

use super::device::Device;
use super::engine;
use super::faults::Command;
use super::qp::QpShared;
use crate::proto::AsyncEvent;
use rdma_sys::ibv_event_type;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Directory of the control sockets (`SOFTROCE_CTL_DIR`).
pub fn ctl_dir() -> PathBuf {
    crate::config::ctl_dir()
}

/// The control socket of the device bound to `addr`.
pub fn socket_path(addr: std::net::Ipv4Addr) -> PathBuf {
    ctl_dir().join(format!("{addr}.sock"))
}

/// Socket files to remove at exit.
static SOCKETS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Held while a command is carried out and answered. A fault such as `qp-fatal` can make the
/// application exit at once (its completion fails); exit then waits here, so `softroce-ctl`
/// still reads the answer instead of a closed socket.
static ANSWERING: Mutex<()> = Mutex::new(());

/// The atexit hook: a panic must not unwind into libc's exit.
extern "C" fn remove_sockets() {
    let _ = std::panic::catch_unwind(|| {
        // Bounded: an answer is one short write; a stuck reader must not hold up the exit.
        let deadline = Instant::now() + std::time::Duration::from_secs(2);
        while matches!(ANSWERING.try_lock(), Err(std::sync::TryLockError::WouldBlock)) && Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        if let Ok(v) = SOCKETS.lock() {
            for p in v.iter() {
                let _ = std::fs::remove_file(p);
            }
        }
    });
}

/// Start the control socket and the `SOFTROCE_FAULTS` schedule of `dev`. A device whose socket
/// cannot be made still works; it says so once on stderr.
pub fn start(dev: &Arc<Device>) {
    // Checked before any device was made (instances::check_config): an error is not possible.
    if let Ok(plan) = super::faults::configured_schedule() {
        if !plan.is_empty() {
            spawn_schedule(dev.clone(), plan);
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
    let _answering = ANSWERING.lock();
    let reply = match Command::parse(&line) {
        Ok(cmd) => match apply(dev, cmd) {
            Ok(said) => format!("ok: {said}\n"),
            Err(e) => format!("error: {e}\n"),
        },
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
                let at = t0.elapsed().as_secs_f64();
                match apply(&dev, cmd) {
                    Ok(said) if crate::config::debug() => eprintln!("softroce: SOFTROCE_FAULTS at {at:.3} s: {said}"),
                    Ok(_) => {}
                    Err(e) => eprintln!("softroce: SOFTROCE_FAULTS at {at:.3} s: {e}"),
                }
            }
        });
    if let Err(e) = spawned {
        eprintln!("softroce: SOFTROCE_FAULTS not run: {e}");
    }
}

/// `device-fatal`: the event first (as the kernel raises it before the provider flushes),
/// then every QP to ERR; the dead flag makes every later post fail and every packet vanish.
fn die(dev: &Device) -> String {
    if dev.sock.faults.kill() {
        dev.device_event(ibv_event_type::IBV_EVENT_DEVICE_FATAL, 0);
        for qp in dev.engine.all_qps() {
            engine::fail_qp(dev, &qp, None);
        }
    }
    format!(
        "{} DEAD (device fatal): every QP flushed, posts fail with EIO",
        dev.name
    )
}

/// `qp-fatal`, `qp-access-err`, `cq-overrun`: the QP `qpn` of this device, or why not.
fn qp_fault(dev: &Device, qpn: u32, what: &str, act: impl FnOnce(&QpShared) -> String) -> Result<String, String> {
    match dev.engine.qp(qpn) {
        Some(qp) => Ok(act(&qp)),
        None => Err(format!("{}: no QP {qpn:#x} on this device, no {what}", dev.name)),
    }
}

/// Carry out a fault command (`softroce-ctl`, `SOFTROCE_FAULTS`) on `dev`; the answer in
/// words, or why it could not be carried out.
pub fn apply(dev: &Device, cmd: Command) -> Result<String, String> {
    let f = &dev.sock.faults;
    let said = match cmd {
        Command::PortDown => {
            if f.set_down(true) {
                dev.device_event(ibv_event_type::IBV_EVENT_PORT_ERR, 1);
            }
            format!("{} port 1 DOWN", dev.name)
        }
        Command::PortUp => {
            if f.set_down(false) {
                dev.device_event(ibv_event_type::IBV_EVENT_PORT_ACTIVE, 1);
            }
            format!("{} port 1 ACTIVE", dev.name)
        }
        Command::GidChange => {
            f.change_gids();
            dev.device_event(ibv_event_type::IBV_EVENT_GID_CHANGE, 1);
            format!(
                "{} GID table changed: IPv4 GIDs {}",
                dev.name,
                match f.ipv4_gid_slot() {
                    Some(i) => format!("restored at {i} and {}", i + 1),
                    None => "removed".to_string(),
                }
            )
        }
        Command::Blackhole(peer) => {
            f.blackhole(peer);
            format!("{}: packets to and from {peer} are dropped", dev.name)
        }
        Command::Heal => {
            f.heal();
            format!("{}: every blackhole healed", dev.name)
        }
        Command::Status => format!("{} ({}): {}; {}", dev.name, dev.addr, f.describe(), dev.describe_link()),
        Command::DeviceFatal => die(dev),
        Command::QpFatal(qpn) => {
            return qp_fault(dev, qpn, "QP fatal", |qp| {
                engine::fail_qp(dev, qp, Some(AsyncEvent::QpFatal));
                format!("{} QP {qpn:#x} in ERR (QP fatal)", dev.name)
            })
        }
        Command::QpAccessErr(qpn) => {
            return qp_fault(dev, qpn, "access error", |qp| {
                engine::fail_qp(dev, qp, Some(AsyncEvent::QpAccessError));
                format!("{} QP {qpn:#x} in ERR (access error)", dev.name)
            })
        }
        Command::CqOverrun(qpn) => {
            return qp_fault(dev, qpn, "CQ overrun", |qp| {
                // The send and receive CQ may be one: it overruns once.
                let send = qp.send_cq.overrun();
                let recv = !Arc::ptr_eq(&qp.send_cq, &qp.recv_cq) && qp.recv_cq.overrun();
                format!(
                    "{} CQs of QP {qpn:#x} overran: {} CQ_ERR event(s) raised",
                    dev.name,
                    u32::from(send) + u32::from(recv)
                )
            });
        }
    };
    Ok(said)
}
