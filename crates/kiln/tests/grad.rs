//! Every gradient rule against central finite differences in f64, on random inputs
//! (contiguous and non-contiguous leaves), on every device.

mod common;
use common::*;
use kiln::op::EpilogueActivation;
use kiln::{AllDims, Conv2dOptions, DType, Device, Generator, RunningStats, Tensor};

type Func = Box<dyn Fn(&[Tensor]) -> kiln::Result<Tensor>>;

struct Case {
    name: &'static str,
    shapes: Vec<Vec<usize>>,
    range: Range,
    f: Func,
}

fn case(
    name: &'static str,
    shapes: &[&[usize]],
    range: Range,
    f: impl Fn(&[Tensor]) -> kiln::Result<Tensor> + 'static,
) -> Case {
    Case {
        name,
        shapes: shapes.iter().map(|s| s.to_vec()).collect(),
        range,
        f: Box::new(f),
    }
}

fn ids(v: &[i64], device: &Device) -> Tensor {
    Tensor::from_vec(v.to_vec(), v.len(), device).unwrap()
}

/// A 5x80 sparsity pattern with an empty row and a row of 70 entries (long enough to be
/// computed in pieces), for the sparse products' gradients.
fn sparse_pattern(device: &Device, dt: DType) -> kiln::sparse::Csr {
    let mut rows = vec![0i64, 0, 2, 2, 4, 4];
    let mut cols = vec![3i64, 79, 5, 6, 0, 40];
    rows.extend(std::iter::repeat_n(1, 70));
    cols.extend(0..70);
    let n = rows.len();
    kiln::sparse::Csr::from_coo(
        5,
        80,
        &Tensor::from_vec(rows, n, &Device::Cpu).unwrap(),
        &Tensor::from_vec(cols, n, &Device::Cpu).unwrap(),
        &Tensor::ones(n, dt, device).unwrap(),
    )
    .unwrap()
}

