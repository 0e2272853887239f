//! Kernels written with AVX-512 intrinsics, for what the auto-vectorised kernels cannot
//! express or schedule well: a reciprocal from its estimate (`logistic`), softmax rows with
//! their passes unrolled and the max without NaN bookkeeping (`softmax`), and tables of
//! polynomials picked per lane (`gelu`). Each entry point is a target-feature function:
//! callers check `SimdLevel::Avx512` first. The exponential here is `math::exp_normal`'s,
//! operation for operation.

pub(crate) mod gelu;
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

/// `dst[i] = $fast(src[i])` sixteen lanes at a time (the last vector masked), where `$fast`
/// returns the values and the mask of lanes where its form applies; every other lane is
/// written again by `$general`, out of line. A macro: target-feature functions are not `Fn`
/// values.
macro_rules! map_lanes {
    ($src:expr, $dst:expr, $fast:ident, $general:path) => {{
        /// `dst[start + k] = $general(src[start + k])` for each bit `k` of `lanes`: out of
        /// line, so that the scalar form's constants do not take the registers the loop
        /// keeps its own in (inlined, they made the loop reload its constants every step).
        #[cold]
        #[inline(never)]
        #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
        fn rewrite(src: &[f32], dst: &mut [MaybeUninit<f32>], start: usize, mut lanes: u32) {
            while lanes != 0 {
                let k = start + lanes.trailing_zeros() as usize;
                dst[k].write($general(src[k]));
                lanes &= lanes - 1;
            }
        }
        let (src, dst): (&[f32], &mut [MaybeUninit<f32>]) = ($src, $dst);
        let mut i = 0;
        // Two vectors a step while whole ones remain: two independent chains interleaved.
        while i + 32 <= src.len() {
            // SAFETY: `i + 32 <= len` of both slices (of equal length); `MaybeUninit<f32>` has
            // f32's layout.
            let (x0, x1) = unsafe {
                (
                    _mm512_loadu_ps(src.as_ptr().add(i)),
                    _mm512_loadu_ps(src.as_ptr().add(i + 16)),
                )
            };
            let ((y0, a0), (y1, a1)) = ($fast(x0), $fast(x1));
            // SAFETY: as above.
            unsafe {
                let d = dst.as_mut_ptr().add(i).cast::<f32>();
                _mm512_storeu_ps(d, y0);
                _mm512_storeu_ps(d.add(16), y1);
            }
            let redo = !(u32::from(a0) | (u32::from(a1) << 16));
            if redo != 0 {
                rewrite(src, dst, i, redo);
            }
            i += 32;
        }
        while i < src.len() {
            let lanes = (src.len() - i).min(16);
            let present = lanes_left(lanes);
            // SAFETY: the lanes of `present` are `i..i + lanes`, inside both slices (of equal
            // length); masked-off lanes are neither read nor written, and `MaybeUninit<f32>`
            // has f32's layout.
            let x = unsafe { _mm512_maskz_loadu_ps(present, src.as_ptr().add(i)) };
            let (y, applies) = $fast(x);
            // SAFETY: as above.
            unsafe { _mm512_mask_storeu_ps(dst.as_mut_ptr().add(i).cast::<f32>(), present, y) };
            let redo = present & !applies;
            if redo != 0 {
                rewrite(src, dst, i, u32::from(redo));
            }
            i += lanes;
        }
    }};
}
pub(super) use map_lanes;

/// What the kernels' tests share.
#[cfg(test)]
pub(super) mod test_support {
    use crate::backend::cpu::simd::SimdLevel;
    use std::mem::MaybeUninit;

    /// Whether this CPU lacks AVX-512 (said on stderr): the kernels' tests have nothing to test
    /// then.
    pub(crate) fn lacks_avx512() -> bool {
        let lacks = !SimdLevel::Avx512.is_supported();
        if lacks {
            eprintln!("no AVX-512 here: nothing to test");
        }
        lacks
    }

    /// `y`'s error against the f64 `r` in ulp of `size` rounded to f32 (the subnormal spacing
    /// below the normal range); `size` is `r` but for functions measured against the size of
    /// the terms they sum where they pass through zero.
    pub(crate) fn ulp_error(y: f32, r: f64, size: f64) -> f64 {
        if y as f64 == r {
            return 0.0;
        }
        let rounded = (size as f32).abs();
        let ulp = if rounded < f32::MIN_POSITIVE {
            2f64.powi(-149)
        } else {
            (f32::from_bits(rounded.to_bits() + 1) - rounded) as f64
        };
        (y as f64 - r).abs() / ulp
    }

    /// A kernel writing `dst[i]` from `src[i]`.
    pub(crate) type Kernel<'a> = &'a dyn Fn(&[f32], &mut [MaybeUninit<f32>]);

    /// One element-wise kernel under [`check_every_length`]'s test.
    pub(crate) struct LaneCase<'a> {
        pub name: &'a str,
        pub kernel: Kernel<'a>,
        /// Where the kernel's fast form applies.
        pub fast: &'a dyn Fn(f32) -> bool,
        pub reference: &'a dyn Fn(f64) -> f64,
        /// What the ulp of the error is taken of, from `x` and the reference value.
        pub size: &'a dyn Fn(f64, f64) -> f64,
        pub max_ulp: f64,
        /// What every other lane must be, bit for bit.
        pub general: &'a dyn Fn(f32) -> f32,
    }

    /// Every length from 0 to 70 (whole pairs of vectors, single vectors and masked tails) of
    /// `value(i + len)`: each element within `max_ulp` of the f64 reference where the fast form
    /// applies and bit for bit the general form elsewhere, and nothing past the end written.
    pub(crate) fn check_every_length(case: &LaneCase, value: &dyn Fn(usize) -> f32) {
        let name = case.name;
        for len in 0..=70 {
            let src: Vec<f32> = (0..len).map(|i| value(i + len)).collect();
            let mut dst = vec![MaybeUninit::new(1234.5f32); len + 3];
            (case.kernel)(&src, &mut dst[..len]);
            for (i, &x) in src.iter().enumerate() {
                // SAFETY: the kernel writes every element of `dst[..len]`.
                let y = unsafe { dst[i].assume_init() };
                if (case.fast)(x) {
                    let r = (case.reference)(x as f64);
                    let err = ulp_error(y, r, (case.size)(x as f64, r));
                    assert!(
                        err <= case.max_ulp,
                        "{name} len {len} [{i}] = {x}: {y:e}, want {r:e} ({err} ulp)"
                    );
                } else {
                    let want = (case.general)(x);
                    assert!(
                        y.to_bits() == want.to_bits() || (y.is_nan() && want.is_nan()),
                        "{name} len {len} [{i}] = {x}: {y:e}, general form {want:e}"
                    );
                }
            }
            for d in &dst[len..] {
                // SAFETY: initialised with the sentinel.
                assert_eq!(
                    unsafe { d.assume_init() },
                    1234.5,
                    "{name}: written past {len}"
                );
            }
        }
    }
}
