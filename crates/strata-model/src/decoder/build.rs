//! A layer's weights, built from its tensors for a backend.

use super::*;

/// A norm weight as the forward pass uses it (Gemma's checkpoints store `w - 1`).
pub(super) fn norm_weight(t: &HostTensor, stored_minus_one: bool) -> HostTensor {
    match stored_minus_one {
        false => t.clone(),
        true => HostTensor::from_f32(&t.to_f32_vec().iter().map(|w| w + 1.0).collect::<Vec<_>>(), t.shape.clone()),
    }
}

/// One layer's weights from its host tensors, as the spec names and shapes them; fused
/// projections are split by rows.
pub(super) fn build_layer<B: Backend>(
    c: &ModelConfig,
    be: &B,
    lt: &LayerTensors,
) -> Result<LayerWeights<B>, SchedError> {
    let spec = c.spec();
    let build_err = |msg: String| SchedError::Build { layer: lt.index, msg };
    let host = |role: Role| -> Result<Option<HostTensor>, SchedError> {
        if !spec.layer_roles(c, lt.index).any(|r| r == role) {
            return Ok(None);
        }
        let name = spec.tensor(role).map_or("", |t| t.hf);
        let t = lt.get(name)?;
        let want = role.shape(c);
        if t.shape != want {
            return Err(build_err(format!("tensor `{name}`: expected shape {want:?}, found {:?}", t.shape)));
        }
        Ok(Some(if role.is_norm() { norm_weight(t, spec.hf_norm_offset) } else { t.clone() }))
    };
    let upload = |t: &HostTensor| be.weight(t).map_err(|source| SchedError::Backend { layer: lt.index, source });
    let opt = |role: Role| -> Result<Option<B::Weight>, SchedError> { host(role)?.as_ref().map(upload).transpose() };
    let req = |role: Role, t: Option<HostTensor>| -> Result<HostTensor, SchedError> {
        t.ok_or_else(|| build_err(format!("the spec of `{}` has no {role:?} tensor", spec.hf_type)))
    };
    let (q_dim, kv_dim, i) = (c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.intermediate_size);
    let split = |t: &HostTensor, at: &[(usize, usize)]| -> Result<Vec<HostTensor>, SchedError> {
        at.iter()
            .map(|&(start, n)| t.rows(start, n).ok_or_else(|| build_err(format!("cannot split rows of {t:?}"))))
            .collect()
    };
    let kind = c.layers.get(lt.index).map(|l| l.mixer);
    let mixer = match kind {
        Some(Mixer::Latent) => MixerWeights::Latent(crate::mla::build(c, be, lt.index, &host)?),
        Some(Mixer::Linear) => {
            let need = |role: Role| req(role, host(role)?);
            // Qwen3-Next's projections come grouped by key head; Qwen3.5's (and a GGUF
            // Qwen3-Next's queries, keys and values) apart, stacked here into the same two
            // products (queries, keys, values, z; then b, a).
            let stack = |x: Role, y: Role| {
                let (x, y) = (need(x)?, need(y)?);
                let parts = [(&x, 0, x.shape[0]), (&y, 0, y.shape[0])];
                concat_rows(&parts).ok_or_else(|| build_err(format!("cannot stack {x:?} and {y:?}")))
            };
            let (qkvz, qkvz_grouped) = match host(Role::LinQkvz)? {
                Some(t) => (t, true),
                None => (stack(Role::LinQkv, Role::LinZ)?, false),
            };
            let (ba, ba_grouped) = match host(Role::LinBa)? {
                Some(t) => (t, true),
                None => (stack(Role::LinB, Role::LinA)?, false),
            };
            let neg_a = match host(Role::LinNegA)? {
                Some(t) => t.to_f32_vec(),
                None => need(Role::LinALog)?.to_f32_vec().iter().map(|a| -a.exp()).collect(),
            };
            let la = c.linear_attn.as_ref().ok_or_else(|| build_err("linear attention without its sizes".into()))?;
            let small = |v: &[f32]| be.upload(v).map_err(|source| SchedError::Backend { layer: lt.index, source });
            let small = DeltaWeights {
                conv: small(&need(Role::LinConv)?.to_f32_vec())?,
                neg_a: small(&neg_a)?,
                dt_bias: small(&need(Role::LinDtBias)?.to_f32_vec())?,
                norm: small(&need(Role::LinNorm)?.to_f32_vec())?,
            };
            let shape = DeltaShape { qkvz_grouped, ba_grouped, eps: c.rms_norm_eps, ..la.delta_shape() };
            MixerWeights::Linear(LinearWeights {
                qkvz: upload(&qkvz)?,
                ba: upload(&ba)?,
                out: upload(&need(Role::LinOut)?)?,
                small,
                shape,
            })
        }
        _ => {
            let [wq, wk, wv] = match host(Role::Qkv)? {
                Some(qkv) => {
                    let parts = split(&qkv, &[(0, q_dim), (q_dim, kv_dim), (q_dim + kv_dim, kv_dim)])?;
                    <[HostTensor; 3]>::try_from(parts).map_err(|_| build_err("QKV split".into()))?
                }
                None => [req(Role::Q, host(Role::Q)?)?, req(Role::K, host(Role::K)?)?, req(Role::V, host(Role::V)?)?],
            };
            // A gated `q_proj` holds each head's queries, then its gate rows.
            let (wq, gate) = match c.attn_output_gate {
                true => {
                    let hd = c.head_dim;
                    // Head h's query rows, then its gate rows (offset 0 or hd).
                    let half = |offset: usize| {
                        let parts: Vec<_> = (0..c.n_heads).map(|h| (&wq, 2 * h * hd + offset, hd)).collect();
                        concat_rows(&parts).ok_or_else(|| build_err(format!("cannot split the gate of {wq:?}")))
                    };
                    let (q, g) = (half(0)?, half(hd)?);
                    (q, Some(upload(&g)?))
                }
                false => (wq, None),
            };
            let both = |a: Option<B::Weight>, b: Option<B::Weight>| a.zip(b).map(|(a, b)| [a, b]);
            MixerWeights::Attention(AttnWeights {
                wq: upload(&wq)?,
                wk: upload(&wk)?,
                wv: upload(&wv)?,
                bias_qkv: match (opt(Role::QBias)?, opt(Role::KBias)?, opt(Role::VBias)?) {
                    (Some(q), Some(k), Some(v)) => Some([q, k, v]),
                    _ => None,
                },
                qk_norm: both(opt(Role::QNorm)?, opt(Role::KNorm)?),
                gate,
                wo: upload(&req(Role::O, host(Role::O)?)?)?,
                bias_o: opt(Role::OBias)?,
                sinks: host(Role::AttnSinks)?.map(|t| t.to_f32_vec()),
            })
        }
    };
    let moe = c.layers.get(lt.index).is_some_and(|l| l.ffn == Ffn::Moe);
    let ffn = match moe {
        false if c.neuron_group.is_some() => {
            let group = c.neuron_group.unwrap_or(i);
            let gate = upload(&req(Role::Gate, host(Role::Gate)?)?)?;
            let scale = lt.get(spec::NEURON_SCALE)?.to_f32_vec();
            if scale.len() != i {
                return Err(build_err(format!(
                    "`{}` holds {} values for {i} neurons",
                    spec::NEURON_SCALE,
                    scale.len()
                )));
            }
            // The layer carries its groups only when it is loaded whole.
            let groups = match lt.tensors.contains_key(&neuron_names(0)[0]) {
                false => None,
                true => Some(
                    (0..i / group.max(1))
                        .map(|g| build_bundle(c, be, lt, g).map(Arc::new))
                        .collect::<Result<Vec<_>, _>>()?,
                ),
            };
            FfnWeights::Neurons(NeuronWeights { gate, scale, group, groups })
        }
        false => {
            let [w_gate, w_up] = match host(Role::GateUp)? {
                Some(gu) => <[HostTensor; 2]>::try_from(split(&gu, &[(0, i), (i, i)])?)
                    .map_err(|_| build_err("gate/up split".into()))?,
                None => [req(Role::Gate, host(Role::Gate)?)?, req(Role::Up, host(Role::Up)?)?],
            };
            let down = req(Role::Down, host(Role::Down)?)?;
            let (gate, up, down) = (upload(&w_gate)?, upload(&w_up)?, upload(&down)?);
            FfnWeights::Dense(Mlp { width: i, gate, up, down, bias: None })
        }
        true => {
            let router = upload(&req(Role::Router, host(Role::Router)?)?)?;
            let shared = match (host(Role::SharedGate)?, host(Role::SharedUp)?, host(Role::SharedDown)?) {
                (Some(g), Some(u), Some(d)) => {
                    let gate = opt(Role::SharedExpertGate)?;
                    let width = g.shape.first().copied().unwrap_or(0);
                    let mlp = Mlp { width, gate: upload(&g)?, up: upload(&u)?, down: upload(&d)?, bias: None };
                    Some((mlp, gate))
                }
                _ => None,
            };
            let choice_bias = host(Role::RouterBias)?.map(|t| t.to_f32_vec());
            // The layer carries its experts only when it is loaded whole.
            let m = c.moe.ok_or_else(|| build_err("a MoE layer in a model without experts".into()))?;
            let experts = match lt.tensors.contains_key(&moe::expert_names(c, 0)[0]) {
                false => None,
                true => Some(
                    (0..m.n_experts)
                        .map(|e| build_expert(c, be, lt, e).map(Arc::new))
                        .collect::<Result<Vec<_>, _>>()?,
                ),
            };
            let router_bias = opt(Role::RouterLogitBias)?;
            FfnWeights::Moe(MoeWeights { router, router_bias, choice_bias, shared, experts })
        }
    };
    Ok(LayerWeights {
        attn_norm: opt(Role::AttnNorm)?,
        mixer,
        attn_post_norm: opt(Role::AttnPostNorm)?,
        ffn_norm: opt(Role::FfnNorm)?,
        ffn,
        ffn_post_norm: opt(Role::FfnPostNorm)?,
    })
}

