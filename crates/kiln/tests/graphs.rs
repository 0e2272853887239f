//! CUDA graphs: capture and replay against an f64 reference with fresh inputs each replay,
//! the graph's private memory, the refusals of whatever cannot be recorded (each leaves the
//! device usable), errors raised inside a replay, and the in-place and scheduled primitives a
//! recorded training step uses. GPU tests skip without CUDA unless `KILN_REQUIRE_CUDA=1`;
//! the CPU-side refusals run everywhere.
#![cfg(feature = "cuda")]

mod common;
use common::*;
use kiln::cuda::{self, Graph};
use kiln::op::{BinaryOp, UpdateRule};
use kiln::{AllDims, DType, Device, Error, Generator, ParamUpdate, Tensor};

/// One test at a time, the CPU-only ones too (they also run on CUDA): a capture takes the
/// device's stream, and an op another thread began just before the capture started (a GEMM
/// plan timing its candidates, say) would land in it.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn gpu() -> Option<Device> {
    if cuda::is_available() {
        return Some(Device::Cuda(0));
    }
    if std::env::var("KILN_REQUIRE_CUDA").is_ok_and(|v| v == "1") {
        panic!(
            "KILN_REQUIRE_CUDA=1 but CUDA is unavailable: {:?}",
            cuda::unavailable_reason()
        );
    }
    eprintln!("skipped: no CUDA device ({:?})", cuda::unavailable_reason());
    None
}

fn randn(shape: &[usize], dev: &Device, rng: &mut Generator) -> Tensor {
    Tensor::randn(shape, 0.0, 1.0, DType::F32, dev, rng).unwrap()
}

fn is_capture_error(e: &Error, op: &str) -> bool {
    matches!(e, Error::GraphCapture { op: o, .. } if o.contains(op))
}

#[test]
fn capturing_on_the_cpu_is_a_clear_error() {
    let x = Tensor::ones(3, DType::F32, &Device::Cpu).unwrap();
    let err = Graph::capture(&Device::Cpu, || x.relu())
        .err()
        .expect("must fail");
    let msg = err.to_string();
    assert!(msg.contains("CUDA device") && msg.contains("cpu"), "{msg}");
}

/// `relu(x·w + b)` recorded once, replayed with new x each time: every replay matches the
/// f64 reference of that replay's input, and the output tensor stays the same buffer.
#[test]
fn replays_recompute_from_fresh_inputs() {
    let Some(dev) = gpu() else { return };
    let _s = serial();
    let mut rng = Generator::new(1);
    let x = randn(&[33, 17], &dev, &mut rng);
    let w = randn(&[17, 9], &dev, &mut rng);
    let b = randn(&[9], &dev, &mut rng);
    // A transposed view as an input too: graphs take any layout.
    let wt = randn(&[9, 17], &dev, &mut rng);
    let f = |x: &Tensor| -> kiln::Result<(Tensor, Tensor)> {
        Ok((
            x.matmul(&w)?.add(&b)?.relu()?,
            x.matmul(&wt.t()?)?.sum(AllDims, false)?,
        ))
    };
    f(&x).unwrap(); // warm-up: kernels and GEMM plans
    let before = cuda::launch_count();
    let (graph, (y, s)) = Graph::capture(&dev, || f(&x)).unwrap();
    assert_eq!(
        cuda::launch_count(),
        before,
        "nothing is launched while capturing"
    );
    assert!(
        graph.kernel_count() >= 3,
        "{} kernels",
        graph.kernel_count()
    );
    assert!(graph.pool_bytes() >= 33 * 9 * 4);
    let (wv, bv, wtv) = (values(&w), values(&b), values(&wt));
    for round in 0..4 {
        let fresh = randn(&[33, 17], &dev, &mut rng);
        x.assign(&fresh).unwrap();
        graph.replay().unwrap();
        let xv = values(&fresh);
        let mut want = vec![0f64; 33 * 9];
        let mut want_s = 0f64;
        for i in 0..33 {
            for j in 0..9 {
                let mut acc = bv[j];
                let mut acc_t = 0.0;
                for k in 0..17 {
                    acc += xv[i * 17 + k] * wv[k * 9 + j];
                    acc_t += xv[i * 17 + k] * wtv[j * 17 + k];
                }
                want[i * 9 + j] = acc.max(0.0);
                want_s += acc_t;
            }
        }
        assert_close(&format!("replay {round}"), &values(&y), &want, 1e-4);
        assert_norm_close(&format!("replay {round} sum"), &values(&s), &[want_s], 1e-4);
    }
    // Outputs outlive the graph, holding the last replay's values.
    let last = values(&y);
    drop(graph);
    assert_eq!(values(&y), last);
}