/// The cases on `device` in `dt` (f64, or f32 where the device has no f64).
fn cases(device: Device, dt: DType) -> Vec<Case> {
    use Range::{Positive as P, Signed as S};
    let d = device;
    let csr_nnz = sparse_pattern(&Device::Cpu, dt).nnz();
    vec![
        case("neg", &[&[3, 4]], S, |x| x[0].neg()),
        case("abs", &[&[3, 4]], S, |x| x[0].abs()),
        // A fresh stream at one step each call: the same mask every evaluation.
        case("dropout", &[&[5, 7]], S, |x| {
            x[0].dropout(0.4, &kiln::DropoutStream::at_step(3, 9, &x[0].device())?)
        }),
        case("sqr", &[&[3, 4]], S, |x| x[0].sqr()),
        case("relu", &[&[3, 4]], S, |x| x[0].relu()),
        case("add_relu", &[&[3, 4], &[4]], S, |x| x[0].add_relu(&x[1])),
        case("mul_relu", &[&[3, 4], &[3, 1]], S, |x| x[0].mul_relu(&x[1])),
        case("affine", &[&[3, 4], &[4], &[3, 1]], S, |x| {
            x[0].affine(&x[1], &x[2])
        }),
        case("matmul_bias_relu", &[&[5, 3], &[3, 8], &[8]], S, |x| {
            x[0].matmul_bias_act(&x[1], &x[2], kiln::op::EpilogueActivation::Relu)
        }),
        case("matmul_bias_gelu", &[&[5, 3], &[3, 8], &[8]], S, |x| {
            x[0].matmul_bias_act(&x[1], &x[2], kiln::op::EpilogueActivation::GeluTanh)
        }),
        case("exp", &[&[3, 4]], S, |x| x[0].exp()),
        case("log", &[&[3, 4]], P, |x| x[0].log()),
        case("sqrt", &[&[3, 4]], P, |x| x[0].sqrt()),
        case("recip", &[&[3, 4]], S, |x| x[0].recip()),
        case("sin", &[&[3, 4]], S, |x| x[0].sin()),
        case("cos", &[&[3, 4]], S, |x| x[0].cos()),
        case("tanh", &[&[3, 4]], S, |x| x[0].tanh()),
        case("sigmoid", &[&[3, 4]], S, |x| x[0].sigmoid()),
        case("erf", &[&[3, 4]], S, |x| x[0].erf()),
        case("gelu", &[&[3, 4]], S, |x| x[0].gelu()),
        case("gelu_tanh", &[&[3, 4]], S, |x| x[0].gelu_tanh()),
        case("silu", &[&[3, 4]], S, |x| x[0].silu()),
        case("powf", &[&[3, 4]], P, |x| x[0].powf(1.7)),
        case("clamp", &[&[3, 4]], S, |x| x[0].clamp(-0.5, 0.7)),
        case("scalar ops", &[&[3, 4]], S, |x| {
            x[0].add_scalar(1.5)?
                .mul_scalar(-2.0)?
                .sub_scalar(0.5)?
                .div_scalar(3.0)?
                .rsub_scalar(1.0)
        }),
        case("rdiv_scalar", &[&[3, 4]], S, |x| x[0].rdiv_scalar(2.0)),
        case("max/min scalar", &[&[3, 4]], S, |x| {
            x[0].maximum_scalar(0.3)?.minimum_scalar(1.2)
        }),
        case("add (broadcast)", &[&[3, 4], &[4]], S, |x| x[0].add(&x[1])),
        case("sub (broadcast)", &[&[3, 1], &[3, 4]], S, |x| {
            x[0].sub(&x[1])
        }),
        case("mul (broadcast)", &[&[2, 3, 4], &[3, 1]], S, |x| {
            x[0].mul(&x[1])
        }),
        case("div", &[&[3, 4], &[3, 4]], S, |x| x[0].div(&x[1])),
        case("maximum", &[&[3, 4], &[3, 4]], S, |x| x[0].maximum(&x[1])),
        case("minimum", &[&[3, 4], &[4]], S, |x| x[0].minimum(&x[1])),
        case("pow", &[&[3, 4], &[3, 4]], P, |x| x[0].pow(&x[1])),
        case("relu_grad", &[&[3, 4], &[4]], S, |x| x[0].relu_grad(&x[1])),
        case("where_cond", &[&[3, 4], &[3, 4]], S, |x| {
            x[0].gt_scalar(0.0)?
                .where_cond(&x[0], &x[1].mul_scalar(2.0)?)
        }),
        case("transpose/permute", &[&[2, 3, 4]], S, |x| {
            x[0].transpose(0, 2)?.permute(&[1, 2, 0])?.sqr()
        }),
        case("narrow/slice/select", &[&[4, 6]], S, |x| {
            let a = x[0].narrow(1, 1, 4)?.slice(0, 0..4, 2)?;
            a.mul(&x[0].select(0, 3)?.narrow(0, 0, 4)?)
        }),
        case("broadcast/unsqueeze/squeeze", &[&[3, 1]], S, |x| {
            x[0].broadcast_as([2, 3, 4])?
                .unsqueeze(1)?
                .squeeze(1)?
                .sqr()
        }),
        case("reshape of a transposed view", &[&[3, 4]], S, |x| {
            x[0].t()?.reshape([2, 6])?.sqr()?.flatten_all()
        }),
        case("contiguous/copy", &[&[3, 4]], S, |x| {
            x[0].t()?.contiguous()?.copy()?.sqr()
        }),
        case("sum over dims", &[&[2, 3, 4]], S, |x| {
            x[0].sqr()?.sum([0, 2], false)
        }),
        case("mean", &[&[2, 3, 4]], S, |x| x[0].sqr()?.mean(1, true)),
        case("max/min", &[&[3, 5]], S, |x| {
            x[0].max(1, false)?
                .add(&x[0].min(0, false)?.narrow(0, 0, 3)?)
        }),
        case("logsumexp", &[&[3, 5]], S, |x| x[0].logsumexp(1, false)),
        case("softmax", &[&[3, 5]], S, |x| {
            x[0].softmax(1)?.add(&x[0].softmax(0)?)
        }),
        case("log_softmax", &[&[3, 5]], S, |x| x[0].log_softmax(-1)),
        case("matmul (transposed views)", &[&[3, 4], &[5, 4]], S, |x| {
            x[0].matmul(&x[1].t()?)
        }),
        case(
            "batched matmul (broadcast)",
            &[&[2, 3, 4], &[4, 2]],
            S,
            |x| x[0].matmul(&x[1]),
        ),
        case(
            "matmul_bias (transposed weight)",
            &[&[3, 4], &[5, 4], &[5]],
            S,
            |x| x[0].matmul_bias(&x[1].t()?, &x[2]),
        ),
        case("matmul_bias (plain)", &[&[6, 3], &[3, 2], &[2]], S, |x| {
            x[0].matmul_bias(&x[1], &x[2])
        }),
        case("matmul with a vector", &[&[3, 4], &[4]], S, |x| {
            x[0].matmul(&x[1])
        }),
        case("cat/stack", &[&[2, 3], &[1, 3]], S, |x| {
            let c = Tensor::cat(&[&x[0], &x[1]], 0)?;
            Tensor::stack(&[&c, &c.sqr()?], 1)
        }),
        case("index_select", &[&[4, 3]], S, move |x| {
            x[0].index_select(&ids(&[2, 0, 2, 3], &d), 0)
        }),
        case("gather", &[&[3, 4]], S, move |x| {
            x[0].gather(&Tensor::from_vec(vec![1i64, 3, 0, 0, 2, 2], [3, 2], &d)?, 1)
        }),
        case("scatter_add", &[&[3, 4], &[3, 2]], S, move |x| {
            x[0].scatter_add(
                &Tensor::from_vec(vec![1i64, 3, 0, 0, 2, 2], [3, 2], &d)?,
                &x[1],
                1,
            )
        }),
        case("csr matmul (spmm)", &[&[csr_nnz], &[80, 3]], S, move |x| {
            sparse_pattern(&d, dt).with_values(&x[0])?.matmul(&x[1])
        }),
        case("csr matmul (spmv)", &[&[csr_nnz], &[80]], S, move |x| {
            sparse_pattern(&d, dt).with_values(&x[0])?.matmul(&x[1])
        }),
        case("csr t_matmul", &[&[csr_nnz], &[5, 3]], S, move |x| {
            sparse_pattern(&d, dt).with_values(&x[0])?.t_matmul(&x[1])
        }),
        case("csr t_matmul (spmv)", &[&[csr_nnz], &[5]], S, move |x| {
            sparse_pattern(&d, dt).with_values(&x[0])?.t_matmul(&x[1])
        }),
        case("conv2d", &[&[2, 3, 5, 6], &[4, 3, 3, 2], &[4]], S, |x| {
            let o = Conv2dOptions {
                stride: [2, 1],
                padding: [1, 0],
                dilation: [1, 2],
                groups: 1,
            };
            x[0].conv2d(&x[1], Some(&x[2]), o)
        }),
        case(
            "conv2d groups relu",
            &[&[2, 4, 5, 5], &[6, 2, 3, 3], &[6]],
            S,
            |x| {
                let o = Conv2dOptions::default().padding(1).groups(2);
                x[0].conv2d_act(&x[1], Some(&x[2]), o, Some(EpilogueActivation::Relu))
            },
        ),
        // One group with bias and ReLU: CUDA's direct kernel adds both in its own pass.
        case(
            "conv2d bias relu",
            &[&[2, 2, 5, 6], &[3, 2, 3, 3], &[3]],
            S,
            |x| {
                let o = Conv2dOptions::default().padding(1);
                x[0].conv2d_act(&x[1], Some(&x[2]), o, Some(EpilogueActivation::Relu))
            },
        ),
        case(
            "conv2d same padding",
            &[&[2, 3, 4, 6], &[2, 3, 3, 5]],
            S,
            |x| {
                let o = Conv2dOptions {
                    padding: [1, 2],
                    ..Conv2dOptions::default()
                };
                x[0].conv2d(&x[1], None, o)
            },
        ),
        case("conv2d no bias", &[&[1, 2, 4, 4], &[3, 2, 2, 2]], S, |x| {
            x[0].conv2d(&x[1], None, Conv2dOptions::default().stride(2))
        }),
        case("max_pool2d", &[&[2, 3, 5, 6]], S, |x| {
            x[0].max_pool2d([3, 3], [2, 2], [1, 1])
        }),
        case("avg_pool2d", &[&[2, 3, 5, 6]], S, |x| {
            x[0].avg_pool2d([2, 3], [1, 2], [1, 1])
        }),
        // Windows that tile the input (kernel = stride, no padding): CUDA's tiled kernel; the
        // transpose after it hands the pool's backward a strided output gradient.
        case("max_pool2d tiled", &[&[2, 3, 4, 6]], S, |x| {
            x[0].max_pool2d([2, 2], [2, 2], [0, 0])?.transpose(2, 3)
        }),
        // Max-pooling of a ReLU's output moves the ReLU's mask in front of the pooling
        // (overlapping windows too); not where the ReLU's output has another use.
        case("relu then max_pool2d", &[&[2, 3, 5, 6]], S, |x| {
            x[0].relu()?.max_pool2d([3, 3], [2, 2], [1, 1])
        }),
        case(
            "conv2d bias relu then max_pool2d",
            &[&[2, 2, 6, 6], &[3, 2, 3, 3], &[3]],
            S,
            |x| {
                let o = Conv2dOptions::default().padding(1);
                x[0].conv2d_act(&x[1], Some(&x[2]), o, Some(EpilogueActivation::Relu))?
                    .max_pool2d([2, 2], [2, 2], [0, 0])
            },
        ),
        case(
            "relu used by max_pool2d and more",
            &[&[2, 3, 4, 6]],
            S,
            |x| {
                let r = x[0].relu()?;
                r.max_pool2d([2, 2], [2, 2], [0, 0])?
                    .add(&r.avg_pool2d([2, 2], [2, 2], [0, 0])?)
            },
        ),
        case("avg_pool2d tiled", &[&[2, 3, 4, 6]], S, |x| {
            x[0].avg_pool2d([2, 3], [2, 3], [0, 0])
        }),
        case(
            "batch_norm train",
            &[&[3, 2, 4, 3], &[2], &[2]],
            S,
            move |x| {
                let (m, v) = (Tensor::zeros(2, dt, &d)?, Tensor::ones(2, dt, &d)?);
                let r = RunningStats {
                    mean: &m,
                    var: &v,
                    momentum: 0.1,
                };
                x[0].batch_norm(Some(r), Some(&x[1]), Some(&x[2]), true, 1e-5)
            },
        ),
        case("batch_norm eval", &[&[3, 2, 4], &[2], &[2], &[2]], P, |x| {
            let r = RunningStats {
                mean: &x[3],
                var: &x[1],
                momentum: 0.1,
            };
            x[0].batch_norm(Some(r), Some(&x[2]), Some(&x[3]), false, 1e-5)
        }),
        case("cast round trip", &[&[3, 4]], S, |x| {
            x[0].to_dtype(DType::F32)?.to_dtype(DType::F64)?.sqr()
        }),
    ]
}

