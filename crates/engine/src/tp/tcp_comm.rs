//! `TcpComm`: collectives between CPU ranks in different processes (or machines), over
//! TCP, with the reduction order of [`LocalComm`](crate::tp::LocalComm).
//!
//! A star: rank 0 is the hub, every other rank holds one connection to it. In each
//! collective the other ranks send their part; the hub reads them in rank order, combines
//! them exactly as `LocalComm` does (the sum starts from rank 0's values and adds ranks
//! 1, 2, … in turn; bf16 rounds each part before and the sum after) and sends the result
//! back. So TP over processes is bitwise equal to TP in one process. The hub reads every
//! part before it writes any result and the others write before they read, so no pair
//! of ranks ever waits on each other's socket buffers.
//!
//! Every collective runs under the step timeout; a rank that fails shuts its sockets
//! down, which turns every peer's pending read into an error at once (the hub, failing,
//! closes all of its connections, so the error reaches every rank).

use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};

use crate::error::{EngineError, Result};
use crate::tp::comm::{AllReduceDtype, Communicator, Endpoint};
use crate::tp::wire::{self, Cursor, Kind, WireError};

/// Largest frame a collective accepts (the parts of an all-gather together): above any
/// activation a step of the supported models exchanges.
pub const MAX_COLLECTIVE_BYTES: usize = 1 << 30;

/// The group a connection belongs to, checked in the hello: a rank of another group (or
/// of an earlier, aborted one) is turned away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupToken(pub u64);

impl GroupToken {
    pub fn random() -> Self {
        GroupToken(rand::random())
    }
}

enum Role {
    /// Rank 0: accepts the other ranks on this listener.
    Hub(TcpListener),
    /// Connects to the hub at this address.
    Spoke(SocketAddr),
}

/// One rank's way into a TCP group; [`Endpoint::connect`] opens the connections on the
/// rank's own thread.
pub struct TcpEndpoint {
    rank: usize,
    world: usize,
    token: GroupToken,
    dtype: AllReduceDtype,
    timeout: Duration,
    /// How long rank 0 waits for the others to connect (by default `timeout`).
    connect_timeout: Duration,
    role: Role,
}

impl TcpEndpoint {
    /// Rank 0 of a group of `world`, accepting the others on `listener`.
    pub fn hub(
        listener: TcpListener,
        world: usize,
        token: GroupToken,
        dtype: AllReduceDtype,
        timeout: Duration,
    ) -> Self {
        Self {
            rank: 0,
            world,
            token,
            dtype,
            timeout,
            connect_timeout: timeout,
            role: Role::Hub(listener),
        }
    }

    /// Rank `rank` (not 0) of a group whose hub listens at `hub`.
    pub fn spoke(
        hub: SocketAddr,
        rank: usize,
        world: usize,
        token: GroupToken,
        dtype: AllReduceDtype,
        timeout: Duration,
    ) -> Self {
        Self {
            rank,
            world,
            token,
            dtype,
            timeout,
            connect_timeout: timeout,
            role: Role::Spoke(hub),
        }
    }

    /// A whole group on the loopback interface of this process (tests, benchmarks).
    pub fn local_group(
        world: usize,
        dtype: AllReduceDtype,
        timeout: Duration,
    ) -> Result<Vec<TcpEndpoint>> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let token = GroupToken::random();
        let mut all = vec![TcpEndpoint::hub(listener, world, token, dtype, timeout)];
        all.extend((1..world).map(|r| TcpEndpoint::spoke(addr, r, world, token, dtype, timeout)));
        Ok(all)
    }

    /// Gives the ranks `timeout` to connect (ranks on other nodes may still be loading
    /// their weights when rank 0 starts waiting).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Opens the group's connections on this thread. Also [`Endpoint::connect`].
    pub fn open(self) -> Result<TcpComm> {
        let deadline = Instant::now() + self.connect_timeout;
        let links = match self.role {
            Role::Hub(listener) => accept_spokes(&listener, self.world, self.token, deadline)?,
            Role::Spoke(addr) => vec![connect_hub(addr, self.rank, self.world, self.token)?],
        };
        let closers = links
            .iter()
            .map(|s| s.try_clone())
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(TcpComm {
            rank: self.rank,
            world: self.world,
            dtype: self.dtype,
            timeout: self.timeout,
            links,
            closers,
            aborted: Arc::new(Mutex::new(None)),
            sequence: 0,
        })
    }
}

