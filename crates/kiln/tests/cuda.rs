//! CUDA-specific behaviour: kernel compilation, the caching allocator, out-of-memory
//! recovery, transfers, TF32, index errors, and large inputs through the vectorised and
//! split paths. Tests that need a GPU skip without one, unless `KILN_REQUIRE_CUDA=1`.
#![cfg(feature = "cuda")]

mod common;
use common::*;
use kiln::{cuda, AllDims, DType, Device, Error, Generator, Tensor};

/// The GPU tests of this binary run one at a time: the out-of-range-index flag is per device,
/// so another test's read could report (and clear) the error the index test expects.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn gpu() -> Option<Device> {
    if cuda::is_available() {
        return Some(Device::Cuda(0));
    }
    if std::env::var("KILN_REQUIRE_CUDA").is_ok_and(|v| v == "1") {
        panic!(
            "KILN_REQUIRE_CUDA=1 but CUDA is unavailable: {:?}",
            cuda::unavailable_reason()
        );
    }
    eprintln!("skipped: no CUDA device ({:?})", cuda::unavailable_reason());
    None
}

#[test]
fn every_kernel_source_compiles_for_sm90() {
    if !cuda::compile::nvrtc_available() {
        if std::env::var("KILN_REQUIRE_NVRTC").is_ok_and(|v| v == "1") {
            panic!("KILN_REQUIRE_NVRTC=1 but libnvrtc cannot be loaded (set LD_LIBRARY_PATH)");
        }
        eprintln!("skipped: NVRTC not found");
        return;
    }
    let compiled = cuda::compile_all_kernels((9, 0)).expect("every kernel module compiles");
    let modules: usize = cuda::compile::KernelSource::ALL
        .iter()
        .map(|s| s.dtypes().len())
        .sum();
    assert_eq!(compiled.len(), modules);
    for (name, size) in compiled {
        assert!(size > 1000, "{name}: cubin of {size} bytes");
    }
    // A unary module with its op fixed holds that dtype's kernel alone, and is far smaller.
    use cuda::compile::{KernelSource, ModuleKey};
    let relu = ModuleKey {
        source: KernelSource::Unary,
        dtype: DType::F32,
        op: Some(3),
    };
    let text = relu.source_text();
    assert!(text.contains("UNARY_FOR(float, f32)") && !text.contains("UNARY_FOR(f16, f16)"));
    assert!(text.starts_with("#define KILN_FIXED_OP 3"));
    let small = cuda::compile::compile_cubin(&relu.name(), &text, (9, 0)).unwrap();
    let generic = ModuleKey { op: None, ..relu };
    let big =
        cuda::compile::compile_cubin(&generic.name(), &generic.source_text(), (9, 0)).unwrap();
    assert!(
        small.len() * 3 < big.len(),
        "{} vs {} bytes",
        small.len(),
        big.len()
    );
    // A broken source is reported with the compiler's log, not a panic.
    let err = cuda::compile::compile_cubin(
        "broken",
        "extern \"C\" __global__ void k() { undeclared(); }",
        (9, 0),
    )
    .expect_err("must fail");
    assert!(err.to_string().contains("undeclared"), "{err}");
}

