//! The order in which Strata's writers (flat directory, `.cawsf`) lay out a decoder
//! layer's tensors, as read units: the layer core, then each routed expert or neuron
//! group.

use std::collections::BTreeMap;

use super::{layer_tensor, unit_tensor};
use strata_tensor::tensor::HostTensor;

/// One read unit of a decoder layer as the writers lay it out: the layer core
/// (attention, norms, router, shared expert, a sparse FFN's gate) or one routed expert
/// or neuron group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerUnit {
    /// `None` for the core, `Some(e)` for routed expert (or neuron group) `e`.
    pub expert: Option<usize>,
    /// Indices into the group's tensors, in the order they are written.
    pub tensors: Vec<usize>,
}

/// An expert's tensors in the order they are written, per naming (Qwen MoE, Mixtral):
/// gate, up, down (a neuron group has no gate: up, down).
const EXPERT_ORDER: [[&str; 3]; 2] =
    [["gate_proj.weight", "up_proj.weight", "down_proj.weight"], ["w1.weight", "w3.weight", "w2.weight"]];

/// The order in which both writers store a group's tensors, as units: the core first,
/// its tensors in the order handed over; then each routed expert by ascending index
/// (expert 10 after expert 9), its tensors gate, up, down ([`EXPERT_ORDER`]), then any
/// others of the expert by name. Units without tensors are left out, so a group without
/// experts is one unit in the order handed over (dense layers are written as before).
/// The one place this order is decided.
pub fn layer_units(tensors: &[(String, HostTensor)]) -> Vec<LayerUnit> {
    let mut core = Vec::new();
    let mut experts: BTreeMap<usize, Vec<(usize, &str, usize)>> = BTreeMap::new();
    for (i, (name, _)) in tensors.iter().enumerate() {
        match layer_tensor(name).and_then(|(_, local)| unit_tensor(local)) {
            None => core.push(i),
            Some((e, rest)) => {
                let rank = EXPERT_ORDER.iter().find_map(|o| o.iter().position(|n| *n == rest));
                experts.entry(e).or_default().push((rank.unwrap_or(EXPERT_ORDER[0].len()), rest, i));
            }
        }
    }
    let core = (!core.is_empty()).then_some(LayerUnit { expert: None, tensors: core });
    let experts = experts.into_iter().map(|(e, mut ts)| {
        ts.sort_unstable();
        LayerUnit { expert: Some(e), tensors: ts.into_iter().map(|(_, _, i)| i).collect() }
    });
    core.into_iter().chain(experts).collect()
}

/// Synthetic layers and their layout checks, for the tests of this crate and of the
/// model layer's conversion (a test module cannot cross crates).
#[doc(hidden)]
pub mod testing {
    use super::*;
    use crate::{ModelMeta, flat};

    /// Routed experts of [`moe_layer`]: enough that string order (`10` before `2`) would
    /// show.
    pub const EXPERTS: usize = 12;
    const HIDDEN: usize = 64;

