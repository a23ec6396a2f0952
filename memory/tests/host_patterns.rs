//! On real host memory: a distinct pattern in every live slice survives
//! random churn and committed compactions.

mod common;

use cistern_memory::{AllocationId, HostStorage, MemoryManager, SliceLocation};
use common::*;
use proptest::prelude::*;

fn pattern(id: AllocationId, index: u64) -> u8 {
    (id.0
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(index.wrapping_mul(31))
        >> 24) as u8
}

fn write(m: &MemoryManager<HostStorage>, id: AllocationId, at: SliceLocation, len: u64) {
    let buffer = m
        .storage()
        .buffer(at.storage)
        .expect("a live slice has its buffer");
    // SAFETY: the slice belongs to this live allocation; nothing else touches it.
    let bytes = unsafe { buffer.slice_mut(at.offset as usize, len as usize) };
    for (index, byte) in bytes.iter_mut().enumerate() {
        *byte = pattern(id, index as u64);
    }
}

fn verify(m: &MemoryManager<HostStorage>, id: AllocationId, at: SliceLocation, len: u64) {
    let buffer = m
        .storage()
        .buffer(at.storage)
        .expect("a live slice has its buffer");
    // SAFETY: no writes happen while reading.
    let bytes = unsafe { buffer.slice(at.offset as usize, len as usize) };
    // A sparse sample keeps the test fast; every byte was written, and a
    // misplaced copy or overlap shifts or clobbers whole runs of them.
    let sampled = (0..bytes.len())
        .step_by(97)
        .chain(bytes.len().saturating_sub(8)..bytes.len());
    for index in sampled {
        assert_eq!(
            bytes[index],
            pattern(id, index as u64),
            "{id:?} byte {index} was overwritten"
        );
    }
}

#[derive(Clone, Debug)]
enum Step {
    Reserve(u64),
    Free(usize),
    Compact,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => prop_oneof![6 => 0..16_000u64, 1 => 500_000..640_000u64].prop_map(Step::Reserve),
        4 => any::<usize>().prop_map(Step::Free),
        1 => Just(Step::Compact),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn patterns_survive_churn_and_committed_compactions(steps in prop::collection::vec(step(), 1..120)) {
        let mut m = MemoryManager::new(HostStorage::new(), small_config(8 * MIB)).expect("valid");
        let mut live: Vec<(AllocationId, u64)> = Vec::new();
        for step in steps {
            match step {
                Step::Reserve(size) => {
                    if let Ok(id) = m.reserve(size, cistern_memory::AllocationPolicy::Allow, 0, S0) {
                        let at = locate(&mut m, id);
                        write(&m, id, at, size);
                        live.push((id, size));
                    }
                }
                Step::Free(pick) if !live.is_empty() => {
                    let (id, _) = live.swap_remove(pick % live.len());
                    m.free(id).expect("live");
                }
                Step::Free(_) => {}
                Step::Compact => {
                    let plan = m.plan_compaction();
                    for relocation in &plan.moves {
                        let from = m.storage().buffer(relocation.from.storage).expect("source");
                        let to = m.storage().buffer(relocation.to.storage).expect("destination");
                        let len = relocation.from.size as usize;
                        // SAFETY: planned source and destination are disjoint slices; no kernel runs.
                        let bytes = unsafe { from.slice(relocation.from.offset as usize, len) }.to_vec();
                        // SAFETY: the destination is reserved for this move only.
                        unsafe { to.slice_mut(relocation.to.offset as usize, len) }.copy_from_slice(&bytes);
                    }
                    m.commit_compaction(plan).expect("current plan");
                }
            }
            for &(id, size) in &live {
                let at = locate(&mut m, id);
                verify(&m, id, at, size);
            }
        }
        for (id, _) in live {
            m.free(id).expect("live");
        }
        m.reclaim();
        prop_assert_eq!(m.storage().held_buffers(), 0);
    }
}
