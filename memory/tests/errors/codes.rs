//! `ErrorCode`: the fixed catalogue of DESIGN §5, serialized as its id.

use std::collections::HashSet;

use cistern_memory::ErrorCode;

use super::samples::{from_bincode, to_bincode};

/// DESIGN §5, verbatim.
const CATALOGUE: [(&str, u32); 21] = [
    ("DeviceOutOfMemory", 1001),
    ("UnsupportedFeature", 1002),
    ("PoisonedLock", 1003),
    ("KernelCompileFailed", 1004),
    ("DispatchFailed", 1005),
    ("InvalidProgram", 1006),
    ("CooperativeResidencyExceeded", 1007),
    ("DeviceLost", 1008),
    ("DevicePoisoned", 1009),
    ("BufferTooBig", 1010),
    ("AllocationForbidden", 1011),
    ("StaleHandle", 1012),
    ("ContextBusy", 1013),
    ("InvalidArgument", 1014),
    ("HandleNotFound", 1015),
    ("TransferFailed", 1016),
    ("StorePoisoned", 1017),
    ("ServerGone", 1018),
    ("DeviceMismatch", 1019),
    ("PeerLost", 1020),
    ("Unknown", 1999),
];

#[test]
fn the_codes_are_exactly_the_design_catalogue() {
    let listed: Vec<(&str, u32)> = ErrorCode::ALL
        .iter()
        .map(|code| (code.name(), code.stable_id()))
        .collect();
    assert_eq!(listed, CATALOGUE);
}

#[test]
fn stable_ids_are_unique_and_resolve_back_to_their_code() {
    let ids: HashSet<u32> = ErrorCode::ALL.iter().map(|c| c.stable_id()).collect();
    assert_eq!(ids.len(), ErrorCode::ALL.len());
    for code in ErrorCode::ALL {
        assert_eq!(ErrorCode::from_stable_id(code.stable_id()), Some(code));
        assert_eq!(format!("{code:?}"), code.name());
    }
    assert_eq!(ErrorCode::from_stable_id(0), None);
    assert_eq!(ErrorCode::from_stable_id(1021), None);
}

#[test]
fn stable_id_is_usable_in_constants() {
    const OOM: u32 = ErrorCode::DeviceOutOfMemory.stable_id();
    assert_eq!(OOM, 1001);
}

#[test]
fn a_code_serializes_as_its_stable_id() {
    for code in ErrorCode::ALL {
        let json = serde_json::to_string(&code).unwrap_or_default();
        assert_eq!(json, code.stable_id().to_string());
        assert_eq!(serde_json::from_str::<ErrorCode>(&json).ok(), Some(code));
        let bytes = to_bincode(&code);
        assert_eq!(bytes, to_bincode(&code.stable_id()));
        assert_eq!(from_bincode::<ErrorCode>(&bytes), Ok(code));
    }
}

#[test]
fn an_unknown_id_does_not_decode() {
    assert!(serde_json::from_str::<ErrorCode>("1021").is_err());
    assert!(from_bincode::<ErrorCode>(&to_bincode(&4242u32)).is_err());
}

#[test]
fn display_names_the_code_and_its_id() {
    assert_eq!(ErrorCode::BufferTooBig.to_string(), "BufferTooBig (1010)");
}
