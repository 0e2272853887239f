//! Layers, losses, optimizers, checkpoints and the IDX reader against plain references.

mod common;
use common::devices;
use kiln::{AllDims, DType, Device, Generator, Tensor};
use kiln_nn::data::parse_idx;
use kiln_nn::init::Init;
use kiln_nn::optim::{Adam, Optimizer, Schedule, Sgd};
use kiln_nn::{checkpoint, loss, Activation, Dropout, Linear, Module, Sequential};
use std::collections::HashMap;

fn host(t: &Tensor) -> Vec<f64> {
    t.to_device(&Device::Cpu).unwrap().to_f64_vec().unwrap()
}

fn close(a: &[f64], b: &[f64], tol: f64, ctx: &str) {
    assert_eq!(a.len(), b.len(), "{ctx}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * (1.0 + y.abs()),
            "{ctx}: element {i}: {x} vs {y}"
        );
    }
}

#[test]
fn cross_entropy_matches_reference_and_its_gradient() {
    let mut rng = Generator::new(1);
    for device in devices() {
        for smoothing in [0.0, 0.1] {
            let (n, c) = (5, 4);
            let logits = Tensor::randn([n, c], 0.0, 2.0, DType::F64, &device, &mut rng).unwrap();
            let targets: Vec<i64> = (0..n).map(|_| rng.below(c) as i64).collect();
            let t = Tensor::from_vec(targets.clone(), n, &device).unwrap();
            let x = logits.var().unwrap();
            let l = loss::cross_entropy(&x, &t, smoothing).unwrap();
            let v = host(&logits);
            let mut want = 0.0;
            let mut grad = vec![0.0; n * c];
            for i in 0..n {
                let row = &v[i * c..(i + 1) * c];
                let m = row.iter().cloned().fold(f64::MIN, f64::max);
                let lse = m + row.iter().map(|r| (r - m).exp()).sum::<f64>().ln();
                for j in 0..c {
                    let q = (1.0 - smoothing) * (j as i64 == targets[i]) as u8 as f64
                        + smoothing / c as f64;
                    want -= q * (row[j] - lse) / n as f64;
                    grad[i * c + j] = ((row[j] - lse).exp() - q) / n as f64;
                }
            }
            close(&host(&l), &[want], 1e-12, "cross-entropy");
            let g = l.backward().unwrap();
            close(
                &host(g.get(&x).unwrap()),
                &grad,
                1e-12,
                "cross-entropy gradient",
            );
        }
        let big = Tensor::from_vec(vec![1000.0f32, -1000.0], [1, 2], &device).unwrap();
        let l = loss::cross_entropy(
            &big,
            &Tensor::from_vec(vec![1i64], 1, &device).unwrap(),
            0.0,
        )
        .unwrap();
        assert!(
            (host(&l)[0] - 2000.0).abs() < 1e-3,
            "stable for huge logits"
        );
    }
    let bad = Tensor::ones([2, 3], DType::F32, &Device::Cpu).unwrap();
    assert!(loss::cross_entropy(
        &bad,
        &Tensor::from_vec(vec![0i64], 1, &Device::Cpu).unwrap(),
        0.0
    )
    .is_err());
    assert!(loss::cross_entropy(
        &bad,
        &Tensor::from_vec(vec![0i64, 1], 2, &Device::Cpu).unwrap(),
        1.5
    )
    .is_err());
}

#[test]
fn mse_and_linear() {
    let d = Device::Cpu;
    let p = Tensor::from_vec(vec![1.0f64, 2.0, 4.0], 3, &d).unwrap();
    let t = Tensor::from_vec(vec![1.0f64, 0.0, 1.0], 3, &d).unwrap();
    assert_eq!(host(&loss::mse(&p, &t).unwrap()), vec![13.0 / 3.0]);
    let mut rng = Generator::new(2);
    let l = Linear::new(3, 2, true, Init::XavierUniform, DType::F64, &d, &mut rng).unwrap();
    let x = Tensor::randn([4, 3], 0.0, 1.0, DType::F64, &d, &mut rng).unwrap();
    let y = host(&l.forward(&x).unwrap());
    let (w, xv) = (host(&l.weight), host(&x));
    for i in 0..4 {
        for o in 0..2 {
            let want: f64 = (0..3).map(|k| xv[i * 3 + k] * w[o * 3 + k]).sum();
            assert!((y[i * 2 + o] - want).abs() < 1e-12);
        }
    }
    let names: Vec<String> = Sequential::new()
        .push(l)
        .push(Activation::Relu)
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, vec!["0.weight", "0.bias"]);
}

