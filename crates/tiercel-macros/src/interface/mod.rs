//! `#[tiercel::interface]`: parse a trait into a model, then generate the client and server stubs.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{parse2, FnArg, Ident, ItemTrait, Pat, ReturnType, TraitItem, Type, Visibility};

/// How an argument travels.
enum ArgKind {
    /// Any `Wire` type, on the call.
    Value,
    /// `In<T>`: `T` on the call.
    In,
    /// `Out<&mut [u8]>`: its length on the call, its bytes on the result.
    Out,
    /// `InOut<&mut [u8]>`: its bytes on the call and back on the result.
    InOut,
}

struct Arg {
    name: Ident,
    ty: Type,
    kind: ArgKind,
}

struct Method {
    name: Ident,
    attrs: Vec<syn::Attribute>,
    args: Vec<Arg>,
    ret: Option<Type>,
    /// An `async fn`: the server runs it on its tokio runtime, not on a worker.
    asynchronous: bool,
    /// Its ONC procedure number (`#[onc(procedure = N)]`).
    onc: Option<u32>,
}

struct Interface {
    vis: Visibility,
    name: Ident,
    version: u32,
    methods: Vec<Method>,
    /// The ONC program and version it is served as (`onc(program = P, version = V)`).
    onc: Option<(u32, u32)>,
}

/// Collects errors so that every misuse in a trait is reported at once.
#[derive(Default)]
struct Errors(Option<syn::Error>);

impl Errors {
    fn push(&mut self, span: Span, msg: impl std::fmt::Display) {
        let e = syn::Error::new(span, msg);
        match &mut self.0 {
            Some(all) => all.combine(e),
            None => self.0 = Some(e),
        }
    }
}

pub(crate) fn expand(attr: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let (version, onc) = parse_options(attr)?;
    let mut item: ItemTrait = parse2(item)?;
    let model = parse_trait(&item, version, onc)?;
    let client = generate_client(&model);
    let server = generate_server(&model);
    let onc = onc::generate_onc(&model);
    desugar_async(&mut item);
    strip_onc(&mut item);
    Ok(quote! {
        #item
        #client
        #server
        #onc
    })
}

/// Rewrites each `async fn` of the trait as a `fn` returning `impl Future<Output = R> + Send`, so
/// that the server can run the procedure on a multi-threaded runtime; an implementation still
/// writes `async fn`.
fn desugar_async(item: &mut ItemTrait) {
    for ti in &mut item.items {
        let TraitItem::Fn(f) = ti else { continue };
        let Some(asyncness) = f.sig.asyncness.take() else { continue };
        let ret: Type = match &f.sig.output {
            ReturnType::Default => syn::parse_quote!(()),
            ReturnType::Type(_, ty) => (**ty).clone(),
        };
        let span = asyncness.span();
        f.sig.output = syn::parse_quote_spanned! {span=>
            -> impl ::core::future::Future<Output = #ret> + ::core::marker::Send
        };
    }
}

/// The interface's version, and its ONC program and version if it has them.
fn parse_options(attr: TokenStream) -> syn::Result<(u32, Option<(u32, u32)>)> {
    let mut version = 1;
    let mut onc = None;
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("version") {
            let lit: syn::LitInt = meta.value()?.parse()?;
            version = lit.base10_parse()?;
            Ok(())
        } else if meta.path.is_ident("onc") {
            let (mut program, mut onc_version) = (None, None);
            meta.parse_nested_meta(|m| {
                let lit: syn::LitInt = m.value()?.parse()?;
                if m.path.is_ident("program") {
                    program = Some(lit.base10_parse()?);
                } else if m.path.is_ident("version") {
                    onc_version = Some(lit.base10_parse()?);
                } else {
                    return Err(m.error("expected `program = P` or `version = V`"));
                }
                Ok(())
            })?;
            let program = program.ok_or_else(|| meta.error("`onc(...)` needs `program = P`"))?;
            onc = Some((program, onc_version.unwrap_or(1)));
            Ok(())
        } else {
            Err(meta.error("unknown interface option; expected `version = N` or `onc(program = P, version = V)`"))
        }
    });
    syn::parse::Parser::parse2(parser, attr)?;
    Ok((version, onc))
}

/// Whether `attr` is `#[onc(...)]`.
fn is_onc(attr: &syn::Attribute) -> bool {
    attr.path().is_ident("onc")
}

/// Removes the `#[onc(...)]` attributes of the trait's methods (they are this macro's).
fn strip_onc(item: &mut ItemTrait) {
    for ti in &mut item.items {
        if let TraitItem::Fn(f) = ti {
            f.attrs.retain(|a| !is_onc(a));
        }
    }
}

/// A method's `#[onc(procedure = N)]`.
fn onc_procedure(attrs: &[syn::Attribute], errors: &mut Errors) -> Option<u32> {
    let mut number = None;
    for attr in attrs.iter().filter(|a| is_onc(a)) {
        let parsed = attr.parse_nested_meta(|m| {
            if m.path.is_ident("procedure") {
                let lit: syn::LitInt = m.value()?.parse()?;
                number = Some(lit.base10_parse()?);
                Ok(())
            } else {
                Err(m.error("expected `procedure = N`"))
            }
        });
        if let Err(e) = parsed {
            errors.push(e.span(), e);
        }
    }
    number
}

