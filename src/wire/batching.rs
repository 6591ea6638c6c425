//! The one batching accumulator: both ends gather appends that queue while a batch is out into
//! the next batch, bounded in count and bytes, with a bounded number of batches in flight. The
//! client batches its producers' appends into `append_many` requests
//! (`client::connection`); the leader's proposer batches every connection's proposals into
//! one Raft entry (`raft::proposer`). What a batch's end means (a term that ended, a
//! connection to redial) stays with each.

use std::sync::Arc;

use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

/// How large a batch may grow, and how many may be out at once.
#[derive(Clone, Copy, Debug)]
pub struct BatchLimits {
    /// Items per batch.
    pub items_max: usize,
    /// Bytes per batch (by the accumulator's size function): a batch takes the next item
    /// only if it still fits, so a batch is at most this, or one larger item alone.
    pub bytes_max: usize,
    /// Batches handed out and not yet finished (their slot not yet dropped). More than one
    /// lets the next batch fill while the current one is flushed.
    pub in_flight_max: usize,
    /// Yield to the runtime once a slot is free, before taking what is queued: the tasks woken
    /// with the first item (producers answered by the same reply) queue theirs too.
    pub yield_before_taking: bool,
}

/// Batches from a queue: see the module docs.
#[derive(Debug)]
pub struct Accumulator<T> {
    incoming: mpsc::Receiver<T>,
    /// The item the last batch could not take: it starts the next.
    carried: Option<T>,
    in_flight: Arc<Semaphore>,
    limits: BatchLimits,
    size: fn(&T) -> usize,
}

/// A batch's place among those in flight: the next batch beyond the limit waits until one
/// is dropped.
pub type FlushSlot = OwnedSemaphorePermit;

impl<T> Accumulator<T> {
    /// Batches what arrives on `incoming`, weighing each item with `size`.
    pub fn new(incoming: mpsc::Receiver<T>, limits: BatchLimits, size: fn(&T) -> usize) -> Self {
        Accumulator {
            incoming,
            carried: None,
            in_flight: Arc::new(Semaphore::new(limits.in_flight_max)),
            limits,
            size,
        }
    }

    /// The next batch and its slot: waits for a first item (the carried one, else the next to
    /// arrive), then for a slot, then takes whatever is queued by then while it fits. `None`
    /// once every sender is gone and the queue is empty.
    pub async fn next(&mut self) -> Option<(Vec<T>, FlushSlot)> {
        let first = match self.carried.take() {
            Some(first) => first,
            None => self.incoming.recv().await?,
        };
        let slot = self.in_flight.clone().acquire_owned().await.ok()?;
        if self.limits.yield_before_taking {
            tokio::task::yield_now().await;
        }
        Some((self.fill(first), slot))
    }

    /// `first`, then what is queued while it fits; the first queued item that does not fit is
    /// carried to start the next batch.
    fn fill(&mut self, first: T) -> Vec<T> {
        let mut bytes = (self.size)(&first);
        let mut batch = vec![first];
        while batch.len() < self.limits.items_max {
            let Ok(next) = self.incoming.try_recv() else {
                break;
            };
            let next_bytes = (self.size)(&next);
            if bytes + next_bytes > self.limits.bytes_max {
                self.carried = Some(next);
                break;
            }
            bytes += next_bytes;
            batch.push(next);
        }
        batch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: BatchLimits = BatchLimits {
        items_max: 4,
        bytes_max: 100,
        in_flight_max: 2,
        yield_before_taking: false,
    };

    /// The batches `sizes`, all queued at once, are taken in.
    async fn batches(sizes: &[usize]) -> Vec<Vec<usize>> {
        let (sender, incoming) = mpsc::channel(sizes.len().max(1));
        for size in sizes {
            sender.try_send(*size).unwrap();
        }
        drop(sender);
        let mut accumulator = Accumulator::new(incoming, LIMITS, |size| *size);
        let mut batches = Vec::new();
        while let Some((batch, _slot)) = accumulator.next().await {
            batches.push(batch);
        }
        batches
    }

    /// A batch takes what is queued while it fits, never more than the byte bound unless one
    /// item alone exceeds it, never more than the count bound; what does not fit starts the
    /// next batch, in order.
    #[tokio::test]
    async fn a_batch_takes_what_fits_and_carries_the_rest() {
        // (what, item sizes in queue order, the batches expected)
        type Case = (&'static str, Vec<usize>, Vec<Vec<usize>>);
        let cases: [Case; 5] = [
            ("nothing queued", vec![], vec![]),
            ("all fit", vec![10, 20, 30], vec![vec![10, 20, 30]]),
            (
                "exactly the bound",
                vec![50, 50, 1],
                vec![vec![50, 50], vec![1]],
            ),
            (
                "an item over the bound goes alone",
                vec![10, 500, 10],
                vec![vec![10], vec![500], vec![10]],
            ),
            (
                "the count bound",
                vec![1; 9],
                vec![vec![1; 4], vec![1; 4], vec![1]],
            ),
        ];
        for (what, sizes, expected) in cases {
            assert_eq!(batches(&sizes).await, expected, "{what}");
        }
    }

    /// Goal: no more than `in_flight_max` batches are out; the next waits for a slot, and
    /// takes what queued meanwhile.
    #[tokio::test]
    async fn the_next_batch_waits_for_a_slot_and_takes_what_queued_meanwhile() {
        let (sender, incoming) = mpsc::channel(16);
        let mut accumulator = Accumulator::new(incoming, LIMITS, |size| *size);
        sender.try_send(1).unwrap();
        let (first, first_slot) = accumulator.next().await.unwrap();
        sender.try_send(2).unwrap();
        let (second, _second_slot) = accumulator.next().await.unwrap();
        assert_eq!((first, second), (vec![1], vec![2]));
        sender.try_send(3).unwrap();
        let mut third = Box::pin(accumulator.next());
        assert!(
            futures::poll!(third.as_mut()).is_pending(),
            "two batches are out"
        );
        sender.try_send(4).unwrap();
        drop(first_slot);
        let (third, _slot) = third.await.unwrap();
        assert_eq!(third, vec![3, 4]);
    }
}
