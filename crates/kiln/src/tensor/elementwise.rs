//! Elementwise ops with numpy broadcasting, scalar ops, comparisons, where and casts.

use super::Tensor;
use crate::autograd::Op;
use crate::backend::BackendStorage;
use crate::op::{BinaryOp, CmpOp, UnaryOp};
use crate::{DType, Result};

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:expr;)*) => {
        impl Tensor {
            $($(#[$doc])* pub fn $name(&self) -> Result<Tensor> { self.unary($op) })*
        }
    };
}

unary_methods! {
    neg => UnaryOp::Neg;
    abs => UnaryOp::Abs;
    /// `x * x`.
    sqr => UnaryOp::Sqr;
    /// `max(x, 0)` (NaN stays NaN).
    relu => UnaryOp::Relu;
    exp => UnaryOp::Exp;
    /// Natural logarithm.
    log => UnaryOp::Log;
    sqrt => UnaryOp::Sqrt;
    /// `1 / x`.
    recip => UnaryOp::Recip;
    sin => UnaryOp::Sin;
    cos => UnaryOp::Cos;
    tanh => UnaryOp::Tanh;
    sigmoid => UnaryOp::Sigmoid;
    /// The error function, `2/√π ∫₀ˣ e^(−t²) dt`.
    erf => UnaryOp::Erf;
    /// GELU with the exact normal CDF: `0.5 x (1 + erf(x / √2))`.
    gelu => UnaryOp::GeluErf;
    /// GELU's tanh approximation: `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`.
    gelu_tanh => UnaryOp::GeluTanh;
    /// `x * sigmoid(x)`.
    silu => UnaryOp::Silu;
}

macro_rules! binary_methods {
    ($($(#[$doc:meta])* $name:ident, $scalar:ident => $op:expr;)*) => {
        impl Tensor {
            $(
                $(#[$doc])*
                /// Broadcasts the operands numpy-style.
                pub fn $name(&self, rhs: &Tensor) -> Result<Tensor> { self.binary(rhs, $op) }
                /// With a scalar right operand (cast to this tensor's dtype).
                pub fn $scalar(&self, value: f64) -> Result<Tensor> {
                    self.unary(UnaryOp::Scalar { op: $op, value, reversed: false })
                }
            )*
        }
    };
}

binary_methods! {
    add, add_scalar => BinaryOp::Add;
    sub, sub_scalar => BinaryOp::Sub;
    mul, mul_scalar => BinaryOp::Mul;
    /// Integer division truncates, and division by zero gives 0.
    div, div_scalar => BinaryOp::Div;
    /// Elementwise maximum; NaN wins.
    maximum, maximum_scalar => BinaryOp::Maximum;
    minimum, minimum_scalar => BinaryOp::Minimum;
    /// `self ^ rhs`, float dtypes.
    pow, powf => BinaryOp::Pow;
}

impl Tensor {
    /// `relu(self + rhs)` in one kernel, with broadcasting and gradients (a residual or
    /// bias add followed by ReLU).
    ///
    /// ```
    /// # use kiln::{Device, Tensor};
    /// let x = Tensor::from_vec(vec![1f32, -2., 3.], 3, &Device::Cpu)?;
    /// let b = Tensor::from_vec(vec![-1.5f32], 1, &Device::Cpu)?;
    /// assert_eq!(x.add_relu(&b)?.to_vec::<f32>()?, [0., 0., 1.5]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn add_relu(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::AddRelu)
    }

    /// `relu(self · rhs)` in one kernel, with broadcasting and gradients.
    ///
    /// ```
    /// # use kiln::{Device, Tensor};
    /// let x = Tensor::from_vec(vec![1f32, -2., 3.], 3, &Device::Cpu)?;
    /// let s = Tensor::from_vec(vec![2f32, 2., -1.], 3, &Device::Cpu)?;
    /// assert_eq!(x.mul_relu(&s)?.to_vec::<f32>()?, [2., 0., 0.]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn mul_relu(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::MulRelu)
    }

    /// `self · scale + shift` in one kernel, `scale` and `shift` broadcast to `self`'s
    /// shape (a per-channel affine map, as after a normalisation), with gradients for all
    /// three.
    ///
    /// ```
    /// # use kiln::{Device, Tensor};
    /// let x = Tensor::from_vec(vec![1f32, 2., 3., 4.], [2, 2], &Device::Cpu)?;
    /// let scale = Tensor::from_vec(vec![10f32, -1.], 2, &Device::Cpu)?;
    /// let shift = Tensor::from_vec(vec![0.5f32, 0.], 2, &Device::Cpu)?;
    /// assert_eq!(x.affine(&scale, &shift)?.to_vec::<f32>()?, [10.5, -2., 30.5, -4.]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn affine(&self, scale: &Tensor, shift: &Tensor) -> Result<Tensor> {
        self.check_same(scale, "affine")?;
        self.check_same(shift, "affine")?;
        let shape = self.shape().clone();
        let bcast = |t: &Tensor| {
            t.layout
                .broadcast_as(shape.clone())
                .map_err(|_| crate::Error::BroadcastIncompatible {
                    op: "affine",
                    lhs: shape.clone(),
                    rhs: t.shape().clone(),
                })
        };
        let (sl, hl) = (bcast(scale)?, bcast(shift)?);
        let s =
            self.storage()
                .affine(&self.layout, &scale.storage(), &sl, &shift.storage(), &hl)?;
        let out = Tensor::from_storage(s, shape);
        let inputs = [self, scale, shift];
        if !crate::grad_enabled() || inputs.iter().all(|t| !t.requires_grad()) {
            return Ok(out);
        }
        let (x, sc) = (self.detach(), scale.detach());
        let (scale_shape, shift_shape) = (scale.shape().clone(), shift.shape().clone());
        let backward = move |g: &Tensor| -> Result<Vec<Option<Tensor>>> {
            Ok(vec![
                Some(g.mul(&sc)?),
                Some(crate::autograd::sum_to_shape(&g.mul(&x)?, &scale_shape)?),
                Some(crate::autograd::sum_to_shape(g, &shift_shape)?),
            ])
        };
        Ok(Tensor::custom_op(
            out,
            vec![self.clone(), scale.clone(), shift.clone()],
            Box::new(backward),
        ))
    }

    /// ReLU's backward in one op: `self` (the gradient) where `input > 0`, else 0.
    /// Broadcasts numpy-style.
    ///
    /// ```
    /// # use kiln::{Device, Tensor};
    /// let g = Tensor::from_vec(vec![1f32, 2., 3.], 3, &Device::Cpu)?;
    /// let x = Tensor::from_vec(vec![-1f32, 0., 5.], 3, &Device::Cpu)?;
    /// assert_eq!(g.relu_grad(&x)?.to_vec::<f32>()?, [0., 0., 3.]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn relu_grad(&self, input: &Tensor) -> Result<Tensor> {
        self.binary(input, BinaryOp::ReluGrad)
    }
}

