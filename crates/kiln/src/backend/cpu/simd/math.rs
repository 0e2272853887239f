//! f32 elementary functions written to vectorise: branch-free (selects, not jumps), no calls,
//! integer tricks through `to_bits`/`from_bits`. Every function is `#[inline(always)]` so it
//! compiles into each instruction-set copy of the kernel that calls it (see `simd_fn!`);
//! `F` says whether that copy has fused multiply-add.
//!
//! Accuracy is measured, not derived: `tests/cpu_math.rs` sweeps the whole f32 range (every
//! 97th bit pattern, plus dense sweeps where the functions bend, subnormals, ±0, ±inf, NaN)
//! against an f64 reference, at the best level of the machine and with the baseline forced.
//! The worst errors seen, in units in the last place of the correctly rounded result, are in
//! each doc comment as "FMA / no FMA".

/// `a * b + c`, fused where the instruction set has it.
#[inline(always)]
pub(crate) fn fma<const F: bool>(a: f32, b: f32, c: f32) -> f32 {
    if F {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// Horner evaluation of `c[0] x^(n-1) + ... + c[n-1]`.
#[inline(always)]
fn horner<const F: bool, const N: usize>(x: f32, c: [f32; N]) -> f32 {
    let mut acc = c[0];
    for &k in &c[1..] {
        acc = fma::<F>(acc, x, k);
    }
    acc
}

/// `x` clamped into `[lo, hi]`, NaN kept.
#[inline(always)]
fn clamp_keep_nan(x: f32, lo: f32, hi: f32) -> f32 {
    let x = if x > hi { hi } else { x };
    if x < lo {
        lo
    } else {
        x
    }
}

/// `x * x` as an unevaluated sum `hi + lo`, `hi` the rounded square.
#[inline(always)]
fn two_square<const F: bool>(x: f32) -> (f32, f32) {
    let hi = x * x;
    let lo = if F {
        x.mul_add(x, -hi)
    } else {
        // Veltkamp split: x = s + (x - s) with s holding 12 significant bits, so s*s is exact.
        let s = f32::from_bits(x.to_bits() & 0xffff_f000);
        let d = x - s;
        (s * s - hi) + d * (x + s)
    };
    (hi, lo)
}

/// `a * b` as an unevaluated sum `hi + lo`, `hi` the rounded product.
#[inline(always)]
fn two_prod<const F: bool>(a: f32, b: f32) -> (f32, f32) {
    let hi = a * b;
    let lo = if F {
        a.mul_add(b, -hi)
    } else {
        let split = |v: f32| {
            let s = f32::from_bits(v.to_bits() & 0xffff_f000);
            (s, v - s)
        };
        let ((ah, al), (bh, bl)) = (split(a), split(b));
        ((ah * bh - hi) + ah * bl + al * bh) + al * bl
    };
    (hi, lo)
}

/// `a + b` as `hi + lo` exactly (Knuth's two-sum).
#[inline(always)]
fn two_sum(a: f32, b: f32) -> (f32, f32) {
    let s = a + b;
    let bb = s - a;
    (s, (a - (s - bb)) + (b - bb))
}

pub(crate) const ROUND_MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
pub(crate) const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split so that `n * LN2_HI` is exact for |n| < 2^9 (Cody and Waite).
pub(crate) const LN2_HI: f32 = 0.693_359_4;
pub(crate) const LN2_LO: f32 = -2.121_944_4e-4;

/// `Q` in `e^r = 1 + r + r² Q(r)` on `|r| <= ln2/2`, highest power first (minimax for the
/// relative error of `e^r`, 3.8e-9 with these f32 coefficients).
pub(crate) const EXP_Q: [f32; 5] = [
    1.3814613e-3,
    8.36871e-3,
    4.166839e-2,
    1.6666521e-1,
    4.9999994e-1,
];

/// The shared core of the exponentials: `e^(hi + lo) = y · 2^n` with `y` in about
/// [0.7, 1.5] (Cody–Waite reduction to `|r| <= ln2/2`, then [`EXP_Q`]'s polynomial), for
/// `hi + lo` finite and inside the exponent range (callers clamp).
#[inline(always)]
fn exp_reduce<const F: bool>(hi: f32, lo: f32) -> (f32, i32) {
    let t = fma::<F>(hi + lo, LOG2E, ROUND_MAGIC);
    let n = t - ROUND_MAGIC;
    // hi - n*LN2_HI is exact (both products and the difference fit in 24 bits).
    let r = fma::<F>(-n, LN2_HI, hi);
    let r = fma::<F>(-n, LN2_LO, r) + lo;
    let y = exp_small::<F>(r);
    let n = (t.to_bits() as i32).wrapping_sub(ROUND_MAGIC.to_bits() as i32);
    (y, n)
}

/// `e^r` for `|r| <= ln2/2` (plus rounding): `1 + r + r² Q(r)`, `Q` by Estrin's scheme.
#[inline(always)]
fn exp_small<const F: bool>(r: f32) -> f32 {
    let c = EXP_Q;
    let r2 = r * r;
    let q = fma::<F>(
        fma::<F>(fma::<F>(c[0], r, c[1]), r, c[2]),
        r2,
        fma::<F>(c[3], r, c[4]),
    );
    fma::<F>(q, r2, r) + 1.0
}

/// Where [`exp_normal`] applies: `EXP_NORMAL_LO <= x <= EXP_NORMAL_HI` (`e^x` a normal
/// float, `2^n` of the reduction an exponent the result's bits can take).
pub(crate) const EXP_NORMAL_LO: f32 = -87.33;
/// See [`EXP_NORMAL_LO`].
pub(crate) const EXP_NORMAL_HI: f32 = 88.0;

/// `e^x` for `x` in `[EXP_NORMAL_LO, EXP_NORMAL_HI]` only: the reduction of [`exp`] without
/// its clamps, and `2^n` added to the exponent bits of `e^r` instead of multiplied in two
/// factors. Elsewhere a meaningless value, never a panic: the exp kernel computes this form
/// on every block and redoes the blocks where it did not apply. Same values as [`exp`] on
/// its range (a unit test compares them), 15% less time per element than [`exp`] (AVX2).
#[inline(always)]
pub(crate) fn exp_normal<const F: bool>(x: f32) -> f32 {
    let t = fma::<F>(x, LOG2E, ROUND_MAGIC);
    let n = t - ROUND_MAGIC;
    let r = fma::<F>(-n, LN2_HI, x);
    let r = fma::<F>(-n, LN2_LO, r);
    // t's bits are ROUND_MAGIC's plus n, and ROUND_MAGIC's low nine bits are zero, so
    // `t << 23` is `n << 23`.
    exp_reduced_scaled::<F>(r, t.to_bits() << 23)
}

/// `e^(hi + lo)` for a small `lo` (|lo| ≲ 2): `lo` enters after the range reduction, so the
/// rounding of `hi + lo` does not spoil results whose argument is large.
#[inline(always)]
pub(crate) fn exp_parts<const F: bool>(hi: f32, lo: f32) -> f32 {
    exp_parts_scaled::<F>(hi, lo, 0)
}

/// `e^(hi + lo) * 2^k` for `0 <= k <= 24`, rounded once: a result that would be subnormal
/// keeps its full precision for a caller that multiplies it back down.
#[inline(always)]
pub(crate) fn exp_parts_scaled<const F: bool>(hi: f32, lo: f32, k: i32) -> f32 {
    // Beyond these e^x is 0 or inf; clamping keeps 2^n inside the exponent range below
    // (and drops `lo`, which may be as large as an ulp of `hi`).
    // The lower bound leaves room for k: e^-121 * 2^24 still rounds to 0.
    let inside = hi > -121.0 && hi < 89.0;
    let lo = if inside { lo } else { 0.0 };
    let hi = clamp_keep_nan(hi, -121.0, 89.0);
    let (y, n) = exp_reduce::<F>(hi, lo);
    // 2^n in two factors, each a normal float even when the result is subnormal.
    let ni = n + k;
    let n1 = ni >> 1;
    let n2 = ni - n1;
    let s1 = f32::from_bits(((n1 + 127) as u32) << 23);
    let s2 = f32::from_bits(((n2 + 127) as u32) << 23);
    y * s1 * s2
}

/// `e^x`. Worst error 1.02 / 1.0 ulp (subnormal results included).
#[inline(always)]
pub(crate) fn exp<const F: bool>(x: f32) -> f32 {
    exp_parts::<F>(x, 0.0)
}

/// `e^x` for the arguments of softmax, `x` in [-inf, 0] (a value minus the finite max of
/// its row): results below `f32::MIN_POSITIVE` (x < -87.33) flush to 0, an absolute error
/// under 1.2e-38 in a probability. Elsewhere on [-inf, 0] the values of [`exp`]. NaN and
/// positive arguments give meaningless values: the callers take rows whose max is NaN or
/// infinite apart.
#[inline(always)]
pub(crate) fn exp_nonpositive<const F: bool>(x: f32) -> f32 {
    let e = exp_normal::<F>(x);
    if x < EXP_NORMAL_LO {
        0.0
    } else {
        e
    }
}

/// Natural logarithm. Worst error 0.8 / 0.9 ulp; `ln(±0) = -inf`, `ln(x<0) = NaN`,
/// subnormal inputs handled.
#[inline(always)]
pub(crate) fn ln<const F: bool>(x: f32) -> f32 {
    let sub = x < f32::MIN_POSITIVE;
    let xs = if sub { x * 8_388_608.0 } else { x }; // * 2^23
    let bits = xs.to_bits();
    let mut e = ((bits >> 23) & 0xff) as i32 - 127 - if sub { 23 } else { 0 };
    // Mantissa in [1, 2), then into [sqrt(1/2), sqrt(2)).
    let m = f32::from_bits((bits & 0x007f_ffff) | 0x3f80_0000);
    let big = m > std::f32::consts::SQRT_2;
    let m = if big { m * 0.5 } else { m };
    e += big as i32;
    let ef = e as f32;
    let f = m - 1.0;
    let z = f * f;
    // Cephes logf.
    let p = horner::<F, 9>(
        f,
        [
            7.037_683_6e-2,
            -1.151_461e-1,
            1.167_699_9e-1,
            -1.242_014_1e-1,
            1.424_932_3e-1,
            -1.666_805_8e-1,
            2.000_071_4e-1,
            -2.499_999_4e-1,
            3.333_333e-1,
        ],
    );
    let mut y = p * f * z;
    y = fma::<F>(ef, LN2_LO, y);
    y = fma::<F>(-0.5, z, y);
    let r = fma::<F>(ef, LN2_HI, f + y);
    let r = if x == 0.0 { f32::NEG_INFINITY } else { r };
    let r = if x == f32::INFINITY { x } else { r };
    // x < 0 and NaN.
    if x >= 0.0 {
        r
    } else {
        f32::NAN
    }
}

/// `P` in `tanh(x) = x + x³ P(x²)` for `|x| < TANH_SMALL_BELOW` (Cephes tanhf), highest power
/// first.
const TANH_SMALL: [f32; 5] = [
    -5.704_988_7e-3,
    2.063_909e-2,
    -5.373_971_6e-2,
    1.333_144_2e-1,
    -3.333_328e-1,
];
/// Where [`tanh`] uses [`TANH_SMALL`]'s polynomial: `|x| < TANH_SMALL_BELOW`.
const TANH_SMALL_BELOW: f32 = 0.625;

/// Hyperbolic tangent. Worst error 1.4 / 1.4 ulp (with AVX-512 the kernel is
/// `avx512::logistic`'s: 1.92 ulp).
#[inline(always)]
pub(crate) fn tanh<const F: bool>(x: f32) -> f32 {
    let a = x.abs();
    // Small |x|: odd polynomial (Cephes tanhf).
    let z = x * x;
    let p = horner::<F, 5>(z, TANH_SMALL);
    let small = fma::<F>(p * z, x, x);
    // Otherwise 1 - 2 / (e^2|x| + 1), which saturates to 1 (and keeps NaN).
    let large = (1.0 - 2.0 / (exp::<F>(2.0 * a) + 1.0)).copysign(x);
    if a < TANH_SMALL_BELOW {
        small
    } else {
        large
    }
}

/// 2^24 and its inverse: scale factors that keep tiny intermediate results normal.
const TWO_24: i32 = 24;
const INV_TWO_24: f32 = 1.0 / 16_777_216.0;

/// `1 / (1 + e^-x)`, as `e^x / (1 + e^x)` for negative x so that tiny results keep their
/// precision. Worst error 2.7 / 2.7 ulp (with AVX-512 the kernel is `logistic`'s: 1.9 ulp).
#[inline(always)]
pub(crate) fn sigmoid<const F: bool>(x: f32) -> f32 {
    let e = exp::<F>(-x.abs());
    let s = 1.0 / (1.0 + e);
    if x < 0.0 {
        e * s
    } else {
        s
    }
}

/// Where [`sigmoid_normal`] applies: `|x| < SIGMOID_NORMAL` (`e^-|x|` a normal float).
pub(crate) const SIGMOID_NORMAL: f32 = 87.0;

/// [`sigmoid`] for `|x| < SIGMOID_NORMAL` only (elsewhere a meaningless value, never a
/// panic): `e^-|x|` without range checks and with one scale factor, at about three quarters
/// of the cost. Worst error 2.7 ulp, as [`sigmoid`]'s over that range.
#[inline(always)]
pub(crate) fn sigmoid_normal<const F: bool>(x: f32) -> f32 {
    let e = exp_parts_normal::<F>(-x.abs(), 0.0);
    let s = 1.0 / (1.0 + e);
    if x < 0.0 {
        e * s
    } else {
        s
    }
}

/// `x * sigmoid(x)` (SiLU, swish), with `e^x` scaled by 2^24 on the negative side so that
/// a normal result never passes through a subnormal. Worst error 3.7 / 3.7 ulp (with AVX-512
/// the kernel is `logistic`'s: 2.7 ulp); `silu(-inf)` is NaN, as in PyTorch.
#[inline(always)]
pub(crate) fn silu<const F: bool>(x: f32) -> f32 {
    x_times_logistic::<F>(x, -x.abs(), 0.0, x < 0.0)
}

/// `x / (1 + e^-a)` where `-|a| = hi + lo` and `neg` says whether `a < 0`: the shared tail
/// of SiLU and the tanh GELU.
#[inline(always)]
fn x_times_logistic<const F: bool>(x: f32, hi: f32, lo: f32, neg: bool) -> f32 {
    let big = exp_parts_scaled::<F>(hi, lo, TWO_24); // e^-|a| * 2^24
    let e = big * INV_TWO_24;
    let s = 1.0 / (1.0 + e);
    if neg {
        x * big * s * INV_TWO_24
    } else {
        x * s
    }
}

/// The argument scales `erfc_of_scaled` supports: 1 (erf) and 1/sqrt(2) (the normal CDF).
#[derive(Clone, Copy)]
enum Scale {
    One,
    InvSqrt2,
}

/// `erfc(|x| * scale) * 2^k` (`0 <= k <= 24`, see [`exp_parts_scaled`]) with relative (not
/// absolute) accuracy, for the normal CDF and erf: `t e^(-z^2 + P(t))`, `t = 1/(1 + z/2)`
/// (Numerical Recipes' erfcc, fractional error below 1.2e-7 for every z), with `z^2`
/// carried as two floats into `exp_parts_scaled`.
#[inline(always)]
fn erfc_of_scaled<const F: bool>(x: f32, scale: Scale, k: i32) -> f32 {
    let (scale, s2) = match scale {
        Scale::One => (1.0, 1.0),
        Scale::InvSqrt2 => (std::f32::consts::FRAC_1_SQRT_2, 0.5),
    };
    // z^2 = x^2 * s2 exactly: s2 is a power of two (the rounded scale squared is not).
    let z = x.abs() * scale;
    let (hi, lo) = two_square::<F>(x);
    let t = 1.0 / fma::<F>(0.5, z, 1.0);
    let p = horner::<F, 10>(
        t,
        [
            0.170_872_77,
            -0.822_152_23,
            1.488_515_9,
            -1.135_204,
            0.278_868_07,
            -0.186_288_06,
            0.096_784_18,
            0.374_091_96,
            1.000_023_7,
            -1.265_512_2,
        ],
    );
    t * exp_parts_scaled::<F>(-hi * s2, fma::<F>(-lo, s2, p), k)
}

/// The error function. Worst error 2.3 / 2.5 ulp.
#[inline(always)]
pub(crate) fn erf<const F: bool>(x: f32) -> f32 {
    // |x| < 0.75: Maclaurin series x * P(x^2) (its truncation error is below 2e-8 there).
    let z = x * x;
    const C: f32 = std::f32::consts::FRAC_2_SQRT_PI;
    let series = x * horner::<F, 10>(
        z,
        [
            -C / 6_894_720.0,
            C / 685_440.0,
            -C / 75_600.0,
            C / 9_360.0,
            -C / 1_320.0,
            C / 216.0,
            -C / 42.0,
            C / 10.0,
            -C / 3.0,
            C,
        ],
    );
    let tail = (1.0 - erfc_of_scaled::<F>(x, Scale::One, 0)).copysign(x);
    if x.abs() < 0.75 {
        series
    } else {
        tail
    }
}

/// `x * Φ(x)` with the exact normal CDF (GELU, erf form); relative accuracy holds in the
/// negative tail, where `1 + erf` would cancel. Worst error 7.1 / 7.7 ulp (the erfc fit's own
/// 1.2e-7 dominates; with AVX-512, `avx512::gelu`'s table takes `|x| < 4.5` at 2.40 ulp and
/// this form the rest); `gelu(-inf)` is NaN (`-inf * 0`), as in PyTorch.
#[inline(always)]
pub(crate) fn gelu_erf<const F: bool>(x: f32) -> f32 {
    // erfc scaled by 2^24 so that a normal result never passes through a subnormal.
    let half_erfc_big = 0.5 * erfc_of_scaled::<F>(x, Scale::InvSqrt2, TWO_24);
    if x < 0.0 {
        x * half_erfc_big * INV_TWO_24
    } else {
        x * (1.0 - half_erfc_big * INV_TWO_24)
    }
}

/// `e^(hi + lo)` for arguments whose result is a normal float (`hi + lo` in about
/// [-87, 88]): [`exp_parts`] without the clamps and with one scale factor. Other arguments
/// give a meaningless value (never a panic: the sigmoid kernel computes the normal-range form
/// on every element and overwrites the blocks where it did not apply).
#[inline(always)]
fn exp_parts_normal<const F: bool>(hi: f32, lo: f32) -> f32 {
    let (y, n) = exp_reduce::<F>(hi, lo);
    y * f32::from_bits((n.wrapping_add(127) as u32) << 23)
}

/// `P` in `ln(2 Φ(-z)) + z²/2 = z P(z)` on `[0, GELU_CENTRAL]`, highest power first: a
/// degree-8 minimax fit (Lawson's iteration in f64, the coefficients rounded to f32 one at a
/// time from the highest, the others refitted after each; absolute error 4.4e-8).
const GELU_TAIL_POLY: [f32; 9] = [
    2.7695916e-7,
    -5.4205793e-6,
    4.4432858e-5,
    -1.7230524e-4,
    -3.5992078e-5,
    4.853918e-3,
    -3.6373872e-2,
    1.8169993e-1,
    -7.978854e-1,
];

/// Where the central GELU applies: `|x| < GELU_CENTRAL`.
pub(crate) const GELU_CENTRAL: f32 = 3.5;

// The central GELU, `x Φ(x)` for `|x| < GELU_CENTRAL`, with the tail probability
// `q = Φ(-|x|) = e^E / 2`, `E = -x²/2 + |x| P(|x|)` (no division, one exponential without
// range checks, `x²` carried as two floats), in three stages that the GELU kernel runs as
// three passes over a block: each stage is a short dependency chain, so the out-of-order
// core keeps many vectors in flight, where the whole formula in one loop was a chain of ~75
// cycles per vector and ran at half the speed (AVX2, measured). Worst error 5.8 / 6.4 ulp
// (with / without FMA; 5.3 / 5.3 before session 38) over every 7th float of the range (see
// `tests::gelu_central_form_stays_within_its_bound`). Elsewhere the stages give a
// meaningless value, never a panic.
//
// Its operations are counted: on Zen 4 the form is bound by the multiply-add pipes, and
// four changes took 20% off its time per element (0.515 → 0.413 ns, one core, 64K elements
// in L2; session 38): `-x²/2` as the product `x · (-x/2)`, which also stands for `x²` in
// the polynomial's first Estrin level; the halving of `e^E` folded into the rounding
// constant; a degree-5 exponential ([`EXP_Q_GELU`]); and the result as `max(0, x) - |x| q`,
// one multiply-add with no select.

/// Central GELU, stage 1: `E = ln(2 Φ(-|x|))` as `hi + lo`.
#[inline(always)]
pub(crate) fn gelu_central_exponent<const F: bool>(x: f32) -> (f32, f32) {
    let (hi, square_lo, z, p) = gelu_central_terms::<F>(x);
    (hi, fma::<F>(z, p, square_lo))
}

/// `-x²/2 = hi + square_lo` exactly, `z = |x|` and `P(z)`: `E = hi + square_lo + z P(z)`.
#[inline(always)]
fn gelu_central_terms<const F: bool>(x: f32) -> (f32, f32, f32, f32) {
    let z = x.abs();
    let c = GELU_TAIL_POLY;
    // -x/2 is exact (bar subnormal x, whose square does not matter here), so the product is
    // -x²/2 rounded, and its rounding error is exactly representable.
    let (hi, square_lo) = two_prod::<F>(x, -0.5 * x);
    // Estrin's first level wants z² = -2 hi: the leading pair scaled by -2 (exact). The
    // three lowest terms by Horner's rule: they carry most of the value, and the rounding
    // of `P` is multiplied by `z` (Estrin's scheme throughout measured 7.0 ulp where this
    // order gave 5.3, in the form before session 38).
    let a = fma::<F>(-2.0 * c[0], z, -2.0 * c[1]);
    let b = fma::<F>(c[2], z, c[3]);
    let high = fma::<F>(fma::<F>(fma::<F>(a, hi, b), z, c[4]), z, c[5]);
    let p = fma::<F>(fma::<F>(fma::<F>(high, z, c[6]), z, c[7]), z, c[8]);
    (hi, square_lo, z, p)
}

/// Stage 1 of the central GELU's derivative: `E` as in [`gelu_central_exponent`], and
/// `-x²/2`, both as `(hi, lo)` with the same `hi`: `(hi, E's lo, -x²/2's lo)`.
#[inline(always)]
pub(crate) fn gelu_grad_central_exponents<const F: bool>(x: f32) -> (f32, f32, f32) {
    let (hi, square_lo, z, p) = gelu_central_terms::<F>(x);
    (hi, fma::<F>(z, p, square_lo), square_lo)
}

/// Central GELU, stage 2: `e^(hi + lo) / 2 = e^r 2^(n-1)` with `|r| <= ln2/2` (plus
/// rounding), returned as `r` and `(n - 1) << 23`, the bits to add to `e^r`'s.
#[inline(always)]
pub(crate) fn gelu_central_reduce<const F: bool>(hi: f32, lo: f32) -> (f32, u32) {
    // Rounding against ROUND_MAGIC - 1 gives the same n (the sum's ulp is still 1), and
    // t's bits are then ROUND_MAGIC's plus n - 1: with ROUND_MAGIC's low nine bits zero,
    // `t << 23` is `(n - 1) << 23`, the halving included.
    const MAGIC_LESS_ONE: f32 = ROUND_MAGIC - 1.0;
    let t = fma::<F>(hi + lo, LOG2E, MAGIC_LESS_ONE);
    let n = t - MAGIC_LESS_ONE;
    // hi - n*LN2_HI is exact (see `exp_reduce`); lo's part is computed beside it.
    let r = fma::<F>(-n, LN2_HI, hi) + fma::<F>(-n, LN2_LO, lo);
    (r, t.to_bits() << 23)
}

/// `Q` as in [`EXP_Q`] one degree lower (relative error 1.1e-7 on `|r| <= ln2/2`, with
/// these f32 coefficients), for the central GELU, whose fit of `P` costs more than this.
const EXP_Q_GELU: [f32; 4] = [8.312_248e-3, 4.189_267_4e-2, 0.166_671_25, 0.499_992_13];

/// `e^r 2^k` for `|r| <= ln2/2` (plus rounding), `exponent` being `k << 23` (wrapping): `k`
/// is added to the exponent bits of `e^r`, so the result must be a normal float (`e^r` is
/// in about [0.7, 1.5]). The GELU's stage 2 gives `k = n - 1` for `e^(hi + lo) / 2`.
#[inline(always)]
pub(crate) fn exp_reduced_scaled<const F: bool>(r: f32, exponent: u32) -> f32 {
    f32::from_bits(exp_small::<F>(r).to_bits().wrapping_add(exponent))
}

/// Central GELU, stage 3: `x Φ(x)` from `x` and stage 2's `r` and exponent bits.
#[inline(always)]
pub(crate) fn gelu_central_finish<const F: bool>(x: f32, r: f32, exponent: u32) -> f32 {
    let c = EXP_Q_GELU;
    let r2 = r * r;
    let poly = fma::<F>(fma::<F>(c[0], r, c[1]), r2, fma::<F>(c[2], r, c[3]));
    let q = f32::from_bits(
        (fma::<F>(poly, r2, r) + 1.0)
            .to_bits()
            .wrapping_add(exponent),
    );
    // x Φ(x) = max(0, x) - |x| q: x (1 - q) above zero, x q below. `0 > x` picks x at
    // both zeros, so -0 stays -0 (and the compare is x86's max, one instruction).
    let floor = if 0.0 > x { 0.0 } else { x };
    fma::<F>(-x.abs(), q, floor)
}

/// Stage 3 of the central GELU's derivative `Φ(x) + x φ(x)`, from `q = Φ(-|x|)` and
/// `half_gauss = e^(-x²/2) / 2` (each [`exp_reduced_scaled`] of its stage-2 reduction).
#[inline(always)]
pub(crate) fn gelu_grad_central_finish<const F: bool>(x: f32, q: f32, half_gauss: f32) -> f32 {
    let cdf = if x > 0.0 { 1.0 - q } else { q };
    // x φ(x) = x * half_gauss * 2 / sqrt(2 pi).
    fma::<F>(x * half_gauss, 0.797_884_6, cdf)
}

/// The central GELU's three stages on one element (the three-pass kernel runs them as
/// passes; with AVX-512 the kernel runs this).
#[inline(always)]
pub(crate) fn gelu_erf_central<const F: bool>(x: f32) -> f32 {
    let (hi, lo) = gelu_central_exponent::<F>(x);
    let (r, exponent) = gelu_central_reduce::<F>(hi, lo);
    gelu_central_finish::<F>(x, r, exponent)
}

/// The central GELU derivative's three stages on one element.
#[inline(always)]
pub(crate) fn gelu_erf_grad_central<const F: bool>(x: f32) -> f32 {
    let (hi, lo, square_lo) = gelu_grad_central_exponents::<F>(x);
    let (r, exponent) = gelu_central_reduce::<F>(hi, lo);
    let (r2, exponent2) = gelu_central_reduce::<F>(hi, square_lo);
    let q = exp_reduced_scaled::<F>(r, exponent);
    gelu_grad_central_finish::<F>(x, q, exp_reduced_scaled::<F>(r2, exponent2))
}

/// d/dx of [`gelu_erf`]: `Φ(x) + x φ(x)` (its limits, 0 and 1, at ∓inf).
#[inline(always)]
pub(crate) fn gelu_erf_grad<const F: bool>(x: f32) -> f32 {
    let half_erfc = 0.5 * erfc_of_scaled::<F>(x, Scale::InvSqrt2, 0);
    let cdf = if x < 0.0 { half_erfc } else { 1.0 - half_erfc };
    let (hi, lo) = two_square::<F>(x);
    let pdf = exp_parts::<F>(-0.5 * hi, -0.5 * lo) * 0.398_942_3; // 1/sqrt(2 pi)
    if x.abs() == f32::INFINITY {
        cdf
    } else {
        fma::<F>(x, pdf, cdf)
    }
}

const GELU_K: f32 = 0.797_884_6; // sqrt(2/pi)
const GELU_C: f32 = 0.044_715;

/// `2u = 2 sqrt(2/pi) (x + 0.044715 x^3)` as `hi + lo`: the exponent GELU's tanh form
/// needs to better than f32 precision, since its error is multiplied by |2u| (up to ~100).
#[inline(always)]
fn gelu_tanh_arg<const F: bool>(x: f32) -> (f32, f32) {
    // 2 sqrt(2/pi) and 2 sqrt(2/pi) * 0.044715, each as two floats.
    const A: (f32, f32) = (1.595_769_2, -4.534_068e-8);
    const B: (f32, f32) = (0.071_354_814, 2.398_832_5e-9);
    let (ph, pl) = two_square::<F>(x);
    let (wh, wl) = two_prod::<F>(B.0, ph);
    let wl = wl + fma::<F>(B.0, pl, B.1 * ph);
    let (vh, vl) = two_sum(A.0, wh);
    let vl = vl + A.1 + wl;
    let (uh, ul) = two_prod::<F>(x, vh);
    (uh, fma::<F>(x, vl, ul))
}

/// The tanh form of GELU, `0.5 x (1 + tanh(u))` computed as `x / (1 + e^(-2u))`,
/// `u = sqrt(2/pi) (x + 0.044715 x^3)`. Worst error 3.6 / 3.6 ulp, tails included (with
/// AVX-512, `avx512::gelu`'s table takes `|x| < 4` at 2.23 ulp); `gelu_tanh(-inf)` is NaN, as
/// in PyTorch.
#[inline(always)]
pub(crate) fn gelu_tanh<const F: bool>(x: f32) -> f32 {
    let (h, l) = gelu_tanh_arg::<F>(x);
    let neg = h < 0.0;
    let (h, l) = if neg { (h, l) } else { (-h, -l) };
    x_times_logistic::<F>(x, h, l, neg)
}

/// d/dx of [`gelu_tanh`]: with `s = sigmoid(2u)`, `s + 2 x s (1 - s) u'` (its limits, 0 and
/// 1, at ∓inf).
#[inline(always)]
pub(crate) fn gelu_tanh_grad<const F: bool>(x: f32) -> f32 {
    let u2 = 2.0 * GELU_K * fma::<F>(GELU_C * x, x * x, x);
    let e = exp::<F>(clamp_keep_nan(-u2, f32::MIN, 88.0));
    let s = 1.0 / (1.0 + e);
    let one_minus_s = e * s;
    let du = GELU_K * fma::<F>(3.0 * GELU_C * x, x, 1.0);
    let g = fma::<F>(2.0 * x * s * one_minus_s, du, s);
    // Saturated: from 8 up the derivative rounds to 1, from -11 down to 0 (there the product
    // would take `0 * inf` once `du` overflows, near 5e19).
    if x >= 8.0 {
        1.0
    } else if x <= -11.0 {
        0.0
    } else {
        g
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Error of `y` against `r` in ulps of the f32 nearest `r` (of either sign).
    fn ulps(y: f32, r: f64) -> f64 {
        let rf = (r as f32).abs();
        let ulp = (f32::from_bits(rf.to_bits() + 1) - rf) as f64;
        ((y as f64) - r).abs() / ulp
    }

    #[test]
    fn exp_nonpositive_is_within_one_ulp_and_flushes_only_below_the_normal_range() {
        let mut worst = 0f64;
        // Every 61st bit pattern of the non-positive floats, from -0 to -inf.
        for bits in (0x8000_0000u32..=0xff80_0000)
            .step_by(61)
            .chain([0xff80_0000])
        {
            let x = f32::from_bits(bits);
            let (fma, plain) = (exp_nonpositive::<true>(x), exp_nonpositive::<false>(x));
            let r = (x as f64).exp();
            if x < -87.33 {
                assert_eq!((fma, plain), (0.0, 0.0), "x = {x:e}");
                continue;
            }
            worst = worst.max(ulps(fma, r)).max(ulps(plain, r));
        }
        assert!(worst <= 1.0, "worst error {worst} ulp");
        assert_eq!(exp_nonpositive::<true>(0.0), 1.0);
        assert_eq!(exp_nonpositive::<true>(-0.0), 1.0);
    }

    #[test]
    fn exp_normal_gives_the_values_of_exp_on_its_range() {
        // Every 13th float of [EXP_NORMAL_LO, EXP_NORMAL_HI], both ends included.
        let negative = (0..=EXP_NORMAL_LO.abs().to_bits())
            .step_by(13)
            .map(|b| -f32::from_bits(b));
        let positive = (0..=EXP_NORMAL_HI.to_bits())
            .step_by(13)
            .map(f32::from_bits);
        for x in negative
            .chain(positive)
            .chain([EXP_NORMAL_LO, EXP_NORMAL_HI])
        {
            for (fast, general) in [
                (exp_normal::<true>(x), exp::<true>(x)),
                (exp_normal::<false>(x), exp::<false>(x)),
            ] {
                assert_eq!(fast.to_bits(), general.to_bits(), "x = {x:e}");
                assert!(fast.is_normal(), "x = {x:e}: {fast:e}");
            }
        }
    }

    #[test]
    fn gelu_central_form_stays_within_its_bound() {
        let mut worst = (0f64, 0f32);
        let mut by_form = [0f64; 2];
        // Every 7th float of (-GELU_CENTRAL, GELU_CENTRAL), both signs.
        for bits in (0u32..GELU_CENTRAL.to_bits()).step_by(7) {
            for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
                let r = x as f64 * 0.5 * libm::erfc(-(x as f64) / std::f64::consts::SQRT_2);
                for (k, y) in [gelu_erf_central::<true>(x), gelu_erf_central::<false>(x)]
                    .into_iter()
                    .enumerate()
                {
                    let e = if r == 0.0 {
                        (y as f64).abs()
                    } else {
                        ulps(y, r)
                    };
                    if e > worst.0 {
                        worst = (e, x);
                    }
                    by_form[k] = by_form[k].max(e);
                }
            }
        }
        eprintln!(
            "central GELU: worst {:.2} ulp with FMA, {:.2} without",
            by_form[0], by_form[1]
        );
        assert!(
            worst.0 <= 6.4,
            "worst {:.2} ulp at x = {:e}",
            worst.0,
            worst.1
        );
        assert!(gelu_erf_central::<true>(-0.0).is_sign_negative());
    }

    #[test]
    fn gelu_grad_central_form_is_as_accurate_as_the_general_form() {
        // Absolute error: the derivative crosses zero at x = -0.75, so relative error means
        // little there. Every 61st float of (-GELU_CENTRAL, GELU_CENTRAL), both signs.
        let (mut central, mut general) = (0f64, 0f64);
        for bits in (0u32..GELU_CENTRAL.to_bits()).step_by(61) {
            for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
                let xd = x as f64;
                let r = 0.5 * libm::erfc(-xd / std::f64::consts::SQRT_2)
                    + xd * (-xd * xd / 2.0).exp() / (2.0 * std::f64::consts::PI).sqrt();
                let err = |y: f32| (y as f64 - r).abs();
                central = central
                    .max(err(gelu_erf_grad_central::<true>(x)))
                    .max(err(gelu_erf_grad_central::<false>(x)));
                general = general
                    .max(err(gelu_erf_grad::<true>(x)))
                    .max(err(gelu_erf_grad::<false>(x)));
            }
        }
        eprintln!("gelu'(x), |x| < 3.5: central form {central:e}, general form {general:e}");
        assert!(
            central <= general && central <= 1.5e-7,
            "central form: {central:e}, general form: {general:e}"
        );
    }
}
