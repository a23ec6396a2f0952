//! The backend conformance suite: one set of checks, run through the public
//! API against every device present. Every backend must pass it unchanged.

mod conformance {
    pub mod common;
    pub mod death;
    pub mod exhaustion;
    pub mod faults;
    pub mod memory;
    pub mod streams;
    pub mod strided;
    pub mod transfers;
}

use conformance::*;

/// Declares one `#[test]` per check, each running the check on every device present.
macro_rules! conformance_tests {
    ($($module:ident :: $check:ident),* $(,)?) => {
        $(
            #[test]
            fn $check() {
                for device in common::devices_present() {
                    $module::$check(device);
                }
            }
        )*
    };
}

conformance_tests! {
    transfers::bytes_and_f32s_round_trip,
    transfers::a_write_at_an_offset_changes_only_its_range,
    transfers::a_range_past_the_end_is_an_invalid_argument,
    transfers::a_dry_run_reservation_is_backed_on_first_use,
    transfers::a_buffer_of_another_client_is_a_device_mismatch,
    streams::work_on_one_stream_runs_in_order,
    streams::an_event_orders_work_across_streams,
    streams::independent_streams_each_finish_their_own_work,
    streams::the_empty_kernel_is_counted_once_per_launch,
    streams::freed_memory_is_reused_in_stream_order,
    strided::a_strided_copy_transposes_a_matrix,
    strided::a_declined_pattern_is_unsupported_strides_never_wrong_data,
    exhaustion::exhausting_a_small_limit_is_out_of_memory_after_one_retry,
    exhaustion::a_buffer_larger_than_the_limit_is_buffer_too_big,
    faults::a_trap_surfaces_at_the_owners_token_and_sync,
    faults::a_refused_launch_is_latched_until_its_stream_syncs,
    faults::a_batch_is_checked_before_any_of_it_runs,
    memory::compaction_moves_live_data_intact_and_handles_stay_valid,
    memory::reclaim_releases_empty_pages_and_memory_stays_usable,
    death::a_server_panic_fails_calls_in_flight_and_every_later_call,
    death::a_shut_down_server_answers_server_gone,
}

#[test]
fn opening_an_absent_device_is_unavailable_not_a_panic() {
    death::opening_an_absent_device_is_unavailable();
}
