//! Register transposes of 16×16 blocks (AVX-512) and 8×8 blocks (AVX2), for the
//! convolution's tiles and the tiled copies of transposed views (`strided.rs`).

/// Transposes a 16×16 block of f32 held as 16 row vectors.
///
/// # Safety
/// The caller has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn transpose16(r: &mut [std::arch::x86_64::__m512; 16]) {
    use std::arch::x86_64::*;
    // SAFETY: register shuffles only; the caller has AVX-512F.
    unsafe {
        let mut t = [_mm512_setzero_ps(); 16];
        // 32-bit interleave of row pairs.
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        // 64-bit interleave of those pairs' pairs.
        let (lo, hi) = (
            |a: __m512, b: __m512| {
                _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)))
            },
            |a: __m512, b: __m512| {
                _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)))
            },
        );
        for i in 0..4 {
            let q = 4 * i;
            r[q] = lo(t[q], t[q + 2]);
            r[q + 1] = hi(t[q], t[q + 2]);
            r[q + 2] = lo(t[q + 1], t[q + 3]);
            r[q + 3] = hi(t[q + 1], t[q + 3]);
        }
        // 128-bit blocks: rows k and k + 4 of each group of eight.
        for g in 0..2 {
            let b = 8 * g;
            for k in 0..4 {
                t[b + k] = _mm512_shuffle_f32x4::<0x88>(r[b + k], r[b + k + 4]);
                t[b + k + 4] = _mm512_shuffle_f32x4::<0xdd>(r[b + k], r[b + k + 4]);
            }
        }
        // 128-bit blocks across the two groups of eight.
        for k in 0..8 {
            r[k] = _mm512_shuffle_f32x4::<0x88>(t[k], t[k + 8]);
            r[k + 8] = _mm512_shuffle_f32x4::<0xdd>(t[k], t[k + 8]);
        }
    }
}

/// Moves a 16×16 tile of 32-bit values: row `r` of `dst` (rows `dst_stride` apart) gets
/// element `r` of each of the 16 source runs (runs `src_stride` apart), i.e. the tile
/// transposed.
///
/// # Safety
/// The CPU has AVX-512F; `src + c·src_stride .. + 16` (c < 16) is readable and
/// `dst + r·dst_stride .. + 16` (r < 16) writable.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn transpose_tile(
    src: *const f32,
    src_stride: usize,
    dst: *mut f32,
    dst_stride: usize,
) {
    use std::arch::x86_64::*;
    // SAFETY: the caller's bounds and AVX-512F.
    unsafe {
        let mut rows: [__m512; 16] =
            std::array::from_fn(|c| _mm512_loadu_ps(src.add(c * src_stride)));
        transpose16(&mut rows);
        for (r, v) in rows.iter().enumerate() {
            _mm512_storeu_ps(dst.add(r * dst_stride), *v);
        }
    }
}

/// [`transpose_tile`] for part of a tile: `runs` source runs (at most 16) of `len` elements
/// (at most 16) each; row `r < len` of `dst` gets element `r` of each run, `runs` elements.
/// Nothing else is read or written.
///
/// # Safety
/// The CPU has AVX-512F; `src + c·src_stride .. + len` (c < runs) is readable and
/// `dst + r·dst_stride .. + runs` (r < len) writable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn transpose_tile_part(
    src: *const f32,
    src_stride: usize,
    runs: usize,
    len: usize,
    dst: *mut f32,
    dst_stride: usize,
) {
    use std::arch::x86_64::*;
    debug_assert!(runs <= 16 && len <= 16);
    if runs == 16 && len == 16 {
        // SAFETY: the whole tile is in bounds (the caller); AVX-512F.
        return unsafe { transpose_tile(src, src_stride, dst, dst_stride) };
    }
    let mask = |n: usize| if n >= 16 { u16::MAX } else { (1u16 << n) - 1 };
    // SAFETY: the caller's bounds and AVX-512F; the masked loads read `len` elements of each
    // of the `runs` runs, the masked stores write `runs` elements of each of `len` rows.
    unsafe {
        let mut rows: [__m512; 16] = std::array::from_fn(|c| {
            if c < runs {
                _mm512_maskz_loadu_ps(mask(len), src.add(c * src_stride))
            } else {
                _mm512_setzero_ps()
            }
        });
        transpose16(&mut rows);
        for (r, v) in rows.iter().enumerate().take(len) {
            _mm512_mask_storeu_ps(dst.add(r * dst_stride), mask(runs), *v);
        }
    }
}

