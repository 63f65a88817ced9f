//! Arrow Flight and Flight SQL on the querier (`docs/flight.md`,
//! `docs/sql.md`).
//!
//! One gRPC service answers both:
//!
//! - a Flight ticket (or descriptor command) that is a JSON object names a
//!   query of the HTTP API, with the HTTP API's parameters
//!   (`{"kind": "merge", "query": "<selector>", "start": "now-1h"}`), and is
//!   answered with Arrow record batches;
//! - anything else is Flight SQL (protobuf `Any` commands), executed by
//!   DataFusion over the tenant's tables (`fathom_querier`'s SQL catalog).
//!
//! The tenant comes from the `x-scope-orgid` call header on every call.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arrow::array::{
    ArrayRef, FixedSizeBinaryBuilder, Int64Array, ListBuilder, RecordBatch, StringBuilder,
    TimestampMillisecondArray,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::ipc::writer::IpcWriteOptions;
use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::sql::metadata::{SqlInfoData, SqlInfoDataBuilder};
use arrow_flight::sql::server::{FlightSqlService, PeekableFlightDataStream};
use arrow_flight::sql::{
    ActionClosePreparedStatementRequest, ActionCreatePreparedStatementRequest,
    ActionCreatePreparedStatementResult, CommandGetCatalogs, CommandGetDbSchemas,
    CommandGetSqlInfo, CommandGetTableTypes, CommandGetTables, CommandPreparedStatementQuery,
    CommandPreparedStatementUpdate, CommandStatementIngest, CommandStatementQuery,
    CommandStatementUpdate, DoPutPreparedStatementResult, ProstMessageExt, SqlInfo,
    SqlSupportedTransaction, TicketStatementQuery,
};
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightEndpoint, FlightInfo,
    HandshakeRequest, HandshakeResponse, IpcMessage, PollInfo, PutResult, SchemaAsIpc,
    SchemaResult, Ticket,
};
use bytes::Bytes;
use datafusion::common::ScalarValue;
use fathom_api::ApiError;
use fathom_api::ticket::{is_json, json_params};
use fathom_model::TenantId;
use futures::{Stream, TryStreamExt};
use parking_lot::Mutex;
use prost::Message;
use tonic::{Request, Response, Status, Streaming};

use crate::http::{diff_params, range, range_params, selector};
use fathom_querier::folded;
use fathom_querier::{
    CATALOG, Querier, SCHEMA, SqlError, SqlQuery, TABLES, labels_type, stack_type, table_schema,
};

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The Flight service of a querier: Flight (JSON tickets) and Flight SQL.
/// (An ingester's head reads are its own Flight service,
/// `fathom_ingester::flight_service`.)
pub fn flight_service(q: Querier) -> FlightServiceServer<FathomFlight> {
    FlightServiceServer::new(FathomFlight {
        sql: Arc::new(SqlService::new(q)),
    })
    .max_decoding_message_size(16 << 20)
}

fn tenant<T>(req: &Request<T>) -> Result<TenantId, Status> {
    fathom_api::tenant_from_metadata(req.metadata()).map_err(Status::from)
}

/// The queries a JSON ticket can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Merge,
    Diff,
    Series,
    QueryRange,
    ProfileTypes,
}

impl Kind {
    fn parse(p: &HashMap<String, String>) -> Result<Kind, Status> {
        match p.get("kind").map(String::as_str) {
            Some("merge") => Ok(Kind::Merge),
            Some("diff") => Ok(Kind::Diff),
            Some("series") => Ok(Kind::Series),
            Some("query_range") => Ok(Kind::QueryRange),
            Some("profile_types") => Ok(Kind::ProfileTypes),
            Some(other) => Err(Status::invalid_argument(format!(
                "ticket kind {other:?} is not one of merge, diff, series, query_range, profile_types"
            ))),
            None => Err(Status::invalid_argument(
                "a JSON ticket needs a \"kind\": merge, diff, series, query_range or profile_types",
            )),
        }
    }