/// A process that exits while kernels compile in the background must exit cleanly (NVRTC
/// torn down under a compiling thread crashed it before `prefetch` waited at exit). The test
/// runs itself as a child that starts the background compiles and returns at once.
#[test]
fn exiting_during_background_compiles_is_clean() {
    if std::env::var("KILN_EXIT_RACE_CHILD").is_ok() {
        use cuda::compile::{KernelSource, ModuleKey};
        let keys: Vec<ModuleKey> = KernelSource::ALL
            .iter()
            .map(|&source| ModuleKey {
                source,
                dtype: DType::F32,
                op: None,
            })
            .collect();
        cuda::compile::prefetch(&keys, (9, 0));
        return;
    }
    if !cuda::compile::nvrtc_available() {
        eprintln!("skipped: NVRTC not found");
        return;
    }
    let cache = std::env::temp_dir().join(format!("kiln-exit-race-{}", std::process::id()));
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "exiting_during_background_compiles_is_clean",
            "--nocapture",
        ])
        .env("KILN_EXIT_RACE_CHILD", "1")
        .env("KILN_KERNEL_CACHE", &cache)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&cache);
    assert!(
        out.status.success(),
        "child exited with {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn compiled_kernels_are_read_back_from_the_disk_cache() {
    if !cuda::compile::nvrtc_available() {
        eprintln!("skipped: NVRTC not found");
        return;
    }
    // A private cache: the first call compiles and writes it; a valid cubin edited in place
    // comes back from the second call (so it compiled nothing), and a truncated one is
    // detected and rebuilt.
    let dir = std::env::temp_dir().join(format!("kiln-cache-test-{}", std::process::id()));
    let key = cuda::compile::ModuleKey {
        source: cuda::compile::KernelSource::Index,
        dtype: DType::F32,
        op: None,
    };
    let first = cuda::compile::cubin_cached(&dir, key, (9, 0)).unwrap();
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let file = files[0].to_string_lossy().to_string();
    assert!(
        file.contains("sm_90a") && file.contains("index-f32"),
        "the key names the module and the architecture: {files:?}"
    );
    let mut edited = first.clone();
    let mid = edited.len() / 2;
    edited[mid] ^= 0x5a;
    std::fs::write(&files[0], &edited).unwrap();
    assert_eq!(
        cuda::compile::cubin_cached(&dir, key, (9, 0)).unwrap(),
        edited
    );
    std::fs::write(&files[0], &first[..first.len() / 3]).unwrap();
    let rebuilt = cuda::compile::cubin_cached(&dir, key, (9, 0)).unwrap();
    assert_eq!(rebuilt.len(), first.len(), "a truncated cubin is rebuilt");
    assert_eq!(std::fs::read(&files[0]).unwrap(), rebuilt);
    assert!(first.len() > 1000);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Four processes (two threads each) compile the same modules into one empty cache folder
/// at once: every one gets a whole cubin, the folder ends with exactly one valid file per
/// module and no temporary files. The child mode compiles and prints the cubins' sizes.
#[test]
fn processes_compiling_into_one_cache_never_tear_a_file() {
    use cuda::compile::{KernelSource, ModuleKey};
    let keys = [
        ModuleKey {
            source: KernelSource::Index,
            dtype: DType::F32,
            op: None,
        },
        ModuleKey {
            source: KernelSource::Cast,
            dtype: DType::F16,
            op: None,
        },
    ];
    if let Ok(dir) = std::env::var("KILN_CACHE_RACE_CHILD") {
        let dir = std::path::PathBuf::from(dir);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for key in keys {
                        let cubin = cuda::compile::cubin_cached(&dir, key, (9, 0)).unwrap();
                        assert!(cubin.len() > 1000 && cubin.starts_with(b"\x7fELF"));
                    }
                });
            }
        });
        return;
    }
    if !cuda::compile::nvrtc_available() {
        eprintln!("skipped: NVRTC not found");
        return;
    }
    let dir = std::env::temp_dir().join(format!("kiln-cache-race-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let children: Vec<_> = (0..4)
        .map(|_| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "processes_compiling_into_one_cache_never_tear_a_file",
                ])
                .env("KILN_CACHE_RACE_CHILD", &dir)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "child: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert_eq!(
        files.len(),
        keys.len(),
        "one file per module, no leftovers: {files:?}"
    );
    for key in keys {
        // The file's own bytes (reading through the cache would silently rebuild a torn
        // one) equal a fresh compile.
        let fresh = cuda::compile::compile_cubin(&key.name(), &key.source_text(), (9, 0)).unwrap();
        let prefix = format!("{}-", key.name());
        let file = files
            .iter()
            .find(|f| {
                f.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(&prefix)
            })
            .unwrap_or_else(|| panic!("no cache file for {}: {files:?}", key.name()));
        assert_eq!(std::fs::read(file).unwrap(), fresh, "{}", key.name());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn device_queries() {
    let _serial = serial();
    let Some(_) = gpu() else { return };
    let info = cuda::device_info(0).unwrap();
    assert!(
        info.compute_capability.0 >= 7 && info.total_memory > 1 << 30 && info.multiprocessors > 0,
        "{info:?}"
    );
    let (free, total) = cuda::mem_info(0).unwrap();
    assert!(free <= total && total > 0);
    assert!(cuda::device_count() >= 1);
    assert!(matches!(
        cuda::device_info(999),
        Err(Error::DeviceUnavailable { .. })
    ));
}

#[test]
fn allocator_reuses_buffers_in_a_training_like_loop() {
    let _serial = serial();
    let Some(dev) = gpu() else { return };
    let mut rng = Generator::new(0);
    let x = Tensor::randn([256, 784], 0.0, 1.0, DType::F32, &dev, &mut rng).unwrap();
    let mut w = Tensor::randn([784, 128], 0.0, 0.05, DType::F32, &dev, &mut rng).unwrap();
    let step = |w: &Tensor| -> Tensor {
        let h = x.matmul(w).unwrap().relu().unwrap();
        let loss = h.sqr().unwrap().mean(AllDims, false).unwrap();
        let g = x.t().unwrap().matmul(&h).unwrap().mul_scalar(1e-4).unwrap();
        drop(loss);
        w.sub(&g).unwrap()
    };
    for _ in 0..10 {
        w = step(&w);
    }
    let before = cuda::memory_stats(0).unwrap();
    for _ in 0..200 {
        w = step(&w);
    }
    cuda::synchronize(0).unwrap();
    let after = cuda::memory_stats(0).unwrap();
    let requests = after.requests - before.requests;
    let reuses = after.reuses - before.reuses;
    let rate = reuses as f64 / requests as f64;
    assert!(requests > 1000, "{requests} requests");
    assert!(
        rate >= 0.99,
        "steady-state reuse rate {rate:.4} ({reuses}/{requests})"
    );
    assert!(after.peak_bytes_in_use >= after.bytes_in_use && after.bytes_in_use > 0);
}

#[test]
fn out_of_memory_is_a_recoverable_error() {
    let _serial = serial();
    let Some(dev) = gpu() else { return };
    let (_, total) = cuda::mem_info(0).unwrap();
    let n = total / 4 * 2; // twice the device's memory in f32
    match Tensor::zeros(n, DType::F32, &dev) {
        Err(Error::OutOfMemory {
            device,
            requested,
            free,
        }) => {
            assert_eq!(device, dev);
            assert!(requested >= n * 4 && free < requested);
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    // The program goes on.
    let t = Tensor::ones(1000, DType::F32, &dev).unwrap();
    assert_eq!(
        t.sum(AllDims, false)
            .unwrap()
            .to_device(&Device::Cpu)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap(),
        1000.0
    );
    assert!(cuda::memory_stats(0).unwrap().oom_retries >= 1);
}

#[test]
fn empty_cache_returns_cached_memory() {
    let _serial = serial();
    let Some(dev) = gpu() else { return };
    drop(Tensor::zeros(16 << 20, DType::F32, &dev).unwrap());
    assert!(cuda::memory_stats(0).unwrap().bytes_cached >= 64 << 20);
    cuda::empty_cache(0).unwrap();
    assert_eq!(cuda::memory_stats(0).unwrap().bytes_cached, 0);
}

#[test]
fn transfers_round_trip_at_every_size() {
    let _serial = serial();
    let Some(dev) = gpu() else { return };
    let mut rng = Generator::new(1);
    for n in [0usize, 1, 1000, 262_144, 5_000_001, 9_000_000] {
        let x = Tensor::randn(n, 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng).unwrap();
        let back = x.to_device(&dev).unwrap().to_device(&Device::Cpu).unwrap();
        assert_eq!(
            back.to_vec::<f32>().unwrap(),
            x.to_vec::<f32>().unwrap(),
            "{n} elements"
        );
    }
    // Narrowed and transposed device views read back correctly.
    let x = Tensor::randn([3000, 2000], 0.0, 1.0, DType::BF16, &Device::Cpu, &mut rng).unwrap();
    let g = x.to_device(&dev).unwrap();
    for (a, b) in [
        (
            x.narrow(0, 1000, 1500).unwrap(),
            g.narrow(0, 1000, 1500).unwrap(),
        ),
        (x.t().unwrap(), g.t().unwrap()),
    ] {
        assert_eq!(
            b.to_device(&Device::Cpu)
                .unwrap()
                .to_vec::<kiln::bf16>()
                .unwrap(),
            a.to_vec::<kiln::bf16>().unwrap()
        );
    }
}

#[test]
fn tf32_is_opt_in() {
    let _serial = serial();
    let Some(dev) = gpu() else { return };
    let mut rng = Generator::new(2);
    let a = input(
        &mut rng,
        &[512, 512],
        DType::F32,
        &dev,
        Variant::Contiguous,
        Range::Signed,
    );
    let b = input(
        &mut rng,
        &[512, 512],
        DType::F32,
        &dev,
        Variant::Transposed,
        Range::Signed,
    );
    let reference =
        a.t.to_device(&Device::Cpu)
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap()
            .matmul(
                &b.t.to_device(&Device::Cpu)
                    .unwrap()
                    .to_dtype(DType::F64)
                    .unwrap(),
            )
            .unwrap();
    let want = reference.to_vec::<f64>().unwrap();
    let rel = |t: &Tensor| {
        let g = values(t);
        let num: f64 = g
            .iter()
            .zip(&want)
            .map(|(x, y)| (x - y).powi(2))
            .sum::<f64>()
            .sqrt();
        num / want.iter().map(|y| y * y).sum::<f64>().sqrt()
    };
    assert!(!cuda::tf32_enabled());
    let exact = rel(&a.t.matmul(&b.t).unwrap());
    cuda::set_tf32(true);
    let fast = rel(&a.t.matmul(&b.t).unwrap());
    cuda::set_tf32(false);
    assert!(exact < 1e-6, "f32 GEMM error {exact:.2e}");
    assert!(
        fast > 10.0 * exact && fast < 1e-2,
        "tf32 error {fast:.2e} vs f32 {exact:.2e}"
    );
}

#[test]
fn out_of_range_indices_are_reported_at_the_next_read() {
    let _serial = serial();
    let Some(dev) = gpu() else { return };
    let x = Tensor::ones([3, 4], DType::F32, &dev).unwrap();
    let ids = Tensor::from_vec(vec![0i64, 7], 2, &dev).unwrap();
    let y = x.index_select(&ids, 0).unwrap(); // queued: the check is asynchronous
    let err = y
        .to_device(&Device::Cpu)
        .expect_err("out-of-range index must be reported");
    assert!(err.to_string().contains("out of range"), "{err}");
    // The flag is cleared: later work is fine.
    assert_eq!(
        values(
            &x.index_select(&Tensor::from_vec(vec![2i64], 1, &dev).unwrap(), 0)
                .unwrap()
        ),
        vec![1.0; 4]
    );
}

#[test]
fn large_inputs_match_the_cpu() {
    let _serial = serial();
    let Some(dev) = gpu() else { return };
    let mut rng = Generator::new(3);
    let cpu = Device::Cpu;
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        let t = tol(dtype);
        let x = Tensor::randn([1 << 20], 0.0, 1.0, dtype, &cpu, &mut rng).unwrap();
        let g = x.to_device(&dev).unwrap();
        // Split row reduction (one long row) and arg reductions across splits.
        for (name, a, b) in [
            (
                "sum",
                x.sum(AllDims, false).unwrap(),
                g.sum(AllDims, false).unwrap(),
            ),
            (
                "max",
                x.max(AllDims, false).unwrap(),
                g.max(AllDims, false).unwrap(),
            ),
            (
                "argmax",
                x.argmax(0, false).unwrap(),
                g.argmax(0, false).unwrap(),
            ),
            (
                "argmin",
                x.argmin(0, false).unwrap(),
                g.argmin(0, false).unwrap(),
            ),
        ] {
            assert_norm_close(&format!("{name} {dtype}"), &values(&b), &values(&a), t);
        }
        // Column reduction with splits, row reduction with many rows.
        let m = x.reshape([4096, 256]).unwrap();
        let gm = g.reshape([4096, 256]).unwrap();
        assert_norm_close(
            &format!("sum0 {dtype}"),
            &values(&gm.sum(0, false).unwrap()),
            &values(&m.sum(0, false).unwrap()),
            t,
        );
        assert_close(
            &format!("max1 {dtype}"),
            &values(&gm.max(1, false).unwrap()),
            &values(&m.max(1, false).unwrap()),
            0.0,
        );
        // Softmax: register path, vector path, shared-memory rows, rows too long for shared
        // memory, and a non-last dim.
        for shape in [[64usize, 16384], [1024, 1024], [4096, 256], [4, 70000]] {
            let xs = x
                .narrow(0, 0, shape[0] * shape[1])
                .unwrap()
                .reshape(shape)
                .unwrap();
            let gs = g
                .narrow(0, 0, shape[0] * shape[1])
                .unwrap()
                .reshape(shape)
                .unwrap();
            assert_close(
                &format!("softmax {dtype} {shape:?}"),
                &values(&gs.softmax(1).unwrap()),
                &values(&xs.softmax(1).unwrap()),
                t,
            );
            assert_close(
                &format!("log_softmax0 {dtype} {shape:?}"),
                &values(&gs.log_softmax(0).unwrap()),
                &values(&xs.log_softmax(0).unwrap()),
                t,
            );
        }
        // Vectorised elementwise with a scalar tail, and a strided (transposed) operand.
        let a = x.narrow(0, 0, 1_000_003).unwrap();
        let b = g.narrow(0, 0, 1_000_003).unwrap();
        assert_close(
            &format!("gelu {dtype}"),
            &values(&b.gelu().unwrap()),
            &values(&a.gelu().unwrap()),
            t,
        );
        let mt = m.t().unwrap();
        let gt = gm.t().unwrap();
        assert_close(
            &format!("add^T {dtype}"),
            &values(&gt.add(&gt.exp().unwrap()).unwrap()),
            &values(&mt.add(&mt.exp().unwrap()).unwrap()),
            t,
        );
    }
}
