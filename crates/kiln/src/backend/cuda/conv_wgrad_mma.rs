//! kiln's weight gradient on tensor cores (kernels `conv_wgrad_mma*` in
//! `kernels/conv_wgrad_mma.cu`), in TF32 for f32 layers of at least 8 input channels with
//! filter rows of 2–7 taps, and for bf16 / f16 layers (exact in TF32: the same MMAs give
//! exact products summed in f32, as 16-bit MMAs would; the rows arrive in half the bytes and
//! are widened where f32's are rounded). b256 32→64 14² 5×5 bf16 on the H200, back to back:
//! 53.1 µs with the bias against cuDNN's 77.9 through PyTorch
//! (`bench/tools/conv_wgrad/wgrad16.cu`). cuDNN's engine for the CNN's second layer
//! (b256 32→64 14² 5×5) spends 79 µs on the H200, of which 24 go to layout passes and split-K launches around
//! its GEMM: the reduction is 50 176 pixels deep and the output only 64 × 800.
//!
//! The kernel reads NCHW as it lies: a block stages one unit (an image, or a band of its
//! output rows) of dy and the input rows it reads, by cp.async, double-buffered, and
//! multiplies them in registers with mma.sync, the pixels as the reduction; a warp owns
//! one filter row of 8 input channels against up to 64 output channels. The blocks'
//! sums leave as partials, which a second kernel adds in a fixed order (deterministic).
//! Where the layer has a bias that wants a gradient, the blocks also sum the staged output
//! gradient per channel in the pass that rounds it to TF32 (each channel group takes its
//! share of the channels), and the second kernel adds those sums too: the bias gradient
//! without a pass of its own over dy (two reduction launches before).
//!
//! Measured on the H200 (2026-11-29, `bench/tools/conv_wgrad`, b256 32→64 14² 5×5, back to
//! back): 0.0511 ms with the partials' sum and 0.0544 ms with the bias too (blocks of two
//! channel groups, whole images, one wave), against cuDNN's 0.083 and 0.104 ms through
//! PyTorch.
//!
//! It runs where it measures faster than cuDNN (`KILN_CONV_MMA`, like kiln's other
//! tensor-core convolutions: `auto` by default, `1` wherever it applies, `0` never).

use super::conv_mma::{choose_measured, Candidate, Choices, Family, Problem};
use super::cudnn::Direction;
use super::launch::{kernel_names, name_for};
use super::window::WindowArgs;
use super::{CudaDevice, CudaStorage};
use crate::layout::Layout;
use crate::op::Window2d;
use crate::{DType, Result};
use cudarc::driver::LaunchConfig;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// `conv_wgrad_mma{MT}x{SW}_{dtype}`: MT m16 tiles of output channels (2 or 4), SW ≥ kw
/// taps, per dtype.
const KERNELS: [[[&str; 7]; 3]; 2] = [
    [
        kernel_names!("conv_wgrad_mma2x3"),
        kernel_names!("conv_wgrad_mma2x5"),
        kernel_names!("conv_wgrad_mma2x7"),
    ],
    [
        kernel_names!("conv_wgrad_mma4x3"),
        kernel_names!("conv_wgrad_mma4x5"),
        kernel_names!("conv_wgrad_mma4x7"),
    ],
];
/// The partials' sum, writing the gradients in the dtype.
const SUM: [&str; 7] = kernel_names!("conv_wgrad_mma_sum");

fn kernel_name(mt: usize, sw: usize, dtype: DType) -> &'static str {
    name_for(&KERNELS[usize::from(mt == 4)][(sw - 3) / 2], dtype)
}

/// Mirrors `WGRAD_SUM_COLS`: lanes' float quads per block of the sum (256 threads).
const SUM_COLUMNS: usize = 32;
/// Mirrors `WGRAD_MMA_THREADS`: the kernels' launch bound.
const MAX_THREADS: usize = 320;

/// Mirrors `WgradMma` in conv_wgrad_mma.cu: the staging geometry.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct Geometry {
    bh: i32,
    dp: i32,
    xh: i32,
    xw: i32,
    xp: i32,
    col0: i32,
    pairs: i32,
    vec: i32,
}

/// Mirrors `WgradFrag`: how the partials hold the sums.
#[repr(C)]
#[derive(Clone, Copy)]
struct FragArgs {
    mt: i32,
    sw: i32,
    warps: i32,
    kh: i32,
    kw: i32,
    grid_y: i32,
    c: u64,
    c_out: u64,
}

