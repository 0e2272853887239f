//! Fits `q(z) = Φ(-z)` (the erf GELU) or `q(z) = σ(-2u(z))`, `u(z) = √(2/π) (z + 0.044715 z³)`
//! (the tanh GELU, `x σ(2u(x))`) on `[0, LIMIT)` by one polynomial per interval, in f64 and
//! minimising the *relative* error (Lawson's iteration on weighted least squares), rounds the
//! coefficients to f32 one at a time from the highest (refitting the lower ones after each),
//! then evaluates the GELU `x Φ(x) = max(0, x) - |x| q(|x|)` exactly as the AVX-512 kernel does
//! (f32 multiply-adds in the same order) on every float of `(-LIMIT, LIMIT)` against the f64
//! reference `x erfc(-x/√2) / 2`. For the derivatives (`erf-grad`, `tanh-grad`) the table holds
//! `r(z) = z density(z) - q(z)`, and the derivative is `1 + r(|x|)` at `x >= 0`, `-r(|x|)` below;
//! their error is in ulp of the larger of the value and `q` (where the derivative crosses zero,
//! near -0.75, the size of the terms it sums).
//!
//! The kernel's interval of `z` is `i = round(z / h)` (interval `i` is centred on `i h`), and
//! its variable `u = z (1/h) - i` lies in [-1/2, 1/2] (in [0, 1/2] for `i = 0`).

/// What is tabulated: the erf or tanh GELU's `q`, or `r` for their derivatives.
#[derive(Clone, Copy, PartialEq)]
enum Form {
    Erf,
    Tanh,
    ErfGrad,
    TanhGrad,
}

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;

impl Form {
    fn is_grad(self) -> bool {
        matches!(self, Form::ErfGrad | Form::TanhGrad)
    }

    /// The forward form's `q(z)`, `1 - q(-z)` for negative `z`.
    fn q(self, z: f64) -> f64 {
        match self {
            Form::Erf | Form::ErfGrad => 0.5 * libm::erfc(z / std::f64::consts::SQRT_2),
            Form::Tanh | Form::TanhGrad => 1.0 / (1.0 + (2.0 * tanh_u(z)).exp()),
        }
    }

    /// `z` times the derivative of `1 - q` at `z`: `z φ(z)`, or `z 2u'(z) q (1 - q)`.
    fn z_density(self, z: f64) -> f64 {
        match self {
            Form::Erf | Form::ErfGrad => {
                z * (-0.5 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt()
            }
            Form::Tanh | Form::TanhGrad => {
                let q = self.q(z);
                z * 2.0 * SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * z * z) * q * (1.0 - q)
            }
        }
    }

    /// What the table holds at `z >= 0`: `q`, or for a derivative `r = z density - q`
    /// (the derivative is `1 + r(|x|)` at `x >= 0` and `-r(|x|)` below).
    fn tabulated(self, z: f64) -> f64 {
        if self.is_grad() {
            self.z_density(z) - self.q(z)
        } else {
            self.q(z)
        }
    }

    /// The size the fit's error is measured against: the value, or for a derivative the
    /// larger of `|r|` and `q` (near the root of `r`, the terms the derivative sums).
    fn scale(self, z: f64) -> f64 {
        if self.is_grad() {
            self.tabulated(z).abs().max(self.q(z))
        } else {
            self.q(z)
        }
    }

    /// The f64 function at `x`.
    fn reference(self, x: f64) -> f64 {
        // x Φ(x) = x q(-x), x σ(2u(x)) = x q(-x); the derivatives are q(-x) + x density(x).
        if self.is_grad() {
            self.q(-x) + self.z_density(x)
        } else {
            x * self.q(-x)
        }
    }
}

/// `u(z) = √(2/π) (z + 0.044715 z³)` of the tanh GELU.
fn tanh_u(z: f64) -> f64 {
    SQRT_2_OVER_PI * (z + 0.044715 * z * z * z)
}

/// Weighted least squares `sum (w (p(u) - y))^2` by the normal equations (small degree).
fn least_squares(us: &[f64], ys: &[f64], ws: &[f64], degree: usize) -> Vec<f64> {
    let m = degree + 1;
    let mut a = vec![vec![0.0f64; m + 1]; m];
    for ((&u, &y), &w) in us.iter().zip(ys).zip(ws) {
        let powers: Vec<f64> = (0..m).map(|k| u.powi(k as i32)).collect();
        for r in 0..m {
            for c in 0..m {
                a[r][c] += w * w * powers[r] * powers[c];
            }
            a[r][m] += w * w * powers[r] * y;
        }
    }
    for col in 0..m {
        let pivot = (col..m)
            .max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))
            .unwrap();
        a.swap(col, pivot);
        for r in 0..m {
            if r != col {
                let f = a[r][col] / a[col][col];
                for c in col..=m {
                    a[r][c] -= f * a[col][c];
                }
            }
        }
    }
    (0..m).map(|r| a[r][m] / a[r][r]).collect()
}

fn horner(c: &[f64], u: f64) -> f64 {
    c.iter().rev().fold(0.0, |acc, &ck| acc * u + ck)
}

