//! `kiln train` on a slice of the real Fashion-MNIST (CI installs the Debian package
//! `dataset-fashion-mnist`; set KILN_DATA to use another copy): the loss falls and accuracy
//! rises far past chance, on every device; checkpoints resume.

use kiln_cli::train::{train, TrainArgs};
use std::path::PathBuf;

fn data_dir() -> PathBuf {
    let dir = std::env::var_os("KILN_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(kiln_nn::data::DEFAULT_DIR));
    assert!(
        dir.is_dir(),
        "{} is missing: install the dataset with `apt-get install dataset-fashion-mnist` or set KILN_DATA",
        dir.display()
    );
    dir
}

fn args(device: &str, out: Option<PathBuf>, epochs: usize) -> TrainArgs {
    TrainArgs {
        model: "mlp".into(),
        hidden: 64,
        epochs,
        batch: 256,
        optimizer: "sgd".into(),
        lr: 0.05,
        momentum: 0.9,
        nesterov: false,
        weight_decay: 0.0,
        schedule: "cosine".into(),
        label_smoothing: 0.0,
        dropout: 0.0,
        device: device.into(),
        seed: 0,
        out,
        data: data_dir(),
        resume: false,
        limit: Some(6400),
        test_limit: Some(2000),
        quiet: true,
        graph: "auto".into(),
        steps_per_graph: 16,
        tf32: false,
        devices: None,
        bucket_mb: 25.0,
    }
}

/// CUDA runs one at a time: a graph capture takes the device's stream, and ops from other
/// threads are refused while it records.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn devices() -> Vec<&'static str> {
    let mut d = vec!["cpu"];
    if kiln::cuda::is_available() {
        d.push("cuda");
    } else if std::env::var("KILN_REQUIRE_CUDA").is_ok_and(|v| v == "1") {
        panic!("KILN_REQUIRE_CUDA=1 but CUDA is unavailable");
    }
    d
}

#[test]
fn a_few_hundred_steps_learn_fashion_mnist() {
    let _s = serial();
    for device in devices() {
        // 25 steps an epoch, 12 epochs: 300 steps.
        let m = train(&args(device, None, 12)).unwrap();
        let (first, last) = (&m[0], m.last().unwrap());
        assert!(
            last.train_loss < 0.6 * first.train_loss,
            "{device}: loss {:.3} -> {:.3}",
            first.train_loss,
            last.train_loss
        );
        assert!(
            last.test_acc > 0.75,
            "{device}: test accuracy {:.3} (chance is 0.1)",
            last.test_acc
        );
        assert!(last.train_acc > first.train_acc, "{device}");
    }
}

/// `--devices` with several devices trains data parallel (one thread per device) and gets
/// what one device gets with the same global batch; with two GPUs, over NCCL.
#[test]
fn data_parallel_runs_train_like_one_device() {
    let _s = serial();
    let mut pairs = vec![("cpu", "cpu,cpu")];
    if kiln::cuda::device_count() >= 2 && kiln::dist::nccl_status().starts_with("NCCL ") {
        pairs.push(("cuda:0", "cuda:0,cuda:1"));
    }
    for (one, several) in pairs {
        let single = train(&args(one, None, 2)).unwrap();
        let mut a = args(one, None, 2);
        a.devices = Some(several.into());
        let parallel = train(&a).unwrap();
        for (p, s) in parallel.iter().zip(&single) {
            assert!(
                (p.train_loss - s.train_loss).abs() < 1e-4 * s.train_loss,
                "{several}: {p:?} vs {one}: {s:?}"
            );
            assert!(
                (p.test_acc - s.test_acc).abs() <= 2e-3,
                "{several}: {p:?} vs {s:?}"
            );
        }
    }
    let mut a = args("cpu", None, 1);
    a.devices = Some("cpu,cpu,cpu".into());
    let err = train(&a).unwrap_err();
    assert!(
        err.contains("--batch 256 does not split evenly over the 3 devices"),
        "{err}"
    );
}

#[test]
fn the_cnn_learns_fashion_mnist_on_every_device() {
    let _s = serial();
    for device in devices() {
        let mut a = args(device, None, 3);
        a.model = "cnn".into();
        a.hidden = 128;
        a.limit = Some(3072); // 12 steps an epoch
        a.test_limit = Some(1000);
        let m = train(&a).unwrap();
        let (first, last) = (&m[0], m.last().unwrap());
        assert!(
            last.train_loss < 0.7 * first.train_loss,
            "{device}: loss {:.3} -> {:.3}",
            first.train_loss,
            last.train_loss
        );
        assert!(
            last.test_acc > 0.6,
            "{device}: test accuracy {:.3} (chance is 0.1)",
            last.test_acc
        );
    }
}