/// One way to launch the kernel on a problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Groups of 8 input channels per block (a warp per group and filter row).
    groups: usize,
    /// Output rows per unit.
    band: usize,
    /// Blocks along the pixels (each adds its units into one partial).
    parts: usize,
}

impl Candidate for Plan {
    fn describe(&self) -> String {
        format!(
            "{} channels × {} rows × {} parts",
            8 * self.groups,
            self.band,
            self.parts
        )
    }
}

fn round_up_to_4_mod_8(v: usize) -> usize {
    v + (12 - v % 8) % 8
}

impl Geometry {
    /// The staging of `band` output rows, input rows copied in pairs or one by one.
    fn new(win: &Window2d, band: usize, pairs: bool, vec: bool) -> Geometry {
        let [_, ow] = win.out_hw();
        let [kh, kw] = win.kernel;
        let pixels = band * ow;
        let dp = round_up_to_4_mod_8(pixels.next_multiple_of(8));
        let xh = (band - 1) * win.stride[0] + kh;
        let pw = win.padding[1];
        let col0 = if pairs { pw.next_multiple_of(2) } else { pw };
        let xw = (col0 + win.w)
            .max(col0 - pw + (ow - 1) * win.stride[1] + kw)
            .next_multiple_of(2);
        let xp = round_up_to_4_mod_8(xh * xw);
        let i = |v: usize| v as i32;
        Geometry {
            bh: i(band),
            dp: i(dp),
            xh: i(xh),
            xw: i(xw),
            xp: i(xp),
            col0: i(col0),
            pairs: i32::from(pairs),
            vec: i32::from(vec),
        }
    }

    /// Dynamic shared memory of a block of `groups` channel groups, in bytes: two stages,
    /// the slack for taps past kw, the pixel offsets of a band and the bias sums.
    fn smem(&self, mt: usize, sw: usize, groups: usize) -> usize {
        let stage = 16 * mt * self.dp as usize + 8 * groups * self.xp as usize;
        let band_px = self.bh as usize * (self.xw as usize); // an upper bound on bh·ow
        let table = band_px.next_multiple_of(8) + 16;
        (2 * stage + sw + 8 + table + 16 * mt) * 4
    }
}

/// The m16 tiles of output channels (a block's tile is 32 or 64 channels) and the
/// accumulator tiles per filter row.
fn tiles(win: &Window2d, c_out: usize) -> (usize, usize) {
    let mt = if c_out <= 32 { 2 } else { 4 };
    let sw = match win.kernel[1] {
        0..=3 => 3,
        4..=5 => 5,
        _ => 7,
    };
    (mt, sw)
}

/// Whether the kernel computes this weight gradient: f32 with TF32 on, or bf16 / f16 (exact
/// in TF32) with even input and output widths (their rows are copied two elements at a time);
/// sm_80 on, one group, dilation 1, at least 8 input channels, filter rows of 2–7 taps, at
/// most 10 filter rows, and a stage of one output row within the shared memory a block may
/// have.
pub(crate) fn applies(dev: &CudaDevice, dtype: DType, win: &Window2d, groups: usize) -> bool {
    let fits_i32 = |v: usize| v < i32::MAX as usize / 8;
    let [kh, kw] = win.kernel;
    let [oh, ow] = win.out_hw();
    let dtype_fits = match dtype {
        DType::F32 => super::tf32_enabled(),
        DType::BF16 | DType::F16 => win.w.is_multiple_of(2) && ow.is_multiple_of(2),
        _ => false,
    };
    super::conv_mma::mode() != super::conv_mma::Mode::Never
        && dtype_fits
        && dev.info.compute_capability >= (8, 0)
        && groups == 1
        && win.dilation == [1, 1]
        && win.c >= 8
        && (2..=7).contains(&kw)
        && 32 * kh <= MAX_THREADS
        && oh * ow > 0
        && [win.h * win.w, oh * ow, win.c, win.n]
            .into_iter()
            .all(fits_i32)
        && stage_fits(dev, win, 1, 1)
}

/// Whether a block of `groups` channel groups holds the stages of `band` output rows (sized
/// for a 64-channel tile and input rows copied in pairs, the largest case).
fn stage_fits(dev: &CudaDevice, win: &Window2d, band: usize, groups: usize) -> bool {
    let (mt, sw) = tiles(win, 64);
    Geometry::new(win, band, true, true).smem(mt, sw, groups) <= dev.info.max_shared_per_block
}

