//! Training a classifier: [`Trainer`] runs epochs of shuffled minibatches (fused
//! cross-entropy, backward, optimizer step) and evaluations, with the running loss and hit
//! counts kept on the device (one host read per epoch). On CUDA the step is recorded into a
//! CUDA graph after one eager warm-up step and replayed, one launch per step (see
//! [`GraphMode`]). `kiln train` and the `train` benchmark use it; so can any program.

use crate::data::DeviceData;
use crate::optim::Optimizer;
use crate::parallel::DataParallel;
use crate::Module;
use kiln::{AllDims, DType, Device, Error, Generator, Result, Tensor};

/// Data-parallel steps between two bounded waits for the peers (see `train_epoch`).
const WAIT_EVERY_STEPS: usize = 16;

/// What one epoch measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EpochStats {
    /// Full batches taken.
    pub steps: usize,
    /// Mean of the per-batch mean losses.
    pub loss: f64,
    /// Fraction of the training rows seen whose argmax was the label.
    pub accuracy: f64,
    /// Steps that ran as a replay of a recorded CUDA graph.
    pub graph_steps: usize,
    /// The first step (1-based, within the epoch) whose loss was NaN or infinite.
    pub diverged_at_step: Option<usize>,
}

impl EpochStats {
    /// An error when the epoch's training loss is not finite (the run diverged), naming
    /// `epoch` (1-based), the first bad step and what to change. The check costs nothing:
    /// the step was located on the device and read with the epoch's loss.
    ///
    /// ```
    /// use kiln_nn::fit::EpochStats;
    /// let s = EpochStats {
    ///     steps: 10, loss: f64::NAN, accuracy: 0.1, graph_steps: 0, diverged_at_step: Some(4),
    /// };
    /// let e = s.check_finite(3).unwrap_err().to_string();
    /// assert!(e.contains("epoch 3, step 4 of 10"), "{e}");
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn check_finite(&self, epoch: usize) -> Result<()> {
        if self.loss.is_finite() && self.diverged_at_step.is_none() {
            return Ok(());
        }
        let step = match self.diverged_at_step {
            Some(s) => format!(", step {s} of {}", self.steps),
            None => String::new(),
        };
        Err(kiln::Error::Msg(format!(
            "training diverged at epoch {epoch}{step}: the training loss became non-finite \
             (epoch mean {}); lower the learning rate, add normalisation or gradient \
             clipping, or check the data for non-finite values",
            self.loss
        )))
    }
}

/// A running sum of per-step losses kept on the device, with, beside it, how many steps
/// each entry stayed finite: [`DivergenceWatch::read`] returns the sum and the first step
/// whose loss was NaN or infinite with one read of the device, however many steps were
/// observed. Each [`DivergenceWatch::observe`] is two small kernels and no host round
/// trip, so it can sit in every step of a training loop (inside a CUDA graph too).
///
/// ```
/// # use kiln::{DType, Device, Tensor};
/// use kiln_nn::fit::DivergenceWatch;
/// let watch = DivergenceWatch::new(1, &Device::Cpu)?;
/// for loss in [0.9f32, 0.7, f32::INFINITY, 0.5] {
///     watch.observe(&Tensor::from_vec(vec![loss], 1, &Device::Cpu)?)?;
/// }
/// let reading = watch.read()?;
/// assert!(reading.sum.is_infinite());
/// assert_eq!(reading.first_bad_step, Some(3));
/// # Ok::<(), kiln::Error>(())
/// ```
pub struct DivergenceWatch {
    /// The running sum of the observed losses (f32, the loss's shape).
    sum: Tensor,
    /// Per entry, the steps through which `sum` stayed finite (f32: exact to 2^24 steps).
    finite_steps: Tensor,
}

/// What [`DivergenceWatch::read`] found.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WatchReading {
    /// The sum of every observed loss entry.
    pub sum: f64,
    /// The first observation (1-based) at which an entry was NaN or infinite.
    pub first_bad_step: Option<usize>,
}

