//! RFC 8323 stream framing on arbitrary bytes, with a small message-size limit:
//! never panics, never claims more bytes than it was given, and a decoded frame
//! re-encodes to a frame that decodes the same.
#![no_main]
use cobalt_proto::message::{decode_tcp, encode_tcp};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(Some((m, used))) = decode_tcp(data, 4096) {
        assert!(used <= data.len());
        let mut out = Vec::new();
        encode_tcp(&m, &mut out);
        let (again, n) = decode_tcp(&out, usize::MAX).expect("valid").expect("whole frame");
        assert_eq!((again, n), (m, out.len()));
    }
});
