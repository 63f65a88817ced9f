//! The tenants file: who may call Fathom, for which tenants, and each
//! tenant's limits. No I/O besides [`TenantsConfig::load`]; the reloading
//! and the request layer that uses it live in the server crate.
//!
//! ```yaml
//! defaults:                  # limits of every tenant (unset: the flags' values)
//!   ingestion_rate: 4MiB     # bytes per second, as received
//!   ingestion_burst: 16MiB
//! tenants:
//!   team-a:
//!     limits: { ingestion_rate: 1MiB, max_query_range: 7d }
//! credentials:
//!   - name: agents-team-a    # named in logs and errors, never the secret
//!     token: sha256:<hex of SHA-256 of the token>
//!     scopes: [write]
//!     tenants: [team-a]
//!   - name: grafana
//!     user: grafana          # HTTP Basic
//!     password: pbkdf2-sha256:<iterations>:<salt hex>:<hash hex>
//!     scopes: [read]
//!     tenants: [team-a, team-b]
//! ```
//!
//! Invariants: secrets exist in memory only as hashes (the file holds
//! hashes, never plain secrets, which are refused); a credential's first
//! tenant is the one a request gets when it names none, and a named tenant
//! must be one of the credential's. Bearer tokens are looked up by their
//! SHA-256 (so they must be random, as generated ones are); Basic passwords
//! may also be PBKDF2 hashes, whose verification is cached by a SHA-256 of
//! user and password so that only the first request pays for it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use fathom_model::TenantId;
use parking_lot::{Mutex, RwLock};
use serde::Deserialize;

/// What a request does: read data or write it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    Read,
    Write,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Write => "write",
        }
    }
}

/// A tenant's limits; `None` leaves the process's flag in force.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TenantLimits {
    /// Bytes per second received (as sent on the wire), sustained.
    pub ingestion_rate: Option<u64>,
    /// Bytes that may arrive at once above the rate (the bucket's size).
    pub ingestion_burst: Option<u64>,
    /// Most series of this tenant in one ingester's head.
    pub max_series: Option<usize>,
    /// Largest profile (request body) in bytes.
    pub max_profile_size: Option<usize>,
    pub max_samples_per_profile: Option<usize>,
    pub max_labels: Option<usize>,
    pub max_query_range: Option<Duration>,
    /// Most points per series in a range query.
    pub max_query_points: Option<i64>,
    /// Memory one SQL query may use.
    pub query_memory: Option<usize>,
    /// Wall time one SQL query may take.
    pub query_timeout: Option<Duration>,
    /// Blocks older than this are removed by the compactor.
    pub retention: Option<Duration>,
}

impl TenantLimits {
    /// `self`, with `base` filling what `self` leaves unset.
    fn or(&self, base: &TenantLimits) -> TenantLimits {
        TenantLimits {
            ingestion_rate: self.ingestion_rate.or(base.ingestion_rate),
            ingestion_burst: self.ingestion_burst.or(base.ingestion_burst),
            max_series: self.max_series.or(base.max_series),
            max_profile_size: self.max_profile_size.or(base.max_profile_size),
            max_samples_per_profile: self
                .max_samples_per_profile
                .or(base.max_samples_per_profile),
            max_labels: self.max_labels.or(base.max_labels),
            max_query_range: self.max_query_range.or(base.max_query_range),
            max_query_points: self.max_query_points.or(base.max_query_points),
            query_memory: self.query_memory.or(base.query_memory),
            query_timeout: self.query_timeout.or(base.query_timeout),
            retention: self.retention.or(base.retention),
        }
    }
}

/// Who a request is: one entry of `credentials`.
#[derive(Debug)]
pub struct Credential {
    /// The name in the file (logs and error messages; never the secret).
    pub name: String,
    pub read: bool,
    pub write: bool,
    /// The tenants it may use; the first when a request names none.
    pub tenants: Vec<TenantId>,
}

