//! Products of a CSR matrix with dense vectors and matrices, and their gradients.

use super::Csr;
use crate::backend::sparse::{CsrProduct, SparseStorage};
use crate::storage::Storage;
use crate::{grad_enabled, Error, Result, Tensor};

impl Csr {
    /// `A·x`: `x` is `[cols]` (the result `[rows]`, SpMV) or `[cols, n]` (the result
    /// `[rows, n]`, SpMM), any layout, same dtype and device as the matrix. Records a
    /// gradient for `x` and for the values when they require one.
    ///
    /// ```
    /// # use kiln::{sparse::Csr, Device, Tensor};
    /// let a = Csr::from_dense(&Tensor::from_vec(vec![0f64, 2., 1., 0.], [2, 2], &Device::Cpu)?)?;
    /// let x = Tensor::from_vec(vec![1f64, 2., 3., 4.], [2, 2], &Device::Cpu)?;
    /// assert_eq!(a.matmul(&x)?.to_vec2::<f64>()?, [[6., 8.], [1., 2.]]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn matmul(&self, x: &Tensor) -> Result<Tensor> {
        self.product(x, false)
    }

    /// `Aᵀ·x` without building `Aᵀ` where the backend has a direct kernel (CUDA); elsewhere
    /// through the cached transpose (see [`Csr::transpose`]). `x` is `[rows]` or
    /// `[rows, n]`. Differentiable like [`Csr::matmul`].
    pub fn t_matmul(&self, x: &Tensor) -> Result<Tensor> {
        self.product(x, true)
    }

    /// `y = alpha·A·x + beta·y` in place (`y` of the product's shape, any non-broadcast
    /// view). When `beta` is 0, `y`'s old values are not read (NaNs in it do not
    /// propagate). Not recorded by autograd: an error if gradients would be needed.
    pub fn matmul_into(&self, alpha: f64, x: &Tensor, beta: f64, y: &Tensor) -> Result<()> {
        const OP: &str = "Csr::matmul_into";
        if grad_enabled() && (self.values.requires_grad() || x.requires_grad()) {
            return Err(Error::Msg(format!(
                "{OP} is not recorded by autograd, but its operands require gradients; use \
                 matmul, or run it inside kiln::no_grad"
            )));
        }
        let x2 = self.operand(OP, x, false)?;
        let [m, n] = [self.rows(), x2.dims()[1]];
        let y2 = if y.rank() == x.rank() && y.dims()[0] == m {
            y.reshape([m, n])
                .or_else(|_| y.contiguous()?.reshape([m, n]))?
        } else {
            return Err(Error::ShapeMismatch {
                op: OP,
                lhs: y.shape().clone(),
                rhs: [m, n][..x.rank()].into(),
            });
        };
        y.check_same(&self.values, OP)?;
        let out = self.raw_product(&x2, false, alpha, Some((beta, &y2)))?;
        y.assign(&out.reshape(y.shape().clone())?)
    }

    /// Checks `x` against the matrix and returns it as a 2-D `[k, n]` view.
    fn operand(&self, op: &'static str, x: &Tensor, transpose: bool) -> Result<Tensor> {
        x.check_same(&self.values, op)?;
        let k = if transpose { self.rows() } else { self.cols() };
        let ok = match x.rank() {
            1 | 2 => x.dims()[0] == k,
            _ => false,
        };
        if !ok {
            let (r, c) = if transpose {
                (self.cols(), self.rows())
            } else {
                (self.rows(), self.cols())
            };
            return Err(Error::MatmulShape {
                lhs: [r, c].into(),
                rhs: x.shape().clone(),
                msg: format!(
                    "{op}: a sparse {r}x{c} matrix multiplies a [{c}] vector or a [{c}, n] matrix"
                ),
            });
        }
        if x.rank() == 1 {
            x.unsqueeze(1)
        } else {
            Ok(x.clone())
        }
    }

    fn product(&self, x: &Tensor, transpose: bool) -> Result<Tensor> {
        let op = if transpose {
            "Csr::t_matmul"
        } else {
            "Csr::matmul"
        };
        let x2 = self.operand(op, x, transpose)?;
        let out = self.raw_product(&x2, transpose, 1.0, None)?;
        let needs = grad_enabled() && (self.values.requires_grad() || x2.requires_grad());
        let out = if needs {
            let (a, xd) = (self.detached(), x2.detach());
            let want_values = self.values.requires_grad();
            let want_x = x2.requires_grad();
            Tensor::custom_op(
                out,
                vec![self.values.clone(), x2],
                Box::new(move |g: &Tensor| {
                    // out = A·X:  dA[k] = g[row k]·X[col k],  dX = Aᵀ·g.
                    // out = Aᵀ·X: dA[k] = X[row k]·g[col k],  dX = A·g.
                    let dv = if want_values {
                        Some(if transpose {
                            a.sampled_dot(&xd, g)?
                        } else {
                            a.sampled_dot(g, &xd)?
                        })
                    } else {
                        None
                    };
                    let dx = if want_x {
                        Some(a.raw_product(g, !transpose, 1.0, None)?)
                    } else {
                        None
                    };
                    Ok(vec![dv, dx])
                }),
            )
        } else {
            out
        };
        if x.rank() == 1 {
            out.squeeze(1)
        } else {
            Ok(out)
        }
    }

    /// The same matrix with values not tracked by autograd.
    fn detached(&self) -> Csr {
        Csr::from_pattern(self.pattern.clone(), self.values.detach())
    }

    /// `alpha·op(A)·x + beta·y` for a checked 2-D `x`, untracked.
    pub(crate) fn raw_product(
        &self,
        x: &Tensor,
        transpose: bool,
        alpha: f64,
        acc: Option<(f64, &Tensor)>,
    ) -> Result<Tensor> {
        let m = if transpose { self.cols() } else { self.rows() };
        let n = x.dims()[1];
        if let Some((_, y)) = acc {
            if y.dims() != [m, n] {
                return Err(Error::ShapeMismatch {
                    op: "Csr::matmul_into",
                    lhs: y.shape().clone(),
                    rhs: [m, n].into(),
                });
            }
        }
        let xs = x.storage();
        let ys = acc.map(|(_, y)| y.storage());
        let acc_ref = match (acc, &ys) {
            (Some((beta, y)), Some(g)) => Some((beta, &**g, y.layout())),
            _ => None,
        };
        let product = CsrProduct { alpha, transpose };
        let out = self.with_ref(|a| Storage::csr_matmul(a, &xs, x.layout(), product, acc_ref))?;
        drop((xs, ys));
        match out {
            Some(s) => Ok(Tensor::from_storage(s, [m, n])),
            None => {
                // No direct transposed kernel: multiply by the cached transpose.
                let (pattern, perm) = self.transpose_pattern()?;
                let values = self.values.detach().index_select(&perm, 0)?;
                Csr::from_pattern(pattern, values).raw_product(x, false, alpha, acc)
            }
        }
    }

    /// `out[k] = lhs[row k]·rhs[col k]` for every stored entry (`lhs` `[rows, n]`, `rhs`
    /// `[cols, n]`): the values' gradient.
    fn sampled_dot(&self, lhs: &Tensor, rhs: &Tensor) -> Result<Tensor> {
        let (l, r) = (lhs.storage(), rhs.storage());
        let out =
            self.with_ref(|a| Storage::csr_sampled_dot(a, &l, lhs.layout(), &r, rhs.layout()))?;
        Ok(Tensor::from_storage(out, self.nnz()))
    }
}
