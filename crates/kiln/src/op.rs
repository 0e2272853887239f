//! The primitive operations every backend implements, as plain enums.

/// Elementwise operations of one tensor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UnaryOp {
    Neg,
    Abs,
    Sqr,
    Relu,
    /// Float only from here on.
    Exp,
    Log,
    Sqrt,
    Recip,
    Sin,
    Cos,
    Tanh,
    Sigmoid,
    /// The error function.
    Erf,
    /// `x * Φ(x)` with the exact normal CDF (erf).
    GeluErf,
    /// The tanh approximation of GELU.
    GeluTanh,
    Silu,
    /// d/dx of `GeluErf` (used by its gradient rule).
    GeluErfGrad,
    /// d/dx of `GeluTanh` (used by its gradient rule).
    GeluTanhGrad,
    /// Clamps into `[min, max]`.
    Clamp(f64, f64),
    /// `x op value` (or `value op x` when `reversed`), the scalar cast to the tensor's dtype.
    Scalar {
        op: BinaryOp,
        value: f64,
        reversed: bool,
    },
}

impl UnaryOp {
    pub fn name(&self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Sqr => "sqr",
            UnaryOp::Relu => "relu",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Recip => "recip",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Erf => "erf",
            UnaryOp::GeluErf => "gelu",
            UnaryOp::GeluTanh => "gelu_tanh",
            UnaryOp::Silu => "silu",
            UnaryOp::GeluErfGrad => "gelu_grad",
            UnaryOp::GeluTanhGrad => "gelu_tanh_grad",
            UnaryOp::Clamp(..) => "clamp",
            UnaryOp::Scalar { op, .. } => op.scalar_name(),
        }
    }

    /// Whether integer dtypes support this op.
    pub fn supports_int(&self) -> bool {
        match self {
            UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sqr | UnaryOp::Relu | UnaryOp::Clamp(..) => true,
            UnaryOp::Scalar { op, .. } => *op != BinaryOp::Pow,
            _ => false,
        }
    }
}

/// Elementwise operations of two tensors of one dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Maximum,
    Minimum,
    /// Float only.
    Pow,
    /// `rhs > 0 ? lhs : 0`: ReLU's backward, the gradient `lhs` passed where the input
    /// `rhs` was positive (one kernel instead of a compare, a fill and a select).
    ReluGrad,
    /// `relu(lhs + rhs)` in one pass (a residual or bias add followed by ReLU).
    AddRelu,
    /// `relu(lhs · rhs)` in one pass (a gate or scale followed by ReLU).
    MulRelu,
    /// `lhs + 1` where `rhs` is finite, else `lhs`: with `rhs` a running sum (whose first
    /// NaN or infinity stays non-finite), `lhs` counts the steps before a run diverged,
    /// kept on the device (see [`crate::Tensor::count_finite_assign`]). No gradient.
    CountFinite,
}

impl BinaryOp {
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Maximum => "maximum",
            BinaryOp::Minimum => "minimum",
            BinaryOp::Pow => "pow",
            BinaryOp::ReluGrad => "relu_grad",
            BinaryOp::AddRelu => "add_relu",
            BinaryOp::MulRelu => "mul_relu",
            BinaryOp::CountFinite => "count_finite",
        }
    }

    fn scalar_name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add_scalar",
            BinaryOp::Sub => "sub_scalar",
            BinaryOp::Mul => "mul_scalar",
            BinaryOp::Div => "div_scalar",
            BinaryOp::Maximum => "maximum_scalar",
            BinaryOp::Minimum => "minimum_scalar",
            BinaryOp::Pow => "powf",
            BinaryOp::ReluGrad => "relu_grad_scalar",
            BinaryOp::AddRelu => "add_relu_scalar",
            BinaryOp::MulRelu => "mul_relu_scalar",
            BinaryOp::CountFinite => "count_finite_scalar",
        }
    }
}

/// The activation a matrix product applies in its epilogue (see
/// [`crate::Tensor::matmul_bias_act`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EpilogueActivation {
    Relu,
    /// GELU, tanh approximation (the form cuBLASLt's epilogue computes).
    GeluTanh,
}

