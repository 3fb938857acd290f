//! `cobalt man`: the manual pages, generated from the command-line definition, so that
//! they always say what the flags do.

use crate::{exit, sink};
use std::path::Path;

/// Prints cobalt.1, or writes it and one page per subcommand into `dir`; returns the
/// exit code.
pub fn run(command: clap::Command, dir: Option<&Path>) -> i32 {
    let result = match dir {
        None => render(&command).and_then(|page| sink::write_stdout(&page).map(|_| ())),
        Some(dir) => write_pages(command, dir),
    };
    match result {
        Ok(()) => exit::OK,
        Err((code, message)) => {
            eprintln!("cobalt: {message}");
            code
        }
    }
}

fn render(command: &clap::Command) -> Result<Vec<u8>, (i32, String)> {
    let mut page = Vec::new();
    clap_mangen::Man::new(command.clone())
        .render(&mut page)
        .map_err(|e| (exit::FAILURE, format!("cannot render the manual page: {e}")))?;
    Ok(page)
}

/// cobalt.1 and cobalt-SUB.1 for every visible subcommand.
fn write_pages(command: clap::Command, dir: &Path) -> Result<(), (i32, String)> {
    let write = |name: &str, page: Vec<u8>| {
        let path = dir.join(format!("{name}.1"));
        std::fs::write(&path, page).map_err(|e| {
            (
                exit::FAILURE,
                format!("cannot write {}: {e}", path.display()),
            )
        })
    };
    write("cobalt", render(&command)?)?;
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("cobalt-{}", sub.get_name());
        let sub = sub.clone().name(name.clone());
        write(&name, render(&sub)?)?;
    }
    Ok(())
}
