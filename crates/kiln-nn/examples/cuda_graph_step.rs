//! A training step recorded once as a CUDA graph and replayed: first by hand with
//! `kiln::cuda::Graph`, then through `kiln_nn::fit::Trainer`, which does it for you.
//!
//! ```sh
//! cargo run --release --example cuda_graph_step
//! ```
//! Without a GPU it says so and trains eagerly on the CPU.

use kiln::{DType, Device, Generator, Result, Tensor};
use kiln_nn::data::DeviceData;
use kiln_nn::fit::{GraphMode, TrainOptions, Trainer};
use kiln_nn::init::Init;
use kiln_nn::optim::Sgd;
use kiln_nn::{Activation, Dropout, Linear, Module, Sequential};

fn mlp(device: &Device, rng: &mut Generator) -> Result<Sequential> {
    Ok(Sequential::new()
        .push(Linear::new(
            32,
            64,
            true,
            Init::KaimingUniform,
            DType::F32,
            device,
            rng,
        )?)
        .push(Activation::Relu) // fused into the first layer's GEMM on CUDA
        .push(Dropout::new(0.1, 7)?) // masks drawn on the device: replays draw new ones
        .push(Linear::new(
            64,
            4,
            true,
            Init::XavierUniform,
            DType::F32,
            device,
            rng,
        )?))
}

fn main() -> Result<()> {
    let device = if kiln::cuda::is_available() {
        Device::Cuda(0)
    } else {
        println!("no CUDA device: training eagerly on the CPU");
        Device::Cpu
    };
    let mut rng = Generator::new(0);
    // A toy task: the class is the argmax of the first four features.
    let x = Tensor::randn([4096, 32], 0.0, 1.0, DType::F32, &device, &mut rng)?;
    let y = x.narrow(1, 0, 4)?.argmax(1, false)?;
    let data = DeviceData { x, y };

    if device.is_cuda() {
        // 1. By hand: static inputs made before the capture, one eager run to compile the
        //    kernels and plan the GEMMs, then capture and replay with new inputs each time.
        let model = mlp(&device, &mut rng)?;
        let (xs, ys) = (
            data.x.narrow(0, 0, 256)?.copy()?,
            data.y.narrow(0, 0, 256)?.copy()?,
        );
        let forward = || -> Result<Tensor> {
            let hits = model.forward(&xs)?.argmax(1, false)?.eq(&ys)?;
            hits.to_dtype(DType::F32)?.sum(kiln::AllDims, false)
        };
        forward()?;
        let (graph, hits) = kiln::cuda::Graph::capture(&device, forward)?;
        println!("recorded {} kernels", graph.kernel_count());
        for b in 0..4 {
            xs.assign(&data.x.narrow(0, b * 256, 256)?)?;
            ys.assign(&data.y.narrow(0, b * 256, 256)?)?;
            graph.replay()?;
            println!(
                "batch {b}: {} of 256 right (untrained)",
                hits.to_scalar::<f32>()?
            );
        }
    }

    // 2. The trainer: with GraphMode::Auto the steps run as graph replays on CUDA after one
    //    eager warm-up step (`TrainOptions::steps_per_graph` steps per recorded graph, 16 by
    //    default), and eagerly elsewhere.
    let model = mlp(&device, &mut rng)?;
    let opt = Sgd::new(model.named_parameters(), 0.1, 0.9, false, 0.0)?;
    let options = TrainOptions {
        batch: 128,
        graph: GraphMode::Auto,
        ..TrainOptions::default()
    };
    let mut trainer = Trainer::new(Box::new(model), Box::new(opt), options)?;
    for epoch in 0..5 {
        trainer.set_lr(0.1 * 0.7f64.powi(epoch))?; // read from device memory by the replays
        let t = std::time::Instant::now();
        let stats = trainer.train_epoch(&data, &mut rng, |_| {})?;
        println!(
            "epoch {epoch}: loss {:.4}, accuracy {:.1}%, {} of {} steps replayed, {:.1} ms",
            stats.loss,
            100.0 * stats.accuracy,
            stats.graph_steps,
            stats.steps,
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    println!("test accuracy {:.1}%", 100.0 * trainer.evaluate(&data)?);
    Ok(())
}