impl DivergenceWatch {
    /// A watch over losses of `shape` (a scalar loss is `1`, per-row losses `[batch]`),
    /// zeroed, on `device`.
    pub fn new(shape: impl Into<kiln::Shape>, device: &Device) -> Result<DivergenceWatch> {
        let shape = shape.into();
        Ok(DivergenceWatch {
            sum: Tensor::zeros(shape.clone(), DType::F32, device)?,
            finite_steps: Tensor::zeros(shape, DType::F32, device)?,
        })
    }

    /// Adds one step's `loss` (any float dtype, broadcast to the watch's shape) on the device.
    pub fn observe(&self, loss: &Tensor) -> Result<()> {
        self.sum.add_assign(&loss.to_dtype(DType::F32)?)?;
        self.finite_steps.count_finite_assign(&self.sum)
    }

    /// Zeroes the sum and the counts (a new epoch).
    pub fn reset(&self) -> Result<()> {
        self.sum.assign(&self.sum.zeros_like()?)?;
        self.finite_steps.assign(&self.finite_steps.zeros_like()?)
    }

    /// The shape of the losses it watches.
    pub fn dims(&self) -> &[usize] {
        self.sum.dims()
    }

    pub fn device(&self) -> Device {
        self.sum.device()
    }

    /// Combines the watches of every rank of `group` in place: the sums add up, and the
    /// first bad step is the earliest of any rank's.
    pub fn all_reduce(&self, group: &kiln::dist::ProcessGroup) -> Result<()> {
        group.all_reduce(&self.sum, kiln::dist::ReduceOp::Sum)?;
        group.all_reduce(&self.finite_steps, kiln::dist::ReduceOp::Min)
    }

    /// Reads the sum (one device read) and, only when it is not finite, the first bad
    /// step (a second).
    pub fn read(&self) -> Result<WatchReading> {
        let sum = read_sum(&self.sum)?;
        let first_bad_step = if sum.is_finite() {
            None
        } else {
            let before = host_scalar(&self.finite_steps.min(AllDims, false)?)?;
            Some(before as usize + 1)
        };
        Ok(WatchReading {
            sum,
            first_bad_step,
        })
    }
}

/// Whether training and evaluation steps run as CUDA graph replays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum GraphMode {
    /// Graphs on CUDA devices (after one eager warm-up step), eager elsewhere; a model whose
    /// step cannot be recorded (an op that needs the host) trains eagerly, with a warning on
    /// standard error. Dropout records: its masks are drawn on the device.
    #[default]
    Auto,
    /// Graphs, or an error where they cannot be used.
    On,
    /// Every step eager.
    Off,
}

impl std::str::FromStr for GraphMode {
    type Err = Error;

    /// Parses `auto`, `on` or `off`.
    fn from_str(s: &str) -> Result<GraphMode> {
        match s {
            "auto" => Ok(GraphMode::Auto),
            "on" => Ok(GraphMode::On),
            "off" => Ok(GraphMode::Off),
            _ => Err(Error::Msg(format!(
                "unknown graph mode '{s}': expected auto, on or off"
            ))),
        }
    }
}

/// How a [`Trainer`] trains.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TrainOptions {
    /// Rows per training step (an epoch takes the full batches of a shuffled pass).
    pub batch: usize,
    /// Label smoothing of the cross-entropy, in `[0, 1)`.
    pub label_smoothing: f64,
    pub graph: GraphMode,
    /// Training steps one recorded CUDA graph holds: a replay runs that many steps, after
    /// one copy of their rows' ids (an epoch of 234 steps: 48 launches instead of 468).
    /// The epoch's last steps that do not fill a group replay a one-step graph. 1: one graph
    /// per step. Data-parallel training records one step per graph.
    pub steps_per_graph: usize,
    /// Rows per evaluation step.
    pub eval_batch: usize,
}

