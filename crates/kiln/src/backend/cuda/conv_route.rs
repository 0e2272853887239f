//! Which kernel computes each convolution on CUDA: kiln's own (the few-output-channel,
//! direct and tensor-core kernels, each where it measured faster for the problem) or cuDNN,
//! and without cuDNN im2col + GEMM (the caller's fallback when these return `None`). The
//! `WindowStorage` methods in `window.rs` start here.

use super::compile::KernelSource;
use super::cudnn::{self, Direction, Operands};
use super::launch::{grid_1d, name_for};
use super::window::CONV_BIAS_ACT;
use super::CudaStorage;
use super::{conv_direct, conv_few, conv_mma, conv_wgrad_mma};
use crate::backend::{BackendStorage, WindowStorage};
use crate::layout::Layout;
use crate::op::Window2d;
use crate::{DType, Result};

impl CudaStorage {
    /// The plan of kiln's few-output-channel kernel for this convolution (`self` at `l`; with
    /// `flip`, the input gradient of the forward filter `w`), where it applies and measured
    /// faster than `other`, what runs otherwise (`conv_few::choose`, measured once).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn few_out_chosen(
        &self,
        l: &Layout,
        w: &Self,
        wl: &Layout,
        win: &Window2d,
        groups: usize,
        c_out: usize,
        flip: bool,
        epilogue: conv_direct::Epilogue<'_>,
        other: &mut dyn FnMut() -> Result<Option<Self>>,
    ) -> Result<Option<conv_few::Plan>> {
        if self.dtype != w.dtype || !conv_few::applies(self.dtype, win, groups, c_out) {
            return Ok(None);
        }
        let d = if flip {
            Direction::BackwardData
        } else {
            Direction::Forward
        };
        let mut run =
            |p: &conv_few::Plan| conv_few::conv(self, l, w, wl, win, c_out, flip, epilogue, p);
        conv_few::choose(self, l, d, win, c_out, &mut run, other)
    }

    /// The forward by kiln's direct or tensor-core kernel where measured faster, else cuDNN.
    pub(super) fn conv2d_by_others(
        &self,
        l: &Layout,
        w: &Self,
        wl: &Layout,
        win: &Window2d,
        groups: usize,
    ) -> Result<Option<Self>> {
        if self.direct_forward_chosen(l, w, wl, win, groups)? {
            return conv_direct::forward(self, l, w, wl, win, None).map(Some);
        }
        if let Some(plan) = self.mma_forward_chosen(l, w, wl, win, groups)? {
            let c_out = wl.dims()[0];
            return conv_mma::forward(self, l, w, wl, win, c_out, false, None, &plan).map(Some);
        }
        self.cudnn_forward(l, w, wl, win, groups)
    }

    /// The forward with its bias and ReLU by kiln's direct or tensor-core kernel where
    /// measured faster, else cuDNN and one pass over its output. The caller
    /// (`conv2d_bias_act`) has checked that the three operands share a dtype.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn conv2d_bias_act_by_others(
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
        // In the direct kernel's store, where it is the forward's measured choice.
        if self.direct_forward_chosen(l, w, wl, win, groups)? {
            return conv_direct::forward(self, l, w, wl, win, Some((b, bl, relu))).map(Some);
        }
        if let Some(plan) = self.mma_forward_chosen(l, w, wl, win, groups)? {
            let (c_out, epilogue) = (wl.dims()[0], Some((b, bl, relu)));
            return conv_mma::forward(self, l, w, wl, win, c_out, false, epilogue, &plan).map(Some);
        }
        // Otherwise one pass over cuDNN's output, in place.
        let Some(y) = self.cudnn_forward(l, w, wl, win, groups)? else {
            return Ok(None);
        };
        let c_out = wl.dims()[0];
        let [oh, ow] = win.out_hw();
        let total = win.n * c_out * oh * ow;
        let (b_ptr, b_stride) = (b.ptr_at(bl.offset()), bl.strides()[0] as u64);
        let name = name_for(&CONV_BIAS_ACT, self.dtype);
        // SAFETY: `y` is the packed [n, c_out, oh, ow] output (total elements, read and
        // written in place); the bias is c_out elements b_stride apart from b_ptr (its
        // layout); matches `conv_bias_act_<T>`.
        unsafe {
            self.dev().call(
                KernelSource::Window,
                name,
                grid_1d(self.dev(), (total as u64).div_ceil(4)),
                &mut [
                    &mut { y.buf.ptr },
                    &mut { b_ptr },
                    &mut { total as u64 },
                    &mut { c_out as u64 },
                    &mut { (oh * ow) as u64 },
                    &mut { b_stride },
                    &mut { i32::from(relu) },
                ],
            )
        }?;
        Ok(Some(y))
    }

    /// The input gradient by kiln's tensor-core kernel where measured faster, else cuDNN.
    pub(super) fn backward_input_by_others(
        &self,
        l: &Layout,
        w: &Self,
        wl: &Layout,
        win: &Window2d,
        groups: usize,
    ) -> Result<Option<Self>> {
        // A stride-1 input gradient is a forward convolution of the output gradient.
        let c_out = wl.dims()[0];
        if let Some(t) = win.input_gradient_window(c_out) {
            if self.dtype == w.dtype && conv_mma::applies(self.dev(), self.dtype, &t, groups) {
                let mut run = |p: &conv_mma::Plan| {
                    conv_mma::forward(self, l, w, wl, &t, win.c, true, None, p)
                };
                let mut library = || self.cudnn_backward_input(l, w, wl, win, groups);
                let d = Direction::BackwardData;
                if let Some(plan) = conv_mma::choose(self, l, d, &t, win.c, &mut run, &mut library)?
                {
                    return run(&plan).map(Some);
                }
            }
        }
        self.cudnn_backward_input(l, w, wl, win, groups)
    }

    /// The plan of kiln's tensor-core weight gradient for this problem (`self` the input at
    /// `l`, `g` the output gradient at `gl`), where it applies and measured faster than cuDNN
    /// (`conv_wgrad_mma::choose`, measured once per problem and remembered).
    pub(super) fn wgrad_mma_plan(
        &self,
        l: &Layout,
        g: &Self,
        gl: &Layout,
        win: &Window2d,
        groups: usize,
        weight_dims: [usize; 4],
    ) -> Result<Option<conv_wgrad_mma::Plan>> {
        if self.dtype != g.dtype || !conv_wgrad_mma::applies(self.dev(), self.dtype, win, groups) {
            return Ok(None);
        }
        let c_out = weight_dims[0];
        let mut run = |p: &conv_wgrad_mma::Plan| {
            conv_wgrad_mma::weight_grad(self, l, g, gl, win, c_out, p, false).map(|r| r.0)
        };
        let mut library = || self.cudnn_backward_weight(l, g, gl, win, groups, weight_dims);
        conv_wgrad_mma::choose(self, l, win, c_out, &mut run, &mut library)
    }

    /// The input gradient through cuDNN (`self` the output gradient at `l`), or `None`:
    /// im2col + GEMM computes it.
    pub(super) fn cudnn_backward_input(
        &self,
        l: &Layout,
        w: &Self,
        wl: &Layout,
        win: &Window2d,
        groups: usize,
    ) -> Result<Option<Self>> {
        let Some(prep) = Prepared::new(self, l, w, wl)? else {
            return Ok(None);
        };
        let dx_layout = Layout::contiguous(win.input_dims());
        let dx = cudnn_output(self, dx_layout.elem_count())?;
        let ops = Operands {
            x: (dx.buf.ptr, &dx_layout),
            w: prep.w_ptr,
            y: (prep.a_ptr, &prep.a_layout),
        };
        // SAFETY: as in `conv2d`; `dx` is written.
        let ran = unsafe {
            cudnn::convolve(
                self.dev(),
                Direction::BackwardData,
                self.dtype,
                win,
                groups,
                prep.w_dims,
                &ops,
            )
        }?;
        // Without a cuDNN algorithm `dx` was never written: im2col + GEMM computes it.
        Ok(ran.then_some(dx))
    }

    /// Whether kiln's direct kernel runs this forward: it applies, and it measured faster
    /// than cuDNN on this problem (`conv_direct::prefer_direct`, measured once).
    pub(super) fn direct_forward_chosen(
        &self,
        l: &Layout,
        w: &Self,
        wl: &Layout,
        win: &Window2d,
        groups: usize,
    ) -> Result<bool> {
        if !conv_direct::applies(self.dtype, win, groups) || self.dtype != w.dtype {
            return Ok(false);
        }
        let mut direct = || conv_direct::forward(self, l, w, wl, win, None);
        let mut library = || self.cudnn_forward(l, w, wl, win, groups);
        let (d, c_out) = (Direction::Forward, wl.dims()[0]);
        conv_direct::prefer_direct(self, l, d, win, c_out, &mut direct, &mut library)
    }

    /// The plan of kiln's tensor-core kernel for this forward, where it applies and measured
    /// faster than cuDNN on this problem (`conv_mma::choose`, measured once).
    pub(super) fn mma_forward_chosen(
        &self,
        l: &Layout,
        w: &Self,
        wl: &Layout,
        win: &Window2d,
        groups: usize,
    ) -> Result<Option<conv_mma::Plan>> {
        if self.dtype != w.dtype || !conv_mma::applies(self.dev(), self.dtype, win, groups) {
            return Ok(None);
        }
        let c_out = wl.dims()[0];
        let mut run =
            |p: &conv_mma::Plan| conv_mma::forward(self, l, w, wl, win, c_out, false, None, p);
        let mut library = || self.cudnn_forward(l, w, wl, win, groups);
        let d = Direction::Forward;
        conv_mma::choose(self, l, d, win, c_out, &mut run, &mut library)
    }

    /// The forward convolution through cuDNN (or `None`: im2col + GEMM, or cuDNN has no
    /// algorithm); with `KILN_CONV_CHOICE=measure`, im2col + GEMM where it measures faster.
    pub(super) fn cudnn_forward(
        &self,
        l: &Layout,
        w: &Self,
        wl: &Layout,
        win: &Window2d,
        groups: usize,
    ) -> Result<Option<Self>> {
        let Some(prep) = Prepared::new(self, l, w, wl)? else {
            return Ok(None);
        };
        let [oh, ow] = win.out_hw();
        let c_out = wl.dims()[0];
        let out_layout = Layout::contiguous([win.n, c_out, oh, ow]);
        let out = cudnn_output(self, out_layout.elem_count())?;
        let ops = Operands {
            x: (prep.a_ptr, &prep.a_layout),
            w: prep.w_ptr,
            y: (out.buf.ptr, &out_layout),
        };
        let mut run = || {
            // SAFETY: the operands are live buffers of `self.dtype` holding what their
            // layouts (and the packed filter `wl.dims()`) index; `out` is written.
            unsafe {
                cudnn::convolve(
                    self.dev(),
                    Direction::Forward,
                    self.dtype,
                    win,
                    groups,
                    prep.w_dims,
                    &ops,
                )
            }
        };
        if !cudnn_forward_wins(self, l, w, wl, win, groups, &mut run)? {
            return Ok(None);
        }
        Ok(run()?.then_some(out))
    }

    /// The weight gradient through cuDNN, or `None` (the caller takes im2col + GEMM).
    pub(super) fn cudnn_backward_weight(
        &self,
        l: &Layout,
        g: &Self,
        gl: &Layout,
        win: &Window2d,
        groups: usize,
        weight_dims: [usize; 4],
    ) -> Result<Option<Self>> {
        let w_layout = Layout::contiguous(weight_dims);
        let dw = cudnn_output(self, w_layout.elem_count())?;
        // The filter operand is the output here; `Prepared` checks and packs the other two.
        let Some(x) = Prepared::new(self, l, &dw, &w_layout)? else {
            return Ok(None);
        };
        let Some(grad) = Prepared::new(g, gl, &dw, &w_layout)? else {
            return Ok(None);
        };
        let ops = Operands {
            x: (x.a_ptr, &x.a_layout),
            w: dw.buf.ptr,
            y: (grad.a_ptr, &grad.a_layout),
        };
        // SAFETY: as in `conv2d`; `dw` is written.
        let ran = unsafe {
            cudnn::convolve(
                self.dev(),
                Direction::BackwardFilter,
                self.dtype,
                win,
                groups,
                weight_dims,
                &ops,
            )
        }?;
        // Without a cuDNN algorithm `dw` was never written: im2col + GEMM computes it.
        Ok(ran.then_some(dw))
    }
}

