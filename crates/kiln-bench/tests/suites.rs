//! Every suite runs once at a tiny size on the CPU (so the benchmark code cannot rot), and
//! the report survives a JSON round trip, a comparison and a regression check.

use kiln::Device;
use kiln_bench::{check, compare, run, Options, Report, SUITES};

#[test]
fn every_suite_runs_quickly_on_the_cpu() {
    let report = run(&Options {
        device: Device::Cpu,
        quick: true,
        suites: vec![],
    })
    .unwrap();
    for suite in SUITES.iter().filter(|s| **s != "transfer") {
        assert!(
            report.records.iter().any(|r| r.suite == *suite),
            "suite {suite} produced no record"
        );
    }
    for r in &report.records {
        assert!(
            r.value.is_finite() && r.value > 0.0 && r.median_ms > 0.0,
            "{r:?}"
        );
    }
    let json = report.to_json();
    assert_eq!(json["library"], "kiln");
    let back = Report::from_json(&json).unwrap();
    assert_eq!(back.records.len(), report.records.len());
    let (table, ratios) = compare(&report, &back);
    assert!(table.contains("gemm/f32/256/nn"));
    assert!(ratios.iter().all(|(_, r)| (*r - 1.0).abs() < 1e-12));
    assert!(check(&report, &back, 0.0).is_empty());
    // A 2x slower copy is flagged.
    let mut slower = back.clone();
    for r in &mut slower.records {
        if r.unit == "GB/s" {
            r.value /= 2.0;
        }
    }
    let regressions = check(&report, &slower, 10.0);
    assert!(
        !regressions.is_empty()
            && regressions
                .iter()
                .all(|r| (r.worse_pct - 50.0).abs() < 1e-9)
    );
    assert!(Report::from_json(&serde_json::json!({"results": "nope"})).is_err());
}

/// `kiln bench dist` on two CPU ranks (host-memory exchange): the all-reduce rows and a
/// data-parallel epoch of the MLP and of the CNN give positive, finite figures under the
/// names `bench/torch_ddp.py` writes; the CNN refuses bf16 before any work.
#[test]
fn dist_benchmarks_run_on_two_cpu_ranks() {
    use kiln::DType;
    use kiln_bench::dist::{all_reduce, train, DistModel};
    let devices = [Device::Cpu, Device::Cpu];
    let mut records = all_reduce(&devices, true).unwrap();
    records.push(
        train(
            &devices,
            DistModel::Mlp(&[784, 32, 10]),
            16,
            DType::F32,
            true,
        )
        .unwrap(),
    );
    records.push(train(&devices, DistModel::MnistCnn, 16, DType::F32, true).unwrap());
    for r in &records {
        assert!(
            r.value.is_finite() && r.value > 0.0 && r.world == 2,
            "{r:?}"
        );
    }
    let names: Vec<&str> = records.iter().map(|r| r.name.as_str()).collect();
    assert!(
        names.contains(&"train mlp 784-32-10 f32 x16/device"),
        "{names:?}"
    );
    assert!(
        names.contains(&"train cnn mnist f32 x16/device"),
        "{names:?}"
    );
    let e = train(&devices, DistModel::MnistCnn, 16, DType::BF16, true).unwrap_err();
    assert!(e.to_string().contains("f32 only"), "{e}");
}
