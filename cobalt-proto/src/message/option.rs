//! Options (RFC 7252 §5.4, §5.10 and the registries of RFC 7641, 7959, 7967, 9175).

/// How an option's value is formatted (RFC 7252 §3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptionFormat {
    /// Zero-length.
    Empty,
    /// Opaque bytes.
    Opaque,
    /// Unsigned integer in network byte order without leading zero bytes.
    Uint,
    /// UTF-8 text.
    String,
}

/// Registered option numbers.
pub mod number {
    /// If-Match (RFC 7252).
    pub const IF_MATCH: u16 = 1;
    /// Uri-Host (RFC 7252).
    pub const URI_HOST: u16 = 3;
    /// ETag (RFC 7252).
    pub const ETAG: u16 = 4;
    /// If-None-Match (RFC 7252).
    pub const IF_NONE_MATCH: u16 = 5;
    /// Observe (RFC 7641).
    pub const OBSERVE: u16 = 6;
    /// Uri-Port (RFC 7252).
    pub const URI_PORT: u16 = 7;
    /// Location-Path (RFC 7252).
    pub const LOCATION_PATH: u16 = 8;
    /// Uri-Path (RFC 7252).
    pub const URI_PATH: u16 = 11;
    /// Content-Format (RFC 7252).
    pub const CONTENT_FORMAT: u16 = 12;
    /// Max-Age (RFC 7252).
    pub const MAX_AGE: u16 = 14;
    /// Uri-Query (RFC 7252).
    pub const URI_QUERY: u16 = 15;
    /// Accept (RFC 7252).
    pub const ACCEPT: u16 = 17;
    /// Location-Query (RFC 7252).
    pub const LOCATION_QUERY: u16 = 20;
    /// Block2 (RFC 7959).
    pub const BLOCK2: u16 = 23;
    /// Block1 (RFC 7959).
    pub const BLOCK1: u16 = 27;
    /// Size2 (RFC 7959).
    pub const SIZE2: u16 = 28;
    /// Proxy-Uri (RFC 7252).
    pub const PROXY_URI: u16 = 35;
    /// Proxy-Scheme (RFC 7252).
    pub const PROXY_SCHEME: u16 = 39;
    /// Size1 (RFC 7252).
    pub const SIZE1: u16 = 60;
    /// Echo (RFC 9175).
    pub const ECHO: u16 = 252;
    /// No-Response (RFC 7967).
    pub const NO_RESPONSE: u16 = 258;
    /// Request-Tag (RFC 9175).
    pub const REQUEST_TAG: u16 = 292;
}

/// What Cobalt knows about a registered option.
#[derive(Debug, Clone, Copy)]
pub struct OptionDef {
    /// The option number.
    pub number: u16,
    /// Its registered name.
    pub name: &'static str,
    /// Value format.
    pub format: OptionFormat,
    /// Smallest allowed value length.
    pub min_len: usize,
    /// Largest allowed value length.
    pub max_len: usize,
    /// Whether it may occur more than once.
    pub repeatable: bool,
}

const fn def(
    number: u16,
    name: &'static str,
    format: OptionFormat,
    min_len: usize,
    max_len: usize,
    repeatable: bool,
) -> OptionDef {
    OptionDef {
        number,
        name,
        format,
        min_len,
        max_len,
        repeatable,
    }
}

use smallvec::SmallVec;
use OptionFormat::{Empty, Opaque, String as Str, Uint};

/// Every option this implementation recognizes, sorted by number.
pub const KNOWN_OPTIONS: &[OptionDef] = &[
    def(number::IF_MATCH, "If-Match", Opaque, 0, 8, true),
    def(number::URI_HOST, "Uri-Host", Str, 1, 255, false),
    def(number::ETAG, "ETag", Opaque, 1, 8, true),
    def(number::IF_NONE_MATCH, "If-None-Match", Empty, 0, 0, false),
    def(number::OBSERVE, "Observe", Uint, 0, 3, false),
    def(number::URI_PORT, "Uri-Port", Uint, 0, 2, false),
    def(number::LOCATION_PATH, "Location-Path", Str, 0, 255, true),
    def(number::URI_PATH, "Uri-Path", Str, 0, 255, true),
    def(number::CONTENT_FORMAT, "Content-Format", Uint, 0, 2, false),
    def(number::MAX_AGE, "Max-Age", Uint, 0, 4, false),
    def(number::URI_QUERY, "Uri-Query", Str, 0, 255, true),
    def(number::ACCEPT, "Accept", Uint, 0, 2, false),
    def(number::LOCATION_QUERY, "Location-Query", Str, 0, 255, true),
    def(number::BLOCK2, "Block2", Uint, 0, 3, false),
    def(number::BLOCK1, "Block1", Uint, 0, 3, false),
    def(number::SIZE2, "Size2", Uint, 0, 4, false),
    def(number::PROXY_URI, "Proxy-Uri", Str, 1, 1034, false),
    def(number::PROXY_SCHEME, "Proxy-Scheme", Str, 1, 255, false),
    def(number::SIZE1, "Size1", Uint, 0, 4, false),
    def(number::ECHO, "Echo", Opaque, 1, 40, false),
    def(number::NO_RESPONSE, "No-Response", Uint, 0, 1, false),
    def(number::REQUEST_TAG, "Request-Tag", Opaque, 0, 8, true),
];

