//! A constraint compiled before its request is submitted: the server compiles a
//! request's `constraint` once, off the engine's thread, and every choice of the request
//! carries the same compiled form, from which the engine starts one matcher per
//! sequence. Opaque here: only the crate that made it reads it.

use std::any::Any;
use std::sync::Arc;

/// A compiled constraint, shared by the sequences of one request.
#[derive(Clone)]
pub struct PreparedConstraint(Arc<dyn Any + Send + Sync>);

impl PreparedConstraint {
    pub fn new<T: Any + Send + Sync>(compiled: T) -> Self {
        Self(Arc::new(compiled))
    }

    /// The compiled form, when it is a `T`.
    pub fn get<T: Any>(&self) -> Option<&T> {
        self.0.downcast_ref()
    }
}

impl std::fmt::Debug for PreparedConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PreparedConstraint")
    }
}

/// Two are equal when they are the same compilation.
impl PartialEq for PreparedConstraint {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_compiled_form_is_read_back_by_its_type_only() {
        let p = PreparedConstraint::new(7u32);
        assert_eq!(p.get::<u32>(), Some(&7));
        assert_eq!(p.get::<u64>(), None);
        assert_eq!(p.clone(), p);
        assert_ne!(PreparedConstraint::new(7u32), p);
    }
}