    fn schema(self) -> SchemaRef {
        let stack = Field::new("stack", stack_type(), false);
        let fields = match self {
            Kind::Merge => vec![stack, Field::new("value", DataType::Int64, false)],
            Kind::Diff => vec![
                stack,
                Field::new("left", DataType::Int64, false),
                Field::new("right", DataType::Int64, false),
            ],
            Kind::Series => vec![
                Field::new("series_id", DataType::FixedSizeBinary(16), false),
                Field::new("profile_type", DataType::Utf8, false),
                Field::new("labels", labels_type(), false),
            ],
            Kind::QueryRange => vec![
                Field::new("labels", labels_type(), false),
                Field::new(
                    "time",
                    DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
                    false,
                ),
                Field::new("value", DataType::Int64, false),
            ],
            Kind::ProfileTypes => vec![Field::new("profile_type", DataType::Utf8, false)],
        };
        Arc::new(Schema::new(fields))
    }
}

fn api(e: ApiError) -> Status {
    e.into()
}

/// A SQL error in the API's one mapping.
fn sql_status(e: SqlError) -> Status {
    ApiError::from(e).into()
}

fn arrow_status(e: arrow::error::ArrowError) -> Status {
    Status::internal(e.to_string())
}

/// Frames lists and values as `stack` plus value columns.
fn stack_batch<const N: usize>(
    schema: SchemaRef,
    rows: &[(Vec<String>, [i64; N])],
) -> Result<RecordBatch, Status> {
    let mut stack = ListBuilder::new(StringBuilder::new());
    let mut vals: [Vec<i64>; N] = std::array::from_fn(|_| Vec::with_capacity(rows.len()));
    for (frames, v) in rows {
        for f in frames {
            stack.values().append_value(f);
        }
        stack.append(true);
        for (c, x) in v.iter().enumerate() {
            vals[c].push(*x);
        }
    }
    let mut cols: Vec<ArrayRef> = vec![Arc::new(stack.finish())];
    for v in vals {
        cols.push(Arc::new(Int64Array::from(v)));
    }
    RecordBatch::try_new(schema, cols).map_err(arrow_status)
}

fn labels_array<'a>(
    labels: impl Iterator<Item = &'a fathom_model::Labels>,
) -> Result<ArrayRef, Status> {
    let mut b = arrow::array::MapBuilder::new(None, StringBuilder::new(), StringBuilder::new());
    for l in labels {
        for (k, v) in l.iter() {
            b.keys().append_value(k);
            b.values().append_value(v);
        }
        b.append(true).map_err(arrow_status)?;
    }
    Ok(Arc::new(b.finish()))
}

