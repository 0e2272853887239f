//! Convolutions and pooling over NCHW tensors.
//!
//! Where the backend has a convolution library (cuDNN on CUDA), a convolution is one call to
//! it (and one bias/activation kernel). Otherwise it is im2col ([`Tensor::unfold2d`], one
//! backend primitive) followed by one
//! GEMM with the bias (and an activation) in its epilogue: the output is `[n·oh·ow, c_out]`,
//! i.e. NHWC memory, returned as an NCHW view without a copy. Gradients come from the
//! ops it is made of: the GEMM's rule gives the weight and bias gradients in one call and the
//! unfolded input's gradient, which [`crate::backend::WindowStorage::fold`] sums back into
//! the input's shape.

use super::Tensor;
use crate::autograd::Op;
use crate::backend::WindowStorage;
use crate::op::{EpilogueActivation, PoolKind, Window2d};
use crate::{Error, Result};

/// Stride, padding, dilation and groups of [`Tensor::conv2d`] (PyTorch's defaults: 1, 0, 1,
/// 1), per axis `[height, width]`.
///
/// ```
/// # use kiln::Conv2dOptions;
/// let o = Conv2dOptions::default().padding(2).stride(1);
/// assert_eq!(o.padding, [2, 2]);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conv2dOptions {
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
}

impl Default for Conv2dOptions {
    fn default() -> Self {
        Conv2dOptions {
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
        }
    }
}

impl Conv2dOptions {
    /// The same stride along both axes.
    pub fn stride(mut self, s: usize) -> Self {
        self.stride = [s, s];
        self
    }
    /// The same zero padding on all four sides.
    pub fn padding(mut self, p: usize) -> Self {
        self.padding = [p, p];
        self
    }
    /// The same dilation along both axes.
    pub fn dilation(mut self, d: usize) -> Self {
        self.dilation = [d, d];
        self
    }
    /// Channel groups: input and output channels split into `g` independent convolutions.
    pub fn groups(mut self, g: usize) -> Self {
        self.groups = g;
        self
    }
}

