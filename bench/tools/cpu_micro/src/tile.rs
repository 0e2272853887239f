//! `cpu_micro tile`: the forward conv tile's inner loop alone (one thread, 800 taps, weights
//! streamed from L2 like the real tile), in three shapes, GFLOP/s. Whether the broadcast of
//! each pixel costs FMA issue slots: 2 weight vectors × 14 pixels with a register broadcast
//! (kiln's tile), the same with the broadcast folded into each FMA ({1to16}), and
//! 4 weight vectors × 7 pixels (half the broadcasts per FMA).
use std::arch::x86_64::*;
use std::time::Instant;

const TAPS: usize = 800;

#[target_feature(enable = "avx512f")]
unsafe fn tile_2x14(w: *const f32, x: *const f32, taps: &[usize], out: &mut [__m512; 28]) {
    let mut acc = [_mm512_setzero_ps(); 28];
    let mut wp = w;
    for &t in taps {
        let w0 = _mm512_loadu_ps(wp);
        let w1 = _mm512_loadu_ps(wp.add(16));
        let xt = x.add(t);
        for p in 0..14 {
            let v = _mm512_set1_ps(*xt.add(p));
            acc[2 * p] = _mm512_fmadd_ps(w0, v, acc[2 * p]);
            acc[2 * p + 1] = _mm512_fmadd_ps(w1, v, acc[2 * p + 1]);
        }
        wp = wp.add(32);
    }
    *out = acc;
}

#[target_feature(enable = "avx512f")]
unsafe fn tile_2x14_embedded(w: *const f32, x: *const f32, taps: &[usize], out: &mut [__m512; 28]) {
    let mut acc = [_mm512_setzero_ps(); 28];
    let mut wp = w;
    for &t in taps {
        let w0 = _mm512_loadu_ps(wp);
        let w1 = _mm512_loadu_ps(wp.add(16));
        let xt = x.add(t);
        macro_rules! px {
            ($($p:literal)*) => {$(
                std::arch::asm!(
                    "vfmadd231ps {a0}, {w0}, dword ptr [{x} + {off}]{{1to16}}",
                    "vfmadd231ps {a1}, {w1}, dword ptr [{x} + {off}]{{1to16}}",
                    a0 = inout(zmm_reg) acc[2 * $p], a1 = inout(zmm_reg) acc[2 * $p + 1],
                    w0 = in(zmm_reg) w0, w1 = in(zmm_reg) w1, x = in(reg) xt, off = const 4 * $p,
                    options(pure, readonly, nostack),
                );
            )*};
        }
        px!(0 1 2 3 4 5 6 7 8 9 10 11 12 13);
        wp = wp.add(32);
    }
    *out = acc;
}

#[target_feature(enable = "avx512f")]
unsafe fn tile_4x7(w: *const f32, x: *const f32, taps: &[usize], out: &mut [__m512; 28]) {
    let mut acc = [_mm512_setzero_ps(); 28];
    let mut wp = w;
    for &t in taps {
        let w0 = _mm512_loadu_ps(wp);
        let w1 = _mm512_loadu_ps(wp.add(16));
        let w2 = _mm512_loadu_ps(wp.add(32));
        let w3 = _mm512_loadu_ps(wp.add(48));
        let xt = x.add(t);
        for p in 0..7 {
            let v = _mm512_set1_ps(*xt.add(p));
            acc[4 * p] = _mm512_fmadd_ps(w0, v, acc[4 * p]);
            acc[4 * p + 1] = _mm512_fmadd_ps(w1, v, acc[4 * p + 1]);
            acc[4 * p + 2] = _mm512_fmadd_ps(w2, v, acc[4 * p + 2]);
            acc[4 * p + 3] = _mm512_fmadd_ps(w3, v, acc[4 * p + 3]);
        }
        wp = wp.add(64);
    }
    *out = acc;
}

pub fn run() {
    // Taps of a 32-channel 5×5 window over an 18-wide padded row of 18 rows.
    let (wp, hp) = (18usize, 18usize);
    let mut taps = vec![];
    for c in 0..32 {
        for ky in 0..5 {
            for kx in 0..5 {
                taps.push(c * hp * wp + ky * wp + kx);
            }
        }
    }
    assert_eq!(taps.len(), TAPS);
    let x: Vec<f32> = (0..32 * hp * wp).map(|i| (i % 7) as f32 * 0.01).collect();
    let w_all: Vec<f32> = (0..TAPS * 64 + 32).map(|i| (i % 5) as f32 * 0.01).collect();
    // WOFF=k: the weights start k floats past a 64-byte boundary (a 16-float load then
    // spans two cache lines unless k is 0).
    let woff: usize = std::env::var("WOFF").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    let base = w_all.as_ptr().align_offset(64);
    let w = &w_all[base + woff..];
    println!("weights at {:#x} (mod 64 = {})", w.as_ptr() as usize, w.as_ptr() as usize % 64);
    let mut out = [unsafe { _mm512_setzero_ps() }; 28];
    let reps: usize = std::env::var("REPS").ok().and_then(|s| s.parse().ok()).unwrap_or(20_000);
    type Tile = unsafe fn(*const f32, *const f32, &[usize], &mut [__m512; 28]);
    let tiles: [(&str, Tile); 3] = [("2w x 14px, register broadcast", tile_2x14), ("2w x 14px, {1to16} in the FMA", tile_2x14_embedded), ("4w x 7px, register broadcast", tile_4x7)];
    for round in 0..2 {
        for (name, f) in tiles {
            let t = Instant::now();
            for r in 0..reps {
                // SAFETY: AVX-512F is checked by the caller; taps and weights are in bounds.
                unsafe { f(w.as_ptr(), x.as_ptr().add(r % 4), &taps, &mut out) };
            }
            let s = t.elapsed().as_secs_f64();
            let flops = 2.0 * 16.0 * 28.0 * TAPS as f64 * reps as f64;
            println!("round {round} {name:34} {:6.1} GFLOP/s", flops / s / 1e9);
        }
    }
    std::hint::black_box(out);
}
