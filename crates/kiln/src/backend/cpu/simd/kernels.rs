//! Vectorised slice kernels for f32 (and the 16-bit floats through f32): element-wise
//! math, binary ops and conversions. Each writes every element of its `dst`, which has the
//! length of its inputs.

use super::math;
use super::{simd_fn, simd_level, SimdLevel};
use crate::op::{BinaryOp, UnaryOp};
use half::{bf16, f16};
use num_traits::Float;
use std::mem::MaybeUninit;

/// Relative cost per element of a unary op (1 = a copy), for the threading grain.
pub(crate) fn unary_cost(op: &UnaryOp) -> usize {
    match op {
        UnaryOp::Exp | UnaryOp::Log | UnaryOp::Sigmoid | UnaryOp::Silu => 4,
        UnaryOp::Tanh | UnaryOp::GeluTanh | UnaryOp::GeluTanhGrad => 6,
        UnaryOp::Erf | UnaryOp::GeluErf | UnaryOp::GeluErfGrad => 10,
        UnaryOp::Sin
        | UnaryOp::Cos
        | UnaryOp::Scalar {
            op: BinaryOp::Pow, ..
        } => 16,
        UnaryOp::Sqrt | UnaryOp::Recip => 2,
        _ => 1,
    }
}

/// Whether [`unary_f32`] has a kernel for `op` (the others stay scalar: sin, cos, pow).
pub(crate) fn has_unary_f32(op: &UnaryOp) -> bool {
    !matches!(
        op,
        UnaryOp::Sin
            | UnaryOp::Cos
            | UnaryOp::Scalar {
                op: BinaryOp::Pow,
                ..
            }
    )
}

#[inline(always)]
fn maximum<T: Float>(x: T, y: T) -> T {
    if x.is_nan() || x > y {
        x
    } else {
        y
    }
}

#[inline(always)]
fn minimum<T: Float>(x: T, y: T) -> T {
    if x.is_nan() || x < y {
        x
    } else {
        y
    }
}

/// `max(x, 0)` keeping NaN.
#[inline(always)]
fn relu<T: Float>(x: T) -> T {
    if x <= T::zero() {
        T::zero()
    } else {
        x
    }
}

/// ReLU's backward: `x` where the input `y` was positive.
#[inline(always)]
fn relu_grad<T: Float>(x: T, y: T) -> T {
    if y > T::zero() {
        x
    } else {
        T::zero()
    }
}

/// `x + 1` where `y` is finite.
#[inline(always)]
fn count_finite<T: Float>(x: T, y: T) -> T {
    if y.is_finite() {
        x + T::one()
    } else {
        x
    }
}

/// `$each!(|x, y| expr)` for the expression of `$op`, matched outside the loop so that
/// each arm's loop vectorises on its own; `$each` is the caller's loop macro.
macro_rules! binary_ops {
    ($op:expr, $each:ident) => {
        match $op {
            BinaryOp::Add => $each!(|x, y| x + y),
            BinaryOp::Sub => $each!(|x, y| x - y),
            BinaryOp::Mul => $each!(|x, y| x * y),
            BinaryOp::Div => $each!(|x, y| x / y),
            BinaryOp::Maximum => $each!(|x, y| maximum(x, y)),
            BinaryOp::Minimum => $each!(|x, y| minimum(x, y)),
            BinaryOp::ReluGrad => $each!(|x, y| relu_grad(x, y)),
            BinaryOp::AddRelu => $each!(|x, y| relu(x + y)),
            BinaryOp::CountFinite => $each!(|x, y| count_finite(x, y)),
            BinaryOp::MulRelu => $each!(|x, y| relu(x * y)),
            BinaryOp::Pow => $each!(|x, y| x.powf(y)),
        }
    };
}

/// Binary op on the pairs of `$iter` into `$dst`.
macro_rules! binary_loop {
    ($op:expr, $iter:expr, $dst:expr) => {{
        macro_rules! each {
            (|$x:ident, $y:ident| $e:expr) => {
                for (d, ($x, $y)) in $dst.iter_mut().zip($iter) {
                    d.write($e);
                }
            };
        }
        binary_ops!($op, each)
    }};
}