#[test]
fn checkpoints_resume_where_the_run_stopped() {
    let out = std::env::temp_dir().join(format!("kiln-train-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    // A constant rate: a cosine schedule depends on the planned number of epochs.
    let constant = |mut a: TrainArgs| {
        a.schedule = "none".into();
        a
    };
    let full = train(&constant(args("cpu", None, 4))).unwrap();
    let mut a = constant(args("cpu", Some(out.clone()), 2));
    train(&a).unwrap();
    a.epochs = 4;
    a.resume = true;
    let resumed = train(&a).unwrap();
    assert_eq!(
        resumed.len(),
        4,
        "metrics of the first run are carried over"
    );
    for (x, y) in full.iter().zip(&resumed) {
        // Same seed, same batches, same state: the resumed run continues the same curve.
        assert!(
            (x.train_loss - y.train_loss).abs() < 1e-4,
            "epoch {}: {} vs {}",
            x.epoch,
            x.train_loss,
            y.train_loss
        );
        assert!((x.test_acc - y.test_acc).abs() < 2e-3, "epoch {}", x.epoch);
    }
    for f in [
        "metrics.csv",
        "metrics.json",
        "curves.png",
        "epoch-4.safetensors",
    ] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    let png = std::fs::read(out.join("curves.png")).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "a real PNG"
    );
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_missing_dataset_says_how_to_install_it() {
    let mut a = args("cpu", None, 1);
    a.data = PathBuf::from("/nonexistent/fashion");
    let err = train(&a).unwrap_err();
    assert!(
        err.contains("apt-get install dataset-fashion-mnist"),
        "{err}"
    );
}

/// `--graph auto` trains eagerly where there are no graphs (the CPU); `--graph on` there is
/// an error before any training; on CUDA a graph run and an eager run from the same seed give
/// the same per-epoch losses and accuracies (the same kernels in the same order), with the
/// learning rate following the cosine schedule inside the recorded step, dropout drawing its
/// masks inside it, and evaluation replayed too.
#[test]
fn graph_modes_train_alike() {
    let _s = serial();
    let mut a = args("cpu", None, 1);
    a.graph = "on".into();
    let err = train(&a).unwrap_err();
    assert!(err.contains("CUDA") && err.contains("cpu"), "{err}");
    a.graph = "sometimes".into();
    let err = train(&a).unwrap_err();
    assert!(err.contains("auto, on or off"), "{err}");
    a.graph = "auto".into();
    assert_eq!(train(&a).unwrap().len(), 1);
    if !devices().contains(&"cuda") {
        return;
    }
    for optimizer in ["sgd", "adam"] {
        let run = |graph: &str| {
            let mut a = args("cuda", None, 3);
            a.graph = graph.into();
            a.optimizer = optimizer.into();
            a.lr = if optimizer == "adam" { 0.002 } else { 0.05 };
            // Dropout records too (masks drawn on the device, one step per replay): the
            // same masks as the eager run's.
            a.dropout = if optimizer == "sgd" { 0.2 } else { 0.0 };
            train(&a).unwrap()
        };
        let (eager, graph) = (run("off"), run("on"));
        for (e, g) in eager.iter().zip(&graph) {
            assert_eq!(
                (e.train_loss, e.train_acc, e.test_acc),
                (g.train_loss, g.train_acc, g.test_acc),
                "{optimizer} epoch {}: eager vs graph",
                e.epoch
            );
        }
        assert!(eager.last().unwrap().test_acc > 0.7, "{optimizer}");
    }
}

/// Each nonsense argument is refused before any work with its name, value and range; a run
/// whose loss turns non-finite stops with an error (on every device) and writes no
/// checkpoint for the bad epoch.
#[test]
fn nonsense_is_refused_and_divergence_is_an_error() {
    type Edit = fn(&mut TrainArgs);
    let cases: [(Edit, &str); 10] = [
        (|a| a.batch = 0, "--batch 0"),
        (|a| a.steps_per_graph = 0, "--steps-per-graph 0"),
        (|a| a.hidden = 0, "--hidden 0"),
        (|a| a.lr = f64::NAN, "--lr NaN"),
        (|a| a.lr = 0.0, "--lr 0"),
        (|a| a.dropout = 1.5, "--dropout 1.5"),
        (|a| a.momentum = f64::NAN, "--momentum NaN"),
        (|a| a.epochs = 0, "--epochs 0"),
        (|a| a.label_smoothing = 1.0, "--label-smoothing 1"),
        (|a| a.weight_decay = -1.0, "--weight-decay -1"),
    ];
    for (edit, want) in cases {
        let mut a = args("cpu", None, 1);
        a.data = PathBuf::from("/nonexistent"); // refused before the data is read
        edit(&mut a);
        let err = train(&a).expect_err(want);
        assert!(err.contains(want), "{want}: {err}");
    }
    // An output folder that cannot be written is refused before training.
    let file = std::env::temp_dir().join(format!("kiln-not-a-folder-{}", std::process::id()));
    std::fs::write(&file, b"x").unwrap();
    for out in [PathBuf::from("/proc/kiln-out"), file.clone()] {
        let mut a = args("cpu", Some(out.clone()), 1);
        a.data = PathBuf::from("/nonexistent");
        let err = train(&a).expect_err("an unwritable --out");
        assert!(
            err.contains("--out") && err.contains("not a writable folder"),
            "{err}"
        );
    }
    let _ = std::fs::remove_file(&file);
    let _guard = serial();
    for device in devices() {
        let out =
            std::env::temp_dir().join(format!("kiln-diverge-{device}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        let mut a = args(device, Some(out.clone()), 3);
        a.lr = 1e30;
        let err = train(&a).expect_err("a diverging run must fail");
        assert!(
            err.contains("diverged at epoch 1, step "),
            "{device}: {err}"
        );
        assert!(
            !out.join("epoch-1.safetensors").exists(),
            "{device}: bad epoch saved"
        );
        let _ = std::fs::remove_dir_all(&out);
    }
}