fn hello_payload(rank: usize, world: usize, token: GroupToken) -> Vec<u8> {
    let mut p = Vec::with_capacity(24);
    p.extend(token.0.to_le_bytes());
    p.extend((rank as u64).to_le_bytes());
    p.extend((world as u64).to_le_bytes());
    p
}

fn connect_hub(
    addr: SocketAddr,
    rank: usize,
    world: usize,
    token: GroupToken,
) -> Result<TcpStream> {
    let fail = |m: String| EngineError::CommAborted(format!("rank {rank}: {m}"));
    let timeout = Duration::from_secs(10);
    let mut s = TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| fail(format!("cannot reach rank 0 at {addr}: {e}")))?;
    s.set_nodelay(true)?;
    wire::write_frame(
        &mut s,
        Kind::Hello,
        0,
        &hello_payload(rank, world, token),
        Instant::now() + timeout,
    )
    .map_err(|e| fail(format!("hello to rank 0 at {addr}: {e}")))?;
    Ok(s)
}

/// Accepts ranks `1..world` before `deadline`; connections that are not a rank of this
/// group (another group, a stray client, garbage) are dropped and do not count.
fn accept_spokes(
    listener: &TcpListener,
    world: usize,
    token: GroupToken,
    deadline: Instant,
) -> Result<Vec<TcpStream>> {
    let mut slots: Vec<Option<TcpStream>> = (1..world).map(|_| None).collect();
    let mut missing = world - 1;
    if missing == 0 {
        return Ok(Vec::new());
    }
    let complete = wire::accept_until(listener, deadline, |mut s| {
        let Ok(hello) = wire::expect_frame(&mut s, Kind::Hello, 0, 24, deadline) else {
            return Ok(false);
        };
        let mut c = Cursor::new(&hello);
        let (Ok(t), Ok(rank), Ok(w)) = (c.u64(), c.u64(), c.u64()) else {
            return Ok(false);
        };
        let rank = rank as usize;
        if t != token.0 || w as usize != world || rank == 0 || rank >= world {
            tracing::warn!("rank 0 turned away a connection that is not a rank of its group");
            return Ok(false);
        }
        if slots[rank - 1].is_some() {
            return Ok(false);
        }
        s.set_nodelay(true)?;
        slots[rank - 1] = Some(s);
        missing -= 1;
        Ok(missing == 0)
    })?;
    if !complete {
        let absent: Vec<usize> = slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_none())
            .map(|(i, _)| i + 1)
            .collect();
        return Err(EngineError::CommAborted(format!(
            "rank 0 waited for ranks {absent:?} to connect and gave up"
        )));
    }
    Ok(slots.into_iter().flatten().collect())
}

/// One rank's connections: to every other rank on the hub, to the hub elsewhere.
pub struct TcpComm {
    rank: usize,
    world: usize,
    dtype: AllReduceDtype,
    timeout: Duration,
    /// Hub: `links[r - 1]` is rank `r`. Others: `links[0]` is the hub.
    links: Vec<TcpStream>,
    /// Clones of `links`, to shut them down from [`Communicator::abort`].
    closers: Vec<TcpStream>,
    aborted: Arc<Mutex<Option<String>>>,
    sequence: u64,
}

fn encode(values: &[f32], dtype: AllReduceDtype) -> Vec<u8> {
    match dtype {
        AllReduceDtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        AllReduceDtype::Bf16 => values
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_bits().to_le_bytes())
            .collect(),
    }
}

