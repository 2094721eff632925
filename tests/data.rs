//! `kiln::data`: every example once per epoch, determinism under a seed, collation.

use kiln::data::{Collate, DataLoader, Dataset, TensorDataset};
use kiln::prelude::*;

fn indexed(n: usize) -> TensorDataset {
    // Row i of the features holds i and -i; the label is i.
    let feats: Vec<i64> = (0..n as i64).flat_map(|i| [i, -i]).collect();
    TensorDataset::new(vec![Tensor::from_vec(feats, [n, 2]), Tensor::arange(0i64, n as i64, 1)])
        .expect("dataset")
}

fn epoch(loader: &DataLoader<'_, TensorDataset>) -> Vec<Vec<i64>> {
    loader
        .iter()
        .map(|b| {
            let b = b.expect("batch");
            let feats = b[0].to_vec::<i64>();
            let labels = b[1].to_vec::<i64>();
            // Fields stay aligned: the features of each row belong to its label.
            for (k, &l) in labels.iter().enumerate() {
                assert_eq!((feats[2 * k], feats[2 * k + 1]), (l, -l));
            }
            labels
        })
        .collect()
}

#[test]
fn every_index_once_per_epoch() {
    for (n, batch, drop_last, shuffle) in [
        (10, 3, false, false),
        (10, 3, false, true),
        (10, 3, true, true),
        (7, 7, true, true),
        (5, 8, false, true),
    ] {
        let data = indexed(n);
        let mut loader = DataLoader::new(&data, batch).drop_last(drop_last);
        if shuffle {
            loader = loader.shuffle(42);
        }
        let want_batches = if drop_last { n / batch } else { n.div_ceil(batch) };
        assert_eq!(loader.len(), want_batches);
        let mut orders = Vec::new();
        for _ in 0..3 {
            let batches = epoch(&loader);
            assert_eq!(batches.len(), want_batches);
            assert!(
                batches.iter().all(|b| b.len() == batch || (!drop_last && b.len() == n % batch))
            );
            let mut seen: Vec<i64> = batches.concat();
            orders.push(seen.clone());
            seen.sort_unstable();
            if drop_last {
                seen.dedup();
                assert_eq!(seen.len(), want_batches * batch, "no repeats");
            } else {
                assert_eq!(seen, (0..n as i64).collect::<Vec<_>>(), "n {n} batch {batch}");
            }
        }
        if shuffle && n > 5 {
            assert_ne!(orders[0], orders[1], "a new order each epoch");
        }
        if !shuffle {
            assert_eq!(orders[0], (0..n as i64).collect::<Vec<_>>());
        }
    }
}

#[test]
fn shuffling_is_deterministic_under_a_seed() {
    let data = indexed(100);
    let run = |seed| {
        let loader = DataLoader::new(&data, 16).shuffle(seed);
        (0..3).map(|_| epoch(&loader).concat()).collect::<Vec<_>>()
    };
    assert_eq!(run(1), run(1));
    assert_ne!(run(1), run(2));
    let loader = DataLoader::new(&data, 16).shuffle(1);
    let peek = loader.next_order();
    assert_eq!(peek.iter().map(|&i| i as i64).collect::<Vec<_>>(), epoch(&loader).concat());
}

/// A dataset that builds its examples on demand, collated by the default `get_batch`.
struct Squares;

impl Dataset for Squares {
    type Item = (Tensor, Tensor);
    fn len(&self) -> usize {
        5
    }
    fn get(&self, index: usize) -> kiln::Result<(Tensor, Tensor)> {
        let x = index as f32;
        Ok((Tensor::from_vec(vec![x, x + 0.5], [2]), Tensor::scalar(x * x)))
    }
}

#[test]
fn custom_datasets_collate_their_items() {
    let loader = DataLoader::new(&Squares, 2);
    let batches: Vec<(Tensor, Tensor)> =
        loader.iter().collect::<kiln::Result<_>>().expect("batches");
    assert_eq!(batches.len(), 3);
    assert_eq!(batches[0].0.dims(), &[2, 2]);
    assert_eq!(batches[0].0.to_vec::<f32>(), vec![0.0, 0.5, 1.0, 1.5]);
    assert_eq!(batches[2].1.to_vec::<f32>(), vec![16.0]);
    let e = Tensor::collate(vec![Tensor::zeros([2]), Tensor::zeros([3])]).unwrap_err();
    assert!(matches!(e, kiln::Error::Shape { .. }), "{e}");
    assert!(Tensor::collate(Vec::new()).is_err());
}

#[test]
fn tensor_dataset_checks_its_tensors() {
    let e = TensorDataset::new(vec![Tensor::zeros([3, 2]), Tensor::zeros([4])]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "TensorDataset::new: every tensor needs the same first dimension (the example index); got shapes [3, 2], [4]"
    );
    let data = indexed(4);
    assert_eq!(data.len(), 4);
    assert_eq!(data.get(3).expect("get")[1].item::<i64>(), 3);
    assert!(matches!(data.get(4), Err(kiln::Error::Index { .. })));
    assert!(matches!(data.get_batch(&[1, 9]), Err(kiln::Error::Index { .. })));
}

#[test]
fn a_batch_size_of_zero_is_an_error() {
    let x = Tensor::zeros([4, 2]);
    let data = kiln::data::TensorDataset::new(vec![x]).expect("a dataset");
    let err = kiln::data::DataLoader::try_new(&data, 0).unwrap_err().to_string();
    assert!(err.starts_with("DataLoader: batch_size must be at least 1"), "{err}");
}
