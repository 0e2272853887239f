//! Measured choices kept on disk, so that later processes on the same GPU and library make the
//! same choice without measuring again.
//!
//! A tuner that times candidates (the GEMM plans of `gemm_lt.rs`) picks by timing, and two
//! processes can time two near-equal candidates in opposite order: the same program then runs
//! different kernels and its results differ in the last bits. With the choices saved, every
//! process after the first reads the first one's choice: runs repeat bit for bit, and they
//! skip the timing (a faster first step).
//!
//! One text file per kind of choice, GPU and library version, in the kernel cache directory
//! ([`super::compile::cache_dir`]) or the directory `KILN_SAVED_CHOICES` names:
//! `<kind>-<gpu>-sm<major><minor>-<library>.txt`, one `key<TAB>value` line per choice. A process appends each new choice as one line; when two
//! processes append the same key, the first line wins for every later reader. Lines that do
//! not parse are skipped, a file over [`MAX_FILE_BYTES`] is neither read nor grown, and a
//! directory that cannot be written is not an error. `KILN_SAVED_CHOICES=off` turns it off
//! (every process measures afresh).
//!
//! A process run under a CUDA tool that injects itself (Nsight Compute, Nsight Systems,
//! compute-sanitizer: [`TOOL_VARIABLES`]) reads the saved choices but saves none of its
//! own: the tool serialises and slows the launches it times, and its choices would hold
//! every later process to them (seen: after an `ncu` run of `kiln bench`, the next runs took
//! 0.35 ms, not 0.15, for the b256 32→64 14² 5×5 TF32 forward and backward, on cuDNN's legacy
//! engines). Reading them lets a profile show the path a plain run takes.
//!
//! Invariant: a saved value is only a hint. Its user checks that it still applies (for GEMM,
//! `cublasLtMatmulAlgoCheck`) and measures afresh when it does not.

use super::CudaDevice;
use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

/// Files larger than this are ignored (a choice file of the GEMM plans of a large program is
/// a few hundred lines of ~200 bytes).
const MAX_FILE_BYTES: u64 = 4 << 20;
/// Longer lines are not choices kiln wrote.
const MAX_LINE_BYTES: usize = 1024;

/// The saved choices of one kind for one GPU and library version.
pub(super) struct SavedChoices {
    /// Where new choices are appended; `None`: saving is off, the file is over its limit,
    /// or the process runs under an injected CUDA tool ([`SavedChoices::read_only`]).
    path: Option<PathBuf>,
    entries: HashMap<String, String>,
}

/// Environment variables that NVIDIA's tools set in the processes they launch: CUDA's
/// injection hook (Nsight Systems, CUPTI-based tools), Nsight Compute's and
/// compute-sanitizer's transports (seen in the processes `ncu` 2025.3 and compute-sanitizer
/// 13.0 start, which do not set the first).
const TOOL_VARIABLES: [&str; 3] = [
    "CUDA_INJECTION64_PATH",
    "NV_NSIGHT_INJECTION_TRANSPORT_TYPE",
    "NV_SANITIZER_INJECTION_TRANSPORT_TYPE",
];

/// Whether a CUDA tool has injected itself into this process (profilers, sanitizers).
fn tool_injected() -> bool {
    static INJECTED: OnceLock<bool> = OnceLock::new();
    *INJECTED.get_or_init(|| {
        TOOL_VARIABLES
            .iter()
            .any(|v| std::env::var_os(v).is_some_and(|v| !v.is_empty()))
    })
}

/// The saved choices of `kind` for `dev`'s GPU model and `library`, one instance per file
/// in the process (devices of one model share it).
pub(super) fn shared(kind: &str, dev: &CudaDevice, library: &str) -> Arc<Mutex<SavedChoices>> {
    static OPEN: OnceLock<Mutex<HashMap<String, Arc<Mutex<SavedChoices>>>>> = OnceLock::new();
    let (gpu, arch) = (&dev.info.name, dev.info.compute_capability);
    let id = format!("{kind}\t{gpu}\t{arch:?}\t{library}");
    OPEN.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(id)
        .or_insert_with(|| Arc::new(Mutex::new(SavedChoices::open(kind, gpu, arch, library))))
        .clone()
}

