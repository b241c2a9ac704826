//! What `#[tiercel::interface(onc(program = P, version = V))]` adds: the server stub as an ONC
//! program (`tiercel::onc::Program`: XDR arguments in, XDR result out, by procedure number) and
//! `{Trait}Onc`, with the program's numbers and its `.x` file for `rpcgen`.

use super::*;

/// `SomeName` as `SOME_NAME`, `some_name` as `SOME_NAME`.
fn upper_snake(name: &str) -> String {
    let mut out = String::new();
    let mut prev_lower = false;
    for c in name.chars() {
        if c.is_uppercase() && prev_lower {
            out.push('_');
        }
        prev_lower = c.is_lowercase() || c.is_ascii_digit();
        out.extend(c.to_uppercase());
    }
    out
}

/// The type an argument is declared as in the `.x` file and decoded as: `T` of `In<T>`, else its
/// own.
fn value_type(a: &Arg) -> &Type {
    match (&a.kind, last_segment(&a.ty)) {
        (ArgKind::In, Some((_, Some(inner)))) => inner,
        _ => &a.ty,
    }
}

pub(super) fn generate_onc(m: &Interface) -> TokenStream {
    let Some((program, version)) = m.onc else { return TokenStream::new() };
    let vis = &m.vis;
    let trait_name = &m.name;
    let server = format_ident!("{}Server", m.name);
    let onc = format_ident!("{}Onc", m.name);
    let client = format_ident!("{}Client", m.name);
    let x = quote!(::tiercel::xdr);
    let label = m.name.to_string();
    let prog_name = upper_snake(&label);
    let methods: Vec<(&Method, u32)> = m.methods.iter().filter_map(|method| Some((method, method.onc?))).collect();
    let declarations = methods.iter().map(|(method, number)| {
        let args = method.args.iter().map(|a| {
            let ty = value_type(a);
            quote! {{
                let __t = <#ty as #x::Xdr<'_>>::xdr_type(&mut __file);
                __file.specifier(&__t)
            }}
        });
        let ret = match &method.ret {
            Some(ty) => quote! {{
                let __t = <#ty as #x::Xdr<'_>>::xdr_type(&mut __file);
                __file.specifier(&__t)
            }},
            None => quote!(::std::string::String::from("void")),
        };
        let name = upper_snake(&method.name.to_string());
        quote! {
            let __args: ::std::vec::Vec<::std::string::String> = ::std::vec![#(#args),*];
            let __ret: ::std::string::String = #ret;
            let __args = if __args.is_empty() { ::std::string::String::from("void") } else { __args.join(", ") };
            __procedures.push(::std::format!("        {} {}({}) = {};", __ret, #name, __args, #number));
        }
    });
    let arms = methods.iter().map(|(method, number)| {
        let name = &method.name;
        let decode = method.args.iter().map(|a| {
            let (n, ty) = (&a.name, value_type(a));
            match a.kind {
                ArgKind::In => {
                    quote!(let #n = ::tiercel::In(__r.decode::<#ty>().map_err(::tiercel::onc::Failure::Garbage)?);)
                }
                _ => quote!(let #n: #ty = __r.decode().map_err(::tiercel::onc::Failure::Garbage)?;),
            }
        });
        let names = method.args.iter().map(|a| &a.name);
        quote! {
            #number => {
                let mut __r = #x::XdrReader::new(__args);
                #(#decode)*
                __r.finish().map_err(::tiercel::onc::Failure::Garbage)?;
                let __ret = self.0.#name(#(#names),*);
                #x::Xdr::encode(&__ret, __out);
                ::core::result::Result::Ok(())
            }
        }
    });
    let names = methods.iter().map(|(method, number)| {
        let name = method.name.to_string();
        quote!(#number => ::core::option::Option::Some(#name),)
    });
    let doc = format!(
        "The `{label}` interface as ONC program {program:#x}, version {version}: its numbers and its `.x` file."
    );
    let header = format!(
        "/* The {label} interface of a tiercel server, as ONC program {program:#x} version {version}.\n * Written by tiercel: `rpcgen -N` makes C stubs from it. */\n"
    );
    let program_open = format!("program {prog_name}_PROG {{\n    version {prog_name}_V{version} {{\n");
    let program_close = format!("\n    }} = {version};\n}} = {program:#x};\n");
    quote! {
        #[doc = #doc]
        #vis struct #onc;

        impl #onc {
            /// The ONC program number.
            pub const PROGRAM: u32 = #program;
            /// The ONC version.
            pub const VERSION: u32 = #version;

            /// The interface's `.x` file: the types its procedures carry, then the program.
            pub fn x_file() -> ::std::string::String {
                let mut __file = #x::XFile::new();
                __file.push(#header);
                let mut __procedures: ::std::vec::Vec<::std::string::String> = ::std::vec::Vec::new();
                #(#declarations)*
                __file.push(#program_open);
                __file.push(&__procedures.join("\n"));
                __file.push(#program_close);
                __file.text().to_string()
            }
        }

        impl ::tiercel::onc::OncImport for #client {
            const PROGRAM: u32 = #program;
            const VERSION: u32 = #version;
        }

        impl<T: #trait_name + Send + Sync + 'static> ::tiercel::onc::Program for #server<T> {
            fn program(&self) -> u32 {
                #program
            }

            fn version(&self) -> u32 {
                #version
            }

            fn interface(&self) -> &'static str {
                #label
            }

            fn procedure_name(&self, __procedure: u32) -> ::core::option::Option<&'static str> {
                match __procedure {
                    #(#names)*
                    _ => ::core::option::Option::None,
                }
            }

            #[allow(unused_mut, unused_variables, clippy::let_unit_value, clippy::unit_arg)]
            fn dispatch(
                &self,
                __procedure: u32,
                __args: &[u8],
                __out: &mut ::std::vec::Vec<u8>,
            ) -> ::core::result::Result<(), ::tiercel::onc::Failure> {
                match __procedure {
                    #(#arms)*
                    _ => ::core::result::Result::Err(::tiercel::onc::Failure::NoProcedure),
                }
            }

            fn x_file(&self) -> ::std::string::String {
                #onc::x_file()
            }
        }
    }
}
