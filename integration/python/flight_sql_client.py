"""Real Flight SQL and Flight clients against Fathom, for integration/tests/e2e/flight.rs.

Usage: flight_sql_client.py URI TENANT_A TENANT_B SERVICE PROFILE_TYPE START END

Prints one JSON object with what the clients saw; the Rust test compares it
with the HTTP API and with the `go tool pprof` expectations.
"""

import json
import sys
import warnings

import adbc_driver_flightsql.dbapi as flightsql
import pyarrow.flight as flight

# ADBC warns that autocommit cannot be disabled: Fathom has no transactions.
warnings.simplefilter("ignore")

uri, tenant_a, tenant_b, service, ptype, start, end = sys.argv[1:8]


def connect(tenant):
    return flightsql.connect(
        uri, db_kwargs={"adbc.flight.sql.rpc.call_header.x-scope-orgid": tenant}
    )


def rows(cur, sql, params=None):
    cur.execute(sql, parameters=params)
    return cur.fetchall()


def totals(pairs):
    out = {}
    for k, v in pairs:
        out[k] = out.get(k, 0) + v
    return out


out = {}
a = connect(tenant_a)
cur = a.cursor()
where = (
    f"service_name = '{service}' AND profile_type = '{ptype}' "
    f"AND time >= TIMESTAMP '{start}' AND time <= TIMESTAMP '{end}'"
)
out["leaf"] = totals(rows(cur, f"SELECT leaf, sum(value) FROM profiles WHERE {where} GROUP BY leaf"))
out["leaf_udf"] = totals(
    rows(cur, f"SELECT leaf_frame(stack), sum(value) FROM profiles WHERE {where} GROUP BY 1")
)
out["stacks"] = totals(
    rows(cur, f"SELECT folded(stack), sum(value) FROM profiles WHERE {where} GROUP BY 1")
)
# The normalized tables joined give the same per-stack totals.
out["joined"] = totals(
    rows(
        cur,
        "SELECT folded(st.stack), sum(s.value) FROM samples s "
        "JOIN series se ON s.series_id = se.series_id "
        "JOIN stacks st ON s.stack_id = st.stack_id "
        f"WHERE se.service_name = '{service}' AND se.profile_type = '{ptype}' "
        f"AND s.time >= TIMESTAMP '{start}' AND s.time <= TIMESTAMP '{end}' GROUP BY 1",
    )
)
# A prepared statement with parameters ($1, $2 are DataFusion's placeholders).
out["prepared"] = totals(
    rows(
        cur,
        "SELECT folded(stack), sum(value) FROM profiles "
        "WHERE service_name = $1 AND profile_type = $2 GROUP BY 1",
        (service, ptype),
    )
)
out["contains"] = rows(
    cur,
    f"SELECT count(*) FROM profiles WHERE {where} AND stack_contains(stack, $1)",
    ("main.main",),
)[0][0]

objects = a.adbc_get_objects().read_all().to_pylist()
tables = {}
for catalog in objects:
    for schema in catalog["catalog_db_schemas"]:
        for t in schema["db_schema_tables"]:
            key = f'{catalog["catalog_name"]}.{schema["db_schema_name"]}.{t["table_name"]}'
            tables[key] = [c["column_name"] for c in t["table_columns"] or []]
out["tables"] = tables

# Tenant isolation: no WHERE clause, each tenant sees only its own rows.
out["count_a"] = rows(cur, "SELECT count(*) FROM profiles")[0][0]
out["services_a"] = sorted(r[0] for r in rows(cur, "SELECT DISTINCT service_name FROM series"))
b = connect(tenant_b)
cur_b = b.cursor()
out["count_b"] = rows(cur_b, "SELECT count(*) FROM profiles")[0][0]
out["services_b"] = sorted(r[0] for r in rows(cur_b, "SELECT DISTINCT service_name FROM series"))
out["b_sees_service_a"] = rows(
    cur_b, f"SELECT count(*) FROM profiles WHERE service_name = '{service}'"
)[0][0]

errors = {}
for name, sql in [
    ("syntax", "SELEC leaf FROM profiles"),
    ("unknown_table", "SELECT * FROM no_such_table"),
    ("insert", "INSERT INTO profiles (value) VALUES (1)"),
    ("create", "CREATE TABLE t (a INT)"),
    ("memory", "SELECT a.profile_id, b.stack_id FROM samples a CROSS JOIN samples b ORDER BY 1, 2"),
    ("timeout", "SELECT count(*) FROM generate_series(1, 1000000000000)"),
]:
    try:
        cur.execute(sql)
        cur.fetchall()
        errors[name] = None
    except Exception as e:  # the driver's error classes differ per status
        errors[name] = f"{type(e).__name__}: {e}"
out["errors"] = errors
out["after_errors"] = rows(cur, f"SELECT count(*) FROM profiles WHERE {where}")[0][0]

# Arrow Flight: a merge by DoGet with a JSON ticket.
client = flight.FlightClient(uri)
opts = flight.FlightCallOptions(headers=[(b"x-scope-orgid", tenant_a.encode())])
ticket = {
    "kind": "merge",
    "query": f'{ptype}{{service_name="{service}"}}',
    "start": start,
    "end": end,
}
info = client.get_flight_info(flight.FlightDescriptor.for_command(json.dumps(ticket)), opts)
table = client.do_get(info.endpoints[0].ticket, opts).read_all()
out["flight_schema"] = [f.name for f in table.schema]
out["flight_merge"] = totals(
    (";".join(s), v)
    for s, v in zip(table.column("stack").to_pylist(), table.column("value").to_pylist())
)
try:
    client.do_get(flight.Ticket(b'{"kind": "merge"}'), opts).read_all()
    out["flight_error"] = None
except Exception as e:  # pyarrow raises ArrowInvalid for INVALID_ARGUMENT
    out["flight_error"] = f"{type(e).__name__}: {e}"
client.close()
for c in (cur, cur_b, a, b):
    c.close()

print(json.dumps(out))
