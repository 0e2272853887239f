//! Mutation fuzzing of every file kiln reads: IDX (plain and gzip), safetensors
//! checkpoints, benchmark-report JSON and edge lists. Valid seed files are mutated (bytes
//! flipped, set, inserted, cut, duplicated; 32/64-bit fields overwritten with boundary
//! values; text tokens spliced in) and each input must be read or refused with an error,
//! never a panic, and without allocating more than the input's size implies.
//!
//! Memory is watched by this binary's allocator, per thread: while a reader runs, one
//! request larger than its bound is refused (the process aborts, naming the size), and the
//! peak of live bytes is compared with the bound afterwards. The bound is 64 bytes per
//! input byte plus 256 KiB (JSON values and kiln tensors are larger than their text), and
//! for gzip input 1100 bytes per input byte (deflate's densest stream inflates 1032-fold).
//!
//! Each target runs for `KILN_FUZZ_SECONDS` seconds (default 6; CI uses the default) from
//! `KILN_FUZZ_SEED` (default 1). A failing input is written to
//! `target/fuzz-failures/<target>-<n>` and named in the failure.

use kiln::sparse::graph::EdgeList;
use kiln::{DType, Device, Generator, Tensor};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::HashMap;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------
// A per-thread tracking allocator.

struct Tracking;

thread_local! {
    /// Bytes allocated and not yet freed by this thread (frees of another thread's blocks
    /// make it smaller; the readers here allocate and free on one thread).
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
    /// The largest single request allowed now (`usize::MAX`: no limit).
    static LIMIT: Cell<usize> = const { Cell::new(usize::MAX) };
}

fn track(delta: isize) {
    let _ = LIVE.try_with(|l| {
        let v = l.get() + delta;
        l.set(v);
        let _ = PEAK.try_with(|p| p.set(p.get().max(v)));
    });
}

fn over_limit(size: usize) -> bool {
    LIMIT.try_with(|l| size > l.get()).unwrap_or(false)
}

/// Refuses a request of `new_size` bytes above the limit, else runs `get` and records the
/// change from `old_size` bytes when it succeeded.
fn limited(old_size: usize, new_size: usize, get: impl FnOnce() -> *mut u8) -> *mut u8 {
    if over_limit(new_size) {
        return std::ptr::null_mut();
    }
    let p = get();
    if !p.is_null() {
        track(new_size as isize - old_size as isize);
    }
    p
}

// SAFETY: every call forwards to `System` with the caller's layout (whose contract the
// caller keeps); the bookkeeping touches only const-initialised thread-locals without
// destructors, which never allocate.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as above.
        limited(0, layout.size(), || unsafe { System.alloc(layout) })
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as above.
        limited(0, layout.size(), || unsafe { System.alloc_zeroed(layout) })
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        track(-(layout.size() as isize));
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as above.
        limited(layout.size(), new_size, || unsafe {
            System.realloc(ptr, layout, new_size)
        })
    }
}

#[global_allocator]
static ALLOCATOR: Tracking = Tracking;

/// Runs `f` with single requests above `limit` bytes refused; returns its result and the
/// peak of bytes it held at once.
fn with_limit<R>(limit: usize, f: impl FnOnce() -> R) -> (R, usize) {
    let start = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(start));
    LIMIT.with(|l| l.set(limit));
    let r = f();
    LIMIT.with(|l| l.set(usize::MAX));
    let peak = PEAK.with(Cell::get) - start;
    (r, peak.max(0) as usize)
}

// ---------------------------------------------------------------------------------------
// Targets, seeds and mutations.

/// What a reader did with one input.
enum Outcome {
    Accepted,
    Refused,
}

struct Target {
    name: &'static str,
    seeds: Vec<Vec<u8>>,
    /// Tokens spliced into text formats.
    tokens: &'static [&'static str],
    /// Bytes the reader may hold per input byte.
    per_byte: usize,
    /// Whether mutated inputs are also re-compressed with gzip (the seeds are plain).
    gzip: bool,
    read: fn(&[u8]) -> Outcome,
}

fn outcome<T, E: std::fmt::Display>(r: Result<T, E>, check: impl FnOnce(&T)) -> Outcome {
    match r {
        Ok(v) => {
            check(&v);
            Outcome::Accepted
        }
        Err(e) => {
            assert!(!e.to_string().is_empty(), "an error without a message");
            Outcome::Refused
        }
    }
}