/// Runs the query a JSON ticket names.
async fn run_ticket(
    q: &Querier,
    t: &TenantId,
    p: &HashMap<String, String>,
) -> Result<RecordBatch, Status> {
    let kind = Kind::parse(p)?;
    let schema = kind.schema();
    match kind {
        Kind::Merge => {
            let r = range(q, p, "start", "end").map_err(api)?;
            let sel = selector(p, "query", true).map_err(api)?.unwrap_or_default();
            let m = q
                .merge(t, &sel, r.start, r.end)
                .await
                .map_err(|e| api(e.into()))?;
            stack_batch(schema, &folded([(&m.samples[..], &m.symbols)]))
        }
        Kind::Diff => {
            let ((ls, lr), (rs, rr)) = diff_params(q, p).map_err(api)?;
            let (l, r) = tokio::try_join!(
                q.merge(t, &ls, lr.start, lr.end),
                q.merge(t, &rs, rr.start, rr.end)
            )
            .map_err(|e| api(e.into()))?;
            stack_batch(
                schema,
                &folded([(&l.samples[..], &l.symbols), (&r.samples[..], &r.symbols)]),
            )
        }
        Kind::Series => {
            let r = range(q, p, "start", "end").map_err(api)?;
            let sel = selector(p, "query", false).map_err(api)?;
            let rows = q
                .series(t, sel.as_ref(), r.start, r.end)
                .await
                .map_err(|e| api(e.into()))?;
            let mut ids = FixedSizeBinaryBuilder::new(16);
            let mut pt = StringBuilder::new();
            for s in &rows {
                ids.append_value(s.series_id.0).map_err(arrow_status)?;
                pt.append_value(s.profile_type.to_string());
            }
            let cols: Vec<ArrayRef> = vec![
                Arc::new(ids.finish()),
                Arc::new(pt.finish()),
                labels_array(rows.iter().map(|s| &s.labels))?,
            ];
            RecordBatch::try_new(schema, cols).map_err(arrow_status)
        }
        Kind::QueryRange => {
            let (sel, r, step, group_by) = range_params(q, p).map_err(api)?;
            let series = q
                .range(t, &sel, r.start, r.end, step, group_by)
                .await
                .map_err(|e| api(e.into()))?;
            let mut labels = Vec::new();
            let (mut time, mut value) = (Vec::new(), Vec::new());
            for s in &series {
                for (ms, v) in &s.points {
                    labels.push(&s.labels);
                    time.push(*ms);
                    value.push(*v);
                }
            }
            let cols: Vec<ArrayRef> = vec![
                labels_array(labels.into_iter())?,
                Arc::new(TimestampMillisecondArray::from(time).with_timezone("UTC")),
                Arc::new(Int64Array::from(value)),
            ];
            RecordBatch::try_new(schema, cols).map_err(arrow_status)
        }
        Kind::ProfileTypes => {
            let r = range(q, p, "start", "end").map_err(api)?;
            let types = q
                .profile_types(t, r.start, r.end)
                .await
                .map_err(|e| api(e.into()))?;
            let cols: Vec<ArrayRef> = vec![Arc::new(arrow::array::StringArray::from(types))];
            RecordBatch::try_new(schema, cols).map_err(arrow_status)
        }
    }
}

fn schema_bytes(schema: &Schema) -> Result<Bytes, Status> {
    let IpcMessage(b) = SchemaAsIpc::new(schema, &IpcWriteOptions::default())
        .try_into()
        .map_err(arrow_status)?;
    Ok(b)
}

fn one_batch(batch: RecordBatch) -> BoxStream<FlightData> {
    let schema = batch.schema();
    Box::pin(
        FlightDataEncoderBuilder::new()
            .with_schema(schema)
            .build(futures::stream::once(async move { Ok(batch) }))
            .map_err(Status::from),
    )
}

/// A prepared statement: its tenant, SQL and bound parameters.
struct Prepared {
    tenant: TenantId,
    sql: String,
    params: Option<Vec<ScalarValue>>,
    used: u64,
}

/// A statement planned by `GetFlightInfo`, for the `DoGet` that follows.
struct Planned {
    tenant: TenantId,
    sql: String,
    at: Instant,
    query: SqlQuery,
}

/// Planned statements kept for their `DoGet`, at most, and for how long.
const PLANNED_KEPT: usize = 64;
const PLANNED_TTL: Duration = Duration::from_secs(30);

/// The Flight SQL half.
pub(crate) struct SqlService {
    q: Querier,
    info: SqlInfoData,
    prepared: Mutex<(u64, HashMap<Bytes, Prepared>)>,
    /// A client runs a statement as `GetFlightInfo` (which plans it, for
    /// its schema) then `DoGet` of the ticket: the plan waits here so the
    /// statement is planned once. The ticket still carries the SQL, so a
    /// `DoGet` that finds nothing here (another querier, a late or
    /// repeated one) plans it again.
    planned: Mutex<VecDeque<Planned>>,
    plans_reused: AtomicU64,
}

