//! The `train` suite: epochs of `kiln train`'s MLPs on random data (eager, and on CUDA with
//! the step in a CUDA graph), with launches per step. Names match `bench/torch_bench.py`.

use crate::suites::Ctx;
use kiln::{DType, Result, Tensor};
use std::time::Instant;

/// Epoch time (wall clock, 234 steps of 256 on 59 904 random rows of 784 features and
/// random labels) of the MLPs 784-128-10 and 784-1024-10 with SGD (momentum 0.9), the
/// same loop `kiln train` runs (`kiln_nn::fit::Trainer`): eager, and on CUDA also with the
/// step replayed as a CUDA graph (`epoch-graph`). On CUDA it also counts the launches of an
/// eager step and the kernel nodes of the recorded step.
pub(crate) fn train(ctx: &mut Ctx) -> Result<()> {
    use kiln_nn::fit::GraphMode;
    use kiln_nn::{optim::Sgd, Module};
    let (batch, steps) = (256, if ctx.quick { 8 } else { 234 });
    let data = random_rows(ctx, batch * steps)?;
    let modes = epoch_modes(ctx);
    // `KILN_BENCH_TRAIN_HIDDEN=1024` runs one model (for profiling).
    let picked = |hidden: usize| {
        std::env::var("KILN_BENCH_TRAIN_HIDDEN")
            .map(|v| v.split(',').any(|h| h == hidden.to_string()))
            .unwrap_or(true)
    };
    for hidden in [128, 1024].into_iter().filter(|&h| picked(h)) {
        for &(graph, metric) in modes {
            let mut trainer = sgd_trainer(mlp(ctx, hidden)?, batch, graph)?;
            let (ms, launches) = time_epochs(ctx, &mut trainer, &data, "train")?;
            if let Some(per_step) = launches {
                let name = if graph == GraphMode::Off {
                    "launches-per-step"
                } else {
                    "launches-per-step-graph"
                };
                let label = format!("train/mlp784-{hidden}-10/b{batch}/{name}");
                ctx.push("train", label, 0.0, "launches", per_step, None);
            }
            if let Some(names) = trainer.recorded_step_kernel_names() {
                let label = format!("train/mlp784-{hidden}-10/b{batch}/graph-kernels");
                eprintln!("{label}: {}", names.join(", "));
                ctx.push("train", label, 0.0, "kernels", names.len() as f64, None);
            }
            ctx.push(
                "train",
                format!("train/mlp784-{hidden}-10/b{batch}/{metric}"),
                ms,
                "ms",
                ms,
                None,
            );
        }
        if hidden == 128 {
            let model = mlp(ctx, hidden)?;
            let mut opt = Sgd::new(model.named_parameters(), 0.05, 0.9, false, 0.0)?;
            step_parts(ctx, "step", &model, &mut opt, &data, batch)?;
            // The same step on a model and batch so small that device time is negligible:
            // what remains is the host's cost per step.
            let tiny = mlp(ctx, 8)?;
            let mut tiny_opt = Sgd::new(tiny.named_parameters(), 0.05, 0.9, false, 0.0)?;
            step_parts(ctx, "step-tiny", &tiny, &mut tiny_opt, &data, 8)?;
        }
    }
    Ok(())
}

/// A trainer of `model` as `kiln train` sets one up by default: SGD with momentum 0.9 at
/// learning rate 0.05, batches of `batch`, the step in a CUDA graph as `graph` says.
pub(crate) fn sgd_trainer(
    model: kiln_nn::Sequential,
    batch: usize,
    graph: kiln_nn::fit::GraphMode,
) -> Result<kiln_nn::fit::Trainer> {
    use kiln_nn::fit::{TrainOptions, Trainer};
    use kiln_nn::{optim::Sgd, Module};
    let opt = Sgd::new(model.named_parameters(), 0.05, 0.9, false, 0.0)?;
    // `KILN_BENCH_STEPS_PER_GRAPH=1` records one step per graph (for comparisons).
    let steps_per_graph = std::env::var("KILN_BENCH_STEPS_PER_GRAPH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(TrainOptions::default().steps_per_graph);
    let options = TrainOptions {
        batch,
        graph,
        steps_per_graph,
        ..TrainOptions::default()
    };
    Trainer::new(Box::new(model), Box::new(opt), options)
}

/// `rows` random rows of 784 features and random labels of 10 classes (Fashion-MNIST's
/// shape) on the bench's device.
pub(crate) fn random_rows(ctx: &mut Ctx, rows: usize) -> Result<kiln_nn::data::DeviceData> {
    let x = ctx.randn(&[rows, 784], DType::F32)?;
    let labels: Vec<i64> = (0..rows).map(|_| ctx.rng.below(10) as i64).collect();
    Ok(kiln_nn::data::DeviceData {
        x,
        y: Tensor::from_vec(labels, rows, &ctx.device)?,
    })
}

/// The epochs a training suite times, with their metric names: eager, and on CUDA also with
/// the step in a CUDA graph.
pub(crate) fn epoch_modes(ctx: &Ctx) -> &'static [(kiln_nn::fit::GraphMode, &'static str)] {
    use kiln_nn::fit::GraphMode;
    if ctx.device.is_cuda() {
        &[(GraphMode::Off, "epoch"), (GraphMode::On, "epoch-graph")]
    } else {
        &[(GraphMode::Off, "epoch")]
    }
}

