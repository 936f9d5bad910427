//! `TcpComm` against `LocalComm` (bitwise), and against peers that misbehave.

use super::*;
use crate::tp::LocalComm;
use std::io::Write;

/// Runs `f` on every rank of a group, one thread each, and returns each rank's result.
fn on_ranks<C, F>(comms: Vec<C>, f: F) -> Vec<Result<Vec<Tensor>>>
where
    C: Communicator + Send,
    F: Fn(&mut C) -> Result<Vec<Tensor>> + Sync,
{
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut c| {
                let f = &f;
                s.spawn(move || f(&mut c))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(EngineError::Step("panic".into())))
            })
            .collect()
    })
}

fn tcp_group(world: usize, dtype: AllReduceDtype, timeout: Duration) -> Vec<TcpComm> {
    let endpoints = TcpEndpoint::local_group(world, dtype, timeout).expect("group");
    // Ranks connect on their own threads (rank 0 waits for the others).
    std::thread::scope(|s| {
        let handles: Vec<_> = endpoints
            .into_iter()
            .map(|e| s.spawn(move || e.open()))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread").expect("connect"))
            .collect()
    })
}

/// Values with many significant bits and mixed signs and magnitudes, so any change in
/// the order of the additions changes the bits of some sums.
fn awkward(rank: usize, step: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let x = ((rank * 7919 + step * 104_729 + i * 31) % 10007) as f32;
            let sign = if (i + rank).is_multiple_of(3) {
                -1.0
            } else {
                1.0
            };
            sign * (x / 7.0).powf(1.0 + (i % 5) as f32) * 1e-3 + 1.0 / (1.0 + x)
        })
        .collect()
}

fn workload<C: Communicator>(c: &mut C) -> Result<Vec<Tensor>> {
    let mut out = Vec::new();
    for step in 0..20 {
        let n = 1 + step * 37;
        let x = Tensor::from_vec(awkward(c.rank(), step, n), n, &Device::Cpu)?;
        out.push(c.all_reduce_sum(&x)?);
        // Uneven parts along dim 1, as a vocab-parallel head gathers them.
        let cols = 1 + c.rank() + step % 3;
        let part = Tensor::from_vec(
            awkward(c.rank(), step + 1, 2 * cols),
            (2, cols),
            &Device::Cpu,
        )?;
        out.push(c.all_gather(&part, 1)?);
        out.push(c.broadcast(&x, step % c.world_size())?);
        c.barrier()?;
    }
    // A bf16 tensor keeps its dtype through the collective.
    let x = Tensor::from_vec(awkward(c.rank(), 99, 64), 64, &Device::Cpu)?.to_dtype(DType::BF16)?;
    out.push(c.all_reduce_sum(&x)?.to_dtype(DType::F32)?);
    Ok(out)
}

fn bits(ts: &[Tensor]) -> Vec<Vec<u32>> {
    ts.iter()
        .map(|t| {
            t.flatten_all()
                .and_then(|t| t.to_vec1::<f32>())
                .expect("values")
                .iter()
                .map(|v| v.to_bits())
                .collect()
        })
        .collect()
}

#[test]
fn results_are_bitwise_those_of_local_comm() {
    for dtype in [AllReduceDtype::F32, AllReduceDtype::Bf16] {
        for world in [2, 3, 4] {
            let timeout = Duration::from_secs(20);
            let local = on_ranks(LocalComm::group(world, dtype, timeout), workload);
            let tcp = on_ranks(tcp_group(world, dtype, timeout), workload);
            for (rank, (l, t)) in local.into_iter().zip(tcp).enumerate() {
                let (l, t) = (l.expect("local"), t.expect("tcp"));
                assert_eq!(bits(&l), bits(&t), "{dtype:?}, world {world}, rank {rank}");
            }
        }
    }
}

#[test]
fn a_rank_that_disconnects_fails_the_others_with_an_error() {
    let mut comms = tcp_group(3, AllReduceDtype::F32, Duration::from_secs(30));
    let gone = comms.pop().expect("rank 2");
    drop(gone);
    let results = on_ranks(comms, |c| {
        let x = Tensor::ones(8, DType::F32, &Device::Cpu)?;
        c.all_reduce_sum(&x).map(|t| vec![t])
    });
    for r in results {
        let msg = r.expect_err("must fail").to_string();
        assert!(msg.contains("rank 2 disconnected"), "{msg}");
    }
}

