//! The NCCL communicator on device buffers: at world size 1, and with 2 to 4 ranks on the
//! one GPU (NCCL 2.30 with `NCCL_MULTI_RANK_GPU_ENABLE=1`).

use std::time::Duration;

use candle_core::DType;
use tessera_engine::tp::{AllReduceDtype, DeviceComm, Endpoint, NcclEndpoint};

use crate::report::{check, download, gpu, max_abs_diff, rounded, upload, Lcg};

#[test]
fn nccl_collectives_on_device_buffers_and_abort() {
    let device = gpu();
    let mut rng = Lcg(13);
    let values = rng.values(3 * 70);
    let x = upload(&values, &[3, 70], DType::F32, &device);
    for dtype in [AllReduceDtype::F32, AllReduceDtype::Bf16] {
        let endpoint = NcclEndpoint::group(1, dtype, Duration::from_secs(10), true)
            .expect("nccl id")
            .pop()
            .expect("one endpoint");
        let mut comm = Box::new(endpoint).connect(&device).expect("nccl init");
        let sum = comm.all_reduce_sum(&x).expect("all-reduce");
        assert!(sum.device().is_cuda(), "the result stays on the GPU");
        let want = match dtype {
            AllReduceDtype::F32 => values.clone(),
            AllReduceDtype::Bf16 => rounded(&values, DType::BF16),
        };
        let gathered = comm.all_gather(&x, 1).expect("all-gather");
        let broadcast = comm.broadcast(&x, 0).expect("broadcast");
        comm.settle().expect("settle");
        let exact = download(&sum) == want
            && download(&gathered) == values
            && gathered.dims() == [3, 70]
            && download(&broadcast) == values;
        comm.abort("abort requested by the check");
        let after = comm
            .all_reduce_sum(&x)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        let refused = after.contains("abort requested by the check");
        check(
            &format!("NCCL world 1, {dtype:?} all-reduce, all-gather, broadcast, abort"),
            format!("results exact: {exact}; collective after abort refused: {refused}"),
            "exact, refused".into(),
            exact && refused,
        );
    }
}

/// What one rank of a multi-rank check saw: its all-reduce, all-gather and broadcast
/// results, and the mean time of an all-reduce of each timed size in microseconds.
struct RankRun {
    sum: Vec<f32>,
    gathered: Vec<f32>,
    broadcast: Vec<f32>,
    micros: Vec<f64>,
}

/// The rows of each rank's input, and the all-reduce sizes timed: one decode row and a
/// prefill chunk of 512 rows of the Llama-3.1-8B hidden size, in bf16.
const ROWS: usize = 3;
const WIDTH: usize = 70;
const TIMED_ROWS: [usize; 2] = [1, 512];
const HIDDEN: usize = 4096;
const TIMED_REPS: usize = 200;

fn rank_values(rank: usize) -> Vec<f32> {
    Lcg(100 + rank as u64).values(ROWS * WIDTH)
}

