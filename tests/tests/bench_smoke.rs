//! The benchmarks (`tests/bench/run.sh`, `portmap.sh`) at their smoke scale, once each:
//! they must finish, write their CSV files, chart and figures with every suite, scenario
//! and judged figure in them, see no failed plugin call, and leave no namespace or
//! temporary file behind.
//!
//! They run on the debug binaries the harness builds (`BENCH_OURS_DIR`), whose timings
//! and size mean nothing, so the judging is skipped (`BENCH_JUDGE=0`) and nothing here
//! asserts on time: `tests/bench/check.sh --smoke`, which the test command runs after
//! `cargo test`, judges the release build. What this test adds is that every figure
//! `tests/bench/targets.toml` judges is still measured, so a benchmark that stopped
//! measuring one fails here first. `TMPDIR` and the namespace tag are this test's own, so
//! "nothing left" is checked exactly.

use std::collections::BTreeSet;
use std::process::Command;

use cni_blackbox::{TempDir, bin_dir, require_root, unique_name, workspace_root};

fn netns_names(prefix: &str) -> BTreeSet<String> {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run ip netns list: {e}"));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(prefix))
        .map(str::to_owned)
        .collect()
}

/// Rows of a CSV file the driver wrote (plain comma-separated, no quoted commas in it).
fn csv_rows(path: &std::path::Path) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.lines()
        .map(|l| l.split(',').map(str::to_owned).collect())
        .collect()
}

/// The figures `tests/bench/targets.toml` judges for `bench` (its `[<bench>.<figure>]`
/// tables), as `<bench>.<figure>`.
fn judged_figures(bench: &str) -> Vec<String> {
    let path = workspace_root().join("tests/bench/targets.toml");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let prefix = format!("[{bench}.");
    text.lines()
        .filter_map(|l| l.trim().strip_prefix(&prefix)?.strip_suffix(']'))
        .map(|figure| format!("{bench}.{figure}"))
        .collect()
}

