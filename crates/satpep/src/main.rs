//! `satpep`: a performance-enhancing proxy for TCP over satellite links, with its link emulator
//! and test lab.

mod cc_cmd;
mod generate_cmd;
mod keygen_cmd;
mod lab_cmd;
mod link_cmd;
mod logging;
mod proxy_cmd;
mod status_cmd;

use clap::{CommandFactory, Parser, Subcommand};

/// satpep: a performance-enhancing proxy for TCP over satellite and other long, lossy links.
#[derive(Parser, Debug)]
#[command(
    name = "satpep",
    version,
    long_about = "satpep: a performance-enhancing proxy (PEP) for TCP over satellite and other \
long, lossy links, with a userspace satellite link emulator and a namespace lab that measures it.

Subcommands need root (namespaces, raw sockets). See README.md and docs/."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    // `about` only: a doc comment here would also replace the subcommand's long help.
    #[command(
        about = "Emulate a satellite link between two interfaces (rate, delay, queue, loss, outages)"
    )]
    Link(Box<link_cmd::LinkCmd>),
    #[command(about = "Build testbeds of network namespaces and run experiments on them")]
    Lab(lab_cmd::LabCmd),
    #[command(
        about = "Split TCP connections crossing this host, or carry them in a tunnel to a peer satpep"
    )]
    Proxy(proxy_cmd::ProxyCmd),
    #[command(about = "Show a running proxy's live connections")]
    Status(status_cmd::StatusCmd),
    #[command(about = "List, load and unload satpep's BPF congestion controls (Hybla, …)")]
    Cc(cc_cmd::CcCmd),
    #[command(
        about = "Make credentials (a private CA and certificates) for the tunnel between satpeps"
    )]
    Keygen(keygen_cmd::KeygenCmd),
    #[command(about = "Write man pages or shell completions (for packagers)")]
    Generate(generate_cmd::GenerateCmd),
}

/// Commands that only print: a reader that stops early (`| head`) ends them quietly, as it
/// does any Unix tool, instead of a panic on the broken pipe. The proxy, the link and the
/// lab keep Rust's default (SIGPIPE ignored): their sockets' writes must fail, not kill them.
fn printing_only(cmd: &Cmd) -> bool {
    matches!(
        cmd,
        Cmd::Status(_) | Cmd::Keygen(_) | Cmd::Generate(_) | Cmd::Cc(_)
    )
}

fn main() {
    let cli = Cli::parse();
    if printing_only(&cli.cmd) {
        // SAFETY: restoring the default disposition of one signal before any thread runs.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let r = match cli.cmd {
        Cmd::Link(c) => link_cmd::main(*c),
        Cmd::Lab(c) => lab_cmd::main(c),
        Cmd::Proxy(c) => proxy_cmd::main(c),
        Cmd::Status(c) => status_cmd::main(c),
        Cmd::Cc(c) => cc_cmd::main(c),
        Cmd::Keygen(c) => keygen_cmd::main(c),
        Cmd::Generate(c) => generate_cmd::main(c, Cli::command()),
    };
    if let Err(e) = r {
        eprintln!("satpep: error: {e}");
        std::process::exit(1);
    }
}
