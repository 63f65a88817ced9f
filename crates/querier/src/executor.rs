//! A dedicated runtime for CPU-heavy query work (DataFusion execution,
//! Parquet decoding), so that it never starves the I/O runtime that serves
//! requests and acknowledges writes.

use std::future::Future;

use tokio::runtime::Handle;
use tracing::Instrument;

/// A handle to a multi-threaded runtime that lives on its own threads.
#[derive(Clone)]
pub struct Executor {
    handle: Handle,
}

impl Executor {
    /// Starts a runtime with `threads` workers named `fathom-query-*`.
    pub fn new(threads: usize) -> std::io::Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("fathom-query")
            .enable_all()
            .build()?;
        let handle = rt.handle().clone();
        // The runtime lives as long as the process: park it on a thread.
        std::thread::Builder::new()
            .name("fathom-query-rt".into())
            .spawn(move || rt.block_on(std::future::pending::<()>()))?;
        Ok(Executor { handle })
    }

    /// Runs `fut` on the dedicated runtime and waits for it.
    pub async fn run<F, T>(&self, fut: F) -> Result<T, tokio::task::JoinError>
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        // The caller's span goes along, so that a query's work on this
        // runtime stays in the query's trace.
        self.handle.spawn(fut.in_current_span()).await
    }

    /// Starts `fut` on the dedicated runtime; the handle waits for it or
    /// aborts it.
    pub fn spawn_handle<F, T>(&self, fut: F) -> tokio::task::JoinHandle<T>
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        self.handle.spawn(fut.in_current_span())
    }

    /// Starts `fut` on the dedicated runtime without waiting for it.
    pub fn spawn<F>(&self, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.handle.spawn(fut.in_current_span());
    }
}
