//! LwM2M paths: `/object[/instance[/resource[/resource-instance]]]`, each level a
//! 16-bit number (LwM2M 1.1 §6.1; 65535 is reserved and refused).

use serde::{Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// A path into a client's object tree: an object, optionally narrowed to an instance,
/// a resource and a resource instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LwPath {
    /// The object id.
    pub object: u16,
    /// The object instance id.
    pub instance: Option<u16>,
    /// The resource id (only with an instance).
    pub resource: Option<u16>,
    /// The resource instance id (only with a resource).
    pub resource_instance: Option<u16>,
}

/// Why a text is not an LwM2M path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an LwM2M path: give /object[/instance[/resource[/resource-instance]]], each 0-65534")]
pub struct PathError(pub String);

impl LwPath {
    /// `/object`.
    pub fn object(object: u16) -> LwPath {
        LwPath {
            object,
            instance: None,
            resource: None,
            resource_instance: None,
        }
    }

    /// `/object/instance`.
    pub fn instance(object: u16, instance: u16) -> LwPath {
        LwPath {
            instance: Some(instance),
            ..LwPath::object(object)
        }
    }

    /// `/object/instance/resource`.
    pub fn resource(object: u16, instance: u16, resource: u16) -> LwPath {
        LwPath {
            resource: Some(resource),
            ..LwPath::instance(object, instance)
        }
    }

    /// `/object/instance/resource/resource_instance`.
    pub fn resource_instance(object: u16, instance: u16, resource: u16, ri: u16) -> LwPath {
        LwPath {
            resource_instance: Some(ri),
            ..LwPath::resource(object, instance, resource)
        }
    }

    /// How many levels it names (1 for an object, 4 for a resource instance).
    pub fn depth(&self) -> usize {
        1 + usize::from(self.instance.is_some())
            + usize::from(self.resource.is_some())
            + usize::from(self.resource_instance.is_some())
    }

    /// Whether it names a resource or a resource instance (a single value).
    pub fn is_resource(&self) -> bool {
        self.resource.is_some()
    }

    /// Whether `other` is this path or below it.
    pub fn contains(&self, other: &LwPath) -> bool {
        fn covers(mine: Option<u16>, theirs: Option<u16>) -> bool {
            mine.is_none() || mine == theirs
        }
        self.object == other.object
            && covers(self.instance, other.instance)
            && covers(self.resource, other.resource)
            && covers(self.resource_instance, other.resource_instance)
    }

    /// The path's segments, for Uri-Path options.
    pub fn segments(&self) -> impl Iterator<Item = u16> {
        [
            Some(self.object),
            self.instance,
            self.resource,
            self.resource_instance,
        ]
        .into_iter()
        .map_while(|s| s)
    }

    /// Builds a path from up to four numbers (one at least).
    pub fn from_ids(ids: &[u16]) -> Option<LwPath> {
        if ids.is_empty() || ids.len() > 4 || ids.contains(&u16::MAX) {
            return None;
        }
        Some(LwPath {
            object: ids[0],
            instance: ids.get(1).copied(),
            resource: ids.get(2).copied(),
            resource_instance: ids.get(3).copied(),
        })
    }
}

impl FromStr for LwPath {
    type Err = PathError;

    /// Parses `/3/0/13` (the leading `/` is optional, a trailing one is allowed).
    fn from_str(s: &str) -> Result<LwPath, PathError> {
        let bad = || PathError(s.chars().take(40).collect());
        let trimmed = s.strip_prefix('/').unwrap_or(s);
        let trimmed = trimmed.strip_suffix('/').unwrap_or(trimmed);
        let mut ids = [0u16; 4];
        let mut n = 0;
        for segment in trimmed.split('/') {
            if n == 4 || segment.is_empty() || segment.len() > 5 {
                return Err(bad());
            }
            if !segment.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            ids[n] = segment.parse().map_err(|_| bad())?;
            n += 1;
        }
        LwPath::from_ids(&ids[..n]).ok_or_else(bad)
    }
}

impl fmt::Display for LwPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for id in self.segments() {
            write!(f, "/{id}")?;
        }
        Ok(())
    }
}

impl Serialize for LwPath {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_parse_and_print_at_every_depth() {
        for (text, depth) in [("/3", 1), ("/3/0", 2), ("/3/0/13", 3), ("/3/0/11/0", 4)] {
            let p: LwPath = text.parse().unwrap();
            assert_eq!((p.to_string().as_str(), p.depth()), (text, depth));
        }
        assert_eq!("3/0/".parse::<LwPath>().unwrap(), LwPath::instance(3, 0));
        assert!(LwPath::instance(3, 0).contains(&LwPath::resource(3, 0, 13)));
        assert!(!LwPath::resource(3, 0, 13).contains(&LwPath::instance(3, 0)));
        assert!(!LwPath::object(1).contains(&LwPath::object(3)));
    }

    #[test]
    fn malformed_paths_are_refused() {
        for bad in [
            "",
            "/",
            "//3",
            "/3//0",
            "/a",
            "/3/0/1/2/3",
            "/65535",
            "/70000",
            "/-1",
            "/+1",
            "/3/0 ",
            "/000001",
        ] {
            assert!(bad.parse::<LwPath>().is_err(), "{bad:?}");
        }
    }
}
