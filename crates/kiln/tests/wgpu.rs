//! What only the wgpu backend has: refused dtypes, launches folded into 2-D, tensors larger
//! than one shader binding, the caching allocator's statistics, faults found by kernels and
//! GPU timing. The op suites (`ops_*.rs`, `grad.rs`) run on wgpu adapter 0 too.
//!
//! Every test skips when there is no wgpu adapter, unless `KILN_REQUIRE_WGPU=1`.
#![cfg(feature = "wgpu")]

mod common;
use common::*;
use kiln::{DType, Device, Error, Generator, Tensor};

/// Tests share the process's wgpu device and run on parallel threads. A fault a kernel
/// finds (a bad label) is the device's, reported at its next read by whichever thread reads
/// first, so the test that causes one runs alone ([`wgpu_alone`]) and the others hold this
/// lock shared.
static DEVICE_USE: std::sync::RwLock<()> = std::sync::RwLock::new(());

type Shared = std::sync::RwLockReadGuard<'static, ()>;
type Alone = std::sync::RwLockWriteGuard<'static, ()>;

/// Adapter 0 and a shared hold on it.
fn wgpu() -> Option<(Device, Shared)> {
    let d = devices().into_iter().find(|d| d.is_wgpu())?;
    Some((d, DEVICE_USE.read().unwrap_or_else(|e| e.into_inner())))
}

/// Adapter 0, with no other test of this file using it meanwhile.
fn wgpu_alone() -> Option<(Device, Alone)> {
    let d = devices().into_iter().find(|d| d.is_wgpu())?;
    Some((d, DEVICE_USE.write().unwrap_or_else(|e| e.into_inner())))
}

#[test]
fn f64_and_bf16_are_refused_not_miscomputed() {
    let Some((d, _shared)) = wgpu() else { return };
    assert!(d.supports(DType::F32) && d.supports(DType::I64));
    for dtype in [DType::F64, DType::BF16] {
        assert!(!d.supports(dtype), "{d} says it holds {dtype}");
        match Tensor::zeros(3, dtype, &d) {
            Err(Error::UnsupportedDType { dtype: got, .. }) => assert_eq!(got, dtype),
            other => panic!("{dtype} on {d}: expected UnsupportedDType, got {other:?}"),
        }
    }
    let x = Tensor::from_vec(vec![1f32, 2., 3.], 3, &d).unwrap();
    match x.to_dtype(DType::F64) {
        Err(Error::UnsupportedDType { op, dtype }) => {
            assert_eq!((op, dtype), ("cast", DType::F64))
        }
        other => panic!("cast to f64: {other:?}"),
    }
    // The host copy still works, so f64 results are one transfer away.
    let back = x
        .to_device(&Device::Cpu)
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap();
    assert_eq!(back.to_vec::<f64>().unwrap(), [1.0, 2.0, 3.0]);
}

#[test]
fn launches_beyond_65535_workgroups_cover_every_element() {
    let Some((d, _shared)) = wgpu() else { return };
    // 256 · 65535 + 1000 elements: one more row of workgroups than a 1-D grid holds.
    let n = 256 * 65_535 + 1000;
    let x = Tensor::arange(0.0, n as f64, 1.0, DType::F32, &Device::Cpu).unwrap();
    let y = x.to_device(&d).unwrap().add_scalar(1.0).unwrap();
    let v = y.to_vec::<f32>().unwrap();
    assert_eq!(v.len(), n);
    for i in [0, 1, 255, 65_535 * 256 - 1, 65_535 * 256, n - 2, n - 1] {
        assert_eq!(v[i], (i + 1) as f32, "element {i}");
    }
    let ones = Tensor::ones(n, DType::F32, &d).unwrap();
    assert_eq!(
        ones.sum(kiln::AllDims, false)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap(),
        n as f32
    );
}

/// Rows gathered from a tensor larger than one storage binding (lavapipe's is 128 MiB):
/// the gather runs in chunks. Skipped where a binding holds more than 512 MiB (real GPUs),
/// where such a tensor would take gigabytes.
#[test]
fn index_select_reads_tensors_larger_than_one_binding() {
    let Some((d, _shared)) = wgpu() else { return };
    let Device::Wgpu(o) = d else { unreachable!() };
    let limit = kiln::wgpu::adapters()[o].max_binding_bytes;
    if limit > 512 << 20 {
        return;
    }
    let cols = 1000;
    let rows = (limit as usize / 4 / cols) + 300; // just over one binding
    let host: Vec<f32> = (0..rows * cols).map(|i| (i % 7919) as f32).collect();
    let x = Tensor::from_vec(host.clone(), [rows, cols], &d).unwrap();
    let pick: Vec<i64> = vec![0, rows as i64 - 1, 5, rows as i64 / 2, rows as i64 - 300];
    let ids = Tensor::from_vec(pick.clone(), pick.len(), &d).unwrap();
    let got = x.index_select(&ids, 0).unwrap().to_vec::<f32>().unwrap();
    for (k, &r) in pick.iter().enumerate() {
        let r = r as usize;
        assert_eq!(
            &got[k * cols..(k + 1) * cols],
            &host[r * cols..(r + 1) * cols],
            "row {r}"
        );
    }
    // Other ops refuse to bind it whole, naming the kernel.
    let err = x.sum(kiln::AllDims, false).unwrap_err().to_string();
    assert!(err.contains("largest storage binding"), "{err}");
}

