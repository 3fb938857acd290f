//! RFC 6690 CoRE Link Format: encoding, parsing and query filtering.
//!
//! A link-format document (content format 40, served at `/.well-known/core`) is a
//! comma-separated list of links, each a `<target>` followed by `;`-separated
//! attributes:
//!
//! ```text
//! </sensors/temp>;rt="temperature-c";if="sensor";obs,</sensors/light>;rt="light-lux";ct=0
//! ```
//!
//! * [`Link`] holds one link: its target and its attributes in document order.
//! * [`encode`] writes links as link-format text.
//! * [`parse`] reads link-format text. It is linear in the input, does not recurse and
//!   returns a [`LinkFormatError`] (never panics) on malformed input.
//! * [`matches()`], [`filter`] and [`filter_by_query`] implement the RFC 6690 §4.1
//!   query filtering used by `GET /.well-known/core?rt=temp*`.
//!
//! ```
//! use cobalt_proto::link_format::{self, Link};
//!
//! let links = vec![
//!     Link::new("/sensors/temp")
//!         .with_rt("temperature-c")
//!         .with_if("sensor")
//!         .with_obs(),
//!     Link::new("/sensors/light").with_rt("light-lux").with_ct(0),
//! ];
//! let text = link_format::encode(&links);
//! assert_eq!(
//!     text,
//!     r#"</sensors/temp>;rt="temperature-c";if="sensor";obs,</sensors/light>;rt="light-lux";ct=0"#
//! );
//!
//! let parsed = link_format::parse(&text)?;
//! assert_eq!(parsed, links);
//! assert!(parsed[0].is_observable());
//! assert_eq!(parsed[1].content_formats().collect::<Vec<_>>(), [0]);
//!
//! // The Uri-Query options of a discovery request, as the server passes them.
//! let hits = link_format::filter_by_query(&parsed, ["rt=temp*"]);
//! assert_eq!(hits.len(), 1);
//! assert_eq!(hits[0].target, "/sensors/temp");
//!
//! assert!(link_format::parse("</unterminated").is_err());
//! # Ok::<(), link_format::LinkFormatError>(())
//! ```
//!
//! Attribute names are compared ASCII case-insensitively everywhere in this module
//! (link parameter names are case-insensitive); values and targets are compared exactly.

use std::fmt;

/// Attributes whose values are relation types (space-separated lists) and are always
/// written as quoted strings. Repeated occurrences are merged by [`encode`].
const RELATION_TYPE_ATTRS: [&str; 4] = ["rt", "if", "rel", "rev"];

/// Attributes that [`encode`] always writes as quoted strings.
const QUOTED_ATTRS: [&str; 6] = ["rt", "if", "rel", "rev", "title", "anchor"];

/// One link of a link-format document: a target URI reference and its attributes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Link {
    /// The link target, the URI reference between `<` and `>` (e.g. `/sensors/temp`).
    pub target: String,
    /// The attributes in document order: name and value, where the value is `None` for
    /// an attribute written without `=` (such as `obs`).
    pub attrs: Vec<(String, Option<String>)>,
}

impl Link {
    /// A link to `target` with no attributes.
    pub fn new(target: impl Into<String>) -> Self {
        Link {
            target: target.into(),
            attrs: Vec::new(),
        }
    }

    /// Appends the attribute `name=value`.
    ///
    /// The name is written verbatim by [`encode`]; it should be a link parameter name
    /// (no whitespace, `=`, `;`, `,`, `"`, `<`, `>` or `\`), or the encoded text will
    /// not parse back.
    pub fn attr(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.attrs.push((name.into(), Some(value.into())));
        self
    }

    /// Appends the valueless attribute `name` (such as `obs`).
    pub fn flag(mut self, name: impl Into<String>) -> Self {
        self.attrs.push((name.into(), None));
        self
    }

    /// Appends a resource type (`rt`) value. Calling it several times yields several
    /// values, which [`encode`] writes space-separated in one quoted `rt` attribute.
    pub fn with_rt(self, resource_type: impl Into<String>) -> Self {
        self.attr("rt", resource_type)
    }

    /// Appends an interface description (`if`) value; repeated values are merged like
    /// [`Link::with_rt`].
    pub fn with_if(self, interface: impl Into<String>) -> Self {
        self.attr("if", interface)
    }