/// Every way of asking the host to wait, or of running an op that would not be recorded,
/// is an error naming the op; the capture is discarded and the device keeps working.
#[test]
fn unrecordable_ops_are_refused_and_the_device_stays_usable() {
    let Some(dev) = gpu() else { return };
    let _s = serial();
    let mut rng = Generator::new(2);
    let x = randn(&[64], &dev, &mut rng);
    x.relu().unwrap().neg().unwrap();
    let cpu = Tensor::ones(4, DType::F32, &Device::Cpu).unwrap();
    type Attempt<'a> = (&'a str, Box<dyn Fn() -> kiln::Result<()> + 'a>);
    let attempts: Vec<Attempt> = vec![
        (
            "device-to-host copy",
            Box::new(|| x.relu()?.to_vec::<f32>().map(drop)),
        ),
        (
            "host-to-device copy",
            Box::new(|| Tensor::from_vec(vec![1f32; 8], 8, &dev).map(drop)),
        ),
        ("synchronize", Box::new(|| cuda::synchronize(0))),
        (
            "time_region",
            Box::new(|| cuda::time_region(0, || Ok(())).map(drop)),
        ),
        ("empty_cache", Box::new(|| cuda::empty_cache(0))),
        // A CPU op would run once now instead of on every replay.
        ("neg", Box::new(|| cpu.neg().map(drop))),
        // Kernels never used in this process (u32 fill, then abs): compiling cannot be
        // recorded.
        (
            "_u32",
            Box::new(|| {
                Tensor::zeros(4, DType::U32, &dev)?.abs()?;
                Ok(())
            }),
        ),
    ];
    for (op, attempt) in &attempts {
        let err = Graph::capture(&dev, || {
            x.relu()?;
            attempt()
        })
        .err()
        .unwrap_or_else(|| panic!("{op}: the capture must fail"));
        assert!(is_capture_error(&err, op), "{op}: {err}");
        assert!(err.to_string().contains("cuda:0"), "{op}: {err}");
        // Swallowing the error does not rescue the capture.
        let err = Graph::capture(&dev, || {
            let _ = attempt();
            x.relu()
        })
        .err()
        .unwrap_or_else(|| panic!("{op}: a swallowed refusal must still fail the capture"));
        assert!(is_capture_error(&err, op), "{op}: {err}");
        // The device works, eagerly and in a new capture.
        assert_eq!(
            values(&x.relu().unwrap()),
            values(&x).iter().map(|v| v.max(0.0)).collect::<Vec<_>>()
        );
        let (g, y) = Graph::capture(&dev, || x.neg()).unwrap();
        g.replay().unwrap();
        assert_eq!(
            values(&y),
            values(&x).iter().map(|v| -v).collect::<Vec<_>>()
        );
    }
    // Ops from another thread on the capturing device are refused too.
    let err = std::thread::scope(|scope| {
        Graph::capture(&dev, || {
            let other = scope.spawn(|| x.relu().map(drop)).join().unwrap();
            assert!(
                matches!(other, Err(Error::GraphCapture { .. })),
                "{other:?}"
            );
            x.relu()
        })
        .map(drop)
    });
    assert!(
        err.is_ok(),
        "the capturing thread's own ops record: {err:?}"
    );
    // Nested captures are refused.
    let err = Graph::capture(&dev, || Graph::capture(&dev, || x.relu()).map(drop))
        .err()
        .expect("nested");
    assert!(err.to_string().contains("nest"), "{err}");
}

