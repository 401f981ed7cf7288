//! An NDSQ file's ROUTING section as stored: each shard's number, cost and key.

use anyhow::bail;

/// The ROUTING section: `dim:u16, n:u32`, `n` shard numbers (u32, the shard's position
/// in the bank), `n` costs (f32, bytes) and `n × dim` key values (f32, unit length).
#[derive(Clone, Debug, PartialEq)]
pub struct RoutingTable {
    pub dim: usize,
    pub shards: Vec<u32>,
    pub costs: Vec<f32>,
    pub keys: Vec<f32>,
}

impl RoutingTable {
    pub fn encode(&self) -> Vec<u8> {
        let mut o = Vec::with_capacity(6 + 8 * self.shards.len() + 4 * self.keys.len());
        o.extend_from_slice(&(self.dim as u16).to_le_bytes());
        o.extend_from_slice(&(self.shards.len() as u32).to_le_bytes());
        self.shards.iter().for_each(|x| o.extend_from_slice(&x.to_le_bytes()));
        self.costs.iter().for_each(|x| o.extend_from_slice(&x.to_le_bytes()));
        self.keys.iter().for_each(|x| o.extend_from_slice(&x.to_le_bytes()));
        o
    }

    /// Parses and checks the section (shard numbers strictly increasing, values finite,
    /// costs not negative); keys are normalised again, zero keys stay zero.
    pub fn parse(b: &[u8]) -> anyhow::Result<RoutingTable> {
        if b.len() < 6 {
            bail!("{} bytes, shorter than its 6-byte header", b.len());
        }
        let dim = usize::from(u16::from_le_bytes([b[0], b[1]]));
        let n = u32::from_le_bytes([b[2], b[3], b[4], b[5]]) as usize;
        let want = n.checked_mul(8 + 4 * dim).and_then(|x| x.checked_add(6));
        if want != Some(b.len()) {
            bail!("{n} entries of {dim}-value keys do not make {} bytes", b.len());
        }
        let u32s =
            |at: usize| (0..n).map(move |i| u32::from_le_bytes(b[at + 4 * i..at + 4 * i + 4].try_into().expect("4")));
        let f32s = |at: usize, len: usize| -> Vec<f32> {
            b[at..at + 4 * len].chunks_exact(4).map(|x| f32::from_le_bytes(x.try_into().expect("4"))).collect()
        };
        let shards: Vec<u32> = u32s(6).collect();
        if let Some(w) = shards.windows(2).find(|w| w[1] <= w[0]) {
            bail!("shard {} follows shard {}: entries must be in increasing shard order", w[1], w[0]);
        }
        let costs = f32s(6 + 4 * n, n);
        if let Some(i) = costs.iter().position(|c| !(c.is_finite() && *c >= 0.0)) {
            bail!("entry {i} (shard {}) has cost {}", shards[i], costs[i]);
        }
        let mut keys = f32s(6 + 8 * n, n * dim);
        for (i, key) in keys.chunks_exact_mut(dim.max(1)).enumerate().take(n) {
            if key.iter().any(|x| !x.is_finite()) {
                bail!("entry {i} (shard {}) has a key value that is not finite", shards[i]);
            }
            normalise(key);
        }
        Ok(RoutingTable { dim, shards, costs, keys })
    }

    pub fn key(&self, i: usize) -> &[f32] {
        &self.keys[i * self.dim..(i + 1) * self.dim]
    }

    /// Entry indices, best first, with their scores against `prompt` (unit length).
    pub fn rank(&self, prompt: &[f32]) -> Vec<(usize, f32)> {
        let mut r: Vec<(usize, f32)> = (0..self.shards.len())
            .map(|i| (i, self.key(i).iter().zip(prompt).map(|(a, b)| a * b).sum::<f32>().abs()))
            .collect();
        r.sort_by(|a, b| b.1.total_cmp(&a.1).then(self.shards[a.0].cmp(&self.shards[b.0])));
        r
    }
}

/// Scales `v` to unit length (a zero vector stays zero).
pub fn normalise(v: &mut [f32]) {
    let norm = v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x = (f64::from(*x) / norm) as f32);
    }
}
