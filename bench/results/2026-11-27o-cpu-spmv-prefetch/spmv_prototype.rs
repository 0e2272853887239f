use std::time::Instant;
use std::arch::x86_64::*;
fn mix(x: u64) -> u64 { let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15); z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9); z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB); z ^ (z >> 31) }
fn matrix(kind: &str, n: usize) -> (Vec<u32>, Vec<u32>) {
    let (mut rp, mut ci) = (vec![0u32], Vec::new());
    for i in 0..n {
        let d = match kind { "random16" => 16, _ => { let u = ((mix(0xD0 ^ i as u64) >> 11) + 1) as f64 * (1.0f64 / (1u64 << 53) as f64); ((4.0 * u.powf(-2.0 / 3.0)).floor() as usize).min(n / 8) } };
        let st = ci.len();
        for j in 0..d { ci.push((mix(0xC0 ^ ((i as u64) << 24 | j as u64)) % n as u64) as u32); }
        ci[st..].sort_unstable(); rp.push(ci.len() as u32);
    }
    (rp, ci)
}
#[inline(always)] unsafe fn dot_row(c: &[u32], v: &[f32], x: &[f32]) -> f32 {
    let len = c.len();
    let t = |k: usize| *v.get_unchecked(k) * *x.get_unchecked(*c.get_unchecked(k) as usize);
    if len < 4 { let mut s = 0.0; for k in 0..len { s += t(k); } return s; }
    let mut s = [0f32; 4]; let mut k = 0;
    while k + 4 <= len { s[0] += t(k); s[1] += t(k+1); s[2] += t(k+2); s[3] += t(k+3); k += 4; }
    while k < len { s[0] += t(k); k += 1; }
    (s[0] + s[1]) + (s[2] + s[3])
}
#[inline(always)]
fn run<const MODE: u8>(rp: &[u32], ci: &[u32], v: &[f32], x: &[f32], y: &mut [f32], d: usize) {
    let mut s = rp[0] as usize;
    for i in 0..y.len() {
        let e = unsafe { *rp.get_unchecked(i + 1) } as usize;
        unsafe {
            let p1 = ci.as_ptr().wrapping_add(s + d) as *const i8; let p2 = v.as_ptr().wrapping_add(s + d) as *const i8;
            if MODE == 1 { _mm_prefetch(p1, _MM_HINT_NTA); _mm_prefetch(p2, _MM_HINT_NTA); }
            if MODE == 2 { _mm_prefetch(p1, _MM_HINT_T0); _mm_prefetch(p2, _MM_HINT_T0); }
            if MODE == 3 { _mm_prefetch(p1, _MM_HINT_T2); _mm_prefetch(p2, _MM_HINT_T2); }
        }
        *unsafe { y.get_unchecked_mut(i) } = unsafe { dot_row(ci.get_unchecked(s..e), v.get_unchecked(s..e), x) }; s = e;
    }
}
fn main() {
    let n = 1 << 20;
    let kinds: Vec<String> = std::env::args().skip(1).collect();
    for kind in kinds {
        let (rp, ci) = matrix(&kind, n);
        let nnz = ci.len();
        let v: Vec<f32> = (0..nnz).map(|k| (mix(k as u64) % 1000) as f32 / 500.0 - 1.0).collect();
        let x: Vec<f32> = (0..n).map(|k| (mix(k as u64 ^ 77) % 1000) as f32 / 500.0 - 1.0).collect();
        let mut y = vec![0f32; n];
        let names = ["plain", "nta512", "t0_512", "t2_512", "nta2048", "t0_2048"];
        let mut meds: Vec<Vec<f64>> = vec![vec![]; names.len()];
        for _round in 0..7 {
            for (vi, _) in names.iter().enumerate() {
                let mut ts = vec![];
                for _ in 0..5 {
                    let t = Instant::now();
                    match vi { 0 => run::<0>(&rp, &ci, &v, &x, &mut y, 0), 1 => run::<1>(&rp, &ci, &v, &x, &mut y, 512), 2 => run::<2>(&rp, &ci, &v, &x, &mut y, 512), 3 => run::<3>(&rp, &ci, &v, &x, &mut y, 512), 4 => run::<1>(&rp, &ci, &v, &x, &mut y, 2048), _ => run::<2>(&rp, &ci, &v, &x, &mut y, 2048) }
                    ts.push(t.elapsed().as_secs_f64() * 1e3);
                }
                ts.sort_by(|a, b| a.partial_cmp(b).unwrap());
                meds[vi].push(ts[2]);
            }
        }
        let mut line = format!("{kind} nnz {nnz}:");
        for (vi, nm) in names.iter().enumerate() { let mut m = meds[vi].clone(); m.sort_by(|a, b| a.partial_cmp(b).unwrap()); line += &format!("  {nm} {:.1} ({:.1}-{:.1})", m[3], m[0], m[6]); }
        println!("{line}  check {}", y.iter().sum::<f32>());
    }
}
