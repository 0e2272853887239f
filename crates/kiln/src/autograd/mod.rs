//! Reverse-mode automatic differentiation.
//!
//! A tensor that requires gradients carries a [`Node`]: a leaf (made by [`Tensor::var`]) or
//! the op that produced it, holding its inputs. Ops record a node only when an input has one
//! and gradients are enabled (see [`no_grad`]). [`Tensor::backward`] walks the graph from the
//! output in reverse topological order, applying each op's rule (rules.rs) and summing the
//! gradients that reach each node; the result maps every leaf to its gradient. Saved values
//! are detached, so a graph holds no cycles and is freed with its last tensor.

mod rules;
pub(crate) use rules::sum_to_shape;

use crate::op::{BinaryOp, UnaryOp};
use crate::{Error, Result, Tensor};
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
    /// The scalar 1 that seeds `backward()` of a scalar output, per device and dtype: a
    /// training step then queues no fill kernel for it.
    static UNIT_SEEDS: std::cell::RefCell<Vec<Tensor>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The cached scalar 1 of `like`'s device and dtype.
fn unit_seed(like: &Tensor) -> Result<Tensor> {
    UNIT_SEEDS.with(|seeds| {
        let mut seeds = seeds.borrow_mut();
        if let Some(s) = seeds
            .iter()
            .find(|s| s.device() == like.device() && s.dtype() == like.dtype())
        {
            return Ok(s.clone());
        }
        let s = Tensor::ones((), like.dtype(), &like.device())?;
        // Made inside a graph capture, the 1 would be written only by replays: not cached.
        if crate::backend::capturing_on_this_thread().is_none() {
            seeds.push(s.clone());
        }
        Ok(s)
    })
}

/// Whether ops on this thread record gradients now.
#[inline]
pub fn grad_enabled() -> bool {
    GRAD_ENABLED.with(Cell::get)
}

/// Runs `f` without recording gradients (evaluation, parameter updates), restoring the
/// previous mode afterwards, even on panic.
///
/// ```
/// # use kiln::{Device, DType, Tensor};
/// let w = Tensor::ones(3, DType::F32, &Device::Cpu)?.var()?;
/// let y = kiln::no_grad(|| w.mul_scalar(2.0))?;
/// assert!(!y.requires_grad());
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            GRAD_ENABLED.with(|g| g.set(self.0));
        }
    }
    let _restore = Restore(GRAD_ENABLED.with(|g| g.replace(false)));
    f()
}

/// The backward function of a custom op: given the output's gradient, one gradient (or
/// `None`) per input, in order.
pub type BackwardFn = dyn Fn(&Tensor) -> Result<Vec<Option<Tensor>>> + Send + Sync;

