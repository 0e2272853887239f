//! The JSON report (shared with `bench/torch_bench.py`) and the side-by-side comparison.

use serde_json::{json, Value};

/// One measured workload.
#[derive(Clone, Debug)]
pub struct Record {
    pub suite: String,
    /// Unique across suites, e.g. `gemm/f32/4096/nn`.
    pub name: String,
    pub median_ms: f64,
    /// `TFLOP/s`, `GB/s`, `us` or `ns`.
    pub unit: String,
    pub value: f64,
    /// Percent of the peak measured in the same run (copy bandwidth or best GEMM rate).
    pub pct_peak: Option<f64>,
}

impl Record {
    /// Whether a larger value is better (rates) or worse (times).
    pub fn higher_is_better(unit: &str) -> bool {
        !matches!(unit, "us" | "ns" | "ms")
    }
}

/// A whole run: metadata plus records.
#[derive(Clone, Debug)]
pub struct Report {
    pub meta: Value,
    pub records: Vec<Record>,
}

impl Report {
    pub fn to_json(&self) -> Value {
        let mut v = self.meta.clone();
        v["results"] = Value::Array(
            self.records
                .iter()
                .map(|r| {
                    json!({"suite": r.suite, "name": r.name, "median_ms": r.median_ms, "unit": r.unit,
                           "value": r.value, "pct_peak": r.pct_peak})
                })
                .collect(),
        );
        v
    }

    pub fn from_json(v: &Value) -> Result<Report, String> {
        let results = v["results"]
            .as_array()
            .ok_or("report has no \"results\" array")?;
        let mut records = Vec::new();
        for r in results {
            let s = |k: &str| {
                r[k].as_str()
                    .map(str::to_string)
                    .ok_or(format!("result without \"{k}\": {r}"))
            };
            let f = |k: &str| {
                r[k].as_f64()
                    .ok_or(format!("result without numeric \"{k}\": {r}"))
            };
            records.push(Record {
                suite: s("suite")?,
                name: s("name")?,
                median_ms: f("median_ms")?,
                unit: s("unit")?,
                value: f("value")?,
                pct_peak: r["pct_peak"].as_f64(),
            });
        }
        let mut meta = v.clone();
        if let Some(o) = meta.as_object_mut() {
            o.remove("results");
        }
        Ok(Report { meta, records })
    }

    /// Reads a report written by `kiln bench run --json`; see [`Report::parse`].
    pub fn read(path: &std::path::Path) -> Result<Report, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Report::parse(&bytes, &path.display().to_string())
    }

    /// A report from the bytes of its JSON file (`what` names it in errors): anything that
    /// is not UTF-8 JSON with a `results` array of complete records is an error, never a
    /// panic.
    ///
    /// ```
    /// let r = kiln_bench::Report::parse(br#"{"results": []}"#, "empty.json").unwrap();
    /// assert!(r.records.is_empty());
    /// assert!(kiln_bench::Report::parse(b"{", "cut.json").unwrap_err().contains("cut.json"));
    /// ```
    pub fn parse(bytes: &[u8], what: &str) -> Result<Report, String> {
        let v: Value =
            serde_json::from_slice(bytes).map_err(|e| format!("{what}: not JSON: {e}"))?;
        Report::from_json(&v).map_err(|e| format!("{what}: {e}"))
    }

    /// A plain-text table of the records.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{:<40} {:>12} {:>12} {:>9}\n",
            "workload", "median ms", "value", "% peak"
        );
        for r in &self.records {
            let pct = r.pct_peak.map(|p| format!("{p:.1}")).unwrap_or_default();
            out += &format!(
                "{:<40} {:>12.4} {:>8.2} {:<4}{:>8}\n",
                r.name, r.median_ms, r.value, r.unit, pct
            );
        }
        out
    }
}

/// Lines comparing `a` (kiln) with `b` (PyTorch) on the workloads both measured. The ratio is
/// kiln's advantage: value/value for rates, time/time inverted for costs (> 1: kiln ahead).
pub fn compare(a: &Report, b: &Report) -> (String, Vec<(String, f64)>) {
    let name = |r: &Report, d: &str| r.meta["library"].as_str().unwrap_or(d).to_string();
    let (na, nb) = (name(a, "A"), name(b, "B"));
    let mut out = format!(
        "{} on {} vs {} on {}\n{:<40} {:>14} {:>14} {:>8}\n",
        na,
        a.meta["device_name"].as_str().unwrap_or("?"),
        nb,
        b.meta["device_name"].as_str().unwrap_or("?"),
        "workload",
        na,
        nb,
        "ratio"
    );
    let mut ratios = Vec::new();
    for ra in &a.records {
        let Some(rb) = b.records.iter().find(|r| r.name == ra.name) else {
            continue;
        };
        let ratio = if Record::higher_is_better(&ra.unit) {
            ra.value / rb.value
        } else {
            rb.value / ra.value
        };
        out += &format!(
            "{:<40} {:>9.2} {:<4} {:>9.2} {:<4} {:>7.2}x\n",
            ra.name, ra.value, ra.unit, rb.value, rb.unit, ratio
        );
        ratios.push((ra.name.clone(), ratio));
    }
    let only_b: Vec<&Record> = b
        .records
        .iter()
        .filter(|r| !a.records.iter().any(|x| x.name == r.name))
        .collect();
    if !only_b.is_empty() {
        out += &format!("measured by {nb} only:\n");
        for r in only_b {
            out += &format!("{:<40} {:>14} {:>9.2} {:<4}\n", r.name, "", r.value, r.unit);
        }
    }
    (out, ratios)
}

/// One metric that got worse than the baseline by more than the tolerance.
#[derive(Clone, Debug)]
pub struct Regression {
    pub name: String,
    pub unit: String,
    pub baseline: f64,
    pub current: f64,
    /// How much worse, in percent (positive).
    pub worse_pct: f64,
}

/// Every metric of `current` worse than in `baseline` by more than `tolerance_pct` percent
/// (lower rates, or higher times). Metrics missing from either report are skipped.
///
/// ```
/// use kiln_bench::{check, Record, Report};
/// let r = |v: f64| Report { meta: serde_json::json!({}), records: vec![Record {
///     suite: "gemm".into(), name: "gemm/f32/1024/nn".into(), median_ms: 1.0,
///     unit: "TFLOP/s".into(), value: v, pct_peak: None }] };
/// assert!(check(&r(100.0), &r(95.0), 10.0).is_empty());
/// assert_eq!(check(&r(100.0), &r(80.0), 10.0).len(), 1);
/// ```
pub fn check(baseline: &Report, current: &Report, tolerance_pct: f64) -> Vec<Regression> {
    let mut out = Vec::new();
    for c in &current.records {
        let Some(b) = baseline
            .records
            .iter()
            .find(|b| b.name == c.name && b.unit == c.unit)
        else {
            continue;
        };
        if !(b.value > 0.0 && c.value > 0.0) {
            continue;
        }
        let worse_pct = if Record::higher_is_better(&c.unit) {
            100.0 * (b.value - c.value) / b.value
        } else {
            100.0 * (c.value - b.value) / b.value
        };
        if worse_pct > tolerance_pct {
            out.push(Regression {
                name: c.name.clone(),
                unit: c.unit.clone(),
                baseline: b.value,
                current: c.value,
                worse_pct,
            });
        }
    }
    out
}
