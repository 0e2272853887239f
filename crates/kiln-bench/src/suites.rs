//! The workloads. Names and byte/FLOP counts match `bench/torch_bench.py` exactly.

use crate::report::{Record, Report};
use crate::timing::{Clock, Timer};
use kiln::{AllDims, DType, Device, Generator, Result, Tensor};
use serde_json::json;
use std::time::Instant;

/// Every suite, in run order (`peak` first: other suites report percent of its figures).
pub const SUITES: [&str; 13] = [
    "peak",
    "gemm",
    "elementwise",
    "activation",
    "reduce",
    "softmax",
    "transfer",
    "overhead",
    "alloc",
    "train",
    "conv",
    "cnn",
    "sparse",
];

pub struct Options {
    pub device: Device,
    pub quick: bool,
    /// Suites to run (empty: all).
    pub suites: Vec<String>,
}

/// Bytes that defeat the GPU's L2 (50 MB on the H100): inputs smaller than this are rotated
/// among several copies.
const ROTATE_BYTES: usize = 256 << 20;

fn copies_for(bytes: usize, device: &Device) -> usize {
    if device.is_cpu() {
        1
    } else {
        ROTATE_BYTES.div_ceil(bytes.max(1)).clamp(1, 64)
    }
}

pub(crate) struct Ctx {
    pub(crate) timer: Timer,
    pub(crate) device: Device,
    pub(crate) quick: bool,
    pub(crate) rng: Generator,
    records: Vec<Record>,
    copy_gbps: Option<f64>,
    gemm_peak: std::collections::BTreeMap<String, f64>,
}

/// Elements of host-made random data that large GPU inputs repeat (see [`Ctx::randn`]).
const RANDOM_BLOCK: usize = 1 << 20;

impl Ctx {
    /// Normal random data. On a GPU, a tensor of more than [`RANDOM_BLOCK`] elements (a
    /// multiple of it) repeats one host-made block, copied on the device: making 64M
    /// normals on the host takes about a second, during which NVIDIA's Vulkan driver
    /// lowers an idle GPU's clock (docs/benchmarks.md, session 19).
    pub(crate) fn randn(&mut self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let n: usize = shape.iter().product();
        if self.device.is_cpu() || n <= RANDOM_BLOCK || !n.is_multiple_of(RANDOM_BLOCK) {
            return Tensor::randn(shape, 0.0, 1.0, dtype, &self.device, &mut self.rng);
        }
        let block = Tensor::randn(
            [1, RANDOM_BLOCK],
            0.0,
            1.0,
            dtype,
            &self.device,
            &mut self.rng,
        )?;
        block
            .broadcast_as([n / RANDOM_BLOCK, RANDOM_BLOCK])?
            .copy()?
            .reshape(shape)
    }

    pub(crate) fn push(
        &mut self,
        suite: &str,
        name: String,
        ms: f64,
        unit: &str,
        value: f64,
        pct: Option<f64>,
    ) {
        self.records.push(Record {
            suite: suite.into(),
            name,
            median_ms: ms,
            unit: unit.into(),
            value,
            pct_peak: pct,
        });
    }

    /// Records a bandwidth figure: `bytes` moved in `ms`.
    pub(crate) fn bandwidth(&mut self, suite: &str, name: String, ms: f64, bytes: f64) {
        let gbps = bytes / (ms * 1e-3) / 1e9;
        let pct = self.copy_gbps.map(|p| 100.0 * gbps / p);
        self.push(suite, name, ms, "GB/s", gbps, pct);
    }
}