/// Runs `world` ranks as threads of this process on the one GPU, each with its own
/// device handle, as the engine's workers do.
fn run_ranks(endpoints: Vec<Box<dyn Endpoint>>, time: bool) -> Vec<RankRun> {
    let handles: Vec<_> = endpoints
        .into_iter()
        .enumerate()
        .map(|(rank, endpoint)| {
            std::thread::spawn(move || {
                let device = tessera_engine::DeviceSpec::Cuda(0).open().expect("cuda:0");
                let mut comm = endpoint.connect(&device).expect("connect");
                let x = upload(&rank_values(rank), &[ROWS, WIDTH], DType::F32, &device);
                let sum = comm.all_reduce_sum(&x).expect("all-reduce");
                let gathered = comm.all_gather(&x, 0).expect("all-gather");
                let broadcast = comm.broadcast(&x, 1).expect("broadcast");
                comm.settle().expect("settle");
                let mut micros = Vec::new();
                if time {
                    for rows in TIMED_ROWS {
                        let t = upload(
                            &vec![0.5; rows * HIDDEN],
                            &[rows, HIDDEN],
                            DType::BF16,
                            &device,
                        );
                        for _ in 0..10 {
                            comm.all_reduce_sum(&t).expect("warm-up all-reduce");
                        }
                        comm.settle().expect("settle");
                        comm.barrier().expect("barrier");
                        let started = std::time::Instant::now();
                        for _ in 0..TIMED_REPS {
                            comm.all_reduce_sum(&t).expect("timed all-reduce");
                        }
                        comm.settle().expect("settle");
                        micros.push(started.elapsed().as_secs_f64() * 1e6 / TIMED_REPS as f64);
                    }
                }
                RankRun {
                    sum: download(&sum),
                    gathered: download(&gathered),
                    broadcast: download(&broadcast),
                    micros,
                }
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank thread"))
        .collect()
}

fn boxed<E: Endpoint + 'static>(endpoints: Vec<E>) -> Vec<Box<dyn Endpoint>> {
    endpoints
        .into_iter()
        .map(|e| Box::new(e) as Box<dyn Endpoint>)
        .collect()
}

/// NCCL with 2 to 4 ranks on the one GPU (NCCL 2.30 with `NCCL_MULTI_RANK_GPU_ENABLE=1`):
/// all-reduce against the host's sum, all-gather and broadcast exact; at world 2 the time
/// of a decode-sized and a prefill-sized bf16 all-reduce over NCCL beside the same-GPU
/// communicator (recorded, not bounded: ranks of one GPU are not a link between GPUs).
#[test]
fn nccl_with_several_ranks_on_one_gpu() {
    let version = tessera_engine::tp::nccl_version::loaded().expect("NCCL loads");
    let enabled = std::env::var(tessera_engine::tp::nccl_version::MULTI_RANK_VARIABLE).ok();
    let refusal = tessera_engine::tp::nccl_version::refuse_ranks_sharing_a_gpu(
        version,
        enabled.as_deref(),
        2,
    );
    check(
        "NCCL loaded for several ranks on one GPU",
        format!(
            "NCCL {version}; {}",
            refusal.clone().unwrap_or_else(|| "allowed".into())
        ),
        ">= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1".into(),
        refusal.is_none(),
    );
    let timeout = Duration::from_secs(60);
    for world in 2..=4 {
        let endpoints =
            NcclEndpoint::group(world, AllReduceDtype::F32, timeout, true).expect("nccl id");
        let runs = run_ranks(boxed(endpoints), world == 2);
        let inputs: Vec<Vec<f32>> = (0..world).map(rank_values).collect();
        let want_sum: Vec<f32> = (0..ROWS * WIDTH)
            .map(|i| inputs.iter().map(|v| v[i] as f64).sum::<f64>() as f32)
            .collect();
        let want_gathered: Vec<f32> = inputs.concat();
        let worst = runs
            .iter()
            .map(|r| max_abs_diff(&r.sum, &want_sum))
            .fold(0f32, f32::max);
        let exact = runs
            .iter()
            .all(|r| r.gathered == want_gathered && r.broadcast == inputs[1]);
        check(
            &format!("NCCL world {world} on one GPU: all-reduce, all-gather, broadcast"),
            format!("all-reduce max |err| {worst:.1e} against the host's sum; gather and broadcast exact: {exact}"),
            "< 1e-5; exact".into(),
            worst < 1e-5 && exact,
        );
        if world == 2 {
            let same_gpu = run_ranks(
                boxed(DeviceComm::group(2, AllReduceDtype::F32, timeout)),
                true,
            );
            for (i, rows) in TIMED_ROWS.iter().enumerate() {
                let nccl = runs.iter().map(|r| r.micros[i]).fold(0f64, f64::max);
                let device = same_gpu.iter().map(|r| r.micros[i]).fold(0f64, f64::max);
                check(
                    &format!("all-reduce of {rows} x {HIDDEN} bf16 at TP=2 on one GPU"),
                    format!("NCCL {nccl:.1} us, same-GPU communicator {device:.1} us"),
                    "recorded".into(),
                    nccl.is_finite() && device.is_finite(),
                );
            }
        }
    }
}
