//! `#[derive(Xdr)]`: a struct as an XDR `struct`, an enum of unit variants as an XDR `enum`, an enum
//! with data as an XDR `union` switched on the variant's index.

use proc_macro2::{Span, TokenStream};
use quote::quote;

use crate::derive::{construct, destructure};
use syn::{parse2, Data, DeriveInput, Fields, GenericParam, Lifetime, LifetimeParam};

pub(crate) fn expand(input: TokenStream) -> syn::Result<TokenStream> {
    let input: DeriveInput = parse2(input)?;
    let name = &input.ident;
    if input.generics.type_params().next().is_some() || input.generics.const_params().next().is_some() {
        return Err(syn::Error::new_spanned(
            &input.generics,
            "#[derive(Xdr)] takes no type or const parameters: a .x file names each type once",
        ));
    }
    let label = name.to_string();
    let x = quote!(::tiercel::xdr);
    let de = Lifetime::new("'__de", Span::call_site());
    let (encode, decode, declare) = match &input.data {
        Data::Struct(s) => {
            if s.fields.is_empty() {
                return Err(syn::Error::new_spanned(name, "an XDR struct has at least one field"));
            }
            let (pattern, names) = destructure(&s.fields);
            let encode = quote! {
                let Self #pattern = self;
                #( #x::Xdr::encode(#names, __out); )*
            };
            let decode = construct(quote!(Self), &s.fields, &quote!(#x::Xdr::decode));
            let body = struct_body(&label, &s.fields, &de);
            let declare = quote! {
                if !__file.claim(#label) {
                    #body
                    __file.define(&__text);
                }
            };
            (encode, quote!(::core::result::Result::Ok(#decode)), declare)
        }
        Data::Enum(e) => {
            if e.variants.is_empty() {
                return Err(syn::Error::new_spanned(name, "an XDR enum or union has at least one variant"));
            }
            if e.variants.len() > i32::MAX as usize {
                return Err(syn::Error::new_spanned(name, "too many variants"));
            }
            let unit_only = e.variants.iter().all(|v| v.fields.is_empty());
            let mut enc = Vec::new();
            let mut dec = Vec::new();
            let mut arms = Vec::new();
            for (i, v) in e.variants.iter().enumerate() {
                let tag = i as u32;
                let vname = &v.ident;
                let (pattern, names) = destructure(&v.fields);
                enc.push(quote! {
                    Self::#vname #pattern => {
                        #x::put_u32(__out, #tag);
                        #( #x::Xdr::encode(#names, __out); )*
                    }
                });
                let build = construct(quote!(Self::#vname), &v.fields, &quote!(#x::Xdr::decode));
                dec.push(quote!(#tag => ::core::result::Result::Ok(#build),));
                let member = v.ident.to_string();
                arms.push(if unit_only {
                    let line = format!("    {label}_{member} = {i}");
                    quote!(__lines.push(::std::string::String::from(#line));)
                } else if v.fields.is_empty() {
                    let line = format!("case {i}:\n    void;");
                    quote!(__lines.push(::std::string::String::from(#line));)
                } else if v.fields.len() == 1 && matches!(v.fields, Fields::Unnamed(_)) {
                    let ty = &v.fields.iter().next().map(|f| f.ty.clone());
                    let head = format!("case {i}:\n    ");
                    quote! {
                        let __t = <#ty as #x::Xdr<#de>>::xdr_type(__file);
                        __lines.push(::std::format!("{}{};", #head, __t.declare(#member)));
                    }
                } else {
                    let arm_struct = format!("{label}_{member}");
                    let body = struct_body(&arm_struct, &v.fields, &de);
                    let line = format!("case {i}:\n    {arm_struct} {member};");
                    quote! {
                        if !__file.claim(#arm_struct) {
                            #body
                            __file.define(&__text);
                        }
                        __lines.push(::std::string::String::from(#line));
                    }
                });
            }
            let encode = quote! { match self { #(#enc)* } };
            let decode = quote! {
                match __r.u32()? {
                    #(#dec)*
                    _ => ::core::result::Result::Err(#x::XdrError(::core::concat!("no variant of ", #label, " with that discriminant"))),
                }
            };
            let (open, sep, close) = if unit_only {
                (format!("enum {label} {{\n"), ",\n", "\n};")
            } else {
                (format!("union {label} switch (unsigned int kind) {{\n"), "\n", "\n};")
            };
            let declare = quote! {
                if !__file.claim(#label) {
                    let mut __lines: ::std::vec::Vec<::std::string::String> = ::std::vec::Vec::new();
                    #(#arms)*
                    let __text = ::std::format!("{}{}{}", #open, __lines.join(#sep), #close);
                    __file.define(&__text);
                }
            };
            (encode, decode, declare)
        }
        Data::Union(u) => {
            return Err(syn::Error::new_spanned(u.union_token, "#[derive(Xdr)] does not support Rust unions"));
        }
    };

    let mut generics = input.generics.clone();
    let lifetimes: Vec<Lifetime> = generics.lifetimes().map(|l| l.lifetime.clone()).collect();
    let mut de_param = LifetimeParam::new(de.clone());
    de_param.bounds.extend(lifetimes);
    generics.params.insert(0, GenericParam::Lifetime(de_param));
    let (impl_generics, _, where_clause) = generics.split_for_impl();
    let (_, ty_generics, _) = input.generics.split_for_impl();
    Ok(quote! {
        impl #impl_generics #x::Xdr<#de> for #name #ty_generics #where_clause {
            fn encode(&self, __out: &mut ::std::vec::Vec<u8>) {
                #encode
            }
            fn decode(__r: &mut #x::XdrReader<#de>) -> ::core::result::Result<Self, #x::XdrError> {
                #decode
            }
            fn xdr_type(__file: &mut #x::XFile) -> #x::XType {
                #declare
                #x::XType::plain(#label)
            }
        }
    })
}

/// Code that sets `__text` to `struct NAME { … };` of `fields` (tuple fields named `f0`, `f1`, …),
/// defining the fields' types first.
fn struct_body(name: &str, fields: &Fields, de: &Lifetime) -> TokenStream {
    let each = fields.iter().enumerate().map(|(i, f)| {
        let ty = &f.ty;
        let member =
            f.ident.as_ref().map_or_else(|| format!("f{i}"), |id| id.to_string().trim_start_matches("r#").to_string());
        quote! {
            let __t = <#ty as ::tiercel::xdr::Xdr<#de>>::xdr_type(__file);
            __lines.push(::std::format!("    {};", __t.declare(#member)));
        }
    });
    let open = format!("struct {name} {{\n");
    quote! {
        let mut __lines: ::std::vec::Vec<::std::string::String> = ::std::vec::Vec::new();
        #(#each)*
        let __text = ::std::format!("{}{}\n}};", #open, __lines.join("\n"));
    }
}
