//! Every `STRATA_*` environment variable Strata reads, in one table: its name, what it
//! takes, its default and what it does. Each is read here, once per process, at its
//! first use; nothing else reads the environment for a `STRATA_*` name. (Tests and
//! benchmark scripts have knobs of their own, read where they run.)
//!
//! Most are settings; the ones marked `debug` change which kernel or path runs, for
//! debugging and for comparing kernels, and are not needed to run Strata well. Besides
//! these, every setting of `strata serve` (each long option, and each key of its config
//! file) has a variable named after it, `STRATA_PORT` for `port`: the command line reads
//! those with the config file, by the settings' own table.

use std::ffi::{OsStr, OsString};
use std::sync::OnceLock;

/// One environment variable.
#[derive(Debug)]
pub struct Var {
    pub name: &'static str,
    /// What it takes, in words.
    pub takes: &'static str,
    /// What applies when it is unset or empty.
    pub default: &'static str,
    pub doc: &'static str,
    /// A knob for debugging or comparing kernels rather than a setting.
    pub debug: bool,
}

pub static HOME: Var = Var {
    name: "STRATA_HOME",
    takes: "a directory",
    default: "~/.strata",
    doc: "Where the model store, its staging area, downloads and the kernel cache live.",
    debug: false,
};

pub static CONFIG: Var = Var {
    name: "STRATA_CONFIG",
    takes: "a file",
    default: "/etc/strata/strata.toml, else $STRATA_HOME/strata.toml, where one exists",
    doc: "The configuration file (as `--config`).",
    debug: false,
};

pub static GDS: Var = Var {
    name: "STRATA_GDS",
    takes: "on|off",
    default: "on where cuFile is present",
    doc: "Whether streamed layers are read from NVMe straight into GPU memory with GPUDirect Storage.",
    debug: false,
};

pub static CUDA_LIBS: Var = Var {
    name: "STRATA_CUDA_LIBS",
    takes: "directories, separated by `:`",
    default: "the loader's path, /usr/local/cuda*, pip's nvidia-* wheels",
    doc: "Where to look first for the CUDA libraries (NVRTC, cuBLAS, cuFile).",
    debug: false,
};

pub static CPU_ISA: Var = Var {
    name: "STRATA_CPU_ISA",
    takes: "native|avx512|avx2|scalar",
    default: "native",
    doc: "The widest CPU instruction set the kernels may use (the CPU's own features still apply): \
          how a machine without AVX-512 is tested on one that has it.",
    debug: true,
};

pub static CPU_PANELS: Var = Var {
    name: "STRATA_CPU_PANELS",
    takes: "on|off",
    default: "on",
    doc: "Whether the CPU repacks quantized weights into 16-row panels for its decode kernels; \
          off keeps every weight as stored.",
    debug: true,
};

pub static PANEL_PREFETCH: Var = Var {
    name: "STRATA_PANEL_PREFETCH",
    takes: "on|off",
    default: "off on AMD CPUs, on elsewhere",
    doc: "Whether the panel kernels prefetch 2 KiB ahead in software.",
    debug: true,
};

pub static CUDA_MATVEC: Var = Var {
    name: "STRATA_CUDA_MATVEC",
    takes: "wide|warp|packed",
    default: "wide",
    doc: "Which CUDA matrix-vector kernels decode runs: a block a row (`wide`), a warp a row (`warp`), or 16-byte weight loads (`packed`: Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/MXFP4/Q4_K/Q5_K/Q6_K/AFFINE_Q4/I8 weights repacked at upload, F32/F16/BF16 ones read in place where their rows are 16-byte aligned; other formats run `wide`).",
    debug: true,
};

pub static CUDA_ATTN: Var = Var {
    name: "STRATA_CUDA_ATTN",
    takes: "group|head",
    default: "head",
    doc: "Which CUDA attention kernel decode and verification (up to 8 query rows) run when query heads share KV heads: a block per KV head reading its keys once for the whole group (`group`), or a block per query head (`head`, what longer prompts and MHA run). The partials are the same bits either way on the CPU emulator; `group` has not yet run on a GPU.",
    debug: true,
};

pub static CUDA_STAGING: Var = Var {
    name: "STRATA_CUDA_STAGING",
    takes: "on|off",
    default: "on",
    doc: "Whether streamed layers are uploaded through pinned staging buffers; off uploads from \
          pageable memory.",
    debug: true,
};

pub static CUDA_GRAPHS: Var = Var {
    name: "STRATA_CUDA_GRAPHS",
    takes: "on|off",
    default: "off",
    doc: "Whether a CUDA decode step of a dense model whose weights are all resident runs as one CUDA graph: \
          captured once per batch size on a stream of its own, then replayed each step with only the kernels \
          whose arguments changed (positions, key counts) updated in it, no launch per kernel (steps that \
          stream weights or route experts launch kernel by kernel). Not yet run on a GPU.",
    debug: true,
};

/// The table, in the order the docs list it.
pub static ALL: [&Var; 11] = [
    &HOME,
    &CONFIG,
    &GDS,
    &CUDA_LIBS,
    &CPU_ISA,
    &CPU_PANELS,
    &PANEL_PREFETCH,
    &CUDA_MATVEC,
    &CUDA_ATTN,
    &CUDA_STAGING,
    &CUDA_GRAPHS,
];

/// The values of [`ALL`] as the process started with them (read at the first lookup).
fn values() -> &'static [Option<OsString>] {
    static VALUES: OnceLock<Vec<Option<OsString>>> = OnceLock::new();
    VALUES.get_or_init(|| ALL.iter().map(|v| std::env::var_os(v.name).filter(|s| !s.is_empty())).collect())
}

impl Var {
    /// The value this variable is set to; `None` when unset or empty.
    pub fn get_os(&'static self) -> Option<&'static OsStr> {
        let i = ALL.iter().position(|v| v.name == self.name).expect("every variable is in the table");
        values()[i].as_deref()
    }

    /// [`Self::get_os`] as text (`None` also when it is not UTF-8).
    pub fn get(&'static self) -> Option<&'static str> {
        self.get_os().and_then(OsStr::to_str)
    }

    /// An on/off variable: `Some(false)` for `off`, `0`, `false` or `no`, `Some(true)`
    /// for `on`, `1`, `true` or `yes` (any case), `None` when unset or anything else.
    pub fn switch(&'static self) -> Option<bool> {
        let v = self.get()?.trim().to_ascii_lowercase();
        match v.as_str() {
            "off" | "0" | "false" | "no" => Some(false),
            "on" | "1" | "true" | "yes" => Some(true),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variable_is_named_once_and_documented() {
        let mut names: Vec<&str> = ALL.iter().map(|v| v.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ALL.len(), "a name twice in the table");
        for v in ALL {
            assert!(v.name.starts_with("STRATA_"), "{}", v.name);
            assert!(!v.takes.is_empty() && !v.default.is_empty() && v.doc.ends_with('.'), "{}", v.name);
        }
    }
}