/// Looks up a recognized option.
pub fn option_def(number: u16) -> Option<&'static OptionDef> {
    KNOWN_OPTIONS
        .binary_search_by_key(&number, |d| d.number)
        .ok()
        .map(|i| &KNOWN_OPTIONS[i])
}

/// Option numbers that the application handles beyond [`KNOWN_OPTIONS`] (e.g. the
/// OSCORE option, 9, handled by a layer of the server): the protocol machines pass a
/// critical option listed here instead of answering 4.02 Bad Option. Its value is not
/// checked (the application does that); a number already known keeps its checks.
///
/// ```
/// use cobalt_proto::message::option::HandledOptions;
/// use cobalt_proto::message::Options;
///
/// let mut o = Options::new();
/// o.push(9, vec![0x09]);
/// assert_eq!(o.first_bad_critical(), Some(9));
/// let handled = HandledOptions::new([9]);
/// assert_eq!(o.first_bad_critical_except(&handled), None);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HandledOptions {
    /// Sorted, without duplicates.
    numbers: std::sync::Arc<[u16]>,
}

impl HandledOptions {
    /// The set of `numbers` (in any order, duplicates allowed).
    pub fn new(numbers: impl IntoIterator<Item = u16>) -> HandledOptions {
        let mut v: Vec<u16> = numbers.into_iter().collect();
        v.sort_unstable();
        v.dedup();
        HandledOptions { numbers: v.into() }
    }

    /// This set and `number`.
    pub fn with(&self, number: u16) -> HandledOptions {
        HandledOptions::new(self.numbers.iter().copied().chain([number]))
    }

    /// Whether `number` is handled by the application.
    pub fn contains(&self, number: u16) -> bool {
        self.numbers.binary_search(&number).is_ok()
    }

    /// The numbers, ascending.
    pub fn numbers(&self) -> &[u16] {
        &self.numbers
    }

    /// True when the application handles no option beyond the known ones.
    pub fn is_empty(&self) -> bool {
        self.numbers.is_empty()
    }
}

/// Critical options must be understood by the receiver (odd numbers, §5.4.1).
pub fn is_critical(number: u16) -> bool {
    number & 1 == 1
}

/// Unsafe-to-forward options (bit 1, §5.4.2).
pub fn is_unsafe(number: u16) -> bool {
    number & 2 == 2
}

/// NoCacheKey options (bits 2–4 all set, §5.4.2).
pub fn is_no_cache_key(number: u16) -> bool {
    number & 0x1e == 0x1c
}

/// A human name for an option number (`Option(NNN)` for unknown ones).
pub fn option_name(number: u16) -> String {
    match option_def(number) {
        Some(d) => d.name.to_string(),
        None => format!("Option({number})"),
    }
}

/// An option's value for a person (`cobalt -v`, `cobalt get -i`): the text of a string
/// option, the number of a uint option (`NUM/M/SIZE` for Block1 and Block2, the media
/// type after a Content-Format or Accept number), `0x` and hex digits otherwise.
pub fn display_value(number: u16, value: &[u8]) -> String {
    use std::fmt::Write;
    match option_def(number).map(|d| d.format) {
        Some(OptionFormat::String) => String::from_utf8_lossy(value).into_owned(),
        Some(OptionFormat::Uint) => match decode_uint(value) {
            None => "(malformed)".into(),
            Some(v) if number == number::BLOCK1 || number == number::BLOCK2 => {
                match super::BlockValue::decode(v) {
                    Some(b) => format!("{}/{}/{}", b.num, u8::from(b.more), b.size()),
                    None => "(malformed)".into(),
                }
            }
            Some(v) if number == number::CONTENT_FORMAT || number == number::ACCEPT => {
                match u16::try_from(v).ok().and_then(content_format::name) {
                    Some(name) => format!("{v} ({name})"),
                    None => v.to_string(),
                }
            }
            Some(v) => v.to_string(),
        },
        _ => {
            let mut hex = String::from("0x");
            for b in value {
                let _ = write!(hex, "{b:02x}");
            }
            hex
        }
    }
}

/// Encodes an unsigned integer as an option value: big-endian, no leading zero bytes (§3.2).
pub fn encode_uint(value: u32) -> Vec<u8> {
    let bytes = value.to_be_bytes();
    let skip = bytes.iter().take_while(|b| **b == 0).count();
    bytes[skip..].to_vec()
}

/// Decodes an unsigned integer option value; `None` if longer than four bytes.
pub fn decode_uint(value: &[u8]) -> Option<u32> {
    if value.len() > 4 {
        return None;
    }
    Some(value.iter().fold(0u32, |acc, b| (acc << 8) | u32::from(*b)))
}

