//! The host→device leg of streaming as the scheduler uses it. The staging contract
//! ([`Stage`], [`CopyEngine`]) and the uploader live in the backend layer
//! ([`strata_backend::stage`]); the scheduler is given a [`StageFactory`].

use std::sync::Arc;

use strata_backend::BackendError;
pub use strata_backend::stage::{
    CopyEngine, DeviceRead, Early, SlotHold, Stage, Staged, TransferSnapshot, TransferStats, UploadSummary, Uploader,
};

/// Makes the stage a streaming scheduler uploads through, given the slot size (the
/// largest streamed unit) and the number of slots in the ring.
#[derive(Clone)]
pub struct StageFactory(
    #[allow(clippy::type_complexity)]
    pub  Arc<dyn Fn(usize, usize, Arc<TransferStats>) -> Result<Arc<dyn Stage>, BackendError> + Send + Sync>,
);

impl std::fmt::Debug for StageFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StageFactory")
    }
}
