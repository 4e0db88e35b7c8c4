//! Connection setup under load (docs/setup-stress.md): several processes over softroce, several
//! threads each, every thread listening, connecting and accepting many comms at once with every
//! other process, so the shared side-channel links between each pair of processes are founded by
//! either side and raced (docs/design/links.md), while CPU hogs (busy loops, twice as many as
//! cores) starve every core. Then every comm carries one small checked message. A round fails
//! when any thread of any process fails or the round overruns its bound; the report names the
//! process, the thread, and the WARN lines of that process.
//!
//! Both tests need softroce (`#[ignore]`d; FERROCE_TEST_SOFTROCE=1 after `make build`, see
//! docs/testing.md). `setup_stress_campaign` is a campaign, not a unit test: `make test`'s cargo
//! stage skips it, `ci/setup-stress.sh --rounds N` runs it for N rounds and
//! `ci/tests/85-setup-stress.sh` for a bounded few. Knobs (environment): SETUP_STRESS_ROUNDS (1),
//! SETUP_STRESS_PROCS (3), SETUP_STRESS_THREADS (4), SETUP_STRESS_COMMS (comms per thread and
//! direction with each peer, 3), SETUP_STRESS_ITERS (setups, each closed before the next, 3),
//! SETUP_STRESS_HOGS (2 × cores), SETUP_STRESS_ROUND_SEC (the bound of one round, 90),
//! SETUP_STRESS_CONNECT_TIMEOUT_SEC (FERROCE_CONNECT_TIMEOUT_SEC of the processes, 30).
//! Addresses: 127.0.87.(rank + 1) for the ranks, 127.0.87.20 for the give-up case.

mod softroce_common;

use nccl_net_ferroce::api::{self, CommContext, ListenHandle, RecvHandle, SendHandle};
use softroce_common::{child, child_command, reg, require_softroce, run_child};
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A thread's own jitter (xorshift64, seeded from the process, rank, thread and iteration):
/// where it sleeps and in which order it drives its connects and accepts, so each round
/// interleaves differently.
struct Jitter(u64);

impl Jitter {
    fn new(me: usize, t: usize, iter: usize) -> Jitter {
        let seed = u64::from(std::process::id()) << 32 ^ ((me as u64) << 16 | (t as u64) << 8 | iter as u64);
        Jitter(seed | 1)
    }

    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below.max(1)
    }

    /// Now and then a sleep of up to 2 ms (a thread preempted at that point).
    fn pause(&mut self) {
        if self.next(8) == 0 {
            std::thread::sleep(Duration::from_micros(self.next(2000)));
        }
    }
}

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Busy-loop processes, killed (by their ids) when dropped.
struct Hogs(Vec<Child>);

impl Hogs {
    fn start(n: usize) -> Hogs {
        Hogs(
            (0..n)
                .map(|_| {
                    // Spins in bursts and ends once the campaign's process is gone (even
                    // one killed before it could kill its hogs).
                    Command::new("sh")
                        .args([
                            "-c",
                            "p=$PPID; while kill -0 $p 2>/dev/null; do i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; done",
                        ])
                        .stdin(Stdio::null())
                        .spawn()
                        .expect("start a CPU hog")
                })
                .collect(),
        )
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The rank processes of one round, killed when dropped unfinished.
struct Ranks(Vec<(usize, Child, PathBuf)>);

impl Drop for Ranks {
    fn drop(&mut self) {
        for (_, c, _) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The campaign's addresses (127.0.87.x) for one round: two campaigns at once (85 beside a
/// longer one) would open the same softroce devices and fail each other's ranks with "Address
/// already in use"; a lock file serialises their rounds instead (their hogs still add up).
struct AddressLock {
    _file: File,
}

impl AddressLock {
    fn take() -> AddressLock {
        let f = File::create("/tmp/ferroce-setup-stress-127.0.87.lock").expect("the campaign's lock file");
        // SAFETY: a valid descriptor, owned by `f` for the lock's life.
        if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&f), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            println!("(waiting for another campaign's round to end: they share 127.0.87.x)");
            // SAFETY: as above; blocks until the other campaign's round ends.
            let rc = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&f), libc::LOCK_EX) };
            assert_eq!(rc, 0, "flock the campaign's lock file");
        }
        AddressLock { _file: f }
    }
}

/// The plugin's WARN lines (outside NCCL it prints them, and only them, to stderr).
fn is_warn(line: &str) -> bool {
    line.contains("NET/ferroce")
}

