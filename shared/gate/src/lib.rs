//! Stepgate (seed 003, `../shared/spec/stepgate-and-sandbox.md` §1): a
//! procedure as a stepfile whose steps are gated, served as MCP tools: the
//! stepfile loaded and checked, runs driven one step at a time through
//! `stepgate_call` and `stepgate_submit`, every request held to the hosts
//! the stepfile declares, and every event in a hash-chained ledger.

pub mod authoring;
pub mod cases;
pub mod casetest;
pub mod check;
pub mod egress;
pub mod error;
pub mod expr;
pub mod guide;
pub mod http;
pub mod inspect;
pub mod jcs;
pub mod ledger;
pub mod load;
pub mod oauth;
pub mod openapi;
pub mod references;
pub mod pattern;
pub mod reply;
pub mod run;
pub mod schema;
pub mod server;
pub mod settings;
pub mod stepfile;
pub mod tools;