fn read_idx(bytes: &[u8]) -> Outcome {
    outcome(kiln_nn::data::parse_idx(bytes, "fuzz"), |idx| {
        assert_eq!(idx.dims.iter().product::<usize>(), idx.data.len());
    })
}

fn read_checkpoint(bytes: &[u8]) -> Outcome {
    outcome(
        kiln_nn::checkpoint::parse(bytes, "fuzz", &Device::Cpu),
        |(tensors, _)| {
            for (_, t) in tensors {
                assert!(t.elem_count() * t.dtype().size_in_bytes() <= bytes.len());
            }
        },
    )
}

fn read_report(bytes: &[u8]) -> Outcome {
    outcome(kiln_bench::Report::parse(bytes, "fuzz"), |r| {
        // What was read can be written and read back.
        let again = serde_json::to_vec(&r.to_json()).unwrap();
        let back = kiln_bench::Report::parse(&again, "again").unwrap();
        assert_eq!(back.records.len(), r.records.len());
    })
}

fn read_edges(bytes: &[u8]) -> Outcome {
    outcome(EdgeList::read(bytes), |g| {
        assert_eq!(g.src.len(), g.dst.len());
        let nodes = g
            .src
            .iter()
            .chain(&g.dst)
            .max()
            .map_or(0, |&m| m as usize + 1);
        assert_eq!(g.nodes, nodes);
    })
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

fn idx_file(dims: &[u32], rng: &mut Generator) -> Vec<u8> {
    let mut b = vec![0, 0, 8, dims.len() as u8];
    for d in dims {
        b.extend(d.to_be_bytes());
    }
    let n: u32 = dims.iter().product();
    b.extend((0..n).map(|_| rng.below(256) as u8));
    b
}

fn checkpoint_file(rng: &mut Generator) -> Vec<u8> {
    let tensors: Vec<(String, Tensor)> = [DType::F32, DType::BF16, DType::I64, DType::U8]
        .iter()
        .enumerate()
        .map(|(i, &dt)| {
            let t = Tensor::rand([2 + i, 3], 0.0, 9.0, dt, &Device::Cpu, rng).unwrap();
            (format!("layer{i}.weight"), t)
        })
        .collect();
    let dir = std::env::temp_dir().join(format!("kiln-fuzz-seed-{}", std::process::id()));
    let path = dir.join("seed.safetensors");
    let meta = HashMap::from([("epoch".to_string(), "2".to_string())]);
    kiln_nn::checkpoint::save(&path, &tensors, &meta).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    bytes
}

fn report_file() -> Vec<u8> {
    br#"{"device": "cpu", "threads": 2, "results": [
  {"suite": "gemm", "name": "gemm/f32/256/nn", "median_ms": 0.5, "unit": "TFLOP/s", "value": 0.07, "pct_peak": 61.5},
  {"suite": "softmax", "name": "softmax/f32/4096x1024", "median_ms": 1.25, "unit": "GB/s", "value": 26.8, "pct_peak": null},
  {"suite": "train", "name": "train/mlp/epoch", "median_ms": 812.0, "unit": "ms", "value": 812.0}
]}"#
    .to_vec()
}

const JSON_TOKENS: &[&str] = &[
    "[",
    "]",
    "{",
    "}",
    "\"",
    ",",
    ":",
    "null",
    "1e999",
    "-0",
    "NaN",
    "18446744073709551616",
    "\"results\"",
    "\"value\"",
    "\\u0000",
    "\u{feff}",
    "[[[[[[[[[[[[[[[[",
    "\"median_ms\": 1",
];
const EDGE_TOKENS: &[&str] = &[
    " ",
    "\t",
    "\n",
    "#",
    "-1",
    "2147483646",
    "2147483647",
    "99999999999999999999",
    "0x10",
    "\r\n",
    "1 2 3",
    "\u{0}",
    "\u{fffd}",
];

/// 32- and 64-bit values that hit header-field edge cases, little- and big-endian.
const WORDS: [u64; 9] = [
    0,
    1,
    0x7f,
    0xff,
    0x7fff_ffff,
    0xffff_ffff,
    1_000_000_000_000,
    u64::MAX,
    1 << 40,
];