/// Elements per block of [`central_blocks!`].
const CENTRAL_BLOCK: usize = 128;

/// GELU and its derivative by blocks of [`CENTRAL_BLOCK`] elements, where AVX-512 is absent
/// (with it both run in one loop: [`central_loop!`]): `$block(s, d, scratch)` runs the central
/// form's three stages (see `math::gelu_central_exponent`) as three passes over the block,
/// its intermediates in `scratch` (L1), and says whether every element was in the central
/// range; where one was not (a tail value, a NaN), `$general` writes those elements again.
/// Whole blocks go through with their length known to the compiler (blocks of 128 measured
/// fastest with AVX2 and with AVX-512, against 32, 64 and 256, and against blocks of unknown
/// length).
///
/// A macro, not a function taking the block function: passed as a value, it was called
/// through an `Fn::call` shim compiled without the kernel's target features, where
/// `mul_add` is a library call (the derivative ran 90x slower, measured).
macro_rules! central_blocks {
    ($src:expr, $dst:expr, $block:path, $general:path) => {{
        let scratch = &mut CentralScratch::new();
        let mut srcs = $src.chunks_exact(CENTRAL_BLOCK);
        let mut dsts = $dst.chunks_exact_mut(CENTRAL_BLOCK);
        for (s, d) in srcs.by_ref().zip(dsts.by_ref()) {
            let s: &[f32; CENTRAL_BLOCK] = s.try_into().expect("chunks_exact");
            let d: &mut [MaybeUninit<f32>; CENTRAL_BLOCK] = d.try_into().expect("chunks_exact");
            if !$block(s, d, scratch) {
                rewrite_tails!(s, d, $general);
            }
        }
        let (s, d) = (srcs.remainder(), dsts.into_remainder());
        if !$block(s, d, scratch) {
            rewrite_tails!(s, d, $general);
        }
    }};
}

/// `d[i] = $general(s[i])` where `s[i]` is outside the central range or NaN.
macro_rules! rewrite_tails {
    ($s:expr, $d:expr, $general:path) => {{
        // Typically one element in a few blocks: rewriting only those (not the block, as
        // `by_blocks!` does) took 5% less time on normally distributed inputs. The search
        // loop stays scalar; a plain `if` in a loop was vectorised into the general form on
        // every element.
        let (s, d) = ($s, $d);
        let mut start = 0;
        while let Some(k) = s[start..]
            .iter()
            .position(|x| x.is_nan() || x.abs() >= math::GELU_CENTRAL)
        {
            let i = start + k;
            d[i].write($general(s[i]));
            start = i + 1;
        }
    }};
}

/// `$central` on every element of each block of [`CENTRAL_BLOCK`], in one loop, then the
/// elements outside the central range (and NaN) written again by `$general`, a vector of
/// lanes at a time: every 16 lanes that hold one are recomputed whole, both forms and a
/// select, which vectorises. On normally distributed inputs one element in ~2000 is a tail;
/// rewriting them one by one (a scalar search, then the scalar general form) had taken 12%
/// of the GELU's time. The blocks are plain slices: as arrays of a known length, LLVM
/// unrolled the loop four times and ran out of vector registers. A macro for the reason
/// [`central_blocks!`] is.
macro_rules! central_loop {
    // With AVX-512 the one loop, otherwise `central_blocks!` with `$block`: on one Zen 4
    // core (1M elements, session 38) GELU's one loop took 0.46 ns an element with AVX-512
    // against 0.55 for three passes, but with AVX2 0.65 against 0.52.
    ($src:expr, $dst:expr, $central:path, $general:path, else $block:path) => {{
        if simd_level() == SimdLevel::Avx512 {
            central_loop!($src, $dst, $central, $general);
        } else {
            central_blocks!($src, $dst, $block, $general);
        }
    }};
    ($src:expr, $dst:expr, $central:path, $general:path) => {{
        const LANES: usize = 16;
        let in_range = |x: f32| x.abs() < math::GELU_CENTRAL;
        for (s, d) in $src
            .chunks(CENTRAL_BLOCK)
            .zip($dst.chunks_mut(CENTRAL_BLOCK))
        {
            let mut central = true;
            for (d, &x) in d.iter_mut().zip(s) {
                central &= in_range(x);
                d.write($central(x));
            }
            if central {
                continue;
            }
            for (s, d) in s.chunks(LANES).zip(d.chunks_mut(LANES)) {
                if s.iter().fold(true, |c, &x| c & in_range(x)) {
                    continue;
                }
                for (d, &x) in d.iter_mut().zip(s) {
                    let (general, central) = ($general(x), $central(x));
                    d.write(if in_range(x) { central } else { general });
                }
            }
        }
    }};
}

