//! Digests the ranks compare: a layout's and a replica's parameters'.

/// FNV-1a over `bytes`, continuing from `hash`.
fn fnv1a(mut hash: u64, bytes: &[u8]) -> u64 {
    for &byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// The digest of a parameter layout: every tensor's shape, in order.
pub fn layout(shapes: &[Vec<usize>]) -> u64 {
    let mut hash = fnv1a(FNV_OFFSET, &(shapes.len() as u64).to_le_bytes());
    for shape in shapes {
        hash = fnv1a(hash, &(shape.len() as u64).to_le_bytes());
        for &dim in shape {
            hash = fnv1a(hash, &(dim as u64).to_le_bytes());
        }
    }
    hash
}

/// The digest of parameter values, bit for bit.
pub fn values(values: &[f32]) -> u64 {
    values.iter().fold(FNV_OFFSET, |hash, value| {
        fnv1a(hash, &value.to_bits().to_le_bytes())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_differ_by_shape_and_order() {
        let a = layout(&[vec![3, 4], vec![3]]);
        assert_eq!(a, layout(&[vec![3, 4], vec![3]]));
        assert_ne!(a, layout(&[vec![3], vec![3, 4]]));
        assert_ne!(a, layout(&[vec![4, 3], vec![3]]));
        assert_ne!(a, layout(&[vec![12], vec![3]]));
    }

    #[test]
    fn values_differ_by_any_bit() {
        assert_ne!(values(&[0.0]), values(&[-0.0]));
        assert_eq!(values(&[1.5, 2.0]), values(&[1.5, 2.0]));
    }
}
