//! How kiln chooses among cuDNN's candidates for a convolution (`cudnn.rs` measures them):
//! which APIs may run a problem (`KILN_CUDNN_API`), how the measured times decide
//! (`KILN_CUDNN_TIMING`, [`pick`]), and the choice logs (`KILN_CUDNN_LOG`).

use std::sync::OnceLock;

/// Which of cuDNN's APIs may run a problem (`KILN_CUDNN_API`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Api {
    /// Both APIs measured per problem, one kept as [`timing`] says (the default).
    Both,
    /// The graph API's engines, measured per problem; the legacy API's best algorithm only
    /// where no engine runs the problem (`graph-first`).
    GraphFirst,
    Legacy,
    /// The graph API only; a problem it has no plan for is an error (f64 excepted, which
    /// few graph engines take: it falls back to the legacy API).
    Graph,
}

pub(super) fn api() -> Api {
    static API: OnceLock<Api> = OnceLock::new();
    *API.get_or_init(|| {
        let names = [
            ("legacy", Api::Legacy),
            ("graph", Api::Graph),
            ("graph-first", Api::GraphFirst),
        ];
        super::env_choice("KILN_CUDNN_API", &names, Api::Both)
    })
}

/// Which APIs one `State::choose_among` (cudnn.rs) pass measures.
#[derive(Clone, Copy)]
pub(super) struct Among {
    pub legacy: bool,
    pub graph: bool,
    /// The graph API having no engine is an error, not an empty list.
    pub graph_required: bool,
}

/// How candidate plans are compared (`KILN_CUDNN_TIMING`). Two measurements exist: the
/// per-call time of three back-to-back calls (best of two rounds: "throughput") and the time
/// of one call from an idle device, its host work included (median of seven: "latency").
/// - `guarded` (the default): the graph API's engines by throughput; the legacy API's
///   algorithm only where it is faster back to back *and* not more than 10% slower as an
///   isolated call. On the H100 (2026-11-26, `KILN_CUDNN_LOG=2`) legacy TF32 and bf16
///   algorithms tied with the best engines back to back but cost 1.3–3.4× as much in most
///   isolated calls (median of 15: 0.26 against 0.084 ms for the b64 256→256 14² TF32
///   forward; the best of five isolated calls did not show it), and the conv suite read
///   those choices at 0.5–0.75× of the engines'. The graph API's engines cost 4–8% more as
///   isolated calls, alike, so among them throughput decides. In exact f32 the legacy
///   algorithms pass the guard and run the large problems up to 1.9× faster than the best
///   engine. With the guard every conv-suite row measured ≥ 1.0× PyTorch in two runs
///   (bench/results/2026-11-26n-h100-cudnn-choice).
/// - `throughput`, `latency`: one measurement decides.
/// - `both`: their sum decides (tried on an H200 on 2026-11-26, with the best of five as the
///   latency: it picked slower engines for small problems, where an isolated call's time is
///   mostly host time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Timing {
    Guarded,
    Throughput,
    Latency,
    Both,
}

pub(super) fn timing() -> Timing {
    static TIMING: OnceLock<Timing> = OnceLock::new();
    *TIMING.get_or_init(|| {
        let names = [
            ("latency", Timing::Latency),
            ("throughput", Timing::Throughput),
            ("both", Timing::Both),
        ];
        super::env_choice("KILN_CUDNN_TIMING", &names, Timing::Guarded)
    })
}

/// The candidate `timing` keeps, given each candidate's per-call times back to back
/// (`throughput`) and isolated (`latency`), in milliseconds (infinite: it failed). The first
/// `legacy` candidates (0 or 1) are the legacy API's.
pub(super) fn pick(
    timing: Timing,
    legacy: usize,
    throughput: &[f32],
    latency: &[f32],
) -> Option<usize> {
    let argmin = |range: std::ops::Range<usize>, cost: &dyn Fn(usize) -> f32| {
        range
            .filter(|&i| cost(i).is_finite())
            .min_by(|&a, &b| cost(a).total_cmp(&cost(b)))
    };
    let n = throughput.len();
    match timing {
        Timing::Throughput => argmin(0..n, &|i| throughput[i]),
        Timing::Latency => argmin(0..n, &|i| latency[i]),
        Timing::Both => argmin(0..n, &|i| throughput[i] + latency[i]),
        Timing::Guarded => {
            let engine = argmin(legacy..n, &|i| throughput[i]);
            let old = argmin(0..legacy, &|i| throughput[i]);
            match (old, engine) {
                (Some(o), Some(e)) => {
                    let wins = throughput[o] < throughput[e] && latency[o] <= 1.1 * latency[e];
                    Some(if wins { o } else { e })
                }
                (o, e) => e.or(o),
            }
        }
    }
}

/// `KILN_CUDNN_LOG=1` logs each choice and its candidates' times.
/// How many of the graph API's plans a problem measures (`KILN_CUDNN_CANDIDATES`, default 8).
pub(super) fn candidates() -> usize {
    std::env::var("KILN_CUDNN_CANDIDATES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8)
}

pub(super) fn log_choices() -> bool {
    std::env::var("KILN_CUDNN_LOG").is_ok_and(|v| v == "1" || v == "2")
}

/// `KILN_CUDNN_LOG=2` also times every candidate as an isolated call (15 single calls,
/// median) beside its score, to check the score ranks candidates as single calls do.
pub(super) fn log_verbose() -> bool {
    std::env::var("KILN_CUDNN_LOG").is_ok_and(|v| v == "2")
}

#[cfg(test)]
mod tests {
    use super::{pick, Timing};
    const INF: f32 = f32::INFINITY;

    #[test]
    fn guarded_pick_keeps_legacy_only_when_it_wins_both_ways() {
        // Candidate 0 is legacy: fastest back to back, but 3x slower isolated (as measured).
        let thr = [0.0758, 0.0782, 0.0806];
        let lat = [0.2581, 0.0836, 0.0862];
        assert_eq!(pick(Timing::Guarded, 1, &thr, &lat), Some(1));
        assert_eq!(pick(Timing::Throughput, 1, &thr, &lat), Some(0));
        // Legacy faster both ways (within 10% isolated): kept.
        let lat = [0.090, 0.0836, 0.0862];
        assert_eq!(pick(Timing::Guarded, 1, &thr, &lat), Some(0));
        // Among engines, throughput decides even when another is faster isolated.
        let thr = [0.5, 0.10, 0.11];
        let lat = [0.5, 0.14, 0.12];
        assert_eq!(pick(Timing::Guarded, 1, &thr, &lat), Some(1));
        assert_eq!(pick(Timing::Latency, 1, &thr, &lat), Some(2));
        assert_eq!(pick(Timing::Both, 1, &thr, &lat), Some(2));
    }

    #[test]
    fn pick_skips_failed_candidates_and_handles_one_api() {
        assert_eq!(pick(Timing::Guarded, 1, &[0.1, INF], &[0.1, INF]), Some(0));
        assert_eq!(pick(Timing::Guarded, 0, &[INF, 0.3], &[INF, 0.3]), Some(1));
        assert_eq!(pick(Timing::Guarded, 1, &[0.1], &[0.1]), Some(0));
        assert_eq!(pick(Timing::Guarded, 1, &[INF, INF], &[INF, INF]), None);
        assert_eq!(pick(Timing::Throughput, 0, &[], &[]), None);
    }
}
