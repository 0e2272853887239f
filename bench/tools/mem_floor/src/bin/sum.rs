//! A 16M-element f32 sum (64 MiB, 2 MiB pages) with AVX-512 three ways on one thread and on
//! two (the second spinning): the floor under the sum / max 16M rows (`cargo run --release --bin sum`).
use std::arch::x86_64::*;
use std::sync::atomic::{AtomicUsize, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

#[target_feature(enable = "avx512f")]
unsafe fn sum4(a: *const f32, n: usize) -> f32 {
    let (mut s0, mut s1, mut s2, mut s3) = (_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps());
    let mut i = 0;
    while i < n { s0 = _mm512_add_ps(s0, _mm512_loadu_ps(a.add(i))); s1 = _mm512_add_ps(s1, _mm512_loadu_ps(a.add(i+16))); s2 = _mm512_add_ps(s2, _mm512_loadu_ps(a.add(i+32))); s3 = _mm512_add_ps(s3, _mm512_loadu_ps(a.add(i+48))); i += 64; }
    _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)))
}
#[target_feature(enable = "avx512f")]
unsafe fn sum4pf(a: *const f32, n: usize) -> f32 {
    let (mut s0, mut s1, mut s2, mut s3) = (_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps());
    let mut i = 0;
    while i < n {
        _mm_prefetch::<_MM_HINT_T0>(a.add(i + 2048) as *const i8);
        s0 = _mm512_add_ps(s0, _mm512_loadu_ps(a.add(i))); s1 = _mm512_add_ps(s1, _mm512_loadu_ps(a.add(i+16))); s2 = _mm512_add_ps(s2, _mm512_loadu_ps(a.add(i+32))); s3 = _mm512_add_ps(s3, _mm512_loadu_ps(a.add(i+48))); i += 64; }
    _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)))
}
// Two interleaved streams per thread: halves of the thread's range read side by side.
#[target_feature(enable = "avx512f")]
unsafe fn sum2stream(a: *const f32, n: usize) -> f32 {
    let h = n / 2; let b = a.add(h);
    let (mut s0, mut s1, mut s2, mut s3) = (_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps());
    let mut i = 0;
    while i < h { s0 = _mm512_add_ps(s0, _mm512_loadu_ps(a.add(i))); s1 = _mm512_add_ps(s1, _mm512_loadu_ps(a.add(i+16))); s2 = _mm512_add_ps(s2, _mm512_loadu_ps(b.add(i))); s3 = _mm512_add_ps(s3, _mm512_loadu_ps(b.add(i+16))); i += 32; }
    _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)))
}
type K = unsafe fn(*const f32, usize) -> f32;
struct Sh { gen: AtomicUsize, done: AtomicUsize, k: AtomicUsize, a: usize, n: usize, out: AtomicU64 }
fn main() {
    assert!(is_x86_feature_detected!("avx512f"), "this probe needs AVX-512F");
    let n: usize = 1 << 24;
    let layout = std::alloc::Layout::from_size_align(n * 4, 2 << 20).unwrap();
    // SAFETY: the buffer holds n floats (allocated above, never freed while the program runs), the kernels read only indices below the n they are given, and AVX-512F is asserted at start.
    let a = unsafe { std::alloc::alloc(layout) as *mut f32 };
    // SAFETY: the buffer holds n floats (allocated above, never freed while the program runs), the kernels read only indices below the n they are given, and AVX-512F is asserted at start.
    unsafe { libc_madvise(a as usize, n * 4); }
    // SAFETY: the buffer holds n floats (allocated above, never freed while the program runs), the kernels read only indices below the n they are given, and AVX-512F is asserted at start.
    for i in 0..n { unsafe { *a.add(i) = (i % 7) as f32; } }
    let kernels: [(&str, K); 3] = [("sum4", sum4), ("sum4pf", sum4pf), ("2stream", sum2stream)];
    let sh = Arc::new(Sh { gen: AtomicUsize::new(0), done: AtomicUsize::new(0), k: AtomicUsize::new(0), a: a as usize, n, out: AtomicU64::new(0) });
    let s2 = sh.clone();
    std::thread::spawn(move || { let mut seen = 0; loop {
        let g = s2.gen.load(Ordering::Acquire);
        if g != seen { seen = g; let f = kernels[s2.k.load(Ordering::Relaxed)].1; let h = s2.n / 2;
            // SAFETY: the buffer holds n floats (allocated above, never freed while the program runs), the kernels read only indices below the n they are given, and AVX-512F is asserted at start.
            let r = unsafe { f((s2.a as *const f32).add(h), s2.n - h) }; s2.out.store(r.to_bits() as u64, Ordering::Relaxed);
            s2.done.store(g, Ordering::Release); } else { std::hint::spin_loop(); } } });
    let mut g = 0;
    for round in 0..2 { for (ki, (name, f)) in kernels.iter().enumerate() { for threads in [1, 2] {
        sh.k.store(ki, Ordering::Relaxed);
        let mut v = vec![];
        for it in 0..40 {
            let t = Instant::now();
            // SAFETY: the buffer holds n floats (allocated above, never freed while the program runs), the kernels read only indices below the n they are given, and AVX-512F is asserted at start.
            if threads == 2 { g += 1; sh.gen.store(g, Ordering::Release); unsafe { f(a, n / 2) }; while sh.done.load(Ordering::Acquire) != g { std::hint::spin_loop(); } }
            // SAFETY: the buffer holds n floats (allocated above, never freed while the program runs), the kernels read only indices below the n they are given, and AVX-512F is asserted at start.
            else { unsafe { f(a, n) }; }
            if it >= 5 { v.push(t.elapsed().as_secs_f64() * 1e3); }
        }
        v.sort_by(|x, y| x.partial_cmp(y).unwrap());
        println!("r{round} {name:8} {threads}t median {:6.3} ms = {:5.1} GB/s", v[v.len()/2], (n*4) as f64 / v[v.len()/2] / 1e6);
    }}}
}
unsafe fn libc_madvise(p: usize, len: usize) { extern "C" { fn madvise(a: *mut u8, l: usize, adv: i32) -> i32; } madvise(p as *mut u8, len, 14); }
