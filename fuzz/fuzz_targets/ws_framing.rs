//! RFC 8323 §4 WebSocket message framing on arbitrary bytes: never panics, and a
//! decoded message re-encodes to one that decodes the same.
#![no_main]
use cobalt_proto::message::{decode_ws, encode_ws};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = decode_ws(data, 4096) {
        let mut out = Vec::new();
        encode_ws(&m, &mut out);
        assert_eq!(decode_ws(&out, usize::MAX).expect("re-encoded message decodes"), m);
    }
});
