use super::*;

#[test]
fn signatures_parse() {
    let p = parse_procedure("transfer(u64, Option<String>, In<Vec<u8>>) -> Result<(u32, i8), String>").unwrap();
    assert_eq!(p.name, "transfer");
    assert_eq!(
        p.args,
        [Ty::Int { bytes: 8, signed: false }, Ty::Option(Box::new(Ty::Str)), Ty::In(Box::new(Ty::Bytes))]
    );
    let tuple = Ty::Tuple(vec![Ty::Int { bytes: 4, signed: false }, Ty::Int { bytes: 1, signed: true }]);
    assert_eq!(p.ret, Ty::Result(Box::new(tuple), Box::new(Ty::Str)));
    assert_eq!(parse_procedure("null()").unwrap().args, []);
    assert_eq!(parse_procedure("max_result(Out<Vec<u8>>)").unwrap().args, [Ty::Out]);
    assert_eq!(parse_procedure("open(Account) -> u64").unwrap().args, [Ty::Named("Account".into())]);
    assert!(parse_procedure("f(opaque(app::Secret))").is_err());
}

fn round_trip(ty: &str, types: &Types, v: Value) {
    let ty = parse_ty(ty).unwrap();
    let mut b = Vec::new();
    encode(&ty, &v, types, &mut b).unwrap();
    let mut r = Reader::new(&b);
    assert_eq!(decode(&ty, types, &mut r).unwrap(), v, "{ty:?}");
    r.finish().unwrap();
}

#[test]
fn values_round_trip_through_the_encoding() {
    let none = Types::default();
    let cases = [
        ("i32", json!(-5)),
        ("u16", json!(65535)),
        ("bool", json!(true)),
        ("String", json!("héllo")),
        ("Vec<u8>", json!("bytes")),
        ("Vec<u8>", json!({"hex": "010203"})),
        ("Option<Vec<u8>>", json!({"hex": "00ff"})),
        ("Option<u64>", json!(null)),
        ("Option<u64>", json!(7)),
        ("Result<u64, String>", json!({"Err": "no"})),
        ("Vec<(u8, char)>", json!([[1, "a"], [2, "b"]])),
        ("f64", json!(1.5)),
        ("[u8; 4]", json!("abcd")),
        ("[i16; 2]", json!([-1, 2])),
        ("Map<String, u32>", json!({"a": 1, "b": 2})),
        ("Map<(u8, u8), bool>", json!([[[1, 2], true]])),
        ("Set<i8>", json!([-1, 3])),
        ("u128", json!("340282366920938463463374607431768211455")),
        ("i128", json!(-3)),
    ];
    for (ty, v) in cases {
        round_trip(ty, &none, v);
    }
    let mut b = Vec::new();
    assert!(encode(&parse_ty("u8").unwrap(), &json!(256), &none, &mut b).is_err());
    assert!(encode(&parse_ty("i8").unwrap(), &json!(-129), &none, &mut b).is_err());
    assert!(encode(&parse_ty("[u8; 4]").unwrap(), &json!("abc"), &none, &mut b).is_err());
}

#[test]
fn the_users_own_types_round_trip_as_objects_and_tagged_values() {
    let signature = "place(Order) -> Result<Receipt, ShopError>\n\
        type Order = struct { id: u64, items: Vec<Line>, note: Option<String>, tags: Map<String, u8> }\n\
        type Line = struct(String, u32)\n\
        type Receipt = struct { total: u64, kind: Kind }\n\
        type Kind = enum { Cash, Card { last4: u16 }, Voucher(u32), Split(u8, u8) }\n\
        type ShopError = enum { OutOfStock(String), Closed }\n\
        type Tree = enum { Leaf, Node(Tree, Tree) }";
    let types = Types::parse(signature).unwrap();
    let order = json!({ "id": 7, "items": [["tea", 2], ["cake", 1]], "note": null, "tags": {"gift": 1} });
    round_trip("Order", &types, order.clone());
    for kind in [json!("Cash"), json!({"Card": {"last4": 1234}}), json!({"Voucher": 5}), json!({"Split": [1, 2]})] {
        round_trip("Receipt", &types, json!({ "total": 3, "kind": kind }));
    }
    round_trip("Result<Receipt, ShopError>", &types, json!({"Err": {"OutOfStock": "tea"}}));
    round_trip("Result<Receipt, ShopError>", &types, json!({"Err": "Closed"}));
    round_trip("Tree", &types, json!({"Node": [{"Node": ["Leaf", "Leaf"]}, "Leaf"]}));
    let mut b = Vec::new();
    let err = encode(&parse_ty("Kind").unwrap(), &json!("Cheque"), &types, &mut b).unwrap_err();
    assert!(err.contains("no variant \"Cheque\""), "{err}");
    let err = encode(&parse_ty("Order").unwrap(), &json!({"id": 1}), &types, &mut b).unwrap_err();
    assert!(err.contains("field \"items\" missing"), "{err}");
    assert!(encode(&parse_ty("Nope").unwrap(), &json!(1), &types, &mut b).unwrap_err().contains("not defined"));
    // A recursive value nested past the bound is refused, not a stack overflow.
    let mut deep = json!("Leaf");
    for _ in 0..100 {
        deep = json!({ "Node": [deep, "Leaf"] });
    }
    assert!(encode(&parse_ty("Tree").unwrap(), &deep, &types, &mut b).unwrap_err().contains("deeper"));
}
