//! CSR matrices: construction, validation and products against a dense f64 reference, on
//! random matrices with empty rows, a row long enough to be split into pieces, duplicates,
//! unsorted COO input and empty shapes, for every float dtype, both index types and every
//! device; dense operands in every layout variant.

mod common;

use common::*;
use kiln::sparse::graph::{pagerank, EdgeList, PageRankOptions};
use kiln::sparse::{Csr, IndexType};
use kiln::{DType, Device, Generator, Tensor};

/// COO triplets with their f64 values (already rounded to the dtype under test).
struct Coo {
    rows: usize,
    cols: usize,
    r: Vec<i64>,
    c: Vec<i64>,
    v: Vec<f64>,
}

impl Coo {
    /// Rows of 0-4 random entries (every fifth row empty), row 1 long (`long` entries, at
    /// distinct columns, so that it stays long after duplicates merge), a few duplicates,
    /// shuffled.
    fn random(rng: &mut Generator, rows: usize, cols: usize, long: usize, dtype: DType) -> Coo {
        let mut e: Vec<(i64, i64)> = Vec::new();
        for r in 0..rows {
            if r % 5 == 4 || cols == 0 {
                continue;
            }
            if r == 1 {
                let mut cs: Vec<usize> = (0..cols).collect();
                rng.shuffle(&mut cs);
                e.extend(cs[..long.min(cols)].iter().map(|&c| (1, c as i64)));
                continue;
            }
            for _ in 0..rng.below(5) {
                e.push((r as i64, rng.below(cols) as i64));
            }
        }
        // Duplicates of a few entries.
        for i in 0..e.len().min(6) {
            e.push(e[i * 3 % e.len()]);
        }
        rng.shuffle(&mut e);
        let v = random_vals(rng, e.len(), dtype, Range::Signed);
        let (r, c) = e.into_iter().unzip();
        Coo {
            rows,
            cols,
            r,
            c,
            v,
        }
    }

    /// `len` distinct random-looking columns in every row (needs `cols >= 3·len`), shuffled.
    fn uniform(rng: &mut Generator, rows: usize, cols: usize, len: usize, dtype: DType) -> Coo {
        let step = cols / len.max(1);
        let mut e: Vec<(i64, i64)> = (0..rows)
            .flat_map(|r| (0..len).map(move |j| (r as i64, ((r * 31 + j * step) % cols) as i64)))
            .collect();
        rng.shuffle(&mut e);
        let v = random_vals(rng, e.len(), dtype, Range::Signed);
        let (r, c) = e.into_iter().unzip();
        Coo {
            rows,
            cols,
            r,
            c,
            v,
        }
    }

    fn csr(&self, dtype: DType, device: &Device) -> Csr {
        let n = self.r.len();
        Csr::from_coo(
            self.rows,
            self.cols,
            &Tensor::from_vec(self.r.clone(), n, &Device::Cpu).unwrap(),
            &Tensor::from_vec(self.c.clone(), n, &Device::Cpu).unwrap(),
            &tensor_of(&self.v, &[n], dtype, device),
        )
        .unwrap()
    }

    /// The dense matrix, duplicates summed in f64 and rounded once to `dtype`.
    fn dense(&self, dtype: DType) -> Vec<f64> {
        let mut d = vec![0.0; self.rows * self.cols];
        for ((&r, &c), &v) in self.r.iter().zip(&self.c).zip(&self.v) {
            d[r as usize * self.cols + c as usize] += v;
        }
        d.iter().map(|&x| round_to(x, dtype)).collect()
    }
}

/// `op(A)·X` in f64 for a dense row-major `a` (`rows × cols`) and `x` (`k × n`).
fn dense_product(a: &[f64], rows: usize, cols: usize, x: &[f64], n: usize, t: bool) -> Vec<f64> {
    let (m, k) = if t { (cols, rows) } else { (rows, cols) };
    let mut y = vec![0.0; m * n];
    for i in 0..m {
        for l in 0..k {
            let aij = if t { a[l * cols + i] } else { a[i * cols + l] };
            if aij != 0.0 {
                for j in 0..n {
                    y[i * n + j] += aij * x[l * n + j];
                }
            }
        }
    }
    y
}