pub fn run(opts: &Options) -> Result<Report> {
    let mut ctx = Ctx {
        timer: Timer {
            device: opts.device,
            quick: opts.quick,
        },
        device: opts.device,
        quick: opts.quick,
        rng: Generator::new(0),
        records: Vec::new(),
        copy_gbps: None,
        gemm_peak: Default::default(),
    };
    let wanted =
        |s: &str| opts.suites.is_empty() || opts.suites.iter().any(|w| w == s) || s == "peak";
    // Probes of memory-dependent slowdowns: `KILN_BENCH_BALLAST_MIB` keeps that much device
    // memory allocated (untouched after its fill) through the run; `KILN_BENCH_RELEASE=1`
    // gives the device's cached memory back to the driver after each suite.
    let _ballast = match std::env::var("KILN_BENCH_BALLAST_MIB") {
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(mib) if mib > 0 => Some(Tensor::zeros(mib << 18, DType::F32, &opts.device)?),
            _ => None,
        },
        Err(_) => None,
    };
    let release = std::env::var("KILN_BENCH_RELEASE").is_ok_and(|v| v.trim() == "1");
    for suite in SUITES {
        if !wanted(suite) {
            continue;
        }
        if release {
            release_cached(&opts.device)?;
        }
        match suite {
            "peak" => peak(&mut ctx)?,
            "gemm" => gemm(&mut ctx)?,
            "elementwise" => elementwise(&mut ctx)?,
            "activation" => activation(&mut ctx)?,
            "reduce" => reduce(&mut ctx)?,
            "softmax" => softmax(&mut ctx)?,
            "transfer" if !opts.device.is_cpu() => transfer(&mut ctx)?,
            "overhead" => overhead(&mut ctx)?,
            "alloc" => alloc(&mut ctx)?,
            "train" => crate::train::train(&mut ctx)?,
            "conv" => crate::conv::conv(&mut ctx)?,
            "cnn" => crate::conv::cnn(&mut ctx)?,
            "sparse" => crate::sparse::sparse(&mut ctx)?,
            _ => {}
        }
    }
    let meta = json!({
        "schema": 1,
        "library": "kiln",
        "version": env!("CARGO_PKG_VERSION"),
        "device": opts.device.to_string(),
        "device_name": device_name(&opts.device),
        "commit": std::env::var("KILN_COMMIT").unwrap_or_else(|_| git_commit()),
        "date": std::env::var("KILN_DATE").unwrap_or_else(|_| now_utc()),
        "settings": {"quick": opts.quick, "cpu_threads": kiln::num_threads(), "tf32_default": false},
        "peaks": {"copy_gbps": ctx.copy_gbps, "gemm_tflops": ctx.gemm_peak},
    });
    Ok(Report {
        meta,
        records: ctx.records,
    })
}

fn device_name(device: &Device) -> String {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(o) => kiln::cuda::device_info(*o)
            .map(|i| i.name)
            .unwrap_or_else(|_| "cuda".into()),
        #[cfg(feature = "wgpu")]
        Device::Wgpu(o) => kiln::wgpu::adapters()
            .get(*o)
            .map(|a| format!("{} ({})", a.name, a.backend))
            .unwrap_or_else(|| "wgpu".into()),
        _ => std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
            })
            .map(|m| format!("{m} ({} threads)", kiln::num_threads()))
            .unwrap_or_else(|| "cpu".into()),
    }
}

fn git_commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

