//! Winograd convolutions for f32 on AVX-512: F(4×4, 3×3) and F(2×2, 5×5), both over 6×6
//! input tiles (the points 0, ±1, ±2 and ∞).
//!
//! Each image's input is copied once into a zero-padded channel-last scratch
//! (`[hp][wp][cp]`, channels padded to a multiple of 16), so that one tile position of 16
//! channels is one vector. For each block of tiles: the input transform `Bᵀ d B` of every
//! tile (`V[ξ][tile][c]`, 36 positions ξ), 36 products `M[ξ] = V[ξ] · U[ξ]` with the weight
//! transformed once a call (`U[c][ξ][k] = (G g Gᵀ)[ξ]`, in f64), and the output transform
//! `Aᵀ M A` (with bias and ReLU) into a channel-last copy of the image's output, transposed
//! into NCHW at the end of the image. The blocks are small enough that `V` and `M` stay in
//! the core's L2 cache.
//!
//! A 3×3 layer does 36 multiply-adds for 16 outputs per channel pair instead of 144, a 5×5
//! layer 36 for 4 instead of 100: 4× and 2.8× fewer. The transforms' rounding costs about
//! ten times the direct kernel's error: 0.9–1.5e-6 relative (norm of the error over the
//! norm of the result, f32 against f64; the test below prints each case's) where the direct
//! kernel's is about 1.3e-7 (a NumPy model of both, 32→64 channels at 28²), inside f32's
//! 1e-5 tolerance.
//!
//! Measured on the 2-core Zen 4 EPYC (`kiln bench run --device cpu --suite conv`, two
//! threads): b32 32→64 28² 3×3 forward 4.26 → 1.70–1.90 ms, b256 32→64 14² 5×5 19.8 →
//! 12.3–12.5 ms. Half of the time is still the transforms and the two transposes: the
//! products alone would take 1.0 and 8.0 ms at the FMA peak.
//!
//! It applies to stride-1, undilated, ungrouped 3×3 and 5×5 layers with at least 16 input
//! and output channels and at least as many images as threads (a batch of one goes to the
//! direct kernel, which shares an image's rows). `KILN_CPU_CONV=direct` turns it off, for
//! A/B runs and tests; `unfold` turns off the direct kernels too (both read in `conv_direct`).

// The kernels are x86-64 code: elsewhere `runs_here` is false and the plan goes unused.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

use super::chunked::for_each_chunk_mut;
use super::conv::images_per_task;
#[cfg(target_arch = "x86_64")]
use super::simd::transpose::transpose_tile_part;
use super::threads::num_threads;
use crate::layout::Layout;
use crate::op::Window2d;

/// Input tile side (output tile side + kernel side − 1).
const ALPHA: usize = 6;
/// Positions of a transformed tile.
const XI: usize = ALPHA * ALPHA;
/// f32 lanes of a vector.
const LANES: usize = 16;
/// Tiles per register block of the products (12 × 32 channels: 24 accumulators).
const ROWS: usize = 12;
/// Bytes of one block's transformed input and products, at most (L2 is 1 MB a core on the
/// Zen 4 host).
const BLOCK_BYTES: usize = 384 << 10;
/// The finite interpolation points (∞ is the sixth).
const POINTS: [f64; 5] = [0.0, 1.0, -1.0, 2.0, -2.0];

/// Whether the Winograd kernels run on this CPU: AVX-512. (`KILN_CPU_CONV` is read by the
/// direct path, which calls [`forward`].)
fn runs_here() -> bool {
    cfg!(target_arch = "x86_64") && super::simd::simd_level() == super::simd::SimdLevel::Avx512
}

/// One call's shape in the kernels' terms.
struct Plan {
    /// Kernel side (3 or 5).
    r: usize,
    /// Input channels, and padded to whole vectors.
    c: usize,
    cp: usize,
    /// Output channels, and padded to whole vectors.
    k: usize,
    kp: usize,
    /// Tiles down and across an image.
    th: usize,
    tw: usize,
    /// The channel-last scratch's rows and columns: every tile's input, padding included.
    hp: usize,
    wp: usize,
    ph: usize,
    pw: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    /// Tiles per block, a multiple of 4.
    block: usize,
}