impl Default for TrainOptions {
    fn default() -> Self {
        TrainOptions {
            batch: 256,
            label_smoothing: 0.0,
            graph: GraphMode::Auto,
            steps_per_graph: 16,
            eval_batch: 1024,
        }
    }
}

/// A recorded step and the tensors it reads: the dataset (kept alive by holding it here)
/// and the static inputs written before each replay.
#[cfg(feature = "cuda")]
struct Recorded {
    graph: kiln::cuda::Graph,
    /// What the graph was recorded for: the dataset's tensors (train) or nothing (eval).
    data: Option<(Tensor, Tensor)>,
    inputs: Vec<Tensor>,
}

#[cfg(feature = "cuda")]
impl Recorded {
    fn serves(&self, data: &DeviceData) -> bool {
        self.data
            .as_ref()
            .is_some_and(|(x, y)| x.same_storage(&data.x) && y.same_storage(&data.y))
    }
}

/// Trains a classifier `model` with `optimizer` on [`DeviceData`].
///
/// ```
/// use kiln::{DType, Device, Generator, Tensor};
/// use kiln_nn::{data::DeviceData, fit::{TrainOptions, Trainer}, init::Init, optim::Sgd, Linear, Module};
/// let mut rng = Generator::new(0);
/// let x = Tensor::randn([64, 4], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng)?;
/// // Labels: which of the first two features is larger.
/// let y = x.narrow(1, 0, 1)?.gt(&x.narrow(1, 1, 1)?)?.to_dtype(DType::I64)?.flatten_all()?;
/// let data = DeviceData { x, y };
/// let model = Linear::new(4, 2, true, Init::XavierUniform, DType::F32, &Device::Cpu, &mut rng)?;
/// let opt = Sgd::new(model.named_parameters(), 0.5, 0.9, false, 0.0)?;
/// let options = TrainOptions { batch: 16, ..TrainOptions::default() };
/// let mut trainer = Trainer::new(Box::new(model), Box::new(opt), options)?;
/// let mut last = None;
/// for _ in 0..20 {
///     last = Some(trainer.train_epoch(&data, &mut rng, |_| {})?);
/// }
/// assert!(last.unwrap().accuracy > 0.9);
/// assert!(trainer.evaluate(&data)? > 0.9);
/// # Ok::<(), kiln::Error>(())
/// ```
pub struct Trainer {
    model: Box<dyn Module>,
    optimizer: Box<dyn Optimizer>,
    options: TrainOptions,
    /// The epoch's per-row losses (with the first non-finite step) and hits (`[batch]`,
    /// on the device).
    sums: Option<(DivergenceWatch, Tensor)>,
    /// Eager steps taken so far (the first one warms up kernels and GEMM plans).
    eager_steps: usize,
    /// Set when a graph could not be recorded in `Auto` mode: train eagerly from then on.
    graph_failed: bool,
    /// Set for data-parallel training (see [`Trainer::data_parallel`]).
    parallel: Option<DataParallel>,
    #[cfg(feature = "cuda")]
    step_graph: Option<Recorded>,
    /// `options.steps_per_graph` steps in one graph.
    #[cfg(feature = "cuda")]
    steps_graph: Option<Recorded>,
    #[cfg(feature = "cuda")]
    eval_graph: Option<Recorded>,
}

