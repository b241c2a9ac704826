//! Procedural macros of tiercel: `#[tiercel::interface]`, `#[derive(tiercel::Wire)]` and
//! `#[derive(tiercel::Xdr)]`.
//!
//! Each macro parses its input into a small typed model (collecting span-tagged errors, so a misuse
//! points at the offending tokens), then generates straight-line code from the model: no interpreter,
//! no table of field descriptors, just one encode or decode call per argument.

#![forbid(unsafe_code)]

mod derive;
mod interface;
mod xdr;

use proc_macro::TokenStream;

/// Turns a trait into an RPC interface.
///
/// ```ignore
/// #[tiercel::interface]
/// pub trait Store {
///     fn put(&self, key: String, value: tiercel::In<&[u8]>) -> Result<u64, String>;
///     fn get(&self, key: &str, into: tiercel::Out<&mut [u8]>) -> usize;
/// }
/// ```
///
/// What a trait may hold: only methods, none generic, unsafe or variadic, each taking `&self` (the
/// server runs calls concurrently on one shared implementation) and arguments with plain names. A
/// method may be an `async fn` (crate feature `async`): the server runs it on its tokio runtime
/// rather than a worker, and it takes owned arguments (no `&str`, `&[u8]`, `Out` or `InOut`: it
/// outlives the packet that carried them). An argument is one of:
/// * a value of any type that implements `tiercel::Wire` (integers, floats, `bool`, `char`,
///   `String`, `Vec<T>`, `Option<T>`, `Result<T, E>`, maps and sets of the standard library, tuples,
///   arrays, and your own types with
///   `#[derive(tiercel::Wire)]`), passed by value;
/// * `&[u8]` or `&str`, borrowed: the server's procedure reads them straight from the received
///   packet, without a copy;
/// * `In<T>`: sent on the call only; `In<&[u8]>` goes from the caller's buffer with no staging copy;
/// * `Out<&mut [u8]>`: the caller's buffer, filled in place by the result (only its length travels
///   on the call);
/// * `InOut<&mut [u8]>`: sent on the call and filled from the result.
///
/// A procedure returns nothing or an owned `Wire` value (no references: return `Vec<u8>` or
/// `String`, or fill an `Out` buffer). Misuse is a compile error pointing at the offending tokens.
///
/// Generates, beside the trait itself:
/// * `<Trait>Client`: one method per procedure, taking the same arguments and returning
///   `Result<R, tiercel::CallError>` (a procedure that returns `Result<T, E>` comes back as
///   `Result<Result<T, E>, tiercel::CallError>`: the outer error is the call's, the inner the
///   procedure's own);
///   Each client also has `binding()` (the `tiercel::Binding`: transport, server, incarnation,
///   counters) and `with_deadline(duration)` (a clone whose calls fail with
///   `CallError::DeadlineExceeded` after that long). Clones share the binding; each thread that
///   calls gets its own client slot, up to the server's `slots_per_binding`;
/// * `<Trait>AsyncClient` (crate feature `async`): the same methods as `async fn`s for tokio tasks,
///   which wait without holding a thread and queue for a slot when every one is busy
///   (`Client::import_async`, or `to_async()` on a `<Trait>Client`);
/// * `<Trait>Server<T>`: wraps an implementation of the trait and dispatches calls to it by
///   procedure number (the declaration order), for `Server::export`. A procedure whose one buffer
///   is an `InOut` and its last argument can also run where the call's arguments arrived
///   (`Export::dispatch_in_place`): a UDP server runs a call of several packets so, on the buffer
///   where it put the call together, and sends the buffer back from there without copying it.
///
/// Binding compares the interface's name and version, then each procedure's shape: the encodings of
/// its arguments and result, down to every field and variant of the types they reach
/// (`tiercel::wire::shape`). A client whose copy of the trait has procedures added, removed or
/// reordered binds by procedure names (a procedure the server lacks fails without being sent); a
/// procedure of the same name with another shape is refused at import, naming it and the type that
/// differs. `#[tiercel::interface(version = 2)]` sets the version (1 by default): bump it for a
/// deliberate break, such as a procedure whose meaning changes without its shape changing.
#[proc_macro_attribute]
pub fn interface(attr: TokenStream, item: TokenStream) -> TokenStream {
    interface::expand(attr.into(), item.into()).unwrap_or_else(syn::Error::into_compile_error).into()
}

/// Derives `tiercel::Wire` for a struct or enum: fields in declaration order, enums as a `u32`
/// variant index followed by the variant's fields. Its shape (`Wire::shape`: every field's name and
/// shape, every variant) is part of each procedure that carries it, so a change to it is found at
/// bind rather than read as other bytes.
#[proc_macro_derive(Wire)]
pub fn derive_wire(input: TokenStream) -> TokenStream {
    derive::expand(input.into()).unwrap_or_else(syn::Error::into_compile_error).into()
}

/// Derives `tiercel::xdr::Xdr` for a struct or enum, for interfaces served over ONC RPC: a struct is
/// an XDR `struct` (fields in declaration order; tuple fields named `f0`, `f1`, …), an enum of unit
/// variants an XDR `enum` (constants `Enum_Variant`, numbered from 0), and an enum with data a
/// `union` switched on the variant's index, each arm the variant's one unnamed field or a struct
/// `Enum_Variant` of its fields. Its `.x` definition comes with the interface's
/// (`tiercel::xdr::XFile`). The type takes no type parameters: a `.x` file names each type once.
#[proc_macro_derive(Xdr)]
pub fn derive_xdr(input: TokenStream) -> TokenStream {
    xdr::expand(input.into()).unwrap_or_else(syn::Error::into_compile_error).into()
}
