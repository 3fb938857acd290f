//! The UDP message decoder on arbitrary bytes: never panics, and whatever decodes
//! re-encodes to bytes that decode to the same message.
#![no_main]
use cobalt_proto::message::{decode, encode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = decode(data) {
        let again = decode(&encode(&m)).expect("re-encoded message decodes");
        assert_eq!(again, m);
    }
});
