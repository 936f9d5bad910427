//! The engine loop: one thread that owns the [`Scheduler`] and the [`Executor`] and runs
//! schedule → step → update while there is work, behind a cloneable [`SchedulerHandle`].
//!
//! - Idle, the thread blocks on its command channel (no polling sleeps); busy, it drains
//!   commands without blocking between steps.
//! - `submit` answers on the caller's thread: admission uses shared atomics, and only an
//!   admitted request is sent to the loop.
//! - A failed step reaches no further than its cause ([`FailureScope`]): a sequence
//!   the executor refused (`StepOutput::failed`) ends alone with `TokenEvent::Failed`;
//!   a step error of scope `Step` ends the sequences of that step the same way, and
//!   every other request goes on (one bad batch must not become an outage). An error
//!   of scope `Group` (a device lost, a collective failed, a rank hung) and an
//!   executor *panic* (its state cannot be trusted) fail every request with
//!   `TokenEvent::Error`, close admission and end the loop: health shows
//!   `executor_failed` before any request hears of it, and the server exits so the
//!   orchestrator restarts it. An output that does not match the plan (a broken
//!   contract) fails every in-flight request and the loop keeps serving.
//! - Backpressure: a request's channel is bounded; a sequence whose client has not
//!   read what it was sent gets no step ([`crate::token_channel`]). When nothing else
//!   can run the loop blocks on its commands, and the stalled client's receiver wakes
//!   it when it reads or is dropped: no polling.
//! - Shutdown (`shutdown()`, `join()`, or drop of the last handle): in-flight requests
//!   get `Finished { reason: Abort }` and the thread exits; the last handle's drop joins it.
//!   A request whose channel closes without `Finished` or `Error` (a submit racing
//!   shutdown) must be treated as aborted by the server.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use tessera_protocol::{Executor, FailureScope, GenerationRequest, SeqId};

use crate::admission::{Admission, AdmittedRequest};
use crate::config::SchedulerConfig;
use crate::error::{AdmissionError, SchedulerError};
use crate::loop_stats::{LoopHealth, LoopStats, StepDurations};
use crate::metrics::{SchedulerMetrics, SharedMetrics};
use crate::scheduler::Scheduler;
use crate::token_channel::TokenReceiver;

enum Command {
    /// Boxed: a request (sampling parameters, response-format schema) dwarfs `Shutdown`.
    Add(Box<AdmittedRequest>),
    /// A stalled client read (or left): look again.
    Wake,
    /// The executor is gone without a step saying so (a node of its group was lost
    /// while idle): fail like a step whose failure has scope `Group`.
    ExecutorLost(String),
    /// Zero the traffic counters and queue times, then answer on the channel.
    ClearTrafficCounters(std::sync::mpsc::SyncSender<()>),
    Shutdown,
}

/// Starts the engine loop thread.
#[derive(Debug)]
pub struct EngineLoop;

impl EngineLoop {
    /// Check `config` against the executor, then run the loop on a new thread.
    pub fn spawn<E: Executor + 'static>(
        config: SchedulerConfig,
        executor: E,
    ) -> Result<SchedulerHandle, SchedulerError> {
        let cfg = config.resolve(executor.kv_cache_shape(), executor.max_context_tokens())?;
        let admission = Admission::new(&cfg);
        let scheduler = Scheduler::with_admission(cfg, Arc::clone(&admission));
        let metrics = Arc::new(SharedMetrics::default());
        metrics.publish(&scheduler.metrics());
        let stats = Arc::new(LoopStats::default());
        let (commands, receiver) = channel();
        let waker = commands.clone();
        admission.set_wake(Arc::new(move || {
            // An error means the loop has exited: nothing to wake.
            let _ = waker.send(Command::Wake);
        }));
        let worker = Worker {
            scheduler,
            executor,
            commands: receiver,
            metrics: Arc::clone(&metrics),
            stats: Arc::clone(&stats),
        };
        let thread = std::thread::Builder::new()
            .name("tessera-engine-loop".into())
            .spawn(move || worker.run())
            .map_err(|e| SchedulerError::InvalidConfig(format!("cannot spawn thread: {e}")))?;
        Ok(SchedulerHandle {
            inner: Arc::new(HandleInner {
                commands,
                admission,
                metrics,
                stats,
                thread: Mutex::new(Some(thread)),
            }),
        })
    }
}