#[test]
fn initialisers_have_the_right_spread() {
    let d = Device::Cpu;
    let mut rng = Generator::new(3);
    let (fi, fo) = (400, 100);
    for (init, want_std) in [
        (Init::KaimingUniform, (2.0f64 / fi as f64).sqrt()),
        (Init::KaimingNormal, (2.0 / fi as f64).sqrt()),
        (Init::XavierUniform, (2.0 / (fi + fo) as f64).sqrt()),
        (Init::XavierNormal, (2.0 / (fi + fo) as f64).sqrt()),
    ] {
        let v = host(
            &init
                .tensor([fo, fi], fi, fo, DType::F64, &d, &mut rng)
                .unwrap(),
        );
        let std = (v.iter().map(|x| x * x).sum::<f64>() / v.len() as f64).sqrt();
        assert!(
            (std / want_std - 1.0).abs() < 0.03,
            "{init:?}: std {std} vs {want_std}"
        );
    }
}

#[test]
fn dropout_scales_in_training_and_is_identity_in_eval() {
    let d = Device::Cpu;
    let x = Tensor::ones(100_000, DType::F32, &d).unwrap();
    let mut drop = Dropout::new(0.25, 7).unwrap();
    let y = host(&drop.forward(&x).unwrap());
    let zeros = y.iter().filter(|&&v| v == 0.0).count() as f64 / y.len() as f64;
    assert!((zeros - 0.25).abs() < 0.01, "dropped {zeros}");
    assert!(y.iter().all(|&v| v == 0.0 || (v - 1.0 / 0.75).abs() < 1e-6));
    drop.set_training(false);
    assert_eq!(host(&drop.forward(&x).unwrap()), host(&x));
}

#[test]
fn optimizers_match_reference_updates() {
    for device in devices() {
        let p0 = [0.5f64, -1.0, 2.0];
        let grads_seq = [[0.1f64, -0.2, 0.3], [0.05, 0.4, -0.1], [-0.3, 0.1, 0.2]];
        for (nesterov, wd) in [(false, 0.0), (true, 0.01), (false, 0.1)] {
            let p = Tensor::from_vec(p0.to_vec(), 3, &device)
                .unwrap()
                .var()
                .unwrap();
            let mut opt = Sgd::new(vec![("p".into(), p.clone())], 0.1, 0.9, nesterov, wd).unwrap();
            let (mut rp, mut v) = (p0, [0.0f64; 3]);
            for (step, g) in grads_seq.iter().enumerate() {
                let gt = Tensor::from_vec(g.to_vec(), 3, &device).unwrap();
                let grads = p
                    .mul(&gt)
                    .unwrap()
                    .sum(AllDims, false)
                    .unwrap()
                    .backward()
                    .unwrap();
                opt.step(&grads).unwrap();
                for i in 0..3 {
                    let gi = g[i] + wd * rp[i];
                    v[i] = if step == 0 { gi } else { 0.9 * v[i] + gi };
                    rp[i] -= 0.1 * if nesterov { gi + 0.9 * v[i] } else { v[i] };
                }
                close(
                    &host(&p),
                    &rp,
                    1e-12,
                    &format!("sgd nesterov={nesterov} wd={wd} step {step} on {device}"),
                );
            }
        }
        for decoupled in [false, true] {
            let p = Tensor::from_vec(p0.to_vec(), 3, &device)
                .unwrap()
                .var()
                .unwrap();
            let mut opt = Adam::new(vec![("p".into(), p.clone())], 0.01, 0.1, decoupled).unwrap();
            let (mut rp, mut m, mut v) = (p0, [0.0f64; 3], [0.0f64; 3]);
            for (step, g) in grads_seq.iter().enumerate() {
                let gt = Tensor::from_vec(g.to_vec(), 3, &device).unwrap();
                let grads = p
                    .mul(&gt)
                    .unwrap()
                    .sum(AllDims, false)
                    .unwrap()
                    .backward()
                    .unwrap();
                opt.step(&grads).unwrap();
                let t = (step + 1) as i32;
                for i in 0..3 {
                    let mut gi = g[i];
                    if decoupled {
                        rp[i] *= 1.0 - 0.01 * 0.1;
                    } else {
                        gi += 0.1 * rp[i];
                    }
                    m[i] = 0.9 * m[i] + 0.1 * gi;
                    v[i] = 0.999 * v[i] + 0.001 * gi * gi;
                    let (mh, vh) = (
                        m[i] / (1.0 - 0.9f64.powi(t)),
                        v[i] / (1.0 - 0.999f64.powi(t)),
                    );
                    rp[i] -= 0.01 * mh / (vh.sqrt() + 1e-8);
                }
                close(
                    &host(&p),
                    &rp,
                    1e-10,
                    &format!("adam decoupled={decoupled} step {step} on {device}"),
                );
            }
            let state: HashMap<String, Tensor> = opt.state().unwrap().into_iter().collect();
            assert!(state.contains_key("p.exp_avg") && state.contains_key("step"));
            let mut fresh = Adam::new(vec![("p".into(), p.clone())], 0.01, 0.1, decoupled).unwrap();
            fresh.load_state(&state).unwrap();
            let restored: HashMap<String, Tensor> = fresh.state().unwrap().into_iter().collect();
            assert_eq!(restored.len(), state.len());
            for (k, t) in &state {
                assert_eq!(host(&restored[k]), host(t), "{k} restored in place");
            }
            assert_eq!(host(&restored["step"]), [3.0]);
        }
    }
}

