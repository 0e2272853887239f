//! The `conv` suite (convolution forward and forward+backward on the shapes) and the
//! `cnn` suite (training epochs of `kiln train --model cnn`'s network on random data).
//! Names and FLOP counts match `bench/torch_bench.py`.

use crate::suites::Ctx;
use crate::timing::Clock;
use crate::train::{epoch_modes, random_rows, sgd_trainer, time_epochs};
use kiln::{Conv2dOptions, DType, Result};

/// `(label, batch, c_in, size, c_out, kernel, padding)`.
pub(crate) const CONV_SHAPES: [(&str, usize, usize, usize, usize, usize, usize); 8] = [
    ("b32-32x64-28-k3", 32, 32, 28, 64, 3, 1),
    ("b1-3x64-224-k3", 1, 3, 224, 64, 3, 1),
    ("b256-1x32-28-k5", 256, 1, 28, 32, 5, 2),
    ("b256-32x64-14-k5", 256, 32, 14, 64, 5, 2),
    ("b64-64x64-56-k3", 64, 64, 56, 64, 3, 1),
    ("b64-128x128-28-k3", 64, 128, 28, 128, 3, 1),
    ("b64-256x256-14-k3", 64, 256, 14, 256, 3, 1),
    ("b64-512x512-7-k3", 64, 512, 7, 512, 3, 1),
];

/// Forward, and forward plus the three gradients (input, weight, bias), of each shape in
/// f32, TF32 (f32 storage, TF32 products: PyTorch's default for convolutions) and bf16.
pub(crate) fn conv(ctx: &mut Ctx) -> Result<()> {
    let precisions: &[(&str, DType)] = if ctx.device.is_cpu() {
        &[("f32", DType::F32)]
    } else {
        &[
            ("f32", DType::F32),
            ("tf32", DType::F32),
            ("bf16", DType::BF16),
        ]
    };
    let shapes: &[_] = if ctx.quick || ctx.device.is_cpu() {
        &CONV_SHAPES[..4]
    } else {
        &CONV_SHAPES
    };
    // `KILN_BENCH_CONV=b64-128x128-28-k3,...` and `KILN_BENCH_CONV_PRECISIONS=tf32,...` run a
    // subset (for profiling one problem).
    let picked = |var: &str, name: &str| {
        std::env::var(var)
            .map(|v| v.split(',').any(|m| m == name))
            .unwrap_or(true)
    };
    for &(label, precision) in precisions {
        if !picked("KILN_BENCH_CONV_PRECISIONS", label) {
            continue;
        }
        #[cfg(feature = "cuda")]
        kiln::cuda::set_tf32(label == "tf32");
        for &(name, n, c_in, size, c_out, k, pad) in shapes {
            if !picked("KILN_BENCH_CONV", name) {
                continue;
            }
            let x = ctx.randn(&[n, c_in, size, size], precision)?;
            let w = ctx
                .randn(&[c_out, c_in, k, k], precision)?
                .mul_scalar(0.1)?;
            let b = ctx.randn(&[c_out], precision)?;
            let options = Conv2dOptions::default().padding(pad);
            let out = (size + 2 * pad - k) + 1;
            let flops = 2.0 * (n * c_out * out * out * c_in * k * k) as f64;
            let ms = ctx
                .timer
                .median_ms(|| x.conv2d(&w, Some(&b), options).map(drop))?;
            let row = format!("conv/{name}/{label}");
            ctx.push(
                "conv",
                format!("{row}/fwd"),
                ms,
                "TFLOP/s",
                flops / ms / 1e9,
                None,
            );
            if !ctx.device.is_cpu() {
                // The host's share of a forward call (plan lookup, output allocation,
                // launch), which the timed row above includes: bursts of 10 calls after a
                // synchronisation, far less than the device work they queue.
                let runs = if ctx.quick { 5 } else { 30 };
                let us = ctx.timer.median_us_per_call(runs, 10, Clock::Host, || {
                    x.conv2d(&w, Some(&b), options).map(drop)
                })?;
                ctx.push("conv", format!("{row}/fwd_host"), us * 1e-3, "us", us, None);
            }
            let (xv, wv, bv) = (x.var()?, w.var()?, b.var()?);
            let g = ctx.randn(&[n, c_out, out, out], precision)?;
            let ms = ctx.timer.median_ms(|| {
                let y = xv.conv2d(&wv, Some(&bv), options)?;
                y.backward_with(&g).map(drop)
            })?;
            let tflops = 3.0 * flops / ms / 1e9;
            ctx.push("conv", format!("{row}/fwdbwd"), ms, "TFLOP/s", tflops, None);
        }
    }
    #[cfg(feature = "cuda")]
    kiln::cuda::set_tf32(false);
    Ok(())
}

/// Epoch time of the CNN (`kiln train --model cnn`'s network, SGD momentum 0.9, batch 256)
/// on random rows and labels; on CUDA eagerly and with the step in a graph, with TF32 on
/// (PyTorch's default for convolutions; `kiln train --tf32`). The CPU runs 16 steps per
/// epoch and reports the time scaled to the 234 steps of a Fashion-MNIST epoch.
pub(crate) fn cnn(ctx: &mut Ctx) -> Result<()> {
    let full_steps = 234;
    let (batch, steps) = match (ctx.quick, ctx.device.is_cpu()) {
        (true, _) => (256, 4),
        (false, true) => (256, 16),
        (false, false) => (256, full_steps),
    };
    let data = random_rows(ctx, batch * steps)?;
    let modes = epoch_modes(ctx);
    #[cfg(feature = "cuda")]
    kiln::cuda::set_tf32(true);
    for &(graph, metric) in modes {
        let mut trainer = sgd_trainer(cnn_model(ctx)?, batch, graph)?;
        let (ms, launches) = time_epochs(ctx, &mut trainer, &data, "cnn")?;
        if let Some(per_step) = launches {
            let label = format!("train/cnn/b{batch}/launches-per-step-{metric}");
            ctx.push("cnn", label, 0.0, "launches", per_step, None);
        }
        // A CPU epoch runs fewer steps: scaled to the full epoch.
        let ms = ms * full_steps as f64 / steps as f64;
        ctx.push(
            "cnn",
            format!("train/cnn/b{batch}/{metric}"),
            ms,
            "ms",
            ms,
            None,
        );
    }
    Ok(())
}

/// `kiln train --model cnn`'s network.
fn cnn_model(ctx: &mut Ctx) -> Result<kiln_nn::Sequential> {
    let dev = ctx.device;
    kiln_nn::conv::mnist_cnn(128, 10, None, &dev, &mut ctx.rng)
}
