//! Plain f64 references of convolutions and their gradients, shared by the conv tests.

use super::*;
use kiln::{Conv2dOptions, DType, Device, Generator, Tensor};

/// The output shape `[n, c_out, oh, ow]` of a convolution of `xs` by `ws`.
pub fn conv_out_shape(xs: [usize; 4], ws: [usize; 4], o: &Conv2dOptions) -> [usize; 4] {
    let [n, _, h, wd] = xs;
    let [co, _, kh, kw] = ws;
    let oh = (h + 2 * o.padding[0] - o.dilation[0] * (kh - 1) - 1) / o.stride[0] + 1;
    let ow = (wd + 2 * o.padding[1] - o.dilation[1] * (kw - 1) - 1) / o.stride[1] + 1;
    [n, co, oh, ow]
}

/// Calls `tap(out, x, w)` with the flat indices of every (output element, input element,
/// filter element) of a convolution of `xs` by `ws` that meet inside the input (padding
/// contributes nothing), in order.
pub fn conv_taps(
    xs: [usize; 4],
    ws: [usize; 4],
    o: &Conv2dOptions,
    mut tap: impl FnMut(usize, usize, usize),
) {
    let [n, c, h, wd] = xs;
    let [co, cig, kh, kw] = ws;
    let [_, _, oh, ow] = conv_out_shape(xs, ws, o);
    let cog = co / o.groups;
    for b in 0..n {
        for oc in 0..co {
            for y in 0..oh {
                for xo in 0..ow {
                    let out = ((b * co + oc) * oh + y) * ow + xo;
                    for ic in 0..cig {
                        let ch = (oc / cog) * cig + ic;
                        for i in 0..kh {
                            for j in 0..kw {
                                let iy = (y * o.stride[0] + i * o.dilation[0]) as isize
                                    - o.padding[0] as isize;
                                let ix = (xo * o.stride[1] + j * o.dilation[1]) as isize
                                    - o.padding[1] as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                                    continue;
                                }
                                let xi = ((b * c + ch) * h + iy as usize) * wd + ix as usize;
                                tap(out, xi, ((oc * cig + ic) * kh + i) * kw + j);
                            }
                        }
                    }
                }
            }
        }
    }
}

pub fn conv_reference(
    x: &[f64],
    xs: [usize; 4],
    w: &[f64],
    ws: [usize; 4],
    bias: Option<&[f64]>,
    o: &Conv2dOptions,
) -> (Vec<f64>, [usize; 4]) {
    let shape = conv_out_shape(xs, ws, o);
    let [_, co, oh, ow] = shape;
    let mut sums = vec![0.0; shape.iter().product()];
    conv_taps(xs, ws, o, |out, xi, wi| sums[out] += x[xi] * w[wi]);
    if let Some(bias) = bias {
        for (k, v) in sums.iter_mut().enumerate() {
            *v += bias[k / (oh * ow) % co];
        }
    }
    (sums, shape)
}

/// The gradients of `sum(conv2d(x, w) + bias) · r)` for a seed `r` of the output's shape:
/// (dx, dw, dbias), as plain f64 loop nests.
pub fn conv_grads_reference(
    x: &[f64],
    xs: [usize; 4],
    w: &[f64],
    ws: [usize; 4],
    r: &[f64],
    o: &Conv2dOptions,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut dx, mut dw, mut db) = (vec![0.0; x.len()], vec![0.0; w.len()], vec![0.0; ws[0]]);
    let [_, co, oh, ow] = conv_out_shape(xs, ws, o);
    conv_taps(xs, ws, o, |out, xi, wi| {
        dw[wi] += r[out] * x[xi];
        dx[xi] += r[out] * w[wi];
    });
    for (k, g) in r.iter().enumerate() {
        db[k / (oh * ow) % co] += g;
    }
    (dx, dw, db)
}

/// A convolution's random input (`variant`), weight and bias, and the three as tracked
/// variables.
pub struct Params {
    pub x: Input,
    pub w: Input,
    pub bias_vals: Vec<f64>,
    pub xv: Tensor,
    pub wv: Tensor,
    pub bv: Tensor,
}

pub fn tracked_params(
    rng: &mut Generator,
    xs: [usize; 4],
    ws: [usize; 4],
    dtype: DType,
    device: &Device,
    variant: Variant,
) -> Params {
    let x = input(rng, &xs, dtype, device, variant, Range::Signed);
    let w = input(rng, &ws, dtype, device, Variant::Contiguous, Range::Signed);
    let bias_vals = random_vals(rng, ws[0], dtype, Range::Signed);
    let bias = tensor_of(&bias_vals, &[ws[0]], dtype, device);
    let (xv, wv, bv) = (x.t.var().unwrap(), w.t.var().unwrap(), bias.var().unwrap());
    Params {
        x,
        w,
        bias_vals,
        xv,
        wv,
        bv,
    }
}

/// The gradients of `sum(y · r)` for a random seed `r` of `y`'s shape: `(r, gradients)`.
pub fn seeded_backward(
    rng: &mut Generator,
    y: &Tensor,
    dtype: DType,
    device: &Device,
) -> (Vec<f64>, kiln::Grads) {
    let r_vals = random_vals(rng, y.elem_count(), dtype, Range::Signed);
    let r = tensor_of(&r_vals, y.dims(), dtype, device);
    (r_vals, backward_of_product(y, &r))
}

/// The gradients of `sum(y · r)`.
pub fn backward_of_product(y: &Tensor, r: &Tensor) -> kiln::Grads {
    y.mul(r)
        .unwrap()
        .sum(kiln::AllDims, false)
        .unwrap()
        .backward()
        .unwrap()
}

/// The input, weight and bias gradients in `grads` against `want` (as
/// [`conv_grads_reference`] returns them); `ctx` names the one compared.
pub fn assert_conv_grads(
    ctx: impl Fn(&str) -> String,
    grads: &kiln::Grads,
    [x, w, b]: [&Tensor; 3],
    want: &(Vec<f64>, Vec<f64>, Vec<f64>),
    tol: f64,
) {
    assert_norm_close(&ctx("x"), &values(grads.get(x).unwrap()), &want.0, tol);
    assert_norm_close(&ctx("w"), &values(grads.get(w).unwrap()), &want.1, tol);
    assert_norm_close(&ctx("bias"), &values(grads.get(b).unwrap()), &want.2, tol);
}
