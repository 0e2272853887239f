//! Matrix products (plain, transposed, strided, batched, broadcast) and the joining and
//! indexing ops, against f64 references.

mod common;
use common::*;
use kiln::{DType, Generator, Tensor};

/// Reference batched product of row-major `a` `[batch.., m, k]` and `b` `[batch.., k, n]`,
/// batch dims broadcast.
fn matmul_ref(a: &[f64], sa: &[usize], b: &[f64], sb: &[usize]) -> (Vec<usize>, Vec<f64>) {
    let (ra, rb) = (sa.len(), sb.len());
    let (m, k, n) = (sa[ra - 2], sa[ra - 1], sb[rb - 1]);
    let batch = broadcast_shape(&sa[..ra - 2], &sb[..rb - 2]);
    let nb: usize = batch.iter().product();
    let mut out = Vec::with_capacity(nb * m * n);
    for bi in 0..nb {
        let bidx = unravel(bi, &batch);
        let oa = bcast_index(&bidx, &sa[..ra - 2]) * m * k;
        let ob = bcast_index(&bidx, &sb[..rb - 2]) * k * n;
        for i in 0..m {
            for j in 0..n {
                out.push((0..k).map(|p| a[oa + i * k + p] * b[ob + p * n + j]).sum());
            }
        }
    }
    let mut shape = batch;
    shape.extend([m, n]);
    (shape, out)
}

#[test]
fn matmul_2d_on_every_layout_pair() {
    let mut rng = Generator::new(20);
    for device in devices() {
        for dtype in FLOATS {
            if !supports(&device, dtype) {
                continue;
            }
            for va in VARIANTS {
                for vb in [
                    Variant::Contiguous,
                    Variant::Transposed,
                    Variant::Stepped,
                    Variant::Broadcast,
                ] {
                    let (m, k, n) = (1 + rng.below(40), 1 + rng.below(40), 1 + rng.below(40));
                    let a = input(&mut rng, &[m, k], dtype, &device, va, Range::Signed);
                    let b = input(&mut rng, &[k, n], dtype, &device, vb, Range::Signed);
                    let got = a.t.matmul(&b.t).unwrap();
                    let (shape, want) = matmul_ref(&a.vals, &[m, k], &b.vals, &[k, n]);
                    assert_eq!(got.dims(), &shape[..]);
                    assert_norm_close(
                        &format!("matmul {dtype} {device} {va:?}x{vb:?} {m}x{k}x{n}"),
                        &values(&got),
                        &want,
                        tol(dtype),
                    );
                }
            }
        }
    }
}

/// Products large enough to be split between threads: on the 2-thread CPU in two halves
/// of the rows (150 rows), of the columns (fewer than 64 rows), per batch (a broadcast
/// batch of 3), or through the pool.
#[test]
fn matmul_large_enough_for_threads() {
    let mut rng = Generator::new(21);
    let shapes: [(&[usize], &[usize]); 3] = [
        (&[150, 130], &[130, 170]),
        (&[40, 150], &[150, 200]),
        (&[3, 70, 90], &[1, 90, 160]),
    ];
    for device in devices() {
        for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            if !supports(&device, dtype) {
                continue;
            }
            for &(sa, sb) in &shapes {
                let variant = if sa.len() == 2 {
                    Variant::Transposed
                } else {
                    Variant::Contiguous
                };
                let a = input(&mut rng, sa, dtype, &device, variant, Range::Signed);
                let b = input(
                    &mut rng,
                    sb,
                    dtype,
                    &device,
                    Variant::Contiguous,
                    Range::Signed,
                );
                let (shape, want) = matmul_ref(&a.vals, sa, &b.vals, sb);
                let got = a.t.matmul(&b.t).unwrap();
                let ctx = format!("matmul {dtype} {device} {sa:?}x{sb:?}");
                assert_eq!(got.dims(), &shape[..], "{ctx}");
                assert_norm_close(&ctx, &values(&got), &want, tol(dtype));
            }
        }
    }
}

