//! The logistic functions (sigmoid, SiLU, tanh) written with AVX-512 intrinsics, for the one
//! operation the auto-vectorised kernels cannot express: a reciprocal from its estimate.
//!
//! All three divide by `1 + e` (`e` an exponential in (0, 1]). Compiled from plain Rust,
//! `1.0 / d` is a 512-bit `vdivps`, which on Zen 4 cost about as much as the exponential
//! itself (one core, 64K elements: exp 0.22 ns an element, sigmoid 0.43). Here the
//! reciprocal is `vrcp14ps` (relative error below 2⁻¹⁴) and one Newton step whose residual
//! also takes in the rounding error of `1 + e`, so the result is the reciprocal of the exact
//! `1 + e` to about 2⁻²⁸ before its final rounding: more accurate than the division of the
//! rounded sum, for four multiply-adds. Measured (session 40, same core): sigmoid 0.43 →
//! 0.33 ns an element, SiLU 0.42 → 0.36; worst error over `tests/cpu_math.rs`'s sweep
//! sigmoid 2.69 → **1.87 ulp**, SiLU 3.68 → **2.70 ulp**.
//!
//! Lanes outside each function's fast range (and NaN) are written again by the general
//! scalar form of `math`, as the other kernels' blocks do; so are the last `len % 16`
//! elements' lanes where the fast range does not apply. tanh's form covers every lane.

use super::{exp_normal_x16, exp_reduced_x16, lanes_left, map_lanes, splat};
use crate::backend::cpu::simd::math;
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

/// The logistic functions this module has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Logistic {
    Sigmoid,
    Silu,
    /// `tanh(x) = 2 sigmoid(2x) - 1`.
    Tanh,
}

/// `dst[i] = f(src[i])` for `f` one of [`Logistic`].
///
/// Calling it needs `unsafe` outside code compiled for AVX-512: the CPU must have AVX-512 F,
/// BW, DQ and VL (`SimdLevel::Avx512`).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
pub(crate) fn logistic_f32(f: Logistic, src: &[f32], dst: &mut [MaybeUninit<f32>]) {
    assert_eq!(
        src.len(),
        dst.len(),
        "logistic_f32: source and destination lengths"
    );
    match f {
        Logistic::Sigmoid => map_lanes!(src, dst, sigmoid_x16, math::sigmoid::<true>),
        Logistic::Silu => map_lanes!(src, dst, silu_x16, math::silu::<true>),
        Logistic::Tanh => map_lanes!(src, dst, tanh_x16, math::tanh::<true>),
    }
}

/// `1 / (1 + e)` for `e` in [0, 1]: `vrcp14ps` of the rounded sum `d`, then one Newton step
/// against the exact sum `d + δ` (`δ = e - (d - 1)`, exact since `d - 1` is).
#[inline]
#[target_feature(enable = "avx512f")]
fn recip_one_plus(e: __m512) -> __m512 {
    let one = splat(1.0);
    let d = _mm512_add_ps(one, e);
    let delta = _mm512_sub_ps(e, _mm512_sub_ps(d, one));
    let y = _mm512_rcp14_ps(d);
    let residual = _mm512_fnmadd_ps(delta, y, _mm512_fnmadd_ps(d, y, one));
    _mm512_fmadd_ps(y, residual, y)
}

/// Sigmoid for `|x| < SIGMOID_NORMAL` (`e^-|x|` a normal float): `1 / (1 + e)`, times `e`
/// for negative `x`.
#[inline]
#[target_feature(enable = "avx512f")]
fn sigmoid_x16(x: __m512) -> (__m512, __mmask16) {
    let a = _mm512_abs_ps(x);
    let negative = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_setzero_ps());
    let applies = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, splat(math::SIGMOID_NORMAL));
    let e = exp_normal_x16(_mm512_sub_ps(_mm512_setzero_ps(), a));
    let s = recip_one_plus(e);
    (_mm512_mask_mul_ps(s, negative, s, e), applies)
}

/// SiLU for `|x| < SIGMOID_NORMAL`: `x` times [`sigmoid_x16`] (a normal result there).
#[inline]
#[target_feature(enable = "avx512f")]
fn silu_x16(x: __m512) -> (__m512, __mmask16) {
    let (s, applies) = sigmoid_x16(x);
    (_mm512_mul_ps(x, s), applies)
}

/// Where [`tanh_x16`] saturates: `tanh(a)` rounds to 1 for `a` above ~9.01, and
/// `e^(-2 TANH_SATURATED)` is a normal float.
const TANH_SATURATED: f32 = 9.5;

