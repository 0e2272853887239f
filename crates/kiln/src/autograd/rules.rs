//! Gradient rules: for each op, the gradients of its inputs from the gradient `g` of its
//! output, written with tensor ops (so they run on any device). They run under `no_grad`.

use super::Op;
use crate::backend::{BackendStorage, WindowStorage};
use crate::layout::Layout;
use crate::op::{BinaryOp, CmpOp, EpilogueActivation, UnaryOp};
use crate::shape::Shape;
use crate::storage::Storage;
use crate::{Error, Result, Tensor};

/// Sums `g` down to `shape` over the dims that broadcasting expanded.
pub(crate) fn sum_to_shape(g: &Tensor, shape: &Shape) -> Result<Tensor> {
    if g.shape() == shape {
        return Ok(g.clone());
    }
    let lead = g.rank() - shape.rank();
    let mut dims: Vec<usize> = (0..lead).collect();
    for (i, &d) in shape.dims().iter().enumerate() {
        if d == 1 && g.dims()[lead + i] != 1 {
            dims.push(lead + i);
        }
    }
    g.sum(dims, true)?.reshape(shape.clone())
}

/// `mask != 0 ? g : 0`.
fn masked(mask: &Tensor, g: &Tensor) -> Result<Tensor> {
    mask.where_cond(g, &g.zeros_like()?)
}

/// Zeros of `x`'s shape with `g` written at elements `start..end` (step `step`) of `dim`.
fn slice_scatter(
    x: &Tensor,
    g: &Tensor,
    dim: usize,
    start: usize,
    end: usize,
    step: usize,
) -> Result<Tensor> {
    let shape = x.shape().clone();
    let mut out = Storage::full(0.0, shape.elem_count(), g.dtype(), g.device())?;
    let dst = Layout::contiguous(shape.clone()).slice(dim, start, end, step)?;
    g.storage().copy_into(g.layout(), &mut out, &dst)?;
    Ok(Tensor::from_storage(out, shape))
}

/// `ids` (1-D, along `dim`) shaped to broadcast against a tensor of `shape`.
fn ids_along(ids: &Tensor, shape: &Shape, dim: usize) -> Result<Tensor> {
    let mut s = vec![1; shape.rank()];
    s[dim] = ids.elem_count();
    ids.reshape(s)?.broadcast_as(shape.clone())
}

/// The input and weight gradients of a convolution (no bias) for the output gradient `g`:
/// the backend's library, or (where it has no algorithm) GEMMs and fold/unfold.
fn conv2d_grads(
    x: &Tensor,
    w: &Tensor,
    window: &crate::op::Window2d,
    groups: usize,
    g: &Tensor,
    (want_x, want_w): (bool, bool),
) -> Result<(Option<Tensor>, Option<Tensor>)> {
    let gx = if want_x {
        let direct = g.storage().conv2d_backward_input(
            g.layout(),
            &w.storage(),
            w.layout(),
            window,
            groups,
        )?;
        Some(match direct {
            Some(s) => Tensor::from_storage(s, window.input_dims()),
            None => crate::tensor::conv2d_input_grad_gemm(g, w, window, groups)?,
        })
    } else {
        None
    };
    let gw = if want_w {
        let d = w.dims();
        let direct = x.storage().conv2d_backward_weight(
            x.layout(),
            &g.storage(),
            g.layout(),
            window,
            groups,
            [d[0], d[1], d[2], d[3]],
        )?;
        Some(match direct {
            Some(s) => Tensor::from_storage(s, w.shape().clone()),
            None => crate::tensor::conv2d_weight_grad_gemm(x, g, w, window, groups)?,
        })
    } else {
        None
    };
    Ok((gx, gw))
}

/// [`backward`] of a ReLU (`Unary` ReLU, `Conv2dBiasAct` with `relu`) whose `g` is already
/// zero wherever its output is (the engine moved the mask in front of a max-pooling), and
/// whose bias gradient the engine may have computed already.
pub(super) fn backward_masked(
    op: &Op,
    g: &Tensor,
    needs: &[bool],
    bias_grad: Option<Tensor>,
) -> Result<Vec<Option<Tensor>>> {
    match op {
        Op::Unary {
            op: UnaryOp::Relu, ..
        } => Ok(vec![Some(g.clone())]),
        Op::Conv2dBiasAct {
            x,
            w,
            window,
            groups,
            relu: true,
            ..
        } => conv2d_bias_grads((x, w, window, *groups), g, needs, bias_grad),
        _ => Err(crate::Error::Msg(
            "backward: a pre-masked gradient reached an op that is no ReLU".into(),
        )),
    }
}

