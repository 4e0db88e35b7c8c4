//! The checks that need no RDMA device: the environment, the limits, `/dev/infiniband`,
//! GPUDirect (nvidia_peermem or DMA-BUF) and the CPU governor.

use super::ports::PortFacts;
use crate::check::Check;
use crate::env::PortName;
use crate::limits::{self, JobSize};
use crate::sysinfo;
use ferroce::config::Config;
use ferroce::error::Limit;

pub(super) fn peermem_check(gpu: bool, peermem: bool, dmabuf_everywhere: bool) -> Check {
    let name = "gpudirect peermem";
    match (gpu, peermem) {
        (_, true) => Check::ok(name, "nvidia_peermem loaded: GPU buffers can be registered"),
        (false, false) => Check::ok(name, "no NVIDIA driver loaded: host memory only"),
        (true, false) if dmabuf_everywhere => Check::ok(name, "nvidia_peermem not loaded; DMA-BUF serves GPU buffers"),
        (true, false) => Check::warn(
            name,
            "NVIDIA driver loaded, nvidia_peermem not, no DMA-BUF: GPU buffers go through host memory",
            "`modprobe nvidia_peermem`",
        ),
    }
}

/// Checks that do not need a device.
pub(super) fn common_checks(
    cfg: &Config,
    vars: &crate::Vars,
    job: &JobSize,
    ports: &[PortFacts],
    checks: &mut Vec<Check>,
) {
    let (_, warnings) = Config::from_lookup(&|k| vars.get(k).cloned());
    let names: Vec<PortName> = ports
        .iter()
        .map(|p| PortName {
            device: p.device.clone(),
            port: u32::from(p.port),
        })
        .collect();
    checks.extend(crate::env::checks(vars, &names, cfg, &warnings));
    checks.push(limits::check_memlock(
        Limit::current(libc::RLIMIT_MEMLOCK),
        limits::has_cap_ipc_lock(),
        job,
    ));
    checks.push(limits::check_nofile(Limit::current(libc::RLIMIT_NOFILE), job));
    checks.push(dev_infiniband_check(!ports.is_empty()));
    checks.push(governor_check(&sysinfo::cpu_governors()));
}

fn dev_infiniband_check(devices_found: bool) -> Check {
    let name = "/dev/infiniband";
    let dir = std::path::Path::new("/dev/infiniband");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return if devices_found {
            Check::ok(name, "absent; this libibverbs needs no kernel device (a userspace NIC)")
        } else {
            Check::fail(
                name,
                "absent: no RDMA character devices",
                "`modprobe ib_uverbs` and the NIC's RDMA driver; containers: `--device /dev/infiniband`",
            )
        };
    };
    let mut names: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let denied: Vec<&String> = names
        .iter()
        .filter(|n| n.starts_with("uverbs") && !sysinfo::accessible(&dir.join(n)))
        .collect();
    if !denied.is_empty() {
        return Check::fail(
            name,
            format!(
                "no read/write access to {}",
                denied.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
            ),
            "a udev rule (MODE=\"0666\") or the owning group; containers: `--device /dev/infiniband`",
        );
    }
    if !names.iter().any(|n| n.starts_with("uverbs")) && !devices_found {
        return Check::fail(
            name,
            format!("no uverbs device ({})", names.join(", ")),
            "`modprobe ib_uverbs`",
        );
    }
    Check::ok(name, format!("{} readable and writable", names.join(", ")))
}

fn governor_check(governors: &[(String, usize)]) -> Check {
    let name = "cpu governor";
    if governors.is_empty() {
        return Check::ok(name, "no cpufreq interface (a VM or a fixed clock)");
    }
    let text = governors
        .iter()
        .map(|(g, n)| format!("{g} on {n} CPU(s)"))
        .collect::<Vec<_>>()
        .join(", ");
    if governors.iter().all(|(g, _)| g == "performance") {
        Check::ok(name, text)
    } else {
        Check::warn(
            name,
            format!("{text}: clock ramps add latency and jitter"),
            "`cpupower frequency-set -g performance`",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::Status;

    #[test]
    fn governors() {
        assert_eq!(governor_check(&[]).status, Status::Ok);
        assert_eq!(governor_check(&[("performance".into(), 8)]).status, Status::Ok);
        let w = governor_check(&[("performance".into(), 4), ("powersave".into(), 4)]);
        assert_eq!(w.status, Status::Warn);
        assert!(w.value.starts_with("performance on 4 CPU(s), powersave on 4 CPU(s)"));
    }

    #[test]
    fn peermem_matters_only_with_a_gpu_and_no_dmabuf() {
        assert_eq!(peermem_check(false, false, false).status, Status::Ok);
        assert_eq!(peermem_check(true, false, true).status, Status::Ok);
        assert_eq!(peermem_check(true, false, false).status, Status::Warn);
        assert_eq!(peermem_check(true, true, false).status, Status::Ok);
    }
}
