//! The x86 vector instruction sets the CPU kernels may use: what the CPU has, capped by
//! `STRATA_CPU_ISA` (`avx2`, or `scalar` for none; unset or `native`: no cap). The cap
//! lets an AVX-512 machine run, test and time exactly the paths an AVX2-only machine
//! takes. Each kernel module still checks the CPU's own features.

use std::sync::OnceLock;

/// Instruction-set tiers, lowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    Scalar,
    Avx2,
    Avx512,
}

impl Isa {
    /// Parses a `STRATA_CPU_ISA` value (`None`: not one).
    pub fn parse(value: &str) -> Option<Isa> {
        match value.trim().to_ascii_lowercase().as_str() {
            "" | "native" | "avx512" => Some(Isa::Avx512),
            "avx2" => Some(Isa::Avx2),
            "scalar" | "none" => Some(Isa::Scalar),
            _ => None,
        }
    }
}

/// The cap from `STRATA_CPU_ISA`, read once; an unknown value is ignored with one warning.
pub fn cap() -> Isa {
    static CAP: OnceLock<Isa> = OnceLock::new();
    *CAP.get_or_init(|| match strata_tensor::env::CPU_ISA.get() {
        None => Isa::Avx512,
        Some(v) => Isa::parse(v).unwrap_or_else(|| {
            tracing::warn!("STRATA_CPU_ISA={v:?} is not one of native, avx512, avx2, scalar; ignored");
            Isa::Avx512
        }),
    })
}

/// Whether AVX-512 kernels may run (the CPU's own features are checked separately).
pub fn avx512() -> bool {
    cap() >= Isa::Avx512
}

/// Whether AVX2 kernels may run (the CPU's own features are checked separately).
pub fn avx2() -> bool {
    cap() >= Isa::Avx2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_parse_to_tiers() {
        assert_eq!(Isa::parse("AVX2"), Some(Isa::Avx2));
        assert_eq!(Isa::parse(" scalar "), Some(Isa::Scalar));
        assert_eq!(Isa::parse("native"), Some(Isa::Avx512));
        assert_eq!(Isa::parse("sse4"), None);
        assert!(Isa::Scalar < Isa::Avx2 && Isa::Avx2 < Isa::Avx512);
    }
}