/// Builds a leaf for input `i` in a layout variant: odd inputs and 2-D+ shapes alternate
/// between contiguous and transposed storage.
fn leaf(vals: &[f64], shape: &[usize], device: &Device, transposed: bool) -> Tensor {
    if transposed && shape.len() >= 2 {
        let r = shape.len();
        let mut ss = shape.to_vec();
        ss.swap(r - 2, r - 1);
        // Storage holds the transpose, so that the view has the logical values `vals`.
        let mut storage = vec![0.0; vals.len()];
        for (i, &v) in vals.iter().enumerate() {
            let mut idx = unravel(i, shape);
            idx.swap(r - 2, r - 1);
            storage[ravel(&idx, &ss)] = v;
        }
        Tensor::from_vec(storage, ss, device)
            .unwrap()
            .transpose(-2, -1)
            .unwrap()
    } else {
        Tensor::from_vec(vals.to_vec(), shape, device).unwrap()
    }
}

#[test]
fn gradients_match_finite_differences() {
    let mut rng = Generator::new(99);
    for device in devices() {
        if !supports(&device, DType::F64) {
            continue; // see gradients_in_f32_match_the_cpu_in_f64
        }
        for transposed in [false, true] {
            for c in cases(device, DType::F64) {
                let vals: Vec<Vec<f64>> = c
                    .shapes
                    .iter()
                    .map(|s| random_vals(&mut rng, s.iter().product(), DType::F64, c.range))
                    .collect();
                let vars: Vec<Tensor> = vals
                    .iter()
                    .zip(&c.shapes)
                    .map(|(v, s)| leaf(v, s, &device, transposed).var().unwrap())
                    .collect();
                let out = (c.f)(&vars).unwrap();
                // A random weighting makes the seed gradient non-uniform.
                let w = Tensor::randn(out.shape().clone(), 0.0, 1.0, DType::F64, &device, &mut rng)
                    .unwrap();
                let loss = out.mul(&w).unwrap().sum(AllDims, false).unwrap();
                let grads = loss.backward().unwrap();
                let eval = |k: usize, perturbed: &[f64]| -> f64 {
                    let inputs: Vec<Tensor> = vals
                        .iter()
                        .zip(&c.shapes)
                        .enumerate()
                        .map(|(j, (v, s))| {
                            leaf(if j == k { perturbed } else { v }, s, &device, transposed)
                        })
                        .collect();
                    let o = (c.f)(&inputs).unwrap();
                    values(&o.mul(&w).unwrap().sum(AllDims, false).unwrap())[0]
                };
                for (k, var) in vars.iter().enumerate() {
                    let g = grads
                        .get(var)
                        .unwrap_or_else(|| panic!("{}: no gradient for input {k}", c.name));
                    assert_eq!(g.dims(), var.dims(), "{}: gradient shape", c.name);
                    let got = values(g);
                    // The f32 round trip needs a step far above f32 resolution (its function,
                    // a square, has exact central differences at any step).
                    let eps = if c.name == "cast round trip" {
                        1e-2
                    } else {
                        1e-6
                    };
                    let want: Vec<f64> = (0..vals[k].len())
                        .map(|i| {
                            let mut p = vals[k].clone();
                            p[i] += eps;
                            let up = eval(k, &p);
                            p[i] -= 2.0 * eps;
                            (up - eval(k, &p)) / (2.0 * eps)
                        })
                        .collect();
                    let ctx = format!(
                        "d/d{k} {} on {device} (transposed leaves: {transposed})",
                        c.name
                    );
                    let tol = if c.name == "cast round trip" {
                        1e-6 * 1e3
                    } else {
                        1e-6
                    };
                    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            (a - b).abs() <= tol * (1.0 + b.abs()),
                            "{ctx}: element {i}: autograd {a}, numeric {b}"
                        );
                    }
                }
            }
        }
    }
}