impl SqlService {
    fn new(q: Querier) -> Self {
        let mut b = SqlInfoDataBuilder::new();
        b.append(SqlInfo::FlightSqlServerName, "Fathom");
        b.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
        b.append(SqlInfo::FlightSqlServerArrowVersion, "1.3");
        b.append(SqlInfo::FlightSqlServerReadOnly, true);
        b.append(SqlInfo::FlightSqlServerSql, true);
        b.append(SqlInfo::FlightSqlServerSubstrait, false);
        b.append(
            SqlInfo::FlightSqlServerTransaction,
            SqlSupportedTransaction::None as i32,
        );
        b.append(SqlInfo::FlightSqlServerCancel, false);
        b.append(
            SqlInfo::FlightSqlServerStatementTimeout,
            i32::try_from(q.sql_config().timeout.as_millis()).unwrap_or(i32::MAX),
        );
        let info = b.build().unwrap_or_else(|_| {
            SqlInfoDataBuilder::new()
                .build()
                .expect("an empty SqlInfo table builds")
        });
        SqlService {
            q,
            info,
            prepared: Mutex::new((0, HashMap::new())),
            planned: Mutex::new(VecDeque::new()),
            plans_reused: AtomicU64::new(0),
        }
    }

    /// Keeps `query`, planned for `tenant`'s `sql`, for its `DoGet`.
    fn keep_plan(&self, tenant: &TenantId, sql: &str, query: SqlQuery) {
        let mut kept = self.planned.lock();
        kept.retain(|p| p.at.elapsed() < PLANNED_TTL);
        if kept.len() >= PLANNED_KEPT {
            kept.pop_front();
        }
        kept.push_back(Planned {
            tenant: tenant.clone(),
            sql: sql.to_owned(),
            at: Instant::now(),
            query,
        });
    }

    /// The plan `GetFlightInfo` kept for `tenant`'s `sql`, taken (each is
    /// used once), else a new plan.
    async fn take_or_plan(&self, tenant: &TenantId, sql: &str) -> Result<SqlQuery, Status> {
        let kept = {
            let mut kept = self.planned.lock();
            kept.retain(|p| p.at.elapsed() < PLANNED_TTL);
            kept.iter()
                .position(|p| &p.tenant == tenant && p.sql == sql)
                .and_then(|i| kept.remove(i))
        };
        match kept {
            Some(p) => {
                self.plans_reused.fetch_add(1, Ordering::Relaxed);
                Ok(p.query)
            }
            None => self.plan(tenant, sql, None).await,
        }
    }

    async fn plan(
        &self,
        tenant: &TenantId,
        sql: &str,
        params: Option<Vec<ScalarValue>>,
    ) -> Result<SqlQuery, Status> {
        self.q
            .sql_plan(tenant, sql, params)
            .await
            .map_err(sql_status)
    }

    fn stream(&self, q: SqlQuery) -> BoxStream<FlightData> {
        let schema = q.schema();
        let rx = self.q.sql_execute(q);
        let batches = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|r| {
                (
                    r.map_err(|e| FlightError::Tonic(Box::new(sql_status(e)))),
                    rx,
                )
            })
        });
        Box::pin(
            FlightDataEncoderBuilder::new()
                .with_schema(schema)
                .build(batches)
                .map_err(Status::from),
        )
    }

    fn info(
        &self,
        schema: &Schema,
        ticket: Bytes,
        descriptor: FlightDescriptor,
    ) -> Result<Response<FlightInfo>, Status> {
        let info = FlightInfo::new()
            .try_with_schema(schema)
            .map_err(arrow_status)?
            .with_endpoint(FlightEndpoint::new().with_ticket(Ticket { ticket }))
            .with_descriptor(descriptor);
        Ok(Response::new(info))
    }

    /// The FlightInfo of a metadata command: its schema, and the command
    /// itself as the ticket.
    fn metadata_info(
        &self,
        request: Request<FlightDescriptor>,
        schema: &Schema,
        cmd: arrow_flight::sql::Any,
    ) -> Result<Response<FlightInfo>, Status> {
        tenant(&request)?;
        self.info(schema, cmd.encode_to_vec().into(), request.into_inner())
    }

    /// The prepared statement `handle` of `tenant`.
    fn prepared(
        &self,
        tenant: &TenantId,
        handle: &Bytes,
    ) -> Result<(String, Option<Vec<ScalarValue>>), Status> {
        let mut g = self.prepared.lock();
        g.0 += 1;
        let tick = g.0;
        match g.1.get_mut(handle) {
            Some(p) if &p.tenant == tenant => {
                p.used = tick;
                Ok((p.sql.clone(), p.params.clone()))
            }
            _ => Err(Status::not_found(
                "no such prepared statement (closed, expired, or of another tenant)",
            )),
        }
    }

    fn read_only<T>(what: &str) -> Result<T, Status> {
        Err(Status::permission_denied(format!(
            "Fathom's SQL is read-only: {what} is refused"
        )))
    }
}

