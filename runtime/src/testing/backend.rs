//! `TestBackend`: the backend half of the test device. It queues every
//! submission and runs none; the test runs work through its
//! [`TestDevice`].

use std::sync::Arc;

use cistern_memory::{BookkeepingStorage, SliceLocation, StreamId};

use super::device::{DeviceState, TestDevice};
use super::options::TestOptions;
use crate::backend::{Backend, Completion, DeviceCounters, Refused, StreamWork, StrideLayout};
use crate::error::ServerError;
use crate::ids::Device;
use crate::ids::EventId;
use crate::sync::{Mutex, Receiver, unbounded};

/// A queue-only backend over a [`BookkeepingStorage`]: submissions wait
/// until the test runs them; relocations copy the simulated bytes at once;
/// events and failure latches are not modelled (a sync answers the device's
/// fault or `Ok`).
pub struct TestBackend {
    state: Arc<Mutex<DeviceState>>,
    max_strided_dims: Option<usize>,
    reports_idle_streams: bool,
}

impl TestBackend {
    /// A backend, the test's handle on it, and the completion channel the
    /// core reads.
    pub fn new(options: &TestOptions) -> (TestBackend, TestDevice, Receiver<Completion>) {
        let state = Arc::new(Mutex::new(DeviceState::default()));
        let (completions, completed) = unbounded();
        let backend = TestBackend {
            state: state.clone(),
            max_strided_dims: options.max_strided_dims,
            reports_idle_streams: options.reports_idle_streams,
        };
        (backend, TestDevice { state, completions }, completed)
    }
}

impl Backend for TestBackend {
    type Storage = BookkeepingStorage;

    fn device(&self) -> Device {
        Device::Cpu(0)
    }

    fn create_stream(&mut self, _stream: StreamId) -> Result<(), ServerError> {
        Ok(())
    }

    fn destroy_stream(&mut self, _stream: StreamId) {}

    fn submit(
        &mut self,
        _storage: &BookkeepingStorage,
        stream: StreamId,
        sequence: u64,
        work: StreamWork,
    ) -> Result<(), Box<Refused>> {
        self.state.lock().queue.push_back((stream, sequence, work));
        Ok(())
    }

    fn stream_idle(&self, stream: StreamId) -> bool {
        let state = self.state.lock();
        self.reports_idle_streams
            && state.fault.is_none()
            && !state.queue.iter().any(|(s, ..)| *s == stream)
            && !state.undelivered.iter().any(|done| done.stream == stream)
    }

    fn supports_strides(&self, layout: &StrideLayout, _: SliceLocation, _: SliceLocation) -> bool {
        self.max_strided_dims
            .is_some_and(|max| layout.shape.len() <= max)
    }

    fn relocate(
        &mut self,
        _storage: &BookkeepingStorage,
        from: SliceLocation,
        to: SliceLocation,
    ) -> Result<(), ServerError> {
        self.state.lock().memory.copy(from, to);
        Ok(())
    }

    fn release_event(&mut self, _event: EventId) {}

    fn counters(&self) -> DeviceCounters {
        self.state.lock().counters
    }

    fn reset_context(&mut self, generation: u64) -> Result<(), ServerError> {
        let mut state = self.state.lock();
        state.reset_generations.push(generation);
        state.fault = None;
        state.generation = generation;
        match state.reset_error.clone() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
}