fn parse_trait(item: &ItemTrait, version: u32, onc: Option<(u32, u32)>) -> syn::Result<Interface> {
    let mut errors = Errors::default();
    if !item.generics.params.is_empty() || item.generics.where_clause.is_some() {
        errors.push(item.generics.span(), "an RPC interface cannot be generic");
    }
    if let Some(unsafety) = &item.unsafety {
        errors.push(unsafety.span(), "an RPC interface cannot be an unsafe trait");
    }
    let mut methods = Vec::new();
    for ti in &item.items {
        let TraitItem::Fn(f) = ti else {
            errors.push(ti.span(), "an RPC interface may contain only methods");
            continue;
        };
        let sig = &f.sig;
        if !sig.generics.params.is_empty() {
            errors.push(sig.generics.span(), "a remote procedure cannot be generic");
        }
        let asynchronous = sig.asyncness.is_some();
        if asynchronous && f.default.is_some() {
            errors.push(f.default.span(), "an async remote procedure cannot have a default body");
        }
        if let Some(u) = &sig.unsafety {
            errors.push(u.span(), "a remote procedure cannot be unsafe");
        }
        if let Some(v) = &sig.variadic {
            errors.push(v.span(), "a remote procedure cannot be variadic");
        }
        let mut args = Vec::new();
        let mut has_receiver = false;
        for input in &sig.inputs {
            match input {
                FnArg::Receiver(r) => {
                    has_receiver = true;
                    if r.reference.is_none() || r.mutability.is_some() || r.colon_token.is_some() {
                        errors.push(
                            r.span(),
                            "a remote procedure takes `&self`: the server runs calls concurrently on a shared implementation",
                        );
                    }
                }
                FnArg::Typed(pt) => {
                    let Pat::Ident(pi) = &*pt.pat else {
                        errors.push(pt.pat.span(), "remote procedure arguments must be plain names");
                        continue;
                    };
                    match classify(&pt.ty) {
                        Ok(kind) if asynchronous && !matches!(kind, ArgKind::Value | ArgKind::In) => errors.push(
                            pt.ty.span(),
                            "an async remote procedure cannot take `Out` or `InOut` buffers: return the bytes",
                        ),
                        Ok(_) if asynchronous && find_reference(&pt.ty).is_some() => errors.push(
                            pt.ty.span(),
                            "an async remote procedure takes owned arguments (`String`, `Vec<u8>`): it runs after \
                             the packet that carried them is gone",
                        ),
                        Ok(kind) => args.push(Arg { name: pi.ident.clone(), ty: (*pt.ty).clone(), kind }),
                        Err((span, msg)) => errors.push(span, msg),
                    }
                }
            }
        }
        if !has_receiver {
            errors.push(sig.ident.span(), "a remote procedure takes `&self`");
        }
        let ret = match &sig.output {
            ReturnType::Default => None,
            ReturnType::Type(_, ty) => {
                if let Some(span) = find_reference(ty) {
                    errors.push(
                        span,
                        "a remote procedure returns owned values; use `Vec<u8>` or `String`, or an `Out` buffer",
                    );
                }
                if let Some(span) = unsupported(ty) {
                    errors.push(span, "this type cannot travel in a remote procedure call");
                }
                Some((**ty).clone())
            }
        };
        let procedure = onc_procedure(&f.attrs, &mut errors);
        if onc.is_some() {
            check_onc(sig, &args, asynchronous, procedure, &methods, &mut errors);
        } else if procedure.is_some() {
            errors.push(sig.ident.span(), "`#[onc(procedure = N)]` needs `onc(program = P)` on the interface");
        }
        let attrs = f.attrs.iter().filter(|a| !is_onc(a)).cloned().collect();
        methods.push(Method { name: sig.ident.clone(), attrs, args, ret, asynchronous, onc: procedure });
    }
    if methods.len() > u16::MAX as usize {
        errors.push(item.ident.span(), "an interface has at most 65535 procedures");
    }
    match errors.0 {
        Some(e) => Err(e),
        None => Ok(Interface { vis: item.vis.clone(), name: item.ident.clone(), version, methods, onc }),
    }
}

fn last_segment(ty: &Type) -> Option<(&Ident, Option<&Type>)> {
    let Type::Path(p) = ty else { return None };
    if p.qself.is_some() {
        return None;
    }
    let seg = p.path.segments.last()?;
    let inner = match &seg.arguments {
        syn::PathArguments::AngleBracketed(a) if a.args.len() == 1 => match a.args.first() {
            Some(syn::GenericArgument::Type(t)) => Some(t),
            _ => None,
        },
        _ => None,
    };
    Some((&seg.ident, inner))
}

fn is_mut_byte_slice(ty: &Type) -> bool {
    match ty {
        Type::Reference(r) if r.mutability.is_some() => match &*r.elem {
            Type::Slice(s) => matches!(&*s.elem, Type::Path(p) if p.path.is_ident("u8")),
            _ => false,
        },
        _ => false,
    }
}