impl Credential {
    pub fn may(&self, scope: Scope) -> bool {
        match scope {
            Scope::Read => self.read,
            Scope::Write => self.write,
        }
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No credential, or one that is not known (401, `UNAUTHENTICATED`).
    #[error("{0}")]
    Unauthenticated(String),
    /// A known credential that may not do this (403, `PERMISSION_DENIED`).
    #[error("{0}")]
    PermissionDenied(String),
}

/// A mistake in the tenants file.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Yaml(#[from] serde_norway::Error),
    #[error("{0}")]
    Invalid(String),
}

/// A stored secret.
#[derive(Debug, Clone)]
enum SecretHash {
    Sha256([u8; 32]),
    Pbkdf2 {
        iterations: std::num::NonZeroU32,
        salt: Vec<u8>,
        hash: Vec<u8>,
    },
}

impl SecretHash {
    fn parse(s: &str, what: &str) -> Result<SecretHash, String> {
        let s = s.trim();
        if let Some(hex) = s.strip_prefix("sha256:") {
            let b = decode_hex(hex)
                .filter(|b| b.len() == 32)
                .ok_or_else(|| format!("{what}: sha256: must be followed by 64 hex digits"))?;
            let mut h = [0u8; 32];
            h.copy_from_slice(&b);
            return Ok(SecretHash::Sha256(h));
        }
        if let Some(rest) = s.strip_prefix("pbkdf2-sha256:") {
            let parts: Vec<&str> = rest.split(':').collect();
            let bad = || {
                format!(
                    "{what}: pbkdf2-sha256: must be followed by <iterations>:<salt hex>:<hash hex>"
                )
            };
            if parts.len() != 3 {
                return Err(bad());
            }
            let iterations = parts[0]
                .parse::<u32>()
                .ok()
                .and_then(std::num::NonZeroU32::new)
                .ok_or_else(bad)?;
            let salt = decode_hex(parts[1]).ok_or_else(bad)?;
            let hash = decode_hex(parts[2])
                .filter(|h| !h.is_empty())
                .ok_or_else(bad)?;
            return Ok(SecretHash::Pbkdf2 {
                iterations,
                salt,
                hash,
            });
        }
        Err(format!(
            "{what}: not a hash; store `sha256:<hex>` or `pbkdf2-sha256:<iterations>:<salt>:<hash>` \
             (make one with `fathom hash-secret`), never the secret itself"
        ))
    }

    fn verify(&self, secret: &[u8]) -> bool {
        match self {
            // Digests of the secret are compared: their timing tells
            // nothing usable about the secret.
            SecretHash::Sha256(h) => sha256(secret) == *h,
            SecretHash::Pbkdf2 {
                iterations,
                salt,
                hash,
            } => ring::pbkdf2::verify(
                ring::pbkdf2::PBKDF2_HMAC_SHA256,
                *iterations,
                salt,
                secret,
                hash,
            )
            .is_ok(),
        }
    }
}

pub fn sha256(b: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, b);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    let s = s.trim();
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

