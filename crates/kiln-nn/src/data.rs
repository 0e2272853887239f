//! MNIST-format data: an IDX reader (plain or gzip), normalisation, seeded shuffling and
//! minibatches. A dataset that fits on the device is uploaded once; each epoch permutes it
//! on the device with one gather, and batches are narrow views of the permuted copy.

use kiln::{DType, Device, Error, Generator, Result, Tensor};
use std::io::Read;
use std::path::{Path, PathBuf};

/// Where `kiln train` looks by default: the Debian package `dataset-fashion-mnist`.
pub const DEFAULT_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// An IDX array of unsigned bytes (the MNIST format): dims and row-major data.
#[derive(Debug, Clone)]
pub struct Idx {
    pub dims: Vec<usize>,
    pub data: Vec<u8>,
}

/// Parses IDX bytes (gzip-compressed or not). Anything malformed is an error naming the
/// problem: bad magic, an element type other than unsigned byte, truncated or trailing data.
///
/// Memory: the data is checked against the dims before it is copied, so a forged header
/// cannot make the reader allocate what the file does not hold. A gzip stream is inflated
/// only up to the size its (inflated) header declares, plus one byte to detect trailing
/// data, so its cost is bounded by what the stream really inflates to.
pub fn parse_idx(bytes: &[u8], what: &str) -> Result<Idx> {
    let raw;
    let bytes = if bytes.starts_with(&[0x1f, 0x8b]) {
        raw = inflate_idx(bytes, what)?;
        &raw[..]
    } else {
        bytes
    };
    let bad = |m: String| Error::Msg(format!("{what}: not an IDX file: {m}"));
    if bytes.len() < 4 || bytes[0] != 0 || bytes[1] != 0 {
        return Err(bad("missing the 0x0000 magic".into()));
    }
    if bytes[2] != 0x08 {
        return Err(bad(format!(
            "element type 0x{:02x}; only unsigned bytes (0x08) are supported",
            bytes[2]
        )));
    }
    let rank = bytes[3] as usize;
    if rank == 0 || bytes.len() < 4 + 4 * rank {
        return Err(bad(format!(
            "header truncated ({} bytes for {rank} dims)",
            bytes.len()
        )));
    }
    let dims: Vec<usize> = (0..rank)
        .map(|i| {
            u32::from_be_bytes(bytes[4 + 4 * i..8 + 4 * i].try_into().expect("4 bytes")) as usize
        })
        .collect();
    let count = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| bad(format!("dims {dims:?} overflow")))?;
    let body = &bytes[4 + 4 * rank..];
    if body.len() != count {
        return Err(bad(format!(
            "dims {dims:?} need {count} bytes of data, found {}",
            body.len()
        )));
    }
    Ok(Idx {
        dims,
        data: body.to_vec(),
    })
}

/// Inflates a gzip-compressed IDX file: the 4-byte magic and the dims first, then at most
/// the data those dims declare and one byte more (left for [`parse_idx`] to refuse).
fn inflate_idx(bytes: &[u8], what: &str) -> Result<Vec<u8>> {
    let corrupt = |e: std::io::Error| Error::Msg(format!("{what}: corrupt gzip data: {e}"));
    let mut stream = flate2::read::GzDecoder::new(bytes);
    let mut out = Vec::new();
    let mut read_upto = |out: &mut Vec<u8>, len: u64| -> Result<()> {
        let want = len.saturating_sub(out.len() as u64);
        (&mut stream)
            .take(want)
            .read_to_end(out)
            .map(|_| ())
            .map_err(corrupt)
    };
    read_upto(&mut out, 4)?;
    if out.len() < 4 {
        return Ok(out); // too short: parse_idx names the problem
    }
    let header = 4 + 4 * out[3] as u64;
    read_upto(&mut out, header)?;
    if (out.len() as u64) < header {
        return Ok(out);
    }
    let count = out[4..]
        .chunks_exact(4)
        .try_fold(1u64, |a, d| {
            a.checked_mul(u32::from_be_bytes(d.try_into().expect("4 bytes")) as u64)
        })
        .unwrap_or(u64::MAX);
    read_upto(&mut out, header.saturating_add(count).saturating_add(1))?;
    Ok(out)
}

pub fn read_idx(path: &Path) -> Result<Idx> {
    let bytes = std::fs::read(path).map_err(|e| Error::Msg(format!("{}: {e}", path.display())))?;
    parse_idx(&bytes, &path.display().to_string())
}

/// Images and labels of one split, on the host: `images` f32 `[n, rows*cols]` in [0, 1],
/// `labels` i64 `[n]`.
pub struct Split {
    pub images: Tensor,
    pub labels: Tensor,
}

/// The four standard files of an MNIST-format dataset.
pub struct Mnist {
    pub train: Split,
    pub test: Split,
}

