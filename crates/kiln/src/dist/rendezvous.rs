//! How the ranks of a multi-process group find each other: rank 0 hands every other rank a
//! 128-byte NCCL id, over TCP (rank 0 listens on `MASTER_PORT`) or through a file.

use crate::{Error, Result};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const MAGIC: &[u8; 8] = b"kiln-rv1";

/// Where the ranks meet (see [`ProcessGroup::join`](super::ProcessGroup::join)).
#[derive(Clone, Debug)]
pub enum Rendezvous {
    /// Rank 0 listens on `port` (all interfaces); the others connect to `addr:port`.
    Tcp {
        addr: String,
        port: u16,
        timeout: Duration,
    },
    /// Rank 0 writes the id to `path` (which must not exist yet) and deletes it once every
    /// rank has joined; the others poll for it.
    File { path: PathBuf, timeout: Duration },
}

impl Rendezvous {
    /// From `KILN_RENDEZVOUS_FILE`, else `MASTER_ADDR` and `MASTER_PORT`;
    /// `KILN_RENDEZVOUS_TIMEOUT` in seconds (default 300).
    pub fn from_env() -> Result<Rendezvous> {
        let timeout = super::env_seconds("KILN_RENDEZVOUS_TIMEOUT", 300.0)?;
        if let Ok(path) = std::env::var("KILN_RENDEZVOUS_FILE") {
            return Ok(Rendezvous::File {
                path: path.into(),
                timeout,
            });
        }
        let addr = std::env::var("MASTER_ADDR").map_err(|_| {
            Error::msg(
                "a group of several processes needs MASTER_ADDR and MASTER_PORT (as torchrun \
                 sets them) or KILN_RENDEZVOUS_FILE",
            )
        })?;
        let port = std::env::var("MASTER_PORT")
            .map_err(|_| Error::msg("MASTER_ADDR is set but MASTER_PORT is not"))?;
        let port = port
            .parse::<u16>()
            .map_err(|_| Error::msg(format!("MASTER_PORT = '{port}': expected a port number")))?;
        Ok(Rendezvous::Tcp {
            addr,
            port,
            timeout,
        })
    }

