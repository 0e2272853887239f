//! Softmax and log-softmax rows with AVX-512: the max without NaN bookkeeping, then the
//! exponentials and their sum, then the scaling, each pass two vectors a step.
//!
//! The compiled kernel (`simd::reduce::softmax_rows_f32`) spent 0.354 ns an element of a
//! row on one core (rows in L2) against 0.217 for the exp kernel alone: its max tracks NaN
//! lane by lane, and each pass runs one vector a step. Here a NaN is left out of the max
//! (`vmaxps` returns its second operand where either is NaN) and caught by the exponential
//! pass instead, whose sum is NaN exactly when an element is. Measured (session 40):
//! one core, 256×1024 in L2, 0.337 → 0.308 ns an element; two threads, 4096×1024, 820–917
//! → 720–948 µs (41 → 46.5 GB/s at the medians of three processes each); log-softmax,
//! whose last pass reads the row again, 1–2%.
//!
//! Results: as `softmax_rows_f32`'s, the exponentials `math::exp_nonpositive`'s bit for bit
//! where those are normal numbers; below, where `exp_nonpositive` flushes to 0, these round
//! to the subnormal (the scaling is `vscalefps`, which needs no compare and mask). The sum
//! is accumulated in two vectors, so its rounding (not its terms) may differ. A row whose
//! max is infinite, or that holds a NaN, is NaN throughout (as in PyTorch).

use super::{exp_reduced_x16, lanes_left, splat};
use crate::backend::cpu::simd::math;
use crate::backend::cpu::simd::reduce::nan_row;
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

/// Below this `x - max`, e^(x - max) rounds to 0 in f32 (e^-104 is under half the least
/// subnormal); clamping there keeps the reduction finite for -inf.
const EXP_ZERO_BELOW: f32 = -112.0;

