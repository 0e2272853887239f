//! Building CSR matrices from COO triplets and dense tensors, back to dense, and the
//! transpose. These run on the host (index arrays are read back from a GPU once); the
//! products are what runs on the device.

use super::{check_values, host_indices, Csr, Pattern};
use crate::{Device, Error, Result, Tensor};
use std::sync::Arc;

impl Csr {
    /// A `rows × cols` matrix from COO triplets: entry `k` is `values[k]` at
    /// `(row_ids[k], col_ids[k])`. The triplets may come in any order; entries at the same
    /// position are summed (in f64, rounded once). `row_ids`/`col_ids` are 1-D integer
    /// tensors; `values` (float) decides the device and dtype. Not differentiable.
    ///
    /// # Errors
    /// [`Error::InvalidSparse`] for lengths that differ or an index outside the shape,
    /// naming the entry.
    pub fn from_coo(
        rows: usize,
        cols: usize,
        row_ids: &Tensor,
        col_ids: &Tensor,
        values: &Tensor,
    ) -> Result<Csr> {
        const OP: &str = "Csr::from_coo";
        let (ri, ci) = (host_indices(OP, row_ids)?, host_indices(OP, col_ids)?);
        if ri.len() != ci.len() {
            return Err(Error::InvalidSparse {
                op: OP,
                msg: format!(
                    "{} row ids but {} column ids",
                    row_ids.elem_count(),
                    col_ids.elem_count()
                ),
            });
        }
        check_values(OP, values, ri.len())?;
        for (k, (&r, &c)) in ri.iter().zip(&ci).enumerate() {
            if r < 0 || r as u64 >= rows as u64 || c < 0 || c as u64 >= cols as u64 {
                return Err(Error::InvalidSparse {
                    op: OP,
                    msg: format!("entry {k} at ({r}, {c}) is outside the {rows}x{cols} matrix"),
                });
            }
        }
        let vals = values.to_f64_vec()?;
        // Counting sort by row, then each row sorted by column and duplicates merged.
        let mut row_ptr = vec![0i64; rows + 1];
        for &r in &ri {
            row_ptr[r as usize + 1] += 1;
        }
        for r in 0..rows {
            row_ptr[r + 1] += row_ptr[r];
        }
        let mut next: Vec<i64> = row_ptr[..rows].to_vec();
        let mut entries = vec![(0i64, 0f64); ri.len()];
        for ((&r, &c), &v) in ri.iter().zip(&ci).zip(&vals) {
            let slot = &mut next[r as usize];
            entries[*slot as usize] = (c, v);
            *slot += 1;
        }
        let (mut out_ptr, mut out_cols, mut out_vals) = (
            Vec::with_capacity(rows + 1),
            Vec::with_capacity(ri.len()),
            Vec::with_capacity(ri.len()),
        );
        out_ptr.push(0i64);
        for r in 0..rows {
            let row = &mut entries[row_ptr[r] as usize..row_ptr[r + 1] as usize];
            row.sort_unstable_by_key(|e| e.0);
            for &(c, v) in row.iter() {
                if out_cols.last() == Some(&c) && out_cols.len() as i64 > out_ptr[r] {
                    *out_vals.last_mut().unwrap() += v;
                } else {
                    out_cols.push(c);
                    out_vals.push(v);
                }
            }
            out_ptr.push(out_cols.len() as i64);
        }
        let device = values.device();
        let pattern = Pattern::from_host(OP, rows, cols, &out_ptr, &out_cols, None, &device)?;
        let n = out_vals.len();
        // Converted on the host: the device may have no f64.
        let values = Tensor::from_vec(out_vals, n, &crate::Device::Cpu)?
            .to_dtype(values.dtype())?
            .to_device(&device)?;
        Ok(Csr::from_pattern(Arc::new(pattern), values))
    }

