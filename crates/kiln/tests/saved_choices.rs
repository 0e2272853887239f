//! The measured choices saved between processes (`KILN_SAVED_CHOICES`, see the CUDA
//! backend's `saved_choices.rs`): a second process reads the GEMM plans the first one timed,
//! times none itself, and computes the same bits. The test runs this executable twice as a
//! child that runs only `child_products` (which does nothing unless `CHILD` is set).
#![cfg(feature = "cuda")]

mod common;
use kiln::{DType, Device, Generator, Tensor};
use std::process::Command;

const CHILD: &str = "KILN_SAVED_CHOICES_TEST_CHILD";

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
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
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
        let products = [
            a.matmul(&bt).unwrap(),
            a.matmul_bias(&bt, &bias).unwrap(),
            a.matmul_bias_act(&bt, &bias, kiln::op::EpilogueActivation::Relu)
                .unwrap(),
        ];
        for c in products {
            for v in c.to_vec::<f32>().unwrap() {
                hash = (hash ^ v.to_bits() as u64).wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
    }
    println!("result bits {hash:016x}");
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
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_products",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .env("KILN_SAVED_CHOICES", &dir)
            .env("KILN_GEMM_LOG", "1")
            .env_remove("KILN_GEMM_AUTOTUNE")
            .env_remove("KILN_GEMM_ENGINE")
            .output()
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
        assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
        // libtest writes "test child_products ... " in front of the child's line.
        let bits = stdout
            .split_once("result bits ")
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .map(str::to_string)
            .unwrap_or_else(|| panic!("no result line:\n{stdout}"));
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
