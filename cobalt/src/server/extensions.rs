//! Values that layers attach to a request for the handler (and for their own answer
//! hook) to read, one per type, like `http::Extensions`.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;

/// A value that can live in [`Extensions`]: any `Clone + Send + Sync + 'static` type.
trait Extension: Any + Send + Sync {
    fn clone_box(&self) -> Box<dyn Extension>;
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

impl<T: Clone + Send + Sync + 'static> Extension for T {
    fn clone_box(&self) -> Box<dyn Extension> {
        Box::new(self.clone())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// A typed map: at most one value per type. Empty until the first insert, and then
/// one allocation, so requests that no layer touches carry only a null pointer.
///
/// ```
/// use cobalt::server::Extensions;
///
/// #[derive(Clone, Debug, PartialEq)]
/// struct ContextId(u32);
///
/// let mut ext = Extensions::new();
/// assert!(ext.get::<ContextId>().is_none());
/// ext.insert(ContextId(7));
/// assert_eq!(ext.get::<ContextId>(), Some(&ContextId(7)));
/// ext.get_mut::<ContextId>().unwrap().0 = 8;
/// assert_eq!(ext.remove::<ContextId>(), Some(ContextId(8)));
/// ```
#[derive(Default)]
pub struct Extensions {
    /// Boxed: one pointer in every request rather than an empty map's 48 bytes.
    #[allow(clippy::box_collection)]
    map: Option<Box<HashMap<TypeId, Box<dyn Extension>>>>,
}

impl Extensions {
    /// An empty map.
    pub fn new() -> Extensions {
        Extensions::default()
    }

    /// Puts `value` in, returning the value of its type that was there.
    pub fn insert<T: Clone + Send + Sync + 'static>(&mut self, value: T) -> Option<T> {
        let old = self
            .map
            .get_or_insert_with(Box::default)
            .insert(TypeId::of::<T>(), Box::new(value))?;
        downcast(old)
    }

    /// The value of type `T`, if any.
    pub fn get<T: Send + Sync + 'static>(&self) -> Option<&T> {
        let v = self.map.as_ref()?.get(&TypeId::of::<T>())?;
        v.as_ref().as_any().downcast_ref()
    }

    /// The value of type `T` to change, if any.
    pub fn get_mut<T: Send + Sync + 'static>(&mut self) -> Option<&mut T> {
        let v = self.map.as_mut()?.get_mut(&TypeId::of::<T>())?;
        v.as_mut().as_any_mut().downcast_mut()
    }

    /// Takes the value of type `T` out.
    pub fn remove<T: Send + Sync + 'static>(&mut self) -> Option<T> {
        let old = self.map.as_mut()?.remove(&TypeId::of::<T>())?;
        downcast(old)
    }

    /// Whether the map holds nothing.
    pub fn is_empty(&self) -> bool {
        self.map.as_ref().is_none_or(|m| m.is_empty())
    }

    /// How many values it holds.
    pub fn len(&self) -> usize {
        self.map.as_ref().map_or(0, |m| m.len())
    }
}

/// The value inside `boxed` if it is a `T`.
fn downcast<T: 'static>(boxed: Box<dyn Extension>) -> Option<T> {
    boxed.into_any().downcast().ok().map(|b| *b)
}

impl Clone for Extensions {
    fn clone(&self) -> Extensions {
        let map = self.map.as_ref().map(|m| {
            Box::new(
                m.iter()
                    .map(|(k, v)| (*k, v.as_ref().clone_box()))
                    .collect::<HashMap<_, _>>(),
            )
        });
        Extensions { map }
    }
}

impl fmt::Debug for Extensions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Extensions")
            .field("len", &self.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_value_per_type_and_clones_are_deep() {
        let mut a = Extensions::new();
        assert!(a.is_empty());
        assert_eq!(a.insert(1u32), None);
        assert_eq!(a.insert(2u32), Some(1));
        a.insert(String::from("kid"));
        assert_eq!(a.len(), 2);
        let mut b = a.clone();
        b.get_mut::<String>().unwrap().push('!');
        assert_eq!(a.get::<String>().map(String::as_str), Some("kid"));
        assert_eq!(b.get::<String>().map(String::as_str), Some("kid!"));
        assert_eq!(b.remove::<u32>(), Some(2));
        assert_eq!(b.get::<u32>(), None);
        assert_eq!(a.get::<u64>(), None);
    }
}
