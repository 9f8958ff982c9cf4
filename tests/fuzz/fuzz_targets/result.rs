//! Results of any shape (prevResult, delegated IPAM output): parse in every default
//! version, print in every supported version, parse the print back.
#![no_main]

use cni_protocol::{CniResult, SUPPORTED_VERSIONS};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    for default in SUPPORTED_VERSIONS.iter().chain(&["", "0.5.0"]) {
        let Ok(result) = CniResult::parse(&value, default) else {
            continue;
        };
        for v in SUPPORTED_VERSIONS {
            let printed = result.to_json(v);
            assert_eq!(printed.is_ok(), result.ensure_convertible(v).is_ok());
            if let Ok(text) = printed {
                let back: serde_json::Value = serde_json::from_str(&text).expect("JSON");
                CniResult::parse(&back, v).expect("a printed result parses");
            }
        }
    }
});
