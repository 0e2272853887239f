//! Losses: cross-entropy as one fused, stable log-softmax + NLL op (with label smoothing),
//! and mean squared error.

use kiln::{AllDims, DType, Error, Result, Tensor};

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
    if logits.rank() != 2 || targets.rank() != 1 || targets.dims()[0] != logits.dims()[0] {
        return Err(Error::Msg(format!(
            "cross_entropy: expected logits [N, C] and targets [N], got {} and {}",
            logits.shape(),
            targets.shape()
        )));
    }
    if !(0.0..1.0).contains(&smoothing) {
        return Err(Error::Msg(format!(
            "cross_entropy: label smoothing {smoothing} is not in [0, 1)"
        )));
    }
    let (n, c) = (logits.dims()[0], logits.dims()[1]);
    let (loss, probs, target_dist) = kiln::no_grad(|| -> Result<_> {
        let x = logits.detach();
        let logp = x.log_softmax(1)?;
        // Target distribution q: (1 − ε) on the label, ε/C everywhere.
        let ids = targets.reshape([n, 1])?;
        let onehot = x.zeros_like()?.scatter_add(
            &ids,
            &Tensor::full(1.0 - smoothing, [n, 1], x.dtype(), &x.device())?,
            1,
        )?;
        let q = if smoothing > 0.0 {
            onehot.add_scalar(smoothing / c as f64)?
        } else {
            onehot
        };
        let loss = logp
            .mul(&q)?
            .sum(AllDims, false)?
            .mul_scalar(-1.0 / n as f64)?;
        Ok((loss, logp.exp()?, q))
    })?;
    let backward = move |g: &Tensor| -> Result<Vec<Option<Tensor>>> {
        let scale = g.to_dtype(probs.dtype())?.mul_scalar(1.0 / n as f64)?;
        Ok(vec![Some(probs.sub(&target_dist)?.mul(&scale)?)])
    };
    Ok(Tensor::custom_op(
        loss,
        vec![logits.clone()],
        Box::new(backward),
    ))
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
