use std::mem::MaybeUninit;
use std::time::Instant;

#[inline(always)]
fn fma(a: f32, b: f32, c: f32) -> f32 {
    a.mul_add(b, c)
}
#[inline(always)]
fn horner<const N: usize>(x: f32, c: [f32; N]) -> f32 {
    let mut acc = c[0];
    for &k in &c[1..] {
        acc = fma(acc, x, k);
    }
    acc
}
#[inline(always)]
fn estrin6(x: f32, c: [f32; 6]) -> f32 {
    let x2 = x * x;
    let a = fma(c[0], x, c[1]);
    let b = fma(c[2], x, c[3]);
    fma(fma(fma(a, x2, b), x, c[4]), x, c[5])
}
#[inline(always)]
fn two_square(x: f32) -> (f32, f32) {
    let hi = x * x;
    (hi, x.mul_add(x, -hi))
}
const ROUND_MAGIC: f32 = 12_582_912.0;
const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
const EXP_Q: [f32; 5] = [1.3814613e-3, 8.36871e-3, 4.166839e-2, 1.6666521e-1, 4.9999994e-1];
#[inline(always)]
fn exp_small(r: f32) -> f32 {
    let c = EXP_Q;
    let r2 = r * r;
    let q = fma(fma(fma(c[0], r, c[1]), r, c[2]), r2, fma(c[3], r, c[4]));
    fma(q, r2, r) + 1.0
}
const GELU_TAIL_POLY: [f32; 9] = [
    2.7695916e-7, -5.4205793e-6, 4.4432858e-5, -1.7230524e-4, -3.5992078e-5, 4.853918e-3, -3.6373872e-2,
    1.8169993e-1, -7.978854e-1,
];
const GELU_CENTRAL: f32 = 3.5;

// ---------------- baseline -----------------
#[inline(always)]
fn base_s1(x: f32) -> (f32, f32) {
    let z = x.abs();
    let c = GELU_TAIL_POLY;
    let high = estrin6(z, [c[0], c[1], c[2], c[3], c[4], c[5]]);
    let p = fma(fma(fma(high, z, c[6]), z, c[7]), z, c[8]);
    let (hi, lo) = two_square(x);
    (-0.5 * hi, -0.5 * lo + z * p)
}
#[inline(always)]
fn base_s2(hi: f32, lo: f32) -> (f32, u32) {
    let t = fma(hi + lo, LOG2E, ROUND_MAGIC);
    let n = t - ROUND_MAGIC;
    let r = fma(-n, LN2_HI, hi) + fma(-n, LN2_LO, lo);
    (r, (t.to_bits() << 23).wrapping_sub(1 << 23))
}
#[inline(always)]
fn base_s3(x: f32, r: f32, e: u32) -> f32 {
    let q = f32::from_bits(exp_small(r).to_bits().wrapping_add(e));
    if x > 0.0 {
        fma(-x, q, x)
    } else {
        x * q
    }
}

// ---------------- variant 1: fewer multiplies -----------------
#[inline(always)]
fn v1_s1(x: f32) -> (f32, f32) {
    let z = x.abs();
    let c = GELU_TAIL_POLY;
    let high = estrin6(z, [c[0], c[1], c[2], c[3], c[4], c[5]]);
    let p = fma(fma(fma(high, z, c[6]), z, c[7]), z, c[8]);
    // -x²/2 = hi + lo exactly: -0.5 x is exact in the central range (bar subnormal x, whose
    // square is negligible).
    let m = -0.5 * x;
    let hi = x * m;
    let lo = fma(x, m, -hi);
    (hi, fma(z, p, lo))
}
#[inline(always)]
fn v1_s3(x: f32, r: f32, e: u32) -> f32 {
    let q = f32::from_bits(exp_small(r).to_bits().wrapping_add(e));
    // x (1 - q) above zero, x q below: x * (∓q) + (x or -0).
    let qs = q.copysign(-x);
    let c = if x >= 0.0 { x } else { -0.0 };
    fma(x, qs, c)
}

const CB: usize = 128;
struct Scratch {
    his: [f32; CB],
    los: [f32; CB],
    es: [u32; CB],
}

