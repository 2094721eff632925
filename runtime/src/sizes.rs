//! When kernels are compiled size-generic, for every back end: the policy (`KILN_SIZES`),
//! what a plan knows about its program's sizes ([`Sizes`]), and the registry of kernel forms
//! each kernel cache consults before compiling (`Forms`).
//!
//! A kernel's *form* is its code up to the numbers of its walks (see
//! [`kiln_codegen::generic`]). The first kernel of a form is compiled for its sizes. When a
//! program runs again at other sizes, a kernel of a form seen before is compiled once more,
//! reading the numbers that differed (and any that earlier generic kernels of the form read)
//! when it runs; that kernel then serves every later kernel of its form whose other numbers
//! are the same, with no compile.

use std::sync::{LazyLock, Mutex, PoisonError};

use kiln_codegen::generic::{self, KernelForm};
use kiln_ir::kernel::Kernel;
use rustc_hash::FxHashMap as HashMap;

/// Whether a plan's program ran before with other sizes (the same ops, recorded at the same
/// places, over tensors of other sizes): only then are its kernels compiled size-generic, so
/// that a program whose sizes never change runs kernels specialised to them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sizes {
    /// The first plan of the program (or its sizes are the same as before).
    First,
    /// The program ran before at other sizes.
    Changed,
    /// Every kernel size-generic, with every size read when it runs (a function compiled
    /// with dynamic sizes asked for up front).
    Dynamic,
    /// Every kernel specialised to its sizes, whatever ran before.
    Static,
    /// Sizes a user marked dynamic (PyTorch's `mark_dynamic`): a kernel whose domain has a
    /// dimension of one of these sizes is compiled size-generic from the first plan, the
    /// others as under [`Sizes::Changed`] (the program may also have run before at other
    /// sizes).
    Marked(Marked),
}

/// The sizes of the dimensions a user marked dynamic in one call (at most [`Marked::MOST`];
/// sizes 0 and 1 are left out: they stay specialised, as broadcasting depends on them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Marked([usize; Marked::MOST]);

impl Marked {
    /// How many distinct sizes one call marks. Past them, later sizes are found as in
    /// [`Sizes::Changed`] (a compile at the second size, then none).
    pub const MOST: usize = 8;

    /// The marked sizes `sizes` (repeats, 0 and 1 dropped), or `None` when none is left.
    pub fn new(sizes: impl IntoIterator<Item = usize>) -> Option<Marked> {
        let mut kept = [0; Marked::MOST];
        let mut n = 0;
        for size in sizes {
            if size > 1 && n < Marked::MOST && !kept[..n].contains(&size) {
                kept[n] = size;
                n += 1;
            }
        }
        (n > 0).then_some(Marked(kept))
    }

    /// The marked sizes.
    pub fn sizes(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().copied().take_while(|&s| s != 0)
    }

    /// Whether `kernel` runs over a marked size: a dimension of its domain is one. (A
    /// dimension that only equals a marked size by chance makes a kernel generic that need
    /// not be; one that depends on a marked size without being it, as a flattened domain,
    /// is found when the size changes, as in [`Sizes::Changed`]. Either way the kernel
    /// computes the same values.)
    pub(crate) fn touches(&self, kernel: &Kernel) -> bool {
        kernel.shape.dims().iter().any(|d| self.sizes().any(|s| s == *d))
    }
}

/// When kernels are compiled size-generic (`KILN_SIZES`), on the CPU and on GPUs alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizePolicy {
    /// A kernel is compiled for its sizes. When a program runs again at other sizes (a
    /// ragged last batch, the next sequence length: [`Sizes::Changed`]), a kernel of a form
    /// compiled before (the same code up to its sizes, strides and offsets) is compiled once
    /// more, reading the numbers that differed when it runs, and serves every later size of
    /// its form. Kernels whose sizes did not change keep their specialised code, and a
    /// program whose sizes never change runs only specialised kernels.
    Auto,
    /// Every kernel is compiled for its sizes.
    Specialize,
    /// Every kernel is compiled size-generic (to test the generic code on every kernel).
    Generic,
}

static POLICY: LazyLock<Mutex<SizePolicy>> = LazyLock::new(|| {
    let text = kiln_ir::settings::Setting::Sizes.text();
    let policy = match text.as_deref().map(str::trim) {
        None | Some("" | "auto") => SizePolicy::Auto,
        Some("specialize") => SizePolicy::Specialize,
        Some("generic") => SizePolicy::Generic,
        Some(other) => {
            eprintln!(
                "kiln: KILN_SIZES={other:?} is not `auto`, `specialize` or `generic`; using `auto`"
            );
            SizePolicy::Auto
        }
    };
    Mutex::new(policy)
});

