//! `#[derive(Wire)]`.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote};
use syn::{parse2, Data, DeriveInput, Fields, GenericParam, Lifetime, LifetimeParam};

pub(crate) fn expand(input: TokenStream) -> syn::Result<TokenStream> {
    let input: DeriveInput = parse2(input)?;
    let name = &input.ident;
    let (encode, decode, shape) = match &input.data {
        Data::Struct(s) => {
            let (pattern, names) = destructure(&s.fields);
            let encode = quote! {
                let Self #pattern = self;
                #( ::tiercel::Wire::encode(#names, __w); )*
            };
            let decode = construct(quote!(Self), &s.fields, &quote!(::tiercel::Wire::decode));
            let fields = shape_of(&s.fields);
            let shape = quote! { __s.write("struct"); #fields };
            (encode, quote!(::core::result::Result::Ok(#decode)), shape)
        }
        Data::Enum(e) => {
            if e.variants.len() > u32::MAX as usize {
                return Err(syn::Error::new_spanned(name, "too many variants"));
            }
            let mut enc = Vec::new();
            let mut dec = Vec::new();
            let mut variants = Vec::new();
            for (i, v) in e.variants.iter().enumerate() {
                let separator = if i == 0 { " " } else { ", " };
                let vlabel = format!("{separator}{}", v.ident);
                let fields = shape_of(&v.fields);
                variants.push(quote! { __s.write(#vlabel); #fields });
                let tag = i as u32;
                let vname = &v.ident;
                let (pattern, names) = destructure(&v.fields);
                enc.push(quote! {
                    Self::#vname #pattern => {
                        __w.put(&#tag.to_le_bytes());
                        #( ::tiercel::Wire::encode(#names, __w); )*
                    }
                });
                let build = construct(quote!(Self::#vname), &v.fields, &quote!(::tiercel::Wire::decode));
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
            let close = if e.variants.is_empty() { "}" } else { " }" };
            let shape = quote! { __s.write("enum {"); #(#variants)* __s.write(#close); };
            (encode, decode, shape)
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
            fn shape(__s: &mut ::tiercel::wire::shape::Shape<'_>) {
                let __name = ::tiercel::wire::shape::short_name(::core::any::type_name::<Self>());
                __s.named::<Self>(&__name, |__s| { #shape });
            }
        }
    })
}

pub(crate) fn destructure(fields: &Fields) -> (TokenStream, Vec<syn::Ident>) {
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

/// The value `path` of `fields`, each decoded from `__r` with `decode` (a path to a function).
pub(crate) fn construct(path: TokenStream, fields: &Fields, decode: &TokenStream) -> TokenStream {
    match fields {
        Fields::Named(f) => {
            let names = f.named.iter().filter_map(|f| f.ident.as_ref());
            quote!(#path { #( #names: #decode(__r)?, )* })
        }
        Fields::Unnamed(f) => {
            let each = f.unnamed.iter().map(|_| quote!(#decode(__r)?));
            quote!(#path ( #(#each),* ))
        }
        Fields::Unit => path,
    }
}

/// The shape of a struct's or variant's fields: ` { name: T, … }`, `(T, …)`, or nothing.
fn shape_of(fields: &Fields) -> TokenStream {
    match fields {
        Fields::Named(f) => {
            let each = f.named.iter().enumerate().map(|(i, f)| {
                let label = format!(
                    "{}{}: ",
                    if i == 0 { " " } else { ", " },
                    f.ident.as_ref().map(|i| i.to_string()).unwrap_or_default()
                );
                let ty = &f.ty;
                quote! { __s.write(#label); __s.of::<#ty>(); }
            });
            quote! { __s.write(" {"); #(#each)* __s.write(" }"); }
        }
        Fields::Unnamed(f) => {
            let each = f.unnamed.iter().enumerate().map(|(i, f)| {
                let ty = &f.ty;
                let sep = if i == 0 { "" } else { ", " };
                quote! { __s.write(#sep); __s.of::<#ty>(); }
            });
            quote! { __s.write("("); #(#each)* __s.write(")"); }
        }
        Fields::Unit => quote!(),
    }
}