macro_rules! block_fn {
    ($name:ident, $s1:ident, $s2:ident, $s3:ident) => {
        block_fn!($name, $s1, $s2, $s3, "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c");
    };
    ($name:ident, $s1:ident, $s2:ident, $s3:ident, $feat:literal) => {
        #[target_feature(enable = $feat)]
        unsafe fn $name(src: &[f32], dst: &mut [MaybeUninit<f32>]) {
            let mut c = Scratch { his: [0.0; CB], los: [0.0; CB], es: [0; CB] };
            for (s, d) in src.chunks_exact(CB).zip(dst.chunks_exact_mut(CB)) {
                let s: &[f32; CB] = s.try_into().unwrap();
                let d: &mut [MaybeUninit<f32>; CB] = d.try_into().unwrap();
                let mut central = true;
                for ((&x, hi), lo) in s.iter().zip(c.his.iter_mut()).zip(c.los.iter_mut()) {
                    central &= x.abs() < GELU_CENTRAL;
                    (*hi, *lo) = $s1(x);
                }
                for ((hi, &lo), e) in c.his.iter_mut().zip(c.los.iter()).zip(c.es.iter_mut()) {
                    (*hi, *e) = $s2(*hi, lo);
                }
                for (((d, &x), &r), &e) in d.iter_mut().zip(s).zip(c.his.iter()).zip(c.es.iter()) {
                    d.write($s3(x, r, e));
                }
                if !central {
                    for (d, &x) in d.iter_mut().zip(s) {
                        if !(x.abs() < GELU_CENTRAL) {
                            d.write(scalar_general(x));
                        }
                    }
                }
            }
        }
    };
}
block_fn!(gelu_base, base_s1, base_s2, base_s3);
block_fn!(gelu_v1, v1_s1, base_s2, v1_s3);


#[inline(always)]
fn a_s2(hi: f32, lo: f32) -> (f32, u32) { (hi + lo, 0) }
#[inline(always)]
fn a_s3(_x: f32, r: f32, _e: u32) -> f32 { r }
#[inline(always)]
fn b_s3(_x: f32, r: f32, e: u32) -> f32 { r + f32::from_bits(e) }
block_fn!(gelu_a, base_s1, a_s2, a_s3);
block_fn!(gelu_b, base_s1, base_s2, b_s3);


#[inline(always)]
fn d_s1(x: f32) -> (f32, f32) { (x.abs(), x) }
#[inline(always)]
fn c_s1(x: f32) -> (f32, f32) {
    let z = x.abs();
    let c = GELU_TAIL_POLY;
    let high = estrin6(z, [c[0], c[1], c[2], c[3], c[4], c[5]]);
    let p = fma(fma(fma(high, z, c[6]), z, c[7]), z, c[8]);
    (p, z)
}
block_fn!(gelu_c, c_s1, a_s2, a_s3);
block_fn!(gelu_d, d_s1, a_s2, a_s3);


#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn map_c(src: &[f32], dst: &mut [MaybeUninit<f32>]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        let (p, z) = c_s1(x);
        d.write(p + z);
    }
}
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn map_base(src: &[f32], dst: &mut [MaybeUninit<f32>]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        let (hi, lo) = base_s1(x);
        let (r, e) = base_s2(hi, lo);
        d.write(base_s3(x, r, e));
    }
}


#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn map_s1(src: &[f32], dst: &mut [MaybeUninit<f32>]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        let (hi, lo) = base_s1(x);
        d.write(hi + lo);
    }
}
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn map_s12(src: &[f32], dst: &mut [MaybeUninit<f32>]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        let (hi, lo) = base_s1(x);
        let (r, e) = base_s2(hi, lo);
        d.write(r + f32::from_bits(e));
    }
}
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn map_v1(src: &[f32], dst: &mut [MaybeUninit<f32>]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        let (hi, lo) = v1_s1(x);
        let (r, e) = base_s2(hi, lo);
        d.write(v1_s3(x, r, e));
    }
}