fn decode(bytes: &[u8], dtype: AllReduceDtype) -> Vec<f32> {
    match dtype {
        AllReduceDtype::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        AllReduceDtype::Bf16 => bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
            .collect(),
    }
}

fn element_bytes(dtype: AllReduceDtype) -> usize {
    match dtype {
        AllReduceDtype::F32 => 4,
        AllReduceDtype::Bf16 => 2,
    }
}

fn to_f32_vec(x: &Tensor) -> Result<Vec<f32>> {
    Ok(x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
}

/// A tensor as an all-gather part: rank count, dims, f32 values.
fn encode_part(x: &Tensor) -> Result<Vec<u8>> {
    let dims = x.dims();
    let mut p = Vec::with_capacity(4 + 8 * dims.len() + 4 * x.elem_count());
    p.extend((dims.len() as u32).to_le_bytes());
    for d in dims {
        p.extend((*d as u64).to_le_bytes());
    }
    p.extend(encode(&to_f32_vec(x)?, AllReduceDtype::F32));
    Ok(p)
}

/// Reads one all-gather part, checking that its dims fit the bytes that follow.
fn decode_part(c: &mut Cursor<'_>) -> std::result::Result<Tensor, WireError> {
    let garbage = |m: String| WireError::Garbage(m);
    let ndim = c.u32()? as usize;
    if ndim > 8 {
        return Err(garbage(format!("a part of {ndim} dimensions")));
    }
    let mut dims = Vec::with_capacity(ndim);
    let mut count: usize = 1;
    for _ in 0..ndim {
        let d = usize::try_from(c.u64()?).map_err(|_| garbage("a dimension overflows".into()))?;
        count = count
            .checked_mul(d)
            .filter(|n| *n <= MAX_COLLECTIVE_BYTES / 4)
            .ok_or_else(|| garbage("a part larger than a frame".into()))?;
        dims.push(d);
    }
    let values = decode(c.take(count * 4)?, AllReduceDtype::F32);
    Tensor::from_vec(values, dims, &Device::Cpu).map_err(|e| garbage(e.to_string()))
}

impl TcpComm {
    fn fail(&self, what: &str, peer: Option<usize>, e: WireError) -> EngineError {
        let who = match peer {
            Some(r) => format!("rank {r}"),
            None => "rank 0".into(),
        };
        let reason = match e {
            WireError::Aborted(m) => m,
            WireError::Closed => format!("{who} disconnected during {what}"),
            WireError::TimedOut => format!(
                "rank {} waited {:?} for {who} during {what}",
                self.rank, self.timeout
            ),
            other => format!("{what} with {who}: {other}"),
        };
        self.abort(&reason);
        EngineError::CommAborted(reason)
    }

    fn check_open(&self) -> Result<()> {
        let aborted = self.aborted.lock().unwrap_or_else(|e| e.into_inner());
        match aborted.as_ref() {
            Some(reason) => Err(EngineError::CommAborted(reason.clone())),
            None => Ok(()),
        }
    }

    /// The hub's side of a collective: every other rank's payload, in rank order, each
    /// checked by `max_len`. `on_part` sees each as it arrives (ranks 1, 2, … in turn).
    fn hub_gather(
        &mut self,
        kind: Kind,
        what: &str,
        max_len: impl Fn(usize) -> usize,
        mut on_part: impl FnMut(usize, Vec<u8>) -> std::result::Result<(), WireError>,
    ) -> Result<()> {
        let seq = self.sequence;
        let deadline = Instant::now() + self.timeout;
        for r in 1..self.world {
            let got = wire::expect_frame(&mut self.links[r - 1], kind, seq, max_len(r), deadline)
                .and_then(|p| on_part(r, p));
            if let Err(e) = got {
                return Err(self.fail(what, Some(r), e));
            }
        }
        Ok(())
    }

    fn hub_send_all(&mut self, kind: Kind, what: &str, payload: &[u8]) -> Result<()> {
        let seq = self.sequence;
        let deadline = Instant::now() + self.timeout;
        for r in 1..self.world {
            if let Err(e) = wire::write_frame(&mut self.links[r - 1], kind, seq, payload, deadline)
            {
                return Err(self.fail(what, Some(r), e));
            }
        }
        Ok(())
    }

    /// A non-hub rank's side: sends its part, returns the hub's answer.
    fn spoke_exchange(
        &mut self,
        kind: Kind,
        what: &str,
        part: &[u8],
        reply_max: usize,
    ) -> Result<Vec<u8>> {
        let seq = self.sequence;
        let deadline = Instant::now() + self.timeout;
        let s = &mut self.links[0];
        let reply = wire::write_frame(s, kind, seq, part, deadline)
            .and_then(|_| wire::expect_frame(s, kind, seq, reply_max, deadline));
        reply.map_err(|e| self.fail(what, None, e))
    }

    fn run<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        self.check_open()?;
        let out = f(self);
        self.sequence += 1;
        out
    }
}