/// On devices without f64 (wgpu), every rule's gradient in f32 against the CPU's f64
/// gradient (itself checked against finite differences above) at the same f32-rounded
/// inputs and seed weights.
#[test]
fn gradients_in_f32_match_the_cpu_in_f64() {
    let mut rng = Generator::new(98);
    for device in devices() {
        if supports(&device, DType::F64) {
            continue;
        }
        for transposed in [false, true] {
            let reference = cases(Device::Cpu, DType::F64);
            for (c, r) in cases(device, DType::F32).into_iter().zip(reference) {
                // The f32 round trip is the identity in f32.
                if c.name == "cast round trip" {
                    continue;
                }
                let vals: Vec<Vec<f64>> = c
                    .shapes
                    .iter()
                    .map(|s| random_vals(&mut rng, s.iter().product(), DType::F32, c.range))
                    .collect();
                let run = |f: &Func, dev: Device, dt: DType| {
                    let vars: Vec<Tensor> = vals
                        .iter()
                        .zip(&c.shapes)
                        .map(|(v, s)| {
                            leaf(v, s, &Device::Cpu, transposed)
                                .to_dtype(dt)
                                .unwrap()
                                .to_device(&dev)
                                .unwrap()
                                .var()
                                .unwrap()
                        })
                        .collect();
                    let out = f(&vars).unwrap();
                    let w = Tensor::randn(
                        out.shape().clone(),
                        0.0,
                        1.0,
                        DType::F32,
                        &Device::Cpu,
                        &mut Generator::new(5),
                    )
                    .unwrap()
                    .to_dtype(dt)
                    .unwrap()
                    .to_device(&dev)
                    .unwrap();
                    let grads = out
                        .mul(&w)
                        .unwrap()
                        .sum(AllDims, false)
                        .unwrap()
                        .backward()
                        .unwrap();
                    vars.iter()
                        .map(|v| values(grads.get(v).expect("a gradient")))
                        .collect::<Vec<_>>()
                };
                let got = run(&c.f, device, DType::F32);
                let want = run(&r.f, Device::Cpu, DType::F64);
                for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                    let ctx = format!(
                        "d/d{k} {} on {device} in f32 (transposed leaves: {transposed})",
                        c.name
                    );
                    assert_close(&ctx, g, w, 1e-4);
                }
            }
        }
    }
}

