use kiln::nn::functional::Conv2dOptions;
use kiln::nn::{Conv2d, Module};
use kiln::prelude::*;
fn main() {
    let x = Tensor::randn([2, 4, 6, 6]).requires_grad_(true);
    let mut conv = Conv2d::new(4, 4, [3, 3], Conv2dOptions::default().padding([1, 1]));
    conv.bias = None;
    x.realize();
    conv.forward(&x).sum().backward();
}