fn check_products(coo: &Coo, dtype: DType, device: &Device, index: IndexType, rng: &mut Generator) {
    let a = coo.csr(dtype, device).with_index_type(index).unwrap();
    assert_eq!(a.index_type(), index);
    let dense = coo.dense(dtype);
    let tol = tol(dtype).max(1e-12) * 2.0;
    for transpose in [false, true] {
        let k = if transpose { coo.rows } else { coo.cols };
        for n in [1usize, 3, 40, 150] {
            for variant in VARIANTS {
                let x = input(rng, &[k, n], dtype, device, variant, Range::Signed);
                let want = dense_product(&dense, coo.rows, coo.cols, &x.vals, n, transpose);
                let got = if transpose {
                    a.t_matmul(&x.t)
                } else {
                    a.matmul(&x.t)
                }
                .unwrap();
                let ctx = format!(
                    "{dtype} {device} {index:?} t={transpose} n={n} {variant:?} {}x{}",
                    coo.rows, coo.cols
                );
                assert_eq!(got.dims(), &[want.len() / n.max(1), n], "{ctx}");
                assert_norm_close(&ctx, &values(&got), &want, tol);
            }
        }
        // SpMV with 1-D operands of every variant.
        for variant in VARIANTS {
            let x = input(rng, &[k], dtype, device, variant, Range::Signed);
            let want = dense_product(&dense, coo.rows, coo.cols, &x.vals, 1, transpose);
            let got = if transpose {
                a.t_matmul(&x.t)
            } else {
                a.matmul(&x.t)
            }
            .unwrap();
            let ctx = format!("spmv {dtype} {device} {index:?} t={transpose} {variant:?}");
            assert_eq!(got.rank(), 1, "{ctx}");
            assert_norm_close(&ctx, &values(&got), &want, tol);
        }
    }
}

#[test]
fn products_match_dense_reference() {
    let mut rng = Generator::new(11);
    for device in devices() {
        for dtype in FLOATS {
            if !supports(&device, dtype) {
                continue;
            }
            // 600 entries in row 1: three pieces of a long row.
            let coo = Coo::random(&mut rng, 23, 700, 600, dtype);
            for index in [IndexType::I32, IndexType::I64] {
                check_products(&coo, dtype, &device, index, &mut rng);
            }
            let small = Coo::random(&mut rng, 9, 5, 3, dtype);
            check_products(&small, dtype, &device, IndexType::I32, &mut rng);
        }
    }
}

/// `A·X` in f64 from the triplets (duplicates summed, then rounded to `dtype` as the CSR
/// stores them), for matrices too large for a dense reference.
fn sparse_reference(coo: &Coo, dtype: DType, x: &[f64], n: usize) -> Vec<f64> {
    let mut merged = std::collections::BTreeMap::new();
    for ((&r, &c), &v) in coo.r.iter().zip(&coo.c).zip(&coo.v) {
        *merged.entry((r as usize, c as usize)).or_insert(0.0) += v;
    }
    let mut y = vec![0.0; coo.rows * n];
    for ((r, c), v) in merged {
        let v = round_to(v, dtype);
        for j in 0..n {
            y[r * n + j] += v * x[c * n + j];
        }
    }
    y
}