/// How a tensor was made, with what its gradient rule needs.
// Every node lives in its own Arc allocation, so the largest variant costs little.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Op {
    Leaf,
    Unary {
        x: Tensor,
        op: UnaryOp,
        out: Tensor,
    },
    Binary {
        a: Tensor,
        b: Tensor,
        op: BinaryOp,
        out: Tensor,
    },
    Where {
        cond: Tensor,
        t: Tensor,
        f: Tensor,
    },
    Cast {
        x: Tensor,
    },
    Transpose {
        x: Tensor,
        d0: usize,
        d1: usize,
    },
    Permute {
        x: Tensor,
        perm: Vec<usize>,
    },
    Slice {
        x: Tensor,
        dim: usize,
        start: usize,
        end: usize,
        step: usize,
    },
    Broadcast {
        x: Tensor,
    },
    Reshape {
        x: Tensor,
    },
    Copy {
        x: Tensor,
    },
    Sum {
        x: Tensor,
    },
    Extremum {
        x: Tensor,
        out: Tensor,
    },
    Softmax {
        x: Tensor,
        out: Tensor,
        dim: usize,
        log: bool,
    },
    /// `ln Σ e^x` along one dim, `out` keeping it with size 1.
    LogSumExp {
        x: Tensor,
        out: Tensor,
    },
    Matmul {
        a: Tensor,
        b: Tensor,
    },
    MatmulBias {
        a: Tensor,
        b: Tensor,
        bias: Tensor,
    },
    /// `act(a·b + bias)`: `out` is the output, `pre` the pre-activation when kept (GELU).
    MatmulBiasAct {
        a: Tensor,
        b: Tensor,
        bias: Tensor,
        act: crate::op::EpilogueActivation,
        out: Tensor,
        pre: Option<Tensor>,
    },
    Cat {
        xs: Vec<Tensor>,
        dim: usize,
    },
    IndexSelect {
        x: Tensor,
        ids: Tensor,
        dim: usize,
    },
    Gather {
        x: Tensor,
        ids: Tensor,
        dim: usize,
    },
    ScatterAdd {
        x: Tensor,
        ids: Tensor,
        src: Tensor,
        dim: usize,
    },
    /// A direct convolution (no bias) by the backend's library (cuDNN).
    Conv2d {
        x: Tensor,
        w: Tensor,
        window: crate::op::Window2d,
        groups: usize,
    },
    /// A direct convolution with its bias added and, with `relu`, the ReLU applied in the
    /// same kernel (kiln's direct CUDA kernel); `out` is the result.
    Conv2dBiasAct {
        x: Tensor,
        w: Tensor,
        bias: Tensor,
        window: crate::op::Window2d,
        groups: usize,
        relu: bool,
        out: Tensor,
    },
    /// im2col of an NCHW input (a convolution's first half).
    Unfold {
        x: Tensor,
        window: crate::op::Window2d,
    },
    /// Max or average pooling; `argmax` holds the maxima's positions for max-pooling, `out`
    /// is the result.
    Pool {
        x: Tensor,
        argmax: Option<Tensor>,
        window: crate::op::Window2d,
        kind: crate::op::PoolKind,
        out: Tensor,
    },
    Custom {
        inputs: Vec<Tensor>,
        backward: Box<BackwardFn>,
    },
}

impl Op {
    /// The inputs whose gradients the rule produces, in the rule's output order.
    fn inputs(&self) -> Vec<&Tensor> {
        match self {
            Op::Leaf => vec![],
            Op::Unary { x, .. }
            | Op::Cast { x }
            | Op::Transpose { x, .. }
            | Op::Permute { x, .. }
            | Op::Slice { x, .. }
            | Op::Broadcast { x }
            | Op::Reshape { x }
            | Op::Copy { x }
            | Op::Sum { x, .. }
            | Op::Extremum { x, .. }
            | Op::Softmax { x, .. }
            | Op::LogSumExp { x, .. }
            | Op::IndexSelect { x, .. }
            | Op::Gather { x, .. }
            | Op::Unfold { x, .. }
            | Op::Pool { x, .. } => vec![x],
            Op::Binary { a, b, .. } | Op::Matmul { a, b } | Op::Conv2d { x: a, w: b, .. } => {
                vec![a, b]
            }
            Op::Where { t, f, .. } => vec![t, f],
            Op::MatmulBias { a, b, bias } | Op::MatmulBiasAct { a, b, bias, .. } => {
                vec![a, b, bias]
            }
            Op::Conv2dBiasAct { x, w, bias, .. } => vec![x, w, bias],
            Op::ScatterAdd { x, src, .. } => vec![x, src],
            Op::Cat { xs, .. } => xs.iter().collect(),
            Op::Custom { inputs, .. } => inputs.iter().collect(),
        }
    }
}

/// A vertex of the gradient graph.
pub struct Node {
    id: u64,
    pub(crate) op: Op,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Node({})", self.id)
    }
}

fn new_node(op: Op) -> Arc<Node> {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    Arc::new(Node {
        id: NEXT.fetch_add(1, Ordering::Relaxed),
        op,
    })
}

/// Gradients of the leaves reached by one [`Tensor::backward`].
#[derive(Default)]
pub struct Grads {
    map: HashMap<u64, Tensor>,
}

impl Grads {
    /// The gradient of `leaf` (a tensor made by [`Tensor::var`]), if the output depends on it.
    pub fn get(&self, leaf: &Tensor) -> Option<&Tensor> {
        self.map.get(&leaf.node.as_ref()?.id)
    }

