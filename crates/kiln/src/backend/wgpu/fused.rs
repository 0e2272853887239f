//! Fused training kernels: softmax cross-entropy (loss, gradient and hit per row in one
//! pass) and the in-place SGD/Adam updates, with the CPU backend's formulas.

use super::codegen::{self, binding, class, prelude, Access, Class, Params, ENTRY};
use super::context::WgpuDevice;
use super::{WgpuBuffer, WgpuStorage};
use crate::layout::Layout;
use crate::op::{CrossEntropyRows, UpdateRule};
use crate::{DType, Error, Result};
use std::sync::Arc;

/// The fault bit a cross-entropy label outside `[0, C)` sets.
const FAULT_LABEL: u32 = 1;

/// The error a fault word read back from the device stands for.
pub(super) fn fault_error(dev: &WgpuDevice, word: u32) -> Error {
    let what = if word & FAULT_LABEL != 0 {
        "cross_entropy: a target label was outside [0, C) (found by an earlier kernel)"
    } else {
        "a kernel reported an unknown fault"
    };
    dev.error(what)
}

impl WgpuDevice {
    /// The device's fault word (zeroed), made on first use.
    fn fault_word(self: &Arc<Self>) -> Result<Arc<WgpuBuffer>> {
        if let Some(f) = self.fault.get() {
            return Ok(f.clone());
        }
        // Not from the pool: zeroed at creation and never handed to a tensor.
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("kiln fault word"),
            size: 4,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let buf = Arc::new(WgpuBuffer::wrap_foreign(self, buffer));
        Ok(self.fault.get_or_init(|| buf).clone())
    }
}

fn float_only(dev: &WgpuDevice, dtype: DType, op: &'static str) -> Result<()> {
    if class(dev, dtype, op)? != Class::Float {
        return Err(Error::UnsupportedDType { op, dtype });
    }
    Ok(())
}