/// The intermediates of one block of [`central_blocks!`].
struct CentralScratch {
    his: [f32; CENTRAL_BLOCK],
    los: [f32; CENTRAL_BLOCK],
    exponents: [u32; CENTRAL_BLOCK],
    // Only the derivative's second exponential uses these.
    los2: [f32; CENTRAL_BLOCK],
    exponents2: [u32; CENTRAL_BLOCK],
}

impl CentralScratch {
    fn new() -> Self {
        CentralScratch {
            his: [0.0; CENTRAL_BLOCK],
            los: [0.0; CENTRAL_BLOCK],
            exponents: [0; CENTRAL_BLOCK],
            los2: [0.0; CENTRAL_BLOCK],
            exponents2: [0; CENTRAL_BLOCK],
        }
    }
}

/// GELU (erf form): `x Φ(x)`, in one loop with AVX-512, else in three passes.
#[inline(always)]
fn gelu_erf_blocks<const FMA: bool>(src: &[f32], dst: &mut [MaybeUninit<f32>]) {
    central_loop!(
        src,
        dst,
        math::gelu_erf_central::<FMA>,
        math::gelu_erf::<FMA>,
        else gelu_erf_block::<FMA>
    );
}

/// One block of [`gelu_erf_blocks`]'s three-pass form; whether every element was central.
#[inline(always)]
fn gelu_erf_block<const FMA: bool>(
    s: &[f32],
    d: &mut [MaybeUninit<f32>],
    c: &mut CentralScratch,
) -> bool {
    let mut central = true;
    for ((&x, hi), lo) in s.iter().zip(c.his.iter_mut()).zip(c.los.iter_mut()) {
        central &= x.abs() < math::GELU_CENTRAL;
        (*hi, *lo) = math::gelu_central_exponent::<FMA>(x);
    }
    // r overwrites hi.
    for ((hi, &lo), e) in c
        .his
        .iter_mut()
        .zip(c.los.iter())
        .zip(c.exponents.iter_mut())
    {
        (*hi, *e) = math::gelu_central_reduce::<FMA>(*hi, lo);
    }
    for (((d, &x), &r), &e) in d
        .iter_mut()
        .zip(s)
        .zip(c.his.iter())
        .zip(c.exponents.iter())
    {
        d.write(math::gelu_central_finish::<FMA>(x, r, e));
    }
    central
}

/// GELU's derivative `Φ(x) + x φ(x)`: two exponentials (`Φ(-|x|)` and `e^(-x²/2)`) from
/// one stage 1; in one loop with AVX-512, as the GELU (one Zen 4 core, 1M elements, GELU
/// forward + backward through autograd: 1.54 → 1.45 ns an element, medians of 8; session 38).
#[inline(always)]
fn gelu_erf_grad_blocks<const FMA: bool>(src: &[f32], dst: &mut [MaybeUninit<f32>]) {
    central_loop!(
        src,
        dst,
        math::gelu_erf_grad_central::<FMA>,
        math::gelu_erf_grad::<FMA>,
        else gelu_erf_grad_block::<FMA>
    );
}

