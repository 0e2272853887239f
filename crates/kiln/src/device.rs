//! Where a tensor's storage lives.

/// A compute device. Every tensor knows its device; moving data between devices is explicit
/// ([`crate::Tensor::to_device`]) and mixing devices in one op is an error.
///
/// ```
/// use kiln::Device;
/// assert_eq!(Device::Cuda(1).to_string(), "cuda:1");
/// assert!(Device::Cpu.is_cpu());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// Host memory, computed by the CPU backend (the default).
    #[default]
    Cpu,
    /// The NVIDIA GPU with this ordinal.
    Cuda(usize),
}

impl Device {
    pub fn is_cpu(self) -> bool {
        matches!(self, Device::Cpu)
    }

    pub fn is_cuda(self) -> bool {
        matches!(self, Device::Cuda(_))
    }

    /// Parses `cpu`, `cuda`, `cuda:N`.
    pub fn parse(s: &str) -> crate::Result<Device> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| {
                    crate::Error::Msg(format!(
                        "unknown device '{s}': expected cpu, cuda or cuda:N"
                    ))
                }),
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}
