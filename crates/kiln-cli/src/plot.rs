//! The PNG of a run's curves: loss on the left, train and test accuracy on the right.

use plotters::prelude::*;
use std::path::Path;

/// A named, coloured line of (epoch, value) points.
type Series<'a> = (&'a str, RGBColor, Vec<(f64, f64)>);

/// One epoch's figures.
#[derive(Clone, Debug)]
pub struct EpochMetrics {
    pub epoch: usize,
    pub seconds: f64,
    pub train_loss: f64,
    pub train_acc: f64,
    pub test_acc: f64,
    pub lr: f64,
}

/// Registers a TrueType font for the chart text, from `KILN_FONT` or the usual system
/// folders (plotters draws no text without one). Returns whether one was found.
pub(crate) fn register_font() -> bool {
    static FOUND: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FOUND.get_or_init(|| {
        let candidates = [
            std::env::var("KILN_FONT").unwrap_or_default(),
            "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf".into(),
            "/usr/share/fonts/TTF/DejaVuSans.ttf".into(),
            "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf".into(),
        ];
        for c in candidates.iter().filter(|c| !c.is_empty()) {
            if let Ok(bytes) = std::fs::read(c) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return true;
                }
            }
        }
        false
    })
}

pub fn plot(path: &Path, title: &str, m: &[EpochMetrics]) -> Result<(), String> {
    let text = register_font();
    let root = BitMapBackend::new(path, (1200, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let root = if text {
        root.titled(title, ("sans-serif", 22))
            .map_err(|e| e.to_string())?
    } else {
        root
    };
    let (left, right) = root.split_horizontally(600);
    let epochs = m.iter().map(|e| e.epoch as f64).fold(1.0, f64::max);
    let max_loss = m.iter().map(|e| e.train_loss).fold(0.0, f64::max) * 1.1 + 1e-9;
    let acc_lo = m
        .iter()
        .flat_map(|e| [e.train_acc, e.test_acc])
        .fold(1.0, f64::min)
        .min(0.9)
        - 0.02;
    let draw = |area: &DrawingArea<BitMapBackend, plotters::coord::Shift>,
                caption: &str,
                y: std::ops::Range<f64>,
                series: &[Series]|
     -> Result<(), String> {
        let mut b = ChartBuilder::on(area);
        b.margin(16)
            .x_label_area_size(if text { 36 } else { 8 })
            .y_label_area_size(if text { 56 } else { 8 });
        if text {
            b.caption(caption, ("sans-serif", 18));
        }
        let mut chart = b
            .build_cartesian_2d(0.0..epochs, y)
            .map_err(|e| e.to_string())?;
        let mut mesh = chart.configure_mesh();
        if text {
            mesh.x_desc("epoch");
        } else {
            mesh.disable_x_axis().disable_y_axis();
        }
        mesh.draw().map_err(|e| e.to_string())?;
        for (name, color, pts) in series {
            let s = chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                .map_err(|e| e.to_string())?;
            if text {
                s.label(*name).legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            }
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(|e| e.to_string())?;
        }
        if text {
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    };
    let pts =
        |f: fn(&EpochMetrics) -> f64| m.iter().map(|e| (e.epoch as f64, f(e))).collect::<Vec<_>>();
    draw(
        &left,
        "training loss",
        0.0..max_loss,
        &[("train loss", RED, pts(|e| e.train_loss))],
    )?;
    draw(
        &right,
        "accuracy",
        acc_lo.max(0.0)..1.0,
        &[
            ("train", BLUE, pts(|e| e.train_acc)),
            ("test", GREEN, pts(|e| e.test_acc)),
        ],
    )?;
    root.present().map_err(|e| e.to_string())
}
