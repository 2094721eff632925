//! The eager plan cache: an eager program recorded again runs its first plan, on its new
//! inputs, with its new constants and random keys; a program recorded at other lines or
//! under other settings gets its own plan.

use kiln::prelude::*;

use crate::common::{Rng, assert_close_tol};

/// `sum_j tanh((x @ w)[i, j] * lr + 1)` per row, in f64.
fn reference(x: &[f64], w: &[f64], (m, k, n): (usize, usize, usize), lr: f64) -> Vec<f64> {
    (0..m)
        .map(|i| {
            (0..n)
                .map(|j| {
                    let dot: f64 = (0..k).map(|l| x[i * k + l] * w[l * n + j]).sum();
                    (dot * lr + 1.0).tanh()
                })
                .sum()
        })
        .collect()
}

fn program(x: &Tensor, w: &Tensor, lr: f64) -> Tensor {
    (x.matmul(w) * lr + 1.0).tanh().sum_dim(1, false)
}

fn f32s(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

#[test]
fn a_repeated_eager_program_is_planned_once_and_computes_each_new_input() {
    let mut rng = Rng::new(41);
    let (m, k, n) = (5, 7, 3);
    let wv: Vec<f64> = (0..k * n).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let w = Tensor::from_vec(f32s(&wv), [k, n]);
    for round in 0..4 {
        let xv: Vec<f64> = (0..m * k).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let x = Tensor::from_vec(f32s(&xv), [m, k]);
        x.realize();
        let (got, p) = kiln::profile(|| program(&x, &w, 0.5).to_vec::<f32>());
        assert_eq!(p.plans(), usize::from(round == 0), "round {round}: {p}");
        let got: Vec<f64> = got.iter().map(|&v| f64::from(v)).collect();
        assert_close_tol(&got, &reference(&xv, &wv, (m, k, n), 0.5), 1e-5, "cached plan");
    }
}

#[test]
fn constants_that_change_are_bound_into_one_more_plan() {
    let mut rng = Rng::new(42);
    let (m, k, n) = (4, 6, 9);
    let xv: Vec<f64> = (0..m * k).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let wv: Vec<f64> = (0..k * n).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let (x, w) = (Tensor::from_vec(f32s(&xv), [m, k]), Tensor::from_vec(f32s(&wv), [k, n]));
    let mut plans = Vec::new();
    for lr in [0.5, 0.5, 0.25, 0.125, 0.0625, 0.25] {
        let (got, p) = kiln::profile(|| program(&x, &w, lr).to_vec::<f32>());
        plans.push(p.plans());
        let got: Vec<f64> = got.iter().map(|&v| f64::from(v)).collect();
        assert_close_tol(&got, &reference(&xv, &wv, (m, k, n), lr), 1e-5, &format!("lr {lr}"));
    }
    // Folded once; the same values reuse it; new values plan once more, rebindable.
    assert_eq!(plans, [1, 0, 1, 0, 0, 0]);
}

#[test]
fn random_draws_stay_fresh_and_seeded_draws_repeat() {
    let draws = || -> Vec<Vec<f32>> {
        (0..4).map(|_| (Tensor::rand([32]) * 2.0 - 1.0).to_vec::<f32>()).collect()
    };
    kiln::manual_seed(5);
    let first = draws();
    for i in 0..first.len() {
        for j in 0..i {
            assert_ne!(first[i], first[j], "draws {j} and {i} are equal");
        }
        assert!(first[i].iter().all(|v| (-1.0..1.0).contains(v)));
    }
    kiln::manual_seed(5);
    assert_eq!(draws(), first, "the same seed gives the same draws");
}

#[test]
fn the_same_program_recorded_at_another_line_has_its_own_plan() {
    let x = Tensor::from_vec(vec![0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0], [2, 3]);
    let good = Tensor::from_vec(vec![2i64, 0], [2, 1]);
    let bad = Tensor::from_vec(vec![1i64, 7], [2, 1]);
    x.realize();
    let ok = x.gather(1, &good) * 2.0;
    assert_eq!(ok.to_vec::<f32>(), [4.0, 6.0]);
    let line = line!() + 1;
    let err = (x.gather(1, &bad) * 2.0).try_to_vec::<f32>().unwrap_err();
    let kiln::Error::Runtime(run) = &err else { panic!("expected a runtime error, got {err:?}") };
    assert_eq!(run.origin.map(|o| o.line()), Some(line), "{err}");
    // The failed program's plan is kept and still runs when its indices are fixed.
    let again = (0..2).map(|_| (x.gather(1, &good) * 2.0).to_vec::<f32>()).collect::<Vec<_>>();
    assert_eq!(again, [[4.0, 6.0], [4.0, 6.0]]);
}

#[test]
fn plans_follow_the_execution_mode() {
    let x = Tensor::randn([16, 8]);
    x.realize();
    let run = || kiln::profile(|| (x.exp() * 2.0).sum().item::<f32>());
    let (fused, p) = run();
    let (unfused, q) = kiln::with_execution(kiln::Execution::Unfused, run);
    let (again, r) = run();
    assert_eq!((p.plans(), q.plans(), r.plans()), (1, 1, 0));
    assert!(q.launches() > p.launches(), "unfused runs one kernel per op:\n{q}\n{p}");
    assert!((fused - unfused).abs() <= 1e-4 * fused.abs());
    assert_eq!(fused, again);
}