/// Nonsense optimizer arguments are refused when the optimizer is made.
#[test]
fn optimizer_arguments_are_checked() {
    let p = Tensor::zeros(2, DType::F32, &Device::Cpu)
        .unwrap()
        .var()
        .unwrap();
    let params = || vec![("p".to_string(), p.clone())];
    for (lr, mu) in [
        (0.0, 0.9),
        (f64::NAN, 0.9),
        (-1.0, 0.0),
        (0.1, 1.5),
        (0.1, f64::NAN),
    ] {
        let err = Sgd::new(params(), lr, mu, false, 0.0)
            .err()
            .expect("refused");
        assert!(err.to_string().contains("SGD"), "{err}");
    }
    assert!(Adam::new(params(), f64::INFINITY, 0.0, false).is_err());
    assert!(Adam::with_betas(params(), 0.1, (1.0, 0.9), 1e-8, 0.0, false).is_err());
    assert!(Adam::with_betas(params(), 0.1, (0.9, 0.9), 0.0, 0.0, true).is_err());
}

#[test]
fn schedules() {
    assert_eq!(Schedule::Constant.lr(0.1, 7), 0.1);
    assert!(
        (Schedule::Step {
            every: 3,
            gamma: 0.5
        }
        .lr(1.0, 7)
            - 0.25)
            .abs()
            < 1e-15
    );
    let c = Schedule::Cosine {
        total: 4,
        min_lr: 0.0,
    };
    assert_eq!(c.lr(1.0, 0), 1.0);
    assert!(c.lr(1.0, 4).abs() < 1e-15);
    for (bad, what) in [
        (
            Schedule::Step {
                every: 0,
                gamma: 0.5,
            },
            "every = 0",
        ),
        (
            Schedule::Step {
                every: 2,
                gamma: f64::NAN,
            },
            "gamma = NaN",
        ),
        (
            Schedule::Step {
                every: 2,
                gamma: 0.0,
            },
            "gamma = 0",
        ),
        (
            Schedule::Cosine {
                total: 0,
                min_lr: 0.0,
            },
            "total = 0",
        ),
        (
            Schedule::Cosine {
                total: 5,
                min_lr: -1.0,
            },
            "min_lr = -1",
        ),
    ] {
        let e = bad.validate().expect_err(what).to_string();
        assert!(e.contains(what), "{what}: {e}");
    }
    assert!(c.validate().is_ok() && Schedule::Constant.validate().is_ok());
}