#[tonic::async_trait]
impl FlightSqlService for SqlService {
    type FlightService = SqlService;

    /// Flight's handshake, as ADBC's username/password login sends it. The
    /// server's authentication layer has checked the credential (with a
    /// tenants file); the answer carries the same `authorization` header,
    /// which the client then sends on its later calls.
    async fn do_handshake(
        &self,
        request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<BoxStream<HandshakeResponse>>, Status> {
        let auth = request.metadata().get("authorization").cloned();
        let out: BoxStream<HandshakeResponse> = Box::pin(futures::stream::once(async {
            Ok(HandshakeResponse {
                protocol_version: 0,
                payload: Bytes::new(),
            })
        }));
        let mut resp = Response::new(out);
        if let Some(a) = auth {
            resp.metadata_mut().insert("authorization", a);
        }
        Ok(resp)
    }

    async fn get_flight_info_statement(
        &self,
        query: CommandStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let t = tenant(&request)?;
        let planned = self.plan(&t, &query.query, None).await?;
        self.keep_plan(&t, &query.query, planned.clone());
        let ticket = TicketStatementQuery {
            statement_handle: Bytes::from(query.query.into_bytes()),
        }
        .as_any()
        .encode_to_vec();
        self.info(&planned.schema(), ticket.into(), request.into_inner())
    }

    async fn get_flight_info_prepared_statement(
        &self,
        cmd: CommandPreparedStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let t = tenant(&request)?;
        let (sql, params) = self.prepared(&t, &cmd.prepared_statement_handle)?;
        let planned = self.plan(&t, &sql, params).await?;
        let ticket = cmd.as_any().encode_to_vec();
        self.info(&planned.schema(), ticket.into(), request.into_inner())
    }

    async fn get_flight_info_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let any = query.as_any();
        self.metadata_info(request, &query.into_builder().schema(), any)
    }