/// One round: `procs` rank processes in `dir`; the failures it saw (empty: the round passed)
/// and the WARN lines of the ranks that passed (a race the plugin recovered from).
fn round(dir: &Path, procs: usize, bound: Duration, connect_timeout: usize) -> (Vec<String>, Vec<String>) {
    let _addresses = AddressLock::take();
    fs::create_dir_all(dir).expect("round directory");
    let mut ranks = Ranks(Vec::new());
    for rank in 0..procs {
        let log = dir.join(format!("rank{rank}.log"));
        let out = File::create(&log).expect("rank log");
        let err = out.try_clone().expect("rank log");
        let child = child_command(
            CAMPAIGN,
            &format!("127.0.87.{}", rank + 1),
            &dir.join(format!("ctl{rank}")),
        )
        .env("SETUP_STRESS_RANK", rank.to_string())
        .env("SETUP_STRESS_PROCS", procs.to_string())
        .env("SETUP_STRESS_DIR", dir)
        .env("NCCL_IB_TIMEOUT", "14")
        .env("FERROCE_CONNECT_TIMEOUT_SEC", connect_timeout.to_string())
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("start a rank");
        ranks.0.push((rank, child, log));
    }
    let end = Instant::now() + bound;
    let mut failures = Vec::new();
    let mut warnings = Vec::new();
    for (rank, child, log) in &mut ranks.0 {
        let status = loop {
            match child.try_wait().expect("wait for a rank") {
                Some(s) => break Some(s),
                None if Instant::now() > end => break None,
                None => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        let text = fs::read_to_string(&*log).unwrap_or_default();
        let done = text.contains(&format!("{CAMPAIGN}: done"));
        if status.is_some_and(|s| s.success()) && done {
            warnings.extend(
                text.lines()
                    .filter(|l| is_warn(l))
                    .map(|l| format!("process {rank}: {l}")),
            );
            continue;
        }
        let why = match status {
            None => format!("still running after {bound:?} (killed)"),
            Some(s) => format!("exited with {s}"),
        };
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("FAIL ") || l.contains("stopped rank") || is_warn(l) || l.contains("panicked"))
            .take(40)
            .collect();
        failures.push(format!("process {rank}: {why}\n    {}", lines.join("\n    ")));
    }
    (failures, warnings)
}

/// The campaign's test name: its rank processes are this test again ([`child`]).
const CAMPAIGN: &str = "setup_stress_campaign";

/// The campaign: SETUP_STRESS_ROUNDS rounds under CPU hogs; prints
/// "setup stress: F failed rounds of R" and fails if any round failed. In a rank process
/// (started by the campaign) it is that rank instead.
#[test]
#[ignore = "needs softroce: a campaign with CPU hogs, run by ci/setup-stress.sh and ci/tests/85-setup-stress.sh (FERROCE_TEST_SOFTROCE=1 after make build; make test's cargo stage skips it)"]
fn setup_stress_campaign() {
    if child(CAMPAIGN, setup_stress_rank) {
        return;
    }
    require_softroce();
    let rounds = knob("SETUP_STRESS_ROUNDS", 1);
    let procs = knob("SETUP_STRESS_PROCS", 3).clamp(2, 8);
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let hogs = knob("SETUP_STRESS_HOGS", 2 * cores);
    let bound = Duration::from_secs(knob("SETUP_STRESS_ROUND_SEC", 90) as u64);
    let connect_timeout = knob("SETUP_STRESS_CONNECT_TIMEOUT_SEC", 30);
    let base = std::env::temp_dir().join(format!("ferroce-setup-stress-{}", std::process::id()));
    let _hogs = Hogs::start(hogs);
    let mut failed = 0;
    let started = Instant::now();
    for r in 0..rounds {
        let dir = base.join(format!("round{r}"));
        let t = Instant::now();
        let (failures, warnings) = round(&dir, procs, bound, connect_timeout);
        if failures.is_empty() {
            println!("round {r}: ok ({:.1}s)", t.elapsed().as_secs_f64());
            for w in &warnings {
                println!("  but {w}");
            }
            if r == 0 {
                for rank in 0..procs {
                    let log = fs::read_to_string(dir.join(format!("rank{rank}.log"))).unwrap_or_default();
                    log.lines()
                        .filter(|l| l.contains("comms, one message each"))
                        .for_each(|l| println!("  {l}"));
                }
            }
            let _ = fs::remove_dir_all(&dir);
        } else {
            failed += 1;
            println!("round {r}: FAILED (logs in {})", dir.display());
            for f in &failures {
                println!("  {f}");
            }
        }
    }
    println!(
        "setup stress: {failed} failed rounds of {rounds} ({procs} processes, {} threads, {} comms per thread and direction, {hogs} hogs on {cores} cores, {:.0}s)",
        knob("SETUP_STRESS_THREADS", 4),
        knob("SETUP_STRESS_COMMS", 3),
        started.elapsed().as_secs_f64()
    );
    if failed == 0 {
        let _ = fs::remove_dir_all(&base);
    }
    assert_eq!(failed, 0, "connection setup failed under load (see above)");
}

/// Where the handle of one listen comm of iteration `iter` goes: the listener's rank `from`,
/// for rank `to`'s thread `t`, its `k`th.
fn handle_path(dir: &Path, iter: usize, from: usize, to: usize, t: usize, k: usize) -> PathBuf {
    dir.join(format!("h-{iter}-{from}-{to}-{t}-{k}"))
}

/// The byte a message from rank `from` to rank `to` (thread `t`, comm `k`) is filled with.
fn fill(from: usize, to: usize, t: usize, k: usize) -> u8 {
    (1 + from * 64 + to * 16 + t * 4 + k) as u8
}

/// A connect in progress: the handle once its file appeared.
struct Connect {
    to: usize,
    k: usize,
    handle: Option<[u8; 128]>,
    comm: Option<Box<SendHandle>>,
}

struct Accept {
    from: usize,
    k: usize,
    listen: Option<Box<ListenHandle>>,
    comm: Option<Box<RecvHandle>>,
}

/// Set in every rank once any thread of any rank of the round failed (it writes the file
/// `failed` in the round's directory, which each rank watches): the others stop at their next
/// check instead of waiting out the bound, so a round ends soon after its first failure, and
/// that failure's FAIL line is the one that names the cause.
static STOP: AtomicBool = AtomicBool::new(false);

/// What a thread that stopped because another failed says (not a FAIL line of its own).
const STOPPED: &str = "stopped: another thread failed";

/// `Err` when the round is stopping, or (`late()` says what was pending) past `end`.
fn check(end: Instant, late: impl FnOnce() -> String) -> Result<(), String> {
    if STOP.load(Ordering::Relaxed) {
        return Err(STOPPED.into());
    }
    if Instant::now() > end {
        return Err(late());
    }
    Ok(())
}

/// One thread of a rank, `iters` times: listen for every peer (`comms` each), connect to every
/// peer's handles for this thread, accept, all interleaved and non-blocking as NCCL's proxy
/// thread does; then one checked message on every comm, and every comm closed once all threads
/// of all ranks are done with this iteration's traffic (so the next iteration's connects race
/// with the links the closes retire). `Err` says what failed.
fn rank_thread(
    ctx: &CommContext,
    dir: &Path,
    me: usize,
    procs: usize,
    t: usize,
    bound: Duration,
) -> Result<(), String> {
    let end = Instant::now() + bound;
    for iter in 0..knob("SETUP_STRESS_ITERS", 3) {
        let (connects, accepts) =
            setup(ctx, dir, me, procs, t, iter, end).map_err(|e| format!("iteration {iter}: {e}"))?;
        traffic(me, t, &connects, &accepts, end).map_err(|e| format!("iteration {iter}: {e}"))?;
        // A send may complete after its receiver's message arrived: close only once every
        // thread of every rank is done with its traffic.
        let done = dir.join(format!("done-{iter}-{me}-{t}"));
        fs::write(&done, b"").map_err(|e| format!("write {}: {e}", done.display()))?;
        let all = procs * knob("SETUP_STRESS_THREADS", 4);
        let prefix = format!("done-{iter}-");
        while fs::read_dir(dir).map_or(0, |d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                .count()
        }) < all
        {
            check(end, || {
                format!("iteration {iter}: the other ranks did not finish their traffic in time")
            })?;
            std::thread::sleep(Duration::from_millis(5));
        }
        // Close in a thread-chosen order after a thread-chosen pause: the retiring links race
        // with the next iteration's connects of the other threads.
        let mut j = Jitter::new(me, t, iter + 1000);
        std::thread::sleep(Duration::from_micros(j.next(3000)));
        if j.next(2) == 0 {
            drop(connects);
            j.pause();
            drop(accepts);
        } else {
            drop(accepts);
            j.pause();
            drop(connects);
        }
    }
    Ok(())
}

