//! The `kiln` command. For now one subcommand, `demo`, shows the core API at work: tensors,
//! views, a matrix product, reductions. Training (`kiln train`) and benchmarks (`kiln bench`)
//! join it as they land.

use kiln_cli::train;

use clap::{Parser, Subcommand};
use kiln::{AllDims, DType, Device, Generator, Tensor};

#[derive(Parser)]
#[command(
    name = "kiln",
    version,
    about = "kiln: tensors on the CPU and NVIDIA GPUs"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Benchmarks: run suites, or compare two reports.
    Bench {
        #[command(subcommand)]
        action: BenchAction,
    },
    /// Trains a model on an MNIST-format dataset (Fashion-MNIST by default).
    Train(train::TrainArgs),
    /// PageRank of a directed graph (an edge-list file or a generated one).
    Pagerank(kiln_cli::pagerank::PageRankArgs),
    /// Lists the devices kiln can use.
    Info,
    /// Builds tensors, takes views, multiplies and reduces, and prints each step.
    Demo {
        /// Device to run on: cpu, cuda, cuda:N, wgpu, wgpu:N.
        #[arg(long, default_value = "cpu")]
        device: String,
        /// Seed of the random generator.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
}

#[derive(Subcommand)]
enum BenchAction {
    /// Runs benchmark suites and writes a JSON report.
    Run {
        /// Device: cpu, cuda, cuda:N, wgpu, wgpu:N, or auto (CUDA when available).
        #[arg(long, default_value = "auto")]
        device: String,
        /// Comma-separated suites (default: all): peak, gemm, elementwise, activation, reduce,
        /// softmax, transfer, overhead, alloc, train, conv, cnn, sparse.
        #[arg(long, value_delimiter = ',')]
        suite: Vec<String>,
        /// Small sizes and few repeats (a smoke test).
        #[arg(long)]
        quick: bool,
        /// Where to write the JSON report.
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
    /// Multi-device benchmarks, one thread per device: all-reduce bus bandwidth (1 MB – 1 GB)
    /// and data-parallel training throughput of an MLP 784-4096-4096-4096-10 (512 rows per
    /// device and step), f32 and bf16. Prints JSON lines (and writes them to --out).
    Dist {
        /// Devices, e.g. cuda:0,cuda:1 or all.
        #[arg(long)]
        devices: String,
        /// Small sizes and few steps (a smoke test).
        #[arg(long)]
        quick: bool,
        /// Which figures: all-reduce, train (both by default).
        #[arg(long, value_delimiter = ',', default_value = "all-reduce,train")]
        parts: Vec<String>,
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
    /// Prints kiln and PyTorch side by side from two reports.
    Compare {
        a: std::path::PathBuf,
        b: std::path::PathBuf,
        /// Also write PNG charts (gemm.png, bandwidth.png) into this folder.
        #[arg(long)]
        plots: Option<std::path::PathBuf>,
    },
    /// Lists every metric worse than the baseline by more than the tolerance (exit status 1
    /// if there is any). Compares `--current FILE`, or runs the baseline's suites afresh on
    /// the baseline's device.
    Check {
        #[arg(long)]
        baseline: std::path::PathBuf,
        /// Allowed slowdown in percent.
        #[arg(long, default_value_t = 10.0)]
        tolerance: f64,
        #[arg(long)]
        current: Option<std::path::PathBuf>,
    },
}

fn bench_dist(
    devices: &str,
    quick: bool,
    parts: &[String],
    out: Option<std::path::PathBuf>,
) -> Result<(), String> {
    if let Some(p) = parts
        .iter()
        .find(|p| !["all-reduce", "train"].contains(&p.as_str()))
    {
        return Err(format!(
            "--parts: unknown part '{p}' (expected all-reduce and/or train)"
        ));
    }
    let devices = train::parse_devices(devices)?;
    let e = |e: kiln::Error| e.to_string();
    let mut records = Vec::new();
    if parts.iter().any(|p| p == "all-reduce") {
        records = kiln_bench::dist::all_reduce(&devices, quick).map_err(e)?;
    }
    let sizes: &[usize] = if quick {
        &[784, 256, 256, 10]
    } else {
        &[784, 4096, 4096, 4096, 10]
    };
    use kiln_bench::dist::{train, DistModel};
    if parts.iter().any(|p| p == "train") {
        for dtype in [DType::F32, DType::BF16] {
            records.push(train(&devices, DistModel::Mlp(sizes), 512, dtype, quick).map_err(e)?);
        }
        records.push(train(&devices, DistModel::MnistCnn, 512, DType::F32, quick).map_err(e)?);
    }
    let mut lines = String::new();
    for r in &records {
        lines.push_str(&r.to_json().to_string());
        lines.push('\n');
    }
    print!("{lines}");
    if let Some(path) = out {
        std::fs::write(&path, lines).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

fn bench(action: BenchAction) -> Result<(), String> {
    match action {
        BenchAction::Dist {
            devices,
            quick,
            parts,
            out,
        } => bench_dist(&devices, quick, &parts, out),
        BenchAction::Run {
            device,
            suite,
            quick,
            out,
        } => {
            let device = train::resolve_device(&device).map_err(|e| e.to_string())?;
            for s in &suite {
                if !kiln_bench::SUITES.contains(&s.as_str()) {
                    return Err(format!(
                        "unknown suite '{s}'; suites: {}",
                        kiln_bench::SUITES.join(", ")
                    ));
                }
            }
            eprintln!(
                "kiln bench on {device}{}",
                if quick { " (quick)" } else { "" }
            );
            let report = kiln_bench::run(&kiln_bench::Options {
                device,
                quick,
                suites: suite,
            })
            .map_err(|e| e.to_string())?;
            print!("{}", report.table());
            if let Some(path) = out {
                let text =
                    serde_json::to_string_pretty(&report.to_json()).map_err(|e| e.to_string())?;
                std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
                eprintln!("wrote {}", path.display());
            }
            Ok(())
        }
        BenchAction::Check {
            baseline,
            tolerance,
            current,
        } => {
            let base = kiln_bench::Report::read(&baseline)?;
            let cur = match current {
                Some(path) => kiln_bench::Report::read(&path)?,
                None => {
                    let device = Device::parse(base.meta["device"].as_str().unwrap_or("cpu"))
                        .map_err(|e| e.to_string())?;
                    let quick = base.meta["settings"]["quick"].as_bool().unwrap_or(false);
                    let suites: Vec<String> = base
                        .records
                        .iter()
                        .map(|r| r.suite.clone())
                        .collect::<std::collections::BTreeSet<_>>()
                        .into_iter()
                        .collect();
                    kiln_bench::run(&kiln_bench::Options {
                        device,
                        quick,
                        suites,
                    })
                    .map_err(|e| e.to_string())?
                }
            };
            let regressions = kiln_bench::check(&base, &cur, tolerance);
            if regressions.is_empty() {
                println!(
                    "no metric is worse than {} by more than {tolerance}%",
                    baseline.display()
                );
                return Ok(());
            }
            println!(
                "{:<40} {:>12} {:>12} {:>8}",
                "metric", "baseline", "current", "worse"
            );
            for r in &regressions {
                println!(
                    "{:<40} {:>8.2} {:<3} {:>8.2} {:<3} {:>7.1}%",
                    r.name, r.baseline, r.unit, r.current, r.unit, r.worse_pct
                );
            }
            Err(format!(
                "{} metrics regressed by more than {tolerance}%",
                regressions.len()
            ))
        }
        BenchAction::Compare { a, b, plots } => {
            let (ra, rb) = (kiln_bench::Report::read(&a)?, kiln_bench::Report::read(&b)?);
            let (table, _) = kiln_bench::compare(&ra, &rb);
            print!("{table}");
            if let Some(dir) = plots {
                for p in kiln_cli::bench_plot::plots(&dir, &ra, &rb)? {
                    eprintln!("wrote {}", p.display());
                }
            }
            Ok(())
        }
    }
}

fn info() -> Result<(), String> {
    println!(
        "cpu: {} threads, {} kernels (best this CPU runs: {}; KILN_CPU_SIMD forces a lower one)",
        kiln::num_threads(),
        kiln::simd_level(),
        kiln::SimdLevel::best()
    );
    #[cfg(feature = "cuda")]
    {
        if let Some(reason) = kiln::cuda::unavailable_reason() {
            println!("cuda: unavailable ({reason})");
        }
        for o in 0..kiln::cuda::device_count() {
            let i = kiln::cuda::device_info(o).map_err(|e| e.to_string())?;
            println!(
                "cuda:{o}: {} (compute {}.{}, {} multiprocessors, {:.1} GiB, {} KiB shared memory per block)",
                i.name,
                i.compute_capability.0,
                i.compute_capability.1,
                i.multiprocessors,
                i.total_memory as f64 / (1u64 << 30) as f64,
                i.max_shared_per_block >> 10
            );
        }
        println!("convolutions: {}", kiln::cuda::convolution_path());
        println!("sparse products: {}", kiln::cuda::sparse_path());
        println!("collectives: {}", kiln::dist::nccl_status());
        println!(
            "kernel cache: {}",
            kiln::cuda::compile::cache_dir().display()
        );
        match kiln::cuda::saved_choices_dir() {
            Some(dir) => println!(
                "saved choices (GEMM plans, convolutions): {}",
                dir.display()
            ),
            None => println!("saved choices: off (KILN_SAVED_CHOICES=off)"),
        }
    }
    #[cfg(feature = "wgpu")]
    {
        let adapters = kiln::wgpu::adapters();
        if adapters.is_empty() {
            println!(
                "wgpu: no adapter (no Vulkan loader or driver; Debian: apt-get install libvulkan1 mesa-vulkan-drivers)"
            );
        }
        for a in adapters {
            println!(
                "wgpu:{}: {} ({}, {}, driver {}; f16 {}; largest binding {:.0} MiB)",
                a.ordinal,
                a.name,
                a.backend,
                a.device_type,
                a.driver.trim(),
                if a.f16 { "yes" } else { "no" },
                a.max_binding_bytes as f64 / (1u64 << 20) as f64
            );
        }
    }
    Ok(())
}

fn demo(device: &Device, seed: u64) -> kiln::Result<()> {
    let mut rng = Generator::new(seed);
    println!(
        "kiln demo on {device} ({} CPU threads)\n",
        kiln::num_threads()
    );

    let a = Tensor::arange(0.0, 6.0, 1.0, DType::F32, device)?.reshape([2, 3])?;
    println!("a = arange(6).reshape(2, 3)\n{a}\n");
    let at = a.t()?;
    println!(
        "a.t() is a view (shares storage: {}, strides {:?})\n{at}\n",
        at.same_storage(&a),
        at.strides()
    );
    let col = a.narrow(1, 1, 2)?;
    println!(
        "a.narrow(1, 1, 2), another view (offset {})\n{col}\n",
        col.layout().offset()
    );

    let x = Tensor::randn([4, 3], 0.0, 1.0, DType::F32, device, &mut rng)?;
    println!("x = randn(4, 3, seed={seed})\n{x}\n");
    let y = x.matmul(&at)?;
    println!(
        "x @ a.t() -> {:?} (the transposed view goes to GEMM as strides)\n{y}\n",
        y.dims()
    );
    println!("relu(x @ a.t()).softmax(-1)\n{}\n", y.relu()?.softmax(-1)?);
    println!("sum over rows: {}", y.sum(0, false)?);
    println!("mean of all:   {}", y.mean(AllDims, false)?);
    println!("argmax per row: {}", y.argmax(-1, false)?);
    let b = a.unsqueeze(0)?.broadcast_as([3, 2, 3])?;
    println!(
        "\na broadcast to {:?} with strides {:?}: sum = {}",
        b.dims(),
        b.strides(),
        b.sum(AllDims, false)?.to_scalar::<f32>()?
    );
    Ok(())
}

fn main() {
    let cli = Cli::parse();
    // Per-step tensors of 100 KiB – 1 MiB would otherwise page-fault afresh every step.
    kiln::retain_freed_host_memory();
    let result = match cli.command.unwrap_or(Command::Demo {
        device: "cpu".into(),
        seed: 0,
    }) {
        Command::Demo { device, seed } => Device::parse(&device)
            .and_then(|d| demo(&d, seed))
            .map_err(|e| e.to_string()),
        Command::Bench { action } => bench(action),
        Command::Info => info(),
        Command::Train(args) => train::train(&args).map(drop),
        Command::Pagerank(args) => kiln_cli::pagerank::run(&args),
    };
    if let Err(e) = result {
        eprintln!("kiln: {e}");
        std::process::exit(1);
    }
}
