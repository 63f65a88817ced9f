"""Calls Fathom's Pyroscope query API (querier.v1 over Connect) the way
Grafana's Pyroscope data source does, with the real Connect client from PyPI
(`connectrpc`) and messages generated at test time from the repo's protos
(`protoc-gen-py`, `protoc-gen-connectrpc`).

Usage: grafana_connect_client.py GEN_PARENT BASE_URL TENANT CALLS_JSON

GEN_PARENT holds the generated package `gen` (querier/v1, types/v1,
google/v1). CALLS_JSON is a list of {"method": <client method>,
"request_type": <full protobuf name>, "request": <request in the protobuf
JSON mapping>}. Every call is made twice, once per codec (proto, json);
the answers go to stdout as {"proto": [...], "json": [...]}, one entry per
call: {"ok": <response in the protobuf JSON mapping>, "binary": <hex of
the response in protobuf>} or {"error": {"code": ..., "message": ...}}.
"""

import importlib
import json
import sys

from connectrpc.codec import proto_binary_codec, proto_json_codec
from connectrpc.errors import ConnectError


def main() -> None:
    gen_parent, base_url, tenant, calls_path = sys.argv[1:5]
    sys.path.insert(0, gen_parent)
    connect = importlib.import_module("gen.querier.v1.querier_connect")
    modules = {
        "querier.v1": importlib.import_module("gen.querier.v1.querier_pb"),
        "types.v1": importlib.import_module("gen.types.v1.types_pb"),
    }
    with open(calls_path) as f:
        calls = json.load(f)
    out = {}
    for name, codec in (("proto", proto_binary_codec()), ("json", proto_json_codec())):
        results = []
        with connect.QuerierServiceClientSync(base_url, codec=codec) as client:
            for call in calls:
                package, _, message = call["request_type"].rpartition(".")
                cls = getattr(modules[package], message)
                request = cls.from_json(json.dumps(call["request"]))
                method = getattr(client, call["method"])
                try:
                    response = method(request, headers={"X-Scope-OrgID": tenant})
                except ConnectError as e:
                    results.append({"error": {"code": e.code.value, "message": e.message}})
                    continue
                results.append(
                    {
                        "ok": json.loads(response.to_json()),
                        "binary": response.to_binary().hex(),
                    }
                )
        out[name] = results
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
