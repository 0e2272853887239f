//! The fused training primitives (softmax cross-entropy, optimizer updates) against plain
//! f64 references, on every float dtype, layout variant and device.

mod common;

use common::*;
use kiln::op::UpdateRule;
use kiln::{DType, Device, Generator, ParamUpdate, Tensor};

/// This binary's tests run one at a time: CUDA's out-of-range flag is per device, so one
/// test's bad label would be reported to whichever test reads next.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Per-row (loss, grad row, hit) in f64 for logits `x` `[n, c]` (row-major values).
fn reference_ce(
    x: &[f64],
    c: usize,
    labels: &[usize],
    eps: f64,
    scale: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut loss, mut grad, mut hits) = (vec![], vec![], vec![]);
    for (i, row) in x.chunks(c).enumerate() {
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = row.iter().map(|v| (v - m).exp()).sum();
        let lse = m + sum.ln();
        let q = |j: usize| (1.0 - eps) * f64::from(u8::from(j == labels[i])) + eps / c as f64;
        loss.push(scale * (lse - (0..c).map(|j| q(j) * row[j]).sum::<f64>()));
        grad.extend((0..c).map(|j| scale * ((row[j] - lse).exp() - q(j))));
        let first_max = row.iter().position(|&v| v == m).unwrap();
        hits.push(f64::from(u8::from(first_max == labels[i])));
    }
    (loss, grad, hits)
}