    /// Rank 0 passes `Some(id)` and gets it back once every rank has it; the others pass
    /// `None` and get rank 0's id.
    pub fn share(&self, rank: usize, world: usize, id: Option<[u8; 128]>) -> Result<[u8; 128]> {
        let fail = |reason: String| Error::Collective {
            op: format!("rendezvous of rank {rank} of {world} at {}", self.place()),
            reason,
        };
        match (self, id) {
            (Rendezvous::Tcp { port, timeout, .. }, Some(id)) => {
                serve(*port, world, id, *timeout).map_err(fail)?;
                Ok(id)
            }
            (
                Rendezvous::Tcp {
                    addr,
                    port,
                    timeout,
                },
                None,
            ) => fetch(addr, *port, rank, world, *timeout).map_err(fail),
            (Rendezvous::File { path, .. }, Some(id)) => {
                if path.exists() {
                    return Err(fail(format!(
                        "{} already exists (left by an earlier run?): remove it first",
                        path.display()
                    )));
                }
                let tmp = path.with_extension(format!("tmp{}", std::process::id()));
                let mut bytes = MAGIC.to_vec();
                bytes.extend_from_slice(&(world as u32).to_le_bytes());
                bytes.extend_from_slice(&id);
                std::fs::write(&tmp, &bytes)
                    .and_then(|()| std::fs::rename(&tmp, path))
                    .map_err(|e| fail(format!("writing {}: {e}", path.display())))?;
                Ok(id)
            }
            (Rendezvous::File { path, timeout }, None) => {
                let deadline = Instant::now() + *timeout;
                loop {
                    if let Ok(bytes) = std::fs::read(path) {
                        return parse_file(&bytes, world).map_err(fail);
                    }
                    if Instant::now() >= deadline {
                        return Err(fail(format!(
                            "rank 0 did not write {} within {:.0} s",
                            path.display(),
                            timeout.as_secs_f64()
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }

    /// Called by rank 0 once every rank has joined: removes the rendezvous file.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn finished(&self) {
        if let Rendezvous::File { path, .. } = self {
            let _ = std::fs::remove_file(path);
        }
    }

    fn place(&self) -> String {
        match self {
            Rendezvous::Tcp { addr, port, .. } => format!("{addr}:{port}"),
            Rendezvous::File { path, .. } => path.display().to_string(),
        }
    }
}

fn parse_file(bytes: &[u8], world: usize) -> std::result::Result<[u8; 128], String> {
    if bytes.len() != 8 + 4 + 128 || &bytes[..8] != MAGIC {
        return Err(format!(
            "the rendezvous file is not one kiln wrote ({} bytes)",
            bytes.len()
        ));
    }
    let theirs = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize;
    if theirs != world {
        return Err(format!("rank 0 has WORLD_SIZE {theirs}, this rank {world}"));
    }
    Ok(bytes[12..].try_into().expect("128 bytes"))
}

/// Rank 0: accepts the `world - 1` other ranks, checks their hello and sends each the id.
fn serve(
    port: u16,
    world: usize,
    id: [u8; 128],
    timeout: Duration,
) -> std::result::Result<(), String> {
    let listener = TcpListener::bind(("0.0.0.0", port))
        .map_err(|e| format!("rank 0 cannot listen on port {port}: {e}"))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("listener: {e}"))?;
    let deadline = Instant::now() + timeout;
    let mut joined = vec![false; world];
    joined[0] = true;
    while joined.iter().any(|j| !j) {
        match listener.accept() {
            Ok((mut stream, peer)) => {
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                let mut hello = [0u8; 16];
                if stream.read_exact(&mut hello).is_err() || &hello[..8] != MAGIC {
                    // Not a kiln rank (a port scan, a stale client): ignore it.
                    continue;
                }
                let rank = u32::from_le_bytes(hello[8..12].try_into().expect("4")) as usize;
                let theirs = u32::from_le_bytes(hello[12..16].try_into().expect("4")) as usize;
                if theirs != world {
                    return Err(format!(
                        "rank {rank} at {peer} has WORLD_SIZE {theirs}, rank 0 has {world}"
                    ));
                }
                if rank == 0 || rank >= world || joined[rank] {
                    return Err(format!(
                        "a second rank {rank} (from {peer}) joined a world of {world}"
                    ));
                }
                stream
                    .write_all(&id)
                    .map_err(|e| format!("sending the id to rank {rank}: {e}"))?;
                joined[rank] = true;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing: Vec<usize> = (0..world).filter(|&r| !joined[r]).collect();
                    return Err(format!(
                        "ranks {missing:?} did not connect within {:.0} s (KILN_RENDEZVOUS_TIMEOUT)",
                        timeout.as_secs_f64()
                    ));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(format!("accepting on port {port}: {e}")),
        }
    }
    Ok(())
}

/// Any other rank: connects to rank 0 (retrying until the deadline), says who it is and
/// reads the id.
fn fetch(
    addr: &str,
    port: u16,
    rank: usize,
    world: usize,
    timeout: Duration,
) -> std::result::Result<[u8; 128], String> {
    let deadline = Instant::now() + timeout;
    loop {
        let target = (addr, port)
            .to_socket_addrs()
            .map_err(|e| format!("resolving {addr}:{port}: {e}"))?
            .next()
            .ok_or_else(|| format!("{addr}:{port} resolves to no address"))?;
        let last = match TcpStream::connect_timeout(&target, Duration::from_secs(2)) {
            Ok(mut stream) => {
                let mut hello = MAGIC.to_vec();
                hello.extend_from_slice(&(rank as u32).to_le_bytes());
                hello.extend_from_slice(&(world as u32).to_le_bytes());
                let left = deadline.saturating_duration_since(Instant::now());
                let _ = stream.set_read_timeout(Some(left.max(Duration::from_secs(1))));
                let mut id = [0u8; 128];
                match stream
                    .write_all(&hello)
                    .and_then(|()| stream.read_exact(&mut id))
                {
                    Ok(()) => return Ok(id),
                    Err(e) => format!("rank 0 closed the connection: {e}"),
                }
            }
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            return Err(format!(
                "could not get the id from rank 0 within {:.0} s (last error: {last})",
                timeout.as_secs_f64()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    #[test]
    fn tcp_hands_every_rank_the_id() {
        let port = free_port();
        let rv = Rendezvous::Tcp {
            addr: "127.0.0.1".into(),
            port,
            timeout: Duration::from_secs(20),
        };
        let id = [7u8; 128];
        let got: Vec<[u8; 128]> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|r| {
                    let rv = rv.clone();
                    s.spawn(move || rv.share(r, 4, (r == 0).then_some(id)).unwrap())
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(got.iter().all(|g| *g == id));
    }

    #[test]
    fn tcp_rejects_a_world_size_mismatch_and_times_out() {
        let port = free_port();
        let rv = |t| Rendezvous::Tcp {
            addr: "127.0.0.1".into(),
            port,
            timeout: Duration::from_secs_f64(t),
        };
        let (r0, r1) = std::thread::scope(|s| {
            let a = s.spawn(|| rv(10.0).share(0, 2, Some([1; 128])));
            let b = s.spawn(|| rv(10.0).share(1, 3, None));
            (a.join().unwrap(), b.join().unwrap())
        });
        let e = r0.unwrap_err().to_string();
        assert!(
            e.contains("WORLD_SIZE 3") && e.contains("rank 0 has 2"),
            "{e}"
        );
        assert!(r1.is_err());
        let e = rv(0.3).share(0, 2, Some([1; 128])).unwrap_err().to_string();
        assert!(e.contains("ranks [1] did not connect"), "{e}");
    }

    #[test]
    fn file_rendezvous_checks_what_it_reads() {
        let dir = std::env::temp_dir().join(format!("kiln-rv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("id");
        let _ = std::fs::remove_file(&path);
        let rv = Rendezvous::File {
            path: path.clone(),
            timeout: Duration::from_secs(10),
        };
        let id = [9u8; 128];
        let got = std::thread::scope(|s| {
            let other = s.spawn(|| rv.share(1, 2, None));
            rv.share(0, 2, Some(id)).unwrap();
            other.join().unwrap().unwrap()
        });
        assert_eq!(got, id);
        // A world-size mismatch and a file that is not kiln's are errors, not panics.
        let e = rv.share(1, 5, None).unwrap_err().to_string();
        assert!(e.contains("WORLD_SIZE 2"), "{e}");
        std::fs::write(&path, b"garbage").unwrap();
        let e = rv.share(1, 2, None).unwrap_err().to_string();
        assert!(e.contains("not one kiln wrote"), "{e}");
        // Rank 0 refuses to reuse an existing file.
        let e = rv.share(0, 2, Some(id)).unwrap_err().to_string();
        assert!(e.contains("already exists"), "{e}");
        rv.finished();
        assert!(!path.exists());
    }
}
