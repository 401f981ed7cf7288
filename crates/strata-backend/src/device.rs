//! `--device auto|cpu|cuda[:N]`: parsed once, resolved once into the backend a model is
//! built for. Nothing past the loader branches on the device.

use std::fmt;
use std::str::FromStr;

/// What the user asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DeviceSpec {
    /// The first GPU that initialises, else the CPU.
    #[default]
    Auto,
    Cpu,
    /// The CUDA device with this ordinal.
    Cuda(usize),
}

impl FromStr for DeviceSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim().to_ascii_lowercase();
        match s.as_str() {
            "auto" => Ok(DeviceSpec::Auto),
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" | "gpu" => Ok(DeviceSpec::Cuda(0)),
            _ => {
                let n = s.strip_prefix("cuda:").or_else(|| s.strip_prefix("gpu:"));
                match n.map(|n| n.parse::<usize>()) {
                    Some(Ok(n)) => Ok(DeviceSpec::Cuda(n)),
                    _ => Err(format!("`{s}` is not a device: use auto, cpu, cuda or cuda:N")),
                }
            }
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Auto => f.write_str("auto"),
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// The device a model actually runs on, as `/health`, `/metrics`, `/api/ps` and `bench`
/// report it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct DeviceInfo {
    /// `cpu` or `cuda:N`.
    pub device: String,
    /// The processor or GPU, in words.
    pub name: String,
}

impl DeviceInfo {
    pub fn cpu() -> Self {
        DeviceInfo { device: "cpu".into(), name: cpu_model().unwrap_or_else(|| "unknown CPU".into()) }
    }
}

/// The CPU's model name from `/proc/cpuinfo`, if it says.
pub fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|rest| rest.split_once(':'))
        .map(|(_, name)| name.trim().to_string())
}

/// `KEY:   123 kB` of `/proc/meminfo` text, in bytes.
pub fn meminfo_bytes(text: &str, key: &str) -> Option<u64> {
    let rest = text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))?;
    let mut parts = rest.split_whitespace();
    let n: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") => n.checked_mul(1024),
        None => Some(n),
        Some(_) => None,
    }
}

/// `MemAvailable` of `/proc/meminfo` in bytes; `None` where it cannot be read.
pub fn available_memory() -> Option<u64> {
    meminfo_bytes(&std::fs::read_to_string("/proc/meminfo").ok()?, "MemAvailable")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_specs_parse() {
        assert_eq!("auto".parse::<DeviceSpec>(), Ok(DeviceSpec::Auto));
        assert_eq!("CPU".parse::<DeviceSpec>(), Ok(DeviceSpec::Cpu));
        assert_eq!("cuda".parse::<DeviceSpec>(), Ok(DeviceSpec::Cuda(0)));
        assert_eq!("cuda:3".parse::<DeviceSpec>(), Ok(DeviceSpec::Cuda(3)));
        for bad in ["cuda:", "cuda:x", "tpu", "cuda:-1", ""] {
            assert!(bad.parse::<DeviceSpec>().is_err(), "{bad}");
        }
        assert_eq!(DeviceSpec::Cuda(1).to_string(), "cuda:1");
    }
}