#[test]
fn the_pool_reuses_freed_buffers() {
    let Some((d, _shared)) = wgpu() else { return };
    let Device::Wgpu(o) = d else { unreachable!() };
    let before = kiln::wgpu::memory_stats(o).unwrap();
    for _ in 0..20 {
        let a = Tensor::zeros([300, 301], DType::F32, &d).unwrap();
        drop(a.add_scalar(1.0).unwrap());
    }
    kiln::wgpu::synchronize(o).unwrap();
    let after = kiln::wgpu::memory_stats(o).unwrap();
    assert!(
        after.requests - before.requests >= 40,
        "{before:?} -> {after:?}"
    );
    assert!(
        after.reuses - before.reuses >= 30,
        "{before:?} -> {after:?}"
    );
    assert!(after.peak_bytes_in_use >= 2 * 300 * 301 * 4);
}

#[test]
fn a_bad_label_is_reported_at_the_next_read() {
    let Some((d, _alone)) = wgpu_alone() else {
        return;
    };
    let logits = Tensor::randn([4, 3], 0.0, 1.0, DType::F32, &d, &mut Generator::new(1)).unwrap();
    let labels = Tensor::from_vec(vec![0i64, 2, 3, 1], 4, &d).unwrap();
    let rows = logits.softmax_cross_entropy(&labels, 0.0, 1.0).unwrap();
    let err = rows.loss.to_vec::<f32>().unwrap_err().to_string();
    assert!(
        err.contains("cross_entropy") && err.contains("label"),
        "{err}"
    );
    // The fault is cleared once reported.
    assert_eq!(
        Tensor::ones(2, DType::F32, &d)
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        [1.0, 1.0]
    );
}

#[test]
fn sparse_products_with_many_pieces_match_the_cpu() {
    let Some((d, _shared)) = wgpu() else { return };
    // Row 3 holds 5000 entries (20 pieces); the other rows 0-3 each.
    let mut rng = Generator::new(9);
    let (rows, cols, n) = (300usize, 6000usize, 5usize);
    let (mut r, mut c) = (Vec::new(), Vec::new());
    for row in 0..rows {
        let k = if row == 3 { 5000 } else { rng.below(4) };
        for _ in 0..k {
            r.push(row as i64);
            c.push(rng.below(cols) as i64);
        }
    }
    let nnz = r.len();
    let vals = Tensor::randn(nnz, 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
    let x = Tensor::randn([cols, n], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
    let (r, c) = (
        Tensor::from_vec(r, nnz, &Device::Cpu).unwrap(),
        Tensor::from_vec(c, nnz, &Device::Cpu).unwrap(),
    );
    let on = |dev: &Device| {
        let a =
            kiln::sparse::Csr::from_coo(rows, cols, &r, &c, &vals.to_device(dev).unwrap()).unwrap();
        // A transposed view of X, and the product through the cached transpose.
        let xt = x.t().unwrap().contiguous().unwrap().to_device(dev).unwrap();
        let y = a.matmul(&xt.t().unwrap()).unwrap();
        let z = a.t_matmul(&y).unwrap();
        (y.to_vec::<f32>().unwrap(), z.to_vec::<f32>().unwrap())
    };
    let (want_y, want_z) = on(&Device::Cpu);
    let (got_y, got_z) = on(&d);
    for (got, want) in [(got_y, want_y), (got_z, want_z)] {
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{g} vs {w}");
        }
    }
}

#[test]
fn gpu_timing_measures_queued_work() {
    let Some((d, _shared)) = wgpu() else { return };
    let Device::Wgpu(o) = d else { unreachable!() };
    let a = Tensor::randn([256, 256], 0.0, 1.0, DType::F32, &d, &mut Generator::new(2)).unwrap();
    let (y, ms) = kiln::wgpu::time_region(o, || a.matmul(&a)).unwrap();
    assert!(ms > 0.0 && ms < 60_000.0, "{ms} ms");
    assert_eq!(y.dims(), [256, 256]);
    // A burst: one time per run, each run's work between its own timestamps (eight chained
    // products take longer than one), and every run's result computed.
    let mut outs = Vec::new();
    let one = kiln::wgpu::time_each(o, 5, || {
        outs.push(a.matmul(&a)?);
        Ok(())
    })
    .unwrap();
    assert_eq!((one.len(), outs.len()), (5, 5));
    let eight = kiln::wgpu::time_each(o, 5, || {
        let mut x = a.clone();
        for _ in 0..8 {
            x = x.matmul(&a)?.mul_scalar(0.01)?;
        }
        drop(x);
        Ok(())
    })
    .unwrap();
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (m1, m8) = (median(one), median(eight));
    assert!(
        m1 > 0.0 && m8 > 2.0 * m1,
        "one product {m1} ms, eight {m8} ms"
    );
    let want = a.to_device(&Device::Cpu).unwrap();
    let want = want.matmul(&want).unwrap().to_vec::<f32>().unwrap();
    for y in outs {
        let got = y.to_vec::<f32>().unwrap();
        assert!(got
            .iter()
            .zip(&want)
            .all(|(g, w)| (g - w).abs() <= 1e-3 * (1.0 + w.abs())));
    }
}

#[test]
fn a_tensor_beyond_the_largest_buffer_is_an_error() {
    let Some((d, _shared)) = wgpu() else { return };
    let err = Tensor::zeros(1usize << 40, DType::F32, &d)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("largest buffer") || err.contains("32-bit"),
        "{err}"
    );
}

