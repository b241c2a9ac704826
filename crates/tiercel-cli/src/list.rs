//! `tiercel list`: what a server exports, or what names a registry holds.

use tiercel::{BindError, Client};

/// Options of `tiercel list`.
#[derive(clap::Args)]
pub struct Args {
    /// A server's address, or a name (every live exporter of it is asked). Without one, the names
    /// in the registry and who exports each.
    target: Option<String>,
    #[command(flatten)]
    secret: tiercel_bench::SecretArgs,
    #[command(flatten)]
    registry: tiercel_bench::RegistryArgs,
}

pub fn run(args: Args) -> crate::Result<()> {
    let registry = args.registry.load().map_err(BindError::from).map_err(tiercel::Error::from)?;
    let Some(target) = &args.target else {
        let names = registry.names().map_err(BindError::from).map_err(tiercel::Error::from)?;
        println!("{} name{} in {registry}", names.len(), if names.len() == 1 { "" } else { "s" });
        for name in names {
            for e in registry.lookup(&name).map_err(BindError::from).map_err(tiercel::Error::from)? {
                println!(
                    "{name}\t{} v{}\t{}\tincarnation {:016x}\tpid {}",
                    e.interface, e.version, e.addr, e.incarnation, e.pid
                );
            }
        }
        return Ok(());
    };
    let config = args.secret.client_config()?;
    let client =
        Client::connect(target.as_str()).map_err(tiercel::Error::from)?.with_config(config).with_registry(registry);
    let exports = client.exports().map_err(tiercel::Error::from)?;
    if exports.is_empty() {
        println!("{target}: nothing exported");
    }
    for e in exports {
        let cut = if e.complete { "" } else { ", signature cut short" };
        println!("{}: {} v{} (fingerprint {:016x}{cut})", e.server, e.name, e.version, e.fingerprint);
        // Each procedure with its own shape fingerprint (what a client of another copy of the
        // interface must agree with to call it), then the types they reach.
        let shapes = tiercel::interface::procedure_fingerprints(&e.signature);
        let (procedures, types): (Vec<&str>, Vec<&str>) = e.signature.lines().partition(|l| !l.starts_with("type "));
        for (i, procedure) in procedures.iter().enumerate() {
            match shapes.get(i) {
                Some(shape) => println!("  {i:>3} {procedure}  [shape {shape:016x}]"),
                None => println!("  {i:>3} {procedure}"),
            }
        }
        for t in types {
            println!("      {t}");
        }
    }
    Ok(())
}
