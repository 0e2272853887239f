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

/// The offsets of a 32-channel 5×5 window's taps over an 18-wide padded image of 18 rows:
/// (row pitch, rows, offsets).
fn window_taps() -> (usize, usize, Vec<usize>) {
    let (wp, hp) = (18usize, 18usize);
    let mut taps = vec![];
    if std::env::var("TAP_ORDER").is_ok_and(|v| v == "kernel") {
        // The kernel's order ([kernel column][channel][kernel row], `tap_order`); WP sets
        // the padded row length.
        let wp: usize = std::env::var("WP").ok().and_then(|s| s.parse().ok()).unwrap_or(wp);
        for kx in 0..5 {
            for c in 0..32 {
                for ky in 0..5 {
                    taps.push(c * hp * wp + ky * wp + kx);
                }
            }
        }
        return (wp, hp, taps);
    }
    for c in 0..32 {
        for ky in 0..5 {
            for kx in 0..5 {
                taps.push(c * hp * wp + ky * wp + kx);
            }
        }
    }
    (wp, hp, taps)
}

pub fn run() {
    let (wp, hp, taps) = window_taps();
    assert_eq!(taps.len(), TAPS);
    // CHUNK=k: only the first k taps, repeated TAPS/k times per tile (weights that stay in L1).
    let chunk: usize = std::env::var("CHUNK").ok().and_then(|s| s.parse().ok()).unwrap_or(TAPS);
    let taps = &taps[..chunk];
    let rows = std::env::var("ROWS").is_ok();
    let x: Vec<f32> = (0..32 * hp * wp).map(|i| (i % 7) as f32 * 0.01).collect();
    let w_all: Vec<f32> = (0..TAPS * 64 + 64).map(|i| (i % 5) as f32 * 0.01).collect();
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
                // ROWS=1: walk the 14 output rows of the padded image as the real kernel does,
                // with the two channel tiles' weights alternating every 14 rows.
                let (xo, wo) = if rows { ((r % 14) * wp, ((r / 14) % 2) * TAPS * 32) } else { (r % 4, 0) };
                for _ in 0..TAPS / chunk {
                    unsafe { f(w.as_ptr().add(wo), x.as_ptr().add(xo), taps, &mut out) };
                }
            }
            let s = t.elapsed().as_secs_f64();
            let flops = 2.0 * 16.0 * 28.0 * TAPS as f64 * reps as f64;
            println!("round {round} {name:34} {:6.1} GFLOP/s", flops / s / 1e9);
        }
    }
    std::hint::black_box(out);
}

/// `cpu_micro wgtile`: the weight-gradient tile's loop alone (one thread, hot data), in
/// three shapes: CV channel vectors × T taps (broadcast input values), walking a 14×14 output.
#[target_feature(enable = "avx512f")]
unsafe fn wg_tile<const CV: usize, const T: usize>(gt: *const f32, xp: *const f32, taps: &[usize; 16], sums: &mut [f32]) {
    let mut acc = [[_mm512_setzero_ps(); CV]; T];
    for y in 0..14 {
        let g = gt.add(y * 14 * 64);
        let x = xp.add(y * 18);
        for xo in 0..14 {
            let gv: [__m512; CV] = std::array::from_fn(|v| _mm512_loadu_ps(g.add(xo * 64 + 16 * v)));
            for (k, a) in acc.iter_mut().enumerate() {
                let b = _mm512_set1_ps(*x.add(taps[k] + xo));
                for v in 0..CV {
                    a[v] = _mm512_fmadd_ps(gv[v], b, a[v]);
                }
            }
        }
    }
    for (k, a) in acc.iter().enumerate() {
        for v in 0..CV {
            let p = sums.as_mut_ptr().add((k * CV + v) * 16);
            _mm512_storeu_ps(p, _mm512_add_ps(_mm512_loadu_ps(p), a[v]));
        }
    }
}

pub fn run_wg() {
    let gt: Vec<f32> = (0..14 * 14 * 64).map(|i| (i % 7) as f32 * 0.01).collect();
    let xp: Vec<f32> = (0..32 * 18 * 18).map(|i| (i % 5) as f32 * 0.01).collect();
    let mut taps = [0usize; 16];
    for (k, t) in taps.iter_mut().enumerate() {
        *t = (k / 5) * 18 + k % 5;
    }
    let mut sums = vec![0f32; 64 * 16];
    let reps = 200_000;
    for round in 0..2 {
        for (name, cv, t) in [("2 vectors x 10 taps (kiln)", 2usize, 10usize), ("4 vectors x 7 taps", 4, 7), ("2 vectors x 14 taps", 2, 14), ("4 vectors x 6 taps", 4, 6)] {
            let start = Instant::now();
            for r in 0..reps {
                // SAFETY: AVX-512F checked by the caller; every index is within the buffers.
                unsafe {
                    let x = xp.as_ptr().add((r % 8) * 18 * 18);
                    match (cv, t) {
                        (2, 10) => wg_tile::<2, 10>(gt.as_ptr(), x, &taps, &mut sums),
                        (4, 7) => wg_tile::<4, 7>(gt.as_ptr(), x, &taps, &mut sums),
                        (2, 14) => wg_tile::<2, 14>(gt.as_ptr(), x, &taps, &mut sums),
                        _ => wg_tile::<4, 6>(gt.as_ptr(), x, &taps, &mut sums),
                    }
                }
            }
            let s = start.elapsed().as_secs_f64();
            let flops = 2.0 * 16.0 * (cv * t) as f64 * 196.0 * reps as f64;
            println!("round {round} {name:30} {:6.1} GFLOP/s", flops / s / 1e9);
        }
    }
    std::hint::black_box(&sums);
}

