//! Element-wise kernels, each one definition (`ops.rs`): `out[i] ← f(inputs[i],
//! scalars)` for an expression `f`. From the definition come [`MapOp`], the
//! CPU body ([`map`]), the WGSL entry points and the CUDA kernel
//! (`table.rs`); the runtime's contract and every backend's dispatch read
//! the definition, so a new element-wise kernel is its definition and its
//! test (docs/architecture.md, "Adding a kernel").

mod table;
mod vocabulary;

use serde::{Deserialize, Serialize};

pub use table::{DEFINITIONS, MapDefinition, cuda_entries, cuda_source, wgsl_entries, wgsl_source};

use crate::KernelError;
use crate::parallel::for_each_indexed;
#[allow(unused_imports)] // what a definition's expression may call
use vocabulary::*;

/// The most scalars an element-wise kernel takes.
pub const MAX_SCALARS: usize = 4;

/// The most bindings an element-wise kernel has (a WGSL module binds six buffers).
pub const MAX_BINDINGS: usize = 6;

macro_rules! map_ops {
    ($($(#[doc = $doc:literal])* $variant:ident => $name:literal
        ($($input:ident),*) [$($scalar:ident),*] $mode:ident : $expr:expr;)*) => {
        /// Every element-wise kernel (`kernels/src/map/ops.rs`), named by
        /// its definition; serialized by position (new ones go last).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[non_exhaustive]
        pub enum MapOp {
            $($(#[doc = $doc])* $variant,)*
        }

        impl MapOp {
            /// Every element-wise kernel, in definition order.
            pub const ALL: &'static [MapOp] = &[$(MapOp::$variant,)*];

            /// Its stable snake_case name.
            pub const fn name(self) -> &'static str {
                match self {
                    $(MapOp::$variant => $name,)*
                }
            }

            /// Its CPU body over `written` (the output, or the first input
            /// when in place) and the other inputs, in order.
            #[allow(unused_variables, clippy::redundant_locals)]
            fn run(
                self,
                written: &mut [f32],
                read: &[&[f32]],
                scalars: &[f32],
            ) -> Result<(), KernelError> {
                match self {
                    $(MapOp::$variant => map_body!(
                        $mode, $name, written, read, scalars,
                        ($($input),*), [$($scalar),*], $expr
                    ),)*
                }
            }
        }
    };
}

/// One definition's CPU body: checks the lengths and the scalars, then
/// evaluates the expression element by element over pieces of `written`.
macro_rules! map_body {
    (new, $name:literal, $written:ident, $read:ident, $scalars:ident,
     ($($input:ident),*), [$($scalar:ident),*], $expr:expr) => {{
        let [$($input),*] = $read else {
            return Err(arity($name, "inputs", $read.len()));
        };
        $(KernelError::check_len(stringify!($input), $written.len(), $input.len())?;)*
        let [$($scalar),*] = $scalars else {
            return Err(arity($name, "scalars", $scalars.len()));
        };
        $(let $scalar = *$scalar;)*
        for_each_indexed($written, |start, out| {
            let len = out.len();
            $(let $input = &$input[start..start + len];)*
            for (i, out) in out.iter_mut().enumerate() {
                $(let $input = $input[i];)*
                *out = $expr;
            }
        });
        Ok(())
    }};
    (in_place, $name:literal, $written:ident, $read:ident, $scalars:ident,
     ($first:ident $(, $input:ident)*), [$($scalar:ident),*], $expr:expr) => {{
        let [$($input),*] = $read else {
            return Err(arity($name, "inputs", $read.len() + 1));
        };
        $(KernelError::check_len(stringify!($input), $written.len(), $input.len())?;)*
        let [$($scalar),*] = $scalars else {
            return Err(arity($name, "scalars", $scalars.len()));
        };
        $(let $scalar = *$scalar;)*
        for_each_indexed($written, |start, out| {
            let len = out.len();
            $(let $input = &$input[start..start + len];)*
            for (i, out) in out.iter_mut().enumerate() {
                let $first = *out;
                $(let $input = $input[i];)*
                *out = $expr;
            }
        });
        Ok(())
    }};
}

include!("ops.rs");

fn arity(name: &str, what: &str, given: usize) -> KernelError {
    KernelError::invalid(name, format!("wrong number of {what}: {given}"))
}

impl MapOp {
    /// Its definition.
    pub fn definition(self) -> &'static MapDefinition {
        // `DEFINITIONS` is made from the same list as `MapOp`, in order.
        &DEFINITIONS[self as usize]
    }

    /// The kernel with that name, if an element-wise one has it.
    pub fn from_name(name: &str) -> Option<MapOp> {
        MapOp::ALL.iter().copied().find(|op| op.name() == name)
    }
}

/// A launch's scalar arguments: up to [`MAX_SCALARS`] kept, and how many
/// were given, so that a count the kernel does not take is refused.
/// Small, so that a launch of it is no wider than other launches.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MapScalars {
    /// How many were given, up to 255 (a launch stays one word narrower).
    given: u8,
    values: [f32; MAX_SCALARS],
}

impl MapScalars {
    /// `values` as scalars (past [`MAX_SCALARS`] only counted).
    pub fn new(values: &[f32]) -> Self {
        let mut kept = [0.0; MAX_SCALARS];
        for (slot, value) in kept.iter_mut().zip(values) {
            *slot = *value;
        }
        MapScalars {
            given: u8::try_from(values.len()).unwrap_or(u8::MAX),
            values: kept,
        }
    }

    /// How many were given (255 for 255 or more).
    pub fn given(&self) -> usize {
        usize::from(self.given)
    }

    /// The values kept.
    pub fn as_slice(&self) -> &[f32] {
        &self.values[..self.given().min(MAX_SCALARS)]
    }
}

/// Runs `op` on the CPU: `written` is its output (or its first input, when
/// it writes in place), `read` its other inputs in order, each as long.
/// Wrong counts of inputs or scalars, or unequal lengths, are errors.
pub fn map(
    op: MapOp,
    written: &mut [f32],
    read: &[&[f32]],
    scalars: &[f32],
) -> Result<(), KernelError> {
    op.run(written, read, scalars)
}

#[cfg(test)]
mod tests;
