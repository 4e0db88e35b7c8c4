// A heap overflow that AddressSanitizer must report: ci/tests/80-sanitizers.sh runs it first,
// so a sanitizer job that silently stopped instrumenting fails instead of passing.
fn main() {
    let v: Vec<u8> = vec![1; 16];
    let p = v.as_ptr();
    let i = std::hint::black_box(16usize);
    // SAFETY: none; this is the deliberate out-of-bounds read the sanitizer must catch.
    let x = unsafe { std::ptr::read_volatile(p.add(i)) };
    println!("read {x} past the end without a report");
}
