//! Shared harness of the op-test suite: the devices under test, random inputs in every
//! layout variant with their f64 reference values, and dtype-aware comparisons.
#![allow(dead_code)]

use kiln::{bf16, f16, DType, Device, Generator, Tensor};

pub mod conv;

/// The devices every op test runs on: the CPU, plus CUDA device 0 and wgpu adapter 0 when
/// they work. With `KILN_REQUIRE_CUDA=1` (`KILN_REQUIRE_WGPU=1`), a missing CUDA device
/// (wgpu adapter) fails the test instead of skipping it.
pub fn devices() -> Vec<Device> {
    let mut v = vec![Device::Cpu];
    for (device, var) in [
        (Device::Cuda(0), "KILN_REQUIRE_CUDA"),
        (Device::Wgpu(0), "KILN_REQUIRE_WGPU"),
    ] {
        match Tensor::zeros(1, DType::F32, &device) {
            Ok(_) => v.push(device),
            Err(e) => {
                if std::env::var(var).is_ok_and(|v| v == "1") {
                    panic!("{var}=1 but {device} is unusable: {e}");
                }
            }
        }
    }
    v
}

/// Whether `device` holds tensors of `dtype`: wgpu devices have no f64 or bf16 (and f16
/// only where the adapter has it); their refusal is tested in `tests/wgpu.rs`.
pub fn supports(device: &Device, dtype: DType) -> bool {
    device.supports(dtype)
}

pub const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];
pub const INTS: [DType; 3] = [DType::U8, DType::U32, DType::I64];

/// Relative tolerance of results computed in `dtype`.
pub fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-12,
        DType::F32 => 1e-5,
        DType::F16 | DType::BF16 => 1e-2,
        _ => 0.0,
    }
}

/// `v` rounded to the nearest value of `dtype` (wrapping integers as the dtype does).
pub fn round_to(v: f64, dtype: DType) -> f64 {
    match dtype {
        DType::F16 => f16::from_f64(v).to_f64(),
        DType::BF16 => bf16::from_f64(v).to_f64(),
        DType::F32 => v as f32 as f64,
        DType::F64 => v,
        DType::U8 => (v as i64).rem_euclid(256) as f64,
        DType::U32 => (v as i64).rem_euclid(1 << 32) as f64,
        DType::I64 => v.trunc(),
    }
}

/// A tensor of `dtype` on `device` holding `vals` (already representable).
pub fn tensor_of(vals: &[f64], shape: &[usize], dtype: DType, device: &Device) -> Tensor {
    fn mk<T: kiln::WithDType>(vals: &[f64], shape: &[usize], device: &Device) -> Tensor {
        Tensor::from_vec(
            vals.iter().map(|&v| T::from_f64(v)).collect::<Vec<T>>(),
            shape,
            device,
        )
        .unwrap()
    }
    match dtype {
        DType::F16 => mk::<f16>(vals, shape, device),
        DType::BF16 => mk::<bf16>(vals, shape, device),
        DType::F32 => mk::<f32>(vals, shape, device),
        DType::F64 => mk::<f64>(vals, shape, device),
        DType::U8 => mk::<u8>(vals, shape, device),
        DType::U32 => mk::<u32>(vals, shape, device),
        DType::I64 => mk::<i64>(vals, shape, device),
    }
}

/// Value ranges for random data: never zero.
#[derive(Clone, Copy, Debug)]
pub enum Range {
    /// ±[0.1, 2] for floats; small non-zero integers for integer dtypes.
    Signed,
    /// [0.1, 3]: for log, sqrt, pow bases.
    Positive,
}

pub fn random_vals(rng: &mut Generator, n: usize, dtype: DType, range: Range) -> Vec<f64> {
    (0..n)
        .map(|_| {
            let v = match (dtype, range) {
                (DType::U8, _) => 1.0 + rng.below(12) as f64,
                (DType::U32, _) => 1.0 + rng.below(1000) as f64,
                (DType::I64, Range::Signed) => {
                    let m = 1.0 + rng.below(1000) as f64;
                    if rng.below(2) == 0 {
                        m
                    } else {
                        -m
                    }
                }
                (DType::I64, Range::Positive) => 1.0 + rng.below(1000) as f64,
                (_, Range::Signed) => {
                    let m = rng.uniform(0.1, 2.0);
                    if rng.below(2) == 0 {
                        m
                    } else {
                        -m
                    }
                }
                (_, Range::Positive) => rng.uniform(0.1, 3.0),
            };
            round_to(v, dtype)
        })
        .collect()
}

pub fn random_shape(rng: &mut Generator, min_rank: usize, max_rank: usize) -> Vec<usize> {
    let rank = min_rank + rng.below(max_rank - min_rank + 1);
    (0..rank).map(|_| 1 + rng.below(6)).collect()
}

/// How an input's layout is made.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Variant {
    Contiguous,
    /// The last two dims are a transposed view.
    Transposed,
    /// Every dim narrowed out of a larger tensor (non-zero offset).
    Narrowed,
    /// The last dim sliced with step 2 and the first with step 3.
    Stepped,
    /// One dim (and, from rank 2 on, the leading dim) broadcast with stride 0.
    Broadcast,
}

pub const VARIANTS: [Variant; 5] = [
    Variant::Contiguous,
    Variant::Transposed,
    Variant::Narrowed,
    Variant::Stepped,
    Variant::Broadcast,
];

/// A test input: the tensor (a view of the given variant) and its logical values, row-major.
pub struct Input {
    pub t: Tensor,
    pub vals: Vec<f64>,
    pub shape: Vec<usize>,
}

pub fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = i % shape[d].max(1);
        i /= shape[d].max(1);
    }
    idx
}