/// `A·X` and `y ← 0.5·A·X − 2·y` for a random contiguous `X` of `n` columns, against
/// [`sparse_reference`].
fn check_plain_and_into(
    ctx: &str,
    coo: &Coo,
    dtype: DType,
    device: &Device,
    n: usize,
    rng: &mut Generator,
) {
    let a = coo.csr(dtype, device);
    let (rows, cols) = (coo.rows, coo.cols);
    let x = input(
        rng,
        &[cols, n],
        dtype,
        device,
        Variant::Contiguous,
        Range::Signed,
    );
    let want = sparse_reference(coo, dtype, &x.vals, n);
    let tol = tol(dtype).max(1e-12) * 2.0;
    assert_norm_close(ctx, &values(&a.matmul(&x.t).unwrap()), &want, tol);
    let y_vals = random_vals(rng, rows * n, dtype, Range::Signed);
    let y = tensor_of(&y_vals, &[rows, n], dtype, device);
    a.matmul_into(0.5, &x.t, -2.0, &y).unwrap();
    let want: Vec<f64> = (0..rows * n)
        .map(|i| 0.5 * want[i] - 2.0 * y_vals[i])
        .collect();
    assert_norm_close(&format!("{ctx} into"), &values(&y), &want, tol * 2.0);
}

/// Products large enough to be split into tasks on every thread (the CPU writes each task's
/// rows into an uninitialised output: a row left out would show as garbage here), with a long
/// row, empty rows, plain and accumulating forms. The long row of 900 entries is cut into
/// pieces on CUDA and computed whole by its task on the CPU; the one of 50 000 entries is
/// longer than an eighth of a CPU task, so the CPU cuts it into pieces too.
#[test]
fn large_products_cover_every_row() {
    let mut rng = Generator::new(15);
    for device in devices() {
        for dtype in [DType::F32, DType::F64] {
            if !supports(&device, dtype) {
                continue;
            }
            for (cols, long) in [(1_000, 900), (60_000, 50_000)] {
                let coo = Coo::random(&mut rng, 150_000, cols, long, dtype);
                for n in [1usize, 3] {
                    let ctx = format!("large, a row of {long}, {dtype} {device} n={n}");
                    check_plain_and_into(&ctx, &coo, dtype, &device, n, &mut rng);
                }
            }
        }
    }
}

/// Matrices whose rows all hold the same number of entries (one a row, as in a cycle graph;
/// two and three a row) take the CPU's fixed-length row loop, at sizes that split into tasks
/// too; a matrix whose entry count is only a multiple of its row count must not.
#[test]
fn uniform_rows_match_the_reference() {
    let mut rng = Generator::new(18);
    for device in devices() {
        for dtype in [DType::F32, DType::F64, DType::BF16] {
            if !supports(&device, dtype) {
                continue;
            }
            for (rows, cols, len) in [
                (40, 50, 1),
                (40, 1000, 3),
                (150_000, 1000, 1),
                (150_000, 1000, 2),
            ] {
                let coo = Coo::uniform(&mut rng, rows, cols, len, dtype);
                for n in [1usize, 3] {
                    let ctx = format!("uniform {rows}x{cols} {len} a row {dtype} {device} n={n}");
                    check_plain_and_into(&ctx, &coo, dtype, &device, n, &mut rng);
                }
            }
            // Three entries in three rows, as 2, 0 and 1.
            let coo = Coo {
                rows: 3,
                cols: 4,
                r: vec![0, 0, 2],
                c: vec![1, 3, 0],
                v: random_vals(&mut rng, 3, dtype, Range::Signed),
            };
            let x = input(
                &mut rng,
                &[4],
                dtype,
                &device,
                Variant::Contiguous,
                Range::Signed,
            );
            let want = dense_product(&coo.dense(dtype), 3, 4, &x.vals, 1, false);
            let got = values(&coo.csr(dtype, &device).matmul(&x.t).unwrap());
            assert_norm_close(
                &format!("2-0-1 rows {dtype} {device}"),
                &got,
                &want,
                tol(dtype) * 2.0,
            );
        }
    }
}