#[test]
fn an_aborting_rank_passes_its_reason_to_every_rank() {
    let comms = tcp_group(3, AllReduceDtype::F32, Duration::from_secs(30));
    let results = on_ranks(comms, |c| {
        if c.rank() == 1 {
            c.abort("rank 1 failed: out of luck");
            return Err(EngineError::Step("aborted".into()));
        }
        c.barrier().map(|_| Vec::new())
    });
    for (rank, r) in results.into_iter().enumerate() {
        let msg = r.expect_err("must fail").to_string();
        if rank != 1 {
            assert!(msg.contains("out of luck"), "rank {rank}: {msg}");
        }
    }
}

/// A fake rank 1 that says hello properly, then does something wrong.
fn with_fake_rank1(bytes_after_hello: Vec<u8>, close: bool) -> String {
    let timeout = Duration::from_secs(2);
    let token = GroupToken::random();
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let hub = TcpEndpoint::hub(listener, 2, token, AllReduceDtype::F32, timeout);
    let fake = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).expect("connect");
        wire::write_frame(
            &mut s,
            Kind::Hello,
            0,
            &hello_payload(1, 2, token),
            Instant::now() + timeout,
        )
        .expect("hello");
        s.write_all(&bytes_after_hello).expect("write");
        if !close {
            // Stay connected, silent, until the hub gives up.
            let mut sink = [0u8; 64];
            let _ = std::io::Read::read(&mut s, &mut sink);
        }
    });
    let mut hub = hub.open().expect("open");
    let x = Tensor::ones(1000, DType::F32, &Device::Cpu).expect("tensor");
    let err = hub.all_reduce_sum(&x).expect_err("must fail").to_string();
    fake.join().expect("fake rank");
    // The group stays failed.
    assert!(hub.barrier().is_err());
    err
}

fn header(kind: u8, seq: u64, len: u32) -> Vec<u8> {
    let mut h = Vec::from(wire::MAGIC);
    h.push(kind);
    h.extend(seq.to_le_bytes());
    h.extend(len.to_le_bytes());
    h
}

#[test]
fn garbage_a_huge_length_a_wrong_size_or_silence_are_errors() {
    let err = with_fake_rank1(b"this is not a frame at all".to_vec(), true);
    assert!(err.contains("bad magic"), "{err}");

    let err = with_fake_rank1(header(Kind::AllReduce as u8, 0, u32::MAX), false);
    assert!(err.contains("above the 4000"), "{err}");

    let mut short = header(Kind::AllReduce as u8, 0, 8);
    short.extend([0u8; 8]);
    let err = with_fake_rank1(short, false);
    assert!(
        err.contains("above the 4000") || err.contains("8 bytes for 4000"),
        "{err}"
    );

    let err = with_fake_rank1(header(Kind::Barrier as u8, 0, 0), false);
    assert!(err.contains("expected AllReduce"), "{err}");

    let err = with_fake_rank1(Vec::new(), false);
    assert!(err.contains("waited"), "{err}");
}

#[test]
fn a_rank_that_never_connects_times_out() {
    let mut endpoints =
        TcpEndpoint::local_group(3, AllReduceDtype::F32, Duration::from_millis(300))
            .expect("group");
    let _rank2 = endpoints.pop();
    let rank1 = endpoints.pop().expect("rank 1");
    let hub = endpoints.pop().expect("rank 0");
    let joined = std::thread::spawn(move || rank1.open().map(|_| ()));
    let err = hub.open().err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("ranks [2]"), "{err}");
    let _ = joined.join();
}

#[test]
fn strangers_are_turned_away_at_the_door() {
    let endpoints =
        TcpEndpoint::local_group(2, AllReduceDtype::F32, Duration::from_secs(10)).expect("group");
    let Role::Spoke(addr) = endpoints[1].role else {
        panic!("rank 1 is a spoke");
    };
    // A client of another group, and an HTTP client, come first.
    let mut other = TcpStream::connect(addr).expect("connect");
    wire::write_frame(
        &mut other,
        Kind::Hello,
        0,
        &hello_payload(1, 2, GroupToken(1)),
        Instant::now() + Duration::from_secs(1),
    )
    .expect("hello");
    let mut http = TcpStream::connect(addr).expect("connect");
    http.write_all(b"GET / HTTP/1.1\r\n\r\n").expect("write");
    let comms = std::thread::scope(|s| {
        let handles: Vec<_> = endpoints
            .into_iter()
            .map(|e| s.spawn(move || e.open()))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread").expect("connect"))
            .collect::<Vec<_>>()
    });
    let results = on_ranks(comms, |c| {
        let x = Tensor::full(c.rank() as f32 + 1.0, 4, &Device::Cpu)?;
        c.all_reduce_sum(&x).map(|t| vec![t])
    });
    for r in results {
        assert_eq!(
            r.expect("sum")[0].to_vec1::<f32>().expect("values"),
            vec![3.0; 4]
        );
    }
}