pub fn ravel(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |acc, (&i, &d)| acc * d + i)
}

/// Logical values of `shape` read from `storage` (of `storage_shape`) through `map`.
fn through(
    storage: &[f64],
    storage_shape: &[usize],
    shape: &[usize],
    map: impl Fn(&[usize]) -> Vec<usize>,
) -> Vec<f64> {
    let n: usize = shape.iter().product();
    (0..n)
        .map(|i| storage[ravel(&map(&unravel(i, shape)), storage_shape)])
        .collect()
}

pub fn input(
    rng: &mut Generator,
    shape: &[usize],
    dtype: DType,
    device: &Device,
    variant: Variant,
    range: Range,
) -> Input {
    let rank = shape.len();
    let make = |rng: &mut Generator, sshape: &[usize]| {
        let vals = random_vals(rng, sshape.iter().product(), dtype, range);
        (tensor_of(&vals, sshape, dtype, device), vals)
    };
    let (t, vals) = match variant {
        Variant::Transposed if rank >= 2 => {
            let mut ss = shape.to_vec();
            ss.swap(rank - 2, rank - 1);
            let (st, sv) = make(rng, &ss);
            let vals = through(&sv, &ss, shape, |i| {
                let mut j = i.to_vec();
                j.swap(rank - 2, rank - 1);
                j
            });
            (st.transpose(-2, -1).unwrap(), vals)
        }
        Variant::Narrowed => {
            let ss: Vec<usize> = shape.iter().map(|d| d + 2).collect();
            let (mut st, sv) = make(rng, &ss);
            for (d, &len) in shape.iter().enumerate() {
                st = st.narrow(d, 1, len).unwrap();
            }
            (
                st,
                through(&sv, &ss, shape, |i| i.iter().map(|x| x + 1).collect()),
            )
        }
        Variant::Stepped if rank >= 1 => {
            let mut ss = shape.to_vec();
            ss[rank - 1] = 2 * shape[rank - 1] + 1;
            ss[0] = if rank > 1 { 3 * shape[0] } else { ss[0] };
            let (st, sv) = make(rng, &ss);
            let mut v = st.slice(-1, 1..ss[rank - 1], 2).unwrap();
            if rank > 1 {
                v = v.slice(0, 0..ss[0], 3).unwrap();
            }
            let vals = through(&sv, &ss, shape, |i| {
                let mut j = i.to_vec();
                j[rank - 1] = 1 + 2 * i[rank - 1];
                if rank > 1 {
                    j[0] = 3 * i[0];
                }
                j
            });
            (v, vals)
        }
        Variant::Broadcast if rank >= 1 => {
            let k = rng.below(rank);
            let mut ss = shape.to_vec();
            ss[k] = 1;
            let drop_lead = rank >= 2 && k != 0;
            let src_shape: Vec<usize> = if drop_lead {
                ss[1..].to_vec()
            } else {
                ss.clone()
            };
            let (st, sv) = make(rng, &src_shape);
            let vals = through(&sv, &src_shape, shape, |i| {
                let mut j = i.to_vec();
                j[k] = 0;
                if drop_lead {
                    j[1..].to_vec()
                } else {
                    j
                }
            });
            (st.broadcast_as(shape).unwrap(), vals)
        }
        _ => make(rng, shape),
    };
    assert_eq!(
        t.dims(),
        shape,
        "harness built the wrong shape for {variant:?}"
    );
    Input {
        t,
        vals,
        shape: shape.to_vec(),
    }
}

/// Elementwise closeness: `|got - want| <= tol * (|want| + 0.1)`; NaN matches NaN; integer
/// dtypes (tol 0) must match exactly.
pub fn assert_close(ctx: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(
        got.len(),
        want.len(),
        "{ctx}: {} values, expected {}",
        got.len(),
        want.len()
    );
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= tol * (w.abs() + 0.1);
        assert!(ok, "{ctx}: element {i}: got {g}, expected {w} (tol {tol})");
    }
}

/// Norm-wise closeness `‖got − want‖ / ‖want‖ <= tol`, for results with cancellation.
pub fn assert_norm_close(ctx: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(
        got.len(),
        want.len(),
        "{ctx}: {} values, expected {}",
        got.len(),
        want.len()
    );
    assert!(
        got.iter().all(|v| v.is_finite()),
        "{ctx}: non-finite output"
    );
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(g, w)| (g - w) * (g - w))
        .sum::<f64>()
        .sqrt();
    let den: f64 = want.iter().map(|w| w * w).sum::<f64>().sqrt().max(1e-30);
    assert!(
        num / den <= tol,
        "{ctx}: relative error {:.3e} > {tol:.1e}",
        num / den
    );
}

/// Values of a tensor as f64, read through the CPU.
pub fn values(t: &Tensor) -> Vec<f64> {
    t.to_device(&Device::Cpu).unwrap().to_f64_vec().unwrap()
}

pub fn broadcast_shape(a: &[usize], b: &[usize]) -> Vec<usize> {
    let r = a.len().max(b.len());
    (0..r)
        .map(|i| {
            let x = if i + a.len() >= r {
                a[i + a.len() - r]
            } else {
                1
            };
            let y = if i + b.len() >= r {
                b[i + b.len() - r]
            } else {
                1
            };
            x.max(y)
        })
        .collect()
}

/// The flat index in `shape` that a broadcast `out_idx` reads.
pub fn bcast_index(out_idx: &[usize], shape: &[usize]) -> usize {
    let off = out_idx.len() - shape.len();
    let idx: Vec<usize> = shape
        .iter()
        .enumerate()
        .map(|(i, &d)| if d == 1 { 0 } else { out_idx[off + i] })
        .collect();
    ravel(&idx, shape)
}