    /// The nonzero entries of a 2-D float tensor (any layout) as a CSR matrix of its dtype
    /// on its device. Not differentiable.
    pub fn from_dense(dense: &Tensor) -> Result<Csr> {
        const OP: &str = "Csr::from_dense";
        dense.check_float(OP)?;
        if dense.rank() != 2 {
            return Err(Error::InvalidSparse {
                op: OP,
                msg: format!("expected a 2-D tensor, got shape {}", dense.shape()),
            });
        }
        let [rows, cols] = [dense.dims()[0], dense.dims()[1]];
        let all = dense.to_f64_vec()?;
        let (mut row_ptr, mut col_idx, mut vals) = (vec![0i64], Vec::new(), Vec::new());
        for r in 0..rows {
            for (c, &v) in all[r * cols..(r + 1) * cols].iter().enumerate() {
                if v != 0.0 {
                    col_idx.push(c as i64);
                    vals.push(v);
                }
            }
            row_ptr.push(col_idx.len() as i64);
        }
        let device = dense.device();
        let pattern = Pattern::from_host(OP, rows, cols, &row_ptr, &col_idx, None, &device)?;
        let n = vals.len();
        let values = Tensor::from_vec(vals, n, &crate::Device::Cpu)?
            .to_dtype(dense.dtype())?
            .to_device(&device)?;
        Ok(Csr::from_pattern(Arc::new(pattern), values))
    }

    /// The dense `[rows, cols]` tensor (entries at one position summed), on the matrix's
    /// device and in its dtype. Not differentiable.
    pub fn to_dense(&self) -> Result<Tensor> {
        let (rp, ci) = self.pattern.host_arrays()?;
        let vals = self.values.to_f64_vec()?;
        let cols = self.cols();
        let mut dense = vec![0f64; self.rows() * cols];
        for r in 0..self.rows() {
            for k in rp[r] as usize..rp[r + 1] as usize {
                dense[r * cols + ci[k] as usize] += vals[k];
            }
        }
        Tensor::from_vec(dense, self.dims(), &Device::Cpu)?
            .to_dtype(self.dtype())?
            .to_device(&self.device())
    }

    /// The transpose as a CSR matrix (the CSC form of this one), with rows sorted by
    /// column. The pattern is built once per matrix pattern and cached; the values are
    /// gathered (differentiably) from this matrix's.
    pub fn transpose(&self) -> Result<Csr> {
        let (pattern, perm) = self.transpose_pattern()?;
        Ok(Csr::from_pattern(
            pattern,
            self.values.index_select(&perm, 0)?,
        ))
    }

    /// Aᵀ's pattern and, for each of Aᵀ's entries, the position of its value among A's.
    pub(crate) fn transpose_pattern(&self) -> Result<(Arc<Pattern>, Tensor)> {
        let p = &self.pattern;
        if let Some((t, perm)) = p.transpose.get() {
            return Ok((t.clone(), perm.clone()));
        }
        let (rp, ci) = p.host_arrays()?;
        let (rows, cols) = (p.rows, p.cols);
        let mut t_ptr = vec![0i64; cols + 1];
        for &c in &ci {
            t_ptr[c as usize + 1] += 1;
        }
        for c in 0..cols {
            t_ptr[c + 1] += t_ptr[c];
        }
        let mut next: Vec<i64> = t_ptr[..cols].to_vec();
        let mut t_cols = vec![0i64; ci.len()];
        let mut perm = vec![0i64; ci.len()];
        for r in 0..rows {
            for k in rp[r] as usize..rp[r + 1] as usize {
                let slot = &mut next[ci[k] as usize];
                t_cols[*slot as usize] = r as i64;
                perm[*slot as usize] = k as i64;
                *slot += 1;
            }
        }
        let device = p.device();
        let t = Pattern::from_host(
            "Csr::transpose",
            cols,
            rows,
            &t_ptr,
            &t_cols,
            Some(p.index),
            &device,
        )?;
        let n = perm.len();
        let entry = (Arc::new(t), Tensor::from_vec(perm, n, &device)?);
        let _ = p.transpose.set(entry.clone());
        Ok(entry)
    }
}
