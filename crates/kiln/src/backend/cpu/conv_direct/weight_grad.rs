//! The direct weight gradient: the output gradient transposed to `[pixel][channel]`, and a
//! tile of 32 channels × every tap of a few filter rows walking the pixels.

use super::*;

/// Filter rows `(ci, kh)` one weight-gradient tile covers for a filter row of `kw` taps:
/// at most 20 accumulators (2 vectors per tap) and 4 row pointers. With 24 (4 rows of 3
/// taps) the compiler spilled accumulators to the stack inside the pixel loop.
const fn rows_per_tile(kw: usize) -> usize {
    let r = 10 / kw;
    if r > 4 {
        4
    } else {
        r
    }
}

/// The weight gradient `[c_out, c_in, kh, kw]` of a stride-1, undilated, ungrouped
/// convolution from the input `x` (`xl`) and the output gradient `g` (`gl`), or `None`
/// where that does not apply (or [`enabled`] is false, or there are fewer than 16 output
/// channels or [`MIN_TAPS`] taps per channel, or filter rows of more than 7 taps; 1→32
/// channels, 5×5, 28², batch 256 took 4.7 ms here against 4.0 through the unfolded matrix).
///
/// Per image: the padded input and the gradient transposed to `[pixel][channel]` (so 32
/// channels of one pixel are two vector loads); a register tile holds 32 channels for every
/// tap of [`rows_per_tile`] filter rows and walks every pixel, broadcasting each tap's input
/// value. Each task sums its run of images into its own accumulators; the runs' sums are
/// added at the end. A tile's filter rows share one kernel row (rows in kernel-row-major
/// order), so it walks only the output rows where that kernel row reaches the image; edge
/// pixels skip their taps that read padding only (b256 32→64 14² 5×5, two threads: 24.3 →
/// 21.2 ms).
pub(in crate::backend::cpu) fn backward_weight(
    x: &[f32],
    xl: &Layout,
    g: &[f32],
    gl: &Layout,
    win: &Window2d,
    groups: usize,
    c_out: usize,
) -> Option<Vec<f32>> {
    let [kh, kw] = win.kernel;
    let avx512 = avx512();
    if !enabled()
        || groups != 1
        || win.stride != [1, 1]
        || win.dilation != [1, 1]
        || kw > if avx512 { 7 } else { 5 }
        || c_out < 16
    {
        return None;
    }
    let [oh, ow] = win.out_hw();
    let (hp, wp) = (win.h + 2 * win.padding[0], win.w + 2 * win.padding[1]);
    let tiles = c_out.div_ceil(CO_TILE);
    let rows = win.c * kh;
    #[cfg(target_arch = "x86_64")]
    let per_tile = if avx512 {
        rows_per_tile(kw)
    } else {
        super::weight_grad_avx2::rows_per_tile_avx2(kw)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let per_tile = rows_per_tile(kw);
    let row_tiles = rows.div_ceil(per_tile);
    // Filter rows in kernel-row-major order (row r is kernel row r / c of input channel
    // r % c), so a tile's rows share their kernel row and with it the output rows at which
    // they read only padding. Each filter row's first input element in the padded image; the
    // last tile's rows past the end repeat row 0 (their sums are dropped).
    let row_offsets: Vec<usize> = (0..row_tiles * per_tile)
        .map(|r| {
            if r < rows {
                (r % win.c) * hp * wp + (r / win.c) * wp
            } else {
                0
            }
        })
        .collect();
    // The output rows at which each tile's filter rows reach the image: kernel row i reads
    // padded row y + i, inside the image for y in [pad − i, pad + h − i).
    let pad_h = win.padding[0];
    let reach: Vec<std::ops::Range<usize>> = (0..row_tiles)
        .map(|rt| {
            let first = rt * per_tile;
            let last = (first + per_tile).min(rows) - 1;
            let (i_first, i_last) = (first / win.c, last / win.c);
            pad_h.saturating_sub(i_last)..(pad_h + win.h).saturating_sub(i_first).min(oh)
        })
        .collect();
    let sums_len = tiles * row_tiles * per_tile * kw * CO_TILE;
    // Tasks: runs of whole images; with fewer images than threads, bands of one image's
    // output rows instead (a batch of one would otherwise run on one core).
    let threads = num_threads().max(1);
    let tasks: Vec<(std::ops::Range<usize>, std::ops::Range<usize>)> = if win.n >= threads {
        let run = images_per_task(win.n);
        (0..win.n)
            .step_by(run)
            .map(|b| (b..(b + run).min(win.n), 0..oh))
            .collect()
    } else {
        let band = oh.div_ceil(threads);
        (0..win.n)
            .flat_map(|b| {
                (0..oh)
                    .step_by(band)
                    .map(move |y| (b..b + 1, y..(y + band).min(oh)))
            })
            .collect()
    };
    let shape = GradShape {
        ow,
        wp,
        kw,
        tiles,
        row_tiles,
        pad_w: win.padding[1],
        w: win.w,
        row_offsets,
        reach,
        avx512,
    };
    let partials = install(|| {
        tasks
            .par_iter()
            .map(|(images, band)| {
                let mut sums = vec![0f32; sums_len];
                let mut xp = vec![0f32; win.c * hp * wp];
                let mut gt = vec![0f32; band.len() * ow * tiles * CO_TILE];
                for b in images.clone() {
                    pad_image(x, xl, win, b, &mut xp);
                    transpose_grad(
                        g,
                        gl,
                        b,
                        c_out,
                        tiles * CO_TILE,
                        band.clone(),
                        &mut gt,
                        avx512,
                    );
                    // The next image's gradient and input, over this image's tiles.
                    let steps = tiles * row_tiles * band.len().div_ceil(chunk_rows(ow));
                    let next = if b + 1 < images.end { b + 1 } else { win.n };
                    let mut prefetch = [
                        Prefetch::image(g, gl, next, steps),
                        Prefetch::image(x, xl, next, steps),
                    ];
                    // SAFETY: `enabled` found AVX-512 or AVX2 (the AVX2 tiles for `kw ≤ 5`,
                    // checked above); `xp`, `gt` and `sums` were sized above for `shape`, its
                    // rows a tile and this band of rows.
                    unsafe {
                        weight_grad_image(&xp, &gt, &shape, band.clone(), &mut sums, &mut prefetch)
                    };
                }
                sums
            })
            .collect::<Vec<_>>()
    });
    let mut dw = vec![0f32; c_out * rows * kw];
    for sums in partials {
        for co in 0..c_out {
            let (t, lane) = (co / CO_TILE, co % CO_TILE);
            for row in 0..rows {
                let (ci, i) = (row % win.c, row / win.c);
                for j in 0..kw {
                    let tap = (t * row_tiles * per_tile + row) * kw + j;
                    dw[((co * win.c + ci) * kh + i) * kw + j] += sums[tap * CO_TILE + lane];
                }
            }
        }
    }
    Some(dw)
}

/// Output rows per chunk of about 256 pixels, every tile walking one chunk before the next:
/// the chunk's transposed gradient stays in cache for all of them (a 224-wide image's 6 MB
/// streamed once per tile took 2 of the weight gradient's 2.4 ms).
pub(super) fn chunk_rows(ow: usize) -> usize {
    (256 / ow).max(1)
}

/// What [`weight_grad_image`] needs of the convolution.
pub(super) struct GradShape {
    pub(super) ow: usize,
    /// Padded input row length.
    pub(super) wp: usize,
    pub(super) kw: usize,
    /// Tiles of 32 output channels.
    pub(super) tiles: usize,
    /// Tiles of [`rows_per_tile`] filter rows (AVX2: `rows_per_tile_avx2`).
    pub(super) row_tiles: usize,
    /// Left padding and unpadded width: the edge pixels' taps that read padding only.
    pad_w: usize,
    w: usize,
    /// Each filter row's first element in the padded image, `row_tiles·R` (rows in
    /// kernel-row-major order).
    pub(super) row_offsets: Vec<usize>,
    /// Per row tile, the output rows at which its filter rows reach the image.
    pub(super) reach: Vec<std::ops::Range<usize>>,
    /// The tiles the rows were laid out for: AVX-512's, or AVX2's (the level read once a
    /// call: tests change it process-wide).
    avx512: bool,
}

impl GradShape {
    /// The output pixels whose taps all reach the image: before them, pixel `xo` reads
    /// padding at its first `pad_w − xo` taps; after them, at its taps from `pad_w + w − xo`.
    pub(super) fn inner_pixels(&self) -> std::ops::Range<usize> {
        let first = self.pad_w.min(self.ow);
        let end = (self.pad_w + self.w + 1).saturating_sub(self.kw);
        first..end.clamp(first, self.ow)
    }

    /// Pixel `xo`'s taps that read padding only: how many first and last.
    pub(super) fn edge_skips(&self, xo: usize) -> (usize, usize) {
        (
            self.pad_w.saturating_sub(xo),
            (xo + self.kw).saturating_sub(self.pad_w + self.w),
        )
    }
}

/// Output rows `band` of image `b` of the output gradient (any strides) as
/// `[band·ow][channels]` (`channels` a multiple of 32; those past `c_out` stay as they are,
/// zero).
#[allow(clippy::too_many_arguments)]
fn transpose_grad(
    g: &[f32],
    gl: &Layout,
    b: usize,
    c_out: usize,
    channels: usize,
    band: std::ops::Range<usize>,
    gt: &mut [f32],
    avx512: bool,
) {
    let (d, s) = (gl.dims(), gl.strides());
    let ow = d[3];
    let base = gl.offset() + b * s[0];
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if s[3] == 1 && (s[2] == ow || d[2] == 1) {
        let blocks = if avx512 {
            transpose_blocks
        } else {
            super::weight_grad_avx2::transpose_blocks_avx2
        };
        // SAFETY: `backward_weight` runs only where `enabled` found AVX-512 or AVX2, and
        // `blocks` is the level's; the plane is contiguous (checked), so each channel's band
        // is one run of `band.len()·ow`.
        done = unsafe {
            blocks(
                &g[base..],
                s[1],
                c_out,
                band.start * ow,
                band.len() * ow,
                channels,
                gt,
            )
        };
    }
    for co in done..c_out {
        for y in band.clone() {
            let src = base + co * s[1] + y * s[2];
            for xo in 0..ow {
                gt[((y - band.start) * ow + xo) * channels + co] = g[src + xo * s[3]];
            }
        }
    }
}

/// [`transpose_grad`] for a contiguous plane, by 16×16 blocks in registers: pixels
/// `first..first + len` of every channel below the last whole block of 16. Returns the
/// channels done (a multiple of 16).
///
/// # Safety
/// The CPU has AVX-512F; `g` holds channel `c` at `c·channel_stride`, each with at least
/// `first + len` pixels; `gt` holds `len·channels` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn transpose_blocks(
    g: &[f32],
    channel_stride: usize,
    c_out: usize,
    first: usize,
    len: usize,
    channels: usize,
    gt: &mut [f32],
) -> usize {
    use std::arch::x86_64::*;
    let blocks = c_out / 16;
    for cb in 0..blocks {
        let mut q = 0;
        while q < len {
            let n = (len - q).min(16);
            let mask = lane_mask(n);
            // SAFETY: pixels first+q .. first+q+n of channels 16·cb .. 16·cb+16 are in `g`
            // (masked past n); the n pixel rows of `gt` hold `channels ≥ 16·cb + 16` each.
            unsafe {
                let mut rows: [__m512; 16] = std::array::from_fn(|i| {
                    let src = g.as_ptr().add((16 * cb + i) * channel_stride + first + q);
                    _mm512_maskz_loadu_ps(mask, src)
                });
                transpose16(&mut rows);
                for (j, r) in rows.iter().enumerate().take(n) {
                    _mm512_storeu_ps(gt.as_mut_ptr().add((q + j) * channels + 16 * cb), *r);
                }
            }
            q += n;
        }
    }
    blocks * 16
}

