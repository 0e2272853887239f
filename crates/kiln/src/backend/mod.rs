//! The narrow interface between tensors and the devices that compute them.
//!
//! Each backend (one folder: `cpu/`, `cuda/`, `wgpu/`) implements [`BackendStorage`]: a handful
//! of primitive ops that take storage plus a [`Layout`] per operand and return fresh,
//! contiguous storage. Broadcasting, dimension checks, views and composite ops live above,
//! in the tensor layer (`tensor/`), and never reach into a backend.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod memory;
pub mod sparse;
#[cfg(feature = "wgpu")]
pub mod wgpu;

use crate::layout::Layout;
use crate::op::{
    BinaryOp, CmpOp, CrossEntropyRows, EpilogueActivation, PoolKind, ReduceOp, UnaryOp, UpdateRule,
    Window2d,
};
use crate::{DType, Device, Error, Result};
use std::cell::Cell;

thread_local! {
    /// The device whose stream this thread is recording into a graph (see
    /// `kiln::cuda::Graph::capture`), if any.
    static CAPTURING: Cell<Option<Device>> = const { Cell::new(None) };
    /// The first op refused by [`check_not_capturing_elsewhere`] during this thread's
    /// capture: it fails the capture even if the caller ignored the error.
    static REFUSED: std::cell::RefCell<Option<(String, Device, String)>> =
        const { std::cell::RefCell::new(None) };
}

/// Takes the first refusal recorded during this thread's capture, if any.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn take_refusal() -> Option<Error> {
    REFUSED
        .with(|r| r.borrow_mut().take())
        .map(|(op, device, reason)| Error::GraphCapture { op, device, reason })
}

/// The device this thread is capturing a graph on, if it is capturing one.
pub(crate) fn capturing_on_this_thread() -> Option<Device> {
    CAPTURING.with(Cell::get)
}

/// Marks (or, with `None`, unmarks) this thread as capturing a graph on `device`.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn set_capturing_on_this_thread(device: Option<Device>) {
    CAPTURING.with(|c| c.set(device));
    REFUSED.with(|r| *r.borrow_mut() = None);
}

/// Refuses an op on `device` while this thread captures a graph on another device: the op
/// would run once, now, instead of on every replay.
#[inline]
pub(crate) fn check_not_capturing_elsewhere(device: Device, op: &str) -> Result<()> {
    match capturing_on_this_thread() {
        Some(d) if d != device => {
            let reason = format!(
                "its operands are on {device}; only ops on {d} can be recorded, so this one \
                 would run once now instead of on every replay"
            );
            REFUSED.with(|r| {
                r.borrow_mut()
                    .get_or_insert_with(|| (op.to_string(), d, reason.clone()));
            });
            Err(Error::GraphCapture {
                op: op.to_string(),
                device: d,
                reason,
            })
        }
        _ => Ok(()),
    }
}

/// The primitive ops of a backend. Every op accepts any layout (strided, broadcast, offset)
/// and returns a new contiguous storage; operands of one op share a device and (except where
/// noted) a dtype, which the caller has checked.
pub trait BackendStorage: Sized {
    fn dtype(&self) -> DType;
    fn device(&self) -> Device;

