//! The 1M-element add (`cargo run --release --bin add [N]`) with AVX-512 four ways (plain,
//! unrolled, software prefetch, non-temporal stores) on one thread and on two (the second a
//! spinning thread, the cheapest hand-off there is): the floor under kiln's and PyTorch's add rows.
use std::arch::x86_64::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

#[target_feature(enable = "avx512f")]
unsafe fn add_plain(a: *const f32, b: *const f32, c: *mut f32, n: usize) {
    let mut i = 0;
    while i < n { let x = _mm512_loadu_ps(a.add(i)); let y = _mm512_loadu_ps(b.add(i)); _mm512_storeu_ps(c.add(i), _mm512_add_ps(x, y)); i += 16; }
}
#[target_feature(enable = "avx512f")]
unsafe fn add_unroll(a: *const f32, b: *const f32, c: *mut f32, n: usize) {
    let mut i = 0;
    while i < n {
        for k in 0..4 { let o = i + 16*k; _mm512_storeu_ps(c.add(o), _mm512_add_ps(_mm512_loadu_ps(a.add(o)), _mm512_loadu_ps(b.add(o)))); }
        i += 64;
    }
}
#[target_feature(enable = "avx512f")]
unsafe fn add_pf(a: *const f32, b: *const f32, c: *mut f32, n: usize) {
    let d = 1024; // elements ahead (4 KB)
    let mut i = 0;
    while i < n {
        _mm_prefetch::<_MM_HINT_T0>(a.add(i + d) as *const i8);
        _mm_prefetch::<_MM_HINT_T0>(b.add(i + d) as *const i8);
        _mm_prefetch::<_MM_HINT_ET0>(c.add(i + d) as *const i8);
        _mm512_storeu_ps(c.add(i), _mm512_add_ps(_mm512_loadu_ps(a.add(i)), _mm512_loadu_ps(b.add(i))));
        i += 16;
    }
}
#[target_feature(enable = "avx512f")]
unsafe fn add_nt(a: *const f32, b: *const f32, c: *mut f32, n: usize) {
    let mut i = 0;
    while i < n { _mm512_stream_ps(c.add(i), _mm512_add_ps(_mm512_loadu_ps(a.add(i)), _mm512_loadu_ps(b.add(i)))); i += 16; }
    _mm_sfence();
}

type K = unsafe fn(*const f32, *const f32, *mut f32, usize);
struct Shared { gen: AtomicUsize, done: AtomicUsize, k: AtomicUsize, a: usize, b: usize, c: usize, n: usize }

fn main() {
    assert!(is_x86_feature_detected!("avx512f"), "this probe needs AVX-512F");
    let n: usize = std::env::args().nth(1).map(|s| s.parse().unwrap()).unwrap_or(1 << 20);
    let layout = std::alloc::Layout::from_size_align(n * 4, 4096).unwrap();
    // SAFETY: the buffers hold n floats each (allocated above, never freed while the program runs), the kernels read and write only indices below the n they are given, the two threads write disjoint halves, and AVX-512F is asserted at start.
    let (a, b, c) = unsafe { (std::alloc::alloc(layout) as *mut f32, std::alloc::alloc(layout) as *mut f32, std::alloc::alloc(layout) as *mut f32) };
    // SAFETY: the buffers hold n floats each (allocated above, never freed while the program runs), the kernels read and write only indices below the n they are given, the two threads write disjoint halves, and AVX-512F is asserted at start.
    for i in 0..n { unsafe { *a.add(i) = i as f32 * 0.5; *b.add(i) = 1.0 + i as f32; *c.add(i) = 0.0; } }
    let kernels: [(&str, K); 4] = [("plain", add_plain), ("unroll4", add_unroll), ("prefetch", add_pf), ("nt", add_nt)];
    let sh = Arc::new(Shared { gen: AtomicUsize::new(0), done: AtomicUsize::new(0), k: AtomicUsize::new(0), a: a as usize, b: b as usize, c: c as usize, n });
    let s2 = sh.clone();
    let kk = kernels;
    std::thread::spawn(move || { let mut seen = 0; loop {
        let g = s2.gen.load(Ordering::Acquire); if g == usize::MAX { return; }
        if g != seen { seen = g; let h = s2.n / 2; let f = kk[s2.k.load(Ordering::Relaxed)].1;
            // SAFETY: the buffers hold n floats each (allocated above, never freed while the program runs), the kernels read and write only indices below the n they are given, the two threads write disjoint halves, and AVX-512F is asserted at start.
            unsafe { f((s2.a as *const f32).add(h), (s2.b as *const f32).add(h), (s2.c as *mut f32).add(h), s2.n - h) }
            s2.done.store(g, Ordering::Release); } else { std::hint::spin_loop(); } } });
    let mut g = 0;
    for round in 0..3 {
    for (ki, (name, f)) in kernels.iter().enumerate() {
        for threads in [1, 2] {
            sh.k.store(ki, Ordering::Relaxed);
            let mut v = vec![];
            for it in 0..60 {
                let t = Instant::now();
                // SAFETY: the buffers hold n floats each (allocated above, never freed while the program runs), the kernels read and write only indices below the n they are given, the two threads write disjoint halves, and AVX-512F is asserted at start.
                if threads == 2 { g += 1; sh.gen.store(g, Ordering::Release); unsafe { f(a, b, c, n / 2) }; while sh.done.load(Ordering::Acquire) != g { std::hint::spin_loop(); } }
                // SAFETY: the buffers hold n floats each (allocated above, never freed while the program runs), the kernels read and write only indices below the n they are given, the two threads write disjoint halves, and AVX-512F is asserted at start.
                else { unsafe { f(a, b, c, n) } }
                if it >= 10 { v.push(t.elapsed().as_secs_f64() * 1e6); }
            }
            v.sort_by(|x, y| x.partial_cmp(y).unwrap());
            println!("r{round} {name:9} {threads}t median {:7.1} us  min {:7.1}", v[v.len()/2], v[0]);
        }
    }}
    sh.gen.store(usize::MAX, Ordering::Release);
}