impl EpilogueActivation {
    /// The element-wise op it applies.
    pub fn unary(self) -> UnaryOp {
        match self {
            EpilogueActivation::Relu => UnaryOp::Relu,
            EpilogueActivation::GeluTanh => UnaryOp::GeluTanh,
        }
    }
}

/// Comparisons; the result is a `u8` tensor of 0 and 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    pub fn name(self) -> &'static str {
        match self {
            CmpOp::Eq => "eq",
            CmpOp::Ne => "ne",
            CmpOp::Lt => "lt",
            CmpOp::Le => "le",
            CmpOp::Gt => "gt",
            CmpOp::Ge => "ge",
        }
    }
}

/// Reductions over a set of dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
    /// Index of the first maximum (`i64`); NaN counts as the maximum.
    ArgMax,
    /// Index of the first minimum (`i64`); NaN counts as the minimum.
    ArgMin,
}

impl ReduceOp {
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::ArgMax => "argmax",
            ReduceOp::ArgMin => "argmin",
        }
    }
}

/// One fused, in-place optimizer step over a parameter, its gradient and its state buffers
/// (the formulas of `torch.optim`). Math runs in f32 (f64 for f64 parameters) with one
/// rounding per stored value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UpdateRule {
    /// `g += wd·p; v = μ·v + g; p -= lr·(nesterov ? g + μ·v : v)`; state: `[v]` when
    /// `momentum != 0`, else none.
    Sgd {
        lr: f64,
        momentum: f64,
        nesterov: bool,
        weight_decay: f64,
    },
    /// Adam (`decoupled = false`: `g += wd·p`) or AdamW (`decoupled`: `p *= 1 − lr·wd`), then
    /// `m = β1·m + (1−β1)·g; v = β2·v + (1−β2)·g²; p -= lr/bc1 · m / (√(v/bc2) + ε)` with the
    /// bias corrections `bc = 1 − β^step`; state: `[m, v]`.
    Adam {
        lr: f64,
        beta1: f64,
        beta2: f64,
        eps: f64,
        weight_decay: f64,
        decoupled: bool,
        step: u64,
    },
}

impl UpdateRule {
    pub fn name(&self) -> &'static str {
        match self {
            UpdateRule::Sgd { .. } => "sgd_update",
            UpdateRule::Adam { .. } => "adam_update",
        }
    }

    /// Adam's bias-corrected step size `lr / (1 − β1^step)` and `1 / (1 − β2^step)`, as every
    /// backend applies them; `None` for other rules.
    pub fn adam_scales(&self) -> Option<(f64, f64)> {
        match *self {
            UpdateRule::Adam {
                lr,
                beta1,
                beta2,
                step,
                ..
            } => Some((
                lr / (1.0 - beta1.powi(step as i32)),
                1.0 / (1.0 - beta2.powi(step as i32)),
            )),
            UpdateRule::Sgd { .. } => None,
        }
    }

    /// This rule with the learning rate and step count of a schedule buffer `[lr, step]`
    /// (the layout of the f64 tensor [`crate::Tensor::apply_update_group_scheduled`] reads).
    pub fn with_schedule(self, lr_now: f64, step_now: f64) -> UpdateRule {
        match self {
            UpdateRule::Sgd {
                momentum,
                nesterov,
                weight_decay,
                ..
            } => UpdateRule::Sgd {
                lr: lr_now,
                momentum,
                nesterov,
                weight_decay,
            },
            UpdateRule::Adam {
                beta1,
                beta2,
                eps,
                weight_decay,
                decoupled,
                ..
            } => UpdateRule::Adam {
                lr: lr_now,
                beta1,
                beta2,
                eps,
                weight_decay,
                decoupled,
                step: step_now.max(0.0) as u64,
            },
        }
    }

    /// How many state buffers the rule reads and writes.
    pub fn state_len(&self) -> usize {
        match self {
            UpdateRule::Sgd { momentum, .. } => usize::from(*momentum != 0.0),
            UpdateRule::Adam { .. } => 2,
        }
    }
}