/// A transposed left operand whose columns lie a multiple of 4 KiB apart (1024 f32s, 512
/// f64s), which the CPU copies to padded columns before the product: whole, narrowed to
/// rows at an odd offset, and in a batch, against the f64 reference.
#[test]
fn matmul_with_left_columns_4k_apart() {
    let mut rng = Generator::new(22);
    for device in devices() {
        for (dtype, len) in [(DType::F32, 1024), (DType::F64, 512), (DType::F16, 2048)] {
            if !supports(&device, dtype) {
                continue;
            }
            for (batch, rows, first) in [(1, len, 0), (1, len - 37, 5), (2, len, 0)] {
                let (k, n) = (24, 96);
                let base =
                    Tensor::randn([batch, k, len], 0.0, 1.0, dtype, &device, &mut rng).unwrap();
                let a = base
                    .transpose(1, 2)
                    .unwrap()
                    .narrow(1, first, rows)
                    .unwrap();
                let b = Tensor::randn([batch, k, n], 0.0, 1.0, dtype, &device, &mut rng).unwrap();
                let ac = a.contiguous().unwrap();
                let (sa, sb) = ([batch, rows, k], [batch, k, n]);
                let (_, want) = matmul_ref(&values(&ac), &sa, &values(&b), &sb);
                let got = a.matmul(&b).unwrap();
                let ctx = format!(
                    "matmul {dtype} {device} [{batch}, {rows}, {k}] at column stride {len}"
                );
                assert_eq!(got.dims(), &[batch, rows, n], "{ctx}");
                assert_norm_close(&ctx, &values(&got), &want, tol(dtype));
            }
        }
    }
}

/// The linear-layer ops: `a·b + bias` and `(a·b, row sums of a)`, on every layout pair (the
/// bias contiguous, narrowed to an odd offset, or stepped, which CUDA computes unfused), at
/// random small sizes and at the MLP's shapes where cuBLASLt's epilogues run.
#[test]
fn matmul_bias_and_row_sums_match_reference() {
    let mut rng = Generator::new(23);
    for device in devices() {
        for dtype in FLOATS {
            if !supports(&device, dtype) {
                continue;
            }
            let mut sizes: Vec<(usize, usize, usize)> = (0..4)
                .map(|_| (1 + rng.below(40), 1 + rng.below(40), 1 + rng.below(40)))
                .collect();
            sizes.extend([
                (256, 784, 128),
                (128, 256, 784),
                (256, 128, 10),
                (10, 256, 128),
            ]);
            for (case, &(m, k, n)) in sizes.iter().enumerate() {
                let va = VARIANTS[case % VARIANTS.len()];
                let vb = [Variant::Transposed, Variant::Contiguous, Variant::Narrowed][case % 3];
                let vbias = [Variant::Contiguous, Variant::Narrowed, Variant::Stepped][case % 3];
                let a = input(&mut rng, &[m, k], dtype, &device, va, Range::Signed);
                let b = input(&mut rng, &[k, n], dtype, &device, vb, Range::Signed);
                let bias = input(&mut rng, &[n], dtype, &device, vbias, Range::Signed);
                let ctx = format!("{dtype} {device} {va:?}x{vb:?}+{vbias:?} {m}x{k}x{n}");
                let (_, product) = matmul_ref(&a.vals, &[m, k], &b.vals, &[k, n]);
                let with_bias: Vec<f64> = product
                    .iter()
                    .enumerate()
                    .map(|(i, v)| v + bias.vals[i % n])
                    .collect();
                let got = a.t.matmul_bias(&b.t, &bias.t).unwrap();
                assert_eq!(got.dims(), &[m, n]);
                assert_norm_close(
                    &format!("matmul_bias {ctx}"),
                    &values(&got),
                    &with_bias,
                    tol(dtype),
                );
                let (p, sums) = a.t.matmul_row_sums(&b.t).unwrap();
                assert_eq!((p.dims(), sums.dims()), (&[m, n][..], &[m][..]));
                assert_norm_close(
                    &format!("matmul_row_sums product {ctx}"),
                    &values(&p),
                    &product,
                    tol(dtype),
                );
                let want: Vec<f64> = (0..m)
                    .map(|i| a.vals[i * k..(i + 1) * k].iter().sum())
                    .collect();
                assert_norm_close(
                    &format!("matmul_row_sums sums {ctx}"),
                    &values(&sums),
                    &want,
                    tol(dtype),
                );
            }
        }
    }
}

#[test]
fn matmul_bias_rejects_bad_shapes() {
    let d = kiln::Device::Cpu;
    let a = Tensor::ones([2, 3], DType::F32, &d).unwrap();
    let b = Tensor::ones([3, 4], DType::F32, &d).unwrap();
    let err = a
        .matmul_bias(&b, &Tensor::ones(3, DType::F32, &d).unwrap())
        .unwrap_err();
    assert!(err.to_string().contains("matmul_bias"), "{err}");
    let err = a
        .matmul_bias(&b, &Tensor::ones(4, DType::F64, &d).unwrap())
        .unwrap_err();
    assert!(err.to_string().contains("matmul_bias"), "{err}");
    assert!(a.matmul_row_sums(&a).is_err());
}

