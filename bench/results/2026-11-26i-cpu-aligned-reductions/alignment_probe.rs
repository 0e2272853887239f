use std::time::Instant;
#[inline(never)]
fn sum(x: &[f32]) -> f64 {
    let mut total = 0f64;
    for block in x.chunks(4096) {
        let mut acc = [0f32; 32];
        let mut ch = block.chunks_exact(32);
        for c in ch.by_ref() { for i in 0..32 { acc[i] += c[i]; } }
        total += ch.remainder().iter().map(|&v| v as f64).sum::<f64>() + acc.iter().map(|&v| v as f64).sum::<f64>();
    }
    total
}
fn main() {
    let n = 16 << 20;
    let buf: Vec<f32> = (0..n + 64).map(|i| (i % 7) as f32).collect();
    let base = buf.as_ptr() as usize;
    let a0 = (64 - base % 64) % 64 / 4;
    for round in 0..3 {
        for off in [0usize, 4, 8, 12] {
            let s = &buf[a0 + off..a0 + off + n];
            let mut best = f64::MAX;
            let mut r = 0.0;
            for _ in 0..15 { let t = Instant::now(); r += sum(s); best = best.min(t.elapsed().as_secs_f64()); }
            println!("round {round} offset {:2} bytes: {:.1} GB/s ({r})", off * 4, n as f64 * 4.0 / best / 1e9);
        }
    }
}
