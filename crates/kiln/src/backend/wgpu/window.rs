//! Sliding-window primitives on wgpu devices: im2col (`unfold`), its adjoint (`fold`),
//! pooling and its gradient. A convolution is `unfold` plus the tiled matrix product (the
//! tensor layer composes them). Every kernel gathers (one invocation per output element),
//! so none needs atomics and every sum has a fixed order.

use super::codegen::{self, binding, class, prelude, Access, Class, Params, ENTRY};
use super::WgpuStorage;
use crate::backend::WindowStorage;
use crate::layout::Layout;
use crate::op::{PoolKind, Window2d};
use crate::{DType, Error, Result};

/// Names of the window's words in the parameters (after the head).
const WINDOW_WGSL: &str = r#"
fn wn() -> u32 { return p[6]; }
fn wc() -> u32 { return p[7]; }
fn wh() -> u32 { return p[8]; }
fn ww() -> u32 { return p[9]; }
fn kh() -> u32 { return p[10]; }
fn kw() -> u32 { return p[11]; }
fn sh() -> u32 { return p[12]; }
fn sw() -> u32 { return p[13]; }
fn ph() -> u32 { return p[14]; }
fn pw() -> u32 { return p[15]; }
fn dh() -> u32 { return p[16]; }
fn dw() -> u32 { return p[17]; }
fn oh() -> u32 { return p[18]; }
fn ow() -> u32 { return p[19]; }
fn xoff() -> u32 { return p[20]; }
fn xs(d: u32) -> u32 { return p[21u + d]; }
// The output position `o` whose tap `k` reads input position `y` along one axis, or
// 0xffffffff when there is none.
fn source_of(y: u32, pad: u32, k: u32, dil: u32, stride: u32, out: u32) -> u32 {
  let t = i32(y + pad) - i32(k * dil);
  if (t < 0 || u32(t) % stride != 0u) { return 0xffffffffu; }
  let o = u32(t) / stride;
  return select(0xffffffffu, o, o < out);
}
"#;

fn window_params(count: usize, win: &Window2d, l: &Layout) -> Result<Params> {
    let mut p = Params::new(count, &[])?;
    let [oh, ow] = win.out_hw();
    for v in [
        win.n,
        win.c,
        win.h,
        win.w,
        win.kernel[0],
        win.kernel[1],
        win.stride[0],
        win.stride[1],
        win.padding[0],
        win.padding[1],
        win.dilation[0],
        win.dilation[1],
        oh,
        ow,
        l.offset(),
    ] {
        p.push(codegen::word(v)?);
    }
    for d in 0..4 {
        p.push(codegen::word(l.strides().get(d).copied().unwrap_or(0))?);
    }
    Ok(p)
}

fn float_only(s: &WgpuStorage, op: &'static str) -> Result<()> {
    if class(s.device_arc(), s.dtype, op)? != Class::Float {
        return Err(Error::UnsupportedDType { op, dtype: s.dtype });
    }
    Ok(())
}

impl WgpuStorage {
    /// One invocation per element of a `count`-element output of `out_dtype` running `body`
    /// (WGSL; `i` is the element, `x` the input) over this storage.
    fn window_kernel(
        &self,
        key: &str,
        p: &Params,
        count: usize,
        extra: Option<(&WgpuStorage, DType)>,
        outputs: &[(DType, usize)],
        body: &str,
    ) -> Result<Vec<WgpuStorage>> {
        let dev = self.device_arc();
        let outs: Vec<WgpuStorage> = outputs
            .iter()
            .map(|&(dt, n)| WgpuStorage::alloc(dev, dt, n))
            .collect::<Result<_>>()?;
        let full_key = format!("window:{key}:{:?}", self.dtype);
        let pipeline = dev.pipeline(&full_key, || {
            let mut s = prelude(&[self.dtype]);
            s += &binding("x", 1, self.dtype, Access::Read);
            let mut next = 2;
            if let Some((_, dt)) = extra {
                s += &binding("ids", next, dt, Access::Read);
                next += 1;
            }
            for (k, (dt, _)) in outputs.iter().enumerate() {
                let name = if k == 0 { "out" } else { "out_ids" };
                s += &binding(name, next, *dt, Access::ReadWrite);
                next += 1;
            }
            s += WINDOW_WGSL;
            s += &format!(
                "{ENTRY} {{\n  let i = linear_id(wid, nwg, lid);\n  if (i >= p[0]) {{ return; }}\n{body}\n}}\n"
            );
            s
        })?;
        let mut buffers = vec![self.buf.clone()];
        if let Some((e, _)) = extra {
            buffers.push(e.buf.clone());
        }
        buffers.extend(outs.iter().map(|o| o.buf.clone()));
        dev.dispatch(
            pipeline,
            p.bytes(),
            buffers,
            dev.grid((count as u64).div_ceil(256))?,
        )?;
        Ok(outs)
    }
}

impl WindowStorage for WgpuStorage {
    fn unfold(&self, l: &Layout, win: &Window2d) -> Result<Self> {
        float_only(self, "unfold")?;
        let count = win.col_rows() * win.col_cols();
        let p = window_params(count, win, l)?;
        let body = r#"
  let cols = wn() * oh() * ow();
  let r = i / cols;
  let col = i % cols;
  let ch = r / (kh() * kw());
  let ki = (r / kw()) % kh();
  let kj = r % kw();
  let b = col / (oh() * ow());
  let oy = (col / ow()) % oh();
  let ox = col % ow();
  let iy = i32(oy * sh() + ki * dh()) - i32(ph());
  let ix = i32(ox * sw() + kj * dw()) - i32(pw());
  var v = 0.0;
  if (iy >= 0 && u32(iy) < wh() && ix >= 0 && u32(ix) < ww()) {
    v = load_x(xoff() + b * xs(0u) + ch * xs(1u) + u32(iy) * xs(2u) + u32(ix) * xs(3u));
  }
  store_out(i, v);"#;
        let mut o = self.window_kernel("unfold", &p, count, None, &[(self.dtype, count)], body)?;
        Ok(o.remove(0))
    }