    /// Appends a content format (`ct`, RFC 7252 §7.2.1) attribute.
    pub fn with_ct(self, content_format: u16) -> Self {
        self.attr("ct", content_format.to_string())
    }

    /// Appends a maximum size estimate (`sz`) attribute, in bytes.
    pub fn with_sz(self, size: u64) -> Self {
        self.attr("sz", size.to_string())
    }

    /// Appends the valueless `obs` attribute (the resource is observable, RFC 7641).
    pub fn with_obs(self) -> Self {
        self.flag("obs")
    }

    /// Appends a human-readable `title` attribute.
    pub fn with_title(self, title: impl Into<String>) -> Self {
        self.attr("title", title)
    }

    /// The value of the first attribute called `name` that has a value.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.attrs
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .find_map(|(_, v)| v.as_deref())
    }

    /// The values of all attributes called `name` that have a value, in order.
    pub fn get_all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.attrs
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .filter_map(|(_, v)| v.as_deref())
    }

    /// Whether the link has an attribute called `name`, with or without a value.
    pub fn has(&self, name: &str) -> bool {
        self.attrs.iter().any(|(n, _)| n.eq_ignore_ascii_case(name))
    }

    /// The resource types: the space-separated values of every `rt` attribute.
    pub fn resource_types(&self) -> impl Iterator<Item = &str> + '_ {
        self.get_all("rt").flat_map(str::split_ascii_whitespace)
    }

    /// The interface descriptions: the space-separated values of every `if` attribute.
    pub fn interfaces(&self) -> impl Iterator<Item = &str> + '_ {
        self.get_all("if").flat_map(str::split_ascii_whitespace)
    }

    /// The content formats: the space-separated values of every `ct` attribute that are
    /// valid numbers (others are skipped).
    pub fn content_formats(&self) -> impl Iterator<Item = u16> + '_ {
        self.get_all("ct")
            .flat_map(str::split_ascii_whitespace)
            .filter_map(|v| v.parse().ok())
    }

    /// The maximum size estimate (`sz`), if present and a valid number.
    pub fn size(&self) -> Option<u64> {
        self.get("sz").and_then(|v| v.trim().parse().ok())
    }

    /// Whether the link carries the `obs` attribute.
    pub fn is_observable(&self) -> bool {
        self.has("obs")
    }

    /// The `title` attribute, if present.
    pub fn title(&self) -> Option<&str> {
        self.get("title")
    }
}

// ---------------------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------------------

/// Writes `links` as a link-format document.
///
/// * The target is written between `<` and `>`; a `>` inside it (which a URI reference
///   cannot contain) is percent-encoded as `%3E`.
/// * `rt`, `if`, `rel`, `rev`, `title` and `anchor` values are always quoted strings.
///   Several valued `rt` (or `if`, `rel`, `rev`) attributes of one link are merged into
///   one quoted string at the position of the first, values separated by a space.
/// * Other values (e.g. `ct`, `sz`) are written as bare tokens when they are non-empty
///   and consist of RFC 6690 `ptoken` characters only, and as quoted strings otherwise.
/// * In quoted strings, `"` and `\` are escaped with a backslash.
/// * Valueless attributes are written as the bare name (`;obs`).
pub fn encode(links: &[Link]) -> String {
    let mut out = String::new();
    for (i, link) in links.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        encode_link(&mut out, link);
    }
    out
}

fn encode_link(out: &mut String, link: &Link) {
    out.push('<');
    for c in link.target.chars() {
        if c == '>' {
            out.push_str("%3E");
        } else {
            out.push(c);
        }
    }
    out.push('>');
    for (i, (name, value)) in link.attrs.iter().enumerate() {
        let relation_types = value.is_some() && is_one_of(name, &RELATION_TYPE_ATTRS);
        if relation_types
            && link.attrs[..i]
                .iter()
                .any(|(n, v)| v.is_some() && n.eq_ignore_ascii_case(name))
        {
            // Already written, merged into the first valued occurrence.
            continue;
        }
        out.push(';');
        out.push_str(name);
        let Some(value) = value else { continue };
        out.push('=');
        if relation_types {
            let mut merged = String::new();
            for (j, v) in link.attrs[i..]
                .iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case(name))
                .filter_map(|(_, v)| v.as_deref())
                .enumerate()
            {
                if j > 0 {
                    merged.push(' ');
                }
                merged.push_str(v);
            }
            push_quoted(out, &merged);
        } else if is_one_of(name, &QUOTED_ATTRS)
            || value.is_empty()
            || !value.chars().all(is_ptoken_char)
        {
            push_quoted(out, value);
        } else {
            out.push_str(value);
        }
    }
}

