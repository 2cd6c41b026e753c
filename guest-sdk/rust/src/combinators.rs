//! `parallel` and `pipeline`: concurrent fan-out over subagent futures, with the spec's
//! failure rules. An item's ordinary error becomes `None`; an [`Abort`] fails the whole
//! call at once (the remaining items are dropped); more than [`MAX_ITEMS`] items are
//! refused before anything runs.

use crate::{Ctx, Error};
use futures::stream::{FuturesUnordered, StreamExt};
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::rc::Rc;

/// The most items one `parallel` or `pipeline` call accepts.
pub const MAX_ITEMS: usize = 4096;

type LocalBoxFuture<T> = Pin<Box<dyn Future<Output = T>>>;

thread_local! {
    /// `parallel`/`pipeline` calls in flight (the guest runs on one thread).
    static CONCURRENT: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Whether a `parallel` or `pipeline` call is in flight: [`Ctx::pause`] is then refused, as
/// a checkpoint belongs to the body's main flow.
pub(crate) fn in_concurrent_call() -> bool {
    CONCURRENT.with(|c| c.get() > 0)
}

/// Counts a `parallel`/`pipeline` call as in flight until dropped (also when abandoned).
struct InFlight;

impl InFlight {
    fn enter() -> Self {
        CONCURRENT.with(|c| c.set(c.get() + 1));
        InFlight
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        CONCURRENT.with(|c| c.set(c.get().saturating_sub(1)));
    }
}

/// Drive `futures` concurrently; `Ok(None)` for an item that failed ordinarily.
async fn join_items<T, E, Fut>(futures: Vec<Fut>) -> Result<Vec<Option<T>>, Error>
where
    Fut: Future<Output = Result<T, E>>,
    E: Into<Error>,
{
    if futures.len() > MAX_ITEMS {
        return Err(Error::TooManyItems(futures.len()));
    }
    let _in_flight = InFlight::enter();
    let mut results: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    let mut pending: FuturesUnordered<_> =
        futures.into_iter().enumerate().map(|(i, f)| async move { (i, f.await) }).collect();
    while let Some((i, outcome)) = pending.next().await {
        match outcome.map_err(Into::into) {
            Ok(v) => results[i] = Some(v),
            Err(Error::Abort(a)) => return Err(Error::Abort(a)),
            Err(_) => {}
        }
    }
    Ok(results)
}

impl Ctx {
    /// Run every future concurrently and wait for all of them (a barrier). Futures are lazy,
    /// so each one is a thunk: it starts when `parallel` polls it.
    ///
    /// Returns one entry per input, in order: `Some(value)`, or `None` where that item
    /// failed ordinarily. An [`Error::Abort`] from any item fails the whole call. Items may
    /// fail with [`Error`] or [`Abort`](crate::Abort) (a bare agent call).
    pub async fn parallel<T, E, Fut, I>(&self, items: I) -> Result<Vec<Option<T>>, Error>
    where
        I: IntoIterator<Item = Fut>,
        Fut: Future<Output = Result<T, E>>,
        E: Into<Error>,
    {
        join_items(items.into_iter().collect()).await
    }

    /// Flow each item through a chain of stages, with no barrier between stages: add stages
    /// with [`Pipeline::stage`] and `.await` the pipeline. Every stage is called as
    /// `(previous, item, index)`; the first stage's `previous` is the item itself.
    pub fn pipeline<Item, It>(&self, items: It) -> Pipeline<Item, Item>
    where
        Item: Clone + 'static,
        It: IntoIterator<Item = Item>,
    {
        Pipeline {
            items: items.into_iter().collect(),
            chain: Rc::new(|item: Item, _index: usize| {
                Box::pin(async move { Ok(item) }) as LocalBoxFuture<Result<Item, Error>>
            }),
        }
    }
}

/// A pipeline under construction; see [`Ctx::pipeline`].
#[must_use = "a pipeline does nothing until awaited"]
pub struct Pipeline<Item, T> {
    items: Vec<Item>,
    chain: Chain<Item, T>,
}

/// A pipeline's stages so far, as one function of an item and its index.
type Chain<Item, T> = Rc<dyn Fn(Item, usize) -> LocalBoxFuture<Result<T, Error>>>;

impl<Item: Clone + 'static, T: 'static> Pipeline<Item, T> {
    /// Append a stage. An item whose stage fails ordinarily becomes `None` and skips its
    /// remaining stages; an [`Error::Abort`] fails the whole pipeline.
    pub fn stage<U, E, F, Fut>(self, stage: F) -> Pipeline<Item, U>
    where
        F: Fn(T, Item, usize) -> Fut + 'static,
        Fut: Future<Output = Result<U, E>> + 'static,
        E: Into<Error>,
    {
        let prev = self.chain;
        let stage = Rc::new(stage);
        Pipeline {
            items: self.items,
            chain: Rc::new(move |item: Item, index: usize| {
                let prev = prev.clone();
                let stage = stage.clone();
                Box::pin(async move {
                    let previous = prev(item.clone(), index).await?;
                    stage(previous, item, index).await.map_err(Into::into)
                })
            }),
        }
    }

    /// Run every item through the stages; one result per item, in input order.
    pub async fn run(self) -> Result<Vec<Option<T>>, Error> {
        if self.items.len() > MAX_ITEMS {
            return Err(Error::TooManyItems(self.items.len()));
        }
        let chain = self.chain;
        let futures: Vec<_> = self.items.into_iter().enumerate().map(|(i, item)| chain(item, i)).collect();
        join_items(futures).await
    }
}

impl<Item: Clone + 'static, T: 'static> IntoFuture for Pipeline<Item, T> {
    type Output = Result<Vec<Option<T>>, Error>;
    type IntoFuture = LocalBoxFuture<Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.run())
    }
}