    /// Elementwise `op`; the result has `layout`'s shape.
    fn unary(&self, layout: &Layout, op: UnaryOp) -> Result<Self>;
    /// Elementwise `op` of two operands whose layouts have one shape.
    fn binary(
        &self,
        layout: &Layout,
        rhs: &Self,
        rhs_layout: &Layout,
        op: BinaryOp,
    ) -> Result<Self>;
    /// `self[layout] = self[layout] op rhs[rhs_layout]`, in place (one shape; `layout`
    /// indexes each element once). Backends with an in-place kernel override the default, a
    /// product into a new buffer and a copy back.
    fn binary_assign(
        &mut self,
        layout: &Layout,
        rhs: &Self,
        rhs_layout: &Layout,
        op: BinaryOp,
    ) -> Result<()> {
        binary_assign_through_copy(self, layout, rhs, rhs_layout, op)
    }
    /// `self · scale + shift` elementwise, all three layouts of one shape and dtype.
    /// Backends with a fused kernel override the default, a product then a sum.
    fn affine(
        &self,
        layout: &Layout,
        scale: &Self,
        scale_layout: &Layout,
        shift: &Self,
        shift_layout: &Layout,
    ) -> Result<Self> {
        let product = self.binary(layout, scale, scale_layout, BinaryOp::Mul)?;
        let out = Layout::contiguous(layout.shape().clone());
        product.binary(&out, shift, shift_layout, BinaryOp::Add)
    }
    /// `act(self·rhs + bias)` for 2-D `[m, k]·[k, n]` and a `[n]` bias, and the
    /// pre-activation `self·rhs + bias` when the activation's gradient needs it (GELU).
    /// Backends with an activation epilogue override the default, [`Self::matmul_bias`]
    /// then the activation.
    fn matmul_bias_act(
        &self,
        layout: &Layout,
        rhs: &Self,
        rhs_layout: &Layout,
        bias: &Self,
        bias_layout: &Layout,
        act: EpilogueActivation,
    ) -> Result<(Self, Option<Self>)> {
        let z = self.matmul_bias(layout, rhs, rhs_layout, bias, bias_layout)?;
        let zl = Layout::contiguous([layout.dims()[0], rhs_layout.dims()[1]]);
        let out = z.unary(&zl, act.unary())?;
        Ok((out, (act == EpilogueActivation::GeluTanh).then_some(z)))
    }
    /// Elementwise comparison, as `u8` 0/1.
    fn compare(&self, layout: &Layout, rhs: &Self, rhs_layout: &Layout, op: CmpOp) -> Result<Self>;
    /// `cond != 0 ? on_true : on_false`; `self` is the condition (any dtype), the two
    /// branches share a dtype; all three layouts have one shape.
    fn where_cond(
        &self,
        layout: &Layout,
        on_true: &Self,
        true_layout: &Layout,
        on_false: &Self,
        false_layout: &Layout,
    ) -> Result<Self>;
    /// Converts to `dtype` (floats to integers truncate toward zero and saturate).
    fn cast(&self, layout: &Layout, dtype: DType) -> Result<Self>;
    /// A contiguous copy.
    fn copy_contiguous(&self, layout: &Layout) -> Result<Self>;
    /// Writes the elements of `self` at `layout` into `dst` at `dst_layout` (same shape).
    fn copy_into(&self, layout: &Layout, dst: &mut Self, dst_layout: &Layout) -> Result<()>;
    /// Reduces `dims` (sorted, unique); the result has `layout`'s shape with those dims set
    /// to 1. ArgMax/ArgMin return `i64`.
    fn reduce(&self, layout: &Layout, dims: &[usize], op: ReduceOp) -> Result<Self>;
    /// Softmax (or log-softmax) along `dim`, float dtypes.
    fn softmax(&self, layout: &Layout, dim: usize, log: bool) -> Result<Self>;
    /// `ln Σ e^x` along `dim` (float dtypes), contiguous, `dim` kept with size 1. `None` where
    /// the backend has no fused kernel: the caller then composes it from max, exp, sum and
    /// log.
    fn logsumexp(&self, _layout: &Layout, _dim: usize) -> Option<Result<Self>> {
        None
    }
    /// Batched matrix product: `layout` is `[batch.., m, k]`, `rhs_layout` `[batch.., k, n]`
    /// with equal batch dims (broadcast ones have stride 0); the result is `[batch.., m, n]`.
    fn matmul(&self, layout: &Layout, rhs: &Self, rhs_layout: &Layout) -> Result<Self>;
    /// `self·rhs + bias` for 2-D `[m, k]·[k, n]` and a 1-D `[n]` bias added to every row (a
    /// linear layer's forward). Backends with a fused epilogue override the default, a
    /// product then an add.
    fn matmul_bias(
        &self,
        layout: &Layout,
        rhs: &Self,
        rhs_layout: &Layout,
        bias: &Self,
        bias_layout: &Layout,
    ) -> Result<Self> {
        let product = self.matmul(layout, rhs, rhs_layout)?;
        let out = Layout::contiguous([layout.dims()[0], rhs_layout.dims()[1]]);
        let bias_rows = bias_layout.broadcast_as(out.shape().clone())?;
        product.binary(&out, bias, &bias_rows, BinaryOp::Add)
    }
    /// `(self·rhs, Σ_k self[i, k])` for 2-D `[m, k]·[k, n]`: the product and the `[m]` row
    /// sums of `self` (with `self = gᵀ`, a linear layer's weight and bias gradients).
    /// Backends with a fused epilogue override the default, a product then a reduction.
    fn matmul_row_sums(
        &self,
        layout: &Layout,
        rhs: &Self,
        rhs_layout: &Layout,
    ) -> Result<(Self, Self)> {
        let product = self.matmul(layout, rhs, rhs_layout)?;
        let sums = self.reduce(layout, &[1], ReduceOp::Sum)?;
        Ok((product, sums))
    }
    /// Picks entries `ids` (1-D, integer) along `dim`.
    fn index_select(
        &self,
        layout: &Layout,
        ids: &Self,
        ids_layout: &Layout,
        dim: usize,
    ) -> Result<Self>;
    /// `out[i][j] = self[i][ids[i][j]]` (for `dim == 1`); the result has `ids`' shape.
    fn gather(&self, layout: &Layout, ids: &Self, ids_layout: &Layout, dim: usize) -> Result<Self>;
    /// A copy of `self` with `src[i][j]` added at `[i][ids[i][j]]` (for `dim == 1`);
    /// `ids` and `src` share a shape.
    fn scatter_add(
        &self,
        layout: &Layout,
        ids: &Self,
        ids_layout: &Layout,
        src: &Self,
        src_layout: &Layout,
        dim: usize,
    ) -> Result<Self>;