fn push_quoted(out: &mut String, value: &str) {
    out.push('"');
    for c in value.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
}

fn is_one_of(name: &str, set: &[&str]) -> bool {
    set.iter().any(|s| s.eq_ignore_ascii_case(name))
}

/// RFC 6690 `ptokenchar`.
fn is_ptoken_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'()*+-./:<=>?@[]^_`{|}~".contains(c)
}

// ---------------------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------------------

/// What the parser expected where a [`LinkFormatError`] occurred.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Expected {
    /// A `<` opening a link.
    LinkStart,
    /// The `>` closing a link target.
    TargetEnd,
    /// An attribute (link parameter) name after `;`.
    ParamName,
    /// An attribute value (a token or a quoted string) after `=`.
    ParamValue,
    /// The `"` closing a quoted string.
    ClosingQuote,
    /// A `;` (next attribute), a `,` (next link) or the end of the input.
    Separator,
}

impl fmt::Display for Expected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Expected::LinkStart => "`<` starting a link",
            Expected::TargetEnd => "`>` closing the link target",
            Expected::ParamName => "an attribute name",
            Expected::ParamValue => "an attribute value (token or quoted string)",
            Expected::ClosingQuote => "`\"` closing the quoted string",
            Expected::Separator => "`;`, `,` or end of input",
        })
    }
}

/// A malformed link-format document: where parsing stopped and what was expected there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkFormatError {
    position: usize,
    expected: Expected,
    found: Option<char>,
}

impl LinkFormatError {
    /// The byte offset into the input at which the error was detected (the input's
    /// length when the input ended too early).
    pub fn position(&self) -> usize {
        self.position
    }

    /// What the parser expected at [`position`](Self::position).
    pub fn expected(&self) -> Expected {
        self.expected
    }

    /// The character found instead, or `None` at the end of the input.
    pub fn found(&self) -> Option<char> {
        self.found
    }
}

impl fmt::Display for LinkFormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid link-format at byte {}: expected {}, found ",
            self.position, self.expected
        )?;
        match self.found {
            Some(c) => write!(f, "{c:?}"),
            None => f.write_str("end of input"),
        }
    }
}

impl std::error::Error for LinkFormatError {}

/// Parses a link-format document.
///
/// Lenient where that is harmless: whitespace (space, tab, CR, LF) is accepted around
/// `,`, `;` and `=` and at either end; any attribute may have a token value, a quoted
/// string value or no value; in quoted strings `\x` stands for `x` and `,`/`;` are plain
/// characters. Targets are taken verbatim (everything up to the next `>`); quoted values
/// are unescaped but otherwise kept verbatim (`rt="a b"` stays one attribute with value
/// `a b`). Empty or all-whitespace input is an empty list.
///
/// The parser works in one linear pass without recursion; malformed input yields a
/// [`LinkFormatError`], never a panic.
pub fn parse(input: &str) -> Result<Vec<Link>, LinkFormatError> {
    let mut cur = Cursor { s: input, pos: 0 };
    let mut links = Vec::new();
    cur.skip_ws();
    if cur.peek().is_none() {
        return Ok(links);
    }
    loop {
        links.push(parse_link(&mut cur)?);
        cur.skip_ws();
        match cur.peek() {
            None => return Ok(links),
            Some(',') => {
                cur.bump();
                cur.skip_ws();
            }
            Some(_) => return Err(cur.error(Expected::Separator)),
        }
    }
}

