//! The main example's training run, shortened, must still reach its accuracy.

#[path = "../examples/common/digits.rs"]
#[allow(dead_code, reason = "the example uses parts of it that this test does not")]
mod example;

use kiln::nn::Parameters;

#[test]
fn train_digits_reaches_95_percent() {
    // The checkout this binary was built in, or (a prebuilt binary run in a copy of the
    // repository elsewhere, as scripts/gpu-check does) the working directory.
    let built = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/digits.csv.gz");
    let path = if built.exists() { built } else { std::path::PathBuf::from("data/digits.csv.gz") };
    let data = example::load(&path).expect("the bundled data set");
    assert_eq!(data.labels.numel(), 1797);
    assert_eq!(data.images.dims(), &[1797, 64]);
    let config = example::Config { epochs: 12, progress: false, ..Default::default() };
    let report = example::train(&data, &config).expect("training");
    assert!(report.test_accuracy >= 0.95, "test accuracy {}", report.test_accuracy);
    assert!(report.final_loss < 0.3, "final loss {}", report.final_loss);
    assert_eq!(report.model.num_parameters(), 64 * 128 + 128 + 128 * 128 + 128 + 128 * 10 + 10);
}