    /// Fused softmax cross-entropy of `self` (`[N, C]`, float, any strides) against class
    /// ids `targets` (`[N]`, i64) with label smoothing `smoothing`; see [`CrossEntropyRows`].
    /// A label outside `[0, C)` is an error (on CUDA, reported at the next read).
    fn cross_entropy(
        &self,
        layout: &Layout,
        targets: &Self,
        targets_layout: &Layout,
        smoothing: f64,
        scale: f64,
    ) -> Result<CrossEntropyRows<Self>>;

    /// [`BackendStorage::cross_entropy`] that also updates a training epoch's running sums
    /// in the same pass, each an f32 vector of `N` (contiguous, offset allowed) written in
    /// place: `sums[0] += loss` (the row's loss as f32), then `sums[1] += 1` where `sums[0]`
    /// is finite, and `sums[2] += correct`: what the three separate in-place ops give, to
    /// the bit. `None` where the backend has no fused form (the default) or the sums do not
    /// have that form; the caller then runs the separate ops.
    #[allow(clippy::too_many_arguments)]
    fn cross_entropy_accumulate(
        &self,
        layout: &Layout,
        targets: &Self,
        targets_layout: &Layout,
        smoothing: f64,
        scale: f64,
        sums: [(&mut Self, &Layout); 3],
    ) -> Result<Option<CrossEntropyRows<Self>>> {
        let _ = (layout, targets, targets_layout, smoothing, scale, sums);
        Ok(None)
    }

