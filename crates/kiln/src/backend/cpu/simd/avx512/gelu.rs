//! GELU (erf form), `x Φ(x)`, with AVX-512: the tail probability `q = Φ(-|x|)` from sixteen
//! degree-6 polynomials, one per interval of `|x|` on `[0, TABLE_LIMIT)`, whose coefficients
//! sit in seven registers and are picked per lane with `vpermps`.
//!
//! The portable form (`math::gelu_erf_central`) computes `q` as `e^E / 2` with `E` a
//! polynomial in `|x|` and `x²` carried as two floats: 21 multiply-adds a vector, which bound
//! it on Zen 4. Here `q` costs six multiply-adds and seven permutes (on Zen 4 a 512-bit
//! permute takes a multiply-add's issue slot, so the count is what matters), with a worst
//! error of **2.40 ulp** over every float of `(-4.5, 4.5)` against 5.8 for the portable form
//! (`bench/tools/fit_gelu_table` fits the table and sweeps every float; `tests/cpu_math.rs`
//! sweeps the whole range through the kernel). Measured on Zen 4 (session 52, `cpu_micro
//! unary`): one core, 64K elements, 0.455 → **0.248 ns** an element; two threads, 1M
//! elements, 30 → **61–64 GB/s**. 32 degree-5 polynomials (`vpermt2ps`, one permute and one
//! multiply-add fewer, 2.28 ulp) measured 4% slower: the permute overwrites a table register,
//! which then has to be copied each time.
//!
//! The result is `max(0, x) - |x| q`: `x (1 - q)` above zero, `|x| q` below, so `q`'s relative
//! error is the result's below zero and is damped above (`q <= 1/2`). From 5.5 up (`+inf`
//! included) `Φ(x)` rounds to 1 and the result is `x`; every other lane (`x <= -4.5`,
//! `4.5 <= x < 5.5`, NaN) is written again by `math::gelu_erf`, out of line.

use super::{lanes_left, map_lanes, splat};
use crate::backend::cpu::simd::math;
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

/// The table covers `|x| < TABLE_LIMIT`.
pub(crate) const TABLE_LIMIT: f32 = 4.5;

/// From here up `x Φ(x)` rounds to `x`: `Φ(-5.5) = 1.9e-8` is below 2⁻²⁵, half an ulp of
/// the floats just below 1 (and `x q` below half an ulp of `x`).
const IDENTITY_FROM: f32 = 5.5;

/// `1/h` for the interval width `h = TABLE_LIMIT / 15.5`: lane `z = |x|` is in interval
/// `i = round(z / h)` (0..=15) with the polynomial's variable `u = z/h - i` in [-1/2, 1/2].
const INV_H: f32 = 3.444_444_4;

