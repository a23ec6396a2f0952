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

pub(crate) use x86_instances;