/// Listen, connect and accept this thread's comms of iteration `iter` with every peer.
fn setup(
    ctx: &CommContext,
    dir: &Path,
    me: usize,
    procs: usize,
    t: usize,
    iter: usize,
    end: Instant,
) -> Result<(Vec<Connect>, Vec<Accept>), String> {
    let comms = knob("SETUP_STRESS_COMMS", 3);
    let peers: Vec<usize> = (0..procs).filter(|&p| p != me).collect();
    let mut accepts = setup_listens(ctx, dir, me, procs, t, iter)?;
    let mut connects: Vec<Connect> = peers
        .iter()
        .flat_map(|&to| {
            (0..comms).map(move |k| Connect {
                to,
                k,
                handle: None,
                comm: None,
            })
        })
        .collect();
    let mut j = Jitter::new(me, t, iter);
    loop {
        let mut pending = 0;
        let accepts_first = j.next(2) == 0;
        if accepts_first {
            pending += accept_round(&mut accepts, &mut j)?;
        }
        for c in &mut connects {
            if c.comm.is_some() {
                continue;
            }
            pending += 1;
            if c.handle.is_none() {
                c.handle = fs::read(handle_path(dir, iter, c.to, me, t, c.k))
                    .ok()
                    .and_then(|b| <[u8; 128]>::try_from(b.as_slice()).ok());
            }
            if let Some(h) = &mut c.handle {
                c.comm = api::connect(ctx, 0, h).map_err(|e| format!("connect to rank {} #{}: {e}", c.to, c.k))?;
            }
            j.pause();
        }
        if !accepts_first {
            pending += accept_round(&mut accepts, &mut j)?;
        }
        if pending == 0 {
            return Ok((connects, accepts));
        }
        check(end, || {
            format!(
                "setup not done in time: {} connects and {} accepts pending",
                connects.iter().filter(|c| c.comm.is_none()).count(),
                accepts.iter().filter(|a| a.comm.is_none()).count()
            )
        })?;
        std::thread::yield_now();
    }
}