fn mutate(seed: &[u8], tokens: &[&str], rng: &mut Generator) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = |rng: &mut Generator, len: usize| rng.below(len + 1);
        match rng.below(8) {
            0 if !b.is_empty() => {
                let i = rng.below(b.len());
                b[i] ^= 1 << rng.below(8);
            }
            1 if !b.is_empty() => {
                let i = rng.below(b.len());
                b[i] = rng.below(256) as u8;
            }
            2 => {
                let i = at(rng, b.len());
                let n = 1 + rng.below(8);
                let bytes: Vec<u8> = (0..n).map(|_| rng.below(256) as u8).collect();
                b.splice(i..i, bytes);
            }
            3 if !b.is_empty() => {
                let i = rng.below(b.len());
                let n = (1 + rng.below(16)).min(b.len() - i);
                b.drain(i..i + n);
            }
            4 => b.truncate(at(rng, b.len())),
            5 if !b.is_empty() => {
                let i = rng.below(b.len());
                let n = (1 + rng.below(64)).min(b.len() - i);
                let chunk = b[i..i + n].to_vec();
                let j = at(rng, b.len());
                b.splice(j..j, chunk);
            }
            6 if b.len() >= 8 => {
                let w = WORDS[rng.below(WORDS.len())];
                let bytes = match rng.below(4) {
                    0 => (w as u32).to_le_bytes().to_vec(),
                    1 => (w as u32).to_be_bytes().to_vec(),
                    2 => w.to_le_bytes().to_vec(),
                    _ => w.to_be_bytes().to_vec(),
                };
                let i = rng.below(b.len() - bytes.len() + 1);
                b[i..i + bytes.len()].copy_from_slice(&bytes);
            }
            _ if !tokens.is_empty() => {
                let t = tokens[rng.below(tokens.len())].as_bytes();
                let i = at(rng, b.len());
                b.splice(i..i, t.iter().copied());
            }
            _ => {}
        }
    }
    b
}

