//! Collectives of process groups against f64 references, on groups of threads: over host
//! memory (CPU, wgpu, mixed devices), over NCCL on one GPU (a real one-rank communicator)
//! and on two GPUs when the machine has them (`KILN_REQUIRE_GPUS=2` makes a missing second
//! GPU a failure), plus one process per GPU meeting over TCP, and failures: a rank that
//! leaves or dies, mismatched calls, nonsense arguments.

mod common;

use common::*;
use kiln::dist::{ProcessGroup, ReduceOp, Rendezvous};
use kiln::{DType, Device, Generator, Tensor};
use std::time::Duration;

/// The tests of this binary run one at a time: two tests driving collectives on the same
/// pair of GPUs at once can deadlock (each device has one stream, so one test's collective
/// can wait behind the other's on one GPU while the reverse holds on the other), and a graph
/// capture on a device refuses other threads' ops.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn cuda_count() -> usize {
    #[cfg(feature = "cuda")]
    {
        kiln::cuda::device_count()
    }
    #[cfg(not(feature = "cuda"))]
    {
        0
    }
}

/// Whether NCCL loads; with `KILN_REQUIRE_NCCL=1` its absence fails the test.
fn nccl_ready() -> bool {
    let status = kiln::dist::nccl_status();
    let ok = status.starts_with("NCCL ");
    if !ok && std::env::var("KILN_REQUIRE_NCCL").is_ok_and(|v| v == "1") {
        panic!("KILN_REQUIRE_NCCL=1 but NCCL is {status}");
    }
    ok
}