    fn fold(&self, l: &Layout, win: &Window2d) -> Result<Self> {
        float_only(self, "fold")?;
        let count = win.n * win.c * win.h * win.w;
        let p = window_params(count, win, l)?;
        let body = r#"
  let x = i % ww();
  let y = (i / ww()) % wh();
  let ch = (i / (ww() * wh())) % wc();
  let b = i / (ww() * wh() * wc());
  var acc = 0.0;
  for (var ki = 0u; ki < kh(); ki++) {
    let oy = source_of(y, ph(), ki, dh(), sh(), oh());
    if (oy == 0xffffffffu) { continue; }
    for (var kj = 0u; kj < kw(); kj++) {
      let ox = source_of(x, pw(), kj, dw(), sw(), ow());
      if (ox == 0xffffffffu) { continue; }
      let r = (ch * kh() + ki) * kw() + kj;
      let c = (b * oh() + oy) * ow() + ox;
      acc += load_x(xoff() + r * xs(0u) + c * xs(1u));
    }
  }
  store_out(i, acc);"#;
        let mut o = self.window_kernel("fold", &p, count, None, &[(self.dtype, count)], body)?;
        Ok(o.remove(0))
    }

    fn pool(&self, l: &Layout, win: &Window2d, kind: PoolKind) -> Result<(Self, Option<Self>)> {
        float_only(self, kind.name())?;
        let [oh, ow] = win.out_hw();
        let count = win.n * win.c * oh * ow;
        let p = window_params(count, win, l)?;
        let finish = match kind {
            PoolKind::Max => "store_out(i, best);\n  store_out_ids(i, best_at);",
            PoolKind::Avg => "store_out(i, sum / f32(kh() * kw()));",
        };
        let body = format!(
            r#"
  let ox = i % ow();
  let oy = (i / ow()) % oh();
  let ch = (i / (ow() * oh())) % wc();
  let b = i / (ow() * oh() * wc());
  let base = xoff() + b * xs(0u) + ch * xs(1u);
  var best = bitcast<f32>(0xff800000u);
  var best_at = 0xffffffffu;
  var sum = 0.0;
  for (var ki = 0u; ki < kh(); ki++) {{
    let iy = i32(oy * sh() + ki * dh()) - i32(ph());
    if (iy < 0 || u32(iy) >= wh()) {{ continue; }}
    for (var kj = 0u; kj < kw(); kj++) {{
      let ix = i32(ox * sw() + kj * dw()) - i32(pw());
      if (ix < 0 || u32(ix) >= ww()) {{ continue; }}
      let v = load_x(base + u32(iy) * xs(2u) + u32(ix) * xs(3u));
      sum += v;
      if (best_at == 0xffffffffu || v > best || (is_nan(v) && !is_nan(best))) {{
        best = v;
        best_at = u32(iy) * ww() + u32(ix);
      }}
    }}
  }}
  {finish}"#
        );
        let mut outputs = vec![(self.dtype, count)];
        if kind == PoolKind::Max {
            outputs.push((DType::U32, count));
        }
        let mut o = self.window_kernel(kind.name(), &p, count, None, &outputs, &body)?;
        let ids = (kind == PoolKind::Max).then(|| o.remove(1));
        Ok((o.remove(0), ids))
    }

    fn pool_backward(
        &self,
        l: &Layout,
        argmax: Option<&Self>,
        win: &Window2d,
        kind: PoolKind,
    ) -> Result<Self> {
        float_only(self, kind.name())?;
        let count = win.n * win.c * win.h * win.w;
        let p = window_params(count, win, l)?;
        let add = match (kind, argmax) {
            (PoolKind::Max, Some(_)) => {
                "if (ids[plane * oh() * ow() + oy * ow() + ox] == y * ww() + x) { acc += g; }"
            }
            (PoolKind::Max, None) => {
                return Err(Error::Msg(
                    "max_pool2d backward: the positions of the maxima are missing".into(),
                ))
            }
            (PoolKind::Avg, _) => "acc += g / f32(kh() * kw());",
        };
        let body = format!(
            r#"
  let x = i % ww();
  let y = (i / ww()) % wh();
  let plane = i / (ww() * wh());
  let ch = plane % wc();
  let b = plane / wc();
  let base = xoff() + b * xs(0u) + ch * xs(1u);
  var acc = 0.0;
  for (var ki = 0u; ki < kh(); ki++) {{
    let oy = source_of(y, ph(), ki, dh(), sh(), oh());
    if (oy == 0xffffffffu) {{ continue; }}
    for (var kj = 0u; kj < kw(); kj++) {{
      let ox = source_of(x, pw(), kj, dw(), sw(), ow());
      if (ox == 0xffffffffu) {{ continue; }}
      let g = load_x(base + oy * xs(2u) + ox * xs(3u));
      {add}
    }}
  }}
  store_out(i, acc);"#
        );
        let extra = match kind {
            PoolKind::Max => argmax.map(|a| (a, DType::U32)),
            PoolKind::Avg => None,
        };
        let key = format!("{}_backward", kind.name());
        let mut o = self.window_kernel(&key, &p, count, extra, &[(self.dtype, count)], &body)?;
        Ok(o.remove(0))
    }
}
