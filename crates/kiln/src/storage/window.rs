//! [`WindowStorage`] for [`Storage`]: convolution, pooling, unfold and fold, forwarded to the
//! backend of the operands' device.

use super::Storage;
use crate::backend::{BackendStorage, WindowStorage};
use crate::layout::Layout;
use crate::op::{PoolKind, Window2d};
use crate::{Error, Result};

impl WindowStorage for Storage {
    fn unfold(&self, l: &Layout, win: &Window2d) -> Result<Self> {
        self.guard("unfold")?;
        on_backend!(self, s => s.unfold(l, win))
    }

    fn fold(&self, l: &Layout, win: &Window2d) -> Result<Self> {
        self.guard("fold")?;
        on_backend!(self, s => s.fold(l, win))
    }

    fn pool(&self, l: &Layout, win: &Window2d, kind: PoolKind) -> Result<(Self, Option<Self>)> {
        self.guard(kind.name())?;
        match self {
            Storage::Cpu(s) => s
                .pool(l, win, kind)
                .map(|(o, i)| (Storage::Cpu(o), i.map(Storage::Cpu))),
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => s
                .pool(l, win, kind)
                .map(|(o, i)| (Storage::Cuda(o), i.map(Storage::Cuda))),
            #[cfg(feature = "wgpu")]
            Storage::Wgpu(s) => s
                .pool(l, win, kind)
                .map(|(o, i)| (Storage::Wgpu(o), i.map(Storage::Wgpu))),
        }
    }

    fn pool_backward(
        &self,
        l: &Layout,
        argmax: Option<&Self>,
        win: &Window2d,
        kind: PoolKind,
    ) -> Result<Self> {
        self.guard(kind.name())?;
        match (self, argmax) {
            (Storage::Cpu(g), None) => g.pool_backward(l, None, win, kind).map(Storage::Cpu),
            (Storage::Cpu(g), Some(Storage::Cpu(i))) => {
                g.pool_backward(l, Some(i), win, kind).map(Storage::Cpu)
            }
            #[cfg(feature = "cuda")]
            (Storage::Cuda(g), None) => g.pool_backward(l, None, win, kind).map(Storage::Cuda),
            #[cfg(feature = "wgpu")]
            (Storage::Wgpu(g), None) => g.pool_backward(l, None, win, kind).map(Storage::Wgpu),
            #[cfg(feature = "cuda")]
            (Storage::Cuda(g), Some(Storage::Cuda(i))) => {
                g.pool_backward(l, Some(i), win, kind).map(Storage::Cuda)
            }
            #[cfg(feature = "wgpu")]
            (Storage::Wgpu(g), Some(Storage::Wgpu(i))) => {
                g.pool_backward(l, Some(i), win, kind).map(Storage::Wgpu)
            }
            #[allow(unreachable_patterns)]
            (g, Some(i)) => Err(Error::DeviceMismatch {
                op: kind.name(),
                lhs: g.device(),
                rhs: i.device(),
            }),
        }
    }

    fn conv2d(
        &self,
        l: &Layout,
        w: &Self,
        wl: &Layout,
        win: &Window2d,
        groups: usize,
    ) -> Result<Option<Self>> {
        self.guard("conv2d")?;
        match (self, w) {
            (Storage::Cpu(x), Storage::Cpu(w)) => {
                Ok(x.conv2d(l, w, wl, win, groups)?.map(Storage::Cpu))
            }
            #[cfg(feature = "cuda")]
            (Storage::Cuda(x), Storage::Cuda(w)) => {
                Ok(x.conv2d(l, w, wl, win, groups)?.map(Storage::Cuda))
            }
            #[cfg(feature = "wgpu")]
            (Storage::Wgpu(x), Storage::Wgpu(w)) => {
                Ok(x.conv2d(l, w, wl, win, groups)?.map(Storage::Wgpu))
            }
            #[allow(unreachable_patterns)]
            _ => Ok(None),
        }
    }