/// What the fused softmax cross-entropy primitive returns for logits `[N, C]`: per-row
/// losses scaled by `scale` (so that their sum is the loss a caller wants, e.g. the mean with
/// `scale = 1/N`), the gradient of that sum and a per-row 0/1 "argmax was the label".
#[derive(Debug)]
pub struct CrossEntropyRows<S> {
    /// `[N]`, logits' dtype: `scale · (logsumexp(x) − Σ_j q_j x_j)` with `q = (1−ε)·onehot + ε/C`.
    pub loss: S,
    /// `[N, C]`, logits' dtype: `scale · (softmax(x) − q)`.
    pub grad: S,
    /// `[N]`, f32: 1 where the first maximum of the row is at the label.
    pub correct: S,
}

/// Where a sliding 2-D window (a convolution's kernel or a pooling window) visits an NCHW
/// input `[n, c, h, w]`: output row `oh` reads input rows `oh·stride − padding + i·dilation`
/// for `i < kernel`, zeros (or, for max-pooling, nothing) outside the input.
///
/// Invariants, checked by [`Window2d::new`]: every extent and stride is positive, and the
/// dilated kernel fits in the padded input, so the output has at least one row and column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Window2d {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
}

impl Window2d {
    /// The window of `kernel` over `input` (`[n, c, h, w]`), or an error naming `op`, the
    /// input shape and the kernel.
    ///
    /// ```
    /// # use kiln::op::Window2d;
    /// let w = Window2d::new("conv2d", &[8, 3, 28, 28], [5, 5], [1, 1], [2, 2], [1, 1])?;
    /// assert_eq!(w.out_hw(), [28, 28]);
    /// assert_eq!((w.col_rows(), w.col_cols()), (3 * 25, 8 * 28 * 28));
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn new(
        op: &'static str,
        input: &[usize],
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
    ) -> crate::Result<Window2d> {
        let err = |msg: String| crate::Error::WindowShape {
            op,
            input: crate::Shape::from(input),
            kernel,
            msg,
        };
        let &[n, c, h, w] = input else {
            return Err(err("the input must be 4-D [N, C, H, W]".into()));
        };
        if kernel.contains(&0) || stride.contains(&0) || dilation.contains(&0) {
            return Err(err(format!(
                "kernel, stride and dilation must be positive (stride {stride:?}, dilation {dilation:?})"
            )));
        }
        if n == 0 || c == 0 {
            return Err(err("the batch and channel extents must be positive".into()));
        }
        for (axis, (&size, name)) in [h, w].iter().zip(["height", "width"]).enumerate() {
            let padded = size + 2 * padding[axis];
            let reach = dilation[axis] * (kernel[axis] - 1) + 1;
            if reach > padded {
                return Err(err(format!(
                    "the kernel spans {reach} along the {name} (dilation {}), more than the \
                     padded input's {padded}",
                    dilation[axis]
                )));
            }
        }
        Ok(Window2d {
            n,
            c,
            h,
            w,
            kernel,
            stride,
            padding,
            dilation,
        })
    }

    /// `[out_h, out_w]`: `(size + 2·padding − dilation·(kernel − 1) − 1) / stride + 1`.
    pub fn out_hw(&self) -> [usize; 2] {
        let out = |axis: usize, size: usize| {
            (size + 2 * self.padding[axis] - self.dilation[axis] * (self.kernel[axis] - 1) - 1)
                / self.stride[axis]
                + 1
        };
        [out(0, self.h), out(1, self.w)]
    }

