//! The portable GPU backend: lists the adapters wgpu finds, runs the same computation on the
//! CPU and on a wgpu device and compares them, times a matrix product on the GPU, and shows
//! what a device without f64 says when asked for it.
//!
//! `cargo run --release -p kiln --example wgpu_tour [-- N]` (N: the adapter, default 0). On
//! Linux without a GPU, Mesa's software driver works: `apt-get install mesa-vulkan-drivers`.

use kiln::{AllDims, DType, Device, Generator, Tensor};

fn main() -> kiln::Result<()> {
    let adapters = kiln::wgpu::adapters();
    if adapters.is_empty() {
        eprintln!("no wgpu adapter: install a Vulkan driver (or run on a Mac: Metal)");
        std::process::exit(1);
    }
    for a in &adapters {
        println!(
            "wgpu:{}: {} ({}, {}; f16 {})",
            a.ordinal, a.name, a.backend, a.device_type, a.f16
        );
    }
    let ordinal: usize = std::env::args()
        .nth(1)
        .map_or(Ok(0), |s| s.parse())
        .unwrap_or(0);
    let gpu = Device::Wgpu(ordinal);
    let mut rng = Generator::new(0);

    // The same program on both devices: a small network's forward pass on a view.
    let x = Tensor::randn([64, 300], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng)?;
    let w = Tensor::randn([128, 300], 0.0, 0.05, DType::F32, &Device::Cpu, &mut rng)?;
    let run = |x: &Tensor, w: &Tensor| -> kiln::Result<Tensor> {
        // `w.t()` is a transposed view: the GPU's matrix product reads it by strides.
        x.matmul(&w.t()?)?.gelu()?.sqr()?.sum(AllDims, false)
    };
    let cpu = run(&x, &w)?.to_scalar::<f32>()?;
    let on_gpu = run(&x.to_device(&gpu)?, &w.to_device(&gpu)?)?.to_scalar::<f32>()?;
    println!("sum of gelu(x·wᵀ)²: cpu {cpu:.6}, {gpu} {on_gpu:.6}");

    // A matrix product timed with GPU timestamps.
    let software = adapters
        .get(ordinal)
        .is_some_and(|a| a.device_type == "Cpu");
    let n = if software { 256 } else { 2048 };
    let a = Tensor::randn([n, n], 0.0, 1.0, DType::F32, &gpu, &mut rng)?;
    a.matmul(&a)?; // compiles the kernel
    let (_, ms) = kiln::wgpu::time_region(ordinal, || a.matmul(&a))?;
    println!(
        "{n}x{n} f32 matmul on {gpu}: {ms:.3} ms, {:.2} TFLOP/s",
        2.0 * (n as f64).powi(3) / (ms * 1e-3) / 1e12
    );

    // f64 is refused with a clear error, never computed wrongly.
    match Tensor::zeros(3, DType::F64, &gpu) {
        Err(e) => println!("f64 on {gpu}: {e}"),
        Ok(_) => println!("f64 on {gpu}: accepted?"),
    }
    let stats = kiln::wgpu::memory_stats(ordinal)?;
    println!(
        "allocator: {} requests, {:.0}% served from the pool, peak {:.1} MiB",
        stats.requests,
        100.0 * stats.reuse_rate(),
        stats.peak_bytes_in_use as f64 / (1 << 20) as f64
    );
    Ok(())
}