/// One option instance as stored: its number and raw value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OptionRef<'a> {
    /// Option number.
    pub number: u16,
    /// Raw value bytes.
    pub value: &'a [u8],
}

/// Bytes of the option sequence kept inline before [`Options`] allocates.
const INLINE_BYTES: usize = 48;
/// The longest value an append copies together with its header (see
/// `Options::append`).
const SHORT_VALUE: usize = 16;
/// The longest value the wire format can carry: a 2-byte extended length (§3.1).
pub const MAX_VALUE_LEN: usize = 65535 + 269;

/// Why bytes are not a well-formed option sequence (RFC 7252 §3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WireError {
    /// The bytes end inside an option.
    Truncated,
    /// A delta or length nibble of 15.
    ReservedNibble,
    /// An option number beyond 65535.
    NumberOverflow,
}

/// One option of a wire-format sequence, as read by [`read_entry`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Entry<'a> {
    /// Where its header starts.
    pub start: usize,
    /// Bytes of its header (the nibble byte and any extended delta and length).
    pub header: usize,
    /// Its number and value.
    pub option: OptionRef<'a>,
}

impl Entry<'_> {
    /// Where the next entry starts.
    pub fn end(&self) -> usize {
        self.start + self.header + self.option.value.len()
    }
}

/// Reads the option whose header starts at `start` in `buf`, the option before it
/// having number `previous` (0 for the first). The byte at `start` must not be the
/// payload marker.
pub(crate) fn read_entry(buf: &[u8], start: usize, previous: u16) -> Result<Entry<'_>, WireError> {
    let first = *buf.get(start).ok_or(WireError::Truncated)?;
    let mut at = start + 1;
    let delta = read_extended(buf, first >> 4, &mut at)?;
    let len = read_extended(buf, first & 0x0f, &mut at)? as usize;
    let number =
        u16::try_from(u32::from(previous) + delta).map_err(|_| WireError::NumberOverflow)?;
    let value = buf.get(at..at + len).ok_or(WireError::Truncated)?;
    Ok(Entry {
        start,
        header: at - start,
        option: OptionRef { number, value },
    })
}

fn read_extended(buf: &[u8], nibble: u8, at: &mut usize) -> Result<u32, WireError> {
    let (value, used) = match nibble {
        0..=12 => (u32::from(nibble), 0),
        13 => (
            u32::from(*buf.get(*at).ok_or(WireError::Truncated)?) + 13,
            1,
        ),
        14 => {
            let b = buf.get(*at..*at + 2).ok_or(WireError::Truncated)?;
            (u32::from(u16::from_be_bytes([b[0], b[1]])) + 269, 2)
        }
        _ => return Err(WireError::ReservedNibble),
    };
    *at += used;
    Ok(value)
}

/// The header of an option on the wire: the nibble byte, then the extended delta and
/// length; returns the bytes and how many of them are used. `delta` and `len` must not
/// exceed 65535 + 269.
fn header(delta: u32, len: u32) -> ([u8; 5], usize) {
    fn nibble(v: u32) -> (u8, [u8; 2], usize) {
        match v {
            0..=12 => (v as u8, [0, 0], 0),
            13..=268 => (13, [(v - 13) as u8, 0], 1),
            _ => (14, ((v - 269) as u16).to_be_bytes(), 2),
        }
    }
    let (dn, dext, dlen) = nibble(delta);
    let (ln, lext, llen) = nibble(len);
    // Byte stores, no copies of a variable length (each a call to memcpy): unused
    // extension bytes are zero, and the length's follow the delta's.
    let mut out = [(dn << 4) | ln, dext[0], dext[1], 0, 0];
    out[1 + dlen] = lext[0];
    out[2 + dlen] = lext[1];
    (out, 1 + dlen + llen)
}

/// The options of a message, kept in ascending number order; repeated options keep
/// their insertion order, as the wire format requires.
///
/// The options are stored as they go on the wire (RFC 7252 §3.1): deltas, lengths
/// and values in one byte buffer, so that decoding a message copies its option bytes
/// once and encoding copies them back. A typical request's options (up to 48 bytes on
/// the wire) live inside the struct itself: decoding them allocates nothing.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Options {
    /// A well-formed option sequence (the wire encoding of each delta and length is
    /// unique, so equal options have equal bytes).
    buf: SmallVec<[u8; INLINE_BYTES]>,
    count: u32,
    /// The number of the last option (0 when there is none): asking for an option
    /// above it, as a server does of each request for Echo and No-Response, and adding
    /// one at or above it, as building a message does, need not read the sequence.
    last: u16,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.iter().map(|o| (o.number, o.value)))
            .finish()
    }
}

/// Where an entry is and what its header encodes, apart from the buffer.
#[derive(Debug, Clone, Copy)]
struct Place {
    start: usize,
    header: usize,
    number: u16,
    len: usize,
}

impl Place {
    fn of(e: &Entry<'_>) -> Place {
        Place {
            start: e.start,
            header: e.header,
            number: e.option.number,
            len: e.option.value.len(),
        }
    }
}

/// The entries of a well-formed sequence in order.
struct Entries<'a> {
    buf: &'a [u8],
    at: usize,
    previous: u16,
}

