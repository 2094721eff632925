//! Which line of the user's program an op is recorded at.
//!
//! Every recording reads `Location::caller()` through `#[track_caller]` chains. A chain
//! ends at the first function without the attribute and at every closure, so library code
//! made of other ops (a loss, a layer's forward, an optimizer's update) could name one of
//! kiln's own lines. Such code marks its entry with [`enter`]: while the guard lives, an op
//! whose caller chain ends inside kiln names the line that called the library instead.
//! Entries made from inside kiln (one library function calling another) keep the user's
//! line; entries made from user code replace it, so a custom module that calls
//! `cross_entropy` names its own line even when a `Sequential` runs it.

use std::cell::Cell;
use std::panic::Location;

thread_local! {
    static ENTRY: Cell<Option<&'static Location<'static>>> = const { Cell::new(None) };
}

/// Whether `location` is a line of kiln's own source (this crate's `src/`).
fn in_kiln(location: &Location<'_>) -> bool {
    // This file is `<crate>/src/engine/origin.rs`: the crate's `src/` is two levels up.
    let here = file!();
    let root = &here[..here.len() - "engine/origin.rs".len()];
    location.file().starts_with(root)
}

/// Marks the user's call site for the ops a library function records; restores the
/// previous one when dropped.
pub(crate) struct CallerGuard {
    previous: Option<&'static Location<'static>>,
}

impl Drop for CallerGuard {
    fn drop(&mut self) {
        ENTRY.with(|e| e.set(self.previous));
    }
}

/// Marks the caller's line, when it is the user's, as the origin of the ops recorded until
/// the guard drops.
#[track_caller]
pub(crate) fn enter() -> CallerGuard {
    let here = Location::caller();
    let previous = ENTRY.with(|e| {
        let previous = e.get();
        if !in_kiln(here) {
            e.set(Some(here));
        }
        previous
    });
    CallerGuard { previous }
}

/// The line an op being recorded now comes from: the caller, through `#[track_caller]`,
/// unless that chain ended inside kiln; then the line that entered the library.
#[track_caller]
pub(crate) fn caller() -> &'static Location<'static> {
    let here = Location::caller();
    if in_kiln(here) { ENTRY.with(Cell::get).unwrap_or(here) } else { here }
}