/// The gradients of a `Conv2dBiasAct`'s input, filter and bias from the gradient `gp` of
/// its sum (after the ReLU's mask); the bias gradient is `bias_grad` where given.
fn conv2d_bias_grads(
    (x, w, window, groups): (&Tensor, &Tensor, &crate::op::Window2d, usize),
    gp: &Tensor,
    needs: &[bool],
    bias_grad: Option<Tensor>,
) -> Result<Vec<Option<Tensor>>> {
    let want = |i: usize| needs.get(i).copied().unwrap_or(true);
    // Where the backend sums the bias in the weight gradient's own pass over `gp`.
    if bias_grad.is_none() && want(1) && want(2) {
        let d = w.dims();
        let fused = x.storage().conv2d_backward_weight_bias(
            x.layout(),
            &gp.storage(),
            gp.layout(),
            window,
            groups,
            [d[0], d[1], d[2], d[3]],
        )?;
        if let Some((gw, gb)) = fused {
            let (gx, _) = conv2d_grads(x, w, window, groups, gp, (want(0), false))?;
            let gw = Tensor::from_storage(gw, w.shape().clone());
            let gb = Tensor::from_storage(gb, [d[0]]);
            return Ok(vec![gx, Some(gw), Some(gb)]);
        }
    }
    let (gx, gw) = conv2d_grads(x, w, window, groups, gp, (want(0), want(1)))?;
    let gb = match bias_grad {
        Some(gb) => Some(gb),
        None if want(2) => Some(gp.sum(vec![0, 2, 3], false)?),
        None => None,
    };
    Ok(vec![gx, gw, gb])
}

