//! Unary, binary, comparison and cast kernels. Each op is matched once, outside the loop, so
//! every loop body is a monomorphic closure.

use super::chunked::{map_kernel1, map_kernel2, split_output};
use super::elem::{Elem, Real};
use super::simd::kernels::unary_cost;
use super::simd::typed::SimdFloat;
use super::strided::{map1, map2};
use super::{match_storage, CpuStorage};
use crate::layout::Layout;
use crate::op::{BinaryOp, CmpOp, UnaryOp};
use crate::{DType, WithDType};
use half::{bf16, f16};

/// `0.5 * x * (1 + erf(x / sqrt 2))`.
#[inline(always)]
pub(crate) fn gelu_erf<C: Real>(x: C) -> C {
    let half = C::from_f64c(0.5);
    half * x * (C::one() + (x * C::from_f64c(std::f64::consts::FRAC_1_SQRT_2)).erf())
}

/// `0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))`.
#[inline(always)]
pub(crate) fn gelu_tanh<C: Real>(x: C) -> C {
    let half = C::from_f64c(0.5);
    let k = C::from_f64c(0.797_884_560_802_865_4);
    half * x * (C::one() + (k * (x + C::from_f64c(0.044715) * x * x * x)).tanh())
}

/// d/dx gelu_erf = Φ(x) + x·φ(x) (its limits, 0 and 1, at ∓inf).
#[inline(always)]
pub(crate) fn gelu_erf_grad<C: Real>(x: C) -> C {
    let half = C::from_f64c(0.5);
    let cdf = half * (C::one() + (x * C::from_f64c(std::f64::consts::FRAC_1_SQRT_2)).erf());
    // At ±inf, `x * pdf` is `inf * 0`: the limits are the cdf's, 1 and 0.
    if x.is_infinite() {
        return cdf;
    }
    let pdf = (-(half * x * x)).exp() * C::from_f64c(0.398_942_280_401_432_7);
    cdf + x * pdf
}

/// d/dx gelu_tanh, with u = k(x + 0.044715x³): 0.5(1 + tanh u) + 0.5x(1 − tanh²u)·k(1 + 3·0.044715x²).
#[inline(always)]
pub(crate) fn gelu_tanh_grad<C: Real>(x: C) -> C {
    let half = C::from_f64c(0.5);
    let k = C::from_f64c(0.797_884_560_802_865_4);
    let c = C::from_f64c(0.044715);
    // Beyond 1e19 the derivative is 1 or 0 in f32 and f64, and `3 c x²` could overflow into
    // `0 * inf`.
    let huge = C::from_f64c(1e19);
    if x > huge {
        return C::one();
    }
    if x < -huge {
        return C::zero();
    }
    let t = (k * (x + c * x * x * x)).tanh();
    half * (C::one() + t)
        + half * x * (C::one() - t * t) * k * (C::one() + C::from_f64c(3.0) * c * x * x)
}

#[inline(always)]
pub(crate) fn sigmoid<C: Real>(x: C) -> C {
    C::one() / (C::one() + (-x).exp())
}

/// One float unary op on one value of a compute type (the scalar path: f64, and the f32
/// ops without a vector kernel).
#[inline(always)]
pub(crate) fn scalar_unary<C: Real>(x: C, op: UnaryOp) -> C {
    let zero = C::zero();
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Sqr => x * x,
        UnaryOp::Relu => {
            if x <= zero {
                zero
            } else {
                x
            }
        }
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Recip => x.recip(),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => sigmoid(x),
        UnaryOp::Erf => x.erf(),
        UnaryOp::GeluErf => gelu_erf(x),
        UnaryOp::GeluTanh => gelu_tanh(x),
        UnaryOp::Silu => x * sigmoid(x),
        UnaryOp::GeluErfGrad => gelu_erf_grad(x),
        UnaryOp::GeluTanhGrad => gelu_tanh_grad(x),
        UnaryOp::Clamp(lo, hi) => {
            let (lo, hi) = (C::from_f64c(lo), C::from_f64c(hi));
            let x = if x.is_nan() || x < hi { x } else { hi };
            if x.is_nan() || x > lo {
                x
            } else {
                lo
            }
        }
        UnaryOp::Scalar {
            op,
            value,
            reversed,
        } => {
            let s = C::from_f64c(value);
            let (a, b) = if reversed { (s, x) } else { (x, s) };
            let relu = |v: C| if v <= zero { zero } else { v };
            match op {
                BinaryOp::Add => a + b,
                BinaryOp::Sub => a - b,
                BinaryOp::Mul => a * b,
                BinaryOp::Div => a / b,
                BinaryOp::Maximum => {
                    if a.is_nan() || a > b {
                        a
                    } else {
                        b
                    }
                }
                BinaryOp::Minimum => {
                    if a.is_nan() || a < b {
                        a
                    } else {
                        b
                    }
                }
                BinaryOp::Pow => a.powf(b),
                BinaryOp::ReluGrad => {
                    if b > zero {
                        a
                    } else {
                        zero
                    }
                }
                BinaryOp::AddRelu => relu(a + b),
                BinaryOp::MulRelu => relu(a * b),
                BinaryOp::CountFinite => {
                    if b.is_finite() {
                        a + C::one()
                    } else {
                        a
                    }
                }
            }
        }
    }
}

