//! The main example's training run, shortened, must still reach its accuracy.

#[path = "../examples/common/digits.rs"]
#[allow(dead_code, reason = "the example uses parts of it that this test does not")]
mod example;

use kiln::nn::Parameters;

#[test]
fn train_digits_reaches_95_percent() {
    let data =
        example::load(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/digits.csv.gz"))
            .expect("the bundled data set");
    assert_eq!(data.labels.numel(), 1797);
    assert_eq!(data.images.dims(), &[1797, 64]);
    let config = example::Config { epochs: 12, progress: false, ..Default::default() };
    let report = example::train(&data, &config).expect("training");
    assert!(report.test_accuracy >= 0.95, "test accuracy {}", report.test_accuracy);
    assert!(report.final_loss < 0.3, "final loss {}", report.final_loss);
    assert_eq!(report.model.num_parameters(), 64 * 128 + 128 + 128 * 128 + 128 + 128 * 10 + 10);
}
