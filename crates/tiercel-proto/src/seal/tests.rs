use super::*;
use proptest::prelude::*;

#[test]
fn an_outer_header_reads_back_as_written_and_anything_else_is_refused() {
    let o = Outer { kind: SealType::Data, index: 7, counter: 0x0102_0304_0506_0708 };
    let mut bytes = o.to_bytes().to_vec();
    assert_eq!(Outer::parse(&bytes), Err(NotSealed::Short));
    bytes.extend_from_slice(&[0; TAG_LEN]);
    assert_eq!(Outer::parse(&bytes), Ok(o));
    assert!(is_sealed(&bytes));
    let mut v = bytes.clone();
    v[2] = 9;
    assert_eq!(Outer::parse(&v), Err(NotSealed::Version(9)));
    v = bytes.clone();
    v[3] = 0;
    assert_eq!(Outer::parse(&v), Err(NotSealed::Type(0)));
    v = bytes.clone();
    v[0] = b'x';
    assert_eq!(Outer::parse(&v), Err(NotSealed::Magic));
    let mut plain = vec![0u8; 64];
    plain[..2].copy_from_slice(b"tc");
    assert!(!is_sealed(&plain));
}

#[test]
fn a_window_takes_each_counter_once_and_nothing_older_than_it_remembers() {
    let mut w = ReplayWindow::new();
    assert!(w.take(0));
    assert!(!w.take(0));
    assert!(w.take(5));
    assert!(w.take(3), "reordered within the window");
    assert!(!w.take(3));
    assert!(w.take(1_000_000));
    assert_eq!(w.highest(), Some(1_000_000));
    assert!(!w.take(5), "below the window after a jump");
    assert!(!w.take(1_000_000 - WINDOW), "just below the window");
    assert!(w.take(1_000_000 - WINDOW + 1), "the oldest counter it remembers");
    assert!(!w.fresh(LAST_COUNTER + 1));
}

proptest! {
    /// Against a model that remembers every counter: the window takes a counter exactly when it
    /// was never taken and lies within the window behind the highest.
    #[test]
    fn a_window_agrees_with_a_model_that_forgets_nothing(steps in proptest::collection::vec(0u64..20_000, 1..2_000)) {
        let mut w = ReplayWindow::new();
        let mut taken = std::collections::BTreeSet::new();
        let mut high: Option<u64> = None;
        for c in steps {
            let expect = !taken.contains(&c) && high.is_none_or(|h| c > h || h - c < WINDOW);
            prop_assert_eq!(w.take(c), expect, "counter {} (highest {:?})", c, high);
            if expect {
                taken.insert(c);
                high = Some(high.map_or(c, |h| h.max(c)));
            }
        }
    }
}
