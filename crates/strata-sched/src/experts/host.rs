//! The host tier behind a device's expert cache: experts' bytes as read (page-locked
//! where the stage uploads from such memory), kept in host memory after their upload, so
//! that an expert evicted from device memory comes back by a copy instead of a read.
//! Least recently used first out, within a byte budget.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::super::expert_policy::ExpertId;
use strata_tensor::tensor::ByteSource;

/// One expert's bytes: the source its tensors are views of, whether it is page-locked,
/// and its size.
#[derive(Clone)]
pub(super) struct Held {
    pub src: Arc<dyn ByteSource>,
    pub pinned: bool,
    pub bytes: u64,
}

#[derive(Default)]
pub(super) struct HostTier {
    budget: u64,
    used: u64,
    tick: u64,
    held: HashMap<ExpertId, (Held, u64)>,
    /// Last use → expert, oldest first.
    order: BTreeMap<u64, ExpertId>,
}

impl HostTier {
    pub fn new(budget: u64) -> Self {
        HostTier { budget, ..HostTier::default() }
    }

    /// The expert's bytes, if held (then most recently used).
    pub fn get(&mut self, id: ExpertId) -> Option<Held> {
        self.tick += 1;
        let (held, last) = self.held.get_mut(&id)?;
        self.order.remove(last);
        *last = self.tick;
        self.order.insert(self.tick, id);
        Some(held.clone())
    }

    /// Keeps `held` for `id`, evicting the least recently used as the budget needs; an
    /// expert larger than the budget is not kept.
    pub fn offer(&mut self, id: ExpertId, held: Held) {
        if held.bytes > self.budget || self.held.contains_key(&id) {
            return;
        }
        while self.used + held.bytes > self.budget {
            let Some((_, old)) = self.order.pop_first() else { break };
            if let Some((gone, _)) = self.held.remove(&old) {
                self.used -= gone.bytes;
            }
        }
        self.tick += 1;
        self.used += held.bytes;
        self.order.insert(self.tick, id);
        self.held.insert(id, (held, self.tick));
    }

    pub fn used(&self) -> u64 {
        self.used
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Bytes(Vec<u8>);
    impl ByteSource for Bytes {
        fn bytes(&self) -> &[u8] {
            &self.0
        }
    }

    fn held(n: usize) -> Held {
        Held { src: Arc::new(Bytes(vec![0; n])), pinned: false, bytes: n as u64 }
    }

    #[test]
    fn the_least_recently_used_leave_first_within_the_budget() {
        let mut t = HostTier::new(30);
        let id = |e| ExpertId::new(0, e);
        t.offer(id(0), held(10));
        t.offer(id(1), held(10));
        t.offer(id(2), held(10));
        assert!(t.get(id(0)).is_some()); // 1 is now the oldest
        t.offer(id(3), held(10));
        assert!(t.get(id(1)).is_none());
        assert!(t.get(id(0)).is_some() && t.get(id(2)).is_some() && t.get(id(3)).is_some());
        assert_eq!(t.used(), 30);
        t.offer(id(4), held(31)); // larger than the budget: not kept, nothing evicted
        assert!(t.get(id(4)).is_none());
        assert_eq!(t.used(), 30);
    }
}