/// Gradients of `op`'s inputs; `needs[i]` says whether input `i` wants one (rules skip the
/// work for inputs that do not, such as the data fed to a layer).
pub(super) fn backward(op: &Op, g: &Tensor, needs: &[bool]) -> Result<Vec<Option<Tensor>>> {
    let want = |i: usize| needs.get(i).copied().unwrap_or(true);
    Ok(match op {
        Op::Leaf => vec![],
        Op::Unary { x, op, out } => vec![Some(unary(x, *op, out, g)?)],
        Op::Binary { a, b, op, out } => {
            let (ga, gb) = binary(a, b, *op, out, g, (want(0), want(1)))?;
            vec![
                ga.map(|t| sum_to_shape(&t, a.shape())).transpose()?,
                gb.map(|t| sum_to_shape(&t, b.shape())).transpose()?,
            ]
        }
        Op::Where { cond, t, f } => {
            let zeros = g.zeros_like()?;
            let gt = cond.where_cond(g, &zeros)?;
            let gf = cond.where_cond(&zeros, g)?;
            vec![
                Some(sum_to_shape(&gt, t.shape())?),
                Some(sum_to_shape(&gf, f.shape())?),
            ]
        }
        Op::Cast { x } => vec![Some(g.to_dtype(x.dtype())?)],
        Op::Transpose { d0, d1, .. } => vec![Some(g.transpose(*d0, *d1)?)],
        Op::Permute { perm, .. } => {
            let mut inv = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inv[p] = i;
            }
            vec![Some(g.permute(&inv)?)]
        }
        Op::Slice {
            x,
            dim,
            start,
            end,
            step,
        } => vec![Some(slice_scatter(x, g, *dim, *start, *end, *step)?)],
        Op::Broadcast { x } => vec![Some(sum_to_shape(g, x.shape())?)],
        Op::Reshape { x } => vec![Some(g.reshape(x.shape().clone())?)],
        Op::Copy { .. } => vec![Some(g.clone())],
        Op::Sum { x, .. } => vec![Some(g.broadcast_as(x.shape().clone())?)],
        Op::Extremum { x, out } => {
            // Every position equal to the extremum receives the gradient.
            let hit = x.eq(&out.broadcast_as(x.shape().clone())?)?;
            vec![Some(masked(&hit, &g.broadcast_as(x.shape().clone())?)?)]
        }
        Op::Softmax { out, dim, log, .. } => {
            let gx = if *log {
                // d log_softmax: g - softmax * sum(g)
                g.sub(&out.exp()?.mul(&g.sum(*dim, true)?)?)?
            } else {
                // d softmax: out * (g - sum(g * out))
                out.mul(&g.sub(&g.mul(out)?.sum(*dim, true)?)?)?
            };
            vec![Some(gx)]
        }
        Op::LogSumExp { x, out } => {
            // d lse / dx = e^(x - lse), the softmax along the reduced dim.
            let shape = x.shape().clone();
            let p = x.sub(&out.broadcast_as(shape.clone())?)?.exp()?;
            vec![Some(p.mul(&g.broadcast_as(shape)?)?)]
        }
        Op::MatmulBias { .. } | Op::MatmulBiasAct { .. } => {
            let g = linear_output_grad(op, g)?;
            linear_grads(op, &g, [want(0), want(1), want(2)])?
        }
        Op::Matmul { a, b } => {
            // Transposed views go to the GEMM as flags: no copies.
            let ga = if want(0) {
                Some(sum_to_shape(&g.matmul(&b.t()?)?, a.shape())?)
            } else {
                None
            };
            let gb = if want(1) {
                Some(sum_to_shape(&a.t()?.matmul(g)?, b.shape())?)
            } else {
                None
            };
            vec![ga, gb]
        }
        Op::Cat { xs, dim } => {
            let mut start = 0;
            let mut out = Vec::with_capacity(xs.len());
            for x in xs {
                let len = x.dims()[*dim];
                out.push(Some(g.narrow(*dim, start, len)?));
                start += len;
            }
            out
        }
        Op::IndexSelect { x, ids, dim } => {
            let spread = ids_along(ids, g.shape(), *dim)?;
            vec![Some(x.zeros_like()?.scatter_add(&spread, g, *dim)?)]
        }
        Op::Gather { x, ids, dim } => vec![Some(x.zeros_like()?.scatter_add(ids, g, *dim)?)],
        Op::ScatterAdd { ids, dim, .. } => vec![Some(g.clone()), Some(g.gather(ids, *dim)?)],
        Op::Conv2d {
            x,
            w,
            window,
            groups,
        } => {
            let (gx, gw) = conv2d_grads(x, w, window, *groups, g, (want(0), want(1)))?;
            vec![gx, gw]
        }
        Op::Conv2dBiasAct {
            x,
            w,
            window,
            groups,
            relu,
            out,
            ..
        } => {
            // The output is positive exactly where the ReLU passed the sum through.
            let gp = if *relu { g.relu_grad(out)? } else { g.clone() };
            conv2d_bias_grads((x, w, window, *groups), &gp, needs, None)?
        }
        Op::Unfold { window, .. } => {
            let dx = g.storage().fold(g.layout(), window)?;
            vec![Some(Tensor::from_storage(dx, window.input_dims()))]
        }
        Op::Pool {
            argmax,
            window,
            kind,
            ..
        } => {
            let ids = argmax.as_ref().map(|a| a.storage());
            let dx = g
                .storage()
                .pool_backward(g.layout(), ids.as_deref(), window, *kind)?;
            vec![Some(Tensor::from_storage(dx, window.input_dims()))]
        }
        Op::Custom { backward, .. } => backward(g)?,
    })
}

