#![allow(unreachable_pub, reason = "test helpers are shared between modules of one binary")]
//! kiln's integration tests, one module per area, in one binary to keep link time down.

mod common;

mod compile;

mod attention;
mod autograd;
mod bad_inputs;
mod checkpoint;
mod construction;
mod conv;
mod cuda;
mod custom_ops;
mod data;
mod dense_linalg;
mod digits;
mod display;
mod distributed;
mod einsum;
mod elementwise;
mod errors;
mod fusion;
mod graph;
mod higher_order;
mod indexing;
mod inplace;
mod linalg;
mod memory;
mod mixed_precision;
mod movement;
mod nn;
mod norm;
mod opaque_ops;
mod optim;
mod ordering;
mod plans;
mod profile;
mod programs;
mod recurrent;
mod reductions;
mod rows;
mod serialize;
mod sizes;
mod special;
mod statistics;
mod torch_layers;
mod torch_vocabulary;
mod vision;
mod vocabulary;
