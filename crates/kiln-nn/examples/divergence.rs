//! Catching a diverging run in your own training loop without a host read per step.
//!
//! A `DivergenceWatch` keeps the running loss sum on the device and, beside it, how many
//! steps it stayed finite; reading it once per epoch names the first step whose loss was
//! NaN or infinite. Here a regression with a learning rate far too large blows up, the
//! epoch check stops the loop, and the program exits with an error (non-zero).
//!
//! `cargo run --release --example divergence [-- cuda]` (`-- 0.01` trains with a sane rate)

use kiln::{DType, Device, Generator, Tensor};
use kiln_nn::fit::DivergenceWatch;
use kiln_nn::init::Init;
use kiln_nn::optim::{Optimizer, Sgd};
use kiln_nn::{loss, Linear, Module};

fn main() -> kiln::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let device = if args.iter().any(|a| a == "cuda") {
        Device::Cuda(0)
    } else {
        Device::Cpu
    };
    let lr: f64 = args.iter().find_map(|a| a.parse().ok()).unwrap_or(5.0);
    let mut rng = Generator::new(0);
    // y = x·w_true + noise
    let x = Tensor::randn([4096, 16], 0.0, 1.0, DType::F32, &device, &mut rng)?;
    let w_true = Tensor::randn([16, 1], 0.0, 1.0, DType::F32, &device, &mut rng)?;
    let y = x.matmul(&w_true)?.add(&Tensor::randn(
        [4096, 1],
        0.0,
        0.1,
        DType::F32,
        &device,
        &mut rng,
    )?)?;
    let model = Linear::new(
        16,
        1,
        true,
        Init::XavierUniform,
        DType::F32,
        &device,
        &mut rng,
    )?;
    let mut opt = Sgd::new(model.named_parameters(), lr, 0.0, false, 0.0)?;
    let watch = DivergenceWatch::new(1, &device)?;
    let (batch, steps) = (64, 4096 / 64);
    for epoch in 1..=5 {
        watch.reset()?;
        for s in 0..steps {
            let xb = x.narrow(0, s * batch, batch)?;
            let yb = y.narrow(0, s * batch, batch)?;
            let l = loss::mse(&model.forward(&xb)?, &yb)?;
            watch.observe(&l.detach().reshape(1)?)?; // two small kernels, no host read
            opt.step(&l.backward()?)?;
        }
        let reading = watch.read()?; // the epoch's one read
        if let Some(step) = reading.first_bad_step {
            return Err(kiln::Error::Msg(format!(
                "diverged at epoch {epoch}, step {step} of {steps} (learning rate {lr}): \
                 lower it (try `-- 0.01`)"
            )));
        }
        println!("epoch {epoch}: mean loss {:.5}", reading.sum / steps as f64);
    }
    Ok(())
}
