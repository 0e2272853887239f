//! A small convolutional network on Fashion-MNIST: conv → ReLU → max-pool twice, then two
//! linear layers, trained with SGD for one epoch (on a GPU when there is one), evaluated,
//! and saved as a safetensors checkpoint that loads into the same `torch.nn.Sequential`.
//!
//! ```sh
//! apt-get install -y dataset-fashion-mnist   # or pass the folder of the four IDX files
//! cargo run --release --example cnn [-- DATA_DIR]
//! ```

use kiln::{Conv2dOptions, DType, Device, Generator, Result};
use kiln_nn::data::{mean_std, DeviceData, Mnist, DEFAULT_DIR};
use kiln_nn::fit::{TrainOptions, Trainer};
use kiln_nn::init::Init;
use kiln_nn::optim::Sgd;
use kiln_nn::{
    checkpoint, Activation, Conv2d, Flatten, Linear, MaxPool2d, Module, Sequential, Unflatten,
};

fn main() -> Result<()> {
    let device = if kiln::cuda::is_available() {
        Device::Cuda(0)
    } else {
        Device::Cpu
    };
    let dir = std::env::args().nth(1).unwrap_or(DEFAULT_DIR.into());
    let data = Mnist::load(dir.as_ref())?;
    let (mean, std) = mean_std(&data.train.images)?;
    // The CPU trains on a fifth of the data to keep the example quick.
    let limit = device.is_cpu().then_some(12_000);
    let train = DeviceData::upload(&data.train, mean, std, DType::F32, &device, limit)?;
    let test = DeviceData::upload(&data.test, mean, std, DType::F32, &device, None)?;

    let mut rng = Generator::new(0);
    let (f32, init) = (DType::F32, Init::TorchDefault);
    let pad2 = Conv2dOptions::default().padding(2);
    let model = Sequential::new()
        .push(Unflatten {
            dim: 1,
            sizes: vec![1, 28, 28], // [n, 784] → [n, 1, 28, 28]
        })
        .push(Conv2d::new(
            1,
            32,
            [5, 5],
            pad2,
            true,
            init,
            f32,
            &device,
            &mut rng,
        )?)
        .push(Activation::Relu) // fused with the convolution
        .push(MaxPool2d::new(2))
        .push(Conv2d::new(
            32,
            64,
            [5, 5],
            pad2,
            true,
            init,
            f32,
            &device,
            &mut rng,
        )?)
        .push(Activation::Relu)
        .push(MaxPool2d::new(2))
        .push(Flatten)
        .push(Linear::new(
            64 * 7 * 7,
            128,
            true,
            init,
            f32,
            &device,
            &mut rng,
        )?)
        .push(Activation::Relu)
        .push(Linear::new(128, 10, true, init, f32, &device, &mut rng)?);
    let opt = Sgd::new(model.named_parameters(), 0.05, 0.9, false, 0.0)?;
    let options = TrainOptions {
        batch: 256,
        ..TrainOptions::default()
    };
    let mut trainer = Trainer::new(Box::new(model), Box::new(opt), options)?;
    let t = std::time::Instant::now();
    let stats = trainer.train_epoch(&train, &mut rng, |_| {})?;
    println!(
        "{device}: one epoch of {} images in {:.1} s, loss {:.3}, train accuracy {:.1}%",
        train.len(),
        t.elapsed().as_secs_f64(),
        stats.loss,
        100.0 * stats.accuracy
    );
    println!("test accuracy {:.2}%", 100.0 * trainer.evaluate(&test)?);
    let path = std::env::temp_dir().join("kiln-cnn.safetensors");
    let mut tensors = trainer.model().named_parameters();
    tensors.extend(trainer.model().named_buffers());
    checkpoint::save(&path, &tensors, &Default::default())?;
    println!("checkpoint: {}", path.display());
    Ok(())
}
