//! `kiln bench compare --plots` draws both charts from two reports.

use kiln_bench::{run, Options};

#[test]
fn compare_plots_are_written_as_png() {
    let a = run(&Options {
        device: kiln::Device::Cpu,
        quick: true,
        suites: vec!["gemm".into(), "elementwise".into()],
    })
    .unwrap();
    let mut b = a.clone();
    b.meta["library"] = "torch".into();
    for r in &mut b.records {
        r.value *= 0.9;
    }
    let dir = std::env::temp_dir().join(format!("kiln-plots-{}", std::process::id()));
    let files = kiln_cli::bench_plot::plots(&dir, &a, &b).unwrap();
    assert_eq!(files.len(), 2);
    for f in files {
        let bytes = std::fs::read(&f).unwrap();
        assert!(
            bytes.starts_with(b"\x89PNG") && bytes.len() > 10_000,
            "{}",
            f.display()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