/// The median wall time (ms) of a few epochs of `trainer` over `data` after one that warms
/// up (kernel loading, allocator, caches, graph recording), and on CUDA the launches per step
/// of the first timed epoch. A loss that is not finite is an error naming `suite`.
pub(crate) fn time_epochs(
    ctx: &mut Ctx,
    trainer: &mut kiln_nn::fit::Trainer,
    data: &kiln_nn::data::DeviceData,
    suite: &str,
) -> Result<(f64, Option<f64>)> {
    let (mut times, mut launches_per_step) = (Vec::new(), None);
    for epoch in 0..if ctx.quick { 2 } else { 4 } {
        let launches = launch_count();
        let t = Instant::now();
        let stats = trainer.train_epoch(data, &mut ctx.rng, |_| {})?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        if !stats.loss.is_finite() {
            return Err(kiln::Error::Msg(format!(
                "{suite} bench: loss {}",
                stats.loss
            )));
        }
        if epoch > 0 {
            times.push(ms);
            if epoch == 1 && ctx.device.is_cuda() {
                launches_per_step = Some((launch_count() - launches) as f64 / stats.steps as f64);
            }
        }
    }
    times.sort_by(f64::total_cmp);
    Ok((times[times.len() / 2], launches_per_step))
}

/// Launches queued on CUDA devices so far (0 without the `cuda` feature).
pub(crate) fn launch_count() -> u64 {
    #[cfg(feature = "cuda")]
    {
        kiln::cuda::launch_count()
    }
    #[cfg(not(feature = "cuda"))]
    {
        0
    }
}

/// The MLP 784-`hidden`-10 with ReLU, initialised as `kiln train` does.
fn mlp(ctx: &mut Ctx, hidden: usize) -> Result<kiln_nn::Sequential> {
    use kiln_nn::{init::Init, Activation, Linear, Sequential};
    let (dev, rng) = (ctx.device, &mut ctx.rng);
    let f32 = DType::F32;
    Ok(Sequential::new()
        .push(Linear::new(
            784,
            hidden,
            true,
            Init::KaimingUniform,
            f32,
            &dev,
            rng,
        )?)
        .push(Activation::Relu)
        .push(Linear::new(
            hidden,
            10,
            true,
            Init::XavierUniform,
            f32,
            &dev,
            rng,
        )?))
}

/// Host time per training step, cumulatively by part (wall clock per iteration over many
/// iterations, one synchronisation at the end): where a step's time goes when the host, not
/// the device, is the bound. kiln only: PyTorch's parts differ.
fn step_parts(
    ctx: &mut Ctx,
    label: &str,
    model: &kiln_nn::Sequential,
    opt: &mut kiln_nn::optim::Sgd,
    data: &kiln_nn::data::DeviceData,
    batch: usize,
) -> Result<()> {
    use kiln_nn::loss::cross_entropy_with_hits;
    use kiln_nn::optim::Optimizer;
    use kiln_nn::Module;
    let (x, y) = (data.x.narrow(0, 0, batch)?, data.y.narrow(0, 0, batch)?);
    let w = model.named_parameters()[0].1.detach();
    let iters = if ctx.quick { 20 } else { 2000 };
    let parts: [(&str, &mut dyn FnMut() -> Result<()>); 5] = [
        ("gemm", &mut || x.matmul(&w.t()?).map(drop)),
        ("forward", &mut || model.forward(&x).map(drop)),
        ("forward+loss", &mut || {
            cross_entropy_with_hits(&model.forward(&x)?, &y, 0.0).map(drop)
        }),
        ("forward+loss+backward", &mut || {
            cross_entropy_with_hits(&model.forward(&x)?, &y, 0.0)?
                .loss
                .backward()
                .map(drop)
        }),
        ("step", &mut || {
            let g = cross_entropy_with_hits(&model.forward(&x)?, &y, 0.0)?
                .loss
                .backward()?;
            opt.step(&g)
        }),
    ];
    for (name, f) in parts {
        f()?;
        ctx.timer.sync()?;
        let t = Instant::now();
        for _ in 0..iters {
            f()?;
        }
        ctx.timer.sync()?;
        let us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
        ctx.push(
            "train",
            format!("train/{label}/{name}"),
            us * 1e-3,
            "us",
            us,
            None,
        );
    }
    Ok(())
}
