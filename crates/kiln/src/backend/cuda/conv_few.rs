//! kiln's kernel for convolutions with few output channels (1–3; kernels `conv_few*` in
//! `kernels/conv_few.cu`): stride 1, dilation 1, one group, a square filter of 3, 5 or 7.
//! The input gradient of an image network's first layer is one: for b256 1→32 28² 5×5 it is a
//! 32→1 convolution of the output gradient with 800 taps per pixel. cuDNN's kernels took
//! 0.06–0.09 ms for it on an H200 (the largest piece of that layer's step), and kiln's
//! tensor-core kernel computes 32 output channels to keep one. This kernel is plain
//! multiply-adds on the CUDA cores, a 4×4 patch of pixels per thread, every input row it
//! loads from shared memory used for each kernel row that reaches the patch.
//!
//! Measured on an H200 (2026-11-29, `bench/results/2026-11-29n-h200-conv-few`): that 32→1
//! gradient in 0.029–0.031 ms (f32 and bf16) against 0.049–0.065 for what ran before, which
//! took the layer's bf16 forward + backward from 0.158 to 0.096 ms. The b1 64→3 224² 3×3
//! gradient stays with cuDNN where it measures faster (0.021–0.038 against 0.035–0.050). Under
//! Nsight Compute the kernel uses half its issue slots and multiply-adds are a third of its
//! instructions: staging the input costs as much as the arithmetic, a lead for later.
//!
//! Which path runs is chosen per problem by measurement (`KILN_CONV_FEW=auto`, the default):
//! the first call of a problem times a few tilings against what would run otherwise (kiln's
//! other kernels or cuDNN, themselves chosen by measurement) and keeps the fastest. `=1`
//! forces this kernel wherever it applies, `=0` never uses it; [`set_conv_engine`] overrides
//! both (the GPU tests force it that way).
//!
//! [`set_conv_engine`]: super::set_conv_engine

use super::compile::KernelSource;
use super::conv_direct::{epilogue_args, packed, Epilogue};
use super::conv_mma::{choose_measured, Candidate, Choices, Family, Mode, Problem};
use super::cudnn::Direction;
use super::launch::{kernel_names, name_for};
use super::window::WindowArgs;
use super::{CudaDevice, CudaStorage};
use crate::layout::Layout;
use crate::op::Window2d;
use crate::{DType, Result};
use cudarc::driver::LaunchConfig;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Output channels the kernels compute at most (instantiated for 1 and 3).
pub(crate) const MAX_OUT: usize = 3;
/// Output rows and columns of a thread's patch; mirrors `FEW_RY` (the columns are 4).
const PATCH_ROWS: usize = 4;
const PATCH_COLS: usize = 4;
/// Column groups and row groups of a block at most (a tile of 32 × 32 pixels).
const MAX_GROUPS: usize = 8;
/// Threads a block at most: the kernels' launch bound.
const MAX_THREADS: usize = 256;
/// Input channels each group of threads takes from a staged chunk.
const CHANNELS_PER_GROUP: usize = 4;

const K3X1: [&str; 7] = kernel_names!("conv_few3x1");
const K3X3: [&str; 7] = kernel_names!("conv_few3x3");
const K5X1: [&str; 7] = kernel_names!("conv_few5x1");
const K5X3: [&str; 7] = kernel_names!("conv_few5x3");
const K7X1: [&str; 7] = kernel_names!("conv_few7x1");
const K7X3: [&str; 7] = kernel_names!("conv_few7x3");

fn mode() -> Mode {
    static MODE: OnceLock<Mode> = OnceLock::new();
    super::conv_mma::mode_of("KILN_CONV_FEW", &MODE)
}

/// Whether the kernels can compute this convolution of `c_out` output channels.
pub(crate) fn applies(dtype: DType, win: &Window2d, groups: usize, c_out: usize) -> bool {
    let fits_i32 = |v: usize| v < i32::MAX as usize / 4;
    let [oh, ow] = win.out_hw();
    let k = win.kernel[0];
    mode() != Mode::Never
        && groups == 1
        && dtype.is_float()
        && (1..=MAX_OUT).contains(&c_out)
        && win.kernel == [k, k]
        && matches!(k, 3 | 5 | 7)
        && win.stride == [1, 1]
        && win.dilation == [1, 1]
        && [win.c, win.h, win.w, win.padding[0], win.padding[1]]
            .into_iter()
            .all(fits_i32)
        // Every block index (n × tiles of at least one pixel) is 32-bit.
        && win.n.checked_mul(oh * ow).is_some_and(fits_i32)
}