/// A graph's memory is its own while it lives (eager work never gets it), and goes back to
/// the device's pool when it and its outputs are dropped.
#[test]
fn graph_memory_is_private_and_returned() {
    let Some(dev) = gpu() else { return };
    let _s = serial();
    let mut rng = Generator::new(3);
    let x = randn(&[1 << 16], &dev, &mut rng);
    x.sqr().unwrap().relu().unwrap();
    let (graph, y) = Graph::capture(&dev, || x.sqr()?.relu()).unwrap();
    graph.replay().unwrap();
    let want = values(&y);
    // Eager work of the same size while the graph lives must not get the graph's buffers.
    for _ in 0..4 {
        let t = x.neg().unwrap().abs().unwrap();
        graph.replay().unwrap();
        assert_eq!(
            values(&t),
            values(&x).iter().map(|v| v.abs()).collect::<Vec<_>>()
        );
    }
    assert_eq!(values(&y), want);
    let held = cuda::memory_stats(0).unwrap().bytes_in_use;
    drop(graph);
    drop(y);
    let after = cuda::memory_stats(0).unwrap();
    assert!(
        after.bytes_in_use < held,
        "in use {} -> {}",
        held,
        after.bytes_in_use
    );
}

/// An out-of-range index met by a replay is reported at the next read, as eagerly.
#[test]
fn index_errors_inside_a_replay_are_reported() {
    let Some(dev) = gpu() else { return };
    let _s = serial();
    let mut rng = Generator::new(4);
    let table = randn(&[10, 3], &dev, &mut rng);
    let ids = Tensor::from_vec(vec![1i64, 2, 3], 3, &dev).unwrap();
    table
        .index_select(&ids, 0)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let (graph, rows) = Graph::capture(&dev, || table.index_select(&ids, 0)).unwrap();
    graph.replay().unwrap();
    assert_eq!(values(&rows), values(&table)[3..12].to_vec());
    ids.assign(&Tensor::from_vec(vec![0i64, 99, 1], 3, &dev).unwrap())
        .unwrap();
    graph.replay().unwrap();
    let err = rows.to_vec::<f32>().expect_err("index 99 of 10");
    assert!(err.to_string().contains("out of range"), "{err}");
    ids.assign(&Tensor::from_vec(vec![0i64, 9, 1], 3, &dev).unwrap())
        .unwrap();
    graph.replay().unwrap();
    assert_eq!(values(&rows)[3..6], values(&table)[27..30]);
}

/// `binary_assign` in place on every device and layout against an f64 reference.
#[test]
fn in_place_binary_ops_match_the_reference() {
    let _s = serial();
    let mut rng = Generator::new(5);
    for dev in devices() {
        for dtype in [DType::F32, DType::F64, DType::BF16] {
            if !supports(&dev, dtype) {
                continue;
            }
            let base = randn(&[6, 8], &Device::Cpu, &mut rng)
                .to_dtype(dtype)
                .unwrap();
            let target_full = base.to_device(&dev).unwrap();
            // A transposed, narrowed target and a broadcast right-hand side.
            let target = target_full.t().unwrap().narrow(0, 1, 5).unwrap();
            let rhs = randn(&[6], &dev, &mut rng).to_dtype(dtype).unwrap();
            let before = values(&target);
            let rv = values(&rhs);
            target.binary_assign(&rhs, BinaryOp::Mul).unwrap();
            let want: Vec<f64> = before
                .iter()
                .enumerate()
                .map(|(i, v)| round_to(v * rv[i % 6], dtype))
                .collect();
            assert_close(
                &format!("{dev} {dtype}"),
                &values(&target),
                &want,
                tol(dtype),
            );
            // Untouched elements stay.
            let full = values(&target_full);
            let bv = values(&base);
            for i in 0..6 {
                assert_eq!(full[i * 8], bv[i * 8], "{dev} {dtype} column 0");
            }
            // Self as the right-hand side is read before it is written.
            let t = Tensor::from_vec(vec![1f32, 2., 3.], 3, &dev).unwrap();
            t.add_assign(&t).unwrap();
            assert_eq!(t.to_vec::<f32>().unwrap(), [2., 4., 6.]);
            let err = t
                .broadcast_as([2, 3])
                .unwrap()
                .add_assign(&t.broadcast_as([2, 3]).unwrap());
            assert!(err.is_err());
        }
    }
}

