//! The host half of a reduction: the replicas' staged gradients, as the
//! native-endian bytes of `f32`s the devices answer, each scaled by its
//! replica's weight and summed in replica order, a block at a time so that
//! one pass over the buffers does it all.

use crate::collective::CollectiveError;

/// Floats summed per block: the block's total stays in the first-level cache.
const BLOCK: usize = 1024;

/// Floats above which the in-process sum is cut among threads.
const PARALLEL_FLOATS: usize = 1 << 16;

/// The floats each of `buffers` holds, once they agree: as many buffers as
/// `weights`, every one the same whole number of `f32`s.
pub(crate) fn check(buffers: &[Vec<u8>], weights: &[f32]) -> Result<usize, CollectiveError> {
    if buffers.len() != weights.len() {
        return Err(CollectiveError::Mismatch(format!(
            "{} buffers and {} weights",
            buffers.len(),
            weights.len()
        )));
    }
    let Some(first) = buffers.first() else {
        return Ok(0);
    };
    if let Some(index) = buffers.iter().position(|b| b.len() != first.len()) {
        return Err(CollectiveError::Mismatch(format!(
            "buffer {index} holds {} bytes, buffer 0 {}",
            buffers[index].len(),
            first.len()
        )));
    }
    match first.len() % 4 {
        0 => Ok(first.len() / 4),
        _ => Err(CollectiveError::Mismatch(format!(
            "{} bytes are not a whole number of f32s",
            first.len()
        ))),
    }
}

/// `Σ sources[r]·weights[r]` into `total`, in replica order: the first
/// source scaled, then each later one scaled and added (a weight of 1
/// leaves its values as they are), exactly as summing the scaled buffers
/// one after another would round.
pub(crate) fn weighted_sum(sources: &[&[u8]], weights: &[f32], total: &mut [f32]) {
    for (index, block) in total.chunks_mut(BLOCK).enumerate() {
        let bytes = index * BLOCK * 4..(index * BLOCK + block.len()) * 4;
        accumulate(sources.iter().map(|s| &s[bytes.clone()]), weights, block);
    }
}

/// [`weighted_sum`] written over the first buffer (the others are only
/// read), cut among a thread per buffer when they are large: the
/// in-process engine's whole reduction.
pub(crate) fn weighted_sum_into_first(buffers: &mut [Vec<u8>], weights: &[f32]) {
    let floats = buffers.first().map_or(0, |b| b.len() / 4);
    let parts = match floats >= PARALLEL_FLOATS {
        true => buffers.len(),
        false => 1,
    };
    let piece = floats.div_ceil(parts.max(1)).max(1) * 4;
    let mut pieces: Vec<Vec<&mut [u8]>> = Vec::new();
    for buffer in buffers.iter_mut() {
        for (part, bytes) in buffer.chunks_mut(piece).enumerate() {
            if pieces.len() <= part {
                pieces.push(Vec::with_capacity(weights.len()));
            }
            pieces[part].push(bytes);
        }
    }
    let mut pieces = pieces.into_iter();
    let Some(mut mine) = pieces.next() else {
        return;
    };
    std::thread::scope(|scope| {
        for mut other in pieces {
            scope.spawn(move || sum_in_place(&mut other, weights));
        }
        sum_in_place(&mut mine, weights);
    });
}

/// One piece of every buffer: summed a block at a time, each block's total
/// stored over the first piece.
fn sum_in_place(pieces: &mut [&mut [u8]], weights: &[f32]) {
    let len = pieces.first().map_or(0, |p| p.len());
    let mut total = [0.0f32; BLOCK];
    for start in (0..len).step_by(BLOCK * 4) {
        let end = (start + BLOCK * 4).min(len);
        let block = &mut total[..(end - start) / 4];
        accumulate(pieces.iter().map(|p| &p[start..end]), weights, block);
        if let Some(first) = pieces.first_mut() {
            store(block, &mut first[start..end]);
        }
    }
}

/// `total` = the weighted sum of `sources` (each `total.len()` floats).
fn accumulate<'a>(sources: impl Iterator<Item = &'a [u8]>, weights: &[f32], total: &mut [f32]) {
    for (index, (bytes, &weight)) in sources.zip(weights).enumerate() {
        let values = bytes
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
        let slots = total.iter_mut().zip(values);
        match (index == 0, weight == 1.0) {
            (true, true) => slots.for_each(|(t, v)| *t = v),
            (true, false) => slots.for_each(|(t, v)| *t = v * weight),
            (false, true) => slots.for_each(|(t, v)| *t += v),
            (false, false) => slots.for_each(|(t, v)| *t += v * weight),
        }
    }
}

/// `values` as native-endian bytes into `bytes` (four per value).
pub(crate) fn store(values: &[f32], bytes: &mut [u8]) {
    for (value, out) in values.iter().zip(bytes.chunks_exact_mut(4)) {
        out.copy_from_slice(&value.to_ne_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_ne_bytes()).collect()
    }

    fn floats(bytes: &[u8]) -> Vec<f32> {
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    /// The reduction as the group did it before: scale each buffer, then
    /// add them one after another into the first.
    fn scaled_then_summed(buffers: &[Vec<f32>], weights: &[f32]) -> Vec<f32> {
        let scaled: Vec<Vec<f32>> = buffers
            .iter()
            .zip(weights)
            .map(|(b, &w)| match w == 1.0 {
                true => b.clone(),
                false => b.iter().map(|v| v * w).collect(),
            })
            .collect();
        let mut total = scaled[0].clone();
        for other in &scaled[1..] {
            for (t, v) in total.iter_mut().zip(other) {
                *t += v;
            }
        }
        total
    }

    fn awkward(seed: u32, len: usize) -> Vec<f32> {
        (0..len)
            .map(|i| {
                let x = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed);
                f32::from_bits(x % 0x7f00_0000) * if x % 3 == 0 { -1.0 } else { 1.0 }
            })
            .collect()
    }

    #[test]
    fn the_weighted_sum_rounds_bit_for_bit_as_scaling_then_summing_in_order() {
        // Ragged against the block and the thread cut, large enough for threads.
        let len = PARALLEL_FLOATS + 3 * BLOCK + 7;
        let buffers: Vec<Vec<f32>> = (0..3).map(|seed| awkward(seed, len)).collect();
        let weights = [0.25, 1.0, 0.75];
        let expected = scaled_then_summed(&buffers, &weights);
        let sources: Vec<Vec<u8>> = buffers.iter().map(|b| bytes(b)).collect();
        let refs: Vec<&[u8]> = sources.iter().map(Vec::as_slice).collect();
        let mut total = vec![0.0f32; len];
        weighted_sum(&refs, &weights, &mut total);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&total), bits(&expected));
        let mut in_place = sources.clone();
        weighted_sum_into_first(&mut in_place, &weights);
        assert_eq!(bits(&floats(&in_place[0])), bits(&expected));
        assert_eq!(in_place[1..], sources[1..], "the others are only read");
    }

    #[test]
    fn buffers_that_disagree_are_a_mismatch_naming_the_buffer() {
        let two = vec![bytes(&[1.0, 2.0]), bytes(&[1.0])];
        match check(&two, &[1.0, 1.0]) {
            Err(CollectiveError::Mismatch(why)) => assert!(why.contains("buffer 1"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert!(check(&two[..1], &[1.0, 1.0]).is_err());
        assert!(check(&[vec![0u8; 6]], &[1.0]).is_err());
        assert_eq!(check(&[], &[]), Ok(0));
    }
}
