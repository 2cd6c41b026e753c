"""A minimal OpenAI-compatible chat-completions server over llama-cpp-python, used only to
record this directory's cassette (see record.sh): `POST /v1/chat/completions` with
`messages`, `max_tokens` (default `--max-tokens`, 96: short replies for README),
`temperature` (default 0: greedy, so a re-recording gives the same replies) and `response_format` (`json_schema` becomes a llama.cpp grammar, so the model's
reply is JSON of that schema; `json_object` any JSON), and `GET /v1/models`. One request
at a time, on 127.0.0.1. llama-cpp-python's own server takes only `json_object` (with a
`schema`), not the `json_schema` the host asks for first.

    python3 server.py --model SmolLM2-135M-Instruct.Q4_1.gguf --port 8089
"""

import argparse
import json
from http.server import BaseHTTPRequestHandler, HTTPServer

from llama_cpp import Llama, LlamaGrammar
from llama_cpp.llama_grammar import JSON_GBNF

MAX_BODY = 1 << 20


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the GGUF file")
    parser.add_argument("--name", default="smollm2-135m-instruct", help="the model id /v1/models lists")
    parser.add_argument("--port", type=int, default=8089)
    parser.add_argument("--ctx", type=int, default=2048, help="the context window in tokens")
    parser.add_argument("--max-tokens", type=int, default=96, help="a reply's length when the request sets none")
    args = parser.parse_args()
    llm = Llama(model_path=args.model, n_ctx=args.ctx, seed=0, verbose=False)

    class Handler(BaseHTTPRequestHandler):
        def reply(self, status, value):
            body = json.dumps(value).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path.rstrip("/") == "/v1/models":
                self.reply(200, {"object": "list", "data": [{"id": args.name, "object": "model"}]})
            else:
                self.reply(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self):
            if self.path.rstrip("/") != "/v1/chat/completions":
                return self.reply(404, {"error": {"message": f"no route {self.path}"}})
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                return self.reply(413, {"error": {"message": "request too large"}})
            try:
                request = json.loads(self.rfile.read(length))
                fmt = request.get("response_format") or {}
                grammar = None
                if fmt.get("type") == "json_schema":
                    schema = json.dumps(fmt["json_schema"]["schema"])
                    grammar = LlamaGrammar.from_json_schema(schema, verbose=False)
                elif fmt.get("type") == "json_object":
                    grammar = LlamaGrammar.from_string(JSON_GBNF, verbose=False)
                completion = llm.create_chat_completion(
                    messages=request["messages"],
                    temperature=request.get("temperature", 0.0),
                    max_tokens=request.get("max_tokens") or args.max_tokens,
                    grammar=grammar,
                    seed=0,
                )
            except (KeyError, TypeError, ValueError) as e:
                return self.reply(400, {"error": {"message": f"bad request: {e}"}})
            completion["model"] = request.get("model", args.name)
            self.reply(200, completion)

    server = HTTPServer(("127.0.0.1", args.port), Handler)
    print(f"serving {args.model} as {args.name} on http://127.0.0.1:{args.port}/v1", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