/// Problems whose forward was measured: `true` when cuDNN beat im2col + GEMM.
type ChoiceKey = (usize, DType, bool, Window2d, usize, [usize; 4]);

/// Whether this forward convolution should run through cuDNN rather than im2col + GEMM.
/// By default cuDNN; with `KILN_CONV_CHOICE=measure`, measured once per problem (one group
/// only): each path runs once to warm up, then three times between device events. The H100
/// run of 2026-11-24 found im2col + GEMM faster for the forward of small channel counts
/// (b1 3→64 224²: 2×) but the CNN's step slower overall (its backward then runs on GEMMs
/// too), so measuring the forward alone is not the default.
fn cudnn_forward_wins(
    x: &CudaStorage,
    l: &Layout,
    w: &CudaStorage,
    wl: &Layout,
    win: &Window2d,
    groups: usize,
    run_cudnn: &mut dyn FnMut() -> Result<bool>,
) -> Result<bool> {
    static MEASURE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let measure =
        *MEASURE.get_or_init(|| std::env::var("KILN_CONV_CHOICE").is_ok_and(|v| v == "measure"));
    if !measure || groups != 1 {
        return Ok(true);
    }
    static CHOICES: std::sync::Mutex<Option<std::collections::HashMap<ChoiceKey, bool>>> =
        std::sync::Mutex::new(None);
    let s = l.strides();
    let key = (
        x.dev().ordinal,
        x.dtype,
        super::tf32_enabled(),
        *win,
        wl.dims()[0],
        [s[0], s[1], s[2], s[3]],
    );
    if let Some(&c) = CHOICES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(Default::default)
        .get(&key)
    {
        return Ok(c);
    }
    if groups != 1 || !wl.is_contiguous() || x.dev().capturing() {
        return Ok(true);
    }
    let (k, c_out) = (win.col_rows(), wl.dims()[0]);
    let w_t = Layout::new([k, c_out].into(), vec![1, k], wl.offset(), usize::MAX)?;
    let gemm = || -> Result<()> {
        let col = x.unfold(l, win)?;
        let rows = Layout::new(
            [win.col_cols(), k].into(),
            vec![1, win.col_cols()],
            0,
            usize::MAX,
        )?;
        col.matmul(&rows, w, &w_t).map(drop)
    };
    let ordinal = x.dev().ordinal;
    if !run_cudnn()? {
        return Ok(false);
    }
    gemm()?;
    let (_, t_cudnn) = super::time_region(ordinal, || {
        for _ in 0..3 {
            run_cudnn()?;
        }
        Ok(())
    })?;
    let (_, t_gemm) = super::time_region(ordinal, || {
        for _ in 0..3 {
            gemm()?;
        }
        Ok(())
    })?;
    let wins = t_cudnn <= t_gemm;
    if std::env::var("KILN_CUDNN_LOG").is_ok_and(|v| v == "1") {
        eprintln!(
            "kiln conv2d forward {:?} {} (tf32 {}): cuDNN {:.3} ms, im2col + GEMM {:.3} ms (3 runs) -> {}",
            win, x.dtype, key.2, t_cudnn, t_gemm, if wins { "cuDNN" } else { "im2col + GEMM" }
        );
    }
    CHOICES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(Default::default)
        .insert(key, wins);
    Ok(wins)
}