macro_rules! cmp_methods {
    ($($name:ident, $scalar:ident => $op:expr;)*) => {
        impl Tensor {
            $(
                /// Elementwise comparison with broadcasting, as a `u8` tensor of 0 and 1.
                pub fn $name(&self, rhs: &Tensor) -> Result<Tensor> { self.compare(rhs, $op) }
                /// Comparison with a scalar (cast to this tensor's dtype), as `u8` 0 and 1.
                pub fn $scalar(&self, value: f64) -> Result<Tensor> {
                    self.compare(&Tensor::scalar(value, self.dtype, &self.device)?, $op)
                }
            )*
        }
    };
}

cmp_methods! {
    eq, eq_scalar => CmpOp::Eq;
    ne, ne_scalar => CmpOp::Ne;
    lt, lt_scalar => CmpOp::Lt;
    le, le_scalar => CmpOp::Le;
    gt, gt_scalar => CmpOp::Gt;
    ge, ge_scalar => CmpOp::Ge;
}

impl Tensor {
    /// Applies a primitive unary op.
    pub fn unary(&self, op: UnaryOp) -> Result<Tensor> {
        if let UnaryOp::Scalar {
            op: sop @ (BinaryOp::AddRelu | BinaryOp::MulRelu | BinaryOp::CountFinite),
            ..
        } = op
        {
            return Err(crate::Error::Msg(format!(
                "{}: no scalar form; use {} with a one-element tensor",
                op.name(),
                sop.name()
            )));
        }
        let s = self.storage().unary(&self.layout, op)?;
        let out = Tensor::from_storage(s, self.shape().clone());
        Ok(out.tracked_out(&[self], |out| Op::Unary {
            x: self.clone(),
            op,
            out,
        }))
    }

    /// Applies a primitive binary op after broadcasting both operands to a common shape.
    pub fn binary(&self, rhs: &Tensor, op: BinaryOp) -> Result<Tensor> {
        self.check_same(rhs, op.name())?;
        let (s, shape) = if self.shape() == rhs.shape() {
            // Equal shapes (the common case) need no broadcast layouts.
            let s = self
                .storage()
                .binary(&self.layout, &rhs.storage(), &rhs.layout, op)?;
            (s, self.shape().clone())
        } else {
            let shape = self.shape().broadcast_with(rhs.shape(), op.name())?;
            let (l, r) = (
                self.layout.broadcast_as(shape.clone())?,
                rhs.layout.broadcast_as(shape.clone())?,
            );
            (self.storage().binary(&l, &rhs.storage(), &r, op)?, shape)
        };
        let out = Tensor::from_storage(s, shape);
        Ok(out.tracked_out(&[self, rhs], |out| Op::Binary {
            a: self.clone(),
            b: rhs.clone(),
            op,
            out,
        }))
    }