fn now_utc() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let (days, rem) = ((secs / 86400) as i64, secs % 86400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + (m <= 2) as i64;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Gives `device`'s cached (free) memory back to its driver.
fn release_cached(device: &Device) -> Result<()> {
    match *device {
        #[cfg(feature = "cuda")]
        Device::Cuda(n) => kiln::cuda::empty_cache(n),
        #[cfg(feature = "wgpu")]
        Device::Wgpu(n) => kiln::wgpu::release_cached(n),
        _ => Ok(()),
    }
}

/// Device copy bandwidth (bytes read plus written), the reference for bandwidth suites.
fn peak(ctx: &mut Ctx) -> Result<()> {
    let n = if ctx.device.is_cpu() || ctx.quick {
        1 << 22
    } else {
        1 << 26
    };
    let x = ctx.randn(&[n], DType::F32)?;
    let ms = ctx.timer.median_ms(|| x.copy().map(drop))?;
    let gbps = 2.0 * 4.0 * n as f64 / (ms * 1e-3) / 1e9;
    ctx.copy_gbps = Some(gbps);
    ctx.push(
        "peak",
        format!("peak/copy/f32/{n}"),
        ms,
        "GB/s",
        gbps,
        Some(100.0),
    );
    Ok(())
}

fn gemm(ctx: &mut Ctx) -> Result<()> {
    let sizes: &[usize] = match (ctx.device.is_cpu(), ctx.quick) {
        (_, true) => &[256, 512],
        (true, false) => &[64, 256, 512, 1024, 2048],
        (false, false) => &[64, 256, 512, 1024, 2048, 4096, 8192],
    };
    // Tall and skinny [m, k]·[k, n]: the MLP's layers (batch 256) and a wide batch.
    let skinny: &[[usize; 3]] = if ctx.quick {
        &[[256, 784, 128]]
    } else {
        &[[256, 784, 128], [256, 784, 1024], [16384, 1024, 128]]
    };
    let wgpu_f16 = [("f32", DType::F32), ("f16", DType::F16)];
    let dtypes: &[(&str, DType)] = if ctx.device.is_cpu() {
        &[("f32", DType::F32)]
    } else if ctx.device.is_wgpu() {
        // No TF32 or bf16 there; f16 where the adapter has it.
        let f16 = Tensor::zeros(1, DType::F16, &ctx.device).is_ok();
        &wgpu_f16[..if f16 { 2 } else { 1 }]
    } else {
        &[
            ("f32", DType::F32),
            ("tf32", DType::F32),
            ("bf16", DType::BF16),
            ("f16", DType::F16),
        ]
    };
    for &(label, dtype) in dtypes {
        #[cfg(feature = "cuda")]
        kiln::cuda::set_tf32(label == "tf32");
        for &n in sizes {
            let a = ctx.randn(&[n, n], dtype)?;
            let b = ctx.randn(&[n, n], dtype)?;
            let at = ctx.randn(&[n, n], dtype)?.t()?; // a transposed view: no copy
            let flops = 2.0 * (n as f64).powi(3);
            for (variant, lhs) in [("nn", &a), ("tn", &at)] {
                let ms = ctx.timer.median_ms(|| lhs.matmul(&b).map(drop))?;
                let tflops = flops / (ms * 1e-3) / 1e12;
                let best = ctx.gemm_peak.entry(label.to_string()).or_insert(0.0);
                *best = best.max(tflops);
                ctx.push(
                    "gemm",
                    format!("gemm/{label}/{n}/{variant}"),
                    ms,
                    "TFLOP/s",
                    tflops,
                    None,
                );
            }
        }
        for &[m, k, n] in skinny {
            let a = ctx.randn(&[m, k], dtype)?;
            let at = ctx.randn(&[k, m], dtype)?.t()?;
            let b = ctx.randn(&[k, n], dtype)?;
            let flops = 2.0 * (m * k * n) as f64;
            for (variant, lhs) in [("nn", &a), ("tn", &at)] {
                let ms = ctx.timer.median_ms(|| lhs.matmul(&b).map(drop))?;
                ctx.push(
                    "gemm",
                    format!("gemm/{label}/{m}x{k}x{n}/{variant}"),
                    ms,
                    "TFLOP/s",
                    flops / (ms * 1e-3) / 1e12,
                    None,
                );
            }
        }
        // A chain of four products with no host synchronisation in between.
        let n = match (ctx.quick, ctx.device.is_cpu()) {
            (true, _) => 256,
            (false, true) => 512,
            (false, false) => 4096,
        };
        let x = ctx.randn(&[n, n], dtype)?;
        let w = ctx
            .randn(&[n, n], dtype)?
            .mul_scalar(1.0 / (n as f64).sqrt())?;
        let ms = ctx.timer.median_ms(|| {
            let mut y = x.clone();
            for _ in 0..4 {
                y = y.matmul(&w)?;
            }
            drop(y);
            Ok(())
        })?;
        let tflops = 4.0 * 2.0 * (n as f64).powi(3) / (ms * 1e-3) / 1e12;
        ctx.push(
            "gemm",
            format!("gemm/{label}/{n}/chain4"),
            ms,
            "TFLOP/s",
            tflops,
            None,
        );
    }
    #[cfg(feature = "cuda")]
    kiln::cuda::set_tf32(false);
    // Percent of the best rate of the same precision.
    for r in ctx.records.iter_mut().filter(|r| r.suite == "gemm") {
        let label = r.name.split('/').nth(1).unwrap_or("");
        r.pct_peak = ctx.gemm_peak.get(label).map(|p| 100.0 * r.value / p);
    }
    Ok(())
}

/// Element counts of the elementwise, activation and reduce suites. `KILN_BENCH_SIZES`
/// (element counts, `K`/`M` suffixes allowed: `16M,24M,32M`) replaces them, e.g. to find
/// the size where a backend's bandwidth falls off.
fn sizes(ctx: &Ctx) -> Vec<usize> {
    if let Ok(list) = std::env::var("KILN_BENCH_SIZES") {
        let parse = |s: &str| {
            let s = s.trim();
            let (digits, scale) = match s.strip_suffix(['M', 'm']) {
                Some(d) => (d, 1 << 20),
                None => match s.strip_suffix(['K', 'k']) {
                    Some(d) => (d, 1 << 10),
                    None => (s, 1),
                },
            };
            digits.parse::<usize>().ok().map(|n| n * scale)
        };
        let sizes: Vec<usize> = list
            .split(',')
            .filter_map(parse)
            .filter(|&n| n > 0)
            .collect();
        if !sizes.is_empty() {
            return sizes;
        }
        eprintln!("kiln bench: KILN_BENCH_SIZES={list:?} names no sizes; using the defaults");
    }
    match (ctx.device.is_cpu(), ctx.quick) {
        (_, true) => vec![1 << 10, 1 << 16],
        (true, false) => vec![1 << 10, 1 << 16, 1 << 20, 1 << 24],
        (false, false) => vec![1 << 10, 1 << 16, 1 << 20, 1 << 24, 1 << 26],
    }
}

/// Times `f` over rotating copies of inputs made by `make`.
fn rotating<T>(
    ctx: &mut Ctx,
    bytes: usize,
    mut make: impl FnMut(&mut Ctx) -> Result<T>,
    f: impl Fn(&T) -> Result<()>,
) -> Result<f64> {
    let copies = copies_for(bytes, &ctx.device);
    let sets = (0..copies).map(|_| make(ctx)).collect::<Result<Vec<T>>>()?;
    let mut i = 0;
    ctx.timer.median_ms(|| {
        i = (i + 1) % sets.len();
        f(&sets[i])
    })
}

fn elementwise(ctx: &mut Ctx) -> Result<()> {
    for n in sizes(ctx) {
        for op in ["add", "mul"] {
            let ms = rotating(
                ctx,
                8 * n,
                |c| Ok((c.randn(&[n], DType::F32)?, c.randn(&[n], DType::F32)?)),
                |(a, b)| if op == "add" { a.add(b) } else { a.mul(b) }.map(drop),
            )?;
            ctx.bandwidth(
                "elementwise",
                format!("elementwise/{op}/f32/{n}"),
                ms,
                12.0 * n as f64,
            );
        }
    }
    // A transposed view made contiguous: read once, written once.
    let sides: &[usize] = if ctx.quick {
        &[256]
    } else {
        &[256, 1024, 4096]
    };
    for &s in sides {
        let ms = rotating(
            ctx,
            4 * s * s,
            |c| c.randn(&[s, s], DType::F32),
            |x| x.t()?.contiguous().map(drop),
        )?;
        ctx.bandwidth(
            "elementwise",
            format!("elementwise/transpose_copy/f32/{s}x{s}"),
            ms,
            8.0 * (s * s) as f64,
        );
    }
    Ok(())
}

fn activation(ctx: &mut Ctx) -> Result<()> {
    for n in sizes(ctx) {
        for op in ["relu", "gelu", "gelu_tanh", "exp", "tanh", "sigmoid"] {
            let f = match op {
                "relu" => Tensor::relu,
                "gelu" => Tensor::gelu,
                "gelu_tanh" => Tensor::gelu_tanh,
                "exp" => Tensor::exp,
                "tanh" => Tensor::tanh,
                _ => Tensor::sigmoid,
            };
            let ms = rotating(
                ctx,
                4 * n,
                |c| c.randn(&[n], DType::F32),
                |x| f(x).map(drop),
            )?;
            ctx.bandwidth(
                "activation",
                format!("activation/{op}/f32/{n}"),
                ms,
                8.0 * n as f64,
            );
        }
    }
    Ok(())
}

fn reduce(ctx: &mut Ctx) -> Result<()> {
    for n in sizes(ctx) {
        for op in ["sum", "max", "argmax"] {
            let ms = rotating(
                ctx,
                4 * n,
                |c| c.randn(&[n], DType::F32),
                |x| {
                    match op {
                        "sum" => x.sum(AllDims, false),
                        "max" => x.max(AllDims, false),
                        _ => x.argmax(0, false),
                    }
                    .map(drop)
                },
            )?;
            ctx.bandwidth("reduce", format!("reduce/{op}/f32/{n}"), ms, 4.0 * n as f64);
        }
    }
    Ok(())
}

fn softmax(ctx: &mut Ctx) -> Result<()> {
    let shapes: &[[usize; 2]] = match (ctx.device.is_cpu(), ctx.quick) {
        (_, true) => &[[256, 10], [512, 1024]],
        // 1024×1024: the 1M elements, whose 8 MB in and out stay in the L3.
        (true, false) => &[[256, 10], [1024, 1024], [4096, 1024]],
        (false, false) => &[[256, 10], [4096, 1024], [32768, 4096], [8192, 32000]],
    };
    for &[r, c] in shapes {
        for (name, log) in [("softmax", false), ("log_softmax", true)] {
            let ms = rotating(
                ctx,
                4 * r * c,
                |ctx| ctx.randn(&[r, c], DType::F32),
                |x| {
                    if log {
                        x.log_softmax(-1)
                    } else {
                        x.softmax(-1)
                    }
                    .map(drop)
                },
            )?;
            ctx.bandwidth(
                "softmax",
                format!("{name}/f32/{r}x{c}"),
                ms,
                8.0 * (r * c) as f64,
            );
        }
        // A reduction: the input read once (the r outputs are not counted).
        let ms = rotating(
            ctx,
            4 * r * c,
            |ctx| ctx.randn(&[r, c], DType::F32),
            |x| x.logsumexp(1, false).map(drop),
        )?;
        ctx.bandwidth(
            "softmax",
            format!("logsumexp/f32/{r}x{c}"),
            ms,
            4.0 * (r * c) as f64,
        );
    }
    Ok(())
}

fn transfer(ctx: &mut Ctx) -> Result<()> {
    let sizes: &[usize] = if ctx.quick {
        &[256 << 10, 4 << 20]
    } else {
        &[256 << 10, 1 << 20, 4 << 20, 64 << 20, 256 << 20]
    };
    let device = ctx.device;
    for &bytes in sizes {
        let n = bytes / 4;
        let host = Tensor::randn(n, 0.0, 1.0, DType::F32, &Device::Cpu, &mut ctx.rng)?;
        let dev = host.to_device(&device)?;
        let h2d = ctx
            .timer
            .median_wall_ms(|| host.to_device(&device).map(drop))?;
        let d2h = ctx
            .timer
            .median_wall_ms(|| dev.to_device(&Device::Cpu).map(drop))?;
        let label = size_label(bytes);
        for (dir, ms) in [("h2d", h2d), ("d2h", d2h)] {
            let gbps = bytes as f64 / (ms * 1e-3) / 1e9;
            ctx.push(
                "transfer",
                format!("transfer/{dir}/pageable/{label}"),
                ms,
                "GB/s",
                gbps,
                None,
            );
        }
    }
    Ok(())
}

fn overhead(ctx: &mut Ctx) -> Result<()> {
    // Host cost of a tiny op: two 1024-element tensors added back to back, wall clock per op
    // after synchronising at the end. The in-place twin (`add_assign`: no output allocated,
    // no autograd check of an output) splits the cost: what remains is the launch path.
    let a = ctx.randn(&[1024], DType::F32)?;
    let b = ctx.randn(&[1024], DType::F32)?;
    let acc = ctx.randn(&[1024], DType::F32)?;
    let reps = if ctx.quick { 1000 } else { 10_000 };
    let ops: [(&str, &dyn Fn() -> Result<()>); 2] = [
        ("tiny_add", &|| a.add(&b).map(drop)),
        ("tiny_add_assign", &|| acc.add_assign(&b)),
    ];
    for (name, op) in ops {
        for _ in 0..100 {
            op()?;
        }
        ctx.timer.sync()?;
        let runs = if ctx.quick { 1 } else { 5 };
        let us = ctx.timer.median_us_per_call(runs, reps, Clock::Wall, op)?;
        ctx.push(
            "overhead",
            format!("overhead/{name}/f32/1024"),
            us * 1e-3,
            "us",
            us,
            None,
        );
        // The host's share alone: bursts of 200, short enough that the launch queue never
        // fills (so the host never waits for the GPU).
        let runs = if ctx.quick { 5 } else { 50 };
        let us = ctx.timer.median_us_per_call(runs, 200, Clock::Host, op)?;
        ctx.push(
            "overhead",
            format!("overhead/{name}_host/f32/1024"),
            us * 1e-3,
            "us",
            us,
            None,
        );
    }

    // View ops and layout checks in ns (no device call on any device).
    let x = ctx.randn(&[64, 64, 64], DType::F32)?;
    let views: [(&str, &dyn Fn() -> Result<()>); 5] = [
        ("clone", &|| {
            drop(std::hint::black_box(&x).clone());
            Ok(())
        }),
        ("transpose", &|| x.transpose(0, 2).map(drop)),
        ("narrow", &|| x.narrow(1, 3, 20).map(drop)),
        ("broadcast", &|| {
            x.unsqueeze(0)?.broadcast_as([4, 64, 64, 64]).map(drop)
        }),
        ("is_contiguous", &|| {
            std::hint::black_box(std::hint::black_box(&x).is_contiguous());
            Ok(())
        }),
    ];
    for (name, f) in views {
        let iters = 100_000;
        let mut samples = Vec::new();
        for _ in 0..7 {
            let t = Instant::now();
            for _ in 0..iters {
                f()?;
            }
            samples.push(t.elapsed().as_secs_f64() * 1e9 / iters as f64);
        }
        samples.sort_by(f64::total_cmp);
        let ns = samples[3];
        ctx.push(
            "overhead",
            format!("overhead/view/{name}"),
            ns * 1e-6,
            "ns",
            ns,
            None,
        );
    }
    Ok(())
}

/// Allocation cost (a `zeros` tensor made and dropped: allocation, fill, free; wall clock
/// per call) and, on CUDA, the caching allocator's reuse rate in a training-like loop.
fn alloc(ctx: &mut Ctx) -> Result<()> {
    let sizes: &[usize] = if ctx.quick {
        &[4 << 10, 1 << 20]
    } else {
        &[4 << 10, 1 << 20, 64 << 20]
    };
    for &bytes in sizes {
        let n = bytes / 4;
        let reps = if ctx.quick {
            100
        } else {
            (256 << 20) / bytes.max(1)
        }
        .clamp(20, 2000);
        let runs = if ctx.quick { 2 } else { 7 };
        let device = ctx.device;
        let us = ctx.timer.median_us_per_call(runs, reps, Clock::Wall, || {
            Tensor::zeros(n, DType::F32, &device).map(drop)
        })?;
        ctx.push(
            "alloc",
            format!("alloc/zeros/{}", size_label(bytes)),
            us * 1e-3,
            "us",
            us,
            None,
        );
    }
    #[cfg(feature = "cuda")]
    if let Device::Cuda(o) = ctx.device {
        // A step's worth of activations of varied sizes, made and freed 100 times.
        let shapes: [usize; 6] = [256 * 784, 256 * 128, 256 * 10, 784 * 128, 128, 10];
        let before = kiln::cuda::memory_stats(o)?;
        for _ in 0..100 {
            let live: Vec<Tensor> = shapes
                .iter()
                .map(|&n| Tensor::zeros(n, DType::F32, &ctx.device))
                .collect::<Result<_>>()?;
            drop(live);
        }
        ctx.timer.sync()?;
        let after = kiln::cuda::memory_stats(o)?;
        let requests = (after.requests - before.requests) as f64;
        let fresh = (after.driver_allocations - before.driver_allocations) as f64;
        let pct = 100.0 * (1.0 - fresh / requests.max(1.0));
        ctx.push("alloc", "alloc/reuse_rate".into(), 0.0, "%", pct, None);
    }
    Ok(())
}

fn size_label(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{}MB", bytes >> 20)
    } else {
        format!("{}KB", bytes >> 10)
    }
}
