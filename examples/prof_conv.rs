use kiln::nn::functional::Conv2dOptions;
use kiln::nn::{Conv2d, Module, Parameters};
use kiln::prelude::*;
fn main() {
    let x = Tensor::randn([64, 64, 32, 32]).requires_grad_(true);
    let conv = Conv2d::new(64, 64, [3, 3], Conv2dOptions::default().padding([1, 1]));
    x.realize();
    let run = || {
        conv.zero_grad();
        x.zero_grad();
        conv.forward(&x).sum().backward();
        Tensor::try_realize_all(&[&x.grad().unwrap(), &conv.weight.grad().unwrap()]).unwrap();
    };
    run();
    let p = kiln::profile(run).1;
    println!("{p}");
}
