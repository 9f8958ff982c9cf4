//! Mixed fleets: which side (our plugin or the reference's) makes and which removes
//! each pod's attachment, so that every combination happens on one node.

/// Which binary runs a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Ours.
    Ours,
    /// The reference plugin.
    Reference,
}

/// Pod `i`'s ADD and DEL sides: the four combinations in turn, so that half of each
/// command is the reference's and every pod made by one side is deleted by both.
pub fn sides(i: usize) -> (Side, Side) {
    match i % 4 {
        0 => (Side::Ours, Side::Ours),
        1 => (Side::Reference, Side::Reference),
        2 => (Side::Ours, Side::Reference),
        _ => (Side::Reference, Side::Ours),
    }
}
