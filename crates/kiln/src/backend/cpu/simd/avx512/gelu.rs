//! GELU, `x Φ(x)` (erf form) and `x σ(2u(x))` (tanh form, `u = √(2/π) (x + 0.044715 x³)`),
//! with AVX-512: the tail probability `q(|x|)` (`Φ(-|x|)`, or `σ(-2u(|x|))`) from sixteen
//! degree-6 polynomials, one per interval of `|x|` below the form's limit, whose coefficients
//! sit in seven registers and are picked per lane with `vpermps`.
//!
//! The portable erf form (`math::gelu_erf_central`) computes `q` as `e^E / 2` with `E` a
//! polynomial in `|x|` and `x²` carried as two floats: 21 multiply-adds a vector, which bound
//! it on Zen 4; the portable tanh form divides by `1 + e^(-2u)`. Here `q` costs six
//! multiply-adds and seven permutes (on Zen 4 a 512-bit permute takes a multiply-add's issue
//! slot, so the count is what matters). Worst errors over every float of the tables' ranges
//! (`bench/tools/fit_gelu_table` fits the tables and sweeps every float; `tests/cpu_math.rs`
//! sweeps the whole range through the kernel): erf form **2.40 ulp** on `|x| < 4.5` (the
//! portable form: 5.8), tanh form **2.23 ulp** on `|x| < 4` (portable: 3.6). Measured on Zen 4
//! (session 52, `cpu_micro unary`): erf form, one core, 64K elements, 0.455 → **0.248 ns** an
//! element; two threads, 1M elements, 30 → **61–64 GB/s**. 32 degree-5 polynomials
//! (`vpermt2ps`, one permute and one multiply-add fewer, 2.28 ulp) measured 4% slower: the
//! permute overwrites a table register, which then has to be copied each time.
//!
//! The result is `max(0, x) - |x| q`: `x (1 - q)` above zero, `|x| q` below, so `q`'s relative
//! error is the result's below zero and is damped above (`q <= 1/2`). From 5.5 up (`+inf`
//! included) both forms round to `x`; every other lane (beyond the table below zero, between
//! the limit and 5.5 above, NaN) is written again by the general form of `math`, out of line.

use super::{lanes_left, map_lanes, splat};
use crate::backend::cpu::simd::math;
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

/// The two forms of GELU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gelu {
    Erf,
    Tanh,
}

/// From here up both forms round to `x`: `Φ(-5.5) = 1.9e-8` and `σ(-2u(5.5)) = 1.1e-9` are
/// below 2⁻²⁵, half an ulp of the floats just below 1 (and `x q` below half an ulp of `x`).
const IDENTITY_FROM: f32 = 5.5;

/// One form's `q` on sixteen intervals of `|x| < limit`.
struct Table {
    limit: f32,
    /// `1/h` for the interval width `h = limit / 15.5`: lane `z = |x|` is in interval
    /// `i = round(z / h)` (0..=15) with the polynomial's variable `u = z/h - i` in [-1/2, 1/2].
    inv_h: f32,
    /// `rows[6 - k][i]`: the coefficient of `u^k` in interval `i` (the highest power first,
    /// one row per register).
    rows: [[f32; 16]; 7],
}

