//! Multi-device benchmarks (one thread per device, as `kiln train --devices`): all-reduce
//! bus bandwidth for 1 MB – 1 GB, and data-parallel training throughput of a large MLP and
//! of `kiln train`'s CNN.
//! `bench/torch_ddp.py` measures PyTorch DDP the same way (same sizes, same timing: a
//! loop of operations between two host synchronisations, median of repeats).

use kiln::dist::{ProcessGroup, ReduceOp};
use kiln::{DType, Device, Generator, Result, Tensor};
use kiln_nn::data::DeviceData;
use kiln_nn::fit::{GraphMode, TrainOptions, Trainer};
use kiln_nn::init::Init;
use kiln_nn::optim::Sgd;
use kiln_nn::{Activation, Linear, Module, Sequential};
use std::time::Instant;

/// One measured figure.
#[derive(Clone, Debug)]
pub struct DistRecord {
    pub name: String,
    pub world: usize,
    pub value: f64,
    pub unit: &'static str,
    /// Milliseconds per operation (all-reduce) or per step (training).
    pub ms: f64,
}

impl DistRecord {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "framework": "kiln", "name": self.name, "world": self.world,
            "value": self.value, "unit": self.unit, "ms": self.ms,
        })
    }
}

/// Runs `f(group)` on a thread per rank; returns rank 0's result.
fn on_ranks<R: Send>(
    devices: &[Device],
    f: impl Fn(ProcessGroup) -> Result<R> + Sync,
) -> Result<R> {
    let groups = ProcessGroup::for_threads(devices)?;
    let mut results: Vec<Result<R>> = std::thread::scope(|s| {
        let hs: Vec<_> = groups
            .into_iter()
            .map(|g| {
                let f = &f;
                s.spawn(move || f(g))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("a benchmark rank panicked"))
            .collect()
    });
    for r in results.iter_mut().skip(1) {
        if let Err(e) = r {
            return Err(kiln::Error::Msg(format!("a rank failed: {e}")));
        }
    }
    results.swap_remove(0)
}

/// Median seconds per call of `f` over `reps` timed loops of `inner` calls, each loop
/// between two waits of the group (after `warmup` calls).
fn loop_seconds(
    g: &ProcessGroup,
    warmup: usize,
    inner: usize,
    reps: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<f64> {
    for _ in 0..warmup {
        f()?;
    }
    g.barrier()?;
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        g.barrier()?;
        let t = Instant::now();
        for _ in 0..inner {
            f()?;
        }
        g.wait()?;
        times.push(t.elapsed().as_secs_f64() / inner as f64);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// All-reduce (sum, f32) bus bandwidth, NCCL's definition: `2(n−1)/n · bytes / time`.
pub fn all_reduce(devices: &[Device], quick: bool) -> Result<Vec<DistRecord>> {
    let sizes: &[usize] = if quick {
        &[1 << 20, 16 << 20]
    } else {
        &[1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]
    };
    let world = devices.len();
    on_ranks(devices, |g| {
        let g = &g;
        let mut out = Vec::new();
        for &bytes in sizes {
            let n = bytes / 4;
            let mut rng = Generator::new(g.rank() as u64);
            let t = Tensor::randn([n], 0.0, 1.0, DType::F32, &g.device(), &mut rng)?;
            let inner = (((256usize << 20) / bytes).clamp(2, 50)) * if quick { 1 } else { 2 };
            let s = loop_seconds(g, 3, inner, if quick { 3 } else { 7 }, || {
                g.all_reduce(&t, ReduceOp::Sum)
            })?;
            let factor = if world > 1 {
                2.0 * (world - 1) as f64 / world as f64
            } else {
                1.0
            };
            out.push(DistRecord {
                name: format!("all_reduce {}", size_label(bytes)),
                world,
                value: factor * bytes as f64 / s / 1e9,
                unit: "GB/s (bus)",
                ms: s * 1e3,
            });
        }
        Ok(out)
    })
}

fn size_label(bytes: usize) -> String {
    if bytes >= 1 << 30 {
        format!("{} GB", bytes >> 30)
    } else {
        format!("{} MB", bytes >> 20)
    }
}

/// A model `kiln bench dist` trains: both take 784 features (28×28 images) to 10 classes.
#[derive(Clone, Copy, Debug)]
pub enum DistModel<'a> {
    /// Linear layers of these sizes with ReLU between them.
    Mlp(&'a [usize]),
    /// `kiln train --model cnn`'s network ([`kiln_nn::conv::mnist_cnn`], f32 only).
    MnistCnn,
}

impl DistModel<'_> {
    fn name(&self, dtype: DType) -> String {
        match self {
            DistModel::Mlp(sizes) => format!(
                "mlp {} {dtype}",
                sizes
                    .iter()
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>()
                    .join("-")
            ),
            DistModel::MnistCnn => format!("cnn mnist {dtype}"),
        }
    }

    fn classes(&self) -> usize {
        match self {
            DistModel::Mlp(sizes) => sizes[sizes.len() - 1],
            DistModel::MnistCnn => 10,
        }
    }

    fn build(&self, dtype: DType, dev: &Device, rng: &mut Generator) -> Result<Sequential> {
        match self {
            DistModel::Mlp(sizes) => {
                let mut model = Sequential::new();
                for (i, w) in sizes.windows(2).enumerate() {
                    let layer =
                        Linear::new(w[0], w[1], true, Init::KaimingUniform, dtype, dev, rng)?;
                    model = model.push(layer);
                    if i + 2 < sizes.len() {
                        model = model.push(Activation::Relu);
                    }
                }
                Ok(model)
            }
            DistModel::MnistCnn if dtype == DType::F32 => {
                kiln_nn::conv::mnist_cnn(128, 10, None, dev, rng)
            }
            DistModel::MnistCnn => Err(kiln::Error::Msg(format!(
                "bench dist: the CNN is built in f32 only, not {dtype}"
            ))),
        }
    }
}

/// Data-parallel training throughput (samples/s) of `model` on synthetic data (784
/// features, 10 classes), `per_device` rows per device and step, SGD with momentum, the
/// step in a CUDA graph where it can be recorded.
pub fn train(
    devices: &[Device],
    model_kind: DistModel,
    per_device: usize,
    dtype: DType,
    quick: bool,
) -> Result<DistRecord> {
    let world = devices.len();
    let batch = per_device * world;
    let steps = if quick { 4 } else { 30 };
    let rows = batch * steps;
    let features = 784;
    let secs = on_ranks(devices, |g| {
        let dev = g.device();
        let mut rng = Generator::new(1);
        let model = model_kind.build(dtype, &dev, &mut rng)?;
        let opt = Sgd::new(model.named_parameters(), 0.01, 0.9, false, 0.0)?;
        let options = TrainOptions {
            batch,
            graph: GraphMode::Auto,
            ..TrainOptions::default()
        };
        let mut trainer = Trainer::new(Box::new(model), Box::new(opt), options)?;
        if world > 1 {
            trainer = trainer.data_parallel(g, kiln_nn::parallel::DEFAULT_BUCKET_BYTES)?;
        }
        let classes = model_kind.classes();
        let data = DeviceData {
            x: Tensor::randn([rows, features], 0.0, 1.0, dtype, &dev, &mut rng)?,
            y: Tensor::rand([rows], 0.0, classes as f64, DType::F32, &dev, &mut rng)?
                .to_dtype(DType::I64)?, // truncates: labels 0..classes
        };
        let mut shuffle = Generator::new(2);
        // The first epoch warms up (kernels, GEMM plans, the recorded step); the second
        // is timed, from a synchronised start to its end (the epoch reads its sums).
        trainer.train_epoch(&data, &mut shuffle, |_| {})?;
        if let Some(g) = trainer.group() {
            g.barrier()?;
        }
        let t = Instant::now();
        trainer.train_epoch(&data, &mut shuffle, |_| {})?;
        Ok(t.elapsed().as_secs_f64())
    })?;
    let name = format!("train {} x{per_device}/device", model_kind.name(dtype));
    Ok(DistRecord {
        name,
        world,
        value: rows as f64 / secs,
        unit: "samples/s",
        ms: secs * 1e3 / steps as f64,
    })
}
