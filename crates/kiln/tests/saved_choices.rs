//! The measured choices saved between processes (`KILN_SAVED_CHOICES`, see the CUDA
//! backend's `saved_choices.rs`): a second process reads the GEMM plans the first one timed,
//! times none itself, and computes the same bits; likewise the cuDNN legacy algorithms a
//! first process found (`KILN_CUDNN_API=legacy`), which a second process takes from cuDNN's
//! heuristics without a search. Each test runs this executable twice as a child that runs
//! only `child_products` or `child_convolutions` (which do nothing unless their variable is
//! set).
#![cfg(feature = "cuda")]

mod common;
use kiln::{DType, Device, Generator, Tensor};
use std::process::Command;

const CHILD: &str = "KILN_SAVED_CHOICES_TEST_CHILD";
const CONV_CHILD: &str = "KILN_SAVED_CHOICES_TEST_CONV_CHILD";

/// The FNV hash of the bits of every f32 in `tensors`.
fn hash_bits(tensors: &[Tensor]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for t in tensors {
        for v in t.to_vec::<f32>().unwrap() {
            hash = (hash ^ v.to_bits() as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    hash
}

/// Runs this executable's test `name` as a child with `envs`; returns its result bits (the
/// child's "result bits" line) and its standard error.
fn run_child(name: &str, envs: &[(&str, &std::ffi::OsStr)]) -> (String, String) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", name, "--nocapture", "--test-threads=1"]);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    // libtest writes "test NAME ... " in front of the child's line.
    let bits = stdout
        .split_once("result bits ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no result line:\n{stdout}"));
    (bits, stderr)
}

/// In a child process: products of the MLP's shapes (plain, transposed operands, with a
/// bias and with bias and ReLU) on random f32 data, and an FNV hash of every result's bits
/// on standard output.
#[test]
fn child_products() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let device = Device::Cuda(0);
    let mut rng = Generator::new(5);
    let mut products = Vec::new();
    let mut randn = |shape: &[usize]| {
        Tensor::randn(shape.to_vec(), 0.0, 1.0, DType::F32, &device, &mut rng).unwrap()
    };
    for (m, k, n) in [
        (256, 784, 128),
        (256, 128, 10),
        (10, 256, 128),
        (128, 256, 784),
    ] {
        let (a, b, bias) = (randn(&[m, k]), randn(&[n, k]), randn(&[n]));
        let bt = b.t().unwrap();
        products.extend([
            a.matmul(&bt).unwrap(),
            a.matmul_bias(&bt, &bias).unwrap(),
            a.matmul_bias_act(&bt, &bias, kiln::op::EpilogueActivation::Relu)
                .unwrap(),
        ]);
    }
    println!("result bits {:016x}", hash_bits(&products));
}

/// In a child process: two exact-f32 convolutions (3×3 and 5×5) and their input and weight
/// gradients on random data, and the hash of their bits on standard output.
#[test]
fn child_convolutions() {
    if std::env::var_os(CONV_CHILD).is_none() {
        return;
    }
    let device = Device::Cuda(0);
    let mut rng = Generator::new(7);
    let mut results = Vec::new();
    for (xs, ws, pad) in [
        ([4, 16, 20, 20], [32, 16, 3, 3], 1),
        ([8, 8, 14, 14], [16, 8, 5, 5], 2),
    ] {
        let x = Tensor::randn(xs.to_vec(), 0.0, 1.0, DType::F32, &device, &mut rng)
            .unwrap()
            .var()
            .unwrap();
        let w = Tensor::randn(ws.to_vec(), 0.0, 0.2, DType::F32, &device, &mut rng)
            .unwrap()
            .var()
            .unwrap();
        let o = kiln::Conv2dOptions::default().padding(pad);
        let y = x.conv2d(&w, None, o).unwrap();
        let r = Tensor::randn(y.dims().to_vec(), 0.0, 1.0, DType::F32, &device, &mut rng).unwrap();
        let grads = common::conv::backward_of_product(&y, &r);
        results.extend([
            y,
            grads.get(&x).unwrap().clone(),
            grads.get(&w).unwrap().clone(),
        ]);
    }
    println!("result bits {:016x}", hash_bits(&results));
}