/// `Φ(-z)`, from `bench/tools/fit_gelu_table` (relative minimax fits in f64, each coefficient
/// rounded to f32 from the highest with the lower ones refitted; worst error of the GELU 2.40
/// ulp over every float of the range).
#[rustfmt::skip]
const ERF: Table = Table {
    limit: 4.5,
    inv_h: 3.444_444_4,
    rows: [
        [7.912669e-7, 1.3067414e-6, 1.9030766e-6, 1.5691346e-6, 6.4558265e-7, -2.7735328e-7, -7.758921e-7, -7.8548976e-7, -5.0632536e-7, -1.8688388e-7, 2.6209083e-8, 1.0987647e-7, 1.08769314e-7, 7.549969e-8, 4.2272017e-8, 2.0068386e-8],
        [-2.1476739e-5, -1.6378493e-5, -6.311456e-6, 4.5350325e-6, 1.1370393e-5, 1.23921645e-5, 9.006871e-6, 4.1179055e-6, 1.4425841e-7, -1.9347144e-6, -2.3699097e-6, -1.9147635e-6, -1.2311734e-6, -6.686629e-7, -3.1527242e-7, -1.3102951e-7],
        [4.62119e-7, -9.5840565e-5, -1.542644e-4, -1.5776618e-4, -1.1538789e-4, -5.33643e-5, 1.5496198e-6, 3.4392015e-5, 4.425818e-5, 3.887731e-5, 2.7511589e-5, 1.6562255e-5, 8.70006e-6, 4.0444224e-6, 1.6785658e-6, 6.2564726e-7],
        [1.6269365e-3, 1.428418e-3, 9.1118366e-4, 2.6881308e-4, -2.889794e-4, -6.2812644e-4, -7.259808e-4, -6.458367e-4, -4.818661e-4, -3.1213864e-4, -1.7866712e-4, -9.130627e-5, -4.1936088e-5, -1.7388787e-5, -6.5305744e-6, -2.2267964e-6],
        [1.326005e-8, 4.6797195e-3, 8.247865e-3, 1.0021187e-2, 9.948068e-3, 8.509895e-3, 6.423554e-3, 4.3329797e-3, 2.6317073e-3, 1.4462511e-3, 7.2152144e-4, 3.275552e-4, 1.355533e-4, 5.120398e-5, 1.7673163e-5, 5.5782475e-6],
        [-1.1582195e-1, -1.11042224e-1, -9.785431e-2, -7.926223e-2, -5.9012927e-2, -4.0385228e-2, -2.5403438e-2, -1.4687806e-2, -7.8057735e-3, -3.8130234e-3, -1.7120544e-3, -7.06578e-4, -2.6803857e-4, -9.346069e-5, -2.9954028e-5, -8.824214e-6],
        [5e-1, 3.8578475e-1, 2.807398e-1, 1.9188589e-1, 1.2276193e-1, 7.330463e-2, 4.0759865e-2, 2.1063767e-2, 1.0100845e-2, 4.4888356e-3, 1.846701e-3, 7.0267887e-4, 2.471088e-4, 8.026304e-5, 2.4066103e-5, 6.6582456e-6],
    ],
};

/// `σ(-2u(z))`, as [`ERF`] (`fit_gelu_table 16 4.0 6 1 tanh`: 2.23 ulp).
#[rustfmt::skip]
const TANH: Table = Table {
    limit: 4.0,
    inv_h: 3.875,
    rows: [
        [4.923289e-7, 6.139348e-7, 9.574192e-7, 8.983116e-7, 5.1726215e-7, 5.199234e-8, -2.769942e-7, -3.9207964e-7, -3.442301e-7, -2.2563228e-7, -1.0567239e-7, -1.6841206e-8, 3.3775432e-8, 5.1737707e-8, 4.801445e-8, 3.448577e-8],
        [-1.2301959e-5, -9.728309e-6, -4.8421075e-6, 9.252026e-7, 5.294286e-6, 7.001014e-6, 6.2423655e-6, 4.1413323e-6, 1.8720389e-6, 1.3963957e-7, -8.535441e-7, -1.210248e-6, -1.1461984e-6, -8.7794166e-7, -5.706053e-7, -3.1917475e-7],
        [3.4149707e-7, -5.5140645e-5, -9.254273e-5, -1.0217116e-4, -8.554462e-5, -5.348831e-5, -1.9447769e-5, 6.8374447e-6, 2.1735717e-5, 2.6429869e-5, 2.4306299e-5, 1.8895806e-5, 1.2861395e-5, 7.74988e-6, 4.1386825e-6, 1.9522713e-6],
        [1.148296e-3, 1.0348847e-3, 7.31277e-4, 3.3212776e-4, -5.0648323e-5, -3.3155194e-4, -4.7610878e-4, -4.977742e-4, -4.3681354e-4, -3.3758505e-4, -2.3446062e-4, -1.4747014e-4, -8.407117e-5, -4.330269e-5, -2.0042085e-5, -8.280872e-6],
        [1.1081923e-8, 3.3303632e-3, 6.0171913e-3, 7.6218965e-3, 8.027287e-3, 7.421683e-3, 6.1759767e-3, 4.6888064e-3, 3.272052e-3, 2.1058226e-3, 1.249941e-3, 6.825022e-4, 3.4125152e-4, 1.5531183e-4, 6.3904e-5, 2.3598863e-5],
        [-1.02952845e-1, -9.956541e-2, -9.0065226e-2, -7.6225586e-2, -6.0384277e-2, -4.479457e-2, -3.1124767e-2, -2.024951e-2, -1.23195145e-2, -6.9915443e-3, -3.6875077e-3, -1.7986178e-3, -8.065515e-4, -3.303266e-4, -1.2268926e-4, -4.1024905e-5],
        [5e-1, 3.9818397e-1, 3.0291957e-1, 2.195064e-1, 1.5113448e-1, 9.864706e-2, 6.089615e-2, 3.5457753e-2, 1.9409863e-2, 9.948859e-3, 4.7519063e-3, 2.1032342e-3, 8.5732236e-4, 3.1970243e-4, 1.08308865e-4, 3.3096752e-5],
    ],
};

