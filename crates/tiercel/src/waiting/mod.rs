//! How tiercel's threads wait: the whole waiting policy, client and server, in one place.
//!
//! Every wait in a call chooses between spinning (the thread keeps its CPU and sees the event in a
//! fraction of a microsecond: 0.2 µs on the VMs we measure on) and blocking (the CPU goes to other
//! work, and the thread takes 50 to 90 µs to wake there, a few µs on bare metal). A Null call's
//! whole round trip is 7 µs over loopback UDP and 0.13 µs through shared memory, so a call that
//! blocks once is many times slower; but a thread that spins holds a CPU that a caller, or another
//! server thread, may need. The rules, each where it lives:
//!
//! - **A caller spins, then blocks** ([`spin`]). It spins for twice the recent round trips plus
//!   [`spin::SLACK_NS`] (50 µs, about what a block costs: spinning as long as a wake-up would take
//!   loses at most that much, the classic spin-then-block bound), at most `ClientConfig::spin` (200
//!   µs by default); long calls block at once. With 5 µs of slack a one-caller UDP Null blocked at
//!   every hiccup past ~20 µs and its p99 was 1.6–2.0× the raw ping-pong's; with 50 µs, 1.25–1.44×.
//! - **Callers that spin side by side take turns** ([`spin::Spinners`]). While more than one caller
//!   of the process spins, each yields the CPU between its looks (`sched_yield`) instead of only
//!   hinting it: eight callers pinned to one CPU otherwise made no more calls over UDP than one. A
//!   UDP caller yields before its first look at all (the result cannot be back yet): 3.0–3.4 system
//!   calls per Null call with eight callers on one CPU, against 4.1–4.3.
//! - **A caller that blocks at once takes a few turns among the others first**
//!   ([`spin::WAIT_TURNS`]). While other callers of the process wait, a UDP or TCP caller that
//!   does not spin yields and looks up to four times before it blocks: the others' turns are the
//!   time the server takes to answer, and a result found at a look costs no wake-up. Alone it
//!   blocks at once.
//! - **A server thread spins after a call only with a lease** ([`leases`]). UDP workers,
//!   shared-memory binding threads and TCP connection readers all spin for their next call
//!   (`ServerConfig::spin`, 1 ms; a shared-memory binding's thread adapts it to the gaps between
//!   calls as a caller does, `ServerConfig::adaptive_spin`), but at most `ServerConfig::spinners` of
//!   them at once (one less than the CPUs, at least one): on a
//!   small machine a few spinning together took every core from the callers. Without a lease a
//!   thread blocks at once.
//! - **Extra server threads stand by until calls are held up** ([`crew`]). One UDP worker listens;
//!   the others stand by, parked, because every listener blocked in `epoll` is woken by every
//!   datagram (four listening workers made one caller's calls twice as slow); and a listener that
//!   spins takes its socket out of its epoll set until it waits again, as a socket in a set costs
//!   every datagram a visit to it (0.2 to 0.5 µs of a Null call on our VM). The *deputy* looks now
//!   and then, a [`crew::TICK`] (1 ms) after a look that found every listener running a call,
//!   otherwise twice the last wait up to [`crew::MAX_LOOK`] (8 ms): looking every tick while quick
//!   calls streamed took the spinning listener's CPU a thousand times a second (Null's p99 29.5 µs
//!   against 10.4 µs). It adds a listener when every listener ran a call at two looks in a row, or
//!   ran slow calls ([`crew::slow_calls`]: under one per [`crew::SLOW_CALL`], 50 µs, per thread)
//!   while datagrams waited. The shared-memory rendezvous thread and the TCP listener give a
//!   binding another thread by the same looks and the same measure of slow calls.
//!
//! - **A thread about to block waits in its receive where it can.** A UDP caller on its thread's
//!   own socket, a UDP listener's first wait after calls, and the first thread of a plain TCP
//!   connection block in the receive itself, which the socket's read timeout ([`RECEIVE_WAIT`])
//!   ends: one system call where `poll` and a receive after it took two. What else the thread
//!   waits for (a datagram another worker hands over, the pool's call for a thread, the server
//!   stopping, a deadline) waits for that receive to end, a tick at most; after a receive that
//!   ends with nothing, the thread waits in `poll` or `epoll`, which those end at once. The
//!   blocking caller that reads a plain TCP binding's connection waits in its receive too, without
//!   the connection's lock (nobody else reads meanwhile); in `poll` with a deadline within that
//!   wait or a buffer lent to its call, and while async calls have the connection registered with
//!   their reactor, which needs it non-blocking.
//!
//! - **An async call waits on its runtime's reactor**, and registers its socket there only when it
//!   waits, not when it spins, since every datagram that arrives on a registered socket wakes the
//!   reactor's thread if it sleeps in `epoll_wait`, beside a caller spinning for that datagram. A
//!   lone call that spins lets the registration go at once (over TCP, when no async call waits on
//!   the connection); a synchronous TCP call, once no async call has waited on the connection for
//!   [`REACTOR_IDLE`].
//!
//! What each rule costs and gains is measured by `tiercel bench` (the spin columns of the latency
//! tables, the workers table, and the blocking rows of the peers table, where nobody spins).

/// The read timeout of a socket whose thread waits in its receive: the thread looks at what else
/// it waits for at least this often. The kernel counts it in ticks of its clock and rounds it up
/// to a whole one (4 ms at 250 Hz).
pub(crate) const RECEIVE_WAIT: std::time::Duration = std::time::Duration::from_millis(1);

/// How long a TCP connection stays registered with a runtime's reactor after the last async call
/// that waited on it, when synchronous calls come next (a lone async call that spins lets it go at
/// once, and so does one over UDP with its endpoint's socket). While it is registered, every
/// datagram or segment that arrives wakes the reactor's thread if that sleeps in `epoll_wait`. On a VM with two CPUs (medians of 20,000 Null
/// calls, three runs each way), a lone async TCP call spinning in `block_on` took 9.7 to 10.9 µs
/// with its connection registered and 5.6 µs without, a spinning synchronous caller of the same
/// connection 9.6 to 10.7 µs against 5.5 to 6.1 µs (about 1.4 context switches a call, against
/// almost none), and a lone async UDP call's p99 in `block_on` was 9.2 to 11.0 µs against 4.4 to
/// 5.7 µs. Calls that wait on the reactor one after another keep the registration; the first
/// synchronous call to find it unused for this long lets it go, and the next that waits registers
/// the connection with the reactor of its own runtime.
#[cfg_attr(not(feature = "async"), allow(dead_code))]
pub(crate) const REACTOR_IDLE: std::time::Duration = std::time::Duration::from_millis(10);

pub(crate) mod crew;
pub(crate) mod leases;
pub(crate) mod spin;