fn find(dir: &Path, stem: &str) -> Result<PathBuf> {
    for name in [format!("{stem}.gz"), stem.to_string()] {
        let p = dir.join(&name);
        if p.is_file() {
            return Ok(p);
        }
    }
    Err(Error::Msg(format!(
        "{} has no {stem}[.gz]: expected the four MNIST-format files (train-images-idx3-ubyte, \
         train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, plain or .gz). \
         Install Fashion-MNIST with `apt-get install dataset-fashion-mnist` (it lands in {DEFAULT_DIR}) \
         or pass --data DIR",
        dir.display()
    )))
}

fn split(dir: &Path, images: &str, labels: &str) -> Result<Split> {
    let (ip, lp) = (find(dir, images)?, find(dir, labels)?);
    let (i, l) = (read_idx(&ip)?, read_idx(&lp)?);
    if i.dims.len() != 3 || l.dims.len() != 1 || i.dims[0] != l.dims[0] {
        return Err(Error::Msg(format!(
            "{} ({:?}) and {} ({:?}) are not images [n, rows, cols] with n labels",
            ip.display(),
            i.dims,
            lp.display(),
            l.dims
        )));
    }
    if let Some(bad) = l.data.iter().find(|&&v| v > 9) {
        return Err(Error::Msg(format!(
            "{}: label {bad} is not a class 0..9",
            lp.display()
        )));
    }
    let n = i.dims[0];
    let pixels = i.dims[1] * i.dims[2];
    let images = Tensor::from_vec(
        i.data.iter().map(|&b| b as f32 / 255.0).collect::<Vec<_>>(),
        [n, pixels],
        &Device::Cpu,
    )?;
    let labels = Tensor::from_vec(
        l.data.iter().map(|&b| b as i64).collect::<Vec<_>>(),
        n,
        &Device::Cpu,
    )?;
    Ok(Split { images, labels })
}

impl Mnist {
    /// Loads the dataset in `dir` (Fashion-MNIST, MNIST, or any set in that format).
    pub fn load(dir: &Path) -> Result<Mnist> {
        if !dir.is_dir() {
            return Err(Error::Msg(format!(
                "dataset folder {} does not exist. Install Fashion-MNIST with `apt-get install dataset-fashion-mnist` \
                 (it lands in {DEFAULT_DIR}) or pass --data DIR with the four MNIST-format files",
                dir.display()
            )));
        }
        Ok(Mnist {
            train: split(dir, "train-images-idx3-ubyte", "train-labels-idx1-ubyte")?,
            test: split(dir, "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")?,
        })
    }
}

/// Mean and (population) standard deviation of all elements, for normalisation.
///
/// Computed in f64 over blocks of [`MEAN_STD_BLOCK`] elements, each block's mean and sum of
/// squared deviations combined as Chan et al. do (stable where the spread is small beside
/// the mean). An f64 copy of a whole 60,000-image split was 376 MB of fresh pages, three
/// times over: 1.5 s of `kiln train`'s start on the CPU.
///
/// ```
/// use kiln::{Device, Tensor};
/// let x = Tensor::from_vec(vec![1f32, 2.0, 3.0, 4.0], [2, 2], &Device::Cpu).unwrap();
/// let (mean, std) = kiln_nn::data::mean_std(&x).unwrap();
/// assert!((mean - 2.5).abs() < 1e-12 && (std - 1.25f64.sqrt()).abs() < 1e-12);
/// ```
pub fn mean_std(x: &Tensor) -> Result<(f64, f64)> {
    mean_std_in_blocks(x, MEAN_STD_BLOCK)
}

/// [`mean_std`] over blocks of `block` elements.
fn mean_std_in_blocks(x: &Tensor, block_len: usize) -> Result<(f64, f64)> {
    let flat = x.flatten_all()?;
    let n = flat.elem_count();
    let (mut count, mut mean, mut m2) = (0usize, f64::NAN, f64::NAN);
    let scalar = |t: Tensor| t.to_device(&Device::Cpu)?.to_scalar::<f64>();
    for start in (0..n).step_by(block_len) {
        let len = block_len.min(n - start);
        let block = flat.narrow(0, start, len)?;
        // Devices without f64 (wgpu) compute it on the host.
        let block = if block.device().supports(DType::F64) {
            block.to_dtype(DType::F64)?
        } else {
            block.to_device(&Device::Cpu)?.to_dtype(DType::F64)?
        };
        let block_mean = scalar(block.mean(kiln::AllDims, false)?)?;
        let block_m2 = scalar(
            block
                .sub_scalar(block_mean)?
                .sqr()?
                .sum(kiln::AllDims, false)?,
        )?;
        if count == 0 {
            (mean, m2) = (block_mean, block_m2);
        } else {
            let total = (count + len) as f64;
            let delta = block_mean - mean;
            mean += delta * len as f64 / total;
            m2 += block_m2 + delta * delta * (count as f64) * (len as f64) / total;
        }
        count += len;
    }
    Ok((mean, (m2 / count as f64).sqrt()))
}

