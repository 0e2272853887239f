//! f32 GEMM throughput of four libraries on the bench shapes (see Cargo.toml for how to run).
use std::time::Instant;
type Sgemm = unsafe extern "C" fn(i32, i32, i32, i32, i32, i32, f32, *const f32, i32, *const f32, i32, f32, *mut f32, i32);
fn median(mut f: impl FnMut()) -> f64 {
    f(); f();
    let mut v = vec![]; let start = Instant::now();
    while v.len() < 5 || (start.elapsed().as_secs_f64() < 0.6 && v.len() < 50) { let t = Instant::now(); f(); v.push(t.elapsed().as_secs_f64()); }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap()); v[v.len() / 2]
}
fn main() {
    let threads = 2;
    let lib_ob = unsafe { libloading::Library::new("libopenblas.so.0") }.ok();
    let lib_bl = unsafe { libloading::Library::new("/usr/lib/x86_64-linux-gnu/blis-pthread/libblis.so.4") }.ok();
    let ob: Option<Sgemm> = lib_ob.as_ref().map(|l| unsafe { *l.get::<Sgemm>(b"cblas_sgemm").unwrap() });
    let bl: Option<Sgemm> = lib_bl.as_ref().map(|l| unsafe { *l.get::<Sgemm>(b"cblas_sgemm").unwrap() });
    let mut shapes: Vec<(usize, usize, usize, bool)> = vec![];
    for n in [64, 256, 512, 1024, 2048] { shapes.push((n, n, n, false)); shapes.push((n, n, n, true)); }
    for (m, k, n) in [(256, 784, 128), (256, 784, 1024), (16384, 1024, 128)] { shapes.push((m, k, n, false)); shapes.push((m, k, n, true)); }
    println!("{:>22} {:>8} {:>8} {:>8} {:>8}  GFLOP/s", "shape", "gemm", "faer", "openblas", "blis");
    for (m, k, n, ta) in shapes {
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7919 % 1000) as f32) / 1000.0 - 0.5).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 104729 % 1000) as f32) / 1000.0 - 0.5).collect();
        let mut c = vec![0f32; m * n];
        // A is m x k; row-major (nn) or stored transposed (tn: A^T stored k x m row-major).
        let (a_rs, a_cs) = if ta { (1isize, m as isize) } else { (k as isize, 1isize) };
        let flops = 2.0 * (m * n * k) as f64;
        let par = if m * n * k >= 96 * 96 * 96 { gemm::Parallelism::Rayon(threads) } else { gemm::Parallelism::None };
        let tg = median(|| unsafe { gemm::gemm(m, n, k, c.as_mut_ptr(), 1, n as isize, false, a.as_ptr(), a_cs, a_rs, b.as_ptr(), 1, n as isize, 0.0, 1.0, false, false, false, par) });
        let fpar = if m * n * k >= 96 * 96 * 96 { faer::Par::rayon(threads) } else { faer::Par::Seq };
        let tf = median(|| {
            let am = if ta { faer::MatRef::from_row_major_slice(&a, k, m).transpose() } else { faer::MatRef::from_row_major_slice(&a, m, k) };
            let bm = faer::MatRef::from_row_major_slice(&b, k, n);
            let cm = faer::MatMut::from_row_major_slice_mut(&mut c, m, n);
            faer::linalg::matmul::matmul(cm, faer::Accum::Replace, am, bm, 1.0f32, fpar);
        });
        let mut cb = |f: Option<Sgemm>| f.map(|f| median(|| unsafe {
            // CblasRowMajor=101, NoTrans=111, Trans=112
            f(101, if ta { 112 } else { 111 }, 111, m as i32, n as i32, k as i32, 1.0, a.as_ptr(), if ta { m as i32 } else { k as i32 }, b.as_ptr(), n as i32, 0.0, c.as_mut_ptr(), n as i32)
        }));
        let to = cb(ob); let tb = cb(bl);
        let g = |t: f64| flops / t / 1e9;
        println!("{:>22} {:8.1} {:8.1} {:>8} {:>8}", format!("{m}x{k}x{n}/{}", if ta { "tn" } else { "nn" }), g(tg), g(tf),
            to.map(|t| format!("{:.1}", g(t))).unwrap_or("-".into()), tb.map(|t| format!("{:.1}", g(t))).unwrap_or("-".into()));
    }
}
