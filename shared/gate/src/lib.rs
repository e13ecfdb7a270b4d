//! Stepgate (seed 003, `../shared/spec/stepgate-and-sandbox.md` §1): a
//! procedure as a stepfile whose steps are gated, served as MCP tools. So
//! far: stepfiles loaded and checked, and the ledger of a run
//! (JCS-canonical records chained by SHA-256) with its verification.

pub mod expr;
pub mod jcs;
pub mod ledger;
pub mod stepfile;
