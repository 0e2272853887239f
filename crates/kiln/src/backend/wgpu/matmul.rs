//! Batched matrix products of any views: register-tiled kernels reading both operands
//! through their strides (transposed views cost nothing), with f32 accumulation.
//!
//! Each workgroup of 16×16 invocations computes a block of the output, staging `BK = 8`
//! columns of A and rows of B in workgroup memory per step, each invocation keeping its
//! sums in registers:
//! - large products: 8×8 sums an invocation, 128×128 blocks ([`tiled_source`]);
//! - medium ones: 4×4 sums, 64×64 blocks (the same kernel);
//! - small ones: 2×2 sums, 32×32 blocks ([`small_source`]), which keep more of the GPU
//!   busy when there are few blocks.
//!
//! `KILN_WGPU_MATMUL=large|medium|small` forces one kernel (tests, measurements).

use super::codegen::{self, binding, class, collapse, prelude, Access, Class, Params, ENTRY};
use super::WgpuStorage;
use crate::layout::Layout;
use crate::{Error, Result};

/// Blocks of the 128×128 kernel needed before it is preferred, and of the 64×64 one before
/// it is preferred to the 32×32 one. Measured with each kernel forced (f32, H200 through
/// Vulkan, TFLOP/s 128² / 64² / 32² blocks): 2048² (256 large blocks) 22.6 / 20.1 / 8.9;
/// 1024² (64 large, 256 medium blocks) 9.1 / 13.6 / 6.8; 512² (64 medium blocks) 2.0 /
/// 3.3 / 3.6; 16384×1024·1024×128 (128 large blocks) 14.1 / 16.0 / 8.1.
const LARGE_BLOCKS: usize = 256;
const MEDIUM_BLOCKS: usize = 128;

impl WgpuStorage {
    pub(super) fn matmul_impl(
        &self,
        l: &Layout,
        rhs: &WgpuStorage,
        rl: &Layout,
    ) -> Result<WgpuStorage> {
        let dev = self.device_arc();
        if class(dev, self.dtype, "matmul")? != Class::Float {
            return Err(Error::UnsupportedDType {
                op: "matmul",
                dtype: self.dtype,
            });
        }
        let r = l.rank();
        let (m, k, n) = (l.dims()[r - 2], l.dims()[r - 1], rl.dims()[r - 1]);
        let batch_dims = &l.dims()[..r - 2];
        let batch: usize = batch_dims.iter().product();
        let out = WgpuStorage::alloc(dev, self.dtype, batch * m * n)?;
        if batch * m * n == 0 {
            return Ok(out);
        }
        if k == 0 {
            return out.copy_impl_fill_zero();
        }
        let (bd, bs) = collapse(batch_dims, &[&l.strides()[..r - 2], &rl.strides()[..r - 2]]);
        let mut p = Params::new(m, &bd)?;
        p.operand(l.offset(), &bs[0])?
            .operand(rl.offset(), &bs[1])?;
        p.scalar_u32(0, codegen::word(n)?)
            .scalar_u32(1, codegen::word(k)?)
            .scalar_u32(2, codegen::word(batch)?);
        for s in [
            l.strides()[r - 2],
            l.strides()[r - 1],
            rl.strides()[r - 2],
            rl.strides()[r - 1],
        ] {
            p.push(codegen::word(s)?);
        }
        // The largest blocks that still leave enough of them to fill the GPU.
        let blocks = |edge: usize| m.div_ceil(edge) * n.div_ceil(edge) * batch;
        let t = match kernel_choice() {
            Some(t) => t,
            None if blocks(128) >= LARGE_BLOCKS => 8,
            None if blocks(64) >= MEDIUM_BLOCKS => 4,
            None => 2,
        };
        let block = 16 * t;
        let max = dev.limits.max_compute_workgroups_per_dimension as usize;
        let grid = [n.div_ceil(block), m.div_ceil(block), batch];
        if grid.iter().any(|&g| g > max) {
            return Err(dev.error(format!(
                "matmul: a product of {batch} × [{m}, {k}] · [{k}, {n}] needs {grid:?} \
                 workgroups, more than {max} along one dimension"
            )));
        }
        let key = format!("matmul:{:?}:{:?}:{t}", self.dtype, rhs.dtype);
        let pipeline = if t == 2 {
            dev.pipeline(&key, || small_source(self.dtype))?
        } else {
            dev.pipeline(&key, || tiled_source(self.dtype, t))?
        };
        dev.dispatch(
            pipeline,
            p.bytes(),
            vec![self.buf.clone(), rhs.buf.clone(), out.buf.clone()],
            [grid[0] as u32, grid[1] as u32, grid[2] as u32],
        )?;
        Ok(out)
    }