fn parse_link(cur: &mut Cursor<'_>) -> Result<Link, LinkFormatError> {
    if cur.peek() != Some('<') {
        return Err(cur.error(Expected::LinkStart));
    }
    cur.bump();
    let start = cur.pos;
    let Some(len) = cur.s[start..].find('>') else {
        cur.pos = cur.s.len();
        return Err(cur.error(Expected::TargetEnd));
    };
    let mut link = Link::new(&cur.s[start..start + len]);
    cur.pos = start + len + 1;
    loop {
        cur.skip_ws();
        if cur.peek() != Some(';') {
            return Ok(link);
        }
        cur.bump();
        cur.skip_ws();
        let name = cur.take_while(is_name_char);
        if name.is_empty() {
            return Err(cur.error(Expected::ParamName));
        }
        cur.skip_ws();
        let value = if cur.peek() == Some('=') {
            cur.bump();
            cur.skip_ws();
            Some(parse_value(cur)?)
        } else {
            None
        };
        link.attrs.push((name.to_owned(), value));
    }
}

fn parse_value(cur: &mut Cursor<'_>) -> Result<String, LinkFormatError> {
    if cur.peek() != Some('"') {
        let token = cur.take_while(is_token_char);
        if token.is_empty() {
            return Err(cur.error(Expected::ParamValue));
        }
        return Ok(token.to_owned());
    }
    cur.bump();
    let mut value = String::new();
    loop {
        match cur.bump() {
            None => return Err(cur.error(Expected::ClosingQuote)),
            Some('"') => return Ok(value),
            Some('\\') => match cur.bump() {
                None => return Err(cur.error(Expected::ClosingQuote)),
                Some(c) => value.push(c),
            },
            Some(c) => value.push(c),
        }
    }
}

