//! Long runs and faults: a soak test whose host RSS and device memory must stay flat after
//! the first epoch, and an out-of-memory error in the middle of a training step after
//! which the device trains a smaller model. The tests of this binary run one at a time
//! (memory is measured process-wide).

mod common;
use common::devices;
use kiln::{DType, Device, Generator, Tensor};
use kiln_nn::data::DeviceData;
use kiln_nn::fit::{TrainOptions, Trainer};
use kiln_nn::init::Init;
use kiln_nn::optim::Adam;
use kiln_nn::{Activation, Linear, Module, Sequential};

fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Resident set size of this process in bytes (Linux; `None` elsewhere).
fn rss() -> Option<usize> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: usize = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// `rows` rows of `features` random features; the label is the index of the largest of
/// the first ten.
fn synthetic(rows: usize, features: usize, device: &Device, seed: u64) -> DeviceData {
    let mut rng = Generator::new(seed);
    let x: Vec<f32> = (0..rows * features)
        .map(|_| rng.normal(0.0, 1.0) as f32)
        .collect();
    let y: Vec<i64> = x
        .chunks(features)
        .map(|r| (0..10).max_by(|&a, &b| r[a].total_cmp(&r[b])).unwrap() as i64)
        .collect();
    DeviceData {
        x: Tensor::from_vec(x, [rows, features], device).unwrap(),
        y: Tensor::from_vec(y, rows, device).unwrap(),
    }
}

fn mlp(sizes: &[usize], device: &Device, rng: &mut Generator) -> Sequential {
    let mut model = Sequential::new();
    for (i, w) in sizes.windows(2).enumerate() {
        model = model.push(
            Linear::new(
                w[0],
                w[1],
                true,
                Init::KaimingUniform,
                DType::F32,
                device,
                rng,
            )
            .unwrap(),
        );
        if i + 2 < sizes.len() {
            model = model.push(Activation::Relu);
        }
    }
    model
}

fn trainer(sizes: &[usize], batch: usize, device: &Device, rng: &mut Generator) -> Trainer {
    let model = mlp(sizes, device, rng);
    let opt = Adam::new(model.named_parameters(), 1e-3, 0.0, false).unwrap();
    let options = TrainOptions {
        batch,
        ..TrainOptions::default()
    };
    Trainer::new(Box::new(model), Box::new(opt), options).unwrap()
}

/// What is measured after each epoch: host RSS and, on CUDA, the caching allocator's
/// bytes in use, bytes reserved (in use + cached) and driver allocations.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Memory {
    rss: usize,
    in_use: usize,
    reserved: usize,
    driver_allocations: u64,
}

fn memory(device: &Device) -> Memory {
    let (in_use, reserved, driver_allocations) = match device {
        Device::Cuda(n) => {
            let s = kiln::cuda::memory_stats(*n).unwrap();
            (
                s.bytes_in_use,
                s.bytes_in_use + s.bytes_cached,
                s.driver_allocations,
            )
        }
        _ => (0, 0, 0),
    };
    Memory {
        rss: rss().unwrap_or(0),
        in_use,
        reserved,
        driver_allocations,
    }
}