pub(super) fn unary_float<T: SimdFloat>(v: &[T], l: &Layout, op: UnaryOp) -> Vec<T> {
    map_kernel1(v, l, unary_cost(&op), |s, d| T::unary_slice(op, s, d))
}

pub(super) fn binary_float<T: SimdFloat>(
    a: &[T],
    la: &Layout,
    b: &[T],
    lb: &Layout,
    op: BinaryOp,
) -> Vec<T> {
    let cost = if op == BinaryOp::Pow { 16 } else { 1 };
    map_kernel2((a, la), (b, lb), cost, |x, y, d| {
        T::binary_slice(op, x, y, d)
    })
}

/// `a op= b` over two contiguous runs of one length (f32, f64, and f16/bf16 staged through
/// f32 in blocks), in place, split across threads as a two-input map is. (The trait's
/// default, a product into a new buffer and a copy back, took 164-187 us for a 1M-element
/// f32 `add_assign` against 54-79 us for `add`.)
pub(super) fn binary_in_place<T: SimdFloat>(a: &mut [T], b: &[T], op: BinaryOp) {
    let cost = if op == BinaryOp::Pow { 16 } else { 1 };
    split_output(a, cost, 64, false, |s, x| {
        T::binary_assign_slice(op, x, &b[s..s + x.len()])
    });
}

/// `a op= b` for a destination `a` at layout `la` and a source `b` at `lb` (same shape), in
/// place: two contiguous runs go to [`binary_in_place`]; otherwise (a strided view, or a
/// broadcast or strided source) the rows of the merged iteration space go through the same
/// in-place kernel, gathered into a block first where a row is not contiguous, with row
/// ranges split across threads when large.
///
/// `la` must not be a broadcast view (the tensor layer refuses in-place writes through
/// one), so no two rows share an element of `a`.
pub(super) fn binary_assign<T: SimdFloat>(
    a: &mut [T],
    la: &Layout,
    b: &[T],
    lb: &Layout,
    op: BinaryOp,
) {
    if let (Some(ra), Some(rb)) = (la.contiguous_range(), lb.contiguous_range()) {
        return binary_in_place(&mut a[ra], &b[rb], op);
    }
    use super::strided::RowPlan;
    use super::threads::{goes_parallel, install, PARALLEL_THRESHOLD};
    use rayon::prelude::*;
    let plan = RowPlan::new([la, lb]);
    let (len, [sa, sb]) = (plan.row_len, plan.row_strides);
    let rows = plan.n_rows();
    if len == 0 || rows == 0 {
        return;
    }
    let last = |o: usize, s: usize| o + (len - 1) * s;
    struct Dst<T>(*mut T, usize);
    // SAFETY: threads write disjoint rows of `a` (see the function's contract).
    unsafe impl<T: Send> Sync for Dst<T> {}
    let dst = Dst(a.as_mut_ptr(), a.len());
    let run = |range: std::ops::Range<usize>| {
        let (mut row_a, mut row_b) = (Vec::new(), Vec::new());
        let dst = &dst;
        plan.for_rows(range, |_, [oa, ob]| {
            assert!(last(oa, sa) < dst.1 && last(ob, sb) < b.len());
            let rhs: &[T] = if sb == 1 {
                &b[ob..ob + len]
            } else {
                row_b.clear();
                row_b.extend((0..len).map(|i| b[ob + i * sb]));
                &row_b
            };
            if sa == 1 {
                // SAFETY: `oa..oa + len` is inside `a` (asserted) and no other row of this
                // call touches it (the contract).
                let row = unsafe { std::slice::from_raw_parts_mut(dst.0.add(oa), len) };
                T::binary_assign_slice(op, row, rhs);
            } else {
                row_a.clear();
                // SAFETY: as above, element by element (every index is at most the asserted
                // last one).
                row_a.extend((0..len).map(|i| unsafe { *dst.0.add(oa + i * sa) }));
                T::binary_assign_slice(op, &mut row_a, rhs);
                for (i, &v) in row_a.iter().enumerate() {
                    // SAFETY: as above.
                    unsafe { *dst.0.add(oa + i * sa) = v };
                }
            }
        });
    };
    let total = rows * len;
    if !goes_parallel(total) {
        run(0..rows);
        return;
    }
    let rows_per_task = (PARALLEL_THRESHOLD / len).max(1);
    install(|| {
        (0..rows.div_ceil(rows_per_task))
            .into_par_iter()
            .for_each(|t| run(t * rows_per_task..((t + 1) * rows_per_task).min(rows)))
    });
}