fn unary(x: &Tensor, op: UnaryOp, out: &Tensor, g: &Tensor) -> Result<Tensor> {
    Ok(match op {
        UnaryOp::Neg => g.neg()?,
        UnaryOp::Abs => {
            let sign = x
                .gt_scalar(0.0)?
                .to_dtype(g.dtype())?
                .sub(&x.lt_scalar(0.0)?.to_dtype(g.dtype())?)?;
            g.mul(&sign)?
        }
        UnaryOp::Sqr => g.mul(x)?.mul_scalar(2.0)?,
        UnaryOp::Relu => g.relu_grad(x)?,
        UnaryOp::Exp => g.mul(out)?,
        UnaryOp::Log => g.div(x)?,
        UnaryOp::Sqrt => g.div(out)?.mul_scalar(0.5)?,
        UnaryOp::Recip => g.mul(&out.sqr()?)?.neg()?,
        UnaryOp::Sin => g.mul(&x.cos()?)?,
        UnaryOp::Cos => g.mul(&x.sin()?)?.neg()?,
        UnaryOp::Tanh => g.mul(&out.sqr()?.rsub_scalar(1.0)?)?,
        UnaryOp::Sigmoid => g.mul(&out.mul(&out.rsub_scalar(1.0)?)?)?,
        // d/dx erf = 2/√π · e^(−x²)
        UnaryOp::Erf => g.mul(
            &x.sqr()?
                .neg()?
                .exp()?
                .mul_scalar(std::f64::consts::FRAC_2_SQRT_PI)?,
        )?,
        UnaryOp::GeluErf => g.mul(&x.unary(UnaryOp::GeluErfGrad)?)?,
        UnaryOp::GeluTanh => g.mul(&x.unary(UnaryOp::GeluTanhGrad)?)?,
        // d/dx x·s(x) = s + x·s·(1 − s)
        UnaryOp::Silu => {
            let s = x.sigmoid()?;
            g.mul(&s.add(&x.mul(&s)?.mul(&s.rsub_scalar(1.0)?)?)?)?
        }
        UnaryOp::GeluErfGrad | UnaryOp::GeluTanhGrad => {
            return Err(crate::Error::Msg(format!(
                "{} has no gradient (second derivatives are not supported)",
                op.name()
            )));
        }
        UnaryOp::Clamp(lo, hi) => {
            let inside = x.ge_scalar(lo)?.mul(&x.le_scalar(hi)?)?;
            masked(&inside, g)?
        }
        UnaryOp::Scalar {
            op,
            value,
            reversed,
        } => match (op, reversed) {
            (BinaryOp::Add, _) | (BinaryOp::Sub, false) => g.clone(),
            (BinaryOp::Sub, true) => g.neg()?,
            (BinaryOp::Mul, _) => g.mul_scalar(value)?,
            (BinaryOp::Div, false) => g.mul_scalar(1.0 / value)?,
            // d(v/x) = -v/x² = -out/x
            (BinaryOp::Div, true) => g.mul(&out.div(x)?)?.neg()?,
            (BinaryOp::Maximum, _) => masked(&x.compare(&scalar_like(x, value)?, CmpOp::Ge)?, g)?,
            (BinaryOp::Minimum, _) => masked(&x.compare(&scalar_like(x, value)?, CmpOp::Le)?, g)?,
            (BinaryOp::Pow, false) => g.mul(&x.powf(value - 1.0)?.mul_scalar(value)?)?,
            (BinaryOp::Pow, true) => g.mul(out)?.mul_scalar(value.ln())?,
            (BinaryOp::ReluGrad, false) => g.unary(UnaryOp::Scalar {
                op,
                value,
                reversed,
            })?,
            (BinaryOp::ReluGrad, true) => g.zeros_like()?,
            (BinaryOp::AddRelu | BinaryOp::MulRelu | BinaryOp::CountFinite, _) => {
                unreachable!("refused by Tensor::unary")
            }
        },
    })
}

fn scalar_like(x: &Tensor, v: f64) -> Result<Tensor> {
    Tensor::scalar(v, x.dtype(), &x.device())
}

