//! Strided copies.

use cistern::client::{Buffer, ComputeClient};
use cistern::runtime::{Device, ServerError, StridedCopy};

use super::common::{ok, open};

fn copy_of(
    source: &Buffer,
    target: &Buffer,
    shape: Vec<u64>,
    source_strides: Vec<u64>,
    target_strides: Vec<u64>,
) -> StridedCopy {
    StridedCopy {
        source: source.reference(),
        source_offset: 0,
        source_strides,
        target: target.reference(),
        target_offset: 0,
        target_strides,
        shape,
        element_size: 4,
    }
}

fn matrix(client: &ComputeClient, rows: usize, columns: usize) -> (Buffer, Vec<f32>) {
    let values: Vec<f32> = (0..rows * columns).map(|i| i as f32).collect();
    (ok(client.upload_f32(&values), "upload"), values)
}

pub fn a_strided_copy_transposes_a_matrix(device: Device) {
    let client = open(device);
    let (rows, columns) = (3usize, 5usize);
    let (source, values) = matrix(&client, rows, columns);
    let target = ok(client.reserve((rows * columns * 4) as u64), "reserve");
    let copy = copy_of(
        &source,
        &target,
        vec![rows as u64, columns as u64],
        vec![columns as u64, 1],
        vec![1, rows as u64],
    );
    ok(
        client.strided_copy(client.default_stream(), copy),
        "strided_copy",
    );
    let transposed = ok(client.download_f32(&target), "download");
    for r in 0..rows {
        for c in 0..columns {
            assert_eq!(transposed[c * rows + r], values[r * columns + c]);
        }
    }
}

pub fn a_declined_pattern_is_unsupported_strides_never_wrong_data(device: Device) {
    let client = open(device);
    // Rank 8: a backend may decline it, but must never copy it wrongly.
    let rank = 8;
    let (source, values) = matrix(&client, 1, 1 << rank);
    let target = ok(client.reserve(4 << rank), "reserve");
    let strides: Vec<u64> = (0..rank).rev().map(|k| 1u64 << k).collect();
    let copy = copy_of(&source, &target, vec![2; rank], strides.clone(), strides);
    match client.strided_copy(client.default_stream(), copy) {
        Ok(()) => assert_eq!(ok(client.download_f32(&target), "download"), values),
        Err(ServerError::Io(cistern::memory::IoError::UnsupportedStrides { .. })) => {}
        Err(other) => panic!("expected a copy or UnsupportedStrides, got {other}"),
    }
}

pub fn a_copy_from_an_offset_off_every_word_is_right_or_unsupported_strides(device: Device) {
    let client = open(device);
    let bytes: Vec<u8> = (0..64u8).collect();
    let source = ok(client.upload(&bytes), "upload");
    let target = ok(client.upload(&[0xEEu8; 64]), "upload");
    for (source_offset, target_offset) in [(2u64, 0u64), (0, 6), (1, 3)] {
        let copy = StridedCopy {
            source: source.reference(),
            source_offset,
            source_strides: vec![1],
            target: target.reference(),
            target_offset,
            target_strides: vec![1],
            shape: vec![8],
            element_size: 4,
        };
        match client.strided_copy(client.default_stream(), copy) {
            Ok(()) => {
                let got = ok(client.download(&target), "download");
                let (from, to) = (source_offset as usize, target_offset as usize);
                assert_eq!(
                    &got[to..to + 32],
                    &bytes[from..from + 32],
                    "{device}: offsets {source_offset}, {target_offset}"
                );
            }
            Err(ServerError::Io(cistern::memory::IoError::UnsupportedStrides { .. })) => {}
            Err(other) => panic!("expected a copy or UnsupportedStrides, got {other}"),
        }
    }
}
