//! Gradient mode: whether ops record autograd history on this thread.

use std::cell::Cell;
use std::marker::PhantomData;

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
}

/// Whether ops on this thread record autograd history (true unless inside [`no_grad`],
/// [`inference_mode`] or a [`NoGradGuard`]).
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(Cell::get)
}

/// Sets the gradient mode until dropped, then restores the previous one (also when a panic
/// unwinds through it). It is tied to its thread: the mode is per thread.
#[must_use = "the mode is restored when the guard is dropped"]
pub struct GradModeGuard {
    previous: bool,
    _not_send: PhantomData<*const ()>,
}

impl GradModeGuard {
    /// Sets the mode to `enabled` for the guard's lifetime.
    pub fn new(enabled: bool) -> GradModeGuard {
        let previous = GRAD_ENABLED.with(|g| g.replace(enabled));
        GradModeGuard { previous, _not_send: PhantomData }
    }
}

impl Drop for GradModeGuard {
    fn drop(&mut self) {
        GRAD_ENABLED.with(|g| g.set(self.previous));
    }
}

/// Disables gradient recording until dropped (restoring the previous mode, also on panic):
/// the guard form of [`no_grad`].
///
/// ```
/// use kiln::prelude::*;
/// let w = Tensor::ones([2]).requires_grad_(true);
/// {
///     let _guard = NoGradGuard::new();
///     assert!(!(&w * 2.0).requires_grad());
/// }
/// assert!((&w * 2.0).requires_grad());
/// ```
#[must_use = "gradients are disabled only while the guard lives"]
pub struct NoGradGuard(#[allow(dead_code, reason = "held for its Drop")] GradModeGuard);

impl NoGradGuard {
    /// Disables gradient recording until the guard is dropped.
    pub fn new() -> NoGradGuard {
        NoGradGuard(GradModeGuard::new(false))
    }
}

impl Default for NoGradGuard {
    fn default() -> NoGradGuard {
        NoGradGuard::new()
    }
}

/// The guard form of [`inference_mode`]: no autograd history until dropped.
#[must_use = "inference mode lasts only while the guard lives"]
pub struct InferenceModeGuard(#[allow(dead_code, reason = "held for its Drop")] GradModeGuard);

impl InferenceModeGuard {
    /// Enters inference mode until the guard is dropped.
    pub fn new() -> InferenceModeGuard {
        InferenceModeGuard(GradModeGuard::new(false))
    }
}

impl Default for InferenceModeGuard {
    fn default() -> InferenceModeGuard {
        InferenceModeGuard::new()
    }
}

/// Runs `f` without recording autograd history: results of ops inside do not require grad.
/// Nests, is per thread, and restores the previous mode on return or panic.
///
/// ```
/// use kiln::prelude::*;
/// let w = Tensor::ones([2]).requires_grad_(true);
/// let y = kiln::no_grad(|| &w * 2.0);
/// assert!(!y.requires_grad());
/// assert!((&w * 2.0).requires_grad());
/// ```
pub fn no_grad<T>(f: impl FnOnce() -> T) -> T {
    let _guard = NoGradGuard::new();
    f()
}

/// Runs `f` with gradient recording enabled, also inside [`no_grad`].
pub fn enable_grad<T>(f: impl FnOnce() -> T) -> T {
    let _guard = GradModeGuard::new(true);
    f()
}

/// Runs `f` for inference: no autograd history is recorded. In kiln this is [`no_grad`];
/// tensors made inside are ordinary tensors.
pub fn inference_mode<T>(f: impl FnOnce() -> T) -> T {
    no_grad(f)
}
