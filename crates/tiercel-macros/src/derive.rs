//! `#[derive(Wire)]`.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote};
use syn::{parse2, Data, DeriveInput, Fields, GenericParam, Lifetime, LifetimeParam};

pub(crate) fn expand(input: TokenStream) -> syn::Result<TokenStream> {
    let input: DeriveInput = parse2(input)?;
    let name = &input.ident;
    let (encode, decode) = match &input.data {
        Data::Struct(s) => {
            let (pattern, names) = destructure(&s.fields);
            let encode = quote! {
                let Self #pattern = self;
                #( ::tiercel::Wire::encode(#names, __w); )*
            };
            let decode = construct(quote!(Self), &s.fields);
            (encode, quote!(::core::result::Result::Ok(#decode)))
        }
        Data::Enum(e) => {
            if e.variants.len() > u32::MAX as usize {
                return Err(syn::Error::new_spanned(name, "too many variants"));
            }
            let mut enc = Vec::new();
            let mut dec = Vec::new();
            for (i, v) in e.variants.iter().enumerate() {
                let tag = i as u32;
                let vname = &v.ident;
                let (pattern, names) = destructure(&v.fields);
                enc.push(quote! {
                    Self::#vname #pattern => {
                        __w.put(&#tag.to_le_bytes());
                        #( ::tiercel::Wire::encode(#names, __w); )*
                    }
                });
                let build = construct(quote!(Self::#vname), &v.fields);
                dec.push(quote!(#tag => ::core::result::Result::Ok(#build),));
            }
            let label = name.to_string();
            let encode = quote! { match self { #(#enc)* } };
            let decode = quote! {
                match u32::from_le_bytes(__r.array()?) {
                    #(#dec)*
                    _ => ::core::result::Result::Err(::tiercel::DecodeError::Invalid(#label)),
                }
            };
            (encode, decode)
        }
        Data::Union(u) => {
            return Err(syn::Error::new_spanned(u.union_token, "#[derive(Wire)] does not support unions"));
        }
    };

    let de = Lifetime::new("'__de", Span::call_site());
    let mut generics = input.generics.clone();
    let lifetimes: Vec<Lifetime> = generics.lifetimes().map(|l| l.lifetime.clone()).collect();
    let mut de_param = LifetimeParam::new(de.clone());
    de_param.bounds.extend(lifetimes);
    generics.params.insert(0, GenericParam::Lifetime(de_param));
    for p in generics.params.iter_mut() {
        if let GenericParam::Type(t) = p {
            t.bounds.push(syn::parse_quote!(::tiercel::Wire<#de>));
        }
    }
    let (impl_generics, _, where_clause) = generics.split_for_impl();
    let (_, ty_generics, _) = input.generics.split_for_impl();
    Ok(quote! {
        impl #impl_generics ::tiercel::Wire<#de> for #name #ty_generics #where_clause {
            #[inline]
            fn encode<'__a>(&'__a self, __w: &mut ::tiercel::Writer<'_, '__a>) {
                #encode
            }
            #[inline]
            fn decode(__r: &mut ::tiercel::Reader<#de>) -> ::core::result::Result<Self, ::tiercel::DecodeError> {
                #decode
            }
        }
    })
}

fn destructure(fields: &Fields) -> (TokenStream, Vec<syn::Ident>) {
    match fields {
        Fields::Named(f) => {
            let names: Vec<_> = f.named.iter().filter_map(|f| f.ident.clone()).collect();
            (quote!({ #(#names),* }), names)
        }
        Fields::Unnamed(f) => {
            let names: Vec<_> = (0..f.unnamed.len()).map(|i| format_ident!("__f{}", i)).collect();
            (quote!(( #(#names),* )), names)
        }
        Fields::Unit => (quote!(), Vec::new()),
    }
}

fn construct(path: TokenStream, fields: &Fields) -> TokenStream {
    match fields {
        Fields::Named(f) => {
            let names = f.named.iter().filter_map(|f| f.ident.as_ref());
            quote!(#path { #( #names: ::tiercel::Wire::decode(__r)?, )* })
        }
        Fields::Unnamed(f) => {
            let each = f.unnamed.iter().map(|_| quote!(::tiercel::Wire::decode(__r)?));
            quote!(#path ( #(#each),* ))
        }
        Fields::Unit => path,
    }
}
