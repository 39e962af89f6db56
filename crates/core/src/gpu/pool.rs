//! [`BufferPool`]: GPU buffers kept for reuse once released, so that a step allocates nothing
//! that an earlier step of the same shapes already had.
//!
//! Every decode step needs the same ~20 activation, input, parameter and readback buffers. Made
//! anew each step, each one was a driver allocation and, because wgpu zeroes a buffer before
//! its first use, a clear recorded ahead of the step's commands. Released buffers are kept here
//! instead, keyed by size class and usage, and handed out again.
//!
//! A released buffer may still be named by commands that are recorded but not yet submitted,
//! and a buffer handed out again may be written at once by `queue.write_buffer`, which runs
//! ahead of every command submitted after it. So a buffer released while any encoder is open
//! waits until every open encoder has been submitted or dropped; one released while none is
//! open is free at once (all its uses are submitted, and queue order puts later work after them).
//! A reused buffer holds what its last user left: [`crate::gpu::Tensor::empty`] promises no
//! contents.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::gpu::memory::{MemoryLedger, Reservation};
use crate::{Error, Result};

/// Idle buffers not reused within this many settlements (moments when the last open encoder
/// was submitted) are freed: a decode step settles two or three times, so this keeps what a
/// run of steps uses and frees what one long prompt needed.
const IDLE_SETTLEMENTS: u64 = 32;

/// At most this many bytes wait idle; past it the longest idle go first. A step of a small
/// model needs a few MiB; batches of varied shapes would otherwise keep a copy of each shape.
const IDLE_BYTES_MAX: u64 = 64 << 20;

/// Released buffers, waiting to be handed out again.
pub(crate) struct BufferPool {
    ledger: Arc<MemoryLedger>,
    state: Mutex<PoolState>,
    /// Buffers created, not handed out again.
    created: AtomicU64,
}

#[derive(Default)]
struct PoolState {
    /// Encoders recorded into and not yet submitted or dropped.
    open_encoders: usize,
    /// Buffers released while some encoder was open.
    released: Vec<Held>,
    /// Buffers free to be handed out, with the settlement at which each became free.
    free: HashMap<BufferKey, Vec<(Held, u64)>>,
    /// At most this many bytes of buffers stay free ([`IDLE_BYTES_MAX`] but in tests).
    idle_bytes_max: u64,
    settlements: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct BufferKey {
    size: u64,
    usage: wgpu::BufferUsages,
}

/// A buffer and the bytes it counts against the memory budget.
struct Held {
    buffer: wgpu::Buffer,
    memory: Reservation,
}

impl Held {
    fn key(&self) -> BufferKey {
        BufferKey { size: self.buffer.size(), usage: self.buffer.usage() }
    }
}

/// A buffer from the pool, returned to it when dropped.
pub(crate) struct PooledBuffer {
    buffer: wgpu::Buffer,
    /// Taken by `drop`, to go with the buffer into the pool.
    memory: Option<Reservation>,
    /// Whether `drop` returns the buffer to the pool (else it is freed).
    returns_to_pool: bool,
    pool: Arc<BufferPool>,
}

/// Counts an open encoder until dropped ([`BufferPool::open_encoder`]).
pub(crate) struct OpenEncoder {
    pool: Arc<BufferPool>,
}

impl BufferPool {
    pub(crate) fn new(ledger: Arc<MemoryLedger>) -> Self {
        Self::with_idle_bytes_max(ledger, IDLE_BYTES_MAX)
    }

    fn with_idle_bytes_max(ledger: Arc<MemoryLedger>, idle_bytes_max: u64) -> Self {
        BufferPool {
            ledger,
            state: Mutex::new(PoolState { idle_bytes_max, ..PoolState::default() }),
            created: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // The state stays consistent through a panic elsewhere: every change is one push or pop.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A buffer of `size` bytes and `usage`: a free one of that size and usage, else a new one
    /// (named `label`) counted against the memory budget. When the budget refuses it, the idle
    /// buffers are freed and the budget asked again.
    pub(crate) fn acquire(
        self: &Arc<Self>,
        device: &wgpu::Device,
        label: &str,
        size: u64,
        usage: wgpu::BufferUsages,
    ) -> Result<PooledBuffer> {
        let key = BufferKey { size: size_class(size), usage };
        let mut state = self.lock();
        if let Some(held) = state.take_free(key) {
            let Held { buffer, memory } = held;
            return Ok(PooledBuffer {
                buffer,
                memory: Some(memory),
                returns_to_pool: true,
                pool: Arc::clone(self),
            });
        }
        let memory = match self.ledger.reserve(label, key.size) {
            Err(Error::OutOfMemory { .. }) if state.free_bytes() > 0 => {
                state.free.clear();
                self.ledger.reserve(label, key.size)?
            }
            reserved => reserved?,
        };
        drop(state);
        self.created.fetch_add(1, Ordering::Relaxed);
        let buffer = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: key.size,
            usage,
            mapped_at_creation: false,
        });
        Ok(PooledBuffer { buffer, memory: Some(memory), returns_to_pool: true, pool: Arc::clone(self) })
    }