impl<'a> Iterator for Entries<'a> {
    type Item = Entry<'a>;

    fn next(&mut self) -> Option<Entry<'a>> {
        // The buffer is well-formed: reading stops at its end only.
        let e = read_entry(self.buf, self.at, self.previous).ok()?;
        self.at = e.end();
        self.previous = e.option.number;
        Some(e)
    }
}

impl Options {
    /// No options.
    pub fn new() -> Options {
        Options::default()
    }

    /// Options from a well-formed wire sequence of `count` options whose last is
    /// numbered `last` (the decoder's).
    pub(crate) fn from_wire(bytes: &[u8], count: usize, last: u16) -> Options {
        Options {
            buf: SmallVec::from_slice(bytes),
            count: u32::try_from(count).unwrap_or(u32::MAX),
            last,
        }
    }

    /// The options as they go on the wire (RFC 7252 §3.1), without the payload marker.
    pub fn as_wire(&self) -> &[u8] {
        &self.buf
    }

    fn entries(&self) -> Entries<'_> {
        Entries {
            buf: &self.buf,
            at: 0,
            previous: 0,
        }
    }

    /// Replaces the bytes from `from` up to the end of the header of the entry at
    /// `next` with that entry's header counted from `previous` (at most its number).
    fn reheader(&mut self, from: usize, next: Place, previous: u16) {
        let (h, used) = header(u32::from(next.number - previous), next.len as u32);
        self.buf.drain(from..next.start + next.header);
        self.buf.insert_from_slice(from, &h[..used]);
    }

    /// Where an option numbered `number` goes: the number of the last entry at most
    /// `number` (0 if none), whether one equals it, and the first entry above it.
    fn slot_of(&self, number: u16) -> (u16, bool, Option<Place>) {
        if number >= self.last {
            return (self.last, number == self.last && self.count > 0, None);
        }
        let mut previous = 0;
        for e in self.entries() {
            if e.option.number > number {
                return (previous, previous == number, Some(Place::of(&e)));
            }
            previous = e.option.number;
        }
        (previous, previous == number && self.count > 0, None)
    }

    /// Writes an option numbered `number` with `value` (at most [`MAX_VALUE_LEN`]
    /// bytes) between the entry numbered `previous` and `next`.
    fn insert_between(&mut self, previous: u16, number: u16, next: Option<Place>, value: &[u8]) {
        let (h, used) = header(u32::from(number - previous), value.len() as u32);
        match next {
            None => {
                self.append(&h[..used], value);
                self.last = number;
            }
            Some(next) => {
                // The next option's delta is now counted from this one.
                self.reheader(next.start, next, number);
                self.buf.insert_from_slice(next.start, value);
                self.buf.insert_from_slice(next.start, &h[..used]);
            }
        }
        self.count += 1;
    }

    /// Appends an entry: its header, then its value.
    fn append(&mut self, header: &[u8], value: &[u8]) {
        if value.len() <= SHORT_VALUE {
            // Byte by byte (uint options, content formats, most path segments): a
            // call to extend the buffer, or to copy a slice, costs more than these.
            for &b in header.iter().chain(value) {
                self.buf.push(b);
            }
            return;
        }
        // One reservation and two plain copies: SmallVec's `extend_from_slice` is a
        // general insertion, which the compiler keeps out of line.
        self.buf.reserve(header.len() + value.len());
        self.buf.extend(header.iter().copied());
        self.buf.extend(value.iter().copied());
    }

    /// Adds an option after any existing ones with the same number. A value longer
    /// than the wire format allows ([`MAX_VALUE_LEN`]) is cut to that length.
    pub fn push(&mut self, number: u16, value: impl AsRef<[u8]>) {
        let value = value.as_ref();
        let value = &value[..value.len().min(MAX_VALUE_LEN)];
        let (previous, _, next) = self.slot_of(number);
        self.insert_between(previous, number, next, value);
    }

    /// Replaces all options with this number by one with `value`.
    pub fn set(&mut self, number: u16, value: impl AsRef<[u8]>) {
        let value = value.as_ref();
        let value = &value[..value.len().min(MAX_VALUE_LEN)];
        let (previous, present, next) = self.slot_of(number);
        if present {
            self.remove(number);
            self.push(number, value);
        } else {
            // The usual case (a response's Content-Format, Max-Age): one pass.
            self.insert_between(previous, number, next, value);
        }
    }

    /// Sets a uint-valued option.
    pub fn set_uint(&mut self, number: u16, value: u32) {
        let bytes = value.to_be_bytes();
        let skip = (value.leading_zeros() / 8) as usize;
        self.set(number, &bytes[skip..]);
    }

    /// Removes every option with this number.
    pub fn remove(&mut self, number: u16) {
        let mut previous = 0;
        let mut first = None;
        let mut removed = 0;
        let mut next = None;
        for e in self.entries() {
            if e.option.number == number {
                first.get_or_insert(e.start);
                removed += 1;
            } else if e.option.number > number {
                next = Some(Place::of(&e));
                break;
            } else {
                previous = e.option.number;
            }
        }
        let Some(first) = first else {
            return;
        };
        match next {
            None => {
                self.buf.truncate(first);
                self.last = previous;
            }
            // The next option's delta is now counted from the one before the removed.
            Some(next) => self.reheader(first, next, previous),
        }
        self.count -= removed;
    }

    /// The first value of an option.
    pub fn get(&self, number: u16) -> Option<&[u8]> {
        if number > self.last {
            return None;
        }
        self.get_all(number).next()
    }

    /// Every value of an option, in order.
    pub fn get_all(&self, number: u16) -> impl Iterator<Item = &[u8]> {
        self.iter()
            .skip_while(move |o| o.number < number)
            .take_while(move |o| o.number == number)
            .map(|o| o.value)
    }

    /// The first value of a uint option, if present and at most four bytes long.
    pub fn get_uint(&self, number: u16) -> Option<u32> {
        self.get(number).and_then(decode_uint)
    }

    /// True if the option is present.
    pub fn contains(&self, number: u16) -> bool {
        self.get(number).is_some()
    }

    /// All options in wire order.
    pub fn iter(&self) -> impl Iterator<Item = OptionRef<'_>> {
        self.entries().map(|e| e.option)
    }

    /// Number of option instances.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// True when there are no options.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The first critical option this implementation does not recognize, or whose value
    /// is malformed or repeated where it must not be; such options are treated as
    /// unrecognized (RFC 7252 §5.4.1, §5.4.3, §5.4.5).
    pub fn first_bad_critical(&self) -> Option<u16> {
        self.unusable().find(|n| is_critical(*n))
    }

    /// Like [`Options::first_bad_critical`], but a critical option that `handled`
    /// lists and this implementation does not know is taken as recognized (the
    /// application handles it). Costs nothing more when every option is known.
    #[inline]
    pub fn first_bad_critical_except(&self, handled: &HandledOptions) -> Option<u16> {
        let bad = self.first_bad_critical()?;
        if handled.is_empty() {
            return Some(bad);
        }
        self.unusable()
            .find(|n| is_critical(*n) && !(option_def(*n).is_none() && handled.contains(*n)))
    }

    fn unusable(&self) -> impl Iterator<Item = u16> + '_ {
        let mut previous = None;
        self.iter().filter_map(move |o| {
            let repeated_number = previous == Some(o.number);
            previous = Some(o.number);
            let Some(def) = option_def(o.number) else {
                return Some(o.number);
            };
            let len = o.value.len();
            let bad_len = len < def.min_len || len > def.max_len;
            let repeated = !def.repeatable && repeated_number;
            (bad_len || repeated).then_some(o.number)
        })
    }

    /// Uri-Path segments.
    pub fn uri_path(&self) -> impl Iterator<Item = &str> {
        self.get_all(number::URI_PATH)
            .map(|v| std::str::from_utf8(v).unwrap_or(""))
    }

    /// Uri-Path joined with `/`, with a leading `/`.
    pub fn uri_path_string(&self) -> String {
        let mut s = String::new();
        for seg in self.uri_path() {
            s.push('/');
            s.push_str(seg);
        }
        if s.is_empty() {
            s.push('/');
        }
        s
    }

    /// Sets Uri-Path from a `/`-separated path (empty segments at the ends are dropped).
    pub fn set_uri_path(&mut self, path: &str) {
        self.set_repeated(number::URI_PATH, path.trim_matches('/'), '/');
    }

    /// Uri-Query items.
    pub fn uri_query(&self) -> impl Iterator<Item = &str> {
        self.get_all(number::URI_QUERY)
            .map(|v| std::str::from_utf8(v).unwrap_or(""))
    }

    /// Sets Uri-Query from an `&`-separated query string.
    pub fn set_uri_query(&mut self, query: &str) {
        self.set_repeated(number::URI_QUERY, query, '&');
    }

    /// Location-Path segments joined with `/`, with a leading `/`, if any.
    pub fn location_path_string(&self) -> Option<String> {
        let mut s = String::new();
        for seg in self.get_all(number::LOCATION_PATH) {
            s.push('/');
            s.push_str(&String::from_utf8_lossy(seg));
        }
        (!s.is_empty()).then_some(s)
    }

    fn set_repeated(&mut self, number: u16, joined: &str, sep: char) {
        self.remove(number);
        if joined.is_empty() {
            return;
        }
        for part in joined.split(sep) {
            self.push(number, part.as_bytes());
        }
    }

    /// Content-Format, if present.
    pub fn content_format(&self) -> Option<u16> {
        self.get_uint(number::CONTENT_FORMAT)
            .and_then(|v| u16::try_from(v).ok())
    }

    /// Accept, if present.
    pub fn accept(&self) -> Option<u16> {
        self.get_uint(number::ACCEPT)
            .and_then(|v| u16::try_from(v).ok())
    }

    /// Observe, if present.
    pub fn observe(&self) -> Option<u32> {
        self.get_uint(number::OBSERVE)
    }

    /// Max-Age in seconds; the default is 60 when absent (§5.10.5).
    pub fn max_age(&self) -> u32 {
        self.get_uint(number::MAX_AGE).unwrap_or(60)
    }
}