/// The value saved for `key` among `kind`'s choices for `dev` and `library`.
pub(super) fn lookup(kind: &str, dev: &CudaDevice, library: &str, key: &str) -> Option<String> {
    let saved = shared(kind, dev, library);
    let saved = saved.lock().unwrap_or_else(|e| e.into_inner());
    saved.get(key).map(str::to_string)
}

/// Saves `value` for `key` among `kind`'s choices for `dev` and `library` (see
/// [`SavedChoices::save`]).
pub(super) fn record(kind: &str, dev: &CudaDevice, library: &str, key: &str, value: &str) {
    let saved = shared(kind, dev, library);
    saved
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .save(key, value);
}

/// Where choices are saved: `KILN_SAVED_CHOICES` names a directory, or `off` (`0`) turns
/// saving off; unset, the kernel cache directory.
pub(super) fn directory() -> Option<PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| match std::env::var_os("KILN_SAVED_CHOICES") {
        Some(v) if v == "off" || v == "0" => None,
        Some(v) if !v.is_empty() => Some(PathBuf::from(v)),
        _ => Some(super::compile::cache_dir()),
    })
    .clone()
}

impl SavedChoices {
    /// The choices of `kind` saved for a GPU named `gpu` with compute capability `arch` and
    /// `library` (a name with its version), read from the saved choices' directory.
    pub fn open(kind: &str, gpu: &str, arch: (i32, i32), library: &str) -> SavedChoices {
        let Some(dir) = directory() else {
            return SavedChoices::in_memory();
        };
        let name = format!(
            "{kind}-{}-sm{}{}-{}.txt",
            file_safe(gpu),
            arch.0,
            arch.1,
            file_safe(library)
        );
        let saved = SavedChoices::at(dir.join(name));
        if tool_injected() {
            saved.read_only()
        } else {
            saved
        }
    }

    /// The same choices, with new ones kept for this process only.
    pub fn read_only(self) -> SavedChoices {
        SavedChoices { path: None, ..self }
    }

    /// The choices saved in the file at `path` (none when it is missing, unreadable or over
    /// [`MAX_FILE_BYTES`]; then new choices are not written there either).
    pub fn at(path: PathBuf) -> SavedChoices {
        match std::fs::metadata(&path) {
            Ok(m) if m.len() > MAX_FILE_BYTES => return SavedChoices::in_memory(),
            Err(_) => {
                return SavedChoices {
                    path: Some(path),
                    entries: HashMap::new(),
                }
            }
            Ok(_) => {}
        }
        let entries = std::fs::read(&path)
            .map(|bytes| parse(&String::from_utf8_lossy(&bytes)))
            .unwrap_or_default();
        SavedChoices {
            path: Some(path),
            entries,
        }
    }

    /// Choices kept for this process only.
    pub fn in_memory() -> SavedChoices {
        SavedChoices {
            path: None,
            entries: HashMap::new(),
        }
    }

    /// The value saved for `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries.get(key).map(String::as_str)
    }

    /// Keeps `value` for `key` and appends it to the file (one write of one line, so lines of
    /// concurrent processes do not interleave). A key already held keeps its first value; a
    /// key or value with a tab or newline, or too long a line, is not saved.
    pub fn save(&mut self, key: &str, value: &str) {
        let line = format!("{key}\t{value}\n");
        if key.contains(['\t', '\n']) || value.contains(['\t', '\n']) || line.len() > MAX_LINE_BYTES
        {
            return;
        }
        if self.entries.contains_key(key) {
            return;
        }
        self.entries.insert(key.to_string(), value.to_string());
        let Some(path) = &self.path else { return };
        let append = || -> std::io::Result<()> {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?;
            if f.metadata()?.len() + line.len() as u64 > MAX_FILE_BYTES {
                return Ok(());
            }
            f.write_all(line.as_bytes())
        };
        let _ = append();
    }
}

/// The `key<TAB>value` lines of `text`; the first line of a key wins, and malformed lines
/// (no tab, an empty key, too long) are skipped.
fn parse(text: &str) -> HashMap<String, String> {
    let mut entries = HashMap::new();
    for line in text.lines() {
        if line.len() > MAX_LINE_BYTES {
            continue;
        }
        let Some((key, value)) = line.split_once('\t') else {
            continue;
        };
        if key.is_empty() || value.contains('\t') {
            continue;
        }
        entries
            .entry(key.to_string())
            .or_insert_with(|| value.to_string());
    }
    entries
}

