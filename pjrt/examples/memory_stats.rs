//! Compiles StableHLO module files (e.g. those written to `TORCH_PJRT_DUMP_DIR`) and prints each
//! executable's compiled memory statistics: what arguments, results, aliases and scratch take.

use pjrt::{Client, Plugin};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let plugin_name = pjrt::configured_plugin_name();
    let plugin = Plugin::load(&plugin_name)?;
    let client = Client::new(&plugin)?;
    println!("| module | arguments | outputs | aliased | temp | peak |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for path in std::env::args().skip(1) {
        let text = std::fs::read_to_string(&path)?;
        let stats = client.compile(&text)?.compiled_memory_stats()?;
        let name = std::path::Path::new(&path)
            .file_name()
            .map_or(path.clone(), |n| n.to_string_lossy().into_owned());
        println!(
            "| {name} | {} | {} | {} | {} | {} |",
            stats.argument_bytes,
            stats.output_bytes,
            stats.alias_bytes,
            stats.temp_bytes,
            stats.peak_bytes
        );
    }
    Ok(())
}
