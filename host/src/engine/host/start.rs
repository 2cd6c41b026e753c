//! Starting runs: checking a new run's options and args, storing its record (or enqueuing it
//! on a shared store's run queue), declining one at the consent prompt, and serving a queued
//! start another worker enqueued.

use super::backends::caller_hidden;
use super::{BackendChoice, Factory, Host, RunOptions, DEFAULT_SESSION};
use crate::backend::AgentBackend;
use crate::error::Error;
use crate::model::envelope::{Accounting, Failure, RunEnvelope, RunStatus};
use crate::model::schema::Schema;
use crate::model::scope::Scope;
use crate::sandbox::admission::Bound;
use crate::sandbox::{self};
use crate::store::RunRecord;
use std::sync::Arc;

pub(super) fn session_of(session: &Option<String>) -> String {
    session.clone().unwrap_or_else(|| DEFAULT_SESSION.to_string())
}

impl Host {
    /// Start a run of `factory` and drive its first attempt to the end. Returns the envelope
    /// for every outcome; refuses only what fails before the run exists (bad limits, bad
    /// args, a store failure).
    pub async fn run(&self, factory: &Factory, mut options: RunOptions) -> Result<RunEnvelope, Error> {
        let backend = match options.backend.take() {
            Some(backend) => backend,
            None => self.chosen_backend(&options.choice)?,
        };
        if self.store.run_queue().is_some() {
            return self.run_queued(factory, options, backend).await;
        }
        let (record, options) = self.create_run(factory, options).await?;
        let backend = caller_hidden(backend, &record);
        self.attempt(factory, record, options.events, backend, options.trace_parent).await
    }

    /// [`Host::run`] on a store with a run queue: the run is stored with its queue entry
    /// (what its first attempt needs: component, script, backend; its grants are in the
    /// record). When this worker has room it claims the entry in the same transaction and
    /// executes the run at once; otherwise any worker with room claims it, and this waits for
    /// its end.
    pub(super) async fn run_queued(
        &self,
        factory: &Factory,
        mut options: RunOptions,
        backend: Arc<dyn AgentBackend>,
    ) -> Result<RunEnvelope, Error> {
        let Some(queue) = self.store.run_queue() else {
            return Err(Error::Misrouted("a queued run on a store without a queue"));
        };
        let permit = self.queue_room.clone().try_acquire_owned().ok();
        let on_start = options.on_start.take();
        let (mut record, options) = self.new_record(factory, options)?;
        let backend = caller_hidden(backend, &record);
        self.put_blobs(factory)?;
        // The component and script bytes are durable before any worker can claim the run.
        if let Err(e) = self.store.flush().await {
            return Err(e
                .0
                .downcast_ref::<crate::store::StoreError>()
                .cloned()
                .unwrap_or(crate::store::StoreError::Closed)
                .into());
        }
        let start = crate::store::queue::QueuedStart {
            component: factory.component.hash.clone(),
            script: factory.component.script.as_ref().map(|s| s.reference()),
            backend: backend.reference(),
        };
        // The consent given to this start, bound to what it runs: checked by the worker that
        // claims it.
        record.seal = Some(self.config.trust.seal(&start_bound(&record, &start)));
        let here = queue.enqueue(&mut record, &start, permit.is_some(), self.config.caps.cluster_runs).await?;
        let run_id = record.envelope.run_id.clone();
        if let Some(on_start) = on_start {
            on_start(&run_id);
        }
        if !here {
            drop(permit);
            return self.wait(Scope::Owner, &run_id).await;
        }
        let ended = self.attempt(factory, record, options.events, backend, options.trace_parent).await;
        // A draining worker keeps the entry of a run it stopped: it hands it back.
        let handed_back = self.draining() && ended.as_ref().is_ok_and(|envelope| envelope.status == RunStatus::Halted);
        if !handed_back {
            if let Err(e) = queue.finish(run_id.clone()).await {
                tracing::warn!(run = %run_id, error = %e, "dropping a finished run's queue entry");
            }
        }
        drop(permit);
        self.queue_freed.notify_one();
        ended
    }

    /// Whether this worker can execute a run it claimed from the queue: the backend the run
    /// was started with (or last recorded) can be built here, its key variable is set, and
    /// every granted directory is under a root this worker allows and still the one recorded.
    pub(crate) async fn can_serve(&self, claimed: &crate::store::queue::Claimed) -> Result<(), Error> {
        let Some(record) = self.store.run(&claimed.run_id).await? else { return Ok(()) };
        if let Some(start) = claimed.start.as_ref().filter(|_| record.envelope.attempts == 0) {
            if self.config.trust.verify(record.seal.as_deref(), &start_bound(&record, start)).is_err() {
                // Not a run another worker could serve: a record that does not match its
                // consent; its start ends it with that failure ([`Host::start_queued`]).
                return Ok(());
            }
        }
        // A run this worker did not start mounts only grants under the roots it allows.
        self.config.trust.check_grants(&claimed.run_id, &record.grants)?;
        sandbox::recheck_grants(&record.grants)?;
        match &claimed.start {
            Some(start) if record.envelope.attempts == 0 => self.backend_of(&start.backend).map(drop),
            _ => self.recorded_backend(&record, &BackendChoice::default()).map(drop),
        }
    }