#[test]
fn matmul_into_scales_and_accumulates() {
    let mut rng = Generator::new(12);
    for device in devices() {
        for dtype in [DType::F32, DType::F64, DType::BF16] {
            if !supports(&device, dtype) {
                continue;
            }
            let coo = Coo::random(&mut rng, 30, 200, 150, dtype);
            let a = coo.csr(dtype, &device);
            let dense = coo.dense(dtype);
            for n in [1usize, 7] {
                let x = input(
                    &mut rng,
                    &[200, n],
                    dtype,
                    &device,
                    Variant::Transposed,
                    Range::Signed,
                );
                let ax = dense_product(&dense, 30, 200, &x.vals, n, false);
                let (alpha, beta) = (0.75, -1.5);
                // y = alpha·A·x + beta·y on a narrowed view: the rest of its storage is kept.
                let y_vals = random_vals(&mut rng, 32 * n, dtype, Range::Signed);
                let base = tensor_of(&y_vals, &[32, n], dtype, &device);
                let y = base.narrow(0, 1, 30).unwrap();
                a.matmul_into(alpha, &x.t, beta, &y).unwrap();
                let want: Vec<f64> = (0..30 * n)
                    .map(|i| alpha * ax[i] + beta * y_vals[n + i])
                    .collect();
                let ctx = format!("matmul_into {dtype} {device} n={n}");
                assert_norm_close(&ctx, &values(&y), &want, tol(dtype) * 4.0);
                let all = values(&base);
                assert_eq!(all[..n], y_vals[..n], "{ctx}: row before the view changed");
                // beta = 0 ignores NaNs in y.
                let nan = Tensor::full(f64::NAN, [30, n], dtype, &device).unwrap();
                a.matmul_into(1.0, &x.t, 0.0, &nan).unwrap();
                assert_norm_close(&ctx, &values(&nan), &ax, tol(dtype) * 4.0);
            }
            // With gradients on and a tracked operand it refuses rather than detach silently.
            let xv = Tensor::ones(200, dtype, &device).unwrap().var().unwrap();
            let y = Tensor::zeros(30, dtype, &device).unwrap();
            let err = a.matmul_into(1.0, &xv, 0.0, &y).unwrap_err().to_string();
            assert!(err.contains("autograd"), "{err}");
        }
    }
}

#[test]
fn empty_shapes() {
    for device in devices() {
        for (rows, cols) in [(0usize, 4usize), (4, 0), (0, 0), (3, 5)] {
            let e = Tensor::zeros(0, DType::I64, &Device::Cpu).unwrap();
            let a = Csr::from_coo(
                rows,
                cols,
                &e,
                &e,
                &Tensor::zeros(0, DType::F32, &device).unwrap(),
            )
            .unwrap();
            assert_eq!((a.nnz(), a.dims()), (0, [rows, cols]));
            for n in [1usize, 4] {
                let x = Tensor::ones([cols, n], DType::F32, &device).unwrap();
                let y = a.matmul(&x).unwrap();
                assert_eq!(y.dims(), &[rows, n]);
                assert!(values(&y).iter().all(|&v| v == 0.0));
                let xt = Tensor::ones([rows, n], DType::F32, &device).unwrap();
                let yt = a.t_matmul(&xt).unwrap();
                assert_eq!(yt.dims(), &[cols, n]);
                assert!(values(&yt).iter().all(|&v| v == 0.0));
            }
            assert_eq!(a.to_dense().unwrap().dims(), &[rows, cols]);
        }
    }
}

#[test]
fn conversions_round_trip() {
    let mut rng = Generator::new(13);
    for device in devices() {
        for dtype in FLOATS {
            if !supports(&device, dtype) {
                continue;
            }
            let coo = Coo::random(&mut rng, 17, 90, 80, dtype);
            let a = coo.csr(dtype, &device);
            let dense = coo.dense(dtype);
            assert_eq!(
                values(&a.to_dense().unwrap()),
                dense,
                "to_dense {dtype} {device}"
            );
            // Rows come out sorted by column, without duplicates.
            let (rp, ci) = (values(a.row_ptr()), values(a.col_idx()));
            for r in 0..17 {
                let row = &ci[rp[r] as usize..rp[r + 1] as usize];
                assert!(
                    row.windows(2).all(|w| w[0] < w[1]),
                    "row {r} not sorted: {row:?}"
                );
            }
            let b = Csr::from_dense(&a.to_dense().unwrap()).unwrap();
            assert_eq!(values(&b.to_dense().unwrap()), dense);
            let t = a.transpose().unwrap();
            assert_eq!(t.dims(), [90, 17]);
            let td = values(&t.to_dense().unwrap());
            for r in 0..17 {
                for c in 0..90 {
                    assert_eq!(td[c * 17 + r], dense[r * 90 + c]);
                }
            }
            let host = a.to_device(&Device::Cpu).unwrap();
            assert_eq!(values(&host.to_dense().unwrap()), dense);
            let back = host.to_device(&device).unwrap();
            assert_eq!(back.device(), device);
            // A transposed view of a dense matrix converts like its copy.
            let dt = tensor_of(&dense, &[17, 90], dtype, &device).t().unwrap();
            let from_view = Csr::from_dense(&dt).unwrap();
            assert_eq!(values(&from_view.to_dense().unwrap()), td);
        }
    }
}

