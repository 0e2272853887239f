//! Batched matrix products of any views: a register-tiled kernel reading both operands
//! through their strides (transposed views cost nothing), with f32 accumulation.
//!
//! Each workgroup of 16×16 invocations computes a `16·t × 16·t` block of the output,
//! staging `BK = 8` columns of A and rows of B in workgroup memory per step; each
//! invocation keeps a `t × t` block of sums in registers, its rows and columns strided
//! by 16 so that reads of workgroup memory and stores of the output are conflict-free and
//! coalesced. Large products use 8×8 per invocation (128×128 blocks); small ones 2×2
//! (32×32 blocks), which keep more of the GPU busy when there are few blocks.

use super::codegen::{self, binding, class, collapse, prelude, Access, Class, Params, ENTRY};
use super::WgpuStorage;
use crate::layout::Layout;
use crate::{Error, Result};

/// Blocks of the large variant needed before it is preferred.
const LARGE_BLOCKS: usize = 264;

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
        let large_blocks = m.div_ceil(128) * n.div_ceil(128) * batch;
        let t = if large_blocks >= LARGE_BLOCKS || variant().always_large {
            8
        } else {
            2
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
        let v = variant();
        let key = format!("matmul:{:?}:{:?}:{t}:{v:?}", self.dtype, rhs.dtype);
        let pipeline = if t == 8 && v.warp_tiles {
            dev.pipeline(&key, || large_source(self.dtype, v))?
        } else {
            dev.pipeline(&key, || matmul_source(self.dtype, t))?
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

/// The kernel for `t × t` sums per invocation, fully unrolled: the sums, the A column and
/// the B row of each step are scalars (a local array indexed in a loop would live in slow
/// local memory on some drivers).
fn matmul_source(dtype: crate::DType, t: usize) -> String {
    let mut src = prelude(&[dtype]);
    src += &binding("a", 1, dtype, Access::Read);
    src += &binding("b", 2, dtype, Access::Read);
    src += &binding("out", 3, dtype, Access::ReadWrite);
    src += &format!(
        "const BM: u32 = {b}u;\nconst BN: u32 = {b}u;\nconst BK: u32 = 8u;\n",
        b = 16 * t
    );
    // With 8×8 sums per invocation, its 8 rows (columns) are adjacent and read as two vec4.
    let wide = t == 8;
    if wide {
        src += "var<workgroup> As: array<vec4<f32>, 2 * BM>;\nvar<workgroup> Bs: array<vec4<f32>, 2 * BN>;\n";
    } else {
        src += "var<workgroup> As: array<f32, 8 * BM>;\nvar<workgroup> Bs: array<f32, 8 * BN>;\n";
    }
    src += ENTRY;
    src += r#" {
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
  let tx = lid % 16u;
  let ty = lid / 16u;
"#;
    for i in 0..t {
        for j in 0..t {
            src += &format!("  var c{i}_{j} = 0.0;\n");
        }
    }
    src += r#"  for (var k0 = 0u; k0 < k; k0 += BK) {
    for (var q = 0u; q < BM * BK / 256u; q++) {
      let idx = lid + q * 256u;
      var mm = idx / BK;
      var kk = idx % BK;
      if (sak != 1u) { mm = idx % BM; kk = idx / BM; }
      let gr = row0 + mm;
      let gk = k0 + kk;
      var v = 0.0;
      if (gr < m && gk < k) { v = load_a(a_base + gr * sam + gk * sak); }
      STORE_A
    }
    for (var q = 0u; q < BN * BK / 256u; q++) {
      let idx = lid + q * 256u;
      var nn = idx % BN;
      var kk = idx / BN;
      if (sbn != 1u) { kk = idx % BK; nn = idx / BK; }
      let gc = col0 + nn;
      let gk = k0 + kk;
      var v = 0.0;
      if (gc < n && gk < k) { v = load_b(b_base + gk * sbk + gc * sbn); }
      STORE_B
    }
    workgroupBarrier();
"#;
    let (store_a, store_b) = if wide {
        (
            "As[(kk * BM + mm) / 4u][mm % 4u] = v;",
            "Bs[(kk * BN + nn) / 4u][nn % 4u] = v;",
        )
    } else {
        ("As[kk * BM + mm] = v;", "Bs[kk * BN + nn] = v;")
    };
    src = src.replace("STORE_A", store_a).replace("STORE_B", store_b);
    let comp = ["x", "y", "z", "w"];
    for kk in 0..8 {
        if wide {
            for h in 0..2 {
                src += &format!("    let av{h} = As[({kk}u * BM + ty * 8u) / 4u + {h}u];\n");
                src += &format!("    let bv{h} = Bs[({kk}u * BN + tx * 8u) / 4u + {h}u];\n");
            }
            for i in 0..8 {
                src += &format!("    let a{i} = av{}.{};\n", i / 4, comp[i % 4]);
                src += &format!("    let b{i} = bv{}.{};\n", i / 4, comp[i % 4]);
            }
        } else {
            for i in 0..t {
                src += &format!("    let a{i} = As[{kk}u * BM + ty + {}u];\n", 16 * i);
            }
            for j in 0..t {
                src += &format!("    let b{j} = Bs[{kk}u * BN + tx + {}u];\n", 16 * j);
            }
        }
        for i in 0..t {
            for j in 0..t {
                src += &format!("    c{i}_{j} = fma(a{i}, b{j}, c{i}_{j});\n");
            }
        }
        if kk < 7 {
            // A new scope per step lets the names repeat.
            src += "    {\n";
        }
    }
    for _ in 0..7 {
        src += "    }\n";
    }
    src += "    workgroupBarrier();\n  }\n";
    // Rows and columns of invocation (ty, tx): strided by 16, or adjacent when wide.
    let row = |i: usize| {
        if wide {
            format!("ty * 8u + {i}u")
        } else {
            format!("ty + {}u", 16 * i)
        }
    };
    let col = |j: usize| {
        if wide {
            format!("tx * 8u + {j}u")
        } else {
            format!("tx + {}u", 16 * j)
        }
    };
    for i in 0..t {
        src += &format!("  let r{i} = row0 + {};\n", row(i));
        src += &format!("  if (r{i} < m) {{\n");
        for j in 0..t {
            src += &format!(
                "    if (col0 + {c} < n) {{ store_out((bz * m + r{i}) * n + col0 + {c}, c{i}_{j}); }}\n",
                c = col(j)
            );
        }
        src += "  }\n";
    }
    src += "}\n";
    src
}

/// How the 128×128 kernel is built (`KILN_WGPU_MM=tiles,bk16,prefetch`; an experiment's knob
/// while the variants are measured).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Variant {
    /// Warps of 8×4 invocations whose rows and columns are 4 apart: the 16-byte reads of
    /// workgroup memory then fetch one contiguous 128-byte (B) or 64-byte (A) run per warp.
    warp_tiles: bool,
    /// Columns of A (rows of B) staged per step.
    bk: usize,
    /// The next step's global reads are issued before this step's arithmetic.
    prefetch: bool,
    /// The 128×128 kernel for every product (tests).
    always_large: bool,
}

fn variant() -> Variant {
    static V: std::sync::OnceLock<Variant> = std::sync::OnceLock::new();
    *V.get_or_init(|| {
        let s = std::env::var("KILN_WGPU_MM").unwrap_or_default();
        let has = |w: &str| s.split(',').any(|p| p == w);
        Variant {
            warp_tiles: has("tiles"),
            bk: if has("bk16") { 16 } else { 8 },
            prefetch: has("prefetch"),
            always_large: has("large"),
        }
    })
}

/// The 128×128 kernel with warp tiles (see [`Variant`]): invocation (tx, ty) of a 16×16
/// grid owns rows `4·ty + {0..3}` and `64 + 4·ty + {0..3}`, and the same columns of `tx`.
fn large_source(dtype: crate::DType, v: Variant) -> String {
    let bk = v.bk;
    let mut src = prelude(&[dtype]);
    src += &binding("a", 1, dtype, Access::Read);
    src += &binding("b", 2, dtype, Access::Read);
    src += &binding("out", 3, dtype, Access::ReadWrite);
    src += &format!(
        "const BM: u32 = 128u;\nconst BN: u32 = 128u;\nconst BK: u32 = {bk}u;\n\
         var<workgroup> As: array<vec4<f32>, {n}>;\nvar<workgroup> Bs: array<vec4<f32>, {n}>;\n",
        n = bk * 32
    );
    src += ENTRY;
    src += r#" {
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
  let warp = lid / 32u;
  let tx = lid % 8u + 8u * (warp % 2u);
  let ty = (lid / 8u) % 4u + 4u * (warp / 2u);
"#;
    let per = bk / 2; // elements of each operand an invocation stages per step
    for i in 0..8 {
        for j in 0..8 {
            src += &format!("  var c{i}_{j} = 0.0;\n");
        }
    }
    // Where staged element q of this invocation comes from and goes to.
    for q in 0..per {
        src += &format!(
            "  let i{q} = lid + {o}u;\n\
             \x20 var am{q} = i{q} / BK; var ak{q} = i{q} % BK;\n\
             \x20 if (sak != 1u) {{ am{q} = i{q} % BM; ak{q} = i{q} / BM; }}\n\
             \x20 var bn{q} = i{q} % BN; var bk{q} = i{q} / BN;\n\
             \x20 if (sbn != 1u) {{ bk{q} = i{q} % BK; bn{q} = i{q} / BK; }}\n",
            o = q * 256
        );
    }
    for q in 0..per {
        src += &format!("  var ra{q} = 0.0;\n  var rb{q} = 0.0;\n");
    }
    let fetch = |k0: &str| {
        let mut f = String::new();
        for q in 0..per {
            f += &format!(
                "    {{ let gr = row0 + am{q}; let gk = {k0} + ak{q}; ra{q} = 0.0; \
                 if (gr < m && gk < k) {{ ra{q} = load_a(a_base + gr * sam + gk * sak); }} }}\n\
                 \x20   {{ let gc = col0 + bn{q}; let gk = {k0} + bk{q}; rb{q} = 0.0; \
                 if (gc < n && gk < k) {{ rb{q} = load_b(b_base + gk * sbk + gc * sbn); }} }}\n"
            );
        }
        f
    };
    let mut stage = String::new();
    for q in 0..per {
        stage += &format!(
            "    {{ let i = ak{q} * BM + am{q}; As[i / 4u][i % 4u] = ra{q}; }}\n\
             \x20   {{ let i = bk{q} * BN + bn{q}; Bs[i / 4u][i % 4u] = rb{q}; }}\n"
        );
    }
    if v.prefetch {
        src += "  {\n";
        src += &fetch("0u");
        src += "  }\n";
    }
    src += "  for (var k0 = 0u; k0 < k; k0 += BK) {\n";
    if !v.prefetch {
        src += &fetch("k0");
    }
    src += &stage;
    src += "    workgroupBarrier();\n";
    if v.prefetch {
        src += "    if (k0 + BK < k) {\n";
        src += &fetch("(k0 + BK)");
        src += "    }\n";
    }
    let comp = ["x", "y", "z", "w"];
    for kk in 0..bk {
        src += "    {\n";
        src += &format!(
            "    let a0 = As[{o}u + ty];\n    let a1 = As[{o}u + 16u + ty];\n\
             \x20   let b0 = Bs[{o}u + tx];\n    let b1 = Bs[{o}u + 16u + tx];\n",
            o = kk * 32
        );
        for i in 0..8 {
            for j in 0..8 {
                src += &format!(
                    "    c{i}_{j} = fma(a{}.{}, b{}.{}, c{i}_{j});\n",
                    i / 4,
                    comp[i % 4],
                    j / 4,
                    comp[j % 4]
                );
            }
        }
        src += "    }\n";
    }
    src += "    workgroupBarrier();\n  }\n";
    let at = |i: usize, t: &str| format!("{}u + {t} * 4u + {}u", 64 * (i / 4), i % 4);
    for i in 0..8 {
        src += &format!("  let r{i} = row0 + {};\n", at(i, "ty"));
        src += &format!("  if (r{i} < m) {{\n");
        for j in 0..8 {
            src += &format!(
                "    {{ let c = col0 + {}; if (c < n) {{ store_out((bz * m + r{i}) * n + c, c{i}_{j}); }} }}\n",
                at(j, "tx")
            );
        }
        src += "  }\n";
    }
    src += "}\n";
    src
}