    /// Takes the gradient of `leaf` out.
    pub fn remove(&mut self, leaf: &Tensor) -> Option<Tensor> {
        self.map.remove(&leaf.node.as_ref()?.id)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

impl Tensor {
    /// Attaches a node for `op` when gradients are on and an input requires them.
    pub(crate) fn tracked(mut self, inputs: &[&Tensor], op: impl FnOnce() -> Op) -> Tensor {
        if grad_enabled() && inputs.iter().any(|t| t.node.is_some()) {
            self.node = Some(new_node(op()));
        }
        self
    }

    /// Like [`Tensor::tracked`], passing the rule a detached copy of the output.
    pub(crate) fn tracked_out(
        mut self,
        inputs: &[&Tensor],
        op: impl FnOnce(Tensor) -> Op,
    ) -> Tensor {
        if grad_enabled() && inputs.iter().any(|t| t.node.is_some()) {
            let saved = self.detach();
            self.node = Some(new_node(op(saved)));
        }
        self
    }

    /// A leaf that requires gradients, sharing storage with `self` (float dtypes).
    ///
    /// ```
    /// # use kiln::{AllDims, Device, DType, Tensor};
    /// let x = Tensor::from_vec(vec![1f64, 2., 3.], 3, &Device::Cpu)?.var()?;
    /// let grads = x.sqr()?.sum(AllDims, false)?.backward()?;
    /// assert_eq!(grads.get(&x).unwrap().to_vec::<f64>()?, vec![2., 4., 6.]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn var(&self) -> Result<Tensor> {
        self.check_float("var")?;
        let mut t = self.detach();
        t.node = Some(new_node(Op::Leaf));
        Ok(t)
    }

    /// The same data without gradient tracking.
    pub fn detach(&self) -> Tensor {
        let mut t = self.clone();
        t.node = None;
        t
    }

    /// Whether this tensor is a leaf or the result of ops on one.
    pub fn requires_grad(&self) -> bool {
        self.node.is_some()
    }

    /// Whether this is the scalar 1 that [`Tensor::backward`] seeds a scalar output with, so
    /// that a custom op's backward (see [`Tensor::custom_op`]) can skip multiplying by it.
    pub fn is_unit_seed(&self) -> bool {
        self.rank() == 0 && UNIT_SEEDS.with(|s| s.borrow().iter().any(|u| u.same_storage(self)))
    }

    /// Whether this tensor is a leaf made by [`Tensor::var`].
    pub fn is_leaf(&self) -> bool {
        matches!(self.node.as_deref(), Some(Node { op: Op::Leaf, .. }))
    }

    /// Wraps `out`, computed from `inputs` by code outside the built-in ops, as a
    /// differentiable op with the gradient rule `backward` (fused losses use this).
    pub fn custom_op(out: Tensor, inputs: Vec<Tensor>, backward: Box<BackwardFn>) -> Tensor {
        let refs: Vec<&Tensor> = inputs.iter().collect();
        let needs = grad_enabled() && refs.iter().any(|t| t.node.is_some());
        let mut out = out.detach();
        if needs {
            out.node = Some(new_node(Op::Custom { inputs, backward }));
        }
        out
    }

    /// Gradients of this tensor (seeded with ones; usually a scalar loss) with respect to
    /// every leaf it depends on. The graph is not changed; drop the output to free it.
    pub fn backward(&self) -> Result<Grads> {
        // A scalar output that is not itself a leaf is seeded with the shared cached 1 (a
        // leaf's gradient is handed to the caller, who may write to it).
        let shared = self.rank() == 0 && !self.is_leaf();
        let seed = if shared {
            unit_seed(self)?
        } else {
            no_grad(|| self.ones_like())?
        };
        self.backward_seeded(seed, shared)
    }

    /// Gradients of the leaves this tensor depends on, for `grad` as the gradient of this
    /// tensor (same shape, dtype and device): what [`Tensor::backward`] computes for a loss
    /// whose gradient with respect to `self` is `grad`, without computing the loss. A fused
    /// loss that already produced its gradient (e.g. [`Tensor::softmax_cross_entropy`])
    /// seeds the backward pass of the network this way.
    ///
    /// ```
    /// # use kiln::{Device, Tensor};
    /// let w = Tensor::from_vec(vec![1f64, 2.], 2, &Device::Cpu)?.var()?;
    /// let y = w.sqr()?;
    /// let g = Tensor::from_vec(vec![1f64, 10.], 2, &Device::Cpu)?;
    /// let grads = y.backward_with(&g)?;
    /// assert_eq!(grads.get(&w).unwrap().to_vec::<f64>()?, [2., 40.]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn backward_with(&self, grad: &Tensor) -> Result<Grads> {
        self.check_seed(grad, "backward_with")?;
        self.backward_seeded(grad.detach(), false)
    }