/// One accept call on every listen comm still waiting; how many were waiting.
fn accept_round(accepts: &mut [Accept], j: &mut Jitter) -> Result<usize, String> {
    let mut pending = 0;
    for a in accepts {
        let Some(l) = &mut a.listen else { continue };
        pending += 1;
        a.comm = api::accept(l).map_err(|e| format!("accept from rank {} #{}: {e}", a.from, a.k))?;
        if a.comm.is_some() {
            // NCCL closes a listen comm once it accepted.
            a.listen = None;
        }
        j.pause();
    }
    Ok(pending)
}

/// Listen for every peer of thread `t` in iteration `iter` and publish the handles.
fn setup_listens(
    ctx: &CommContext,
    dir: &Path,
    me: usize,
    procs: usize,
    t: usize,
    iter: usize,
) -> Result<Vec<Accept>, String> {
    let mut accepts = Vec::new();
    for from in (0..procs).filter(|&p| p != me) {
        for k in 0..knob("SETUP_STRESS_COMMS", 3) {
            let mut handle = [0u8; 128];
            let l = api::listen(ctx, 0, &mut handle).map_err(|e| format!("listen for rank {from} #{k}: {e}"))?;
            let p = handle_path(dir, iter, me, from, t, k);
            let tmp = p.with_extension("tmp");
            fs::write(&tmp, handle)
                .and_then(|_| fs::rename(&tmp, &p))
                .map_err(|e| format!("write {}: {e}", p.display()))?;
            accepts.push(Accept {
                from,
                k,
                listen: Some(l),
                comm: None,
            });
        }
    }
    Ok(accepts)
}

