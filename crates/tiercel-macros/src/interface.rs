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
}

struct Interface {
    vis: Visibility,
    name: Ident,
    version: u32,
    methods: Vec<Method>,
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
    let version = parse_version(attr)?;
    let mut item: ItemTrait = parse2(item)?;
    let model = parse_trait(&item, version)?;
    let client = generate_client(&model);
    let server = generate_server(&model);
    desugar_async(&mut item);
    Ok(quote! {
        #item
        #client
        #server
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

fn parse_version(attr: TokenStream) -> syn::Result<u32> {
    if attr.is_empty() {
        return Ok(1);
    }
    let mut version = 1;
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("version") {
            let lit: syn::LitInt = meta.value()?.parse()?;
            version = lit.base10_parse()?;
            Ok(())
        } else {
            Err(meta.error("unknown interface option; expected `version = N`"))
        }
    });
    syn::parse::Parser::parse2(parser, attr)?;
    Ok(version)
}

fn parse_trait(item: &ItemTrait, version: u32) -> syn::Result<Interface> {
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
        methods.push(Method { name: sig.ident.clone(), attrs: f.attrs.clone(), args, ret, asynchronous });
    }
    if methods.len() > u16::MAX as usize {
        errors.push(item.ident.span(), "an interface has at most 65535 procedures");
    }
    match errors.0 {
        Some(e) => Err(e),
        None => Ok(Interface { vis: item.vis.clone(), name: item.ident.clone(), version, methods }),
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

/// The closure that writes one argument's or result's shape ([`tiercel::wire::shape`]): a value's
/// through its `Wire::shape`, a buffer's as `In<…>`, `Out<Vec<u8>>` or `InOut<Vec<u8>>`.
fn shape_writer(ty: &Type, kind: &ArgKind) -> TokenStream {
    let body = match kind {
        ArgKind::Value => quote!(__s.of::<#ty>();),
        ArgKind::In => match last_segment(ty) {
            Some((_, Some(inner))) => quote!(__s.write("In<"); __s.of::<#inner>(); __s.write(">");),
            _ => quote!(__s.write("In<"); __s.opaque::<#ty>(); __s.write(">");),
        },
        ArgKind::Out => quote!(__s.write("Out<Vec<u8>>");),
        ArgKind::InOut => quote!(__s.write("InOut<Vec<u8>>");),
    };
    quote!(&|__s: &mut ::tiercel::wire::shape::Shape<'_>| { #body })
}

/// The generated `describe` of the interface: each procedure's line of the signature,
/// `name(shape, …) -> shape` (argument names are left out: renaming one changes nothing on the
/// wire), in the order of their numbers.
fn describe(m: &Interface) -> TokenStream {
    let lines = m.methods.iter().map(|x| {
        let name = x.name.to_string();
        let args = x.args.iter().map(|a| shape_writer(&a.ty, &a.kind));
        let result = match &x.ret {
            Some(r) => {
                let w = shape_writer(r, &ArgKind::Value);
                quote!(::core::option::Option::Some(#w))
            }
            None => quote!(::core::option::Option::None),
        };
        quote!(__shapes.procedure(#name, &[#(#args),*], #result))
    });
    quote! {
        {
            fn __describe(__shapes: &mut ::tiercel::wire::shape::Shapes) -> ::std::vec::Vec<::std::string::String> {
                ::std::vec![#(#lines),*]
            }
            __describe
        }
    }
}

fn info_tokens(m: &Interface) -> TokenStream {
    let name = m.name.to_string();
    let version = m.version;
    let procs = m.methods.iter().map(|x| x.name.to_string());
    let describe = describe(m);
    quote! {
        &::tiercel::InterfaceInfo {
            name: #name,
            id: ::tiercel::__private::interface_id(#name),
            version: #version,
            procedures: &[#(#procs),*],
            source: ::tiercel::SignatureSource::Described(#describe),
        }
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

/// The client stubs' methods, one per procedure: synchronous, or `async` (awaiting the slot and the
/// result).
fn client_methods(m: &Interface, asynchronous: bool) -> Vec<TokenStream> {
    m.methods
        .iter()
        .enumerate()
        .map(|(index, method)| {
            let index = index as u16;
            let name = &method.name;
            let attrs = method.attrs.iter().filter(|a| a.path().is_ident("doc"));
            let params = method.args.iter().map(|a| {
                let (n, t) = (&a.name, &a.ty);
                quote!(#n: #t)
            });
            // A call lends an in-place procedure's buffer to the call whole (`Call::invoke_in_out`,
            // `AsyncCall::invoke_in_out`): sent from it, and its result received into it.
            let lend = in_place_of(method).then(|| &method.args[method.args.len() - 1].name);
            let encode = method.args.iter().map(|a| {
                let n = &a.name;
                let span = a.ty.span();
                match a.kind {
                    ArgKind::Value => quote_spanned!(span=> ::tiercel::Wire::encode(&#n, &mut __w);),
                    ArgKind::In => quote_spanned!(span=> ::tiercel::Wire::encode(&#n.0, &mut __w);),
                    ArgKind::Out => quote!(__w.put_len(#n.0.len());),
                    ArgKind::InOut if lend.is_some() => quote!(__w.put_len(#n.0.len());),
                    ArgKind::InOut => quote! {
                        __w.put_len(#n.0.len());
                        __w.put_borrowed(&*#n.0);
                    },
                }
            });
            let read_back = method.args.iter().filter(|a| matches!(a.kind, ArgKind::Out | ArgKind::InOut)).map(|a| {
                let n = &a.name;
                if lend.is_some() {
                    quote! {
                        if __reply.in_place() {
                            __r.take(#n.0.len()).map_err(::tiercel::Reply::bad_result)?;
                        } else {
                            __r.read_into(#n.0).map_err(::tiercel::Reply::bad_result)?;
                        }
                    }
                } else {
                    quote!(__r.read_into(#n.0).map_err(::tiercel::Reply::bad_result)?;)
                }
            });
            let ret_ty = method.ret.clone().unwrap_or_else(|| syn::parse_quote!(()));
            let ret_span = ret_ty.span();
            let decode_ret =
                quote_spanned!(ret_span=> let __ret: #ret_ty = __r.decode().map_err(::tiercel::Reply::bad_result)?;);
            let span = method.name.span();
            let (asyncness, start, invoke) = if asynchronous {
                (
                    quote!(async),
                    quote! {
                        let mut __call = self.binding.call_async(#index);
                        __call.start().await?;
                    },
                    // The call is done with the arguments it borrowed: end the borrow before
                    // results are read back into them.
                    match lend {
                        Some(n) => quote!({
                            let __reply = __call.invoke_in_out(&mut *#n.0).await?;
                            ::core::mem::drop(__call);
                            __reply
                        }),
                        None => quote!({
                            let __reply = __call.invoke().await?;
                            ::core::mem::drop(__call);
                            __reply
                        }),
                    },
                )
            } else {
                let invoke = match lend {
                    Some(n) => quote!(__call.invoke_in_out(&mut *#n.0)?),
                    None => quote!(__call.invoke()?),
                };
                (quote!(), quote!(let mut __call = self.binding.call(#index)?;), invoke)
            };
            quote_spanned! {span=>
                #(#attrs)*
                pub #asyncness fn #name(&self, #(#params),*) -> ::core::result::Result<#ret_ty, ::tiercel::CallError> {
                    #start
                    {
                        let mut __w = __call.writer();
                        #(#encode)*
                        let _ = &mut __w;
                    }
                    let __reply = #invoke;
                    let mut __r = __reply.reader();
                    #(#read_back)*
                    #decode_ret
                    __r.finish().map_err(::tiercel::Reply::bad_result)?;
                    ::core::result::Result::Ok(__ret)
                }
            }
        })
        .collect()
}

/// A client stub: the struct holding the binding, its common methods, and `methods`.
fn stub(vis: &Visibility, name: &Ident, doc: &str, methods: TokenStream) -> TokenStream {
    quote! {
        #[doc = #doc]
        #[derive(Debug, Clone)]
        #vis struct #name {
            binding: ::tiercel::Binding,
        }

        impl #name {
            /// The binding this stub calls through.
            pub fn binding(&self) -> &::tiercel::Binding {
                &self.binding
            }

            /// A clone whose calls carry `deadline`: each fails with `CallError::DeadlineExceeded`
            /// when it passes, and the server does not start one after it.
            pub fn with_deadline(&self, deadline: ::core::time::Duration) -> Self {
                Self { binding: self.binding.with_deadline(deadline) }
            }

            #methods
        }
    }
}

fn generate_client(m: &Interface) -> TokenStream {
    let vis = &m.vis;
    let client = format_ident!("{}Client", m.name);
    let async_client = format_ident!("{}AsyncClient", m.name);
    let info = info_tokens(m);
    let doc = format!("Client stub of the `{}` interface: one method per remote procedure.", m.name);
    let async_doc = format!(
        "Async client stub of the `{}` interface (crate feature `async`): one `async` method per remote \
         procedure, for tokio tasks. Calls wait without holding a thread; when every slot of the binding \
         is in use they queue; dropping a call's future cancels it.",
        m.name
    );
    let methods = client_methods(m, false);
    let async_methods = client_methods(m, true);
    let sync_stub = stub(vis, &client, &doc, quote!(#(#methods)*));
    let to_sync = quote! {
        /// The synchronous stub on the same binding.
        pub fn to_sync(&self) -> #client {
            #client { binding: self.binding.clone() }
        }

        #(#async_methods)*
    };
    let async_stub = stub(vis, &async_client, &async_doc, to_sync);
    quote! {
        #sync_stub

        impl ::tiercel::Import for #client {
            const INFO: &'static ::tiercel::InterfaceInfo = #info;
            fn from_binding(binding: ::tiercel::Binding) -> Self {
                Self { binding }
            }
        }

        ::tiercel::__async_client! {
            #async_stub

            impl #client {
                /// The async stub on the same binding (crate feature `async`).
                pub fn to_async(&self) -> #async_client {
                    #async_client { binding: self.binding.clone() }
                }
            }

            impl ::tiercel::Import for #async_client {
                const INFO: &'static ::tiercel::InterfaceInfo = <#client as ::tiercel::Import>::INFO;
                fn from_binding(binding: ::tiercel::Binding) -> Self {
                    Self { binding }
                }
            }
        }
    }
}

/// The server stub's decoding of a value argument (plain, or wrapped in `In`).
fn decode_value(a: &Arg) -> TokenStream {
    let (n, t) = (&a.name, &a.ty);
    let span = t.span();
    match a.kind {
        ArgKind::In => quote_spanned!(span=> let #n = ::tiercel::In(__r.decode()?);),
        _ => quote_spanned!(span=> let #n: #t = __r.decode()?;),
    }
}

fn generate_server(m: &Interface) -> TokenStream {
    let vis = &m.vis;
    let trait_name = &m.name;
    let client = format_ident!("{}Client", m.name);
    let server = format_ident!("{}Server", m.name);
    let doc = format!("Server stub of the `{}` interface: dispatches calls to an implementation.", m.name);
    let arms = m.methods.iter().enumerate().filter(|(_, method)| !method.asynchronous).map(|(index, method)| {
        let index = index as u16;
        let name = &method.name;
        let decode = method.args.iter().map(|a| {
            let n = &a.name;
            match a.kind {
                ArgKind::Value | ArgKind::In => decode_value(a),
                ArgKind::Out => {
                    let len = format_ident!("__len_{}", n);
                    quote!(let #len = ::tiercel::__private::out_len(&mut __r, __results.limit())?;)
                }
                ArgKind::InOut => {
                    let bytes = format_ident!("__in_{}", n);
                    quote!(let #bytes: &[u8] = __r.decode()?;)
                }
            }
        });
        let buffers: Vec<&Arg> =
            method.args.iter().filter(|a| matches!(a.kind, ArgKind::Out | ArgKind::InOut)).collect();
        let lens = buffers.iter().map(|a| match a.kind {
            ArgKind::Out => {
                let len = format_ident!("__len_{}", a.name);
                quote!(::tiercel::Region::Zeroed(#len))
            }
            _ => {
                let bytes = format_ident!("__in_{}", a.name);
                quote!(::tiercel::Region::Filled(#bytes))
            }
        });
        let regions: Vec<Ident> = buffers.iter().map(|a| format_ident!("__region_{}", a.name)).collect();
        let call_args = method.args.iter().map(|a| {
            let n = &a.name;
            let region = format_ident!("__region_{}", n);
            match a.kind {
                ArgKind::Value | ArgKind::In => quote!(#n),
                ArgKind::Out => quote!(::tiercel::Out(#region)),
                ArgKind::InOut => quote!(::tiercel::InOut(#region)),
            }
        });
        quote! {
            #index => {
                let mut __r = ::tiercel::Reader::new(__args);
                #(#decode)*
                __r.finish()?;
                let [#(#regions),*] = __results.regions([#(#lens),*])?;
                ::tiercel::__private::mark(::tiercel::__private::Point::ArgsDecoded);
                let __ret = self.0.#name(#(#call_args),*);
                ::tiercel::__private::mark(::tiercel::__private::Point::ProcedureDone);
                __results.encode(&__ret);
                ::core::result::Result::Ok(())
            }
        }
    });
    let in_place: Vec<bool> = m.methods.iter().map(in_place_of).collect();
    let in_place_arms =
        m.methods.iter().enumerate().filter(|(_, method)| in_place_of(method)).map(|(index, method)| {
            let index = index as u16;
            let name = &method.name;
            let last = method.args.len() - 1;
            let decode = method.args[..last].iter().map(decode_value);
            let decode_again = method.args[..last].iter().map(decode_value);
            let bytes = format_ident!("__in_{}", method.args[last].name);
            let call_args = method.args.iter().enumerate().map(|(i, a)| {
                let n = &a.name;
                if i == last {
                    quote!(::tiercel::InOut(__buf))
                } else {
                    quote!(#n)
                }
            });
            quote! {
                #index => {
                    // Where the buffer starts: the arguments decoded once to find it...
                    let __pos = {
                        let __args = __message.get(__start..).unwrap_or_default();
                        let mut __r = ::tiercel::Reader::new(__args);
                        #(#decode)*
                        let #bytes: &[u8] = __r.decode()?;
                        __r.finish()?;
                        __message.len() - #bytes.len()
                    };
                    // ...then again from the bytes before it, the buffer lent mutably where it lies.
                    let __ret = {
                        let (__head, __buf) = __message.split_at_mut(__pos);
                        let mut __r = ::tiercel::Reader::new(__head.get(__start..).unwrap_or_default());
                        #(#decode_again)*
                        ::tiercel::__private::out_len(&mut __r, usize::MAX)?;
                        __r.finish()?;
                        ::tiercel::__private::mark(::tiercel::__private::Point::ArgsDecoded);
                        let __ret = self.0.#name(#(#call_args),*);
                        ::tiercel::__private::mark(::tiercel::__private::Point::ProcedureDone);
                        __ret
                    };
                    ::tiercel::Results::new(__message, 0).encode(&__ret);
                    ::core::result::Result::Ok(__pos)
                }
            }
        });
    let asyncs: Vec<bool> = m.methods.iter().map(|x| x.asynchronous).collect();
    let async_arms = m.methods.iter().enumerate().filter(|(_, method)| method.asynchronous).map(|(index, method)| {
        let index = index as u16;
        let name = &method.name;
        // The macro refuses `Out` and `InOut` in async procedures: every argument is a value.
        let decode = method.args.iter().map(decode_value);
        let names = method.args.iter().map(|a| &a.name);
        quote! {
            #index => ::core::option::Option::Some(::std::boxed::Box::pin(async move {
                let mut __r = ::tiercel::Reader::new(&__args);
                #(#decode)*
                __r.finish()?;
                let __ret = __this.0.#name(#(#names),*).await;
                let mut __out = ::std::vec::Vec::new();
                ::tiercel::Results::new(&mut __out, __limit).encode(&__ret);
                ::core::result::Result::Ok(__out)
            })),
        }
    });
    quote! {
        #[doc = #doc]
        #vis struct #server<T>(T);

        impl<T: #trait_name + Send + Sync + 'static> #server<T> {
            /// Wraps an implementation for export.
            pub fn new(implementation: T) -> Self {
                Self(implementation)
            }

            /// The wrapped implementation.
            pub fn implementation(&self) -> &T {
                &self.0
            }
        }

        impl<T: #trait_name + Send + Sync + 'static> ::tiercel::Export for #server<T> {
            fn info(&self) -> &'static ::tiercel::InterfaceInfo {
                <#client as ::tiercel::Import>::INFO
            }

            #[allow(unused_mut, unused_variables, clippy::let_unit_value, clippy::unit_arg)]
            fn dispatch(
                &self,
                __procedure: u16,
                __args: &[u8],
                __results: &mut ::tiercel::Results<'_>,
            ) -> ::core::result::Result<(), ::tiercel::DispatchError> {
                match __procedure {
                    #(#arms)*
                    _ => ::core::result::Result::Err(::tiercel::DispatchError::UnknownProcedure),
                }
            }

            fn in_place(&self, __procedure: u16) -> bool {
                const IN_PLACE: &[bool] = &[#(#in_place),*];
                IN_PLACE.get(__procedure as usize).copied().unwrap_or(false)
            }

            #[allow(unused_mut, unused_variables, clippy::let_unit_value, clippy::unit_arg)]
            fn dispatch_in_place(
                &self,
                __procedure: u16,
                __message: &mut ::std::vec::Vec<u8>,
                __start: usize,
            ) -> ::core::result::Result<usize, ::tiercel::DispatchError> {
                match __procedure {
                    #(#in_place_arms)*
                    _ => ::core::result::Result::Err(::tiercel::DispatchError::UnknownProcedure),
                }
            }

            fn is_async(&self, __procedure: u16) -> bool {
                const ASYNC: &[bool] = &[#(#asyncs),*];
                ASYNC.get(__procedure as usize).copied().unwrap_or(false)
            }

            #[allow(unused_mut, unused_variables, clippy::let_unit_value, clippy::unit_arg)]
            fn dispatch_async(
                self: ::std::sync::Arc<Self>,
                __procedure: u16,
                __args: ::std::vec::Vec<u8>,
                __limit: usize,
            ) -> ::core::option::Option<::tiercel::AsyncDispatch> {
                let __this = self;
                match __procedure {
                    #(#async_arms)*
                    _ => ::core::option::Option::None,
                }
            }
        }
    }
}