/// `cpu_micro fmapeak`: independent fused multiply-adds from registers only (one thread),
/// the FMA rate this core sustains under AVX-512 load, GFLOP/s.
#[target_feature(enable = "avx512f")]
unsafe fn fma_loop(iters: usize) -> __m512 {
    let mut acc = [_mm512_set1_ps(0.0); 24];
    let a = _mm512_set1_ps(0.999_999);
    let b = _mm512_set1_ps(1e-7);
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = _mm512_fmadd_ps(*x, a, b);
        }
    }
    acc.iter().fold(_mm512_setzero_ps(), |s, &x| _mm512_add_ps(s, x))
}

pub fn run_fma_peak() {
    let iters = 20_000_000;
    for round in 0..3 {
        let t = Instant::now();
        // SAFETY: AVX-512F checked by the caller.
        let r = unsafe { fma_loop(iters) };
        let s = t.elapsed().as_secs_f64();
        std::hint::black_box(r);
        println!("round {round} FMA from registers: {:6.1} GFLOP/s", 2.0 * 16.0 * 24.0 * iters as f64 / s / 1e9);
    }
}

/// AVX2: `CH`·8 channels (CH weight vectors, `wstride` floats apart in the packed tile) ×
/// `NP` pixels of one output row, through every tap.
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2<const CH: usize, const NP: usize, const PF: u8>(w: *const f32, x: *const f32, taps: &[usize], out: &mut [__m256; 14]) {
    let mut acc = [[_mm256_setzero_ps(); CH]; NP];
    for (t, &off) in taps.iter().enumerate() {
        let wt = w.add(t * 32);
        if PF > 0 {
            // The kernel's software prefetch of the weights 8 taps ahead.
            _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add((t + 8) * 32).cast());
            if PF == 2 {
                _mm_prefetch::<_MM_HINT_T0>(x.add(*taps.get_unchecked((t + 8).min(taps.len() - 1))).cast());
            }
        }
        let mut wv = [_mm256_setzero_ps(); CH];
        for (c, v) in wv.iter_mut().enumerate() {
            *v = _mm256_loadu_ps(wt.add(8 * c));
        }
        let xt = x.add(off);
        for (p, a) in acc.iter_mut().enumerate() {
            let b = _mm256_broadcast_ss(&*xt.add(p));
            for c in 0..CH {
                a[c] = _mm256_fmadd_ps(wv[c], b, a[c]);
            }
        }
    }
    for p in 0..NP {
        for c in 0..CH {
            out[(p * CH + c) % 14] = _mm256_add_ps(out[(p * CH + c) % 14], acc[p][c]);
        }
    }
}

/// AVX2, oneDNN's arrangement: `NP` pixels broadcast first, then each of the 4 weight
/// vectors of the 32-channel packed tile loaded once and multiplied into the `NP` pixels.
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2_bcast_first<const NP: usize>(w: *const f32, x: *const f32, taps: &[usize], out: &mut [__m256; 14]) {
    let mut acc = [[_mm256_setzero_ps(); 4]; NP];
    for (t, &off) in taps.iter().enumerate() {
        let wt = w.add(t * 32);
        _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add((t + 8) * 32).cast());
        let xt = x.add(off);
        let b: [__m256; NP] = std::array::from_fn(|p| _mm256_broadcast_ss(&*xt.add(p)));
        for c in 0..4 {
            let wv = _mm256_loadu_ps(wt.add(8 * c));
            for p in 0..NP {
                acc[p][c] = _mm256_fmadd_ps(wv, b[p], acc[p][c]);
            }
        }
    }
    for p in 0..NP {
        for c in 0..4 {
            out[(p * 4 + c) % 14] = _mm256_add_ps(out[(p * 4 + c) % 14], acc[p][c]);
        }
    }
}