impl Trainer {
    /// Also asks the C allocator to keep freed blocks for reuse
    /// ([`kiln::retain_freed_host_memory`], process-wide): a CPU training step allocates a
    /// dozen buffers of 100 KiB and more, which would otherwise be fresh, page-faulting
    /// memory every step.
    ///
    /// # Errors
    /// A batch size or steps per graph of zero, or a label smoothing outside `[0, 1)`.
    pub fn new(
        model: Box<dyn Module>,
        optimizer: Box<dyn Optimizer>,
        options: TrainOptions,
    ) -> Result<Trainer> {
        if options.batch == 0 || options.eval_batch == 0 || options.steps_per_graph == 0 {
            return Err(Error::Msg(format!(
                "Trainer: batch = {}, eval_batch = {} and steps_per_graph = {} must be at least 1",
                options.batch, options.eval_batch, options.steps_per_graph
            )));
        }
        if !(0.0..1.0).contains(&options.label_smoothing) {
            return Err(Error::Msg(format!(
                "Trainer: label_smoothing = {} is out of range: [0, 1)",
                options.label_smoothing
            )));
        }
        kiln::retain_freed_host_memory();
        Ok(Trainer {
            model,
            optimizer,
            options,
            sums: None,
            eager_steps: 0,
            graph_failed: false,
            parallel: None,
            #[cfg(feature = "cuda")]
            step_graph: None,
            #[cfg(feature = "cuda")]
            steps_graph: None,
            #[cfg(feature = "cuda")]
            eval_graph: None,
        })
    }

    /// Trains as one rank of `group` (data parallel): the model's parameters and buffers
    /// are broadcast from rank 0 now; each step then takes this rank's `batch / world`
    /// rows of the global batch of `options.batch` rows (every rank must shuffle with the
    /// same seed), and the gradients are summed across ranks in buckets of about
    /// `bucket_bytes` before the optimizer step, so every rank takes the step one device
    /// would take on the global batch. Epoch statistics are combined across ranks.
    ///
    /// # Errors
    /// A global batch that does not split evenly over the ranks; a failed broadcast.
    pub fn data_parallel(
        mut self,
        group: kiln::dist::ProcessGroup,
        bucket_bytes: usize,
    ) -> Result<Trainer> {
        let world = group.world_size();
        if !self.options.batch.is_multiple_of(world) {
            return Err(Error::Msg(format!(
                "Trainer: the global batch of {} rows does not split evenly over {world} ranks",
                self.options.batch
            )));
        }
        self.parallel = Some(DataParallel::new(
            group,
            self.model.as_ref(),
            kiln::dist::ReduceOp::Sum,
            bucket_bytes,
        )?);
        Ok(self)
    }

    /// The process group of a data-parallel trainer.
    pub fn group(&self) -> Option<&kiln::dist::ProcessGroup> {
        self.parallel.as_ref().map(DataParallel::group)
    }

    pub fn model(&self) -> &dyn Module {
        self.model.as_ref()
    }

    pub fn optimizer(&self) -> &dyn Optimizer {
        self.optimizer.as_ref()
    }

    pub fn optimizer_mut(&mut self) -> &mut dyn Optimizer {
        self.optimizer.as_mut()
    }

    pub fn options(&self) -> &TrainOptions {
        &self.options
    }

    /// Sets the learning rate of the following steps (recorded steps follow it too).
    pub fn set_lr(&mut self, lr: f64) -> Result<()> {
        self.optimizer.set_lr(lr)
    }

    /// Whether steps on `device` are to run as graph replays.
    fn wants_graph(&self, device: Device) -> Result<bool> {
        match self.options.graph {
            GraphMode::Off => Ok(false),
            GraphMode::Auto => Ok(device.is_cuda() && cfg!(feature = "cuda") && !self.graph_failed),
            GraphMode::On if device.is_cuda() && cfg!(feature = "cuda") => Ok(true),
            GraphMode::On => Err(Error::Msg(format!(
                "--graph on: CUDA graphs need a CUDA device, and this run is on {device}"
            ))),
        }
    }