#[test]
fn batched_matmul_with_broadcast_batches() {
    let mut rng = Generator::new(22);
    let shapes: [(&[usize], &[usize]); 5] = [
        (&[3, 4, 5], &[3, 5, 6]),
        (&[2, 3, 4, 5], &[5, 2]),
        (&[4, 5], &[2, 3, 5, 6]),
        (&[2, 1, 4, 5], &[1, 3, 5, 2]),
        (&[1, 4, 5], &[3, 5, 2]),
    ];
    for device in devices() {
        for dtype in FLOATS {
            if !supports(&device, dtype) {
                continue;
            }
            for (sa, sb) in shapes {
                for (va, vb) in [
                    (Variant::Contiguous, Variant::Transposed),
                    (Variant::Transposed, Variant::Narrowed),
                    (Variant::Stepped, Variant::Broadcast),
                ] {
                    let a = input(&mut rng, sa, dtype, &device, va, Range::Signed);
                    let b = input(&mut rng, sb, dtype, &device, vb, Range::Signed);
                    let got = a.t.matmul(&b.t).unwrap();
                    let (shape, want) = matmul_ref(&a.vals, sa, &b.vals, sb);
                    assert_eq!(got.dims(), &shape[..], "{sa:?} x {sb:?}");
                    assert_norm_close(
                        &format!("bmm {dtype} {device} {sa:?}{va:?} x {sb:?}{vb:?}"),
                        &values(&got),
                        &want,
                        tol(dtype),
                    );
                }
            }
        }
    }
}

/// Batched products with enough output blocks for each of wgpu's matmul kernels (128×128
/// blocks from 256 of them, 64×64 from 128, 32×32 below), partial blocks at the edges and
/// transposed operands.
#[test]
fn batched_matmul_with_many_blocks() {
    let mut rng = Generator::new(23);
    let shapes: [(&[usize], &[usize]); 3] = [
        (&[130, 100, 9], &[130, 9, 131]), // 520 blocks of 128²
        (&[40, 70, 11], &[40, 11, 65]),   // 40 of 128², 160 of 64²
        (&[3, 33, 7], &[3, 7, 40]),       // 3 of 128², 3 of 64²
    ];
    for device in devices() {
        for (sa, sb) in shapes {
            for (va, vb) in [
                (Variant::Contiguous, Variant::Contiguous),
                (Variant::Transposed, Variant::Transposed),
            ] {
                let a = input(&mut rng, sa, DType::F32, &device, va, Range::Signed);
                let b = input(&mut rng, sb, DType::F32, &device, vb, Range::Signed);
                let got = a.t.matmul(&b.t).unwrap();
                let (shape, want) = matmul_ref(&a.vals, sa, &b.vals, sb);
                assert_eq!(got.dims(), &shape[..], "{sa:?} x {sb:?}");
                assert_norm_close(
                    &format!("bmm {device} {sa:?}{va:?} x {sb:?}{vb:?}"),
                    &values(&got),
                    &want,
                    tol(DType::F32),
                );
            }
        }
    }
}

#[test]
fn matmul_with_vectors() {
    let d = kiln::Device::Cpu;
    let m = Tensor::from_vec(vec![1f32, 2., 3., 4., 5., 6.], [2, 3], &d).unwrap();
    let v = Tensor::from_vec(vec![1f32, 0., -1.], 3, &d).unwrap();
    assert_eq!(
        m.matmul(&v).unwrap().to_vec::<f32>().unwrap(),
        vec![-2., -2.]
    );
    let w = Tensor::from_vec(vec![1f32, 1.], 2, &d).unwrap();
    assert_eq!(
        w.matmul(&m).unwrap().to_vec::<f32>().unwrap(),
        vec![5., 7., 9.]
    );
    assert_eq!(v.matmul(&v).unwrap().to_scalar::<f32>().unwrap(), 2.0);
}