/// Coefficients (lowest power first) of interval `i`'s polynomial in `u` on `[lo, hi]`.
fn fit_interval(form: Form, i: usize, inv_h: f32, degree: usize, lo: f64, hi: f64) -> Vec<f32> {
    const POINTS: usize = 400;
    let us: Vec<f64> = (0..POINTS)
        .map(|k| {
            let t = (std::f64::consts::PI * (k as f64 + 0.5) / POINTS as f64).cos();
            lo + (hi - lo) * (t + 1.0) / 2.0
        })
        .collect();
    let zs: Vec<f64> = us.iter().map(|&u| (u + i as f64) / inv_h as f64).collect();
    let ys: Vec<f64> = zs.iter().map(|&z| form.tabulated(z)).collect();
    let relative: Vec<f64> = zs.iter().map(|&z| 1.0 / form.scale(z)).collect();
    // Lawson: weights grow where the relative error is large, toward the minimax fit.
    let mut ws = relative.clone();
    for _ in 0..30 {
        let c = least_squares(&us, &ys, &ws, degree);
        let errs: Vec<f64> = us
            .iter()
            .zip(&ys)
            .zip(&relative)
            .map(|((&u, &y), &w)| ((horner(&c, u) - y) * w).abs())
            .collect();
        let mean: f64 = errs.iter().zip(&ws).map(|(e, w)| e * w).sum::<f64>() / POINTS as f64;
        for (w, e) in ws.iter_mut().zip(&errs) {
            *w *= (e / mean).max(1e-3).sqrt();
        }
    }
    // Round from the highest power, refitting the lower powers against what is fixed.
    let mut out = vec![0f32; degree + 1];
    for k in (0..=degree).rev() {
        let rest: Vec<f64> = us
            .iter()
            .zip(&ys)
            .map(|(&u, &y)| y - (k + 1..=degree).map(|j| out[j] as f64 * u.powi(j as i32)).sum::<f64>())
            .collect();
        out[k] = least_squares(&us, &rest, &relative, k)[k] as f32;
    }
    out
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, default: &str| args.get(i).map_or(default.to_string(), |s| s.clone());
    let entries: usize = arg(1, "16").parse().expect("ENTRIES");
    let limit: f32 = arg(2, "4.5").parse().expect("LIMIT");
    let degree: usize = arg(3, "6").parse().expect("DEGREE");
    let step: u32 = arg(4, "1").parse().expect("STEP");
    let form = match arg(5, "erf").as_str() {
        "erf" => Form::Erf,
        "tanh" => Form::Tanh,
        "erf-grad" => Form::ErfGrad,
        "tanh-grad" => Form::TanhGrad,
        other => panic!("FORM is erf, tanh, erf-grad or tanh-grad, not {other}"),
    };
    assert!(entries.is_power_of_two(), "ENTRIES must be a power of two (the index is its low bits)");
    // round(z / h) <= entries - 1 for z < limit.
    let inv_h = (entries as f32 - 0.5) / limit;
    // A little past each interval's edges: the index of a tie may round either way.
    let tables: Vec<Vec<f32>> = (0..entries)
        .map(|i| fit_interval(form, i, inv_h, degree, if i == 0 { 0.0 } else { -0.502 }, 0.502))
        .collect();
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23, as math::ROUND_MAGIC
    let gelu = |x: f32| -> f32 {
        let z = x.abs();
        let s = z.mul_add(inv_h, MAGIC);
        let n = s - MAGIC;
        let c = &tables[(s.to_bits() as usize) & (entries - 1)];
        let u = z.mul_add(inv_h, -n);
        let p = c[..degree].iter().rev().fold(c[degree], |acc, &ck| acc.mul_add(u, ck));
        if form.is_grad() {
            // 1 + r at x >= 0, -r below (-0 counts as below: both give 1/2 there).
            if x.is_sign_negative() {
                -p
            } else {
                1.0 + p
            }
        } else {
            let floor = if 0.0 > x { 0.0 } else { x };
            (-z).mul_add(p, floor)
        }
    };
    let (mut worst, mut worst_at) = (0.0f64, 0.0f32);
    let mut bits = 0u32;
    while f32::from_bits(bits) < limit {
        for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
            let reference = form.reference(x as f64);
            let y = gelu(x) as f64;
            // For a derivative, the ulp of the terms it sums where it passes through zero.
            let size = if form.is_grad() {
                reference.abs().max(form.q(x.abs() as f64))
            } else {
                reference.abs()
            };
            let rounded = size as f32;
            let ulp = (f32::from_bits(rounded.to_bits() + 1) - rounded) as f64;
            let err = if y == reference { 0.0 } else { (y - reference).abs() / ulp };
            if err > worst {
                (worst, worst_at) = (err, x);
            }
        }
        bits += step;
    }
    println!("{entries} intervals on [0, {limit}), degree {degree}: worst {worst:.2} ulp (at {worst_at:e}), every {step} float(s)");
    println!("const INV_H: f32 = {inv_h:?};");
    println!("const TABLE: [[f32; {entries}]; {}] = [", degree + 1);
    for k in (0..=degree).rev() {
        let row: Vec<String> = tables.iter().map(|t| format!("{:e}", t[k])).collect();
        println!("    [{}],", row.join(", "));
    }
    println!("];");
}
