//! The result rows of the benchmark examples, printed as a table or as JSON lines.

/// One measurement.
pub(crate) struct Row {
    /// `W1`, `copy`, ...
    pub(crate) workload: String,
    /// `fused`, `unfused`, `reference`, `plain_rust`, `ceiling`, ...
    pub(crate) variant: &'static str,
    /// Median wall time.
    pub(crate) ms: f64,
    /// Bytes read plus bytes written once, per second.
    pub(crate) gbps: Option<f64>,
    /// For products.
    pub(crate) gflops: Option<f64>,
}

/// Prints `rows`: one JSON object per line (with `extra` fields appended, e.g.
/// `"device":"..."`), or an aligned table.
pub(crate) fn print(rows: &[Row], json: bool, extra: &str) {
    if json {
        for r in rows {
            let mut line = format!(
                "{{\"workload\":\"{}\",\"variant\":\"{}\",\"median_ms\":{:.4}",
                r.workload, r.variant, r.ms
            );
            if let Some(g) = r.gbps {
                line += &format!(",\"gbps\":{g:.3}");
            }
            if let Some(g) = r.gflops {
                line += &format!(",\"gflops\":{g:.3}");
            }
            if !extra.is_empty() {
                line += &format!(",{extra}");
            }
            println!("{line}}}");
        }
        return;
    }
    let width = rows.iter().map(|r| r.workload.chars().count()).max().unwrap_or(8).max(8);
    println!(
        "{:<width$} {:<11} {:>11} {:>9} {:>9}",
        "workload", "variant", "median ms", "GB/s", "GFLOP/s"
    );
    for r in rows {
        let g = r.gbps.map_or(String::new(), |g| format!("{g:.2}"));
        let f = r.gflops.map_or(String::new(), |f| format!("{f:.1}"));
        println!("{:<width$} {:<11} {:>11.3} {:>9} {:>9}", r.workload, r.variant, r.ms, g, f);
    }
}