    /// Zeros into `self` (a product with `k = 0`).
    fn copy_impl_fill_zero(self) -> Result<WgpuStorage> {
        WgpuStorage::fill(&self.buf.device, 0.0, self.len, self.dtype)
    }
}

/// The operands' parameters and the invocation's place, shared by both kernels: `p[0..4]`
/// m, batch rank, n, k; the batch offsets of A and B; A's and B's matrix strides.
const HEADER: &str = r#" {
  let m = p[0];
  let n = p[2];
  let k = p[3];
  let br = p[1];
  let bz = wid.z;
  let a_base = strided(bz, br, HEAD, operand_at(0u));
  let b_base = strided(bz, br, HEAD, operand_at(1u));
  let ex = HEAD + br + 2u * (br + 1u);
  let sam = p[ex];
  let sak = p[ex + 1u];
  let sbk = p[ex + 2u];
  let sbn = p[ex + 3u];
  let row0 = wid.y * BM;
  let col0 = wid.x * BN;
"#;

/// A's and B's bindings, the block size and the entry point's opening.
fn opening(dtype: crate::DType, block: usize, stage: &str) -> String {
    let mut src = prelude(&[dtype]);
    src += &binding("a", 1, dtype, Access::Read);
    src += &binding("b", 2, dtype, Access::Read);
    src += &binding("out", 3, dtype, Access::ReadWrite);
    src += &format!("const BM: u32 = {block}u;\nconst BN: u32 = {block}u;\nconst BK: u32 = 8u;\n");
    src += stage;
    src += ENTRY;
    src += HEADER;
    src
}

/// Loads of step `k0`'s A and B tiles (`per` elements each an invocation, zero outside the
/// matrices) into `va{q}`/`vb{q}` and their stores into the workgroup arrays by `store`
/// (given the flat index and the value): k-major, so the arithmetic reads rows of both.
/// Consecutive invocations read consecutive addresses of whichever dimension is contiguous.
fn stage_tiles(per: usize, store: impl Fn(&str, &str, &str) -> String) -> String {
    let mut src = String::new();
    for q in 0..per {
        src += &format!(
            r#"    {{
      let idx = lid + {o}u;
      var mm = idx / BK; var kk = idx % BK;
      if (sak != 1u) {{ mm = idx % BM; kk = idx / BM; }}
      let gr = row0 + mm; let gk = k0 + kk;
      var v = 0.0;
      if (gr < m && gk < k) {{ v = load_a(a_base + gr * sam + gk * sak); }}
      {sa}
      var nn = idx % BN; var kb = idx / BN;
      if (sbn != 1u) {{ kb = idx % BK; nn = idx / BK; }}
      let gc = col0 + nn; let gkb = k0 + kb;
      var w = 0.0;
      if (gc < n && gkb < k) {{ w = load_b(b_base + gkb * sbk + gc * sbn); }}
      {sb}
    }}
"#,
            o = q * 256,
            sa = store("As", "kk * BM + mm", "v"),
            sb = store("Bs", "kb * BN + nn", "w"),
        );
    }
    src
}

/// The stores of the output block: `row(i)`/`col(j)` give sum (i, j)'s place in the block.
fn store_block(t: usize, row: impl Fn(usize) -> String, col: impl Fn(usize) -> String) -> String {
    let mut src = String::new();
    for i in 0..t {
        src += &format!("  let r{i} = row0 + {};\n  if (r{i} < m) {{\n", row(i));
        for j in 0..t {
            src += &format!(
                "    {{ let c = col0 + {}; if (c < n) {{ store_out((bz * m + r{i}) * n + c, c{i}_{j}); }} }}\n",
                col(j)
            );
        }
        src += "  }\n";
    }
    src
}

fn sums(t: usize) -> String {
    let mut src = String::new();
    for i in 0..t {
        for j in 0..t {
            src += &format!("  var c{i}_{j} = 0.0;\n");
        }
    }
    src
}