/// CoAP Content-Format numbers and their media types, from the IANA "CoAP
/// Content-Formats" registry (RFC 7252 §12.3 and the RFCs that registered more).
pub mod content_format {

    /// text/plain; charset=utf-8
    pub const TEXT_PLAIN: u16 = 0;
    /// application/link-format
    pub const LINK_FORMAT: u16 = 40;
    /// application/xml
    pub const XML: u16 = 41;
    /// application/octet-stream
    pub const OCTET_STREAM: u16 = 42;
    /// application/exi
    pub const EXI: u16 = 47;
    /// application/json
    pub const JSON: u16 = 50;
    /// application/cbor
    pub const CBOR: u16 = 60;

    /// The registered Content-Formats this crate knows: number and media type (with
    /// parameters as registered).
    pub const REGISTRY: &[(u16, &str)] = &[
        (0, "text/plain;charset=utf-8"),
        (16, "application/cose;cose-type=\"cose-encrypt0\""),
        (17, "application/cose;cose-type=\"cose-mac0\""),
        (18, "application/cose;cose-type=\"cose-sign1\""),
        (19, "application/ace+cbor"),
        (21, "image/gif"),
        (22, "image/jpeg"),
        (23, "image/png"),
        (40, "application/link-format"),
        (41, "application/xml"),
        (42, "application/octet-stream"),
        (47, "application/exi"),
        (50, "application/json"),
        (51, "application/json-patch+json"),
        (52, "application/merge-patch+json"),
        (60, "application/cbor"),
        (61, "application/cwt"),
        (62, "application/multipart-core"),
        (63, "application/cbor-seq"),
        (96, "application/cose;cose-type=\"cose-encrypt\""),
        (97, "application/cose;cose-type=\"cose-mac\""),
        (98, "application/cose;cose-type=\"cose-sign\""),
        (101, "application/cose-key"),
        (102, "application/cose-key-set"),
        (110, "application/senml+json"),
        (111, "application/sensml+json"),
        (112, "application/senml+cbor"),
        (113, "application/sensml+cbor"),
        (114, "application/senml-exi"),
        (115, "application/sensml-exi"),
        (256, "application/coap-group+json"),
        (
            280,
            "application/pkcs7-mime;smime-type=server-generated-key",
        ),
        (281, "application/pkcs7-mime;smime-type=certs-only"),
        (284, "application/pkcs8"),
        (285, "application/csrattrs"),
        (286, "application/pkcs10"),
        (287, "application/pkix-cert"),
        (310, "application/senml+xml"),
        (311, "application/sensml+xml"),
        (320, "application/senml-etch+json"),
        (322, "application/senml-etch+cbor"),
        (340, "application/yang-data+cbor"),
        (432, "application/td+json"),
        (10000, "application/vnd.ocf+cbor"),
        (10001, "application/oscore"),
        (10002, "application/javascript"),
        (11542, "application/vnd.oma.lwm2m+tlv"),
        (11543, "application/vnd.oma.lwm2m+json"),
        (11544, "application/vnd.oma.lwm2m+cbor"),
        (20000, "text/css"),
        (30000, "image/svg+xml"),
    ];