#[test]
fn graph_bookkeeping() {
    let d = Device::Cpu;
    let x = Tensor::from_vec(vec![1.0f64, 2.0, 3.0], 3, &d).unwrap();
    assert!(!x.requires_grad());
    assert!(x.backward().is_err(), "backward needs a var");
    let v = x.var().unwrap();
    assert!(v.is_leaf() && v.same_storage(&x));
    // A tensor used twice accumulates both contributions: d(v*v + v)/dv = 2v + 1.
    let y = v
        .mul(&v)
        .unwrap()
        .add(&v)
        .unwrap()
        .sum(AllDims, false)
        .unwrap();
    let g = y.backward().unwrap();
    assert_eq!(
        g.get(&v).unwrap().to_vec::<f64>().unwrap(),
        vec![3.0, 5.0, 7.0]
    );
    // no_grad records nothing, and restores the mode.
    let z = kiln::no_grad(|| v.sqr().unwrap());
    assert!(!z.requires_grad() && kiln::grad_enabled());
    // detach cuts the graph.
    let w = v.detach().sqr().unwrap();
    assert!(!w.requires_grad());
    // Integer tensors cannot be vars.
    assert!(Tensor::ones(2, DType::I64, &d).unwrap().var().is_err());
    // A leaf the output does not depend on has no gradient.
    let other = x.var().unwrap();
    assert!(v
        .sum(AllDims, false)
        .unwrap()
        .backward()
        .unwrap()
        .get(&other)
        .is_none());
}