/// The server's way into the engine loop. Cheap to clone; `Send + Sync`.
#[derive(Debug, Clone)]
pub struct SchedulerHandle {
    inner: Arc<HandleInner>,
}

#[derive(Debug)]
struct HandleInner {
    commands: Sender<Command>,
    admission: Arc<Admission>,
    metrics: Arc<SharedMetrics>,
    stats: Arc<LoopStats>,
    /// Taken by whoever joins first (an explicit `join` or the last drop).
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Add(a) => write!(f, "Add({})", a.id),
            Command::Wake => write!(f, "Wake"),
            Command::ExecutorLost(why) => write!(f, "ExecutorLost({why})"),
            Command::ClearTrafficCounters(_) => write!(f, "ClearTrafficCounters"),
            Command::Shutdown => write!(f, "Shutdown"),
        }
    }
}

impl SchedulerHandle {
    /// Admit a request (synchronously) and hand it to the loop. The receiver gets
    /// `Token`s, then exactly one `Finished` or `Error`. Dropping it cancels the request.
    pub fn submit(
        &self,
        request: GenerationRequest,
    ) -> Result<(SeqId, TokenReceiver), AdmissionError> {
        let (admitted, receiver) = self.inner.admission.admit(request)?;
        let id = admitted.id;
        self.inner
            .commands
            .send(Command::Add(Box::new(admitted)))
            .map_err(|_| AdmissionError::ShuttingDown)?;
        Ok((id, receiver))
    }

    /// The latest metrics the loop published (after its last step).
    pub fn metrics(&self) -> SchedulerMetrics {
        self.inner.metrics.snapshot()
    }

    /// Most requests that may wait to start; more are refused with `QueueFull`.
    pub fn max_waiting(&self) -> usize {
        self.inner.admission.max_waiting()
    }

    /// Requests admitted that have not started running yet (live, not per step).
    pub fn num_queued(&self) -> usize {
        self.inner.admission.num_waiting()
    }

    /// Requests waiting to start or to restart, each counted once: those admitted that
    /// have not run yet (live, wherever they are: on their way to the loop or in its
    /// queue) and those preempted back into the queue (as of the last step).
    pub fn num_waiting(&self) -> usize {
        self.num_queued() + self.inner.metrics.snapshot().num_waiting_preempted
    }

    /// Whether the loop is running and its executor is succeeding (for readiness).
    pub fn health(&self) -> LoopHealth {
        self.inner.stats.health()
    }

    /// Every executor step's duration so far, as a histogram.
    pub fn step_durations(&self) -> StepDurations {
        self.inner.stats.step_durations()
    }

    /// Histogram of queue times: admission to a sequence's first step.
    pub fn queue_durations(&self) -> StepDurations {
        self.inner.stats.queue_durations()
    }

    /// Zero the token, prefix-cache and queue-time counts the metrics report, once the
    /// sequences before have finished: a server's warm-up generation is not traffic.
    /// Blocks until the loop has done it (or has stopped).
    pub fn clear_traffic_counters(&self) {
        let (done, wait) = std::sync::mpsc::sync_channel(1);
        if self
            .inner
            .commands
            .send(Command::ClearTrafficCounters(done))
            .is_ok()
        {
            // An error means the loop stopped first: nothing is counted any more.
            let _ = wait.recv();
        }
    }

    /// Refuse new requests (`AdmissionError::ShuttingDown`) but keep running the ones
    /// already admitted: the first half of a graceful drain. `shutdown` ends the rest.
    pub fn close_admission(&self) {
        self.inner.admission.close();
    }

