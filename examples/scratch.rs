use kiln::prelude::*;
fn main() {
    let x = Tensor::randn([256, 256]);
    x.realize();
    let (_, fused) = kiln::profile(|| ((&x * 2.0).exp() + 1.0).sum_dim(1, false).realize().clone());
    println!("{fused}");
}