/// 2×2 sums an invocation, its rows and columns 16 apart (conflict-free reads of workgroup
/// memory, coalesced stores), 32×32 blocks.
fn small_source(dtype: crate::DType) -> String {
    let stage = "var<workgroup> As: array<f32, 8 * BM>;\nvar<workgroup> Bs: array<f32, 8 * BN>;\n";
    let mut src = opening(dtype, 32, stage);
    src += "  let tx = lid % 16u;\n  let ty = lid / 16u;\n";
    src += &sums(2);
    src += "  for (var k0 = 0u; k0 < k; k0 += BK) {\n";
    // 32·8 elements of each tile: one each.
    src += &stage_tiles(1, |arr, at, v| format!("{arr}[{at}] = {v};"));
    src += "    workgroupBarrier();\n";
    for kk in 0..8 {
        src += &format!(
            "    {{\n    let a0 = As[{o}u + ty];\n    let a1 = As[{o}u + ty + 16u];\n\
             \x20   let b0 = Bs[{o}u + tx];\n    let b1 = Bs[{o}u + tx + 16u];\n",
            o = kk * 32
        );
        for i in 0..2 {
            for j in 0..2 {
                src += &format!("    c{i}_{j} = fma(a{i}, b{j}, c{i}_{j});\n");
            }
        }
        src += "    }\n";
    }
    src += "    workgroupBarrier();\n  }\n";
    src += &store_block(
        2,
        |i| format!("ty + {}u", 16 * i),
        |j| format!("tx + {}u", 16 * j),
    );
    src += "}\n";
    src
}

/// `t × t` sums an invocation (t = 4 or 8), `16·t`-square blocks. The 16×16 invocations
/// form warps of 8×4: (tx, ty) owns rows `4·ty + {0..3}` (and, for t = 8, `64 + 4·ty +
/// {0..3}`), and the same columns of tx, so each 16-byte read of workgroup memory fetches
/// one contiguous run per warp (128 bytes of B, 64 of A). With the rows and columns of an
/// invocation adjacent instead (a warp of 16×2), B's reads were 2-way bank conflicts and the
/// 8×8 kernel ran at 14.6 TFLOP/s against 27.1 (f32 4096², H200 through Vulkan,
/// 2026-11-26). Staging 16 columns a step (24.2) or issuing the next step's global reads
/// before the arithmetic (23.5) measured slower.
fn tiled_source(dtype: crate::DType, t: usize) -> String {
    let stage =
        "var<workgroup> As: array<vec4<f32>, 2 * BM>;\nvar<workgroup> Bs: array<vec4<f32>, 2 * BN>;\n";
    let mut src = opening(dtype, 16 * t, stage);
    src += "  let warp = lid / 32u;\n  let tx = lid % 8u + 8u * (warp % 2u);\n  let ty = (lid / 8u) % 4u + 4u * (warp / 2u);\n";
    src += &sums(t);
    src += "  for (var k0 = 0u; k0 < k; k0 += BK) {\n";
    // 16·t·8 elements of each tile: t/2 each.
    src += &stage_tiles(t / 2, |arr, at, v| {
        format!("{{ let i = {at}; {arr}[i / 4u][i % 4u] = {v}; }}")
    });
    src += "    workgroupBarrier();\n";
    let comp = ["x", "y", "z", "w"];
    let row_vec4s = 4 * t; // vec4s per staged k-row
    for kk in 0..8 {
        src += "    {\n";
        for h in 0..t / 4 {
            let o = kk * row_vec4s + 16 * h;
            src += &format!("    let a{h} = As[{o}u + ty];\n    let b{h} = Bs[{o}u + tx];\n");
        }
        for i in 0..t {
            for j in 0..t {
                let (a, b) = (
                    format!("a{}.{}", i / 4, comp[i % 4]),
                    format!("b{}.{}", j / 4, comp[j % 4]),
                );
                src += &format!("    c{i}_{j} = fma({a}, {b}, c{i}_{j});\n");
            }
        }
        src += "    }\n";
    }
    src += "    workgroupBarrier();\n  }\n";
    let at = |i: usize, t: &str| format!("{}u + {t} * 4u + {}u", 64 * (i / 4), i % 4);
    src += &store_block(t, |i| at(i, "ty"), |j| at(j, "tx"));
    src += "}\n";
    src
}

/// `KILN_WGPU_MATMUL=large|medium|small`: the kernel (sums an invocation) every product uses.
fn kernel_choice() -> Option<usize> {
    static CHOICE: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *CHOICE.get_or_init(|| match std::env::var("KILN_WGPU_MATMUL").as_deref() {
        Ok("large") => Some(8),
        Ok("medium") => Some(4),
        Ok("small") => Some(2),
        _ => None,
    })
}
