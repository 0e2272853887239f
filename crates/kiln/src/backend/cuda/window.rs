//! Sliding-window ops on CUDA (kernels in `kernels/window.cu`): im2col and col2im for
//! convolutions, max/avg pooling and its gradient. Operands are read through their strides.

use super::compile::KernelSource;
use super::cudnn::Direction;
use super::launch::{grid_1d, kernel_names, name_for};
use super::CudaStorage;
use super::{conv_direct, conv_few, conv_wgrad_mma};
use crate::backend::WindowStorage;
use crate::layout::Layout;
use crate::op::{PoolKind, Window2d};
use crate::{DType, Error, Result};

/// Mirrors `Win` in window.cu.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct WindowArgs {
    n: u64,
    c: u64,
    h: u64,
    w: u64,
    oh: u64,
    ow: u64,
    kh: i64,
    kw: i64,
    sh: i64,
    sw: i64,
    ph: i64,
    pw: i64,
    dh: i64,
    dw: i64,
    s: [u64; 4],
    offset: u64,
}

impl WindowArgs {
    /// The window with the strides and offset of `l` (the operand read through a layout).
    pub(super) fn new(win: &Window2d, l: &Layout) -> WindowArgs {
        let [oh, ow] = win.out_hw();
        let mut s = [0u64; 4];
        for (d, &st) in s.iter_mut().zip(l.strides()) {
            *d = st as u64;
        }
        WindowArgs {
            n: win.n as u64,
            c: win.c as u64,
            h: win.h as u64,
            w: win.w as u64,
            oh: oh as u64,
            ow: ow as u64,
            kh: win.kernel[0] as i64,
            kw: win.kernel[1] as i64,
            sh: win.stride[0] as i64,
            sw: win.stride[1] as i64,
            ph: win.padding[0] as i64,
            pw: win.padding[1] as i64,
            dh: win.dilation[0] as i64,
            dw: win.dilation[1] as i64,
            s,
            offset: l.offset() as u64,
        }
    }
}

const UNFOLD: [&str; 7] = kernel_names!("unfold");
const FOLD: [&str; 7] = kernel_names!("fold");
const POOL: [&str; 7] = kernel_names!("pool");
const POOL_BACKWARD: [&str; 7] = kernel_names!("pool_backward");
const POOL_BACKWARD_TILED: [&str; 7] = kernel_names!("pool_backward_tiled");
const POOL_TILED: [&str; 7] = kernel_names!("pool_tiled");
pub(super) const CONV_BIAS_ACT: [&str; 7] = kernel_names!("conv_bias_act");

/// Whether the windows of `win` tile its input exactly: kernel = stride, no padding, no
/// dilation, the input a whole number of windows (the 2×2/2 pool of most CNNs). The tiled
/// backward kernel then writes each window from its output element.
fn windows_tile_input(win: &Window2d) -> bool {
    let [oh, ow] = win.out_hw();
    win.kernel == win.stride
        && win.padding == [0, 0]
        && win.dilation == [1, 1]
        && win.h == oh * win.stride[0]
        && win.w == ow * win.stride[1]
}

/// The pooling kernels index a plane and its window with 32-bit integers (the positions of
/// the maxima are u32 already): larger planes are refused, not wrapped.
fn check_plane(win: &Window2d, op: &'static str) -> Result<()> {
    let limit = i32::MAX as usize / 4;
    let [oh, ow] = win.out_hw();
    let sizes = [win.h * win.w, oh * ow, win.kernel[0], win.kernel[1]];
    let window = [win.stride, win.padding].concat();
    if sizes.iter().chain(&window).all(|&v| v < limit) {
        Ok(())
    } else {
        Err(Error::Msg(format!(
            "{op} on CUDA: a {}×{} plane with window {:?} exceeds the kernels' 32-bit plane \
             indexing",
            win.h, win.w, win.kernel
        )))
    }
}

fn check_float(x: &CudaStorage, op: &'static str) -> Result<()> {
    if x.dtype.is_float() {
        Ok(())
    } else {
        Err(Error::UnsupportedDType { op, dtype: x.dtype })
    }
}