/// Duplicate columns inside a row given through `Csr::new` are kept and both count.
#[test]
fn raw_arrays_with_repeated_columns() {
    for device in devices() {
        let rp = Tensor::from_vec(vec![0u32, 3, 3, 4], 4, &Device::Cpu).unwrap();
        let ci = Tensor::from_vec(vec![2u32, 0, 2, 1], 4, &Device::Cpu).unwrap();
        // Exact in every float dtype; f32 where the device has no f64 (wgpu).
        let dtype = if supports(&device, DType::F64) {
            DType::F64
        } else {
            DType::F32
        };
        let on_device = |v: Vec<f64>| {
            let n = v.len();
            let t = Tensor::from_vec(v, n, &Device::Cpu).unwrap();
            t.to_dtype(dtype).unwrap().to_device(&device).unwrap()
        };
        let v = on_device(vec![1., 2., 3., 4.]);
        let a = Csr::new(3, 3, &rp, &ci, &v).unwrap();
        let x = on_device(vec![1., 10., 100.]);
        assert_eq!(values(&a.matmul(&x).unwrap()), [402., 0., 40.]);
        assert_eq!(values(&a.t_matmul(&x).unwrap()), [2., 400., 4.]);
    }
}

#[test]
fn malformed_input_is_an_error() {
    let cpu = Device::Cpu;
    let i64s = |v: &[i64]| Tensor::from_vec(v.to_vec(), v.len(), &cpu).unwrap();
    let vals = |n: usize| Tensor::ones(n, DType::F32, &cpu).unwrap();
    let err = |r: kiln::Result<Csr>| r.unwrap_err().to_string();
    let cases = [
        (
            err(Csr::new(2, 3, &i64s(&[1, 1, 2]), &i64s(&[0, 1]), &vals(2))),
            "starts at 1",
        ),
        (
            err(Csr::new(2, 3, &i64s(&[0, 2, 1]), &i64s(&[0]), &vals(1))),
            "decreases",
        ),
        (
            err(Csr::new(2, 3, &i64s(&[0, 1, 3]), &i64s(&[0, 1]), &vals(2))),
            "ends at 3",
        ),
        (
            err(Csr::new(3, 3, &i64s(&[0, 1, 2]), &i64s(&[0, 1]), &vals(2))),
            "needs 4",
        ),
        (
            err(Csr::new(2, 3, &i64s(&[0, 1, 2]), &i64s(&[0, 3]), &vals(2))),
            "outside 0..3",
        ),
        (
            err(Csr::new(2, 3, &i64s(&[0, 1, 2]), &i64s(&[0, -1]), &vals(2))),
            "-1",
        ),
        (
            err(Csr::new(2, 3, &i64s(&[0, 1, 2]), &i64s(&[0, 1]), &vals(3))),
            "2 entries",
        ),
        (
            err(Csr::new(2, 3, &i64s(&[0, -1, 2]), &i64s(&[0, 1]), &vals(2))),
            "decreases",
        ),
        (
            err(Csr::from_coo(
                2,
                2,
                &i64s(&[0, 2]),
                &i64s(&[0, 0]),
                &vals(2),
            )),
            "entry 1 at (2, 0)",
        ),
        (
            err(Csr::from_coo(2, 2, &i64s(&[0]), &i64s(&[0, 0]), &vals(2))),
            "1 row ids but 2",
        ),
    ];
    for (msg, want) in cases {
        assert!(msg.contains(want), "{msg:?} should mention {want:?}");
    }
    // Index arrays of a float dtype, and integer values.
    let f = Tensor::zeros(2, DType::F32, &cpu).unwrap();
    assert!(Csr::new(1, 1, &f, &i64s(&[]), &vals(0)).is_err());
    assert!(Csr::new(1, 1, &i64s(&[0, 0]), &i64s(&[]), &i64s(&[])).is_err());
    // Sizes beyond 32-bit indices: chosen automatically, refused when asked for.
    let big = Csr::new(
        1,
        3_000_000_000,
        &i64s(&[0, 1]),
        &i64s(&[2_999_999_999]),
        &vals(1),
    )
    .unwrap();
    assert_eq!(big.index_type(), IndexType::I64);
    let e = big.with_index_type(IndexType::I32).unwrap_err().to_string();
    assert!(e.contains("does not fit I32"), "{e}");
    // Products check shapes, dtypes and devices.
    let a = Csr::new(2, 3, &i64s(&[0, 1, 2]), &i64s(&[0, 1]), &vals(2)).unwrap();
    let e = a
        .matmul(&Tensor::ones(2, DType::F32, &cpu).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("[2, 3]") || e.contains("2x3"), "{e}");
    assert!(a
        .matmul(&Tensor::ones(3, DType::F64, &cpu).unwrap())
        .is_err());
    assert!(a
        .matmul(&Tensor::ones([3, 1, 1], DType::F32, &cpu).unwrap())
        .is_err());
}