impl Plan {
    /// The plan for a layer, or `None` where Winograd does not apply (see the module docs).
    fn new(win: &Window2d, groups: usize, c_out: usize) -> Option<Plan> {
        let [oh, ow] = win.out_hw();
        if !matches!(win.kernel, [3, 3] | [5, 5]) {
            return None;
        }
        let r = win.kernel[0];
        let m = ALPHA + 1 - r;
        let fits = groups == 1
            && win.stride == [1, 1]
            && win.dilation == [1, 1]
            && win.c >= LANES
            && c_out >= LANES
            && oh >= m
            && ow >= m
            && win.n >= num_threads().max(1);
        if !fits {
            return None;
        }
        let (cp, kp) = (win.c.next_multiple_of(LANES), c_out.next_multiple_of(LANES));
        let (th, tw) = (oh.div_ceil(m), ow.div_ceil(m));
        let tiles = th * tw;
        let fit = BLOCK_BYTES / (XI * (cp + kp) * 4);
        // A multiple of 4: the products run a last partial block of rows as whole blocks of
        // 4 (the rows past its tiles hold stale values whose products are never read).
        let block = tiles.next_multiple_of(4).min(fit.max(ROWS) / ROWS * ROWS);
        Some(Plan {
            r,
            c: win.c,
            cp,
            k: c_out,
            kp,
            th,
            tw,
            hp: (th - 1) * m + ALPHA,
            wp: (tw - 1) * m + ALPHA,
            ph: win.padding[0],
            pw: win.padding[1],
            h: win.h,
            w: win.w,
            oh,
            ow,
            block,
        })
    }

    /// Output tile side: 4 for 3×3, 2 for 5×5.
    fn m(&self) -> usize {
        ALPHA + 1 - self.r
    }

    fn tiles(&self) -> usize {
        self.th * self.tw
    }

    /// Elements from one position's transformed input to the next's: a block of rows and
    /// one cache line more, so that a tile's 36 positions do not fall in a few sets of the
    /// L1 cache (24 tiles × 32 channels is 3 KB: 4 sets; the products' 6 KB, 2 sets).
    fn v_stride(&self) -> usize {
        self.block * self.cp + LANES
    }

    /// The same for the products.
    fn m_stride(&self) -> usize {
        self.block * self.kp + LANES
    }

    /// Elements from one input channel's transformed weights (`[ξ][kp]`) to the next's, a
    /// cache line more than they hold, for the same reason.
    fn u_stride(&self) -> usize {
        XI * self.kp + LANES
    }
}

/// One task's buffers, reused for its images.
struct Scratch<'a> {
    /// `[hp][wp][cp]`: the padded image, channel-last; the padding stays zero.
    hwc: &'a mut [f32],
    /// `[ξ][block][cp]` (ξ [`Plan::v_stride`] apart): a block's transformed input.
    v: &'a mut [f32],
    /// `[ξ][block][kp]` (ξ [`Plan::m_stride`] apart): a block's products.
    m: &'a mut [f32],
    /// `[oh·ow][kp]`: the image's output, channel-last.
    stage: &'a mut [f32],
}

/// Scratch up to this many floats is kept by each thread for its next call: allocated and
/// zeroed for each task, it cost page faults and memsets of 0.6 MB a task (32→64 channels
/// at 28²).
const KEPT_SCRATCH: usize = 1 << 20;