/// Row ranges `(tensor, start, n)` of 2-D tensors of one dtype and width, one after
/// another in a tensor of their own (whole rows, so any block type); `None` when the
/// tensors do not fit together or a range is out of bounds.
pub(crate) fn concat_rows(parts: &[(&HostTensor, usize, usize)]) -> Option<HostTensor> {
    let (first, ..) = parts.first()?;
    let (dtype, cols, panels) = (first.dtype, *first.shape.get(1)?, first.is_panels());
    let mut ranges = Vec::with_capacity(parts.len());
    for &(t, start, n) in parts {
        let &[rows, c] = &t.shape[..] else { return None };
        // Panels move as whole panels (see `HostTensor::rows`).
        let whole = |x: usize| x.is_multiple_of(strata_tensor::tensor::PANEL_ROWS);
        if c != cols || t.dtype != dtype || start + n > rows || t.is_panels() != panels {
            return None;
        }
        if panels && !(whole(start) && whole(n)) {
            return None;
        }
        let row_bytes = t.byte_len() / rows.max(1);
        ranges.push((&t.bytes()[start * row_bytes..(start + n) * row_bytes], n));
    }
    let len = ranges.iter().map(|r| r.0.len()).sum();
    let mut bytes = AlignedBytes::zeroed(len);
    let mut at = 0;
    for (src, _) in &ranges {
        bytes.bytes_mut()[at..at + src.len()].copy_from_slice(src);
        at += src.len();
    }
    let rows = ranges.iter().map(|r| r.1).sum();
    let view = if panels { HostTensor::new_panels } else { HostTensor::new };
    Some(view(Arc::new(bytes), 0, len, dtype, vec![rows, cols]))
}