/// Elements per block of [`mean_std`]: 32 MiB of f64, reused from block to block.
const MEAN_STD_BLOCK: usize = 1 << 22;

/// A dataset resident on one device.
pub struct DeviceData {
    pub x: Tensor,
    pub y: Tensor,
}

impl DeviceData {
    /// Normalises `(x − mean) / std`, converts to `dtype` and uploads once.
    pub fn upload(
        split: &Split,
        mean: f64,
        std: f64,
        dtype: DType,
        device: &Device,
        limit: Option<usize>,
    ) -> Result<DeviceData> {
        let n = limit.unwrap_or(usize::MAX).min(split.labels.elem_count());
        let x = split
            .images
            .narrow(0, 0, n)?
            .sub_scalar(mean)?
            .mul_scalar(1.0 / std)?
            .to_dtype(dtype)?;
        Ok(DeviceData {
            x: x.to_device(device)?,
            y: split.labels.narrow(0, 0, n)?.to_device(device)?,
        })
    }

    pub fn len(&self) -> usize {
        self.y.elem_count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// An error unless `1 <= batch <= len()` (a shuffled epoch takes full batches only).
    pub fn check_batch(&self, op: &str, batch: usize) -> Result<()> {
        if batch == 0 || batch > self.len() {
            return Err(Error::Msg(format!(
                "{op}: batch = {batch}: must be in [1, {}], the rows of the data",
                self.len()
            )));
        }
        Ok(())
    }

    /// The epoch's minibatches of `batch` rows, shuffled by `rng` (full batches only), made
    /// as the iterator is walked. On CUDA the data is permuted once (one kernel) and each
    /// batch is a view of that copy; on the CPU each batch is gathered when it is reached,
    /// so no shuffled copy of the whole set is written (and page-faulted) every epoch; on
    /// wgpu too, since a batch's rows must be read into a buffer of their own there (a view
    /// of a training set can be larger than one shader binding).
    pub fn shuffled_batches(
        &self,
        batch: usize,
        rng: &mut Generator,
    ) -> Result<impl Iterator<Item = Result<(Tensor, Tensor)>> + '_> {
        let n = self.len();
        self.check_batch("shuffled_batches", batch)?;
        let mut perm: Vec<i64> = (0..n as i64).collect();
        rng.shuffle(&mut perm);
        let ids = Tensor::from_vec(perm, n, &self.x.device())?;
        let shuffled = if !self.x.device().is_cuda() {
            None
        } else {
            Some((self.x.index_select(&ids, 0)?, self.y.index_select(&ids, 0)?))
        };
        Ok((0..n / batch).map(move |b| match &shuffled {
            Some((x, y)) => Ok((
                x.narrow(0, b * batch, batch)?,
                y.narrow(0, b * batch, batch)?,
            )),
            None => {
                let take = ids.narrow(0, b * batch, batch)?;
                Ok((
                    self.x.index_select(&take, 0)?,
                    self.y.index_select(&take, 0)?,
                ))
            }
        }))
    }

    /// In-order batches (the last may be short), for evaluation.
    pub fn batches(&self, batch: usize) -> Result<Vec<(Tensor, Tensor)>> {
        let n = self.len();
        if batch == 0 {
            return Err(Error::Msg("batches: batch = 0: must be at least 1".into()));
        }
        (0..n.div_ceil(batch))
            .map(|b| {
                let len = batch.min(n - b * batch);
                Ok((
                    self.x.narrow(0, b * batch, len)?,
                    self.y.narrow(0, b * batch, len)?,
                ))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks combined (the last one short) against a plain two-pass f64 reference, on data
    /// whose spread is small beside its mean (where `E[x²] − mean²` loses every digit).
    #[test]
    fn mean_std_matches_two_pass_reference() {
        let mut rng = Generator::new(7);
        let x = Tensor::randn([101, 99], 1000.0, 0.01, DType::F32, &Device::Cpu, &mut rng).unwrap();
        let v: Vec<f64> = x
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|&v| v as f64)
            .collect();
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let std = (v.iter().map(|a| (a - mean) * (a - mean)).sum::<f64>() / v.len() as f64).sqrt();
        for block in [1000, 4096, v.len(), 1 << 22] {
            let (m, s) = mean_std_in_blocks(&x, block).unwrap();
            assert!(
                (m - mean).abs() <= 1e-12 * mean.abs(),
                "block {block}: mean {m} against {mean}"
            );
            assert!(
                (s - std).abs() <= 1e-9 * std,
                "block {block}: std {s} against {std}"
            );
        }
    }
}
