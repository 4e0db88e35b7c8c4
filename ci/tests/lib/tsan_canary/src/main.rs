//! Two threads write one heap word with nothing ordering the writes: the data race
//! ThreadSanitizer must report (see Cargo.toml).

fn main() {
    let word = Box::into_raw(Box::new(0u64)) as usize;
    let writer = std::thread::spawn(move || {
        // SAFETY: none; this write races with main's below on purpose (the canary).
        unsafe { std::ptr::write_volatile(word as *mut u64, 1) };
    });
    // SAFETY: none; the other side of the deliberate race (before the join orders anything).
    unsafe { std::ptr::write_volatile(word as *mut u64, 2) };
    writer.join().expect("writer thread");
    // SAFETY: word came from Box::into_raw above and is freed once, after the join.
    let last = unsafe { Box::from_raw(word as *mut u64) };
    println!("wrote {last} from two threads without a report");
}