    /// Compares after broadcasting; the result is `u8` 0/1.
    pub fn compare(&self, rhs: &Tensor, op: CmpOp) -> Result<Tensor> {
        self.check_same(rhs, op.name())?;
        let shape = self.shape().broadcast_with(rhs.shape(), op.name())?;
        let (l, r) = (
            self.layout.broadcast_as(shape.clone())?,
            rhs.layout.broadcast_as(shape.clone())?,
        );
        let s = self.storage().compare(&l, &rhs.storage(), &r, op)?;
        Ok(Tensor::from_storage(s, shape))
    }

    /// `value - self`.
    pub fn rsub_scalar(&self, value: f64) -> Result<Tensor> {
        self.unary(UnaryOp::Scalar {
            op: BinaryOp::Sub,
            value,
            reversed: true,
        })
    }

    /// `value / self`.
    pub fn rdiv_scalar(&self, value: f64) -> Result<Tensor> {
        self.unary(UnaryOp::Scalar {
            op: BinaryOp::Div,
            value,
            reversed: true,
        })
    }

    /// Clamps into `[min, max]`.
    pub fn clamp(&self, min: f64, max: f64) -> Result<Tensor> {
        self.unary(UnaryOp::Clamp(min, max))
    }

    /// `self != 0 ? on_true : on_false`, broadcasting all three; `self` may have any dtype.
    ///
    /// ```
    /// # use kiln::{Device, DType, Tensor};
    /// let x = Tensor::from_vec(vec![-1f32, 2., -3.], 3, &Device::Cpu)?;
    /// let y = x.gt_scalar(0.0)?.where_cond(&x, &x.zeros_like()?)?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![0., 2., 0.]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn where_cond(&self, on_true: &Tensor, on_false: &Tensor) -> Result<Tensor> {
        self.check_device(on_true, "where_cond")?;
        on_true.check_same(on_false, "where_cond")?;
        let shape = self
            .shape()
            .broadcast_with(on_true.shape(), "where_cond")?
            .broadcast_with(on_false.shape(), "where_cond")?;
        let c = self.layout.broadcast_as(shape.clone())?;
        let t = on_true.layout.broadcast_as(shape.clone())?;
        let f = on_false.layout.broadcast_as(shape.clone())?;
        let s = self
            .storage()
            .where_cond(&c, &on_true.storage(), &t, &on_false.storage(), &f)?;
        let out = Tensor::from_storage(s, shape);
        Ok(out.tracked(&[on_true, on_false], || Op::Where {
            cond: self.detach(),
            t: on_true.clone(),
            f: on_false.clone(),
        }))
    }

    /// Converts to `dtype` (a no-op returning `self` when it already has it).
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype {
            return Ok(self.clone());
        }
        let s = self.storage().cast(&self.layout, dtype)?;
        let out = Tensor::from_storage(s, self.shape().clone());
        Ok(out.tracked(&[self], || Op::Cast { x: self.clone() }))
    }
}

macro_rules! std_ops {
    ($trait:ident, $method:ident, $tensor_fn:ident, $scalar_fn:ident) => {
        impl std::ops::$trait<&Tensor> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                Tensor::$tensor_fn(&self, rhs)
            }
        }
        impl std::ops::$trait<Tensor> for Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                Tensor::$tensor_fn(&self, &rhs)
            }
        }
        impl std::ops::$trait<&Tensor> for Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                Tensor::$tensor_fn(&self, rhs)
            }
        }
        impl std::ops::$trait<f64> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: f64) -> Result<Tensor> {
                Tensor::$scalar_fn(&self, rhs)
            }
        }
        impl std::ops::$trait<f64> for Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: f64) -> Result<Tensor> {
                Tensor::$scalar_fn(&self, rhs)
            }
        }
    };
}

std_ops!(Add, add, add, add_scalar);
std_ops!(Sub, sub, sub, sub_scalar);
std_ops!(Mul, mul, mul, mul_scalar);
std_ops!(Div, div, div, div_scalar);

impl std::ops::Neg for &Tensor {
    type Output = Result<Tensor>;
    fn neg(self) -> Result<Tensor> {
        Tensor::neg(self)
    }
}