#[test]
fn assign_updates_shared_storage_in_place() {
    let d = Device::Cpu;
    let p = Tensor::zeros([2, 3], DType::F32, &d).unwrap();
    let view = p.t().unwrap();
    p.assign(&Tensor::ones([2, 3], DType::F32, &d).unwrap())
        .unwrap();
    assert_eq!(view.to_vec::<f32>().unwrap(), vec![1.0; 6]);
    // Writing through a view, and a source that shares the target's storage.
    view.narrow(0, 0, 1)
        .unwrap()
        .assign(&Tensor::full(5.0, [1, 2], DType::F32, &d).unwrap())
        .unwrap();
    assert_eq!(p.to_vec::<f32>().unwrap(), vec![5., 1., 1., 5., 1., 1.]);
    p.assign(&p.mul_scalar(2.0).unwrap()).unwrap();
    p.narrow(1, 0, 1)
        .unwrap()
        .assign(&p.narrow(1, 1, 1).unwrap())
        .unwrap();
    assert_eq!(p.to_vec::<f32>().unwrap(), vec![2., 2., 2., 2., 2., 2.]);
    assert!(p
        .assign(&Tensor::ones([3, 2], DType::F32, &d).unwrap())
        .is_err());
    assert!(p
        .unsqueeze(0)
        .unwrap()
        .broadcast_as([2, 2, 3])
        .unwrap()
        .assign(&Tensor::ones([2, 2, 3], DType::F32, &d).unwrap())
        .is_err());
}

