//! Elementwise ops, comparisons, where and casts against f64 references, on every device,
//! dtype and layout variant.

mod common;
use common::*;
use kiln::{DType, Generator, Tensor};

type UnaryFn = fn(&Tensor) -> kiln::Result<Tensor>;
type BinaryFn = fn(&Tensor, &Tensor) -> kiln::Result<Tensor>;
type IntCase = (&'static str, UnaryFn, fn(f64) -> f64);
type CmpCase = (&'static str, BinaryFn, fn(f64, f64) -> bool);
type UnaryCase = (
    &'static str,
    fn(&Tensor) -> kiln::Result<Tensor>,
    fn(f64) -> f64,
    Range,
);

fn erf(x: f64) -> f64 {
    libm_erf(x)
}
// A reference erf independent of the library's: Abramowitz-Stegun 7.1.26 is too coarse for
// f64, so integrate the series directly (converges fast for |x| <= 3).
fn libm_erf(x: f64) -> f64 {
    let mut sum = 0.0f64;
    let mut term = x;
    let mut n = 0.0;
    while term.abs() > 1e-17 * sum.abs().max(1e-300) || n < 3.0 {
        sum += term / (2.0 * n + 1.0);
        n += 1.0;
        term *= -x * x / n;
        if n > 200.0 {
            break;
        }
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

fn unary_cases() -> Vec<UnaryCase> {
    vec![
        ("neg", Tensor::neg, |x| -x, Range::Signed),
        ("abs", Tensor::abs, f64::abs, Range::Signed),
        ("sqr", Tensor::sqr, |x| x * x, Range::Signed),
        ("relu", Tensor::relu, |x| x.max(0.0), Range::Signed),
        ("exp", Tensor::exp, f64::exp, Range::Signed),
        ("log", Tensor::log, f64::ln, Range::Positive),
        ("sqrt", Tensor::sqrt, f64::sqrt, Range::Positive),
        ("recip", Tensor::recip, |x| 1.0 / x, Range::Signed),
        ("sin", Tensor::sin, f64::sin, Range::Signed),
        ("cos", Tensor::cos, f64::cos, Range::Signed),
        ("tanh", Tensor::tanh, f64::tanh, Range::Signed),
        ("erf", Tensor::erf, erf, Range::Signed),
        (
            "sigmoid",
            Tensor::sigmoid,
            |x| 1.0 / (1.0 + (-x).exp()),
            Range::Signed,
        ),
        (
            "gelu",
            Tensor::gelu,
            |x| 0.5 * x * (1.0 + erf(x / 2f64.sqrt())),
            Range::Signed,
        ),
        (
            "gelu_tanh",
            Tensor::gelu_tanh,
            |x| {
                0.5 * x
                    * (1.0
                        + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
            },
            Range::Signed,
        ),
        (
            "silu",
            Tensor::silu,
            |x| x / (1.0 + (-x).exp()),
            Range::Signed,
        ),
        ("powf", |t| t.powf(1.7), |x| x.powf(1.7), Range::Positive),
        (
            "clamp",
            |t| t.clamp(-0.5, 0.7),
            |x| x.clamp(-0.5, 0.7),
            Range::Signed,
        ),
        (
            "add_scalar",
            |t| t.add_scalar(1.25),
            |x| x + 1.25,
            Range::Signed,
        ),
        (
            "sub_scalar",
            |t| t.sub_scalar(0.75),
            |x| x - 0.75,
            Range::Signed,
        ),
        (
            "mul_scalar",
            |t| t.mul_scalar(-1.5),
            |x| x * -1.5,
            Range::Signed,
        ),
        (
            "div_scalar",
            |t| t.div_scalar(4.0),
            |x| x / 4.0,
            Range::Signed,
        ),
        (
            "rsub_scalar",
            |t| t.rsub_scalar(2.0),
            |x| 2.0 - x,
            Range::Signed,
        ),
        (
            "rdiv_scalar",
            |t| t.rdiv_scalar(3.0),
            |x| 3.0 / x,
            Range::Signed,
        ),
        (
            "maximum_scalar",
            |t| t.maximum_scalar(0.3),
            |x| x.max(0.3),
            Range::Signed,
        ),
        (
            "minimum_scalar",
            |t| t.minimum_scalar(0.3),
            |x| x.min(0.3),
            Range::Signed,
        ),
    ]
}

#[test]
fn erf_reference_is_accurate() {
    assert!((erf(0.5) - 0.520_499_877_813_046_5).abs() < 1e-15);
    assert!((erf(-1.5) + 0.966_105_146_475_310_7).abs() < 1e-14);
}

#[test]
fn unary_float_ops_match_reference() {
    let mut rng = Generator::new(1);
    for device in devices() {
        for dtype in FLOATS {
            if !supports(&device, dtype) {
                continue;
            }
            for (name, op, reference, range) in unary_cases() {
                for variant in VARIANTS {
                    let shape = random_shape(&mut rng, 1, 4);
                    let x = input(&mut rng, &shape, dtype, &device, variant, range);
                    let y = op(&x.t).unwrap();
                    let ctx = format!("{name} {dtype} {device} {variant:?} {shape:?}");
                    assert_eq!(y.dims(), &shape[..], "{ctx}");
                    assert_eq!((y.dtype(), y.device()), (dtype, device), "{ctx}");
                    let want: Vec<f64> = x.vals.iter().map(|&v| reference(v)).collect();
                    assert_close(&ctx, &values(&y), &want, tol(dtype));
                }
            }
        }
    }
}

#[test]
fn unary_int_ops_match_reference() {
    let mut rng = Generator::new(2);
    let cases: Vec<IntCase> = vec![
        ("neg", Tensor::neg, |x| -x),
        ("abs", Tensor::abs, f64::abs),
        ("sqr", Tensor::sqr, |x| x * x),
        ("relu", Tensor::relu, |x| x.max(0.0)),
        ("clamp", |t| t.clamp(3.0, 9.0), |x| x.clamp(3.0, 9.0)),
        ("add_scalar", |t| t.add_scalar(5.0), |x| x + 5.0),
        ("mul_scalar", |t| t.mul_scalar(3.0), |x| x * 3.0),
        ("div_scalar", |t| t.div_scalar(3.0), |x| (x / 3.0).trunc()),
        ("rsub_scalar", |t| t.rsub_scalar(7.0), |x| 7.0 - x),
    ];
    for device in devices() {
        for dtype in INTS {
            if !supports(&device, dtype) {
                continue;
            }
            for &(name, op, reference) in &cases {
                for variant in VARIANTS {
                    let shape = random_shape(&mut rng, 1, 3);
                    let x = input(&mut rng, &shape, dtype, &device, variant, Range::Signed);
                    let y = op(&x.t).unwrap();
                    let want: Vec<f64> = x
                        .vals
                        .iter()
                        .map(|&v| round_to(reference(v), dtype))
                        .collect();
                    assert_close(
                        &format!("{name} {dtype} {device} {variant:?}"),
                        &values(&y),
                        &want,
                        0.0,
                    );
                }
            }
        }
    }
}

#[test]
fn float_only_ops_reject_integers() {
    let x = Tensor::ones(3, DType::I64, &kiln::Device::Cpu).unwrap();
    for r in [
        x.exp(),
        x.log(),
        x.gelu(),
        x.softmax(0),
        x.powf(2.0),
        x.mean(0, false),
    ] {
        assert!(
            matches!(
                r,
                Err(kiln::Error::UnsupportedDType {
                    dtype: DType::I64,
                    ..
                })
            ),
            "{r:?}"
        );
    }
}

type BinaryCase = (
    &'static str,
    fn(&Tensor, &Tensor) -> kiln::Result<Tensor>,
    fn(f64, f64) -> f64,
);

fn binary_cases() -> Vec<BinaryCase> {
    vec![
        ("add", Tensor::add, |a, b| a + b),
        ("sub", Tensor::sub, |a, b| a - b),
        ("mul", Tensor::mul, |a, b| a * b),
        ("div", Tensor::div, |a, b| a / b),
        ("maximum", Tensor::maximum, f64::max),
        ("minimum", Tensor::minimum, f64::min),
        ("pow", Tensor::pow, f64::powf),
        ("relu_grad", Tensor::relu_grad, |g, x| {
            if x > 0.0 {
                g
            } else {
                0.0
            }
        }),
    ]
}

#[test]
fn binary_ops_match_reference_on_every_layout() {
    let mut rng = Generator::new(3);
    for device in devices() {
        for dtype in FLOATS.into_iter().chain(INTS) {
            if !supports(&device, dtype) {
                continue;
            }
            for (name, op, reference) in binary_cases() {
                if dtype.is_int() && name == "pow" {
                    continue;
                }
                for (va, vb) in VARIANTS.iter().zip(VARIANTS.iter().cycle().skip(2)) {
                    let shape = random_shape(&mut rng, 1, 4);
                    let range = if name == "pow" {
                        Range::Positive
                    } else {
                        Range::Signed
                    };
                    let a = input(&mut rng, &shape, dtype, &device, *va, range);
                    let b = input(&mut rng, &shape, dtype, &device, *vb, range);
                    let y = op(&a.t, &b.t).unwrap();
                    let want: Vec<f64> = a
                        .vals
                        .iter()
                        .zip(&b.vals)
                        .map(|(&x, &y)| {
                            let r = reference(x, y);
                            if dtype.is_int() {
                                round_to(if name == "div" { r.trunc() } else { r }, dtype)
                            } else {
                                r
                            }
                        })
                        .collect();
                    let ctx = format!("{name} {dtype} {device} {va:?}x{vb:?} {shape:?}");
                    assert_close(&ctx, &values(&y), &want, tol(dtype));
                }
            }
        }
    }
}

#[test]
fn in_place_binary_ops_match_reference() {
    // `x op= y` against f64, with `x` contiguous or narrowed (on the CPU, in place row by
    // row; f16/bf16 staged through f32), `y` of every layout.
    use kiln::op::BinaryOp;
    type Case = (BinaryOp, fn(f64, f64) -> f64);
    let cases: [Case; 8] = [
        (BinaryOp::Add, |a, b| a + b),
        (BinaryOp::Sub, |a, b| a - b),
        (BinaryOp::Mul, |a, b| a * b),
        (BinaryOp::Div, |a, b| a / b),
        (BinaryOp::Maximum, f64::max),
        (BinaryOp::Minimum, f64::min),
        (BinaryOp::Pow, f64::powf),
        (BinaryOp::ReluGrad, |g, x| if x > 0.0 { g } else { 0.0 }),
    ];
    let mut rng = Generator::new(13);
    for device in devices() {
        for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            if !supports(&device, dtype) {
                continue;
            }
            for (op, reference) in cases {
                let range = if op == BinaryOp::Pow {
                    Range::Positive
                } else {
                    Range::Signed
                };
                for (vx, vy) in [Variant::Contiguous, Variant::Narrowed]
                    .into_iter()
                    .flat_map(|vx| VARIANTS.into_iter().map(move |vy| (vx, vy)))
                {
                    let shape = random_shape(&mut rng, 1, 4);
                    let x = input(&mut rng, &shape, dtype, &device, vx, range);
                    let y = input(&mut rng, &shape, dtype, &device, vy, range);
                    x.t.binary_assign(&y.t, op).unwrap();
                    let want: Vec<f64> = x
                        .vals
                        .iter()
                        .zip(&y.vals)
                        .map(|(&a, &b)| reference(a, b))
                        .collect();
                    let ctx = format!("{op:?}= {dtype} {device} {vx:?}x{vy:?} {shape:?}");
                    assert_close(&ctx, &values(&x.t), &want, tol(dtype));
                }
            }
        }
        // Large enough for the CPU's threads (and, in bf16, many staging blocks).
        for dtype in [DType::F32, DType::BF16] {
            if !supports(&device, dtype) {
                continue;
            }
            let mut large = || {
                let shape = [1 << 20];
                input(
                    &mut rng,
                    &shape,
                    dtype,
                    &device,
                    Variant::Contiguous,
                    Range::Signed,
                )
            };
            let (x, y) = (large(), large());
            x.t.add_assign(&y.t).unwrap();
            let want: Vec<f64> = x.vals.iter().zip(&y.vals).map(|(a, b)| a + b).collect();
            assert_close(
                &format!("add_assign 1M {dtype} on {device}"),
                &values(&x.t),
                &want,
                tol(dtype),
            );
            // A large strided destination (the CPU splits its rows across threads), from a
            // transposed and a broadcast source.
            let shape = [384, 700];
            for (vx, vy) in [
                (Variant::Narrowed, Variant::Transposed),
                (Variant::Stepped, Variant::Broadcast),
                (Variant::Transposed, Variant::Contiguous),
            ] {
                let x = input(&mut rng, &shape, dtype, &device, vx, Range::Signed);
                let y = input(&mut rng, &shape, dtype, &device, vy, Range::Signed);
                x.t.binary_assign(&y.t, kiln::op::BinaryOp::Mul).unwrap();
                let want: Vec<f64> = x.vals.iter().zip(&y.vals).map(|(a, b)| a * b).collect();
                assert_close(
                    &format!("mul_assign {shape:?} {dtype} {vx:?}x{vy:?} on {device}"),
                    &values(&x.t),
                    &want,
                    tol(dtype),
                );
            }
        }
    }
}

#[test]
fn binary_ops_broadcast_numpy_style() {
    let mut rng = Generator::new(4);
    let pairs: [(&[usize], &[usize]); 5] = [
        (&[3, 1, 4], &[5, 1]),
        (&[1], &[2, 3]),
        (&[2, 3, 4], &[4]),
        (&[6, 1], &[1, 7]),
        (&[], &[3, 2]),
    ];
    for device in devices() {
        for dtype in [DType::F32, DType::BF16, DType::I64] {
            if !supports(&device, dtype) {
                continue;
            }
            for (sa, sb) in pairs {
                for (name, op, reference) in binary_cases().into_iter().take(4) {
                    let a = input(
                        &mut rng,
                        sa,
                        dtype,
                        &device,
                        Variant::Contiguous,
                        Range::Signed,
                    );
                    let b = input(
                        &mut rng,
                        sb,
                        dtype,
                        &device,
                        Variant::Narrowed,
                        Range::Signed,
                    );
                    let y = op(&a.t, &b.t).unwrap();
                    let out = broadcast_shape(sa, sb);
                    assert_eq!(y.dims(), &out[..]);
                    let want: Vec<f64> = (0..out.iter().product())
                        .map(|i| {
                            let idx = unravel(i, &out);
                            let r = reference(
                                a.vals[bcast_index(&idx, sa)],
                                b.vals[bcast_index(&idx, sb)],
                            );
                            if dtype.is_int() {
                                round_to(if name == "div" { r.trunc() } else { r }, dtype)
                            } else {
                                r
                            }
                        })
                        .collect();
                    assert_close(
                        &format!("{name} {dtype} {device} {sa:?}+{sb:?}"),
                        &values(&y),
                        &want,
                        tol(dtype),
                    );
                }
            }
        }
    }
}

#[test]
fn operators_and_scalars() {
    let d = kiln::Device::Cpu;
    let a = Tensor::from_vec(vec![1f32, 2., 3.], 3, &d).unwrap();
    let b = Tensor::from_vec(vec![4f32, 5., 6.], 3, &d).unwrap();
    assert_eq!(
        (&a + &b).unwrap().to_vec::<f32>().unwrap(),
        vec![5., 7., 9.]
    );
    assert_eq!(
        (&a - &b).unwrap().to_vec::<f32>().unwrap(),
        vec![-3., -3., -3.]
    );
    assert_eq!(
        (&a * 2.0).unwrap().to_vec::<f32>().unwrap(),
        vec![2., 4., 6.]
    );
    assert_eq!(
        (&b / &a).unwrap().to_vec::<f32>().unwrap(),
        vec![4., 2.5, 2.]
    );
    assert_eq!((-&a).unwrap().to_vec::<f32>().unwrap(), vec![-1., -2., -3.]);
    // Integer division by zero gives 0, never a panic.
    let i = Tensor::from_vec(vec![7i64, -7], 2, &d).unwrap();
    let z = Tensor::from_vec(vec![0i64, 2], 2, &d).unwrap();
    assert_eq!(i.div(&z).unwrap().to_vec::<i64>().unwrap(), vec![0, -3]);
}

#[test]
fn comparisons_and_where_match_reference() {
    let mut rng = Generator::new(5);
    let cmps: [CmpCase; 6] = [
        ("eq", Tensor::eq, |a, b| a == b),
        ("ne", Tensor::ne, |a, b| a != b),
        ("lt", Tensor::lt, |a, b| a < b),
        ("le", Tensor::le, |a, b| a <= b),
        ("gt", Tensor::gt, |a, b| a > b),
        ("ge", Tensor::ge, |a, b| a >= b),
    ];
    for device in devices() {
        for dtype in FLOATS.into_iter().chain(INTS) {
            if !supports(&device, dtype) {
                continue;
            }
            for variant in VARIANTS {
                let shape = random_shape(&mut rng, 1, 3);
                let a = input(&mut rng, &shape, dtype, &device, variant, Range::Signed);
                // Half of b equals a, so eq/le/ge see ties.
                let bv: Vec<f64> = a
                    .vals
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| {
                        if i % 2 == 0 {
                            v
                        } else {
                            round_to(v * 0.5 + 1.0, dtype)
                        }
                    })
                    .collect();
                let b = tensor_of(&bv, &shape, dtype, &device);
                for (name, op, reference) in cmps {
                    let y = op(&a.t, &b).unwrap();
                    assert_eq!(y.dtype(), DType::U8);
                    let want: Vec<f64> = a
                        .vals
                        .iter()
                        .zip(&bv)
                        .map(|(&x, &y)| reference(x, y) as u8 as f64)
                        .collect();
                    assert_close(
                        &format!("{name} {dtype} {device} {variant:?}"),
                        &values(&y),
                        &want,
                        0.0,
                    );
                }
                let gt = a.t.gt_scalar(0.5).unwrap();
                let want: Vec<f64> = a
                    .vals
                    .iter()
                    .map(|&x| (x > round_to(0.5, dtype)) as u8 as f64)
                    .collect();
                assert_close(
                    &format!("gt_scalar {dtype} {device}"),
                    &values(&gt),
                    &want,
                    0.0,
                );
                // where_cond with a broadcast condition row.
                let cond = tensor_of(&[1.0, 0.0, 1.0], &[3], DType::U8, &device);
                let shape2 = [4, 3];
                let t = input(&mut rng, &shape2, dtype, &device, variant, Range::Signed);
                let f = input(
                    &mut rng,
                    &shape2,
                    dtype,
                    &device,
                    Variant::Contiguous,
                    Range::Signed,
                );
                let y = cond.where_cond(&t.t, &f.t).unwrap();
                let want: Vec<f64> = (0..12)
                    .map(|i| if i % 3 != 1 { t.vals[i] } else { f.vals[i] })
                    .collect();
                assert_close(
                    &format!("where {dtype} {device} {variant:?}"),
                    &values(&y),
                    &want,
                    0.0,
                );
            }
        }
    }
}

#[test]
fn casts_between_every_dtype_pair() {
    let mut rng = Generator::new(6);
    for device in devices() {
        for from in DType::ALL {
            if !supports(&device, from) {
                continue;
            }
            for to in DType::ALL {
                if !supports(&device, to) {
                    continue;
                }
                for variant in [Variant::Contiguous, Variant::Transposed, Variant::Broadcast] {
                    let shape = random_shape(&mut rng, 2, 3);
                    // Values representable in both dtypes' common range: small positive
                    // integers and halves.
                    let x = input(&mut rng, &shape, from, &device, variant, Range::Positive);
                    let y = x.t.to_dtype(to).unwrap();
                    assert_eq!(y.dtype(), to);
                    let want: Vec<f64> = x
                        .vals
                        .iter()
                        .map(|&v| round_to(if to.is_int() { v.trunc() } else { v }, to))
                        .collect();
                    assert_close(
                        &format!("cast {from}->{to} {device} {variant:?}"),
                        &values(&y),
                        &want,
                        0.0,
                    );
                }
            }
        }
    }
}

/// Dropout masks: 0 or `1/(1-p)`, about `1-p` of them kept, and on every device and float
/// dtype the same mask as the CPU's in f64 from the same seed and step (the same hash); each
/// mask advances the step, so the next one differs; `dropout` is the input times the mask.
#[test]
fn dropout_masks_are_the_same_on_every_device_and_new_at_each_step() {
    use kiln::DropoutStream;
    let (rows, cols, p) = (37usize, 129usize, 0.3);
    let n = rows * cols;
    let reference = values(
        &DropoutStream::at_step(11, 5, &kiln::Device::Cpu)
            .unwrap()
            .mask([rows, cols], DType::F64, p)
            .unwrap(),
    );
    let kept = reference.iter().filter(|&&v| v != 0.0).count() as f64;
    let (mean, sd) = (n as f64 * (1.0 - p), (n as f64 * p * (1.0 - p)).sqrt());
    assert!((kept - mean).abs() < 6.0 * sd, "{kept} kept of {n}");
    assert!(reference.iter().all(|&v| v == 0.0 || v == 1.0 / (1.0 - p)));
    let mut rng = Generator::new(4);
    for device in devices() {
        for dtype in FLOATS {
            if !supports(&device, dtype) {
                continue;
            }
            let ctx = format!("dropout mask {device} {dtype:?}");
            let stream = DropoutStream::at_step(11, 5, &device).unwrap();
            let mask = stream.mask([rows, cols], dtype, p).unwrap();
            assert_eq!(
                (mask.dims(), mask.dtype()),
                (&[rows, cols][..], dtype),
                "{ctx}"
            );
            let got = values(&mask);
            for (g, r) in got.iter().zip(&reference) {
                assert_eq!(*g == 0.0, *r == 0.0, "{ctx}: a different keep pattern");
            }
            assert_close(&ctx, &got, &reference, tol(dtype));
            assert_eq!(stream.step().unwrap(), 6, "{ctx}: the step advances by one");
            let next = values(&stream.mask([rows, cols], dtype, p).unwrap());
            let same = next.iter().zip(&got).filter(|(a, b)| a == b).count() as f64;
            // Two independent masks agree on p² + (1-p)² of the elements (58%).
            assert!(
                same / (n as f64) < 0.65,
                "{ctx}: the next mask repeats this one"
            );
            // dropout = x · mask, here on a transposed view.
            let xs = random_vals(&mut rng, n, dtype, Range::Signed);
            let x = tensor_of(&xs, &[cols, rows], dtype, &device).t().unwrap();
            let y = x
                .dropout(p, &DropoutStream::at_step(11, 5, &device).unwrap())
                .unwrap();
            let xv = values(&x);
            let want: Vec<f64> = xv.iter().zip(&reference).map(|(a, m)| a * m).collect();
            assert_close(
                &format!("{ctx}: x·mask"),
                &values(&y),
                &want,
                2.0 * tol(dtype),
            );
        }
    }
}

#[test]
fn dropout_refuses_bad_probabilities_and_integer_dtypes() {
    let stream = kiln::DropoutStream::new(0, &kiln::Device::Cpu).unwrap();
    for p in [1.0, -0.1, f64::NAN] {
        let err = stream.mask(4, DType::F32, p).unwrap_err().to_string();
        assert!(err.contains("dropout") && err.contains("p ="), "{err}");
    }
    let err = stream.mask(4, DType::I64, 0.5).unwrap_err().to_string();
    assert!(
        err.contains("dropout") && err.to_lowercase().contains("i64"),
        "{err}"
    );
    assert_eq!(
        stream.step().unwrap(),
        0,
        "refused draws do not advance the stream"
    );
}

/// Maps long enough for the CPU's two threads to share them in chunks (the calling thread
/// taking chunks from the front, the helper from the back): every element is written once
/// and right, for a contiguous run of odd length and for the rows of a narrowed view.
#[test]
fn maps_shared_between_threads_write_every_element() {
    let mut rng = Generator::new(21);
    for device in devices() {
        for (shape, variant) in [
            (vec![2_000_007], Variant::Contiguous),
            (vec![1501, 1403], Variant::Narrowed),
        ] {
            let mut operand = || {
                input(
                    &mut rng,
                    &shape,
                    DType::F32,
                    &device,
                    variant,
                    Range::Signed,
                )
            };
            let (x, y) = (operand(), operand());
            let ctx = format!("{shape:?} {variant:?} on {device}");
            let want: Vec<f64> = x.vals.iter().zip(&y.vals).map(|(a, b)| a + b).collect();
            assert_close(
                &format!("add {ctx}"),
                &values(&x.t.add(&y.t).unwrap()),
                &want,
                tol(DType::F32),
            );
            let want: Vec<f64> = x.vals.iter().map(|a| a.exp()).collect();
            assert_close(
                &format!("exp {ctx}"),
                &values(&x.t.exp().unwrap()),
                &want,
                tol(DType::F32),
            );
        }
    }
}