/// Adds the weight gradient of output rows `band` of one image into `sums`
/// (`[tile][row tile][row][kw][32]`). Row tile `rt` walks only the output rows
/// `shape.reach[rt]`, where its filter rows reach the image, and each edge pixel only its taps
/// that do.
///
/// # Safety
/// The CPU has AVX-512F (`shape.avx512`) or AVX2 and FMA with `shape.kw ≤ 5`; `xp` is the padded
/// image, `gt` the transposed gradient, and `sums` was made for `shape` and the level's rows
/// a tile (as in [`backward_weight`]).
#[cfg(target_arch = "x86_64")]
unsafe fn weight_grad_image(
    xp: &[f32],
    gt: &[f32],
    shape: &GradShape,
    band: std::ops::Range<usize>,
    sums: &mut [f32],
    prefetch: &mut [Prefetch; 2],
) {
    // SAFETY: forwarded from the caller, who checked the level (and `kw ≤ 5` for AVX2).
    unsafe {
        if shape.avx512 {
            weight_grad_image_avx512(xp, gt, shape, band, sums, prefetch)
        } else {
            super::weight_grad_avx2::weight_grad_image_avx2(xp, gt, shape, band, sums, prefetch)
        }
    }
}

/// [`weight_grad_image`] on AVX-512.
///
/// # Safety
/// As [`weight_grad_image`], on AVX-512.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn weight_grad_image_avx512(
    xp: &[f32],
    gt: &[f32],
    shape: &GradShape,
    band: std::ops::Range<usize>,
    sums: &mut [f32],
    prefetch: &mut [Prefetch; 2],
) {
    macro_rules! by_width {
        ($($kw:literal)*) => {
            match shape.kw {
                // SAFETY: forwarded from the caller.
                $($kw => unsafe {
                    weight_grad_tiles::<$kw, { rows_per_tile($kw) }>(xp, gt, shape, band.clone(), sums, prefetch)
                },)*
                _ => unreachable!("filter rows of {} taps", shape.kw),
            }
        };
    }
    by_width!(1 2 3 4 5 6 7)
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn weight_grad_image(
    _: &[f32],
    _: &[f32],
    _: &GradShape,
    _: std::ops::Range<usize>,
    _: &mut [f32],
    _: &mut [Prefetch; 2],
) {
    unreachable!("the direct convolution runs only where `enabled` found AVX-512 or AVX2")
}

/// [`weight_grad_image`] for filter rows of `KW` taps, `R` rows a tile.
///
/// # Safety
/// As [`weight_grad_image`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn weight_grad_tiles<const KW: usize, const R: usize>(
    xp: &[f32],
    gt: &[f32],
    shape: &GradShape,
    band: std::ops::Range<usize>,
    sums: &mut [f32],
    prefetch: &mut [Prefetch; 2],
) {
    use std::arch::x86_64::*;
    let channels = shape.tiles * CO_TILE;
    let inner = shape.inner_pixels();
    let edges: Vec<usize> = (0..inner.start).chain(inner.end..shape.ow).collect();
    // SAFETY: (the whole body) every tap of every pixel stays in the padded image (a
    // stride-1 window: oh + kh − 1 = hp, ow + kw − 1 = wp), `gt` holds `band·ow·channels`
    // values and `sums` `tiles·row_tiles·R·KW·32`.
    unsafe {
        for y0 in band.clone().step_by(chunk_rows(shape.ow)) {
            let chunk = y0..(y0 + chunk_rows(shape.ow)).min(band.end);
            for t in 0..shape.tiles {
                for rt in 0..shape.row_tiles {
                    let s = sums
                        .as_mut_ptr()
                        .add((t * shape.row_tiles + rt) * R * KW * CO_TILE);
                    let mut acc = [[[_mm512_setzero_ps(); 2]; KW]; R];
                    for (r, row) in acc.iter_mut().enumerate() {
                        for (j, a) in row.iter_mut().enumerate() {
                            let p = s.add((r * KW + j) * CO_TILE);
                            *a = [_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))];
                        }
                    }
                    let offsets = &shape.row_offsets[rt * R..(rt + 1) * R];
                    prefetch.iter_mut().for_each(Prefetch::step);
                    let rows =
                        chunk.start.max(shape.reach[rt].start)..chunk.end.min(shape.reach[rt].end);
                    for y in rows {
                        let grow = gt
                            .as_ptr()
                            .add((y - band.start) * shape.ow * channels + t * CO_TILE);
                        let xrows: [*const f32; R] =
                            std::array::from_fn(|r| xp.as_ptr().add(offsets[r] + y * shape.wp));
                        let g = |xo: usize| {
                            let g = grow.add(xo * channels);
                            [_mm512_loadu_ps(g), _mm512_loadu_ps(g.add(16))]
                        };
                        for xo in inner.clone() {
                            grad_pixel::<KW, R, 0, 0>(&mut acc, g(xo), &xrows, xo);
                        }
                        for &xo in &edges {
                            macro_rules! skipping {
                                ($(($l:literal, $r:literal))*) => {
                                    match shape.edge_skips(xo) {
                                        (l, r) if l + r >= KW => {}
                                        $(($l, $r) => grad_pixel::<KW, R, $l, $r>(&mut acc, g(xo), &xrows, xo),)*
                                        // Wider edges multiply the padding's zeros.
                                        _ => grad_pixel::<KW, R, 0, 0>(&mut acc, g(xo), &xrows, xo),
                                    }
                                };
                            }
                            skipping!((1, 0)(2, 0)(3, 0)(0, 1)(0, 2)(0, 3));
                        }
                    }
                    for (r, row) in acc.iter().enumerate() {
                        for (j, a) in row.iter().enumerate() {
                            let p = s.add((r * KW + j) * CO_TILE);
                            _mm512_storeu_ps(p, a[0]);
                            _mm512_storeu_ps(p.add(16), a[1]);
                        }
                    }
                }
            }
        }
    }
}

/// One output pixel's gradient `g` (32 channels) times its input at taps `LEFT..KW − RIGHT`
/// of each filter row (the others read padding), into `acc`.
///
/// # Safety
/// The CPU has AVX-512F; `xrows[r] + xo + j` is inside the padded image for each tap `j`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn grad_pixel<const KW: usize, const R: usize, const LEFT: usize, const RIGHT: usize>(
    acc: &mut [[[std::arch::x86_64::__m512; 2]; KW]; R],
    g: [std::arch::x86_64::__m512; 2],
    xrows: &[*const f32; R],
    xo: usize,
) {
    use std::arch::x86_64::*;
    for (r, row) in acc.iter_mut().enumerate() {
        for (j, a) in row.iter_mut().enumerate().take(KW - RIGHT).skip(LEFT) {
            // SAFETY: the caller's guarantee.
            let v = _mm512_set1_ps(unsafe { *xrows[r].add(xo + j) });
            a[0] = _mm512_fmadd_ps(g[0], v, a[0]);
            a[1] = _mm512_fmadd_ps(g[1], v, a[1]);
        }
    }
}