/// The layer-local names of neuron group `g`'s up rows and down columns.
pub(super) fn neuron_names(g: usize) -> [String; 2] {
    let p = strata_format::NEURON_PREFIX;
    [format!("{p}{g}.up_proj.weight"), format!("{p}{g}.down_proj.weight")]
}

/// Neuron group `g` of layer `lt.index`, each tensor checked against its shape.
pub(super) fn build_bundle<B: Backend>(
    c: &ModelConfig,
    be: &B,
    lt: &LayerTensors,
    g: usize,
) -> Result<Bundle<B>, SchedError> {
    let (group, h) = (c.neuron_group.unwrap_or(c.intermediate_size), c.hidden_size);
    let [u, d] = neuron_names(g);
    let [up, down] =
        moe::checked_weights(be, lt.index, [(&u, lt.get(&u)?, [group, h]), (&d, lt.get(&d)?, [h, group])])?;
    Ok(Bundle { up, down })
}

/// Routed expert `e` of layer `lt.index` from tensors named as in the checkpoint.
pub(crate) fn build_expert<B: Backend>(
    c: &ModelConfig,
    be: &B,
    lt: &LayerTensors,
    e: usize,
) -> Result<Mlp<B>, SchedError> {
    let [g, u, d] = moe::expert_names(c, e);
    let width = c.moe.map_or(0, |m| m.expert_size);
    let mut mlp =
        moe::build_mlp(be, lt.index, [(&g, lt.get(&g)?), (&u, lt.get(&u)?), (&d, lt.get(&d)?)], width, c.hidden_size)?;
    if let Some(names) = moe::expert_bias_names(c, e) {
        let mut bias = Vec::with_capacity(3);
        for (name, len) in names.iter().zip([width, width, c.hidden_size]) {
            let t = lt.get(name)?;
            if t.shape != [len] {
                let msg = format!("tensor `{name}`: expected shape [{len}], found {:?}", t.shape);
                return Err(SchedError::Build { layer: lt.index, msg });
            }
            bias.push(be.weight(t).map_err(|source| SchedError::Backend { layer: lt.index, source })?);
        }
        mlp.bias = <[B::Weight; 3]>::try_from(bias).ok();
    }
    Ok(mlp)
}