/// An activation operand as cuDNN can read it (its own strides, or a packed copy) and the
/// packed filter, or `None` when cuDNN is not used.
struct Prepared {
    _copies: (Option<CudaStorage>, Option<CudaStorage>),
    a_ptr: u64,
    a_layout: Layout,
    w_ptr: u64,
    w_dims: [usize; 4],
}

impl Prepared {
    pub(super) fn new(
        a: &CudaStorage,
        al: &Layout,
        w: &CudaStorage,
        wl: &Layout,
    ) -> Result<Option<Prepared>> {
        if cudnn::unavailable_reason().is_some() || !a.dtype.is_float() || a.dtype != w.dtype {
            return Ok(None);
        }
        let (a_copy, a_ptr, a_layout) = if cudnn::describable(al) {
            (None, a.ptr_at(al.offset()), al.clone())
        } else {
            let c = super::elementwise::cast(a, al, a.dtype)?;
            let p = c.buf.ptr;
            (Some(c), p, Layout::contiguous(al.shape().clone()))
        };
        let (w_copy, w_ptr) = conv_direct::packed(w, wl)?;
        let d = wl.dims();
        Ok(Some(Prepared {
            _copies: (a_copy, w_copy),
            a_ptr,
            a_layout,
            w_ptr,
            w_dims: [d[0], d[1], d[2], d[3]],
        }))
    }
}

/// A buffer for a cuDNN result of `like`'s dtype. cuDNN's f64 kernels
/// (`implicit_convolve_dgemm`, `scalePackedTensor_kernel`) read their output before writing
/// it even with β = 0 (compute-sanitizer's initcheck on the H100, cuDNN 9.14), so an f64
/// output starts zeroed: stale NaNs in a reused buffer cannot leak in. f32 and 16-bit
/// outputs showed no such read and are left as allocated.
fn cudnn_output(like: &CudaStorage, len: usize) -> Result<CudaStorage> {
    let out = CudaStorage::alloc(like.dev(), len, like.dtype)?;
    if like.dtype == DType::F64 {
        super::elementwise::fill(&out, 0.0)?;
    }
    Ok(out)
}
