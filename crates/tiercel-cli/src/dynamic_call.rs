//! `tiercel call` of a procedure of any interface: the server says what it exports (its
//! signature), the arguments are encoded from the command line by their types, and the result is
//! printed as JSON.

use std::time::Instant;

use tiercel::{Client, InterfaceInfo};
use tiercel_bench::summary::Summary;

use crate::dynamic::{self, Ty};
use crate::Error;

/// Calls `procedure` (`name`, or `Interface.name` when several exports have one of that name) of
/// the server at `target` (an address or a name), `repeat` times.
pub fn run(
    target: &str,
    procedure: &str,
    args: &[String],
    repeat: u32,
    secret: &tiercel_bench::SecretArgs,
    registry: &tiercel_bench::RegistryArgs,
) -> crate::Result<()> {
    let config = secret.client_config()?;
    let registry = registry.load().map_err(tiercel::BindError::from).map_err(tiercel::Error::from)?;
    let client = Client::connect(target).map_err(tiercel::Error::from)?.with_config(config).with_registry(registry);
    let bind_start = Instant::now();
    let exports = client.exports().map_err(tiercel::Error::from)?;
    // `proc`, `Interface.proc`, or `Interface@VERSION.proc` where a server exports several versions.
    let (interface, wanted) = match procedure.split_once('.') {
        Some((i, p)) => (Some(i), p),
        None => (None, procedure),
    };
    let (interface, version) = match interface.map(|i| i.split_once('@')) {
        Some(Some((i, v))) => {
            let v = v.parse::<u32>().map_err(|_| Error::Usage(format!("{v:?} is not a version (Interface@N.proc)")))?;
            (Some(i), Some(v))
        }
        _ => (interface, None),
    };
    let mut found = Vec::new();
    for e in &exports {
        if interface.is_some_and(|i| i != e.name) || version.is_some_and(|v| v != e.version) {
            continue;
        }
        for (index, line) in e.signature.lines().filter(|l| !l.starts_with("type ")).enumerate() {
            if line.split('(').next() == Some(wanted) {
                found.push((e, index, line));
            }
        }
    }
    // Several exporters of a name export the same interface: one is as good as another. Of several
    // versions of one interface, the newest, unless a version is named.
    found.dedup_by(|a, b| a.0.name == b.0.name && a.0.fingerprint == b.0.fingerprint && a.1 == b.1);
    let newest: std::collections::HashMap<&str, u32> = found.iter().fold(Default::default(), |mut m, (e, ..)| {
        let v = m.entry(e.name.as_str()).or_insert(e.version);
        *v = (*v).max(e.version);
        m
    });
    found.retain(|(e, ..)| newest.get(e.name.as_str()) == Some(&e.version));
    let (export, index, line) = match found[..] {
        [one] => one,
        [] => {
            let known: Vec<String> = exports.iter().map(|e| format!("{} v{}", e.name, e.version)).collect();
            return Err(Error::Usage(format!(
                "{target} exports no procedure {procedure:?} (it exports {}; see `tiercel list {target}`)",
                if known.is_empty() { "nothing".to_string() } else { known.join(", ") }
            )));
        }
        _ => {
            return Err(Error::Usage(format!("several interfaces have {wanted:?}: say which, as `Interface.{wanted}`")))
        }
    };
    if !export.complete {
        return Err(Error::Usage(format!("{}'s signature came cut short: it cannot be called from here", export.name)));
    }
    let proc = dynamic::parse_procedure(line).map_err(|e| Error::Usage(format!("{}: {e}", export.name)))?;
    let types = dynamic::Types::parse(&export.signature).map_err(|e| Error::Usage(format!("{}: {e}", export.name)))?;
    if args.len() != proc.args.len() {
        return Err(Error::Usage(format!("{line} takes {} arguments, {} given", proc.args.len(), args.len())));
    }
    let values: Vec<_> = args.iter().map(|a| dynamic::arg_value(a)).collect();
    let mut encoded = Vec::new();
    let mut buffers = Vec::new();
    for (ty, v) in proc.args.iter().zip(&values) {
        dynamic::encode(ty, v, &types, &mut encoded).map_err(|e| Error::Usage(format!("{line}: {e}")))?;
        match ty {
            Ty::Out => buffers.push(v.as_u64().unwrap_or(0) as usize),
            Ty::InOut => buffers.push(dynamic::bytes_of(v).map(|b| b.len()).unwrap_or(0)),
            _ => {}
        }
    }
    let procedures: Vec<&'static str> = export
        .signature
        .lines()
        .filter(|l| !l.starts_with("type "))
        .map(|l| &*Box::leak(l.split('(').next().unwrap_or(l).to_string().into_boxed_str()))
        .collect();
    // The interface as the server described it: bound like any other (its fingerprint checked).
    let info: &'static InterfaceInfo = Box::leak(Box::new(InterfaceInfo {
        name: Box::leak(export.name.clone().into_boxed_str()),
        id: tiercel::__private::interface_id(&export.name),
        version: export.version,
        procedures: Box::leak(procedures.into_boxed_slice()),
        source: tiercel::SignatureSource::Given(Box::leak(export.signature.clone().into_boxed_str())),
    }));
    let binding = client.import_info(info).map_err(tiercel::Error::from)?;
    let bind_time = bind_start.elapsed();
    let mut summary = Summary::new();
    let mut shown = String::new();
    for _ in 0..repeat.max(1) {
        let start = Instant::now();
        let call_error = |source| Error::Call { procedure: procedure.to_string(), source };
        let mut call = binding.call(index as u16).map_err(call_error)?;
        call.writer().put(&encoded);
        let reply = call.invoke().map_err(call_error)?;
        let mut r = reply.reader();
        let mut out = Vec::new();
        for len in &buffers {
            let bytes = r.take(*len).map_err(|e| call_error(tiercel::Reply::bad_result(e)))?;
            out.push(
                dynamic::decode(&Ty::Bytes, &types, &mut tiercel::wire::Reader::new(&with_len(bytes)))
                    .unwrap_or_default(),
            );
        }
        let result =
            dynamic::decode(&proc.ret, &types, &mut r).map_err(|e| Error::Check(format!("{line}: result: {e}")))?;
        r.finish().map_err(|e| call_error(tiercel::Reply::bad_result(e)))?;
        summary.record(start.elapsed());
        let args_shown: Vec<String> = values.iter().map(|v| v.to_string()).collect();
        shown = format!("{}.{}({}) = {result}", export.name, proc.name, args_shown.join(", "));
        for (i, b) in out.iter().enumerate() {
            shown += &format!("\nbuffer {i} = {b}");
        }
    }
    println!("{shown}");
    println!(
        "latency median {:.1} µs, p99 {:.1} µs over {} call(s) (bind {:.1} µs)",
        summary.median_us(),
        summary.p99_us(),
        repeat.max(1),
        bind_time.as_secs_f64() * 1e6
    );
    Ok(())
}

/// `bytes` with its length in front, to decode them as a byte string.
fn with_len(bytes: &[u8]) -> Vec<u8> {
    let mut v = (bytes.len() as u32).to_le_bytes().to_vec();
    v.extend_from_slice(bytes);
    v
}
