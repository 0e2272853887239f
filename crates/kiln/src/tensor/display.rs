//! A readable `Display`, in PyTorch's style, summarised past 1000 elements.

use super::Tensor;

const SUMMARY_THRESHOLD: usize = 1000;
const EDGE_ITEMS: usize = 3;

impl std::fmt::Display for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let values = match self.to_f64_vec() {
            Ok(v) => v,
            Err(e) => {
                return write!(
                    f,
                    "<tensor {} {} on {}: {e}>",
                    self.shape(),
                    self.dtype(),
                    self.device()
                )
            }
        };
        let summarise = values.len() > SUMMARY_THRESHOLD;
        let fmt_one = |v: f64| -> String {
            if self.dtype().is_float() {
                format!("{v:.4}")
            } else {
                format!("{v}")
            }
        };
        let width = values.iter().map(|&v| fmt_one(v).len()).max().unwrap_or(1);
        let mut out = String::from("tensor(");
        let strides = self.shape().contiguous_strides();
        write_dim(
            &mut out,
            &values,
            self.dims(),
            strides.as_slice(),
            0,
            0,
            summarise,
            width,
            &fmt_one,
        );
        write!(
            f,
            "{out}, shape={}, dtype={}, device={})",
            self.shape(),
            self.dtype(),
            self.device()
        )
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor({:?}, {:?}, {})",
            self.layout(),
            self.dtype(),
            self.device()
        )
    }
}

#[allow(clippy::too_many_arguments)]
fn write_dim(
    out: &mut String,
    values: &[f64],
    dims: &[usize],
    strides: &[usize],
    depth: usize,
    base: usize,
    summarise: bool,
    width: usize,
    fmt_one: &dyn Fn(f64) -> String,
) {
    if depth == dims.len() {
        out.push_str(&format!("{:>width$}", fmt_one(values[base])));
        return;
    }
    let n = dims[depth];
    let indent = " ".repeat("tensor(".len() + depth + 1);
    let sep = if depth + 1 == dims.len() {
        ", ".to_string()
    } else {
        format!(",\n{}{indent}", "\n".repeat(dims.len() - depth - 2))
    };
    out.push('[');
    let mut first = true;
    let mut i = 0;
    while i < n {
        if summarise && n > 2 * EDGE_ITEMS && i == EDGE_ITEMS {
            out.push_str(&sep);
            out.push_str("...");
            i = n - EDGE_ITEMS;
            continue;
        }
        if !first {
            out.push_str(&sep);
        }
        first = false;
        write_dim(
            out,
            values,
            dims,
            strides,
            depth + 1,
            base + i * strides[depth],
            summarise,
            width,
            fmt_one,
        );
        i += 1;
    }
    out.push(']');
}
