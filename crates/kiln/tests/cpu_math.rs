//! Accuracy of the CPU's vectorised f32 functions in ulp, over the whole f32 range, at every
//! instruction-set level this machine runs (the baseline always among them), against f64
//! references. NaN in gives NaN out; special values (±0, ±inf, subnormals) give what the
//! reference gives, rounded. The bounds asserted are the worst errors measured on AVX2 + FMA
//! and on the baseline, rounded up; the doc comments in `backend/cpu/simd/math.rs` state
//! them. `cargo test --release -p kiln --test cpu_math -- --nocapture` prints the table.

use kiln::{DType, Device, SimdLevel, Tensor};
use std::sync::Mutex;

/// The SIMD level is process-wide: tests that set it take turns.
static LEVEL: Mutex<()> = Mutex::new(());

type Op = fn(&Tensor) -> kiln::Result<Tensor>;

struct Case {
    name: &'static str,
    op: Op,
    reference: fn(f64) -> f64,
    /// Worst error allowed, in ulp of the correctly rounded result.
    max_ulp: f64,
}

fn gelu_tanh_ref(x: f64) -> f64 {
    let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
    x / (1.0 + (-2.0 * u).exp())
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "exp",
            op: Tensor::exp,
            reference: f64::exp,
            max_ulp: 1.02,
        },
        Case {
            name: "log",
            op: Tensor::log,
            reference: f64::ln,
            max_ulp: 1.0,
        },
        Case {
            name: "tanh",
            op: Tensor::tanh,
            reference: f64::tanh,
            // 1.31 scalar and AVX2, 1.92 in AVX-512's division-free kernel.
            max_ulp: 2.0,
        },
        Case {
            name: "sigmoid",
            op: Tensor::sigmoid,
            reference: |x| 1.0 / (1.0 + (-x).exp()),
            max_ulp: 3.0,
        },
        Case {
            name: "silu",
            op: Tensor::silu,
            reference: |x| x / (1.0 + (-x).exp()),
            max_ulp: 4.0,
        },
        Case {
            name: "erf",
            op: Tensor::erf,
            reference: libm::erf,
            max_ulp: 2.5,
        },
        Case {
            name: "gelu",
            op: Tensor::gelu,
            reference: |x| x * 0.5 * libm::erfc(-x / std::f64::consts::SQRT_2),
            max_ulp: 8.0,
        },
        Case {
            name: "gelu_tanh",
            op: Tensor::gelu_tanh,
            reference: gelu_tanh_ref,
            max_ulp: 4.0,
        },
        Case {
            name: "sqrt",
            op: Tensor::sqrt,
            reference: f64::sqrt,
            max_ulp: 0.5,
        },
        Case {
            name: "recip",
            op: Tensor::recip,
            reference: |x| 1.0 / x,
            max_ulp: 0.5,
        },
    ]
}

/// The spacing of f32 values at `v` (the subnormal spacing below the normal range).
fn ulp(v: f32) -> f64 {
    let a = v.abs();
    if !a.is_finite() || a == f32::MAX {
        return 2f64.powi(104);
    }
    if a < f32::MIN_POSITIVE {
        return 2f64.powi(-149);
    }
    (f32::from_bits(a.to_bits() + 1) as f64) - a as f64
}

/// Error of `y` against the exact `r` in ulp, or `None` when one is NaN and the other not,
/// or an infinity is wrong.
fn ulp_error(y: f32, r: f64) -> Option<f64> {
    if r.is_nan() || y.is_nan() {
        return (r.is_nan() && y.is_nan()).then_some(0.0);
    }
    let rf = r as f32;
    if y == rf {
        return Some(0.0);
    }
    if y.is_infinite() || r.is_infinite() {
        // Allowed only at the overflow boundary: r rounds to MAX or inf.
        let near =
            r.abs() >= f32::MAX as f64 && y.abs() >= f32::MAX && y.signum() as f64 == r.signum();
        return near.then_some(1.0);
    }
    Some((y as f64 - r).abs() / ulp(rf))
}

