//! `grove-gitserver ROOT [--token-env VAR] [--throttle BYTES_PER_SEC]`: serves the bare
//! repositories under ROOT over smart HTTP on a loopback port, prints the base URL on
//! stdout and runs until killed. For measurements by hand (ADR 25) and scripts.

use std::path::PathBuf;

fn main() -> std::process::ExitCode {
    let mut args = std::env::args().skip(1);
    let mut root = None;
    let mut options = grove_gitserver::Options::default();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--token-env" => {
                let var = args.next().unwrap_or_default();
                match std::env::var(&var) {
                    Ok(token) => options.token = Some(token),
                    Err(_) => return usage(&format!("{var} is not set")),
                }
            }
            "--throttle" => match args.next().and_then(|v| v.parse().ok()) {
                Some(rate) => options.throttle_bytes_per_sec = Some(rate),
                None => return usage("--throttle takes bytes per second"),
            },
            _ if root.is_none() => root = Some(PathBuf::from(arg)),
            _ => return usage(&format!("unexpected argument {arg:?}")),
        }
    }
    let Some(root) = root else {
        return usage("ROOT is missing");
    };
    match grove_gitserver::GitServer::start(&root, options) {
        Ok(server) => {
            println!("{}", server.base);
            loop {
                std::thread::park();
            }
        }
        Err(e) => usage(&e),
    }
}

fn usage(why: &str) -> std::process::ExitCode {
    eprintln!("grove-gitserver: {why}\nusage: grove-gitserver ROOT [--token-env VAR] [--throttle BYTES_PER_SEC]");
    std::process::ExitCode::from(2)
}
