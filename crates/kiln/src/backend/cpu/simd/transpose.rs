//! Register transposes of 16×16 blocks (AVX-512), for the convolution's tiles and the
//! tiled copies of transposed views (`strided.rs`).

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
}