/// One block of [`gelu_erf_grad_blocks`]; whether every element was central.
#[inline(always)]
fn gelu_erf_grad_block<const FMA: bool>(
    s: &[f32],
    d: &mut [MaybeUninit<f32>],
    c: &mut CentralScratch,
) -> bool {
    let mut central = true;
    for (((&x, hi), lo), lo2) in s
        .iter()
        .zip(c.his.iter_mut())
        .zip(c.los.iter_mut())
        .zip(c.los2.iter_mut())
    {
        central &= x.abs() < math::GELU_CENTRAL;
        (*hi, *lo, *lo2) = math::gelu_grad_central_exponents::<FMA>(x);
    }
    // The two reductions overwrite lo and lo2 with their r.
    for ((((&hi, lo), lo2), e), e2) in c
        .his
        .iter()
        .zip(c.los.iter_mut())
        .zip(c.los2.iter_mut())
        .zip(c.exponents.iter_mut())
        .zip(c.exponents2.iter_mut())
    {
        (*lo, *e) = math::gelu_central_reduce::<FMA>(hi, *lo);
        (*lo2, *e2) = math::gelu_central_reduce::<FMA>(hi, *lo2);
    }
    for ((((d, &x), (&r, &e)), &r2), &e2) in d
        .iter_mut()
        .zip(s)
        .zip(c.los.iter().zip(c.exponents.iter()))
        .zip(c.los2.iter())
        .zip(c.exponents2.iter())
    {
        let q = math::exp_reduced_scaled::<FMA>(r, e);
        let half_gauss = math::exp_reduced_scaled::<FMA>(r2, e2);
        d.write(math::gelu_grad_central_finish::<FMA>(x, q, half_gauss));
    }
    central
}

simd_fn! {
    /// `dst[i] = op(src[i])` for the ops [`has_unary_f32`] accepts.
    pub(crate) fn unary_f32(op: UnaryOp, src: &[f32], dst: &mut [MaybeUninit<f32>]) {
        debug_assert_eq!(src.len(), dst.len());
        // A plain zip loop: the compiler vectorises it one register of lanes per step, and
        // the out-of-order core overlaps the steps. (Blocks of 32 unrolled by hand were
        // vectorised *across* blocks, with gathers: ReLU ran 8x slower, measured.)
        macro_rules! each {
            (|$x:ident| $e:expr) => {{
                for (d, &$x) in dst.iter_mut().zip(src) {
                    d.write($e);
                }
            }};
        }
        // Every block of `cheap` elements, noting on the way whether all met `applies`
        // (with typical inputs, nearly all blocks); a block where one did not (a tail value,
        // a NaN) is written again by `general`. Checking first, in a loop of its own, cost
        // 10% more.
        macro_rules! by_blocks {
            (|$x:ident| $applies:expr, $cheap:expr, $general:expr) => {{
                const BLOCK: usize = 64;
                for (d, s) in dst.chunks_mut(BLOCK).zip(src.chunks(BLOCK)) {
                    let mut all = true;
                    for (d, &$x) in d.iter_mut().zip(s) {
                        all &= $applies;
                        d.write($cheap);
                    }
                    if !all {
                        for (d, &$x) in d.iter_mut().zip(s) {
                            d.write($general);
                        }
                    }
                }
            }};
        }
        #[cfg(target_arch = "x86_64")]
        if simd_level() == SimdLevel::Avx512 {
            use super::avx512::logistic::{logistic_f32, Logistic};
            let f = match op {
                UnaryOp::Sigmoid => Some(Logistic::Sigmoid),
                UnaryOp::Silu => Some(Logistic::Silu),
                UnaryOp::Tanh => Some(Logistic::Tanh),
                _ => None,
            };
            if let Some(f) = f {
                // SAFETY: the level is AVX-512, so the CPU has every feature `logistic_f32`
                // is compiled for.
                return unsafe { logistic_f32(f, src, dst) };
            }
            use super::avx512::gelu::{gelu_f32, Gelu};
            let form = match op {
                UnaryOp::GeluErf => Some(Gelu::Erf),
                UnaryOp::GeluTanh => Some(Gelu::Tanh),
                UnaryOp::GeluErfGrad => Some(Gelu::ErfGrad),
                UnaryOp::GeluTanhGrad => Some(Gelu::TanhGrad),
                _ => None,
            };
            if let Some(form) = form {
                // SAFETY: as above, for `gelu_f32`.
                return unsafe { gelu_f32(form, src, dst) };
            }
        }
        match op {
            UnaryOp::Neg => each!(|x| -x),
            UnaryOp::Abs => each!(|x| x.abs()),
            UnaryOp::Sqr => each!(|x| x * x),
            UnaryOp::Relu => each!(|x| relu(x)),
            UnaryOp::Exp => by_blocks!(
                |x| (math::EXP_NORMAL_LO..=math::EXP_NORMAL_HI).contains(&x),
                math::exp_normal::<FMA>(x),
                math::exp::<FMA>(x)
            ),
            UnaryOp::Log => each!(|x| math::ln::<FMA>(x)),
            UnaryOp::Sqrt => each!(|x| x.sqrt()),
            UnaryOp::Recip => each!(|x| 1.0 / x),
            UnaryOp::Tanh => each!(|x| math::tanh::<FMA>(x)),
            UnaryOp::Sigmoid => by_blocks!(
                |x| x.abs() < math::SIGMOID_NORMAL,
                math::sigmoid_normal::<FMA>(x),
                math::sigmoid::<FMA>(x)
            ),
            UnaryOp::Erf => each!(|x| math::erf::<FMA>(x)),
            UnaryOp::Silu => each!(|x| math::silu::<FMA>(x)),
            UnaryOp::GeluErf => gelu_erf_blocks::<FMA>(src, dst),
            UnaryOp::GeluTanh => each!(|x| math::gelu_tanh::<FMA>(x)),
            UnaryOp::GeluErfGrad => gelu_erf_grad_blocks::<FMA>(src, dst),
            UnaryOp::GeluTanhGrad => each!(|x| math::gelu_tanh_grad::<FMA>(x)),
            UnaryOp::Clamp(lo, hi) => {
                let (lo, hi) = (lo as f32, hi as f32);
                each!(|x| maximum(minimum(x, hi), lo))
            }
            UnaryOp::Scalar { op, value, reversed } => {
                let s = value as f32;
                if reversed {
                    binary_loop!(op, src.iter().map(|&x| (s, x)), dst)
                } else {
                    binary_loop!(op, src.iter().map(|&x| (x, s)), dst)
                }
            }
            UnaryOp::Sin => each!(|x| x.sin()),
            UnaryOp::Cos => each!(|x| x.cos()),
        }
    }
}