/// The ops integer dtypes support (and floats share).
pub(super) fn unary_int<T: Elem>(v: &[T], l: &Layout, op: UnaryOp) -> Vec<T> {
    match op {
        UnaryOp::Neg => map1(v, l, T::ZERO, |x| x.neg()),
        UnaryOp::Abs => map1(v, l, T::ZERO, |x| x.abs()),
        UnaryOp::Sqr => map1(v, l, T::ZERO, |x| x.mul(x)),
        UnaryOp::Relu => map1(v, l, T::ZERO, |x| x.maximum(T::ZERO)),
        UnaryOp::Clamp(lo, hi) => {
            let (lo, hi) = (T::from_f64(lo), T::from_f64(hi));
            map1(v, l, T::ZERO, |x| x.minimum(hi).maximum(lo))
        }
        UnaryOp::Scalar {
            op,
            value,
            reversed,
        } => {
            let s = T::from_f64(value);
            macro_rules! both {
                (|$a:ident, $b:ident| $e:expr) => {
                    if reversed {
                        map1(v, l, T::ZERO, |x| {
                            let ($a, $b) = (s, x);
                            $e
                        })
                    } else {
                        map1(v, l, T::ZERO, |x| {
                            let ($a, $b) = (x, s);
                            $e
                        })
                    }
                };
            }
            match op {
                BinaryOp::Add => map1(v, l, T::ZERO, |x| x.add(s)),
                BinaryOp::Mul => map1(v, l, T::ZERO, |x| x.mul(s)),
                BinaryOp::Maximum => map1(v, l, T::ZERO, |x| x.maximum(s)),
                BinaryOp::Minimum => map1(v, l, T::ZERO, |x| x.minimum(s)),
                BinaryOp::Sub => both!(|a, b| a.sub(b)),
                BinaryOp::Div => both!(|a, b| a.div(b)),
                BinaryOp::Pow => unreachable!("pow on integers is rejected before dispatch"),
                BinaryOp::ReluGrad => both!(|a, b| if b > T::ZERO { a } else { T::ZERO }),
                BinaryOp::AddRelu | BinaryOp::MulRelu | BinaryOp::CountFinite => {
                    unreachable!("scalar forms are refused by Tensor::unary")
                }
            }
        }
        _ => unreachable!("float-only unary op {op:?} is rejected before dispatch"),
    }
}

/// `max(s, 0)` keeping NaN (as the unary ReLU).
#[inline]
fn relu_of<T: Elem>(s: T) -> T {
    if s <= T::ZERO {
        T::ZERO
    } else {
        s
    }
}