/// `TABLE[6 - k][i]`: the coefficient of `u^k` in interval `i` (the highest power first, one
/// row per register). From `bench/tools/fit_gelu_table` (relative minimax fits in f64, each
/// coefficient rounded to f32 from the highest with the lower ones refitted; worst error 2.40
/// ulp over every float of the range).
#[rustfmt::skip]
const TABLE: [[f32; 16]; 7] = [
    [7.912669e-7, 1.3067414e-6, 1.9030766e-6, 1.5691346e-6, 6.4558265e-7, -2.7735328e-7, -7.758921e-7, -7.8548976e-7, -5.0632536e-7, -1.8688388e-7, 2.6209083e-8, 1.0987647e-7, 1.08769314e-7, 7.549969e-8, 4.2272017e-8, 2.0068386e-8],
    [-2.1476739e-5, -1.6378493e-5, -6.311456e-6, 4.5350325e-6, 1.1370393e-5, 1.23921645e-5, 9.006871e-6, 4.1179055e-6, 1.4425841e-7, -1.9347144e-6, -2.3699097e-6, -1.9147635e-6, -1.2311734e-6, -6.686629e-7, -3.1527242e-7, -1.3102951e-7],
    [4.62119e-7, -9.5840565e-5, -1.542644e-4, -1.5776618e-4, -1.1538789e-4, -5.33643e-5, 1.5496198e-6, 3.4392015e-5, 4.425818e-5, 3.887731e-5, 2.7511589e-5, 1.6562255e-5, 8.70006e-6, 4.0444224e-6, 1.6785658e-6, 6.2564726e-7],
    [1.6269365e-3, 1.428418e-3, 9.1118366e-4, 2.6881308e-4, -2.889794e-4, -6.2812644e-4, -7.259808e-4, -6.458367e-4, -4.818661e-4, -3.1213864e-4, -1.7866712e-4, -9.130627e-5, -4.1936088e-5, -1.7388787e-5, -6.5305744e-6, -2.2267964e-6],
    [1.326005e-8, 4.6797195e-3, 8.247865e-3, 1.0021187e-2, 9.948068e-3, 8.509895e-3, 6.423554e-3, 4.3329797e-3, 2.6317073e-3, 1.4462511e-3, 7.2152144e-4, 3.275552e-4, 1.355533e-4, 5.120398e-5, 1.7673163e-5, 5.5782475e-6],
    [-1.1582195e-1, -1.11042224e-1, -9.785431e-2, -7.926223e-2, -5.9012927e-2, -4.0385228e-2, -2.5403438e-2, -1.4687806e-2, -7.8057735e-3, -3.8130234e-3, -1.7120544e-3, -7.06578e-4, -2.6803857e-4, -9.346069e-5, -2.9954028e-5, -8.824214e-6],
    [5e-1, 3.8578475e-1, 2.807398e-1, 1.9188589e-1, 1.2276193e-1, 7.330463e-2, 4.0759865e-2, 2.1063767e-2, 1.0100845e-2, 4.4888356e-3, 1.846701e-3, 7.0267887e-4, 2.471088e-4, 8.026304e-5, 2.4066103e-5, 6.6582456e-6],
];

/// `dst[i] = gelu(src[i])` (erf form).
///
/// Calling it needs `unsafe` outside code compiled for AVX-512: the CPU must have AVX-512 F,
/// BW, DQ and VL (`SimdLevel::Avx512`).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
pub(crate) fn gelu_erf_f32(src: &[f32], dst: &mut [MaybeUninit<f32>]) {
    assert_eq!(
        src.len(),
        dst.len(),
        "gelu_erf_f32: source and destination lengths"
    );
    map_lanes!(src, dst, gelu_x16, gelu_outside_table)
}

/// GELU where the table does not apply: `x` from [`IDENTITY_FROM`] up, the general form
/// below (and for NaN).
#[inline]
#[target_feature(enable = "avx512f,fma")]
fn gelu_outside_table(x: f32) -> f32 {
    if x >= IDENTITY_FROM {
        x
    } else {
        math::gelu_erf::<true>(x)
    }
}

/// The table's row `k` as a register.
#[inline]
#[target_feature(enable = "avx512f")]
fn row(k: usize) -> __m512 {
    // SAFETY: `TABLE[k]` is 16 f32, the width of an unaligned 512-bit load.
    unsafe { _mm512_loadu_ps(TABLE[k].as_ptr()) }
}