    async fn get_flight_info_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let any = query.as_any();
        self.metadata_info(request, &query.into_builder().schema(), any)
    }

    async fn get_flight_info_tables(
        &self,
        query: CommandGetTables,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let any = query.as_any();
        self.metadata_info(request, &query.into_builder().schema(), any)
    }

    async fn get_flight_info_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let any = query.as_any();
        self.metadata_info(request, &query.into_builder().schema(), any)
    }

    async fn get_flight_info_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let any = query.as_any();
        self.metadata_info(request, &query.into_builder(&self.info).schema(), any)
    }

    async fn do_get_statement(
        &self,
        ticket: TicketStatementQuery,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let t = tenant(&request)?;
        let sql = std::str::from_utf8(&ticket.statement_handle)
            .map_err(|_| Status::invalid_argument("the statement handle is not UTF-8 SQL"))?;
        let planned = self.take_or_plan(&t, sql).await?;
        Ok(Response::new(self.stream(planned)))
    }

    async fn do_get_prepared_statement(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let t = tenant(&request)?;
        let (sql, params) = self.prepared(&t, &query.prepared_statement_handle)?;
        let planned = self.plan(&t, &sql, params).await?;
        Ok(Response::new(self.stream(planned)))
    }

    async fn do_get_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        tenant(&request)?;
        let mut b = query.into_builder();
        b.append(CATALOG);
        Ok(Response::new(one_batch(b.build().map_err(Status::from)?)))
    }

    async fn do_get_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        tenant(&request)?;
        let mut b = query.into_builder();
        b.append(CATALOG, SCHEMA);
        Ok(Response::new(one_batch(b.build().map_err(Status::from)?)))
    }

    async fn do_get_tables(
        &self,
        query: CommandGetTables,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        tenant(&request)?;
        let mut b = query.into_builder();
        for name in TABLES {
            let schema = table_schema(name).ok_or_else(|| Status::internal(name))?;
            b.append(CATALOG, SCHEMA, name, "TABLE", &schema)
                .map_err(Status::from)?;
        }
        Ok(Response::new(one_batch(b.build().map_err(Status::from)?)))
    }

    async fn do_get_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        tenant(&request)?;
        let mut b = query.into_builder();
        b.append("TABLE");
        Ok(Response::new(one_batch(b.build().map_err(Status::from)?)))
    }

    async fn do_get_sql_info(
        &self,
        query: CommandGetSqlInfo,
        _request: Request<Ticket>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let b = query.into_builder(&self.info);
        Ok(Response::new(one_batch(b.build().map_err(Status::from)?)))
    }

    async fn do_put_statement_update(
        &self,
        _ticket: CommandStatementUpdate,
        _request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        Self::read_only("an update statement")
    }

    async fn do_put_statement_ingest(
        &self,
        _ticket: CommandStatementIngest,
        _request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        Self::read_only("bulk ingestion")
    }

    async fn do_put_prepared_statement_update(
        &self,
        _query: CommandPreparedStatementUpdate,
        _request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        Self::read_only("an update statement")
    }

    async fn do_put_prepared_statement_query(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<DoPutPreparedStatementResult, Status> {
        let t = tenant(&request)?;
        let handle = query.prepared_statement_handle.clone();
        self.prepared(&t, &handle)?;
        let stream = FlightRecordBatchStream::new_from_flight_data(
            request.into_inner().map_err(FlightError::from),
        );
        let batches: Vec<RecordBatch> = stream.try_collect().await.map_err(Status::from)?;
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        let params = match batches.iter().find(|b| b.num_rows() > 0) {
            None => None,
            Some(_) if rows > 1 => {
                return Err(Status::invalid_argument(format!(
                    "parameters bind one row at a time; {rows} rows were sent"
                )));
            }
            Some(b) => {
                let mut v = Vec::with_capacity(b.num_columns());
                for c in b.columns() {
                    v.push(
                        ScalarValue::try_from_array(c, 0)
                            .map_err(|e| Status::invalid_argument(format!("parameter: {e}")))?,
                    );
                }
                Some(v)
            }
        };
        let mut g = self.prepared.lock();
        if let Some(p) = g.1.get_mut(&handle) {
            p.params = params;
        }
        Ok(DoPutPreparedStatementResult {
            prepared_statement_handle: Some(handle),
        })
    }

    async fn do_action_create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        request: Request<Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        let t = tenant(&request)?;
        let (dataset, params) = self
            .q
            .sql_parameters(&t, &query.query)
            .await
            .map_err(sql_status)?;
        let handle = Bytes::from(uuid::Uuid::new_v4().to_string().into_bytes());
        {
            let mut g = self.prepared.lock();
            let max = self.q.sql_config().max_prepared.max(1);
            if g.1.len() >= max
                && let Some(oldest) =
                    g.1.iter()
                        .min_by_key(|(_, p)| p.used)
                        .map(|(k, _)| k.clone())
            {
                g.1.remove(&oldest);
            }
            g.0 += 1;
            let used = g.0;
            g.1.insert(
                handle.clone(),
                Prepared {
                    tenant: t,
                    sql: query.query,
                    params: None,
                    used,
                },
            );
        }
        Ok(ActionCreatePreparedStatementResult {
            prepared_statement_handle: handle,
            dataset_schema: schema_bytes(&dataset)?,
            parameter_schema: schema_bytes(&params)?,
        })
    }

    async fn do_action_close_prepared_statement(
        &self,
        query: ActionClosePreparedStatementRequest,
        request: Request<Action>,
    ) -> Result<(), Status> {
        let t = tenant(&request)?;
        let mut g = self.prepared.lock();
        if g.1
            .get(&query.prepared_statement_handle)
            .is_some_and(|p| p.tenant == t)
        {
            g.1.remove(&query.prepared_statement_handle);
        }
        Ok(())
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}

