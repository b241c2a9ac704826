use super::*;
use crate::Execution;

#[test]
fn every_status_maps_to_the_error_of_where_the_call_stopped() {
    let ran = |s: Status| status_error(s, 3, "why".into()).execution();
    assert!(matches!(status_error(Status::UnknownProcedure, 3, String::new()), CallError::UnknownProcedure(3)));
    assert_eq!(ran(Status::UnknownProcedure), Execution::NeverRan);
    assert!(matches!(status_error(Status::BadArguments, 3, "why".into()), CallError::BadArguments(m) if m == "why"));
    assert_eq!(ran(Status::BadArguments), Execution::NeverRan);
    assert!(matches!(status_error(Status::Refused, 3, "why".into()), CallError::Refused(m) if m == "why"));
    assert_eq!(ran(Status::Refused), Execution::NeverRan, "refused by the interceptor before it ran");
    assert_eq!(ran(Status::TooLarge), Execution::NeverRan, "refused before it ran");
    assert_eq!(ran(Status::ResultTooLarge), Execution::Ran, "refused after it ran");
    assert_eq!(ran(Status::Panicked), Execution::Ran);
    assert!(matches!(
        status_error(Status::DeadlineExceeded, 3, String::new()),
        CallError::DeadlineExceeded { may_have_run: false }
    ));
    assert!(matches!(status_error(Status::UnknownBinding, 3, String::new()), CallError::UnknownBinding));
    assert!(matches!(status_error(Status::BadSlot, 3, String::new()), CallError::UnknownBinding));
    assert!(matches!(status_error(Status::WrongIncarnation, 3, String::new()), CallError::ServerRestarted));
    assert_eq!(ran(Status::WrongIncarnation), Execution::MayHaveRun);
    // What no server sends as a call's result is a protocol violation, not a guess.
    for s in [
        Status::Ok,
        Status::Busy,
        Status::AddressUnproven,
        Status::UnknownInterface,
        Status::VersionMismatch,
        Status::InterfaceMismatch,
        Status::AuthRequired,
        Status::AuthFailed,
        Status::Cancelled,
        Status::UnsupportedVersion,
    ] {
        let e = status_error(s, 3, String::new());
        assert!(matches!(e, CallError::Protocol(_)), "{s:?}: {e:?}");
        assert_eq!(e.execution(), Execution::MayHaveRun);
    }
}