    /// Parses a Content-Format: a number (0 to 65535), a registered media type
    /// (`application/senml+json`, `text/plain;charset=utf-8`; case and spaces around
    /// `;` do not matter), or the part after the slash (`senml+json`, `cbor`,
    /// `link-format`), or `text`/`binary` for text/plain and octet-stream.
    pub fn parse(s: &str) -> Option<u16> {
        let s = s.trim();
        if let Ok(n) = s.parse::<u16>() {
            return Some(n);
        }
        let wanted: String = s
            .to_ascii_lowercase()
            .split(';')
            .map(str::trim)
            .collect::<Vec<_>>()
            .join(";");
        match wanted.as_str() {
            "text" | "text/plain" | "plain" => return Some(TEXT_PLAIN),
            "binary" => return Some(OCTET_STREAM),
            _ => {}
        }
        REGISTRY
            .iter()
            .find(|(_, name)| {
                let name = name.to_ascii_lowercase();
                name == wanted || name.split_once('/').is_some_and(|(_, sub)| sub == wanted)
            })
            .map(|(n, _)| *n)
    }

    /// The media type of a Content-Format number, if registered.
    pub fn name(n: u16) -> Option<&'static str> {
        REGISTRY
            .binary_search_by_key(&n, |(number, _)| *number)
            .ok()
            .map(|i| REGISTRY[i].1)
    }

    /// Whether the media type is JSON (`application/json` or a `+json` type).
    pub fn is_json(n: u16) -> bool {
        name(n).is_some_and(|m| {
            let m = m.split(';').next().unwrap_or(m);
            m.ends_with("/json") || m.ends_with("+json")
        })
    }

    /// Whether the media type is CBOR (`application/cbor` or a `+cbor` type).
    pub fn is_cbor(n: u16) -> bool {
        name(n).is_some_and(|m| {
            let m = m.split(';').next().unwrap_or(m);
            m.ends_with("/cbor") || m.ends_with("+cbor")
        })
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn names_numbers_and_ranges() {
            assert!(REGISTRY.windows(2).all(|w| w[0].0 < w[1].0), "sorted");
            for (n, s) in [
                (0, "text/plain"),
                (0, "text/plain; charset=utf-8"),
                (0, "text"),
                (40, "link-format"),
                (50, "JSON"),
                (60, "cbor"),
                (110, "senml+json"),
                (112, "application/senml+cbor"),
                (42, "binary"),
                (65535, "65535"),
                (11543, "vnd.oma.lwm2m+json"),
            ] {
                assert_eq!(parse(s), Some(n), "{s}");
            }
            for bad in ["65536", "-1", "nonsense", "", "application/"] {
                assert_eq!(parse(bad), None, "{bad}");
            }
            assert_eq!(name(112), Some("application/senml+cbor"));
            assert_eq!(name(9999), None);
            assert!(is_json(50) && is_json(110) && !is_json(60));
            assert!(is_cbor(60) && is_cbor(112) && is_cbor(11544) && !is_cbor(50));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// An edit of a set of options.
    #[derive(Debug, Clone)]
    enum Edit {
        Push(u16, Vec<u8>),
        Set(u16, Vec<u8>),
        Remove(u16),
    }

    fn edit() -> impl Strategy<Value = Edit> {
        // Few distinct numbers (so that edits meet), some far apart (extended deltas),
        // and values across the one- and two-byte extended lengths and either side of
        // the longest value appended in one copy with its header (SHORT_VALUE).
        let number = prop_oneof![0u16..20, Just(300), Just(2000), Just(u16::MAX)];
        let value = prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..=SHORT_VALUE + 4),
            proptest::collection::vec(any::<u8>(), 260..300),
        ];
        prop_oneof![
            (number.clone(), value.clone()).prop_map(|(n, v)| Edit::Push(n, v)),
            (number.clone(), value).prop_map(|(n, v)| Edit::Set(n, v)),
            number.prop_map(Edit::Remove),
        ]
    }

    proptest! {
        #[test]
        fn edits_behave_like_a_sorted_list(edits in proptest::collection::vec(edit(), 0..24)) {
            let mut o = Options::new();
            let mut model: Vec<(u16, Vec<u8>)> = Vec::new();
            for e in edits {
                match e {
                    Edit::Push(n, v) => {
                        let at = model.iter().take_while(|(m, _)| *m <= n).count();
                        model.insert(at, (n, v.clone()));
                        o.push(n, v);
                    }
                    Edit::Set(n, v) => {
                        model.retain(|(m, _)| *m != n);
                        let at = model.iter().take_while(|(m, _)| *m <= n).count();
                        model.insert(at, (n, v.clone()));
                        o.set(n, v);
                    }
                    Edit::Remove(n) => {
                        model.retain(|(m, _)| *m != n);
                        o.remove(n);
                    }
                }
                let got: Vec<(u16, Vec<u8>)> =
                    o.iter().map(|x| (x.number, x.value.to_vec())).collect();
                prop_assert_eq!(&got, &model);
                prop_assert_eq!(o.len(), model.len());
                let last = model.last().map_or(0, |(n, _)| *n);
                prop_assert_eq!(Options::from_wire(o.as_wire(), o.len(), last), o.clone());
                // What is asked above the last option is absent without a look.
                for n in [last, last.saturating_add(1), 7, 300] {
                    let first = model.iter().find(|(m, _)| *m == n).map(|(_, v)| v.as_slice());
                    prop_assert_eq!(o.get(n), first);
                }
            }
        }
    }

    #[test]
    fn a_value_longer_than_the_wire_allows_is_cut() {
        let mut o = Options::new();
        o.push(number::PROXY_URI, vec![b'a'; MAX_VALUE_LEN + 10]);
        o.push(number::URI_PATH, "x");
        assert_eq!(
            o.get(number::PROXY_URI).map(<[u8]>::len),
            Some(MAX_VALUE_LEN)
        );
        assert_eq!(o.uri_path_string(), "/x");
    }

    #[test]
    fn a_header_carries_the_delta_extension_then_the_length_extension() {
        // Delta 300: nibble 14, 300 - 269 in two bytes; length 20: nibble 13, 20 - 13.
        assert_eq!(header(300, 20), ([0xed, 0x00, 0x1f, 0x07, 0], 4));
        // Delta 20: nibble 13, one byte; length 300: nibble 14, two bytes.
        assert_eq!(header(20, 300), ([0xde, 0x07, 0x00, 0x1f, 0], 4));
        assert_eq!(header(12, 0), ([0xc0, 0, 0, 0, 0], 1));
        assert_eq!(header(269, 65535 + 269), ([0xee, 0, 0, 0xff, 0xff], 5));
        let mut o = Options::new();
        o.set_uint(number::CONTENT_FORMAT, 0);
        o.set_uint(number::MAX_AGE, 60);
        assert_eq!(o.as_wire(), [0xc0, 0x21, 60]);
    }

    #[test]
    fn uint_encoding_has_no_leading_zeros() {
        assert_eq!(encode_uint(0), Vec::<u8>::new());
        assert_eq!(encode_uint(1), vec![1]);
        assert_eq!(encode_uint(256), vec![1, 0]);
        assert_eq!(decode_uint(&[1, 0]), Some(256));
        assert_eq!(decode_uint(&[1, 2, 3, 4, 5]), None);
    }

    #[test]
    fn options_stay_sorted_and_repeat_in_order() {
        let mut o = Options::new();
        o.push(number::URI_QUERY, "a=1");
        o.push(number::URI_PATH, "x");
        o.push(number::URI_PATH, "y");
        o.push(number::IF_MATCH, vec![1]);
        let numbers: Vec<u16> = o.iter().map(|o| o.number).collect();
        assert_eq!(numbers, vec![1, 11, 11, 15]);
        assert_eq!(o.uri_path_string(), "/x/y");
    }

    #[test]
    fn set_remove_and_get_keep_the_order() {
        let mut o = Options::new();
        o.push(number::URI_PATH, "a");
        o.push(number::ETAG, [1, 2]);
        o.push(number::URI_PATH, "b");
        o.push(number::ETAG, [3]);
        o.set_uint(number::CONTENT_FORMAT, 50);
        o.push(number::SIZE1, vec![0; 300]);
        assert_eq!(
            o.get_all(number::ETAG).collect::<Vec<_>>(),
            [&[1u8, 2][..], &[3]]
        );
        assert_eq!(o.uri_path_string(), "/a/b");
        o.set(number::URI_PATH, "c");
        assert_eq!(o.uri_path_string(), "/c");
        o.remove(number::ETAG);
        assert!(!o.contains(number::ETAG));
        assert_eq!(o.len(), 3);
        let numbers: Vec<u16> = o.iter().map(|o| o.number).collect();
        assert_eq!(
            numbers,
            [number::URI_PATH, number::CONTENT_FORMAT, number::SIZE1]
        );
        assert_eq!(o.get_uint(number::CONTENT_FORMAT), Some(50));
        assert_eq!(o.get(number::SIZE1).map(<[u8]>::len), Some(300));
        o.remove(number::SIZE1);
        o.remove(number::URI_PATH);
        o.remove(number::CONTENT_FORMAT);
        assert!(o.is_empty() && o.as_wire().is_empty());
        assert_eq!(o, Options::new());
    }

    #[test]
    fn path_and_query_setters() {
        let mut o = Options::new();
        o.set_uri_path("/seg1/seg2/seg3");
        o.set_uri_query("a=1&b=2");
        assert_eq!(o.uri_path().collect::<Vec<_>>(), ["seg1", "seg2", "seg3"]);
        assert_eq!(o.uri_query().collect::<Vec<_>>(), ["a=1", "b=2"]);
        o.set_uri_path("/");
        assert_eq!(o.uri_path_string(), "/");
    }

    #[test]
    fn option_classes() {
        assert!(is_critical(number::URI_PATH));
        assert!(!is_critical(number::CONTENT_FORMAT));
        assert!(is_unsafe(number::URI_HOST));
        assert!(is_no_cache_key(number::SIZE1));
    }

    #[test]
    fn bad_critical_detection() {
        let mut o = Options::new();
        o.push(number::URI_PATH, "a");
        assert_eq!(o.first_bad_critical(), None);
        o.push(9, vec![]); // unknown critical
        assert_eq!(o.first_bad_critical(), Some(9));

        let mut o = Options::new();
        o.push(number::CONTENT_FORMAT, vec![0]);
        o.push(number::CONTENT_FORMAT, vec![1]);
        o.push(number::URI_PORT, vec![1, 2, 3]); // too long: treated as unrecognized
        assert_eq!(o.first_bad_critical(), Some(number::URI_PORT));

        let mut o = Options::new();
        o.push(100, vec![]); // unknown elective: ignored
        assert_eq!(o.first_bad_critical(), None);
    }

    #[test]
    fn handled_options_pass_only_when_unknown_and_listed() {
        let handled = HandledOptions::new([65001, 9, 9]);
        assert_eq!(handled.numbers(), [9, 65001]);
        let mut o = Options::new();
        o.push(9, vec![1, 2]);
        o.push(65001, vec![]);
        assert_eq!(o.first_bad_critical_except(&handled), None);
        o.push(65003, vec![]); // critical, not handled
        assert_eq!(o.first_bad_critical_except(&handled), Some(65003));
        // A known option keeps its checks even when listed.
        let mut o = Options::new();
        o.push(number::URI_PORT, vec![1, 2, 3]);
        let handled = HandledOptions::new([number::URI_PORT]);
        assert_eq!(
            o.first_bad_critical_except(&handled),
            Some(number::URI_PORT)
        );
        assert!(HandledOptions::default().is_empty());
    }
}
