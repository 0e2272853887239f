//! `kiln train`: an MLP on an MNIST-format dataset (Fashion-MNIST by default), on the CPU or
//! a GPU, with a progress bar, per-epoch lines, metrics (CSV, JSON), a PNG of the curves and a
//! checkpoint per epoch that `--resume` continues from.

use crate::plot::{plot, EpochMetrics};
use clap::Args;
use kiln::dist::ProcessGroup;
use kiln::{DType, Device, Generator, Tensor};
use kiln_nn::data::{mean_std, DeviceData, Mnist, DEFAULT_DIR};
use kiln_nn::fit::{GraphMode, TrainOptions, Trainer};
use kiln_nn::init::Init;
use kiln_nn::optim::{Adam, Optimizer, Schedule, Sgd};
use kiln_nn::{checkpoint, Activation, Dropout, Linear, Module, Sequential};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args, Clone, Debug)]
pub struct TrainArgs {
    /// Model: mlp (784-hidden-10 with ReLU) or cnn (two 5x5 conv + max-pool stages, 32 and
    /// 64 channels, then 3136-hidden-10).
    #[arg(long, default_value = "mlp")]
    pub model: String,
    /// Hidden units of the MLP.
    #[arg(long, default_value_t = 128)]
    pub hidden: usize,
    #[arg(long, default_value_t = 10)]
    pub epochs: usize,
    /// Minibatch size (an epoch is the full batches of a shuffled pass).
    #[arg(long, default_value_t = 256)]
    pub batch: usize,
    /// sgd, adam or adamw.
    #[arg(long, default_value = "sgd")]
    pub optimizer: String,
    #[arg(long, default_value_t = 0.05)]
    pub lr: f64,
    /// SGD momentum.
    #[arg(long, default_value_t = 0.9)]
    pub momentum: f64,
    /// Nesterov momentum (SGD).
    #[arg(long)]
    pub nesterov: bool,
    #[arg(long, default_value_t = 0.0)]
    pub weight_decay: f64,
    /// Learning-rate schedule: cosine (to 0 at the last epoch), step (×0.1 every third of
    /// the run) or none.
    #[arg(long, default_value = "cosine")]
    pub schedule: String,
    #[arg(long, default_value_t = 0.0)]
    pub label_smoothing: f64,
    /// Dropout after the hidden layer.
    #[arg(long, default_value_t = 0.0)]
    pub dropout: f64,
    /// cpu, cuda, cuda:N, wgpu, wgpu:N or auto (CUDA when there is a GPU; cuda:LOCAL_RANK
    /// when launched by torchrun-style variables).
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Data-parallel training over several devices of this host, one thread each:
    /// `cuda:0,cuda:1`, or `all` (every CUDA device). --batch is the global batch, split
    /// evenly; gradients are summed through NCCL (host memory for non-CUDA devices). One
    /// process per GPU instead: set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (torchrun).
    #[arg(long)]
    pub devices: Option<String>,
    /// Gradient bucket size for data-parallel training, in MiB.
    #[arg(long, default_value_t = 25.0)]
    pub bucket_mb: f64,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Folder for metrics, plot and checkpoints.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Folder with the four MNIST-format IDX files (plain or .gz).
    #[arg(long, default_value = DEFAULT_DIR)]
    pub data: PathBuf,
    /// Continue from the last checkpoint in --out.
    #[arg(long)]
    pub resume: bool,
    /// Use only the first N training images (smoke tests).
    #[arg(long)]
    pub limit: Option<usize>,
    /// Use only the first N test images.
    #[arg(long)]
    pub test_limit: Option<usize>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// CUDA graphs: auto (on for CUDA after one eager warm-up step, off elsewhere), on, off.
    #[arg(long, default_value = "auto")]
    pub graph: String,
    /// Training steps recorded in one CUDA graph (one launch for that many steps; 1: a graph
    /// per step). Single-device training only.
    #[arg(long, default_value_t = 16)]
    pub steps_per_graph: usize,
    /// On CUDA, let f32 GEMMs and convolutions use TF32 tensor cores (10-bit mantissa
    /// products, f32 sums; PyTorch's default for convolutions). Off: full f32.
    #[arg(long)]
    pub tf32: bool,
}

