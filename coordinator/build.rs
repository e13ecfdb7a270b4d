//! Links the `steppe` binary as a position-dependent executable (`-no-pie`),
//! as Go links its programs: a position-independent one of this size spends
//! about 2 ms of every start applying 90,000 relocations (its pages copied
//! as they are written), which a one-step `steppe run` and every
//! `steppe submit` would pay. Shared libraries, the heap, stacks and mmaps
//! stay randomized; the executable's own code and data do not move.
fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-link-arg-bins=-no-pie");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
