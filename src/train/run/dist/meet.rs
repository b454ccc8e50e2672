//! Every rank out of `MPI_Init` before any rank sends an MPI message.
//!
//! Open MPI 4.1 (Debian 12's, under `srun --mpi=pmix`) can release one
//! rank from `MPI_Init` while another is still waiting there for its
//! address exchange, before its message layer has registered the handlers
//! of incoming messages: the first message that reaches it (the other
//! rank's first collective) is dispatched to a handler that is not there,
//! and the rank dies of SIGSEGV inside `MPI_Init`
//! (`mca_btl_tcp.so` → `ompi_mpi_init`; seen about once in 250 two-node
//! launches on a loaded machine). So, between `MPI_Init` and the first
//! message, the ranks meet once outside MPI, on `MASTER_ADDR:MASTER_PORT`
//! (sweep's job scripts set both, checked reachable by the launch doctor;
//! a step `srun` started without them meets on its first node): rank 0
//! listens and answers once every other rank has said it is out of
//! `MPI_Init`. Ranks with neither (`mpirun` by hand) go on as before.

use super::Ranks;
use anyhow::{bail, Context, Result};
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// How long ranks wait for each other: as long as a slow `MPI_Init` of a
/// large job takes, well inside the watchdog's start-up limit.
pub const LIMIT: Duration = Duration::from_secs(300);

/// Where the ranks meet, and what tells this launch's ranks from a stray
/// connection (another job's, on a reused port).
#[derive(Debug, Clone)]
pub struct Place {
    pub host: String,
    pub port: u16,
    pub token: u64,
}

impl Place {
    /// `MASTER_ADDR:MASTER_PORT`, where both are set; else, for ranks
    /// `srun` started itself (`sweep bench ddp --nodes`, a hand-written
    /// `srun`), the step's first node — where `srun` places task 0 — on a
    /// port drawn from the job and step ids. The token from what every rank
    /// of one launch sees alike.
    pub fn from_env() -> Result<Option<Place>> {
        let var = |k: &str| std::env::var(k).ok();
        let launch: Vec<String> = [
            "SLURM_JOB_ID",
            "SLURM_STEP_ID",
            "SLURM_RESTART_COUNT",
            "WORLD_SIZE",
        ]
        .iter()
        .map(|k| var(k).unwrap_or_default())
        .collect();
        let (host, port) = match (var("MASTER_ADDR"), var("MASTER_PORT")) {
            (Some(host), Some(port)) => {
                let port = port
                    .trim()
                    .parse()
                    .with_context(|| format!("MASTER_PORT={port:?} is not a port"))?;
                (host, port)
            }
            _ => match var("SLURM_STEP_NODELIST") {
                Some(list) => {
                    let first = crate::util::slurm::hostnames(&list)
                        .and_then(|nodes| crate::util::slurm::node_address(&nodes[0]));
                    let addr = match first {
                        Ok(addr) => addr,
                        Err(why) => {
                            // Every rank sees the same and goes on alike.
                            eprintln!("sweep train: no MASTER_ADDR and MASTER_PORT, and the step's first node is unknown ({why}): the ranks do not meet before their first MPI message");
                            return Ok(None);
                        }
                    };
                    let drawn = fnv1a(launch.join("/").as_bytes()) % STEP_PORTS as u64;
                    (addr.to_string(), STEP_PORT_BASE + drawn as u16)
                }
                None => return Ok(None),
            },
        };
        let token = fnv1a(format!("{host}:{port}/{}", launch.join("/")).as_bytes());
        Ok(Some(Place { host, port, token }))
    }
}

/// The ports a step without `MASTER_PORT` draws its meeting port from:
/// above `[slurm] master_port`'s default, as the launch doctor draws.
const STEP_PORT_BASE: u16 = 29500;
const STEP_PORTS: u16 = 2000;

/// Returns once every rank has called it, or fails naming who was missing.
pub fn all_ranks(ranks: Ranks, place: &Place, limit: Duration) -> Result<()> {
    if ranks.world_size <= 1 {
        return Ok(());
    }
    match ranks.rank {
        0 => gather(ranks.world_size, place, limit),
        r => report(r, place, limit),
    }
}

