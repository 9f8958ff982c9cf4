//! Temporary directories (IPAM `dataDir`s, config dirs) removed on drop.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::names::unique_name;

/// A fresh directory under [`std::env::temp_dir`], removed with its contents on drop.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates `<tmp>/<prefix>-<pid>-<n>`; panics if it cannot (or if it already exists,
    /// which would mean another run's state could leak into this test).
    pub fn new(prefix: &str) -> Self {
        let path = std::env::temp_dir().join(unique_name(prefix));
        std::fs::create_dir(&path)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
        Self { path }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// [`Self::path`] as text, for JSON configs.
    pub fn path_str(&self) -> &str {
        self.path.to_str().unwrap_or_default()
    }
}

impl Drop for TempDir {
    /// Never panics; reports what it could not remove.
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            let _ = writeln!(
                std::io::stderr(),
                "warning: could not remove {}: {e}",
                self.path.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tempdir_is_created_and_removed_with_contents() {
        let dir = TempDir::new("cnibb-tmp");
        let path = dir.path().to_path_buf();
        assert!(path.is_dir());
        std::fs::create_dir(path.join("sub")).unwrap();
        std::fs::write(path.join("sub/file"), b"x").unwrap();
        drop(dir);
        assert!(!path.exists());
    }
}