/// `backward()` of a scalar seeds with one cached 1 per device and dtype; a gradient that
/// is a view of it is copied before it reaches the caller, so writing to a gradient in place
/// cannot change later backward passes.
#[test]
fn shared_scalar_seed_never_reaches_the_caller() {
    use kiln::op::UpdateRule;
    for device in devices() {
        let x = Tensor::from_vec(vec![2f32], [1], &device)
            .unwrap()
            .var()
            .unwrap();
        let loss = x.reshape(()).unwrap();
        let grads = loss.backward().unwrap();
        let g = grads.get(&x).unwrap();
        assert_eq!(g.to_vec::<f32>().unwrap(), [1.0]);
        // Write to the gradient in place (g -= 1·g → 0).
        let rule = UpdateRule::Sgd {
            lr: 1.0,
            momentum: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        };
        g.apply_update(&g.copy().unwrap(), &[], rule).unwrap();
        assert_eq!(g.to_vec::<f32>().unwrap(), [0.0]);
        let again = loss.backward().unwrap();
        assert_eq!(
            again.get(&x).unwrap().to_vec::<f32>().unwrap(),
            [1.0],
            "{device}"
        );
    }
}

/// `backward_with_hook` hands a layer's weight (a transposed view of the leaf, as `Linear`
/// stores it) and bias to the hook before the layer's input gradient is computed (a path of
/// its own in the backward pass); the gradients equal `backward_with`'s, every leaf reaches
/// the hook once, contiguous and alone in its storage, the last layer's first, and what the
/// hook returns is what is stored. On every device, f32.
#[test]
fn hooked_backward_of_linear_layers_matches_the_plain_backward() {
    for dev in devices() {
        let mut rng = Generator::new(11);
        let leaf = |dims: &[usize], rng: &mut Generator| {
            Tensor::randn(dims, 0.0, 1.0, DType::F32, &dev, rng)
                .unwrap()
                .var()
                .unwrap()
        };
        let (w1, b1, w2, b2) = (
            leaf(&[8, 5], &mut rng),
            leaf(&[8], &mut rng),
            leaf(&[3, 8], &mut rng),
            leaf(&[3], &mut rng),
        );
        // The input needs a gradient too, so each layer has an input gradient to queue.
        let x = leaf(&[4, 5], &mut rng);
        let h = x
            .matmul_bias_act(&w1.t().unwrap(), &b1, EpilogueActivation::Relu)
            .unwrap();
        let out = h.matmul_bias(&w2.t().unwrap(), &b2).unwrap();
        let seed = Tensor::randn([4, 3], 0.0, 1.0, DType::F32, &dev, &mut rng).unwrap();
        let plain = out.backward_with(&seed).unwrap();
        let mut seen = Vec::new();
        let hooked = out
            .backward_with_hook(&seed, |id, g| {
                seen.push(id);
                // Data parallel reduces it in place: no copy needed.
                assert!(
                    g.is_contiguous() && g.owns_storage_alone(),
                    "{dev}: leaf {id}"
                );
                g.mul_scalar(2.0)
            })
            .unwrap();
        let id = |t: &Tensor| t.leaf_id().unwrap();
        assert_eq!(seen.len(), 5, "{dev}: {seen:?}");
        let pos = |t: &Tensor| seen.iter().position(|&s| s == id(t)).unwrap();
        assert!(
            pos(&w2) < pos(&w1) && pos(&b2) < pos(&b1),
            "{dev}: {seen:?}"
        );
        for t in [&w1, &b1, &w2, &b2, &x] {
            let want: Vec<f32> = plain.get(t).unwrap().to_vec().unwrap();
            let got: Vec<f32> = hooked.get(t).unwrap().to_vec().unwrap();
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    (g - 2.0 * w).abs() <= 1e-5 * (1.0 + w.abs()),
                    "{dev}: {g} vs 2·{w}"
                );
            }
        }
    }
}

