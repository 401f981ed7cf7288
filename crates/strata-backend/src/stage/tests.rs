//! The upload pipeline against a recording fake device. The fake runs a copy stream and a
//! compute stream on threads of their own, executes each op late (after a random delay),
//! honours event waits as CUDA does, and checks at execution time the two orderings the
//! pipeline promises:
//! - no staging buffer goes back to its pool while a copy reading it is still queued;
//! - no copy overwrites a slot while a compute op that reads the slot's content is queued.
//!
//! It also checks the data: every compute op reads exactly the bytes its unit had.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::*;

#[derive(Default)]
struct FakeEvent {
    done: Mutex<bool>,
    cv: Condvar,
}

impl FakeEvent {
    fn complete(&self) {
        *lock(&self.done) = true;
        self.cv.notify_all();
    }
    fn wait(&self) {
        let mut done = lock(&self.done);
        while !*done {
            done = self.cv.wait(done).unwrap_or_else(|e| e.into_inner());
        }
    }
}

struct FakeSlot {
    id: usize,
    data: Mutex<Vec<u8>>,
}

enum Op {
    Wait(Arc<FakeEvent>),
    Record(Arc<FakeEvent>),
    Copy { src: usize, len: usize, dst: Arc<FakeSlot>, id: usize },
    Read { slot: Arc<FakeSlot>, expect: u64, id: usize },
}

/// What the fake saw going wrong.
#[derive(Default)]
struct Record {
    /// Copies enqueued and not yet executed: id → source address.
    queued_copies: HashMap<usize, usize>,
    /// Compute reads enqueued and not yet executed: id → (slot, content they expect).
    queued_reads: HashMap<usize, (usize, u64)>,
    /// The content each slot holds now.
    slot_content: HashMap<usize, u64>,
    violations: Vec<String>,
    copies_done: usize,
    reads_done: usize,
}

struct Fake {
    copy_tx: Mutex<mpsc::Sender<Op>>,
    compute_tx: Mutex<mpsc::Sender<Op>>,
    record: Arc<Mutex<Record>>,
    next_id: AtomicUsize,
    /// Honour `after` (a broken device ignores it, to show the checks catch that).
    honour_after: bool,
}

fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