impl Endpoint for TcpEndpoint {
    fn connect(self: Box<Self>, _device: &Device) -> Result<Box<dyn Communicator>> {
        Ok(Box::new(self.open()?))
    }
}

impl Communicator for TcpComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn all_reduce_sum(&mut self, x: &Tensor) -> Result<Tensor> {
        if self.world == 1 {
            return Ok(x.clone());
        }
        let dtype = self.dtype;
        let mut mine = to_f32_vec(x)?;
        let n = mine.len();
        let bytes = n * element_bytes(dtype);
        if bytes > MAX_COLLECTIVE_BYTES {
            return Err(EngineError::CommAborted(format!(
                "an all-reduce of {bytes} bytes is above the {MAX_COLLECTIVE_BYTES} a frame carries"
            )));
        }
        let sum = self.run(|c| {
            if c.rank != 0 {
                let reply =
                    c.spoke_exchange(Kind::AllReduce, "all-reduce", &encode(&mine, dtype), bytes)?;
                if reply.len() != bytes {
                    let e =
                        WireError::Garbage(format!("a sum of {} bytes for {bytes}", reply.len()));
                    return Err(c.fail("all-reduce", None, e));
                }
                return Ok(decode(&reply, dtype));
            }
            if dtype == AllReduceDtype::Bf16 {
                mine = decode(&encode(&mine, dtype), dtype);
            }
            // Rank 0's values, then ranks 1, 2, … added in turn: LocalComm's order.
            let mut sum = mine;
            c.hub_gather(
                Kind::AllReduce,
                "all-reduce",
                |_| bytes,
                |r, part| {
                    if part.len() != bytes {
                        return Err(WireError::Garbage(format!(
                            "rank {r} sent {} bytes for {bytes}",
                            part.len()
                        )));
                    }
                    sum.iter_mut()
                        .zip(decode(&part, dtype))
                        .for_each(|(s, o)| *s += o);
                    Ok(())
                },
            )?;
            let out = encode(&sum, dtype);
            c.hub_send_all(Kind::AllReduce, "all-reduce", &out)?;
            Ok(match dtype {
                AllReduceDtype::F32 => sum,
                AllReduceDtype::Bf16 => decode(&out, dtype),
            })
        })?;
        Ok(Tensor::from_vec(sum, x.shape(), &Device::Cpu)?.to_dtype(x.dtype())?)
    }

    fn all_gather(&mut self, x: &Tensor, dim: usize) -> Result<Tensor> {
        if self.world == 1 {
            return Ok(x.clone());
        }
        let mine = encode_part(x)?;
        let world = self.world;
        let gathered = self.run(|c| {
            if c.rank != 0 {
                return c.spoke_exchange(
                    Kind::AllGather,
                    "all-gather",
                    &mine,
                    MAX_COLLECTIVE_BYTES,
                );
            }
            let mut all = mine;
            c.hub_gather(
                Kind::AllGather,
                "all-gather",
                |_| MAX_COLLECTIVE_BYTES,
                |r, part| {
                    // Check the part here, so a bad one is blamed on its sender.
                    let mut cur = Cursor::new(&part);
                    decode_part(&mut cur)?;
                    if !cur.is_empty() {
                        return Err(WireError::Garbage(format!(
                            "rank {r}'s part has trailing bytes"
                        )));
                    }
                    if all.len() + part.len() > MAX_COLLECTIVE_BYTES {
                        return Err(WireError::Garbage(
                            "the gathered parts exceed a frame".into(),
                        ));
                    }
                    all.extend(part);
                    Ok(())
                },
            )?;
            c.hub_send_all(Kind::AllGather, "all-gather", &all)?;
            Ok(all)
        })?;
        let mut cur = Cursor::new(&gathered);
        let mut parts = Vec::with_capacity(world);
        for _ in 0..world {
            match decode_part(&mut cur) {
                Ok(t) => parts.push(t),
                Err(e) => return Err(self.fail("all-gather", None, e)),
            }
        }
        Ok(Tensor::cat(&parts, dim)?.to_dtype(x.dtype())?)
    }

    fn broadcast(&mut self, x: &Tensor, root: usize) -> Result<Tensor> {
        if self.world == 1 {
            return Ok(x.clone());
        }
        if root >= self.world {
            return Err(EngineError::Parallel(format!(
                "broadcast from rank {root} in a group of {}",
                self.world
            )));
        }
        let bytes = x.elem_count() * 4;
        let mine = if self.rank == root {
            encode(&to_f32_vec(x)?, AllReduceDtype::F32)
        } else {
            Vec::new()
        };
        let data = self.run(|c| {
            if c.rank != 0 {
                let reply = c.spoke_exchange(Kind::Broadcast, "broadcast", &mine, bytes)?;
                if reply.len() != bytes {
                    let e = WireError::Garbage(format!("{} bytes for {bytes}", reply.len()));
                    return Err(c.fail("broadcast", None, e));
                }
                return Ok(reply);
            }
            let mut data = mine;
            c.hub_gather(
                Kind::Broadcast,
                "broadcast",
                |r| if r == root { bytes } else { 0 },
                |r, part| {
                    if r == root {
                        if part.len() != bytes {
                            return Err(WireError::Garbage(format!(
                                "rank {r} broadcast {} bytes for {bytes}",
                                part.len()
                            )));
                        }
                        data = part;
                    }
                    Ok(())
                },
            )?;
            c.hub_send_all(Kind::Broadcast, "broadcast", &data)?;
            Ok(data)
        })?;
        let values = decode(&data, AllReduceDtype::F32);
        Ok(Tensor::from_vec(values, x.shape(), &Device::Cpu)?.to_dtype(x.dtype())?)
    }

    fn barrier(&mut self) -> Result<()> {
        if self.world == 1 {
            return Ok(());
        }
        self.run(|c| {
            if c.rank != 0 {
                c.spoke_exchange(Kind::Barrier, "barrier", &[], 0)?;
                return Ok(());
            }
            c.hub_gather(Kind::Barrier, "barrier", |_| 0, |_, _| Ok(()))?;
            c.hub_send_all(Kind::Barrier, "barrier", &[])
        })
    }

    fn abort(&self, reason: &str) {
        self.aborted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(|| reason.to_string());
        // Tell the peers why (best effort, briefly), so the reason reaches every rank
        // instead of a bare disconnect; then close.
        let deadline = Instant::now() + Duration::from_millis(200);
        for s in &self.closers {
            if let Ok(mut w) = s.try_clone() {
                let why = &reason.as_bytes()[..reason.len().min(4096)];
                let _ = wire::write_frame(&mut w, Kind::Abort, 0, why, deadline);
            }
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

#[cfg(test)]
mod tests;