/// Updates that read `[lr, step]` from device memory equal updates with the same values
/// given by value, and follow a change of the schedule inside a recorded step.
#[test]
fn scheduled_updates_follow_device_memory() {
    let _s = serial();
    let mut rng = Generator::new(6);
    for dev in devices() {
        if !supports(&dev, DType::F64) {
            continue; // schedules are f64 buffers; wgpu's optimizers keep them on the host
        }
        let rules = [
            UpdateRule::Sgd {
                lr: 0.1,
                momentum: 0.9,
                nesterov: true,
                weight_decay: 0.01,
            },
            UpdateRule::Adam {
                lr: 0.01,
                beta1: 0.9,
                beta2: 0.99,
                eps: 1e-8,
                weight_decay: 0.1,
                decoupled: true,
                step: 3,
            },
        ];
        for rule in rules {
            let p0 = randn(&[5, 7], &dev, &mut rng);
            let g = randn(&[5, 7], &dev, &mut rng);
            let states: Vec<Tensor> = (0..rule.state_len())
                .map(|_| randn(&[5, 7], &dev, &mut rng).abs().unwrap())
                .collect();
            let run = |scheduled: bool, lr: f64, step: f64| {
                let p = p0.copy().unwrap();
                let st: Vec<Tensor> = states.iter().map(|s| s.copy().unwrap()).collect();
                let refs: Vec<&Tensor> = st.iter().collect();
                let u = [ParamUpdate {
                    param: &p,
                    grad: &g,
                    state: &refs,
                }];
                if scheduled {
                    let sched = Tensor::from_vec(vec![lr, step], 2, &dev).unwrap();
                    Tensor::apply_update_group_scheduled(&u, rule, &sched).unwrap();
                } else {
                    Tensor::apply_update_group(&u, rule.with_schedule(lr, step)).unwrap();
                }
                values(&p)
            };
            for (lr, step) in [(0.05, 1.0), (0.2, 7.0)] {
                assert_close(
                    &format!("{dev} {} lr {lr} step {step}", rule.name()),
                    &run(true, lr, step),
                    &run(false, lr, step),
                    1e-6,
                );
            }
        }
        // A schedule that is not f64 [2] is refused.
        let p = Tensor::zeros(3, DType::F32, &dev).unwrap();
        let bad = Tensor::zeros(3, DType::F64, &dev).unwrap();
        let u = [ParamUpdate {
            param: &p,
            grad: &p.copy().unwrap(),
            state: &[],
        }];
        let sgd = UpdateRule::Sgd {
            lr: 0.1,
            momentum: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        };
        let err = Tensor::apply_update_group_scheduled(&u, sgd, &bad).unwrap_err();
        assert!(err.to_string().contains("[lr, step]"), "{err}");
    }
    // Inside a graph: the learning rate is read at replay time.
    let Some(dev) = gpu() else { return };
    let p = Tensor::from_vec(vec![1f32, 2., 3.], 3, &dev).unwrap();
    let g = Tensor::from_vec(vec![1f32, 1., 1.], 3, &dev).unwrap();
    let sched = Tensor::from_vec(vec![0.5f64, 0.0], 2, &dev).unwrap();
    let sgd = UpdateRule::Sgd {
        lr: 99.0,
        momentum: 0.0,
        nesterov: false,
        weight_decay: 0.0,
    };
    let step = || {
        Tensor::apply_update_group_scheduled(
            &[ParamUpdate {
                param: &p,
                grad: &g,
                state: &[],
            }],
            sgd,
            &sched,
        )
    };
    step().unwrap(); // [0.5, 1.5, 2.5]
    let (graph, ()) = Graph::capture(&dev, step).unwrap();
    graph.replay().unwrap(); // [0, 1, 2]
    sched
        .assign(&Tensor::from_vec(vec![0.25f64, 0.0], 2, &dev).unwrap())
        .unwrap();
    graph.replay().unwrap(); // [-0.25, 0.75, 1.75]
    assert_eq!(p.to_vec::<f32>().unwrap(), [-0.25, 0.75, 1.75]);
}

