"""An OTLP/HTTP trace and metrics receiver for the tests (tests/telemetry.rs), on 127.0.0.1.

Each POST body to /v1/traces is decoded as an ExportTraceServiceRequest with the official
`opentelemetry-proto` package; the spans are appended as one JSON line per request to
OUT, the raw bodies to OUT.raw (so a test can search every exported byte). A POST to
/v1/metrics is decoded as an ExportMetricsServiceRequest; its metrics (name, kind,
monotonicity, temporality, data points with their attributes) are appended as one JSON
line per request to OUT.metrics. Prints its port on the first line of stdout once it
listens.

    python3 receiver.py OUT
"""

import http.server
import json
import sys

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

OUT = sys.argv[1]


def value(v):
    kind = v.WhichOneof("value")
    if kind in ("string_value", "bool_value", "int_value", "double_value"):
        return getattr(v, kind)
    return str(v)


def point(p):
    out = {"attributes": {a.key: value(a.value) for a in p.attributes}}
    if hasattr(p, "bucket_counts"):
        out.update(count=p.count, sum=p.sum, buckets=list(p.bucket_counts), bounds=list(p.explicit_bounds))
    else:
        out["value"] = getattr(p, p.WhichOneof("value"))
    return out


def metrics(body):
    request = ExportMetricsServiceRequest()
    request.ParseFromString(body)
    found = []
    for rm in request.resource_metrics:
        resource = {a.key: value(a.value) for a in rm.resource.attributes}
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                data = getattr(m, kind)
                found.append({
                    "name": m.name,
                    "description": m.description,
                    "kind": kind,
                    "monotonic": getattr(data, "is_monotonic", None),
                    "temporality": getattr(data, "aggregation_temporality", None),
                    "points": [point(p) for p in data.data_points],
                    "resource": resource,
                })
    return found


class Handler(http.server.BaseHTTPRequestHandler):
    def answer(self, message):
        answer = message.SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        if self.path == "/v1/metrics":
            with open(OUT + ".metrics", "a") as f:
                f.write(json.dumps({"path": self.path, "contentType": self.headers.get("content-type"), "metrics": metrics(body)}) + "\n")
            self.answer(ExportMetricsServiceResponse())
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        spans = []
        for rs in request.resource_spans:
            resource = {a.key: value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    spans.append({
                        "name": s.name,
                        "traceId": s.trace_id.hex(),
                        "spanId": s.span_id.hex(),
                        "parentSpanId": s.parent_span_id.hex(),
                        "kind": s.kind,
                        "status": s.status.code,
                        "start": s.start_time_unix_nano,
                        "end": s.end_time_unix_nano,
                        "attributes": {a.key: value(a.value) for a in s.attributes},
                        "events": [e.name for e in s.events],
                        "resource": resource,
                    })
        with open(OUT, "a") as f:
            f.write(json.dumps({"path": self.path, "contentType": self.headers.get("content-type"), "spans": spans}) + "\n")
        with open(OUT + ".raw", "ab") as f:
            f.write(body)
        self.answer(ExportTraceServiceResponse())

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