/// Asserts that the benchmark wrote a finite value for every figure targets.toml judges.
fn assert_every_figure_measured(out_dir: &std::path::Path, bench: &str) {
    let path = out_dir.join("figures").join(format!("{bench}.tsv"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let measured: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| {
            let (name, value) = l.split_once('\t')?;
            value.parse::<f64>().ok()?.is_finite().then_some(name)
        })
        .collect();
    let judged = judged_figures(bench);
    assert!(!judged.is_empty(), "no [{bench}.*] targets");
    let missing: Vec<&String> = judged
        .iter()
        .filter(|f| !measured.contains(f.as_str()))
        .collect();
    assert!(missing.is_empty(), "not measured: {missing:?} in:\n{text}");
}

#[test]
fn quick_benchmark_completes_and_writes_its_csv() {
    if !require_root() {
        return;
    }
    let bins = bin_dir();
    let tmp = TempDir::new("cnibb-bench-tmp");
    let out_dir = TempDir::new("cnibb-bench-out");
    // Short: the driver prefixes every pod netns with the tag and a suite and pod number.
    let tag = unique_name("cbs").replace('-', "");
    let script = workspace_root().join("tests/bench/run.sh");
    let out = Command::new("bash")
        .arg(&script)
        .env("BENCH_SMOKE", "1")
        // Fewer rounds than check.sh's smoke run: only completeness is checked here.
        .env("BENCH_ROUNDS", "2")
        .env("BENCH_PODS", "1")
        .env("BENCH_JUDGE", "0")
        .env_remove("BENCH_ONLY")
        .env("BENCH_OURS_DIR", bins)
        .env("BENCH_OUT", out_dir.path())
        .env("BENCH_TAG", &tag)
        .env("TMPDIR", tmp.path())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} failed ({}):\n{stdout}\n{stderr}",
        script.display(),
        out.status
    );
    assert!(
        stdout.contains("| scenario | op | ours p50"),
        "no table:\n{stdout}"
    );

    let summary = csv_rows(&out_dir.path().join("summary.csv"));
    assert_eq!(
        summary.first().map(|h| h[..3].join(",")),
        Some("scenario,op,suite".to_owned()),
        "{summary:?}"
    );
    let errors: Vec<_> = summary.iter().filter(|r| r[1] == "errors").collect();
    assert!(
        errors.is_empty(),
        "failed plugin calls: {errors:?}\n{stderr}"
    );
    for (scenario, suites) in [
        ("ipv4", &["ours", "ref", "floor"][..]),
        ("dual-stack", &["ours", "ref", "floor"]),
        ("ipMasq iptables", &["ours", "ref", "floor"]),
        ("ipMasq nftables", &["ours", "floor"]),
    ] {
        for suite in suites {
            for op in ["ADD", "DEL"] {
                assert!(
                    summary
                        .iter()
                        .any(|r| r[0] == scenario && r[1] == op && r[2] == *suite),
                    "no {scenario}/{op}/{suite} row in {summary:?}"
                );
            }
        }
        assert!(
            summary
                .iter()
                .any(|r| r[0] == scenario && r[1] == "CHECK" && r[2] == "ours"),
            "no {scenario}/CHECK/ours row"
        );
    }

    let concurrent = csv_rows(&out_dir.path().join("concurrent.csv"));
    assert_eq!(concurrent.len(), 3, "header + ours + ref: {concurrent:?}");
    for row in &concurrent[1..] {
        // suite,pods,width,add_wall_s,del_wall_s,errors,duplicates,veths_left
        assert_eq!(&row[5..], ["0", "0", "0"], "concurrent run: {row:?}");
    }
    let sizes = csv_rows(&out_dir.path().join("sizes.csv"));
    assert_eq!(sizes.len(), 7, "header + 3 binaries x 2 suites: {sizes:?}");
    let column = |name: &str| {
        sizes[0]
            .iter()
            .position(|c| c == name)
            .unwrap_or_else(|| panic!("no {name} column in {:?}", sizes[0]))
    };
    let (rss, errors) = (column("peak_rss_kib"), column("errors"));
    for row in &sizes[1..] {
        assert_eq!(row[errors], "0", "a call under GNU time failed: {row:?}");
        assert!(row[rss].parse::<u64>().is_ok_and(|k| k > 0), "{row:?}");
    }
    // Ours ship as one multi-call file under three names.
    let same = column("same_file_as");
    let ours_same: Vec<&str> = sizes[1..]
        .iter()
        .filter(|r| r[0] == "ours")
        .map(|r| r[same].as_str())
        .collect();
    assert_eq!(ours_same, ["", "bridge", "bridge"], "{sizes:?}");
    let png = std::fs::metadata(out_dir.path().join("bench.png"))
        .unwrap_or_else(|e| panic!("no chart: {e}"));
    assert!(png.len() > 1000, "chart of {} bytes", png.len());
    assert_every_figure_measured(out_dir.path(), "plugins");

    let left = netns_names(&tag);
    assert!(left.is_empty(), "namespaces left: {left:?}");
    let files: Vec<_> = std::fs::read_dir(tmp.path())
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(files.is_empty(), "temporary files left: {files:?}");
}

/// The portmap benchmark (`tests/bench/portmap.sh`) at its smoke scale: every suite
/// (ours on both backends, the reference; TCP and TCP+UDP host ports) in the table, no
/// failed call, no namespace left.
#[test]
fn quick_portmap_benchmark_completes() {
    if !require_root() {
        return;
    }
    let tag = unique_name("cps").replace('-', "");
    let out_dir = TempDir::new("cnibb-bench-pm-out");
    let script = workspace_root().join("tests/bench/portmap.sh");
    let out = Command::new("bash")
        .arg(&script)
        .env("BENCH_SMOKE", "1")
        .env("BENCH_ROUNDS", "1")
        .env("BENCH_PODS", "3")
        .env("BENCH_JUDGE", "0")
        .env("BENCH_OUT", out_dir.path())
        .env("BENCH_OURS_DIR", bin_dir())
        .env("BENCH_TAG", &tag)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} failed ({}):\n{stdout}\n{stderr}",
        script.display(),
        out.status
    );
    for op in ["ADD", "CHECK", "DEL"] {
        for suite in ["ours iptables", "ref iptables", "ours nftables"] {
            for ports in ["tcp", "tcp+udp"] {
                let row = format!("| {op} | {suite} {ports} | 3 |");
                assert!(stdout.contains(&row), "no {row:?} in:\n{stdout}");
            }
        }
    }
    assert!(
        stdout.contains("| ADD | ours no mappings | 3 |"),
        "no floor row in:\n{stdout}"
    );
    assert_every_figure_measured(out_dir.path(), "portmap");
    let left = netns_names(&tag);
    assert!(left.is_empty(), "namespaces left: {left:?}");
}