/// The groups of devices the collectives are checked on.
fn device_groups() -> Vec<Vec<Device>> {
    let mut groups = vec![vec![Device::Cpu; 2], vec![Device::Cpu; 3]];
    let devs = devices();
    if devs.contains(&Device::Wgpu(0)) {
        groups.push(vec![Device::Wgpu(0), Device::Cpu]);
    }
    if devs.contains(&Device::Cuda(0)) {
        groups.push(vec![Device::Cuda(0), Device::Cpu]); // host-memory exchange
        if nccl_ready() {
            groups.push(vec![Device::Cuda(0)]); // NCCL, one rank
        }
    }
    let want: usize = std::env::var("KILN_REQUIRE_GPUS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let have = cuda_count();
    assert!(
        have >= want,
        "KILN_REQUIRE_GPUS={want} but {have} CUDA devices work"
    );
    if have >= 2 && nccl_ready() {
        groups.push(vec![Device::Cuda(0), Device::Cuda(1)]);
    }
    groups
}

/// Runs `f(group)` on a thread per rank; returns each rank's result in rank order.
fn on_ranks<R: Send>(devices: &[Device], f: impl Fn(ProcessGroup) -> R + Sync) -> Vec<R> {
    let groups = ProcessGroup::for_threads(devices).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = groups.into_iter().map(|g| s.spawn(|| f(g))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn reduce_ref(per_rank: &[Vec<f64>], op: ReduceOp, dtype: DType) -> Vec<f64> {
    (0..per_rank[0].len())
        .map(|i| {
            let col = per_rank.iter().map(|v| v[i]);
            let v = match op {
                ReduceOp::Sum => col.sum(),
                ReduceOp::Mean => col.sum::<f64>() / per_rank.len() as f64,
                ReduceOp::Max => col.fold(f64::NEG_INFINITY, f64::max),
                ReduceOp::Min => col.fold(f64::INFINITY, f64::min),
            };
            round_to(v, dtype)
        })
        .collect()
}

#[test]
fn collectives_match_reference() {
    let _serial = serial();
    for devices in device_groups() {
        let world = devices.len();
        for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64] {
            if !devices.iter().all(|d| supports(d, dtype)) {
                continue;
            }
            // Each rank's values (small integers for I64, so sums stay exact).
            let mut rng = Generator::new(17 + dtype as u64);
            let vals: Vec<Vec<f64>> = (0..world)
                .map(|_| random_vals(&mut rng, 24, dtype, Range::Signed))
                .collect();
            let ctx = format!("{devices:?} {dtype}");
            let tolerance = tol(dtype) * 4.0;
            let ops: &[ReduceOp] = if dtype.is_float() {
                &[ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min]
            } else {
                &[ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min]
            };
            on_ranks(&devices, |g| {
                let r = g.rank();
                let dev = g.device();
                let mine = |shape: &[usize]| tensor_of(&vals[r], shape, dtype, &dev);
                for &op in ops {
                    let t = mine(&[4, 6]);
                    g.all_reduce(&t, op).unwrap();
                    let want = reduce_ref(&vals, op, dtype);
                    assert_close(
                        &format!("{ctx} all_reduce {op:?} rank {r}"),
                        &values(&t),
                        &want,
                        tolerance,
                    );
                }
                // A transposed view is reduced in place through its layout.
                let base = mine(&[4, 6]);
                let view = base.t().unwrap();
                g.all_reduce(&view, ReduceOp::Sum).unwrap();
                assert_close(
                    &format!("{ctx} all_reduce of a transposed view, rank {r}"),
                    &values(&base),
                    &reduce_ref(&vals, ReduceOp::Sum, dtype),
                    tolerance,
                );
                // Broadcast from the last rank.
                let t = mine(&[24]);
                g.broadcast(&t, world - 1).unwrap();
                assert_close(
                    &format!("{ctx} broadcast rank {r}"),
                    &values(&t),
                    &vals[world - 1],
                    0.0,
                );
                // All-gather of a narrowed view: every rank's rows 1..3, in rank order.
                let t = mine(&[4, 6]).narrow(0, 1, 2).unwrap();
                let got = g.all_gather(&t).unwrap();
                assert_eq!(got.dims(), &[2 * world, 6]);
                let want: Vec<f64> = vals.iter().flat_map(|v| v[6..18].to_vec()).collect();
                assert_close(
                    &format!("{ctx} all_gather rank {r}"),
                    &values(&got),
                    &want,
                    0.0,
                );
                // Reduce-scatter: rank r gets rows [r·k, (r+1)·k) of the sum.
                let rows = 24 / 3;
                if rows % world == 0 {
                    let t = mine(&[rows, 3]);
                    let got = g.reduce_scatter(&t, ReduceOp::Sum).unwrap();
                    let k = rows / world;
                    assert_eq!(got.dims(), &[k, 3]);
                    let sum = reduce_ref(&vals, ReduceOp::Sum, dtype);
                    assert_close(
                        &format!("{ctx} reduce_scatter rank {r}"),
                        &values(&got),
                        &sum[r * k * 3..(r + 1) * k * 3],
                        tolerance,
                    );
                }
                g.barrier().unwrap();
            });
        }
    }
}

#[test]
fn a_rank_that_leaves_or_disagrees_is_an_error() {
    let _serial = serial();
    // Rank 1 leaves (its group is dropped) without joining: rank 0 fails, it does not hang.
    let results = on_ranks(&[Device::Cpu, Device::Cpu], |g| {
        if g.rank() == 1 {
            drop(g);
            return Ok(());
        }
        let t = Tensor::ones(3, DType::F32, &Device::Cpu).unwrap();
        g.all_reduce(&t, ReduceOp::Sum)
    });
    let e = results[0].as_ref().unwrap_err().to_string();
    assert!(
        e.contains("rank 1 left the group") && e.contains("all_reduce"),
        "{e}"
    );
    // Mismatched shapes: every rank gets an error naming both calls.
    let results = on_ranks(&[Device::Cpu, Device::Cpu], |g| {
        let t = Tensor::ones(3 + g.rank(), DType::F32, &Device::Cpu).unwrap();
        g.all_reduce(&t, ReduceOp::Sum)
    });
    for r in &results {
        assert!(r.is_err(), "{results:?}");
    }
    let e = results
        .iter()
        .find_map(|r| r.as_ref().err())
        .unwrap()
        .to_string();
    assert!(e.contains("disagree") || e.contains("mismatched"), "{e}");
}

#[test]
fn nonsense_arguments_are_refused() {
    let _serial = serial();
    let e = ProcessGroup::for_threads(&[]).unwrap_err().to_string();
    assert!(e.contains("no devices"), "{e}");
    let e = ProcessGroup::for_threads(&[Device::Cuda(0), Device::Cuda(0)])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("listed twice") || e.contains("not available"),
        "{e}"
    );
    let rv = Rendezvous::Tcp {
        addr: "127.0.0.1".into(),
        port: 1,
        timeout: Duration::from_millis(10),
    };
    let e = ProcessGroup::join(&Device::Cpu, 2, 2, &rv)
        .unwrap_err()
        .to_string();
    assert!(e.contains("rank 2 is out of range"), "{e}");
    let e = ProcessGroup::join(&Device::Cpu, 0, 2, &rv)
        .unwrap_err()
        .to_string();
    assert!(e.contains("need CUDA devices"), "{e}");
    // A group of one exchanges nothing, on any device.
    let g = ProcessGroup::join(&Device::Cpu, 0, 1, &rv).unwrap();
    assert_eq!(
        (g.rank(), g.world_size(), g.backend_name()),
        (0, 1, "single")
    );
    let t = Tensor::from_vec(vec![1f32, 2.], 2, &Device::Cpu).unwrap();
    g.all_reduce(&t, ReduceOp::Sum).unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), [1., 2.]);
    let e = g.broadcast(&t, 1).unwrap_err().to_string();
    assert!(e.contains("root rank 1 is out of range"), "{e}");
    let e = g
        .reduce_scatter(
            &Tensor::ones([3], DType::F32, &Device::Cpu).unwrap(),
            ReduceOp::Mean,
        )
        .map(|_| ())
        .and_then(|()| {
            g.all_reduce(
                &Tensor::ones([3], DType::I64, &Device::Cpu).unwrap(),
                ReduceOp::Mean,
            )
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("Mean") && e.contains("i64"), "{e}");
    // The status line says what is missing, or which NCCL is used.
    let status = kiln::dist::nccl_status();
    assert!(status.contains("NCCL"), "{status}");
}