pub fn resolve_device(name: &str) -> kiln::Result<Device> {
    if name == "auto" {
        #[cfg(feature = "cuda")]
        if kiln::cuda::is_available() {
            return Ok(Device::Cuda(0));
        }
        return Ok(Device::Cpu);
    }
    Device::parse(name)
}

fn describe(device: &Device) -> String {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(o) => match kiln::cuda::device_info(*o) {
            Ok(i) => format!("{device} ({})", i.name),
            Err(_) => device.to_string(),
        },
        #[cfg(feature = "wgpu")]
        Device::Wgpu(o) => match kiln::wgpu::adapters().get(*o) {
            Some(a) => format!("{device} ({}, {})", a.name, a.backend),
            None => device.to_string(),
        },
        _ => format!("cpu ({} threads)", kiln::num_threads()),
    }
}

fn build_model(
    a: &TrainArgs,
    inputs: usize,
    classes: usize,
    device: &Device,
    rng: &mut Generator,
) -> kiln::Result<Sequential> {
    match a.model.as_str() {
        "mlp" => build_mlp(a, inputs, classes, device, rng),
        "cnn" => build_cnn(a, inputs, classes, device, rng),
        other => Err(kiln::Error::Msg(format!(
            "unknown model '{other}': the models are: mlp, cnn"
        ))),
    }
}

fn build_mlp(
    a: &TrainArgs,
    inputs: usize,
    classes: usize,
    device: &Device,
    rng: &mut Generator,
) -> kiln::Result<Sequential> {
    let mut m = Sequential::new()
        .push(Linear::new(
            inputs,
            a.hidden,
            true,
            Init::KaimingUniform,
            DType::F32,
            device,
            rng,
        )?)
        .push(Activation::Relu);
    if a.dropout > 0.0 {
        m = m.push(Dropout::new(a.dropout, a.seed ^ 0x5eed)?);
    }
    Ok(m.push(Linear::new(
        a.hidden,
        classes,
        true,
        Init::XavierUniform,
        DType::F32,
        device,
        rng,
    )?))
}

/// [`kiln_nn::conv::mnist_cnn`], for 28×28 images.
fn build_cnn(
    a: &TrainArgs,
    inputs: usize,
    classes: usize,
    device: &Device,
    rng: &mut Generator,
) -> kiln::Result<Sequential> {
    if inputs != 28 * 28 {
        return Err(kiln::Error::Msg(format!(
            "--model cnn expects 28x28 images (784 inputs), the data has {inputs}"
        )));
    }
    let dropout = (a.dropout > 0.0).then_some((a.dropout, a.seed ^ 0x5eed));
    kiln_nn::conv::mnist_cnn(a.hidden, classes, dropout, device, rng)
}

fn schedule(a: &TrainArgs) -> kiln::Result<Schedule> {
    let s = match a.schedule.as_str() {
        "none" | "constant" => Schedule::Constant,
        "step" => Schedule::Step {
            every: (a.epochs / 3).max(1),
            gamma: 0.1,
        },
        "cosine" => Schedule::Cosine {
            total: a.epochs,
            min_lr: 0.0,
        },
        s => {
            return Err(kiln::Error::Msg(format!(
                "unknown schedule '{s}': none, step or cosine"
            )))
        }
    };
    s.validate()?;
    Ok(s)
}

fn optimizer(a: &TrainArgs, params: Vec<(String, Tensor)>) -> kiln::Result<Box<dyn Optimizer>> {
    Ok(match a.optimizer.as_str() {
        "sgd" => Box::new(Sgd::new(
            params,
            a.lr,
            a.momentum,
            a.nesterov,
            a.weight_decay,
        )?),
        "adam" => Box::new(Adam::new(params, a.lr, a.weight_decay, false)?),
        "adamw" => Box::new(Adam::new(params, a.lr, a.weight_decay, true)?),
        o => {
            return Err(kiln::Error::Msg(format!(
                "unknown optimizer '{o}': sgd, adam or adamw"
            )))
        }
    })
}

fn last_checkpoint(out: &Path) -> Option<(usize, PathBuf)> {
    std::fs::read_dir(out)
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            let n = name
                .strip_prefix("epoch-")?
                .strip_suffix(".safetensors")?
                .parse::<usize>()
                .ok()?;
            Some((n, e.path()))
        })
        .max_by_key(|(n, _)| *n)
}