#[test]
fn edge_list_reader() {
    let g = EdgeList::read("# header\n\n0 1\n 1\t2  # tab\n2 2\n5 0\n0 1\n".as_bytes()).unwrap();
    assert_eq!(g.nodes, 6);
    assert_eq!(g.src, [0, 1, 2, 5, 0]);
    assert_eq!(g.dst, [1, 2, 2, 0, 1]);
    for (text, line, what) in [
        ("0 1\n2\n", 2, "found one"),
        ("0 1\n1 2 3\n", 2, "found more"),
        ("0 -1\n", 1, "not a non-negative integer"),
        ("# c\n\nx y\n", 3, "not a non-negative integer"),
        ("0 99999999999999\n", 1, "above"),
        ("0 1.5\n", 1, "not a non-negative"),
    ] {
        let e = EdgeList::read(text.as_bytes()).unwrap_err().to_string();
        assert!(
            e.contains(&format!("line {line}:")) && e.contains(what),
            "{text:?}: {e}"
        );
    }
    assert_eq!(EdgeList::read("".as_bytes()).unwrap().nodes, 0);
}

/// PageRank as networkx defines it, by dense power iteration in f64.
fn reference_pagerank(g: &EdgeList, d: f64, iters: usize) -> Vec<f64> {
    let n = g.nodes;
    let mut edges: Vec<(usize, usize)> = g
        .src
        .iter()
        .zip(&g.dst)
        .map(|(&s, &t)| (s as usize, t as usize))
        .collect();
    edges.sort();
    edges.dedup();
    let mut deg = vec![0usize; n];
    for &(s, _) in &edges {
        deg[s] += 1;
    }
    let mut r = vec![1.0 / n as f64; n];
    for _ in 0..iters {
        let dangling: f64 = (0..n).filter(|&i| deg[i] == 0).map(|i| r[i]).sum();
        let mut next = vec![(1.0 - d) / n as f64 + d * dangling / n as f64; n];
        for &(s, t) in &edges {
            next[t] += d * r[s] / deg[s] as f64;
        }
        r = next;
    }
    r
}

