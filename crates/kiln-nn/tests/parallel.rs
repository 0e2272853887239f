//! Data-parallel training computes what one device computes with the global batch: after
//! every step each rank's parameters equal the single-device run's within f32 tolerance,
//! and the ranks' parameters are identical. Checked on groups of CPU threads (host-memory
//! exchange), on one GPU through a one-rank NCCL communicator (the recorded CUDA-graph step
//! included) and on two GPUs when there are two.

mod common;
use common::devices;
use kiln::dist::{ProcessGroup, ReduceOp};
use kiln::{DType, Device, Generator, Tensor};
use kiln_nn::data::DeviceData;
use kiln_nn::fit::{TrainOptions, Trainer};
use kiln_nn::init::Init;
use kiln_nn::optim::{Optimizer, Sgd};
use kiln_nn::parallel::DataParallel;
use kiln_nn::{Activation, Linear, Module, Sequential};

const FEATURES: usize = 16;
const CLASSES: usize = 4;
const BATCH: usize = 48;

/// The tests of this binary run one at a time: a CUDA graph capture on a device refuses ops
/// from other threads (the trainer test records its step while another test would train).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn device_sets() -> Vec<Vec<Device>> {
    let mut sets = vec![vec![Device::Cpu; 2], vec![Device::Cpu; 3]];
    if devices().contains(&Device::Cuda(0)) && kiln::dist::nccl_status().starts_with("NCCL ") {
        sets.push(vec![Device::Cuda(0)]);
        if kiln::cuda::device_count() >= 2 {
            sets.push(vec![Device::Cuda(0), Device::Cuda(1)]);
        }
    }
    sets
}

fn mlp(device: &Device, seed: u64) -> Sequential {
    let mut rng = Generator::new(seed);
    let lin = |i, o, rng: &mut Generator| {
        Linear::new(i, o, true, Init::KaimingUniform, DType::F32, device, rng).unwrap()
    };
    let first = lin(FEATURES, 32, &mut rng);
    let second = lin(32, CLASSES, &mut rng);
    Sequential::new()
        .push(first)
        .push(Activation::Relu)
        .push(second)
}

/// Random features; the label is the argmax of the first `CLASSES` features.
fn synthetic(rows: usize, device: &Device) -> DeviceData {
    let mut rng = Generator::new(5);
    let x: Vec<f32> = (0..rows * FEATURES)
        .map(|_| rng.normal(0.0, 1.0) as f32)
        .collect();
    let y: Vec<i64> = x
        .chunks(FEATURES)
        .map(|r| (0..CLASSES).max_by(|&a, &b| r[a].total_cmp(&r[b])).unwrap() as i64)
        .collect();
    DeviceData {
        x: Tensor::from_vec(x, [rows, FEATURES], device).unwrap(),
        y: Tensor::from_vec(y, rows, device).unwrap(),
    }
}

fn params(model: &dyn Module) -> Vec<Vec<f32>> {
    model
        .named_parameters()
        .iter()
        .map(|(_, p)| p.to_vec::<f32>().unwrap())
        .collect()
}

fn assert_params_close(ctx: &str, got: &[Vec<f32>], want: &[Vec<f32>]) {
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        for (i, (a, b)) in g.iter().zip(w).enumerate() {
            let d = (a - b).abs() as f64;
            assert!(
                d <= 1e-5 + 1e-4 * b.abs() as f64,
                "{ctx}: parameter {k} element {i}: {a} vs {b}"
            );
        }
    }
}

/// One SGD step on `x`/`y` with the loss scaled by the global batch; through `dp` when
/// given.
fn step(model: &Sequential, opt: &mut Sgd, dp: Option<&DataParallel>, x: &Tensor, y: &Tensor) {
    let logits = model.forward(x).unwrap();
    let rows = logits
        .detach()
        .softmax_cross_entropy(y, 0.0, 1.0 / BATCH as f64)
        .unwrap();
    let grads = match dp {
        Some(dp) => dp.backward(&logits, &rows.grad).unwrap(),
        None => logits.backward_with(&rows.grad).unwrap(),
    };
    opt.step(&grads).unwrap();
}

