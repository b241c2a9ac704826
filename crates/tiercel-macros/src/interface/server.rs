//! The server stub `#[tiercel::interface]` generates (`{Trait}Server`): decoding each call's
//! arguments, running the procedure, encoding its result.

use super::*;

/// The server stub's decoding of a value argument (plain, or wrapped in `In`).
fn decode_value(a: &Arg) -> TokenStream {
    let (n, t) = (&a.name, &a.ty);
    let span = t.span();
    match a.kind {
        ArgKind::In => quote_spanned!(span=> let #n = ::tiercel::In(__r.decode()?);),
        _ => quote_spanned!(span=> let #n: #t = __r.decode()?;),
    }
}

pub(super) fn generate_server(m: &Interface) -> TokenStream {
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