/// `backward_with` seeds the backward pass with a given gradient: the same gradients as
/// `(y · g).sum().backward()`.
#[test]
fn backward_with_matches_a_weighted_sum() {
    let _s = serial();
    let mut rng = Generator::new(7);
    for dev in devices() {
        let (dt, tol) = if supports(&dev, DType::F64) {
            (DType::F64, 1e-12)
        } else {
            (DType::F32, 1e-6)
        };
        let w = randn(&[4, 3], &dev, &mut rng)
            .to_dtype(dt)
            .unwrap()
            .var()
            .unwrap();
        let x = randn(&[5, 4], &dev, &mut rng).to_dtype(dt).unwrap();
        let g = randn(&[5, 3], &dev, &mut rng).to_dtype(dt).unwrap();
        let y = x.matmul(&w).unwrap().tanh().unwrap();
        let a = y.backward_with(&g).unwrap();
        let b = y
            .mul(&g)
            .unwrap()
            .sum(AllDims, false)
            .unwrap()
            .backward()
            .unwrap();
        assert_close(
            &format!("{dev}"),
            &values(a.get(&w).unwrap()),
            &values(b.get(&w).unwrap()),
            tol,
        );
        assert!(y.backward_with(&g.narrow(0, 0, 2).unwrap()).is_err());
    }
}

/// Dropout inside a graph: the mask's step lives in device memory, so every replay draws the
/// next mask (the CPU's mask of that step, bit for bit in its keep pattern) without
/// re-capturing, and the stream's step counts the replays; the gradient uses the same mask.
#[test]
fn dropout_draws_a_new_mask_on_every_replay() {
    let Some(dev) = gpu() else { return };
    let _s = serial();
    let mut rng = Generator::new(8);
    let x = randn(&[19, 23], &dev, &mut rng).var().unwrap();
    let stream = kiln::DropoutStream::new(5, &dev).unwrap();
    let f = || -> kiln::Result<(Tensor, Tensor)> {
        let y = x.dropout(0.5, &stream)?;
        let grads = y.sum(AllDims, false)?.backward()?;
        Ok((y, grads.get(&x).expect("x has a gradient").clone()))
    };
    f().unwrap(); // warm-up (step 0): kernels compiled
    let (graph, (y, gx)) = Graph::capture(&dev, f).unwrap();
    let names = graph.kernel_names();
    assert_eq!(names.len(), graph.kernel_count());
    assert!(
        names.iter().any(|n| n == "dropout_mask_f32"),
        "the graph's kernels by name: {names:?}"
    );
    // The capture recorded step 1's draw; replays draw steps 1, 2, 3.
    let xv = values(&x);
    for step in 1..4u64 {
        graph.replay().unwrap();
        let mask = values(
            &kiln::DropoutStream::at_step(5, step, &Device::Cpu)
                .unwrap()
                .mask([19, 23], DType::F32, 0.5)
                .unwrap(),
        );
        assert_eq!(
            values(&gx),
            mask,
            "replay of step {step}: the gradient is the mask"
        );
        let want: Vec<f64> = xv.iter().zip(&mask).map(|(a, m)| a * m).collect();
        assert_close(&format!("replay of step {step}"), &values(&y), &want, 1e-6);
    }
    assert_eq!(
        stream.step().unwrap(),
        4,
        "one step per replay, none re-captured"
    );
}