fn write_metrics(
    out: &Path,
    metrics: &[EpochMetrics],
    meta: &serde_json::Value,
) -> std::io::Result<()> {
    let mut csv = String::from("epoch,seconds,train_loss,train_acc,test_acc,lr\n");
    for m in metrics {
        csv += &format!(
            "{},{:.6},{:.6},{:.6},{:.6},{}\n",
            m.epoch, m.seconds, m.train_loss, m.train_acc, m.test_acc, m.lr
        );
    }
    std::fs::write(out.join("metrics.csv"), csv)?;
    let epochs: Vec<serde_json::Value> = metrics
        .iter()
        .map(|m| {
            serde_json::json!({"epoch": m.epoch, "seconds": m.seconds, "train_loss": m.train_loss,
                               "train_acc": m.train_acc, "test_acc": m.test_acc, "lr": m.lr})
        })
        .collect();
    let mut v = meta.clone();
    v["epochs"] = serde_json::Value::Array(epochs);
    std::fs::write(
        out.join("metrics.json"),
        serde_json::to_string_pretty(&v).unwrap_or_default(),
    )
}

/// Refuses nonsense arguments before any work, each with its value and allowed range (the
/// library constructors behind them check too; this answers before the data is loaded).
fn validate(a: &TrainArgs) -> Result<(), String> {
    let range = |name: &str, value: f64, ok: bool, allowed: &str| {
        if value.is_finite() && ok {
            Ok(())
        } else {
            Err(format!("--{name} {value} is out of range: {allowed}"))
        }
    };
    if a.epochs == 0 {
        return Err("--epochs 0: there is nothing to train; give at least 1".into());
    }
    for (name, v) in [
        ("hidden", a.hidden),
        ("batch", a.batch),
        ("steps-per-graph", a.steps_per_graph),
    ] {
        if v == 0 {
            return Err(format!("--{name} 0 is out of range: at least 1"));
        }
    }
    for (name, v) in [("limit", a.limit), ("test-limit", a.test_limit)] {
        if v == Some(0) {
            return Err(format!("--{name} 0 is out of range: at least 1"));
        }
    }
    range("lr", a.lr, a.lr > 0.0, "finite and > 0")?;
    range(
        "momentum",
        a.momentum,
        (0.0..1.0).contains(&a.momentum),
        "[0, 1)",
    )?;
    range(
        "weight-decay",
        a.weight_decay,
        a.weight_decay >= 0.0,
        "finite and >= 0",
    )?;
    range(
        "dropout",
        a.dropout,
        (0.0..1.0).contains(&a.dropout),
        "[0, 1)",
    )?;
    range(
        "label-smoothing",
        a.label_smoothing,
        (0.0..1.0).contains(&a.label_smoothing),
        "[0, 1)",
    )?;
    range(
        "bucket-mb",
        a.bucket_mb,
        a.bucket_mb.is_finite() && a.bucket_mb > 0.0,
        "finite and > 0",
    )?;
    if let Some(out) = &a.out {
        // Probed now, not at the first checkpoint an epoch later.
        // Named per process: the ranks of a multi-process run probe the same folder.
        let probe = out.join(format!(".kiln-write-test-{}", std::process::id()));
        std::fs::create_dir_all(out)
            .and_then(|_| std::fs::write(&probe, b"kiln"))
            .and_then(|_| std::fs::remove_file(&probe))
            .map_err(|err| format!("--out {} is not a writable folder: {err}", out.display()))?;
    }
    Ok(())
}

/// The devices of `--devices`: a comma list, or `all` (every CUDA device).
pub fn parse_devices(list: &str) -> Result<Vec<Device>, String> {
    if list == "all" {
        #[cfg(feature = "cuda")]
        {
            let n = kiln::cuda::device_count();
            if n > 0 {
                return Ok((0..n).map(Device::Cuda).collect());
            }
        }
        return Err("--devices all: there is no CUDA device here".into());
    }
    // A device may repeat for host-memory ranks (cpu,cpu); NCCL refuses a GPU twice.
    list.split(',')
        .map(|d| resolve_device(d.trim()).map_err(|e| format!("--devices {list}: {e}")))
        .collect()
}