    /// Execute the first attempt of a queued run this worker claimed, as its start recorded
    /// it (no consent asked again: it was given when the run was started).
    /// A run whose start cannot be prepared here (its component cannot be loaded, ...) ends
    /// `error` with the reason instead of waiting forever.
    pub(crate) async fn start_queued(
        &self,
        mut record: RunRecord,
        start: &crate::store::queue::QueuedStart,
    ) -> Result<RunEnvelope, Error> {
        let run_id = record.envelope.run_id.clone();
        let claim = self.claim(&run_id)?;
        let prepared = async {
            // Before anything of the run is loaded: what the database says to run must be
            // what its consent was given for.
            self.config.trust.verify(record.seal.as_deref(), &start_bound(&record, start))?;
            self.config.trust.check_grants(&run_id, &record.grants)?;
            sandbox::recheck_grants(&record.grants)?;
            let factory = match &start.script {
                Some(script) => self.load_recorded_script(&start.component, script, Some(&run_id)).await,
                None => self.load_stored(&start.component).await,
            }
            .map_err(|e| match e {
                Error::Trust(refused) => Error::Trust(refused),
                e => Error::NonResumable(format!("the component of run `{run_id}` cannot be loaded: {e}")),
            })?;
            Ok::<_, Error>((factory, caller_hidden(self.backend_of(&start.backend)?, &record)))
        };
        match prepared.await {
            Ok((factory, backend)) => self.attempt_claimed(&factory, record, None, backend, claim, None).await,
            Err(error) => {
                let failure = match &error {
                    Error::Trust(refused) => Failure::new(
                        crate::model::envelope::FailureType::Sandbox,
                        Some(refused.kind()),
                        format!("the queued run was refused: {refused}; nothing ran"),
                    ),
                    _ => Failure::new(
                        crate::model::envelope::FailureType::Internal,
                        None,
                        format!("the queued run could not start: {error}"),
                    ),
                };
                self.end_broken_attempt(&mut record, failure).await;
                drop(claim);
                self.announce_end(&record).await;
                Err(error)
            }
        }
    }

    /// Record a fresh run of `factory` that its user declined to start (a consent prompt
    /// answered "no"): created as [`Host::run`] would create it (same checks, a run id,
    /// `on_start`), then ended at once as `cancelled` (failure kind `declined`) without
    /// executing anything. It cannot be resumed: it has no attempt to continue.
    pub async fn decline(&self, factory: &Factory, options: RunOptions) -> Result<RunEnvelope, Error> {
        let (mut record, _) = self.create_run(factory, options).await?;
        let envelope = &mut record.envelope;
        envelope.status = RunStatus::Cancelled;
        let failure = Failure::new(
            crate::model::envelope::FailureType::Cancelled,
            Some(crate::model::envelope::DECLINED_KIND),
            "the run was declined at the consent prompt; nothing ran",
        );
        envelope.error = Some(failure.message.clone());
        envelope.failure = Some(failure);
        envelope.updated_at = crate::store::records_timestamp();
        self.store.put_run(&mut record, false).await?;
        self.revisions.announce(&record).await?;
        self.current(record).await
    }

    /// Check `options` and store a new pending run of `factory`; hands back what of
    /// `options` the attempt still needs.
    pub(super) async fn create_run(
        &self,
        factory: &Factory,
        mut options: RunOptions,
    ) -> Result<(RunRecord, RunOptions), Error> {
        let on_start = options.on_start.take();
        let (mut record, options) = self.new_record(factory, options)?;
        self.put_blobs(factory)?;
        self.store.put_run(&mut record, true).await?;
        if let Some(on_start) = on_start {
            on_start(&record.envelope.run_id);
        }
        Ok((record, options))
    }

    /// Check `options` and build the record of a new pending run of `factory` (not stored).
    pub(super) fn new_record(&self, factory: &Factory, options: RunOptions) -> Result<(RunRecord, RunOptions), Error> {
        let limits = factory.meta.limits.overridden_by(&options.limits);
        limits.validate()?;
        let grants = sandbox::check_grants(&options.grants)?;
        let args = options.args.clone().unwrap_or_else(|| serde_json::json!({}));
        if let Some(schema) = &factory.meta.args_schema {
            let schema = Schema::parse(schema.get()).map_err(|e| Error::InvalidArgs(e.to_string()))?;
            schema.check(&args).map_err(|m| Error::InvalidArgs(m.to_string()))?;
        }
        let run_id = uuid::Uuid::now_v7().to_string();
        let now = crate::store::records_timestamp();
        let mut record = RunRecord {
            envelope: RunEnvelope {
                run_id: run_id.clone(),
                factory: factory.meta.name.clone(),
                status: RunStatus::Pending,
                result: None,
                failure: None,
                error: None,
                accounting: Accounting::default(),
                attempts: 0,
                created_at: now.clone(),
                updated_at: now,
                revision: 0,
                backend: None,
                resume_at: None,
                checkpoint: None,
                session: None,
            },
            session: session_of(&options.session),
            args: args.to_string(),
            overrides: options.limits,
            limits,
            component_hashes: Vec::new(),
            scripts: Vec::new(),
            backends: Vec::new(),
            grants,
            writes: 0,
            seq: 0,
            interrupted: None,
            recoveries: 0,
            seal: None,
            caller_dirs: Vec::new(),
            phases: Vec::new(),
            checkpoints: Default::default(),
        };
        if let Some(dir) = &options.caller_cwd {
            record.add_caller_dir(dir);
        }
        Ok((record, options))
    }
}

/// What the consent of a queued start (`record` enqueued with `start`) is bound to.
pub(super) fn start_bound<'a>(record: &'a RunRecord, start: &'a crate::store::queue::QueuedStart) -> Bound<'a> {
    Bound {
        run_id: &record.envelope.run_id,
        session: &record.session,
        args: &record.args,
        component: &start.component,
        script: start.script.as_ref(),
        backend: &start.backend,
        grants: &record.grants,
        caller_dirs: &record.caller_dirs,
        limits: &record.limits,
        overrides: &record.overrides,
    }
}
