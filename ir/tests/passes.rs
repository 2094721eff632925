//! Pass tests as text. Each `tests/passes/<pass>/<case>.graph` holds a graph in its printed
//! form (`Graph`'s `Display`, read back by `Graph::parse`), a line `---`, and the graph the
//! pass makes of it (the input again when the pass changes nothing). A line
//! `# target: cuda` plans for a GPU-like target (no one-pass log-sum-exp, reductions that
//! do not store their inputs); the default is a CPU-like one. Every pass of the standard
//! pipeline must have at least one case.

use std::path::Path;

use kiln_ir::pipeline::{Constants, Fusion, Pipeline, PlanOptions};
use kiln_ir::target::{OpCosts, Target};
use kiln_ir::{DType, Graph};

const CPU: Target = Target {
    name: "cpu",
    costs: OpCosts { transcendental: 32, division: 4, arithmetic: 1 },
    gemm_dtypes: &[DType::F32, DType::F64, DType::F16, DType::BF16],
    library_reads_views: true,
    reductions_store_inputs: true,
    fused_logsumexp: true,
    writes_in_place: true,
    custom_ops_read_views: true,
};

const CUDA: Target = Target {
    name: "cuda",
    costs: OpCosts { transcendental: 2, division: 2, arithmetic: 2 },
    gemm_dtypes: &[DType::F32, DType::F64, DType::F16, DType::BF16],
    library_reads_views: false,
    reductions_store_inputs: false,
    fused_logsumexp: false,
    writes_in_place: false,
    custom_ops_read_views: false,
};

/// The text's lines without comments and blank lines, each trimmed.
fn lines(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

#[test]
fn every_pass_does_what_its_text_cases_say() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/passes");
    let pipeline = Pipeline::default();
    let mut failures = Vec::new();
    for pass in pipeline.passes() {
        let dir = root.join(pass.name());
        let mut cases: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: no cases ({e})", dir.display()))
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "graph"))
            .collect();
        cases.sort();
        assert!(!cases.is_empty(), "{}: no .graph case", dir.display());
        for case in cases {
            let text = std::fs::read_to_string(&case).unwrap();
            let (input, expected) = text
                .split_once("\n---\n")
                .unwrap_or_else(|| panic!("{}: no `---` line", case.display()));
            let target = if text.contains("# target: cuda") { CUDA } else { CPU };
            let options = PlanOptions { fusion: Fusion::Fused, constants: Constants::Fold, target };
            let graph = Graph::parse(input)
                .unwrap_or_else(|e| panic!("{}: the input does not parse: {e}", case.display()));
            let got = match pass.run(&graph, &options) {
                Some(rewrite) => rewrite.graph.to_string(),
                None => graph.to_string(),
            };
            if lines(&got) != lines(expected) {
                failures.push(format!("{}: {} gave\n{got}", case.display(), pass.name()));
            }
            // The expected graph is itself a graph: it parses.
            Graph::parse(expected).unwrap_or_else(|e| {
                panic!("{}: the expected graph does not parse: {e}", case.display())
            });
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