    /// [`Tensor::backward_with`], calling `ready(leaf_id, grad)` as soon as a leaf's
    /// gradient is final (every op that used the leaf has been differentiated), in the order
    /// that happens; what `ready` returns is stored as that leaf's gradient. Data-parallel
    /// training starts reducing a bucket of gradients across devices here while the rest of
    /// the backward pass runs. [`Tensor::leaf_id`] names a leaf.
    ///
    /// ```
    /// # use kiln::{Device, Tensor};
    /// let w = Tensor::from_vec(vec![1f64, 2.], 2, &Device::Cpu)?.var()?;
    /// let b = Tensor::from_vec(vec![3f64, 4.], 2, &Device::Cpu)?.var()?;
    /// let y = w.sqr()?.add(&b)?;
    /// let mut seen = Vec::new();
    /// let g = Tensor::ones(2, kiln::DType::F64, &Device::Cpu)?;
    /// let grads = y.backward_with_hook(&g, |id, grad| {
    ///     seen.push(id);
    ///     grad.mul_scalar(10.0)
    /// })?;
    /// assert_eq!(seen, [b.leaf_id().unwrap(), w.leaf_id().unwrap()]); // b's is final first
    /// assert_eq!(grads.get(&w).unwrap().to_vec::<f64>()?, [20., 40.]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn backward_with_hook(
        &self,
        grad: &Tensor,
        mut ready: impl FnMut(u64, Tensor) -> Result<Tensor>,
    ) -> Result<Grads> {
        self.check_seed(grad, "backward_with_hook")?;
        self.backward_core(grad.detach(), false, Some(&mut ready))
    }

    /// The id [`Tensor::backward_with_hook`] passes for this leaf (`None` unless the tensor
    /// was made by [`Tensor::var`]).
    pub fn leaf_id(&self) -> Option<u64> {
        self.node
            .as_ref()
            .filter(|n| matches!(n.op, Op::Leaf))
            .map(|n| n.id)
    }

    /// A seed gradient must match this tensor's dtype, device and shape.
    fn check_seed(&self, grad: &Tensor, op: &'static str) -> Result<()> {
        self.check_same(grad, op)?;
        if grad.shape() != self.shape() {
            return Err(Error::ShapeMismatch {
                op,
                lhs: self.shape().clone(),
                rhs: grad.shape().clone(),
            });
        }
        Ok(())
    }

    fn backward_seeded(&self, seed: Tensor, shared: bool) -> Result<Grads> {
        self.backward_core(seed, shared, None)
    }

    fn backward_core(
        &self,
        seed: Tensor,
        shared: bool,
        mut ready: Option<&mut dyn FnMut(u64, Tensor) -> Result<Tensor>>,
    ) -> Result<Grads> {
        let root = self.node.clone().ok_or_else(|| {
            Error::Msg("backward: this tensor does not depend on any tensor made by var()".into())
        })?;
        let order = topological(&root);
        // Uses of each node by the nodes of the graph: a leaf's gradient is final when all
        // of its users have been visited.
        let mut users: HashMap<u64, usize> = HashMap::new();
        for node in &order {
            for input in node.op.inputs() {
                if let Some(n) = &input.node {
                    *users.entry(n.id).or_default() += 1;
                }
            }
        }
        let hooked = ready.is_some();
        no_grad(|| {
            let mut pending: HashMap<u64, Tensor> = HashMap::new();
            // ReLU nodes whose pending gradient is already zero where their output is, with
            // their bias gradient where it came from the pooled gradient (see `pool_of_relu`).
            let mut relu_masked: HashMap<u64, Option<Tensor>> = HashMap::new();
            let shared_seed = shared.then(|| seed.clone());
            pending.insert(root.id, seed);
            let mut grads = Grads::default();
            // Stores a leaf's final gradient (through `ready`, when given).
            let mut finish = |id: u64, g: Tensor, grads: &mut Grads| -> Result<()> {
                // A view of the shared seed must not reach the caller.
                let g = match &shared_seed {
                    Some(s) if g.same_storage(s) => g.copy()?,
                    _ => g,
                };
                let g = match ready.as_mut() {
                    Some(f) => f(id, g)?,
                    None => g,
                };
                grads.map.insert(id, g);
                Ok(())
            };
            for node in order {
                let inputs = node.op.inputs();
                if let Some(g) = pending.remove(&node.id) {
                    if let Op::Leaf = node.op {
                        finish(node.id, g, &mut grads)?;
                        continue;
                    }
                    let needs: Vec<bool> = inputs.iter().map(|t| t.node.is_some()).collect();
                    let accumulate = |input_grads: Vec<Option<Tensor>>,
                                      pending: &mut HashMap<u64, Tensor>|
                     -> Result<()> {
                        for (input, gi) in inputs.iter().zip(input_grads) {
                            let (Some(n), Some(gi)) = (&input.node, gi) else {
                                continue;
                            };
                            let gi = if gi.dtype() != input.dtype() {
                                gi.to_dtype(input.dtype())?
                            } else {
                                gi
                            };
                            let acc = match pending.remove(&n.id) {
                                Some(prev) => prev.add(&gi)?,
                                None => gi,
                            };
                            pending.insert(n.id, acc);
                        }
                        Ok(())
                    };
                    // With a hook (data parallel), a layer's weight and bias gradients that
                    // are final here go to it before the input's gradient is queued, so their
                    // reduction overlaps that product instead of waiting for it.
                    let linear = hooked
                        && matches!(node.op, Op::MatmulBias { .. } | Op::MatmulBiasAct { .. });
                    let early: Vec<Option<EarlyLeaf>> = inputs
                        .iter()
                        .map(|t| linear.then(|| early_leaf(t, &users)).flatten())
                        .collect();
                    let is_early: Vec<bool> = early.iter().map(Option::is_some).collect();
                    let late: Vec<bool> = needs
                        .iter()
                        .zip(&is_early)
                        .map(|(&n, &e)| n && !e)
                        .collect();
                    if is_early.iter().any(|&e| e) && late.iter().any(|&l| l) {
                        let g = rules::linear_output_grad(&node.op, &g)?;
                        let want = |m: &[bool]| [m[0], m[1], m[2]];
                        accumulate(
                            rules::linear_grads(&node.op, &g, want(&is_early))?,
                            &mut pending,
                        )?;
                        for (input, e) in inputs.iter().zip(&early) {
                            let (Some(n), Some(e)) = (&input.node, e) else {
                                continue;
                            };
                            let Some(gi) = pending.remove(&n.id) else {
                                continue;
                            };
                            let leaf_grad = match e {
                                EarlyLeaf::Direct => gi,
                                // The view's own turn comes later and finds nothing pending.
                                EarlyLeaf::ThroughView(leaf) => {
                                    let g = rules::backward(&n.op, &gi, &[true])?
                                        .pop()
                                        .flatten()
                                        .ok_or_else(|| {
                                        Error::Msg("backward: a view lost its gradient".into())
                                    })?;
                                    // The leaf's gradient then owns its storage alone (a
                                    // hook may reduce it in place without a copy).
                                    drop(gi);
                                    match pending.remove(leaf) {
                                        Some(prev) => prev.add(&g)?,
                                        None => g,
                                    }
                                }
                            };
                            let leaf_id = match e {
                                EarlyLeaf::Direct => n.id,
                                EarlyLeaf::ThroughView(leaf) => *leaf,
                            };
                            finish(leaf_id, leaf_grad, &mut grads)?;
                        }
                        accumulate(
                            rules::linear_grads(&node.op, &g, want(&late))?,
                            &mut pending,
                        )?;
                    } else if let Some(bias_grad) = relu_masked.remove(&node.id) {
                        let grads = rules::backward_masked(&node.op, &g, &needs, bias_grad)?;
                        accumulate(grads, &mut pending)?;
                    } else if let Some(masked) = pool_of_relu(&node.op, &g, &users)? {
                        relu_masked.insert(masked.relu_id, masked.bias_grad);
                        accumulate(rules::backward(&node.op, &masked.g, &needs)?, &mut pending)?;
                    } else {
                        accumulate(rules::backward(&node.op, &g, &needs)?, &mut pending)?;
                    }
                }
                // This node's uses of its inputs are done: leaves with no user left are final.
                for input in &inputs {
                    let Some(n) = &input.node else { continue };
                    let left = users.get_mut(&n.id).expect("counted above");
                    *left -= 1;
                    if *left == 0 && matches!(n.op, Op::Leaf) {
                        if let Some(g) = pending.remove(&n.id) {
                            finish(n.id, g, &mut grads)?;
                        }
                    }
                }
            }
            Ok(grads)
        })
    }
}

