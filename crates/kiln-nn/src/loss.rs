//! Losses: cross-entropy as one fused, stable log-softmax + NLL op (with label smoothing),
//! and mean squared error.

use kiln::{AllDims, DType, Result, Tensor};

/// Mean cross-entropy of `logits` `[N, C]` against class indices `targets` `[N]` (integer
/// dtype), with label smoothing `smoothing` in `[0, 1)`: the target distribution is
/// `(1 − ε)·onehot + ε/C`. Computed as one op: the forward uses a stable log-softmax, and
/// the gradient is `(softmax − target) / N`, never going through the log.
///
/// ```
/// # use kiln::{Device, DType, Tensor};
/// let logits = Tensor::from_vec(vec![2f32, 0., 0., 0., 2., 0.], [2, 3], &Device::Cpu)?.var()?;
/// let targets = Tensor::from_vec(vec![0i64, 1], 2, &Device::Cpu)?;
/// let loss = kiln_nn::loss::cross_entropy(&logits, &targets, 0.0)?;
/// let expected = -(2f32.exp() / (2f32.exp() + 2.0)).ln();
/// assert!((loss.to_scalar::<f32>()? - expected).abs() < 1e-6);
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn cross_entropy(logits: &Tensor, targets: &Tensor, smoothing: f64) -> Result<Tensor> {
    Ok(cross_entropy_with_hits(logits, targets, smoothing)?.loss)
}

/// What [`cross_entropy_with_hits`] returns.
pub struct CrossEntropy {
    /// The mean loss, differentiable with respect to the logits.
    pub loss: Tensor,
    /// `[N]` f32: 1 where the row's first maximum is at the target, else 0.
    pub hits: Tensor,
}

/// [`cross_entropy`] together with per-row hits (argmax = target), from the same fused
/// kernel: a training loop gets its accuracy without another pass over the logits.
///
/// ```
/// # use kiln::{AllDims, Device, Tensor};
/// let logits = Tensor::from_vec(vec![2f32, 0., 0., 0., 2., 0.], [2, 3], &Device::Cpu)?.var()?;
/// let targets = Tensor::from_vec(vec![0i64, 2], 2, &Device::Cpu)?;
/// let ce = kiln_nn::loss::cross_entropy_with_hits(&logits, &targets, 0.1)?;
/// assert_eq!(ce.hits.to_vec::<f32>()?, [1., 0.]);
/// let grads = ce.loss.backward()?;
/// // Each row of the gradient, softmax − q, sums to 0.
/// let g = grads.get(&logits).unwrap().sum(1, false)?.to_vec::<f32>()?;
/// assert!(g.iter().all(|v| v.abs() < 1e-6));
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn cross_entropy_with_hits(
    logits: &Tensor,
    targets: &Tensor,
    smoothing: f64,
) -> Result<CrossEntropy> {
    let n = logits.dims().first().copied().unwrap_or(0).max(1);
    // The kernel's gradient is already that of the mean: (softmax − q) / N.
    let rows = logits
        .detach()
        .softmax_cross_entropy(targets, smoothing, 1.0 / n as f64)?;
    // The row losses come scaled by 1/N: their sum is the mean.
    let loss = kiln::no_grad(|| rows.loss.sum(AllDims, false))?;
    let grad = rows.grad;
    let backward = move |g: &Tensor| -> Result<Vec<Option<Tensor>>> {
        if g.is_unit_seed() {
            // `loss.backward()`: the gradient is the kernel's, as is.
            return Ok(vec![Some(grad.clone())]);
        }
        Ok(vec![Some(grad.mul(&g.to_dtype(grad.dtype())?)?)])
    };
    Ok(CrossEntropy {
        loss: Tensor::custom_op(loss, vec![logits.clone()], Box::new(backward)),
        hits: rows.correct,
    })
}

/// Mean of `(pred − target)²`.
pub fn mse(pred: &Tensor, target: &Tensor) -> Result<Tensor> {
    pred.sub(target)?.sqr()?.mean(AllDims, false)
}

/// Fraction of rows of `logits` whose argmax equals the target.
pub fn accuracy(logits: &Tensor, targets: &Tensor) -> Result<f64> {
    let pred = logits.argmax(1, false)?;
    let hits = pred
        .eq(&targets.to_dtype(DType::I64)?)?
        .to_dtype(DType::F32)?
        .sum(AllDims, false)?;
    Ok(
        hits.to_device(&kiln::Device::Cpu)?.to_scalar::<f32>()? as f64
            / targets.elem_count().max(1) as f64,
    )
}
