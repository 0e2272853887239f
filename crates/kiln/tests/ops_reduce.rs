//! Reductions, logsumexp, softmax and log-softmax against f64 references.

mod common;
use common::*;
use kiln::{AllDims, DType, Device, Generator, Tensor};

type RefFn<'a> = Box<dyn Fn(&[f64]) -> f64 + 'a>;

/// Reference reduction of `vals` (shape `shape`) over `dims`, keepdim layout.
fn reduce_ref(
    vals: &[f64],
    shape: &[usize],
    dims: &[usize],
    f: impl Fn(&[f64]) -> f64,
) -> (Vec<usize>, Vec<f64>) {
    let out_shape: Vec<usize> = shape
        .iter()
        .enumerate()
        .map(|(i, &d)| if dims.contains(&i) { 1 } else { d })
        .collect();
    let n_out: usize = out_shape.iter().product();
    let mut groups = vec![Vec::new(); n_out];
    for (i, &v) in vals.iter().enumerate() {
        let mut idx = unravel(i, shape);
        for &d in dims {
            idx[d] = 0;
        }
        groups[ravel(&idx, &out_shape)].push(v);
    }
    (out_shape, groups.iter().map(|g| f(g)).collect())
}

fn random_dims(rng: &mut Generator, rank: usize) -> Vec<usize> {
    let mut dims: Vec<usize> = (0..rank).filter(|_| rng.below(2) == 0).collect();
    if dims.is_empty() {
        dims.push(rng.below(rank));
    }
    dims
}

fn argext(g: &[f64], max: bool) -> f64 {
    let mut best = 0;
    for (i, &v) in g.iter().enumerate() {
        if (max && v > g[best]) || (!max && v < g[best]) {
            best = i;
        }
    }
    best as f64
}

#[test]
fn reductions_match_reference() {
    let mut rng = Generator::new(10);
    for device in devices() {
        for dtype in FLOATS.into_iter().chain(INTS) {
            if !supports(&device, dtype) {
                continue;
            }
            for variant in VARIANTS {
                for _ in 0..3 {
                    let shape = random_shape(&mut rng, 1, 4);
                    let dims = random_dims(&mut rng, shape.len());
                    let x = input(&mut rng, &shape, dtype, &device, variant, Range::Signed);
                    let ctx = |op: &str| {
                        format!("{op} {dtype} {device} {variant:?} {shape:?} over {dims:?}")
                    };
                    let cases: Vec<(&str, Tensor, RefFn)> = vec![
                        (
                            "sum",
                            x.t.sum(dims.clone(), true).unwrap(),
                            Box::new(|g: &[f64]| round_to(g.iter().sum(), dtype)),
                        ),
                        (
                            "max",
                            x.t.max(dims.clone(), true).unwrap(),
                            Box::new(|g: &[f64]| g.iter().cloned().fold(f64::MIN, f64::max)),
                        ),
                        (
                            "min",
                            x.t.min(dims.clone(), true).unwrap(),
                            Box::new(|g: &[f64]| g.iter().cloned().fold(f64::MAX, f64::min)),
                        ),
                    ];
                    for (op, got, f) in cases {
                        let (out_shape, want) = reduce_ref(&x.vals, &shape, &dims, f);
                        assert_eq!(got.dims(), &out_shape[..], "{}", ctx(op));
                        // Sums of many rounded values: compare against the sum of magnitudes.
                        let t = if op == "sum" {
                            tol(dtype) * 4.0
                        } else {
                            tol(dtype)
                        };
                        assert_close(&ctx(op), &values(&got), &want, t);
                    }
                    if dtype.is_float() {
                        let got = x.t.mean(dims.clone(), false).unwrap();
                        let (_, want) = reduce_ref(&x.vals, &shape, &dims, |g| {
                            g.iter().sum::<f64>() / g.len() as f64
                        });
                        assert_close(&ctx("mean"), &values(&got), &want, tol(dtype) * 4.0);
                        let got = x.t.logsumexp(dims.clone(), true).unwrap();
                        let (_, want) = reduce_ref(&x.vals, &shape, &dims, |g| {
                            g.iter().map(|v| v.exp()).sum::<f64>().ln()
                        });
                        assert_close(&ctx("logsumexp"), &values(&got), &want, tol(dtype));
                    }
                    // Arg reductions along one dim, without keepdim.
                    let d = dims[0];
                    for (op, max) in [("argmax", true), ("argmin", false)] {
                        let got = if max {
                            x.t.argmax(d, false)
                        } else {
                            x.t.argmin(d, false)
                        }
                        .unwrap();
                        assert_eq!(got.dtype(), DType::I64);
                        let (mut out_shape, want) =
                            reduce_ref(&x.vals, &shape, &[d], |g| argext(g, max));
                        out_shape.remove(d);
                        assert_eq!(got.dims(), &out_shape[..], "{}", ctx(op));
                        assert_close(&ctx(op), &values(&got), &want, 0.0);
                    }
                }
            }
        }
    }
}

