//! Object storage configuration: the local filesystem by default, or any
//! S3-compatible endpoint.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::{ObjectStore, RetryConfig};

use crate::Error;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreKind {
    /// `<data dir>/store` on the local filesystem.
    Filesystem,
    /// An S3-compatible bucket.
    S3,
}

#[derive(Clone, Debug)]
pub struct ObjectStoreConfig {
    pub kind: StoreKind,
    pub s3_endpoint: Option<String>,
    pub s3_bucket: Option<String>,
    pub s3_region: String,
    pub s3_access_key_id: Option<String>,
    pub s3_secret_access_key: Option<String>,
    /// Allow plain-HTTP endpoints (test servers on loopback).
    pub s3_allow_http: bool,
    /// Filesystem store directory (default `<data dir>/store`); processes
    /// that share it share blocks, like a bucket on one machine.
    pub fs_path: Option<std::path::PathBuf>,
}

impl ObjectStoreConfig {
    pub fn filesystem() -> Self {
        ObjectStoreConfig {
            kind: StoreKind::Filesystem,
            s3_endpoint: None,
            s3_bucket: None,
            s3_region: "us-east-1".into(),
            s3_access_key_id: None,
            s3_secret_access_key: None,
            s3_allow_http: false,
            fs_path: None,
        }
    }

    fn fs_dir(&self, data_dir: &Path) -> std::path::PathBuf {
        self.fs_path
            .clone()
            .unwrap_or_else(|| data_dir.join("store"))
    }

    pub fn describe(&self, data_dir: &Path) -> String {
        match self.kind {
            StoreKind::Filesystem => format!("file://{}", self.fs_dir(data_dir).display()),
            StoreKind::S3 => format!(
                "s3://{}{}",
                self.s3_bucket.as_deref().unwrap_or("?"),
                self.s3_endpoint
                    .as_deref()
                    .map(|e| format!(" at {e}"))
                    .unwrap_or_default()
            ),
        }
    }

    pub fn build(&self, data_dir: &Path) -> Result<Arc<dyn ObjectStore>, Error> {
        match self.kind {
            StoreKind::Filesystem => {
                let dir = self.fs_dir(data_dir);
                std::fs::create_dir_all(&dir).map_err(|source| Error::Io {
                    what: format!("creating {}", dir.display()),
                    source,
                })?;
                let fs = LocalFileSystem::new_with_prefix(&dir).map_err(Error::Store)?;
                Ok(Arc::new(fs))
            }
            StoreKind::S3 => {
                let bucket = self.s3_bucket.as_deref().ok_or(Error::S3Bucket)?;
                // Fail within seconds and leave the retrying to the roles
                // (ingester uploads back off and count failures; queries
                // answer 503) instead of object_store's 3-minute budget.
                let retry = RetryConfig {
                    backoff: Default::default(),
                    max_retries: 3,
                    retry_timeout: Duration::from_secs(15),
                };
                let mut b = AmazonS3Builder::from_env()
                    .with_retry(retry)
                    .with_bucket_name(bucket)
                    .with_region(&self.s3_region)
                    .with_allow_http(self.s3_allow_http);
                if let Some(e) = &self.s3_endpoint {
                    b = b.with_endpoint(e).with_virtual_hosted_style_request(false);
                }
                if let Some(k) = &self.s3_access_key_id {
                    b = b.with_access_key_id(k);
                }
                if let Some(k) = &self.s3_secret_access_key {
                    b = b.with_secret_access_key(k);
                }
                Ok(Arc::new(b.build().map_err(Error::Store)?))
            }
        }
    }
}
