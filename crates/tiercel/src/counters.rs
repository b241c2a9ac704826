//! Counters: atomics that the library bumps as it goes, and the plain snapshot of them a user reads.
//!
//! `counters!` declares both at once from one list of documented fields: the crate-private atomic
//! struct, the public snapshot of `u64`s (`#[non_exhaustive]`: counters are added without breaking
//! users), `snapshot()` between them, and a `Display` of `name=value` pairs for logs.

macro_rules! counters {
    (
        $(#[$counters_doc:meta])* $counters:ident,
        $(#[$snapshot_doc:meta])* $snapshot:ident {
            $( $(#[$doc:meta])* $name:ident, )*
        }
    ) => {
        $(#[$counters_doc])*
        #[derive(Debug, Default)]
        pub(crate) struct $counters {
            $( pub(crate) $name: std::sync::atomic::AtomicU64, )*
        }

        $(#[$snapshot_doc])*
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
        #[non_exhaustive]
        pub struct $snapshot {
            $( $(#[$doc])* pub $name: u64, )*
        }

        impl $counters {
            /// The counters as they stand (each read on its own: a snapshot taken while calls run is
            /// not one instant's).
            pub(crate) fn snapshot(&self) -> $snapshot {
                $snapshot { $( $name: self.$name.load(std::sync::atomic::Ordering::Relaxed), )* }
            }
        }

        impl core::fmt::Display for $snapshot {
            /// The counters as `name=value` pairs, for logs.
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                let mut first = true;
                $(
                    if !first {
                        f.write_str(" ")?;
                    }
                    first = false;
                    write!(f, "{}={}", stringify!($name), self.$name)?;
                )*
                let _ = first;
                Ok(())
            }
        }
    };
}

pub(crate) use counters;

/// A count that threads add to each on a counter of its own, with no locked instruction (a
/// shared-memory binding's threads count the calls they run this way: a locked add on the path of
/// every call, between seeing it and publishing its result, made a Null call slower), summed when
/// read. A counter has one owner at a time ([`Shard`]); given back, it keeps its count and goes to
/// the next thread that asks for one, so there are never more counters than threads that held one
/// at once.
#[derive(Debug, Default)]
pub(crate) struct Shards {
    counters: std::sync::Mutex<Made>,
}

/// Every counter made, and those no thread holds.
type Made = (Vec<std::sync::Arc<Padded>>, Vec<std::sync::Arc<Padded>>);

/// A counter on cache lines of its own, so that its owner's adds never touch another's line.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded(std::sync::atomic::AtomicU64);

/// A thread's counter of [`Shards`]: only its holder adds to it.
#[derive(Debug)]
pub(crate) struct Shard {
    counter: std::sync::Arc<Padded>,
    shards: std::sync::Arc<Shards>,
}

impl Shards {
    /// A counter for the calling thread: one given back earlier, or a new one.
    pub(crate) fn take(self: &std::sync::Arc<Self>) -> Shard {
        let mut counters = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        let counter = counters.1.pop().unwrap_or_else(|| {
            let new = std::sync::Arc::new(Padded::default());
            counters.0.push(new.clone());
            new
        });
        Shard { counter, shards: self.clone() }
    }

    /// The count: every counter's sum. An add that happened before this thread learned of it (a
    /// call whose result it has read) is in it.
    pub(crate) fn sum(&self) -> u64 {
        let counters = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        counters.0.iter().map(|c| c.0.load(std::sync::atomic::Ordering::Relaxed)).fold(0, u64::wrapping_add)
    }
}

impl Shard {
    /// Adds one: a load and a store, no locked instruction (this thread alone writes the counter;
    /// the lock it was taken and given back under orders one holder's adds before the next's).
    #[inline]
    pub(crate) fn add_one(&self) {
        let c = &self.counter.0;
        c.store(c.load(std::sync::atomic::Ordering::Relaxed).wrapping_add(1), std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for Shard {
    fn drop(&mut self) {
        let mut counters = self.shards.counters.lock().unwrap_or_else(|p| p.into_inner());
        counters.1.push(self.counter.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn shards_sum_every_holders_adds_and_a_counter_given_back_is_reused_with_its_count() {
        let shards = Arc::new(Shards::default());
        let (a, b) = (shards.take(), shards.take());
        for _ in 0..3 {
            a.add_one();
        }
        b.add_one();
        assert_eq!(shards.sum(), 4);
        drop(a);
        let c = shards.take();
        c.add_one();
        assert_eq!(shards.sum(), 5, "the counter given back kept its three");
        assert_eq!(shards.counters.lock().unwrap().0.len(), 2, "the given-back counter was reused, not a third made");
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let shards = shards.clone();
                std::thread::spawn(move || {
                    let s = shards.take();
                    for _ in 0..1000 {
                        s.add_one();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(shards.sum(), 4005, "no add lost across threads and owners");
        drop((b, c));
    }
}