/// Flight (JSON tickets) in front of Flight SQL.
pub struct FathomFlight {
    sql: Arc<SqlService>,
}

impl FathomFlight {
    fn sql(&self) -> Result<&SqlService, Status> {
        Ok(&self.sql)
    }

    fn json_info(
        &self,
        descriptor: FlightDescriptor,
    ) -> Result<(Kind, Bytes, FlightDescriptor), Status> {
        let p = json_params(&descriptor.cmd)?;
        let kind = Kind::parse(&p)?;
        Ok((kind, descriptor.cmd.clone(), descriptor))
    }
}

#[tonic::async_trait]
impl FlightService for FathomFlight {
    type HandshakeStream = BoxStream<HandshakeResponse>;
    type ListFlightsStream = BoxStream<FlightInfo>;
    type DoGetStream = BoxStream<FlightData>;
    type DoPutStream = BoxStream<PutResult>;
    type DoExchangeStream = BoxStream<FlightData>;
    type DoActionStream = BoxStream<arrow_flight::Result>;
    type ListActionsStream = BoxStream<ActionType>;

    async fn handshake(
        &self,
        request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        FlightService::handshake(self.sql()?, request).await
    }

    async fn list_flights(
        &self,
        request: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        FlightService::list_flights(self.sql()?, request).await
    }