fn is_ws(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

/// Characters accepted in attribute names (lenient `parmname`).
fn is_name_char(c: char) -> bool {
    !(c.is_control() || is_ws(c) || matches!(c, '=' | ';' | ',' | '"' | '<' | '>' | '\\'))
}

/// Characters accepted in unquoted attribute values (lenient `ptoken`).
fn is_token_char(c: char) -> bool {
    !(c.is_control() || is_ws(c) || matches!(c, ';' | ',' | '"' | '\\'))
}

/// A byte position in the input; always on a `char` boundary.
struct Cursor<'a> {
    s: &'a str,
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<char> {
        self.s[self.pos..].chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    fn skip_ws(&mut self) {
        self.take_while(is_ws);
    }

    fn take_while(&mut self, pred: fn(char) -> bool) -> &'a str {
        let start = self.pos;
        let rest = &self.s[start..];
        let len = rest.find(|c: char| !pred(c)).unwrap_or(rest.len());
        self.pos += len;
        &self.s[start..self.pos]
    }

    fn error(&self, expected: Expected) -> LinkFormatError {
        LinkFormatError {
            position: self.pos,
            expected,
            found: self.peek(),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Query filtering
// ---------------------------------------------------------------------------------------

/// Whether `link` matches one RFC 6690 §4.1 query filter `name[=value]`.
///
/// * `name` is compared ASCII case-insensitively with the attribute names.
/// * With a value: the link matches if some attribute called `name` has a value that
///   equals `value`, or one of whose space-separated parts equals `value` (so
///   `rt=temp` matches `rt="temp humidity"`). A trailing `*` in `value` makes these
///   prefix comparisons (`rt=te*`; `rt=*` matches any valued `rt`). Valueless
///   attributes never match a filter with a value.
/// * The name `href` filters on the link target instead (`href=/sensors/*`); the
///   target is compared as a whole, not split on spaces.
/// * Without a value (`?obs`): the link matches if it has an attribute called `name`,
///   with or without a value; `href` alone matches every link.
///
/// Values are compared exactly, without percent-decoding (CoAP Uri-Query options
/// already carry decoded text).
pub fn matches(link: &Link, name: &str, value: Option<&str>) -> bool {
    if name.eq_ignore_ascii_case("href") {
        return value.is_none_or(|pattern| value_matches(&link.target, pattern, false));
    }
    match value {
        None => link.has(name),
        Some(pattern) => link.get_all(name).any(|v| value_matches(v, pattern, true)),
    }
}

fn value_matches(value: &str, pattern: &str, split: bool) -> bool {
    let (needle, prefix) = match pattern.strip_suffix('*') {
        Some(p) => (p, true),
        None => (pattern, false),
    };
    let test = |candidate: &str| {
        if prefix {
            candidate.starts_with(needle)
        } else {
            candidate == needle
        }
    };
    test(value) || (split && value.split_ascii_whitespace().any(test))
}

/// Whether `link` matches one query item `name=value` or `name` (see [`matches()`]).
/// The item is split at its first `=`; an empty item matches every link.
pub fn matches_query_item(link: &Link, item: &str) -> bool {
    if item.is_empty() {
        return true;
    }
    match item.split_once('=') {
        Some((name, value)) => matches(link, name, Some(value)),
        None => matches(link, item, None),
    }
}

/// The links that match every query item, as a server answers a discovery request: the
/// items are the request's Uri-Query option values (`rt=temp*`, `obs`, ...).
///
/// RFC 6690 §4.1 defines a single filter per query. When several items are given this
/// function applies all of them (logical AND): a link is returned only if it matches
/// each item (see [`matches_query_item`]). No items, or only empty ones, return every
/// link. The order of `links` is kept.
pub fn filter_by_query<I>(links: &[Link], query_items: I) -> Vec<&Link>
where
    I: IntoIterator,
    I::Item: AsRef<str>,
{
    let items: Vec<I::Item> = query_items.into_iter().collect();
    links
        .iter()
        .filter(|link| {
            items
                .iter()
                .all(|item| matches_query_item(link, item.as_ref()))
        })
        .collect()
}

/// Like [`filter_by_query`] for a query string such as `rt=temp*&if=sensor` (a leading
/// `?` is ignored; items are separated by `&` and all must match).
pub fn filter<'a>(links: &'a [Link], query: &str) -> Vec<&'a Link> {
    let query = query.strip_prefix('?').unwrap_or(query);
    filter_by_query(links, query.split('&'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const RFC_EXAMPLE: &str = r#"</sensors/temp>;rt="temperature-c";if="sensor",</sensors/light>;rt="light-lux";if="sensor""#;

    fn rfc_links() -> Vec<Link> {
        vec![
            Link::new("/sensors/temp")
                .with_rt("temperature-c")
                .with_if("sensor"),
            Link::new("/sensors/light")
                .with_rt("light-lux")
                .with_if("sensor"),
        ]
    }

    fn targets<'a>(links: &[&'a Link]) -> Vec<&'a str> {
        links.iter().map(|l| l.target.as_str()).collect()
    }

    #[test]
    fn parses_rfc6690_example() {
        let links = parse(RFC_EXAMPLE).unwrap();
        assert_eq!(links, rfc_links());
        assert_eq!(links[0].get("rt"), Some("temperature-c"));
        assert_eq!(links[1].interfaces().collect::<Vec<_>>(), ["sensor"]);
    }

    #[test]
    fn encodes_rfc6690_example() {
        assert_eq!(encode(&rfc_links()), RFC_EXAMPLE);
    }

    #[test]
    fn parses_rfc6690_section5_examples() {
        // RFC 6690 §5: multi-line documents with anchors, rel, sz and token values.
        let doc = "</sensors>;ct=40;title=\"Sensor Index\",\n\
                   </sensors/temp>;rt=\"temperature-c\";if=\"sensor\",\n\
                   </sensors/light>;rt=\"light-lux\";if=\"sensor\",\n\
                   <http://www.example.com/sensors/t123>;anchor=\"/sensors/temp\";rel=\"describedby\",\n\
                   </t>;anchor=\"/sensors/temp\";rel=\"alternate\"";
        let links = parse(doc).unwrap();
        assert_eq!(links.len(), 5);
        assert_eq!(links[0].content_formats().collect::<Vec<_>>(), [40]);
        assert_eq!(links[0].title(), Some("Sensor Index"));
        assert_eq!(links[3].target, "http://www.example.com/sensors/t123");
        assert_eq!(links[3].get("anchor"), Some("/sensors/temp"));
        assert_eq!(links[4].get("rel"), Some("alternate"));
        assert_eq!(parse(&encode(&links)).unwrap(), links);
    }

    #[test]
    fn encodes_tokens_quotes_and_flags() {
        let link = Link::new("/path")
            .with_rt("temp")
            .with_ct(0)
            .with_sz(1024)
            .with_obs()
            .with_title("A \"quoted\" \\ title")
            .attr("foo", "bar")
            .attr("empty", "")
            .attr("spaced", "a b");
        assert_eq!(
            encode(&[link.clone(), Link::new("/x")]),
            r#"</path>;rt="temp";ct=0;sz=1024;obs;title="A \"quoted\" \\ title";foo=bar;empty="";spaced="a b",</x>"#
        );
        let parsed = parse(&encode(std::slice::from_ref(&link))).unwrap();
        assert_eq!(parsed, [link]);
        assert_eq!(parsed[0].size(), Some(1024));
        assert!(parsed[0].is_observable());
    }

    #[test]
    fn encode_merges_repeated_relation_types() {
        let link = Link::new("/a")
            .with_rt("one")
            .with_obs()
            .with_rt("two")
            .with_if("x")
            .with_if("y");
        let text = encode(std::slice::from_ref(&link));
        assert_eq!(text, r#"</a>;rt="one two";obs;if="x y""#);
        let parsed = parse(&text).unwrap();
        assert_eq!(parsed[0].get_all("rt").collect::<Vec<_>>(), ["one two"]);
        assert_eq!(
            parsed[0].resource_types().collect::<Vec<_>>(),
            link.resource_types().collect::<Vec<_>>()
        );
    }

    #[test]
    fn encode_percent_encodes_gt_in_target() {
        assert_eq!(encode(&[Link::new("/a>b")]), "</a%3Eb>");
    }

    #[test]
    fn parses_quoted_commas_semicolons_and_escapes() {
        let links = parse(r#"</a>;title="x, y; z";rt="q\"uote\\d",</b>;title="\a\,""#).unwrap();
        assert_eq!(links.len(), 2);
        assert_eq!(links[0].title(), Some("x, y; z"));
        assert_eq!(links[0].get("rt"), Some("q\"uote\\d"));
        assert_eq!(links[1].title(), Some("a,"));
    }

    #[test]
    fn parses_with_whitespace_leniency() {
        let links = parse(" \r\n</a> ; rt = \"t\" ;\tobs , \n </b>;ct = 40 \n").unwrap();
        assert_eq!(
            links,
            [
                Link::new("/a").with_rt("t").with_obs(),
                Link::new("/b").with_ct(40)
            ]
        );
    }

    #[test]
    fn parses_valueless_and_token_values() {
        let links = parse("</a>;obs;rt=temp;ct=0;foo=<bar>?=x;title*=UTF-8''%e2%82%ac").unwrap();
        let a = &links[0];
        assert_eq!(a.attrs[0], ("obs".to_owned(), None));
        assert_eq!(a.get("rt"), Some("temp"));
        assert_eq!(a.get("foo"), Some("<bar>?=x"));
        assert_eq!(a.get("title*"), Some("UTF-8''%e2%82%ac"));
        assert_eq!(a.get("obs"), None);
        assert!(a.has("OBS"));
        assert_eq!(a.get("RT"), Some("temp"));
    }

    #[test]
    fn parses_empty_input() {
        assert_eq!(parse("").unwrap(), []);
        assert_eq!(parse(" \n\t").unwrap(), []);
    }

    #[test]
    fn non_ascii_is_kept() {
        let link = Link::new("/température").with_title("Température °C");
        let text = encode(std::slice::from_ref(&link));
        assert_eq!(parse(&text).unwrap(), [link]);
    }

    fn err(input: &str) -> LinkFormatError {
        parse(input).expect_err(input)
    }

    #[test]
    fn unterminated_target_is_an_error() {
        let e = err("</sensors/temp;rt=\"x\"");
        assert_eq!(e.expected(), Expected::TargetEnd);
        assert_eq!(e.position(), 21);
        assert_eq!(e.found(), None);
        assert_eq!(
            e.to_string(),
            "invalid link-format at byte 21: expected `>` closing the link target, found end of input"
        );
    }

    #[test]
    fn unterminated_quote_is_an_error() {
        let e = err(r#"</a>;rt="temp"#);
        assert_eq!(e.expected(), Expected::ClosingQuote);
        assert_eq!(e.position(), 13);
        let e = err(r#"</a>;rt="temp\"#);
        assert_eq!(e.expected(), Expected::ClosingQuote);
    }

    #[test]
    fn malformed_inputs_are_errors() {
        let cases: &[(&str, Expected, usize, Option<char>)] = &[
            ("/a", Expected::LinkStart, 0, Some('/')),
            ("</a>,", Expected::LinkStart, 5, None),
            ("</a>,,</b>", Expected::LinkStart, 5, Some(',')),
            ("</a>;", Expected::ParamName, 5, None),
            ("</a>;;rt=x", Expected::ParamName, 5, Some(';')),
            ("</a>;=x", Expected::ParamName, 5, Some('=')),
            ("</a>;rt=", Expected::ParamValue, 8, None),
            ("</a>;rt=;ct=0", Expected::ParamValue, 8, Some(';')),
            ("</a>;rt=\"x\"y", Expected::Separator, 11, Some('y')),
            ("</a> </b>", Expected::Separator, 5, Some('<')),
            ("</a>x", Expected::Separator, 4, Some('x')),
            ("</a>;rt=a\\b", Expected::Separator, 9, Some('\\')),
        ];
        for &(input, expected, position, found) in cases {
            let e = err(input);
            assert_eq!(
                (e.expected(), e.position(), e.found()),
                (expected, position, found),
                "{input:?}: {e}"
            );
        }
        assert_eq!(
            err("</a>x").to_string(),
            "invalid link-format at byte 4: expected `;`, `,` or end of input, found 'x'"
        );
    }

    fn catalogue() -> Vec<Link> {
        vec![
            Link::new("/sensors/temp")
                .with_rt("temperature-c")
                .with_if("sensor")
                .with_obs()
                .with_ct(0),
            Link::new("/sensors/light")
                .with_rt("light-lux core.s")
                .with_if("sensor")
                .with_ct(0)
                .with_ct(50),
            Link::new("/actuators/led")
                .with_rt("led")
                .with_title("Front LED"),
        ]
    }

    #[test]
    fn filter_exact_match() {
        let links = catalogue();
        assert_eq!(
            targets(&filter_by_query(&links, ["rt=temperature-c"])),
            ["/sensors/temp"]
        );
        // One of several space-separated values.
        assert_eq!(
            targets(&filter_by_query(&links, ["rt=core.s"])),
            ["/sensors/light"]
        );
        // Whole-value match too (e.g. titles with spaces).
        assert_eq!(
            targets(&filter(&links, "title=Front LED")),
            ["/actuators/led"]
        );
        assert!(filter_by_query(&links, ["rt=temp"]).is_empty());
        assert_eq!(targets(&filter(&links, "?ct=50")), ["/sensors/light"]);
        assert_eq!(
            targets(&filter(&links, "if=sensor")),
            ["/sensors/temp", "/sensors/light"]
        );
    }

    #[test]
    fn filter_prefix_match() {
        let links = catalogue();
        assert_eq!(
            targets(&filter_by_query(&links, ["rt=te*"])),
            ["/sensors/temp"]
        );
        assert_eq!(
            targets(&filter_by_query(&links, ["rt=core*"])),
            ["/sensors/light"]
        );
        assert_eq!(
            targets(&filter_by_query(&links, ["title=*"])),
            ["/actuators/led"]
        );
        assert_eq!(filter_by_query(&links, ["rt=*"]).len(), 3);
        assert!(filter_by_query(&links, ["rt=x*"]).is_empty());
    }

    #[test]
    fn filter_href() {
        let links = catalogue();
        assert_eq!(
            targets(&filter_by_query(&links, ["href=/sensors/light"])),
            ["/sensors/light"]
        );
        assert_eq!(
            targets(&filter_by_query(&links, ["href=/sensors*"])),
            ["/sensors/temp", "/sensors/light"]
        );
        assert!(filter_by_query(&links, ["href=/sensors"]).is_empty());
        assert_eq!(filter_by_query(&links, ["href"]).len(), 3);
    }

    #[test]
    fn filter_valueless_and_missing_attributes() {
        let links = catalogue();
        assert_eq!(targets(&filter(&links, "?obs")), ["/sensors/temp"]);
        assert_eq!(targets(&filter(&links, "title")), ["/actuators/led"]);
        // A valueless attribute does not match a filter with a value.
        assert!(filter(&links, "obs=*").is_empty());
        // Missing attribute: nothing matches.
        assert!(filter(&links, "sz=10").is_empty());
        assert!(filter(&links, "nope").is_empty());
        // Names are case-insensitive, values are not.
        assert_eq!(filter(&links, "RT=led").len(), 1);
        assert!(filter(&links, "rt=LED").is_empty());
    }

    #[test]
    fn filter_multiple_items_and_empty_query() {
        let links = catalogue();
        assert_eq!(
            targets(&filter_by_query(&links, ["if=sensor", "ct=50"])),
            ["/sensors/light"]
        );
        assert_eq!(targets(&filter(&links, "if=sensor&obs")), ["/sensors/temp"]);
        assert!(filter(&links, "rt=led&if=sensor").is_empty());
        assert_eq!(filter(&links, "").len(), 3);
        assert_eq!(filter(&links, "?").len(), 3);
        assert_eq!(filter_by_query(&links, Vec::<String>::new()).len(), 3);
        let owned = vec![String::from("rt=led")];
        assert_eq!(
            targets(&filter_by_query(&links, &owned)),
            ["/actuators/led"]
        );
    }

    #[test]
    fn matches_function() {
        let link = &catalogue()[0];
        assert!(matches(link, "rt", Some("temperature-c")));
        assert!(matches(link, "ct", Some("0")));
        assert!(matches(link, "obs", None));
        assert!(!matches(link, "rt", Some("temperature")));
        assert!(matches(link, "href", Some("/sensors/*")));
        assert!(matches_query_item(link, "rt=temperature*"));
        assert!(matches_query_item(link, ""));
    }

    fn arb_name() -> impl Strategy<Value = String> {
        prop_oneof![
            prop::sample::select(vec![
                "rt", "if", "ct", "sz", "obs", "title", "anchor", "rel"
            ])
            .prop_map(str::to_owned),
            "[a-zA-Z][a-zA-Z0-9*._!#$&+^|~-]{0,7}",
        ]
    }

    fn arb_value() -> impl Strategy<Value = Option<String>> {
        prop_oneof![
            Just(None),
            "[0-9]{1,5}".prop_map(Some),
            "[a-z0-9.:/<>?=-]{0,10}".prop_map(Some),
            "(?s).{0,12}".prop_map(Some),
            "[ ,;\"\\\\=<>a]{0,8}".prop_map(Some),
        ]
    }

    fn arb_link() -> impl Strategy<Value = Link> {
        (
            "[^>]{0,20}",
            proptest::collection::vec((arb_name(), arb_value()), 0..6),
        )
            .prop_map(|(target, attrs)| {
                // The encoder merges repeated valued relation-type attributes; keep only
                // the first so that the round trip is the identity.
                let mut kept: Vec<(String, Option<String>)> = Vec::new();
                for (name, value) in attrs {
                    let repeated = value.is_some()
                        && is_one_of(&name, &RELATION_TYPE_ATTRS)
                        && kept
                            .iter()
                            .any(|(n, v)| v.is_some() && n.eq_ignore_ascii_case(&name));
                    if !repeated {
                        kept.push((name, value));
                    }
                }
                Link {
                    target,
                    attrs: kept,
                }
            })
    }

    proptest! {
        #[test]
        fn encode_then_parse_is_identity(links in proptest::collection::vec(arb_link(), 0..5)) {
            let text = encode(&links);
            prop_assert_eq!(parse(&text).unwrap(), links);
        }

        #[test]
        fn parse_never_panics(s in any::<String>()) {
            if let Ok(links) = parse(&s) {
                // Whatever parses re-encodes to text that parses to the same encoding
                // (repeated `rt` values may have been merged, so compare encodings).
                let text = encode(&links);
                prop_assert_eq!(encode(&parse(&text).unwrap()), text);
            }
        }

        #[test]
        fn parse_never_panics_on_link_like_input(s in "[<>;,=\"\\\\ \t\na-z/*é]{0,64}") {
            match parse(&s) {
                Ok(links) => {
                    let _ = filter(&links, "rt=a*&b&href=/*");
                }
                Err(e) => {
                    prop_assert!(e.position() <= s.len());
                    prop_assert!(s.is_char_boundary(e.position()));
                    let _ = e.to_string();
                }
            }
        }

        #[test]
        fn filter_never_panics(links in proptest::collection::vec(arb_link(), 0..4), q in "(?s).{0,20}") {
            let hits = filter(&links, &q);
            prop_assert!(hits.len() <= links.len());
        }
    }
}