    /// One pass over `data` in batches shuffled by `rng` (full batches only), calling
    /// `on_step(step)` after each step. Returns after the device has finished the epoch.
    pub fn train_epoch(
        &mut self,
        data: &DeviceData,
        rng: &mut Generator,
        mut on_step: impl FnMut(usize),
    ) -> Result<EpochStats> {
        let batch = self.options.batch;
        data.check_batch("Trainer::train_epoch", batch)?;
        let n = data.len();
        let device = data.x.device();
        // This rank's rows of each global batch.
        let (rank, world) = match self.group() {
            Some(g) if g.device() != device => {
                return Err(Error::Msg(format!(
                    "Trainer::train_epoch: the data is on {device}, rank {} of the group on {}",
                    g.rank(),
                    g.device()
                )))
            }
            Some(g) => (g.rank(), g.world_size()),
            None => (0, 1),
        };
        let local = batch / world;
        let mut perm: Vec<i64> = (0..n as i64).collect();
        rng.shuffle(&mut perm);
        let ids = Tensor::from_vec(perm, n, &device)?;
        self.model.set_training(true);
        self.reset_sums(local, &device)?;
        let use_graph = self.wants_graph(device)?;
        let steps = n / batch;
        // Groups of steps in one graph: single-device training only (a data-parallel step
        // waits on its peers every few steps).
        let group = if world == 1 {
            self.options.steps_per_graph
        } else {
            1
        };
        let mut graph_steps = 0;
        let mut s = 0;
        while s < steps {
            if use_graph && group > 1 && s + group <= steps {
                let take = ids.narrow(0, s * batch, group * batch)?;
                if self.replay_steps(data, &take, group)? {
                    graph_steps += group;
                    for step in s..s + group {
                        on_step(step);
                    }
                    s += group;
                    continue;
                }
            }
            let take = ids.narrow(0, s * batch + rank * local, local)?;
            if use_graph && self.replay_steps(data, &take, 1)? {
                graph_steps += 1;
            } else {
                self.step(data, &take)?;
                self.eager_steps += 1;
            }
            on_step(s);
            s += 1;
            // Data parallel: a bounded wait every few steps, so that a failed peer is an
            // error within the collective timeout before the launch queue fills and the host
            // blocks in a launch that cannot return.
            if let Some(g) = self.group() {
                if (s + 1) % WAIT_EVERY_STEPS == 0 {
                    g.wait()?;
                }
            }
        }
        if let Some(dp) = &self.parallel {
            dp.sync_buffers(self.model.as_ref())?;
        }
        let (losses, hit_sum) = self.sums.as_ref().expect("made by reset_sums");
        if let Some(g) = self.group() {
            losses.all_reduce(g)?;
            g.all_reduce(hit_sum, kiln::dist::ReduceOp::Sum)?;
            // A bounded wait: a failed peer is an error here, not a hang in the read.
            g.wait()?;
        }
        let steps_f = steps.max(1) as f64;
        let reading = losses.read()?;
        Ok(EpochStats {
            steps,
            loss: reading.sum / steps_f,
            accuracy: read_sum(hit_sum)? / (steps_f * batch as f64),
            graph_steps,
            diverged_at_step: reading.first_bad_step,
        })
    }

    /// Zeroes the running sums (made on first use, outside any capture).
    fn reset_sums(&mut self, batch: usize, device: &Device) -> Result<()> {
        let fresh = match &self.sums {
            Some((l, _)) => l.dims() != [batch] || l.device() != *device,
            None => true,
        };
        if fresh {
            self.sums = Some((
                DivergenceWatch::new(batch, device)?,
                Tensor::zeros(batch, DType::F32, device)?,
            ));
            #[cfg(feature = "cuda")]
            {
                // A recorded step adds into the old sums.
                self.step_graph = None;
                self.steps_graph = None;
            }
        } else if let Some((l, h)) = &self.sums {
            l.reset()?;
            h.assign(&h.zeros_like()?)?;
        }
        Ok(())
    }

