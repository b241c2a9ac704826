//! The client stubs `#[tiercel::interface]` generates (`{Trait}Client`, `{Trait}AsyncClient`), and
//! the interface's description they and the server stub share.

use super::*;

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

pub(super) fn info_tokens(m: &Interface) -> TokenStream {
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
            let onc = match (m.onc, method.onc) {
                (Some(_), Some(_)) if asynchronous => quote! {
                    if self.binding.onc().is_some() {
                        return ::core::result::Result::Err(::tiercel::CallError::Onc(::tiercel::OncError::Synchronous));
                    }
                },
                (Some(_), Some(number)) => {
                    let encode = method.args.iter().map(|a| {
                        let n = &a.name;
                        match a.kind {
                            ArgKind::In => quote!(::tiercel::xdr::Xdr::encode(&#n.0, __out);),
                            _ => quote!(::tiercel::xdr::Xdr::encode(&#n, __out);),
                        }
                    });
                    quote! {
                        if let ::core::option::Option::Some(__onc) = self.binding.onc() {
                            return __onc.call(
                                #number,
                                self.binding.deadline(),
                                |__out: &mut ::std::vec::Vec<u8>| { #(#encode)* },
                                |__r: &mut ::tiercel::xdr::XdrReader<'_>| __r.decode::<#ret_ty>(),
                            );
                        }
                    }
                }
                _ => quote!(),
            };
            // The call lives in a block that ends with the reply: it is dropped where it was built
            // (not moved into `drop`, a copy of a few hundred bytes), and it ends, with its borrow of
            // the arguments, before results are read back into them.
            let (asyncness, start, invoke) = if asynchronous {
                let invoke = match lend {
                    Some(n) => quote!(__call.invoke_in_out(&mut *#n.0).await?),
                    None => quote!(__call.invoke().await?),
                };
                (
                    quote!(async),
                    quote! {
                        let mut __call = self.binding.call_async(#index);
                        __call.start().await?;
                    },
                    invoke,
                )
            } else {
                let invoke = match lend {
                    Some(n) => quote!(__call.invoke_in_out(&mut *#n.0)?),
                    None => quote!(__call.invoke()?),
                };
                (
                    quote!(),
                    quote! {
                        let mut __call = self.binding.begin_call(#index);
                        __call.start()?;
                    },
                    invoke,
                )
            };
            let call = if asynchronous && lend.is_none() {
                // As below, for an async call: a plain binding's takes the short path of
                // `Binding::call_plain_async`.
                quote! {
                    self.binding.call_plain_async(#index, |mut __w| {
                        #(#encode)*
                        let _ = &mut __w;
                    }).await?
                }
            } else if asynchronous || lend.is_some() {
                quote! {{
                    #start
                    {
                        let mut __w = __call.writer();
                        #(#encode)*
                        let _ = &mut __w;
                    }
                    let __reply = #invoke;
                    __reply
                }}
            } else {
                // A synchronous call without a lent buffer: the arguments marshaled by a closure,
                // so that a plain binding's call takes its short path (`Binding::call_plain`).
                quote! {
                    self.binding.call_plain(#index, |mut __w| {
                        #(#encode)*
                        let _ = &mut __w;
                    })?
                }
            };
            quote_spanned! {span=>
                #(#attrs)*
                pub #asyncness fn #name(&self, #(#params),*) -> ::core::result::Result<#ret_ty, ::tiercel::CallError> {
                    #onc
                    let __reply = #call;
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

pub(super) fn generate_client(m: &Interface) -> TokenStream {
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