/// The most output rows whose stages a block of `groups` channel groups holds.
fn largest_band(dev: &CudaDevice, win: &Window2d, groups: usize) -> Option<usize> {
    let [oh, _] = win.out_hw();
    (1..=oh)
        .rev()
        .find(|&band| stage_fits(dev, win, band, groups))
}

/// The candidate plans, the model's pick first: blocks of two channel groups (where the
/// layer has more than 8 input channels and the rows fit the launch bound) and of one, each
/// with the largest band it holds and one wave of blocks.
/// With a plan forced ([`force_conv_wgrad_mma_plan`]), that one alone, where it applies.
fn candidates(x: &CudaStorage, win: &Window2d, c_out: usize) -> Vec<Plan> {
    let dev = x.dev();
    let [oh, _] = win.out_hw();
    let (mt, sw) = tiles(win, c_out);
    if let Some([groups, band, parts]) = *FORCED_PLAN.lock().unwrap_or_else(|e| e.into_inner()) {
        let fits = (1..=oh).contains(&band)
            && (groups == 1 || (groups == 2 && win.c > 8))
            && 32 * win.kernel[0] * groups <= MAX_THREADS
            && stage_fits(dev, win, band, groups)
            && (1..=65_535).contains(&parts);
        return if fits {
            vec![Plan {
                groups,
                band,
                parts,
            }]
        } else {
            Vec::new()
        };
    }
    let mut plans = Vec::new();
    for groups in [2, 1] {
        if (groups > 1 && win.c <= 8) || 32 * win.kernel[0] * groups > MAX_THREADS {
            continue;
        }
        let Some(band) = largest_band(dev, win, groups) else {
            continue;
        };
        let smem = Geometry::new(win, band, true, true).smem(mt, sw, groups);
        let threads = 32 * win.kernel[0] * groups;
        let name = kernel_name(mt, sw, x.dtype);
        let resident =
            super::conv_mma::allow_shared_memory(dev, super::compile::KernelSource::ConvMma, name)
                .and_then(|()| super::conv_mma_filter::resident_blocks(dev, name, threads, smem))
                .unwrap_or(dev.info.multiprocessors);
        let blocks = win.c.div_ceil(8 * groups) * c_out.div_ceil(16 * mt);
        let units = win.n * oh.div_ceil(band);
        let parts = (resident / blocks).clamp(1, units.min(65_535));
        plans.push(Plan {
            groups,
            band,
            parts,
        });
    }
    plans
}

/// The plan a test forces ([`force_conv_wgrad_mma_plan`]): `[groups, band, parts]`.
static FORCED_PLAN: Mutex<Option<[usize; 3]>> = Mutex::new(None);

/// Makes kiln's tensor-core weight gradient run `groups` (1 or 2) groups of 8 input channels
/// a block, `band` output rows a unit and `parts` blocks along the pixels wherever that plan
/// fits the problem (and none where it does not), for tests that must reach plans the
/// measurement would not pick, such as blocks that walk bands of different heights; `None`
/// restores the measured plans (the default). With [`super::ConvEngine::Kiln`] forced, the
/// plan runs.
///
/// ```no_run
/// kiln::cuda::force_conv_wgrad_mma_plan(Some([2, 2, 3]));
/// ```
#[doc(hidden)]
pub fn force_conv_wgrad_mma_plan(plan: Option<[usize; 3]>) {
    *FORCED_PLAN.lock().unwrap_or_else(|e| e.into_inner()) = plan;
}

static LAUNCHES: AtomicU64 = AtomicU64::new(0);

/// How many weight gradients kiln's tensor-core kernel has computed in this process,
/// timing runs included: for tests and measurements that need to know which path ran.
pub fn conv_wgrad_mma_launches() -> u64 {
    LAUNCHES.load(Ordering::Relaxed)
}

/// The plan for this weight gradient (`x` at `l`), or `None` for the library: see
/// [`choose_measured`].
pub(crate) fn choose(
    x: &CudaStorage,
    l: &Layout,
    win: &Window2d,
    c_out: usize,
    run: &mut dyn FnMut(&Plan) -> Result<CudaStorage>,
    library: &mut dyn FnMut() -> Result<Option<CudaStorage>>,
) -> Result<Option<Plan>> {
    static CHOICES: Choices<Option<Plan>> = OnceLock::new();
    const FAMILY: Family = Family {
        label: "wgrad-mma",
        saved_kind: "conv-wgrad-mma",
        fallback: "cuDNN",
    };
    let problem = Problem {
        x,
        l,
        d: Direction::BackwardFilter,
        win,
        c_out,
    };
    let mode = super::conv_mma::mode();
    let plans = || candidates(x, win, c_out);
    choose_measured(&FAMILY, &CHOICES, mode, &problem, plans, run, library)
}