impl WgpuStorage {
    pub(super) fn cross_entropy_impl(
        &self,
        l: &Layout,
        targets: &WgpuStorage,
        tl: &Layout,
        smoothing: f64,
        scale: f64,
    ) -> Result<CrossEntropyRows<WgpuStorage>> {
        let dev = self.device_arc();
        float_only(dev, self.dtype, "cross_entropy")?;
        let label = match targets.dtype {
            DType::I64 => "let tv = load_t(p[7] + row * p[5]);\n  let valid = tv.y == 0u && tv.x < c;\n  let label = select(0u, tv.x, valid);",
            DType::U32 | DType::U8 => "let tv = load_t(p[7] + row * p[5]);\n  let valid = tv < c;\n  let label = select(0u, tv, valid);",
            other => {
                return Err(Error::Msg(format!(
                    "cross_entropy: targets must be i64, u32 or u8, got {other}"
                )))
            }
        };
        let (n, c) = (l.dims()[0], l.dims()[1]);
        let loss = WgpuStorage::alloc(dev, self.dtype, n)?;
        let grad = WgpuStorage::alloc(dev, self.dtype, n * c)?;
        let correct = WgpuStorage::alloc(dev, DType::F32, n)?;
        let mut p = Params::new(n, &[])?;
        p.scalar_u32(0, codegen::word(c)?)
            .scalar_u32(1, codegen::word(l.strides()[0])?)
            .scalar_u32(2, codegen::word(l.strides()[1])?)
            .scalar_u32(3, codegen::word(tl.strides()[0])?);
        p.push(codegen::word(l.offset())?)
            .push(codegen::word(tl.offset())?)
            .push((smoothing as f32).to_bits())
            .push((scale as f32).to_bits());
        let key = format!("cross_entropy:{:?}:{:?}", self.dtype, targets.dtype);
        let pipeline = dev.pipeline(&key, || {
            let mut s = prelude(&[self.dtype]);
            s += &binding("x", 1, self.dtype, Access::Read);
            s += &binding("t", 2, targets.dtype, Access::Read);
            s += &binding("loss", 3, self.dtype, Access::ReadWrite);
            s += &binding("grad", 4, self.dtype, Access::ReadWrite);
            s += &binding("hit", 5, DType::F32, Access::ReadWrite);
            s += "@group(0) @binding(6) var<storage, read_write> fault: array<atomic<u32>>;\n";
            s += r#"var<workgroup> sv: array<f32, 256>;
var<workgroup> si: array<u32, 256>;
fn better(av: f32, ai: u32, bv: f32, bi: u32) -> bool {
  if (is_nan(av)) { return is_nan(bv) && bi < ai; }
  if (is_nan(bv)) { return true; }
  if (bv > av) { return true; }
  return av == bv && bi < ai;
}
fn tree_sum(v: f32, lid: u32) -> f32 {
  sv[lid] = v;
  workgroupBarrier();
  for (var s = 128u; s > 0u; s >>= 1u) { if (lid < s) { sv[lid] = sv[lid] + sv[lid + s]; } workgroupBarrier(); }
  let r = sv[0];
  workgroupBarrier();
  return r;
}
"#;
            s += ENTRY;
            s += &r#" {
  let row = group_id(wid, nwg);
  if (row >= p[0]) { return; }
  let c = p[2];
  let xb = p[6] + row * p[3];
  let xs = p[4];
  let eps = bitcast<f32>(p[8]);
  let scale = bitcast<f32>(p[9]);
  var m = bitcast<f32>(0xff800000u);
  var mi = 0xffffffffu;
  var sx = 0.0;
  for (var j = lid; j < c; j += 256u) {
    let v = load_x(xb + j * xs);
    if (better(m, mi, v, j)) { m = v; mi = j; }
    sx += v;
  }
  sv[lid] = m;
  si[lid] = mi;
  workgroupBarrier();
  for (var s = 128u; s > 0u; s >>= 1u) {
    if (lid < s && better(sv[lid], si[lid], sv[lid + s], si[lid + s])) { sv[lid] = sv[lid + s]; si[lid] = si[lid + s]; }
    workgroupBarrier();
  }
  m = sv[0];
  mi = si[0];
  workgroupBarrier();
  sx = tree_sum(sx, lid);
  var se = 0.0;
  for (var j = lid; j < c; j += 256u) { se += exp(load_x(xb + j * xs) - m); }
  se = tree_sum(se, lid);
  LABEL
  let q_other = eps / f32(c);
  let q_label = 1.0 - eps + q_other;
  for (var j = lid; j < c; j += 256u) {
    let v = load_x(xb + j * xs);
    let q = select(q_other, q_label, j == label);
    store_grad(row * c + j, select(nan_f32(), scale * (exp(v - m) / se - q), valid));
  }
  if (lid == 0u) {
    let xt = load_x(xb + label * xs);
    let lse = m + log(se);
    let l = scale * (lse - ((1.0 - eps) * xt + q_other * sx));
    store_loss(row, select(nan_f32(), l, valid));
    store_hit(row, select(0.0, 1.0, valid && mi == label));
    if (!valid) { atomicOr(&fault[0], 1u); }
  }
}
"#
            .replace("LABEL", label);
            s
        })?;
        let fault = dev.fault_word()?;
        dev.dispatch(
            pipeline,
            p.bytes(),
            vec![
                self.buf.clone(),
                targets.buf.clone(),
                loss.buf.clone(),
                grad.buf.clone(),
                correct.buf.clone(),
                fault,
            ],
            dev.grid(n as u64)?,
        )?;
        Ok(CrossEntropyRows {
            loss,
            grad,
            correct,
        })
    }

    pub(super) fn update_impl(
        &mut self,
        l: &Layout,
        grad: &WgpuStorage,
        gl: &Layout,
        state: &mut [(&mut WgpuStorage, &Layout)],
        rule: UpdateRule,
    ) -> Result<()> {
        let dev = self.device_arc().clone();
        float_only(&dev, self.dtype, rule.name())?;
        let n = l.elem_count();
        let mut p = Params::new(n, &[])?;
        p.push(codegen::word(l.offset())?)
            .push(codegen::word(gl.offset())?);
        for (_, sl) in state.iter() {
            p.push(codegen::word(sl.offset())?);
        }
        while p.words.len() < 10 {
            p.push(0);
        }
        let body = match rule {
            UpdateRule::Sgd {
                lr,
                momentum,
                nesterov,
                weight_decay,
            } => {
                p.scalar_f32(0, lr as f32)
                    .scalar_f32(1, momentum as f32)
                    .scalar_f32(2, weight_decay as f32)
                    .scalar_u32(3, u32::from(nesterov));
                if state.is_empty() {
                    "let pc = load_param(p[6] + i);\n  let g = load_grad(p[7] + i) + pf(2u) * pc;\n  \
                     store_param(p[6] + i, pc - pf(0u) * g);"
                } else {
                    "let pc = load_param(p[6] + i);\n  var g = load_grad(p[7] + i) + pf(2u) * pc;\n  \
                     let v = pf(1u) * load_s0(p[8] + i) + g;\n  store_s0(p[8] + i, v);\n  \
                     g = select(v, g + pf(1u) * v, pu(3u) != 0u);\n  store_param(p[6] + i, pc - pf(0u) * g);"
                }
            }
            UpdateRule::Adam {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
                decoupled,
                step: _,
            } => {
                let (step_size, inv_bc2) = rule.adam_scales().expect("an Adam rule");
                p.scalar_f32(0, lr as f32)
                    .scalar_f32(1, beta1 as f32)
                    .scalar_f32(2, beta2 as f32)
                    .scalar_f32(3, eps as f32);
                p.push((weight_decay as f32).to_bits())
                    .push(u32::from(decoupled))
                    .push((step_size as f32).to_bits())
                    .push((inv_bc2 as f32).to_bits());
                "var pc = load_param(p[6] + i);\n  var g = load_grad(p[7] + i);\n  \
                 let wd = bitcast<f32>(p[10]);\n  \
                 if (p[11] != 0u) { pc = pc * (1.0 - pf(0u) * wd); } else { g = g + wd * pc; }\n  \
                 let m = pf(1u) * load_s0(p[8] + i) + (1.0 - pf(1u)) * g;\n  \
                 let v = pf(2u) * load_s1(p[9] + i) + (1.0 - pf(2u)) * g * g;\n  \
                 store_s0(p[8] + i, m);\n  store_s1(p[9] + i, v);\n  \
                 store_param(p[6] + i, pc - bitcast<f32>(p[12]) * m / (sqrt(v * bitcast<f32>(p[13])) + pf(3u)));"
            }
        };
        let key = format!("update:{}:{}:{:?}", rule.name(), state.len(), self.dtype);
        let dtype = self.dtype;
        let n_state = state.len();
        let pipeline = dev.pipeline(&key, || {
            let mut s = prelude(&[dtype]);
            s += &binding("param", 1, dtype, Access::ReadWrite);
            s += &binding("grad", 2, dtype, Access::Read);
            for k in 0..n_state {
                s += &binding(&format!("s{k}"), 3 + k as u32, dtype, Access::ReadWrite);
            }
            s += &format!(
                "{ENTRY} {{\n  let i = linear_id(wid, nwg, lid);\n  if (i >= p[0]) {{ return; }}\n  {body}\n}}\n"
            );
            s
        })?;
        let mut buffers = vec![self.buf.clone(), grad.buf.clone()];
        for (s, _) in state.iter() {
            buffers.push(s.buf.clone());
        }
        dev.dispatch(
            pipeline,
            p.bytes(),
            buffers,
            dev.grid((n as u64).div_ceil(256))?,
        )
    }
}