    /// A dropout mask of `n` elements of the float `dtype` on this storage's device, drawn on
    /// the device: element `i` is `draw.scale` where `draw.keeps(draw.key(step), i)`, else
    /// 0, with `step` the i64 of `self` at `step_layout` (one element), read by the kernel,
    /// so a CUDA graph draws a new mask on every replay. `None` where the backend draws
    /// none itself (the default): the caller reads the step and builds the mask on the host.
    fn dropout_mask(
        &self,
        step_layout: &Layout,
        n: usize,
        dtype: DType,
        draw: &crate::op::DropoutDraw,
    ) -> Result<Option<Self>> {
        let _ = (step_layout, n, dtype, draw);
        Ok(None)
    }

    /// Updates the parameter `self` in place by `rule` from `grad` and the rule's state
    /// buffers (read and written). Every operand is contiguous (its layout may have an
    /// offset) with the same element count and dtype; the caller has checked.
    fn update(
        &mut self,
        layout: &Layout,
        grad: &Self,
        grad_layout: &Layout,
        state: &mut [(&mut Self, &Layout)],
        rule: UpdateRule,
    ) -> Result<()>;

    /// [`BackendStorage::update`] of several parameters by one rule (an optimizer step).
    /// With `schedule` (a contiguous f64 `[lr, step]` on the same device, see
    /// [`crate::op::UpdateRule::with_schedule`]), the learning rate and Adam's step count
    /// are read from device memory when the update runs, so a recorded step (a CUDA graph)
    /// follows a schedule without being recorded again. Backends that can update many
    /// buffers in one launch override the default, a loop without schedule support.
    fn update_group(
        slots: &mut [UpdateSlot<'_, Self>],
        rule: UpdateRule,
        schedule: Option<&Self>,
    ) -> Result<()> {
        if schedule.is_some() {
            return Err(Error::Msg(format!(
                "{}: this backend does not read schedules from device memory",
                rule.name()
            )));
        }
        for s in slots.iter_mut() {
            s.param
                .update(s.layout, s.grad, s.grad_layout, &mut s.state, rule)?;
        }
        Ok(())
    }
}

/// One parameter of [`BackendStorage::update_group`]: the parameter, its gradient and the
/// rule's state buffers, each with its layout (the contract of [`BackendStorage::update`]).
pub struct UpdateSlot<'a, S> {
    pub param: &'a mut S,
    pub layout: &'a Layout,
    pub grad: &'a S,
    pub grad_layout: &'a Layout,
    pub state: Vec<(&'a mut S, &'a Layout)>,
}

/// The sliding-window primitives of convolutions and pooling over NCHW tensors (each
/// backend's `window.rs`). A convolution is [`WindowStorage::unfold`] then a GEMM (see
/// `tensor/conv.rs`); its input gradient is a GEMM then [`WindowStorage::fold`].
pub trait WindowStorage: BackendStorage {
    /// im2col: the `[c·kh·kw, n·oh·ow]` matrix (contiguous) whose column `(b, oh, ow)` holds
    /// the window of output pixel `(oh, ow)` of image `b`, row `(ch, i, j)` the input element
    /// at channel `ch`, kernel offset `(i, j)`, zero where the window reaches into padding.
    /// `layout` is the input `[n, c, h, w]`, any strides.
    fn unfold(&self, layout: &Layout, window: &Window2d) -> Result<Self>;
    /// col2im, the adjoint of [`WindowStorage::unfold`]: `[n, c, h, w]` (contiguous) where
    /// each input element is the sum of the matrix entries `unfold` would have copied it
    /// to. `layout` is the `[c·kh·kw, n·oh·ow]` matrix, any strides.
    fn fold(&self, layout: &Layout, window: &Window2d) -> Result<Self>;
    /// Pools each window of the input (`layout`, `[n, c, h, w]`, any strides) into
    /// `[n, c, oh, ow]` (contiguous); for [`PoolKind::Max`] also the position of each
    /// maximum in its input plane (`h·w`-index, `u32`), which the backward reads.
    fn pool(
        &self,
        layout: &Layout,
        window: &Window2d,
        kind: PoolKind,
    ) -> Result<(Self, Option<Self>)>;
    /// The input gradient `[n, c, h, w]` (contiguous) of [`WindowStorage::pool`] from the
    /// output gradient `self` (`layout`, `[n, c, oh, ow]`, any strides) and, for max-pooling,
    /// the positions `pool` returned (contiguous).
    fn pool_backward(
        &self,
        layout: &Layout,
        argmax: Option<&Self>,
        window: &Window2d,
        kind: PoolKind,
    ) -> Result<Self>;

