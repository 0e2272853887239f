//! A two-layer graph convolutional network (Kipf & Welling): `softmax(Â·relu(Â·X·W₁)·W₂)`
//! with `Â = D^-½ (A + I) D^-½` a sparse CSR matrix, trained by gradient descent to label the
//! nodes of a generated two-community graph. Gradients flow through the sparse products to
//! the dense weights `W₁`, `W₂`, and to a learnable weight per edge of `Â`'s first use.
//!
//! ```sh
//! cargo run --release -p kiln --example graph_conv            # CPU
//! cargo run --release -p kiln --example graph_conv -- cuda    # first CUDA device
//! ```

use kiln::sparse::Csr;
use kiln::{AllDims, DType, Device, Generator, Tensor};

/// A stochastic block model: two communities of `half` nodes, each pair of nodes linked
/// with probability `p_in` inside a community and `p_out` across. Returns the normalised
/// adjacency with self-loops and each node's community.
fn two_communities(
    half: usize,
    p_in: f64,
    p_out: f64,
    rng: &mut Generator,
    device: &Device,
) -> kiln::Result<(Csr, Vec<i64>)> {
    let n = 2 * half;
    let label = |i: usize| (i >= half) as i64;
    let (mut rows, mut cols) = (Vec::new(), Vec::new());
    for i in 0..n {
        rows.push(i as i64);
        cols.push(i as i64); // self-loop
        for j in i + 1..n {
            let p = if label(i) == label(j) { p_in } else { p_out };
            if rng.uniform(0.0, 1.0) < p {
                rows.extend([i as i64, j as i64]);
                cols.extend([j as i64, i as i64]);
            }
        }
    }
    let mut degree = vec![0f64; n];
    for &r in &rows {
        degree[r as usize] += 1.0;
    }
    let weights: Vec<f32> = rows
        .iter()
        .zip(&cols)
        .map(|(&r, &c)| (1.0 / (degree[r as usize] * degree[c as usize]).sqrt()) as f32)
        .collect();
    let e = rows.len();
    let cpu = Device::Cpu;
    let a = Csr::from_coo(
        n,
        n,
        &Tensor::from_vec(rows, e, &cpu)?,
        &Tensor::from_vec(cols, e, &cpu)?,
        &Tensor::from_vec(weights, e, device)?,
    )?;
    Ok((a, (0..n).map(label).collect()))
}

fn main() -> kiln::Result<()> {
    let device = match std::env::args().nth(1) {
        Some(name) => Device::parse(&name)?,
        None => Device::Cpu,
    };
    let mut rng = Generator::new(7);
    let (a_hat, labels) = two_communities(500, 0.02, 0.002, &mut rng, &device)?;
    let n = a_hat.rows();
    println!(
        "graph: {n} nodes, {} stored entries of Â, on {device}",
        a_hat.nnz()
    );

    // Features: a weak hint of the community buried in noise; the graph has to do the rest.
    let (features, hidden, classes) = (16, 16, 2);
    let hint: Vec<f32> = labels
        .iter()
        .flat_map(|&l| (0..features).map(move |f| if f == l as usize { 0.3 } else { 0.0 }))
        .collect();
    let x = Tensor::from_vec(hint, [n, features], &device)?.add(&Tensor::randn(
        [n, features],
        0.0,
        1.0,
        DType::F32,
        &device,
        &mut rng,
    )?)?;
    let targets = Tensor::from_vec(labels.clone(), n, &device)?;

    let w1 = Tensor::randn([features, hidden], 0.0, 0.3, DType::F32, &device, &mut rng)?.var()?;
    let w2 = Tensor::randn([hidden, classes], 0.0, 0.3, DType::F32, &device, &mut rng)?.var()?;
    // One learnable scale per stored entry of the first layer's Â, starting at Â itself.
    let edge_w = a_hat.values().copy()?.var()?;

    let lr = 0.5;
    for epoch in 0..=200 {
        let a1 = a_hat.with_values(&edge_w)?;
        let h = a1.matmul(&x.matmul(&w1)?)?.relu()?; // Â·X·W₁: SpMM, gradients to edge_w and W₁
        let logits = a_hat.matmul(&h.matmul(&w2)?)?; // Â·H·W₂
        let log_p = logits.log_softmax(-1)?;
        let picked = log_p.gather(&targets.unsqueeze(1)?, 1)?;
        let loss = picked.mean(AllDims, false)?.neg()?;
        let grads = loss.backward()?;
        kiln::no_grad(|| -> kiln::Result<()> {
            for p in [&w1, &w2, &edge_w] {
                let g = grads.get(p).expect("every parameter gets a gradient");
                p.assign(&p.sub(&g.mul_scalar(lr)?)?)?;
            }
            Ok(())
        })?;
        if epoch % 40 == 0 {
            let predicted = logits.argmax(-1, false)?.to_vec::<i64>()?;
            let hits = predicted
                .iter()
                .zip(&labels)
                .filter(|(p, l)| p == l)
                .count();
            println!(
                "epoch {epoch:3}: loss {:.4}, accuracy {:.1}%",
                loss.to_dtype(DType::F64)?.to_scalar::<f64>()?,
                100.0 * hits as f64 / n as f64
            );
        }
    }
    Ok(())
}