/// Batch sizes outside [1, rows] are refused by the loaders and the trainer, naming the
/// size and the range.
#[test]
fn data_loaders_refuse_bad_batch_sizes() {
    use kiln_nn::data::DeviceData;
    let data = DeviceData {
        x: Tensor::zeros([10, 3], DType::F32, &Device::Cpu).unwrap(),
        y: Tensor::zeros(10, DType::I64, &Device::Cpu).unwrap(),
    };
    let mut rng = Generator::new(0);
    for batch in [0, 11] {
        let e = data
            .shuffled_batches(batch, &mut rng)
            .err()
            .expect("refused")
            .to_string();
        assert!(
            e.contains(&format!("batch = {batch}")) && e.contains("[1, 10]"),
            "{e}"
        );
    }
    assert!(data.batches(0).is_err());
    assert_eq!(data.batches(4).unwrap().len(), 3);
    let model = Linear::new(
        3,
        2,
        true,
        Init::XavierUniform,
        DType::F32,
        &Device::Cpu,
        &mut rng,
    )
    .unwrap();
    let opt = Sgd::new(model.named_parameters(), 0.1, 0.0, false, 0.0).unwrap();
    let options = kiln_nn::fit::TrainOptions {
        batch: 11,
        ..Default::default()
    };
    let mut t = kiln_nn::fit::Trainer::new(Box::new(model), Box::new(opt), options).unwrap();
    let e = t
        .train_epoch(&data, &mut rng, |_| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("Trainer::train_epoch: batch = 11"), "{e}");
}

#[test]
fn checkpoints_round_trip_every_dtype_atomically() {
    let dir = std::env::temp_dir().join(format!("kiln-ckpt-{}", std::process::id()));
    let path = dir.join("model.safetensors");
    let mut rng = Generator::new(4);
    let tensors: Vec<(String, Tensor)> = DType::ALL
        .iter()
        .enumerate()
        .map(|(i, &dt)| {
            let t = Tensor::rand([3, 2 + i], 0.0, 9.0, dt, &Device::Cpu, &mut rng)
                .unwrap()
                .t()
                .unwrap();
            (format!("layer{i}.{dt}"), t)
        })
        .collect();
    let meta = HashMap::from([("epoch".to_string(), "3".to_string())]);
    checkpoint::save(&path, &tensors, &meta).unwrap();
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .collect();
    assert_eq!(files.len(), 1, "no temporary file left behind: {files:?}");
    let (back, meta_back) = checkpoint::load(&path, &Device::Cpu).unwrap();
    assert_eq!(meta_back.get("epoch").map(String::as_str), Some("3"));
    assert_eq!(back.len(), tensors.len());
    let back: HashMap<String, Tensor> = back.into_iter().collect();
    for (n1, a) in &tensors {
        let b = &back[n1];
        assert_eq!((a.dims(), a.dtype()), (b.dims(), b.dtype()));
        assert_eq!(a.to_bytes().unwrap(), b.to_bytes().unwrap(), "{n1}");
    }
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    assert!(checkpoint::load(&path, &Device::Cpu).is_err(), "truncated");
    std::fs::write(&path, b"not a checkpoint").unwrap();
    assert!(checkpoint::load(&path, &Device::Cpu).is_err(), "garbage");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn idx_reader_accepts_valid_files_and_rejects_malformed_ones() {
    let mut ok = vec![0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 3];
    ok.extend([1u8, 2, 3, 4, 5, 6]);
    let idx = parse_idx(&ok, "ok").unwrap();
    assert_eq!(
        (idx.dims.clone(), idx.data.clone()),
        (vec![2, 3], vec![1, 2, 3, 4, 5, 6])
    );
    let mut gz = Vec::new();
    {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(&mut gz, flate2::Compression::fast());
        e.write_all(&ok).unwrap();
    }
    assert_eq!(parse_idx(&gz, "gz").unwrap().data, idx.data);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("bad magic", vec![1, 0, 8, 1, 0, 0, 0, 1, 7]),
        ("float type", vec![0, 0, 0x0d, 1, 0, 0, 0, 1, 0, 0, 0, 0]),
        ("truncated header", vec![0, 0, 8, 3, 0, 0]),
        ("truncated data", ok[..ok.len() - 1].to_vec()),
        ("trailing data", [ok.clone(), vec![9]].concat()),
        ("corrupt gzip", [gz[..12].to_vec(), vec![0xff; 20]].concat()),
        ("zero dims", vec![0, 0, 8, 0]),
    ];
    for (what, bytes) in cases {
        // The error names the file it was given (here, the case's name) and never panics.
        let err = parse_idx(&bytes, what).expect_err(what);
        assert!(err.to_string().contains(what), "{what}: {err}");
    }
}