/// Softmax (or log-softmax, `log`) of each row of length `n` that makes up `x`, into `out`.
///
/// # Panics
/// If `n` is 0 or does not divide `x.len()`, or `out` is not as long as `x`.
///
/// Calling it needs `unsafe` outside code compiled for AVX-512: the CPU must have AVX-512 F,
/// BW, DQ and VL (`SimdLevel::Avx512`).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
pub(crate) fn softmax_rows(x: &[f32], n: usize, out: &mut [MaybeUninit<f32>], log: bool) {
    assert!(
        n > 0 && x.len().is_multiple_of(n) && out.len() == x.len(),
        "softmax_rows: rows of {n} in {} elements into {}",
        x.len(),
        out.len()
    );
    for (row, o) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        softmax_row(row, o, log);
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
fn softmax_row(row: &[f32], out: &mut [MaybeUninit<f32>], log: bool) {
    let n = row.len();
    let (src, dst) = (row.as_ptr(), out.as_mut_ptr().cast::<f32>());
    let pairs = n / 32 * 32;

    // Pass 1: the max of the row's numbers (NaN left out).
    let neg_inf = splat(f32::NEG_INFINITY);
    let (mut m0, mut m1) = (neg_inf, neg_inf);
    let mut i = 0;
    while i < pairs {
        // SAFETY: i + 32 <= n, inside `row`.
        let (a, b) = unsafe {
            (
                _mm512_loadu_ps(src.add(i)),
                _mm512_loadu_ps(src.add(i + 16)),
            )
        };
        m0 = _mm512_max_ps(a, m0);
        m1 = _mm512_max_ps(b, m1);
        i += 32;
    }
    while i < n {
        // SAFETY: the mask's lanes are i..n, inside `row`; the others are not read.
        let a = unsafe { _mm512_mask_loadu_ps(neg_inf, lanes_left(n - i), src.add(i)) };
        m0 = _mm512_max_ps(a, m0);
        i += 16;
    }
    let m = _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
    if !m.is_finite() {
        // +inf (inf - inf is NaN), or -inf / NaN everywhere.
        return nan_row(out);
    }

    // Pass 2: e = exp(x - m), written out for softmax, and their sum. `x - m` is clamped
    // from below to where e^x is 0 in f32 (`vmaxps` keeps a NaN in its second operand), and
    // `vscalefps` scales by 2^n, rounding below the normal range as a division would: no
    // compare or mask in the loop. A NaN element makes the sum NaN.
    let (shift, lowest) = (splat(m), splat(EXP_ZERO_BELOW));
    let (mut s0, mut s1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let exp_shifted = |v: __m512| {
        let d = _mm512_max_ps(lowest, _mm512_sub_ps(v, shift));
        let (_, n, s) = exp_reduced_x16(d);
        _mm512_scalef_ps(_mm512_add_ps(s, splat(1.0)), n)
    };
    let mut i = 0;
    while i < pairs {
        // SAFETY: i + 32 <= n, inside `row`.
        let (a, b) = unsafe {
            (
                _mm512_loadu_ps(src.add(i)),
                _mm512_loadu_ps(src.add(i + 16)),
            )
        };
        let (ea, eb) = (exp_shifted(a), exp_shifted(b));
        if !log {
            // SAFETY: as above, inside `out` (as long as `row`).
            unsafe {
                _mm512_storeu_ps(dst.add(i), ea);
                _mm512_storeu_ps(dst.add(i + 16), eb);
            }
        }
        s0 = _mm512_add_ps(s0, ea);
        s1 = _mm512_add_ps(s1, eb);
        i += 32;
    }
    while i < n {
        let lanes = lanes_left(n - i);
        // SAFETY: the mask's lanes are i..n, inside `row` and `out`; no others are touched.
        let a = unsafe { _mm512_mask_loadu_ps(neg_inf, lanes, src.add(i)) };
        let e = exp_shifted(a);
        if !log {
            // SAFETY: as above.
            unsafe { _mm512_mask_storeu_ps(dst.add(i), lanes, e) };
        }
        s0 = _mm512_add_ps(s0, e);
        i += 16;
    }
    let sum = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
    if sum.is_nan() {
        return nan_row(out);
    }

    // Pass 3: softmax scales the exponentials; log-softmax is (x - m) - ln(sum).
    let (scale, offset) = if log {
        (splat(1.0), splat(math::ln::<true>(sum)))
    } else {
        (splat(1.0 / sum), _mm512_setzero_ps())
    };
    let finish = |v: __m512| {
        if log {
            _mm512_sub_ps(_mm512_sub_ps(v, shift), offset)
        } else {
            _mm512_mul_ps(v, scale)
        }
    };
    // Softmax reads back its exponentials; log-softmax reads the row.
    let from = if log { src } else { dst.cast_const() };
    let mut i = 0;
    while i < pairs {
        // SAFETY: i + 32 <= n, inside `row` and `out`; `out` was written by pass 2 where it
        // is read here.
        unsafe {
            let (a, b) = (
                _mm512_loadu_ps(from.add(i)),
                _mm512_loadu_ps(from.add(i + 16)),
            );
            _mm512_storeu_ps(dst.add(i), finish(a));
            _mm512_storeu_ps(dst.add(i + 16), finish(b));
        }
        i += 32;
    }
    while i < n {
        let lanes = lanes_left(n - i);
        // SAFETY: the mask's lanes are i..n, as above.
        unsafe {
            let a = _mm512_maskz_loadu_ps(lanes, from.add(i));
            _mm512_mask_storeu_ps(dst.add(i), lanes, finish(a));
        }
        i += 16;
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::lacks_avx512;
    use super::*;

    /// Rows of every length from 1 to 70 and of 1000, random, and with a NaN, a +inf, all
    /// -inf, and some -inf at varying places: each element within a few units of 2⁻²⁴ of the
    /// f64 softmax (relative, plus the rounding of `x - max`) / log-softmax (absolute), NaN
    /// rows NaN throughout, and every element written.
    #[test]
    fn rows_match_the_f64_reference_with_special_values() {
        if lacks_avx512() {
            return;
        }
        let mut seed = 12345u64;
        let mut uniform = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 40) as f32 / (1u64 << 24) as f32
        };
        for n in (1..=70).chain([1000]) {
            for case in 0..5 {
                let mut row: Vec<f32> = (0..n).map(|_| uniform() * 40.0 - 20.0).collect();
                let at = (case * 7 + n / 2) % n;
                match case {
                    1 => row[at] = f32::NAN,
                    2 => row[at] = f32::INFINITY,
                    3 => row.iter_mut().for_each(|v| *v = f32::NEG_INFINITY),
                    4 => row[at] = f32::NEG_INFINITY,
                    _ => {}
                }
                let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
                let nan_row = !m.is_finite() || row.iter().any(|v| v.is_nan());
                let sum: f64 = row.iter().map(|&v| (v as f64 - m).exp()).sum();
                for log in [false, true] {
                    let mut out = vec![MaybeUninit::new(1234.5f32); n];
                    // SAFETY: AVX-512 is present (checked above).
                    unsafe { softmax_rows(&row, n, &mut out, log) };
                    for (k, (o, &v)) in out.iter().zip(&row).enumerate() {
                        // SAFETY: initialised (with a sentinel, then by the kernel).
                        let y = unsafe { o.assume_init() };
                        let what = format!("n {n} case {case} log {log} [{k}] = {v}: {y:e}");
                        if nan_row {
                            assert!(y.is_nan(), "{what}, want NaN");
                            continue;
                        }
                        let (want, tol) = if log {
                            let r = (v as f64 - m) - sum.ln();
                            (r, 4.0 * f32::EPSILON as f64 * (1.0 + r.abs()))
                        } else {
                            // `x - max` rounded to f32 moves e^(x - max) by up to half an
                            // ulp of the difference, relative.
                            let d = v as f64 - m;
                            let r = d.exp() / sum;
                            (r, f32::EPSILON as f64 * (4.0 + d.abs()) * r + 1.2e-38)
                        };
                        assert!(
                            y as f64 == want || (y as f64 - want).abs() <= tol,
                            "{what}, want {want:e} (sentinel 1234.5 means not written)"
                        );
                    }
                }
            }
        }
    }
}