/// One launch shape: a block computes `4·rgy` output rows by `4·cgx` columns of one image
/// with `split` groups of `cgx·rgy` threads, staging `ck` input channels at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    cgx: usize,
    rgy: usize,
    split: usize,
    ck: usize,
    pitch: usize,
    smem: usize,
}

impl Plan {
    /// The plan of a `cgx × rgy` tile and `split` groups for this problem, `None` where the
    /// block would not fit the device.
    fn new(
        dev: &CudaDevice,
        dtype: DType,
        win: &Window2d,
        c_out: usize,
        [cgx, rgy, split]: [usize; 3],
    ) -> Option<Plan> {
        let k = win.kernel[0];
        // f64 accumulates (and stages) in f64, the rest in f32.
        let elem = if dtype == DType::F64 { 8 } else { 4 };
        let co = if c_out == 1 { 1 } else { MAX_OUT };
        // A thread's window loads: 4 + k − 1 values rounded up to whole 16-byte quads.
        let window = (PATCH_COLS + k - 1).next_multiple_of(4);
        let pitch = PATCH_COLS * cgx + window - 4;
        let rows = PATCH_ROWS * rgy + k - 1;
        let ck = (split * CHANNELS_PER_GROUP).min(win.c.next_multiple_of(split));
        let stage = ck * rows * pitch + ck * (k * k * co).next_multiple_of(4);
        let group = cgx * rgy;
        let partials = (split - 1) * co * PATCH_ROWS * PATCH_COLS * group;
        let smem = stage.max(partials) * elem;
        let threads = group * split;
        (threads <= MAX_THREADS && smem <= dev.info.max_shared_per_block).then_some(Plan {
            cgx,
            rgy,
            split,
            ck,
            pitch,
            smem,
        })
    }

    fn threads(&self) -> usize {
        self.cgx * self.rgy * self.split
    }

    /// Blocks of the launch: tiles of every image.
    fn blocks(&self, win: &Window2d) -> usize {
        let [oh, ow] = win.out_hw();
        win.n * oh.div_ceil(PATCH_ROWS * self.rgy) * ow.div_ceil(PATCH_COLS * self.cgx)
    }

    fn kernel(dtype: DType, k: usize, c_out: usize) -> &'static str {
        let table = match (k, c_out == 1) {
            (3, true) => &K3X1,
            (3, false) => &K3X3,
            (5, true) => &K5X1,
            (5, false) => &K5X3,
            (7, true) => &K7X1,
            _ => &K7X3,
        };
        name_for(table, dtype)
    }
}

impl Candidate for Plan {
    /// "tile 28×28, 4 groups".
    fn describe(&self) -> String {
        format!(
            "tile {}×{}, {} groups",
            PATCH_ROWS * self.rgy,
            PATCH_COLS * self.cgx,
            self.split
        )
    }
}

/// The split a test forces ([`force_conv_few_split`]), 0 for none.
static FORCED_SPLIT: AtomicUsize = AtomicUsize::new(0);

/// Restricts kiln's few-output-channel convolution to plans of `split` groups of threads
/// (each taking every `split`-th input channel), for tests that must run each; `None`
/// measures them all (the default).
///
/// ```no_run
/// kiln::cuda::force_conv_few_split(Some(4));
/// ```
#[doc(hidden)]
pub fn force_conv_few_split(split: Option<usize>) {
    FORCED_SPLIT.store(split.unwrap_or(0), Ordering::Relaxed);
}

/// The plans to measure, the model's pick first: the widest tile up to 32 × 32 pixels, then
/// one of half its rows (more blocks for few images), each with 1–8 groups of threads
/// (blocks of up to 256 threads), the pick the one nearest 256 threads.
fn candidates(dev: &CudaDevice, dtype: DType, win: &Window2d, c_out: usize) -> Vec<Plan> {
    let [oh, ow] = win.out_hw();
    let cgx = ow.div_ceil(PATCH_COLS).min(MAX_GROUPS);
    let full = oh.div_ceil(PATCH_ROWS).min(MAX_GROUPS);
    let mut tiles = vec![full];
    if full > 1 {
        tiles.push(full.div_ceil(2));
    }
    let forced = FORCED_SPLIT.load(Ordering::Relaxed);
    let mut plans: Vec<Plan> = tiles
        .into_iter()
        .flat_map(|rgy| [1, 2, 4, 8].map(|split| [cgx, rgy, split]))
        .filter(|&[_, _, split]| (forced == 0 || split == forced) && (split == 1 || split <= win.c))
        .filter_map(|shape| Plan::new(dev, dtype, win, c_out, shape))
        .collect();
    // The pick: the full tile with the block nearest the most threads.
    if let Some(best) = plans
        .iter()
        .enumerate()
        .filter(|(_, p)| p.rgy == full)
        .min_by_key(|(_, p)| p.threads().abs_diff(MAX_THREADS))
        .map(|(i, _)| i)
    {
        let pick = plans.remove(best);
        plans.insert(0, pick);
    }
    plans
}

