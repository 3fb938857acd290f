//! Route patterns: the segments of a route's path (`/rd/{id}`, `/files/{*rest}`) and,
//! for a route with parameters, where each parameter sits in a matched request's
//! Uri-Path.

use std::fmt;

/// One segment of a route's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Segment<'a> {
    /// Matches exactly this Uri-Path segment.
    Static(&'a str),
    /// `{name}`: matches any one segment.
    Param(&'a str),
    /// `{*name}`: matches the remaining segments, zero or more (last only).
    Wildcard(&'a str),
}

/// A route's path that is not a valid pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidRoute {
    /// The path as given.
    pub path: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl fmt::Display for InvalidRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid route `{}`: {} (segments are literal text, `{{name}}` for one \
             segment or a last `{{*name}}` for the rest)",
            self.path, self.reason
        )
    }
}

impl std::error::Error for InvalidRoute {}

/// Splits `path` into its segments (empty ones, as in `//` or a trailing `/`, are
/// skipped), checking that braces only appear as whole `{name}` / `{*name}` segments,
/// that names are unique and that a wildcard comes last.
pub(crate) fn parse(path: &str) -> Result<Vec<Segment<'_>>, InvalidRoute> {
    let invalid = |reason| InvalidRoute {
        path: path.to_string(),
        reason,
    };
    let mut out: Vec<Segment<'_>> = Vec::new();
    for seg in path.split('/').filter(|s| !s.is_empty()) {
        if matches!(out.last(), Some(Segment::Wildcard(_))) {
            return Err(invalid("a `{*name}` wildcard must be the last segment"));
        }
        let segment = match seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
            Some(inner) => match inner.strip_prefix('*') {
                Some(name) => Segment::Wildcard(name),
                None => Segment::Param(inner),
            },
            None if seg.contains(['{', '}']) => {
                return Err(invalid("a segment with braces must be a whole `{name}`"))
            }
            None => Segment::Static(seg),
        };
        if let Segment::Param(name) | Segment::Wildcard(name) = segment {
            if name.is_empty() || name.contains(['{', '}', '*']) {
                return Err(invalid("a parameter needs a name without braces or `*`"));
            }
            if out.iter().any(|s| s.name() == Some(name)) {
                return Err(invalid("a parameter name is used twice"));
            }
        }
        out.push(segment);
    }
    Ok(out)
}

impl Segment<'_> {
    fn name(&self) -> Option<&str> {
        match self {
            Segment::Static(_) => None,
            Segment::Param(n) | Segment::Wildcard(n) => Some(n),
        }
    }
}

/// Where the parameters of a route with parameters are in a request's Uri-Path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RoutePattern {
    /// Each `{name}` with the index of its Uri-Path segment, in path order.
    params: Vec<(Box<str>, usize)>,
    /// The `{*name}` and the index of the first segment it takes.
    rest: Option<(Box<str>, usize)>,
}

impl RoutePattern {
    /// The pattern of `segments`, or `None` for a static path (nothing to capture).
    pub(crate) fn of(segments: &[Segment<'_>]) -> Option<RoutePattern> {
        let mut pattern = RoutePattern {
            params: Vec::new(),
            rest: None,
        };
        for (i, seg) in segments.iter().enumerate() {
            match seg {
                Segment::Static(_) => {}
                Segment::Param(name) => pattern.params.push(((*name).into(), i)),
                Segment::Wildcard(name) => pattern.rest = Some(((*name).into(), i)),
            }
        }
        (!pattern.params.is_empty() || pattern.rest.is_some()).then_some(pattern)
    }

    /// The Uri-Path segment of the parameter `name`, if it is a `{name}` of this route.
    pub(crate) fn segment_of(&self, name: &str) -> Option<usize> {
        self.params
            .iter()
            .find(|(n, _)| &**n == name)
            .map(|(_, i)| *i)
    }

    /// The wildcard's name and the first segment it takes, if the route has one.
    pub(crate) fn rest(&self) -> Option<(&str, usize)> {
        self.rest.as_ref().map(|(n, i)| (&**n, *i))
    }

    /// The `{name}` parameters' names and segments, in path order.
    pub(crate) fn params(&self) -> impl Iterator<Item = (&str, usize)> {
        self.params.iter().map(|(n, i)| (&**n, *i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_static_param_and_wildcard_segments() {
        assert_eq!(
            parse("/rd/{id}//x/{*rest}").unwrap(),
            [
                Segment::Static("rd"),
                Segment::Param("id"),
                Segment::Static("x"),
                Segment::Wildcard("rest")
            ]
        );
        assert!(parse("/").unwrap().is_empty());
    }

    #[test]
    fn refuses_misplaced_wildcards_stray_braces_and_twice_used_names() {
        for (path, why) in [
            ("/a/{*rest}/b", "last"),
            ("/a/x{id}", "whole"),
            ("/a/{id", "whole"),
            ("/a/{}", "name"),
            ("/a/{*}", "name"),
            ("/a/{id}/{id}", "twice"),
        ] {
            let e = parse(path).unwrap_err();
            assert!(e.reason.contains(why), "{path}: {e}");
            assert!(e.to_string().contains(path), "{e}");
        }
    }

    #[test]
    fn pattern_records_segment_indices() {
        let segs = parse("/a/{x}/b/{y}/{*z}").unwrap();
        let p = RoutePattern::of(&segs).unwrap();
        assert_eq!(p.segment_of("x"), Some(1));
        assert_eq!(p.segment_of("y"), Some(3));
        assert_eq!(p.segment_of("z"), None);
        assert_eq!(p.rest(), Some(("z", 4)));
        assert!(RoutePattern::of(&parse("/a/b").unwrap()).is_none());
    }
}
