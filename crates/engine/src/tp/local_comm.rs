//! `LocalComm`: collectives between CPU ranks that are threads of one process.
//!
//! Each rank owns a slot per buffer parity; a collective writes the rank's slot, meets the
//! others at an abortable barrier, then reads every slot in rank order. Slots are double
//! buffered by the collective's sequence number: a rank can only overwrite parity `p` in
//! collective `k + 2`, whose barrier no rank passes before all have arrived at `k + 1`,
//! that is, before all have finished reading collective `k`. So one barrier per
//! collective suffices. No global lock, no polling: waiting is a condition variable with
//! a timeout, and a rank that fails or hangs turns into an error on every other rank.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use candle_core::{Device, Tensor};

use crate::error::{EngineError, Result};
use crate::tp::barrier::AbortableBarrier;
use crate::tp::comm::{AllReduceDtype, Communicator, Endpoint};

struct Shared {
    world: usize,
    /// `slots[parity][rank]`: each written only by its rank, read by all after a barrier.
    slots: [Vec<RwLock<Vec<f32>>>; 2],
    barrier: AbortableBarrier,
}

/// One CPU rank's endpoint. Create a whole group with [`LocalComm::group`].
pub struct LocalComm {
    rank: usize,
    shared: Arc<Shared>,
    dtype: AllReduceDtype,
    sequence: u64,
}

impl LocalComm {
    /// Endpoints for `world` ranks; hand one to each worker thread. A collective that
    /// waits longer than `timeout` for the other ranks fails (a hung rank never becomes a
    /// silent hang).
    pub fn group(world: usize, dtype: AllReduceDtype, timeout: Duration) -> Vec<LocalComm> {
        let slots = || (0..world).map(|_| RwLock::new(Vec::new())).collect();
        let shared = Arc::new(Shared {
            world,
            slots: [slots(), slots()],
            barrier: AbortableBarrier::new(world, timeout),
        });
        (0..world)
            .map(|rank| LocalComm {
                rank,
                shared: shared.clone(),
                dtype,
                sequence: 0,
            })
            .collect()
    }

    /// Publishes `data` in this rank's slot and waits for every rank to do the same.
    /// Returns the parity whose slots now hold every rank's data.
    fn exchange(&mut self, data: Vec<f32>) -> Result<usize> {
        let parity = (self.sequence % 2) as usize;
        self.sequence += 1;
        *self.shared.slots[parity][self.rank]
            .write()
            .unwrap_or_else(|e| e.into_inner()) = data;
        self.shared.barrier.wait(self.rank)?;
        Ok(parity)
    }

    fn read_slot(&self, parity: usize, rank: usize) -> std::sync::RwLockReadGuard<'_, Vec<f32>> {
        self.shared.slots[parity][rank]
            .read()
            .unwrap_or_else(|e| e.into_inner())
    }
}

