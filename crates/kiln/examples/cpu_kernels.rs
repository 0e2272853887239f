//! The CPU's vectorised kernels: which instruction set this machine runs, how fast GELU,
//! softmax, a max and a transposed view's copy (`t().contiguous()`, moved in 16×16 tiles)
//! are at each level, and how close GELU is to an f64 reference.
//!
//! ```sh
//! cargo run --release -p kiln --example cpu_kernels
//! KILN_CPU_SIMD=scalar cargo run --release -p kiln --example cpu_kernels   # force the baseline
//! ```

use kiln::{AllDims, DType, Device, Generator, SimdLevel, Tensor};
use std::time::Instant;

/// Median wall time of `f` in microseconds, after a warm-up call.
fn median_us(mut f: impl FnMut() -> kiln::Result<Tensor>) -> kiln::Result<f64> {
    f()?;
    let mut times = Vec::new();
    for _ in 0..21 {
        let t = Instant::now();
        f()?;
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    Ok(times[times.len() / 2])
}

fn main() -> kiln::Result<()> {
    // Keep freed tensors' memory for reuse, as `kiln train` does.
    kiln::retain_freed_host_memory();
    println!(
        "best level on this CPU: {}, in use: {}, threads: {}",
        SimdLevel::best(),
        kiln::simd_level(),
        kiln::num_threads()
    );
    let mut rng = Generator::new(0);
    let n = 1 << 20;
    let x = Tensor::randn([n], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng)?;
    let rows = x.reshape([1024, 1024])?;
    let transposed = rows.t()?;

    let mut levels = vec![SimdLevel::Scalar];
    if kiln::simd_level() != SimdLevel::Scalar {
        levels.push(kiln::simd_level());
    }
    let in_use = kiln::simd_level();
    for level in levels {
        kiln::set_simd_level(level)?;
        let gelu = median_us(|| x.gelu())?;
        let softmax = median_us(|| rows.softmax(-1))?;
        let max = median_us(|| x.max(AllDims, false))?;
        let copy = median_us(|| transposed.contiguous())?;
        // GB/s: bytes read plus bytes written.
        let gbps = |bytes: f64, us: f64| bytes / (us * 1e3);
        println!(
            "{level:>7}: gelu {gelu:7.0} us ({:5.1} GB/s)  softmax {softmax:7.0} us ({:5.1} GB/s)  max {max:6.0} us ({:5.1} GB/s)  transposed copy {copy:6.0} us ({:5.1} GB/s)",
            gbps(8.0 * n as f64, gelu),
            gbps(8.0 * n as f64, softmax),
            gbps(4.0 * n as f64, max),
            gbps(8.0 * n as f64, copy),
        );
    }
    kiln::set_simd_level(in_use)?;

    // Accuracy against f64: the erf form of GELU, x * Φ(x), over [-10, 10].
    let grid: Vec<f32> = (0..200_001).map(|i| -10.0 + i as f32 * 1e-4).collect();
    let g = Tensor::from_vec(grid.clone(), grid.len(), &Device::Cpu)?;
    let got = g.gelu()?.to_vec::<f32>()?;
    let worst = grid
        .iter()
        .zip(&got)
        .map(|(&x, &y)| {
            let x = x as f64;
            // Φ(x) = erfc(-x/√2)/2, from the f64 library; relative error of the f32 result.
            let want = x * 0.5 * erfc(-x / std::f64::consts::SQRT_2);
            if want == 0.0 {
                0.0
            } else {
                ((y as f64 - want) / want).abs()
            }
        })
        .fold(0.0, f64::max);
    println!("gelu on [-10, 10]: worst relative error {worst:.2e} (f32 epsilon 1.19e-7)");
    Ok(())
}

/// erfc in f64 by its continued fraction (x > 2) or series (otherwise); enough for a check.
fn erfc(x: f64) -> f64 {
    if x < 0.0 {
        return 2.0 - erfc(-x);
    }
    if x > 2.0 {
        // Lentz-free backward evaluation of erfc(x) = e^(-x²)/√π · 1/(x + 1/2/(x + 1/(x + ...)))
        let mut f = x;
        for k in (1..60).rev() {
            f = x + (k as f64 / 2.0) / f;
        }
        return (-x * x).exp() / std::f64::consts::PI.sqrt() / f;
    }
    let (mut sum, mut term, mut k) = (0.0, x, 0.0);
    while term.abs() > 1e-17 {
        sum += term / (2.0 * k + 1.0);
        k += 1.0;
        term *= -x * x / k;
    }
    1.0 - sum * 2.0 / std::f64::consts::PI.sqrt()
}