/// GELU on the lanes with `|x| < TABLE_LIMIT`, and the mask of those lanes.
#[inline]
#[target_feature(enable = "avx512f")]
fn gelu_x16(x: __m512) -> (__m512, __mmask16) {
    let z = _mm512_abs_ps(x);
    let magic = splat(math::ROUND_MAGIC);
    // `s`'s low bits are `i` (ROUND_MAGIC's low bits are zero), and `vpermps` reads the low
    // four bits of each lane of its index.
    let s = _mm512_fmadd_ps(z, splat(INV_H), magic);
    let u = _mm512_fmsub_ps(z, splat(INV_H), _mm512_sub_ps(s, magic));
    let index = _mm512_castps_si512(s);
    let mut q = _mm512_permutexvar_ps(index, row(0));
    for k in 1..TABLE.len() {
        q = _mm512_fmadd_ps(q, u, _mm512_permutexvar_ps(index, row(k)));
    }
    // max(0, x) as `0 > x ? 0 : x`, so that -0 stays -0.
    let floor = _mm512_max_ps(_mm512_setzero_ps(), x);
    let y = _mm512_fnmadd_ps(z, q, floor);
    (y, _mm512_cmp_ps_mask::<_CMP_LT_OQ>(z, splat(TABLE_LIMIT)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::simd::SimdLevel;

    fn reference(x: f32) -> f64 {
        let x = x as f64;
        x * 0.5 * libm::erfc(-x / std::f64::consts::SQRT_2)
    }

    /// `y`'s error against the f64 `r` in ulp of `r` rounded to f32.
    fn ulp_error(y: f32, r: f64) -> f64 {
        if y as f64 == r {
            return 0.0;
        }
        let rounded = (r as f32).abs();
        let ulp = if rounded < f32::MIN_POSITIVE {
            2f64.powi(-149)
        } else {
            (f32::from_bits(rounded.to_bits() + 1) - rounded) as f64
        };
        (y as f64 - r).abs() / ulp
    }

    fn run(src: &[f32], extra: usize) -> Vec<MaybeUninit<f32>> {
        let mut dst = vec![MaybeUninit::new(1234.5f32); src.len() + extra];
        // SAFETY: the callers check that the CPU has AVX-512.
        unsafe { gelu_erf_f32(src, &mut dst[..src.len()]) };
        dst
    }

    /// Every 61st float of the table's range, both signs (subnormals and ±0 included): within
    /// 2.5 ulp of the f64 GELU (`bench/tools/fit_gelu_table` measures 2.40 over every float).
    #[test]
    fn table_range_stays_within_its_bound() {
        if !SimdLevel::Avx512.is_supported() {
            eprintln!("no AVX-512 here: nothing to test");
            return;
        }
        let positive: Vec<f32> = (0..)
            .map(|i: u32| f32::from_bits(i * 61))
            .take_while(|x| *x < TABLE_LIMIT)
            .collect();
        for sign in [1.0f32, -1.0] {
            let src: Vec<f32> = positive.iter().map(|x| x * sign).collect();
            let dst = run(&src, 0);
            let (mut worst, mut at) = (0.0, 0.0);
            for (&x, y) in src.iter().zip(&dst) {
                // SAFETY: the kernel writes every element.
                let y = unsafe { y.assume_init() };
                let err = ulp_error(y, reference(x));
                if err > worst {
                    (worst, at) = (err, x);
                }
                assert!(
                    x != 0.0 || y.to_bits() == x.to_bits(),
                    "gelu({x:?}) = {y:?}"
                );
            }
            assert!(worst <= 2.5, "worst {worst} ulp at {at:e}");
        }
    }

    /// Every length from 0 to 70 with values outside the table (±4.5 and beyond, ±inf, NaN)
    /// at varying lanes: table lanes within 2.5 ulp of the f64 GELU, every other lane bit for
    /// bit `math::gelu_erf` (from 5.5 up, that is `x`), nothing past the end written.
    #[test]
    fn every_length_and_lane_gets_its_value() {
        if !SimdLevel::Avx512.is_supported() {
            eprintln!("no AVX-512 here: nothing to test");
            return;
        }
        let value = |i: usize| match i % 23 {
            3 => f32::NAN,
            5 => 4.5,
            7 => 5.25,
            9 => 5.5,
            11 => -4.75,
            13 => f32::NEG_INFINITY,
            17 => f32::INFINITY,
            19 => -9.0,
            21 => 1e30,
            _ => ((i * 7919) % 900) as f32 / 100.0 - 4.5,
        };
        for len in 0..=70 {
            let src: Vec<f32> = (0..len).map(|i| value(i + len)).collect();
            let dst = run(&src, 3);
            for (i, &x) in src.iter().enumerate() {
                // SAFETY: the kernel writes every element of `dst[..len]`.
                let y = unsafe { dst[i].assume_init() };
                if x.abs() < TABLE_LIMIT {
                    let err = ulp_error(y, reference(x));
                    assert!(err <= 2.5, "len {len} [{i}] = {x}: {y:e} ({err} ulp)");
                } else {
                    let want = math::gelu_erf::<true>(x);
                    assert!(
                        y.to_bits() == want.to_bits() || (y.is_nan() && want.is_nan()),
                        "len {len} [{i}] = {x}: {y:e}, general form {want:e}"
                    );
                    if x >= IDENTITY_FROM {
                        assert_eq!(y, x, "len {len} [{i}]");
                    }
                }
            }
            for d in &dst[len..] {
                // SAFETY: initialised with the sentinel.
                assert_eq!(unsafe { d.assume_init() }, 1234.5, "written past {len}");
            }
        }
    }
}