fn to_f32_vec(x: &Tensor) -> Result<Vec<f32>> {
    Ok(x.to_dtype(candle_core::DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?)
}

fn round_bf16(v: &mut [f32]) {
    for x in v {
        *x = half::bf16::from_f32(*x).to_f32();
    }
}

impl Endpoint for LocalComm {
    fn connect(self: Box<Self>, _device: &Device) -> Result<Box<dyn Communicator>> {
        Ok(self)
    }
}

impl Communicator for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }

    /// Host collectives: an emulated rank's replay runs them again.
    fn graph_refusal(&self) -> Option<String> {
        None
    }

    fn world_size(&self) -> usize {
        self.shared.world
    }

    fn all_reduce_sum(&mut self, x: &Tensor) -> Result<Tensor> {
        if self.shared.world == 1 {
            return Ok(x.clone());
        }
        let mut mine = to_f32_vec(x)?;
        let bf16 = self.dtype == AllReduceDtype::Bf16;
        if bf16 {
            round_bf16(&mut mine);
        }
        let n = mine.len();
        let parity = self.exchange(mine)?;
        let mut sum = self.read_slot(parity, 0).clone();
        for r in 1..self.shared.world {
            let other = self.read_slot(parity, r);
            if other.len() != n {
                return Err(EngineError::CommAborted(format!(
                    "all-reduce size mismatch: rank {r} sent {} values, rank {} sent {n}",
                    other.len(),
                    self.rank
                )));
            }
            sum.iter_mut().zip(other.iter()).for_each(|(s, o)| *s += o);
        }
        if bf16 {
            round_bf16(&mut sum);
        }
        Ok(Tensor::from_vec(sum, x.shape(), &Device::Cpu)?.to_dtype(x.dtype())?)
    }

    fn all_gather(&mut self, x: &Tensor, dim: usize) -> Result<Tensor> {
        if self.shared.world == 1 {
            return Ok(x.clone());
        }
        let dims = x.dims().to_vec();
        let mut header = vec![dims.len() as f32];
        header.extend(dims.iter().map(|d| *d as f32));
        header.extend(to_f32_vec(x)?);
        let parity = self.exchange(header)?;
        let mut parts = Vec::with_capacity(self.shared.world);
        for r in 0..self.shared.world {
            let slot = self.read_slot(parity, r);
            let rank_dims = slot.first().map(|n| *n as usize).unwrap_or(0);
            let shape: Vec<usize> = slot[1..1 + rank_dims].iter().map(|d| *d as usize).collect();
            let data = slot[1 + rank_dims..].to_vec();
            parts.push(Tensor::from_vec(data, shape, &Device::Cpu)?);
        }
        Ok(Tensor::cat(&parts, dim)?.to_dtype(x.dtype())?)
    }

    fn broadcast(&mut self, x: &Tensor, root: usize) -> Result<Tensor> {
        if self.shared.world == 1 {
            return Ok(x.clone());
        }
        let mine = if self.rank == root {
            to_f32_vec(x)?
        } else {
            Vec::new()
        };
        let parity = self.exchange(mine)?;
        let data = self.read_slot(parity, root).clone();
        Ok(Tensor::from_vec(data, x.shape(), &Device::Cpu)?.to_dtype(x.dtype())?)
    }

    fn barrier(&mut self) -> Result<()> {
        self.shared.barrier.wait(self.rank)
    }

    fn abort(&self, reason: &str) {
        self.shared.barrier.abort(reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn run<F>(world: usize, dtype: AllReduceDtype, f: F) -> Vec<Result<Tensor>>
    where
        F: Fn(&mut LocalComm) -> Result<Tensor> + Sync,
    {
        let comms = LocalComm::group(world, dtype, Duration::from_secs(5));
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

    #[test]
    fn all_reduce_sums_in_rank_order_many_times() -> Result<()> {
        for world in 1..=4 {
            let out = run(world, AllReduceDtype::F32, |c| {
                let mut last = None;
                for step in 0..50 {
                    let v: Vec<f32> = (0..7).map(|i| (c.rank() * 100 + i + step) as f32).collect();
                    last = Some(c.all_reduce_sum(&Tensor::from_vec(v, 7, &Device::Cpu)?)?);
                }
                last.ok_or_else(|| EngineError::Step("no result".into()))
            });
            let expected: Vec<f32> = (0..7)
                .map(|i| (0..world).map(|r| (r * 100 + i + 49) as f32).sum())
                .collect();
            for t in out {
                assert_eq!(t?.to_vec1::<f32>()?, expected);
            }
        }
        Ok(())
    }

    #[test]
    fn all_gather_concatenates_uneven_parts() -> Result<()> {
        let out = run(3, AllReduceDtype::F32, |c| {
            let n = c.rank() + 1;
            let x = Tensor::full(c.rank() as f32, (2, n), &Device::Cpu)?;
            c.all_gather(&x, 1)
        });
        for t in out {
            let t = t?;
            assert_eq!(t.dims(), &[2, 6]);
            assert_eq!(t.to_vec2::<f32>()?[1], vec![0., 1., 1., 2., 2., 2.]);
        }
        Ok(())
    }

    #[test]
    fn broadcast_and_bf16_reduce() -> Result<()> {
        let out = run(2, AllReduceDtype::Bf16, |c| {
            let x = Tensor::new(&[1.0f32 + c.rank() as f32, 1.0 / 3.0], &Device::Cpu)?;
            let b = c.broadcast(&x, 1)?;
            assert_eq!(b.to_vec1::<f32>()?[0], 2.0);
            c.all_reduce_sum(&x)
        });
        for t in out {
            let v = t?.to_vec1::<f32>()?;
            assert_eq!(v[0], 3.0);
            assert_eq!(
                v[1],
                half::bf16::from_f32(2.0 * half::bf16::from_f32(1.0 / 3.0).to_f32()).to_f32()
            );
        }
        Ok(())
    }

    #[test]
    fn a_missing_rank_times_out_and_names_it() {
        let mut comms = LocalComm::group(2, AllReduceDtype::F32, Duration::from_millis(200));
        let start = Instant::now();
        let err = comms[0]
            .barrier()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("ranks [1]"), "{err}");
        assert!(start.elapsed() < Duration::from_secs(5));
        // Once aborted, the group stays failed.
        assert!(comms[1].barrier().is_err());
    }

    #[test]
    fn abort_wakes_waiting_ranks() {
        let mut comms = LocalComm::group(3, AllReduceDtype::F32, Duration::from_secs(30));
        let c2 = comms.pop();
        let start = Instant::now();
        std::thread::scope(|s| {
            let waiter = s.spawn(|| comms[0].barrier());
            std::thread::sleep(Duration::from_millis(50));
            if let Some(c) = &c2 {
                c.abort("rank 2 failed");
            }
            let res = waiter.join().unwrap_or(Ok(()));
            let msg = res.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(msg.contains("rank 2 failed"), "{msg}");
        });
        assert!(start.elapsed() < Duration::from_secs(5));
    }
}
