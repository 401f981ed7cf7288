//! Errors written for people.

/// `e` and its causes on one line, `a: b: c`, as `{e:#}` writes them, but each message
/// once. An error whose text already ends with its cause's (thiserror's
/// `#[error("{path}: {source}")]`, which also returns the source from `source()`) would
/// otherwise repeat it: `x.bin: No such file or directory (os error 2): No such file or
/// directory (os error 2)`.
pub fn chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    let mut parent = String::new();
    for (i, cause) in e.chain().enumerate() {
        let text = cause.to_string();
        if i == 0 {
            out.push_str(&text);
        } else if !repeats(&parent, &text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        parent = text;
    }
    out
}

/// Whether `parent` ends with all of `cause`, not just the end of a word or number of it
/// (`layer 12` does not repeat `2`).
fn repeats(parent: &str, cause: &str) -> bool {
    parent.strip_suffix(cause).is_some_and(|head| !head.ends_with(|c: char| c.is_alphanumeric()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{path}: {source}")]
    struct Io {
        path: String,
        source: std::io::Error,
    }

    #[test]
    fn a_cause_its_error_already_says_is_written_once() {
        let io = std::io::Error::other("disk on fire");
        let e = anyhow::Error::new(Io { path: "m/layer_001.bin".into(), source: io }).context("loading `m`");
        assert_eq!(format!("{e:#}"), "loading `m`: m/layer_001.bin: disk on fire: disk on fire");
        assert_eq!(chain(&e), "loading `m`: m/layer_001.bin: disk on fire");
        // Causes that differ, or only share the end of a word or number, are all written.
        let e = anyhow::anyhow!("2").context("layer 12").context("loading");
        assert_eq!(chain(&e), "loading: layer 12: 2");
    }
}