/// One image's 14 output rows in tiles of 32 channels × 3, 3, 3, 3 and 2 pixels.
#[target_feature(enable = "avx2,fma")]
unsafe fn image_32x3(w: &[f32], x: &[f32], taps: &[usize], wp: usize, out: &mut [__m256; 14]) {
    for y in 0..14 {
        let xr = x.as_ptr().add(y * wp);
        for x0 in [0, 3, 6, 9] {
            tile_avx2_bcast_first::<3>(w.as_ptr(), xr.add(x0), taps, out);
        }
        tile_avx2_bcast_first::<2>(w.as_ptr(), xr.add(12), taps, out);
    }
}

/// One image's 14 output rows in tiles of 16 channels × 5, 5 and 4 pixels (both halves of the
/// packed 32-channel tile), with or without the weights' prefetch.
#[target_feature(enable = "avx2,fma")]
unsafe fn image_16x5<const PF: u8>(w: &[f32], x: &[f32], taps: &[usize], wp: usize, out: &mut [__m256; 14]) {
    for y in 0..14 {
        for half in 0..2 {
            let (wh, xr) = (w.as_ptr().add(16 * half), x.as_ptr().add(y * wp));
            tile_avx2::<2, 5, PF>(wh, xr, taps, out);
            tile_avx2::<2, 5, PF>(wh, xr.add(5), taps, out);
            tile_avx2::<2, 4, PF>(wh, xr.add(10), taps, out);
        }
    }
}

/// `cpu_micro tile2`: the AVX2 channel tile's shapes over a b256 32→64 14² 5×5 layer's image
/// (one thread, 800 taps, the 32-channel packed weights, rows walked): 16 channels × 5/5/4
/// pixels (the kernel's split of a 14-wide row into tiles of at most 6), the same with the
/// kernel's software prefetch of the weights (`PF_X=1`: and of the input 8 taps ahead),
/// 32 × 3/3/3/3/2 (oneDNN's arrangement: three broadcasts, four weight vectors a tap), and
/// 8 × 14 (a whole row: one weight vector and 14 broadcasts a tap). GFLOP/s against the
/// core's 40. `TAP_ORDER=kernel` walks the taps in the kernel's order ([column][channel]
/// [row]) instead of [channel][row][column]; `WP` sets the padded row length there.
pub fn run_avx2() {
    let (wp, hp, taps) = window_taps();
    let x: Vec<f32> = (0..32 * hp * wp + 64).map(|i| (i % 7) as f32 * 0.01).collect();
    let w_all: Vec<f32> = (0..TAPS * 32 + 64).map(|i| (i % 5) as f32 * 0.01).collect();
    let w = &w_all[w_all.as_ptr().align_offset(64)..];
    let mut out = [unsafe { _mm256_setzero_ps() }; 14];
    let images: usize = std::env::var("REPS").ok().and_then(|s| s.parse().ok()).unwrap_or(200);
    for round in 0..2 {
        // 16 channels × 5, 5, 4 pixels, two halves of the packed tile; then the same with the
        // kernel's software prefetch of the weights, 8 taps ahead.
        let t = Instant::now();
        for _ in 0..images {
            // SAFETY: AVX2 and FMA checked by the caller; every tap stays in the image.
            unsafe { image_16x5::<0>(w, &x, &taps, wp, &mut out) };
        }
        let a = t.elapsed().as_secs_f64();
        let t = Instant::now();
        for _ in 0..images {
            // SAFETY: as above (a prefetch past the weights does not fault).
            if std::env::var_os("PF_X").is_some() {
                unsafe { image_16x5::<2>(w, &x, &taps, wp, &mut out) }
            } else {
                unsafe { image_16x5::<1>(w, &x, &taps, wp, &mut out) }
            };
        }
        let b = t.elapsed().as_secs_f64();
        let t = Instant::now();
        for _ in 0..images {
            // SAFETY: as above.
            unsafe { image_32x3(w, &x, &taps, wp, &mut out) };
        }
        let d = t.elapsed().as_secs_f64();
        // 8 channels × 14 pixels, four quarters of the packed tile.
        let t = Instant::now();
        for _ in 0..images {
            for y in 0..14 {
                for q in 0..4 {
                    // SAFETY: as above.
                    unsafe { tile_avx2::<1, 14, 0>(w.as_ptr().add(8 * q), x.as_ptr().add(y * wp), &taps, &mut out) };
                }
            }
        }
        let c = t.elapsed().as_secs_f64();
        let flops = 2.0 * 14.0 * 14.0 * 32.0 * TAPS as f64 * images as f64;
        println!(
            "round {round}: 16ch x 5/5/4 px {:5.1}, with the weights' prefetch {:5.1}, 32ch x 3/3/3/3/2 px {:5.1}, 8ch x 14 px {:5.1} GFLOP/s",
            flops / a / 1e9,
            flops / b / 1e9,
            flops / d / 1e9,
            flops / c / 1e9
        );
    }
    std::hint::black_box(out);
}
