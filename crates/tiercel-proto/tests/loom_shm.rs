//! Model check of the shared-memory call handshake with loom: every interleaving (and every
//! reordering the memory model allows) of a client making calls and a server serving them, each
//! spinning briefly and then blocking on a futex. A lost wake-up would leave both blocked, which loom
//! reports as a deadlock; a result read before it was published would fail the assertions.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p tiercel-proto --test loom_shm --release`.
#![cfg(loom)]

use loom::sync::atomic::{AtomicU32, AtomicUsize};
use loom::sync::{Arc, Condvar, Mutex};
use std::sync::atomic::Ordering;
use tiercel_proto::shm::{self, Word};

struct W(AtomicU32);

impl Word for W {
    fn load(&self, o: Ordering) -> u32 {
        self.0.load(o)
    }
    fn store(&self, v: u32, o: Ordering) {
        self.0.store(v, o)
    }
    fn fetch_add(&self, v: u32, o: Ordering) -> u32 {
        self.0.fetch_add(v, o)
    }
    fn fence_seq_cst() {
        loom::sync::atomic::fence(Ordering::SeqCst)
    }
    // loom has no system-wide barrier (`membarrier`). What the server's barrier guarantees is that
    // the client's thread passes through a full fence at the moment the barrier is issued, between
    // its program-ordered accesses: the model gives the client a full fence where its compiler fence
    // is, and the server a full fence where its barrier is. It checks the handshake given that
    // guarantee, not the kernel's barrier.
    fn fence_light() {
        loom::sync::atomic::fence(Ordering::SeqCst)
    }
}

/// A futex: `wait` sleeps only while the word still holds the expected value, checked atomically
/// with going to sleep (the mutex stands for the kernel's hash-bucket lock); `wake` wakes sleepers.
struct Futex {
    lock: Mutex<()>,
    cv: Condvar,
}

impl Futex {
    fn new() -> Futex {
        Futex { lock: Mutex::new(()), cv: Condvar::new() }
    }
    fn wait(&self, word: &W, expected: u32) {
        let g = self.lock.lock().unwrap();
        if word.load(Ordering::SeqCst) == expected {
            drop(self.cv.wait(g).unwrap());
        }
    }
    fn wake(&self) {
        let _g = self.lock.lock().unwrap();
        self.cv.notify_all();
    }
}

struct Region {
    state: W,
    client_waiting: W,
    server_sleeping: W,
    doorbell: W,
    /// Stands for the slot's data: written before publishing, read after seeing the publication.
    data: AtomicUsize,
    state_futex: Futex,
    doorbell_futex: Futex,
}

const CALLS: usize = 2;

#[test]
fn no_lost_wakeup_and_results_are_seen_whole() {
    model(false);
}

/// The same, with a client that publishes with a compiler fence only and a server that issues a
/// system-wide barrier before its last look at the slots (`header::SERVER_BARRIER`).
#[test]
fn no_lost_wakeup_with_the_server_s_barrier_in_place_of_the_client_s_fence() {
    model(true);
}

fn model(barrier: bool) {
    loom::model(move || {
        let r = Arc::new(Region {
            state: W(AtomicU32::new(shm::state::IDLE)),
            client_waiting: W(AtomicU32::new(0)),
            server_sleeping: W(AtomicU32::new(0)),
            doorbell: W(AtomicU32::new(0)),
            data: AtomicUsize::new(0),
            state_futex: Futex::new(),
            doorbell_futex: Futex::new(),
        });
        let server = {
            let r = r.clone();
            loom::thread::spawn(move || {
                for _ in 0..CALLS {
                    // Spin once, then sleep until a call is published.
                    while !shm::server_has_call(&r.state) {
                        if let Some(bell) = shm::server_prepare_sleep(&r.doorbell, &r.server_sleeping, || {
                            if barrier {
                                // The system-wide barrier: see `W::fence_light`.
                                loom::sync::atomic::fence(Ordering::SeqCst);
                            }
                            shm::server_has_call(&r.state)
                        }) {
                            r.doorbell_futex.wait(&r.doorbell, bell);
                            shm::server_woke(&r.server_sleeping);
                        }
                    }
                    let args = r.data.load(Ordering::Relaxed);
                    r.data.store(args * 10, Ordering::Relaxed);
                    if shm::server_publish(&r.state, &r.client_waiting) != shm::Wake::Nobody {
                        r.state_futex.wake();
                    }
                }
            })
        };
        for call in 1..=CALLS {
            r.data.store(call, Ordering::Relaxed);
            let published = if barrier {
                shm::client_publish_light(&r.state, &r.server_sleeping, &r.doorbell)
            } else {
                shm::client_publish(&r.state, &r.server_sleeping, &r.doorbell)
            };
            if published {
                r.doorbell_futex.wake();
            }
            while !shm::client_done(&r.state) {
                if shm::client_prepare_block(&r.state, &r.client_waiting) {
                    r.state_futex.wait(&r.state, shm::state::CALL);
                }
                shm::client_woke(&r.client_waiting);
            }
            assert_eq!(r.data.load(Ordering::Relaxed), call * 10, "the result is the server's, whole");
        }
        server.join().unwrap();
    });
}