    /// The window whose forward convolution computes this one's input gradient, for
    /// `c_out` output channels: the output gradient (`c_out` channels, `oh × ow`) convolved
    /// with the flipped filter at stride 1 and padding `dilation·(k − 1) − padding`, giving
    /// `[n, c, h, w]`. `None` for strides above 1 or padding wider than the kernel's reach.
    ///
    /// ```
    /// # use kiln::op::Window2d;
    /// let w = Window2d::new("conv2d", &[2, 3, 11, 9], [5, 3], [1, 1], [2, 0], [1, 2])?;
    /// let t = w.input_gradient_window(7).unwrap();
    /// assert_eq!((t.c, [t.h, t.w], t.padding), (7, w.out_hw(), [2, 4]));
    /// assert_eq!(t.out_hw(), [11, 9]);
    /// let strided = Window2d::new("conv2d", &[2, 3, 11, 9], [3, 3], [2, 1], [1, 1], [1, 1])?;
    /// assert!(strided.input_gradient_window(7).is_none());
    /// let wide_pad = Window2d::new("conv2d", &[2, 3, 11, 9], [3, 3], [1, 1], [3, 1], [1, 1])?;
    /// assert!(wide_pad.input_gradient_window(7).is_none());
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn input_gradient_window(&self, c_out: usize) -> Option<Window2d> {
        if self.stride != [1, 1] {
            return None;
        }
        let pad = |i: usize| ((self.kernel[i] - 1) * self.dilation[i]).checked_sub(self.padding[i]);
        let [oh, ow] = self.out_hw();
        let t = Window2d {
            n: self.n,
            c: c_out,
            h: oh,
            w: ow,
            kernel: self.kernel,
            stride: [1, 1],
            padding: [pad(0)?, pad(1)?],
            dilation: self.dilation,
        };
        debug_assert_eq!(t.out_hw(), [self.h, self.w]);
        Some(t)
    }

    /// Rows of the unfolded input (im2col): `c · kernel_h · kernel_w`.
    pub fn col_rows(&self) -> usize {
        self.c * self.kernel[0] * self.kernel[1]
    }

    /// Columns of the unfolded input: `n · out_h · out_w`.
    pub fn col_cols(&self) -> usize {
        let [oh, ow] = self.out_hw();
        self.n * oh * ow
    }

    /// The input shape `[n, c, h, w]`.
    pub fn input_dims(&self) -> [usize; 4] {
        [self.n, self.c, self.h, self.w]
    }

    /// The pooled shape `[n, c, out_h, out_w]`.
    pub fn output_dims(&self) -> [usize; 4] {
        let [oh, ow] = self.out_hw();
        [self.n, self.c, oh, ow]
    }
}

/// What a pooling window computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolKind {
    /// The largest element (NaN wins); the gradient goes to its position.
    Max,
    /// The mean over the whole window, padding counted as zeros (PyTorch's
    /// `count_include_pad=True`).
    Avg,
}

impl PoolKind {
    pub fn name(self) -> &'static str {
        match self {
            PoolKind::Max => "max_pool2d",
            PoolKind::Avg => "avg_pool2d",
        }
    }
}

/// SplitMix64's finaliser: a bijective mix of 64 bits, the hash of the dropout masks (the
/// CUDA kernel `dropout_mask` computes the same function).
#[inline]
fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// How a dropout mask is drawn ([`crate::DropoutStream`]; the descriptor that
/// `BackendStorage::dropout_mask` takes): element `i` of the mask of step `step` of stream
/// `seed` is kept when 24 bits of `splitmix(key ^ i)` reach `threshold`, `key` mixing seed
/// and step. Every backend draws the same masks from the same seed and step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DropoutDraw {
    pub seed: u64,
    /// Elements whose 24-bit draw is below this are dropped: `ceil(p · 2^24)`.
    pub threshold: u32,
    /// The value of a kept element, `1 / (1 - p)`.
    pub scale: f64,
}

impl DropoutDraw {
    pub fn new(seed: u64, p: f64) -> DropoutDraw {
        DropoutDraw {
            seed,
            threshold: (p * (1u64 << 24) as f64).ceil() as u32,
            scale: 1.0 / (1.0 - p),
        }
    }

    /// The key of step `step`: the same for every element of one mask.
    #[inline]
    pub fn key(&self, step: u64) -> u64 {
        splitmix(self.seed.wrapping_add(splitmix(step)))
    }

    /// Whether element `i` of the mask with key `key` is kept.
    #[inline]
    pub fn keeps(&self, key: u64, i: u64) -> bool {
        (splitmix(key ^ i) >> 40) as u32 >= self.threshold
    }
}
