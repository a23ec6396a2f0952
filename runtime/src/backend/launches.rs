//! `Launches`: a batch's kernel calls, shared by every replay of a graph.
//!
//! A replayed graph hands each replay the same list (an `Arc` clone, no
//! copy), and the backend keeps its own resolved form of the list beside
//! it, made on first use, so a replay is resolved once per graph rather
//! than once per replay. The resolved form stays valid because a graph pins
//! every allocation it uses (see `server/graphs.rs`); changing the list
//! (a fault plan's trap) copies it and drops the resolved form.
//!
//! A recorded graph's list is marked as one ([`Launches::recorded`]), so a
//! backend may turn it into a device graph of its own (CUDA captures it into
//! a CUDA graph); an ordinary batch and a changed copy are not marked.

use std::any::Any;
use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, OnceLock};

use super::ResolvedLaunch;

/// Kernel calls run in order as one batch; cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Launches(Arc<LaunchList>);

#[derive(Default)]
struct LaunchList {
    launches: Vec<ResolvedLaunch>,
    /// A recorded graph's own list, replayed unchanged many times.
    recorded: bool,
    /// The backend's resolved form: one backend per server, so one slot.
    prepared: OnceLock<Box<dyn Any + Send + Sync>>,
}

impl Clone for LaunchList {
    fn clone(&self) -> Self {
        // A copy is about to change: neither the resolved form nor the
        // graph's mark follows it.
        LaunchList {
            launches: self.launches.clone(),
            recorded: false,
            prepared: OnceLock::new(),
        }
    }
}

impl fmt::Debug for LaunchList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LaunchList")
            .field("launches", &self.launches)
            .field("recorded", &self.recorded)
            .field("prepared", &self.prepared.get().is_some())
            .finish()
    }
}

impl Launches {
    /// A recorded graph's list: every replay of the graph shares it unchanged.
    pub fn recorded(launches: Vec<ResolvedLaunch>) -> Self {
        Launches(Arc::new(LaunchList {
            launches,
            recorded: true,
            prepared: OnceLock::new(),
        }))
    }

    /// Whether this is a recorded graph's list, unchanged (an ordinary
    /// batch and a changed copy are not).
    pub fn is_recorded(&self) -> bool {
        self.0.recorded
    }

    /// The backend's resolved form of these launches, made by `prepare` on
    /// first use and shared by every later clone of this list.
    pub fn prepared<T, E>(
        &self,
        prepare: impl FnOnce(&[ResolvedLaunch]) -> Result<Arc<T>, E>,
    ) -> Result<Arc<T>, E>
    where
        T: ?Sized + Send + Sync + 'static,
    {
        if let Some(prepared) = self.cached::<T>() {
            return Ok(prepared);
        }
        let prepared = prepare(&self.0.launches)?;
        // Lost a race, or the slot holds another type: still correct, uncached.
        let _ = self.0.prepared.set(Box::new(prepared.clone()));
        Ok(prepared)
    }

    fn cached<T: ?Sized + Send + Sync + 'static>(&self) -> Option<Arc<T>> {
        self.0
            .prepared
            .get()
            .and_then(|prepared| prepared.downcast_ref::<Arc<T>>())
            .cloned()
    }

    /// The launches, writable: copied first unless this is the only clone;
    /// the resolved form and the graph's mark are dropped either way.
    pub fn make_mut(&mut self) -> &mut [ResolvedLaunch] {
        let list = Arc::make_mut(&mut self.0);
        list.prepared = OnceLock::new();
        list.recorded = false;
        &mut list.launches
    }
}

impl From<Vec<ResolvedLaunch>> for Launches {
    fn from(launches: Vec<ResolvedLaunch>) -> Self {
        Launches(Arc::new(LaunchList {
            launches,
            recorded: false,
            prepared: OnceLock::new(),
        }))
    }
}

impl Deref for Launches {
    type Target = [ResolvedLaunch];

    fn deref(&self) -> &[ResolvedLaunch] {
        &self.0.launches
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::Kernel;

    fn launches(kernels: &[Kernel]) -> Launches {
        kernels
            .iter()
            .map(|kernel| ResolvedLaunch {
                kernel: kernel.clone(),
                bindings: Vec::new(),
            })
            .collect::<Vec<_>>()
            .into()
    }

    fn prepare_count(list: &Launches, made: &mut u32) -> Arc<usize> {
        let prepared = list.prepared(|launches| {
            *made += 1;
            Ok::<_, ()>(Arc::new(launches.len()))
        });
        prepared.unwrap_or_default()
    }

    #[test]
    fn clones_share_one_resolved_form_made_on_first_use() {
        let list = launches(&[Kernel::Empty, Kernel::Empty]);
        let replay = list.clone();
        let mut made = 0;
        assert_eq!(*prepare_count(&list, &mut made), 2);
        assert_eq!(*prepare_count(&replay, &mut made), 2);
        assert_eq!(made, 1);
    }

    #[test]
    fn a_changed_copy_leaves_the_shared_list_and_its_resolved_form_alone() {
        let list = launches(&[Kernel::Empty, Kernel::Empty]);
        let mut made = 0;
        prepare_count(&list, &mut made);
        let mut trapped = list.clone();
        trapped.make_mut()[1].kernel = Kernel::Trap;
        assert_eq!(list[1].kernel, Kernel::Empty);
        assert_eq!(trapped[1].kernel, Kernel::Trap);
        prepare_count(&trapped, &mut made);
        assert_eq!(made, 2, "the changed copy is resolved afresh");
        prepare_count(&list, &mut made);
        assert_eq!(made, 2, "the shared list keeps its resolved form");
    }

    #[test]
    fn only_a_recorded_graphs_unchanged_list_is_marked_recorded() {
        let batch = launches(&[Kernel::Empty, Kernel::Empty]);
        assert!(!batch.is_recorded());
        let graph = Launches::recorded(batch.to_vec());
        let replay = graph.clone();
        assert!(replay.is_recorded());
        let mut trapped = graph.clone();
        trapped.make_mut()[0].kernel = Kernel::Trap;
        assert!(!trapped.is_recorded(), "a changed copy is not the graph");
        assert!(graph.is_recorded());
        let mut only = Launches::recorded(batch.to_vec());
        only.make_mut()[0].kernel = Kernel::Trap;
        assert!(
            !only.is_recorded(),
            "changed in place, it is no longer the graph"
        );
    }

    #[test]
    fn a_failed_preparation_caches_nothing() {
        let list = launches(&[Kernel::Empty]);
        assert_eq!(list.prepared(|_| Err::<Arc<u8>, _>("gone")), Err("gone"));
        let mut made = 0;
        prepare_count(&list, &mut made);
        assert_eq!(made, 1);
    }
}
