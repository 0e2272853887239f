//! Kernels written with AVX-512 intrinsics, for what the auto-vectorised kernels cannot
//! express or schedule well: a reciprocal from its estimate (`logistic`), and softmax rows
//! with their passes unrolled and the max without NaN bookkeeping (`softmax`). Each entry
//! point is a target-feature function: callers check `SimdLevel::Avx512` first. The
//! exponential here is `math::exp_normal`'s, operation for operation.

pub(crate) mod logistic;
pub(crate) mod softmax;

use super::math;
use std::arch::x86_64::*;

#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn splat(v: f32) -> __m512 {
    _mm512_set1_ps(v)
}

/// `e^x` for `x` in `[EXP_NORMAL_LO, EXP_NORMAL_HI]`: `math::exp_normal` on sixteen lanes.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn exp_normal_x16(x: __m512) -> __m512 {
    let (t, _, s) = exp_reduced_x16(x);
    let y = _mm512_add_ps(s, splat(1.0));
    let scale = _mm512_slli_epi32::<23>(_mm512_castps_si512(t));
    _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(y), scale))
}

/// The reduction of `e^x = 2^n (1 + s)` (`math::exp_normal`'s, `|x| <= EXP_NORMAL_HI`):
/// `t` (whose bits shifted left by 23 are `n`'s as an exponent), `n` as a float, and
/// `s = e^r - 1` for the reduced `r`, without the `+ 1` that would round its low bits away.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn exp_reduced_x16(x: __m512) -> (__m512, __m512, __m512) {
    let c = math::EXP_Q;
    let magic = splat(math::ROUND_MAGIC);
    let t = _mm512_fmadd_ps(x, splat(math::LOG2E), magic);
    let n = _mm512_sub_ps(t, magic);
    let r = _mm512_fnmadd_ps(n, splat(math::LN2_HI), x);
    let r = _mm512_fnmadd_ps(n, splat(math::LN2_LO), r);
    let r2 = _mm512_mul_ps(r, r);
    let q = _mm512_fmadd_ps(
        _mm512_fmadd_ps(_mm512_fmadd_ps(splat(c[0]), r, splat(c[1])), r, splat(c[2])),
        r2,
        _mm512_fmadd_ps(splat(c[3]), r, splat(c[4])),
    );
    (t, n, _mm512_fmadd_ps(q, r2, r))
}

/// The lanes of a vector that starts `left` elements before the end of a run (all 16 from
/// 16 on).
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn lanes_left(left: usize) -> __mmask16 {
    if left >= 16 {
        0xffff
    } else {
        (1u16 << left) - 1
    }
}