/// One 64-byte message on every comm, sends and receives driven together; the bytes checked.
fn traffic(me: usize, t: usize, connects: &[Connect], accepts: &[Accept], end: Instant) -> Result<(), String> {
    const SIZE: usize = 64;
    let sends: Vec<(&SendHandle, Vec<u8>, String)> = connects
        .iter()
        .filter_map(|c| {
            Some((
                c.comm.as_deref()?,
                vec![fill(me, c.to, t, c.k); SIZE],
                format!("send to rank {} #{}", c.to, c.k),
            ))
        })
        .collect();
    let mut recvs: Vec<(&RecvHandle, Vec<u8>, u8, String)> = accepts
        .iter()
        .filter_map(|a| {
            Some((
                a.comm.as_deref()?,
                vec![0u8; SIZE],
                fill(a.from, me, t, a.k),
                format!("receive from rank {} #{}", a.from, a.k),
            ))
        })
        .collect();
    let smh: Vec<_> = sends.iter().map(|(s, b, _)| reg(*s, b)).collect();
    let rmh: Vec<_> = recvs.iter().map(|(r, b, _, _)| reg(*r, b)).collect();
    let result = (|| {
        let mut rq = Vec::new();
        for ((r, b, _, what), mh) in recvs.iter_mut().zip(&rmh) {
            // SAFETY: live comm; the buffer is registered and outlives the request (freed after
            // the loop below finished or the round failed and the process exits).
            let q = unsafe { api::irecv(r, &[b.as_mut_ptr() as usize], &[SIZE], &[7], &[mh], false) }
                .map_err(|e| format!("{what}: irecv: {e}"))?
                .ok_or_else(|| format!("{what}: irecv: no slot"))?;
            rq.push(Some(q));
        }
        let mut sq: Vec<Option<*mut api::Request>> = vec![None; sends.len()];
        let mut sent = vec![false; sends.len()];
        let mut got = vec![false; recvs.len()];
        while sent.iter().chain(&got).any(|d| !d) {
            for (i, ((s, b, what), mh)) in sends.iter().zip(&smh).enumerate() {
                if sent[i] {
                    continue;
                }
                if sq[i].is_none() {
                    // SAFETY: as above.
                    sq[i] = unsafe { api::isend(s, b.as_ptr() as usize, SIZE, 7, mh) }
                        .map_err(|e| format!("{what}: isend: {e}"))?;
                }
                if let Some(q) = sq[i] {
                    let mut n = [0i32];
                    // SAFETY: q is in flight until test says done.
                    if unsafe { api::test(q, n.as_mut_ptr()) }.map_err(|e| format!("{what}: test: {e}"))? {
                        sent[i] = true;
                    }
                }
            }
            for (i, q) in rq.iter_mut().enumerate() {
                let Some(req) = *q else { continue };
                let mut n = [0i32];
                // SAFETY: as above.
                if unsafe { api::test(req, n.as_mut_ptr()) }.map_err(|e| format!("{}: test: {e}", recvs[i].3))? {
                    *q = None;
                    got[i] = true;
                    if n[0] as usize != SIZE {
                        return Err(format!("{}: {} bytes reported of {SIZE}", recvs[i].3, n[0]));
                    }
                }
            }
            check(end, || {
                format!(
                    "traffic not done in time: {} sends and {} receives pending",
                    sent.iter().filter(|d| !**d).count(),
                    got.iter().filter(|d| !**d).count()
                )
            })?;
            std::thread::yield_now();
        }
        for (_, b, want, what) in &recvs {
            if b.iter().any(|x| x != want) {
                return Err(format!("{what}: the bytes differ"));
            }
        }
        Ok(())
    })();
    if result.is_ok() {
        for mh in smh.into_iter().chain(rmh) {
            api::dereg_mr(mh).map_err(|e| format!("deregMr: {e}"))?;
        }
    }
    result
}

