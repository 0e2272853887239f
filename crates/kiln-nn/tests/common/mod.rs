//! Helpers shared by kiln-nn's test binaries.

use kiln::Device;

/// The CPU and, when there is one, the first CUDA device; with `KILN_REQUIRE_CUDA=1` a
/// missing CUDA device is a failure, not a skip.
pub fn devices() -> Vec<Device> {
    let mut d = vec![Device::Cpu];
    if kiln::cuda::is_available() {
        d.push(Device::Cuda(0));
    } else if std::env::var("KILN_REQUIRE_CUDA").is_ok_and(|v| v == "1") {
        panic!("KILN_REQUIRE_CUDA=1 but CUDA is unavailable");
    }
    d
}