#[test]
fn cat_and_stack_match_reference() {
    let mut rng = Generator::new(23);
    for device in devices() {
        for dtype in FLOATS.into_iter().chain(INTS) {
            if !supports(&device, dtype) {
                continue;
            }
            for variant in VARIANTS {
                let shape = random_shape(&mut rng, 1, 3);
                let dim = rng.below(shape.len());
                let mut s2 = shape.clone();
                s2[dim] = 1 + rng.below(4);
                let a = input(&mut rng, &shape, dtype, &device, variant, Range::Signed);
                let b = input(
                    &mut rng,
                    &s2,
                    dtype,
                    &device,
                    Variant::Contiguous,
                    Range::Signed,
                );
                let got = Tensor::cat(&[&a.t, &b.t], dim).unwrap();
                let mut out_shape = shape.clone();
                out_shape[dim] += s2[dim];
                let want: Vec<f64> = (0..out_shape.iter().product())
                    .map(|i| {
                        let mut idx = unravel(i, &out_shape);
                        if idx[dim] < shape[dim] {
                            a.vals[ravel(&idx, &shape)]
                        } else {
                            idx[dim] -= shape[dim];
                            b.vals[ravel(&idx, &s2)]
                        }
                    })
                    .collect();
                assert_eq!(got.dims(), &out_shape[..]);
                assert_close(
                    &format!("cat {dtype} {device} {variant:?}"),
                    &values(&got),
                    &want,
                    0.0,
                );

                let c = input(
                    &mut rng,
                    &shape,
                    dtype,
                    &device,
                    Variant::Stepped,
                    Range::Signed,
                );
                let st = Tensor::stack(&[&a.t, &c.t], 0).unwrap();
                let mut want = a.vals.clone();
                want.extend(&c.vals);
                assert_close(
                    &format!("stack {dtype} {device} {variant:?}"),
                    &values(&st),
                    &want,
                    0.0,
                );
                let st1 = Tensor::stack(&[&a.t, &c.t], -1).unwrap();
                let want: Vec<f64> = a
                    .vals
                    .iter()
                    .zip(&c.vals)
                    .flat_map(|(&x, &y)| [x, y])
                    .collect();
                assert_close(
                    &format!("stack(-1) {dtype} {device}"),
                    &values(&st1),
                    &want,
                    0.0,
                );
            }
        }
    }
}

#[test]
fn index_select_gather_scatter_add_match_reference() {
    let mut rng = Generator::new(24);
    for device in devices() {
        for dtype in [DType::F32, DType::F64, DType::BF16, DType::I64] {
            if !supports(&device, dtype) {
                continue;
            }
            for ids_dtype in [DType::U32, DType::I64] {
                if !supports(&device, ids_dtype) {
                    continue;
                }
                for variant in VARIANTS {
                    let shape = random_shape(&mut rng, 2, 3);
                    let dim = rng.below(shape.len());
                    let x = input(&mut rng, &shape, dtype, &device, variant, Range::Signed);
                    let ctx =
                        format!("{dtype} ids {ids_dtype} {device} {variant:?} {shape:?} dim {dim}");

                    // index_select with repeats.
                    let nsel = 1 + rng.below(6);
                    let ids: Vec<f64> = (0..nsel).map(|_| rng.below(shape[dim]) as f64).collect();
                    let idt = tensor_of(&ids, &[nsel], ids_dtype, &device);
                    let got = x.t.index_select(&idt, dim).unwrap();
                    let mut out_shape = shape.clone();
                    out_shape[dim] = nsel;
                    let want: Vec<f64> = (0..out_shape.iter().product())
                        .map(|i| {
                            let mut idx = unravel(i, &out_shape);
                            idx[dim] = ids[idx[dim]] as usize;
                            x.vals[ravel(&idx, &shape)]
                        })
                        .collect();
                    assert_close(&format!("index_select {ctx}"), &values(&got), &want, 0.0);

                    // gather with an index tensor no larger than x in other dims.
                    let gshape: Vec<usize> = shape
                        .iter()
                        .enumerate()
                        .map(|(i, &d)| {
                            if i == dim {
                                1 + rng.below(4)
                            } else {
                                1 + rng.below(d)
                            }
                        })
                        .collect();
                    let gids: Vec<f64> = (0..gshape.iter().product())
                        .map(|_| rng.below(shape[dim]) as f64)
                        .collect();
                    let gt = tensor_of(&gids, &gshape, ids_dtype, &device);
                    let got = x.t.gather(&gt, dim).unwrap();
                    let want: Vec<f64> = (0..gids.len())
                        .map(|i| {
                            let mut idx = unravel(i, &gshape);
                            idx[dim] = gids[i] as usize;
                            x.vals[ravel(&idx, &shape)]
                        })
                        .collect();
                    assert_close(&format!("gather {ctx}"), &values(&got), &want, 0.0);

                    // scatter_add of src at those indices (repeats accumulate).
                    let src = input(
                        &mut rng,
                        &gshape,
                        dtype,
                        &device,
                        Variant::Contiguous,
                        Range::Signed,
                    );
                    let got = x.t.scatter_add(&gt, &src.t, dim).unwrap();
                    let mut want = x.vals.clone();
                    for (i, &g) in gids.iter().enumerate() {
                        let mut idx = unravel(i, &gshape);
                        idx[dim] = g as usize;
                        want[ravel(&idx, &shape)] += src.vals[i];
                    }
                    let want: Vec<f64> = want.into_iter().map(|v| round_to(v, dtype)).collect();
                    assert_close(
                        &format!("scatter_add {ctx}"),
                        &values(&got),
                        &want,
                        tol(dtype) * 2.0,
                    );
                }
            }
        }
    }
}
