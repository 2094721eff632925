use kiln::prelude::*;
fn main() {
    let x = Tensor::randn([1 << 24]);
    x.realize();
    for (name, f) in [("relu", (|x: &Tensor| x.relu()) as fn(&Tensor) -> Tensor), ("sqrt", |x| x.abs().sqrt()), ("exp", |x| x.exp()), ("sigmoid", |x| x.sigmoid()), ("tanh", |x| x.tanh()), ("poly", |x| ((((x * 1.1 + 0.3) * x + 0.2) * x + 0.1) * x + 0.5) * x)] {
        let mut v = vec![];
        for _ in 0..5 {
            let t = std::time::Instant::now();
            f(&x).realize();
            v.push(t.elapsed().as_secs_f64() * 1e3);
        }
        v.sort_by(f64::total_cmp);
        println!("{name}: {:.2} ms", v[2]);
    }
}