/// Sorts an argument type into how it travels, or explains why it cannot.
fn classify(ty: &Type) -> Result<ArgKind, (Span, &'static str)> {
    if let Some((ident, inner)) = last_segment(ty) {
        let wrapper = ident.to_string();
        match (wrapper.as_str(), inner) {
            ("Out", Some(t)) if is_mut_byte_slice(t) => return Ok(ArgKind::Out),
            ("InOut", Some(t)) if is_mut_byte_slice(t) => return Ok(ArgKind::InOut),
            ("Out", _) | ("InOut", _) => return Err((ty.span(), "`Out` and `InOut` buffers must be `&mut [u8]`")),
            ("In", Some(t)) => {
                check_value(t)?;
                return Ok(ArgKind::In);
            }
            _ => {}
        }
    }
    check_value(ty)?;
    Ok(ArgKind::Value)
}

fn check_value(ty: &Type) -> Result<(), (Span, &'static str)> {
    if let Type::Reference(r) = ty {
        if r.mutability.is_some() {
            return Err((
                ty.span(),
                "a remote procedure cannot take `&mut`; use `Out<&mut [u8]>` or `InOut<&mut [u8]>`",
            ));
        }
        let ok = match &*r.elem {
            Type::Slice(s) => matches!(&*s.elem, Type::Path(p) if p.path.is_ident("u8")),
            Type::Path(p) => p.path.is_ident("str"),
            _ => false,
        };
        if !ok {
            return Err((
                ty.span(),
                "only `&[u8]` and `&str` can be borrowed from the call; pass other types by value",
            ));
        }
        return Ok(());
    }
    if let Some(span) = unsupported(ty) {
        return Err((span, "this type cannot travel in a remote procedure call"));
    }
    Ok(())
}

/// Types that never implement `Wire`: trait objects, `impl Trait`, function pointers, raw pointers.
fn unsupported(ty: &Type) -> Option<Span> {
    match ty {
        Type::ImplTrait(_)
        | Type::TraitObject(_)
        | Type::BareFn(_)
        | Type::Ptr(_)
        | Type::Never(_)
        | Type::Infer(_) => Some(ty.span()),
        Type::Tuple(t) => t.elems.iter().find_map(unsupported),
        Type::Array(a) => unsupported(&a.elem),
        Type::Paren(p) => unsupported(&p.elem),
        _ => None,
    }
}

fn find_reference(ty: &Type) -> Option<Span> {
    match ty {
        Type::Reference(_) => Some(ty.span()),
        Type::Tuple(t) => t.elems.iter().find_map(find_reference),
        Type::Array(a) => find_reference(&a.elem),
        Type::Paren(p) => find_reference(&p.elem),
        Type::Path(p) => p.path.segments.iter().find_map(|s| match &s.arguments {
            syn::PathArguments::AngleBracketed(a) => a.args.iter().find_map(|g| match g {
                syn::GenericArgument::Type(t) => find_reference(t),
                syn::GenericArgument::Lifetime(l) => Some(l.span()),
                _ => None,
            }),
            _ => None,
        }),
        _ => None,
    }
}

/// Whether a procedure's one buffer is an `InOut` and its last argument: the buffer's bytes end the
/// call and begin the result, so that the server runs it where its arguments arrived and the
/// client stubs (synchronous and async) lend the buffer to receive the result into.
fn in_place_of(method: &Method) -> bool {
    let mut buffers = method.args.iter().filter(|a| matches!(a.kind, ArgKind::Out | ArgKind::InOut));
    !method.asynchronous
        && buffers.next().is_some()
        && buffers.next().is_none()
        && method.args.last().is_some_and(|a| matches!(a.kind, ArgKind::InOut))
}

/// What a procedure of an interface served over ONC must be.
fn check_onc(
    sig: &syn::Signature,
    args: &[Arg],
    asynchronous: bool,
    procedure: Option<u32>,
    before: &[Method],
    errors: &mut Errors,
) {
    match procedure {
        None => errors.push(
            sig.ident.span(),
            "a procedure of an ONC interface needs its number: `#[onc(procedure = N)]` (1 or more; 0 is the null procedure)",
        ),
        Some(0) => errors.push(sig.ident.span(), "ONC procedure 0 is the null procedure, which every program answers"),
        Some(n) if before.iter().any(|m| m.onc == Some(n)) => {
            errors.push(sig.ident.span(), format!("ONC procedure {n} is already another procedure's"))
        }
        Some(_) => {}
    }
    if asynchronous {
        errors.push(
            sig.ident.span(),
            "a procedure of an ONC interface is synchronous (the ONC server runs it on its threads)",
        );
    }
    for a in args.iter().filter(|a| matches!(a.kind, ArgKind::Out | ArgKind::InOut)) {
        errors.push(
            a.ty.span(),
            "ONC calls carry values: take `&[u8]` or `Vec<u8>` and return the bytes, not `Out` or `InOut`",
        );
    }
}

mod client;
mod onc;
mod server;

use client::generate_client;
use server::generate_server;
