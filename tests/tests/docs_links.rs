//! The README and the pages under `docs/` link to each other and to files of the
//! repository: every relative link must name a file that exists, and every `#anchor` a
//! heading of that file (as GitHub turns headings into anchors). The README also stays
//! short enough to read: at most 300 lines, with the two commands near the top.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use cni_blackbox::workspace_root;

/// The markdown files checked: the README and every page under `docs/`.
fn pages() -> Vec<PathBuf> {
    let root = workspace_root();
    let mut pages = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "md"))
                .collect()
        })
        .unwrap_or_default();
    docs.sort();
    pages.extend(docs);
    pages
}

/// GitHub's anchor of a heading: lower case, punctuation other than `-` and `_` dropped,
/// spaces turned into `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a markdown file's headings (outside code blocks).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut in_code = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if !in_code && line.starts_with('#') {
            out.insert(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// The targets of `[text](target)` links outside code blocks and code spans.
fn links(text: &str) -> Vec<String> {
    let mut in_code = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        // Code spans may hold brackets that are not links.
        let outside_spans: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, part)| part)
            .collect::<Vec<_>>()
            .join(" ");
        let mut rest = outside_spans.as_str();
        while let Some(start) = rest.find("](") {
            let after = &rest[start + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page)
            .unwrap_or_else(|e| panic!("read {}: {e}", page.display()));
        let dir = page.parent().unwrap_or(Path::new("."));
        for target in links(&text) {
            if target.starts_with("http://")
                || target.starts_with("https://")
                || target.starts_with("mailto:")
            {
                continue;
            }
            let (file, fragment) = match target.split_once('#') {
                Some((file, fragment)) => (file, Some(fragment)),
                None => (target.as_str(), None),
            };
            let path = if file.is_empty() {
                page.clone()
            } else {
                dir.join(file)
            };
            if !path.exists() {
                broken.push(format!("{}: {target} (no such file)", page.display()));
                continue;
            }
            if let Some(fragment) = fragment {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                if !anchors(&text).contains(fragment) {
                    broken.push(format!("{}: {target} (no such heading)", page.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_is_short_with_the_two_commands_near_the_top() {
    let readme = std::fs::read_to_string(workspace_root().join("README.md")).expect("README");
    let lines: Vec<&str> = readme.lines().collect();
    assert!(lines.len() <= 300, "README has {} lines", lines.len());
    let position = |needle: &str| lines.iter().position(|l| l.contains(needle));
    for command in ["tests/demo.sh", "tests/run-all.sh"] {
        let at = position(command).unwrap_or(usize::MAX);
        assert!(
            at < 80,
            "{command} first appears on line {at} of the README"
        );
    }
    for page in [
        "configuration",
        "kubernetes",
        "cnitool",
        "performance",
        "design",
        "testing",
        "troubleshooting",
    ] {
        assert!(
            readme.contains(&format!("(docs/{page}.md")),
            "the README does not link docs/{page}.md"
        );
    }
}

#[test]
fn anchors_follow_githubs_rules() {
    assert_eq!(
        anchor(" The operator's log (every plugin)"),
        "the-operators-log-every-plugin"
    );
    assert_eq!(anchor(" `cni-installer`"), "cni-installer");
}
