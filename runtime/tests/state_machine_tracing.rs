//! The context state machine's transitions as `tracing` events. In a test
//! binary of its own: `tracing`'s per-callsite interest cache is global, and
//! tests running beside it on other threads could leave its callsites
//! disabled for the scoped subscriber.

use std::sync::Arc;

use cistern_runtime::sync::Mutex;
use cistern_runtime::testing::TestServer;
use cistern_runtime::{ContextState, ServerError};

/// Poisons the harness, invalidates, runs the drain and the probe; returns
/// the invalidate's answer.
fn recover(harness: &mut TestServer) -> Result<ContextState, ServerError> {
    let seen = harness.state().generation();
    let answer = harness.invalidate(seen);
    harness.run_normally();
    match answer.try_recv() {
        Ok(result) => result,
        Err(error) => panic!("the invalidate was answered: {error:?}"),
    }
}

/// Records the fields of every event that names a state change.
#[derive(Clone, Default)]
struct Transitions(Arc<Mutex<Vec<EventFields>>>);

/// An event's fields, as (name, value).
type EventFields = Vec<(String, String)>;

struct Fields<'a>(&'a mut Vec<(String, String)>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0
            .push((field.name().to_string(), format!("{value:?}")));
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.push((field.name().to_string(), value.to_string()));
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Transitions {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut fields = Vec::new();
        event.record(&mut Fields(&mut fields));
        if fields.iter().any(|(name, _)| name == "old") {
            self.0.lock().push(fields);
        }
    }
}

#[test]
fn every_transition_is_traced_with_the_ordinal_both_states_and_the_generation() {
    use tracing_subscriber::layer::SubscriberExt;

    let transitions = Transitions::default();
    let subscriber = tracing_subscriber::registry().with(transitions.clone());
    tracing::subscriber::with_default(subscriber, || {
        let mut harness = TestServer::new();
        harness.poison();
        assert!(recover(&mut harness).is_ok());
    });
    let seen: Vec<(String, String, String)> = transitions
        .0
        .lock()
        .iter()
        .map(|fields| {
            let get = |key: &str| {
                fields
                    .iter()
                    .find(|(name, _)| name == key)
                    .map(|(_, value)| value.clone())
                    .unwrap_or_default()
            };
            assert_eq!(get("device"), "0");
            (get("old"), get("new"), get("generation"))
        })
        .collect();
    let expected = [
        ("active", "poisoned", "0"),
        ("poisoned", "retiring", "0"),
        ("retiring", "active", "1"),
    ]
    .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()));
    assert_eq!(seen, expected);
}