/// [`pool_of_relu`]'s result.
struct PooledRelu {
    /// The ReLU node, whose rule then skips the mask.
    relu_id: u64,
    /// The pooling's output gradient, masked.
    g: Tensor,
    /// For a convolution with a bias (that wants a gradient): that gradient.
    bias_grad: Option<Tensor>,
}

/// Max-pooling of a ReLU's output that is the ReLU's only use: the ReLU's gradient mask
/// moves in front of the pooling, where it is a quarter of the size (2×2 windows) and, as
/// the pooled output is the input at each maximum, the same:
/// `relu_grad(pool_backward(g), x) = pool_backward(relu_grad(g, pooled))`. A max-pooling's
/// backward only moves each gradient to its window's maximum, so the sum over N, H and W
/// of a convolution's output gradient (its bias gradient) is that of the masked pooled
/// gradient, a quarter of the size too.
fn pool_of_relu(op: &Op, g: &Tensor, users: &HashMap<u64, usize>) -> Result<Option<PooledRelu>> {
    let Op::Pool {
        x,
        kind: crate::op::PoolKind::Max,
        out,
        ..
    } = op
    else {
        return Ok(None);
    };
    let Some(n) = &x.node else { return Ok(None) };
    let (relu, bias) = match &n.op {
        Op::Unary { op, .. } => (*op == crate::op::UnaryOp::Relu, None),
        Op::Conv2dBiasAct { relu, bias, .. } => (*relu, Some(bias)),
        _ => (false, None),
    };
    if !relu || users.get(&n.id) != Some(&1) {
        return Ok(None);
    }
    let g = g.relu_grad(out)?;
    let bias_grad = match bias {
        Some(b) if b.node.is_some() => Some(g.sum(vec![0, 2, 3], false)?),
        _ => None,
    };
    Ok(Some(PooledRelu {
        relu_id: n.id,
        g,
        bias_grad,
    }))
}