simd_fn! {
    /// `dst[i] = a[i] op b[i]` (f32 and f64).
    pub(crate) fn binary<T: Float>(op: BinaryOp, a: &[T], b: &[T], dst: &mut [MaybeUninit<T>]) {
        debug_assert!(a.len() == dst.len() && b.len() == dst.len());
        binary_loop!(op, a.iter().copied().zip(b.iter().copied()), dst)
    }
}

simd_fn! {
    /// `a[i] = a[i] op b[i]`, in place (f32 and f64).
    pub(crate) fn binary_in_place<T: Float>(op: BinaryOp, a: &mut [T], b: &[T]) {
        debug_assert_eq!(a.len(), b.len());
        macro_rules! each {
            (|$x:ident, $y:ident| $e:expr) => {
                for (d, &$y) in a.iter_mut().zip(b) {
                    let $x = *d;
                    *d = $e;
                }
            };
        }
        binary_ops!(op, each)
    }
}

simd_fn! {
    /// f32 to bf16, rounding to nearest even; NaN stays NaN (quiet).
    pub(crate) fn f32_to_bf16(src: &[f32], dst: &mut [MaybeUninit<bf16>]) {
        for (d, &x) in dst.iter_mut().zip(src) {
            let b = x.to_bits();
            let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
            let nan = ((b >> 16) as u16) | 0x0040;
            d.write(bf16::from_bits(if x.is_nan() { nan } else { rounded }));
        }
    }
}

