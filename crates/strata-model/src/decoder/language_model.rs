//! The decoder as the engine sees it: [`LanguageModel`](crate::LanguageModel).

use super::*;

impl<B: Backend> crate::LanguageModel for DecoderModel<B> {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn new_cache(&self, capacity: usize) -> Result<KvCache, ModelError> {
        DecoderModel::new_cache(self, capacity)
    }

    fn reserve_cache(&self, cache: &mut KvCache, positions: usize) -> Result<(), ModelError> {
        DecoderModel::reserve_cache(self, cache, positions)
    }

    fn free_memory(&self) -> Option<u64> {
        self.backend.free_memory()
    }

    fn forward_until(
        &self,
        batch: &mut [SeqStep<'_>],
        cancelled: &(dyn Fn() -> bool + Sync),
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        DecoderModel::forward_until(self, batch, cancelled)
    }

    fn forward_top_k(
        &self,
        batch: &mut [SeqStep<'_>],
        k: usize,
        cancelled: &(dyn Fn() -> bool + Sync),
    ) -> Result<Vec<TopK>, ModelError> {
        DecoderModel::forward_top_k(self, batch, k, cancelled)
    }

    fn forward_rows(
        &self,
        batch: &mut [SeqStep<'_>],
        readback: Readback,
        cancelled: &(dyn Fn() -> bool + Sync),
    ) -> Result<PassRows, ModelError> {
        let (logits, counts, top) = self.run(batch, cancelled, readback)?;
        Ok(PassRows { logits, counts, top })
    }

    fn embed(&self, tokens: &[u32], cancelled: &(dyn Fn() -> bool + Sync)) -> Result<Vec<f32>, ModelError> {
        DecoderModel::embed(self, tokens, cancelled)
    }

    fn scheduler(&self) -> &dyn SchedInfo {
        &self.layers
    }

    fn backend_name(&self) -> String {
        self.backend.name()
    }

    fn chunking_changes_rows(&self) -> bool {
        self.backend.chunking_changes_rows()
    }

    fn device_bytes(&self) -> u64 {
        self.backend.device_bytes()
    }

    fn memory_bandwidth(&self) -> Option<f64> {
        self.backend.memory_bandwidth()
    }

    fn launch_stats(&self) -> Option<strata_backend::LaunchStats> {
        self.backend.launch_stats()
    }

    fn weights_bytes(&self) -> usize {
        self.weights_bytes
    }

    fn lm_head_bytes(&self) -> usize {
        self.lm_head_bytes
    }
}
