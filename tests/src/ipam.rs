//! host-local's on-disk state, read the way tests compare it: the reservation files of
//! one network, name (the address) to content (`<id>\r\n<ifname>`).

use std::collections::BTreeMap;
use std::path::Path;

/// The reservation files in a network's state directory (`<dataDir>/<network>`): files
/// whose name parses as an address; `lock`, `last_reserved_ip.*` and temp files are not
/// reservations. A missing directory holds none.
pub fn reservations(network_dir: &Path) -> BTreeMap<String, String> {
    let Ok(entries) = std::fs::read_dir(network_dir) else {
        return BTreeMap::new();
    };
    entries
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.parse::<std::net::IpAddr>().is_ok())
        .map(|name| {
            let content = std::fs::read_to_string(network_dir.join(&name)).unwrap_or_default();
            (name, content)
        })
        .collect()
}
