//! The NCCL communicator on device buffers at world size 1 (a second GPU is needed for
//! more; NCCL before 2.30 refuses two ranks on one GPU).

use std::time::Duration;

use candle_core::DType;
use tessera_engine::tp::{AllReduceDtype, Endpoint, NcclEndpoint};

use crate::report::{check, download, gpu, rounded, upload, Lcg};

#[test]
fn nccl_collectives_on_device_buffers_and_abort() {
    let device = gpu();
    let mut rng = Lcg(13);
    let values = rng.values(3 * 70);
    let x = upload(&values, &[3, 70], DType::F32, &device);
    for dtype in [AllReduceDtype::F32, AllReduceDtype::Bf16] {
        let endpoint = NcclEndpoint::group(1, dtype, Duration::from_secs(10))
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