/// `dst[i] = gelu(src[i])` in the form `form`.
///
/// Calling it needs `unsafe` outside code compiled for AVX-512: the CPU must have AVX-512 F,
/// BW, DQ and VL (`SimdLevel::Avx512`).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
pub(crate) fn gelu_f32(form: Gelu, src: &[f32], dst: &mut [MaybeUninit<f32>]) {
    assert_eq!(
        src.len(),
        dst.len(),
        "gelu_f32: source and destination lengths"
    );
    match form {
        Gelu::Erf => map_lanes!(src, dst, erf_x16, erf_outside_table),
        Gelu::Tanh => map_lanes!(src, dst, tanh_x16, tanh_outside_table),
    }
}

/// The erf form where its table does not apply: `x` from [`IDENTITY_FROM`] up, the general
/// form below (and for NaN).
#[inline]
#[target_feature(enable = "avx512f,fma")]
fn erf_outside_table(x: f32) -> f32 {
    if x >= IDENTITY_FROM {
        x
    } else {
        math::gelu_erf::<true>(x)
    }
}

/// The tanh form where its table does not apply, as [`erf_outside_table`].
#[inline]
#[target_feature(enable = "avx512f,fma")]
fn tanh_outside_table(x: f32) -> f32 {
    if x >= IDENTITY_FROM {
        x
    } else {
        math::gelu_tanh::<true>(x)
    }
}

#[inline]
#[target_feature(enable = "avx512f")]
fn erf_x16(x: __m512) -> (__m512, __mmask16) {
    table_x16(x, &ERF)
}

#[inline]
#[target_feature(enable = "avx512f")]
fn tanh_x16(x: __m512) -> (__m512, __mmask16) {
    table_x16(x, &TANH)
}