fn encode_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `sha256:<hex>` of a secret: the form for tokens (and generated
/// passwords) in the tenants file.
pub fn hash_sha256(secret: &str) -> String {
    format!("sha256:{}", encode_hex(&sha256(secret.as_bytes())))
}

/// `pbkdf2-sha256:<iterations>:<salt>:<hash>` of a password, salted with
/// 16 random bytes: the form for passwords people choose.
pub fn hash_pbkdf2(secret: &str, iterations: u32) -> String {
    use ring::rand::SecureRandom;
    let mut salt = [0u8; 16];
    // The system RNG fails only without /dev/urandom or getrandom(2).
    ring::rand::SystemRandom::new()
        .fill(&mut salt)
        .expect("the system random number generator works");
    let iterations =
        std::num::NonZeroU32::new(iterations.max(1)).unwrap_or(std::num::NonZeroU32::MIN);
    let mut out = [0u8; 32];
    ring::pbkdf2::derive(
        ring::pbkdf2::PBKDF2_HMAC_SHA256,
        iterations,
        &salt,
        secret.as_bytes(),
        &mut out,
    );
    format!(
        "pbkdf2-sha256:{iterations}:{}:{}",
        encode_hex(&salt),
        encode_hex(&out)
    )
}

// --- the file's shape ---

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    #[serde(default)]
    defaults: LimitsSpec,
    #[serde(default)]
    tenants: BTreeMap<String, Option<TenantSpec>>,
    #[serde(default)]
    credentials: Vec<CredentialSpec>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct TenantSpec {
    #[serde(default)]
    limits: LimitsSpec,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CredentialSpec {
    name: String,
    token: Option<String>,
    user: Option<String>,
    password: Option<String>,
    scopes: Vec<Scope>,
    tenants: Vec<String>,
}

/// A size (`4MiB`, `1000`) or duration (`7d`) as written in YAML: a
/// number or a string.
#[derive(Deserialize, Clone)]
#[serde(untagged)]
enum Human {
    Int(u64),
    Str(String),
}

impl Human {
    fn size(&self, what: &str) -> Result<u64, String> {
        match self {
            Human::Int(n) => Ok(*n),
            Human::Str(s) => s
                .parse::<bytesize::ByteSize>()
                .map(|b| b.as_u64())
                .map_err(|e| format!("{what}: {s:?} is not a size like 4MiB: {e}")),
        }
    }

    fn count(&self, what: &str) -> Result<u64, String> {
        match self {
            Human::Int(n) => Ok(*n),
            Human::Str(s) => s
                .trim()
                .parse::<u64>()
                .map_err(|_| format!("{what}: {s:?} is not a whole number")),
        }
    }

    fn duration(&self, what: &str) -> Result<Duration, String> {
        match self {
            Human::Int(n) => Ok(Duration::from_secs(*n)),
            Human::Str(s) => humantime::parse_duration(s)
                .map_err(|e| format!("{what}: {s:?} is not a duration like 7d: {e}")),
        }
    }
}

#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
struct LimitsSpec {
    ingestion_rate: Option<Human>,
    ingestion_burst: Option<Human>,
    max_series: Option<Human>,
    max_profile_size: Option<Human>,
    max_samples_per_profile: Option<Human>,
    max_labels: Option<Human>,
    max_query_range: Option<Human>,
    max_query_points: Option<Human>,
    query_memory: Option<Human>,
    query_timeout: Option<Human>,
    retention: Option<Human>,
}

impl LimitsSpec {
    fn compile(&self, at: &str) -> Result<TenantLimits, String> {
        let w = |f: &str| format!("{at}.{f}");
        let usize_of = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        let l = TenantLimits {
            ingestion_rate: self
                .ingestion_rate
                .as_ref()
                .map(|h| h.size(&w("ingestion_rate")))
                .transpose()?,
            ingestion_burst: self
                .ingestion_burst
                .as_ref()
                .map(|h| h.size(&w("ingestion_burst")))
                .transpose()?,
            max_series: self
                .max_series
                .as_ref()
                .map(|h| h.count(&w("max_series")).map(usize_of))
                .transpose()?,
            max_profile_size: self
                .max_profile_size
                .as_ref()
                .map(|h| h.size(&w("max_profile_size")).map(usize_of))
                .transpose()?,
            max_samples_per_profile: self
                .max_samples_per_profile
                .as_ref()
                .map(|h| h.count(&w("max_samples_per_profile")).map(usize_of))
                .transpose()?,
            max_labels: self
                .max_labels
                .as_ref()
                .map(|h| h.count(&w("max_labels")).map(usize_of))
                .transpose()?,
            max_query_range: self
                .max_query_range
                .as_ref()
                .map(|h| h.duration(&w("max_query_range")))
                .transpose()?,
            max_query_points: self
                .max_query_points
                .as_ref()
                .map(|h| {
                    h.count(&w("max_query_points"))
                        .map(|v| i64::try_from(v).unwrap_or(i64::MAX))
                })
                .transpose()?,
            query_memory: self
                .query_memory
                .as_ref()
                .map(|h| h.size(&w("query_memory")).map(usize_of))
                .transpose()?,
            query_timeout: self
                .query_timeout
                .as_ref()
                .map(|h| h.duration(&w("query_timeout")))
                .transpose()?,
            retention: self
                .retention
                .as_ref()
                .map(|h| h.duration(&w("retention")))
                .transpose()?,
        };
        if l.ingestion_rate == Some(0) {
            return Err(format!(
                "{at}.ingestion_rate: 0 would refuse every write; leave it unset for no limit"
            ));
        }
        if let (Some(r), Some(b)) = (l.ingestion_rate, l.ingestion_burst)
            && b < r
        {
            return Err(format!(
                "{at}.ingestion_burst ({b} bytes) is smaller than ingestion_rate ({r} bytes/s)"
            ));
        }
        Ok(l)
    }
}

/// A parsed, checked tenants file.
#[derive(Debug)]
pub struct TenantsConfig {
    tokens: HashMap<[u8; 32], Arc<Credential>>,
    users: HashMap<String, (SecretHash, Arc<Credential>)>,
    defaults: TenantLimits,
    tenants: HashMap<TenantId, TenantLimits>,
    /// SHA-256 of `user \0 password` of Basic logins verified against a
    /// PBKDF2 hash (bounded; cleared when full).
    verified: Mutex<HashSet<[u8; 32]>>,
}

/// Most cached PBKDF2 verifications before the cache is cleared.
const MAX_VERIFIED: usize = 4096;

impl TenantsConfig {
    /// Reads and checks a tenants file.
    pub fn load(path: &Path) -> Result<TenantsConfig, FileError> {
        let text = std::fs::read_to_string(path).map_err(|source| FileError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text)
    }

    /// Parses and checks the text of a tenants file.
    pub fn parse(text: &str) -> Result<TenantsConfig, FileError> {
        let spec: FileSpec = if text.trim().is_empty() {
            FileSpec::default()
        } else {
            serde_norway::from_str(text)?
        };
        let inv = FileError::Invalid;
        let defaults = spec.defaults.compile("defaults").map_err(inv)?;
        let mut tenants = HashMap::new();
        for (name, t) in &spec.tenants {
            let id = TenantId::new(name).map_err(|e| inv(format!("tenants.{name}: {e}")))?;
            let l = t
                .as_ref()
                .map(|t| t.limits.compile(&format!("tenants.{name}.limits")))
                .transpose()
                .map_err(inv)?
                .unwrap_or_default();
            tenants.insert(id, l);
        }
        let mut tokens = HashMap::new();
        let mut users = HashMap::new();
        let mut names = HashSet::new();
        for (i, c) in spec.credentials.iter().enumerate() {
            let at = format!("credentials[{i}] ({})", c.name);
            if c.name.trim().is_empty() {
                return Err(inv(format!("credentials[{i}]: name is empty")));
            }
            if !names.insert(c.name.clone()) {
                return Err(inv(format!("{at}: the name is used twice")));
            }
            if c.tenants.is_empty() {
                return Err(inv(format!("{at}: tenants is empty")));
            }
            if c.scopes.is_empty() {
                return Err(inv(format!("{at}: scopes is empty (read, write)")));
            }
            let mut ts = Vec::new();
            for t in &c.tenants {
                let id = TenantId::new(t).map_err(|e| inv(format!("{at}: tenant {t:?}: {e}")))?;
                if !ts.contains(&id) {
                    ts.push(id);
                }
            }
            let cred = Arc::new(Credential {
                name: c.name.clone(),
                read: c.scopes.contains(&Scope::Read),
                write: c.scopes.contains(&Scope::Write),
                tenants: ts,
            });
            match (&c.token, &c.user, &c.password) {
                (Some(t), None, None) => {
                    match SecretHash::parse(t, &format!("{at}: token")).map_err(inv)? {
                        SecretHash::Sha256(h) => {
                            if tokens.insert(h, cred).is_some() {
                                return Err(inv(format!("{at}: the same token is listed twice")));
                            }
                        }
                        SecretHash::Pbkdf2 { .. } => {
                            return Err(inv(format!(
                                "{at}: token: tokens are stored as sha256:<hex> (they are looked up by hash)"
                            )));
                        }
                    }
                }
                (None, Some(u), Some(p)) => {
                    if u.is_empty() || u.contains(':') {
                        return Err(inv(format!("{at}: user must be non-empty without ':'")));
                    }
                    let h = SecretHash::parse(p, &format!("{at}: password")).map_err(inv)?;
                    if users.insert(u.clone(), (h, cred)).is_some() {
                        return Err(inv(format!("{at}: user {u:?} is listed twice")));
                    }
                }
                _ => {
                    return Err(inv(format!(
                        "{at}: give either token, or user and password"
                    )));
                }
            }
        }
        Ok(TenantsConfig {
            tokens,
            users,
            defaults,
            tenants,
            verified: Mutex::new(HashSet::new()),
        })
    }

    /// How many credentials the file lists.
    pub fn credentials(&self) -> usize {
        self.tokens.len() + self.users.len()
    }

    /// The credential of an `Authorization` header value: `Bearer <token>`,
    /// or `Basic` with a listed user and password (or any user and a
    /// listed token as the password, as Grafana Cloud-style clients send).
    pub fn authenticate(&self, authorization: Option<&[u8]>) -> Result<Arc<Credential>, AuthError> {
        let Some(v) = authorization else {
            return Err(AuthError::Unauthenticated(
                "this server requires a credential: send Authorization: Bearer <token>, \
                 or Basic user:password"
                    .into(),
            ));
        };
        let v = std::str::from_utf8(v)
            .map_err(|_| {
                AuthError::Unauthenticated("the Authorization header is not UTF-8".into())
            })?
            .trim();
        let (scheme, rest) = v.split_once(' ').unwrap_or((v, ""));
        let rest = rest.trim();
        if scheme.eq_ignore_ascii_case("bearer") {
            return self
                .tokens
                .get(&sha256(rest.as_bytes()))
                .cloned()
                .ok_or_else(|| AuthError::Unauthenticated("unknown bearer token".into()));
        }
        if scheme.eq_ignore_ascii_case("basic") {
            let raw = base64::engine::general_purpose::STANDARD
                .decode(rest)
                .map_err(|_| {
                    AuthError::Unauthenticated("the Basic credential is not base64".into())
                })?;
            let raw = String::from_utf8(raw).map_err(|_| {
                AuthError::Unauthenticated("the Basic credential is not UTF-8".into())
            })?;
            let (user, password) = raw.split_once(':').ok_or_else(|| {
                AuthError::Unauthenticated("the Basic credential is not user:password".into())
            })?;
            return self
                .basic(user, password)
                .ok_or_else(|| AuthError::Unauthenticated("wrong user or password".into()));
        }
        Err(AuthError::Unauthenticated(format!(
            "unsupported Authorization scheme {scheme:?}: use Bearer or Basic"
        )))
    }

    fn basic(&self, user: &str, password: &str) -> Option<Arc<Credential>> {
        if let Some((hash, cred)) = self.users.get(user) {
            return match hash {
                SecretHash::Sha256(_) => hash.verify(password.as_bytes()).then(|| cred.clone()),
                SecretHash::Pbkdf2 { .. } => {
                    let key = sha256(format!("{user}\0{password}").as_bytes());
                    if self.verified.lock().contains(&key) {
                        return Some(cred.clone());
                    }
                    if !hash.verify(password.as_bytes()) {
                        return None;
                    }
                    let mut v = self.verified.lock();
                    if v.len() >= MAX_VERIFIED {
                        v.clear();
                    }
                    v.insert(key);
                    Some(cred.clone())
                }
            };
        }
        self.tokens.get(&sha256(password.as_bytes())).cloned()
    }

    /// The tenant a credential acts as for `scope`: the header's (which it
    /// must allow), else its first.
    pub fn authorize(
        cred: &Credential,
        scope: Scope,
        header: Option<&str>,
    ) -> Result<TenantId, AuthError> {
        if !cred.may(scope) {
            return Err(AuthError::PermissionDenied(format!(
                "credential {:?} may not {} (its scopes: {})",
                cred.name,
                scope.as_str(),
                [(cred.read, "read"), (cred.write, "write")]
                    .iter()
                    .filter(|(y, _)| *y)
                    .map(|(_, s)| *s)
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let Some(h) = header else {
            return Ok(cred.tenants[0].clone());
        };
        cred.tenants
            .iter()
            .find(|t| t.as_str() == h)
            .cloned()
            .ok_or_else(|| {
                AuthError::PermissionDenied(format!(
                    "credential {:?} may not {} tenant {h:?} (X-Scope-OrgID); it may use {}",
                    cred.name,
                    scope.as_str(),
                    cred.tenants
                        .iter()
                        .map(TenantId::as_str)
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
    }

    /// A tenant's limits: its own, then the file's defaults.
    pub fn limits(&self, tenant: &TenantId) -> TenantLimits {
        match self.tenants.get(tenant) {
            Some(l) => l.or(&self.defaults),
            None => self.defaults.clone(),
        }
    }

    /// Every tenant named with limits of its own, with its resolved limits.
    pub fn tenant_limits(&self) -> impl Iterator<Item = (&TenantId, TenantLimits)> {
        self.tenants.iter().map(|(t, l)| (t, l.or(&self.defaults)))
    }

    pub fn default_limits(&self) -> &TenantLimits {
        &self.defaults
    }
}

tokio::task_local! {
    /// The limits of the tenant of the request being handled.
    static REQUEST_LIMITS: TenantLimits;
}

/// Runs `f` (a request's handling) with `limits` as its tenant's limits:
/// the server's authentication layer does this, so that handlers deep in
/// the querier apply them without threading the tenant through.
pub async fn with_request_limits<F: std::future::Future>(limits: TenantLimits, f: F) -> F::Output {
    REQUEST_LIMITS.scope(limits, f).await
}

/// The limits of the current request's tenant; `None` outside
/// [`with_request_limits`] (no tenants file, or work outside the request's
/// task, which then keeps the flags' limits).
pub fn request_limits() -> Option<TenantLimits> {
    REQUEST_LIMITS.try_with(Clone::clone).ok()
}

/// The tenants file in force, shared by the request layer, the
/// distributor and the querier, and swapped whole on reload. Cheap to
/// clone.
#[derive(Clone, Debug)]
pub struct Tenants(Arc<RwLock<Arc<TenantsConfig>>>);

impl Tenants {
    pub fn new(cfg: TenantsConfig) -> Tenants {
        Tenants(Arc::new(RwLock::new(Arc::new(cfg))))
    }

    pub fn current(&self) -> Arc<TenantsConfig> {
        self.0.read().clone()
    }

    pub fn replace(&self, cfg: TenantsConfig) {
        *self.0.write() = Arc::new(cfg);
    }

    pub fn limits(&self, tenant: &TenantId) -> TenantLimits {
        self.current().limits(tenant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(c: &TenantsConfig, v: &[u8]) -> Result<Arc<Credential>, AuthError> {
        c.authenticate(Some(v))
    }

    fn basic(user: &str, pass: &str) -> Vec<u8> {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))
        )
        .into_bytes()
    }

    fn file() -> String {
        format!(
            r#"
defaults:
  ingestion_rate: 1MiB
  ingestion_burst: 4MiB
  max_query_range: 7d
tenants:
  team-a:
    limits: {{ ingestion_rate: 2MiB, max_labels: 8 }}
  team-b:
credentials:
  - name: agent-a
    token: {}
    scopes: [write]
    tenants: [team-a]
  - name: ops
    user: ops
    password: {}
    scopes: [read]
    tenants: [team-a, team-b]
  - name: sdk
    user: sdk
    password: {}
    scopes: [read, write]
    tenants: [team-b]
"#,
            hash_sha256("tok-a"),
            hash_pbkdf2("hunter2", 1000),
            hash_sha256("sdk-pass"),
        )
    }

    #[test]
    fn bearer_and_basic() {
        let c = TenantsConfig::parse(&file()).unwrap();
        assert_eq!(c.credentials(), 3);
        let a = auth(&c, b"Bearer tok-a").unwrap();
        assert_eq!(a.name, "agent-a");
        assert!(matches!(
            auth(&c, b"Bearer tok-b"),
            Err(AuthError::Unauthenticated(_))
        ));
        assert!(matches!(
            c.authenticate(None),
            Err(AuthError::Unauthenticated(_))
        ));
        let ops = auth(&c, &basic("ops", "hunter2")).unwrap();
        assert_eq!(ops.name, "ops");
        // Cached the second time, same answer.
        assert_eq!(auth(&c, &basic("ops", "hunter2")).unwrap().name, "ops");
        assert!(auth(&c, &basic("ops", "hunter3")).is_err());
        assert_eq!(auth(&c, &basic("sdk", "sdk-pass")).unwrap().name, "sdk");
        // A token as the Basic password, any user.
        assert_eq!(auth(&c, &basic("team-a", "tok-a")).unwrap().name, "agent-a");
        assert!(auth(&c, b"Digest x").is_err());
    }

    #[test]
    fn scopes_and_tenants() {
        let c = TenantsConfig::parse(&file()).unwrap();
        let agent = auth(&c, b"Bearer tok-a").unwrap();
        assert_eq!(
            TenantsConfig::authorize(&agent, Scope::Write, None)
                .unwrap()
                .as_str(),
            "team-a"
        );
        let e = TenantsConfig::authorize(&agent, Scope::Read, None).unwrap_err();
        assert!(matches!(&e, AuthError::PermissionDenied(m) if m.contains("may not read")));
        let e = TenantsConfig::authorize(&agent, Scope::Write, Some("team-b")).unwrap_err();
        assert!(matches!(&e, AuthError::PermissionDenied(m) if m.contains("team-b")));
        let ops = auth(&c, &basic("ops", "hunter2")).unwrap();
        assert_eq!(
            TenantsConfig::authorize(&ops, Scope::Read, Some("team-b"))
                .unwrap()
                .as_str(),
            "team-b"
        );
        assert!(TenantsConfig::authorize(&ops, Scope::Write, Some("team-b")).is_err());
    }

    #[test]
    fn limits_fall_back_to_defaults() {
        let c = TenantsConfig::parse(&file()).unwrap();
        let a = c.limits(&TenantId::new("team-a").unwrap());
        assert_eq!(a.ingestion_rate, Some(2 << 20));
        assert_eq!(a.ingestion_burst, Some(4 << 20));
        assert_eq!(a.max_labels, Some(8));
        assert_eq!(a.max_query_range, Some(Duration::from_secs(7 * 86400)));
        let other = c.limits(&TenantId::new("zzz").unwrap());
        assert_eq!(other.ingestion_rate, Some(1 << 20));
        assert_eq!(other.max_labels, None);
    }

    #[test]
    fn mistakes_are_named() {
        let e = |t: &str| TenantsConfig::parse(t).unwrap_err().to_string();
        assert!(
            e("credentials:\n  - {name: x, token: plain, scopes: [read], tenants: [a]}\n")
                .contains("never the secret itself")
        );
        assert!(
            e("credentials:\n  - {name: x, token: sha256:00, scopes: [read], tenants: [a]}\n")
                .contains("64 hex digits")
        );
        assert!(e("tenants:\n  ../x:\n").contains("tenants.../x"));
        assert!(e("defaults: {ingestion_rate: fast}\n").contains("defaults.ingestion_rate"));
        assert!(e("defaults: {ingestion_rat: 1}\n").contains("unknown field"));
        let h = hash_sha256("t");
        assert!(
            e(&format!(
                "credentials:\n  - {{name: x, token: '{h}', scopes: [], tenants: [a]}}\n"
            ))
            .contains("scopes is empty")
        );
        assert!(
            e(&format!(
                "credentials:\n  - {{name: x, token: '{h}', scopes: [read], tenants: [a]}}\n  - {{name: x, token: '{h}', scopes: [read], tenants: [a]}}\n"
            ))
            .contains("used twice")
        );
        assert!(TenantsConfig::parse("").unwrap().credentials() == 0);
    }

    #[test]
    fn hashes_verify() {
        assert!(
            SecretHash::parse(&hash_sha256("x"), "t")
                .unwrap()
                .verify(b"x")
        );
        let p = SecretHash::parse(&hash_pbkdf2("pw", 10), "t").unwrap();
        assert!(p.verify(b"pw"));
        assert!(!p.verify(b"pw2"));
    }
}