simd_fn! {
    /// bf16 to f32 (exact).
    pub(crate) fn bf16_to_f32(src: &[bf16], dst: &mut [MaybeUninit<f32>]) {
        for (d, &x) in dst.iter_mut().zip(src) {
            d.write(f32::from_bits((x.to_bits() as u32) << 16));
        }
    }
}

/// Elements per stack buffer where a kernel converts through one.
pub(crate) const STAGE: usize = 256;

/// f32 to f16, rounding to nearest even (`half`'s slice conversion: F16C where present).
pub(crate) fn f32_to_f16(src: &[f32], dst: &mut [MaybeUninit<f16>]) {
    use half::slice::HalfFloatSliceExt;
    let mut buf = [f16::ZERO; STAGE];
    for (s, d) in src.chunks(STAGE).zip(dst.chunks_mut(STAGE)) {
        let b = &mut buf[..s.len()];
        b.convert_from_f32_slice(s);
        for (d, &v) in d.iter_mut().zip(b.iter()) {
            d.write(v);
        }
    }
}

/// f16 to f32 (exact).
pub(crate) fn f16_to_f32(src: &[f16], dst: &mut [MaybeUninit<f32>]) {
    use half::slice::HalfFloatSliceExt;
    let mut buf = [0f32; STAGE];
    for (s, d) in src.chunks(STAGE).zip(dst.chunks_mut(STAGE)) {
        let b = &mut buf[..s.len()];
        s.convert_to_f32_slice(b);
        for (d, &v) in d.iter_mut().zip(b.iter()) {
            d.write(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The GELU kernels' blocks (GELU and its derivative), whole and partial, with and without
    /// FMA, give every element exactly what the one-element forms give: the central form
    /// inside its range, the general form for tail values, infinities and NaN wherever they
    /// sit in a block. (With AVX-512 `unary_f32` takes the GELU itself to `avx512::gelu`'s
    /// table, tested there; the blocks are called here directly.)
    #[test]
    fn gelu_blocks_match_the_one_element_forms_at_every_length() {
        type Blocks = fn(&[f32], &mut [MaybeUninit<f32>]);
        type Form = fn(f32) -> f32;
        let cases: [(&str, Blocks, Form, Form); 4] = [
            (
                "gelu, FMA",
                gelu_erf_blocks::<true>,
                math::gelu_erf_central::<true>,
                math::gelu_erf::<true>,
            ),
            (
                "gelu, no FMA",
                gelu_erf_blocks::<false>,
                math::gelu_erf_central::<false>,
                math::gelu_erf::<false>,
            ),
            (
                "gelu derivative, FMA",
                gelu_erf_grad_blocks::<true>,
                math::gelu_erf_grad_central::<true>,
                math::gelu_erf_grad::<true>,
            ),
            (
                "gelu derivative, no FMA",
                gelu_erf_grad_blocks::<false>,
                math::gelu_erf_grad_central::<false>,
                math::gelu_erf_grad::<false>,
            ),
        ];
        for (name, blocks, central_form, general_form) in cases {
            for len in [0, 1, 7, 127, 128, 129, 255, 256, 300, 1000] {
                let src: Vec<f32> = (0..len)
                    .map(|i| match i % 37 {
                        5 => 4.25,
                        11 => -3.75,
                        17 => f32::NAN,
                        23 => f32::NEG_INFINITY,
                        29 => -9.5,
                        _ => ((i * 7919) % 1000) as f32 / 1000.0 * 7.0 - 3.5,
                    })
                    .collect();
                let mut dst = vec![MaybeUninit::uninit(); len];
                blocks(&src, &mut dst);
                for (i, (&x, y)) in src.iter().zip(&dst).enumerate() {
                    // SAFETY: the kernel writes every element of `dst`.
                    let y = unsafe { y.assume_init() };
                    let want = if x.abs() < math::GELU_CENTRAL {
                        central_form(x)
                    } else {
                        general_form(x)
                    };
                    assert!(
                        y.to_bits() == want.to_bits() || (y.is_nan() && want.is_nan()),
                        "{name}, len {len}, element {i}: {x} gives {y:e}, one-element form {want:e}"
                    );
                }
            }
        }
    }
}