#[test]
fn a_second_process_runs_the_gemm_plans_the_first_one_timed() {
    if !common::devices().contains(&Device::Cuda(0)) {
        eprintln!("skipped: no CUDA device");
        return;
    }
    let dir = std::env::temp_dir().join(format!("kiln-saved-choices-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let run = || {
        let one = std::ffi::OsStr::new("1");
        let (bits, stderr) = run_child(
            "child_products",
            &[
                (CHILD, one),
                ("KILN_SAVED_CHOICES", dir.as_os_str()),
                ("KILN_GEMM_LOG", one),
                ("KILN_GEMM_AUTOTUNE", std::ffi::OsStr::new("1")),
                ("KILN_GEMM_ENGINE", std::ffi::OsStr::new("measure")),
            ],
        );
        let count = |what: &str| stderr.lines().filter(|l| l.contains(what)).count();
        (bits, count("timed:"), count("saved choice:"), stderr)
    };
    let (bits1, timed1, saved1, log1) = run();
    assert!(
        timed1 >= 4,
        "the first process timed {timed1} plans:\n{log1}"
    );
    assert_eq!(
        saved1, 0,
        "nothing was saved before the first process:\n{log1}"
    );
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert_eq!(files.len(), 1, "one file of GEMM plans in {dir:?}");
    let (bits2, timed2, saved2, log2) = run();
    assert_eq!(
        (timed2, saved2),
        (0, timed1),
        "the second process should take every plan from the saved choices:\n{log2}"
    );
    assert_eq!(bits1, bits2, "the two processes computed different bits");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_second_process_takes_the_legacy_cudnn_algorithms_the_first_one_found() {
    if !common::devices().contains(&Device::Cuda(0)) {
        eprintln!("skipped: no CUDA device");
        return;
    }
    if !kiln::cuda::convolution_path().starts_with("cuDNN") {
        if std::env::var("KILN_REQUIRE_CUDNN").is_ok_and(|v| v == "1") {
            panic!("KILN_REQUIRE_CUDNN=1 but cuDNN is not in use");
        }
        eprintln!("skipped: cuDNN not loaded");
        return;
    }
    let dir = std::env::temp_dir().join(format!("kiln-saved-cudnn-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let os = std::ffi::OsStr::new;
    let run = || {
        let (bits, stderr) = run_child(
            "child_convolutions",
            &[
                (CONV_CHILD, os("1")),
                ("KILN_SAVED_CHOICES", dir.as_os_str()),
                ("KILN_CUDNN_LOG", os("1")),
                ("KILN_CUDNN_API", os("legacy")),
                // cuDNN for every direction: kiln's own kernels never run.
                ("KILN_CONV_MMA", os("0")),
                ("KILN_CONV_DIRECT", os("0")),
                ("KILN_CONV_FEW", os("0")),
                // Algorithms that add with atomics give other bits on every run, whatever
                // was chosen: the comparison needs deterministic ones.
                ("KILN_CUDNN_DETERMINISTIC", os("1")),
            ],
        );
        let count = |what: &str| stderr.lines().filter(|l| l.contains(what)).count();
        // A search logs each algorithm it keeps with its time; a saved choice logs where
        // it came from.
        let searched = count(" ms, workspace ");
        (bits, searched, count("from the heuristics"), stderr)
    };
    let (bits1, searched1, heuristic1, log1) = run();
    assert!(
        searched1 >= 6,
        "the first process searched {searched1} problems (two convolutions, three directions):\n{log1}"
    );
    assert_eq!(
        heuristic1, 0,
        "nothing was saved before the first process:\n{log1}"
    );
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.len() == 1 && names[0].starts_with("cudnn-legacy-"),
        "one file of legacy choices in {dir:?}: {names:?}"
    );
    let (bits2, searched2, heuristic2, log2) = run();
    assert_eq!(
        (searched2, heuristic2),
        (0, searched1),
        "the second process should take every algorithm from the saved choices:\n{log2}"
    );
    assert_eq!(bits1, bits2, "the two processes computed different bits");
    let _ = std::fs::remove_dir_all(&dir);
}
