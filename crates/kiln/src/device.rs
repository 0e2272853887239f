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
    /// The GPU adapter with this ordinal among those wgpu finds (Vulkan, Metal or DX12; real
    /// GPUs first, software rasterisers such as lavapipe last): see `kiln::wgpu::adapters`.
    Wgpu(usize),
}

impl Device {
    pub fn is_cpu(self) -> bool {
        matches!(self, Device::Cpu)
    }

    pub fn is_cuda(self) -> bool {
        matches!(self, Device::Cuda(_))
    }

    pub fn is_wgpu(self) -> bool {
        matches!(self, Device::Wgpu(_))
    }

    /// Parses `cpu`, `cuda`, `cuda:N`, `wgpu`, `wgpu:N`.
    ///
    /// ```
    /// use kiln::Device;
    /// assert_eq!(Device::parse("wgpu:1")?, Device::Wgpu(1));
    /// assert!(Device::parse("tpu").is_err());
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn parse(s: &str) -> crate::Result<Device> {
        let ordinal = |prefix: &str| s.strip_prefix(prefix).and_then(|n| n.parse().ok());
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            "wgpu" => Ok(Device::Wgpu(0)),
            _ => ordinal("cuda:")
                .map(Device::Cuda)
                .or_else(|| ordinal("wgpu:").map(Device::Wgpu))
                .ok_or_else(|| {
                    crate::Error::Msg(format!(
                        "unknown device '{s}': expected cpu, cuda, cuda:N, wgpu or wgpu:N"
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
            Device::Wgpu(n) => write!(f, "wgpu:{n}"),
        }
    }
}