/// GELU from `table` on the lanes with `|x| < table.limit`, and the mask of those lanes.
#[inline]
#[target_feature(enable = "avx512f")]
fn table_x16(x: __m512, table: &Table) -> (__m512, __mmask16) {
    // SAFETY: each row is 16 f32, the width of an unaligned 512-bit load.
    let row = |k: usize| unsafe { _mm512_loadu_ps(table.rows[k].as_ptr()) };
    let z = _mm512_abs_ps(x);
    let magic = splat(math::ROUND_MAGIC);
    // `s`'s low bits are `i` (ROUND_MAGIC's low bits are zero), and `vpermps` reads the low
    // four bits of each lane of its index.
    let s = _mm512_fmadd_ps(z, splat(table.inv_h), magic);
    let u = _mm512_fmsub_ps(z, splat(table.inv_h), _mm512_sub_ps(s, magic));
    let index = _mm512_castps_si512(s);
    let mut q = _mm512_permutexvar_ps(index, row(0));
    for k in 1..table.rows.len() {
        q = _mm512_fmadd_ps(q, u, _mm512_permutexvar_ps(index, row(k)));
    }
    // max(0, x) as `0 > x ? 0 : x`, so that -0 stays -0.
    let floor = _mm512_max_ps(_mm512_setzero_ps(), x);
    let y = _mm512_fnmadd_ps(z, q, floor);
    (y, _mm512_cmp_ps_mask::<_CMP_LT_OQ>(z, splat(table.limit)))
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{check_every_length, ulp_error, LaneCase};
    use super::*;
    use crate::backend::cpu::simd::SimdLevel;

    /// The f64 GELU of `form`.
    fn reference(form: Gelu, x: f64) -> f64 {
        match form {
            Gelu::Erf => x * 0.5 * libm::erfc(-x / std::f64::consts::SQRT_2),
            Gelu::Tanh => {
                let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
                x / (1.0 + (-2.0 * u).exp())
            }
        }
    }

    fn table(form: Gelu) -> &'static Table {
        match form {
            Gelu::Erf => &ERF,
            Gelu::Tanh => &TANH,
        }
    }

    /// Every 61st float of each table's range, both signs (subnormals and ±0 included):
    /// within 2.5 ulp of the f64 GELU (`bench/tools/fit_gelu_table` measures 2.40 and 2.23
    /// over every float).
    #[test]
    fn table_range_stays_within_its_bound() {
        if !SimdLevel::Avx512.is_supported() {
            eprintln!("no AVX-512 here: nothing to test");
            return;
        }
        for form in [Gelu::Erf, Gelu::Tanh] {
            let positive: Vec<f32> = (0..)
                .map(|i: u32| f32::from_bits(i * 61))
                .take_while(|x| *x < table(form).limit)
                .collect();
            for sign in [1.0f32, -1.0] {
                let src: Vec<f32> = positive.iter().map(|x| x * sign).collect();
                let mut dst = vec![MaybeUninit::uninit(); src.len()];
                // SAFETY: AVX-512 is present (checked above).
                unsafe { gelu_f32(form, &src, &mut dst) };
                let (mut worst, mut at) = (0.0, 0.0);
                for (&x, y) in src.iter().zip(&dst) {
                    // SAFETY: the kernel writes every element.
                    let y = unsafe { y.assume_init() };
                    let err = ulp_error(y, reference(form, x as f64));
                    if err > worst {
                        (worst, at) = (err, x);
                    }
                    assert!(
                        x != 0.0 || y.to_bits() == x.to_bits(),
                        "{form:?}({x:?}) = {y:?}"
                    );
                }
                assert!(worst <= 2.5, "{form:?}: worst {worst} ulp at {at:e}");
            }
        }
    }

    /// Every length from 0 to 70 with values outside the tables (the limits and beyond, ±inf,
    /// NaN) at varying lanes: table lanes within 2.5 ulp of the f64 GELU, every other lane
    /// bit for bit the general form of `math` (from 5.5 up, that is `x`).
    #[test]
    fn every_length_and_lane_gets_its_value() {
        if !SimdLevel::Avx512.is_supported() {
            eprintln!("no AVX-512 here: nothing to test");
            return;
        }
        let value = |i: usize| match i % 23 {
            3 => f32::NAN,
            5 => 4.5,
            6 => 4.0,
            7 => 5.25,
            9 => 5.5,
            11 => -4.75,
            12 => -4.25,
            13 => f32::NEG_INFINITY,
            17 => f32::INFINITY,
            19 => -9.0,
            21 => 1e30,
            _ => ((i * 7919) % 900) as f32 / 100.0 - 4.5,
        };
        for (form, general) in [
            (Gelu::Erf, math::gelu_erf::<true> as fn(f32) -> f32),
            (Gelu::Tanh, math::gelu_tanh::<true>),
        ] {
            check_every_length(
                &LaneCase {
                    name: &format!("{form:?}"),
                    // SAFETY: AVX-512 is present (checked above).
                    kernel: &|src, dst| unsafe { gelu_f32(form, src, dst) },
                    fast: &|x| x.abs() < table(form).limit,
                    reference: &|x| reference(form, x),
                    max_ulp: 2.5,
                    general: &|x| {
                        // From 5.5 up the general form is `x`, as the kernel's.
                        assert!(
                            x.is_nan() || x < IDENTITY_FROM || general(x) == x,
                            "{form:?}({x})"
                        );
                        general(x)
                    },
                },
                &value,
            );
        }
    }
}