/// Transposes an 8×8 block of f32 held as 8 row vectors.
///
/// # Safety
/// The caller has AVX.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn transpose8(r: &mut [std::arch::x86_64::__m256; 8]) {
    use std::arch::x86_64::*;
    // SAFETY: register shuffles only; the caller has AVX.
    unsafe {
        // 32-bit interleave of row pairs, then 64-bit picks of those pairs' pairs: each
        // 128-bit half of u[k] holds column k (rows 0–3 and 4–7 in the two groups).
        let t: [__m256; 8] = std::array::from_fn(|i| {
            let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
            if i % 2 == 0 {
                _mm256_unpacklo_ps(a, b)
            } else {
                _mm256_unpackhi_ps(a, b)
            }
        });
        let mut u = [_mm256_setzero_ps(); 8];
        for g in 0..2 {
            let b = 4 * g;
            u[b] = _mm256_shuffle_ps::<0x44>(t[b], t[b + 2]);
            u[b + 1] = _mm256_shuffle_ps::<0xee>(t[b], t[b + 2]);
            u[b + 2] = _mm256_shuffle_ps::<0x44>(t[b + 1], t[b + 3]);
            u[b + 3] = _mm256_shuffle_ps::<0xee>(t[b + 1], t[b + 3]);
        }
        // 128-bit halves across the two groups of four rows.
        for k in 0..4 {
            r[k] = _mm256_permute2f128_ps::<0x20>(u[k], u[k + 4]);
            r[k + 4] = _mm256_permute2f128_ps::<0x31>(u[k], u[k + 4]);
        }
    }
}

/// [`transpose_tile`] for AVX2 CPUs: the 16×16 tile as four 8×8 register transposes.
///
/// # Safety
/// The CPU has AVX2; `src + c·src_stride .. + 16` (c < 16) is readable and
/// `dst + r·dst_stride .. + 16` (r < 16) writable.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn transpose_tile_avx2(
    src: *const f32,
    src_stride: usize,
    dst: *mut f32,
    dst_stride: usize,
) {
    use std::arch::x86_64::*;
    // SAFETY: the caller's bounds and AVX2; block (i, j) reads source runs 8i.. at elements
    // 8j.. and writes output rows 8j.. at columns 8i.., all inside the 16×16 tile.
    unsafe {
        for i in 0..2 {
            for j in 0..2 {
                let mut rows: [__m256; 8] = std::array::from_fn(|c| {
                    _mm256_loadu_ps(src.add((8 * i + c) * src_stride + 8 * j))
                });
                transpose8(&mut rows);
                for (r, v) in rows.iter().enumerate() {
                    _mm256_storeu_ps(dst.add((8 * j + r) * dst_stride + 8 * i), *v);
                }
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    #[test]
    fn transpose16_transposes() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return;
        }
        use std::arch::x86_64::*;
        let m: Vec<f32> = (0..256).map(|i| i as f32).collect();
        // SAFETY: AVX-512F checked above; loads and stores of 16 floats within `m`/`out`.
        let out = unsafe {
            let mut rows: [__m512; 16] =
                std::array::from_fn(|i| _mm512_loadu_ps(m[16 * i..].as_ptr()));
            super::transpose16(&mut rows);
            let mut out = vec![0f32; 256];
            for (i, r) in rows.iter().enumerate() {
                _mm512_storeu_ps(out[16 * i..].as_mut_ptr(), *r);
            }
            out
        };
        for i in 0..16 {
            for j in 0..16 {
                assert_eq!(out[16 * i + j], m[16 * j + i], "element ({i}, {j})");
            }
        }
    }

    /// Parts of a tile (fewer runs, shorter runs): the transposed part lands where it
    /// belongs and nothing around it is written.
    #[test]
    fn tile_parts_transpose_only_their_part() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return;
        }
        let src: Vec<f32> = (0..16 * 20).map(|i| i as f32 + 0.5).collect();
        for (runs, len) in [(16, 16), (5, 16), (16, 3), (7, 11), (1, 1)] {
            let mut dst = vec![-1f32; 17 * 24];
            // SAFETY: AVX-512F detected; `runs` runs of `len` from a 20-stride source of 16
            // rows, `len` rows of `runs` into a 24-stride destination of 17 rows.
            unsafe {
                super::transpose_tile_part(src.as_ptr(), 20, runs, len, dst.as_mut_ptr(), 24)
            };
            for r in 0..17 {
                for c in 0..24 {
                    let want = if r < len && c < runs {
                        src[c * 20 + r]
                    } else {
                        -1.0
                    };
                    assert_eq!(dst[r * 24 + c], want, "{runs}×{len}: row {r} column {c}");
                }
            }
        }
    }

    /// A 16×16 tile out of a 20-wide source into a 24-wide destination, by both tile
    /// routines the CPU has: every element where the transpose puts it, nothing else
    /// written.
    #[test]
    fn tiles_transpose_between_strides() {
        type TileFn = unsafe fn(*const f32, usize, *mut f32, usize);
        let src: Vec<f32> = (0..16 * 20).map(|i| i as f32 + 0.5).collect();
        let mut kinds: Vec<(&str, TileFn)> = Vec::new();
        if std::arch::is_x86_feature_detected!("avx2") {
            kinds.push(("avx2", super::transpose_tile_avx2));
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            kinds.push(("avx512", super::transpose_tile));
        }
        for (name, tile) in kinds {
            let mut dst = vec![-1f32; 16 * 24];
            // SAFETY: the feature was detected; 16 runs of 16 from a 20-stride source of 16
            // rows and 16 rows of 16 into a 24-stride destination of 16 rows.
            unsafe { tile(src.as_ptr(), 20, dst.as_mut_ptr(), 24) };
            for r in 0..16 {
                for c in 0..24 {
                    let want = if c < 16 { src[c * 20 + r] } else { -1.0 };
                    assert_eq!(dst[r * 24 + c], want, "{name}: row {r} column {c}");
                }
            }
        }
    }
}
