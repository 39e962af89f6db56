//! flint's own account of the GPU memory its tensors and weights hold, and the budget it may
//! keep within ([`crate::gpu::GpuOptions::memory_budget`]).
//!
//! wgpu has no memory budget and reports an exhausted device only after the fact, leaving the
//! device's state in doubt. A budget is checked before each buffer is created: going past it
//! is an [`Error::OutOfMemory`] that the caller can recover from, since nothing was allocated.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{Error, Result};

/// Bytes held by live tensors and weights, and the most ever held at once.
#[derive(Debug, Default)]
pub(crate) struct MemoryLedger {
    budget: Option<u64>,
    in_use: AtomicU64,
    peak: AtomicU64,
}

/// Bytes counted against the ledger until dropped (with the buffer they stand for).
#[derive(Debug)]
pub(crate) struct Reservation {
    ledger: Arc<MemoryLedger>,
    bytes: u64,
}

impl MemoryLedger {
    pub(crate) fn new(budget: Option<u64>) -> Self {
        MemoryLedger { budget, ..Default::default() }
    }

    /// Counts `bytes` for the buffer named `what`, or refuses them if they would take the total
    /// past the budget.
    pub(crate) fn reserve(self: &Arc<Self>, what: &str, bytes: u64) -> Result<Reservation> {
        let mut in_use = self.in_use.load(Ordering::Relaxed);
        loop {
            let total = in_use.saturating_add(bytes);
            if let Some(budget) = self.budget.filter(|&budget| total > budget) {
                return Err(Error::OutOfMemory { what: what.to_string(), requested: bytes, in_use, budget });
            }
            match self.in_use.compare_exchange_weak(in_use, total, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => {
                    self.peak.fetch_max(total, Ordering::Relaxed);
                    return Ok(Reservation { ledger: Arc::clone(self), bytes });
                }
                Err(now) => in_use = now,
            }
        }
    }

    /// Bytes held now.
    pub(crate) fn in_use(&self) -> u64 {
        self.in_use.load(Ordering::Relaxed)
    }

    /// The most bytes held at once so far.
    pub(crate) fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// The budget, if there is one.
    pub(crate) fn budget(&self) -> Option<u64> {
        self.budget
    }
}

/// Bytes of memory the host has available for new allocations (Linux's `MemAvailable`), where
/// the platform says: what a CPU device such as lavapipe allocates its buffers from.
pub fn host_available_memory() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
        let line = meminfo.lines().find(|line| line.starts_with("MemAvailable:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.ledger.in_use.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_count_until_dropped_and_stop_at_the_budget() {
        let ledger = Arc::new(MemoryLedger::new(Some(100)));
        let a = ledger.reserve("a", 60).unwrap();
        let refused = ledger.reserve("b", 41).unwrap_err();
        assert!(
            matches!(&refused, Error::OutOfMemory { what, requested: 41, in_use: 60, budget: 100 } if what == "b"),
            "{refused:?}"
        );
        let b = ledger.reserve("b", 40).unwrap();
        assert_eq!((ledger.in_use(), ledger.peak()), (100, 100));
        drop(a);
        assert_eq!(ledger.in_use(), 40);
        let c = ledger.reserve("c", 60).unwrap();
        drop((b, c));
        assert_eq!((ledger.in_use(), ledger.peak()), (0, 100));
    }

    #[test]
    fn without_a_budget_everything_is_counted() {
        let ledger = Arc::new(MemoryLedger::new(None));
        let held = ledger.reserve("huge", u64::MAX / 2).unwrap();
        assert_eq!(ledger.in_use(), u64::MAX / 2);
        drop(held);
        assert_eq!(ledger.in_use(), 0);
    }
}
