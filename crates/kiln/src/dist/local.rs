//! The host-memory exchange behind groups whose ranks are threads of one process on devices
//! without NCCL: each collective hands every rank a snapshot of every rank's tensor, and each
//! rank computes its result from them in rank order (so every rank gets identical bits).

use super::ReduceOp;
use crate::{Device, Error, Result, Tensor};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The meeting point of the ranks of one group.
///
/// Invariant: `slots[r]` is `Some` exactly for the ranks that arrived in round `round`;
/// `result` holds the snapshots of round `round - 1`, which every rank reads before it can
/// arrive in round `round` (so a round's result is never overwritten while a rank of that
/// round still waits for it).
pub(crate) struct Exchange {
    world: usize,
    /// Milliseconds a rank waits for the others (the last `set_timeout` of any rank).
    timeout_ms: AtomicU64,
    state: Mutex<State>,
    changed: Condvar,
}

struct State {
    round: u64,
    /// What each rank arrived with, and the op it called (to catch mismatched calls).
    slots: Vec<Option<(Tensor, &'static str)>>,
    result: Arc<Vec<Tensor>>,
    /// Ranks whose group was dropped.
    left: Vec<bool>,
}

impl Exchange {
    pub(crate) fn new(world: usize, timeout: Duration) -> Exchange {
        Exchange {
            world,
            timeout_ms: AtomicU64::new(timeout.as_millis() as u64),
            state: Mutex::new(State {
                round: 0,
                slots: vec![None; world],
                result: Arc::new(Vec::new()),
                left: vec![false; world],
            }),
            changed: Condvar::new(),
        }
    }

    pub(crate) fn set_timeout(&self, timeout: Duration) {
        self.timeout_ms
            .store(timeout.as_millis() as u64, Ordering::Relaxed);
    }

    /// Records that `rank` left: ranks waiting for it fail instead of waiting forever.
    pub(crate) fn leave(&self, rank: usize) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.left[rank] = true;
        self.changed.notify_all();
    }

    /// Contributes a snapshot of `t` as `rank` and returns every rank's snapshot once all
    /// have arrived.
    pub(crate) fn exchange(
        &self,
        rank: usize,
        op: &'static str,
        t: &Tensor,
    ) -> Result<Arc<Vec<Tensor>>> {
        // A copy, so that a rank writing its result cannot change what a slower rank reads.
        let snapshot = if t.device() == Device::Cpu {
            t.copy()?
        } else {
            t.to_device(&Device::Cpu)?
        };
        let fail = |reason: String| Error::Collective {
            op: format!("{op} (rank {rank} of {}, threads)", self.world),
            reason,
        };
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let round = s.round;
        s.slots[rank] = Some((snapshot, op));
        if s.slots.iter().all(Option::is_some) {
            let arrived: Vec<(Tensor, &'static str)> = s
                .slots
                .iter_mut()
                .map(|x| x.take().expect("all arrived"))
                .collect();
            s.round += 1;
            self.changed.notify_all();
            let first = &arrived[0];
            for (r, (t, o)) in arrived.iter().enumerate() {
                if *o != first.1 || t.shape() != first.0.shape() || t.dtype() != first.0.dtype() {
                    let e = fail(format!(
                        "ranks disagree: rank 0 called {} with {} {}, rank {r} called {o} with {} {}",
                        first.1,
                        first.0.shape(),
                        first.0.dtype(),
                        t.shape(),
                        t.dtype()
                    ));
                    s.result = Arc::new(Vec::new());
                    return Err(e);
                }
            }
            s.result = Arc::new(arrived.into_iter().map(|(t, _)| t).collect());
            return Ok(s.result.clone());
        }
        let timeout = Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed));
        let deadline = Instant::now() + timeout;
        loop {
            if s.round != round {
                if s.result.len() != self.world {
                    return Err(fail("the ranks called mismatched collectives".into()));
                }
                return Ok(s.result.clone());
            }
            let missing: Vec<usize> = (0..self.world).filter(|&r| s.slots[r].is_none()).collect();
            if let Some(r) = missing.iter().find(|&&r| s.left[r]) {
                s.slots[rank] = None;
                return Err(fail(format!(
                    "rank {r} left the group (its thread ended or failed) before joining this \
                     collective"
                )));
            }
            let now = Instant::now();
            if now >= deadline {
                s.slots[rank] = None;
                return Err(fail(format!(
                    "ranks {missing:?} did not arrive within {:.0} s (KILN_COLLECTIVE_TIMEOUT \
                     sets the limit in seconds)",
                    timeout.as_secs_f64()
                )));
            }
            s = self
                .changed
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// `all` combined with `op`, in rank order (on the CPU).
pub(crate) fn reduce(all: &[Tensor], op: ReduceOp) -> Result<Tensor> {
    let mut acc = all[0].clone();
    for t in &all[1..] {
        acc = match op {
            ReduceOp::Sum | ReduceOp::Mean => acc.add(t)?,
            ReduceOp::Max => acc.maximum(t)?,
            ReduceOp::Min => acc.minimum(t)?,
        };
    }
    if op == ReduceOp::Mean {
        acc = acc.mul_scalar(1.0 / all.len() as f64)?;
    }
    Ok(acc)
}