impl CudaStorage {
    /// im2col or col2im (kernel `table`): `self` read at `l`, a new `total`-element result.
    fn matrix_pass(
        &self,
        l: &Layout,
        win: &Window2d,
        table: &[&'static str; 7],
        op: &'static str,
        total: usize,
    ) -> Result<CudaStorage> {
        check_float(self, op)?;
        let out = CudaStorage::alloc(self.dev(), total, self.dtype)?;
        let args = WindowArgs::new(win, l);
        // SAFETY: `self` holds every element its layout indexes (layout invariant); `out`
        // holds `total` elements, the size `unfold_<T>`/`fold_<T>` write for `win`; the
        // arguments match both kernels' (input, output, Win).
        unsafe {
            self.dev().call(
                KernelSource::Window,
                name_for(table, self.dtype),
                grid_1d(self.dev(), total as u64),
                &mut [&mut { self.buf.ptr }, &mut { out.buf.ptr }, &mut { args }],
            )
        }?;
        Ok(out)
    }
}

impl WindowStorage for CudaStorage {
    fn unfold(&self, l: &Layout, win: &Window2d) -> Result<Self> {
        self.matrix_pass(
            l,
            win,
            &UNFOLD,
            "conv2d (unfold)",
            win.col_rows() * win.col_cols(),
        )
    }

    fn fold(&self, l: &Layout, win: &Window2d) -> Result<Self> {
        self.matrix_pass(
            l,
            win,
            &FOLD,
            "conv2d (fold)",
            win.n * win.c * win.h * win.w,
        )
    }

    fn pool(&self, l: &Layout, win: &Window2d, kind: PoolKind) -> Result<(Self, Option<Self>)> {
        check_float(self, kind.name())?;
        check_plane(win, kind.name())?;
        let total: usize = win.output_dims().iter().product();
        let out = CudaStorage::alloc(self.dev(), total, self.dtype)?;
        let ids = match kind {
            PoolKind::Max => Some(CudaStorage::alloc(self.dev(), total, DType::U32)?),
            PoolKind::Avg => None,
        };
        let ids_ptr = ids.as_ref().map_or(0, |i| i.buf.ptr);
        let is_max = i32::from(kind == PoolKind::Max);
        let table = if windows_tile_input(win) {
            &POOL_TILED
        } else {
            &POOL
        };
        let name = name_for(table, self.dtype);
        let args = WindowArgs::new(win, l);
        // SAFETY: `self` holds the input at `l`; `out` (and `ids` for max-pooling, the only
        // case the kernel writes them) hold n·c·oh·ow elements; matches `pool_<T>` and
        // `pool_tiled_<T>` (whose windows lie inside the input when `windows_tile_input`).
        unsafe {
            self.dev().call(
                KernelSource::Window,
                name,
                grid_1d(self.dev(), total as u64),
                &mut [
                    &mut { self.buf.ptr },
                    &mut { out.buf.ptr },
                    &mut { ids_ptr },
                    &mut { args },
                    &mut { is_max },
                ],
            )
        }?;
        Ok((out, ids))
    }

    fn pool_backward(
        &self,
        l: &Layout,
        argmax: Option<&Self>,
        win: &Window2d,
        kind: PoolKind,
    ) -> Result<Self> {
        check_float(self, kind.name())?;
        check_plane(win, kind.name())?;
        let ids_ptr = match (kind, argmax) {
            (PoolKind::Max, Some(i)) if i.dtype == DType::U32 => i.buf.ptr,
            (PoolKind::Max, _) => {
                return Err(Error::Msg(
                    "max_pool2d backward: the positions of the maxima (u32) are missing".into(),
                ))
            }
            (PoolKind::Avg, _) => 0,
        };
        let total = win.n * win.c * win.h * win.w;
        let out = CudaStorage::alloc(self.dev(), total, self.dtype)?;
        let is_max = i32::from(kind == PoolKind::Max);
        let (table, threads) = if windows_tile_input(win) {
            (
                &POOL_BACKWARD_TILED,
                win.output_dims().iter().product::<usize>(),
            )
        } else {
            (&POOL_BACKWARD, total)
        };
        let name = name_for(table, self.dtype);
        let args = WindowArgs::new(win, l);
        // SAFETY: `self` is the output gradient at `l`; the positions (read for max-pooling
        // only) are n·c·oh·ow contiguous u32; `out` holds n·c·h·w elements; matches
        // `pool_backward_<T>` and `pool_backward_tiled_<T>` (which writes every element of
        // `out` when `windows_tile_input`).
        unsafe {
            self.dev().call(
                KernelSource::Window,
                name,
                grid_1d(self.dev(), threads as u64),
                &mut [
                    &mut { self.buf.ptr },
                    &mut { ids_ptr },
                    &mut { out.buf.ptr },
                    &mut { args },
                    &mut { is_max },
                ],
            )
        }?;
        Ok(out)
    }