    /// Buffers this pool has created (a buffer handed out again is not counted again).
    pub(crate) fn created(&self) -> u64 {
        self.created.load(Ordering::Relaxed)
    }

    /// Marks an encoder open until the returned guard is dropped, which must be after its
    /// commands are submitted (or when they are abandoned).
    pub(crate) fn open_encoder(self: &Arc<Self>) -> OpenEncoder {
        self.lock().open_encoders += 1;
        OpenEncoder { pool: Arc::clone(self) }
    }

    /// Frees every buffer that is free to be handed out (for when the engine has no work).
    pub(crate) fn free_idle(&self) {
        self.lock().free.clear();
    }

    fn release(&self, held: Held) {
        let mut state = self.lock();
        if state.open_encoders == 0 {
            let settlement = state.settlements;
            state.push_free(held, settlement);
        } else {
            state.released.push(held);
        }
    }

    /// Buffers waiting in the pool (free or released), for tests.
    #[cfg(test)]
    fn idle_count(&self) -> usize {
        let state = self.lock();
        state.released.len() + state.free.values().map(Vec::len).sum::<usize>()
    }
}

impl PoolState {
    fn take_free(&mut self, key: BufferKey) -> Option<Held> {
        self.free.get_mut(&key)?.pop().map(|(held, _)| held)
    }

    /// Bytes of the buffers free to be handed out.
    fn free_bytes(&self) -> u64 {
        self.free.iter().map(|(key, buffers)| key.size * buffers.len() as u64).sum()
    }

    fn push_free(&mut self, held: Held, since: u64) {
        self.free.entry(held.key()).or_default().push((held, since));
        while self.free_bytes() > self.idle_bytes_max && self.free_longest_idle() {}
    }

    /// Frees the buffer idle longest; false when none is free.
    fn free_longest_idle(&mut self) -> bool {
        let oldest = self
            .free
            .iter()
            .flat_map(|(key, buffers)| {
                buffers.iter().enumerate().map(move |(i, &(_, since))| (since, *key, i))
            })
            .min_by_key(|&(since, ..)| since);
        if let Some((_, key, index)) = oldest
            && let Some(buffers) = self.free.get_mut(&key)
        {
            buffers.swap_remove(index);
            return true;
        }
        false
    }

    /// The last open encoder is gone: what was released meanwhile is free, and what has been
    /// idle for [`IDLE_SETTLEMENTS`] is dropped.
    fn settle(&mut self) {
        self.settlements += 1;
        let now = self.settlements;
        for held in std::mem::take(&mut self.released) {
            self.push_free(held, now);
        }
        self.free.retain(|_, buffers| {
            buffers.retain(|&(_, since)| now - since <= IDLE_SETTLEMENTS);
            !buffers.is_empty()
        });
    }
}

/// The size of the buffer handed out for a request of `size` bytes: rounded up to one of eight
/// sizes an octave (at most 1/8 more), so that steps of nearby shapes share buffers.
pub(crate) fn size_class(size: u64) -> u64 {
    const SMALLEST: u64 = 256;
    if size <= SMALLEST {
        return SMALLEST;
    }
    let step = 1 << (size.ilog2() - 3);
    size.next_multiple_of(step)
}

impl PooledBuffer {
    /// The buffer.
    pub(crate) fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }

    /// Whether dropping this returns the buffer to the pool (the default) or frees it: a
    /// buffer left in a state its next user cannot start from (mapped) must be freed.
    pub(crate) fn set_returns_to_pool(&mut self, returns: bool) {
        self.returns_to_pool = returns;
    }
}

impl Drop for PooledBuffer {
    fn drop(&mut self) {
        if let Some(memory) = self.memory.take().filter(|_| self.returns_to_pool) {
            self.pool.release(Held { buffer: self.buffer.clone(), memory });
        }
    }
}

