#[allow(dead_code, unused_imports)]
mod config;
#[allow(dead_code)]
mod runner;
#[allow(dead_code)]
mod sources;
fn main() {}