    /// Stop accepting requests and ask the loop to abort in-flight ones and exit.
    /// Returns at once; `join` waits.
    pub fn shutdown(&self) {
        self.inner.admission.close();
        // An error means the loop has already exited.
        let _ = self.inner.commands.send(Command::Shutdown);
    }

    /// A way to tell the loop, from outside any step, that its executor is lost for good.
    /// It holds only the loop's command channel, not the handle, so it does not keep the
    /// loop alive.
    pub fn loss_notifier(&self) -> ExecutorLossNotifier {
        ExecutorLossNotifier {
            commands: self.inner.commands.clone(),
        }
    }

    /// Shut down and wait for the loop thread to exit.
    pub fn join(&self) -> Result<(), SchedulerError> {
        self.shutdown();
        self.inner.join()
    }
}

/// Fails the engine loop as a group failure would: health turns `executor_failed`,
/// admission closes, every request ends with an error, and the loop exits.
#[derive(Debug, Clone)]
pub struct ExecutorLossNotifier {
    commands: Sender<Command>,
}

impl ExecutorLossNotifier {
    pub fn executor_lost(&self, why: String) {
        // An error means the loop has already exited.
        let _ = self.commands.send(Command::ExecutorLost(why));
    }
}

impl HandleInner {
    fn join(&self) -> Result<(), SchedulerError> {
        let thread = match self.thread.lock() {
            Ok(mut guard) => guard.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        match thread {
            Some(t) => t.join().map_err(|_| SchedulerError::LoopPanicked),
            None => Ok(()),
        }
    }
}

impl Drop for HandleInner {
    fn drop(&mut self) {
        self.admission.close();
        let _ = self.commands.send(Command::Shutdown);
        if let Err(e) = self.join() {
            tracing::error!("engine loop: {e}");
        }
    }
}

struct Worker<E> {
    scheduler: Scheduler,
    executor: E,
    commands: Receiver<Command>,
    metrics: Arc<SharedMetrics>,
    stats: Arc<LoopStats>,
}

#[derive(PartialEq, Eq)]
enum Flow {
    Continue,
    Stop,
}

impl<E: Executor> Worker<E> {
    fn run(self) {
        /// Marks the loop stopped however the thread ends, an unexpected panic included.
        struct StoppedOnDrop(Arc<LoopStats>);
        impl Drop for StoppedOnDrop {
            fn drop(&mut self) {
                self.0.mark_stopped(std::thread::panicking());
            }
        }
        let _guard = StoppedOnDrop(Arc::clone(&self.stats));
        self.run_steps();
    }

    /// The loop proper. A step that stops it (executor panic or failure) has already
    /// recorded why in the loop's stats.
    fn run_steps(mut self) {
        // Consecutive plans that scheduled nothing while work remained. One can happen
        // (every running sequence preempted itself); the next plan must then admit the
        // queue head, because every block is free and admission guaranteed it fits. A
        // longer run is a bug: fail loudly instead of spinning.
        let mut empty_plans = 0u32;
        loop {
            if !self.scheduler.has_work() {
                match self.commands.recv() {
                    Ok(cmd) => {
                        if self.apply(cmd) == Flow::Stop {
                            break;
                        }
                    }
                    Err(_) => break,
                }
            }
            if self.drain_commands() == Flow::Stop {
                break;
            }
            let (flow, scheduled_any) = self.step();
            if flow == Flow::Stop {
                return;
            }
            if scheduled_any || !self.scheduler.has_work() {
                empty_plans = 0;
            } else if self.scheduler.num_stalled() > 0 {
                // Nothing can run until a stalled client reads or leaves (its receiver
                // wakes us), or a command comes.
                empty_plans = 0;
                match self.commands.recv() {
                    Ok(cmd) => {
                        if self.apply(cmd) == Flow::Stop {
                            break;
                        }
                    }
                    Err(_) => break,
                }
            } else {
                empty_plans += 1;
                if empty_plans > 2 {
                    tracing::error!("scheduler made no progress; failing in-flight requests");
                    self.scheduler
                        .fail_all("internal error: the scheduler could not place any request");
                }
            }
        }
        // Requests that raced the shutdown get an answer too.
        while let Ok(cmd) = self.commands.try_recv() {
            if let Command::Add(a) = cmd {
                self.scheduler.add(*a);
            }
        }
        self.scheduler.abort_all();
        self.publish();
    }