    /// One training step on the rows `take` of `data`: gather the batch, forward, fused
    /// cross-entropy (loss, gradient, hits and the running sums in one kernel on CUDA),
    /// backward seeded with its gradient, optimizer step. The same ops eager and recorded.
    fn step(&mut self, data: &DeviceData, take: &Tensor) -> Result<()> {
        let x = data.x.index_select(take, 0)?;
        let y = data.y.index_select(take, 0)?;
        let logits = self.model.forward(&x)?;
        let scale = 1.0 / self.options.batch as f64;
        let (losses, hit_sum) = self.sums.as_ref().expect("made by reset_sums");
        // The running sums are updated by the cross-entropy kernel itself (CUDA), or by
        // the same ops right after it.
        let sums = kiln::EpochSums {
            loss: &losses.sum,
            finite_steps: &losses.finite_steps,
            hits: hit_sum,
        };
        let rows = logits.detach().softmax_cross_entropy_accumulate(
            &y,
            self.options.label_smoothing,
            scale,
            sums,
        )?;
        let grads = match &self.parallel {
            Some(dp) => dp.backward(&logits, &rows.grad)?,
            None => logits.backward_with(&rows.grad)?,
        };
        self.optimizer.step(&grads)
    }

    /// Runs `steps` training steps on the rows `take` (each step's ids back to back) as one
    /// graph replay: the one-step graph, or the group graph of `options.steps_per_graph`
    /// steps, recorded first when needed. Returns `false` where the steps are to run eagerly
    /// instead (the warm-up step, or `Auto` mode after a failed recording).
    #[cfg(feature = "cuda")]
    fn replay_steps(&mut self, data: &DeviceData, take: &Tensor, steps: usize) -> Result<bool> {
        if self.eager_steps == 0 || self.graph_failed {
            return Ok(false);
        }
        let mut recorded = self.train_graph(steps).take().filter(|r| r.serves(data));
        if recorded.is_none() {
            let ids = take.copy()?;
            let rows = take.dims()[0] / steps;
            let capture = kiln::cuda::Graph::capture(&data.x.device(), || {
                for k in 0..steps {
                    self.step(data, &ids.narrow(0, k * rows, rows)?)?;
                }
                Ok(())
            });
            match capture {
                Ok((graph, ())) => {
                    recorded = Some(Recorded {
                        graph,
                        data: Some((data.x.clone(), data.y.clone())),
                        inputs: vec![ids],
                    })
                }
                Err(e) => return self.graph_failure(e),
            }
        }
        let r = recorded.expect("recorded above");
        let replayed = r.inputs[0].assign(take).and_then(|()| r.graph.replay());
        *self.train_graph(steps) = Some(r);
        replayed.map(|()| true)
    }

    /// The recorded graph of one training step, or of a group of `steps`.
    #[cfg(feature = "cuda")]
    fn train_graph(&mut self, steps: usize) -> &mut Option<Recorded> {
        if steps == 1 {
            &mut self.step_graph
        } else {
            &mut self.steps_graph
        }
    }

    #[cfg(not(feature = "cuda"))]
    fn replay_steps(&mut self, _data: &DeviceData, _take: &Tensor, _steps: usize) -> Result<bool> {
        Ok(false)
    }

    /// In `Auto` mode a step that cannot be recorded trains eagerly (said once on standard
    /// error); in `On` mode it is an error.
    #[cfg(feature = "cuda")]
    fn graph_failure(&mut self, e: Error) -> Result<bool> {
        if self.options.graph == GraphMode::On {
            return Err(Error::Msg(format!(
                "--graph on: the step cannot be recorded as a CUDA graph: {e}"
            )));
        }
        eprintln!("warning: training eagerly: the step cannot be recorded as a CUDA graph: {e}");
        self.graph_failed = true;
        Ok(false)
    }

    /// Accuracy of the model on `data` in evaluation mode without gradients (batches of
    /// `eval_batch` rows in order; full batches replay a recorded graph on CUDA). The model
    /// is left in training mode.
    pub fn evaluate(&mut self, data: &DeviceData) -> Result<f64> {
        self.model.set_training(false);
        let r = kiln::no_grad(|| self.evaluate_inner(data));
        self.model.set_training(true);
        r
    }