fn seconds() -> Duration {
    let s = std::env::var("KILN_FUZZ_SECONDS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(6.0);
    Duration::from_secs_f64(s)
}

fn seed() -> u64 {
    std::env::var("KILN_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

fn save_failure(name: &str, n: usize, input: &[u8]) -> String {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/fuzz-failures");
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join(format!("{name}-{n}"));
    let _ = std::fs::write(&path, input);
    path.display().to_string()
}

/// Runs `input` through the target under its memory bound; panics name the saved input.
fn run_one(t: &Target, input: &[u8], n: usize) -> Outcome {
    let compressed = input.starts_with(&[0x1f, 0x8b]);
    let bound = input.len() * if compressed { 1100 } else { t.per_byte } + (256 << 10);
    let (r, peak) = with_limit(bound, || {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (t.read)(input)))
    });
    match r {
        Err(_) => panic!(
            "{}: input {n} panicked the reader; saved to {}",
            t.name,
            save_failure(t.name, n, input)
        ),
        Ok(o) => {
            assert!(
                peak <= bound,
                "{}: input {n} of {} bytes held {peak} bytes at once (bound {bound}); saved to {}",
                t.name,
                input.len(),
                save_failure(t.name, n, input)
            );
            o
        }
    }
}

/// Mutates the target's seeds for the configured time; prints the counts.
fn fuzz(t: Target, forged: &[Vec<u8>]) {
    // Warm-up outside the measurement: kiln's one-time host state (thread pool, tables).
    for s in &t.seeds {
        let _ = (t.read)(s);
    }
    let mut rng = Generator::new(seed());
    let (mut accepted, mut refused, mut n) = (0usize, 0usize, 0usize);
    for s in &t.seeds {
        assert!(
            matches!(run_one(&t, s, n), Outcome::Accepted),
            "{}: a seed is refused",
            t.name
        );
        n += 1;
    }
    for f in forged {
        assert!(
            matches!(run_one(&t, f, n), Outcome::Refused),
            "{}: forged input {n} is accepted",
            t.name
        );
        n += 1;
    }
    let deadline = Instant::now() + seconds();
    while Instant::now() < deadline {
        for _ in 0..64 {
            let seed = &t.seeds[rng.below(t.seeds.len())];
            let mut input = mutate(seed, t.tokens, &mut rng);
            if t.gzip && rng.below(2) == 0 {
                input = gzip(&input);
            }
            match run_one(&t, &input, n) {
                Outcome::Accepted => accepted += 1,
                Outcome::Refused => refused += 1,
            }
            n += 1;
        }
    }
    println!(
        "fuzz {}: {n} inputs ({} seeds, {} forged, {accepted} mutants read, {refused} refused), 0 panics, \
         every input within its memory bound",
        t.name,
        t.seeds.len(),
        forged.len()
    );
}

// ---------------------------------------------------------------------------------------

#[test]
fn fuzz_idx_reader() {
    let mut rng = Generator::new(2);
    let images = idx_file(&[4, 5, 3], &mut rng);
    let labels = idx_file(&[9], &mut rng);
    // Forged: 10^6 x 10^6 images (10^12 bytes) declared, 60 bytes present, plain and gzip;
    // a gzip stream of 10 MiB of zeros behind a 10^12-element header (inflates only what
    // it holds); a rank-255 header of huge dims.
    let mut forged_plain = vec![0, 0, 8, 2];
    forged_plain.extend(1_000_000u32.to_be_bytes());
    forged_plain.extend(1_000_000u32.to_be_bytes());
    forged_plain.extend([7u8; 60]);
    let mut bomb = forged_plain[..12].to_vec();
    bomb.extend(vec![0u8; 10 << 20]);
    let mut rank255 = vec![0, 0, 8, 255];
    rank255.extend(std::iter::repeat_n(u32::MAX.to_be_bytes(), 255).flatten());
    let forged = vec![
        forged_plain.clone(),
        gzip(&forged_plain),
        gzip(&bomb),
        rank255.clone(),
        gzip(&rank255),
    ];
    fuzz(
        Target {
            name: "idx",
            seeds: vec![images, labels],
            tokens: &[],
            per_byte: 64,
            gzip: true,
            read: read_idx,
        },
        &forged,
    );
}

#[test]
fn fuzz_checkpoint_loader() {
    let mut rng = Generator::new(3);
    let seed = checkpoint_file(&mut rng);
    // Forged: one tensor declaring 10^12 f32 elements with 16 bytes of data; a header
    // length of 2^60; a header length past the end.
    let header =
        br#"{"w":{"dtype":"F32","shape":[1000000,1000000],"data_offsets":[0,4000000000000]}}"#;
    let mut huge = (header.len() as u64).to_le_bytes().to_vec();
    huge.extend(header);
    huge.extend([0u8; 16]);
    let mut long_header = (1u64 << 60).to_le_bytes().to_vec();
    long_header.extend(b"{}");
    let mut past_end = 1000u64.to_le_bytes().to_vec();
    past_end.extend(b"{}");
    fuzz(
        Target {
            name: "checkpoint",
            seeds: vec![seed],
            tokens: JSON_TOKENS,
            per_byte: 64,
            gzip: false,
            read: read_checkpoint,
        },
        &[huge, long_header, past_end],
    );
}

#[test]
fn fuzz_bench_report_reader() {
    // Forged: arrays nested far beyond serde_json's recursion limit (refused, no stack
    // overflow); a record with a field missing.
    let deep = [vec![b'['; 100_000], vec![b']'; 100_000]].concat();
    let missing =
        br#"{"results": [{"suite": "gemm", "name": "x", "unit": "ms", "value": 1}]}"#.to_vec();
    fuzz(
        Target {
            name: "bench-report",
            seeds: vec![report_file()],
            tokens: JSON_TOKENS,
            per_byte: 64,
            gzip: false,
            read: read_report,
        },
        &[deep, missing],
    );
}

#[test]
fn fuzz_edge_list_reader() {
    let seed = b"# a small graph\n0 1\n1 2\t# tail\n\n2 0\n3 3\n10 4\n".to_vec();
    let forged = vec![
        b"0 2147483648\n".to_vec(),
        b"1 2 3\n".to_vec(),
        b"-5 1\n".to_vec(),
    ];
    fuzz(
        Target {
            name: "edge-list",
            seeds: vec![seed],
            tokens: EDGE_TOKENS,
            per_byte: 64,
            gzip: false,
            read: read_edges,
        },
        &forged,
    );
}