/// `s` with every character other than ASCII letters, digits, `.` and `-` made `_`.
fn file_safe(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_file(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("kiln-saved-{}", std::process::id()));
        let _ = std::fs::remove_file(dir.join(name));
        dir.join(name)
    }

    #[test]
    fn choices_saved_by_one_process_are_read_by_the_next() {
        let path = temp_file("roundtrip.txt");
        let mut first = SavedChoices::at(path.clone());
        assert_eq!(first.get("m=10 n=128"), None);
        first.save("m=10 n=128", "lt 0 1,2,3");
        first.save("m=784 n=1024", "kiln");
        // A second choice for a key already saved is ignored, in memory and on disk.
        first.save("m=10 n=128", "kiln");
        assert_eq!(first.get("m=10 n=128"), Some("lt 0 1,2,3"));
        let second = SavedChoices::at(path.clone());
        assert_eq!(second.get("m=10 n=128"), Some("lt 0 1,2,3"));
        assert_eq!(second.get("m=784 n=1024"), Some("kiln"));
        assert_eq!(second.get("m=1 n=1"), None);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 2, "{text}");
    }

    #[test]
    fn malformed_lines_are_skipped_and_the_first_line_of_a_key_wins() {
        let parsed = parse("a\t1\nno tab here\n\tempty key\nb\t2\t3\na\t9\nc\t\n");
        assert_eq!(parsed.get("a").map(String::as_str), Some("1"));
        assert_eq!(parsed.get("c").map(String::as_str), Some(""));
        assert_eq!(parsed.len(), 2, "{parsed:?}");
        let long = format!("k\t{}\nk2\tv\n", "x".repeat(MAX_LINE_BYTES));
        let parsed = parse(&long);
        assert_eq!(parsed.len(), 1);
        assert_eq!(parsed.get("k2").map(String::as_str), Some("v"));
        // Bytes that are not UTF-8 do not stop the reading.
        let path = temp_file("binary.txt");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"\xff\xfe\x00junk\nkey\tvalue\n").unwrap();
        assert_eq!(SavedChoices::at(path).get("key"), Some("value"));
    }

    #[test]
    fn keys_and_values_that_would_break_a_line_are_not_saved() {
        let path = temp_file("refused.txt");
        let mut saved = SavedChoices::at(path.clone());
        saved.save("two\tparts", "v");
        saved.save("k", "two\nlines");
        saved.save("long", &"x".repeat(MAX_LINE_BYTES));
        assert_eq!(saved.get("k"), None);
        assert!(!path.exists() || std::fs::read_to_string(&path).unwrap().is_empty());
    }

    #[test]
    fn an_oversized_file_is_neither_read_nor_grown() {
        let path = temp_file("oversized.txt");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut text = String::from("a\t1\n");
        while (text.len() as u64) <= MAX_FILE_BYTES {
            text.push_str(&"#".repeat(1000));
            text.push('\n');
        }
        std::fs::write(&path, &text).unwrap();
        let mut saved = SavedChoices::at(path.clone());
        assert_eq!(saved.get("a"), None);
        saved.save("b", "2");
        assert_eq!(saved.get("b"), Some("2"), "kept in memory");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), text.len() as u64);
    }

    #[test]
    fn a_process_under_a_cuda_tool_reads_choices_but_saves_none() {
        let path = temp_file("injected.txt");
        SavedChoices::at(path.clone()).save("k", "v");
        let mut under_tool = SavedChoices::at(path.clone()).read_only();
        assert_eq!(under_tool.get("k"), Some("v"));
        under_tool.save("k2", "distorted");
        assert_eq!(
            under_tool.get("k2"),
            Some("distorted"),
            "kept for this process"
        );
        assert_eq!(SavedChoices::at(path).get("k2"), None, "not on disk");
    }

    #[test]
    fn file_names_keep_only_plain_characters() {
        assert_eq!(
            file_safe("NVIDIA H100 80GB HBM3/x"),
            "NVIDIA_H100_80GB_HBM3_x"
        );
        assert_eq!(file_safe("cublasLt-130100"), "cublasLt-130100");
    }
}