/// Trains for `KILN_SOAK_EPOCHS` epochs (default 40) with evaluation each epoch: after the
/// first, host RSS may not grow by more than 4 MiB, and on CUDA the bytes in use, the bytes
/// reserved and the driver allocation count stay exactly where they were.
#[test]
fn soak_memory_stays_flat_after_the_first_epoch() {
    let _serial = serial();
    let epochs: usize = std::env::var("KILN_SOAK_EPOCHS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    for device in devices() {
        let train = synthetic(8192, 64, &device, 1);
        let test = synthetic(2048, 64, &device, 2);
        let mut rng = Generator::new(3);
        let mut t = trainer(&[64, 256, 10], 128, &device, &mut rng);
        let mut first = None;
        let mut worst_rss_growth = 0isize;
        let mut last_acc = 0.0;
        for epoch in 1..=epochs {
            let stats = t.train_epoch(&train, &mut rng, |_| {}).unwrap();
            stats.check_finite(epoch).unwrap();
            last_acc = t.evaluate(&test).unwrap();
            let m = memory(&device);
            let Some(base) = first else {
                first = Some(m);
                continue;
            };
            worst_rss_growth = worst_rss_growth.max(m.rss as isize - base.rss as isize);
            assert!(
                m.rss <= base.rss + (4 << 20),
                "{device}: host RSS grew from {} to {} bytes by epoch {epoch}",
                base.rss,
                m.rss
            );
            assert_eq!(
                (m.in_use, m.reserved, m.driver_allocations),
                (base.in_use, base.reserved, base.driver_allocations),
                "{device}: device memory moved at epoch {epoch} (in use, reserved, driver allocations)"
            );
        }
        let base = first.unwrap();
        println!(
            "soak {device}: {epochs} epochs, test accuracy {:.3}; after epoch 1: RSS {:.1} MiB \
             (largest growth later {:+.2} MiB), device in use {} B, reserved {} B, driver \
             allocations {} (unchanged through epoch {epochs})",
            last_acc,
            base.rss as f64 / (1 << 20) as f64,
            worst_rss_growth as f64 / (1 << 20) as f64,
            base.in_use,
            base.reserved,
            base.driver_allocations
        );
        assert!(
            last_acc > 0.5,
            "{device}: the soak run did not learn ({last_acc})"
        );
    }
}

/// A step whose activations do not fit on the GPU fails with `OutOfMemory` naming what was
/// requested and what is free; everything the failed step held is returned, and the same
/// device then trains a smaller model.
#[test]
fn out_of_memory_mid_step_is_an_error_and_the_device_recovers() {
    let _serial = serial();
    let Some(device) = devices().into_iter().find(|d| d.is_cuda()) else {
        eprintln!("skipped: no CUDA device");
        return;
    };
    let Device::Cuda(ordinal) = device else {
        unreachable!()
    };
    // Warm the device up, then size the batch so that one [batch, 8192] f32 activation
    // takes 60% of the free memory: the forward's first product fits, the step does not.
    drop(synthetic(256, 64, &device, 4));
    kiln::cuda::empty_cache(ordinal).unwrap();
    let before = kiln::cuda::memory_stats(ordinal).unwrap().bytes_in_use;
    let (free, _) = kiln::cuda::mem_info(ordinal).unwrap();
    let hidden = 8192;
    let batch = free * 6 / 10 / (hidden * 4);
    {
        let data = DeviceData {
            x: Tensor::ones([batch, 64], DType::F32, &device).unwrap(),
            y: Tensor::zeros(batch, DType::I64, &device).unwrap(),
        };
        let mut rng = Generator::new(5);
        let mut t = trainer(&[64, hidden, 10], batch, &device, &mut rng);
        match t.train_epoch(&data, &mut rng, |_| {}) {
            Err(kiln::Error::OutOfMemory {
                device: d,
                requested,
                free,
            }) => {
                assert_eq!(d, device);
                assert!(requested > free, "requested {requested}, free {free}");
                let msg = kiln::Error::OutOfMemory {
                    device: d,
                    requested,
                    free,
                }
                .to_string();
                assert!(msg.contains("requested") && msg.contains("free"), "{msg}");
                println!("batch {batch} x {hidden}: {msg}");
            }
            Err(other) => panic!("expected OutOfMemory, got {other}"),
            Ok(stats) => panic!("a batch of {batch} x {hidden} f32 fitted: {stats:?}"),
        }
    }
    kiln::cuda::synchronize(ordinal).unwrap();
    let after = kiln::cuda::memory_stats(ordinal).unwrap();
    assert_eq!(
        after.bytes_in_use, before,
        "the failed step's buffers are all returned"
    );
    assert!(after.oom_retries >= 1);
    // The next, smaller run trains normally.
    let train = synthetic(4096, 64, &device, 6);
    let mut rng = Generator::new(7);
    let mut t = trainer(&[64, 256, 10], 128, &device, &mut rng);
    for epoch in 1..=5 {
        t.train_epoch(&train, &mut rng, |_| {})
            .unwrap()
            .check_finite(epoch)
            .unwrap();
    }
    let acc = t.evaluate(&train).unwrap();
    assert!(
        acc > 0.5,
        "the run after the out-of-memory error learned ({acc})"
    );
}