#[inline(always)]
fn v2_s2(hi: f32, lo: f32) -> (f32, u32) {
    // n = round(hi log2 e) (lo only moves r a little past ln2/2); t - (MAGIC - 1) = n and
    // t's bits << 23 = (n - 1) << 23: the halving of e^E comes free.
    const M1: f32 = ROUND_MAGIC - 1.0;
    let t = fma(hi + lo, LOG2E, M1);
    let n = t - M1;
    let r = fma(-n, LN2_HI, hi) + fma(-n, LN2_LO, lo);
    (r, t.to_bits() << 23)
}
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn map_v2(src: &[f32], dst: &mut [MaybeUninit<f32>]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        let (hi, lo) = v1_s1(x);
        let (r, e) = v2_s2(hi, lo);
        d.write(v1_s3(x, r, e));
    }
}
block_fn!(gelu_v2, v1_s1, v2_s2, v1_s3);


#[inline(always)]
fn v3_s1(x: f32) -> (f32, f32) {
    let z = x.abs();
    let c = GELU_TAIL_POLY;
    let m = -0.5 * x;
    let hi = x * m; // -z²/2, rounded as -(z²)/2 is
    let lo = fma(x, m, -hi);
    // Estrin's first level with x² = -2 hi: the leading pair scaled by -2 (exact).
    let a = fma(-2.0 * c[0], z, -2.0 * c[1]);
    let b = fma(c[2], z, c[3]);
    let high = fma(fma(fma(a, hi, b), z, c[4]), z, c[5]);
    let p = fma(fma(fma(high, z, c[6]), z, c[7]), z, c[8]);
    (hi, fma(z, p, lo))
}
const EXP_Q3: [f32; 4] = [0.008312247693538666, 0.04189267382025719, 0.1666712462902069, 0.49999213218688965];
#[inline(always)]
fn exp_small3(r: f32) -> f32 {
    let c = EXP_Q3;
    let r2 = r * r;
    let q = fma(fma(c[0], r, c[1]), r2, fma(c[2], r, c[3]));
    fma(q, r2, r) + 1.0
}
#[inline(always)]
fn v3_s3(x: f32, r: f32, e: u32) -> f32 {
    let q = f32::from_bits(exp_small3(r).to_bits().wrapping_add(e));
    let qs = q.copysign(-x);
    let c = if x >= 0.0 { x } else { -0.0 };
    fma(x, qs, c)
}
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn map_v3(src: &[f32], dst: &mut [MaybeUninit<f32>]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        let (hi, lo) = v3_s1(x);
        let (r, e) = v2_s2(hi, lo);
        d.write(v3_s3(x, r, e));
    }
}
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn map_v3b(src: &[f32], dst: &mut [MaybeUninit<f32>]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        let (hi, lo) = v3_s1(x);
        let (r, e) = v2_s2(hi, lo);
        d.write(v1_s3(x, r, e));
    }
}
block_fn!(gelu_v3, v3_s1, v2_s2, v3_s3);


#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn map_v3_avx2(src: &[f32], dst: &mut [MaybeUninit<f32>]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        let (hi, lo) = v3_s1(x);
        let (r, e) = v2_s2(hi, lo);
        d.write(v3_s3(x, r, e));
    }
}
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn map_v3_u2(src: &[f32], dst: &mut [MaybeUninit<f32>]) {
    // two interleaved halves
    let h = src.len() / 2;
    let (s0, s1) = src.split_at(h);
    let (d0, d1) = dst.split_at_mut(h);
    for (((a, b), &x), &y) in d0.iter_mut().zip(d1.iter_mut()).zip(s0).zip(s1) {
        let (hi, lo) = v3_s1(x);
        let (r, e) = v2_s2(hi, lo);
        a.write(v3_s3(x, r, e));
        let (hi, lo) = v3_s1(y);
        let (r, e) = v2_s2(hi, lo);
        b.write(v3_s3(y, r, e));
    }
}


