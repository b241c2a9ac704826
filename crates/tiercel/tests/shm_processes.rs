//! A user interface (not the seeds' `Test`) through shared memory across two real processes: this
//! test binary starts a copy of itself as the server.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use tiercel::{Client, In, InOut, Out, Server, Transport, Wire};

#[derive(Wire, Debug, Clone, PartialEq)]
pub enum Entry {
    Empty,
    Text(String),
    Pair { key: u64, values: Vec<i32> },
}

#[tiercel::interface(version = 2)]
pub trait Catalog {
    fn describe(&self, e: Entry) -> String;
    fn total(&self, entries: Vec<Entry>) -> Result<u64, String>;
    fn transform(&self, data: In<&[u8]>, out: Out<&mut [u8]>, both: InOut<&mut [u8]>) -> u32;
}

struct CatalogImpl;

impl Catalog for CatalogImpl {
    fn describe(&self, e: Entry) -> String {
        format!("{e:?} from {}", std::process::id())
    }
    fn total(&self, entries: Vec<Entry>) -> Result<u64, String> {
        if entries.is_empty() {
            return Err("no entries".into());
        }
        Ok(entries
            .iter()
            .map(|e| match e {
                Entry::Empty => 0,
                Entry::Text(s) => s.len() as u64,
                Entry::Pair { key, values } => key + values.len() as u64,
            })
            .sum())
    }
    fn transform(&self, data: In<&[u8]>, out: Out<&mut [u8]>, both: InOut<&mut [u8]>) -> u32 {
        for (o, d) in out.0.iter_mut().zip(data.0.iter().cycle()) {
            *o = d.wrapping_mul(3);
        }
        both.0.reverse();
        data.0.len() as u32
    }
}

const ROLE: &str = "TIERCEL_TEST_ROLE";

/// Not a test of its own (ignored, so never counted as one): the server process of
/// `a_user_interface_across_processes`, which runs it with `--ignored`.
#[test]
#[ignore = "the server process of a_user_interface_across_processes"]
fn server_role() {
    if std::env::var(ROLE).as_deref() != Ok("server") {
        return;
    }
    let server = Server::bind("udp://127.0.0.1:0").unwrap().export(CatalogServer::new(CatalogImpl)).start().unwrap();
    println!("listening {}", server.addr());
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn a_user_interface_across_processes() {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["server_role", "--exact", "--ignored", "--nocapture", "--test-threads", "1"])
        .env(ROLE, "server")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let addr = out
        .lines()
        .map_while(Result::ok)
        // libtest may print "test server_role ... " on the same line first.
        .find_map(|l| l.split_once("listening ").map(|(_, a)| a.trim().to_string()))
        .expect("the server process prints its address");
    let client: CatalogClient = Client::connect(format!("shm:{addr}")).unwrap().import().unwrap();
    assert_eq!(client.binding().transport(), Transport::SharedMemory);
    let described = client.describe(Entry::Text("hi".into())).unwrap();
    assert!(described.starts_with("Text(\"hi\") from "), "{described}");
    assert_ne!(described, format!("Text(\"hi\") from {}", std::process::id()), "ran in the other process");
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let c = client.clone();
            std::thread::spawn(move || {
                for i in 0..500u64 {
                    let entries = vec![
                        Entry::Empty,
                        Entry::Text("x".repeat(t as usize)),
                        Entry::Pair { key: i, values: vec![1; (i % 5) as usize] },
                    ];
                    assert_eq!(c.total(entries).unwrap(), Ok(t + i + i % 5));
                    let data: Vec<u8> = (0..=t as u8).collect();
                    let mut out = vec![0u8; 300];
                    let mut both = vec![1u8, 2, 3, t as u8];
                    assert_eq!(c.transform(In(&data), Out(&mut out), InOut(&mut both)).unwrap(), t as u32 + 1);
                    assert!(out.iter().enumerate().all(|(k, &o)| o == data[k % data.len()].wrapping_mul(3)));
                    assert_eq!(both, vec![t as u8, 3, 2, 1]);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(client.total(vec![]).unwrap(), Err("no entries".into()));
    let _ = child.kill();
    let _ = child.wait();
}