const FAMILY: Family = Family {
    label: "few",
    saved_kind: "conv-few",
    fallback: "other",
};

/// The plan to run this problem with, or `None` for `other` (what would run without this
/// kernel: kiln's other kernels or cuDNN). In `auto` mode the first call of a problem times
/// the candidate plans and `other` on the call's operands and remembers the fastest.
pub(crate) fn choose(
    x: &CudaStorage,
    l: &Layout,
    d: Direction,
    win: &Window2d,
    c_out: usize,
    run: &mut dyn FnMut(&Plan) -> Result<CudaStorage>,
    other: &mut dyn FnMut() -> Result<Option<CudaStorage>>,
) -> Result<Option<Plan>> {
    static CHOICES: Choices<Option<Plan>> = OnceLock::new();
    let problem = Problem {
        x,
        l,
        d,
        win,
        c_out,
    };
    let plans = || candidates(x.dev(), x.dtype, win, c_out);
    choose_measured(&FAMILY, &CHOICES, mode(), &problem, plans, run, other)
}

static LAUNCHES: AtomicU64 = AtomicU64::new(0);

/// How many convolutions (forward or input gradient) kiln's few-output-channel kernel has
/// computed in this process, timing runs included: for tests that need to know which path
/// ran.
pub fn conv_few_launches() -> u64 {
    LAUNCHES.load(Ordering::Relaxed)
}

/// `y = conv(x, w)` (then `epilogue`), packed `[n, c_out, oh, ow]`, for `x` at `l` (any
/// strides) and the filter `w` at `wl` (`[c_out, c, k, k]`; with `flip`, the
/// `[c, c_out, k, k]` filter of the forward convolution whose input gradient this is). The
/// caller has checked [`applies`] and made `plan` for this problem.
#[allow(clippy::too_many_arguments)]
pub(crate) fn conv(
    x: &CudaStorage,
    l: &Layout,
    w: &CudaStorage,
    wl: &Layout,
    win: &Window2d,
    c_out: usize,
    flip: bool,
    epilogue: Epilogue<'_>,
    plan: &Plan,
) -> Result<CudaStorage> {
    let dev = x.dev();
    let [oh, ow] = win.out_hw();
    let name = Plan::kernel(x.dtype, win.kernel[0], c_out);
    if plan.smem > 48 * 1024 {
        super::conv_mma::allow_shared_memory(dev, KernelSource::ConvFew, name)?;
    }
    let y = CudaStorage::alloc(dev, win.n * c_out * oh * ow, x.dtype)?;
    let (_w_copy, w_ptr) = packed(w, wl)?;
    let (_b_copy, bias_ptr, relu) = epilogue_args(epilogue)?;
    let cfg = LaunchConfig {
        grid_dim: (plan.blocks(win) as u32, 1, 1),
        block_dim: (plan.threads() as u32, 1, 1),
        shared_mem_bytes: plan.smem as u32,
    };
    let args = WindowArgs::new(win, l);
    // SAFETY: `x` holds every element its layout indexes (layout invariant; `args` carries its
    // strides and offset); `w_ptr` is the packed filter of c_out·c·k·k elements; `bias_ptr`
    // null or `c_out` packed elements (the caller checked the bias shape); `y` holds
    // n·c_out·oh·ow elements. The grid is one block per tile (`Plan::blocks`, < 2³¹ by
    // `applies`), the block `cgx·rgy·split` ≤ 256 threads (the launch bound) with the dynamic shared memory the
    // plan sized (within the opt-in above); the arguments match `conv_few<k>x<co>_<T>`'s
    // (x, w, y, Win, c_out, flip, bias, relu, cgx, rgy, split, ck, pitch).
    unsafe {
        dev.call(
            KernelSource::ConvFew,
            name,
            cfg,
            &mut [
                &mut { x.buf.ptr },
                &mut { w_ptr },
                &mut { y.buf.ptr },
                &mut { args },
                &mut { c_out as i32 },
                &mut { i32::from(flip) },
                &mut { bias_ptr },
                &mut { relu },
                &mut { plan.cgx as i32 },
                &mut { plan.rgy as i32 },
                &mut { plan.split as i32 },
                &mut { plan.ck as i32 },
                &mut { plan.pitch as i32 },
            ],
        )
    }?;
    LAUNCHES.fetch_add(1, Ordering::Relaxed);
    Ok(y)
}