pub(super) fn binary<T: Elem>(a: &[T], la: &Layout, b: &[T], lb: &Layout, op: BinaryOp) -> Vec<T> {
    let z = T::ZERO;
    match op {
        BinaryOp::Add => map2(a, la, b, lb, z, |x, y| x.add(y)),
        BinaryOp::Sub => map2(a, la, b, lb, z, |x, y| x.sub(y)),
        BinaryOp::Mul => map2(a, la, b, lb, z, |x, y| x.mul(y)),
        BinaryOp::Div => map2(a, la, b, lb, z, |x, y| x.div(y)),
        BinaryOp::Maximum => map2(a, la, b, lb, z, |x, y| x.maximum(y)),
        BinaryOp::Minimum => map2(a, la, b, lb, z, |x, y| x.minimum(y)),
        BinaryOp::ReluGrad => map2(a, la, b, lb, z, |x, y| if y > z { x } else { z }),
        BinaryOp::AddRelu => map2(a, la, b, lb, z, |x, y| relu_of(x.add(y))),
        BinaryOp::MulRelu => map2(a, la, b, lb, z, |x, y| relu_of(x.mul(y))),
        // Integers are always finite.
        BinaryOp::CountFinite => map2(a, la, b, lb, z, |x, _| x.add(T::ONE)),
        BinaryOp::Pow => map2(a, la, b, lb, z, |x, y| {
            T::from_f64(x.to_f64().powf(y.to_f64()))
        }),
    }
}

pub(super) fn compare<T: WithDType>(
    a: &[T],
    la: &Layout,
    b: &[T],
    lb: &Layout,
    op: CmpOp,
) -> Vec<u8> {
    match op {
        CmpOp::Eq => map2(a, la, b, lb, 0u8, |x, y| (x == y) as u8),
        CmpOp::Ne => map2(a, la, b, lb, 0u8, |x, y| (x != y) as u8),
        CmpOp::Lt => map2(a, la, b, lb, 0u8, |x, y| (x < y) as u8),
        CmpOp::Le => map2(a, la, b, lb, 0u8, |x, y| (x <= y) as u8),
        CmpOp::Gt => map2(a, la, b, lb, 0u8, |x, y| (x > y) as u8),
        CmpOp::Ge => map2(a, la, b, lb, 0u8, |x, y| (x >= y) as u8),
    }
}

/// Converts one element type to another: integer pairs through `i64` (wrapping, as C and
/// PyTorch do), everything else through `f64` (exact but for `i64` beyond 2^53);
/// float-to-integer casts truncate and saturate, NaN becomes 0.
trait CastTo<O> {
    fn cast(self) -> O;
}
impl<I: WithDType, O: WithDType> CastTo<O> for I {
    #[inline(always)]
    fn cast(self) -> O {
        if I::DTYPE.is_int() && O::DTYPE.is_int() {
            O::from_i64(self.to_i64())
        } else {
            O::from_f64(self.to_f64())
        }
    }
}

pub(super) fn cast(s: &CpuStorage, l: &Layout, dtype: DType) -> CpuStorage {
    use super::simd::kernels as k;
    use CpuStorage as S;
    // The float pairs that matter for speed, through slice kernels.
    match (s, dtype) {
        (S::F32(v), DType::BF16) => return S::BF16(map_kernel1(v, l, 1, k::f32_to_bf16)),
        (S::F32(v), DType::F16) => return S::F16(map_kernel1(v, l, 1, k::f32_to_f16)),
        (S::BF16(v), DType::F32) => return S::F32(map_kernel1(v, l, 1, k::bf16_to_f32)),
        (S::F16(v), DType::F32) => return S::F32(map_kernel1(v, l, 1, k::f16_to_f32)),
        _ => {}
    }
    fn to<I: WithDType>(v: &[I], l: &Layout, dtype: DType) -> CpuStorage {
        match dtype {
            DType::F16 => CpuStorage::F16(map1(v, l, f16::ZERO, CastTo::cast)),
            DType::BF16 => CpuStorage::BF16(map1(v, l, bf16::ZERO, CastTo::cast)),
            DType::F32 => CpuStorage::F32(map1(v, l, 0.0, CastTo::cast)),
            DType::F64 => CpuStorage::F64(map1(v, l, 0.0, CastTo::cast)),
            DType::U8 => CpuStorage::U8(map1(v, l, 0, CastTo::cast)),
            DType::U32 => CpuStorage::U32(map1(v, l, 0, CastTo::cast)),
            DType::I64 => CpuStorage::I64(map1(v, l, 0, CastTo::cast)),
        }
    }
    match_storage!(s, v => to(v, l, dtype))
}