/// The policy in force.
pub fn size_policy() -> SizePolicy {
    *POLICY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Sets the policy for the kernels compiled from now on (every thread, every device),
/// returning the previous one.
pub fn set_size_policy(policy: SizePolicy) -> SizePolicy {
    std::mem::replace(&mut *POLICY.lock().unwrap_or_else(PoisonError::into_inner), policy)
}

/// Whether a plan whose program's sizes are `sizes` takes a kernel its cache holds for the
/// exact kernel `kernel`, `generic` or not. A plan that runs kernels specialised to its sizes
/// only (under the policy in force) does not take a size-generic one (linked there when
/// another program came back at other sizes): it compiles the specialised kernel, so that a
/// program whose sizes never change runs the same code whatever ran before it in the
/// process. Likewise a kernel over a size marked dynamic ([`Sizes::Marked`]) does not take a
/// specialised one: it is compiled generic, so that the marked size's next value compiles
/// nothing.
pub(crate) fn reuses(generic: bool, sizes: Sizes, kernel: &Kernel) -> bool {
    let policy = size_policy();
    let specialised_only = match (policy, sizes) {
        (SizePolicy::Specialize, _) | (SizePolicy::Auto, Sizes::First | Sizes::Static) => true,
        (SizePolicy::Generic, _)
        | (SizePolicy::Auto, Sizes::Changed | Sizes::Dynamic | Sizes::Marked(_)) => false,
    };
    let generic_only =
        policy != SizePolicy::Specialize && matches!(sizes, Sizes::Marked(m) if m.touches(kernel));
    if generic { !specialised_only } else { !generic_only }
}

/// What a kernel cache does with a kernel it does not hold.
pub(crate) enum Decision<K> {
    /// A generic kernel compiled before runs it: link it, compile nothing.
    Serve(K),
    /// Compile it, reading the numbers `Ask::marks` marks when it runs (none: specialised);
    /// hand the result to [`Forms::record`].
    Compile(Box<Ask>),
}

/// A compile the registry asked for.
pub(crate) struct Ask {
    /// Which of the kernel's numbers ([`generic::numbers`]' order) the code reads when it
    /// runs; empty or all `false` for a kernel specialised to its sizes.
    pub(crate) marks: Vec<bool>,
    /// The kernel's form and numbers, when the registry tracks it.
    seen: Option<(KernelForm, Vec<i64>)>,
}

/// A kernel form's compiles: the numbers of the first kernel compiled for its sizes, and
/// the size-generic kernels compiled since.
struct Form<K> {
    first: Vec<i64>,
    generic: Vec<Generic<K>>,
}

/// A size-generic kernel: which numbers it reads when it runs, and the others' values.
struct Generic<K> {
    marks: Vec<bool>,
    numbers: Vec<i64>,
    kernel: K,
}

/// The kernel forms one kernel cache has compiled (cleared when it holds as many as the
/// kernel cache may), with their generic kernels.
pub(crate) struct Forms<K> {
    forms: HashMap<KernelForm, Form<K>>,
}

impl<K> Default for Forms<K> {
    fn default() -> Forms<K> {
        Forms { forms: HashMap::default() }
    }
}

impl<K: Clone> Forms<K> {
    /// What to do with `kernel` (of the target's `form`) in a plan whose program's sizes
    /// are `sizes`, under the policy in force.
    pub(crate) fn decide(
        &mut self,
        kernel: &Kernel,
        form: fn(&Kernel) -> KernelForm,
        sizes: Sizes,
    ) -> Decision<K> {
        // `KILN_SIZES=specialize|generic` (tests of the generic code) overrides the plan's ask.
        let policy = match (size_policy(), sizes) {
            (SizePolicy::Auto, Sizes::Dynamic) => SizePolicy::Generic,
            (SizePolicy::Auto, Sizes::Static) => SizePolicy::Specialize,
            (policy, _) => policy,
        };
        if policy == SizePolicy::Specialize {
            return Decision::Compile(Box::new(Ask { marks: Vec::new(), seen: None }));
        }
        let (form, numbers) = (form(kernel), generic::numbers(kernel));
        let mut marks = Vec::new();
        let generic_ok =
            policy == SizePolicy::Generic || matches!(sizes, Sizes::Changed | Sizes::Marked(_));
        match self.forms.get(&form) {
            Some(seen) if generic_ok => {
                let serving =
                    seen.generic.iter().find(|g| generic::serves(&g.marks, &g.numbers, &numbers));
                if let Some(g) = serving {
                    return Decision::Serve(g.kernel.clone());
                }
                let before = seen.generic.iter().fold(vec![false; numbers.len()], |mut m, g| {
                    m.iter_mut().zip(&g.marks).for_each(|(a, &b)| *a |= b);
                    m
                });
                marks = generic::dynamic_marks(&seen.first, &numbers, &before);
            }
            Some(_) => {}
            None => {
                if self.forms.len() >= crate::cache::limits().kernels {
                    self.forms.clear();
                }
                self.forms
                    .insert(form.clone(), Form { first: numbers.clone(), generic: Vec::new() });
            }
        }
        let marked = matches!(sizes, Sizes::Marked(m) if m.touches(kernel));
        if policy == SizePolicy::Generic || marked {
            marks = generic::generic_marks(kernel);
        }
        Decision::Compile(Box::new(Ask { marks, seen: Some((form, numbers)) }))
    }

    /// Keeps `kernel`, compiled as `ask` asked, to serve later kernels of its form when it
    /// is generic.
    pub(crate) fn record(&mut self, ask: Box<Ask>, kernel: K) {
        let ask = *ask;
        let (Some((form, numbers)), true) = (ask.seen, generic::is_generic(&ask.marks)) else {
            return;
        };
        let seen = self
            .forms
            .entry(form)
            .or_insert_with(|| Form { first: numbers.clone(), generic: Vec::new() });
        seen.generic.push(Generic { marks: ask.marks, numbers, kernel });
    }
}