    async fn get_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        if !is_json(&request.get_ref().cmd) {
            return FlightService::get_flight_info(self.sql()?, request).await;
        }
        tenant(&request)?;
        let (kind, ticket, descriptor) = self.json_info(request.into_inner())?;
        self.sql()?.info(&kind.schema(), ticket, descriptor)
    }

    async fn poll_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        FlightService::poll_flight_info(self.sql()?, request).await
    }

    async fn get_schema(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        if is_json(&request.get_ref().cmd) {
            let (kind, _, _) = self.json_info(request.into_inner())?;
            let r: SchemaResult = SchemaAsIpc::new(&kind.schema(), &IpcWriteOptions::default())
                .try_into()
                .map_err(arrow_status)?;
            return Ok(Response::new(r));
        }
        // A Flight SQL statement: its result schema.
        let t = tenant(&request)?;
        let any = arrow_flight::sql::Any::decode(&*request.get_ref().cmd)
            .map_err(|e| Status::invalid_argument(format!("descriptor command: {e}")))?;
        let Ok(Some(cmd)) = any.unpack::<CommandStatementQuery>() else {
            return Err(Status::invalid_argument(
                "GetSchema takes a JSON query or a Flight SQL CommandStatementQuery",
            ));
        };
        let planned = self.sql()?.plan(&t, &cmd.query, None).await?;
        let r: SchemaResult = SchemaAsIpc::new(&planned.schema(), &IpcWriteOptions::default())
            .try_into()
            .map_err(arrow_status)?;
        Ok(Response::new(r))
    }

    async fn do_get(
        &self,
        request: Request<Ticket>,
    ) -> Result<Response<Self::DoGetStream>, Status> {
        if !is_json(&request.get_ref().ticket) {
            return FlightService::do_get(self.sql()?, request).await;
        }
        let t = tenant(&request)?;
        let p = json_params(&request.get_ref().ticket)?;
        let batch = run_ticket(&self.sql()?.q, &t, &p).await?;
        Ok(Response::new(one_batch(batch)))
    }

    async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        FlightService::do_put(self.sql()?, request).await
    }

    async fn do_exchange(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        FlightService::do_exchange(self.sql()?, request).await
    }

    async fn do_action(
        &self,
        request: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        FlightService::do_action(self.sql()?, request).await
    }

    async fn list_actions(
        &self,
        request: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        FlightService::list_actions(self.sql()?, request).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_tickets_are_told_from_flight_sql_commands() {
        assert!(is_json(br#" {"kind":"merge"}"#));
        let any = CommandStatementQuery {
            query: "SELECT 1".into(),
            transaction_id: None,
        }
        .as_any()
        .encode_to_vec();
        assert!(!is_json(&any));
    }

    #[test]
    fn json_ticket_parameters() {
        let p = json_params(br#"{"kind":"merge","query":"a{}","start":5}"#).unwrap();
        assert_eq!(p["start"], "5");
        assert_eq!(Kind::parse(&p).unwrap(), Kind::Merge);
        let e = Kind::parse(&json_params(br#"{"kind":"nope"}"#).unwrap()).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("nope"));
        let e = Status::from(json_params(b"{not json").unwrap_err());
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }

    /// `GetFlightInfo` then `DoGet` of a statement plans it once: `DoGet`
    /// takes the kept plan. A `DoGet` with no kept plan, or another
    /// tenant's, plans again, with the same answer.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_statement_is_planned_once_for_its_flight_info_and_do_get() {
        use arrow::array::AsArray;
        use arrow::datatypes::Int64Type;
        use fathom_block::MemoryIndex;
        use object_store::ObjectStore;
        use object_store::memory::InMemory;

        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let (metas, all) = fathom_querier::test_util::history(store.as_ref()).await;
        let rows: usize = all.iter().map(|p| p.samples.len()).sum();
        let q = fathom_querier::test_querier_on(
            fathom_querier::Config::default(),
            Arc::new(MemoryIndex::new(metas)),
            store,
        );
        let svc = &SqlService::new(q);
        let sql = "SELECT count(*) AS n FROM samples";
        let req = |tenant: &str| {
            let mut r = Request::new(FlightDescriptor::new_cmd(Vec::<u8>::new()));
            r.metadata_mut()
                .insert("x-scope-orgid", tenant.parse().unwrap());
            r
        };
        let info = |tenant: &'static str| {
            svc.get_flight_info_statement(
                CommandStatementQuery {
                    query: sql.into(),
                    transaction_id: None,
                },
                req(tenant),
            )
        };
        let get = |tenant: &'static str| async move {
            let mut r = Request::new(Ticket::default());
            r.metadata_mut()
                .insert("x-scope-orgid", tenant.parse().unwrap());
            let stream = svc
                .do_get_statement(
                    TicketStatementQuery {
                        statement_handle: sql.into(),
                    },
                    r,
                )
                .await
                .unwrap()
                .into_inner();
            let batches: Vec<RecordBatch> = FlightRecordBatchStream::new_from_flight_data(
                stream.map_err(|s| FlightError::Tonic(Box::new(s))),
            )
            .try_collect()
            .await
            .unwrap();
            batches[0].column(0).as_primitive::<Int64Type>().value(0)
        };

        info("t").await.unwrap();
        assert_eq!(svc.planned.lock().len(), 1);
        let n = get("t").await;
        assert_eq!(n, i64::try_from(rows).unwrap(), "every sample row counted");
        assert_eq!(svc.plans_reused.load(Ordering::Relaxed), 1);
        assert!(svc.planned.lock().is_empty(), "a kept plan is used once");

        // No kept plan: planned again, same answer.
        assert_eq!(get("t").await, n);
        assert_eq!(svc.plans_reused.load(Ordering::Relaxed), 1);

        // Another tenant's DoGet of the same SQL does not take t's plan.
        info("t").await.unwrap();
        assert_eq!(get("u").await, 0, "tenant u has no data");
        assert_eq!(svc.plans_reused.load(Ordering::Relaxed), 1);
        assert_eq!(svc.planned.lock().len(), 1);
    }
}