#[test]
fn pagerank_matches_reference() {
    // Dangling nodes (3, 6), a self-loop, a duplicate edge, an isolated node (5).
    let text = "0 1\n0 2\n1 2\n2 0\n2 2\n0 1\n4 3\n4 0\n6 6\n2 6\n";
    let mut g = EdgeList::read(text.as_bytes()).unwrap();
    g.nodes = 8;
    g.src.push(7);
    g.dst.push(3);
    let want = reference_pagerank(&g, 0.85, 500);
    let opts = PageRankOptions {
        tol: 1e-13,
        max_iter: 500,
        ..PageRankOptions::default()
    };
    let mut per_device = Vec::new();
    for device in devices() {
        if !supports(&device, DType::F64) {
            // wgpu: the iteration in f32, to f32's resolution.
            let f32_opts = PageRankOptions {
                dtype: DType::F32,
                tol: 1e-6,
                ..opts
            };
            let pr = pagerank(&g, &f32_opts, &device).unwrap();
            assert!(pr.converged, "{device}: change {}", pr.change);
            assert_close(
                &format!("pagerank {device}"),
                &values(&pr.ranks),
                &want,
                1e-4,
            );
            continue;
        }
        let pr = pagerank(&g, &opts, &device).unwrap();
        assert!(pr.converged, "{device}: change {}", pr.change);
        let got = values(&pr.ranks);
        assert!((got.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        assert_close(&format!("pagerank {device}"), &got, &want, 1e-9);
        per_device.push(got);
    }
    // A generated power-law graph: devices agree to 1e-6 (relative to each rank).
    let big = EdgeList::power_law(3000, 5);
    let ranks: Vec<Vec<f64>> = devices()
        .iter()
        .filter(|d| supports(d, DType::F64))
        .map(|d| {
            values(
                &pagerank(&big, &PageRankOptions::default(), d)
                    .unwrap()
                    .ranks,
            )
        })
        .collect();
    let want = reference_pagerank(&big, 0.85, 200);
    for r in &ranks {
        assert_close("pagerank power-law", r, &want, 1e-6);
    }
    // Nonsense arguments are refused before any work.
    for bad in [
        PageRankOptions {
            damping: 1.0,
            ..opts
        },
        PageRankOptions {
            damping: f64::NAN,
            ..opts
        },
        PageRankOptions { tol: 0.0, ..opts },
        PageRankOptions {
            max_iter: 0,
            ..opts
        },
        PageRankOptions {
            dtype: DType::I64,
            ..opts
        },
    ] {
        assert!(pagerank(&g, &bad, &Device::Cpu).is_err(), "{bad:?}");
    }
    assert!(pagerank(&EdgeList::default(), &opts, &Device::Cpu).is_err());
}

/// cuSPARSE and kiln's kernels, each forced, against the dense reference (f32/f64, SpMV
/// and SpMM, a strided dense operand). With `KILN_REQUIRE_CUDA=1` cuSPARSE must be present.
#[cfg(feature = "cuda")]
#[test]
fn cuda_engines_agree() {
    use kiln::cuda::{set_sparse_engine, SparseEngine};
    let Some(device) = devices().into_iter().find(|d| d.is_cuda()) else {
        return;
    };
    let path = kiln::cuda::sparse_path();
    if std::env::var("KILN_REQUIRE_CUDA").is_ok_and(|v| v == "1") {
        assert!(!path.contains("not used"), "cuSPARSE missing: {path}");
    }
    let _only_me = ENGINE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = Generator::new(14);
    for dtype in [DType::F32, DType::F64] {
        let coo = Coo::random(&mut rng, 40, 300, 280, dtype);
        let dense = coo.dense(dtype);
        for engine in [SparseEngine::Library, SparseEngine::Kiln] {
            set_sparse_engine(engine);
            let a = coo.csr(dtype, &device);
            for (n, variant) in [
                (1, Variant::Contiguous),
                (5, Variant::Contiguous),
                (5, Variant::Narrowed),
            ] {
                let x = input(&mut rng, &[300, n], dtype, &device, variant, Range::Signed);
                let want = dense_product(&dense, 40, 300, &x.vals, n, false);
                let got = a.matmul(&x.t).unwrap();
                let ctx = format!("{engine:?} {dtype} n={n} {variant:?}");
                assert_norm_close(&ctx, &values(&got), &want, tol(dtype) * 2.0);
            }
        }
        set_sparse_engine(SparseEngine::Measure);
    }
}

/// The process-wide engine and group settings of the CUDA tests below.
#[cfg(feature = "cuda")]
static ENGINE_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// kiln's SpMM kernels with every row group forced (the measured choice picks among them on
/// large matrices), with 16-byte column loads (n a multiple of 16 bytes, aligned) and without
/// (odd widths, a narrowed operand), tiles past n, and a long row in pieces.
#[cfg(feature = "cuda")]
#[test]
fn cuda_spmm_every_row_group() {
    use kiln::cuda::{set_sparse_engine, set_spmm_group, SparseEngine};
    let Some(device) = devices().into_iter().find(|d| d.is_cuda()) else {
        return;
    };
    let _only_me = ENGINE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    set_sparse_engine(SparseEngine::Kiln);
    let mut rng = Generator::new(16);
    for dtype in [DType::F32, DType::F64, DType::BF16] {
        let coo = Coo::random(&mut rng, 40, 300, 280, dtype);
        let dense = coo.dense(dtype);
        let a = coo.csr(dtype, &device);
        for group in [1, 2, 4, 8, 16, 32] {
            set_spmm_group(Some(group));
            for (n, variant) in [
                (40, Variant::Contiguous),
                (6, Variant::Contiguous),
                (150, Variant::Contiguous),
                (40, Variant::Narrowed),
                (64, Variant::Transposed),
            ] {
                let x = input(&mut rng, &[300, n], dtype, &device, variant, Range::Signed);
                let want = dense_product(&dense, 40, 300, &x.vals, n, false);
                let got = a.matmul(&x.t).unwrap();
                let ctx = format!("group {group} {dtype} n={n} {variant:?}");
                assert_norm_close(&ctx, &values(&got), &want, tol(dtype) * 2.0);
            }
        }
    }
    set_spmm_group(None);
    set_sparse_engine(SparseEngine::Measure);
}

mod edge_list_fuzz {
    use kiln::sparse::graph::EdgeList;
    use proptest::prelude::*;

    /// A valid edge file: lines of two ids, comments and blank lines.
    fn valid_file() -> impl Strategy<Value = String> {
        proptest::collection::vec(
            prop_oneof![
                (0u32..50, 0u32..50).prop_map(|(a, b)| format!("{a} {b}")),
                Just("# comment".to_string()),
                Just(String::new()),
                (0u32..50, 0u32..50).prop_map(|(a, b)| format!("\t{a}\t {b}  # tail")),
            ],
            0..30,
        )
        .prop_map(|lines| lines.join("\n"))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

        /// Any mutation of a valid file (bytes replaced, inserted, cut) is read or refused
        /// with a line number, never a panic; what is read is consistent.
        #[test]
        fn mutated_edge_files_never_panic(
            file in valid_file(),
            edits in proptest::collection::vec((any::<usize>(), any::<u8>(), 0u8..3), 0..6),
        ) {
            let mut bytes = file.into_bytes();
            for (pos, byte, kind) in edits {
                let at = if bytes.is_empty() { 0 } else { pos % bytes.len() };
                match kind {
                    0 if !bytes.is_empty() => bytes[at] = byte,
                    1 => bytes.insert(at.min(bytes.len()), byte),
                    _ => bytes.truncate(at),
                }
            }
            match EdgeList::read(&bytes[..]) {
                Ok(g) => {
                    prop_assert_eq!(g.src.len(), g.dst.len());
                    let max = g.src.iter().chain(&g.dst).max().map_or(0, |&m| m as usize + 1);
                    prop_assert_eq!(g.nodes, max);
                }
                Err(e) => {
                    let msg = e.to_string();
                    prop_assert!(msg.contains("line "), "{}", msg);
                }
            }
        }
    }
}
