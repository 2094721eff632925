//! What autocast does to an op's operands: the policy lives here, beside the ops; the
//! thread's autocast type is [`crate::autocast`]'s.

use kiln_ir::DType;

use crate::Tensor;
use crate::autocast::autocast_dtype;

impl Tensor {
    /// An operand of a product under autocast: f32/f64 cast to the autocast type.
    #[track_caller]
    pub(crate) fn autocast_lowered(&self) -> Tensor {
        match autocast_dtype() {
            Some(low) if matches!(self.dtype(), DType::F32 | DType::F64) => self.to_dtype(low),
            _ => self.clone(),
        }
    }

    /// An input of a precision-sensitive op under autocast: 16-bit floats widened to f32.
    #[track_caller]
    pub(crate) fn autocast_widened(&self) -> Tensor {
        match autocast_dtype() {
            Some(_) if matches!(self.dtype(), DType::BF16 | DType::F16) => {
                self.to_dtype(DType::F32)
            }
            _ => self.clone(),
        }
    }
}
