//! Fused training primitives on the CPU: softmax cross-entropy (loss, gradient and argmax hit
//! per row in one pass over the logits) and in-place optimizer updates.

use super::disjoint::DisjointPtr;
use super::elem::{FloatElem, Real};
use super::simd::simd_fn;
use super::threads::install;
use crate::layout::Layout;
use crate::op::UpdateRule;
use num_traits::{Float, One, Zero};
use rayon::prelude::*;

/// Per-row loss, gradient `[N, C]` and hit (see `CrossEntropyRows`), for logits `x` at
/// layout `l` (`[N, C]`, any strides) and labels already checked to lie in `[0, C)`.
pub(super) fn cross_entropy<T: FloatElem>(
    x: &[T],
    l: &Layout,
    labels: &[usize],
    smoothing: f64,
    scale: f64,
) -> (Vec<T>, Vec<T>, Vec<f32>) {
    let (n, c) = (l.dims()[0], l.dims()[1]);
    let (rs, cs, base) = (l.strides()[0], l.strides()[1], l.offset());
    let mut loss = vec![T::ZERO; n];
    let mut grad = vec![T::ZERO; n * c];
    let mut correct = vec![0f32; n];
    if c == 0 {
        return (loss, grad, correct);
    }
    let eps = T::C::from_f64c(smoothing);
    let uniform = eps / T::C::from_f64c(c as f64);
    let on_label = T::C::one() - eps + uniform;
    let scale = T::C::from_f64c(scale);
    let row = |i: usize, loss: &mut T, grad: &mut [T], hit: &mut f32| {
        let xr = |j: usize| x[base + i * rs + j * cs].to_c();
        // First maximum (NaN counts as the maximum, as argmax does).
        let (mut m, mut am) = (T::C::neg_infinity(), 0);
        for j in 0..c {
            let v = xr(j);
            if v > m || (v.is_nan() && !m.is_nan()) {
                (m, am) = (v, j);
            }
        }
        let shift = if m.is_finite() { m } else { T::C::zero() };
        let (mut sum, mut sum_x) = (T::C::zero(), T::C::zero());
        for j in 0..c {
            let v = xr(j);
            sum = sum + (v - shift).exp();
            sum_x = sum_x + v;
        }
        let lse = shift + sum.ln();
        let label = labels[i];
        // Σ_j q_j x_j with q = (1−ε)·onehot + ε/C.
        let target_term = (T::C::one() - eps) * xr(label) + uniform * sum_x;
        *loss = T::from_c((lse - target_term) * scale);
        let inv = T::C::one() / sum;
        for (j, g) in grad.iter_mut().enumerate() {
            let p = (xr(j) - shift).exp() * inv;
            let q = if j == label { on_label } else { uniform };
            *g = T::from_c((p - q) * scale);
        }
        *hit = f32::from(u8::from(am == label));
    };
    if super::threads::goes_parallel(n * c) {
        install(|| {
            loss.par_iter_mut()
                .zip(grad.par_chunks_mut(c))
                .zip(correct.par_iter_mut())
                .enumerate()
                .for_each(|(i, ((l, g), h))| row(i, l, g, h))
        });
    } else {
        for (i, ((l, g), h)) in loss
            .iter_mut()
            .zip(grad.chunks_mut(c))
            .zip(correct.iter_mut())
            .enumerate()
        {
            row(i, l, g, h);
        }
    }
    (loss, grad, correct)
}

/// Applies `rule` to `p` in place; `state` holds the rule's buffers (each `p.len()` long).
/// Split between threads as an in-place map of its cost is (`chunked::split_output`): a
/// step of the MLP 784-1024-10 updates 0.8M parameters, which took 0.28 ms on one core of
/// the 2-core EPYC (5% of the step).
pub(super) fn update<T: FloatElem>(p: &mut [T], g: &[T], state: &mut [&mut [T]], rule: UpdateRule) {
    assert!(
        g.len() == p.len() && state.iter().all(|s| s.len() == p.len()),
        "{}: parameter, gradient and state lengths differ",
        rule.name()
    );
    let state_at: Vec<DisjointPtr<T>> = state
        .iter_mut()
        .map(|s| DisjointPtr(s.as_mut_ptr()))
        .collect();
    // Reads and writes of (2 + 2 * state) buffers an element: a copy's cost per buffer pair.
    let cost = 1 + state.len();
    super::chunked::split_output(p, cost, 16, true, |first, part| {
        let mut state: Vec<&mut [T]> = state_at
            .iter()
            // SAFETY: each state buffer is `p.len()` long (asserted above) and borrowed
            // mutably by this call; the chunks `first..first + part.len()` that
            // `split_output` hands out are disjoint, so no element is reached twice.
            .map(|s| unsafe { std::slice::from_raw_parts_mut(s.0.add(first), part.len()) })
            .collect();
        update_run(part, &g[first..first + part.len()], &mut state, rule)
    });
}

simd_fn! {
    /// [`update`] on one thread, compiled for each SIMD level: the same operations in the
    /// same order at every level (no contraction into FMAs), so the results do not depend on
    /// it. An SGD step with momentum of 0.8M parameters on two threads of the 2-core EPYC took
    /// 135–157 µs at the baseline's SSE2 width and 121–122 µs with AVX-512
    /// (`cpu_micro sgd`).
    fn update_run<T: FloatElem>(p: &mut [T], g: &[T], state: &mut [&mut [T]], rule: UpdateRule) {
        let c = T::C::from_f64c;
        match rule {
            UpdateRule::Sgd {
                lr,
                momentum,
                nesterov,
                weight_decay,
            } => {
                let (lr, mu, wd) = (c(lr), c(momentum), c(weight_decay));
                let step = |p: &mut T, g: T, v: Option<&mut T>| {
                    let pc = p.to_c();
                    let mut gc = g.to_c() + wd * pc;
                    if let Some(v) = v {
                        let vc = mu * v.to_c() + gc;
                        *v = T::from_c(vc);
                        gc = if nesterov { gc + mu * vc } else { vc };
                    }
                    *p = T::from_c(pc - lr * gc);
                };
                match state {
                    [v] => p
                        .iter_mut()
                        .zip(g)
                        .zip(v.iter_mut())
                        .for_each(|((p, &g), v)| step(p, g, Some(v))),
                    _ => p.iter_mut().zip(g).for_each(|(p, &g)| step(p, g, None)),
                }
            }
            UpdateRule::Adam {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
                decoupled,
                step: _,
            } => {
                let (step_size, inv_bc2) = rule.adam_scales().expect("an Adam rule");
                let (lr_c, b1, b2, e, wd) = (c(lr), c(beta1), c(beta2), c(eps), c(weight_decay));
                let (step_size, inv_bc2) = (c(step_size), c(inv_bc2));
                let one = T::C::one();
                let [m, v] = state else {
                    unreachable!("Adam has two state buffers (checked by the tensor layer)")
                };
                for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
                    let mut pc = p.to_c();
                    let mut gc = g.to_c();
                    if decoupled {
                        pc = pc * (one - lr_c * wd);
                    } else {
                        gc = gc + wd * pc;
                    }
                    let mc = b1 * m.to_c() + (one - b1) * gc;
                    let vc = b2 * v.to_c() + (one - b2) * gc * gc;
                    *m = T::from_c(mc);
                    *v = T::from_c(vc);
                    *p = T::from_c(pc - step_size * mc / ((vc * inv_bc2).sqrt() + e));
                }
            }
        }
    }
}