fn binary(
    a: &Tensor,
    b: &Tensor,
    op: BinaryOp,
    out: &Tensor,
    g: &Tensor,
    (wa, wb): (bool, bool),
) -> Result<(Option<Tensor>, Option<Tensor>)> {
    // Each side is computed only when wanted.
    let side = |w: bool, f: &dyn Fn() -> Result<Tensor>| if w { f().map(Some) } else { Ok(None) };
    Ok(match op {
        BinaryOp::Add => (side(wa, &|| Ok(g.clone()))?, side(wb, &|| Ok(g.clone()))?),
        BinaryOp::Sub => (side(wa, &|| Ok(g.clone()))?, side(wb, &|| g.neg())?),
        BinaryOp::Mul => (side(wa, &|| g.mul(b))?, side(wb, &|| g.mul(a))?),
        BinaryOp::Div => (
            side(wa, &|| g.div(b))?,
            side(wb, &|| g.div(b)?.mul(out)?.neg())?,
        ),
        // Ties send the gradient to the left operand.
        BinaryOp::Maximum => (
            side(wa, &|| masked(&a.ge(b)?, g))?,
            side(wb, &|| masked(&a.ge(b)?.eq_scalar(0.0)?, g))?,
        ),
        BinaryOp::Minimum => (
            side(wa, &|| masked(&a.le(b)?, g))?,
            side(wb, &|| masked(&a.le(b)?.eq_scalar(0.0)?, g))?,
        ),
        // The mask is piecewise constant: no gradient flows to the input side.
        BinaryOp::ReluGrad => (side(wa, &|| g.relu_grad(b))?, side(wb, &|| b.zeros_like())?),
        // The output is positive exactly where the ReLU passed its input through.
        BinaryOp::AddRelu => {
            let gp = g.relu_grad(out)?;
            (side(wa, &|| Ok(gp.clone()))?, side(wb, &|| Ok(gp.clone()))?)
        }
        BinaryOp::MulRelu => {
            let gp = g.relu_grad(out)?;
            (side(wa, &|| gp.mul(b))?, side(wb, &|| gp.mul(a))?)
        }
        // A step count: the gradient passes to the count, none to the watched value.
        BinaryOp::CountFinite => (side(wa, &|| Ok(g.clone()))?, side(wb, &|| b.zeros_like())?),
        // d a^b = b·a^(b−1) da + a^b·ln(a) db
        BinaryOp::Pow => (
            side(wa, &|| g.mul(&b.mul(&a.pow(&b.sub_scalar(1.0)?)?)?))?,
            side(wb, &|| g.mul(&out.mul(&a.log()?)?))?,
        ),
    })
}

/// For a layer `act(a·b + bias)` (`Op::MatmulBias` / `Op::MatmulBiasAct`): the gradient at
/// the pre-activation from the gradient `g` of the output (`g` itself without activation).
/// Other ops are an internal error.
pub(crate) fn linear_output_grad(op: &Op, g: &Tensor) -> Result<Tensor> {
    match op {
        Op::MatmulBias { .. } => Ok(g.clone()),
        Op::MatmulBiasAct { act, out, pre, .. } => match (act, pre) {
            (EpilogueActivation::Relu, _) => g.relu_grad(out),
            (EpilogueActivation::GeluTanh, Some(z)) => g.mul(&z.unary(UnaryOp::GeluTanhGrad)?),
            (EpilogueActivation::GeluTanh, None) => Err(Error::Msg(
                "matmul_bias_act: the GELU pre-activation was not kept".into(),
            )),
        },
        _ => Err(Error::Msg(
            "linear_output_grad: not a matmul-with-bias node".into(),
        )),
    }
}

/// The gradients `[a, b, bias]` (those `want`ed) of a layer from the gradient `g` at its
/// pre-activation ([`linear_output_grad`]). Other ops are an internal error.
pub(crate) fn linear_grads(op: &Op, g: &Tensor, want: [bool; 3]) -> Result<Vec<Option<Tensor>>> {
    match op {
        Op::MatmulBias { a, b, .. } | Op::MatmulBiasAct { a, b, .. } => matmul_bias(a, b, g, want),
        _ => Err(Error::Msg(
            "linear_grads: not a matmul-with-bias node".into(),
        )),
    }
}

/// Gradients of `a·b + bias` (2-D) for the output gradient `g`: the input gradient is one
/// GEMM, the weight and bias gradients one GEMM call together; unwanted ones are skipped.
fn matmul_bias(a: &Tensor, b: &Tensor, g: &Tensor, want: [bool; 3]) -> Result<Vec<Option<Tensor>>> {
    let ga = if want[0] {
        Some(g.matmul(&b.t()?)?)
    } else {
        None
    };
    // gbᵀ = gᵀ·a, and the row sums of gᵀ are the bias gradient: one GEMM call.
    let (gb, gbias) = if want[1] {
        let (gbt, sums) = g.t()?.matmul_row_sums(a)?;
        (Some(gbt.t()?), want[2].then_some(sums))
    } else {
        (
            None,
            if want[2] {
                Some(g.sum(0, false)?)
            } else {
                None
            },
        )
    };
    Ok(vec![ga, gb, gbias])
}
