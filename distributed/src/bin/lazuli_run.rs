//! `lazuli-run --nproc N [--max-restarts K] [--coordinator host:port] -- <program> <args>`: see
//! `lazuli_distributed::launcher`.
#![forbid(unsafe_code)]

use clap::Parser;

fn main() {
    let args = lazuli_distributed::launcher::Args::parse();
    std::process::exit(lazuli_distributed::launcher::run(&args));
}
