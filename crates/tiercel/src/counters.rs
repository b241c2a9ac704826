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