/// Rank 0: waits for every other rank's hello, then answers each.
fn gather(world: usize, place: &Place, limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    let listener = TcpListener::bind(("0.0.0.0", place.port)).with_context(|| {
        format!(
            "rank 0 listening on port {} (MASTER_PORT) to meet the other ranks",
            place.port
        )
    })?;
    listener.set_nonblocking(true)?;
    let mut met: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
    let mut missing = world - 1;
    while missing > 0 {
        match listener.accept() {
            Ok((stream, _)) => {
                if let Some(r) = hello(&stream, place.token, world) {
                    if r != 0 && met[r].is_none() {
                        met[r] = Some(stream);
                        missing -= 1;
                    }
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    let absent: Vec<String> = (1..world)
                        .filter(|&r| met[r].is_none())
                        .map(|r| r.to_string())
                        .collect();
                    bail!(
                        "rank(s) {} did not come out of MPI_Init within {:.0} s (rank 0 waited on port {})",
                        absent.join(", "),
                        limit.as_secs_f64(),
                        place.port
                    );
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            // A connection reset before it was accepted, a signal: go on.
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ConnectionAborted | ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e).context("rank 0 accepting the other ranks"),
        }
    }
    for stream in met.iter_mut().flatten() {
        // A rank that died since its hello finds out by itself.
        let _ = stream.write_all(b"G");
    }
    Ok(())
}

/// One accepted connection's rank, where it is this launch's.
fn hello(mut stream: &TcpStream, token: u64, world: usize) -> Option<usize> {
    stream.set_nonblocking(false).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    let mut buf = [0u8; 12];
    stream.read_exact(&mut buf).ok()?;
    let (t, r) = buf.split_at(8);
    let r = u32::from_le_bytes(r.try_into().ok()?) as usize;
    (u64::from_le_bytes(t.try_into().ok()?) == token && r < world).then_some(r)
}

/// Rank r > 0: says it is out of `MPI_Init` (rank 0 may not listen yet:
/// it is in `MPI_Init` too), then waits for rank 0's answer.
fn report(rank: usize, place: &Place, limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    // Every address the name has, IPv4 first ("localhost" may name ::1
    // first, and rank 0 listens on IPv4).
    let mut addrs: Vec<_> = (place.host.as_str(), place.port)
        .to_socket_addrs()
        .with_context(|| format!("resolving MASTER_ADDR={}", place.host))?
        .collect();
    addrs.sort_by_key(|a| !a.is_ipv4());
    if addrs.is_empty() {
        bail!("MASTER_ADDR={} resolves to no address", place.host);
    }
    let mut hello = place.token.to_le_bytes().to_vec();
    hello.extend((rank as u32).to_le_bytes());
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!(
                "rank 0 did not answer on {}:{} within {:.0} s (still in MPI_Init, or gone)",
                place.host,
                place.port,
                limit.as_secs_f64()
            );
        }
        let wait = left.min(Duration::from_secs(2));
        let Some(mut stream) = addrs
            .iter()
            .find_map(|a| TcpStream::connect_timeout(a, wait).ok())
        else {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        if stream.write_all(&hello).is_err() {
            continue;
        }
        stream.set_read_timeout(Some(left))?;
        let mut answer = [0u8; 1];
        return match stream.read_exact(&mut answer) {
            Ok(()) if answer == *b"G" => Ok(()),
            Ok(()) => bail!("rank 0 on {}:{} answered {answer:?}", place.host, place.port),
            Err(e) => Err(e).with_context(|| {
                format!(
                    "waiting for rank 0's answer on {}:{} (another launch's rank 0 on that port refuses this one)",
                    place.host, place.port
                )
            }),
        };
    }
}

/// FNV-1a, 64 bits: a token, not a defence.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
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

    fn place(port: u16, token: u64) -> Place {
        Place {
            host: "127.0.0.1".into(),
            port,
            token,
        }
    }

    fn ranks(rank: usize, world_size: usize) -> Ranks {
        Ranks {
            rank,
            world_size,
            local_rank: rank,
        }
    }

    #[test]
    fn the_ranks_meet_whoever_comes_first_and_a_stranger_is_ignored() {
        let port = free_port();
        let others: Vec<_> = (1..4)
            .map(|r| std::thread::spawn(move || all_ranks(ranks(r, 4), &place(port, 7), LIMIT)))
            .collect();
        // Rank 0 comes out of MPI_Init last; a rank of another launch
        // knocks on the same port first (it keeps retrying, then gives up).
        let stranger =
            std::thread::spawn(move || report(1, &place(port, 8), Duration::from_secs(3)));
        std::thread::sleep(Duration::from_millis(300));
        all_ranks(ranks(0, 4), &place(port, 7), LIMIT).unwrap();
        for t in others {
            t.join().unwrap().unwrap();
        }
        let refused = stranger.join().unwrap().unwrap_err();
        assert!(format!("{refused:#}").contains("rank 0"), "{refused:#}");
    }

    #[test]
    fn a_rank_whose_rank_0_never_comes_says_so_within_the_limit() {
        let port = free_port();
        let e = all_ranks(ranks(2, 3), &place(port, 1), Duration::from_millis(400)).unwrap_err();
        assert!(
            format!("{e:#}").contains(&format!("rank 0 did not answer on 127.0.0.1:{port}")),
            "{e:#}"
        );
    }

    #[test]
    fn rank_0_names_the_ranks_that_never_came() {
        let port = free_port();
        let one = std::thread::spawn(move || all_ranks(ranks(1, 3), &place(port, 5), LIMIT));
        let e = all_ranks(ranks(0, 3), &place(port, 5), Duration::from_millis(1500)).unwrap_err();
        assert!(
            format!("{e:#}").contains("rank(s) 2 did not come out of MPI_Init"),
            "{e:#}"
        );
        // Rank 0 gave up: rank 1's connection closes unanswered.
        assert!(one.join().unwrap().is_err());
    }
}
