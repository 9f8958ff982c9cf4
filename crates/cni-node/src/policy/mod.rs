//! NetworkPolicy: the objects it is read from ([`objects`], [`selector`]), its
//! meaning ([`model`], which `explain` and the tests use), and what the kernel must
//! hold on this node ([`compile`]).

pub mod compile;
pub mod datapath;
pub mod explain;
pub mod model;
pub mod objects;
pub mod selector;

use serde_json::Value;

/// A JSON value for a message, cut short: API data can be anything.
pub(crate) fn short(value: &Value) -> String {
    let mut text = value.to_string();
    if text.len() > 80 {
        let cut = (0..=80)
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0);
        text.truncate(cut);
        text.push_str("...");
    }
    text
}