/// `dW` (`[c_out, c, kh, kw]`, packed) of the convolution of `x` at `l` (any strides) whose
/// output gradient is `dy` at `dyl`, by `plan`, and with `bias` also the bias gradient (`dy`
/// summed over images and pixels, `[c_out]`) from the same staged rows. The caller has
/// checked [`applies`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn weight_grad(
    x: &CudaStorage,
    l: &Layout,
    dy: &CudaStorage,
    dyl: &Layout,
    win: &Window2d,
    c_out: usize,
    plan: &Plan,
    bias: bool,
) -> Result<(CudaStorage, Option<CudaStorage>)> {
    let dev = x.dev();
    let [oh, ow] = win.out_hw();
    let [kh, kw] = win.kernel;
    let (mt, sw) = tiles(win, c_out);
    let dtype = x.dtype;
    let elem = dtype.size_in_bytes() as u64;
    let (mut dy_copy, mut dy_ptr) = super::conv_direct::packed(dy, dyl)?;
    // Input rows go two elements at a time where every row starts aligned to that.
    let pairs_fit = |l: &Layout, ptr: u64| {
        let s = l.strides();
        s[3] == 1
            && win.w.is_multiple_of(2)
            && s[..3].iter().all(|v| v.is_multiple_of(2))
            && ptr.is_multiple_of(2 * elem)
    };
    // The kernel reads x from `x_base` plus the layout's offset; `x_ptr` is its first element.
    let (mut x_base, mut x_ptr) = (x.buf.ptr, x.ptr_at(l.offset()));
    let (mut _x_copy, mut x_l) = (None, l.clone());
    if elem == 2 {
        // 16-bit rows are only copied two (input) or two to four (output gradient) elements
        // at a time: a view that does not allow it is packed into a fresh, aligned buffer.
        if !pairs_fit(l, x_ptr) {
            let c = super::elementwise::cast(x, l, dtype)?;
            (x_base, x_ptr, x_l) = (c.buf.ptr, c.buf.ptr, Layout::contiguous(l.shape().clone()));
            _x_copy = Some(c);
        }
        if !dy_ptr.is_multiple_of(4) {
            let c = super::elementwise::cast(dy, dyl, dtype)?;
            dy_ptr = c.buf.ptr;
            dy_copy = Some(c);
        }
    }
    let _dy_copy = dy_copy;
    let pairs = pairs_fit(&x_l, x_ptr);
    // Output-gradient rows go 4 elements at a time where every row starts aligned to that.
    let vec = dy_ptr.is_multiple_of(4 * elem)
        && (oh * ow).is_multiple_of(4)
        && (plan.band * ow).is_multiple_of(4);
    let geometry = Geometry::new(win, plan.band, pairs, vec);
    let smem = geometry.smem(mt, sw, plan.groups);
    let name = kernel_name(mt, sw, dtype);
    super::conv_mma::allow_shared_memory(dev, super::compile::KernelSource::ConvMma, name)?;
    let warps = kh * plan.groups;
    let (grid_y, grid_z) = (win.c.div_ceil(8 * plan.groups), c_out.div_ceil(16 * mt));
    let frags = grid_y * grid_z * warps * mt * sw * 128;
    let partial = CudaStorage::alloc(dev, plan.parts * frags, DType::F32)?;
    // The bias partials: a row of grid_z·16·mt sums per part, each written by the channel
    // group of its channel mod grid_y.
    let bias_cols = grid_z * 16 * mt;
    let bias_part = if bias {
        Some(CudaStorage::alloc(dev, plan.parts * bias_cols, DType::F32)?)
    } else {
        None
    };
    let bias_part_ptr = bias_part.as_ref().map_or(0, |b| b.buf.ptr);
    let args = WindowArgs::new(win, &x_l);
    let cfg = LaunchConfig {
        grid_dim: (plan.parts as u32, grid_y as u32, grid_z as u32),
        block_dim: (32 * warps as u32, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    // SAFETY: `x_base` (x, or its packed copy) holds every element `x_l` indexes (layout
    // invariant) and `dy_ptr` the packed `[n, c_out, oh, ow]` gradient; dy's rows start
    // aligned to `vec`'s copies (16 bytes, 8 for 16-bit) where `vec` says and x's rows to two
    // elements where `pairs` says (for 16-bit both hold or dy rows start 4-byte aligned: the
    // views were packed above, and `applies` asked for even widths); `partial` has
    // `parts × frags` floats, what the grid writes in fragment order, and `bias_part_ptr`
    // null or `parts × bias_cols` floats, what the blocks of the first channel group write;
    // the block has `kh·groups` warps (≤ the launch bound, `candidates` keeps it so) and the dynamic shared memory `Geometry::smem` sized for
    // the kernel's stages (within the opt-in allowed above); the arguments match
    // `conv_wgrad_mma{MT}x{SW}_{dtype}`'s (x, dy, partial, bias_part, Win, c_out, WgradMma).
    unsafe {
        dev.call(
            super::compile::KernelSource::ConvMma,
            name,
            cfg,
            &mut [
                &mut { x_base },
                &mut { dy_ptr },
                &mut { partial.buf.ptr },
                &mut { bias_part_ptr },
                &mut { args },
                &mut { c_out as u64 },
                &mut { geometry },
            ],
        )
    }?;
    let dw = CudaStorage::alloc(dev, c_out * win.c * kh * kw, dtype)?;
    let db = if bias {
        Some(CudaStorage::alloc(dev, c_out, dtype)?)
    } else {
        None
    };
    let db_ptr = db.as_ref().map_or(0, |b| b.buf.ptr);
    let frag_blocks = (frags / 4).div_ceil(SUM_COLUMNS);
    let bias_blocks = if bias {
        bias_cols.div_ceil(SUM_COLUMNS)
    } else {
        0
    };
    let i = |v: usize| v as i32;
    let f = FragArgs {
        mt: i(mt),
        sw: i(sw),
        warps: i(warps),
        kh: i(kh),
        kw: i(kw),
        grid_y: i(grid_y),
        c: win.c as u64,
        c_out: c_out as u64,
    };
    // SAFETY: `partial` holds `parts` runs of `frags` floats (a multiple of 4), `dw`
    // `c_out·c·kh·kw` elements of the dtype, every one written once by the lane that holds
    // it; with a bias, `bias_part_ptr` holds `parts` rows of `bias_cols` floats (written
    // above) and `db_ptr` `c_out` elements, and the grid has the bias blocks after the
    // fragments'; the arguments match `conv_wgrad_mma_sum_{dtype}`'s (partial, dw, frags,
    // parts, WgradFrag, bias_part, bias_out, bias_cols).
    unsafe {
        dev.call(
            super::compile::KernelSource::ConvMma,
            name_for(&SUM, dtype),
            LaunchConfig {
                grid_dim: ((frag_blocks + bias_blocks) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            },
            &mut [
                &mut { partial.buf.ptr },
                &mut { dw.buf.ptr },
                &mut { frags as u64 },
                &mut { plan.parts as u64 },
                &mut { f },
                &mut { bias_part_ptr },
                &mut { db_ptr },
                &mut { bias_cols as u64 },
            ],
        )
    }?;
    LAUNCHES.fetch_add(1, Ordering::Relaxed);
    Ok((dw, db))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pitches keep the kernel's bank patterns: dy rows ≡ 4 (mod 8) words (odd 16-byte
    /// units, for ldmatrix) and input planes ≡ 4 (mod 8) (8 channels × 4 pixels of a B load
    /// on distinct banks); the staged rows cover the image and every tap's reach.
    #[test]
    fn geometry_keeps_bank_patterns_and_covers_the_taps() {
        for (h, w, k, pad, stride) in [(14, 14, 5, 2, 1), (28, 28, 3, 1, 1), (15, 13, 3, 1, 2)] {
            let win = Window2d {
                n: 2,
                c: 16,
                h,
                w,
                kernel: [k, k],
                stride: [stride, stride],
                padding: [pad, pad],
                dilation: [1, 1],
            };
            let [oh, ow] = win.out_hw();
            for band in 1..=oh {
                for pairs in [false, true] {
                    let g = Geometry::new(&win, band, pairs, false);
                    assert_eq!(g.dp % 8, 4);
                    assert_eq!(g.xp % 8, 4);
                    assert!(g.dp as usize >= (band * ow).next_multiple_of(8));
                    assert!(g.xp >= g.xh * g.xw);
                    assert!(g.col0 as usize >= pad && (g.col0 % 2 == 0 || !pairs));
                    let right = g.col0 as usize - pad + (ow - 1) * stride + k - 1;
                    assert!(right < g.xw as usize && g.col0 as usize + w <= g.xw as usize);
                    assert_eq!(g.xh as usize, (band - 1) * stride + k);
                }
            }
        }
    }
}