/// One rank process of the campaign (SETUP_STRESS_RANK of SETUP_STRESS_PROCS).
fn setup_stress_rank() {
    let me = knob("SETUP_STRESS_RANK", 0);
    let procs = knob("SETUP_STRESS_PROCS", 3);
    let threads = knob("SETUP_STRESS_THREADS", 4);
    let comms = knob("SETUP_STRESS_COMMS", 3);
    // Within the campaign's bound of the round, so that a rank that cannot finish says what
    // it waits for before the campaign kills it.
    let round = Duration::from_secs(knob("SETUP_STRESS_ROUND_SEC", 90) as u64);
    let bound = round.saturating_sub(Duration::from_secs(5)).max(round / 2);
    let dir = PathBuf::from(std::env::var("SETUP_STRESS_DIR").expect("SETUP_STRESS_DIR"));
    let failed_flag = dir.join("failed");
    let ctx = match api::init(None, -1, false) {
        Ok(ctx) => ctx,
        Err(e) => {
            // The other ranks wait for this one: stop them now.
            println!("FAIL rank {me}: init: {}", e.message);
            let _ = fs::write(&failed_flag, b"");
            panic!("init failed");
        }
    };
    if std::env::var("SETUP_STRESS_QUIT_RANK").ok() == Some(me.to_string()) {
        // The campaign's own check: a rank that goes away after publishing its handles must
        // fail the others' setup, each failure named by process and thread.
        for t in 0..threads {
            setup_listens(&ctx, &dir, me, procs, t, 0).expect("listen");
        }
        println!("{CAMPAIGN}: rank {me} quits after listening, as asked");
        std::process::exit(0);
    }
    let running = AtomicUsize::new(threads);
    let failures = std::thread::scope(|s| {
        // The round's failure flag, watched for the threads (a file check per loop turn would
        // cost more than the setups).
        s.spawn(|| {
            while running.load(Ordering::Relaxed) > 0 {
                if failed_flag.exists() {
                    STOP.store(true, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (ctx, dir, running, failed_flag) = (&ctx, &dir, &running, &failed_flag);
                s.spawn(move || {
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        rank_thread(ctx, dir, me, procs, t, bound)
                    }))
                    .unwrap_or_else(|_| Err("panicked".into()));
                    // Said at once (stdout is line-buffered): a rank the campaign has to kill
                    // has still named its failures.
                    match &r {
                        Ok(()) => {}
                        Err(e) if e.ends_with(STOPPED) => {
                            println!("stopped rank {me} thread {t}: another thread failed")
                        }
                        Err(e) => {
                            println!("FAIL rank {me} thread {t}: {e}");
                            STOP.store(true, Ordering::Relaxed);
                            let _ = fs::write(failed_flag, b"");
                        }
                    }
                    running.fetch_sub(1, Ordering::Relaxed);
                    r.is_err()
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join())
            .filter(|r| !matches!(r, Ok(false)))
            .count()
    });
    assert_eq!(failures, 0, "threads failed or stopped (see above)");
    api::finalize(ctx).expect("finalize");
    let n = threads * (procs - 1) * comms;
    let iters = knob("SETUP_STRESS_ITERS", 3);
    println!("{CAMPAIGN}: rank {me}: {iters} times {n} send comms and {n} recv comms, one message each");
}

/// The failure docs/setup-stress.md starts from, made on purpose in one process: the listener
/// answers a request whose connector has already given up (here: it timed out waiting, its
/// listener's accept not called in time). The connector says why before it closes, and the
/// listener's WARN and its accept's error name that reason instead of "connection closed by the
/// peer" and a wait for its whole timeout.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn a_connector_that_gives_up_tells_the_listener_why() {
    const NAME: &str = "a_connector_that_gives_up_tells_the_listener_why";
    if child(NAME, give_up) {
        return;
    }
    let out = run_child(NAME, "127.0.87.20", &[("FERROCE_CONNECT_TIMEOUT_SEC", "1")]);
    assert!(
        out.contains("gave up the handshake after our answer") && out.contains("did not finish within 1s"),
        "the listener's WARN does not carry the connector's reason:\n{out}"
    );
    assert!(!out.contains("connection closed by the peer"), "{out}");
}

/// The child of [`a_connector_that_gives_up_tells_the_listener_why`].
fn give_up() {
    let ctx = api::init(None, -1, false).expect("init");
    let mut handle = [0u8; 128];
    let mut l = api::listen(&ctx, 0, &mut handle).expect("listen");
    // Dial and send the request (a few calls: the TCP connect completes in one of them).
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(200) {
        assert!(api::connect(&ctx, 0, &mut handle).expect("connect").is_none());
        std::thread::sleep(Duration::from_millis(10));
    }
    // No answer within the 1 s setup timeout: the connect fails.
    std::thread::sleep(Duration::from_millis(1100));
    let e = match api::connect(&ctx, 0, &mut handle) {
        Err(e) => e,
        Ok(_) => panic!("the connect outlived its timeout"),
    };
    assert!(e.message.contains("did not finish within 1s"), "{}", e.message);
    // Now the listener takes the request, answers, reads why the connector went away, and
    // fails at once with that reason (not after its own timeout).
    let start = Instant::now();
    let e = loop {
        match api::accept(&mut l) {
            Ok(None) => {}
            Ok(Some(_)) => panic!("accepted a connection whose connector gave up"),
            Err(e) => break e,
        }
        assert!(start.elapsed() < Duration::from_secs(5), "the accept did not fail");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(
        e.message.contains("gave up after this listener answered"),
        "{}",
        e.message
    );
    assert!(e.message.contains("did not finish within 1s"), "{}", e.message);
    drop(l);
    api::finalize(ctx).expect("finalize");
}