    /// A meta whose config the readers parse (the writers do not check tensors against it).
    pub fn tiny_meta() -> ModelMeta {
        ModelMeta {
            name: "tiny-moe".into(),
            config_json: r#"{"model_type":"llama","hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,
                "num_attention_heads":2,"vocab_size":4}"#
                .into(),
            tokenizer_json: "{}".into(),
            tokenizer_config_json: None,
            generation_config_json: None,
            chat_template: None,
        }
    }

    /// An F32 tensor whose values repeat (so zstd shrinks it) and differ per `seed`.
    pub fn filled(shape: Vec<usize>, seed: usize) -> HostTensor {
        let data: Vec<f32> = (0..shape.iter().product::<usize>()).map(|k| (seed * 8 + k % 7) as f32).collect();
        HostTensor::from_f32(&data, shape)
    }

    /// Layer 0 of a synthetic MoE model: attention, norms, the router, for Qwen naming
    /// the shared expert and its gate, and [`EXPERTS`] routed experts whose tensors span
    /// one to three pages. Sorted by name, as `convert` hands them over: expert 10 comes
    /// before expert 2, Mixtral's `w2` before `w3`.
    pub fn moe_layer(mixtral: bool) -> Vec<(String, HostTensor)> {
        let h = HIDDEN;
        let mut core = vec![
            ("input_layernorm.weight", vec![h]),
            ("post_attention_layernorm.weight", vec![h]),
            ("self_attn.q_proj.weight", vec![h, h]),
            ("self_attn.k_proj.weight", vec![h / 2, h]),
            ("self_attn.v_proj.weight", vec![h / 2, h]),
            ("self_attn.o_proj.weight", vec![h, h]),
        ];
        let (prefix, names) = match mixtral {
            true => ("block_sparse_moe", EXPERT_ORDER[1]),
            false => ("mlp", EXPERT_ORDER[0]),
        };
        match mixtral {
            true => core.push(("block_sparse_moe.gate.weight", vec![EXPERTS, h])),
            false => core.extend([
                ("mlp.gate.weight", vec![EXPERTS, h]),
                ("mlp.shared_expert.gate_proj.weight", vec![32, h]),
                ("mlp.shared_expert.up_proj.weight", vec![32, h]),
                ("mlp.shared_expert.down_proj.weight", vec![h, 32]),
                ("mlp.shared_expert_gate.weight", vec![1, h]),
            ]),
        }
        let mut out: Vec<(String, Vec<usize>)> =
            core.into_iter().map(|(n, shape)| (format!("model.layers.0.{n}"), shape)).collect();
        for e in 0..EXPERTS {
            let rows = (e % 5 + 1) * 8; // 2 to 10 KiB per tensor in F32
            for (name, shape) in names.iter().zip([vec![rows, h], vec![rows, h], vec![h, rows]]) {
                out.push((format!("model.layers.0.{prefix}.experts.{e}.{name}"), shape));
            }
        }
        out.sort_unstable();
        out.into_iter().enumerate().map(|(seed, (name, shape))| (name, filled(shape, seed))).collect()
    }

    /// Checks the MoE layout of one written layer from each tensor's byte span `[start,
    /// end)` in its file: the core first, at `layer_start`; then experts `0..experts` in
    /// order; each unit's tensors back to back (less than a page apart) with nothing of
    /// another unit between them; each unit starting on a page; each expert's tensors
    /// gate, up, down.
    pub fn assert_unit_layout(spans: &[(String, u64, u64)], layer_start: u64, experts: usize) {
        let mut spans = spans.to_vec();
        spans.sort_by_key(|s| s.1);
        let mut units: Vec<(Option<usize>, Vec<&str>)> = Vec::new();
        for (i, (name, start, _)) in spans.iter().enumerate() {
            let (unit, rest) = match layer_tensor(name).and_then(|(_, local)| unit_tensor(local)) {
                Some((e, rest)) => (Some(e), rest),
                None => (None, name.as_str()),
            };
            match units.last_mut() {
                Some((u, rests)) if *u == unit => {
                    let gap = start.checked_sub(spans[i - 1].2);
                    assert!(
                        gap.is_some_and(|g| g < flat::ALIGN),
                        "`{name}` is {gap:?} bytes after its unit's previous tensor"
                    );
                    rests.push(rest);
                }
                _ => {
                    assert_eq!(start % flat::ALIGN, 0, "unit {unit:?} (`{name}`) starts at {start}, not on a page");
                    units.push((unit, vec![rest]));
                }
            }
        }
        assert_eq!(spans.first().map(|s| s.1), Some(layer_start), "the layer starts with its core");
        let order: Vec<Option<usize>> = units.iter().map(|u| u.0).collect();
        let want: Vec<Option<usize>> = std::iter::once(None).chain((0..experts).map(Some)).collect();
        assert_eq!(order, want, "units split or out of order");
        for (e, rests) in &units[1..] {
            assert!(EXPERT_ORDER.iter().any(|o| o[..] == rests[..]), "expert {e:?} holds {rests:?}");
        }
    }

    #[test]
    fn experts_follow_the_core_in_numeric_order() {
        for mixtral in [false, true] {
            let layer = moe_layer(mixtral);
            let units = layer_units(&layer);
            assert_eq!(units.len(), 1 + EXPERTS, "mixtral: {mixtral}");
            let core: Vec<usize> = (0..layer.len()).filter(|&i| !layer[i].0.contains(".experts.")).collect();
            assert_eq!(units[0], LayerUnit { expert: None, tensors: core }, "the core keeps the order handed over");
            for (e, unit) in units[1..].iter().enumerate() {
                assert_eq!(unit.expert, Some(e));
                let names: Vec<&str> = unit.tensors.iter().map(|&i| layer[i].0.as_str()).collect();
                let order = EXPERT_ORDER[usize::from(mixtral)];
                assert!(names.iter().zip(order).all(|(n, o)| n.ends_with(&format!(".experts.{e}.{o}"))), "{names:?}");
            }
        }
    }

    #[test]
    fn a_dense_layer_is_one_unit_in_the_order_handed_over() {
        let names = ["self_attn.v_proj.weight", "mlp.gate_proj.weight", "input_layernorm.weight", "mlp.gate.bias"];
        let layer: Vec<_> = names.iter().map(|n| (format!("model.layers.3.{n}"), filled(vec![4], 0))).collect();
        assert_eq!(layer_units(&layer), [LayerUnit { expert: None, tensors: vec![0, 1, 2, 3] }]);
        let global = [("model.embed_tokens.weight".to_string(), filled(vec![4], 0))];
        assert_eq!(layer_units(&global), [LayerUnit { expert: None, tensors: vec![0] }]);
        assert_eq!(layer_units(&[]), []);
    }
}