impl Drop for OpenEncoder {
    fn drop(&mut self) {
        let mut state = self.pool.lock();
        state.open_encoders -= 1;
        if state.open_encoders == 0 {
            state.settle();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::GpuContext;
    use crate::kernels::testing::gpu;

    const USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE.union(wgpu::BufferUsages::COPY_DST);

    fn pool(budget: Option<u64>) -> Arc<BufferPool> {
        Arc::new(BufferPool::new(Arc::new(MemoryLedger::new(budget))))
    }

    fn acquire(pool: &Arc<BufferPool>, ctx: &GpuContext, size: u64) -> PooledBuffer {
        pool.acquire(ctx.device(), "test", size, USAGE).unwrap()
    }

    #[test]
    fn a_released_buffer_of_the_same_size_and_usage_is_handed_out_again() {
        let ctx = gpu();
        let pool = pool(None);
        let first = acquire(&pool, ctx, 256);
        let buffer = first.buffer().clone();
        drop(first);
        assert_eq!(*acquire(&pool, ctx, 256).buffer(), buffer);
        assert_ne!(*acquire(&pool, ctx, 512).buffer(), buffer, "another size");
        let other_usage = pool.acquire(ctx.device(), "test", 256, wgpu::BufferUsages::UNIFORM).unwrap();
        assert_ne!(*other_usage.buffer(), buffer, "another usage");
        assert_eq!(pool.created(), 3, "the buffer handed out again is not counted again");
    }

    #[test]
    fn buffers_released_during_recording_wait_until_every_encoder_is_gone() {
        let ctx = gpu();
        let pool = pool(None);
        let (a, b) = (pool.open_encoder(), pool.open_encoder());
        let used = acquire(&pool, ctx, 256);
        let buffer = used.buffer().clone();
        drop(used);
        // Each newcomer is kept, so that only `buffer` can come back.
        let early = acquire(&pool, ctx, 256);
        assert_ne!(*early.buffer(), buffer, "an encoder may still name it");
        drop(a);
        let later = acquire(&pool, ctx, 256);
        assert_ne!(*later.buffer(), buffer, "one encoder is still open");
        drop(b);
        assert_eq!(*acquire(&pool, ctx, 256).buffer(), buffer);
        drop((early, later));
    }

    #[test]
    fn idle_buffers_are_freed_after_a_while_and_when_the_budget_needs_them() {
        let ctx = gpu();
        let pool = pool(Some(1024));
        drop(acquire(&pool, ctx, 512));
        assert_eq!(pool.idle_count(), 1);
        // The budget has room for 1024 bytes; 512 sit idle, so a new 1024 frees them first.
        drop(acquire(&pool, ctx, 1024));
        assert_eq!(pool.idle_count(), 1, "the 512 were freed, the 1024 wait");
        assert!(pool.acquire(ctx.device(), "test", 2048, USAGE).is_err(), "past the budget");
        assert_eq!(pool.idle_count(), 0, "freed in trying");
        drop(acquire(&pool, ctx, 1024));
        for _ in 0..IDLE_SETTLEMENTS {
            drop(pool.open_encoder());
        }
        assert_eq!(pool.idle_count(), 1);
        drop(pool.open_encoder());
        assert_eq!(pool.idle_count(), 0);
        assert_eq!(pool.ledger.in_use(), 0);
    }

    #[test]
    fn past_the_idle_cap_the_longest_idle_buffers_are_freed() {
        let ctx = gpu();
        let pool = Arc::new(BufferPool::with_idle_bytes_max(Arc::new(MemoryLedger::new(None)), 1024));
        drop(acquire(&pool, ctx, 512));
        drop(pool.open_encoder());
        let newer = acquire(&pool, ctx, 1024);
        let buffer = newer.buffer().clone();
        drop(newer);
        assert_eq!(pool.idle_count(), 1, "512 + 1024 bytes idle is past the cap");
        // Held out of the pool, so that the 4096 below is the only free buffer.
        let kept = acquire(&pool, ctx, 1024);
        assert_eq!(*kept.buffer(), buffer, "the newer one stayed");
        drop(acquire(&pool, ctx, 4096));
        assert_eq!(pool.idle_count(), 0, "one buffer past the cap is freed at once");
        drop(kept);
        assert_eq!(pool.idle_count(), 1);
        pool.free_idle();
        assert_eq!((pool.idle_count(), pool.ledger.in_use()), (0, 0));
    }

    #[test]
    fn sizes_round_up_to_eight_classes_an_octave() {
        assert_eq!(size_class(1), 256);
        assert_eq!(size_class(4096), 4096);
        assert_eq!(size_class(4097), 4608);
        assert_eq!(size_class(65540), 73728);
        let mut previous = 0;
        for size in (1..200_000).step_by(37) {
            let class = size_class(size);
            assert!(class >= size && class >= previous, "{size} -> {class}");
            assert!(size <= 256 || class * 8 <= size * 9, "{size} -> {class} wastes more than 1/8");
            previous = class;
        }
    }
}