    fn conv2d(
        &self,
        l: &Layout,
        w: &Self,
        wl: &Layout,
        win: &Window2d,
        groups: usize,
    ) -> Result<Option<Self>> {
        let c_out = wl.dims()[0];
        let mut other = || self.conv2d_by_others(l, w, wl, win, groups);
        let few = self.few_out_chosen(l, w, wl, win, groups, c_out, false, None, &mut other)?;
        match few {
            Some(plan) => conv_few::conv(self, l, w, wl, win, c_out, false, None, &plan).map(Some),
            None => other(),
        }
    }

    fn conv2d_bias_act(
        &self,
        l: &Layout,
        w: &Self,
        wl: &Layout,
        b: &Self,
        bl: &Layout,
        win: &Window2d,
        groups: usize,
        relu: bool,
    ) -> Result<Option<Self>> {
        if self.dtype != w.dtype || self.dtype != b.dtype {
            return Ok(None);
        }
        let (c_out, epilogue) = (wl.dims()[0], Some((b, bl, relu)));
        let mut other = || self.conv2d_bias_act_by_others(l, w, wl, b, bl, win, groups, relu);
        let few = self.few_out_chosen(l, w, wl, win, groups, c_out, false, epilogue, &mut other)?;
        match few {
            Some(plan) => {
                conv_few::conv(self, l, w, wl, win, c_out, false, epilogue, &plan).map(Some)
            }
            None => other(),
        }
    }

    fn conv2d_backward_input(
        &self,
        l: &Layout,
        w: &Self,
        wl: &Layout,
        win: &Window2d,
        groups: usize,
    ) -> Result<Option<Self>> {
        // A stride-1 input gradient is a forward convolution of the output gradient with the
        // filter transposed and mirrored: into the forward's few input channels, kiln's
        // few-output-channel kernel where it measures fastest.
        let mut other = || self.backward_input_by_others(l, w, wl, win, groups);
        let Some(t) = win.input_gradient_window(wl.dims()[0]) else {
            return other();
        };
        let few = self.few_out_chosen(l, w, wl, &t, groups, win.c, true, None, &mut other)?;
        match few {
            Some(plan) => conv_few::conv(self, l, w, wl, &t, win.c, true, None, &plan).map(Some),
            None => other(),
        }
    }

    fn conv2d_backward_weight(
        &self,
        l: &Layout,
        g: &Self,
        gl: &Layout,
        win: &Window2d,
        groups: usize,
        weight_dims: [usize; 4],
    ) -> Result<Option<Self>> {
        if conv_direct::applies(self.dtype, win, groups) && self.dtype == g.dtype {
            let c_out = weight_dims[0];
            let mut direct = || conv_direct::weight_grad(self, l, g, gl, win, c_out);
            let mut library = || self.cudnn_backward_weight(l, g, gl, win, groups, weight_dims);
            let d = Direction::BackwardFilter;
            if conv_direct::prefer_direct(self, l, d, win, c_out, &mut direct, &mut library)? {
                return direct().map(Some);
            }
        }
        if let Some(plan) = self.wgrad_mma_plan(l, g, gl, win, groups, weight_dims)? {
            let c_out = weight_dims[0];
            let (dw, _) = conv_wgrad_mma::weight_grad(self, l, g, gl, win, c_out, &plan, false)?;
            return Ok(Some(dw));
        }
        self.cudnn_backward_weight(l, g, gl, win, groups, weight_dims)
    }

    fn conv2d_backward_weight_bias(
        &self,
        l: &Layout,
        g: &Self,
        gl: &Layout,
        win: &Window2d,
        groups: usize,
        weight_dims: [usize; 4],
    ) -> Result<Option<(Self, Self)>> {
        // Only where the weight gradient would run on kiln's tensor-core kernel anyway (the
        // same measured choice, remembered): its blocks sum the bias from the staged rows.
        // Problems of kiln's direct kernel keep the separate path.
        if conv_direct::applies(self.dtype, win, groups) {
            return Ok(None);
        }
        let Some(plan) = self.wgrad_mma_plan(l, g, gl, win, groups, weight_dims)? else {
            return Ok(None);
        };
        let c_out = weight_dims[0];
        let (dw, db) = conv_wgrad_mma::weight_grad(self, l, g, gl, win, c_out, &plan, true)?;
        Ok(db.map(|db| (dw, db)))
    }
}
