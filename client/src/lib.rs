//! Cistern's client side: `ComputeClient` and its handles, `BackendError`,
//! and `ErrorReport` with its JSON and bincode codecs.
//!
//! Depends on `cistern-runtime`, `cistern-memory` and `cistern-optim`; never
//! on the facade.
