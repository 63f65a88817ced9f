//! The querier's two [`HeadSource`]s, both owned by the ingester crate:
//! the in-process [`Ingester`] (`fathom all`) and the head reads of the
//! ingesters' Flight services ([`FlightHeads`], a cluster).

use fathom_ingester::{FlightHeads, Ingester};
use fathom_model::{Id, Symbols, TenantId};

use crate::{HeadSnapshot, HeadSource, QueryError};

#[async_trait::async_trait]
impl HeadSource for Ingester {
    async fn snapshot(
        &self,
        tenant: &TenantId,
        start: i64,
        end: i64,
    ) -> Result<Vec<HeadSnapshot>, QueryError> {
        Ok(vec![Ingester::snapshot(self, tenant, start, end)])
    }

    async fn symbols(&self, tenant: &TenantId, stacks: &[Id]) -> Result<Symbols, QueryError> {
        Ok(Ingester::symbols(self, tenant, stacks))
    }
}

#[async_trait::async_trait]
impl HeadSource for FlightHeads {
    async fn snapshot(
        &self,
        tenant: &TenantId,
        start: i64,
        end: i64,
    ) -> Result<Vec<HeadSnapshot>, QueryError> {
        Ok(FlightHeads::snapshot(self, tenant, start, end).await?)
    }

    async fn symbols(&self, tenant: &TenantId, stacks: &[Id]) -> Result<Symbols, QueryError> {
        Ok(FlightHeads::symbols(self, tenant, stacks).await?)
    }
}
