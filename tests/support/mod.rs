//! Shared test support: included by the `it` integration test binary and by benches via
//! `#[path = "../support/mod.rs"] mod support;`. Keep this free of `#[test]` items so every
//! includer compiles the same code.
#![allow(dead_code, unused_imports)]

pub mod fake_apiserver;
pub mod service;

pub use fake_apiserver::{
    ApiError, FakeApiServer, Kind, RbacRequest, RecordedRequest, ServedApi, WriteFault, WriteOp,
};
