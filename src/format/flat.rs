//! Being written (issue 5).

use std::path::Path;

use crate::model::ModelSource;

/// Opens a model in this format.
pub fn open(path: &Path) -> anyhow::Result<ModelSource> {
    anyhow::bail!("{}: this format is not readable yet", path.display())
}