thread_local! {
    static KEPT: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` with scratch for `p`, the thread's kept buffer where it is free and large
/// enough to keep. Only the padded image is zeroed: the kernels read no other element
/// before writing it.
fn with_scratch(p: &Plan, f: impl FnOnce(Scratch)) {
    let lens = [
        p.hp * p.wp * p.cp,
        XI * p.v_stride(),
        XI * p.m_stride(),
        p.oh * p.ow * p.kp,
    ];
    let total: usize = lens.iter().sum();
    fn run(buf: &mut [f32], lens: [usize; 4], f: impl FnOnce(Scratch)) {
        let (hwc, rest) = buf.split_at_mut(lens[0]);
        let (v, rest) = rest.split_at_mut(lens[1]);
        let (m, rest) = rest.split_at_mut(lens[2]);
        hwc.fill(0.0);
        f(Scratch {
            hwc,
            v,
            m,
            stage: &mut rest[..lens[3]],
        })
    }
    KEPT.with(|kept| match kept.try_borrow_mut() {
        Ok(mut buf) if total <= KEPT_SCRATCH => {
            if buf.len() < total {
                buf.resize(total, 0.0);
            }
            run(&mut buf, lens, f)
        }
        _ => run(&mut vec![0f32; total], lens, f),
    })
}

/// `y = act(conv(x, w) + bias)` (`[n, c_out, oh, ow]`, contiguous) by Winograd, or `None`
/// where it does not apply (see the module docs). `w` is contiguous.
#[allow(clippy::too_many_arguments)]
pub(super) fn forward(
    x: &[f32],
    xl: &Layout,
    w: &[f32],
    win: &Window2d,
    groups: usize,
    c_out: usize,
    bias: Option<&[f32]>,
    relu: bool,
) -> Option<Vec<f32>> {
    if !runs_here() {
        return None;
    }
    let plan = Plan::new(win, groups, c_out)?;
    let u = transform_weights(w, &plan);
    let mut bias_padded = vec![0f32; plan.kp];
    if let Some(b) = bias {
        bias_padded[..c_out].copy_from_slice(&b[..c_out]);
    }
    let per_image = c_out * plan.oh * plan.ow;
    let mut out = super::host_memory::with_capacity_huge::<f32>(win.n * per_image);
    let spare = &mut out.spare_capacity_mut()[..win.n * per_image];
    let run = images_per_task(win.n);
    for_each_chunk_mut(spare, run * per_image, |r, images| {
        with_scratch(&plan, |mut scratch| {
            for (i, y) in images.chunks_mut(per_image).enumerate() {
                let image = Image {
                    plan: &plan,
                    x,
                    xl,
                    b: r * run + i,
                    u: &u,
                    bias: &bias_padded,
                    relu,
                };
                // SAFETY: `enabled` found AVX-512; `y` is image b's `c_out·oh·ow` outputs, which
                // only this task writes; the scratch and `u` were made for `plan`.
                unsafe { image.run(&mut scratch, y.as_mut_ptr().cast()) };
            }
        });
    });
    // SAFETY: `Image::run` writes every (channel, pixel) of its image (`store_nchw`), and
    // the chunks cover every image.
    unsafe { out.set_len(win.n * per_image) };
    Some(out)
}

/// The rows of `G` (6 × r) for kernel side `r`: row j is `(1, p, p², …) / Π (p − q)` over the
/// other finite points q, the last row picks the kernel's last tap.
fn g_matrix(r: usize) -> [[f64; 5]; ALPHA] {
    let mut g = [[0.0; 5]; ALPHA];
    for (j, &p) in POINTS.iter().enumerate() {
        let f: f64 = POINTS.iter().filter(|&&q| q != p).map(|q| p - q).product();
        for (k, v) in g[j].iter_mut().take(r).enumerate() {
            *v = p.powi(k as i32) / f;
        }
    }
    g[ALPHA - 1][r - 1] = 1.0;
    g
}

/// `U[c][ξ][k] = (G g_{k,c} Gᵀ)[ξ]` in f64, rounded once (input channels
/// [`Plan::u_stride`] apart); channels past `c`/`k` zero. Input channel by input channel,
/// the output channels innermost (vectorised), the channels shared between threads: written
/// per (k, c) pair with scalar sums on one thread, this took 0.33–0.50 ms of a 2.9 ms call
/// (32→64 channels, 3×3, batch 32); vectorised, 0.11 ms.
fn transform_weights(w: &[f32], p: &Plan) -> Vec<f32> {
    let g = g_matrix(p.r);
    let (r, k) = (p.r, p.k);
    let rr = r * r;
    let mut u = vec![0f32; p.cp * p.u_stride()];
    for_each_chunk_mut(&mut u, p.u_stride(), |c, u_c| {
        if c >= p.c {
            return;
        }
        // The channel's taps `[tap][k]`, `G · taps` `[a][j][k]`, one position's sums.
        let mut taps = vec![0f64; rr * k];
        let mut t = vec![0f64; ALPHA * r * k];
        let mut sum = vec![0f64; k];
        for (o, kernel) in w.chunks_exact(p.c * rr).enumerate() {
            for (q, &v) in kernel[c * rr..(c + 1) * rr].iter().enumerate() {
                taps[q * k + o] = v as f64;
            }
        }
        for a in 0..ALPHA {
            for j in 0..r {
                let dst = &mut t[(a * r + j) * k..][..k];
                for (i, &gi) in g[a][..r].iter().enumerate().filter(|(_, g)| **g != 0.0) {
                    for (d, s) in dst.iter_mut().zip(&taps[(i * r + j) * k..][..k]) {
                        *d += gi * s;
                    }
                }
            }
        }
        for a in 0..ALPHA {
            for b in 0..ALPHA {
                sum.fill(0.0);
                for (j, &gj) in g[b][..r].iter().enumerate().filter(|(_, g)| **g != 0.0) {
                    for (d, s) in sum.iter_mut().zip(&t[(a * r + j) * k..][..k]) {
                        *d += gj * s;
                    }
                }
                let dst = &mut u_c[(a * ALPHA + b) * p.kp..][..k];
                for (d, s) in dst.iter_mut().zip(&sum) {
                    *d = *s as f32;
                }
            }
        }
    });
    u
}

/// One image of one call.
struct Image<'a> {
    plan: &'a Plan,
    x: &'a [f32],
    xl: &'a Layout,
    b: usize,
    /// The transformed weight ([`transform_weights`]).
    u: &'a [f32],
    /// `kp` values (zeros without a bias).
    bias: &'a [f32],
    relu: bool,
}

impl Image<'_> {
    /// Writes the image's output at `out` (`k·oh·ow` elements, NCHW).
    ///
    /// # Safety
    /// The CPU has AVX-512F; `out` points at `k·oh·ow` writable elements; `s` was made for
    /// the plan.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn run(&self, s: &mut Scratch<'_>, out: *mut f32) {
        let p = self.plan;
        self.fill_hwc(s.hwc);
        let tiles = p.tiles();
        for t0 in (0..tiles).step_by(p.block) {
            let n = p.block.min(tiles - t0);
            // SAFETY: AVX-512F (this function's feature); the buffers have the plan's sizes
            // and the tiles t0..t0 + n exist.
            unsafe {
                input_transform(p, s.hwc, t0, n, s.v);
                for xi in 0..XI {
                    products(
                        p,
                        n,
                        &s.v[xi * p.v_stride()..],
                        &self.u[xi * p.kp..],
                        &mut s.m[xi * p.m_stride()..],
                    );
                }
                match p.m() {
                    4 => output_transform::<4>(p, s.m, t0, n, self.bias, self.relu, s.stage),
                    _ => output_transform::<2>(p, s.m, t0, n, self.bias, self.relu, s.stage),
                }
            }
        }
        // SAFETY: as above; `out` holds the image's k·oh·ow outputs (the caller).
        unsafe { store_nchw(p, s.stage, out) };
    }

    #[cfg(not(target_arch = "x86_64"))]
    unsafe fn run(&self, _: &mut Scratch<'_>, _: *mut f32) {
        unreachable!("Winograd runs only where `enabled` found AVX-512")
    }

    /// The image into the padded channel-last scratch (its padding stays zero: only the
    /// image's own positions and channels are written, the same ones for every image).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn fill_hwc(&self, hwc: &mut [f32]) {
        let p = self.plan;
        let s = self.xl.strides();
        let base = self.xl.offset() + self.b * s[0];
        let rows = p.h.min(p.hp.saturating_sub(p.ph));
        let cols = p.w.min(p.wp.saturating_sub(p.pw));
        for y in 0..rows {
            let dst_row = (y + p.ph) * p.wp + p.pw;
            if s[3] != 1 {
                for x in 0..cols {
                    for c in 0..p.c {
                        hwc[(dst_row + x) * p.cp + c] =
                            self.x[base + c * s[1] + y * s[2] + x * s[3]];
                    }
                }
                continue;
            }
            for c0 in (0..p.c).step_by(LANES) {
                for x0 in (0..cols).step_by(LANES) {
                    let (runs, len) = (LANES.min(p.c - c0), LANES.min(cols - x0));
                    let src = base + c0 * s[1] + y * s[2] + x0;
                    let dst = (dst_row + x0) * p.cp + c0;
                    // Reads channel c0 + i's run of `len` (i < runs), which lies in x: its
                    // last element is an element of the image.
                    assert!(src + (runs - 1) * s[1] + len <= self.x.len());
                    assert!(dst + (len - 1) * p.cp + runs <= hwc.len());
                    // SAFETY: both bounds checked above; AVX-512F.
                    unsafe {
                        transpose_tile_part(
                            self.x.as_ptr().add(src),
                            s[1],
                            runs,
                            len,
                            hwc.as_mut_ptr().add(dst),
                            p.cp,
                        )
                    };
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// `Bᵀ d` for the six values of one column (or row) of a tile.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn data_transform(d: [__m512; ALPHA]) -> [__m512; ALPHA] {
    // SAFETY: arithmetic on registers; the caller has AVX-512F.
    unsafe {
        let s = _mm512_set1_ps;
        let (d12, d34) = (_mm512_add_ps(d[1], d[2]), _mm512_add_ps(d[3], d[4]));
        let (d1m2, d4m3) = (_mm512_sub_ps(d[1], d[2]), _mm512_sub_ps(d[4], d[3]));
        let (d3m1, d4m2) = (_mm512_sub_ps(d[3], d[1]), _mm512_sub_ps(d[4], d[2]));
        [
            // 4·d0 − 5·d2 + d4
            _mm512_fmadd_ps(s(4.0), d[0], _mm512_fnmadd_ps(s(5.0), d[2], d[4])),
            // −4·(d1 + d2) + d3 + d4
            _mm512_fnmadd_ps(s(4.0), d12, d34),
            // 4·(d1 − d2) + d4 − d3
            _mm512_fmadd_ps(s(4.0), d1m2, d4m3),
            // 2·(d3 − d1) + d4 − d2
            _mm512_fmadd_ps(s(2.0), d3m1, d4m2),
            // −2·(d3 − d1) + d4 − d2
            _mm512_fnmadd_ps(s(2.0), d3m1, d4m2),
            // 4·d1 − 5·d3 + d5
            _mm512_fmadd_ps(s(4.0), d[1], _mm512_fnmadd_ps(s(5.0), d[3], d[5])),
        ]
    }
}

/// `Aᵀ s` for the six values of one column (or row) of a tile's products: `M` outputs.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn output_line<const M: usize>(s: [__m512; ALPHA]) -> [__m512; M] {
    // SAFETY: arithmetic on registers; the caller has AVX-512F.
    unsafe {
        let c = _mm512_set1_ps;
        let (s12, s34) = (_mm512_add_ps(s[1], s[2]), _mm512_add_ps(s[3], s[4]));
        let (s1m2, s3m4) = (_mm512_sub_ps(s[1], s[2]), _mm512_sub_ps(s[3], s[4]));
        let first = _mm512_add_ps(_mm512_add_ps(s[0], s12), s34);
        std::array::from_fn(|i| match (M, i) {
            (_, 0) => first,
            // F(2, 5): s1 − s2 + 2·(s3 − s4) + s5
            (2, _) => _mm512_add_ps(_mm512_fmadd_ps(c(2.0), s3m4, s1m2), s[5]),
            // F(4, 3)
            (_, 1) => _mm512_fmadd_ps(c(2.0), s3m4, s1m2),
            (_, 2) => _mm512_fmadd_ps(c(4.0), s34, s12),
            _ => _mm512_add_ps(_mm512_fmadd_ps(c(8.0), s3m4, s1m2), s[5]),
        })
    }
}

/// The transformed input of tiles `t0..t0 + n` into `v` (`[ξ][block][cp]`).
///
/// # Safety
/// The CPU has AVX-512F; the buffers have the plan's sizes; the tiles exist.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::needless_range_loop)] // the second pass reads the first's columns as rows
unsafe fn input_transform(p: &Plan, hwc: &[f32], t0: usize, n: usize, v: &mut [f32]) {
    assert!(hwc.len() >= p.hp * p.wp * p.cp && v.len() >= XI * p.v_stride());
    assert!(n <= p.block && t0 + n <= p.tiles());
    for li in 0..n {
        let (ty, tx) = ((t0 + li) / p.tw, (t0 + li) % p.tw);
        // The tile's corner: (ty·m, tx·m); its 6×6 positions lie inside [hp][wp].
        let corner = (ty * p.m() * p.wp + tx * p.m()) * p.cp;
        for cv in (0..p.cp).step_by(LANES) {
            let mut cols = [[_mm512_setzero_ps(); ALPHA]; ALPHA];
            for (j, col) in cols.iter_mut().enumerate() {
                // SAFETY: position (i, j) of the tile and channels cv..cv + 16 are inside
                // hwc (asserted sizes: the tile's rows and columns are < hp, wp; cv < cp).
                let d = std::array::from_fn(|i| unsafe {
                    _mm512_loadu_ps(hwc.as_ptr().add(corner + (i * p.wp + j) * p.cp + cv))
                });
                // SAFETY: AVX-512F.
                *col = unsafe { data_transform(d) };
            }
            for a in 0..ALPHA {
                // SAFETY: AVX-512F.
                let row = unsafe { data_transform(std::array::from_fn(|j| cols[j][a])) };
                for (b, value) in row.into_iter().enumerate() {
                    let at = (a * ALPHA + b) * p.v_stride() + li * p.cp + cv;
                    // SAFETY: ξ < 36, li < block, cv + 16 <= cp: inside v (asserted).
                    unsafe { _mm512_storeu_ps(v.as_mut_ptr().add(at), value) };
                }
            }
        }
    }
}

/// `m[t][k] = Σ_c v[t][c] · u[c][k]` for one position ξ: `n` tiles of `v` (`[block][cp]`),
/// `u` `[cp][kp]` (rows [`Plan::u_stride`] apart), `m` `[block][kp]`; rows up to the next multiple of 4 are computed too
/// (a single row's 2 accumulators wait on the multiply-add's latency: the 49th tile of a
/// 28² image alone took 3% of the kernel's time).
///
/// # Safety
/// The CPU has AVX-512F; the slices hold `n₄·cp`, `(cp − 1)·u_stride + kp` and `n₄·kp`
/// elements, `n₄` being
/// `n` rounded up to a multiple of 4.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn products(p: &Plan, n: usize, v: &[f32], u: &[f32], m: &mut [f32]) {
    let n = n.next_multiple_of(4);
    assert!(v.len() >= n * p.cp && u.len() >= (p.cp - 1) * p.u_stride() + p.kp);
    assert!(m.len() >= n * p.kp);
    let (v, u, m) = (v.as_ptr(), u.as_ptr(), m.as_mut_ptr());
    let mut k0 = 0;
    while k0 < p.kp {
        let wide = p.kp - k0 >= 2 * LANES;
        let mut t = 0;
        // SAFETY: every block below reads rows t.. of v, columns k0.. of u and writes rows
        // t.. of m, all inside the asserted sizes (t + rows <= n, k0 + 16·NV <= kp).
        unsafe {
            macro_rules! block {
                ($rows:literal) => {
                    while n - t >= $rows {
                        let (vt, mt) = (v.add(t * p.cp), m.add(t * p.kp + k0));
                        if wide {
                            product_block::<$rows, 2>(vt, p.cp, u.add(k0), p.u_stride(), mt, p.kp);
                        } else {
                            product_block::<$rows, 1>(vt, p.cp, u.add(k0), p.u_stride(), mt, p.kp);
                        }
                        t += $rows;
                    }
                };
            }
            block!(12);
            block!(4);
        }
        k0 += if wide { 2 * LANES } else { LANES };
    }
}

/// `R` rows × `NV` vectors of products in registers, over all `cp` input channels.
///
/// # Safety
/// The CPU has AVX-512F; `v` has `R` rows of `cp`, `u` `cp` rows `u_stride` apart (`16·NV`
/// read from each), `out` `R` rows `out_stride` apart (`16·NV` written to each).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn product_block<const R: usize, const NV: usize>(
    v: *const f32,
    cp: usize,
    u: *const f32,
    u_stride: usize,
    out: *mut f32,
    out_stride: usize,
) {
    // SAFETY: the caller's bounds and AVX-512F.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); NV]; R];
        for c in 0..cp {
            let w: [__m512; NV] =
                std::array::from_fn(|j| _mm512_loadu_ps(u.add(c * u_stride + 16 * j)));
            for (r, row) in acc.iter_mut().enumerate() {
                let x = _mm512_set1_ps(*v.add(r * cp + c));
                for (a, wj) in row.iter_mut().zip(w) {
                    *a = _mm512_fmadd_ps(x, wj, *a);
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            for (j, a) in row.iter().enumerate() {
                _mm512_storeu_ps(out.add(r * out_stride + 16 * j), *a);
            }
        }
    }
}

/// The outputs of tiles `t0..t0 + n` from their products (`m`, `[ξ][block][kp]`), with
/// bias and ReLU, into `stage` (`[oh·ow][kp]`); positions past the image are dropped.
///
/// # Safety
/// The CPU has AVX-512F; the buffers have the plan's sizes; the tiles exist.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::needless_range_loop)] // the second pass reads the first's columns as rows
unsafe fn output_transform<const M: usize>(
    p: &Plan,
    m: &[f32],
    t0: usize,
    n: usize,
    bias: &[f32],
    relu: bool,
    stage: &mut [f32],
) {
    assert!(m.len() >= XI * p.m_stride() && stage.len() >= p.oh * p.ow * p.kp);
    assert!(bias.len() >= p.kp && n <= p.block && t0 + n <= p.tiles());
    for li in 0..n {
        let (ty, tx) = ((t0 + li) / p.tw, (t0 + li) % p.tw);
        let (rows, cols) = (M.min(p.oh - ty * M), M.min(p.ow - tx * M));
        for kv in (0..p.kp).step_by(LANES) {
            // SAFETY: kv + 16 <= kp, inside bias (asserted).
            let b = unsafe { _mm512_loadu_ps(bias.as_ptr().add(kv)) };
            let mut cols_out = [[_mm512_setzero_ps(); M]; ALPHA];
            for (j, col) in cols_out.iter_mut().enumerate() {
                // SAFETY: ξ = i·6 + j < 36, li < block, kv + 16 <= kp: inside m.
                let s = std::array::from_fn(|i| unsafe {
                    _mm512_loadu_ps(
                        m.as_ptr()
                            .add((i * ALPHA + j) * p.m_stride() + li * p.kp + kv),
                    )
                });
                // SAFETY: AVX-512F.
                *col = unsafe { output_line::<M>(s) };
            }
            for i in 0..rows {
                // SAFETY: AVX-512F.
                let line = unsafe { output_line::<M>(std::array::from_fn(|j| cols_out[j][i])) };
                for (j, &value) in line.iter().enumerate().take(cols) {
                    let mut y = _mm512_add_ps(value, b);
                    if relu {
                        y = _mm512_max_ps(y, _mm512_setzero_ps());
                    }
                    let at = ((ty * M + i) * p.ow + tx * M + j) * p.kp + kv;
                    // SAFETY: the position (ty·M + i, tx·M + j) is inside oh × ow (rows,
                    // cols) and kv + 16 <= kp: inside stage (asserted).
                    unsafe { _mm512_storeu_ps(stage.as_mut_ptr().add(at), y) };
                }
            }
        }
    }
}

/// The channel-last output `stage` (`[oh·ow][kp]`) into NCHW at `out` (`[k][oh·ow]`).
///
/// # Safety
/// The CPU has AVX-512F; `out` points at `k·oh·ow` writable elements.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn store_nchw(p: &Plan, stage: &[f32], out: *mut f32) {
    let plane = p.oh * p.ow;
    assert!(stage.len() >= plane * p.kp);
    for p0 in (0..plane).step_by(LANES) {
        for k0 in (0..p.k).step_by(LANES) {
            let (runs, len) = (LANES.min(plane - p0), LANES.min(p.k - k0));
            // SAFETY: reads positions p0..p0 + runs, channels k0..k0 + len of stage; writes
            // channels k0..k0 + len, positions p0..p0 + runs of out (k·plane elements).
            unsafe {
                transpose_tile_part(
                    stage.as_ptr().add(p0 * p.kp + k0),
                    p.kp,
                    runs,
                    len,
                    out.add(k0 * plane + p0),
                    plane,
                )
            };
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// A direct f64 convolution (stride 1, no dilation, one group) of NCHW `x` with `w`.
    fn reference(
        x: &[f32],
        xd: [usize; 4],
        w: &[f32],
        k: usize,
        r: usize,
        pad: [usize; 2],
    ) -> Vec<f64> {
        let [n, c, h, wd] = xd;
        let (oh, ow) = (h + 2 * pad[0] + 1 - r, wd + 2 * pad[1] + 1 - r);
        let mut y = vec![0f64; n * k * oh * ow];
        for b in 0..n {
            for o in 0..k {
                for oy in 0..oh {
                    for ox in 0..ow {
                        let mut s = 0f64;
                        for ci in 0..c {
                            for i in 0..r {
                                for j in 0..r {
                                    let (iy, ix) = (
                                        (oy + i) as isize - pad[0] as isize,
                                        (ox + j) as isize - pad[1] as isize,
                                    );
                                    if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                                        continue;
                                    }
                                    let xv = x[((b * c + ci) * h + iy as usize) * wd + ix as usize]
                                        as f64;
                                    s += xv * w[((o * c + ci) * r + i) * r + j] as f64;
                                }
                            }
                        }
                        y[((b * k + o) * oh + oy) * ow + ox] = s;
                    }
                }
            }
        }
        y
    }

    /// Both tile sizes, with channel counts and image sides that leave partial vectors and
    /// partial tiles: the Winograd path runs (it returns `Some`) and matches f64 within
    /// f32's tolerance (norm of the error over the norm of the result).
    #[test]
    fn winograd_matches_a_direct_f64_convolution() {
        if !runs_here() {
            eprintln!("skipped: no AVX-512 (the Winograd kernels do not run here)");
            return;
        }
        let mut seed = 0x2545f491u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        };
        for (xd, k, r, pad) in [
            ([2, 16, 28, 28], 32, 3, [1, 1]),
            ([3, 17, 13, 11], 33, 3, [1, 1]),
            ([2, 20, 9, 10], 16, 5, [2, 1]),
            ([2, 32, 14, 14], 64, 5, [2, 2]),
            ([2, 16, 7, 23], 48, 3, [0, 2]),
        ] {
            // The path takes batches of at least one image a thread (16 on the GPU hosts'
            // Xeons): no fewer here, whatever the machine.
            let xd = [xd[0].max(num_threads()), xd[1], xd[2], xd[3]];
            let x: Vec<f32> = (0..xd.iter().product()).map(|_| next()).collect();
            let w: Vec<f32> = (0..k * xd[1] * r * r).map(|_| next()).collect();
            let win = Window2d {
                n: xd[0],
                c: xd[1],
                h: xd[2],
                w: xd[3],
                kernel: [r, r],
                stride: [1, 1],
                padding: pad,
                dilation: [1, 1],
            };
            let got = forward(&x, &Layout::contiguous(xd), &w, &win, 1, k, None, false)
                .expect("the Winograd path applies");
            let want = reference(&x, xd, &w, k, r, pad);
            let err: f64 = got
                .iter()
                .zip(&want)
                .map(|(g, w)| (*g as f64 - w).powi(2))
                .sum();
            let norm: f64 = want.iter().map(|w| w * w).sum();
            let rel = (err / norm).sqrt();
            eprintln!(
                "{xd:?} * [{k}, {}, {r}, {r}] pad {pad:?}: error {rel:.2e}",
                xd[1]
            );
            assert!(
                rel < 1e-5,
                "{xd:?} * [{k}, {}, {r}, {r}] pad {pad:?}: error {rel:.2e}",
                xd[1]
            );
        }
    }
}