#[test]
fn every_step_equals_the_single_device_step() {
    let _serial = serial();
    const STEPS: usize = 6;
    for set in device_sets() {
        let world = set.len();
        let data = synthetic(BATCH * STEPS, &Device::Cpu);
        // The reference: one device, the global batch, rank 0's initial parameters.
        let reference = mlp(&set[0], 100);
        let mut opt = Sgd::new(reference.named_parameters(), 0.1, 0.9, false, 1e-4).unwrap();
        let mut want = Vec::new();
        for s in 0..STEPS {
            let x = data
                .x
                .narrow(0, s * BATCH, BATCH)
                .unwrap()
                .to_device(&set[0])
                .unwrap();
            let y = data
                .y
                .narrow(0, s * BATCH, BATCH)
                .unwrap()
                .to_device(&set[0])
                .unwrap();
            step(&reference, &mut opt, None, &x, &y);
            want.push(params(&reference));
        }
        let groups = ProcessGroup::for_threads(&set).unwrap();
        let per_rank: Vec<Vec<Vec<Vec<f32>>>> = std::thread::scope(|s| {
            let hs: Vec<_> = groups
                .into_iter()
                .map(|g| {
                    let data = &data;
                    s.spawn(move || {
                        let mut g = g;
                        // A failure on one rank fails the other within a minute, not 300 s.
                        g.set_timeout(std::time::Duration::from_secs(60));
                        let (rank, dev) = (g.rank(), g.device());
                        // Different initial values per rank: the broadcast makes them equal.
                        let model = mlp(&dev, 100 + rank as u64);
                        let dp = DataParallel::new(g, &model, ReduceOp::Sum, 1000).unwrap();
                        assert!(dp.bucket_sizes().len() > 1, "several buckets are exercised");
                        let mut opt =
                            Sgd::new(model.named_parameters(), 0.1, 0.9, false, 1e-4).unwrap();
                        let local = BATCH / world;
                        let mut seen = Vec::new();
                        for s in 0..STEPS {
                            let rows = s * BATCH + rank * local;
                            let x = data
                                .x
                                .narrow(0, rows, local)
                                .unwrap()
                                .to_device(&dev)
                                .unwrap();
                            let y = data
                                .y
                                .narrow(0, rows, local)
                                .unwrap()
                                .to_device(&dev)
                                .unwrap();
                            step(&model, &mut opt, Some(&dp), &x, &y);
                            seen.push(params(&model));
                        }
                        seen
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for s in 0..STEPS {
            for (r, seen) in per_rank.iter().enumerate() {
                let ctx = format!("{set:?} step {} rank {r}", s + 1);
                assert_params_close(&ctx, &seen[s], &want[s]);
                assert_eq!(seen[s], per_rank[0][s], "{ctx}: ranks 0 and {r} differ");
            }
        }
    }
}

#[test]
fn data_parallel_trainer_matches_the_single_device_trainer() {
    let _serial = serial();
    for set in device_sets() {
        let world = set.len();
        let options = TrainOptions {
            batch: BATCH,
            ..TrainOptions::default()
        };
        let make = |dev: &Device, seed: u64| {
            let model = mlp(dev, seed);
            let opt = Sgd::new(model.named_parameters(), 0.1, 0.9, false, 0.0).unwrap();
            Trainer::new(Box::new(model), Box::new(opt), options).unwrap()
        };
        let epochs = 3;
        let rows = BATCH * 5 + 7;
        // A row near a decision boundary may flip with the last bits of the parameters.
        let acc_tol = 2.0 / rows as f64;
        let run = |trainer: &mut Trainer, dev: &Device| {
            let data = synthetic(rows, dev);
            let mut stats = Vec::new();
            for e in 0..epochs {
                let mut shuffle = Generator::new(40 + e);
                stats.push(trainer.train_epoch(&data, &mut shuffle, |_| {}).unwrap());
            }
            (
                stats,
                params(trainer.model()),
                trainer.evaluate(&data).unwrap(),
            )
        };
        let mut reference = make(&set[0], 7);
        let (want_stats, want_params, want_acc) = run(&mut reference, &set[0]);
        let groups = ProcessGroup::for_threads(&set).unwrap();
        let results: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = groups
                .into_iter()
                .map(|g| {
                    let make = &make;
                    let run = &run;
                    s.spawn(move || {
                        let mut g = g;
                        g.set_timeout(std::time::Duration::from_secs(60));
                        let dev = g.device();
                        let mut t = make(&dev, 7 + g.rank() as u64)
                            .data_parallel(g, 4096)
                            .unwrap();
                        run(&mut t, &dev)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (r, (stats, p, acc)) in results.iter().enumerate() {
            let ctx = format!("{set:?} ({world} ranks) rank {r}");
            assert_params_close(&ctx, p, &want_params);
            assert_eq!(p, &results[0].1, "{ctx}: parameters differ from rank 0's");
            for (s, w) in stats.iter().zip(&want_stats) {
                assert_eq!(s.steps, w.steps, "{ctx}");
                assert!(
                    (s.loss - w.loss).abs() < 1e-5,
                    "{ctx}: loss {} vs {}",
                    s.loss,
                    w.loss
                );
                assert!(
                    (s.accuracy - w.accuracy).abs() <= acc_tol,
                    "{ctx}: {s:?} vs {w:?}"
                );
            }
            assert!(
                (acc - want_acc).abs() <= acc_tol,
                "{ctx}: eval {acc} vs {want_acc}"
            );
        }
    }
}

#[test]
fn a_global_batch_that_does_not_split_is_refused() {
    let _serial = serial();
    let groups = ProcessGroup::for_threads(&[Device::Cpu; 3]).unwrap();
    let model = mlp(&Device::Cpu, 1);
    let opt = Sgd::new(model.named_parameters(), 0.1, 0.0, false, 0.0).unwrap();
    let options = TrainOptions {
        batch: 50,
        ..TrainOptions::default()
    };
    let t = Trainer::new(Box::new(model), Box::new(opt), options).unwrap();
    let e = t
        .data_parallel(groups.into_iter().next().unwrap(), 1 << 20)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("50 rows does not split evenly over 3 ranks"),
        "{e}"
    );
}

/// Each rank's batch norm sees only its slice of the batch, so its running statistics drift
/// from the other ranks'; at the end of each epoch the trainer makes them rank 0's (what
/// PyTorch's DDP replicas hold), so evaluation and checkpoints agree on every rank.
#[test]
fn batch_norm_running_statistics_agree_across_ranks_after_an_epoch() {
    let _serial = serial();
    for world in [2, 3] {
        let groups = ProcessGroup::for_threads(&vec![Device::Cpu; world]).unwrap();
        let buffers: Vec<Vec<Vec<f64>>> = std::thread::scope(|s| {
            let hs: Vec<_> = groups
                .into_iter()
                .map(|g| {
                    s.spawn(move || {
                        let dev = g.device();
                        let mut rng = Generator::new(3);
                        let model = Sequential::new()
                            .push(kiln_nn::Unflatten {
                                dim: 1,
                                sizes: vec![4, 2, 2],
                            })
                            .push(kiln_nn::BatchNorm2d::new(4, DType::F32, &dev).unwrap())
                            .push(kiln_nn::Flatten)
                            .push(
                                Linear::new(
                                    FEATURES,
                                    CLASSES,
                                    true,
                                    Init::KaimingUniform,
                                    DType::F32,
                                    &dev,
                                    &mut rng,
                                )
                                .unwrap(),
                            );
                        let opt =
                            Sgd::new(model.named_parameters(), 0.05, 0.0, false, 0.0).unwrap();
                        let options = TrainOptions {
                            batch: BATCH,
                            ..TrainOptions::default()
                        };
                        let mut t = Trainer::new(Box::new(model), Box::new(opt), options)
                            .unwrap()
                            .data_parallel(g, 4096)
                            .unwrap();
                        let data = synthetic(BATCH * 3, &dev);
                        t.train_epoch(&data, &mut Generator::new(9), |_| {})
                            .unwrap();
                        t.model()
                            .named_buffers()
                            .iter()
                            .map(|(_, b)| b.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap())
                            .collect()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        // The statistics moved away from their initial values (the check is not vacuous)...
        assert!(
            buffers[0][0].iter().any(|&m| m != 0.0),
            "running_mean never updated"
        );
        // ...and every rank holds rank 0's.
        for (r, b) in buffers.iter().enumerate() {
            assert_eq!(
                b, &buffers[0],
                "{world} ranks: rank {r}'s buffers differ from rank 0's"
            );
        }
    }
}
