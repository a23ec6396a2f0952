//! For tests: a kernel's parameter list as the build-time PTX declares it,
//! to hold against the arguments the host packs for it.

use super::launch::Arg;

/// The PTX types of kernel `name`'s parameters, in order (empty when the
/// PTX has no such kernel).
pub(super) fn parameters<'a>(ptx: &'a str, name: &str) -> Vec<&'a str> {
    let header = format!(".entry {name}(");
    let Some(start) = ptx.find(&header) else {
        return Vec::new();
    };
    ptx[start..]
        .lines()
        .skip(1)
        .take_while(|line| line.trim_start().starts_with(".param"))
        .filter_map(|line| line.split_whitespace().nth(1))
        .collect()
}

/// The PTX type a packed argument fills.
pub(super) fn ptx_type(arg: &Arg) -> &'static str {
    match arg {
        Arg::Pointer(_) | Arg::U64(_) => ".u64",
        Arg::F32(_) => ".f32",
        Arg::F64(_) => ".f64",
        Arg::I32(_) | Arg::U32(_) => ".u32",
    }
}
