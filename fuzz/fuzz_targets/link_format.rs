//! The RFC 6690 link-format parser on arbitrary text: never panics, and what parses
//! survives an encode/parse round trip with the same targets.
#![no_main]
use cobalt_proto::link_format::{encode, parse};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(links) = parse(text) {
        let again = parse(&encode(&links)).expect("encoded links parse");
        let targets = |l: &[cobalt_proto::link_format::Link]| l.iter().map(|x| x.target.clone()).collect::<Vec<_>>();
        assert_eq!(targets(&again), targets(&links));
    }
});