impl Tensor {
    /// 2-D convolution (cross-correlation, as in PyTorch) of `self` `[n, c_in, h, w]` with
    /// `weight` `[c_out, c_in / groups, kh, kw]` and an optional `bias` `[c_out]`: the
    /// result is `[n, c_out, oh, ow]` (see [`Window2d::out_hw`]). Every operand may be any
    /// view; gradients flow to all three.
    ///
    /// On the GEMM path the result is an NCHW view of NHWC memory (the GEMM's natural
    /// output): ops downstream read it through its strides; [`Tensor::contiguous`] makes an
    /// NCHW copy. Through cuDNN it is contiguous NCHW.
    ///
    /// # Errors
    /// Non-float or mixed dtypes, operands on two devices, an input or weight that is not
    /// 4-D, channels that do not match the weight (`c_in ≠ groups · weight.dims[1]`), groups
    /// that do not divide both channel counts, a bias that is not `[c_out]`, or a kernel
    /// larger than the padded input; the error names the op and the shapes.
    ///
    /// ```
    /// use kiln::{Conv2dOptions, Device, DType, Tensor};
    /// let x = Tensor::ones([1, 1, 3, 3], DType::F32, &Device::Cpu)?;
    /// let w = Tensor::ones([2, 1, 2, 2], DType::F32, &Device::Cpu)?;
    /// let b = Tensor::from_vec(vec![0f32, 10.], 2, &Device::Cpu)?;
    /// let y = x.conv2d(&w, Some(&b), Conv2dOptions::default().padding(1))?;
    /// assert_eq!(y.dims(), &[1, 2, 4, 4]);
    /// assert_eq!(y.contiguous()?.to_vec::<f32>()?[..4], [1., 2., 2., 1.]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn conv2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        options: Conv2dOptions,
    ) -> Result<Tensor> {
        self.conv2d_act(weight, bias, options, None)
    }

    /// [`Tensor::conv2d`] followed by `act`, fused into the GEMM's epilogue where the
    /// backend has one (cuBLASLt, with a bias and one group).
    pub fn conv2d_act(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        options: Conv2dOptions,
        act: Option<EpilogueActivation>,
    ) -> Result<Tensor> {
        let window = self.conv2d_window(weight, bias, &options)?;
        let (n, [oh, ow]) = (window.n, window.out_hw());
        let (c_out, groups) = (weight.dims()[0], options.groups);
        // Bias (and ReLU) in the convolution's own kernel, where the backend fuses them.
        if let (Some(b), None | Some(EpilogueActivation::Relu)) = (bias, act) {
            let relu = act.is_some();
            let fused = self.storage().conv2d_bias_act(
                &self.layout,
                &weight.storage(),
                &weight.layout,
                &b.storage(),
                &b.layout,
                &window,
                groups,
                relu,
            )?;
            if let Some(y) = fused {
                let y = Tensor::from_storage(y, [n, c_out, oh, ow]);
                return Ok(y.tracked_out(&[self, weight, b], |out| Op::Conv2dBiasAct {
                    x: self.clone(),
                    w: weight.clone(),
                    bias: b.clone(),
                    window,
                    groups,
                    relu,
                    out,
                }));
            }
        }
        let direct = self.storage().conv2d(
            &self.layout,
            &weight.storage(),
            &weight.layout,
            &window,
            groups,
        )?;
        if let Some(y) = direct {
            let y = Tensor::from_storage(y, [n, c_out, oh, ow]).tracked(&[self, weight], || {
                Op::Conv2d {
                    x: self.clone(),
                    w: weight.clone(),
                    window,
                    groups,
                }
            });
            let Some(b) = bias else {
                return activate(y, act);
            };
            let b = b.reshape([1, c_out, 1, 1])?;
            return match act {
                Some(EpilogueActivation::Relu) => y.add_relu(&b),
                a => activate(y.add(&b)?, a),
            };
        }
        let col = self.unfold2d(&window)?; // [c_in·kh·kw, n·oh·ow]
        if groups == 1 {
            let rows = col.t()?; // [n·oh·ow, k], a transposed view
            let wt = weight.reshape([c_out, window.col_rows()])?.t()?;
            let y = match (bias, act) {
                (Some(b), Some(a)) => rows.matmul_bias_act(&wt, b, a)?,
                (Some(b), None) => rows.matmul_bias(&wt, b)?,
                (None, a) => activate(rows.matmul(&wt)?, a)?,
            };
            return y.reshape([n, oh, ow, c_out])?.permute(&[0, 3, 1, 2]);
        }
        // Groups: one batched GEMM over the groups, then an NCHW copy.
        let (k_group, c_out_group) = (window.col_rows() / groups, c_out / groups);
        let rows = col
            .reshape([groups, k_group, window.col_cols()])?
            .transpose(1, 2)?;
        let wt = weight
            .reshape([groups, c_out_group, k_group])?
            .transpose(1, 2)?;
        let mut y = rows.matmul(&wt)?; // [groups, n·oh·ow, c_out / groups]
        if let Some(b) = bias {
            y = y.add(&b.reshape([groups, 1, c_out_group])?)?;
        }
        activate(y, act)?
            .reshape([groups, n, oh, ow, c_out_group])?
            .permute(&[1, 0, 4, 2, 3])?
            .reshape([n, c_out, oh, ow])
    }

    /// Checks a convolution's operands; returns its window.
    fn conv2d_window(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        o: &Conv2dOptions,
    ) -> Result<Window2d> {
        const OP: &str = "conv2d";
        self.check_same(weight, OP)?;
        self.check_float(OP)?;
        if let Some(b) = bias {
            self.check_same(b, OP)?;
        }
        let kernel = match weight.dims() {
            &[_, _, kh, kw] => [kh, kw],
            _ => [0, 0],
        };
        let err = |msg: String| Error::WindowShape {
            op: OP,
            input: self.shape().clone(),
            kernel,
            msg,
        };
        let &[c_out, c_in_group, _, _] = weight.dims() else {
            return Err(err(format!(
                "the weight {} must be 4-D [c_out, c_in / groups, kh, kw]",
                weight.shape()
            )));
        };
        if self.rank() != 4 {
            return Err(err("the input must be 4-D [N, C, H, W]".into()));
        }
        let c_in = self.dims()[1];
        let g = o.groups;
        if g == 0 || !c_in.is_multiple_of(g) || !c_out.is_multiple_of(g) {
            return Err(err(format!(
                "groups {g} must divide the input channels {c_in} and the output channels {c_out}"
            )));
        }
        if c_in_group * g != c_in {
            return Err(err(format!(
                "the input has {c_in} channels but the weight {} expects {} ({} per group × {g} groups)",
                weight.shape(),
                c_in_group * g,
                c_in_group
            )));
        }
        if let Some(b) = bias {
            if b.dims() != [c_out] {
                return Err(err(format!(
                    "the bias {} must be [{c_out}] (one per output channel of weight {})",
                    b.shape(),
                    weight.shape()
                )));
            }
        }
        Window2d::new(OP, self.dims(), kernel, o.stride, o.padding, o.dilation)
    }

    /// im2col: the `[c·kh·kw, n·oh·ow]` matrix of `window` over `self` `[n, c, h, w]` (any
    /// view), whose column `(b, y, x)` is the receptive field of output pixel `(y, x)` of
    /// image `b` (zeros in the padding). Its gradient sums back into the input (col2im).
    ///
    /// ```
    /// use kiln::{op::Window2d, Device, Tensor};
    /// let x = Tensor::from_vec((0..4).map(|v| v as f32).collect(), [1, 1, 2, 2], &Device::Cpu)?;
    /// let w = Window2d::new("unfold", x.dims(), [2, 2], [1, 1], [0, 0], [1, 1])?;
    /// assert_eq!(x.unfold2d(&w)?.to_vec::<f32>()?, [0., 1., 2., 3.]); // one column
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn unfold2d(&self, window: &Window2d) -> Result<Tensor> {
        if self.dims() != window.input_dims() {
            return Err(Error::WindowShape {
                op: "unfold2d",
                input: self.shape().clone(),
                kernel: window.kernel,
                msg: format!("the window was made for {:?}", window.input_dims()),
            });
        }
        let s = self.storage().unfold(&self.layout, window)?;
        let out = Tensor::from_storage(s, [window.col_rows(), window.col_cols()]);
        Ok(out.tracked(&[self], || Op::Unfold {
            x: self.clone(),
            window: *window,
        }))
    }

    /// Max-pooling of `self` `[n, c, h, w]` over `kernel` windows moved by `stride`, with
    /// implicit `-inf` padding of at most half the kernel (PyTorch's rule). NaN is the
    /// maximum of any window holding one; the gradient goes to the (first) maximum.
    ///
    /// ```
    /// # use kiln::{Device, Tensor};
    /// let x = Tensor::from_vec(vec![1f32, 5., 2., 0., 3., 4., -1., 7., 6.], [1, 1, 3, 3], &Device::Cpu)?;
    /// assert_eq!(x.max_pool2d([2, 2], [1, 1], [0, 0])?.to_vec::<f32>()?, [5., 5., 7., 7.]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn max_pool2d(
        &self,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    ) -> Result<Tensor> {
        self.pool2d(kernel, stride, padding, PoolKind::Max)
    }

    /// Average pooling of `self` `[n, c, h, w]`, zero padding counted in each window's
    /// mean (PyTorch's `count_include_pad=True`), padding at most half the kernel.
    ///
    /// ```
    /// # use kiln::{Device, Tensor};
    /// let x = Tensor::from_vec(vec![1f32, 2., 3., 4.], [1, 1, 2, 2], &Device::Cpu)?;
    /// assert_eq!(x.avg_pool2d([2, 2], [2, 2], [0, 0])?.to_vec::<f32>()?, [2.5]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn avg_pool2d(
        &self,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    ) -> Result<Tensor> {
        self.pool2d(kernel, stride, padding, PoolKind::Avg)
    }

    /// Adaptive average pooling to `[oh, ow]`: the mean over each cell of an even split of
    /// the plane. `[1, 1]` (global average pooling) and sizes dividing the input are
    /// supported; other sizes are an error.
    pub fn adaptive_avg_pool2d(&self, output: [usize; 2]) -> Result<Tensor> {
        let err = |msg: String| Error::WindowShape {
            op: "adaptive_avg_pool2d",
            input: self.shape().clone(),
            kernel: output,
            msg,
        };
        if self.rank() != 4 {
            return Err(err("the input must be 4-D [N, C, H, W]".into()));
        }
        let (h, w) = (self.dims()[2], self.dims()[3]);
        if output == [1, 1] {
            self.check_float("adaptive_avg_pool2d")?;
            return self.mean([2, 3], true);
        }
        if output.contains(&0) || h % output[0] != 0 || w % output[1] != 0 {
            return Err(err(format!(
                "output size {output:?} must divide the input plane {h}x{w} (or be [1, 1])"
            )));
        }
        let k = [h / output[0], w / output[1]];
        self.avg_pool2d(k, k, [0, 0])
    }

    fn pool2d(
        &self,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        kind: PoolKind,
    ) -> Result<Tensor> {
        let op = kind.name();
        self.check_float(op)?;
        if padding[0] * 2 > kernel[0] || padding[1] * 2 > kernel[1] {
            return Err(Error::WindowShape {
                op,
                input: self.shape().clone(),
                kernel,
                msg: format!("padding {padding:?} must be at most half the kernel"),
            });
        }
        let window = Window2d::new(op, self.dims(), kernel, stride, padding, [1, 1])?;
        let (s, ids) = self.storage().pool(&self.layout, &window, kind)?;
        let out = Tensor::from_storage(s, window.output_dims());
        let argmax = ids.map(|i| Tensor::from_storage(i, window.output_dims()));
        Ok(out.tracked_out(&[self], |out| Op::Pool {
            x: self.clone(),
            argmax,
            window,
            kind,
            out,
        }))
    }
}

