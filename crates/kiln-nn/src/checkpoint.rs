//! Checkpoints in the safetensors format, with PyTorch's dtype and parameter names, so a
//! checkpoint loads in PyTorch (`safetensors.torch.load_file`) and back. Writes are atomic:
//! a temporary file in the same folder, then a rename, so a crash never leaves a torn file.

use kiln::{DType, Device, Error, Result, Tensor};
use safetensors::tensor::{Dtype, TensorView};
use std::collections::HashMap;
use std::path::Path;

fn to_st(dtype: DType) -> Dtype {
    match dtype {
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::U8 => Dtype::U8,
        DType::U32 => Dtype::U32,
        DType::I64 => Dtype::I64,
    }
}

fn from_st(dtype: Dtype) -> Option<DType> {
    Some(match dtype {
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        Dtype::U8 => DType::U8,
        Dtype::U32 => DType::U32,
        Dtype::I64 => DType::I64,
        _ => return None,
    })
}

/// Writes `tensors` (any device) and string `metadata` to `path` atomically.
pub fn save(
    path: &Path,
    tensors: &[(String, Tensor)],
    metadata: &HashMap<String, String>,
) -> Result<()> {
    let host: Vec<(String, DType, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, t)| Ok((n.clone(), t.dtype(), t.dims().to_vec(), t.to_bytes()?)))
        .collect::<Result<_>>()?;
    let views: Vec<(String, TensorView<'_>)> = host
        .iter()
        .map(|(n, d, s, b)| {
            TensorView::new(to_st(*d), s.clone(), b)
                .map(|v| (n.clone(), v))
                .map_err(|e| Error::Msg(format!("checkpoint {n}: {e}")))
        })
        .collect::<Result<_>>()?;
    let bytes = safetensors::serialize(views, Some(metadata.clone()))
        .map_err(|e| Error::Msg(format!("serialising checkpoint {}: {e}", path.display())))?;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        path.file_name()
            .map(|f| f.to_string_lossy())
            .unwrap_or_default(),
        std::process::id()
    ));
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// Named tensors and string metadata, as stored in a checkpoint.
pub type Loaded = (Vec<(String, Tensor)>, HashMap<String, String>);

/// Reads a checkpoint: tensors (on `device`, sorted by name) and metadata. A malformed file
/// is an error, never a panic; see [`parse`].
pub fn load(path: &Path, device: &Device) -> Result<Loaded> {
    let bytes = std::fs::read(path)
        .map_err(|e| Error::Msg(format!("reading checkpoint {}: {e}", path.display())))?;
    parse(&bytes, &path.display().to_string(), device)
}

/// A checkpoint from the bytes of a safetensors file (`what` names it in errors). A
/// malformed file is an error, never a panic, and nothing is allocated beyond what the
/// bytes hold: every tensor's shape must match its byte range inside `bytes`, so a forged
/// header cannot declare more data than the file has.
///
/// ```
/// # use kiln::{Device, Tensor};
/// let err = kiln_nn::checkpoint::parse(b"\x08\0\0\0\0\0\0\0{}", "tiny", &Device::Cpu);
/// assert!(err.unwrap_err().to_string().contains("tiny"));
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn parse(bytes: &[u8], what: &str, device: &Device) -> Result<Loaded> {
    let st = safetensors::SafeTensors::deserialize(bytes)
        .map_err(|e| Error::Msg(format!("{what} is not a valid safetensors file: {e}")))?;
    let (_, meta) = safetensors::SafeTensors::read_metadata(bytes)
        .map_err(|e| Error::Msg(format!("{what}: bad safetensors header: {e}")))?;
    let mut out = Vec::new();
    let mut names: Vec<(usize, String)> =
        st.names().into_iter().map(|n| (0, n.to_string())).collect();
    // Keep the file's data order, which is the order `save` wrote.
    for (off, n) in names.iter_mut() {
        *off = meta
            .tensors()
            .get(n.as_str())
            .map(|i| i.data_offsets.0)
            .unwrap_or(0);
    }
    names.sort();
    for (_, name) in names {
        let v = st
            .tensor(&name)
            .map_err(|e| Error::Msg(format!("{what}: {name}: {e}")))?;
        let dtype = from_st(v.dtype()).ok_or_else(|| {
            Error::Msg(format!(
                "{what}: {name} has dtype {:?}, which kiln does not support",
                v.dtype()
            ))
        })?;
        out.push((
            name.clone(),
            Tensor::from_bytes(v.data(), dtype, v.shape().to_vec(), device)?,
        ));
    }
    Ok((out, meta.metadata().clone().unwrap_or_default()))
}