/// Runs training (data parallel with --devices or torchrun-style variables); returns the
/// per-epoch metrics.
pub fn train(a: &TrainArgs) -> Result<Vec<EpochMetrics>, String> {
    validate(a)?;
    #[cfg(feature = "cuda")]
    kiln::cuda::set_tf32(a.tf32);
    let e = |e: kiln::Error| e.to_string();
    if let Some(list) = &a.devices {
        let devices = parse_devices(list)?;
        if devices.len() == 1 {
            return train_rank(a, devices[0], None);
        }
        if !a.batch.is_multiple_of(devices.len()) {
            return Err(format!(
                "--batch {} does not split evenly over the {} devices of --devices {list}",
                a.batch,
                devices.len()
            ));
        }
        let groups = ProcessGroup::for_threads(&devices).map_err(e)?;
        let results: Vec<(Result<Vec<EpochMetrics>, String>, Instant)> = std::thread::scope(|s| {
            let handles: Vec<_> = groups
                .into_iter()
                .map(|g| s.spawn(move || (train_rank(a, g.device(), Some(g)), Instant::now())))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        (Err("the rank's thread panicked".into()), Instant::now())
                    })
                })
                .collect()
        });
        return rank_zero_or_first_failure(results);
    }
    let world: usize = std::env::var("WORLD_SIZE")
        .ok()
        .and_then(|w| w.parse().ok())
        .unwrap_or(1);
    if world > 1 {
        let device = match (a.device.as_str(), std::env::var("LOCAL_RANK")) {
            ("auto", Ok(local)) => Device::parse(&format!("cuda:{local}")).map_err(e)?,
            (d, _) => resolve_device(d).map_err(e)?,
        };
        let group = ProcessGroup::from_env(&device).map_err(e)?;
        return train_rank(a, device, Some(group));
    }
    train_rank(a, resolve_device(&a.device).map_err(e)?, None)
}

/// Rank 0's result when every rank (a thread, with the time it ended) succeeded; otherwise
/// the failure that came first, which explains the others (a rank fails, its peers then
/// fail at their next collective), followed by the later ones.
fn rank_zero_or_first_failure<T>(results: Vec<(Result<T, String>, Instant)>) -> Result<T, String> {
    let mut failures: Vec<(Instant, usize, String)> = Vec::new();
    let mut zero = None;
    for (rank, (r, ended)) in results.into_iter().enumerate() {
        match r {
            Ok(m) if rank == 0 => zero = Some(m),
            Ok(_) => {}
            Err(err) => failures.push((ended, rank, err)),
        }
    }
    failures.sort_by_key(|f| f.0);
    let mut failures = failures.into_iter();
    match failures.next() {
        None => zero.ok_or_else(|| "no rank finished".into()),
        Some((_, rank, err)) => {
            let mut msg = format!("rank {rank} failed first: {err}");
            for (_, rank, err) in failures {
                msg.push_str(&format!("\n  then rank {rank}: {err}"));
            }
            Err(msg)
        }
    }
}