/// A step with a collective records into a CUDA graph; replays see fresh inputs. On one GPU
/// (a one-rank communicator) and, with two, on both. The group is dropped before the graph:
/// NCCL destroys a communicator only after the graphs that recorded it, so the graph keeps it
/// alive (before it did, this drop hung on two GPUs).
#[cfg(feature = "cuda")]
#[test]
fn nccl_collectives_record_into_graphs() {
    let _serial = serial();
    if !devices().contains(&Device::Cuda(0)) || !nccl_ready() {
        return;
    }
    let mut groups = vec![vec![Device::Cuda(0)]];
    if cuda_count() >= 2 {
        groups.push(vec![Device::Cuda(0), Device::Cuda(1)]);
    }
    for devices in groups {
        let world = devices.len() as f32;
        on_ranks(&devices, |g| {
            assert_eq!(g.backend_name(), "nccl");
            let dev = g.device();
            let rank = g.rank() as f32;
            let x = Tensor::from_vec(vec![1f32, 2., 3.], 3, &dev).unwrap();
            let step = || -> kiln::Result<Tensor> {
                let y = x.mul_scalar(2.0)?;
                let pending = g.all_reduce_start(std::slice::from_ref(&y), ReduceOp::Sum)?;
                pending.wait()?;
                y.add_scalar(1.0)
            };
            step().unwrap(); // kernels compiled before the capture
            let (graph, y) = kiln::cuda::Graph::capture(&dev, step).unwrap();
            for k in 0..3 {
                let k = k as f32;
                x.assign(&Tensor::from_vec(vec![k + rank, 10.0, -1.0], 3, &dev).unwrap())
                    .unwrap();
                graph.replay().unwrap();
                g.wait().unwrap();
                // Σ over ranks of 2·(k + r), etc.
                let sum_r = world * (world - 1.0) / 2.0;
                assert_eq!(
                    y.to_vec::<f32>().unwrap(),
                    [
                        2.0 * (world * k + sum_r) + 1.0,
                        20.0 * world + 1.0,
                        -2.0 * world + 1.0
                    ],
                    "{devices:?} rank {rank} replay {k}"
                );
            }
            drop(g);
            drop(graph);
        });
    }
}

/// With two GPUs in one process: a rank that stops (its thread ends) makes the other's next
/// collective fail at its wait, within the timeout, instead of hanging.
#[test]
fn a_stopped_gpu_rank_fails_its_peer_within_the_timeout() {
    let _serial = serial();
    if cuda_count() < 2 || !nccl_ready() {
        return;
    }
    let results = on_ranks(&[Device::Cuda(0), Device::Cuda(1)], |mut g| {
        g.set_timeout(Duration::from_secs(15));
        let t = Tensor::ones(1 << 20, DType::F32, &g.device()).unwrap();
        g.all_reduce(&t, ReduceOp::Sum).unwrap();
        g.wait().unwrap();
        if g.rank() == 1 {
            return Ok(Duration::ZERO); // leaves: its communicator is destroyed
        }
        let start = std::time::Instant::now();
        g.all_reduce(&t, ReduceOp::Sum)
            .and_then(|()| g.wait())
            .map(|()| start.elapsed())
            .map_err(|e| (e.to_string(), start.elapsed()))
    });
    let (e, took) = results[0].clone().unwrap_err();
    assert!(e.contains("rank 0 of 2"), "{e}");
    assert!(took < Duration::from_secs(60), "took {took:?}: {e}");
}