#[test]
fn large_reductions_use_every_path() {
    // Sizes past the parallel threshold: row-wise (last dim), column-wise (first dim of a
    // contiguous tensor) and strided (middle dim).
    let mut rng = Generator::new(11);
    for device in devices() {
        for dtype in [DType::F32, DType::BF16] {
            if !supports(&device, dtype) {
                continue;
            }
            let shape = [64, 33, 40];
            for variant in [Variant::Contiguous, Variant::Transposed] {
                let x = input(&mut rng, &shape, dtype, &device, variant, Range::Signed);
                for dims in [
                    vec![2],
                    vec![0],
                    vec![1],
                    vec![0, 1],
                    vec![0, 2],
                    vec![0, 1, 2],
                ] {
                    let got = x.t.sum(dims.clone(), true).unwrap();
                    let (_, want) = reduce_ref(&x.vals, &shape, &dims, |g| g.iter().sum());
                    assert_norm_close(
                        &format!("sum {dtype} {device} {variant:?} {dims:?}"),
                        &values(&got),
                        &want,
                        tol(dtype),
                    );
                    let got = x.t.max(dims.clone(), true).unwrap();
                    let (_, want) = reduce_ref(&x.vals, &shape, &dims, |g| {
                        g.iter().cloned().fold(f64::MIN, f64::max)
                    });
                    assert_close(
                        &format!("max {dtype} {device} {variant:?} {dims:?}"),
                        &values(&got),
                        &want,
                        0.0,
                    );
                }
                for dim in 0..3 {
                    for (op, max) in [("argmax", true), ("argmin", false)] {
                        let got = if max {
                            x.t.argmax(dim, true)
                        } else {
                            x.t.argmin(dim, true)
                        }
                        .unwrap();
                        let (_, want) = reduce_ref(&x.vals, &shape, &[dim], |g| argext(g, max));
                        assert_eq!(
                            values(&got),
                            want,
                            "{op} {dtype} {device} {variant:?} {dim}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn reductions_around_kept_middle_dims() {
    // A convolution's bias gradient: sums over N, H and W of NCHW, and other leading plus
    // trailing runs around kept dims (CUDA reduces these in two passes without a copy, the
    // CPU in memory order, slab by slab).
    let mut rng = Generator::new(12);
    for device in devices() {
        for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
            if !supports(&device, dtype) {
                continue;
            }
            // Planes of 120 (a warp each, 16-byte loads), 63 (a warp each, scalar loads) and
            // 1221 elements (a block each, scalar loads) for CUDA's plane kernel.
            for (shape, dims) in [
                ([16, 24, 10, 12], vec![0, 2, 3]),
                ([16, 24, 10, 12], vec![0, 3]),
                ([16, 24, 10, 12], vec![0, 1, 3]),
                ([4, 6, 7, 9], vec![0, 2, 3]),
                ([3, 5, 33, 37], vec![0, 2, 3]),
                // The CPU's in-order channel sums: blocks of 16 slabs, split across threads.
                ([40, 12, 30, 31], vec![0, 2, 3]),
            ] {
                let x = input(
                    &mut rng,
                    &shape,
                    dtype,
                    &device,
                    Variant::Contiguous,
                    Range::Signed,
                );
                let ctx = |op: &str| format!("{op} {dtype} {device} {shape:?} {dims:?}");
                let got = x.t.sum(dims.clone(), true).unwrap();
                let (_, want) = reduce_ref(&x.vals, &shape, &dims, |g| g.iter().sum());
                assert_norm_close(&ctx("sum"), &values(&got), &want, tol(dtype));
                for (op, got, pick) in [
                    (
                        "max",
                        x.t.max(dims.clone(), true).unwrap(),
                        f64::max as fn(f64, f64) -> f64,
                    ),
                    ("min", x.t.min(dims.clone(), true).unwrap(), f64::min),
                ] {
                    let start = if op == "max" { f64::MIN } else { f64::MAX };
                    let (_, want) = reduce_ref(&x.vals, &shape, &dims, |g| {
                        g.iter().cloned().fold(start, pick)
                    });
                    assert_close(&ctx(op), &values(&got), &want, 0.0);
                }
            }
        }
    }
}

/// One long run of `n` random values with the maximum 7 at `maxes` and the minimum -7 at
/// `mins`, then NaNs at `nans`: the first extreme and the first NaN win, on every device.
fn check_long_run(seed: u64, n: usize, maxes: &[usize], mins: &[usize], nans: &[usize]) {
    let mut rng = Generator::new(seed);
    let mut v: Vec<f64> = (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect();
    for &i in maxes {
        v[i] = 7.0;
    }
    for &i in mins {
        v[i] = -7.0;
    }
    let first = |at: &[usize]| vec![*at.iter().min().expect("positions") as f64];
    for device in devices() {
        let x = tensor_of(&v, &[n], DType::F32, &device);
        assert_eq!(values(&x.argmax(0, false).unwrap()), first(maxes));
        assert_eq!(values(&x.argmin(0, false).unwrap()), first(mins));
        assert_eq!(values(&x.max(0, false).unwrap()), vec![7.0]);
        assert_eq!(values(&x.min(0, false).unwrap()), vec![-7.0]);
        let sum: f64 = v.iter().map(|&a| a as f32 as f64).sum();
        let got = values(&x.sum(0, false).unwrap())[0];
        assert!((got - sum).abs() < 1e-2, "sum {got} vs {sum} on {device}");
        let mut w = v.clone();
        for &i in nans {
            w[i] = f64::NAN;
        }
        let x = tensor_of(&w, &[n], DType::F32, &device);
        assert_eq!(values(&x.argmax(0, false).unwrap()), first(nans));
        assert_eq!(values(&x.argmin(0, false).unwrap()), first(nans));
        assert!(values(&x.max(0, false).unwrap())[0].is_nan());
        assert!(values(&x.sum(0, false).unwrap())[0].is_nan());
        // The same run as every other element of a longer one (a strided row).
        let interleaved: Vec<f64> = v.iter().flat_map(|&a| [a, 9.0]).collect();
        let x = tensor_of(&interleaved, &[n, 2], DType::F32, &device);
        let column = x.narrow(1, 0, 1).unwrap();
        assert_eq!(values(&column.argmax(0, false).unwrap()), first(maxes));
        assert_eq!(values(&column.argmin(0, false).unwrap()), first(mins));
    }
}

#[test]
fn long_runs_split_across_threads_keep_the_first_position() {
    // 300k elements: split across threads (or a GPU's workgroups) and merged in order.
    check_long_run(
        5,
        300_001,
        &[150_000, 250_000, 280_000],
        &[160_000, 290_000],
        &[290_001, 200_000],
    );
}

#[test]
fn runs_split_in_two_halves_keep_the_first_position() {
    // 700k elements: past the pool's grain, split in two halves (the second through the
    // CPU's helper thread) and merged in order; the extremes repeat in both halves.
    check_long_run(
        6,
        700_001,
        &[340_000, 350_000, 600_000],
        &[351_000, 650_000],
        &[690_000, 500_000],
    );
}

#[test]
fn runs_shared_in_chunks_keep_the_first_position() {
    // 4.5M elements: past the halves' limit, shared between the calling thread and the CPU's
    // helper in 16 chunks (281,251 elements each) and merged in order; the extremes repeat
    // in chunks the two threads take from opposite ends.
    check_long_run(
        7,
        4_500_001,
        &[600_000, 2_300_000, 4_400_000],
        &[600_001, 4_499_999],
        &[4_400_001, 1_000_000, 3_000_000],
    );
}

/// Softmax, log-softmax and logsumexp of rows long and many enough for the CPU's two
/// threads to share them in chunks of whole rows.
#[test]
fn softmax_rows_shared_between_threads_match_reference() {
    let mut rng = Generator::new(23);
    let shape = [1111, 1000];
    for device in devices() {
        let x = input(
            &mut rng,
            &shape,
            DType::F32,
            &device,
            Variant::Contiguous,
            Range::Signed,
        );
        let (_, lse) = reduce_ref(&x.vals, &shape, &[1], |g| {
            g.iter().map(|v| v.exp()).sum::<f64>().ln()
        });
        let ctx = format!("{shape:?} on {device}");
        let log_p: Vec<f64> = x
            .vals
            .iter()
            .enumerate()
            .map(|(i, &v)| v - lse[i / shape[1]])
            .collect();
        let p: Vec<f64> = log_p.iter().map(|v| v.exp()).collect();
        let tol = tol(DType::F32);
        assert_close(
            &format!("softmax {ctx}"),
            &values(&x.t.softmax(1).unwrap()),
            &p,
            tol,
        );
        assert_close(
            &format!("log_softmax {ctx}"),
            &values(&x.t.log_softmax(1).unwrap()),
            &log_p,
            tol,
        );
        assert_close(
            &format!("logsumexp {ctx}"),
            &values(&x.t.logsumexp(1, false).unwrap()),
            &lse,
            tol,
        );
    }
}

/// Infinities of both signs in one run, without a NaN: the CPU's vector max and min watch
/// for NaNs through a running sum, which turns NaN here too, so the result must come from
/// the check that follows. Large finite values whose lane sums overflow take the same road.
#[test]
fn max_and_min_of_runs_with_both_infinities_and_no_nan() {
    let mut rng = Generator::new(44);
    for n in [200, 1000, 4099] {
        let mut v: Vec<f64> = (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect();
        // Every position a multiple of 32 apart lands in the same lane of a 32-wide body.
        v[n / 2] = f64::INFINITY;
        v[n / 2 + 32] = f64::NEG_INFINITY;
        let mut big = v.clone();
        big[n / 2] = 3.0e38;
        big[n / 2 + 32] = f64::NEG_INFINITY;
        big[n / 2 + 64] = 3.0e38;
        for device in devices() {
            let x = tensor_of(&v, &[n], DType::F32, &device);
            assert_eq!(
                values(&x.max(0, false).unwrap()),
                vec![f64::INFINITY],
                "{n}"
            );
            assert_eq!(
                values(&x.min(0, false).unwrap()),
                vec![f64::NEG_INFINITY],
                "{n}"
            );
            assert_eq!(values(&x.argmax(0, false).unwrap()), vec![(n / 2) as f64]);
            let x = tensor_of(&big, &[n], DType::F32, &device);
            let m = values(&x.max(0, false).unwrap())[0];
            assert_eq!(m, 3.0e38f32 as f64, "{n} on {device}");
            assert_eq!(values(&x.min(0, false).unwrap()), vec![f64::NEG_INFINITY]);
        }
    }
}

#[test]
fn nan_propagates_through_max_and_argmax() {
    for device in devices() {
        let x = tensor_of(&[1.0, f64::NAN, 3.0, 2.0], &[4], DType::F32, &device);
        assert!(x
            .max(0, false)
            .unwrap()
            .to_device(&kiln::Device::Cpu)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
            .is_nan());
        assert_eq!(values(&x.argmax(0, false).unwrap()), vec![1.0]);
        assert_eq!(values(&x.argmin(0, false).unwrap()), vec![1.0]);
    }
}

/// Runs starting at every offset of a cache line (the CPU's vector reductions start their
/// body on a 64-byte boundary and take the elements before it apart), with the maximum and
/// then a NaN in those first elements, in the body and at the end.
#[test]
fn reductions_of_runs_at_every_alignment() {
    let mut rng = Generator::new(31);
    let len = 1000;
    let vals = random_vals(&mut rng, len + 20, DType::F32, Range::Signed);
    for device in devices() {
        for start in 0..20 {
            for special in [
                None,
                Some((3, 50.0)),
                Some((3, f64::NAN)),
                Some((700, f64::NAN)),
                Some((len - 1, 50.0)),
            ] {
                let mut v = vals.clone();
                if let Some((at, x)) = special {
                    v[start + at] = x;
                }
                let full = tensor_of(&v, &[len + 20], DType::F32, &device);
                let x = full.narrow(0, start, len).unwrap();
                let run = &v[start..start + len];
                let ctx = format!("run at {start} with {special:?} on {device}");
                let sum: f64 = run.iter().sum();
                let got = values(&x.sum(0, false).unwrap())[0];
                if sum.is_nan() {
                    assert!(got.is_nan(), "sum of {ctx}: {got}");
                } else {
                    assert_close(&format!("sum of {ctx}"), &[got], &[sum], 1e-5);
                }
                let max = values(&x.max(0, false).unwrap())[0];
                // The first NaN wins (as in PyTorch), else the first maximum.
                let want = match run.iter().position(|v| v.is_nan()) {
                    Some(i) => i as f64,
                    None => argext(run, true),
                };
                assert_eq!(
                    values(&x.argmax(0, false).unwrap()),
                    vec![want],
                    "argmax of {ctx}"
                );
                if run.iter().any(|v| v.is_nan()) {
                    assert!(max.is_nan(), "max of {ctx}: {max}");
                } else {
                    assert_eq!(max, run[want as usize], "max of {ctx}");
                }
            }
        }
    }
}

#[test]
fn sum_all_and_empty_dim_set() {
    let d = kiln::Device::Cpu;
    let x = Tensor::arange(1.0, 7.0, 1.0, DType::F64, &d)
        .unwrap()
        .reshape([2, 3])
        .unwrap();
    assert_eq!(
        x.sum(AllDims, false).unwrap().to_scalar::<f64>().unwrap(),
        21.0
    );
    assert_eq!(x.sum(AllDims, false).unwrap().rank(), 0);
    assert_eq!(
        x.sum(Vec::<usize>::new(), false)
            .unwrap()
            .to_vec::<f64>()
            .unwrap(),
        x.to_vec::<f64>().unwrap()
    );
}

#[test]
fn softmax_and_log_softmax_match_reference() {
    let mut rng = Generator::new(12);
    for device in devices() {
        for dtype in FLOATS {
            if !supports(&device, dtype) {
                continue;
            }
            for variant in VARIANTS {
                for _ in 0..3 {
                    let shape = random_shape(&mut rng, 1, 4);
                    let dim = rng.below(shape.len());
                    let x = input(&mut rng, &shape, dtype, &device, variant, Range::Signed);
                    let (_, lse) = reduce_ref(&x.vals, &shape, &[dim], |g| {
                        g.iter().map(|v| v.exp()).sum::<f64>().ln()
                    });
                    let out_shape: Vec<usize> = shape
                        .iter()
                        .enumerate()
                        .map(|(i, &d)| if i == dim { 1 } else { d })
                        .collect();
                    let lse_at = |i: usize| {
                        let mut idx = unravel(i, &shape);
                        idx[dim] = 0;
                        lse[ravel(&idx, &out_shape)]
                    };
                    let ctx = format!("{dtype} {device} {variant:?} {shape:?} dim {dim}");
                    let want: Vec<f64> = x
                        .vals
                        .iter()
                        .enumerate()
                        .map(|(i, &v)| (v - lse_at(i)).exp())
                        .collect();
                    assert_close(
                        &format!("softmax {ctx}"),
                        &values(&x.t.softmax(dim).unwrap()),
                        &want,
                        tol(dtype),
                    );
                    let want: Vec<f64> = x
                        .vals
                        .iter()
                        .enumerate()
                        .map(|(i, &v)| v - lse_at(i))
                        .collect();
                    assert_close(
                        &format!("log_softmax {ctx}"),
                        &values(&x.t.log_softmax(dim).unwrap()),
                        &want,
                        tol(dtype),
                    );
                }
            }
        }
    }
}

#[test]
fn softmax_is_stable_for_large_inputs() {
    for device in devices() {
        let x = tensor_of(&[1000.0, 1001.0, -1000.0, 999.0], &[4], DType::F32, &device);
        let s = values(&x.softmax(0).unwrap());
        let e = [(-1f64).exp(), 1.0, 0.0, (-2f64).exp()];
        let z: f64 = e.iter().sum();
        assert_close(
            "stable softmax",
            &s,
            &e.iter().map(|v| v / z).collect::<Vec<_>>(),
            1e-5,
        );
        let lse = values(&x.logsumexp(0, false).unwrap());
        assert_close("stable logsumexp", &lse, &[1001.0 + z.ln()], 1e-6);
    }
}

/// Rows with -inf (masked entries: exactly 0, and -inf in log-softmax), and rows whose max
/// is not finite (all -inf, a +inf, a NaN: NaN throughout, as in PyTorch), short and long
/// (the CPU's short-row and row kernels), for each dtype and device.
#[test]
fn softmax_of_masked_and_non_finite_rows() {
    let (inf, nan) = (f64::INFINITY, f64::NAN);
    for device in devices() {
        for dtype in FLOATS {
            if !supports(&device, dtype) {
                continue;
            }
            for n in [5usize, 100] {
                let masked: Vec<f64> = (0..n)
                    .map(|i| {
                        if i % 3 == 1 {
                            -inf
                        } else {
                            round_to((i as f64 * 0.37).sin(), dtype)
                        }
                    })
                    .collect();
                let lse = masked
                    .iter()
                    .filter(|v| v.is_finite())
                    .map(|v| v.exp())
                    .sum::<f64>()
                    .ln();
                let mut plus_inf = masked.clone();
                plus_inf[n / 2] = inf;
                let mut with_nan = masked.clone();
                with_nan[n - 1] = nan;
                let rows = [masked.clone(), vec![-inf; n], plus_inf, with_nan];
                let x = tensor_of(&rows.concat(), &[rows.len(), n], dtype, &device);
                let soft = values(&x.softmax(1).unwrap());
                let log = values(&x.log_softmax(1).unwrap());
                let ctx = format!("{dtype} {device} n={n}");
                for (i, &v) in masked.iter().enumerate() {
                    let (s, l) = (soft[i], log[i]);
                    if v == -inf {
                        assert_eq!(s, 0.0, "softmax {ctx}: a masked entry");
                        assert_eq!(l, -inf, "log_softmax {ctx}: a masked entry");
                    } else {
                        let want = v - lse;
                        let tol = tol(dtype);
                        assert!(
                            (s - want.exp()).abs() <= tol * want.exp().max(0.1),
                            "softmax {ctx} [{i}]: {s}"
                        );
                        assert!(
                            (l - want).abs() <= tol * want.abs().max(1.0),
                            "log_softmax {ctx} [{i}]: {l}"
                        );
                    }
                }
                for r in 1..rows.len() {
                    let got = soft[r * n..(r + 1) * n]
                        .iter()
                        .chain(&log[r * n..(r + 1) * n]);
                    assert!(
                        got.clone().all(|v| v.is_nan()),
                        "{ctx}: row {:?} gave {:?}",
                        &rows[r][..3],
                        got.collect::<Vec<_>>()
                    );
                }
            }
        }
    }
}

/// Column reductions on every path: of a contiguous `[R, C]` over R, and of its transposed
/// view (`[C, R]`, as a layer's bias gradient `gᵀ` is) over its last dim; few short columns
/// run as strided rows on CUDA (one launch), the others as the column kernel, split or not.
#[test]
fn column_reductions_of_matrices_and_transposed_views() {
    let mut rng = Generator::new(12);
    for device in devices() {
        for dtype in [DType::F32, DType::BF16] {
            if !supports(&device, dtype) {
                continue;
            }
            for (r, c) in [
                (256, 10),
                (5, 3),
                (2000, 31),
                (300, 40),
                (40_000, 4),
                (1, 7),
            ] {
                let x = input(
                    &mut rng,
                    &[r, c],
                    dtype,
                    &device,
                    Variant::Contiguous,
                    Range::Signed,
                );
                let (_, sums) = reduce_ref(&x.vals, &[r, c], &[0], |g| g.iter().sum());
                let (_, maxes) = reduce_ref(&x.vals, &[r, c], &[0], |g| {
                    g.iter().cloned().fold(f64::MIN, f64::max)
                });
                let (_, argmaxes) = reduce_ref(&x.vals, &[r, c], &[0], |g| argext(g, true));
                let xt = x.t.t().unwrap();
                for (view, t, dim) in [("[R, C] over R", &x.t, 0usize), ("its transpose", &xt, 1)] {
                    let ctx = format!("{dtype} {device} {r}x{c} {view}");
                    let got = t.sum(dim, false).unwrap();
                    assert_norm_close(&format!("sum {ctx}"), &values(&got), &sums, tol(dtype));
                    let got = t.max(dim, false).unwrap();
                    assert_close(&format!("max {ctx}"), &values(&got), &maxes, 0.0);
                    assert_eq!(
                        values(&t.argmax(dim, false).unwrap()),
                        argmaxes,
                        "argmax {ctx}"
                    );
                }
            }
        }
    }
}

/// logsumexp along one dim of long f32 rows (the CPU's fused kernel, with a vector body from
/// 32 elements), contiguous and transposed, against f64: the error is bounded by a few ulp of
/// the result plus the f32 sum's rounding; and its special values (as PyTorch: a row of -inf
/// gives -inf, +inf gives +inf, NaN gives NaN, an empty row -inf).
#[test]
fn logsumexp_of_long_rows_and_special_values() {
    let mut rng = Generator::new(77);
    for device in devices() {
        let mut worst_ulps = 0f64;
        for n in [1usize, 7, 10, 31, 32, 33, 100, 1000, 1024, 4096] {
            // Short rows go through the CPU's grouped kernel (~256 elements per group): many
            // rows make several groups and a partial last one.
            let rows = if n < 64 { 70 } else { 3 };
            let scale = [1.0, 30.0, 300.0][n % 3];
            let x = Tensor::randn([rows, n], 0.0, scale, DType::F32, &Device::Cpu, &mut rng)
                .unwrap()
                .to_device(&device)
                .unwrap();
            let vals = values(&x);
            for (view, dim) in [(x.clone(), 1usize), (x.t().unwrap(), 0)] {
                let got = values(&view.logsumexp(dim, false).unwrap());
                for r in 0..rows {
                    let row = &vals[r * n..(r + 1) * n];
                    let m = row.iter().cloned().fold(f64::MIN, f64::max);
                    let want = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
                    let ulp =
                        (want as f32).abs().max(f32::MIN_POSITIVE) as f64 * f32::EPSILON as f64;
                    let err = (got[r] - want).abs();
                    // The f32 sum of n terms in [0, 1] (at least one of them 1) rounds by at
                    // most ~(n/16 + 16) units of 2^-24 relative; ln turns that into absolute.
                    let sum_rounding = (n as f64 / 16.0 + 16.0) * f32::EPSILON as f64 / 2.0;
                    assert!(
                        err <= 4.0 * ulp + sum_rounding,
                        "logsumexp {device} n={n} dim={dim} row {r}: got {} want {want}",
                        got[r]
                    );
                    worst_ulps = worst_ulps.max(err / ulp);
                }
            }
        }
        eprintln!("logsumexp on {device}: worst error {worst_ulps:.2} ulp");
        let inf = f64::INFINITY;
        for (row, want) in [
            (vec![-inf; 40], -inf),
            (vec![-inf, 1.0, inf, 2.0], inf),
            (vec![1.0, f64::NAN, inf], f64::NAN),
            (vec![0.5; 40], 0.5 + 40f64.ln()),
        ] {
            let len = row.len();
            let t = tensor_of(&row, &[1, len], DType::F32, &device);
            let got = values(&t.logsumexp(1, false).unwrap())[0];
            assert!(
                got == want || (got.is_nan() && want.is_nan()) || (got - want).abs() < 1e-5,
                "logsumexp {device} of {row:?}: got {got}, want {want}"
            );
        }
        // The special rows among finite ones, in one tensor of short rows (one group).
        let rows = [
            vec![0.25, -1.0, 3.0],
            vec![-inf, -inf, -inf],
            vec![-inf, 1.0, inf],
            vec![1.0, f64::NAN, 2.0],
            vec![-2.0, 0.5, 1.5],
        ];
        let flat: Vec<f64> = rows.concat();
        let got = values(
            &tensor_of(&flat, &[rows.len(), 3], DType::F32, &device)
                .logsumexp(1, false)
                .unwrap(),
        );
        for (row, got) in rows.iter().zip(got) {
            let m = row.iter().cloned().fold(f64::MIN, f64::max);
            let want = match row {
                r if r.iter().any(|v| v.is_nan()) => f64::NAN,
                _ if m.is_infinite() => m,
                _ => m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln(),
            };
            assert!(
                got == want || (got.is_nan() && want.is_nan()) || (got - want).abs() < 1e-5,
                "logsumexp {device} of {row:?} among other rows: got {got}, want {want}"
            );
        }
        let empty = Tensor::zeros([2, 0], DType::F32, &device).unwrap();
        assert_eq!(
            values(&empty.logsumexp(1, false).unwrap()),
            vec![-inf, -inf],
            "logsumexp {device} of empty rows"
        );
    }
}
