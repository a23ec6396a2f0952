//! Kernel launches as the server receives them: which kernel, what it binds,
//! and its arguments.
//!
//! Each kernel declares its signature (the access of each binding, its
//! element size, its argument kind), so the server checks every launch the
//! same way before anything runs. New kernels add a variant here and a body
//! in each backend.

use serde::{Deserialize, Serialize};

use crate::command::BufferRef;

/// A kernel every backend provides.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Kernel {
    /// Writes `KernelArgs::Fill { value }` to every `f32` of its one binding.
    Fill,
    /// Copies its first binding's bytes to its second.
    Copy,
    /// Copies `f32`s from its first binding to its second (the recovery probe's kernel).
    Identity,
    /// Does nothing but count one run on the device (benchmarks prove it ran).
    Empty,
    /// Faults on the device, as a hardware trap does: poisons the context (tests).
    Trap,
}

/// How a kernel uses one binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Access {
    /// Only read.
    Read,
    /// Written (and possibly read): may not overlap any other binding.
    Write,
}

impl Kernel {
    /// The kernel's name, as errors and traces show it.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Fill => "fill",
            Kernel::Copy => "copy",
            Kernel::Identity => "identity",
            Kernel::Empty => "empty",
            Kernel::Trap => "trap",
        }
    }

    /// The kernel's entry in the `cistern-kernels` catalogue.
    pub fn id(self) -> cistern_kernels::KernelId {
        use cistern_kernels::KernelId;
        match self {
            Kernel::Fill => KernelId::Fill,
            Kernel::Copy => KernelId::Copy,
            Kernel::Identity => KernelId::Identity,
            Kernel::Empty => KernelId::Empty,
            Kernel::Trap => KernelId::Trap,
        }
    }

    /// The access of each binding, in order.
    pub fn signature(self) -> &'static [Access] {
        match self {
            Kernel::Fill => &[Access::Write],
            Kernel::Copy | Kernel::Identity => &[Access::Read, Access::Write],
            Kernel::Empty | Kernel::Trap => &[],
        }
    }

    /// Bytes per element: every binding's offset and size are multiples of it.
    pub fn element_size(self) -> u64 {
        match self {
            Kernel::Fill | Kernel::Identity => 4,
            Kernel::Copy | Kernel::Empty | Kernel::Trap => 1,
        }
    }

    /// Whether `args` are the kind of arguments this kernel takes.
    pub fn accepts(self, args: &KernelArgs) -> bool {
        matches!(
            (self, args),
            (Kernel::Fill, KernelArgs::Fill { .. })
                | (
                    Kernel::Copy | Kernel::Identity | Kernel::Empty | Kernel::Trap,
                    KernelArgs::None
                )
        )
    }

    /// Whether every binding must have the same size (element-wise kernels).
    pub fn needs_equal_sizes(self) -> bool {
        matches!(self, Kernel::Copy | Kernel::Identity)
    }
}

/// A kernel's scalar arguments, typed per kernel family.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum KernelArgs {
    /// No arguments.
    None,
    /// The value `Fill` writes.
    Fill {
        /// The value.
        value: f32,
    },
}

/// A byte range of an allocation that a kernel binds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Binding {
    /// The allocation.
    pub buffer: BufferRef,
    /// First byte bound, from the allocation's start.
    pub offset: u64,
    /// Bytes bound.
    pub size: u64,
}

/// One kernel call: the server checks it (bindings against the kernel's
/// signature, sizes, alignment, aliasing) before anything runs, and answers
/// `InvalidProgram` for a malformed one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelLaunch {
    /// The kernel.
    pub kernel: Kernel,
    /// Its bindings, in the order of its signature.
    pub bindings: Vec<Binding>,
    /// Its arguments.
    pub args: KernelArgs,
}

impl KernelLaunch {
    /// `Fill`: every `f32` of `target` becomes `value`.
    pub fn fill(target: Binding, value: f32) -> Self {
        KernelLaunch {
            kernel: Kernel::Fill,
            bindings: vec![target],
            args: KernelArgs::Fill { value },
        }
    }

    /// `Copy`: `source`'s bytes to `target`.
    pub fn copy(source: Binding, target: Binding) -> Self {
        KernelLaunch {
            kernel: Kernel::Copy,
            bindings: vec![source, target],
            args: KernelArgs::None,
        }
    }

    /// `Identity`: `source`'s `f32`s to `target`.
    pub fn identity(source: Binding, target: Binding) -> Self {
        KernelLaunch {
            kernel: Kernel::Identity,
            bindings: vec![source, target],
            args: KernelArgs::None,
        }
    }

    /// `Empty`: a launch that does nothing but count one run.
    pub fn empty() -> Self {
        KernelLaunch {
            kernel: Kernel::Empty,
            bindings: Vec::new(),
            args: KernelArgs::None,
        }
    }

    /// `Trap`: a launch that faults on the device and poisons its context.
    pub fn trap() -> Self {
        KernelLaunch {
            kernel: Kernel::Trap,
            bindings: Vec::new(),
            args: KernelArgs::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kernel_is_named_as_in_the_catalogue() {
        for kernel in [
            Kernel::Fill,
            Kernel::Copy,
            Kernel::Identity,
            Kernel::Empty,
            Kernel::Trap,
        ] {
            assert_eq!(kernel.name(), kernel.id().name());
        }
    }
}
