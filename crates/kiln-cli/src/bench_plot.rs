//! PNG charts for `kiln bench compare --plots DIR`: GEMM TFLOP/s against size, and GB/s
//! against element count for the bandwidth suites, kiln and PyTorch on one chart each.

use crate::plot::register_font;
use kiln_bench::Report;
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

/// (library, series) -> points (x, y).
type Lines = BTreeMap<(String, String), Vec<(f64, f64)>>;

fn collect(reports: &[&Report], pick: impl Fn(&[&str]) -> Option<(String, f64)>) -> Lines {
    let mut lines = Lines::new();
    for r in reports {
        let lib = r.meta["library"].as_str().unwrap_or("?").to_string();
        for rec in &r.records {
            let parts: Vec<&str> = rec.name.split('/').collect();
            if let Some((series, x)) = pick(&parts) {
                lines
                    .entry((lib.clone(), series))
                    .or_default()
                    .push((x, rec.value));
            }
        }
    }
    for pts in lines.values_mut() {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    lines
}

fn chart(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    lines: &Lines,
) -> Result<(), String> {
    if lines.is_empty() {
        return Ok(());
    }
    let text = register_font();
    let root = BitMapBackend::new(path, (1000, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let xs = lines.values().flatten().map(|p| p.0);
    let (x0, x1) = xs
        .clone()
        .fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let y1 = lines.values().flatten().map(|p| p.1).fold(0.0, f64::max) * 1.1;
    let mut b = ChartBuilder::on(&root);
    b.margin(20)
        .x_label_area_size(if text { 40 } else { 8 })
        .y_label_area_size(if text { 70 } else { 8 });
    if text {
        b.caption(title, ("sans-serif", 22));
    }
    let mut c = b
        .build_cartesian_2d((x0 * 0.8..x1 * 1.25).log_scale(), 0.0..y1.max(1e-9))
        .map_err(|e| e.to_string())?;
    let mut mesh = c.configure_mesh();
    if text {
        mesh.x_desc(x_desc).y_desc(y_desc);
    } else {
        mesh.disable_x_axis().disable_y_axis();
    }
    mesh.draw().map_err(|e| e.to_string())?;
    let palette = [
        BLUE,
        RED,
        GREEN,
        MAGENTA,
        CYAN,
        BLACK,
        RGBColor(255, 140, 0),
        RGBColor(128, 0, 128),
    ];
    let series: Vec<&String> = lines
        .keys()
        .map(|(_, s)| s)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    for ((lib, name), pts) in lines {
        let color = palette[series.iter().position(|s| *s == name).unwrap_or(0) % palette.len()];
        // kiln: thick lines and dots; the other library: thin lines and crosses, same colour.
        let style = if lib == "kiln" {
            color.stroke_width(3)
        } else {
            color.stroke_width(1)
        };
        let s = c
            .draw_series(LineSeries::new(pts.clone(), style))
            .map_err(|e| e.to_string())?;
        if text {
            s.label(format!("{lib} {name}"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        }
        let marker = |p: (f64, f64)| -> DynElement<'static, BitMapBackend, (f64, f64)> {
            if lib == "kiln" {
                Circle::new(p, 4, color.filled()).into_dyn()
            } else {
                Cross::new(p, 4, color.stroke_width(2)).into_dyn()
            }
        };
        c.draw_series(pts.iter().map(|&p| marker(p)))
            .map_err(|e| e.to_string())?;
    }
    if text {
        c.configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}

/// Writes `gemm.png` and `bandwidth.png` into `dir`.
pub fn plots(dir: &Path, a: &Report, b: &Report) -> Result<Vec<std::path::PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let reports = [a, b];
    let gemm = collect(&reports, |p| match p {
        ["gemm", dtype, n, "nn"] => Some((dtype.to_string(), n.parse().ok()?)),
        _ => None,
    });
    let bw = collect(&reports, |p| match p {
        [suite, op, "f32", n] if ["elementwise", "activation", "reduce"].contains(suite) => {
            Some((op.to_string(), n.parse().ok()?))
        }
        _ => None,
    });
    let device = a.meta["device_name"].as_str().unwrap_or("?");
    let (g, w) = (dir.join("gemm.png"), dir.join("bandwidth.png"));
    chart(
        &g,
        &format!("GEMM (square, A·B) on {device}"),
        "n",
        "TFLOP/s",
        &gemm,
    )?;
    chart(
        &w,
        &format!("element-wise, activation and reduction bandwidth on {device}"),
        "elements",
        "GB/s",
        &bw,
    )?;
    Ok([g, w].into_iter().filter(|p| p.exists()).collect())
}
