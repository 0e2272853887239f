//! Data-parallel training in a user's own program: one thread per device, each with a
//! replica of the model and a `ProcessGroup`, the `Trainer` splitting every global batch
//! over the ranks and summing gradients across them (NCCL on GPUs, host memory for CPU
//! ranks). The same program as one process per GPU: `ProcessGroup::from_env` under
//! `torchrun --nproc_per_node=N` (or RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set by hand).
//!
//! cargo run --release --example data_parallel [-- cuda:0,cuda:1 | all | cpu,cpu]

use kiln::dist::ProcessGroup;
use kiln::{DType, Device, Generator, Tensor};
use kiln_nn::data::DeviceData;
use kiln_nn::fit::{TrainOptions, Trainer};
use kiln_nn::init::Init;
use kiln_nn::optim::Sgd;
use kiln_nn::{Activation, Linear, Module, Sequential};

const FEATURES: usize = 32;
const CLASSES: usize = 8;

/// A toy task: the label is the argmax of the first eight features.
fn dataset(rows: usize, device: &Device) -> kiln::Result<DeviceData> {
    let mut rng = Generator::new(0);
    let x = Tensor::randn(
        [rows, FEATURES],
        0.0,
        1.0,
        DType::F32,
        &Device::Cpu,
        &mut rng,
    )?;
    let y = x.narrow(1, 0, CLASSES)?.argmax(1, false)?;
    Ok(DeviceData {
        x: x.to_device(device)?,
        y: y.to_device(device)?,
    })
}

fn main() -> kiln::Result<()> {
    let list = std::env::args().nth(1).unwrap_or_else(|| {
        if kiln::cuda::device_count() >= 2 {
            "all".into()
        } else {
            "cpu,cpu".into()
        }
    });
    let devices: Vec<Device> = if list == "all" {
        (0..kiln::cuda::device_count()).map(Device::Cuda).collect()
    } else {
        list.split(',')
            .map(Device::parse)
            .collect::<kiln::Result<_>>()?
    };
    let groups = ProcessGroup::for_threads(&devices)?;
    println!(
        "{} ranks over {}: {}",
        devices.len(),
        groups[0].backend_name(),
        list
    );
    let results: Vec<kiln::Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = groups
            .into_iter()
            .map(|group| {
                s.spawn(move || -> kiln::Result<()> {
                    let device = group.device();
                    let rank = group.rank();
                    // Replicas may start apart: `data_parallel` broadcasts rank 0's values.
                    let mut rng = Generator::new(rank as u64);
                    let model = Sequential::new()
                        .push(Linear::new(
                            FEATURES,
                            128,
                            true,
                            Init::KaimingUniform,
                            DType::F32,
                            &device,
                            &mut rng,
                        )?)
                        .push(Activation::Relu)
                        .push(Linear::new(
                            128,
                            CLASSES,
                            true,
                            Init::KaimingUniform,
                            DType::F32,
                            &device,
                            &mut rng,
                        )?);
                    let opt = Sgd::new(model.named_parameters(), 0.1, 0.9, false, 0.0)?;
                    // `batch` is the global batch: each rank takes 256 / world rows per step.
                    let options = TrainOptions {
                        batch: 256,
                        ..TrainOptions::default()
                    };
                    let mut trainer = Trainer::new(Box::new(model), Box::new(opt), options)?
                        .data_parallel(group, kiln_nn::parallel::DEFAULT_BUCKET_BYTES)?;
                    let data = dataset(256 * 40, &device)?;
                    for epoch in 1..=5 {
                        // Every rank shuffles with the same seed: the ranks split one order.
                        let mut shuffle = Generator::new(epoch);
                        let stats = trainer.train_epoch(&data, &mut shuffle, |_| {})?;
                        stats.check_finite(epoch as usize)?;
                        if rank == 0 {
                            println!(
                                "epoch {epoch}: loss {:.4}, train accuracy {:.1}% (all ranks)",
                                stats.loss,
                                100.0 * stats.accuracy
                            );
                        }
                    }
                    let acc = trainer.evaluate(&data)?;
                    println!(
                        "rank {rank} on {device}: accuracy {:.1}% with its replica",
                        100.0 * acc
                    );
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a rank panicked"))
            .collect()
    });
    for r in results {
        r?;
    }
    Ok(())
}