    fn evaluate_inner(&mut self, data: &DeviceData) -> Result<f64> {
        let device = data.x.device();
        let hits = Tensor::zeros(1, DType::F32, &device)?;
        let use_graph = self.wants_graph(device)?;
        let eval_batch = self.options.eval_batch;
        for (x, y) in data.batches(eval_batch)? {
            if !(use_graph && x.dims()[0] == eval_batch && self.replay_eval(&x, &y, &hits)?) {
                hits.add_assign(&self.eval_hits(&x, &y)?)?;
            }
        }
        Ok(read_sum(&hits)? / data.len().max(1) as f64)
    }

    /// How many rows of `x` the model classifies as `y`, as a `[1]` f32 tensor.
    fn eval_hits(&self, x: &Tensor, y: &Tensor) -> Result<Tensor> {
        self.model
            .forward(x)?
            .argmax(1, false)?
            .eq(y)?
            .to_dtype(DType::F32)?
            .sum(AllDims, true)
    }

    #[cfg(feature = "cuda")]
    fn replay_eval(&mut self, x: &Tensor, y: &Tensor, hits: &Tensor) -> Result<bool> {
        if self.eval_graph.is_none() {
            // Run once eagerly first (kernels, GEMM plans), then record.
            self.eval_hits(x, y)?;
            let (xs, ys) = (x.copy()?, y.copy()?);
            let recorded = kiln::cuda::Graph::capture(&x.device(), || self.eval_hits(&xs, &ys));
            match recorded {
                Ok((graph, out)) => {
                    self.eval_graph = Some(Recorded {
                        graph,
                        data: None,
                        inputs: vec![xs, ys, out],
                    })
                }
                Err(e) => return self.graph_failure(e),
            }
        }
        let r = self.eval_graph.as_ref().expect("recorded above");
        if r.inputs[0].dims() != x.dims() {
            return Ok(false);
        }
        r.inputs[0].assign(x)?;
        r.inputs[1].assign(y)?;
        r.graph.replay()?;
        hits.add_assign(&r.inputs[2])?;
        Ok(true)
    }

    #[cfg(not(feature = "cuda"))]
    fn replay_eval(&mut self, _x: &Tensor, _y: &Tensor, _hits: &Tensor) -> Result<bool> {
        Ok(false)
    }

    /// Kernel nodes of the recorded training step, if one was recorded.
    pub fn recorded_step_kernels(&self) -> Option<usize> {
        self.recorded_step_kernel_names().map(|k| k.len())
    }

    /// The function names of the recorded training step's kernels, if one was recorded.
    pub fn recorded_step_kernel_names(&self) -> Option<Vec<String>> {
        #[cfg(feature = "cuda")]
        {
            if let Some(r) = &self.step_graph {
                return Some(r.graph.kernel_names().to_vec());
            }
            // The first of the group's steps.
            self.steps_graph.as_ref().map(|r| {
                let names = r.graph.kernel_names();
                names[..names.len() / self.options.steps_per_graph].to_vec()
            })
        }
        #[cfg(not(feature = "cuda"))]
        {
            None
        }
    }

    /// Drops recorded graphs (they are recorded again when needed), e.g. after replacing
    /// parameters' storage.
    pub fn forget_graphs(&mut self) {
        #[cfg(feature = "cuda")]
        {
            self.step_graph = None;
            self.steps_graph = None;
            self.eval_graph = None;
        }
    }
}

/// The sum of all elements of `t`, read on the host.
fn read_sum(t: &Tensor) -> Result<f64> {
    host_scalar(&t.sum(AllDims, false)?)
}

/// A one-element tensor's value, read on the host as f64.
fn host_scalar(t: &Tensor) -> Result<f64> {
    t.to_device(&Device::Cpu)?
        .to_dtype(DType::F64)?
        .to_scalar::<f64>()
}