/// A small pseudo-random delay, different per op.
fn jitter(seed: usize, max_us: u64) {
    let x = (seed as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
    std::thread::sleep(Duration::from_micros(x % (max_us + 1)));
}

fn run_stream(rx: mpsc::Receiver<Op>, record: Arc<Mutex<Record>>, max_delay_us: u64) {
    for op in rx {
        match op {
            Op::Wait(e) => e.wait(),
            Op::Record(e) => e.complete(),
            Op::Copy { src, len, dst, id } => {
                jitter(id, max_delay_us);
                let mut r = lock(&record);
                let current = r.slot_content.get(&dst.id).copied();
                if let Some(c) = current
                    && r.queued_reads.values().any(|&(s, want)| s == dst.id && want == c)
                {
                    r.violations.push(format!("copy {id} overwrote slot {} while a read of it was queued", dst.id));
                }
                // SAFETY: the pipeline's contract keeps `src` alive and unchanged until this
                // copy's event completes; a broken pipeline is what the checks are for.
                let bytes = unsafe { std::slice::from_raw_parts(src as *const u8, len) }.to_vec();
                r.slot_content.insert(dst.id, checksum(&bytes));
                r.queued_copies.remove(&id);
                r.copies_done += 1;
                drop(r);
                *lock(&dst.data) = bytes;
            }
            Op::Read { slot, expect, id } => {
                jitter(id, max_delay_us);
                let got = checksum(&lock(&slot.data));
                let mut r = lock(&record);
                r.queued_reads.remove(&id);
                r.reads_done += 1;
                if got != expect {
                    r.violations.push(format!("read {id} of slot {} saw other bytes than its unit's", slot.id));
                }
            }
        }
    }
}

impl Fake {
    fn new(honour_after: bool, copy_delay_us: u64, compute_delay_us: u64) -> Arc<Fake> {
        let record = Arc::new(Mutex::new(Record::default()));
        let (copy_tx, copy_rx) = mpsc::channel();
        let (compute_tx, compute_rx) = mpsc::channel();
        let r = record.clone();
        std::thread::spawn(move || run_stream(copy_rx, r, copy_delay_us));
        let r = record.clone();
        std::thread::spawn(move || run_stream(compute_rx, r, compute_delay_us));
        Arc::new(Fake {
            copy_tx: Mutex::new(copy_tx),
            compute_tx: Mutex::new(compute_tx),
            record,
            next_id: AtomicUsize::new(0),
            honour_after,
        })
    }

    fn id(&self) -> usize {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn send_copy(&self, op: Op) {
        lock(&self.copy_tx).send(op).expect("copy stream running");
    }

    fn send_compute(&self, op: Op) {
        lock(&self.compute_tx).send(op).expect("compute stream running");
    }

    /// A compute op that reads `slot` and expects `bytes` there.
    fn read(&self, slot: &Arc<FakeSlot>, bytes: &[u8]) {
        let id = self.id();
        let expect = checksum(bytes);
        lock(&self.record).queued_reads.insert(id, (slot.id, expect));
        self.send_compute(Op::Read { slot: slot.clone(), expect, id });
    }

    /// Waits for both streams to drain.
    fn finish(&self) {
        for send in [Fake::send_copy, Fake::send_compute] {
            let e = Arc::new(FakeEvent::default());
            send(self, Op::Record(e.clone()));
            e.wait();
        }
    }

    /// A staging buffer is going back to its pool: no queued copy may still read it.
    fn returning(&self, addr: usize) {
        let mut r = lock(&self.record);
        if r.queued_copies.values().any(|&a| a == addr) {
            r.violations.push(format!("staging buffer {addr:#x} returned while a copy from it was queued"));
        }
    }
}

impl CopyEngine for Fake {
    type Event = Arc<FakeEvent>;
    type Slot = Arc<FakeSlot>;

    fn alloc_slot(&self, len: usize, _direct: bool) -> Result<Self::Slot, BackendError> {
        Ok(Arc::new(FakeSlot { id: self.id(), data: Mutex::new(vec![0; len]) }))
    }

    unsafe fn copy(
        &self,
        src: &[u8],
        dst: &Self::Slot,
        after: Option<&Self::Event>,
    ) -> Result<Self::Event, BackendError> {
        if let Some(a) = after.filter(|_| self.honour_after) {
            self.send_copy(Op::Wait(a.clone()));
        }
        let id = self.id();
        lock(&self.record).queued_copies.insert(id, src.as_ptr() as usize);
        self.send_copy(Op::Copy { src: src.as_ptr() as usize, len: src.len(), dst: dst.clone(), id });
        let done = Arc::new(FakeEvent::default());
        self.send_copy(Op::Record(done.clone()));
        Ok(done)
    }

    fn compute_wait(&self, event: &Self::Event) -> Result<(), BackendError> {
        self.send_compute(Op::Wait(event.clone()));
        Ok(())
    }

    fn compute_mark(&self) -> Result<Self::Event, BackendError> {
        let e = Arc::new(FakeEvent::default());
        self.send_compute(Op::Record(e.clone()));
        Ok(e)
    }

    fn synchronize(&self, event: &Self::Event) -> Result<(), BackendError> {
        event.wait();
        Ok(())
    }

    fn download(&self, slot: &Self::Slot, len: usize) -> Result<Vec<u8>, BackendError> {
        Ok(lock(&slot.data)[..len].to_vec())
    }
}

/// Staging buffers as the I/O thread's ring holds them: a buffer goes back to the pool
/// when the last `Arc` to it drops, and is refilled with the next unit's bytes.
struct Staging {
    pool: Mutex<Vec<Vec<u8>>>,
    back: Condvar,
    fake: Arc<Fake>,
}

struct StagingBuf {
    data: Vec<u8>,
    home: Arc<Staging>,
}

impl ByteSource for StagingBuf {
    fn bytes(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for StagingBuf {
    fn drop(&mut self) {
        self.home.fake.returning(self.data.as_ptr() as usize);
        lock(&self.home.pool).push(std::mem::take(&mut self.data));
        self.home.back.notify_all();
    }
}

impl Staging {
    /// A free buffer filled with unit `n`'s bytes; waits (up to a bound) for one.
    fn fill(self: &Arc<Self>, n: usize, len: usize) -> Arc<StagingBuf> {
        let mut pool = lock(&self.pool);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while pool.is_empty() {
            assert!(std::time::Instant::now() < deadline, "no staging buffer came back: the pipeline holds them");
            pool = self.back.wait_timeout(pool, Duration::from_millis(50)).unwrap_or_else(|e| e.into_inner()).0;
        }
        let mut data = pool.pop().expect("checked above");
        data.clear();
        data.extend((0..len).map(|i| (i.wrapping_mul(31) ^ n.wrapping_mul(7919)) as u8));
        Arc::new(StagingBuf { data, home: self.clone() })
    }
}

/// Streams `units` units through an uploader with `buffers` staging buffers and a ring of
/// `ring` slots, the compute reading each unit's slot once (twice for every third unit),
/// and returns what the fake recorded.
fn stream_units(fake: &Arc<Fake>, units: usize, buffers: usize, ring: usize) -> (Vec<String>, usize, usize) {
    const LEN: usize = 4096;
    let staging = Arc::new(Staging {
        pool: Mutex::new((0..buffers).map(|_| Vec::with_capacity(LEN)).collect()),
        back: Condvar::new(),
        fake: fake.clone(),
    });
    let stats = Arc::new(TransferStats::default());
    let up = Uploader::new(fake.clone(), LEN, ring, None, stats.clone()).expect("reaper thread");
    for n in 0..units {
        let len = LEN - (n % 5) * 100;
        let host = staging.fill(n, len);
        let expected = host.data.clone();
        let staged = up.upload(host, true).expect("upload");
        let slot = staged.hold().slot().clone();
        fake.read(&slot, &expected);
        if n % 3 == 0 {
            fake.read(&slot, &expected);
        }
        drop(staged);
    }
    fake.finish();
    drop(up);
    assert_eq!(stats.copies.load(Ordering::Relaxed), units as u64);
    let r = lock(&fake.record);
    (r.violations.clone(), r.copies_done, r.reads_done)
}

#[test]
fn no_staging_buffer_or_slot_is_reused_before_its_event() {
    // Copies slower than compute, then compute slower than copies: each ordering gets
    // its turn at being the one that would break.
    for (copy_us, compute_us) in [(400, 20), (20, 400), (150, 150)] {
        let fake = Fake::new(true, copy_us, compute_us);
        let (violations, copies, reads) = stream_units(&fake, 60, 3, 3);
        assert!(violations.is_empty(), "copy {copy_us} µs, compute {compute_us} µs: {violations:#?}");
        assert_eq!(copies, 60);
        assert_eq!(reads, 60 + 20);
    }
}

#[test]
fn the_ring_holds_its_size_when_units_are_released_in_turn() {
    let fake = Fake::new(true, 50, 50);
    let stats = Arc::new(TransferStats::default());
    let up = Uploader::new(fake.clone(), 64, 3, None, stats.clone()).unwrap();
    let mut held = VecDeque::new();
    for n in 0..30u8 {
        held.push_back(up.upload(Arc::new(AlignedOwned(vec![n; 64])), false).unwrap());
        if held.len() > 2 {
            held.pop_front();
        }
    }
    assert_eq!(up.slots_allocated(), 3);
    assert_eq!(stats.extra_slots.load(Ordering::Relaxed), 0);
    assert_eq!(stats.pageable_copies.load(Ordering::Relaxed), 30);
    // Holding more than the ring costs one slot more each, never a deadlock.
    let more: Vec<_> = (0..4u8).map(|n| up.upload(Arc::new(AlignedOwned(vec![n; 8])), true).unwrap()).collect();
    assert_eq!(up.slots_allocated(), 3 + 3);
    assert_eq!(stats.extra_slots.load(Ordering::Relaxed), 3);
    drop(more);
    drop(held);
    fake.finish();
    assert!(lock(&fake.record).violations.is_empty());
    let big = up.upload(Arc::new(AlignedOwned(vec![0; 65])), true);
    assert!(matches!(big, Err(BackendError::Device { .. })), "a unit larger than a slot is an error");
}

struct AlignedOwned(Vec<u8>);

impl ByteSource for AlignedOwned {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
}

#[test]
fn the_checks_catch_a_device_that_ignores_the_slot_event() {
    // A device that copies into a slot without waiting for its last reader: with slow
    // compute and fast copies, the overwrite happens while reads are queued.
    let fake = Fake::new(false, 0, 2000);
    let (violations, _, _) = stream_units(&fake, 12, 3, 2);
    assert!(violations.iter().any(|v| v.contains("overwrote slot")), "{violations:#?}");
}

#[test]
fn the_checks_catch_a_staging_buffer_returned_early() {
    // Bypass the uploader: drop the staging buffer right after enqueueing its copy on a
    // slow copy stream, as a pipeline without the reaper would.
    let fake = Fake::new(true, 3000, 0);
    let staging = Arc::new(Staging { pool: Mutex::new(vec![Vec::new()]), back: Condvar::new(), fake: fake.clone() });
    let slot = fake.alloc_slot(256, false).unwrap();
    let host = staging.fill(1, 256);
    // SAFETY: deliberately broken: `host` drops before the copy runs (its bytes go back
    // to the pool, still allocated, so the fake reads stale but valid memory).
    let _event = unsafe { fake.copy(host.bytes(), &slot, None) }.unwrap();
    drop(host);
    fake.finish();
    let r = lock(&fake.record);
    assert!(r.violations.iter().any(|v| v.contains("returned while a copy")), "{:#?}", r.violations);
}