/// Every `step`-th f32 bit pattern, plus special values.
fn inputs(step: u32) -> Vec<f32> {
    let mut v: Vec<f32> = (0..=u32::MAX / step)
        .map(|i| f32::from_bits(i * step))
        .collect();
    v.extend([
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
        f32::from_bits(1),
        f32::from_bits(0x8000_0001),
        f32::MAX,
        f32::MIN,
        88.72,
        88.73,
        -87.33,
        -103.9,
        -104.0,
        0.625,
        -0.625,
        0.75,
        -0.75,
    ]);
    // Dense where the functions bend: every 3rd float in [-16, 16] would be 10^9 values, so
    // a regular grid of 2^22 points instead.
    v.extend((0..1 << 22).map(|i| -16.0 + 32.0 * i as f32 / (1 << 22) as f32));
    v
}

#[derive(Default)]
struct Worst {
    ulp: f64,
    at: f32,
    got: f32,
    want: f64,
}

fn measure(case: &Case, xs: &[f32]) -> Result<Worst, String> {
    let mut worst = Worst::default();
    for chunk in xs.chunks(1 << 22) {
        let t = Tensor::from_vec(chunk.to_vec(), chunk.len(), &Device::Cpu).unwrap();
        let y = (case.op)(&t).unwrap().to_vec::<f32>().unwrap();
        for (&x, &y) in chunk.iter().zip(&y) {
            let r = (case.reference)(x as f64);
            let Some(e) = ulp_error(y, r) else {
                return Err(format!(
                    "{}({x:e}) = {y:e}, reference {r:e}: NaN or infinity mismatch",
                    case.name
                ));
            };
            if e > worst.ulp {
                worst = Worst {
                    ulp: e,
                    at: x,
                    got: y,
                    want: r,
                };
            }
        }
    }
    Ok(worst)
}

fn levels() -> Vec<SimdLevel> {
    let mut v = vec![SimdLevel::Scalar];
    if SimdLevel::best() != SimdLevel::Scalar {
        v.push(SimdLevel::best());
    }
    v
}

#[test]
fn vectorised_functions_stay_within_their_ulp_bounds_at_every_level() {
    let _turn = LEVEL.lock().unwrap_or_else(|e| e.into_inner());
    let before = kiln::simd_level();
    let xs = inputs(97);
    let mut failures = Vec::new();
    for level in levels() {
        kiln::set_simd_level(level).unwrap();
        for case in cases() {
            match measure(&case, &xs) {
                Err(e) => failures.push(format!("[{level}] {e}")),
                Ok(w) => {
                    println!(
                        "{level:>7} {:<10} worst {:.2} ulp at x = {:e} (got {:e}, want {:e})",
                        case.name, w.ulp, w.at, w.got, w.want
                    );
                    if w.ulp > case.max_ulp {
                        failures.push(format!(
                            "[{level}] {}: {:.2} ulp > {} at x = {:e} (got {:e}, want {:e})",
                            case.name, w.ulp, case.max_ulp, w.at, w.got, w.want
                        ));
                    }
                }
            }
        }
    }
    kiln::set_simd_level(before).unwrap();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The 16-bit floats compute in f32 and round once: their results are the f32 results
/// rounded, so they are within half an ulp of their own type plus the f32 error.
#[test]
fn half_precision_results_are_the_f32_results_rounded() {
    let _turn = LEVEL.lock().unwrap_or_else(|e| e.into_inner());
    for dtype in [DType::F16, DType::BF16] {
        // Every finite value of the type with |x| <= 20.
        let xs: Vec<f32> = (0..=u16::MAX)
            .map(|b| match dtype {
                DType::F16 => kiln::f16::from_bits(b).to_f32(),
                _ => kiln::bf16::from_bits(b).to_f32(),
            })
            .filter(|x| x.abs() <= 20.0)
            .collect();
        let t = Tensor::from_vec(xs.clone(), xs.len(), &Device::Cpu).unwrap();
        let h = t.to_dtype(dtype).unwrap();
        for case in cases() {
            let want = (case.op)(&t).unwrap().to_vec::<f32>().unwrap();
            let got = (case.op)(&h)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            let want_rounded = Tensor::from_vec(want.clone(), want.len(), &Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            for ((x, g), w) in xs.iter().zip(&got).zip(&want_rounded) {
                let same = g == w || (g.is_nan() && w.is_nan());
                assert!(same, "{} {dtype:?}({x}) = {g}, f32 rounded {w}", case.name);
            }
        }
    }
}
