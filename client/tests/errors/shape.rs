//! `ShapeError` and its checks.

use cistern_client::ShapeError;

#[test]
fn element_count_multiplies_the_dimensions() {
    assert_eq!(ShapeError::element_count(&[2, 3, 4]), Ok(24));
    assert_eq!(ShapeError::element_count(&[]), Ok(1));
    assert_eq!(ShapeError::element_count(&[5, 0]), Ok(0));
}

#[test]
fn an_overflowing_element_count_is_an_error_naming_the_shape() {
    assert_eq!(
        ShapeError::element_count(&[usize::MAX, 2]),
        Err(ShapeError::ElementCountOverflow {
            dims: vec![usize::MAX, 2]
        })
    );
}

#[test]
fn check_dims_reports_the_rank_first_then_the_lowest_differing_axis() {
    assert_eq!(ShapeError::check_dims(&[2, 3], &[2, 3]), Ok(()));
    assert_eq!(
        ShapeError::check_dims(&[2, 3], &[2, 3, 1]),
        Err(ShapeError::RankMismatch {
            expected: 2,
            actual: 3
        })
    );
    assert_eq!(
        ShapeError::check_dims(&[2, 3, 4], &[2, 5, 6]),
        Err(ShapeError::DimensionMismatch {
            axis: 1,
            expected: 3,
            actual: 5
        })
    );
}

#[test]
fn check_element_count_names_both_counts() {
    assert_eq!(ShapeError::check_element_count(4, 4), Ok(()));
    let error = ShapeError::check_element_count(4, 5);
    assert_eq!(
        error,
        Err(ShapeError::ElementCountMismatch {
            expected: 4,
            actual: 5
        })
    );
    assert_eq!(
        error.err().map(|e| e.to_string()).as_deref(),
        Some("expected 4 elements, got 5")
    );
}