#[test]
fn cross_entropy_matches_reference_on_every_layout() {
    let _serial = serial();
    let mut rng = Generator::new(11);
    for device in devices() {
        for dtype in FLOATS {
            if !supports(&device, dtype) {
                continue;
            }
            // 10 classes (the MLP), 37 (a warp and a tail), 300 (several warp sweeps).
            for (n, c) in [(7, 10), (5, 37), (3, 300)] {
                for variant in [
                    Variant::Contiguous,
                    Variant::Transposed,
                    Variant::Narrowed,
                    Variant::Stepped,
                ] {
                    for eps in [0.0, 0.1] {
                        let x = input(&mut rng, &[n, c], dtype, &device, variant, Range::Signed);
                        let labels: Vec<usize> = (0..n).map(|_| rng.below(c)).collect();
                        let ids: Vec<f64> = labels.iter().map(|&l| l as f64).collect();
                        for tdtype in [DType::I64, DType::U32] {
                            if !supports(&device, tdtype) {
                                continue;
                            }
                            let t = tensor_of(&ids, &[n], tdtype, &device);
                            let r = x.t.softmax_cross_entropy(&t, eps, 0.25).unwrap();
                            let (loss, grad, hits) = reference_ce(&x.vals, c, &labels, eps, 0.25);
                            let ctx = format!("cross_entropy {dtype} {device} {variant:?} {n}x{c} eps {eps} {tdtype}");
                            assert_eq!(r.loss.dims(), [n]);
                            assert_eq!(r.grad.dims(), [n, c]);
                            assert_eq!(r.correct.dtype(), DType::F32);
                            let t = tol(dtype).max(1e-12) * 4.0;
                            assert_close(&format!("{ctx} loss"), &values(&r.loss), &loss, t);
                            assert_close(&format!("{ctx} grad"), &values(&r.grad), &grad, t);
                            // 16-bit rounding can tie two maxima the f64 values separate.
                            if matches!(dtype, DType::F32 | DType::F64) {
                                assert_eq!(values(&r.correct), hits, "{ctx} hits");
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn cross_entropy_hit_takes_the_first_maximum() {
    let _serial = serial();
    for device in devices() {
        let x = Tensor::from_vec(vec![1f32, 3., 3., 0., 2., 2.], [2, 3], &device).unwrap();
        let t = Tensor::from_vec(vec![2i64, 1], 2, &device).unwrap();
        let r = x.softmax_cross_entropy(&t, 0.0, 1.0).unwrap();
        assert_eq!(r.correct.to_vec::<f32>().unwrap(), [0., 1.], "{device}");
    }
}

#[test]
fn cross_entropy_accumulate_equals_the_separate_running_sum_ops() {
    let _serial = serial();
    let mut rng = Generator::new(41);
    for device in devices() {
        for dtype in FLOATS {
            if !supports(&device, dtype) {
                continue;
            }
            let (n, c) = (37, 11);
            // Logits large enough that one row's loss overflows f16 (a non-finite sum).
            let x = Tensor::randn([n, c], 0.0, 4.0, dtype, &device, &mut rng).unwrap();
            let t: Vec<i64> = (0..n).map(|i| ((i * 7) % c) as i64).collect();
            let t = Tensor::from_vec(t, n, &device).unwrap();
            let zeros = || Tensor::zeros(n, DType::F32, &device).unwrap();
            let fused = [zeros(), zeros(), zeros()];
            let separate = [zeros(), zeros(), zeros()];
            for step in 0..3 {
                let x = x.mul_scalar(1.0 + step as f64).unwrap();
                let sums = kiln::EpochSums {
                    loss: &fused[0],
                    finite_steps: &fused[1],
                    hits: &fused[2],
                };
                let got = x
                    .softmax_cross_entropy_accumulate(&t, 0.1, 0.5, sums)
                    .unwrap();
                let want = x.softmax_cross_entropy(&t, 0.1, 0.5).unwrap();
                let (loss, finite, hits) = (&separate[0], &separate[1], &separate[2]);
                loss.add_assign(&want.loss.to_dtype(DType::F32).unwrap())
                    .unwrap();
                finite.count_finite_assign(loss).unwrap();
                hits.add_assign(&want.correct).unwrap();
                let bits = |t: &Tensor| -> Vec<u32> {
                    let v = t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
                    v.iter().map(|f| f.to_bits()).collect()
                };
                let ctx = format!("{dtype} step {step} on {device}");
                assert_eq!(bits(&got.loss), bits(&want.loss), "rows' loss, {ctx}");
                assert_eq!(bits(&got.correct), bits(&want.correct), "hits, {ctx}");
                for (name, (f, s)) in ["loss sum", "finite steps", "hit sum"]
                    .iter()
                    .zip(fused.iter().zip(&separate))
                {
                    assert_eq!(bits(f), bits(s), "{name}, {ctx}");
                }
            }
            assert!(
                fused[2]
                    .sum(kiln::AllDims, false)
                    .unwrap()
                    .to_vec::<f32>()
                    .unwrap()[0]
                    > 0.0,
                "some hits, {dtype} on {device}"
            );
        }
        // Sums that are not f32 [N] take the separate ops (and say what is wrong).
        let x = Tensor::randn([4, 3], 0.0, 1.0, DType::F32, &device, &mut rng).unwrap();
        let t = Tensor::from_vec(vec![0i64, 1, 2, 0], 4, &device).unwrap();
        let f64_sum = Tensor::zeros(4, DType::F64, &device);
        if let Ok(bad) = f64_sum {
            let ok = Tensor::zeros(4, DType::F32, &device).unwrap();
            let ok2 = Tensor::zeros(4, DType::F32, &device).unwrap();
            let sums = kiln::EpochSums {
                loss: &bad,
                finite_steps: &ok,
                hits: &ok2,
            };
            let e = x.softmax_cross_entropy_accumulate(&t, 0.0, 1.0, sums);
            assert!(e.is_err(), "an f64 loss sum is refused on {device}");
        }
    }
}

#[test]
fn cross_entropy_rejects_bad_input() {
    let _serial = serial();
    for device in devices() {
        let x = Tensor::ones([2, 3], DType::F32, &device).unwrap();
        let t = Tensor::from_vec(vec![0i64, 1], 2, &device).unwrap();
        let msg = |r: kiln::Result<_>| match r {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.to_string(),
        };
        assert!(
            msg(x.softmax_cross_entropy(&t.narrow(0, 0, 1).unwrap(), 0.0, 1.0)).contains("[2, 3]")
        );
        assert!(msg(x.softmax_cross_entropy(&t, 1.0, 1.0)).contains("smoothing"));
        let xi = Tensor::ones([2, 3], DType::I64, &device).unwrap();
        assert!(msg(xi.softmax_cross_entropy(&t, 0.0, 1.0)).contains("cross_entropy"));
        let tf = Tensor::ones(2, DType::F32, &device).unwrap();
        assert!(msg(x.softmax_cross_entropy(&tf, 0.0, 1.0)).contains("targets"));
        // A label out of range: an error now (CPU) or at the next read (CUDA).
        let bad = Tensor::from_vec(vec![0i64, 3], 2, &device).unwrap();
        let r = x
            .softmax_cross_entropy(&bad, 0.0, 1.0)
            .and_then(|r| r.loss.to_vec::<f32>());
        assert!(r.is_err(), "{device}: label 3 of 3 classes was accepted");
        // The device is usable afterwards.
        assert!(x
            .softmax_cross_entropy(&t, 0.0, 1.0)
            .unwrap()
            .loss
            .to_vec::<f32>()
            .is_ok());
    }
    if devices().contains(&Device::Cuda(0)) {
        let x = Tensor::ones([2, 3], DType::F32, &Device::Cpu).unwrap();
        let t = Tensor::from_vec(vec![0i64, 1], 2, &Device::Cuda(0)).unwrap();
        assert!(
            format!("{}", x.softmax_cross_entropy(&t, 0.0, 1.0).err().unwrap()).contains("cuda")
        );
    }
}

/// One step of `rule` in f64 on (p, g, state), as torch.optim computes it.
fn reference_step(p: &mut [f64], g: &[f64], state: &mut [Vec<f64>], rule: UpdateRule) {
    match rule {
        UpdateRule::Sgd {
            lr,
            momentum,
            nesterov,
            weight_decay,
        } => {
            for i in 0..p.len() {
                let mut gi = g[i] + weight_decay * p[i];
                if momentum != 0.0 {
                    let v = momentum * state[0][i] + gi;
                    state[0][i] = v;
                    gi = if nesterov { gi + momentum * v } else { v };
                }
                p[i] -= lr * gi;
            }
        }
        UpdateRule::Adam {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            decoupled,
            step,
        } => {
            let bc1 = 1.0 - beta1.powi(step as i32);
            let bc2 = 1.0 - beta2.powi(step as i32);
            for i in 0..p.len() {
                let mut gi = g[i];
                if decoupled {
                    p[i] *= 1.0 - lr * weight_decay;
                } else {
                    gi += weight_decay * p[i];
                }
                state[0][i] = beta1 * state[0][i] + (1.0 - beta1) * gi;
                state[1][i] = beta2 * state[1][i] + (1.0 - beta2) * gi * gi;
                p[i] -= lr / bc1 * state[0][i] / ((state[1][i] / bc2).sqrt() + eps);
            }
        }
    }
}

fn rules(step: u64) -> Vec<UpdateRule> {
    let sgd = |momentum, nesterov, weight_decay| UpdateRule::Sgd {
        lr: 0.1,
        momentum,
        nesterov,
        weight_decay,
    };
    let adam = |weight_decay, decoupled| UpdateRule::Adam {
        lr: 0.01,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay,
        decoupled,
        step,
    };
    vec![
        sgd(0.0, false, 0.0),
        sgd(0.9, false, 0.0),
        sgd(0.9, true, 0.01),
        adam(0.0, false),
        adam(0.1, false),
        adam(0.1, true),
    ]
}

/// Every rule over three steps, on parameters of 15–25 elements and of 33K (split between
/// threads on the CPU), with gradients as any view.
#[test]
fn optimizer_updates_match_reference_over_three_steps() {
    let _serial = serial();
    let mut rng = Generator::new(12);
    for device in devices() {
        for dtype in FLOATS {
            if !supports(&device, dtype) {
                continue;
            }
            for (k, variant) in [Variant::Contiguous, Variant::Transposed, Variant::Stepped]
                .into_iter()
                .enumerate()
            {
                // The large parameter is split between threads on the CPU.
                for (r, shape) in
                    (0..rules(1).len()).flat_map(|r| [(r, [3 + k, 5]), (r, [257, 129 + k])])
                {
                    let n = shape[0] * shape[1];
                    let mut p_ref = random_vals(&mut rng, n, dtype, Range::Signed);
                    let p = tensor_of(&p_ref, &shape, dtype, &device);
                    let len = rules(1)[r].state_len();
                    let mut s_ref = vec![vec![0.0; n]; len];
                    let states: Vec<Tensor> = (0..len).map(|_| p.zeros_like().unwrap()).collect();
                    for step in 1..=3 {
                        let rule = rules(step)[r];
                        // Gradients come as any view.
                        let g = input(&mut rng, &shape, dtype, &device, variant, Range::Signed);
                        let refs: Vec<&Tensor> = states.iter().collect();
                        p.apply_update(&g.t, &refs, rule).unwrap();
                        reference_step(&mut p_ref, &g.vals, &mut s_ref, rule);
                        let ctx = format!("{rule:?} {dtype} {device} {variant:?} step {step}");
                        let t = tol(dtype).max(1e-12) * 8.0;
                        assert_close(&ctx, &values(&p), &p_ref, t);
                        for (i, (s, st)) in s_ref.iter_mut().zip(&states).enumerate() {
                            assert_close(&format!("{ctx} state {i}"), &values(st), s, t);
                            // Go on from the stored values: 16-bit rounding must not compound.
                            *s = values(st);
                        }
                        p_ref = values(&p);
                    }
                }
            }
        }
    }
}

/// Eleven parameters of varied sizes (one empty, one at an offset in its storage) in one
/// grouped update: on CUDA two launches of up to eight, each parameter its own slice.
#[test]
fn grouped_updates_match_reference() {
    let _serial = serial();
    let mut rng = Generator::new(13);
    for device in devices() {
        for dtype in [DType::F32, DType::F64, DType::BF16] {
            if !supports(&device, dtype) {
                continue;
            }
            for r in 0..rules(1).len() {
                let sizes = [1, 7, 300, 0, 33, 4096, 5, 64, 129, 2, 1000];
                let mut p_ref: Vec<Vec<f64>> = sizes
                    .iter()
                    .map(|&n| random_vals(&mut rng, n, dtype, Range::Signed))
                    .collect();
                let params: Vec<Tensor> = p_ref
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        if i == 2 {
                            // Rows 1.. of a [n + 1] storage: a contiguous view at offset 1.
                            let mut padded = vec![0.5];
                            padded.extend(v);
                            let t = tensor_of(&padded, &[v.len() + 1], dtype, &device);
                            t.narrow(0, 1, v.len()).unwrap()
                        } else {
                            tensor_of(v, &[v.len()], dtype, &device)
                        }
                    })
                    .collect();
                let len = rules(1)[r].state_len();
                let states: Vec<Vec<Tensor>> = params
                    .iter()
                    .map(|p| (0..len).map(|_| p.zeros_like().unwrap()).collect())
                    .collect();
                let mut s_ref: Vec<Vec<Vec<f64>>> =
                    sizes.iter().map(|&n| vec![vec![0.0; n]; len]).collect();
                for step in 1..=2 {
                    let rule = rules(step)[r];
                    let grads: Vec<(Tensor, Vec<f64>)> = sizes
                        .iter()
                        .map(|&n| {
                            let v = random_vals(&mut rng, n, dtype, Range::Signed);
                            (tensor_of(&v, &[n], dtype, &device), v)
                        })
                        .collect();
                    let refs: Vec<Vec<&Tensor>> =
                        states.iter().map(|s| s.iter().collect()).collect();
                    let updates: Vec<ParamUpdate> = params
                        .iter()
                        .zip(&grads)
                        .zip(&refs)
                        .map(|((param, (grad, _)), state)| ParamUpdate { param, grad, state })
                        .collect();
                    Tensor::apply_update_group(&updates, rule).unwrap();
                    for i in 0..sizes.len() {
                        reference_step(&mut p_ref[i], &grads[i].1, &mut s_ref[i], rule);
                        let ctx = format!("group {rule:?} {dtype} {device} param {i} step {step}");
                        let t = tol(dtype).max(1e-12) * 8.0;
                        assert_close(&ctx, &values(&params[i]), &p_ref[i], t);
                        for (s, st) in s_ref[i].iter_mut().zip(&states[i]) {
                            assert_close(&format!("{ctx} state"), &values(st), s, t);
                            *s = values(st);
                        }
                        p_ref[i] = values(&params[i]);
                    }
                }
            }
        }
    }
}

/// A float dtype other than f32 that `device` holds.
fn other_float(device: &Device) -> DType {
    if supports(device, DType::F64) {
        DType::F64
    } else {
        DType::F16
    }
}

#[test]
fn grouped_update_rejects_shared_or_mixed_operands() {
    let _serial = serial();
    for device in devices() {
        let p = Tensor::ones([4], DType::F32, &device).unwrap();
        let q = Tensor::ones([4], other_float(&device), &device).unwrap();
        let g = p.ones_like().unwrap();
        let sgd = rules(1)[0];
        let one = |param| ParamUpdate {
            param,
            grad: &g,
            state: &[],
        };
        let err = Tensor::apply_update_group(&[one(&p), one(&p)], sgd).unwrap_err();
        assert!(err.to_string().contains("share"), "{err}");
        let gq = q.ones_like().unwrap();
        let mixed = [
            one(&p),
            ParamUpdate {
                param: &q,
                grad: &gq,
                state: &[],
            },
        ];
        let err = Tensor::apply_update_group(&mixed, sgd).unwrap_err();
        assert!(err.to_string().contains("sgd_update"), "{err}");
        // Nothing was written by the rejected groups.
        assert_eq!(p.to_vec::<f32>().unwrap(), [1.0; 4]);
    }
}

#[test]
fn optimizer_update_rejects_bad_operands() {
    let _serial = serial();
    for device in devices() {
        let p = Tensor::ones([2, 3], DType::F32, &device).unwrap();
        let g = p.ones_like().unwrap();
        let sgd = rules(1)[1];
        let msg = |r: kiln::Result<()>| match r {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.to_string(),
        };
        assert!(msg(p.apply_update(&g, &[], sgd)).contains("state"));
        assert!(msg(p.apply_update(&g, &[&p], sgd)).contains("share"));
        let v = p.zeros_like().unwrap();
        assert!(msg(p
            .t()
            .unwrap()
            .apply_update(&g.t().unwrap(), &[&v.t().unwrap()], sgd))
        .contains("contiguous"));
        let other = other_float(&device);
        assert!(
            msg(p.apply_update(&g.to_dtype(other).unwrap(), &[&v], sgd)).contains(other.as_str())
        );
        assert!(msg(p.apply_update(&g.narrow(1, 0, 2).unwrap(), &[&v], sgd)).contains("[2, 2]"));
        let pi = Tensor::ones([2, 3], DType::I64, &device).unwrap();
        assert!(
            msg(pi.apply_update(&pi.ones_like().unwrap(), &[&pi.zeros_like().unwrap()], sgd))
                .contains("i64")
        );
        // A gradient that is a view of the parameter itself works (copied first).
        let q = Tensor::from_vec(vec![1f32, 2.], 2, &device).unwrap();
        q.apply_update(&q, &[], rules(1)[0]).unwrap();
        assert_eq!(q.to_vec::<f32>().unwrap(), [0.9, 1.8]);
    }
}

/// The fused element-wise ops and the matrix product with an activation epilogue against
/// the same computation in f64 on the CPU (unfused), on every device and float dtype, with
/// transposed and broadcast operands.
#[test]
fn fused_activation_ops_match_the_unfused_f64_reference() {
    use kiln::op::EpilogueActivation as Act;
    let _serial = serial();
    let mut rng = Generator::new(31);
    let f64_cpu = |t: &Tensor| {
        t.to_device(&Device::Cpu)
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap()
    };
    for device in devices() {
        for dtype in FLOATS {
            if !supports(&device, dtype) {
                continue;
            }
            let rand = |shape: &[usize], rng: &mut Generator| {
                Tensor::randn(shape, 0.0, 1.0, DType::F32, &device, rng)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap()
            };
            // x is a transposed view; the right-hand sides broadcast.
            let x = rand(&[9, 7], &mut rng).t().unwrap();
            let row = rand(&[9], &mut rng);
            let col = rand(&[7, 1], &mut rng);
            let ctx = |op: &str| format!("{op} {dtype} on {device}");
            let (xr, rr, cr) = (f64_cpu(&x), f64_cpu(&row), f64_cpu(&col));
            let t = tol(dtype) * 4.0;
            assert_close(
                &ctx("add_relu"),
                &values(&x.add_relu(&row).unwrap()),
                &values(&xr.add(&rr).unwrap().relu().unwrap()),
                t,
            );
            assert_close(
                &ctx("mul_relu"),
                &values(&x.mul_relu(&col).unwrap()),
                &values(&xr.mul(&cr).unwrap().relu().unwrap()),
                t,
            );
            assert_close(
                &ctx("affine"),
                &values(&x.affine(&row, &col).unwrap()),
                &values(&xr.mul(&rr).unwrap().add(&cr).unwrap()),
                t,
            );
            // n = 16 takes cuBLASLt's epilogues on CUDA (GELU needs n % 8 == 0); n = 5 the
            // unfused path.
            for n in [16, 5] {
                let a = rand(&[33, 24], &mut rng);
                let w = rand(&[n, 24], &mut rng).t().unwrap();
                let b = rand(&[n], &mut rng);
                let z = f64_cpu(&a).matmul_bias(&f64_cpu(&w), &f64_cpu(&b)).unwrap();
                for (act, want) in [
                    (Act::Relu, z.relu().unwrap()),
                    (Act::GeluTanh, z.gelu_tanh().unwrap()),
                ] {
                    let got = a.matmul_bias_act(&w, &b, act).unwrap();
                    // Products accumulate 24 terms in the dtype's GEMM precision.
                    // (cuBLASLt's f64 GELU epilogue differs from kiln's by ~3e-11.)
                    let gt = match dtype {
                        DType::F32 => 1e-4,
                        DType::F64 => 1e-9,
                        _ => t * 4.0,
                    };
                    assert_norm_close(
                        &ctx(&format!("matmul_bias_act {act:?} n={n}")),
                        &values(&got),
                        &values(&want),
                        gt,
                    );
                }
            }
        }
    }
}

/// `count_finite_assign` adds 1 exactly where the watched value is finite (NaN and both
/// infinities are not), on every dtype and device, with a transposed and a broadcast
/// watched operand; integers are always finite.
#[test]
fn count_finite_assign_counts_only_finite_entries() {
    let _serial = serial();
    let mut rng = Generator::new(41);
    for device in devices() {
        for dtype in FLOATS.into_iter().chain(INTS) {
            if !supports(&device, dtype) {
                continue;
            }
            let start: Vec<f64> = (0..12).map(|_| rng.below(50) as f64).collect();
            let count = tensor_of(&start, &[3, 4], dtype, &device);
            // Watched [4, 3] viewed transposed: entry (i, j) is w[j * 3 + i].
            let mut w: Vec<f64> = random_vals(&mut rng, 12, DType::F32, Range::Signed);
            if dtype.is_float() {
                for (k, bad) in [(1, f64::NAN), (5, f64::INFINITY), (10, f64::NEG_INFINITY)] {
                    w[k] = bad;
                }
            }
            let watched = tensor_of(&w, &[4, 3], DType::F32, &Device::Cpu)
                .to_dtype(dtype)
                .unwrap()
                .to_device(&device)
                .unwrap();
            count.count_finite_assign(&watched.t().unwrap()).unwrap();
            let want: Vec<f64> = (0..12)
                .map(|e| {
                    let (i, j) = (e / 4, e % 4);
                    start[e] + f64::from(u8::from(w[j * 3 + i].is_finite()))
                })
                .collect();
            let ctx = format!("count_finite_assign {dtype} on {device}");
            assert_eq!(values(&count), want, "{ctx} transposed");
            // A one-row watched value broadcast over the rows.
            let row = tensor_of(&w[..4], &[4], dtype, &device);
            count.count_finite_assign(&row).unwrap();
            let want2: Vec<f64> = (0..12)
                .map(|e| want[e] + f64::from(u8::from(w[e % 4].is_finite())))
                .collect();
            assert_eq!(values(&count), want2, "{ctx} broadcast");
        }
    }
}