#[inline(always)]
fn v4_s3(x: f32, r: f32, e: u32) -> f32 {
    let q = f32::from_bits(exp_small3(r).to_bits().wrapping_add(e));
    // c - |x| q with c = max(0, x) (x86's operand order: -0 stays -0): x - x q above zero,
    // x q below, ±0 kept.
    let c = if 0.0 > x { 0.0 } else { x };
    fma(-x.abs(), q, c)
}
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn map_v4(src: &[f32], dst: &mut [MaybeUninit<f32>]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        let (hi, lo) = v3_s1(x);
        let (r, e) = v2_s2(hi, lo);
        d.write(v4_s3(x, r, e));
    }
}
block_fn!(gelu_v4, v3_s1, v2_s2, v4_s3);


macro_rules! map_v4c_fn {
    ($name:ident, $feat:literal) => {
#[target_feature(enable = $feat)]
unsafe fn $name(src: &[f32], dst: &mut [MaybeUninit<f32>]) {
    for (s, d) in src.chunks_exact(CB).zip(dst.chunks_exact_mut(CB)) {
        let mut central = true;
        for (d, &x) in d.iter_mut().zip(s) {
            central &= x.abs() < GELU_CENTRAL;
            let (hi, lo) = v3_s1(x);
            let (r, e) = v2_s2(hi, lo);
            d.write(v4_s3(x, r, e));
        }
        if !central {
            for (d, &x) in d.iter_mut().zip(s) {
                if !(x.abs() < GELU_CENTRAL) {
                    d.write(scalar_general(x));
                }
            }
        }
    }
}
    };
}
map_v4c_fn!(map_v4c, "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c");
map_v4c_fn!(map_v4c_avx2, "avx2,fma,f16c");
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn map_v4m(src: &[f32], dst: &mut [MaybeUninit<f32>]) {
    // central as a max of |x| (one vmaxps a vector)
    for (s, d) in src.chunks_exact(CB).zip(dst.chunks_exact_mut(CB)) {
        let mut big = 0.0f32;
        for (d, &x) in d.iter_mut().zip(s) {
            big = if x.abs() > big { x.abs() } else { big };
            let (hi, lo) = v3_s1(x);
            let (r, e) = v2_s2(hi, lo);
            d.write(v4_s3(x, r, e));
        }
        if !(big < GELU_CENTRAL) || s.iter().any(|x| x.is_nan()) {
            for (d, &x) in d.iter_mut().zip(s) {
                if !(x.abs() < GELU_CENTRAL) {
                    d.write(scalar_general(x));
                }
            }
        }
    }
}


block_fn!(gelu_base_avx2, base_s1, base_s2, base_s3, "avx2,fma,f16c");
block_fn!(gelu_v4_avx2, v3_s1, v2_s2, v4_s3, "avx2,fma,f16c");

fn reference(x: f64) -> f64 {
    x * 0.5 * libm::erfc(-x / std::f64::consts::SQRT_2)
}

fn ulp_err(got: f32, want: f64) -> f64 {
    let w = want as f32;
    if got == w {
        return 0.0;
    }
    let ulp = if w == 0.0 { f32::from_bits(1) as f64 } else {
        let b = w.abs().to_bits();
        (f32::from_bits(b + 1) - f32::from_bits(b)) as f64
    };
    (got as f64 - want).abs() / ulp
}

type K = unsafe fn(&[f32], &mut [MaybeUninit<f32>]);

fn accuracy(name: &str, k: K) {
    // Every 3rd float with |x| < 3.5.
    let mut xs = vec![];
    let mut b: u32 = 0;
    while b < 0x4060_0000 {
        xs.push(f32::from_bits(b));
        xs.push(-f32::from_bits(b));
        b += 3;
    }
    xs.truncate(xs.len() / CB * CB);
    let mut out = vec![MaybeUninit::<f32>::uninit(); xs.len()];
    unsafe { k(&xs, &mut out) };
    let mut worst = (0.0, 0.0f32);
    for (&x, o) in xs.iter().zip(&out) {
        let e = ulp_err(unsafe { o.assume_init() }, reference(x as f64));
        if e > worst.0 {
            worst = (e, x);
        }
    }
    println!("{name}: worst {:.2} ulp at {:e}", worst.0, worst.1);
}