    fn apply(&mut self, cmd: Command) -> Flow {
        match cmd {
            Command::Add(a) => {
                self.scheduler.add(*a);
                Flow::Continue
            }
            Command::Wake => Flow::Continue,
            Command::ExecutorLost(why) => {
                tracing::error!("executor lost, engine loop stops: {why}");
                // Before any request hears of it, so health checks agree with them.
                self.stats.mark_executor_failed();
                self.scheduler.admission().close();
                self.scheduler.fail_all(&why);
                self.publish();
                Flow::Stop
            }
            Command::ClearTrafficCounters(done) => {
                self.scheduler.clear_traffic_counters();
                self.stats.clear_queue_times();
                self.publish();
                let _ = done.send(());
                Flow::Continue
            }
            Command::Shutdown => Flow::Stop,
        }
    }

    fn drain_commands(&mut self) -> Flow {
        loop {
            match self.commands.try_recv() {
                Ok(cmd) => {
                    if self.apply(cmd) == Flow::Stop {
                        return Flow::Stop;
                    }
                }
                Err(TryRecvError::Empty) => return Flow::Continue,
                Err(TryRecvError::Disconnected) => return Flow::Stop,
            }
        }
    }

    /// One schedule → execute → update round. Also returns whether the plan scheduled
    /// any tokens.
    fn step(&mut self) -> (Flow, bool) {
        let plan = self.scheduler.schedule();
        for waited in self.scheduler.take_queue_times() {
            self.stats.record_queue_time(waited);
        }
        let scheduled_any = !plan.scheduled.is_empty();
        if !scheduled_any && plan.finished.is_empty() {
            self.publish();
            return (Flow::Continue, false);
        }
        let start = Instant::now();
        let executor = &mut self.executor;
        let result = catch_unwind(AssertUnwindSafe(|| executor.step(&plan)));
        let elapsed = start.elapsed();
        self.scheduler.record_step_duration(elapsed);
        // Only steps that ran sequences say whether the executor works; a clean-up
        // step (only `finished`) after a failure proves nothing either way.
        let outcome = scheduled_any.then_some(matches!(&result, Ok(Ok(_))));
        self.stats.record_step(elapsed, outcome);
        let flow = match result {
            Ok(Ok(output)) => {
                if let Err(e) = self.scheduler.update(&output) {
                    tracing::error!("{e}");
                    self.scheduler.fail_all(&e.to_string());
                }
                Flow::Continue
            }
            Ok(Err(e)) if e.scope == FailureScope::Group => {
                tracing::error!("executor failed for good, engine loop stops: {e}");
                // Before any request hears of it, so health checks agree with them.
                self.stats.mark_executor_failed();
                self.scheduler.admission().close();
                self.scheduler.fail_all(&e.to_string());
                Flow::Stop
            }
            Ok(Err(e)) => {
                tracing::error!("executor step failed, its sequences end: {e}");
                self.scheduler.fail_in_flight(&e.to_string());
                Flow::Continue
            }
            Err(_) => {
                tracing::error!("executor panicked; engine loop stops");
                // Before any request hears of it, so health checks agree with them.
                self.stats.mark_stopped(true);
                self.scheduler.admission().close();
                self.scheduler.fail_all("executor panicked");
                Flow::Stop
            }
        };
        self.publish();
        (flow, scheduled_any)
    }

    fn publish(&self) {
        self.metrics.publish(&self.scheduler.metrics());
    }
}
