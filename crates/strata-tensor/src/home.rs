//! Where Strata keeps its files: `$STRATA_HOME`, or `~/.strata`.

use std::ffi::OsString;
use std::path::PathBuf;

/// `$STRATA_HOME`, or `~/.strata` where it is unset or empty.
pub fn strata_home() -> PathBuf {
    home_from(crate::env::HOME.get_os().map(OsString::from), std::env::var_os("HOME"))
}

/// [`strata_home`] from the values of `STRATA_HOME` and `HOME`. An empty `STRATA_HOME=`
/// counts as unset, as an empty `XDG_DATA_HOME` does: not as the current directory.
fn home_from(strata_home: Option<OsString>, home: Option<OsString>) -> PathBuf {
    match strata_home.filter(|h| !h.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => home.map(PathBuf::from).unwrap_or_else(|| PathBuf::from(".")).join(".strata"),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn an_empty_strata_home_is_the_default_home() {
        let os = |s: &str| Some(OsString::from(s));
        assert_eq!(home_from(os("/srv/strata"), os("/home/u")), Path::new("/srv/strata"));
        assert_eq!(home_from(None, os("/home/u")), Path::new("/home/u/.strata"));
        assert_eq!(home_from(os(""), os("/home/u")), Path::new("/home/u/.strata"));
    }
}