/// With two GPUs: one process per GPU meeting over TCP (`RANK`, `WORLD_SIZE`, `MASTER_*`),
/// and a rank that dies after joining makes the other fail within the timeout.
#[test]
fn processes_meet_over_tcp_and_a_dead_peer_is_detected() {
    let _serial = serial();
    if cuda_count() < 2 || !nccl_ready() {
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    for fail_rank in [None, Some(1)] {
        let children: Vec<_> = (0..2)
            .map(|rank| {
                let mut c = std::process::Command::new(std::env::current_exe().unwrap());
                c.args(["--exact", "child_rank", "--ignored", "--nocapture"])
                    .env("RANK", rank.to_string())
                    .env("LOCAL_RANK", rank.to_string())
                    .env("WORLD_SIZE", "2")
                    .env("MASTER_ADDR", "127.0.0.1")
                    .env("MASTER_PORT", port.to_string())
                    .env("KILN_COLLECTIVE_TIMEOUT", "30")
                    .env("NCCL_NVLS_ENABLE", "0");
                if let Some(f) = fail_rank {
                    c.env("KILN_TEST_DIE_RANK", f.to_string());
                }
                c.stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let start = std::time::Instant::now();
        let outs: Vec<_> = children
            .into_iter()
            .map(|c| (c.wait_with_output().unwrap(), start.elapsed()))
            .collect();
        // Everything a failure needs: how the child ended, by when, and both of its streams.
        let (outs, ended): (Vec<_>, Vec<_>) = outs.into_iter().unzip();
        let text = |i: usize| {
            format!(
                "{}, seen {:.1} s after the start\n--- stdout\n{}\n--- stderr\n{}",
                outs[i].status,
                ended[i].as_secs_f64(),
                String::from_utf8_lossy(&outs[i].stdout),
                String::from_utf8_lossy(&outs[i].stderr)
            )
        };
        match fail_rank {
            None => {
                for (i, o) in outs.iter().enumerate() {
                    assert!(o.status.success(), "rank {i}: {}", text(i));
                    assert!(
                        text(i).contains("child: all_reduce ok"),
                        "rank {i}: {}",
                        text(i)
                    );
                }
            }
            Some(f) => {
                let other = 1 - f;
                assert!(
                    outs[other].status.success(),
                    "rank {other}: {}",
                    text(other)
                );
                assert!(
                    text(other).contains("child: peer failure detected"),
                    "{}",
                    text(other)
                );
            }
        }
    }
}

/// One rank of the test above (run by it, in a process of its own).
#[test]
#[ignore = "run by processes_meet_over_tcp_and_a_dead_peer_is_detected"]
fn child_rank() {
    let _serial = serial();
    let rank: usize = std::env::var("RANK").unwrap().parse().unwrap();
    let dev = Device::Cuda(rank);
    let g = ProcessGroup::from_env(&dev).unwrap();
    assert_eq!(
        (g.rank(), g.world_size(), g.backend_name()),
        (rank, 2, "nccl")
    );
    let t = Tensor::full(rank as f64 + 1.0, [1000], DType::F32, &dev).unwrap();
    g.all_reduce(&t, ReduceOp::Sum).unwrap();
    g.wait().unwrap();
    assert!(t.to_vec::<f32>().unwrap().iter().all(|&v| v == 3.0));
    println!("child: all_reduce ok");
    if std::env::var("KILN_TEST_DIE_RANK").is_ok_and(|v| v == rank.to_string()) {
        std::process::exit(3); // dies without a word to its peer
    }
    if std::env::var("KILN_TEST_DIE_RANK").is_ok() {
        // The peer is gone: the next collective cannot finish, and the wait says so.
        std::thread::sleep(Duration::from_millis(500));
        let r = g.all_reduce(&t, ReduceOp::Sum).and_then(|()| g.wait());
        let e = r.unwrap_err().to_string();
        assert!(e.contains("rank"), "{e}");
        println!("child: peer failure detected: {e}");
        std::process::exit(0); // the aborted communicator is not destroyed again
    }
}