/// A NaN planted in one training row makes its step's loss non-finite (and every later
/// one, through the weights): the epoch names exactly that step, read once at the epoch's
/// end, eager and (on CUDA) from graph replays; a clean epoch names none.
#[test]
fn trainer_names_the_first_non_finite_step() {
    use kiln_nn::data::DeviceData;
    use kiln_nn::fit::{GraphMode, TrainOptions, Trainer};
    let (n, batch, seed) = (96usize, 8usize, 5u64);
    for device in devices() {
        // One step per graph, and groups of four (steps 1-4 and 5-8 in two recorded
        // graphs, then 9-11 one at a time).
        for (graph, steps_per_graph) in [
            (GraphMode::Off, 1),
            (GraphMode::Auto, 1),
            (GraphMode::Auto, 4),
        ] {
            for poisoned in [None, Some(90usize)] {
                let mut rng = Generator::new(1);
                let mut xs: Vec<f32> = (0..n * 4).map(|_| rng.normal(0.0, 1.0) as f32).collect();
                if let Some(row) = poisoned {
                    xs[row * 4 + 2] = f32::NAN;
                }
                let ys: Vec<i64> = (0..n).map(|i| (xs[i * 4] > xs[i * 4 + 1]) as i64).collect();
                let data = DeviceData {
                    x: Tensor::from_vec(xs, [n, 4], &device).unwrap(),
                    y: Tensor::from_vec(ys, n, &device).unwrap(),
                };
                let model = Linear::new(
                    4,
                    2,
                    true,
                    Init::XavierUniform,
                    DType::F32,
                    &device,
                    &mut rng,
                )
                .unwrap();
                let opt = Sgd::new(model.named_parameters(), 0.1, 0.0, false, 0.0).unwrap();
                let options = TrainOptions {
                    batch,
                    graph,
                    steps_per_graph,
                    ..TrainOptions::default()
                };
                let mut trainer = Trainer::new(Box::new(model), Box::new(opt), options).unwrap();
                // The step the poisoned row falls in, from the same shuffle as the trainer's.
                let mut shuffle = Generator::new(seed);
                let mut perm: Vec<i64> = (0..n as i64).collect();
                shuffle.shuffle(&mut perm);
                let want = poisoned
                    .map(|row| perm.iter().position(|&r| r == row as i64).unwrap() / batch + 1);
                // After the eager warm-up step and the recording: a replayed step on CUDA.
                assert!(
                    want.is_none_or(|s| s >= 3),
                    "pick another row: step {want:?}"
                );
                let mut shuffle = Generator::new(seed);
                let stats = trainer.train_epoch(&data, &mut shuffle, |_| {}).unwrap();
                let ctx = format!(
                    "{device} {graph:?} {steps_per_graph} per graph, poisoned row {poisoned:?}"
                );
                assert_eq!(stats.diverged_at_step, want, "{ctx}: {stats:?}");
                #[cfg(feature = "cuda")]
                if device.is_cuda() && graph == GraphMode::Auto {
                    // A second epoch, every step replayed: a copy of the ids and a replay per
                    // graph, and a few launches for the epoch's sums.
                    let before = kiln::cuda::launch_count();
                    let again = trainer
                        .train_epoch(&data, &mut Generator::new(seed + 1), |_| {})
                        .unwrap();
                    let launches = (kiln::cuda::launch_count() - before) as usize;
                    assert_eq!(again.graph_steps, n / batch, "{ctx}");
                    let graphs = (n / batch).div_ceil(steps_per_graph);
                    assert!(
                        launches <= 2 * graphs + 12,
                        "{ctx}: {launches} launches for {graphs} graphs"
                    );
                }
                let check = stats.check_finite(1);
                match want {
                    None => assert!(check.is_ok() && stats.loss.is_finite(), "{ctx}"),
                    Some(s) => {
                        let e = check.unwrap_err().to_string();
                        assert!(
                            e.contains(&format!("epoch 1, step {s} of {}", n / batch)),
                            "{ctx}: {e}"
                        );
                    }
                }
            }
        }
    }
}
