//! The process-wide device instances: created (socket bound following the
//! address rules, engine thread started) on first use, never destroyed.

use std::sync::{Arc, Mutex, Once, OnceLock};

use super::addr::{bind_for, guid_for, ifindex_of, link_mtu_of, mtu_enum_for_link};
use super::device::Device;
use super::engine;
use super::faults;
use crate::config::{self, BadValue};

static INSTANCES: Mutex<Vec<Option<Arc<Device>>>> = Mutex::new(Vec::new());

/// Whether every softroce variable parses ([`config::error`]) and `SOFTROCE_FAULTS` names only
/// known commands ([`faults::configured_schedule`]): else the first that does not, its line
/// ([`BadValue::line`]) printed on stderr once per process. Every device path calls this first.
pub fn check_config() -> Result<(), &'static BadValue> {
    static BAD: OnceLock<Option<BadValue>> = OnceLock::new();
    static SAID: Once = Once::new();
    let bad = BAD.get_or_init(|| config::error().cloned().or_else(|| faults::configured_schedule().err()));
    match bad {
        None => Ok(()),
        Some(bad) => {
            SAID.call_once(|| eprintln!("{}", bad.line()));
            Err(bad)
        }
    }
}

/// The process-wide instance of device `index`, created on first use.
pub fn instance(index: usize) -> std::io::Result<Arc<Device>> {
    let mut v = INSTANCES.lock().unwrap();
    if v.len() <= index {
        v.resize(index + 1, None);
    }
    if let Some(d) = &v[index] {
        return Ok(d.clone());
    }
    // Never bind or run with settings other than those asked for (see `config`).
    check_config().map_err(|bad| std::io::Error::new(std::io::ErrorKind::InvalidInput, bad.line()))?;
    let link = super::link::link_config(index);
    let (addr, sock) = bind_for(index)?;
    let link_mtu = link_mtu_of(addr);
    let active_mtu = config::mtu_override().unwrap_or_else(|| mtu_enum_for_link(link_mtu));
    let dev = Arc::new(Device::new(
        index,
        sock,
        link_mtu,
        active_mtu,
        ifindex_of(addr),
        guid_for(addr),
        link,
    ));
    engine::start(dev.clone())?;
    super::ctl::start(&dev);
    v[index] = Some(dev.clone());
    Ok(dev)
}
