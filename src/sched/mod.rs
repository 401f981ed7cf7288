//! Where weights live. The model asks the scheduler for each layer's weights, every
//! token, in order; the scheduler decides whether they are resident or streamed. Today
//! every layer is resident: layer streaming adds a policy here without touching the
//! model code, which only ever sees `Arc<L>` handles from [`Scheduler::layer`].

pub mod io;
pub mod plan;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::tensor::HostTensor;

/// The host tensors of one layer, by their name inside the layer (for Hugging Face
/// checkpoints, the part after `model.layers.N.`).
#[derive(Clone, Debug, Default)]
pub struct LayerTensors {
    pub index: usize,
    pub tensors: HashMap<String, HostTensor>,
}

impl LayerTensors {
    pub fn get(&self, name: &str) -> Result<&HostTensor, SchedError> {
        self.tensors.get(name).ok_or_else(|| SchedError::MissingTensor { layer: self.index, name: name.to_string() })
    }

    pub fn get_opt(&self, name: &str) -> Option<&HostTensor> {
        self.tensors.get(name)
    }

    /// Bytes of weights in this layer.
    pub fn bytes(&self) -> usize {
        self.tensors.values().map(|t| t.bytes().len()).sum()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SchedError {
    #[error("layer {layer}: missing tensor `{name}`")]
    MissingTensor { layer: usize, name: String },
    #[error("layer {layer}: {msg}")]
    Build { layer: usize, msg: String },
    #[error("layer {0} does not exist")]
    NoSuchLayer(usize),
}

/// Counters the benchmarks report.
#[derive(Debug, Default)]
pub struct SchedStats {
    pub layer_requests: AtomicU64,
    pub layer_hits: AtomicU64,
    pub bytes_read: AtomicU64,
}

/// Hands out each layer's weights (`L`, built by the model from [`LayerTensors`]).
pub struct Scheduler<L> {
    layers: Vec<Arc<L>>,
    layer_bytes: Vec<usize>,
    stats: SchedStats,
}

impl<L: Send + Sync> Scheduler<L> {
    /// Every layer resident: `build` runs once per layer now.
    pub fn resident(
        sources: Vec<LayerTensors>,
        build: impl Fn(&LayerTensors) -> Result<L, SchedError>,
    ) -> Result<Self, SchedError> {
        let layer_bytes = sources.iter().map(LayerTensors::bytes).collect();
        let layers = sources.iter().map(|s| build(s).map(Arc::new)).collect::<Result<_, _>>()?;
        Ok(Scheduler { layers, layer_bytes, stats: SchedStats::default() })
    }

    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// The weights of layer `i`, ready for compute.
    pub fn layer(&self, i: usize) -> Result<Arc<L>, SchedError> {
        self.stats.layer_requests.fetch_add(1, Ordering::Relaxed);
        let layer = self.layers.get(i).ok_or(SchedError::NoSuchLayer(i))?;
        self.stats.layer_hits.fetch_add(1, Ordering::Relaxed);
        Ok(layer.clone())
    }

    /// Bytes of layer weights the memory budget governs.
    pub fn streamable_bytes(&self) -> usize {
        self.layer_bytes.iter().sum()
    }

    /// Bytes of layer weights kept resident.
    pub fn resident_bytes(&self) -> usize {
        self.streamable_bytes()
    }

    pub fn stats(&self) -> &SchedStats {
        &self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_layers_are_built_once_and_counted() {
        let sources = (0..3).map(|index| LayerTensors { index, ..Default::default() }).collect();
        let built = std::cell::Cell::new(0);
        let s = Scheduler::resident(sources, |t| {
            built.set(built.get() + 1);
            Ok(t.index * 10)
        })
        .unwrap();
        for _ in 0..2 {
            for i in 0..3 {
                assert_eq!(*s.layer(i).unwrap(), i * 10);
            }
        }
        assert_eq!(built.get(), 3);
        assert_eq!(s.stats().layer_requests.load(Ordering::Relaxed), 6);
        assert!(matches!(s.layer(3), Err(SchedError::NoSuchLayer(3))));
    }
}