/// The GELU derivatives (both forms) take their limits, 1 and 0, at huge and infinite inputs
/// on every device and float dtype, where a naive `x · φ(x)` or `x (1 − tanh²u) u'` would be
/// `inf · 0`; NaN stays NaN; moderate inputs keep their values (against the CPU in f64).
#[test]
fn gelu_derivatives_take_their_limits_at_huge_inputs() {
    // Inputs whose derivative is the limit (NaN's is NaN), then moderate ones.
    let limits = [
        f64::INFINITY,
        f64::NEG_INFINITY,
        1e30,
        -1e30,
        3e19,
        -3e19,
        1e10,
        -1e10,
        30.0,
        -30.0,
        f64::NAN,
    ];
    let moderate = [-1.5, 0.7];
    let special: Vec<f64> = limits.iter().chain(&moderate).copied().collect();
    type Activation = fn(&Tensor) -> kiln::Result<Tensor>;
    let forms: [(&str, Activation); 2] = [("gelu", Tensor::gelu), ("gelu_tanh", Tensor::gelu_tanh)];
    let grad_of = |f: Activation, vals: &[f64], device: &Device, dt: DType| {
        let x = Tensor::from_vec(vals.to_vec(), vals.len(), &Device::Cpu)
            .unwrap()
            .to_dtype(dt)
            .unwrap()
            .to_device(device)
            .unwrap()
            .var()
            .unwrap();
        let grads = f(&x)
            .unwrap()
            .sum(AllDims, false)
            .unwrap()
            .backward()
            .unwrap();
        values(grads.get(&x).expect("a gradient"))
    };
    for device in devices() {
        for dt in FLOATS {
            if !supports(&device, dt) {
                continue;
            }
            for (name, f) in forms {
                let got = grad_of(f, &special, &device, dt);
                // The moderate inputs as `dt` holds them, for the f64 reference.
                let held = values(
                    &Tensor::from_vec(moderate.to_vec(), moderate.len(), &Device::Cpu)
                        .unwrap()
                        .to_dtype(dt)
                        .unwrap(),
                );
                let reference = grad_of(f, &held, &Device::Cpu, DType::F64);
                let ctx = format!("d/dx {name} on {device} in {dt}");
                for (&x, &g) in limits.iter().zip(&got) {
                    if x.is_nan() {
                        assert!(g.is_nan(), "{ctx} at NaN: {g}");
                    } else if x.abs() >= 1e10 {
                        let limit = if x > 0.0 { 1.0 } else { 0.0 };
                        assert_eq!(g, limit, "{ctx} at {x:e}");
                    } else if x.abs() >= 30.0 {
                        // Within rounding of the limit (in f64, -30 gives about -4e-195).
                        let limit = if x > 0.0 { 1.0 } else { 0.0 };
                        assert!((g - limit).abs() <= 1e-6, "{ctx} at {x:e}: {g}");
                    }
                }
                assert_close(&ctx, &got[limits.len()..], &reference, tol(dt));
            }
        }
    }
}