/// How a layer's input that is (a view of) a parameter reaches its leaf, when this layer is
/// the leaf's last use, so its gradient can be final before the layer's other inputs'.
enum EarlyLeaf {
    /// The input is the leaf.
    Direct,
    /// The input is a transpose, permutation or reshape whose one use is this layer, of the
    /// leaf with this id, whose one use is that view.
    ThroughView(u64),
}

fn early_leaf(t: &Tensor, users: &HashMap<u64, usize>) -> Option<EarlyLeaf> {
    let n = t.node.as_ref()?;
    let only_use = |id: u64| users.get(&id) == Some(&1);
    if !only_use(n.id) {
        return None;
    }
    match &n.op {
        Op::Leaf => Some(EarlyLeaf::Direct),
        Op::Transpose { x, .. } | Op::Permute { x, .. } | Op::Reshape { x } => {
            let leaf = x.node.as_ref()?;
            (matches!(leaf.op, Op::Leaf) && only_use(leaf.id))
                .then_some(EarlyLeaf::ThroughView(leaf.id))
        }
        _ => None,
    }
}

/// Nodes reachable from `root`, each before all nodes it depends on.
fn topological(root: &Arc<Node>) -> Vec<Arc<Node>> {
    let mut seen = std::collections::HashSet::new();
    let mut post = Vec::new();
    // Iterative post-order DFS (graphs of long training loops are deep).
    let mut stack: Vec<(Arc<Node>, bool)> = vec![(root.clone(), false)];
    while let Some((node, expanded)) = stack.pop() {
        if expanded {
            post.push(node);
            continue;
        }
        if !seen.insert(node.id) {
            continue;
        }
        stack.push((node.clone(), true));
        for input in node.op.inputs() {
            if let Some(n) = &input.node {
                if !seen.contains(&n.id) {
                    stack.push((n.clone(), false));
                }
            }
        }
    }
    post.reverse();
    post
}