/// Enough output blocks to take the large-tile kernel (8×8 sums per invocation), at odd
/// sizes, batched, with a transposed operand: against the CPU.
#[test]
fn large_tile_products_match_the_cpu() {
    let Some((d, _shared)) = wgpu() else { return };
    let mut rng = Generator::new(3);
    let a = Tensor::randn([270, 130, 9], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
    let b = Tensor::randn([270, 129, 9], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng)
        .unwrap()
        .transpose(1, 2)
        .unwrap();
    let want = a.matmul(&b).unwrap().to_vec::<f32>().unwrap();
    let got = a
        .to_device(&d)
        .unwrap()
        .matmul(
            &b.to_device(&d)
                .unwrap()
                .transpose(1, 2)
                .unwrap()
                .contiguous()
                .unwrap()
                .transpose(1, 2)
                .unwrap(),
        )
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let (got, want): (Vec<f64>, Vec<f64>) = (
        got.iter().map(|&v| v as f64).collect(),
        want.iter().map(|&v| v as f64).collect(),
    );
    assert_close("batched large-tile matmul", &got, &want, 1e-5);
}

/// Contiguous f32 maps read and write whole vec4s: offsets that are and are not multiples
/// of 4, lengths with a partial last vec4, against the CPU.
#[test]
fn vec4_maps_match_the_cpu_at_every_offset_and_length() {
    let Some((d, _shared)) = wgpu() else { return };
    let mut rng = Generator::new(4);
    let a = Tensor::randn(4099, 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
    let b = Tensor::randn(4099, 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
    let (ad, bd) = (a.to_device(&d).unwrap(), b.to_device(&d).unwrap());
    for (start, len) in [(0, 4099), (4, 4093), (3, 4096), (8, 1), (1, 7)] {
        let f = |x: &Tensor, y: &Tensor| {
            let (x, y) = (
                x.narrow(0, start, len).unwrap(),
                y.narrow(0, 0, len).unwrap(),
            );
            let s = x.add(&y).unwrap().exp().unwrap();
            s.to_vec::<f32>().unwrap()
        };
        let (want, got) = (f(&a, &b), f(&ad, &bd));
        assert_eq!(want.len(), got.len());
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g - w).abs() <= 1e-5 * w.abs(),
                "start {start} len {len}: {g} vs {w}"
            );
        }
    }
}

#[test]
fn large_uploads_go_through_pieces_in_order() {
    // 17M + 3 elements: eight-MiB staging pieces, the batch submitted mid-upload (64 MiB
    // staged), and a short last piece, each at its offset.
    let Some((d, _shared)) = wgpu() else { return };
    let n = (17 << 20) + 3;
    let host: Vec<f32> = (0..n).map(|i| (i % 9973) as f32 - 4000.0).collect();
    let x = Tensor::from_vec(host.clone(), n, &d).unwrap();
    let back = x.to_device(&Device::Cpu).unwrap().to_vec::<f32>().unwrap();
    assert!(
        back == host,
        "the uploaded tensor differs from the host data"
    );
}
