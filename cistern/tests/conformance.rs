//! The backend conformance suite: one set of checks, run through the public
//! API against every device present. Every backend must pass it unchanged.

mod conformance {
    pub mod broadcast;
    pub mod capture;
    pub mod capture_faults;
    pub mod classify;
    pub mod common;
    pub mod death;
    pub mod exhaustion;
    pub mod faults;
    pub mod kernels;
    pub mod kernels_bindings;
    pub mod large;
    pub mod layers;
    pub mod max;
    pub mod memory;
    pub mod optim;
    pub mod optim_amp;
    pub mod optim_reference;
    pub mod ordering;
    pub mod recovery;
    pub mod step_graph;
    pub mod store;
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
    large::kernels_over_more_than_the_largest_storage_binding_cover_every_element,
    store::every_optimizer_family_through_the_store_matches_the_reference,
    store::the_device_chain_step_matches_the_tape_and_step,
    store::a_resident_datasets_steps_draw_the_cpus_rows,
    store::the_device_chain_prediction_matches_the_tape_forward,
    store::a_trapped_step_latches_the_store_and_nothing_of_it_is_readable,
    store::the_tapes_gradients_match_the_cpus,
    store::the_stores_device_amp_step_matches_the_cpus,
    store::a_replica_group_on_this_device_steps_as_a_lone_store,
    store::a_store_restored_from_its_checkpoint_file_steps_as_the_original,
    step_graph::a_replayed_tape_step_trains_as_the_tape_steps,
    ordering::two_streams_hammering_one_buffer_see_each_others_writes_in_order,
    ordering::an_upload_on_the_default_stream_is_used_at_once_by_another_stream,
    ordering::reads_of_one_buffer_on_two_streams_do_not_wait_for_each_other,
    ordering::a_batch_requiring_failed_work_runs_none_of_it_and_answers_that_failure,
    kernels::elementwise_kernels_match_the_cpu_kernels,
    kernels::every_element_wise_definition_matches_its_cpu_body,
    kernels::a_kernel_over_a_sub_range_changes_only_that_range,
    kernels::every_activation_forward_and_backward_matches_the_cpu_kernels,
    kernels::exact_gelu_keeps_its_tail_relatively_accurate,
    kernels::gemm_with_transposes_bias_and_activation_matches_the_cpu_kernel,
    kernels::gemm_off_every_tile_and_block_boundary_matches_the_cpu_kernel,
    kernels::reductions_match_the_cpu_kernels,
    kernels_bindings::bad_bindings_are_invalid_programs_and_nothing_runs,
    kernels_bindings::a_bad_launch_in_a_batch_stops_all_of_it_before_it_runs,
    kernels_bindings::a_mean_over_no_elements_is_refused_before_it_runs,
    optim::every_optimizer_option_matches_the_reference_through_the_server,
    optim::every_streaming_step_matches_the_reference_on_and_off_a_16_byte_boundary,
    optim::buffers_large_enough_to_run_in_parallel_match_the_reference,
    optim::many_small_segments_match_the_reference,
    optim::optimizer_state_is_allocated_and_initialised_per_its_layout,
    optim::an_invalid_config_or_segment_table_is_refused_before_anything_runs,
    optim::a_lamb_refusal_at_run_time_is_operation_local_and_does_not_poison,
    optim_amp::an_amp_step_unscales_then_applies_or_skips_on_the_flag,
    optim_amp::the_flag_accumulates_over_several_unscales_until_reset,
    optim_amp::the_device_scale_update_and_counted_step_follow_the_grad_scaler,
    optim_amp::a_counted_step_far_into_training_matches_the_reference_at_its_count,
    optim_amp::unscaling_by_the_device_scale_rounds_the_reciprocal_as_the_cpu,
    optim_amp::one_counted_step_from_zero_parameters_measures_its_constants,
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
    strided::a_copy_from_an_offset_off_every_word_is_right_or_unsupported_strides,
    exhaustion::exhausting_a_small_limit_is_out_of_memory_after_one_retry,
    exhaustion::a_buffer_larger_than_the_limit_is_buffer_too_big,
    faults::a_trap_surfaces_at_the_owners_token_and_sync,
    faults::a_refused_launch_is_latched_until_its_stream_syncs,
    faults::a_latched_error_is_reported_by_a_sync_on_an_idle_stream,
    faults::a_batch_is_checked_before_any_of_it_runs,
    faults::the_nth_executed_launch_traps_and_poisons,
    faults::a_trap_inside_a_batch_poisons_and_no_later_launch_of_it_runs,
    faults::the_nth_reservation_fails_out_of_memory_and_does_not_poison,
    faults::the_nth_transfer_fails_and_does_not_poison,
    faults::a_seeded_trap_rate_traps_the_same_launches_every_run,
    recovery::the_published_device_state_follows_poison_and_recovery,
    recovery::a_poisoned_device_recovers_and_only_fresh_handles_work,
    recovery::concurrent_invalidates_advance_the_generation_exactly_once,
    recovery::a_late_invalidate_after_recovery_changes_nothing,
    recovery::the_poisoned_state_holds_under_load_from_other_clients,
    recovery::three_operation_local_probe_failures_leave_the_device_unrecoverable,
    recovery::two_operation_local_probe_failures_then_a_pass_recover,
    recovery::a_sticky_probe_failure_leaves_the_device_unrecoverable,
    recovery::a_mismatching_probe_leaves_the_device_unrecoverable,
    memory::compaction_moves_live_data_intact_and_handles_stay_valid,
    memory::reclaim_releases_empty_pages_and_memory_stays_usable,
    death::a_server_panic_fails_calls_in_flight_and_every_later_call,
    death::a_shut_down_server_answers_server_gone,
    death::calls_queued_behind_a_shutdown_answer_server_gone,
    capture::a_replayed_graph_matches_the_launches_run_directly,
    capture::a_graph_keeps_its_memory_until_its_last_handle_drops,
    capture::compaction_never_moves_what_a_graph_holds,
    capture::a_capture_excludes_other_threads_until_it_ends,
    capture::a_capture_begins_only_on_an_active_device_and_never_nests,
    capture::a_dropped_guard_discards_the_capture_and_leaves_the_device_active,
    capture::a_sync_read_or_write_through_the_token_is_refused_untouched,
    capture::a_reservation_beyond_the_warmed_pools_is_page_update_forbidden,
    capture_faults::a_trap_during_replay_poisons_the_device,
    capture_faults::a_graph_from_before_an_invalidate_is_refused_as_stale,
    capture_faults::a_fault_while_capturing_discards_the_capture,
    broadcast::broadcast_and_strided_sum_kernels_match_the_f64_reference,
    broadcast::a_strided_walk_past_its_input_is_refused_before_it_runs,
    broadcast::broadcasting_arithmetic_on_the_tape_matches_finite_differences,
    broadcast::reductions_and_views_on_the_tape_match_finite_differences,
    layers::layer_norm_on_the_tape_matches_finite_differences,
    layers::embedding_on_the_tape_matches_finite_differences,
    layers::softmax_over_the_last_dimension_of_a_3d_tensor_matches_finite_differences,
    layers::layer_norm_and_embedding_over_many_workgroups_match_the_reference,
    layers::batched_matmul_on_the_tape_matches_finite_differences,
    layers::every_registered_parameter_in_any_operation_gets_its_gradient_staged,
    layers::dropout_masks_match_the_cpu_bit_for_bit_and_backward_reuses_them,
    layers::a_counted_dropout_draws_the_mask_of_the_step_its_counter_holds,
    layers::attention_on_the_tape_matches_finite_differences,
    layers::fused_multi_head_attention_matches_finite_differences,
    layers::fused_attention_over_many_rows_matches_the_composed_one,
    layers::narrow_split_and_cat_on_the_tape_match_finite_differences,
    layers::softmax_over_any_dimension_matches_finite_differences,
    max::max_dim_kernels_take_the_first_maximum_and_route_the_gradient_there,
    max::max_dim_on_the_tape_matches_finite_differences,
    max::max_dim_on_the_tape_returns_pytorchs_indices,
    classify::softmax_and_log_softmax_match_the_f64_reference_and_finite_differences,
    classify::every_cross_entropy_option_matches_the_f64_reference_and_finite_differences,
    classify::extreme_and_equal_logits_give_finite_correct_cross_entropy,
    classify::a_large_batch_matches_the_f64_reference,
    classify::an_out_of_range_target_is_never_read_through_on_the_device,
    classify::binary_cross_entropy_with_logits_matches_the_f64_reference_and_finite_differences,
    classify::a_class_loss_with_bad_arguments_is_refused_before_it_runs,
    classify::the_device_chains_cross_entropy_step_matches_the_cpus,
}

#[test]
fn opening_an_absent_device_is_unavailable_not_a_panic() {
    death::opening_an_absent_device_is_unavailable();
}