/// Training on `device`, as one rank of `group` when given (rank 0 alone prints, checkpoints
/// and plots).
fn train_rank(
    a: &TrainArgs,
    device: Device,
    group: Option<ProcessGroup>,
) -> Result<Vec<EpochMetrics>, String> {
    let e = |e: kiln::Error| e.to_string();
    let main = group.as_ref().is_none_or(|g| g.rank() == 0);
    let quiet = a.quiet || !main;
    let out_dir = if main { a.out.as_ref() } else { None };
    match &group {
        Some(g) if main => eprintln!(
            "kiln train: {} data parallel over {} ranks ({}), rank 0 on {}, global batch {}",
            a.model,
            g.world_size(),
            g.backend_name(),
            describe(&device),
            a.batch
        ),
        Some(_) => {}
        None => eprintln!("kiln train: {} on {}", a.model, describe(&device)),
    }
    let data = Mnist::load(&a.data).map_err(e)?;
    let (mean, std) = mean_std(&data.train.images).map_err(e)?;
    let train =
        DeviceData::upload(&data.train, mean, std, DType::F32, &device, a.limit).map_err(e)?;
    let test =
        DeviceData::upload(&data.test, mean, std, DType::F32, &device, a.test_limit).map_err(e)?;
    let inputs = train.x.dims()[1];
    let mut rng = Generator::new(a.seed);
    let model = build_model(a, inputs, 10, &device, &mut rng).map_err(e)?;
    let params = model.named_parameters();
    let buffers = model.named_buffers();
    let mut opt = optimizer(a, params.clone()).map_err(e)?;
    let sched = schedule(a).map_err(e)?;
    let graph: GraphMode = a.graph.parse().map_err(e)?;
    let mut metrics: Vec<EpochMetrics> = Vec::new();
    let mut start_epoch = 0;
    if let Some(out) = &a.out {
        if main {
            std::fs::create_dir_all(out).map_err(|err| format!("{}: {err}", out.display()))?;
        }
        if a.resume {
            match last_checkpoint(out) {
                Some((n, path)) => {
                    let (tensors, meta) = checkpoint::load(&path, &device).map_err(e)?;
                    let map: HashMap<String, Tensor> = tensors.into_iter().collect();
                    for (name, p) in params.iter().chain(&buffers) {
                        let t = map
                            .get(name)
                            .ok_or(format!("{}: no tensor {name}", path.display()))?;
                        p.assign(t).map_err(e)?;
                    }
                    let state: HashMap<String, Tensor> = map
                        .iter()
                        .filter_map(|(k, v)| {
                            k.strip_prefix("optimizer.")
                                .map(|k| (k.to_string(), v.clone()))
                        })
                        .collect();
                    opt.load_state(&state).map_err(e)?;
                    if let Some(prev) = meta
                        .get("metrics")
                        .and_then(|m| serde_json::from_str::<serde_json::Value>(m).ok())
                    {
                        metrics = prev
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|m| {
                                Some(EpochMetrics {
                                    epoch: m["epoch"].as_u64()? as usize,
                                    seconds: m["seconds"].as_f64()?,
                                    train_loss: m["train_loss"].as_f64()?,
                                    train_acc: m["train_acc"].as_f64()?,
                                    test_acc: m["test_acc"].as_f64()?,
                                    lr: m["lr"].as_f64()?,
                                })
                            })
                            .collect();
                    }
                    start_epoch = n;
                    if main {
                        eprintln!("resuming after epoch {n} from {}", path.display());
                    }
                }
                None if main => eprintln!(
                    "--resume: no checkpoint in {}, starting afresh",
                    out.display()
                ),
                None => {}
            }
        }
    }
    let mut trainer = Trainer::new(
        Box::new(model),
        opt,
        TrainOptions {
            batch: a.batch,
            label_smoothing: a.label_smoothing,
            graph,
            steps_per_graph: a.steps_per_graph,
            eval_batch: 1024,
        },
    )
    .map_err(e)?;
    if let Some(g) = group {
        let bucket = (a.bucket_mb * (1u64 << 20) as f64) as usize;
        trainer = trainer.data_parallel(g, bucket).map_err(e)?;
    }
    let steps = train.len() / a.batch.max(1);
    if steps == 0 {
        return Err(format!(
            "{} training images make no batch of {}",
            train.len(),
            a.batch
        ));
    }
    let meta = serde_json::json!({
        "model": a.model, "hidden": a.hidden, "batch": a.batch, "optimizer": a.optimizer, "lr": a.lr,
        "momentum": a.momentum, "nesterov": a.nesterov, "weight_decay": a.weight_decay, "schedule": a.schedule,
        "label_smoothing": a.label_smoothing, "seed": a.seed, "tf32": a.tf32, "device": describe(&device),
        "data": a.data.display().to_string(), "normalise": {"mean": mean, "std": std},
    });
    for epoch in start_epoch..a.epochs {
        let lr = sched.lr(a.lr, epoch);
        trainer.set_lr(lr).map_err(e)?;
        // The shuffle of each epoch depends only on the seed and the epoch (so a resumed run
        // sees the same batches).
        let mut shuffle = Generator::new(
            a.seed
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .wrapping_add(epoch as u64 + 1),
        );
        let bar = if quiet {
            indicatif::ProgressBar::hidden()
        } else {
            indicatif::ProgressBar::new(steps as u64)
        };
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "epoch {msg} [{bar:30}] {pos}/{len} {per_sec} ETA {eta}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar.set_message(format!("{}/{}", epoch + 1, a.epochs));
        let t0 = Instant::now();
        let stats = trainer
            .train_epoch(&train, &mut shuffle, |_| bar.inc(1))
            .map_err(e)?;
        let (train_loss, train_acc) = (stats.loss, stats.accuracy);
        let seconds = t0.elapsed().as_secs_f64();
        bar.finish_and_clear();
        // Before anything is written: the last good checkpoint stays the newest.
        stats.check_finite(epoch + 1).map_err(|err| match out_dir {
            Some(out) if epoch > 0 => format!(
                "{err} (--lr {:?}); {} holds the last good checkpoint, epoch-{epoch}.safetensors",
                a.lr,
                out.display()
            ),
            _ => format!("{err} (--lr {:?})", a.lr),
        })?;
        let test_acc = trainer.evaluate(&test).map_err(e)?;
        let m = EpochMetrics {
            epoch: epoch + 1,
            seconds,
            train_loss,
            train_acc,
            test_acc,
            lr,
        };
        if main {
            println!(
                "epoch {:>3}/{}  {:>8.1} ms  train loss {:.4}  train acc {:.2}%  test acc {:.2}%",
                m.epoch,
                a.epochs,
                seconds * 1e3,
                train_loss,
                100.0 * train_acc,
                100.0 * test_acc
            );
        }
        metrics.push(m);
        if let Some(out) = out_dir {
            let mut tensors = trainer.model().named_parameters();
            tensors.extend(trainer.model().named_buffers());
            tensors.extend(
                trainer
                    .optimizer()
                    .state()
                    .map_err(e)?
                    .into_iter()
                    .map(|(n, t)| (format!("optimizer.{n}"), t)),
            );
            let history: Vec<serde_json::Value> = metrics
                .iter()
                .map(|m| serde_json::json!({"epoch": m.epoch, "seconds": m.seconds, "train_loss": m.train_loss, "train_acc": m.train_acc, "test_acc": m.test_acc, "lr": m.lr}))
                .collect();
            let info = HashMap::from([
                ("epoch".to_string(), (epoch + 1).to_string()),
                (
                    "metrics".to_string(),
                    serde_json::to_string(&history).unwrap_or_default(),
                ),
                ("config".to_string(), meta.to_string()),
            ]);
            checkpoint::save(
                &out.join(format!("epoch-{}.safetensors", epoch + 1)),
                &tensors,
                &info,
            )
            .map_err(e)?;
            write_metrics(out, &metrics, &meta).map_err(|err| err.to_string())?;
            let shape = match a.model.as_str() {
                "cnn" => format!("conv32-conv64-3136-{}-10", a.hidden),
                _ => format!("{inputs}-{}-10", a.hidden),
            };
            let title = format!("{} {shape} on {}", a.model, describe(&device));
            if let Err(err) = plot(&out.join("curves.png"), &title, &metrics) {
                eprintln!("warning: could not draw the plot: {err}");
            }
        }
    }
    if let Some(out) = out_dir {
        eprintln!("metrics, curves.png and checkpoints in {}", out.display());
    }
    Ok(metrics)
}

#[cfg(test)]
mod tests {
    use super::rank_zero_or_first_failure;
    use std::time::{Duration, Instant};

    #[test]
    fn the_earliest_failure_is_reported_first_whatever_its_rank() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_millis(5);
        let ok: Vec<(Result<u32, String>, Instant)> = vec![(Ok(7), t0), (Ok(8), t0)];
        assert_eq!(rank_zero_or_first_failure(ok), Ok(7));
        // Rank 1 ran out of memory; rank 0 then timed out waiting for it.
        let failed = vec![
            (Err("collective timed out".to_string()), later),
            (Err("out of memory".to_string()), t0),
            (Ok(1), t0),
        ];
        let msg = rank_zero_or_first_failure(failed).unwrap_err();
        assert_eq!(
            msg,
            "rank 1 failed first: out of memory\n  then rank 0: collective timed out"
        );
    }
}