/// Hyperbolic tangent of every lane (NaN stays NaN, ±inf gives ±1): `(1 - e) / (1 + e)`
/// with `e = e^(-2|x|)`, signed like `x`, one form for every magnitude. `e` is kept as
/// `2^n (1 + s)`, `s = e^r - 1` from the exponential's polynomial without its final `+ 1`,
/// so that `1 - e = (1 - 2^n) - 2^n s` has no cancellation: for `|x|` below ~0.17 (`n = 0`)
/// it is `-s` exactly, and `s` keeps its relative accuracy down to subnormal `x`. The
/// quotient is `vrcp14ps` of the denominator and one correction of the quotient itself.
/// Worst error 1.92 ulp (`tests/cpu_math.rs`'s sweep), against 1.31 for `math::tanh`, at
/// 0.33 ns an element against its 0.55 (one Xeon core, 64K elements). Taking the rounding
/// of the denominator into the correction cost 0.04 ns for 1.83 ulp, and was left out.
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
fn tanh_x16(x: __m512) -> (__m512, __mmask16) {
    // `min(SATURATED, |x|)` returns its second operand where one is NaN, so NaN flows
    // through every step below. (`vrangeps`, one instruction for both, drops NaN.)
    let a = _mm512_min_ps(splat(TANH_SATURATED), _mm512_abs_ps(x));
    let (_, n, s) = exp_reduced_x16(_mm512_mul_ps(a, splat(-2.0))); // -2a exact
    let p = _mm512_scalef_ps(splat(1.0), n); // 2^n, n in [-28, 0]
    let num = _mm512_fnmadd_ps(p, s, _mm512_sub_ps(splat(1.0), p));
    // (`2 - num` would save an operation, but its error and the numerator's then add up
    // in the quotient: 2.50 ulp.)
    let den = _mm512_fmadd_ps(p, s, _mm512_add_ps(splat(1.0), p));
    let y = _mm512_rcp14_ps(den);
    let q0 = _mm512_mul_ps(num, y);
    let q1 = _mm512_fmadd_ps(_mm512_fnmadd_ps(den, q0, num), y, q0);
    // The sign bit of `x` on the magnitude (bitwise: q1 | (x & -0.0)).
    let signed = _mm512_castsi512_ps(_mm512_ternarylogic_epi32::<0xF8>(
        _mm512_castps_si512(q1),
        _mm512_castps_si512(x),
        _mm512_castps_si512(splat(-0.0)),
    ));
    (signed, 0xffff)
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{check_every_length, lacks_avx512, LaneCase};
    use super::*;

    /// Every length from 0 to 70 (whole pairs of vectors, single vectors and masked tails),
    /// with values outside the fast range (±87 and beyond, ±inf, NaN) at varying lanes:
    /// each element within 2 ulp of the f64 sigmoid / SiLU / tanh where the fast form
    /// applies (for tanh every value but NaN: ±inf give ±1), and
    /// bit for bit the general form elsewhere; nothing past the end written.
    #[test]
    fn every_length_and_lane_gets_its_value() {
        if lacks_avx512() {
            return;
        }
        let value = |i: usize| match i % 23 {
            3 => f32::NAN,
            7 => 90.0,
            11 => -95.5,
            13 => f32::NEG_INFINITY,
            17 => f32::INFINITY,
            19 => -87.0,
            _ => ((i * 7919) % 2000) as f32 / 100.0 - 10.0,
        };
        let logistic_range = |x: f32| x.abs() < math::SIGMOID_NORMAL;
        for (f, reference, general, fast) in [
            (
                Logistic::Sigmoid,
                (|x: f64| 1.0 / (1.0 + (-x).exp())) as fn(f64) -> f64,
                math::sigmoid::<true> as fn(f32) -> f32,
                logistic_range as fn(f32) -> bool,
            ),
            (
                Logistic::Silu,
                |x: f64| x / (1.0 + (-x).exp()),
                math::silu::<true>,
                logistic_range,
            ),
            (Logistic::Tanh, f64::tanh, math::tanh::<true>, |x| {
                !x.is_nan()
            }),
        ] {
            let name = format!("{f:?}");
            check_every_length(
                &LaneCase {
                    name: &name,
                    // SAFETY: AVX-512 is present (checked above).
                    kernel: &|src, dst| unsafe { logistic_f32(f, src, dst) },
                    fast: &fast,
                    reference: &reference,
                    size: &|_, r| r,
                    max_ulp: 2.0,
                    general: &general,
                },
                &value,
            );
        }
    }
}
