//! Loops compiled once per x86 vector unit: one `#[inline(always)]` source
//! body, and an instance of it under each `#[target_feature]`, chosen at
//! run time where the CPU has the feature. The same source rounds the same
//! way in every instance (Rust never contracts to FMA); only the lanes per
//! instruction differ.

/// Defines `fn $instance(args) [-> ret]` calling `$body(args)` compiled with
/// `$feature`, for each `$feature => $instance`. Call an instance only
/// where the CPU has its feature (`is_x86_feature_detected!`).
macro_rules! x86_instances {
    ($body:ident $args:tt; $($feature:literal => $instance:ident),+ $(,)?) => {
        $(crate::wide::x86_instances!(@one $body $args -> (); $feature => $instance);)+
    };
    ($body:ident $args:tt -> $ret:ty; $($feature:literal => $instance:ident),+ $(,)?) => {
        $(crate::wide::x86_instances!(@one $body $args -> $ret; $feature => $instance);)+
    };
    (@one $body:ident ($($arg:ident: $ty:ty),*) -> $ret:ty; $feature:literal => $instance:ident) => {
        pub(crate) fn $instance($($arg: $ty),*) -> $ret {
            #[target_feature(enable = $feature)]
            unsafe fn body($($arg: $ty),*) -> $ret {
                $body($($arg),*)
            }
            // SAFETY: chosen only where the CPU has the feature (the
            // caller's `is_x86_feature_detected!`).
            unsafe { body($($arg),*) }
        }
    };
}

/// The instances for the widest vector unit present: `avx512` where the
/// CPU has AVX-512F, else `avx2` where it has AVX2 (each also needing the
/// `with` feature, when given), else `plain`; the first two are named only
/// on x86-64.
macro_rules! widest {
    ($(with $extra:tt,)? avx512: $avx512:expr, avx2: $avx2:expr, plain: $plain:expr $(,)?) => {{
        #[cfg(target_arch = "x86_64")]
        let found = {
            let extra = true $(&& std::is_x86_feature_detected!($extra))?;
            if extra && std::is_x86_feature_detected!("avx512f") {
                Some($avx512)
            } else if extra && std::is_x86_feature_detected!("avx2") {
                Some($avx2)
            } else {
                None
            }
        };
        #[cfg(not(target_arch = "x86_64"))]
        let found = None;
        found.unwrap_or($plain)
    }};
}

pub(crate) use {widest, x86_instances};
