//! `--sparse-ffn`: the setting that says how a model stored with neuron-group bundles
//! runs its FFNs (`off`, `auto`, `topk=F`, `threshold=T`); the gate-predicted sparse FFN
//! that reads it is `model::sparse`, a layer above.

use std::fmt;

/// The fraction of groups `auto` keeps: the sparsest `topk` whose perplexity on
/// SmolLM2-135M-Instruct (converted with the default group size, 8 groups a layer) rises
/// by at most 2%. None below 1 does (7 of 8 groups already costs over 40%;
/// docs/benchmarks.md, "Sparse FFN"), so `auto` keeps every group: the sparse path's
/// reads and bookkeeping with the dense result.
pub const AUTO_TOPK: f64 = 1.0;

/// Which neuron groups a row keeps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Select {
    /// Every group (the dense result, computed group by group).
    Off,
    /// The `⌈F · groups⌉` groups with the largest gate activity, `F` in (0, 1].
    TopK(f64),
    /// The groups whose mean `|act(gate)| · scale` over their neurons is at least `T ≥ 0`
    /// (`model::sparse::neuron_scale`).
    Threshold(f64),
}

/// `--sparse-ffn`: how a model stored with neuron-group bundles runs its FFNs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SparseFfn {
    pub select: Select,
    /// Choose once per sequence of a forward pass (the union of its rows' activity:
    /// CoreInfer-style prefill) instead of per row.
    pub per_sequence: bool,
    /// Chosen as `auto` (shown as such).
    pub auto: bool,
}

impl Default for SparseFfn {
    fn default() -> Self {
        SparseFfn { select: Select::Off, per_sequence: false, auto: false }
    }
}

impl SparseFfn {
    /// `off`, `auto`, `topk=F` or `threshold=T`, then optionally `,per=token|sequence`.
    pub fn parse(s: &str) -> Result<SparseFfn, String> {
        let mut parts = s.split(',').map(str::trim);
        let head = parts.next().unwrap_or_default();
        let num = |v: &str, what: &str| {
            v.trim().parse::<f64>().map_err(|_| format!("`{s}`: {what} takes a number, found `{v}`"))
        };
        let mut out = SparseFfn::default();
        match head.split_once('=') {
            None if head == "off" => {}
            None if head == "auto" => out = SparseFfn { select: Select::TopK(AUTO_TOPK), auto: true, ..out },
            Some(("topk", v)) => match num(v, "topk")? {
                f if f > 0.0 && f <= 1.0 => out.select = Select::TopK(f),
                f => return Err(format!("`{s}`: topk is a fraction of the neuron groups in (0, 1], found {f}")),
            },
            Some(("threshold", v)) => match num(v, "threshold")? {
                t if t >= 0.0 && t.is_finite() => out.select = Select::Threshold(t),
                t => return Err(format!("`{s}`: threshold is a mean activation of at least 0, found {t}")),
            },
            _ => return Err(format!("`{s}`: expected off, auto, topk=F or threshold=T")),
        }
        for part in parts {
            match part {
                "per=token" => out.per_sequence = false,
                "per=sequence" => out.per_sequence = true,
                _ => return Err(format!("`{s}`: after the setting only `per=token` or `per=sequence` may follow")),
            }
        }
        if out.select == Select::Off && out.per_sequence {
            return Err(format!("`{s}`: `off` chooses nothing per sequence"));
        }
        Ok(out)
    }

    pub fn is_off(&self) -> bool {
        self.select == Select::Off
    }

    /// Whether it keeps every group whatever the gate says (`off`, `topk=1`,
    /// `threshold=0`, and `auto` where that is `topk=1`).
    pub fn keeps_all(&self) -> bool {
        match self.select {
            Select::Off => true,
            Select::TopK(f) => f >= 1.0,
            Select::Threshold(t) => t <= 0.0,
        }
    }
}

impl std::str::FromStr for SparseFfn {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        SparseFfn::parse(s)
    }
}

impl fmt::Display for SparseFfn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.select {
            Select::Off => return f.write_str("off"),
            _ if self.auto => f.write_str("auto")?,
            Select::TopK(k) => write!(f, "topk={k}")?,
            Select::Threshold(t) => write!(f, "threshold={t}")?,
        }
        if self.per_sequence {
            f.write_str(",per=sequence")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_bad_ones_say_why() {
        assert_eq!(SparseFfn::parse("off").unwrap(), SparseFfn::default());
        let t = SparseFfn::parse("topk=0.5").unwrap();
        assert_eq!((t.select, t.per_sequence, t.to_string()), (Select::TopK(0.5), false, "topk=0.5".into()));
        let a = SparseFfn::parse("auto").unwrap();
        assert_eq!((a.select, a.to_string()), (Select::TopK(AUTO_TOPK), "auto".into()));
        let s = SparseFfn::parse("threshold=0.05,per=sequence").unwrap();
        assert_eq!((s.select, s.per_sequence), (Select::Threshold(0.05), true));
        assert_eq!(s.to_string(), "threshold=0.05,per=sequence");
        for bad in [
            "topk=0",
            "topk=1.5",
            "topk=-1",
            "topk=x",
            "threshold=-0.1",
            "threshold=inf",
            "dense",
            "off,per=sequence",
            "topk=0.5,per=layer",
        ] {
            assert!(SparseFfn::parse(bad).is_err(), "{bad} was accepted");
        }
        assert!(SparseFfn::parse("topk=1.5").unwrap_err().contains("(0, 1]"));
        assert!(SparseFfn::parse("threshold=-1").unwrap_err().contains("at least 0"));
    }
}