    /// A direct convolution of the input `self` (`layout`, `[n, c_in, h, w]`) with `weight`
    /// (`[c_out, c_in / groups, kh, kw]`), no bias: `[n, c_out, oh, ow]`, contiguous. Backends
    /// with a convolution library (cuDNN) override this; `None` sends the caller to unfold
    /// and a GEMM.
    fn conv2d(
        &self,
        _layout: &Layout,
        _weight: &Self,
        _weight_layout: &Layout,
        _window: &Window2d,
        _groups: usize,
    ) -> Result<Option<Self>> {
        Ok(None)
    }
    /// [`WindowStorage::conv2d`] with `bias` (`[c_out]` at `bias_layout`) added and, with
    /// `relu`, the ReLU applied in the same pass, where the backend fuses them; `None` sends
    /// the caller to the separate path (the convolution, then a bias-add kernel).
    #[allow(clippy::too_many_arguments)]
    fn conv2d_bias_act(
        &self,
        _layout: &Layout,
        _weight: &Self,
        _weight_layout: &Layout,
        _bias: &Self,
        _bias_layout: &Layout,
        _window: &Window2d,
        _groups: usize,
        _relu: bool,
    ) -> Result<Option<Self>> {
        Ok(None)
    }
    /// The input gradient `[n, c_in, h, w]` (contiguous) of [`WindowStorage::conv2d`] from
    /// the output gradient `self` (`layout`).
    fn conv2d_backward_input(
        &self,
        _layout: &Layout,
        _weight: &Self,
        _weight_layout: &Layout,
        _window: &Window2d,
        _groups: usize,
    ) -> Result<Option<Self>> {
        Ok(None)
    }
    /// The weight gradient (`weight_dims`, contiguous) of [`WindowStorage::conv2d`] from the
    /// input `self` (`layout`) and the output gradient `grad`.
    #[allow(clippy::too_many_arguments)]
    fn conv2d_backward_weight(
        &self,
        _layout: &Layout,
        _grad: &Self,
        _grad_layout: &Layout,
        _window: &Window2d,
        _groups: usize,
        _weight_dims: [usize; 4],
    ) -> Result<Option<Self>> {
        Ok(None)
    }
    /// [`WindowStorage::conv2d_backward_weight`] and the bias gradient (`grad` summed over
    /// images and pixels, `[c_out]`) in one pass over `grad`, where the backend has one;
    /// `None` sends the caller to the weight gradient and a separate sum.
    #[allow(clippy::too_many_arguments)]
    fn conv2d_backward_weight_bias(
        &self,
        _layout: &Layout,
        _grad: &Self,
        _grad_layout: &Layout,
        _window: &Window2d,
        _groups: usize,
        _weight_dims: [usize; 4],
    ) -> Result<Option<(Self, Self)>> {
        Ok(None)
    }
}

/// [`BackendStorage::binary_assign`] for any backend: the product into a new buffer, then a
/// copy back into `dst`'s elements.
pub(crate) fn binary_assign_through_copy<S: BackendStorage>(
    dst: &mut S,
    layout: &Layout,
    rhs: &S,
    rhs_layout: &Layout,
    op: BinaryOp,
) -> Result<()> {
    let r = dst.binary(layout, rhs, rhs_layout, op)?;
    r.copy_into(&Layout::contiguous(layout.shape().clone()), dst, layout)
}