fn timing(name: &str, k: K, n: usize) {
    // Normal-ish data from a simple generator.
    let mut s: u64 = 12345;
    let xs: Vec<f32> = (0..n)
        .map(|_| {
            let mut acc = 0.0;
            for _ in 0..4 {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                acc += (s >> 40) as f32 / (1u64 << 24) as f32;
            }
            if std::env::var("NORMAL").is_ok() {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let u2 = ((s >> 40) as f32 + 0.5) / (1u64 << 24) as f32;
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let u1 = ((s >> 40) as f32 + 0.5) / (1u64 << 24) as f32; let _ = acc;
                (-2.0 * u1.min(0.9999999).ln()).sqrt() * (6.2831853 * u2).cos()
            } else {
                (acc - 2.0) * 1.7
            }
        })
        .collect();
    let mut out = vec![MaybeUninit::<f32>::uninit(); n];
    let mut v = vec![];
    for _ in 0..200 {
        let t = Instant::now();
        unsafe { k(&xs, &mut out) };
        v.push(t.elapsed().as_secs_f64());
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!("{name}: {:.3} ns/elem (min {:.3})", v[v.len() / 2] * 1e9 / n as f64, v[0] * 1e9 / n as f64);
}

fn main() {
    let which: Vec<String> = std::env::args().skip(1).collect();
    if which.first().map(|s| s.as_str()) == Some("zeros") { zeros(); return; }
    if which.first().map(|s| s.as_str()) == Some("dbg") { for x in [-3.43271f32, -1.0, 1.0, 2.5] { dbg(x); } return; }
    let ks: Vec<(&str, K)> = vec![("base", gelu_base), ("v1", gelu_v1), ("a", gelu_a), ("b", gelu_b), ("c", gelu_c), ("d", gelu_d), ("mapc", map_c), ("mapbase", map_base), ("maps1", map_s1), ("maps12", map_s12), ("mapv1", map_v1), ("mapv2", map_v2), ("v2", gelu_v2), ("mapv3", map_v3), ("mapv3b", map_v3b), ("v3", gelu_v3), ("mapv3avx2", map_v3_avx2), ("mapv3u2", map_v3_u2), ("mapv4", map_v4), ("v4", gelu_v4), ("mapv4c", map_v4c), ("mapv4m", map_v4m), ("mapv4c_avx2", map_v4c_avx2), ("base_avx2", gelu_base_avx2), ("v4_avx2", gelu_v4_avx2)];
    for (name, k) in &ks {
        if which.is_empty() || which.iter().any(|w| w == name) {
            accuracy(name, *k);
        }
    }
    for _ in 0..3 {
        for (name, k) in &ks {
            if which.is_empty() || which.iter().any(|w| w == name) {
                timing(name, *k, std::env::var("N").map(|v| v.parse().unwrap()).unwrap_or(65536));
            }
        }
    }
}
#[allow(dead_code)]
pub fn dbg(x: f32) {
    let (h1, l1) = base_s1(x);
    let (r1, e1) = base_s2(h1, l1);
    let (h2, l2) = v1_s1(x);
    let (r2, e2) = v2_s2(h2, l2);
    println!("{x}: base {h1} {l1} {r1} {e1:x} -> {}; v2 {h2} {l2} {r2} {e2:x} -> {}; ref {}", base_s3(x, r1, e1), v1_s3(x, r2, e2), reference(x as f64));
}
#[allow(dead_code)]
pub fn zeros() {
    let xs = [0.0f32, -0.0, 1e-45, -1e-45, 1e-30, -1e-30, f32::NAN];
    let mut xsb = vec![0.5f32; 128];
    xsb[..xs.len()].copy_from_slice(&xs);
    let mut out = vec![MaybeUninit::<f32>::uninit(); 128];
    unsafe { gelu_v4(&xsb, &mut out) };
    for i in 0..xs.len() { let o = unsafe { out[i].assume_init() }; println!("{:e} -> {:e} (sign {})", xs[i], o, o.is_sign_negative()); }
}

#[inline(never)]
fn scalar_general(x: f32) -> f32 { reference(x as f64) as f32 }