/// The output gradient `g` `[n, c_out, oh, ow]` as `[groups, c_out / groups, n·oh·ow]`.
fn grad_rows(g: &Tensor, groups: usize) -> Result<Tensor> {
    let [n, c_out, oh, ow] = [g.dims()[0], g.dims()[1], g.dims()[2], g.dims()[3]];
    g.reshape([n, groups, c_out / groups, oh * ow])?
        .permute(&[1, 2, 0, 3])?
        .reshape([groups, c_out / groups, n * oh * ow])
}

/// A convolution's input gradient by GEMM and fold (for problems a library convolved
/// directly but cannot differentiate): `fold(Wᵀ · g)` per group.
pub(crate) fn conv2d_input_grad_gemm(
    g: &Tensor,
    w: &Tensor,
    window: &Window2d,
    groups: usize,
) -> Result<Tensor> {
    let (c_out, k_group) = (w.dims()[0], window.col_rows() / groups);
    let wt = w
        .reshape([groups, c_out / groups, k_group])?
        .transpose(1, 2)?;
    let col = wt
        .matmul(&grad_rows(g, groups)?)?
        .reshape([window.col_rows(), window.col_cols()])?;
    let dx = col.storage().fold(col.layout(), window)?;
    Ok(Tensor::from_storage(dx, window.input_dims()))
}

/// A convolution's weight gradient by unfold and GEMM: `g · unfold(x)ᵀ` per group.
pub(crate) fn conv2d_weight_grad_gemm(
    x: &Tensor,
    g: &Tensor,
    w: &Tensor,
    window: &Window2d,
    groups: usize,
) -> Result<Tensor> {
    let k_group = window.col_rows() / groups;
    let col = x
        .unfold2d(window)?
        .reshape([groups, k_group, window.col_cols()])?
        .transpose(1, 2)?;
    grad_rows(g, groups)?
        .matmul(&col)?
        .reshape(w.shape().clone())
}

fn activate(y: Tensor, act: Option<EpilogueActivation>) -> Result<Tensor> {
    match act {
        Some(a) => y.unary(a.unary()),
        None => Ok(y),
    }
}