    fn conv2d_bias_act(
        &self,
        l: &Layout,
        w: &Self,
        wl: &Layout,
        b: &Self,
        bl: &Layout,
        win: &Window2d,
        groups: usize,
        relu: bool,
    ) -> Result<Option<Self>> {
        self.guard("conv2d")?;
        match (self, w, b) {
            (Storage::Cpu(x), Storage::Cpu(w), Storage::Cpu(b)) => Ok(x
                .conv2d_bias_act(l, w, wl, b, bl, win, groups, relu)?
                .map(Storage::Cpu)),
            #[cfg(feature = "cuda")]
            (Storage::Cuda(x), Storage::Cuda(w), Storage::Cuda(b)) => Ok(x
                .conv2d_bias_act(l, w, wl, b, bl, win, groups, relu)?
                .map(Storage::Cuda)),
            #[allow(unreachable_patterns)]
            _ => Ok(None),
        }
    }

    fn conv2d_backward_input(
        &self,
        l: &Layout,
        w: &Self,
        wl: &Layout,
        win: &Window2d,
        groups: usize,
    ) -> Result<Option<Self>> {
        self.guard("conv2d backward")?;
        match (self, w) {
            (Storage::Cpu(g), Storage::Cpu(w)) => Ok(g
                .conv2d_backward_input(l, w, wl, win, groups)?
                .map(Storage::Cpu)),
            #[cfg(feature = "cuda")]
            (Storage::Cuda(g), Storage::Cuda(w)) => Ok(g
                .conv2d_backward_input(l, w, wl, win, groups)?
                .map(Storage::Cuda)),
            #[cfg(feature = "wgpu")]
            (Storage::Wgpu(g), Storage::Wgpu(w)) => Ok(g
                .conv2d_backward_input(l, w, wl, win, groups)?
                .map(Storage::Wgpu)),
            #[allow(unreachable_patterns)]
            _ => Ok(None),
        }
    }

    fn conv2d_backward_weight(
        &self,
        l: &Layout,
        g: &Self,
        gl: &Layout,
        win: &Window2d,
        groups: usize,
        weight_dims: [usize; 4],
    ) -> Result<Option<Self>> {
        self.guard("conv2d backward")?;
        match (self, g) {
            (Storage::Cpu(x), Storage::Cpu(g)) => Ok(x
                .conv2d_backward_weight(l, g, gl, win, groups, weight_dims)?
                .map(Storage::Cpu)),
            #[cfg(feature = "cuda")]
            (Storage::Cuda(x), Storage::Cuda(g)) => Ok(x
                .conv2d_backward_weight(l, g, gl, win, groups, weight_dims)?
                .map(Storage::Cuda)),
            #[cfg(feature = "wgpu")]
            (Storage::Wgpu(x), Storage::Wgpu(g)) => Ok(x
                .conv2d_backward_weight(l, g, gl, win, groups, weight_dims)?
                .map(Storage::Wgpu)),
            #[allow(unreachable_patterns)]
            _ => Ok(None),
        }
    }

    // Only CUDA fuses the two; without it every argument but `self` goes unread.
    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    fn conv2d_backward_weight_bias(
        &self,
        l: &Layout,
        g: &Self,
        gl: &Layout,
        win: &Window2d,
        groups: usize,
        weight_dims: [usize; 4],
    ) -> Result<Option<(Self, Self)>> {
        self.guard("conv2d backward")?;
        match (self, g) {
            #[cfg(feature = "cuda")]
            (Storage::Cuda(x), Storage::Cuda(g)) => Ok(x
                .conv2d_backward_weight_bias(l, g, gl, win, groups, weight_dims)?
                .map(|(w, b)| (Storage::Cuda(w), Storage::Cuda(b)))),
            // The other backends compute the two apart.
            _ => Ok(None),
        }
    }
}
